"""Result files: one schema-validated JSON document per (device, solution), `results/<device>/<solution>.json`.

Calibration files (`results/<device>/calibration.json`) hold the ceilings measured by `harness calibrate`.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, ValidationError, field_validator

from harness.provenance import REPO_ROOT, Provenance
from harness.registry import HashMethod
from harness.roofline import DevicePeaks
from harness.status import Status
from harness.workloads import default_suite

RESULTS_DIR = REPO_ROOT / "results"
SCHEMA_VERSION = 3  # 3: call latency (the headline), device time and host cost apart
CALIBRATION_FILE = "calibration.json"
# The solution whose latency on a workload is T_b, the baseline of the SOL score.
BASELINE_SOLUTION = "reference_fp32"


def baseline_first(names: Iterable[str]) -> list[str]:
    """The solutions' names in order, the baseline's first: runs take it first so that T_b is known for the others."""
    return sorted(names, key=lambda name: name != BASELINE_SOLUTION)


# Two-sided 95% quantiles of Student's t for 1..30 degrees of freedom; the normal 1.96 beyond.
_T95 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


def t95(degrees_of_freedom: int) -> float:
    return _T95[degrees_of_freedom - 1] if degrees_of_freedom <= len(_T95) else 1.96


class LateWork(BaseModel):
    """GPU work that ran after timed calls had returned, on streams their end events did not wait for; harness.timing
    charges it to their times. Measured per call (per batch of calls for the device time): the host's wait for the
    device to go idle once the call's stream was done, less the same wait on an idle device and a noise allowance."""

    measured: int = Field(description="calls (for the device time: batches) measured")
    late: int = Field(description="how many of them were charged")
    mean_us: float = Field(description="mean charge per measurement")
    max_us: float


class TimingStats(BaseModel):
    clock: Literal["cuda_events", "cpu_wall", "host_wall"]
    mean_us: float
    median_us: float
    std_us: float
    min_us: float
    max_us: float
    n: int
    ci95_low_us: float
    ci95_high_us: float
    rel_stderr: float
    warmup_calls: int
    input_sets: int = Field(description="distinct input sets the calls rotated over; 0: every call had fresh addresses")
    late_work: LateWork | None = Field(default=None, description="charged to the samples; None where not measured")

    @classmethod
    def from_samples(
        cls, samples_us: list[float], clock: str, warmup_calls: int, input_sets: int, late_work: LateWork | None = None
    ) -> TimingStats:
        n = len(samples_us)
        mean = statistics.fmean(samples_us)
        std = statistics.stdev(samples_us) if n > 1 else 0.0
        stderr = std / math.sqrt(n)
        half_width = t95(n - 1) * stderr if n > 1 else 0.0
        return cls(
            clock=clock,
            mean_us=mean,
            median_us=statistics.median(samples_us),
            std_us=std,
            min_us=min(samples_us),
            max_us=max(samples_us),
            n=n,
            ci95_low_us=mean - half_width,
            ci95_high_us=mean + half_width,
            rel_stderr=stderr / mean if mean > 0 else 0.0,
            warmup_calls=warmup_calls,
            input_sets=input_sets,
            late_work=late_work,
        )


class ResultsError(ValueError):
    """A results or calibration file that cannot be read; the message names the file and the problem."""


class OutputCheck(BaseModel):
    name: str
    status: Status
    message: str = ""
    max_abs_error: float | None = None
    max_rel_error: float | None = None
    matched_ratio: float | None = None
    # an output scattered to the batch: the matched ratio over the rows the tokens scatter to (correctness.check_output)
    rows_matched_ratio: float | None = None
    has_nan: bool = False
    has_inf: bool = False
    all_zeros: bool = False  # no nonzero element where the reference has one (correctness.ALL_ZEROS)


class TrialReport(BaseModel):
    seed: int
    status: Status
    message: str = ""
    check: str = ""  # the reward-hack check whose verdict this is (harness.reward_hacks.REWARD_HACK_CHECKS), if any
    outputs: list[OutputCheck] = []


