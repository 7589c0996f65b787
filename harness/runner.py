"""The bench driver: for each workload, correctness trials on fresh seeded inputs, then timing.

One trial: draw inputs from a seed, compute the float32 reference under strict settings, poison the
outputs, snapshot the inputs and the process-wide numeric settings, call the solution, then check (in
this order) its exception, the settings, the inputs, aliasing, and each output against the reference.
A workload passes when every trial passes. A workload that completed (passed, or only numerically
wrong) is then timed over rotating input sets, and the outputs of its last timed calls are checked
again, so that a solution cannot behave differently when it is being timed.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from harness import guards, provenance
from harness.correctness import check_output
from harness.problem import INPUTS, OUTPUTS, bytes_moved, flops
from harness.registry import Solution
from harness.results import (
    BenchConfig,
    BenchResult,
    SolutionRecord,
    TrialReport,
    WorkloadResult,
    load_calibration,
    load_result,
    result_path,
)
from harness.roofline import DevicePeaks, datasheet_peaks, percent_of_sol, sol_score, sol_time_us
from harness.status import Status, worst
from harness.timing import TimingConfig, time_solution
from harness.workloads import Suite, Workload
from reference import generate_inputs, reference_backward

BASELINE_SOLUTION = "reference_fp32"


@dataclass
class BenchOptions:
    trials: int
    seed: int = 0
    input_sets: int = 3
    timing: TimingConfig = field(default_factory=TimingConfig)


def trial_seed(base_seed: int, workload_index: int, trial: int) -> int:
    """Distinct, reproducible seeds: one per (workload, trial); timing sets use trial numbers past the trials."""
    return base_seed * 1_000_003 + workload_index * 1_009 + trial


def _describe_exception(exc: BaseException) -> str:
    frames = traceback.format_exception(type(exc), exc, exc.__traceback__)
    return f"{type(exc).__name__}: {exc}\n" + "".join(frames[-3:]).rstrip()


class SolutionCaller:
    """Calls a loaded entry point with the harness's calling convention and returns the 5 outputs."""

    def __init__(self, solution: Solution, entry_point: Callable[..., object]):
        self.dps = solution.spec.destination_passing_style
        self.entry_point = entry_point

    def __call__(self, inputs: dict[str, torch.Tensor], outputs: list[torch.Tensor]) -> list[object]:
        if self.dps:
            self.entry_point(*inputs.values(), *outputs)
            return list(outputs)
        returned = self.entry_point(*inputs.values())
        if not isinstance(returned, (tuple, list)) or len(returned) != len(OUTPUTS):
            raise TypeError(f"expected a tuple of {len(OUTPUTS)} output tensors, got {type(returned).__name__}")
        return list(returned)


def allocate_outputs(workload: Workload, device: torch.device) -> list[torch.Tensor]:
    return [torch.empty(spec.concrete_shape(workload.dims), dtype=spec.dtype, device=device) for spec in OUTPUTS]


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def check_call(
    call: SolutionCaller,
    workload: Workload,
    inputs: dict[str, torch.Tensor],
    outputs: list[torch.Tensor],
    reference: tuple[torch.Tensor, ...],
    device: torch.device,
    seed: int,
) -> TrialReport:
    """One guarded call of the solution and the verdict on it."""
    snapshot = guards.snapshot(inputs)
    settings = guards.numeric_settings()
    guards.poison(outputs)
    _synchronize(device)
    try:
        produced = call(inputs, outputs)
        _synchronize(device)
    except Exception as exc:  # a solution's failure of any kind is a result, not a crash of the harness
        guards.restore_numeric_settings(settings)
        return TrialReport(seed=seed, status=Status.RUNTIME_ERROR, message=_describe_exception(exc))

    changed = guards.changed_settings(settings)
    guards.restore_numeric_settings(settings)
    if changed:
        return TrialReport(seed=seed, status=Status.REWARD_HACK, message=f"changed process-wide settings: {', '.join(changed)}")
    mutated = guards.mutated_inputs(snapshot, inputs)
    if mutated:
        return TrialReport(seed=seed, status=Status.REWARD_HACK, message=f"modified inputs: {', '.join(mutated)}")
    for spec, out in zip(OUTPUTS, produced):
        aliased = guards.aliased_inputs(out, inputs) if isinstance(out, torch.Tensor) else []
        if aliased:
            return TrialReport(
                seed=seed, status=Status.REWARD_HACK, message=f"output {spec.name} aliases input {', '.join(aliased)}"
            )
    checks = [
        check_output(spec, spec.concrete_shape(workload.dims), out, ref, workload.tolerance)
        for spec, out, ref in zip(OUTPUTS, produced, reference)
    ]
    status = worst([c.status for c in checks])
    message = "; ".join(f"{c.name}: {c.message}" for c in checks if c.status is not Status.PASSED)
    return TrialReport(seed=seed, status=status, message=message, outputs=checks)


