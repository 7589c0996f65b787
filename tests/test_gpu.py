"""GPU-only checks of the harness itself (run on the H200: `pytest -m gpu`)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from harness.attribution import profile_kernels
from harness.isolation import RunPlan
from harness.launch_audit import cupti
from harness.parallel import device_slots, run_local
from harness.registry import SOLUTIONS_DIR, get_solution
from harness.results import BenchResult
from harness.runner import Bench, BenchOptions
from harness.scoring import Scorer
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


def bench_smallest_public_workload(
    solution: str, results_dir: Path, cuda_graph: bool = False, kernels: bool = False, more: tuple[int, ...] = ()
) -> BenchResult:
    """One solution on the public workload of the fewest bytes (#14, B = 256, T = 64) and on those of `more`, with
    few trials and calls."""
    suite = load_named_suite("public")
    options = BenchOptions(trials=2, timing=TimingConfig(max_calls=20), cuda_graph=cuda_graph, kernels=kernels)
    workloads = [suite.workloads[i] for i in (14, *more)]
    return Bench(get_solution(solution), torch.device("cuda"), options, results_dir).run(suite, workloads)


def test_bench_names_the_gpu_as_its_tensors_do(tmp_path: Path) -> None:
    """The checks compare a device with the outputs' (an output elsewhere is not sampled): Bench gives "cuda" an index."""
    bench = Bench(get_solution("torch_eager"), torch.device("cuda"), BenchOptions(trials=1), tmp_path)
    assert bench.device == torch.empty(0, device="cuda").device


@pytest.mark.parametrize("solution", ["reference_fp32", "torch_eager"])
def test_public_workload_on_cuda(tmp_path: Path, solution: str) -> None:
    result = bench_smallest_public_workload(solution, tmp_path)
    workload = result.workloads[0]
    assert workload.status is Status.PASSED, workload.message
    assert workload.call_latency.clock == workload.device_time.clock == "cuda_events" and workload.device_time.n >= 10
    assert workload.host.median_us > 0 and workload.call_latency.mean_us > 0
    assert 0 < workload.launch_floor.host_us < workload.launch_floor.latency_us < workload.call_latency.mean_us
    assert workload.sol_us is not None and 0 < workload.percent_of_sol < 100
    assert result.provenance.device_type == "cuda" and result.provenance.sm_count


@pytest.mark.skipif(cupti is None, reason="the launch audit needs cupti-python (pip install '.[cupti]')")
def test_launch_audit_then_kernel_profile_on_each_workload(tmp_path: Path) -> None:
    """Each workload's trials and timings run under the launch audit, which passes the honest solution and hands CUPTI
    back for `--kernels`' torch.profiler, workload after workload."""
    result = bench_smallest_public_workload("torch_cublas", tmp_path, kernels=True, more=(0,))
    assert result.config.launch_audit.startswith("cupti-python")
    for workload in result.workloads:
        assert workload.status is Status.PASSED and "NOT_AUDITED" not in workload.flags, workload.message
        assert workload.kernels is not None and workload.kernels.calls == 3 and workload.kernels.kernels


def test_isolated_workers_on_one_gpu(tmp_path: Path) -> None:
    """harness bench's default: each solution in a worker process bound to the GPU (one device slot), the baseline's
    latency the other's T_b."""
    suite, cuda = load_named_suite("public"), torch.device("cuda")
    options = BenchOptions(trials=2, timing=TimingConfig(max_calls=20))
    plan = RunPlan(["torch_eager", "reference_fp32"], SOLUTIONS_DIR, options, tmp_path, suite, [suite.workloads[14]],
                   Scorer(cuda, tmp_path))  # fmt: skip
    results = run_local(plan, device_slots("1", "cuda"))
    for result in results.values():
        (workload,) = result.workloads
        assert workload.status is Status.PASSED and workload.device_index == 0, workload.message
        assert result.provenance.device_type == "cuda" and [d.device_type for d in result.devices] == ["cuda"]
    assert results["torch_eager"].workloads[0].baseline_us == results["reference_fp32"].workloads[0].latency_us


def test_cuda_graph_replays_pass_the_check_near_the_device_time(tmp_path: Path) -> None:
    """`bench --cuda-graph`: triton_fused captured in a CUDA graph (two streams, events, its recorded launches) replays
    with outputs that pass the check, in about its device time (the GPU's work without the host's issue)."""
    (workload,) = bench_smallest_public_workload("triton_fused", tmp_path, cuda_graph=True).workloads
    graph = workload.cuda_graph
    assert workload.status is Status.PASSED and graph.error == "", (workload.message, graph.error)
    assert 0.8 * workload.device_us < graph.timing.mean_us < 1.3 * workload.device_us, (graph.timing.mean_us, workload.device_us)


def test_kernel_profile_from_an_idle_device_or_behind_a_head_start() -> None:
    """`bench --kernels` profiles a call from an idle device; timeline.py behind a GPU spin, which the profile leaves out:
    both see the call's one kernel, and the 2 ms spin is in neither span. From an idle device the host's lead-in is read
    against the marker fill: a call that spends 2 ms on the host before its launch shows it, one that launches at once
    a few microseconds."""
    cuda = torch.device("cuda")
    a = torch.randn(2048, 2048, device=cuda)

    def late(i: int) -> torch.Tensor:
        time.sleep(2e-3)
        return a @ a

    idle = profile_kernels(lambda i: a @ a, lambda i: None, cuda)
    ahead = profile_kernels(lambda i: a @ a, lambda i: None, cuda, head_start_s=2e-3)
    slow_host = profile_kernels(late, lambda i: None, cuda)
    for profile in (idle, ahead, slow_host):
        assert profile.calls == 3 and len(profile.kernels) == 1 and 0 < profile.span_us < 1000, profile
        assert profile.idle_us == pytest.approx(0.0, abs=1e-6), profile  # one kernel: no gap inside the span
    assert idle.kernels[0].name == ahead.kernels[0].name
    assert ahead.lead_in_us is None and 0 <= idle.lead_in_us < 200 and 1900 <= slow_host.lead_in_us < 4000, (idle, slow_host)
