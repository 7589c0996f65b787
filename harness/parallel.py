"""Benches in worker processes: a queue of (solution, workload) jobs run by workers of one device each.

- **local** (`harness bench`, on one device unless `--gpus N|all`): one thread per device slot (a GPU, or on a CPU
  machine a CPU process), each driving isolated worker processes (harness.isolation.Worker), one per solution it has
  met, bound to its device. A slot takes the next job from the queue when its last one is done, so the slots stay
  busy until the queue is empty. A worker that dies or hangs costs its job (RUNTIME_ERROR, TIMEOUT) and a fresh one
  takes the slot's next job of that solution.
- **ray** (`--backend ray`): each job a Ray task of one GPU (of one CPU on a CPU machine) in a process of its own,
  on the cluster that `ray.init(address)` joins, or a local one; Ray schedules them. A task that crashes or runs
  past the timeout costs its job.

Each workload of a solution is measured whole (trials and timings) on one device, recorded in its result
(`device_index`), and every device's provenance, its clocks before and after included, is in the result file
(`devices`). The results merge into the same files as a one-device run, in suite order; T_b comes from the
baseline's results of the same run (or its committed file), filled in once every job is done, since the
baseline's job for a workload may finish after another solution's.

A run stopped by SIGINT or SIGTERM (a scheduler's time limit) kills its workers, or cancels its Ray tasks, and raises
runner.Interrupted with the results of the workloads that finished before the signal, for the caller to write as a
partial run: a run cut short loses only the workloads it was measuring.
"""

from __future__ import annotations

import json
import os
import queue
import threading
import time
from dataclasses import dataclass

import torch

from harness import guards
from harness.isolation import RunPlan, Worker
from harness.results import BASELINE_SOLUTION, BenchResult, WorkloadResult, baseline_first
from harness.runner import Interrupted, stopped_by_signals
from harness.scoring import Baseline, Scorer
from harness.status import Status
from harness.worker import bench_from_setup
from harness.workloads import Suite, Workload


@dataclass(frozen=True)
class Job:
    solution: str
    workload: Workload
    index: int  # the workload's index in the suite


class Collected:
    """What the jobs of a run have given so far, per solution: workload results, worker summaries and busy seconds,
    and the baseline's T_b per workload as its results come in. Thread-safe."""

    def __init__(self, plan: RunPlan):
        self.results: dict[str, list[WorkloadResult]] = {name: [] for name in plan.solutions}
        self.summaries: dict[str, list[BenchResult]] = {name: [] for name in plan.solutions}
        self.busy: dict[str, float] = dict.fromkeys(plan.solutions, 0.0)
        self.baseline: dict[str, Baseline] = plan.scorer.baseline_from_file()
        self._on_done = plan.on_done
        self._lock = threading.Lock()

    def baseline_of(self, workload: Workload) -> Baseline | None:
        with self._lock:
            return self.baseline.get(workload.uuid)

    def result(self, job: Job, result: WorkloadResult) -> None:
        with self._lock:
            self.results[job.solution].append(result)
            if job.solution == BASELINE_SOLUTION and result.latency_us is not None:
                self.baseline[job.workload.uuid] = Baseline.of(result)
            self._on_done(job.solution, result)

    def summary(self, solution: str, summary: BenchResult | None, busy_seconds: float) -> None:
        with self._lock:
            self.busy[solution] += busy_seconds
            if summary is not None:
                self.summaries[solution].append(summary)


def jobs_for(solutions: list[str], suite: Suite, workloads: list[Workload]) -> list[Job]:
    """Every (solution, workload), workload by workload so that solutions run interleaved and clock drift hits all
    alike, the baseline's first on each workload so that its T_b is mostly known before the others run."""
    return [Job(name, w, suite.workloads.index(w)) for w in workloads for name in baseline_first(solutions)]


@dataclass(frozen=True)
class Slot:
    """One device of a local run: its workers see only `visible_gpu` (CUDA_VISIBLE_DEVICES), as their "cuda"."""

    device: str  # "cuda" or "cpu"
    visible_gpu: str | None = None