# Informational flags of a workload (never a failure). HOST_BOUND: the solution's host time to issue one call is longer
# than its device time, so under the call-latency timer the GPU waits for the host. NOT_AUDITED: CUPTI refused the
# launch audit on this workload, or NVML did not list the solution's process (harness.launch_audit), so work issued
# outside the calls would have gone unseen. HARNESS_PACED: in the sustained timing the solution's host issued a call
# faster than the GPU runs it, but not together with the harness's work between the calls (SustainedTiming): the GPU
# had run the previous call before a tenth of the calls or more started, waiting for the harness, and the sustained
# time is an upper bound set by this machine's host.
Flag = Literal["HOST_BOUND", "NOT_AUDITED", "HARNESS_PACED"]


class GraphTiming(BaseModel):
    """`bench --cuda-graph`: the call captured once in a CUDA graph and replayed at the same addresses, synchronised
    before each replay; a capture that fails, or replays whose outputs are wrong, leave `error` instead."""

    timing: TimingStats | None = None
    error: str = ""


class MixedTokensTiming(BaseModel):
    """`bench --mixed-tokens`: call latency, timed as the headline's, of calls whose T changes from each call to the
    next, as a training step's experts make them. The calls cycle through `tokens` (the T nearest the workload's, the
    same work within a few percent), one round untimed (each T's first call), then `rounds` - 1 timed; against the
    call latency it shows what changing shape costs a solution once it has met each T. Every call's outputs are
    scanned for the NaN poison, and each T's first timed call and later ones drawn at random as they end are checked
    against the reference; a failure leaves `error` and fails the workload (runner.Bench._time_mixed_tokens)."""

    tokens: list[int]
    rounds: int
    timing: TimingStats | None = None
    # each T's mean, in the order of `tokens`: where one T costs more than its neighbours (a tile or plan limit)
    tokens_us: list[float] = Field(default_factory=list, description="mean call latency of each T (empty before it)")
    host: TimingStats | None = None
    error: str = ""


# HARNESS_PACED: the share of a sustained timing's calls that found the GPU's queue empty, above which it is flagged.
# Such a call's time includes the solution's own lead-in, which calls back to back hide: at a tenth of the calls, a
# lead-in of a fifth of the call moves the mean by 2%, about the timing's noise.
PACED_SHARE = 0.1


class SustainedTiming(BaseModel):
    """`bench --sustained`: the time per call with the calls back to back and never a pause, as a training step keeps
    the GPU busy (timing.time_sustained): the calls rotate over the input sets, grad_output drawn anew and the L2
    flushed before each, a block of each weight too before one in eight at random (reward_hacks.draw_sustained), the
    first `settle_s` seconds of calls untimed. The device time pauses between batches, and a GPU whose load pauses stays
    below its power limit, near its boost clock; under continuous heavy work the limit brings the clock down. A solution
    whose host issues a call more slowly than the GPU runs it is timed at its host's pace, as in a step. The launch
    audit records throughout, adding host time to every launch, the harness's too (a step has none): where the harness's
    work between the calls then holds the GPU back, the workload is flagged HARNESS_PACED. Sampled calls (of all, and of
    those with fresh weight blocks) and a last call on each input set, with fresh blocks, after the timed ones are
    checked against the reference (the outputs are not poisoned) and must lie nearer it than such a block moves it
    (reward_hacks.stale_outputs); a failure leaves `error` and fails the workload (runner.Bench._time_sustained)."""

    settle_s: float
    settle_calls: int = 0
    timing: TimingStats | None = None
    host_us: float = Field(0.0, description="on a GPU: the solution's host time per timed call, issuing it")
    harness_host_us: float = Field(
        0.0, description="on a GPU: the harness's host time per timed call between the calls (draws, flush, events, checks)"
    )
    drained_share: float | None = Field(
        None, description="on a GPU: the share of timed calls before whose start the GPU had already run the previous call"
    )
    error: str = ""

    def harness_paced(self, device_us: float) -> bool:
        """The HARNESS_PACED flag: the solution's host issued a call faster than the GPU runs it (`device_us`, its device
        time), yet before more than PACED_SHARE of the calls the GPU had run the previous one: it waited for the
        harness's work between them.
        Against the device time, not the sustained mean: a host-bound solution's calls end soon after its last launch,
        so their mean is its own pace. Not by the host times alone: a host that runs ahead blocks in its launches once
        the GPU's queue is full, and that wait counts in them as if it were work."""
        return (
            self.timing is not None
            and self.host_us < device_us
            and self.drained_share is not None
            and self.drained_share > PACED_SHARE
        )


