"""The worker process of harness.isolation: runs one solution's workloads as the parent asks.

    python -m harness.worker COMMAND_FD RESULT_FD

Reads JSON commands from COMMAND_FD (setup first, then one workload at a time, then finish) and writes
JSON replies, each with the parent's nonce, to RESULT_FD. stdout and stderr are the solution's.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
from dataclasses import asdict
from pathlib import Path

import torch

from harness import guards
from harness.registry import get_solution
from harness.runner import Bench, BenchOptions
from harness.scoring import Baseline
from harness.timing import TimingConfig
from harness.workloads import Suite


def job_setup(solution: str, solutions_dir: Path, device: str, options: BenchOptions, results_dir: Path, suite: Suite) -> dict:
    """What a process needs to bench one solution, as JSON-ready values (a worker's setup message, a Ray task's
    argument)."""
    return {
        "solution": solution,
        "solutions_dir": str(solutions_dir),
        "device": device,
        "options": asdict(options),
        "results_dir": str(results_dir),
        "suite": suite.model_dump(mode="json"),
    }


def bench_from_setup(setup: dict) -> tuple[Suite, Bench]:
    """The suite and the started Bench (the solution loaded) that a job_setup describes."""
    raw = setup["options"]
    options = BenchOptions(**{**raw, "timing": TimingConfig(**raw["timing"])})
    solution = get_solution(setup["solution"], Path(setup["solutions_dir"]))
    bench = Bench(solution, torch.device(setup["device"]), options, Path(setup["results_dir"]))
    bench.start()
    return Suite.model_validate(setup["suite"]), bench


def die_with_parent() -> None:
    """Have Linux kill this process when the parent's thread that started it ends: between jobs the parent keeps the
    worker stopped (harness.isolation), and a stopped worker would never see its command pipe close."""
    if sys.platform.startswith("linux"):
        pr_set_pdeathsig = 1
        ctypes.CDLL(None).prctl(pr_set_pdeathsig, signal.SIGKILL)


def main(command_fd: int, result_fd: int) -> int:
    die_with_parent()  # first: the parent stops this process only once it has answered
    commands = os.fdopen(command_fd, "r")
    results = os.fdopen(result_fd, "w")
    setup = json.loads(commands.readline())
    nonce = setup["nonce"]

    def send(message: dict) -> None:
        results.write(json.dumps({"nonce": nonce, **message}) + "\n")
        results.flush()

    patched = guards.patch_check(kernels=True)  # before the solution is loaded: the backstop after each workload
    try:
        suite, bench = bench_from_setup(setup)
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which marks the workloads
        send({"error": f"{type(exc).__name__}: {exc}"})
        return 1
    send({"ready": True})
    by_uuid = {workload.uuid: workload for workload in suite.workloads}
    for line in commands:
        command = json.loads(line)
        if command.get("finish"):
            send({"finish": json.loads(bench.finish(suite, []).model_dump_json())})
            return 0
        workload = by_uuid[command["workload"]]
        if command.get("baseline") is not None:
            bench.baseline[workload.uuid] = Baseline(**command["baseline"])
        result = bench.workload(suite, workload)
        replaced = patched()  # before any harness code is looked up again: it puts back what was replaced
        result = bench.mark_patched(result, replaced)
        send({"result": json.loads(result.model_dump_json())})
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), int(sys.argv[2])))