def device_slots(requested: str, device_type: str) -> list[Slot]:
    """The devices to spread jobs over: `requested` GPUs ("all" or a count) on CUDA, that many CPU processes on a CPU.
    GPU i is the i-th that this process sees (the i-th of CUDA_VISIBLE_DEVICES where that is set)."""
    available = torch.cuda.device_count() if device_type == "cuda" else None
    if requested == "all":
        if available is None:
            raise ValueError("--gpus all needs CUDA GPUs; on a CPU give a number of worker processes")
        count = available
    elif requested.isdigit() and int(requested) >= 1:
        count = int(requested)
    else:
        raise ValueError(f"--gpus must be 'all' or a number of at least 1, not '{requested}'")
    if available is not None and count > available:
        raise ValueError(f"--gpus {count} asks for more GPUs than the {available} torch sees")
    if device_type != "cuda":
        return [Slot("cpu")] * count
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [i.strip() for i in visible.split(",")] if visible else [str(i) for i in range(count)]
    return [Slot("cuda", ids[i]) for i in range(count)]


def run_local(plan: RunPlan, devices: list[Slot]) -> dict[str, BenchResult]:
    """The jobs on one worker thread per device slot (see the module's docstring)."""
    jobs: queue.Queue[Job] = queue.Queue()
    for job in jobs_for(plan.solutions, plan.suite, plan.workloads):
        jobs.put(job)
    collected = Collected(plan)
    failures: list[BaseException] = []
    stopping = threading.Event()
    live: list[Worker] = []  # every worker started, for a signal to stop

    def slot(index: int, device: Slot) -> None:
        try:
            drive(index, device)
        except BaseException as exc:  # noqa: BLE001 - the harness's own fault: raised in the caller's thread below
            failures.append(exc)

    def drive(index: int, device: Slot) -> None:
        workers: dict[str, Worker] = {}
        try:
            while not stopping.is_set():
                try:
                    job = jobs.get_nowait()
                except queue.Empty:
                    break
                worker = workers.get(job.solution)
                if worker is None:
                    worker = workers[job.solution] = Worker(job.solution, plan, device.device, device.visible_gpu)
                    live.append(worker)
                    if stopping.is_set():  # stopped while it was made: the signal's kills may have missed it
                        return
                    worker.start()
                known = collected.baseline_of(job.workload)
                result = worker.workload(job.workload, job.index, known, plan.scorer.for_solution(job.solution))
                if stopping.is_set():  # its worker was killed under it: no result
                    return
                result.device_index = index
                collected.result(job, result)
            for name, worker in workers.items():
                collected.summary(name, worker.finish(), worker.busy_seconds)
        finally:
            for worker in workers.values():  # killed and reaped, their output gone, whatever ended the slot
                worker.stop()

    threads = [threading.Thread(target=slot, args=(i, device), daemon=True) for i, device in enumerate(devices)]
    try:
        with stopped_by_signals():
            for thread in threads:
                thread.start()
            for thread in threads:
                while thread.is_alive():
                    thread.join(timeout=0.1)  # a join without a timeout would hold the signal back
    except KeyboardInterrupt:
        stopping.set()
        for worker in live:
            worker.stop()
        for thread in threads:
            if thread.ident is not None:  # started
                thread.join()
        raise Interrupted(merge(plan, collected)) from None
    if failures:
        # A slot that broke took its jobs with it: a result file would lack them with nothing to say so.
        raise failures[0]
    return merge(plan, collected)


def merge(plan: RunPlan, collected: Collected) -> dict[str, BenchResult]:
    """One BenchResult per solution, as a one-device run writes it: workloads in suite order, T_b from the baseline
    of this run (or its file) and the verdicts re-derived, every device's provenance beside the first's."""
    merged = {}
    for name in plan.solutions:
        own = sorted(collected.summaries[name], key=lambda s: s.provenance.timestamp)
        result = own[0] if own else plan.summary_without_workers(name)
        rescore = plan.scorer.for_solution(name).rescore
        workloads = sorted(collected.results[name], key=lambda w: w.index)
        for w in workloads:
            known = collected.baseline.get(w.uuid)
            if known is not None and name != BASELINE_SOLUTION:
                w.baseline_us, w.device_baseline_us = known.latency_us, known.device_us
            rescore(w)
        result.workloads = workloads
        result.devices = [s.provenance for s in own]
        result.duration_s = collected.busy[name]
        merged[name] = result
    return merged


