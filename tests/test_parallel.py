"""Benches over several devices (harness/parallel.py): the sharding into jobs, the slots, and results identical to a
one-worker run's apart from timings and provenance, on CPU workers (local processes, or a local Ray instance)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch

from harness import isolation, parallel
from harness.isolation import RunPlan, Worker
from harness.launch_audit import proc_stat_fields
from harness.parallel import Slot, device_slots, jobs_for, run_local, run_ray
from harness.registry import SOLUTIONS_DIR, get_solution
from harness.runner import Bench, BenchOptions, Interrupted, run_side_by_side
from harness.scoring import Scorer
from harness.timing import TimingConfig
from harness.workloads import load_named_suite

SMOKE = load_named_suite("smoke")
OPTIONS = BenchOptions(trials=2, timing=TimingConfig(warmup_calls=1, min_calls=2, max_calls=4, batch_calls=2))
SOLUTIONS = ["torch_eager", "reference_fp32"]
CPU = torch.device("cpu")


def test_jobs_go_workload_by_workload_with_the_baseline_first() -> None:
    jobs = jobs_for(SOLUTIONS, SMOKE, SMOKE.workloads[:3])
    assert [(j.solution, j.index) for j in jobs] == [(name, i) for i in range(3) for name in ("reference_fp32", "torch_eager")]


def test_slots(monkeypatch) -> None:
    assert device_slots("2", "cpu") == [Slot("cpu"), Slot("cpu")]
    for bad in ("0", "two", "-1"):
        with pytest.raises(ValueError, match="'all' or a number"):
            device_slots(bad, "cpu")
    with pytest.raises(ValueError, match="needs CUDA GPUs"):
        device_slots("all", "cpu")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5,6,7")
    assert device_slots("2", "cuda") == [Slot("cuda", "3"), Slot("cuda", "5")]
    assert len(device_slots("all", "cuda")) == 4
    with pytest.raises(ValueError, match="more GPUs than the 4"):
        device_slots("5", "cuda")


def verdicts(result) -> list[tuple]:
    """What a run decided, without its timings and provenance: per workload its status and its trials' seeds,
    statuses and output verdicts."""
    return [
        (w.uuid, w.index, w.status, [(t.seed, t.status, [(o.name, o.status) for o in t.outputs]) for t in w.trials])
        for w in result.workloads
    ]


@pytest.fixture(scope="module")
def one_worker(tmp_path_factory):
    results = tmp_path_factory.mktemp("one")
    plan = RunPlan(SOLUTIONS, SOLUTIONS_DIR, OPTIONS, results, SMOKE, SMOKE.workloads[:3], Scorer(CPU, results))
    return run_local(plan, [Slot("cpu")])


def check_same_as_one_worker(merged, one_worker, devices: int) -> None:
    for name in SOLUTIONS:
        assert verdicts(merged[name]) == verdicts(one_worker[name])
        assert len(merged[name].devices) <= devices and merged[name].devices
    baseline = {w.uuid: w.latency_us for w in merged["reference_fp32"].workloads}
    assert all(w.baseline_us == baseline[w.uuid] for w in merged["torch_eager"].workloads)


def test_two_local_workers_decide_as_one(tmp_path: Path, one_worker) -> None:
    plan = RunPlan(SOLUTIONS, SOLUTIONS_DIR, OPTIONS, tmp_path, SMOKE, SMOKE.workloads[:3], Scorer(CPU, tmp_path))
    merged = run_local(plan, [Slot("cpu"), Slot("cpu")])
    check_same_as_one_worker(merged, one_worker, 2)
    assert {w.device_index for name in SOLUTIONS for w in merged[name].workloads} <= {0, 1}


def test_ray_tasks_decide_as_one_worker(tmp_path: Path, one_worker) -> None:
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        plan = RunPlan(SOLUTIONS, SOLUTIONS_DIR, OPTIONS, tmp_path, SMOKE, SMOKE.workloads[:3], Scorer(CPU, tmp_path))
        merged = run_ray(plan, "cpu")
    finally:
        ray.shutdown()
    check_same_as_one_worker(merged, one_worker, 6)


def test_a_worker_that_dies_costs_only_its_job(tmp_path: Path) -> None:
    adversaries = Path(__file__).resolve().parent / "adversarial" / "solutions"
    plan = RunPlan(["crashes_mid_suite"], adversaries, OPTIONS, tmp_path, SMOKE, SMOKE.workloads, Scorer(CPU, tmp_path))
    merged = run_local(plan, [Slot("cpu"), Slot("cpu")])
    statuses = [(w.num_tokens, w.status.value) for w in merged["crashes_mid_suite"].workloads]
    assert statuses == [(w.num_tokens, "RUNTIME_ERROR" if w.num_tokens == 17 else "PASSED") for w in SMOKE.workloads]


# At import: a thread and a child process, each adding a line to its file every 10 ms for as long as it runs; each call
# takes 0.1 s.
TICKING = """
import os, subprocess, sys, threading, time
from reference import reference_backward

