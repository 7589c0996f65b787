"""Each solution in its own worker process, so that a crash, a hang or a corrupted CUDA context costs one
workload and not the run, and the solution never shares a process with the bookkeeping.

The parent (this module) drives one worker per solution (`python -m harness.worker`) over two pipes
that are neither stdin nor stdout: commands go down one, results come up the other, each message a JSON
line carrying a nonce the parent made for that worker. The worker's stdout and stderr (the solution's
prints) go to a file with no name, whose tail is quoted when a worker dies and which vanishes with the
worker's handle, whatever ends the run. The parent expects every workload it asked for: a result that
does not come within the timeout is TIMEOUT (the worker is killed), a worker that exits is RUNTIME_ERROR
(or COMPILE_ERROR before its first result), and in both cases a fresh worker takes the remaining
workloads. The parent re-derives the roofline verdicts from the reported times.

A worker runs only while it has a job: between jobs the parent stops its process group (SIGSTOP; each worker leads a
session of its own, which holds any process the solution starts) and waits until each of their threads has stopped, and
continues it (SIGCONT) with the next command. So while one solution's workload is measured, no thread or process of
another solution's worker issues GPU work or takes the host's CPUs, which a host-bound call's timing feels. GPU work a
worker had queued when it was stopped still runs, and a process that leaves the session (setsid) is neither stopped nor
killed with its worker. A parent killed outright takes its workers with it (harness.worker.die_with_parent), not the
processes they started.

What this does not stop: code running inside the worker can, in principle, read the worker's memory
(the nonce included) and write to its pipe. The nonce turns forging a result from printing a line into
searching the interpreter's objects; the checks that matter (poisoned outputs, input snapshots, the
reference comparison) run in the worker before any result is sent, and a solution that replaces functions or methods
of the harness, its checks included, is caught after the workload by a check the worker took before loading it
(harness.guards.patch_check).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from pydantic import ValidationError

from harness import provenance
from harness.launch_audit import proc_stat_fields
from harness.registry import get_solution
from harness.results import BenchResult, WorkloadResult
from harness.runner import BenchOptions, bench_config, solution_record
from harness.scoring import Baseline, Scorer
from harness.status import Status
from harness.worker import job_setup
from harness.workloads import Suite, Workload

LOG_TAIL_CHARS = 2000
LOG_TAIL_BYTES = 4 * LOG_TAIL_CHARS  # UTF-8 takes at most 4 bytes a character
# The longest the parent waits for a stopped worker's threads to come to rest: a thread inside an uninterruptible system
# call stops when it returns, and none of them should hold up every job.
STOP_WAIT_S = 0.1
STOPPED_STATES = "TtZX"  # /proc's states of a thread that runs no more: stopped, stopped by a tracer, a zombie, dead


@dataclass(frozen=True)
class Timeouts:
    compile_s: float = 600.0  # loading the solution, and on top of run_s for its first workload (JIT)
    run_s: float = 600.0  # one workload: its trials and its timing


def _ignore(solution: str, result: WorkloadResult) -> None:
    pass


@dataclass(frozen=True)
class RunPlan:
    """A run of solutions in worker processes, whichever way the workers are spread (run_local or run_ray, in
    harness.parallel): what is measured, how, where the results go, and who hears of each one."""

    solutions: list[str]
    solutions_dir: Path
    options: BenchOptions
    results_dir: Path
    suite: Suite
    workloads: list[Workload]
    scorer: Scorer
    timeouts: Timeouts = Timeouts()
    on_done: Callable[[str, WorkloadResult], None] = _ignore  # each workload's result as it comes in

    def setup(self, solution: str, device: str) -> dict:
        """What a worker of `solution` on `device` is started with (harness.worker)."""
        return job_setup(solution, self.solutions_dir, device, self.options, self.results_dir, self.suite)

    def summary_without_workers(self, solution: str) -> BenchResult:
        """A solution's result file as the parent describes it, where none of its workers lived to report the run."""
        return BenchResult(
            solution=solution_record(get_solution(solution, self.solutions_dir)),
            config=bench_config(self.suite, self.options, self.scorer.device),
            provenance=provenance.collect(self.scorer.device, provenance.Clocks()),
            duration_s=0.0,
            workloads=[],
        )


