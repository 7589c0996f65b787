"""The bench driver: for each workload, correctness trials on fresh seeded inputs, then timing.

Every trial and every device-time call goes to one of a few input sets (the same addresses each time), redrawn
in place from a new seed just before the call, with outputs poisoned: trials and timed calls look alike, and a
solution that caches outputs by address or by a sample of the contents replays stale outputs. Call-latency
calls each get inputs and outputs at addresses of their own (timing.FreshAddresses), drawn the same way. The trials'
seeds are reproducible; the timed calls' come from the operating system's entropy, so that no solution can work out
a timed call's inputs, and compute its outputs, ahead of the call.

One trial (harness.reward_hacks.check_call): draw inputs, snapshot them, the process-wide numeric settings and the
watched functions, call the solution, then check (in this order) its exception, the reward-hack checks (threads
still running its code, patched functions, GPU work still running after it returned, the settings, the inputs, the
outputs' types and aliasing), each output against the float32 reference computed from the snapshot
(harness.correctness), and outputs identical to an earlier trial's (a replay). The last trial repeats the first
one's inputs with grad_output alone redrawn, so that a cache keyed on the other inputs replays. A workload passes
when every trial passes. A workload that completed (passed, or only numerically wrong) is then timed (device time,
then call latency and host cost: harness.timing), and the outputs of a random sample of the timed calls, of the last
timed call on each input set and of the last call at fresh addresses are checked again
(reward_hacks.verify_timed_outputs); where asked, the call replayed from a CUDA graph, calls whose T changes every
call (the mixed-T timing) and calls back to back (the sustained timing) are timed last, the checked calls of the
last two failing the workload where they fail. The trials and timings run under the launch audit
(harness.launch_audit: CUPTI where installed, NVML where the driver has it), whose verdict on GPU work issued by
another thread, or by a process the solution started, while no call was running comes last.
"""

from __future__ import annotations

import contextlib
import math
import secrets
import signal
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from harness import guards, provenance, reward_hacks
from harness.attribution import profile_kernels
from harness.launch_audit import LaunchAudit
from harness.registry import Solution, SolutionError
from harness.results import (
    BASELINE_SOLUTION,
    BenchConfig,
    BenchResult,
    GraphTiming,
    LaunchFloor,
    MixedTokensTiming,
    SolutionRecord,
    SustainedTiming,
    TimedChecks,
    TrialReport,
    WorkloadResult,
    baseline_first,
)
from harness.reward_hacks import (
    FRESH_WEIGHT_CALLS,
    LATE_WORK_RECHECKS,
    PROCESS_STATE_CHECKS,
    LateWorkWatch,
    SampledElements,
    SolutionCaller,
    TimedCall,
    TimedOutputChecks,
    describe_exception,
    draw_sustained,
    patched_message,
    written_outside,
)
from harness.scoring import Baseline, Scorer
from harness.status import Status, worst
from harness.timing import (
    FreshAddresses,
    TimingConfig,
    TimingStats,
    capture_graph,
    time_call_latency,
    time_device,
    time_launch_floor,
    time_sustained,
)
from harness.workloads import Suite, Workload
from reference import allocate_inputs, draw_normal, fill_inputs, validate_token_indices
from reference.problem import INPUTS, OUTPUTS, Dims


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


def trial_seed(base_seed: int, workload_index: int, trial: int) -> int:
    """Distinct, reproducible seeds: one per (workload, trial)."""
    return base_seed * 1_000_003 + workload_index * 1_009 + trial


def unpredictable_seeds() -> Iterator[int]:
    """The seeds of timed calls: drawn from the operating system's entropy as each call is prepared (a check that
    fails quotes its call's seed)."""
    while True:
        yield secrets.randbits(62)


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
    """The output buffers of a workload, each with guard bands around it (guards.guarded_empty)."""
    return [guards.guarded_empty(spec.concrete_shape(workload.dims), spec.dtype, device) for spec in OUTPUTS]