def compute_reference(inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
    with guards.strict_fp32():
        return reference_backward(*inputs.values())


class Bench:
    """Runs one solution over workloads on one device and assembles its BenchResult."""

    def __init__(self, solution: Solution, device: torch.device, options: BenchOptions, results_dir: Path):
        self.solution = solution
        self.device = device
        self.options = options
        self.results_dir = results_dir
        self.device_slug = provenance.device_slug(device)
        self.peaks = datasheet_peaks(provenance.device_name(device)) if device.type == "cuda" else None
        calibration = load_calibration(results_dir, self.device_slug) if device.type == "cuda" else None
        self.measured_peaks = (
            DevicePeaks("measured", calibration.matmul_flops_per_s, calibration.copy_bytes_per_s, calibration.method)
            if calibration
            else None
        )
        self.baseline = self._load_baseline()

    def _load_baseline(self) -> dict[str, float]:
        path = result_path(self.results_dir, self.device_slug, BASELINE_SOLUTION)
        if self.solution.name == BASELINE_SOLUTION or not path.exists():
            return {}
        return {w.uuid: w.latency_us for w in load_result(path).workloads if w.latency_us is not None}

    def start(self) -> None:
        """Load the solution (an import error becomes every workload's COMPILE_ERROR) and note the clocks."""
        started = time.perf_counter()
        self._clocks_before = provenance.read_clocks(self.device)
        self._call, self._setup_problem = self._prepare_solution()
        self._busy_seconds = time.perf_counter() - started  # this solution's own time, also when interleaved

    def workload(self, suite: Suite, workload: Workload) -> WorkloadResult:
        started = time.perf_counter()
        index = suite.workloads.index(workload)
        if self._setup_problem is not None:
            result = self._base(workload, index, *self._setup_problem)
        else:
            result = self.run_workload(self._call, workload, index)
        self._busy_seconds += time.perf_counter() - started
        return result

    def finish(self, suite: Suite, results: list[WorkloadResult]) -> BenchResult:
        return BenchResult(
            solution=self._record(),
            config=BenchConfig(
                suite=suite.name,
                trials=self.options.trials,
                seed=self.options.seed,
                input_sets=self.options.input_sets,
                target_rel_stderr=self.options.timing.target_rel_stderr,
                max_calls=self.options.timing.max_calls,
            ),
            provenance=provenance.collect(self.device, self._clocks_before),
            peaks_source=self.peaks.source if self.peaks else None,
            calibration_source=self.measured_peaks.source if self.measured_peaks else None,
            duration_s=self._busy_seconds,
            workloads=results,
        )

    def run(self, suite: Suite, workloads: list[Workload], on_done: Callable[[WorkloadResult], None] = lambda r: None) -> BenchResult:
        return run_side_by_side([self], suite, workloads, lambda bench, result: on_done(result))[0]

    def _prepare_solution(self) -> tuple[SolutionCaller | None, tuple[Status, str] | None]:
        if not self.solution.runs_on(self.device.type):
            where = ", ".join(self.solution.spec.devices)
            return None, (Status.SKIPPED, f"solution '{self.solution.name}' runs on {where} only; this run is on {self.device.type}")
        try:
            return SolutionCaller(self.solution, self.solution.load_entry_point()), None
        except Exception as exc:  # an import or syntax error in the solution is reported per workload
            return None, (Status.COMPILE_ERROR, _describe_exception(exc))

    def _record(self) -> SolutionRecord:
        spec = self.solution.spec
        return SolutionRecord(
            name=spec.name,
            description=spec.description,
            author=spec.author,
            license=spec.license,
            language=spec.language,
            entry_point=spec.entry_point,
            destination_passing_style=spec.destination_passing_style,
            source_sha256=self.solution.source_hashes(),
        )

    def _base(self, workload: Workload, index: int, status: Status, message: str) -> WorkloadResult:
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
            sol_us=sol_time_us(dims, self.peaks) if self.peaks else None,
            sol_us_measured=sol_time_us(dims, self.measured_peaks) if self.measured_peaks else None,
            baseline_us=self.baseline.get(workload.uuid),
        )

    def run_workload(self, call: SolutionCaller, workload: Workload, index: int) -> WorkloadResult:
        trials = []
        for trial in range(self.options.trials):
            seed = trial_seed(self.options.seed, index, trial)
            inputs = generate_inputs(workload.dims, seed, self.device)
            reference = compute_reference(inputs)
            report = check_call(call, workload, inputs, allocate_outputs(workload, self.device), reference, self.device, seed)
            trials.append(report)
            del inputs, reference
            if report.status is not Status.PASSED:
                break
        status = worst([t.status for t in trials])
        failing = next((t for t in trials if t.status is not Status.PASSED), None)
        result = self._base(workload, index, status, f"trial seed {failing.seed}: {failing.message}" if failing else "")
        result.trials = trials
        if status in (Status.PASSED, Status.INCORRECT_NUMERICAL):
            self._time(call, workload, index, result)
        return result

    def _time(self, call: SolutionCaller, workload: Workload, index: int, result: WorkloadResult) -> None:
        seeds = [trial_seed(self.options.seed, index, self.options.trials + k) for k in range(self.options.input_sets)]
        input_sets = [generate_inputs(workload.dims, seed, self.device) for seed in seeds]
        output_sets = [allocate_outputs(workload, self.device) for _ in seeds]
        produced: list[list[object]] = [[] for _ in seeds]

        def timed_call(k: int) -> None:
            produced[k] = call(input_sets[k], output_sets[k])

        try:
            timing = time_solution(timed_call, lambda k: guards.poison(output_sets[k]), len(seeds), self.device, self.options.timing)
        except Exception as exc:
            result.status, result.message = Status.RUNTIME_ERROR, "during timing: " + _describe_exception(exc)
            return
        result.timing = timing
        if result.status is Status.PASSED:
            self._verify_timed_outputs(workload, input_sets, produced, seeds, result)
        self._score(result)

    def _verify_timed_outputs(
        self, workload: Workload, input_sets: list[dict[str, torch.Tensor]], produced: list[list[object]], seeds: list[int], result: WorkloadResult
    ) -> None:
        """The outputs left by the last timed call on each input set must match the reference too."""
        for inputs, outputs, seed in zip(input_sets, produced, seeds):
            mutated = guards.mutated_inputs(generate_inputs(workload.dims, seed, self.device), inputs)
            if mutated:
                result.status = Status.REWARD_HACK
                result.message = f"inputs modified during timing (seed {seed}): {', '.join(mutated)}"
                return
            reference = compute_reference(inputs)
            checks = [
                check_output(spec, spec.concrete_shape(workload.dims), out, ref, workload.tolerance)
                for spec, out, ref in zip(OUTPUTS, outputs, reference)
            ]
            bad = [c for c in checks if c.status is not Status.PASSED]
            if bad:
                detail = "; ".join(f"{c.name}: {c.message}" for c in bad)
                result.status = Status.REWARD_HACK
                result.message = f"outputs of timed calls (seed {seed}) fail although the trials passed: {detail}"
                return

    def _score(self, result: WorkloadResult) -> None:
        latency = result.latency_us
        assert latency is not None
        if result.sol_us is not None:
            result.percent_of_sol = percent_of_sol(latency, result.sol_us)
            if latency < result.sol_us:
                result.status = Status.INVALID_TIMING
                result.message = f"mean {latency:.1f} us is below the roofline's {result.sol_us:.1f} us: physically impossible"
        if result.sol_us_measured is not None:
            result.percent_of_sol_measured = percent_of_sol(latency, result.sol_us_measured)
        baseline = latency if self.solution.name == BASELINE_SOLUTION else result.baseline_us
        if baseline is not None and result.sol_us is not None and result.status is Status.PASSED:
            result.baseline_us = baseline
            result.sol_score = sol_score(latency, result.sol_us, baseline)


def run_side_by_side(
    benches: list[Bench],
    suite: Suite,
    workloads: list[Workload],
    on_done: Callable[[Bench, WorkloadResult], None] = lambda bench, result: None,
) -> list[BenchResult]:
    """Run several solutions in one process, interleaved per workload, so that clock drift hits all alike.

    The baseline solution, if present, runs first on each workload and its latency becomes the others'
    T_b for that workload at once.
    """
    ordered = sorted(benches, key=lambda bench: bench.solution.name != BASELINE_SOLUTION)
    for bench in ordered:
        bench.start()
    results: dict[str, list[WorkloadResult]] = {bench.solution.name: [] for bench in ordered}
    for workload in workloads:
        for bench in ordered:
            result = bench.workload(suite, workload)
            results[bench.solution.name].append(result)
            if bench.solution.name == BASELINE_SOLUTION and result.latency_us is not None:
                for other in ordered:
                    other.baseline[workload.uuid] = result.latency_us
            on_done(bench, result)
    return [bench.finish(suite, results[bench.solution.name]) for bench in benches]
