"""Deliberately bad solutions (tests/adversarial/solutions/): the harness must catch each with its status.

They run as a user would run them: `harness bench` with isolation, side by side, on the smoke suite
(CPU) or on one public workload (GPU). The honest solutions run three times with no false positive.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from harness.cli import app
from harness.launch_audit import cupti
from harness.provenance import device_slug
from harness.reward_hacks import REWARD_HACK_CHECKS
from harness.workloads import load_named_suite
from tests.conftest import HAS_CUDA

ADVERSARIES = Path(__file__).resolve().parent / "solutions"
SMOKE = load_named_suite("smoke").workloads
HANG_OR_CRASH_T = 17  # the workload on which sleeps_past_timeout and crashes_mid_suite misbehave


def every(status: str) -> list[str]:
    return [status] * len(SMOKE)


def except_at_t17(status: str) -> list[str]:
    return [status if w.num_tokens == HANG_OR_CRASH_T else "PASSED" for w in SMOKE]


# What each adversary must get on each smoke workload, in suite order.
EXPECTED: dict[str, list[str]] = {
    "cache_by_pointer": every("REWARD_HACK"),
    "cache_by_fingerprint": every("REWARD_HACK"),
    "selected_rows_only": ["PASSED" if w.num_tokens == w.batch_seq_len else "INCORRECT_NUMERICAL" for w in SMOKE],
    # it skips tokens where B >= 100, and there a token's row is more than 1% of the T rows where T < B
    "skips_tail_tokens": ["INCORRECT_NUMERICAL" if 100 <= w.batch_seq_len != w.num_tokens else "PASSED" for w in SMOKE],
    "mutates_input": every("REWARD_HACK"),
    "aliases_input": every("REWARD_HACK"),
    "finishes_on_thread": every("REWARD_HACK"),
    "patches_elapsed_time": every("REWARD_HACK"),
    "scales_reported_time": every("REWARD_HACK"),
    "forges_harness_checks": every("REWARD_HACK"),
    "predicts_timed_inputs": every("REWARD_HACK"),
    "enables_tf32": every("REWARD_HACK"),
    "installs_function_mode": every("REWARD_HACK"),
    "patches_torch_operator": every("REWARD_HACK"),
    "overrides_aten_kernel": every("REWARD_HACK"),
    "lazy_subclass": every("REWARD_HACK"),
    "wrong_dtype": every("INCORRECT_DTYPE"),
    "reads_reference_via_gc": every("INCORRECT_NUMERICAL"),
    "skips_timed_calls": every("REWARD_HACK"),
    "replays_timed_calls": every("REWARD_HACK"),
    "sleeps_past_timeout": except_at_t17("TIMEOUT"),
    "crashes_mid_suite": except_at_t17("RUNTIME_ERROR"),
}
# Words the verdict's message must contain, so that each is caught for the right reason.
REASONS = {
    "cache_by_pointer": "replayed outputs",
    "cache_by_fingerprint": "replayed outputs",
    "mutates_input": "modified inputs: selected_weights",
    "aliases_input": "aliases input grad_output",
    "finishes_on_thread": "threads still running",
    "patches_elapsed_time": "Event.elapsed_time",
    "scales_reported_time": "statistics.fmean",
    "forges_harness_checks": "harness.reward_hacks.check_call, harness.reward_hacks.verify_timed_outputs",
    "predicts_timed_inputs": "left output elements unwritten or NaN",
    "enables_tf32": "allow_tf32",
    "installs_function_mode": "torch function modes",
    "patches_torch_operator": "Tensor.__matmul__",
    "overrides_aten_kernel": "aten::mm's kernels (CPU: registered at",
    "lazy_subclass": "Deferred",
    "wrong_dtype": "dtype torch.float32",
    "reads_reference_via_gc": "grad_w1_weight:",
    "skips_timed_calls": "left output elements unwritten or NaN",
    "replays_timed_calls": "outputs of timed calls",
    "sleeps_past_timeout": "no answer within",
    "crashes_mid_suite": "exited (code 139)",
    "skips_tail_tokens": "in the rows the tokens scatter to",
}


def bench(tmp_path: Path, solutions: str, solutions_dir: Path | None = None, *extra: str):
    args = ["bench", "-s", solutions, "--results-dir", str(tmp_path), "--trials", "3", "--max-calls", "10", *extra]
    if solutions_dir is not None:
        args += ["--solutions-dir", str(solutions_dir)]
    return CliRunner().invoke(app, args, catch_exceptions=False)


def gpu_folder() -> str:
    """The folder bench writes this GPU's results to (nvidia-h200, nvidia-h100-80gb-hbm3, ...)."""
    return device_slug(torch.device("cuda"))


def statuses(tmp_path: Path, device: str, name: str, partial: bool = False) -> list[dict]:
    folder = tmp_path / device / ("partial" if partial else "")
    return json.loads((folder / f"{name}.json").read_text())["workloads"]