class TimedChecks(BaseModel):
    """The checks of the timed calls' outputs (reward_hacks.TimedOutputChecks): how many calls were checked for
    unwritten elements, which calls of each timing (numbered from 0, warm-ups included) were drawn for verification
    in full, and which call-latency calls for the check of their sampled elements (reward_hacks.SampledElements;
    empty in files written before it)."""

    poison_checked: int
    verified_device_time_calls: list[int]
    verified_call_latency_calls: list[int]
    sampled_call_latency_calls: list[int] = []


class KernelRun(BaseModel):
    name: str
    stream: int
    start_us: float = Field(description="from the start of the call's first GPU activity")
    duration_us: float


class KernelProfile(BaseModel):
    """`bench --kernels`: the GPU activity of single calls (synchronised before each, as call latency), from the
    CUDA profiling interface through torch.profiler."""

    calls: int
    span_us: float = Field(description="median over the calls of first start to last end: the public evaluator's figure")
    busy_us: float = Field(description="median over the calls of the sum of the activities' durations")
    idle_us: float | None = Field(
        default=None, description="median over the calls of the time inside the span in which no activity runs"
    )
    lead_in_us: float | None = Field(
        default=None,
        description="median over the calls of the host's time from entering the call to its first activity's start, "
        "from an idle device (harness.attribution): the part of call latency the span leaves out, as the profiler "
        "sees it; its callbacks add host time to every launch, so an upper bound (call latency less the span bounds it "
        "from below)",
    )
    kernels: list[KernelRun] = Field(description="the activities of the call whose span is the median")
    note: str = ""


class LaunchFloor(BaseModel):
    """A call that launches one kernel, timed as the solution's calls are and just before them: what the machine's
    host and driver cost any call at that moment. Host speed differs between machines of one kind and over a run, and
    a solution's call latency moves with it; read against the floor measured beside it, two runs compare."""

    latency_us: float = Field(description="mean call latency, synchronised before each call")
    host_us: float = Field(description="median host time to issue the call")


class WorkloadResult(BaseModel):
    uuid: str
    index: int
    batch_seq_len: int
    num_tokens: int
    hidden_dim: int
    ffn_dim: int
    status: Status
    message: str = ""
    trials: list[TrialReport] = []
    call_latency: TimingStats | None = Field(default=None, description="synchronised before each call, fresh addresses")
    device_time: TimingStats | None = Field(default=None, description="the GPU's queue kept full")
    host: TimingStats | None = Field(default=None, description="the solution's own host time to issue one call")
    launch_floor: LaunchFloor | None = None
    flags: list[Flag] = []
    device_index: int | None = Field(default=None, description="the device slot (--gpus) or Ray GPU it ran on")
    timed_checks: TimedChecks | None = None
    cuda_graph: GraphTiming | None = None
    mixed_tokens: MixedTokensTiming | None = None
    sustained: SustainedTiming | None = None
    kernels: KernelProfile | None = None
    flops: int
    bytes: int
    sol_us: float | None = Field(default=None, description="roofline time with datasheet peaks")
    sol_us_measured: float | None = Field(default=None, description="roofline time with calibrated ceilings")
    # Scores of the call latency (the headline) and, prefixed device_, of the device time, each against the baseline's
    # figure of the same kind.
    percent_of_sol: float | None = None
    percent_of_sol_measured: float | None = None
    baseline_us: float | None = Field(default=None, description="T_b: reference_fp32's mean call latency on this device")
    sol_score: float | None = None
    device_percent_of_sol: float | None = None
    device_percent_of_sol_measured: float | None = None
    device_baseline_us: float | None = Field(default=None, description="reference_fp32's mean device time on this device")
    device_sol_score: float | None = None

    @property
    def latency_us(self) -> float | None:
        """The headline: mean call latency."""
        return self.call_latency.mean_us if self.call_latency else None

    @property
    def device_us(self) -> float | None:
        return self.device_time.mean_us if self.device_time else None


class SolutionRecord(BaseModel):
    name: str
    description: str
    author: str
    license: str
    language: str
    entry_point: str
    destination_passing_style: bool
    source_sha256: dict[str, str]
    # what source_sha256 hashes (registry.Solution.source_hashes): files before code hashes hashed the text
    source_hash_method: HashMethod = "text"


class BenchConfig(BaseModel):
    suite: str
    trials: int
    seed: int
    input_sets: int
    target_rel_stderr: float
    max_calls: int
    cuda_graph: bool = False
    mixed_tokens: bool = False
    sustained_s: float = Field(0.0, description="the sustained timing's untimed seconds of calls at its start; 0: none")
    kernels: bool = False
    launch_audit: str = Field("off: not recorded", description="how GPU work issued outside the calls was looked for")


