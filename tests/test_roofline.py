"""Roofline figures computed by hand from SPEC section 5 for two workloads, and the SPEC anchors."""

from __future__ import annotations

import pytest
import torch

from harness.results import GraphTiming, MixedTokensTiming, SustainedTiming, TimingStats, WorkloadResult
from harness.roofline import DevicePeaks, datasheet_peaks, percent_of_sol, sol_score, sol_time_us
from harness.scoring import Scorer
from harness.status import Status
from harness.workloads import load_named_suite
from reference.problem import Dims, bytes_moved, flops

H200 = datasheet_peaks("NVIDIA H200")
H, F = 4096, 14336


def test_smallest_public_workload_by_hand() -> None:
    dims = Dims(batch_seq_len=256, num_tokens=64)
    assert flops(dims) == 12 * 64 * H * F == 45_097_156_608
    # grad_output + grad_hidden_states, four (T, F) activations, selected_tokens + expert_output,
    # three weights read and three gradients written, token_indices, selected_weights, grad_routing_weights.
    expected_bytes = 2 * 256 * H * 2 + 4 * 64 * F * 2 + 2 * 64 * H * 2 + 6 * F * H * 2 + 64 * 8 + 64 * 2 + 256 * 2
    assert bytes_moved(dims) == expected_bytes == 717_227_136
    # Memory-bound on the H200: 717.2 MB / 4.8 TB/s = 149.4 us (compute would be 45.6 us).
    assert sol_time_us(dims, H200) == pytest.approx(717_227_136 / 4.8e12 * 1e6)
    assert sol_time_us(dims, H200) == pytest.approx(149.42, abs=0.01)


def test_largest_public_workload_by_hand() -> None:
    dims = Dims(batch_seq_len=4096, num_tokens=2048)
    assert flops(dims) == 1_443_109_011_456
    assert bytes_moved(dims) == pytest.approx(1040e6, rel=1e-3)  # SPEC: 1040 MB
    # Compute-bound: 1.443 TFLOP / 989 TFLOP/s = 1459.16 us.
    assert sol_time_us(dims, H200) == pytest.approx(1459.16, abs=0.01)


def test_spec_anchor_mean_sol_over_the_public_suite() -> None:
    dims = [w.dims for w in load_named_suite("public").workloads]
    datasheet = sum(sol_time_us(d, H200) for d in dims) / len(dims)
    measured = DevicePeaks("measured", 791e12, 4.2e12, "SPEC section 5")
    calibrated = sum(sol_time_us(d, measured) for d in dims) / len(dims)
    assert datasheet == pytest.approx(277, abs=1.5)  # SPEC section 6: 277 us
    assert calibrated == pytest.approx(339, abs=1.5)  # SPEC section 6: 339 us


def test_peaks_are_picked_by_device_name() -> None:
    assert datasheet_peaks("NVIDIA H200").bytes_per_s == 4.8e12
    assert datasheet_peaks("NVIDIA H100 80GB HBM3").bytes_per_s == 3.35e12
    assert datasheet_peaks("NVIDIA B200").flops_per_s == 1.811e15
    assert datasheet_peaks("NVIDIA GeForce RTX 4090") is None


def test_sol_score_and_percent() -> None:
    assert sol_score(latency_us=1000, sol_us=100, baseline_us=1000) == pytest.approx(0.5)
    assert sol_score(latency_us=100, sol_us=100, baseline_us=1000) == pytest.approx(1.0)
    assert sol_score(latency_us=550, sol_us=100, baseline_us=1000) == pytest.approx(1 / 1.5)
    assert percent_of_sol(latency_us=200, sol_us=150) == pytest.approx(75.0)


def _result(dims: Dims, **timings) -> WorkloadResult:
    return WorkloadResult(uuid="u", index=0, batch_seq_len=dims.batch_seq_len, num_tokens=dims.num_tokens,
                          hidden_dim=dims.hidden_dim, ffn_dim=dims.ffn_dim, status=Status.PASSED, flops=flops(dims),
                          bytes=bytes_moved(dims), **timings)  # fmt: skip


def _mean(us: float) -> TimingStats:
    return TimingStats.from_samples([us, us], "cuda_events", warmup_calls=0, input_sets=0)


@pytest.mark.parametrize("timing", ["call_latency", "device_time", "cuda_graph", "sustained", "mixed_tokens"])
def test_every_timings_mean_below_the_roofline_is_invalid_timing(tmp_path, timing: str) -> None:
    """Whichever timing reports a mean below T_SOL with datasheet peaks makes the workload INVALID_TIMING, named; a
    mixed-T T is held to its own T_SOL (T = 262's mean here lies above T = 256's T_SOL, below its own)."""
    scorer = Scorer(torch.device("cpu"), tmp_path)
    scorer.peaks = H200
    dims, tokens = Dims(4096, 256), [250, 256, 262]
    sol = {t: sol_time_us(Dims(4096, t), H200) for t in tokens}

    def timings(fast: str) -> dict:
        late = 0.99 if fast == "mixed_tokens" else 1.1
        us = {name: _mean(sol[256] * (0.9 if name == fast else 1.2)) for name in ("call_latency", "device_time")}
        return {**us, "cuda_graph": GraphTiming(timing=_mean(sol[256] * (0.9 if fast == "cuda_graph" else 1.2))),
                "sustained": SustainedTiming(settle_s=1.0, timing=_mean(sol[256] * (0.9 if fast == "sustained" else 1.2))),
                "mixed_tokens": MixedTokensTiming(tokens=tokens, rounds=3, timing=_mean(sol[256] * 1.2),
                                                  tokens_us=[sol[250] * 1.2, sol[256] * 1.2, sol[262] * late])}  # fmt: skip

    assert sol[262] * 0.99 > sol[256]
    assert scorer.rescore(_result(dims, **timings(""))).status is Status.PASSED
    judged = scorer.rescore(_result(dims, **timings(timing)))
    named = {"call_latency": "call latency", "device_time": "device time", "cuda_graph": "CUDA-graph",
             "sustained": "sustained", "mixed_tokens": "mixed-T T = 262"}[timing]  # fmt: skip
    assert judged.status is Status.INVALID_TIMING and judged.message.startswith(f"{named} mean "), judged.message


def test_a_failed_cuda_graph_timing_is_not_held_to_the_roofline(tmp_path) -> None:
    """A graph whose last replay failed its check (its capture missed work, say) is reported as failed with no mean:
    its time is no measurement of the solution, and the workload keeps the verdict of its other timings."""
    scorer = Scorer(torch.device("cpu"), tmp_path)
    scorer.peaks = H200
    dims = Dims(4096, 256)
    sol = sol_time_us(dims, H200)
    graph = GraphTiming(timing=_mean(0.1 * sol), error="a last replay: outputs fail the check")
    result = _result(dims, call_latency=_mean(1.2 * sol), device_time=_mean(1.1 * sol), cuda_graph=graph)
    assert scorer.rescore(result).status is Status.PASSED
