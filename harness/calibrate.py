"""Measure the two ceilings of the roofline on the current GPU: copy bandwidth and bf16 matmul rate."""

from __future__ import annotations

import statistics

import torch

from harness import provenance
from harness.results import Calibration

COPY_BYTES = 2 * 2**30
MATMUL_SIZE = 8192
REPEATS = 20


# Short on purpose: on the H200 (2026-11-29) 3 warm-up products gave 764 TFLOP/s, while 1 s of sustained
# products first gave 598 (the chip lowers its clocks under a sustained matmul load). The ceiling is the
# rate the chip reaches, not the rate it can sustain for seconds.
WARMUP_CALLS = 3


def _median_ms(fn, repeats: int = REPEATS) -> float:
    for _ in range(WARMUP_CALLS):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def _copy_ms(device: torch.device, gen: torch.Generator) -> float:
    src = torch.randn(COPY_BYTES // 4, device=device, generator=gen)
    dst = torch.empty_like(src)
    return _median_ms(lambda: dst.copy_(src))


def _matmul_ms(device: torch.device, gen: torch.Generator) -> float:
    a = torch.randn(MATMUL_SIZE, MATMUL_SIZE, device=device, generator=gen).to(torch.bfloat16)
    b = torch.randn(MATMUL_SIZE, MATMUL_SIZE, device=device, generator=gen).to(torch.bfloat16)
    out = torch.empty_like(a)
    return _median_ms(lambda: torch.mm(a, b, out=out))


def calibrate(device: torch.device) -> Calibration:
    if device.type != "cuda":
        raise RuntimeError("calibration measures a CUDA GPU and none is present")
    clocks_before = provenance.read_clocks(device)
    gen = torch.Generator(device=device).manual_seed(0)

    copy_ms = _copy_ms(device, gen)
    matmul_ms = _matmul_ms(device, gen)

    return Calibration(
        device_name=provenance.device_name(device),
        copy_bytes_per_s=2 * COPY_BYTES / (copy_ms * 1e-3),
        matmul_flops_per_s=2 * MATMUL_SIZE**3 / (matmul_ms * 1e-3),
        method=(
            f"median of {REPEATS} CUDA-event timings after {WARMUP_CALLS} warm-ups: copy of {COPY_BYTES // 2**20} MiB "
            f"(read + write counted); torch.mm bf16 {MATMUL_SIZE}^3 on random normal data"
        ),
        provenance=provenance.collect(device, clocks_before),
    )
