"""Scoring a measured workload on its device: T_SOL, percent of SOL, INVALID_TIMING and the SOL score against the
float32 baseline's time. harness.roofline holds the formulas and the peaks; Scorer applies them to results, with the
device's datasheet and calibrated peaks and the baseline's result files."""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from harness import provenance
from harness.results import BASELINE_SOLUTION, ResultsError, WorkloadResult, load_calibration, load_result, result_path
from harness.roofline import datasheet_peaks, percent_of_sol, sol_score, sol_time_us
from harness.status import Status
from harness.workloads import Workload, available_suites
from reference.problem import Dims, bytes_moved, flops


@dataclass(frozen=True)
class Baseline:
    """reference_fp32's means on one workload: T_b of the call-latency and of the device-time scores."""

    latency_us: float | None
    device_us: float | None

    @classmethod
    def of(cls, result: WorkloadResult) -> Baseline:
        return cls(result.latency_us, result.device_us)


class Scorer:
    """The roofline verdicts on one device: T_SOL, percent of SOL, INVALID_TIMING and the SOL score.

    The worker that measured a result and the parent that collects it (harness.isolation) both use it, so
    the parent re-derives every verdict from the reported time instead of trusting the worker's.
    """

    def __init__(self, device: torch.device, results_dir: Path, solution: str = ""):
        self.device = device
        self.results_dir = results_dir
        self.solution = solution
        self.device_slug = provenance.device_slug(device)
        self.peaks = datasheet_peaks(provenance.device_name(device)) if device.type == "cuda" else None
        calibration = load_calibration(results_dir, self.device_slug) if device.type == "cuda" else None
        self.measured_peaks = calibration.peaks() if calibration else None

    def for_solution(self, name: str) -> Scorer:
        other = copy.copy(self)
        other.solution = name
        return other

    def baseline_from_file(self) -> dict[str, Baseline]:
        """T_b per workload uuid from this device's reference_fp32 result files, those of every suite in workloads/
        (full runs only; a workload's uuid names it in every suite); files it cannot read are passed over."""
        paths = {result_path(self.results_dir, self.device_slug, BASELINE_SOLUTION, suite=name) for name in available_suites()}
        baseline = {}
        for path in sorted(p for p in paths if p.exists()):
            try:
                workloads = load_result(path).workloads
            except ResultsError:  # a file this harness cannot read gives no T_b; a baseline run alongside still does
                continue
            baseline.update({w.uuid: Baseline.of(w) for w in workloads if w.latency_us is not None})
        return baseline

    def base(
        self, workload: Workload, index: int, status: Status, message: str, baseline: Baseline | None = None
    ) -> WorkloadResult:
        dims = workload.dims
        return WorkloadResult(
            uuid=workload.uuid,
            index=index,
            batch_seq_len=dims.batch_seq_len,
            num_tokens=dims.num_tokens,
            hidden_dim=dims.hidden_dim,
            ffn_dim=dims.ffn_dim,
            status=status,
            message=message,
            flops=flops(dims),
            bytes=bytes_moved(dims),
            baseline_us=baseline.latency_us if baseline else None,
            device_baseline_us=baseline.device_us if baseline else None,
        )

    def rescore(self, result: WorkloadResult) -> WorkloadResult:
        dims = Dims(result.batch_seq_len, result.num_tokens, result.hidden_dim, result.ffn_dim)
        result.flops, result.bytes = flops(dims), bytes_moved(dims)
        result.sol_us = sol_time_us(dims, self.peaks) if self.peaks else None
        result.sol_us_measured = sol_time_us(dims, self.measured_peaks) if self.measured_peaks else None
        if result.call_latency is None and result.device_time is None:
            return result
        impossible = self._below_roofline(result, dims) if self.peaks else ""
        if impossible and result.status in (Status.PASSED, Status.INCORRECT_NUMERICAL):
            result.status, result.message = Status.INVALID_TIMING, f"{impossible}: physically impossible"
        if self.solution == BASELINE_SOLUTION:
            result.baseline_us, result.device_baseline_us = result.latency_us, result.device_us
        result.percent_of_sol, result.percent_of_sol_measured, result.sol_score = self._scores(
            result, result.latency_us, result.baseline_us
        )
        result.device_percent_of_sol, result.device_percent_of_sol_measured, result.device_sol_score = self._scores(
            result, result.device_us, result.device_baseline_us
        )
        return result

    def _below_roofline(self, result: WorkloadResult, dims: Dims) -> str:
        """The first of the result's means below its roofline time with datasheet peaks, named; "" where none. Every
        timing is held to it, each mixed-T call's T to its own; an optional timing that failed (its error says why) is
        reported with no mean, and so is not."""
        optional = {"CUDA-graph": result.cuda_graph, "sustained": result.sustained}
        timings = {
            "call latency": result.call_latency,
            "device time": result.device_time,
            **{what: part.timing for what, part in optional.items() if part is not None and not part.error},
        }
        means = [(what, timing.mean_us, dims) for what, timing in timings.items() if timing is not None]
        if result.mixed_tokens is not None and not result.mixed_tokens.error:
            mixed = result.mixed_tokens
            means += [(f"mixed-T T = {t}", us, replace(dims, num_tokens=t)) for t, us in zip(mixed.tokens, mixed.tokens_us)]
        for what, mean_us, at in means:
            sol_us = sol_time_us(at, self.peaks)
            if mean_us < sol_us:
                return f"{what} mean {mean_us:.1f} us is below the roofline's {sol_us:.1f} us"
        return ""

    def _scores(self, result: WorkloadResult, latency: float | None, baseline: float | None) -> tuple[float | None, ...]:
        """(%SOL with datasheet peaks, %SOL with measured ceilings, SOL score) of one timing."""
        if latency is None:
            return None, None, None
        percent = percent_of_sol(latency, result.sol_us) if result.sol_us is not None else None
        measured = percent_of_sol(latency, result.sol_us_measured) if result.sol_us_measured is not None else None
        passed = result.status is Status.PASSED and baseline is not None and result.sol_us is not None
        return percent, measured, sol_score(latency, result.sol_us, baseline) if passed else None