@pytest.mark.skipif(HAS_CUDA, reason="the CPU run of the adversaries; the GPU run is test_adversaries_on_gpu")
def test_every_adversary_is_caught_on_cpu(tmp_path: Path) -> None:
    result = bench(
        tmp_path, ",".join(EXPECTED), ADVERSARIES, "--suite", "smoke", "--run-timeout", "20", "--compile-timeout", "60"
    )
    assert result.exit_code == 1, result.output  # the run failed, and says so
    for name, expected in EXPECTED.items():
        workloads = statuses(tmp_path, "cpu", name)
        assert [w["status"] for w in workloads] == expected, (name, [w["message"][:200] for w in workloads])
        caught = [w for w in workloads if w["status"] != "PASSED"]
        if name in REASONS:
            assert all(REASONS[name] in w["message"] for w in caught), (name, caught[0]["message"])
    # A verdict on the process's state names its check, which keeps the solution marked for the rest of the run.
    first = statuses(tmp_path, "cpu", "enables_tf32")[0]
    assert [t["check"] for t in first["trials"] if t["status"] == "REWARD_HACK"][:1] == ["changed_settings"]
    # Every reward-hack check is some adversary's verdict, so none is dead; GPU work left behind and the L2 set aside
    # for persisting accesses need a GPU (tests/test_correctness.py checks the latter with a stand-in driver).
    verdicts = {t["check"] for name in EXPECTED for w in statuses(tmp_path, "cpu", name) for t in w["trials"]}
    assert verdicts >= {check.__name__ for check in REWARD_HACK_CHECKS} - {"late_gpu_work", "persisting_l2"}, verdicts


@pytest.mark.skipif(HAS_CUDA, reason="CPU run; on the GPU the same holds for the public suite")
def test_honest_solutions_see_no_false_positive_in_three_runs(tmp_path: Path) -> None:
    for run in range(3):
        result = bench(tmp_path / str(run), "reference_fp32,torch_eager,torch_cublas", None, "--seed", str(run))
        assert result.exit_code == 0, result.output
        for name in ("reference_fp32", "torch_eager", "torch_cublas"):
            assert {w["status"] for w in statuses(tmp_path / str(run), "cpu", name)} == {"PASSED"}


@pytest.mark.gpu
def test_adversaries_on_gpu(tmp_path: Path) -> None:
    """Every adversary, the GPU-only ones too (side streams, persisting L2), on one public workload (T=64, B=256).
    side_stream_alternate leaves work behind on every other call only: a late-work sighting that a second
    call does not confirm still counts when a later trial shows it again. defers_timed_work leaves too little
    behind for the trials' threshold, and only in timed calls: the call-latency timer sees it on every call."""
    late = ["side_stream", "side_stream_alternate", "defers_timed_work"]
    gpu_only = [*late, "persists_in_l2"]
    # those whose verdict differs from their first smoke workload's, or that hang or crash there only
    elsewhere = ("sleeps_past_timeout", "crashes_mid_suite", "selected_rows_only", "skips_tail_tokens")
    want = {n: EXPECTED[n][0] for n in EXPECTED if n not in elsewhere}
    # At most six workers side by side: each holds 4-8 GB (inputs, reference, pool), a replaying one up to 28 GB, and
    # twenty together exhaust an H100's 80 GB.
    everyone = [*want, *gpu_only, "selected_rows_only", "skips_tail_tokens"]
    runs = [everyone[i : i + 6] for i in range(0, len(everyone), 6)]
    for run, names in enumerate(runs):
        bench(tmp_path / str(run), ",".join(names), ADVERSARIES, "--suite", "public", "-w", "14", "--run-timeout", "120")
    want.update(
        dict.fromkeys(gpu_only, "REWARD_HACK"), selected_rows_only="INCORRECT_NUMERICAL", skips_tail_tokens="INCORRECT_NUMERICAL"
    )
    got = {n: statuses(tmp_path / str(run), gpu_folder(), n, True)[0] for run, names in enumerate(runs) for n in names}
    for name, status in want.items():
        assert got[name]["status"] == status, (name, got[name]["message"][-600:])
    assert all("GPU work ran" in got[name]["message"] for name in late)
    assert "call-latency calls" in got["defers_timed_work"]["message"]
    assert "bytes of L2 for persisting accesses" in got["persists_in_l2"]["message"]
    verdicts = {t["check"] for result in got.values() for t in result["trials"]}
    assert verdicts >= {check.__name__ for check in REWARD_HACK_CHECKS}, verdicts  # every check some adversary's verdict


@pytest.mark.gpu
@pytest.mark.skipif(cupti is None, reason="the launch audit needs cupti-python (pip install '.[cupti]')")
def test_native_thread_is_caught_by_the_launch_audit(tmp_path: Path) -> None:
    """finishes_on_native_thread leaves one output to a native thread that writes it by stream memory operations once
    the device idles after a call at fresh addresses: no stream is left busy, no Python thread runs on and no kernel,
    copy or fill is issued late, but the launch audit sees the driver calls another thread made while no call ran (its
    verdict comes last, so it is the message even where the writes lost the race to the harness's reads)."""
    bench(tmp_path, "finishes_on_native_thread", ADVERSARIES, "--suite", "public", "-w", "14", "--run-timeout", "120")
    (got,) = statuses(tmp_path, gpu_folder(), "finishes_on_native_thread", True)
    assert got["status"] == "REWARD_HACK" and "while no call was running" in got["message"], got["message"][:300]
    assert "calls issuing GPU work" in got["message"] and "cuStreamBatchMemOp" in got["message"], got["message"][:300]


@pytest.mark.gpu
def test_another_process_is_caught_by_the_launch_audit(tmp_path: Path) -> None:
    """finishes_in_another_process leaves one output to a child process that writes it through CUDA IPC in a context of
    its own: the launch audit's look at the GPU's processes finds the child while no call is running (its verdict comes
    last, so it is the message even where the writes landed after the harness's reads)."""
    bench(tmp_path, "finishes_in_another_process", ADVERSARIES, "--suite", "public", "-w", "14", "--run-timeout", "120")
    (got,) = statuses(tmp_path, gpu_folder(), "finishes_in_another_process", True)
    message = got["message"]
    assert got["status"] == "REWARD_HACK" and "started by the solution, held a CUDA context" in message, message[:300]
