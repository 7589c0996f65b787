"""The bench driver: for each workload, correctness trials on fresh seeded inputs, then timing.

Every trial and every device-time call goes to one of a few input sets (the same addresses each time), redrawn
in place from a new seed just before the call, with outputs poisoned: trials and timed calls look alike, and a
solution that caches outputs by address or by a sample of the contents replays stale outputs. Call-latency
calls each get inputs and outputs at addresses of their own (timing.FreshAddresses), drawn the same way. The trials'
seeds are reproducible; the timed calls' come from the operating system's entropy, so that no solution can work out
a timed call's inputs, and compute its outputs, ahead of the call.

One trial: draw inputs, compute the float32 reference under strict settings, snapshot the inputs, the
process-wide numeric settings and the watched functions, call the solution, then check (in this order)
its exception, threads still running its code, patched functions, GPU work still running after it
returned, the settings, the inputs, the outputs' types and aliasing, each output against the
reference, and outputs identical to an earlier trial's (a replay). The last trial repeats the first
one's inputs with grad_output alone redrawn, so that a cache keyed on the other inputs replays. A workload
passes when every trial passes. A workload that completed (passed, or only numerically wrong) is then
timed (device time, then call latency and host cost: harness.timing), and the outputs of the last timed call
on each input set and of the last call at fresh addresses are checked again; where asked, the call replayed from a
CUDA graph and calls whose T changes every call (the mixed-T timing) are timed last. The trials and timings run under the
launch audit (harness.launch_audit: CUPTI where installed, NVML where the driver has it), whose verdict on GPU work
issued by another thread, or by a process the solution started, while no call was running comes last.
"""

from __future__ import annotations

import contextlib
import copy
import math
import random
import secrets
import signal
import statistics
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from harness import guards, provenance
from harness.attribution import profile_kernels
from harness.correctness import check_output
from harness.launch_audit import LaunchAudit
from harness.registry import Solution, SolutionError
from harness.results import (
    BASELINE_SOLUTION,
    BenchConfig,
    BenchResult,
    GraphTiming,
    LaunchFloor,
    MixedTokensTiming,
    OutputCheck,
    ResultsError,
    SolutionRecord,
    SustainedTiming,
    TimedChecks,
    TrialReport,
    WorkloadResult,
    baseline_first,
    load_calibration,
    load_result,
    result_path,
)
from harness.roofline import DevicePeaks, datasheet_peaks, percent_of_sol, sol_score, sol_time_us
from harness.status import Status, worst
from harness.timing import (
    FreshAddresses,
    TimingConfig,
    TimingStats,
    capture_graph,
    device_wait_after,
    time_call_latency,
    time_device,
    time_launch_floor,
    time_sustained,
)
from harness.workloads import Suite, Workload, available_suites
from reference import (
    WEIGHT_SCALE,
    allocate_inputs,
    draw_normal,
    fill_inputs,
    generate_inputs,
    reference_backward,
    validate_token_indices,
)
from reference.problem import INPUTS, OUTPUTS, Dims, bytes_moved, flops


@dataclass
class BenchOptions:
    trials: int
    seed: int = 0
    input_sets: int = 3
    timing: TimingConfig = field(default_factory=TimingConfig)
    cuda_graph: bool = False  # also time the call captured in a CUDA graph and replayed
    mixed_tokens: bool = False  # also time calls whose T changes every call (results.MixedTokensTiming)
    sustained_s: float = 0.0  # > 0: also the calls back to back, the first this many seconds untimed (SustainedTiming)
    kernels: bool = False  # also record the GPU activity of single calls (torch.profiler)


@dataclass(frozen=True)
class Baseline:
    """reference_fp32's means on one workload: T_b of the call-latency and of the device-time scores."""

    latency_us: float | None
    device_us: float | None

    @classmethod
    def of(cls, result: WorkloadResult) -> Baseline:
        return cls(result.latency_us, result.device_us)


def trial_seed(base_seed: int, workload_index: int, trial: int) -> int:
    """Distinct, reproducible seeds: one per (workload, trial)."""
    return base_seed * 1_000_003 + workload_index * 1_009 + trial


def unpredictable_seeds() -> Iterator[int]:
    """The seeds of timed calls: drawn from the operating system's entropy as each call is prepared (a check that
    fails quotes its call's seed)."""
    while True:
        yield secrets.randbits(62)


def _describe_exception(exc: BaseException) -> str:
    frames = traceback.format_exception(type(exc), exc, exc.__traceback__)
    return f"{type(exc).__name__}: {exc}\n" + "".join(frames[-3:]).rstrip()


class SolutionCaller:
    """Calls a loaded entry point with the harness's calling convention and returns the 5 outputs."""

    def __init__(self, solution: Solution, entry_point: Callable[..., object]):
        self.dps = solution.spec.destination_passing_style
        self.entry_point = entry_point
        self.folder = solution.folder
        self.audit = LaunchAudit(torch.device("cpu"))  # the workload's, which notes the span of every call

    def __call__(self, inputs: dict[str, torch.Tensor], outputs: list[torch.Tensor]) -> list[object]:
        with self.audit.call():
            return self._call(inputs, outputs)

    def _call(self, inputs: dict[str, torch.Tensor], outputs: list[torch.Tensor]) -> list[object]:
        if self.dps:
            self.entry_point(*inputs.values(), *outputs)
            return list(outputs)
        returned = self.entry_point(*inputs.values())
        if not isinstance(returned, (tuple, list)) or len(returned) != len(OUTPUTS):
            raise TypeError(f"expected a tuple of {len(OUTPUTS)} output tensors, got {type(returned).__name__}")
        return list(returned)


# The mixed-T timing (results.MixedTokensTiming): how many T it cycles through, and its rounds over them (the first
# untimed). More T than a solution that keeps a few shapes' state (eight, say) would hold, so such a cache misses on
# every call as it would in a training step.
MIXED_TOKEN_COUNTS = 16
MIXED_TOKEN_ROUNDS = 4

# Seconds of calls back to back before `bench --sustained` times: on the H200 a heavy call's time settles within one
# second of load (docs/performance.md, "The clock under sustained load").
SUSTAINED_SETTLE_S = 1.0


def mixed_token_counts(dims: Dims, count: int = MIXED_TOKEN_COUNTS) -> list[int]:
    """The `count` T nearest dims.num_tokens other than it within [1, B], nearest first, the smaller first at equal
    distance (fewer where B leaves fewer)."""
    t, b = dims.num_tokens, dims.batch_seq_len
    others = [n for n in range(max(1, t - count), min(b, t + count) + 1) if n != t]
    return sorted(others, key=lambda n: (abs(n - t), n))[:count]


def allocate_outputs(workload: Workload, device: torch.device) -> list[torch.Tensor]:
    return [torch.empty(spec.concrete_shape(workload.dims), dtype=spec.dtype, device=device) for spec in OUTPUTS]