class BenchResult(BaseModel):
    schema_version: int = SCHEMA_VERSION

    solution: SolutionRecord
    config: BenchConfig
    provenance: Provenance
    peaks_source: str | None = None
    calibration_source: str | None = None
    duration_s: float = Field(description="this solution's own seconds: loading it and its workloads")
    workloads: list[WorkloadResult]
    # each worker's provenance (one per device slot, or per Ray task, and per replaced worker), clocks before and after
    # included; `provenance` is the first's. Empty in a run without worker processes (--no-isolation).
    devices: list[Provenance] = []

    @field_validator("schema_version")
    @classmethod
    def _current(cls, value: int) -> int:
        if value != SCHEMA_VERSION:
            raise ValueError(
                f"schema {value} is not this harness's {SCHEMA_VERSION} (call latency and device time apart): run `harness bench` again"
            )
        return value

    @property
    def passed(self) -> int:
        return sum(w.status is Status.PASSED for w in self.workloads)


class Calibration(BaseModel):
    device_name: str
    copy_bytes_per_s: float = Field(gt=0, description="device-to-device copy, bytes read plus bytes written")
    matmul_flops_per_s: float = Field(gt=0, description="bf16 matmul on random data")
    method: str
    provenance: Provenance

    def peaks(self) -> DevicePeaks:
        """The measured ceilings as the roofline takes peaks."""
        return DevicePeaks("measured", self.matmul_flops_per_s, self.copy_bytes_per_s, self.method)


class EvaluatedSources(BaseModel):
    """What the public evaluator's traces of a solution measured (results/<device>/public-evaluator/<solution>.sources.json
    beside them, written by compare.keep_public_traces): the source hashes of the result its export was made from."""

    solution: str
    source_sha256: dict[str, str]


def folder_suite(device_slug: str) -> str:
    """The suite whose result files sit in results/<device>/ itself: the default suite of the device (public in a GPU's
    folder, smoke in the CPU's)."""
    return default_suite("cpu" if device_slug == "cpu" else "cuda")


def result_folder(results_dir: Path, device_slug: str, suite: str | None = None) -> Path:
    """results/<device>/ for the device's default suite (public on a GPU, smoke on the CPU: the files that compare,
    plot and export read), results/<device>/<suite>/ for any other suite, so that a run of one suite never replaces
    another's file."""
    folder = results_dir / device_slug
    return folder if suite is None or suite == folder_suite(device_slug) else folder / suite


def result_path(results_dir: Path, device_slug: str, solution: str, partial: bool = False, suite: str | None = None) -> Path:
    """<solution>.json in result_folder; a partial run's file goes to a `partial` folder there."""
    folder = result_folder(results_dir, device_slug, suite)
    return (folder / "partial" if partial else folder) / f"{solution}.json"


def save(model: BaseModel, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(model.model_dump_json(indent=1) + "\n")
    return path


def _load(path: Path, model: type[BaseModel]) -> BaseModel:
    try:
        return model.model_validate_json(path.read_text())
    except OSError as exc:
        raise ResultsError(f"{path}: cannot read: {exc.strerror}") from None
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise ResultsError(f"{path}: not a valid {model.__name__} file: field '{where}': {first['msg']}") from None


def load_result(path: Path) -> BenchResult:
    return _load(path, BenchResult)  # type: ignore[return-value]


def load_evaluated_sources(path: Path) -> EvaluatedSources:
    return _load(path, EvaluatedSources)  # type: ignore[return-value]


def load_calibration(results_dir: Path, device_slug: str) -> Calibration | None:
    path = results_dir / device_slug / CALIBRATION_FILE
    return _load(path, Calibration) if path.exists() else None  # type: ignore[return-value]


def find_results(results_dir: Path, suite: str | None = None) -> list[Path]:
    """The result files of full runs: of each device's default suite, or with `suite` of that suite on every device
    (result_path's layout)."""
    devices = sorted(p.name for p in results_dir.iterdir() if p.is_dir()) if results_dir.is_dir() else []
    folders = [result_folder(results_dir, device, suite) for device in devices]
    return sorted(p for folder in folders for p in folder.glob("*.json") if p.name != CALIBRATION_FILE)