def thread_states(pgid: int) -> list[str]:
    """The state letter (R, S, D, T, ...) of every thread of every process in process group `pgid`; none where there
    is no /proc."""
    if not os.path.isdir("/proc"):
        return []
    states = []
    for entry in os.scandir("/proc"):
        fields = proc_stat_fields(f"{entry.path}/stat") if entry.name.isdigit() else None
        if fields is None or int(fields[2]) != pgid:
            continue
        with contextlib.suppress(OSError):  # the process ended meanwhile
            for task in os.scandir(f"{entry.path}/task"):
                task_fields = proc_stat_fields(f"{task.path}/stat")
                if task_fields is not None:
                    states.append(task_fields[0])
    return states


def stop_group(pgid: int) -> None:
    """Stop process group `pgid` (SIGSTOP) and wait, STOP_WAIT_S at the most, until none of its threads runs: a thread
    stops when it next handles the signal, which on a busy host can come milliseconds after killpg returns, while the
    next solution's timing has begun."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGSTOP)
    deadline = time.monotonic() + STOP_WAIT_S
    while any(state not in STOPPED_STATES for state in thread_states(pgid)) and time.monotonic() < deadline:
        time.sleep(0.001)


class Worker:
    """The parent's handle on one solution's worker process."""

    def __init__(
        self,
        solution: str,
        plan: RunPlan,
        device: str,
        visible_gpu: str | None = None,  # the one GPU the worker sees (CUDA_VISIBLE_DEVICES), as its "cuda"
    ):
        self.solution = solution
        self.visible_gpu = visible_gpu
        self.setup = plan.setup(solution, device)
        self.timeouts = plan.timeouts
        self.busy_seconds = 0.0
        # Every process of the worker's writes through one shared file offset, and the parent reads with pread, which
        # moves none: their output stays in order, and the file, unlinked at birth, leaves nothing on disk.
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 - open for the worker's life, closed by stop()
        self._process: subprocess.Popen | None = None
        self._first_result_pending = True
        self._setup_problem: tuple[Status, str] | None = None
        self._stopped = False  # by stop(): no process is started again

    # -- process management -------------------------------------------------------------------------
    def _spawn(self) -> None:
        self.nonce = secrets.token_hex(16)
        command_read, command_write = os.pipe()
        result_read, result_write = os.pipe()
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        if self.visible_gpu is not None:
            env["CUDA_VISIBLE_DEVICES"] = self.visible_gpu
        self._process = subprocess.Popen(
            [sys.executable, "-m", "harness.worker", str(command_read), str(result_write)],
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            pass_fds=(command_read, result_write),
            env=env,
            start_new_session=True,
        )
        os.close(command_read)
        os.close(result_write)
        self._commands = os.fdopen(command_write, "w")
        self._replies: queue.Queue[dict | None] = queue.Queue()
        reader = threading.Thread(target=self._read, args=(os.fdopen(result_read, "r"),), daemon=True)
        reader.start()
        self._send({**self.setup, "nonce": self.nonce})
        self._first_result_pending = True
        reply = self._receive(self.timeouts.compile_s)
        if reply is None or not reply.get("ready"):
            self._setup_problem = (Status.COMPILE_ERROR, self._died("while loading the solution", reply))
            self._kill()
        self._stop_group()

    def _read(self, stream) -> None:
        for line in stream:
            try:
                message = json.loads(line)
            except json.JSONDecodeError:
                continue  # not a message of the worker's (the nonce check would refuse it anyway)
            if isinstance(message, dict) and message.get("nonce") == self.nonce:
                self._replies.put(message)
        self._replies.put(None)

    def _running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def _stop_group(self) -> None:
        """Stop the worker's process group, the worker and the processes it started (see the module's docstring), until
        the next command; nothing where no worker is running."""
        if self._running():
            stop_group(self._process.pid)

    def _send(self, message: dict) -> None:
        if self._running():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._process.pid, signal.SIGCONT)
        try:
            self._commands.write(json.dumps(message) + "\n")
            self._commands.flush()
        except (BrokenPipeError, ValueError):
            pass  # the worker is gone; _receive reports it

    def _receive(self, timeout: float) -> dict | None:
        try:
            return self._replies.get(timeout=timeout)
        except queue.Empty:
            return {"timeout": timeout}

    def _kill(self) -> None:
        process = self._process  # a signal's stop and the slot's thread may both kill it
        if process is not None:
            with contextlib.suppress(ProcessLookupError):  # the group outlives its leader while a process in it lives
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        self._process = None

    def _died(self, when: str, reply: dict | None) -> str:
        if reply is not None and "timeout" in reply:
            return f"no answer within {reply['timeout']:.0f} s {when}"
        if reply is not None and "error" in reply:
            return reply["error"]
        code = self._process.wait() if self._process is not None else None
        tail = self._log_tail()
        return f"the worker process exited (code {code}) {when}" + (f"; its last output:\n{tail}" if tail else "")

    def _log_tail(self) -> str:
        """The last LOG_TAIL_CHARS characters the worker's processes wrote; none once the worker is stopped (a signal's
        stop may close the file while a slot's thread still reports the kill)."""
        if self.log.closed:
            return ""
        size = os.fstat(self.log.fileno()).st_size
        tail = os.pread(self.log.fileno(), LOG_TAIL_BYTES, max(0, size - LOG_TAIL_BYTES))
        return tail.decode(errors="replace")[-LOG_TAIL_CHARS:].strip()

    # -- the protocol ---------------------------------------------------------------------------------
    def start(self) -> None:
        started = time.perf_counter()
        self._spawn()
        self.busy_seconds += time.perf_counter() - started

    def workload(self, workload: Workload, index: int, baseline: Baseline | None, scorer: Scorer) -> WorkloadResult:
        started = time.perf_counter()
        try:
            return scorer.rescore(self._workload(workload, index, baseline, scorer))
        finally:
            self.busy_seconds += time.perf_counter() - started

    def _workload(self, workload: Workload, index: int, baseline: Baseline | None, scorer: Scorer) -> WorkloadResult:
        if self._stopped:
            return scorer.base(workload, index, Status.RUNTIME_ERROR, "the run was stopped before this workload")
        if self._process is None and self._setup_problem is None:
            self._spawn()
        if self._setup_problem is not None:
            return scorer.base(workload, index, *self._setup_problem, baseline)
        self._send({"nonce": self.nonce, "workload": workload.uuid, "baseline": asdict(baseline) if baseline else None})
        timeout = self.timeouts.run_s + (self.timeouts.compile_s if self._first_result_pending else 0.0)
        reply = self._receive(timeout)
        if reply is not None and "result" in reply:
            try:
                result = WorkloadResult.model_validate(reply["result"])
            except ValidationError as exc:
                self._kill()
                return scorer.base(
                    workload, index, Status.RUNTIME_ERROR, f"the worker sent an invalid result: {exc.errors()[0]['msg']}"
                )
            if result.uuid == workload.uuid:
                self._first_result_pending = False
                self._stop_group()
                return result
            reply = {"error": f"the worker answered for workload {result.uuid}, not {workload.uuid}"}
        status = Status.TIMEOUT if reply is not None and "timeout" in reply else Status.RUNTIME_ERROR
        message = self._died(f"during workload {index} ({workload.label})", reply)
        self._kill()  # a fresh worker takes the next workload
        return scorer.base(workload, index, status, message)

    def stop(self) -> None:
        """Kills the worker process, whatever it is doing, for good: its job ends without a result, no process is
        started again, and its output is gone. Every worker ends so: after `finish`, or in a run stopped by a signal or
        by a fault of the harness."""
        self._stopped = True
        self._kill()
        self.log.close()

    def finish(self) -> BenchResult | None:
        """The worker's summary (provenance, config); None if no worker could give one."""
        if self._stopped:
            return None
        if self._process is None and self._setup_problem is None:
            self._spawn()
        if self._process is not None:
            self._send({"nonce": self.nonce, "finish": True})
            reply = self._receive(self.timeouts.run_s)
            self._commands.close()
            self._kill()
            if reply is not None and "finish" in reply:
                return BenchResult.model_validate(reply["finish"])
        return None