def _same_bits(a: object, b: torch.Tensor) -> bool:
    return (
        isinstance(a, torch.Tensor) and a.shape == b.shape and a.dtype == b.dtype and torch.equal(guards.bits(a), guards.bits(b))
    )


def redraw(inputs: dict[str, torch.Tensor], name: str, seed: int) -> None:
    """Replace one input's values by a fresh standard-normal draw (the near-duplicate trial)."""
    tensor = inputs[name]
    draw_normal(tensor, torch.Generator(device=tensor.device).manual_seed(seed))


# The share of each weight's F slices that the sustained timing draws anew before one call in FRESH_WEIGHT_CALLS,
# beside grad_output (drawn anew before every call). Its calls keep an input set's addresses and the rest of its values,
# so a solution could keep what it derives from a weight (converted, transposed) from call to call, which a training
# step, whose weights change every step, cannot. A block of fresh slices leaves such a copy stale in 2% of F: in as many
# rows of grad_w1 and grad_w3 through a copy of w2, in every sum of dx through one of w1 or w3. The tolerance need not
# see that in 1% of dx's elements (at T = 1 the block moves dx by a few percent), so the sampled calls' outputs must
# also lie nearer the reference than STALE_WEIGHT_RATIO of the least distance one weight's fresh block moves it
# (stale_outputs): an honest bf16 solution's error is a few percent of that distance, a stale copy's about all of it.
# The calls that draw blocks are chosen at random and the sample verified is drawn from them (TimedOutputChecks), with
# a last call on each input set after the timed ones: a kept copy goes stale there, and no call can tell those calls
# from the others without reading every weight in full. Not every call draws blocks: their nine small launches, beside
# the solution's own issue time, would outlast the GPU's time at small T on the H200 machine's host, and the timing
# would measure the harness (docs/performance.md, "The clock under sustained load"; HARNESS_PACED flags where it does).
FRESH_WEIGHT_SHARE = 0.02
STALE_WEIGHT_RATIO = 0.5
FRESH_WEIGHT_CALLS = 8
FRESH_WEIGHT_AXES = {"w1_weight": 0, "w2_weight": 1, "w3_weight": 0}  # each weight's F axis


def draw_sustained(inputs: dict[str, torch.Tensor], seed: int, fresh_weights: bool) -> Callable[[], None]:
    """Before a sustained call: grad_output drawn anew from `seed`, and with `fresh_weights` so is a block of
    FRESH_WEIGHT_SHARE of each weight's F slices, at a place drawn from it; returns what puts the blocks' earlier values
    back. The host issues this between calls that follow each other with no pause, so it costs one launch per draw
    (straight into the tensor's dtype, rounded once) and one per saved or restored block, no synchronisation: the
    places come from the host's generator."""
    values = torch.Generator(device=inputs["grad_output"].device).manual_seed(seed)
    inputs["grad_output"].normal_(generator=values)
    earlier = []
    if fresh_weights:
        places = random.Random(seed)
        for name, f_axis in FRESH_WEIGHT_AXES.items():
            size = inputs[name].shape[f_axis]
            width = math.ceil(FRESH_WEIGHT_SHARE * size)
            block = inputs[name].narrow(f_axis, places.randrange(size - width + 1), width)
            earlier.append((block, block.clone()))
            block.normal_(0.0, WEIGHT_SCALE, generator=values)

    def put_back() -> None:
        for block, values_before in earlier:
            block.copy_(values_before)

    return put_back


def stale_outputs(
    produced: list[object], reference: tuple[torch.Tensor, ...], without_each: list[tuple[torch.Tensor, ...]]
) -> str:
    """The outputs (named, with their share of the distance) farther from `reference` than STALE_WEIGHT_RATIO of the
    least distance between it and one of `without_each`, the references on the call's inputs with one weight's fresh
    block put back; '' where none is. Outputs no block moves (grad_w2, the routing weights') are not judged."""
    stale = []
    for index, (spec, out, ref) in enumerate(zip(OUTPUTS, produced, reference)):
        moves = [float((alt[index].float() - ref.float()).norm()) for alt in without_each]
        least = min((move for move in moves if move > 0), default=0.0)
        if least > 0 and isinstance(out, torch.Tensor):
            off = float((out.float() - ref.float()).norm())
            if off > STALE_WEIGHT_RATIO * least:
                stale.append(f"{spec.name} ({off / least:.2f} of it)")
    return ", ".join(stale)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# GPU work still running after the call returned, beyond this share of the call's own time (or this many
# milliseconds, whichever is more), was left on another stream. Measured on the host: once the call's
# stream has finished, how long a device-wide synchronisation still waits. For an honest call that is the
# cost of an empty synchronisation, microseconds; nothing of the harness's own runs inside that wait. Coarser than
# the timers' allowance, which honest host-bound trial calls exceed (docs/performance.md, at its top): deferring
# less than this is left to the timers' charge and their verdict on a habit.
LATE_WORK_SHARE = 0.25
LATE_WORK_MIN_MS = 0.5
# Trials added when the trials end with one unconfirmed sighting of late work (see LateWorkWatch): the
# sighting may have been the only one the trials could see (a first call's host time masks late work, and
# a solution may leave work behind on alternate calls only; seen on the H200 with 3 trials).
LATE_WORK_RECHECKS = 2
# The timers charge late work beyond a noise allowance to the times they report (harness.timing); where a timing
# charged it on at least this share of its measurements, and on LATE_WORK_TIMED_MIN at least, the solution leaves
# work behind as a habit: REWARD_HACK. Fewer sightings can be the host's thread descheduled, and are only charged.
LATE_WORK_TIMED_SHARE = 0.5
LATE_WORK_TIMED_MIN = 3
# Outputs of timed calls that fail the check are cheating (work skipped, stale or replayed outputs) only when
# they are grossly wrong: an honest solution whose error sits near the tolerance can miss the 99% on one input
# set after passing the trials on others (torch_eager at T = 128 on the H200: 0.9904 in the trials, below 0.99
# on a timed set), which is a numerical failure. Skipped or replayed work gets most elements wrong, or leaves an
# output all zeros (OutputCheck.all_zeros).
GROSS_MISMATCH_RATIO = 0.9


# Taken when the harness is imported, before any solution is: a solution that replaces it is caught after the
# call, and this measurement, made before that check, must not use its replacement.
_event_elapsed_ms = torch.cuda.Event.elapsed_time


def _late_gpu_work_ms(start: torch.cuda.Event, end: torch.cuda.Event) -> tuple[float, float]:
    """(ms the device still worked after the call's stream finished; ms between start and end on that stream)."""
    return device_wait_after(end) / 1e3, _event_elapsed_ms(start, end)


@dataclass
class LateWorkWatch:
    """Late GPU work seen so far on one workload. The host times the wait for it, so a descheduled host thread
    can look like late work once (seen on the H200: 0.9 ms after one of ~1000 honest calls). A first sighting
    is re-measured with a second call on the same inputs; a second sighting, on that call or on any later
    trial of the workload, is the verdict, so a solution that leaves work behind on alternate calls only is
    caught too."""

    sightings: int = 0

    def confirm(self) -> bool:
        """Record a sighting; True when it is the verdict, False when the call should be measured again."""
        self.sightings += 1
        return self.sightings >= 2