def tick(path):
    while True:
        with open(path, "a") as f:
            f.write("tick\\n")
        time.sleep(0.01)

threading.Thread(target=tick, args=(r"{thread}",), daemon=True).start()
CHILD = subprocess.Popen([sys.executable, "-c", "import time\\nwhile True:\\n    open(r'{child}', 'a').write('tick\\\\n')\\n    time.sleep(0.01)"])
while not os.path.exists(r"{child}"):
    time.sleep(0.01)

def run(*tensors):
    time.sleep(0.1)
    for out, value in zip(tensors[12:], reference_backward(*tensors[:12])):
        out.copy_(value)
"""


def test_a_worker_runs_only_during_its_jobs(tmp_path: Path, make_solution) -> None:
    """Between its jobs a worker and the processes it started are stopped, so an idle solution cannot work (on the
    GPU, or on the host's CPUs) while another solution is measured; each job continues them, and killing the worker
    kills them too."""
    ticks = {name: tmp_path / f"{name}.ticks" for name in ("thread", "child")}
    root = make_solution("ticking", TICKING.format(**ticks))
    plan = RunPlan(["ticking"], root, OPTIONS, tmp_path, SMOKE, SMOKE.workloads[:2], Scorer(CPU, tmp_path))
    worker = Worker("ticking", plan, "cpu")

    def ticking() -> dict[str, bool]:
        sizes = {name: path.stat().st_size for name, path in ticks.items()}
        time.sleep(0.3)
        return {name: path.stat().st_size > sizes[name] for name, path in ticks.items()}

    try:
        worker.start()
        assert ticking() == {"thread": False, "child": False}
        result = worker.workload(SMOKE.workloads[0], 0, None, plan.scorer.for_solution("ticking"))
        assert result.trials, result.message  # the worker answered: it ran again
        sizes = [path.stat().st_size for path in ticks.values()]
        assert ticking() == {"thread": False, "child": False}
        worker.workload(SMOKE.workloads[1], 1, None, plan.scorer.for_solution("ticking"))
        assert [path.stat().st_size for path in ticks.values()] > sizes  # both ran during the job
        assert worker.finish() is not None
        time.sleep(0.1)
        assert ticking() == {"thread": False, "child": False}  # killed with the worker
    finally:
        worker.stop()  # the child too, whatever failed


# Two threads that never wait for anything.
BUSY = """
import threading

def spin():
    while True:
        pass

threading.Thread(target=spin, daemon=True).start()
spin()
"""


def test_a_stopped_group_runs_no_thread() -> None:
    """stop_group returns once every thread of every process in the group has stopped, not when the signal is sent."""
    process = subprocess.Popen([sys.executable, "-c", BUSY], start_new_session=True)
    try:
        time.sleep(0.3)
        assert "R" in isolation.thread_states(process.pid)
        isolation.stop_group(process.pid)
        states = isolation.thread_states(process.pid)
        assert sorted(states) == ["T", "T"], states
    finally:
        process.kill()
        process.wait()


def test_stop_group_waits_for_the_last_thread(monkeypatch) -> None:
    seen = iter([["T", "R"], ["D", "T"], ["T", "T"]])
    looked: list[int] = []

    def states(pgid: int) -> list[str]:
        looked.append(pgid)
        return next(seen)

    monkeypatch.setattr(isolation, "thread_states", states)
    monkeypatch.setattr(os, "killpg", lambda pgid, signum: None)
    isolation.stop_group(4321)
    assert looked == [4321] * 3


ORPHANING = """
import os, torch
from pathlib import Path
from harness.isolation import RunPlan, Worker
from harness.registry import SOLUTIONS_DIR
from harness.runner import BenchOptions
from harness.scoring import Scorer
from harness.workloads import load_named_suite

smoke, results = load_named_suite("smoke"), Path(r"{results}")
plan = RunPlan(["torch_eager"], SOLUTIONS_DIR, BenchOptions(trials=1), results, smoke, smoke.workloads, Scorer(torch.device("cpu"), results))
worker = Worker("torch_eager", plan, "cpu")
worker.start()
print(worker._process.pid, flush=True)
os._exit(0)
"""


def test_a_stopped_worker_dies_with_its_parent(tmp_path: Path) -> None:
    """A parent that dies without a word (killed, crashed) leaves no worker stopped for good."""
    script = ORPHANING.format(results=tmp_path)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=True)
    pid = int(done.stdout.split()[-1])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and process_state(pid) not in ("gone", "Z"):
        time.sleep(0.05)
    state = process_state(pid)
    if state not in ("gone", "Z"):
        os.kill(pid, signal.SIGKILL)  # not left behind by a failing test
    assert state in ("gone", "Z")  # a zombie where nothing reaps orphans (a container's first process)


def process_state(pid: int) -> str:
    """The state letter of process `pid` in /proc (T: stopped, Z: a zombie), or "gone"."""
    fields = proc_stat_fields(f"/proc/{pid}/stat")
    return fields[0] if fields else "gone"


def test_a_slot_that_breaks_fails_the_run(tmp_path: Path, monkeypatch) -> None:
    """A fault of the harness itself in a slot's thread (here, starting its worker) is raised, not left to the thread:
    the jobs it took would otherwise be missing from a result file that says nothing of them."""

    class Broken:
        def __init__(self, *args) -> None:
            pass

        def start(self) -> None:
            raise RuntimeError("the worker could not start")

        def stop(self) -> None:
            pass

    monkeypatch.setattr(parallel, "Worker", Broken)
    plan = RunPlan(SOLUTIONS, SOLUTIONS_DIR, OPTIONS, tmp_path, SMOKE, SMOKE.workloads[:2], Scorer(CPU, tmp_path))
    with pytest.raises(RuntimeError, match="could not start"):
        run_local(plan, [Slot("cpu"), Slot("cpu")])


@pytest.fixture
def temp_folder(tmp_path: Path, monkeypatch) -> Path:
    """The parent's temporary folder for the test, empty at first."""
    folder = tmp_path / "temp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


def test_a_fault_of_the_harness_leaves_no_worker_behind(tmp_path: Path, monkeypatch, temp_folder: Path) -> None:
    """A slot that breaks after its worker started (here, reading the worker's summary) kills and reaps the worker
    (its thread's end would kill it, unreaped) and leaves no file of its output."""
    started: list[int] = []

    class Breaks(Worker):
        def start(self) -> None:
            super().start()
            started.append(self._process.pid)

        def finish(self):
            raise RuntimeError("the summary could not be read")

    monkeypatch.setattr(parallel, "Worker", Breaks)
    plan = RunPlan(["torch_eager"], SOLUTIONS_DIR, OPTIONS, tmp_path, SMOKE, SMOKE.workloads[:1], Scorer(CPU, tmp_path))
    with pytest.raises(RuntimeError, match="could not be read"):
        run_local(plan, [Slot("cpu")])
    assert started and [process_state(pid) for pid in started] == ["gone"] * len(started)
    assert list(temp_folder.iterdir()) == []


DIES_TALKING = """
import os

def run(*tensors):
    print("the last words of a dying solution", flush=True)
    os._exit(3)
"""


def test_a_worker_that_dies_is_quoted_and_leaves_no_file(tmp_path: Path, make_solution, temp_folder: Path) -> None:
    """The verdict of a workload whose worker died quotes what the solution printed, and no worker leaves a file in
    the temporary folder: neither one that ran to its end nor one stopped, between jobs, for good."""
    root = make_solution("dies_talking", DIES_TALKING)
    plan = RunPlan(["dies_talking"], root, OPTIONS, tmp_path, SMOKE, SMOKE.workloads[:1], Scorer(CPU, tmp_path))
    message = run_local(plan, [Slot("cpu")])["dies_talking"].workloads[0].message
    assert "exited (code 3)" in message and "the last words of a dying solution" in message
    worker = Worker("dies_talking", plan, "cpu")
    worker.start()
    worker.stop()
    assert list(temp_folder.iterdir()) == []


# Right at once on T = 1 (smoke workloads 0 and 1), and a minute long elsewhere: a run over workloads 0, 2 and 3 is
# stopped during its second workload, whatever the moment the signal is handled.
SLOW_AFTER_THE_FIRST = """
import time
from reference import reference_backward

def run(*tensors):
    if tensors[1].numel() > 1:
        time.sleep(60)
    for out, value in zip(tensors[12:], reference_backward(*tensors[:12])):
        out.copy_(value)
"""


def test_a_signal_stops_the_run_and_keeps_what_finished(tmp_path: Path, make_solution) -> None:
    """SIGTERM during a run (a scheduler's time limit): the workers are killed at once, and the workloads that finished
    come back as results, the one being measured left out."""
    root = make_solution("slow_after_the_first", SLOW_AFTER_THE_FIRST)

    def on_done(solution: str, result) -> None:
        signal.raise_signal(signal.SIGTERM)  # from the slot's thread, as a signal from outside reaches the main one

    chosen = [SMOKE.workloads[i] for i in (0, 2, 3)]
    plan = RunPlan(["slow_after_the_first"], root, OPTIONS, tmp_path, SMOKE, chosen, Scorer(CPU, tmp_path),
                   on_done=on_done)  # fmt: skip
    before, started = signal.getsignal(signal.SIGTERM), time.monotonic()
    with pytest.raises(Interrupted) as stopped:
        run_local(plan, [Slot("cpu")])
    assert time.monotonic() - started < 45
    workloads = stopped.value.results["slow_after_the_first"].workloads
    assert [(w.index, w.status.value) for w in workloads] == [(0, "PASSED")]
    assert signal.getsignal(signal.SIGTERM) is before  # put back


def test_a_signal_stops_a_ray_run_and_keeps_what_finished(tmp_path: Path, make_solution) -> None:
    """SIGTERM during a Ray run: its tasks still running are cancelled, the finished workloads come back as results."""
    ray = pytest.importorskip("ray")
    root = make_solution("slow_after_the_first", SLOW_AFTER_THE_FIRST)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        chosen = [SMOKE.workloads[i] for i in (0, 2, 3)]
        plan = RunPlan(["slow_after_the_first"], root, OPTIONS, tmp_path, SMOKE, chosen, Scorer(CPU, tmp_path),
                       on_done=lambda solution, result: signal.raise_signal(signal.SIGTERM))  # fmt: skip
        before, started = signal.getsignal(signal.SIGTERM), time.monotonic()
        with pytest.raises(Interrupted) as stopped:
            run_ray(plan, "cpu")
        assert time.monotonic() - started < 45
        assert signal.getsignal(signal.SIGTERM) is before  # put back
    finally:
        ray.shutdown()
    workloads = stopped.value.results["slow_after_the_first"].workloads
    assert [(w.index, w.status.value) for w in workloads] == [(0, "PASSED")]


def test_a_signal_stops_a_run_in_one_process_and_keeps_what_finished(tmp_path: Path) -> None:
    """--no-isolation: SIGTERM after the first workload stops the run there, its result kept."""
    bench = Bench(get_solution("torch_eager"), CPU, OPTIONS, tmp_path)
    with pytest.raises(Interrupted) as stopped:
        run_side_by_side([bench], SMOKE, SMOKE.workloads[:3], lambda bench, result: signal.raise_signal(signal.SIGTERM))
    assert [(w.index, w.status.value) for w in stopped.value.results["torch_eager"].workloads] == [(0, "PASSED")]