# -- Ray --------------------------------------------------------------------------------------------------------


def run_one_job(setup: dict, uuid: str) -> str:
    """One job in the calling process (a Ray task's): the solution loaded, the workload measured, the summary with its
    one result as JSON."""
    patched = guards.patch_check(kernels=True)  # before the solution is loaded: the backstop after the workload
    suite, bench = bench_from_setup(setup)
    workload = next(w for w in suite.workloads if w.uuid == uuid)
    result = bench.workload(suite, workload)
    replaced = patched()  # before any harness code is looked up again: it puts back what was replaced
    result = bench.mark_patched(result, replaced)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "") if setup["device"] == "cuda" else ""
    result.device_index = int(visible.split(",")[0]) if visible.split(",")[0].isdigit() else None  # Ray's GPU for the task
    return bench.finish(suite, [result]).model_dump_json()


def run_ray(plan: RunPlan, device_type: str, address: str | None = None) -> dict[str, BenchResult]:
    """The jobs as Ray tasks of one GPU each (one CPU each on a CPU machine), each in a fresh process."""
    try:
        import ray
    except ImportError:
        raise ValueError("--backend ray needs Ray: pip install 'moe-bench[ray]'") from None
    if not ray.is_initialized():
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
    gpus = 1 if device_type == "cuda" else 0
    task = ray.remote(num_gpus=gpus, num_cpus=1, max_calls=1, max_retries=0)(run_one_job)
    collected = Collected(plan)
    # As many tasks in flight as the cluster has devices for, so that each one's clock starts when it can run.
    slots = max(1, int(ray.cluster_resources().get("GPU" if gpus else "CPU", 1)))
    waiting = jobs_for(plan.solutions, plan.suite, plan.workloads)
    pending: dict[object, tuple[Job, float]] = {}
    limit = plan.timeouts.compile_s + plan.timeouts.run_s
    try:
        with stopped_by_signals():
            while waiting or pending:
                while waiting and len(pending) < slots:
                    job = waiting.pop(0)
                    ref = task.remote(plan.setup(job.solution, device_type), job.workload.uuid)
                    pending[ref] = (job, time.perf_counter())
                ready, _ = ray.wait(list(pending), num_returns=1, timeout=1.0)
                now = time.perf_counter()
                for ref in ready or [r for r, (_, started) in pending.items() if now - started > limit]:
                    job = pending.pop(ref)[0]
                    result = _ray_result(ray, ref, job, plan.scorer, limit, ready)
                    if isinstance(result, BenchResult):
                        collected.summary(job.solution, result, result.duration_s)
                        result = result.workloads[0]
                    collected.result(job, result)
    except KeyboardInterrupt:
        for ref in pending:
            ray.cancel(ref, force=True)
        raise Interrupted(merge(plan, collected)) from None
    return merge(plan, collected)


def _ray_result(ray, ref, job: Job, scorer: Scorer, limit: float, ready: list) -> BenchResult | WorkloadResult:
    """The task's summary, or the workload's TIMEOUT or RUNTIME_ERROR where the task ran too long or failed."""
    base = scorer.for_solution(job.solution).base
    if ref not in ready:
        ray.cancel(ref, force=True)
        return base(job.workload, job.index, Status.TIMEOUT, f"no answer within {limit:.0f} s")
    try:
        return BenchResult.model_validate(json.loads(ray.get(ref)))
    except Exception as exc:  # noqa: BLE001 - a task that crashed, however it crashed, costs its job
        return base(job.workload, job.index, Status.RUNTIME_ERROR, f"the Ray task failed: {type(exc).__name__}: {str(exc)[:500]}")