@dataclass
class CallEvidence:
    """What one guarded call left behind, for the reward-hack checks."""

    inputs: dict[str, torch.Tensor]
    snapshot: dict[str, torch.Tensor]  # the inputs as they were before the call
    produced: list[object]
    threads: list[str]  # threads still running the solution's code after it returned
    patched: list[str]  # watched functions replaced
    late: bool  # GPU work ran well after the call's stream finished (LATE_WORK_SHARE, LATE_WORK_MIN_MS)
    late_ms: float
    own_ms: float
    late_sightings: int
    changed_settings: list[str]


def threads_still_running(e: CallEvidence) -> str:
    return f"threads still running the solution's code after it returned: {', '.join(e.threads)}" if e.threads else ""


def _patched_message(replaced: list[str]) -> str:
    return f"replaced timing, synchronisation or harness functions: {', '.join(replaced)}"


def patched_functions(e: CallEvidence) -> str:
    return _patched_message(e.patched) if e.patched else ""


def late_gpu_work(e: CallEvidence) -> str:
    if not e.late:
        return ""
    return (f"GPU work ran {e.late_ms:.3f} ms after the call returned (the call's stream took {e.own_ms:.3f} ms), seen on "
            f"{e.late_sightings} calls of this workload: work left on another stream is outside the timed window")  # fmt: skip


def changed_settings(e: CallEvidence) -> str:
    return f"changed process-wide settings: {', '.join(e.changed_settings)}" if e.changed_settings else ""


def modified_inputs(e: CallEvidence) -> str:
    mutated = guards.mutated_inputs(e.snapshot, e.inputs)
    return f"modified inputs: {', '.join(mutated)}" if mutated else ""


def subclass_outputs(e: CallEvidence) -> str:
    subclasses = guards.not_plain_tensors(e.produced)
    return f"outputs are tensor subclasses, not plain torch.Tensor: {', '.join(subclasses)}" if subclasses else ""


def aliased_outputs(e: CallEvidence) -> str:
    for spec, out in zip(OUTPUTS, e.produced):
        aliased = guards.aliased_inputs(out, e.inputs) if isinstance(out, torch.Tensor) else []
        if aliased:
            return f"output {spec.name} aliases input {', '.join(aliased)}"
    return ""


# The reward-hack checks of one call, in the order they are judged (the first that finds something is the verdict,
# REWARD_HACK; the outputs are checked against the reference only after all pass). A new check is a function of the
# CallEvidence that returns what it found, or "", added here.
REWARD_HACK_CHECKS: tuple[Callable[[CallEvidence], str], ...] = (
    threads_still_running,
    patched_functions,
    late_gpu_work,
    changed_settings,
    modified_inputs,
    subclass_outputs,
    aliased_outputs,
)
# The checks whose verdicts are on the process's state rather than on one call: the harness repairs the state, but
# the solution stays marked for the rest of the run (it may have changed the state at import time).
PROCESS_STATE_CHECKS = frozenset(check.__name__ for check in (patched_functions, changed_settings))


def check_call(
    call: SolutionCaller,
    workload: Workload,
    inputs: dict[str, torch.Tensor],
    outputs: list[torch.Tensor],
    device: torch.device,
    seed: int,
    pristine: guards.Pristine,
    late_work: LateWorkWatch,
) -> tuple[TrialReport, list[object]]:
    """One guarded call of the solution; returns the verdict and what the call produced.

    `pristine` holds the watched functions and numeric settings as they were before the solution was
    imported, so that a change made at import time is caught as surely as one made during a call. The reference
    is computed only after the call, from the inputs' snapshot: while the solution runs, no tensor in the process
    holds the answer.
    """
    snapshot = guards.snapshot(inputs)
    settings = pristine.settings
    events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) if device.type == "cuda" else None

    def call_once() -> tuple[list[object], list[str], float, float, list[str]]:
        guards.poison(outputs)
        _synchronize(device)
        if events:
            events[0].record()
        produced = call(inputs, outputs)
        if events:
            events[1].record()
        still_running = guards.threads_running_code_in(call.folder)
        late_ms, own_ms = _late_gpu_work_ms(*events) if events else (0.0, 0.0)
        return produced, still_running, late_ms, own_ms, pristine.patched()

    def late(late_ms: float, own_ms: float) -> bool:
        return late_ms > max(LATE_WORK_MIN_MS, LATE_WORK_SHARE * own_ms)

    try:
        produced, still_running, late_ms, own_ms, patched = call_once()
        if late(late_ms, own_ms) and not still_running and not patched and not late_work.confirm():
            # Measured again; the second call's outputs are the ones checked.
            produced, still_running, late_ms, own_ms, patched = call_once()
            if late(late_ms, own_ms):
                late_work.confirm()
    except Exception as exc:  # noqa: BLE001 - a solution's failure of any kind is a result, not a crash of the harness
        pristine.patched()
        guards.restore_numeric_settings(settings)
        return TrialReport(seed=seed, status=Status.RUNTIME_ERROR, message=_describe_exception(exc)), []

    evidence = CallEvidence(inputs, snapshot, produced, still_running, patched, late(late_ms, own_ms), late_ms, own_ms,
                            late_work.sightings, guards.changed_settings(settings))  # fmt: skip
    guards.restore_numeric_settings(settings)
    for check in REWARD_HACK_CHECKS:
        if found := check(evidence):
            return TrialReport(seed=seed, status=Status.REWARD_HACK, message=found, check=check.__name__), []
    checks, status, message = check_outputs(workload, produced, compute_reference(snapshot))
    return TrialReport(seed=seed, status=status, message=message, outputs=checks), produced


def check_outputs(
    workload: Workload, produced: list[object], reference: tuple[torch.Tensor, ...]
) -> tuple[list[OutputCheck], Status, str]:
    """Every output against the reference: the checks, the worst status, and what failed."""
    checks = [
        check_output(spec, spec.concrete_shape(workload.dims), out, ref, workload.tolerance)
        for spec, out, ref in zip(OUTPUTS, produced, reference)
    ]
    message = "; ".join(f"{c.name}: {c.message}" for c in checks if c.status is not Status.PASSED)
    return checks, worst([c.status for c in checks]), message


def _grossly_wrong(check: OutputCheck) -> bool:
    if check.status is Status.PASSED:
        return False
    return (check.has_nan or check.has_inf or check.all_zeros or check.matched_ratio is None
            or check.matched_ratio < GROSS_MISMATCH_RATIO)  # fmt: skip


