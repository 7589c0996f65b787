"""Speed of light (SPEC section 5): the roofline time of a workload on a device, percent of SOL, SOL score.

T_SOL = max(FLOPs / peak_flops, bytes / peak_bandwidth). Peaks come from datasheets (named with their
source below) or from `harness calibrate`, which measures them on the device at hand. A measured time
below T_SOL with *datasheet* peaks is physically impossible and is reported as INVALID_TIMING.
"""

from __future__ import annotations

from dataclasses import dataclass

from reference.problem import Dims, bytes_moved, flops


@dataclass(frozen=True)
class DevicePeaks:
    label: str
    flops_per_s: float
    bytes_per_s: float
    source: str


# Matched against the device name in this order (a name is matched by substring, case-insensitive).
DATASHEET_PEAKS: tuple[tuple[str, DevicePeaks], ...] = (
    ("H200", DevicePeaks("H200 SXM datasheet", 989e12, 4.8e12, "NVIDIA H200 datasheet: dense BF16 989 TFLOP/s, HBM3e 4.8 TB/s")),
    (
        "H100",
        DevicePeaks("H100 SXM datasheet", 989e12, 3.35e12, "NVIDIA H100 SXM datasheet: dense BF16 989 TFLOP/s, HBM3 3.35 TB/s"),
    ),
    (
        "B200",
        DevicePeaks(
            "B200 (SOLAR)", 1.811e15, 7.667e12, "public leaderboard's SOLAR model: BF16 1.811 PFLOP/s, 7.667 TB/s at 1500 MHz"
        ),
    ),
)


def datasheet_peaks(device_name: str) -> DevicePeaks | None:
    for key, peaks in DATASHEET_PEAKS:
        if key.lower() in device_name.lower():
            return peaks
    return None


def sol_time_us(dims: Dims, peaks: DevicePeaks) -> float:
    return max(flops(dims) / peaks.flops_per_s, bytes_moved(dims) / peaks.bytes_per_s) * 1e6


def percent_of_sol(latency_us: float, sol_us: float) -> float:
    return 100.0 * sol_us / latency_us


def sol_score(latency_us: float, sol_us: float, baseline_us: float) -> float:
    """S = 1 / (1 + (T_k - T_SOL) / (T_b - T_SOL)): 0.5 at the baseline T_b, 1 at the speed of light."""
    return 1.0 / (1.0 + (latency_us - sol_us) / (baseline_us - sol_us))