def _same_bits(a: object, b: torch.Tensor) -> bool:
    return (
        isinstance(a, torch.Tensor) and a.shape == b.shape and a.dtype == b.dtype and torch.equal(guards.bits(a), guards.bits(b))
    )


def redraw(inputs: dict[str, torch.Tensor], name: str, seed: int) -> None:
    """Replace one input's values by a fresh standard-normal draw (the near-duplicate trial)."""
    tensor = inputs[name]
    draw_normal(tensor, torch.Generator(device=tensor.device).manual_seed(seed))


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


class Bench:
    """Runs one solution over workloads on one device and assembles its BenchResult."""

    def __init__(self, solution: Solution, device: torch.device, options: BenchOptions, results_dir: Path):
        self.solution = solution
        # with its index, as tensors have it: torch.device("cuda") equals no tensor's device
        self.device = torch.device("cuda", torch.cuda.current_device()) if device == torch.device("cuda") else device
        self.options = options
        self.scorer = Scorer(self.device, results_dir, solution.name)
        self.baseline: dict[str, Baseline] = {} if solution.name == BASELINE_SOLUTION else self.scorer.baseline_from_file()

    def start(self) -> None:
        """Load the solution (an import error becomes every workload's COMPILE_ERROR) and note the clocks."""
        started = time.perf_counter()
        self._clocks_before = provenance.read_clocks(self.device)
        self._pristine = guards.Pristine.now(self.device)
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
        self._mark_for_the_run(result, patched_message(replaced))
        return self.scorer.rescore(result)

    def _mark_for_the_run(self, result: WorkloadResult, found: str) -> None:
        """REWARD_HACK for a change to the process's state, which keeps the solution marked for the rest of the run."""
        result.status, result.message = Status.REWARD_HACK, found
        self._tainted = f"on an earlier workload: {found}"

    def mark_patched_when_loaded(self, replaced: list[str]) -> None:
        """The backstop's verdict on what loading the solution replaced (run_side_by_side, where solutions share a
        process): every workload of the solution is REWARD_HACK."""
        if replaced:
            self._tainted = f"when it was loaded: {patched_message(replaced)}"

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
        if (reason := self.solution.skip_reason(self.device)) is not None:
            return None, (Status.SKIPPED, reason)
        try:
            return SolutionCaller(self.solution, self.solution.load_entry_point()), None
        except SolutionError as exc:  # the registry's own finding says all: no harness frames after it
            return None, (Status.COMPILE_ERROR, str(exc))
        except Exception as exc:  # noqa: BLE001 - an import or syntax error in the solution is reported per workload
            return None, (Status.COMPILE_ERROR, describe_exception(exc))

    def _base(self, workload: Workload, index: int, status: Status, message: str) -> WorkloadResult:
        return self.scorer.base(workload, index, status, message, self.baseline.get(workload.uuid))

    def run_workload(self, call: SolutionCaller, workload: Workload, index: int) -> WorkloadResult:
        """The trials and the timings under the launch audit, whose verdict comes last but for the persisting-L2 check
        (a set-aside changed in a timed call); the optional kernel profile after it (torch.profiler takes CUPTI over)."""
        pool = [allocate_inputs(workload.dims, self.device) for _ in range(self.options.input_sets)]
        output_pool = [allocate_outputs(workload, self.device) for _ in range(self.options.input_sets)]
        with LaunchAudit(self.device) as audit:
            call.audit = audit
            result = self._trials_and_timings(call, workload, index, pool, output_pool)
        if audit.failure:
            result.flags.append("NOT_AUDITED")
        if verdict := audit.verdict():
            result.status, result.message = Status.REWARD_HACK, verdict
        if changed := self._pristine.changed_persisting_l2():  # in a timed call: the trials' check saw none
            self._mark_for_the_run(result, changed)
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
        audited = secrets.randbelow(self.options.trials)  # the trial whose reference is spot-checked (harness.spot_check)
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
            report, produced = reward_hacks.check_call(
                call, workload, inputs, output_pool[k], self.device, seed, self._pristine, late_work, audit=trial == audited
            )
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
        device_checks, latency_checks = TimedOutputChecks(), TimedOutputChecks(elements=SampledElements(self.device))
        try:
            result.device_time, on_sets = self._time_device(call, workload.dims, pool, output_pool, seeds, device_checks)
            floor_latency, floor_host = time_launch_floor(self.device, self.options.timing)
            result.launch_floor = LaunchFloor(latency_us=floor_latency.mean_us, host_us=floor_host.median_us)
            result.call_latency, result.host, fresh = self._time_call_latency(
                call, workload.dims, pool[0], output_pool[0], seeds, latency_checks
            )
        except Exception as exc:  # noqa: BLE001 - a failure while timing is the solution's result
            result.status, result.message = Status.RUNTIME_ERROR, "during timing: " + describe_exception(exc)
            return
        written = next(filter(None, map(written_outside, output_pool)), "")  # many more inputs than the trials saw
        if written:
            result.status, result.message = Status.RUNTIME_ERROR, f"during the device-time calls: {written}"
            return
        if self.device.type == "cuda" and result.host.median_us > result.device_time.mean_us:
            result.flags.append("HOST_BOUND")
        result.timed_checks = TimedChecks(
            poison_checked=device_checks.calls + latency_checks.calls,
            verified_device_time_calls=[c.index for c in device_checks.kept],
            verified_call_latency_calls=[c.index for c in latency_checks.kept],
            sampled_call_latency_calls=latency_checks.elements.chosen_calls,
        )
        if result.status is Status.PASSED:
            reward_hacks.verify_timed_outputs(workload, self.device, device_checks, latency_checks, [*on_sets, fresh], result)
        if self.options.cuda_graph:
            result.cuda_graph = self._time_graph(call, workload, pool[0], output_pool[0], seeds)
        if self.options.mixed_tokens:
            result.mixed_tokens, verdict = self._time_mixed_tokens(call, workload, seeds)
            if verdict and result.status is Status.PASSED:  # wrong where T changes from call to call, as in a step
                result.status, result.message = verdict
        if self.options.sustained_s > 0:
            result.sustained, verdict = self._time_sustained(call, workload, pool, output_pool, seeds)
            if verdict and result.status is Status.PASSED:  # the workload's own T, wrong in calls a step makes
                result.status, result.message = verdict
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
            checks.current = last[k] = redraw_in_place(pool[k], output_pool[k], dims, next(seeds))

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
        fresh = FreshAddresses([*inputs.values(), *outputs], config.most_calls)
        buffers: list[torch.Tensor] = []

        def prepare(i: int) -> None:
            tensors = fresh.at(i)
            drawn, buffers[:] = dict(zip(inputs, tensors)), tensors[len(inputs) :]
            seed = next(seeds)
            fill_inputs(drawn, dims, seed)
            guards.poison(buffers)
            checks.current = TimedCall(drawn, seed)
            call.audit.watch_processes()  # a process that would write this call's outputs late is alive by now
            self._pristine.reset_persisting_lines()  # ahead of the flush (harness.persisting_l2)

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
            return GraphTiming(error="capture failed: " + describe_exception(exc))
        prepare = _redrawn_in_place(inputs, outputs, workload.dims, seeds)
        try:
            timing, _ = time_call_latency(lambda i: graph.replay(), prepare, self.device, self.options.timing)
            checked = redraw_in_place(inputs, outputs, workload.dims, next(seeds))
            graph.replay()
        except Exception as exc:  # noqa: BLE001
            return GraphTiming(error="replay failed: " + describe_exception(exc))
        checked.outputs = produced
        failure = checked.failure(workload, self.device, audit=True)
        return GraphTiming(timing=timing, error=f"a last replay: {failure[1]}" if failure else "")

    def _time_mixed_tokens(
        self, call: SolutionCaller, workload: Workload, seeds: Iterator[int]
    ) -> tuple[MixedTokensTiming | None, tuple[Status, str] | None]:
        """Call latency of calls cycling through the T nearest the workload's (results.MixedTokensTiming): each call at
        fresh addresses, the (T, .) inputs cut from pools shaped for the largest T; every call's outputs scanned for the
        NaN poison (reward_hacks.PoisonScan), and a T's call in timed round j checked against the reference as it ends,
        outside the timed window (TimedCall.failure), with probability 1/j drawn then: the first surely, each later one
        whatever was checked before. A check takes milliseconds, which the next call can see in the pause before it;
        with one checked call per T drawn ahead, a solution would learn that its T's check was done and could fake the
        rest. None where B = 1 leaves no other T. A failure, or an exception, is also the workload's verdict, returned
        beside the timing: a solution right at each T alone but wrong where T changes from call to call, as in a
        training step, is wrong."""
        tokens, rounds = mixed_token_counts(workload.dims), MIXED_TOKEN_ROUNDS
        if not tokens:
            return None, None
        inputs = allocate_inputs(replace(workload.dims, num_tokens=max(tokens)), self.device)
        fresh = FreshAddresses([*inputs.values(), *allocate_outputs(workload, self.device)], len(tokens) * rounds)
        del inputs
        audited = secrets.choice(tokens)  # the T whose first checked call's reference is spot-checked (spot_check)
        failures: dict[int, tuple[Status, str]] = {}
        scan = reward_hacks.PoisonScan()
        current: dict[str, torch.Tensor] = {}
        buffers: list[torch.Tensor] = []
        drawn: list[TimedCall] = []  # the current call's

        def prepare(i: int) -> None:
            t = tokens[i % len(tokens)]
            tensors = fresh.at(i)
            current.clear()
            current.update((spec.name, x[:t] if spec.shape[0] == "T" else x) for spec, x in zip(INPUTS, tensors))
            buffers[:] = tensors[len(INPUTS) :]
            seed = next(seeds)
            fill_inputs(current, replace(workload.dims, num_tokens=t), seed)
            guards.poison(buffers)
            drawn[:] = [TimedCall(dict(current), seed)]
            self._pristine.reset_persisting_lines()  # ahead of the flush (harness.persisting_l2)

        def timed_call(i: int) -> None:
            buffers[:] = call(current, buffers)

        def after(i: int) -> None:
            t, timed_round = tokens[i % len(tokens)], i // len(tokens)  # round 0 is untimed
            scan.after(buffers)
            if timed_round and secrets.randbelow(timed_round) == 0:  # 1, 1/2, 1/3, ...: see the docstring
                drawn[0].outputs = list(buffers)
                at_t = workload.model_copy(update={"num_tokens": t})
                failure = drawn[0].failure(at_t, self.device, audit=t == audited and timed_round == 1)
                if failure:
                    failures.setdefault(t, failure)

        timed = len(tokens) * (rounds - 1)
        # every round, whatever the time: the checked calls are in all of them
        config = replace(self.options.timing, warmup_calls=len(tokens), warmup_s=0.0, min_calls=timed, max_calls=timed,
                         batch_calls=len(tokens), max_seconds=math.inf)  # fmt: skip
        samples: list[float] = []  # timed call k is of T tokens[k % len(tokens)]: the untimed round is one whole cycle
        try:
            latency, host = time_call_latency(timed_call, prepare, self.device, config, after, samples)
        except Exception as exc:  # noqa: BLE001 - a solution that fails at another T is the solution's result
            error = "during the mixed-T calls: " + describe_exception(exc)
            return MixedTokensTiming(tokens=tokens, rounds=rounds, error=error), (Status.RUNTIME_ERROR, error)
        poisoned = scan.verdict("mixed-T")
        if poisoned:
            return MixedTokensTiming(tokens=tokens, rounds=rounds, error=poisoned), (Status.REWARD_HACK, poisoned)
        if failures:
            error = "checked mixed-T calls fail: " + "; ".join(f"T = {t}: {failures[t][1]}" for t in tokens if t in failures)
            hack = any(status is Status.REWARD_HACK for status, _ in failures.values())
            verdict = (Status.REWARD_HACK if hack else Status.INCORRECT_NUMERICAL), error
            return MixedTokensTiming(tokens=tokens, rounds=rounds, error=error), verdict
        tokens_us = [statistics.fmean(samples[k :: len(tokens)]) for k in range(len(tokens))]
        return MixedTokensTiming(tokens=tokens, rounds=rounds, timing=latency, host=host, tokens_us=tokens_us), None

    def _time_sustained(
        self,
        call: SolutionCaller,
        workload: Workload,
        pool: list[dict[str, torch.Tensor]],
        output_pool: list[list[torch.Tensor]],
        seeds: Iterator[int],
    ) -> tuple[SustainedTiming, tuple[Status, str] | None]:
        """The calls over the input sets back to back (timing.time_sustained, results.SustainedTiming), the first
        options.sustained_s seconds untimed. Before each call only grad_output is drawn anew, which changes every output,
        and before one in FRESH_WEIGHT_CALLS at random a block of each weight too (draw_sustained); the outputs are not
        poisoned: redrawing every input and filling the outputs (about 3.5 GB of memory traffic per call at the public
        shapes, a millisecond) would put memory-bound work between the calls, most of the GPU's time at T = 296, and
        hold it below its power limit. The sampled calls' outputs (a sample of all, one of those with fresh weight
        blocks) must pass TimedCall.verify, and so must those of a last call on each input set, with fresh blocks, right
        after the timed ones: a copy of a weight kept from the earlier calls fails there however few calls the timing
        made. A failure, or an exception, is also the workload's verdict (reward_hacks.verdict_on_verified), returned
        beside the timing: these are calls at the workload's own T, as a training step makes them."""
        settle_s, checks = self.options.sustained_s, TimedOutputChecks(scan_unwritten=False, fresh_weights_too=True)
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
        except Exception as exc:  # noqa: BLE001 - a failure in the long run of calls is the solution's result
            error = "during the sustained calls: " + describe_exception(exc)
            return SustainedTiming(settle_s=settle_s, error=error), (Status.RUNTIME_ERROR, error)
        verdict = reward_hacks.verdict_on_verified([*checks.kept, *last], workload, self.device, "sustained calls")
        if verdict:
            return SustainedTiming(settle_s=settle_s, settle_calls=run.settle_calls, error=verdict[1]), verdict
        timing = SustainedTiming(
            settle_s=settle_s,
            settle_calls=run.settle_calls,
            timing=run.timing,
            host_us=run.host_us,
            harness_host_us=run.harness_host_us,
            drained_share=run.drained_share,
        )
        return timing, None


def redraw_in_place(inputs: dict[str, torch.Tensor], outputs: list[torch.Tensor], dims: Dims, seed: int) -> TimedCall:
    """What bench does before each timed call on one input set: the inputs drawn anew in place from `seed`, the outputs
    poisoned; the call's TimedCall, whose outputs are set once it has run."""
    fill_inputs(inputs, dims, seed)
    guards.poison(outputs)
    return TimedCall(inputs, seed)


def _redrawn_in_place(
    inputs: dict[str, torch.Tensor], outputs: list[torch.Tensor], dims: Dims, seeds: Iterator[int]
) -> Callable[[int], None]:
    """A timer's `prepare` for calls on one input set: redraw_in_place from the next seed."""

    def prepare(i: int) -> None:
        redraw_in_place(inputs, outputs, dims, next(seeds))

    return prepare


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
    patched = guards.patch_check(kernels=True)
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