def compute_reference(inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
    with guards.strict_fp32():
        return reference_backward(*inputs.values())


def solution_record(solution: Solution) -> SolutionRecord:
    spec = solution.spec
    return SolutionRecord(
        name=spec.name,
        description=spec.description,
        author=spec.author,
        license=spec.license,
        language=spec.language,
        entry_point=spec.entry_point,
        destination_passing_style=spec.destination_passing_style,
        source_sha256=solution.source_hashes("code"),
        source_hash_method="code",
    )


def bench_config(suite: Suite, options: BenchOptions, device: torch.device) -> BenchConfig:
    return BenchConfig(
        suite=suite.name,
        trials=options.trials,
        seed=options.seed,
        input_sets=options.input_sets,
        target_rel_stderr=options.timing.target_rel_stderr,
        max_calls=options.timing.max_calls,
        cuda_graph=options.cuda_graph,
        mixed_tokens=options.mixed_tokens,
        sustained_s=options.sustained_s,
        kernels=options.kernels,
        launch_audit=LaunchAudit.method(device),
    )


class Scorer:
    """The roofline verdicts on one device: T_SOL, percent of SOL, INVALID_TIMING and the SOL score.

    The worker that measured a result and the parent that collects it (harness.isolation) both use it, so
    the parent re-derives every verdict from the reported time instead of trusting the worker's.
    """

    def __init__(self, device: torch.device, results_dir: Path, solution: str = ""):
        self.device = device
        self.results_dir = results_dir
        self.solution = solution
        self.device_slug = provenance.device_slug(device)
        self.peaks = datasheet_peaks(provenance.device_name(device)) if device.type == "cuda" else None
        calibration = load_calibration(results_dir, self.device_slug) if device.type == "cuda" else None
        self.measured_peaks = (
            DevicePeaks("measured", calibration.matmul_flops_per_s, calibration.copy_bytes_per_s, calibration.method)
            if calibration
            else None
        )

    def for_solution(self, name: str) -> Scorer:
        other = copy.copy(self)
        other.solution = name
        return other

    def baseline_from_file(self) -> dict[str, Baseline]:
        """T_b per workload uuid from this device's reference_fp32 result files, those of every suite in workloads/
        (full runs only; a workload's uuid names it in every suite); files it cannot read are passed over."""
        paths = {result_path(self.results_dir, self.device_slug, BASELINE_SOLUTION, suite=name) for name in available_suites()}
        baseline = {}
        for path in sorted(p for p in paths if p.exists()):
            try:
                workloads = load_result(path).workloads
            except ResultsError:  # a file this harness cannot read gives no T_b; a baseline run alongside still does
                continue
            baseline.update({w.uuid: Baseline.of(w) for w in workloads if w.latency_us is not None})
        return baseline

    def base(
        self, workload: Workload, index: int, status: Status, message: str, baseline: Baseline | None = None
    ) -> WorkloadResult:
        dims = workload.dims
        return WorkloadResult(
            uuid=workload.uuid,
            index=index,
            batch_seq_len=dims.batch_seq_len,
            num_tokens=dims.num_tokens,
            hidden_dim=dims.hidden_dim,
            ffn_dim=dims.ffn_dim,
            status=status,
            message=message,
            flops=flops(dims),
            bytes=bytes_moved(dims),
            baseline_us=baseline.latency_us if baseline else None,
            device_baseline_us=baseline.device_us if baseline else None,
        )

    def rescore(self, result: WorkloadResult) -> WorkloadResult:
        dims = Dims(result.batch_seq_len, result.num_tokens, result.hidden_dim, result.ffn_dim)
        result.flops, result.bytes = flops(dims), bytes_moved(dims)
        result.sol_us = sol_time_us(dims, self.peaks) if self.peaks else None
        result.sol_us_measured = sol_time_us(dims, self.measured_peaks) if self.measured_peaks else None
        timed = [t for t in (result.call_latency, result.device_time) if t is not None]
        if not timed:
            return result
        fastest = min(t.mean_us for t in timed)
        if result.sol_us is not None and fastest < result.sol_us and result.status in (Status.PASSED, Status.INCORRECT_NUMERICAL):
            result.status = Status.INVALID_TIMING
            result.message = f"mean {fastest:.1f} us is below the roofline's {result.sol_us:.1f} us: physically impossible"
        if self.solution == BASELINE_SOLUTION:
            result.baseline_us, result.device_baseline_us = result.latency_us, result.device_us
        result.percent_of_sol, result.percent_of_sol_measured, result.sol_score = self._scores(
            result, result.latency_us, result.baseline_us
        )
        result.device_percent_of_sol, result.device_percent_of_sol_measured, result.device_sol_score = self._scores(
            result, result.device_us, result.device_baseline_us
        )
        return result

    def _scores(self, result: WorkloadResult, latency: float | None, baseline: float | None) -> tuple[float | None, ...]:
        """(%SOL with datasheet peaks, %SOL with measured ceilings, SOL score) of one timing."""
        if latency is None:
            return None, None, None
        percent = percent_of_sol(latency, result.sol_us) if result.sol_us is not None else None
        measured = percent_of_sol(latency, result.sol_us_measured) if result.sol_us_measured is not None else None
        passed = result.status is Status.PASSED and baseline is not None and result.sol_us is not None
        return percent, measured, sol_score(latency, result.sol_us, baseline) if passed else None


class Bench:
    """Runs one solution over workloads on one device and assembles its BenchResult."""

    def __init__(self, solution: Solution, device: torch.device, options: BenchOptions, results_dir: Path):
        self.solution = solution
        self.device = device
        self.options = options
        self.scorer = Scorer(device, results_dir, solution.name)
        self.baseline: dict[str, Baseline] = {} if solution.name == BASELINE_SOLUTION else self.scorer.baseline_from_file()

    def start(self) -> None:
        """Load the solution (an import error becomes every workload's COMPILE_ERROR) and note the clocks."""
        started = time.perf_counter()
        self._clocks_before = provenance.read_clocks(self.device)
        self._pristine = guards.Pristine.now()
        self._tainted = ""
        self._call, self._setup_problem = self._prepare_solution()
        self._busy_seconds = time.perf_counter() - started  # this solution's own time, also when interleaved

    def workload(self, suite: Suite, workload: Workload) -> WorkloadResult:
        started = time.perf_counter()
        index = suite.workloads.index(workload)
        if self._setup_problem is not None:
            result = self._base(workload, index, *self._setup_problem)
        elif self._tainted:
            result = self._base(workload, index, Status.REWARD_HACK, self._tainted)
        else:
            result = self.run_workload(self._call, workload, index)
            if result.status is Status.REWARD_HACK and any(t.check in PROCESS_STATE_CHECKS for t in result.trials):
                self._tainted = f"on an earlier workload: {result.message}"
        self._busy_seconds += time.perf_counter() - started
        return self.scorer.rescore(result)

    def mark_patched(self, result: WorkloadResult, replaced: list[str]) -> WorkloadResult:
        """The verdict of the backstop that follows every workload (run_side_by_side, harness.worker, the Ray task):
        `replaced` is what the check taken before the solution was loaded found (and put back), functions every check of
        the workload may have run through. Where it found any: REWARD_HACK, and the solution stays marked for the rest
        of the run."""
        if not replaced:
            return result
        result.status, result.message = Status.REWARD_HACK, _patched_message(replaced)
        self._tainted = f"on an earlier workload: {result.message}"
        return self.scorer.rescore(result)

    def mark_patched_when_loaded(self, replaced: list[str]) -> None:
        """The backstop's verdict on what loading the solution replaced (run_side_by_side, where solutions share a
        process): every workload of the solution is REWARD_HACK."""
        if replaced:
            self._tainted = f"when it was loaded: {_patched_message(replaced)}"

    def finish(self, suite: Suite, results: list[WorkloadResult]) -> BenchResult:
        return BenchResult(
            solution=solution_record(self.solution),
            config=bench_config(suite, self.options, self.device),
            provenance=provenance.collect(self.device, self._clocks_before),
            peaks_source=self.scorer.peaks.source if self.scorer.peaks else None,
            calibration_source=self.scorer.measured_peaks.source if self.scorer.measured_peaks else None,
            duration_s=self._busy_seconds,
            workloads=results,
        )

    def run(
        self, suite: Suite, workloads: list[Workload], on_done: Callable[[WorkloadResult], None] = lambda r: None
    ) -> BenchResult:
        return run_side_by_side([self], suite, workloads, lambda bench, result: on_done(result))[0]

    def _prepare_solution(self) -> tuple[SolutionCaller | None, tuple[Status, str] | None]:
        if not self.solution.runs_on(self.device.type):
            where = ", ".join(self.solution.spec.devices)
            return None, (
                Status.SKIPPED,
                f"solution '{self.solution.name}' runs on {where} only; this run is on {self.device.type}",
            )
        if (reason := self.solution.unavailable_reason()) is not None:
            return None, (Status.SKIPPED, reason)
        try:
            return SolutionCaller(self.solution, self.solution.load_entry_point()), None
        except SolutionError as exc:  # the registry's own finding says all: no harness frames after it
            return None, (Status.COMPILE_ERROR, str(exc))
        except Exception as exc:  # noqa: BLE001 - an import or syntax error in the solution is reported per workload
            return None, (Status.COMPILE_ERROR, _describe_exception(exc))

    def _base(self, workload: Workload, index: int, status: Status, message: str) -> WorkloadResult:
        return self.scorer.base(workload, index, status, message, self.baseline.get(workload.uuid))

    def run_workload(self, call: SolutionCaller, workload: Workload, index: int) -> WorkloadResult:
        """The trials and the timings under the launch audit, whose verdict comes last; the optional kernel profile
        after it (torch.profiler takes CUPTI over)."""
        pool = [allocate_inputs(workload.dims, self.device) for _ in range(self.options.input_sets)]
        output_pool = [allocate_outputs(workload, self.device) for _ in range(self.options.input_sets)]
        with LaunchAudit(self.device) as audit:
            call.audit = audit
            result = self._trials_and_timings(call, workload, index, pool, output_pool)
        if audit.failure:
            result.flags.append("NOT_AUDITED")
        if verdict := audit.verdict():
            result.status, result.message = Status.REWARD_HACK, verdict
        if self.options.kernels and self.device.type == "cuda" and result.call_latency is not None:
            prepare = _redrawn_in_place(pool[0], output_pool[0], workload.dims, unpredictable_seeds())
            result.kernels = profile_kernels(lambda i: call(pool[0], output_pool[0]), prepare, self.device)
        return result

    def _trials_and_timings(
        self,
        call: SolutionCaller,
        workload: Workload,
        index: int,
        pool: list[dict[str, torch.Tensor]],
        output_pool: list[list[torch.Tensor]],
    ) -> WorkloadResult:
        dims = workload.dims
        trials: list[TrialReport] = []
        earlier: list[list[torch.Tensor]] = []
        late_work = LateWorkWatch()
        for trial in range(self.options.trials + LATE_WORK_RECHECKS):
            recheck = trial >= self.options.trials
            if recheck and late_work.sightings != 1:
                break
            near_duplicate = trial == self.options.trials - 1 and trial >= 2
            k = 0 if near_duplicate else trial % len(pool)
            seed = trial_seed(self.options.seed, index, 0 if near_duplicate else trial)
            inputs = fill_inputs(pool[k], dims, seed)
            validate_token_indices(inputs["token_indices"], dims.batch_seq_len)
            if near_duplicate:
                redraw(inputs, "grad_output", trial_seed(self.options.seed, index, trial))
            report, produced = check_call(call, workload, inputs, output_pool[k], self.device, seed, self._pristine, late_work)
            replayed = next((j for j, old in enumerate(earlier) if produced and all(map(_same_bits, produced, old))), None)
            if replayed is not None:
                report.status = Status.REWARD_HACK
                report.message = f"outputs identical to trial {replayed}'s although the inputs differ: replayed outputs"
            if near_duplicate:
                report.message = "(trial 0's inputs with grad_output redrawn) " + report.message
            if recheck:
                report.message = "(a trial added after one unconfirmed sighting of late GPU work) " + report.message
            if report.status is Status.PASSED:
                earlier.append([out.clone() for out in produced])
            trials.append(report)
            if report.status is not Status.PASSED:
                break
        del earlier
        status = worst([t.status for t in trials])
        failing = next((t for t in trials if t.status is not Status.PASSED), None)
        result = self._base(workload, index, status, f"trial seed {failing.seed}: {failing.message}" if failing else "")
        result.trials = trials
        if status in (Status.PASSED, Status.INCORRECT_NUMERICAL):
            self._time(call, workload, pool, output_pool, result)
        return result

    def _time(
        self,
        call: SolutionCaller,
        workload: Workload,
        pool: list[dict[str, torch.Tensor]],
        output_pool: list[list[torch.Tensor]],
        result: WorkloadResult,
    ) -> None:
        """Device time over the input sets, call latency and host cost at fresh addresses, then the checks of the
        timed calls' outputs (TimedOutputChecks) and of the last calls' inputs; the optional CUDA-graph, mixed-T and
        sustained timings last."""
        seeds = unpredictable_seeds()
        device_checks, latency_checks = TimedOutputChecks(), TimedOutputChecks()
        try:
            result.device_time, on_sets = self._time_device(call, workload.dims, pool, output_pool, seeds, device_checks)
            floor_latency, floor_host = time_launch_floor(self.device, self.options.timing)
            result.launch_floor = LaunchFloor(latency_us=floor_latency.mean_us, host_us=floor_host.median_us)
            result.call_latency, result.host, fresh = self._time_call_latency(
                call, workload.dims, pool[0], output_pool[0], seeds, latency_checks
            )
        except Exception as exc:  # noqa: BLE001 - a failure while timing is the solution's result
            result.status, result.message = Status.RUNTIME_ERROR, "during timing: " + _describe_exception(exc)
            return
        if self.device.type == "cuda" and result.host.median_us > result.device_time.mean_us:
            result.flags.append("HOST_BOUND")
        result.timed_checks = TimedChecks(
            poison_checked=device_checks.calls + latency_checks.calls,
            verified_device_time_calls=[c.index for c in device_checks.kept],
            verified_call_latency_calls=[c.index for c in latency_checks.kept],
        )
        if result.status is Status.PASSED:
            self._verify_timed_outputs(workload, device_checks, latency_checks, [*on_sets, fresh], result)
        if self.options.cuda_graph:
            result.cuda_graph = self._time_graph(call, workload, pool[0], output_pool[0], seeds)
        if self.options.mixed_tokens:
            result.mixed_tokens = self._time_mixed_tokens(call, workload, seeds)
        if self.options.sustained_s > 0:
            result.sustained = self._time_sustained(call, workload, pool, output_pool, seeds)
            if result.sustained.harness_paced(result.device_time.mean_us):
                result.flags.append("HARNESS_PACED")

    def _time_device(
        self,
        call: SolutionCaller,
        dims: Dims,
        pool: list[dict[str, torch.Tensor]],
        output_pool: list[list[torch.Tensor]],
        seeds: Iterator[int],
        checks: TimedOutputChecks,
    ) -> tuple[TimingStats, list[TimedCall]]:
        """Device time rotating over the input sets, redrawn in place before each call; the last call on each set."""
        last: list[TimedCall | None] = [None] * len(pool)

        def prepare(k: int) -> None:
            seed = next(seeds)
            fill_inputs(pool[k], dims, seed)
            guards.poison(output_pool[k])
            checks.current = last[k] = TimedCall(pool[k], seed)

        def timed_call(k: int) -> None:
            last[k].outputs = call(pool[k], output_pool[k])

        timing = time_device(timed_call, prepare, len(pool), self.device, self.options.timing, checks.after)
        return timing, [c for c in last if c is not None and c.outputs]

    def _time_call_latency(
        self,
        call: SolutionCaller,
        dims: Dims,
        inputs: dict[str, torch.Tensor],
        outputs: list[torch.Tensor],
        seeds: Iterator[int],
        checks: TimedOutputChecks,
    ) -> tuple[TimingStats, TimingStats, TimedCall]:
        """Call latency and host cost, every call drawn at fresh addresses shaped like `inputs` and `outputs`; the last
        call."""
        config = self.options.timing
        fresh = FreshAddresses([*inputs.values(), *outputs], config.warmup_calls + config.max_calls)
        buffers: list[torch.Tensor] = []

        def prepare(i: int) -> None:
            tensors = fresh.at(i)
            drawn, buffers[:] = dict(zip(inputs, tensors)), tensors[len(inputs) :]
            seed = next(seeds)
            fill_inputs(drawn, dims, seed)
            guards.poison(buffers)
            checks.current = TimedCall(drawn, seed)
            call.audit.watch_processes()  # a process that would write this call's outputs late is alive by now

        def timed_call(i: int) -> None:
            checks.current.outputs = call(checks.current.inputs, buffers)

        latency, host = time_call_latency(timed_call, prepare, self.device, config, checks.after)
        return latency, host, checks.current

    def _time_graph(
        self,
        call: SolutionCaller,
        workload: Workload,
        inputs: dict[str, torch.Tensor],
        outputs: list[torch.Tensor],
        seeds: Iterator[int],
    ) -> GraphTiming:
        """Replays of the call captured once in a CUDA graph, on inputs redrawn in place; the last replay's outputs must
        pass the check."""
        if self.device.type != "cuda":
            return GraphTiming(error="CUDA graphs need a CUDA device")
        try:
            graph, produced = capture_graph(lambda: call(inputs, outputs), self.device)
        except Exception as exc:  # noqa: BLE001 - a solution that cannot be captured is this mode's result
            return GraphTiming(error="capture failed: " + _describe_exception(exc))
        prepare = _redrawn_in_place(inputs, outputs, workload.dims, seeds)
        try:
            timing, _ = time_call_latency(lambda i: graph.replay(), prepare, self.device, self.options.timing)
        except Exception as exc:  # noqa: BLE001
            return GraphTiming(error="replay failed: " + _describe_exception(exc))
        _, status, detail = check_outputs(workload, produced, compute_reference(inputs))
        return GraphTiming(
            timing=timing, error="" if status is Status.PASSED else f"the last replay's outputs fail the check: {detail}"
        )

    def _time_mixed_tokens(self, call: SolutionCaller, workload: Workload, seeds: Iterator[int]) -> MixedTokensTiming | None:
        """Call latency of calls cycling through the T nearest the workload's (results.MixedTokensTiming): each call at
        fresh addresses, the (T, .) inputs cut from pools shaped for the largest T; one call of each T, drawn at random
        before the first, checked against the reference outside the timed window. None where B = 1 leaves no other T."""
        tokens, rounds = mixed_token_counts(workload.dims), MIXED_TOKEN_ROUNDS
        if not tokens:
            return None
        inputs = allocate_inputs(replace(workload.dims, num_tokens=max(tokens)), self.device)
        fresh = FreshAddresses([*inputs.values(), *allocate_outputs(workload, self.device)], len(tokens) * rounds)
        del inputs
        verified = {t: 1 + secrets.randbelow(rounds - 1) for t in tokens}  # the timed round whose call is checked
        failures: dict[int, str] = {}
        current: dict[str, torch.Tensor] = {}
        buffers: list[torch.Tensor] = []

        def prepare(i: int) -> None:
            t = tokens[i % len(tokens)]
            tensors = fresh.at(i)
            current.clear()
            current.update((spec.name, x[:t] if spec.shape[0] == "T" else x) for spec, x in zip(INPUTS, tensors))
            buffers[:] = tensors[len(INPUTS) :]
            fill_inputs(current, replace(workload.dims, num_tokens=t), next(seeds))
            guards.poison(buffers)

        def timed_call(i: int) -> None:
            buffers[:] = call(current, buffers)

        def after(i: int) -> None:
            t = tokens[i % len(tokens)]
            if i // len(tokens) == verified[t]:
                shaped = workload.model_copy(update={"num_tokens": t})
                _, status, detail = check_outputs(shaped, buffers, compute_reference(current))
                if status is not Status.PASSED:
                    failures[t] = detail

        timed = len(tokens) * (rounds - 1)
        # every round, whatever the time: the checked calls are in all of them
        config = replace(self.options.timing, warmup_calls=len(tokens), min_calls=timed, max_calls=timed,
                         batch_calls=len(tokens), max_seconds=math.inf)  # fmt: skip
        samples: list[float] = []  # timed call k is of T tokens[k % len(tokens)]: the untimed round is one whole cycle
        try:
            latency, host = time_call_latency(timed_call, prepare, self.device, config, after, samples)
        except Exception as exc:  # noqa: BLE001 - a solution that fails at another T is this timing's result
            return MixedTokensTiming(tokens=tokens, rounds=rounds, error="during the calls: " + _describe_exception(exc))
        if failures:
            error = "outputs fail the check: " + "; ".join(f"T = {t}: {failures[t]}" for t in tokens if t in failures)
            return MixedTokensTiming(tokens=tokens, rounds=rounds, error=error)
        tokens_us = [statistics.fmean(samples[k :: len(tokens)]) for k in range(len(tokens))]
        return MixedTokensTiming(tokens=tokens, rounds=rounds, timing=latency, host=host, tokens_us=tokens_us)

    def _time_sustained(
        self,
        call: SolutionCaller,
        workload: Workload,
        pool: list[dict[str, torch.Tensor]],
        output_pool: list[list[torch.Tensor]],
        seeds: Iterator[int],
    ) -> SustainedTiming:
        """The calls over the input sets back to back (timing.time_sustained, results.SustainedTiming), the first
        options.sustained_s seconds untimed. Before each call only grad_output is drawn anew, which changes every output,
        and before one in FRESH_WEIGHT_CALLS at random a block of each weight too (draw_sustained); the outputs are not
        poisoned: redrawing every input and filling the outputs (about 3.5 GB of memory traffic per call at the public
        shapes, a millisecond) would put memory-bound work between the calls, most of the GPU's time at T = 296, and
        hold it below its power limit. The sampled calls' outputs (sampled among those with fresh weight blocks) must
        pass TimedCall.verify, and so must those of a last call on each input set, with fresh blocks, right after the
        timed ones: a copy of a weight kept from the earlier calls fails there however few calls the timing made."""
        settle_s, checks = self.options.sustained_s, TimedOutputChecks(scan_unwritten=False, fresh_weights_only=True)
        choose = secrets.SystemRandom()
        base_seeds = [next(seeds) for _ in pool]
        for inputs, seed in zip(pool, base_seeds):
            fill_inputs(inputs, workload.dims, seed)
        last: list[TimedCall | None] = [None] * len(pool)
        put_back: list[Callable[[], None]] = [lambda: None] * len(pool)

        def draw(k: int, fresh_weights: bool) -> None:
            seed = next(seeds)
            put_back[k]()  # the set's base values again, so that each call's inputs replay from two seeds
            put_back[k] = draw_sustained(pool[k], seed, fresh_weights)
            checks.current = last[k] = TimedCall(pool[k], seed, base_seed=base_seeds[k], fresh_weights=fresh_weights)

        def timed_call(k: int) -> None:
            last[k].outputs = call(pool[k], output_pool[k])

        try:
            run = time_sustained(timed_call, lambda k: draw(k, choose.randrange(FRESH_WEIGHT_CALLS) == 0), len(pool),
                                 self.device, self.options.timing, settle_s, checks.after)  # fmt: skip
            for k in range(len(pool)):
                draw(k, fresh_weights=True)
                timed_call(k)
        except Exception as exc:  # noqa: BLE001 - a failure in the long run of calls is this timing's result
            return SustainedTiming(settle_s=settle_s, error="during the calls: " + _describe_exception(exc))
        for checked in [*checks.kept, *last]:
            _, status, detail = checked.verify(workload, self.device)
            if status is not Status.PASSED:
                error = f"outputs of timed calls (seed {checked.seed}) fail the check: {detail}"
                return SustainedTiming(settle_s=settle_s, settle_calls=run.settle_calls, error=error)
        return SustainedTiming(
            settle_s=settle_s,
            settle_calls=run.settle_calls,
            timing=run.timing,
            host_us=run.host_us,
            harness_host_us=run.harness_host_us,
        )

    def _verify_timed_outputs(
        self,
        workload: Workload,
        device_checks: TimedOutputChecks,
        latency_checks: TimedOutputChecks,
        last: list[TimedCall],
        result: WorkloadResult,
    ) -> None:
        """After timing: no timing saw late work as a habit (LATE_WORK_TIMED_SHARE); no timed call left an output
        element unwritten (or NaN); the sampled calls' outputs and those of the last call on each input set and at
        fresh addresses match the reference; those last calls' inputs are unmodified."""
        habit = late_work_habit(result)
        if habit:
            result.status, result.message = Status.REWARD_HACK, habit
            return
        for name, checks in (("device-time", device_checks), ("call-latency", latency_checks)):
            poisoned = checks.poisoned_calls()
            if poisoned:
                result.status = Status.REWARD_HACK
                result.message = (f"{len(poisoned)} of {checks.calls} {name} calls left output elements unwritten or NaN "
                                  f"(calls {', '.join(map(str, poisoned[:8]))}) although the trials passed")  # fmt: skip
                return
        for checked in last:
            mutated = guards.mutated_inputs(checked.drawn_inputs(workload.dims, self.device), checked.inputs)
            if mutated:
                result.status = Status.REWARD_HACK
                result.message = f"inputs modified during timing (seed {checked.seed}): {', '.join(mutated)}"
                return
        for checked in [*device_checks.kept, *latency_checks.kept, *last]:
            checks, status, detail = checked.verify(workload, self.device)
            if status is not Status.PASSED:
                if any(_grossly_wrong(check) for check in checks):
                    result.status = Status.REWARD_HACK
                    result.message = (
                        f"outputs of timed calls (seed {checked.seed}) are wrong although the trials passed: {detail}"
                    )
                else:
                    result.status = Status.INCORRECT_NUMERICAL
                    result.message = (
                        f"outputs of timed calls (seed {checked.seed}) narrowly miss the tolerance although the trials passed "
                        f"(numerically marginal, not counted as cheating): {detail}"
                    )
                return


def late_work_habit(result: WorkloadResult) -> str:
    """What a timing found where it saw late work as a habit (LATE_WORK_TIMED_SHARE), or ""."""
    for what, timing in (("device-time batches", result.device_time), ("call-latency calls", result.call_latency)):
        late = timing.late_work if timing else None
        if late and late.late >= max(LATE_WORK_TIMED_MIN, LATE_WORK_TIMED_SHARE * late.measured):
            return (f"GPU work ran after {late.late} of {late.measured} {what} had returned ({late.mean_us:.1f} us each "
                    f"on average, up to {late.max_us:.1f}, charged to the timing): work left on another stream")  # fmt: skip
    return ""


def _redrawn_in_place(
    inputs: dict[str, torch.Tensor], outputs: list[torch.Tensor], dims: Dims, seeds: Iterator[int]
) -> Callable[[int], None]:
    """A timer's `prepare` for calls on one input set: the inputs redrawn in place from the next seed, the outputs
    poisoned."""

    def prepare(i: int) -> None:
        fill_inputs(inputs, dims, next(seeds))
        guards.poison(outputs)

    return prepare


# Timed calls of each timing whose outputs are kept and verified in full against the reference after the timing.
VERIFIED_TIMED_CALLS = 3


class TimedOutputChecks:
    """The checks of one timing's calls, made outside the timed window as each call ends (the timers' `after`).

    Every call's outputs are checked for the poison the harness filled them with (an element left unwritten) and for
    NaN. VERIFIED_TIMED_CALLS of the calls, a uniformly random sample drawn from the operating system's entropy by
    reservoir sampling as each call ends, keep a copy of their outputs for verification in full against the reference
    after the timing: no call can know, when it returns, whether it will be verified, so a solution that skips or
    fakes its work on a fraction f of the calls is caught with probability 1 - (1 - f)^VERIFIED_TIMED_CALLS per timing
    (and surely where it leaves any output unwritten). With `scan_unwritten` off (the sustained timing, whose outputs
    are not poisoned) the sample alone; with `fresh_weights_only` (the sustained timing) the sample is drawn from the
    calls whose weight blocks were drawn anew, which no call can tell from the others without reading its weights.
    """

    def __init__(self, scan_unwritten: bool = True, fresh_weights_only: bool = False) -> None:
        self.scan_unwritten = scan_unwritten
        self.fresh_weights_only = fresh_weights_only
        self.current: TimedCall | None = None  # the call being made (set by the timing's prepare)
        self.calls = 0
        self._candidates = 0  # the calls the sample is drawn from
        self.kept: list[TimedCall] = []
        self._unwritten: list[torch.Tensor] = []  # per call, whether an output element still holds NaN
        self._random = secrets.SystemRandom()

    def after(self, i: int) -> None:
        if self.scan_unwritten:
            produced = [out for out in self.current.outputs if isinstance(out, torch.Tensor)]
            left = [torch.isnan(out).any() for out in produced if out.is_floating_point()]
            self._unwritten.append(torch.stack(left).any() if left else torch.zeros((), dtype=torch.bool))
        self.calls += 1
        if self.fresh_weights_only and not self.current.fresh_weights:
            return
        self._candidates += 1
        n = self._candidates
        slot = n - 1 if n <= VERIFIED_TIMED_CALLS else self._random.randrange(n)
        if slot < VERIFIED_TIMED_CALLS:
            outputs = [o.clone() if isinstance(o, torch.Tensor) else o for o in self.current.outputs]
            self.kept[slot : slot + 1] = [replace(self.current, inputs={}, outputs=outputs, index=i)]

    def poisoned_calls(self) -> list[int]:
        """The calls (in order, from 0) whose outputs held NaN when they ended."""
        return [i for i, flag in enumerate(torch.stack(self._unwritten).tolist()) if flag] if self._unwritten else []


@dataclass
class TimedCall:
    """A timed call whose outputs are verified after timing: its inputs, the seed they were drawn from, its outputs
    and its number among the timing's calls; where `base_seed` drew the inputs and draw_sustained then drew parts of
    them anew from `seed` (the sustained timing), both, and whether it drew the weights' blocks too."""

    inputs: dict[str, torch.Tensor]
    seed: int
    outputs: list[object] = field(default_factory=list)
    index: int = 0
    base_seed: int | None = None
    fresh_weights: bool = False

    def drawn_inputs(self, dims: Dims, device: torch.device) -> dict[str, torch.Tensor]:
        """The call's inputs drawn again from their seeds."""
        return self._draw(dims, device)[0]

    def _draw(self, dims: Dims, device: torch.device) -> tuple[dict[str, torch.Tensor], Callable[[], None]]:
        """The call's inputs drawn again from their seeds, and what puts the base set's weight blocks back in them."""
        if self.base_seed is None:
            return generate_inputs(dims, self.seed, device), lambda: None
        inputs = generate_inputs(dims, self.base_seed, device)
        return inputs, draw_sustained(inputs, self.seed, self.fresh_weights)

    def verify(self, workload: Workload, device: torch.device) -> tuple[list[OutputCheck], Status, str]:
        """check_outputs of the call's outputs against the reference on its inputs drawn again; a sustained call's
        outputs where it drew fresh weight blocks must also lie nearer it than such a block moves it (stale_outputs),
        or they are INCORRECT_NUMERICAL."""
        inputs, put_back = self._draw(workload.dims, device)
        reference = compute_reference(inputs)
        checks, status, detail = check_outputs(workload, self.outputs, reference)
        if status is not Status.PASSED or not self.fresh_weights:
            return checks, status, detail
        fresh = {name: inputs[name].clone() for name in FRESH_WEIGHT_AXES}
        put_back()  # inputs' weights as the base set drew them
        without_each = [compute_reference({**inputs, **fresh, name: inputs[name]}) for name in FRESH_WEIGHT_AXES]
        stale = stale_outputs(self.outputs, reference, without_each)
        if stale:
            return checks, Status.INCORRECT_NUMERICAL, f"{stale} no nearer the reference than a fresh weight block moves it"
        return checks, status, detail


class Interrupted(Exception):
    """A run stopped by a signal: `results` holds each solution's workloads that finished before it (merge)."""

    def __init__(self, results: dict[str, BenchResult]):
        super().__init__("interrupted")
        self.results = results


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


@contextlib.contextmanager
def stopped_by_signals() -> Iterator[None]:
    """SIGTERM raises KeyboardInterrupt in the main thread for the duration, as SIGINT does."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_side_by_side(
    benches: list[Bench],
    suite: Suite,
    workloads: list[Workload],
    on_done: Callable[[Bench, WorkloadResult], None] = lambda bench, result: None,
) -> list[BenchResult]:
    """Run several solutions in one process, interleaved per workload, so that clock drift hits all alike.

    The baseline solution, if present, runs first on each workload and its latency becomes the others'
    T_b for that workload at once. After each solution is loaded and after each workload the backstop: the check of the
    watched functions taken before any solution is loaded, held here where no solution can replace it
    (guards.patch_check). Run after each load, it puts back what one solution replaced before the next one takes its
    snapshot of the harness, and marks the solution that did. SIGINT or SIGTERM stops the run: Interrupted holds the
    workloads that finished.
    """
    by_name = {bench.solution.name: bench for bench in benches}
    ordered = [by_name[name] for name in baseline_first(by_name)]
    patched = guards.patch_check()
    for bench in ordered:
        bench.start()
        replaced = patched()  # before the method is looked up: it puts back a replaced one
        bench.mark_patched_when_loaded(replaced)
    results: dict[str, list[WorkloadResult]] = {bench.solution.name: [] for bench in ordered}
    try:
        with stopped_by_signals():
            for workload in workloads:
                for bench in ordered:
                    result = bench.workload(suite, workload)
                    replaced = patched()  # before any harness code is looked up again: it puts back what was replaced
                    result = bench.mark_patched(result, replaced)
                    results[bench.solution.name].append(result)
                    if bench.solution.name == BASELINE_SOLUTION and result.latency_us is not None:
                        for other in ordered:
                            other.baseline[workload.uuid] = Baseline.of(result)
                    on_done(bench, result)
    except KeyboardInterrupt:
        raise Interrupted({bench.solution.name: bench.finish(suite, results[bench.solution.name]) for bench in benches}) from None
    return [bench.finish(suite, results[bench.solution.name]) for bench in benches]
