"""GPU-only checks of the harness itself (run on the H200: `pytest -m gpu`)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from harness.registry import get_solution
from harness.runner import Bench, BenchOptions
from harness.status import Status
from harness.timing import TimingConfig
from harness.workloads import load_named_suite
from reference import generate_inputs
from reference.problem import Dims

pytestmark = pytest.mark.gpu


def test_generator_is_deterministic_on_cuda() -> None:
    dims = Dims(batch_seq_len=512, num_tokens=64)
    first, again = generate_inputs(dims, 11, "cuda"), generate_inputs(dims, 11, "cuda")
    assert all(torch.equal(first[name], again[name]) for name in first)


@pytest.mark.parametrize("solution", ["reference_fp32", "torch_eager"])
def test_public_workload_on_cuda(tmp_path: Path, solution: str) -> None:
    suite = load_named_suite("public")
    options = BenchOptions(trials=2, timing=TimingConfig(max_calls=20))
    result = Bench(get_solution(solution), torch.device("cuda"), options, tmp_path).run(suite, [suite.workloads[14]])
    workload = result.workloads[0]
    assert workload.status is Status.PASSED, workload.message
    assert workload.call_latency.clock == workload.device_time.clock == "cuda_events" and workload.device_time.n >= 10
    assert workload.host.median_us > 0 and workload.call_latency.mean_us > 0
    assert 0 < workload.launch_floor.host_us < workload.launch_floor.latency_us < workload.call_latency.mean_us
    assert workload.sol_us is not None and 0 < workload.percent_of_sol < 100
    assert result.provenance.device_type == "cuda" and result.provenance.sm_count
