"""The PyTorch peers are correct on the smoke suite on the CPU; the GPU run proves them on the public suite."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from harness.registry import get_solution
from harness.runner import Bench, BenchOptions
from harness.status import Status
from harness.timing import TimingConfig
from harness.workloads import load_named_suite

SMOKE = load_named_suite("smoke")
FAST = BenchOptions(trials=1, timing=TimingConfig(warmup_calls=1, min_calls=2, max_calls=4, batch_calls=2))


@pytest.mark.parametrize("name", ["torch_cublas", "torch_compile"])
def test_peer_passes_smoke_workloads(name: str) -> None:
    picks = [SMOKE.workloads[i] for i in (0, 3, 5)]  # T = 1, odd T = 17, T = B = 131
    result = Bench(get_solution(name), torch.device("cpu"), FAST, Path("/nonexistent")).run(SMOKE, picks)
    assert [w.status for w in result.workloads] == [Status.PASSED] * 3, [w.message for w in result.workloads]


def test_torch_cublas_fp16_path_for_large_t(monkeypatch) -> None:
    """Large T takes fp16 operands for grad_w1/grad_w3 instead of the hi + lo split: both must pass."""
    solution = get_solution("torch_cublas")
    bench = Bench(solution, torch.device("cpu"), FAST, Path("/nonexistent"))
    bench.start()
    module = sys.modules[bench._call.entry_point.__module__]
    monkeypatch.setattr(module, "HI_LO_MAX_TOKENS", 0)
    result = bench.workload(SMOKE, SMOKE.workloads[5])
    assert result.status is Status.PASSED, result.message
