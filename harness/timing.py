"""Timing one solution on one workload.

On CUDA every call is bracketed by events on the current stream; before each call, outside the timed
window, the caller's `prepare` poisons the outputs and the L2 cache is flushed by zeroing a buffer of
twice its size. Calls rotate over several input sets, so no two consecutive calls see the same data or
addresses. After a warm-up, calls are taken in batches until the standard error of the mean is under
`target_rel_stderr` of the mean, or a cap on calls or seconds is reached. On a CPU the same statistics
come from a wall clock and are labelled as such.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
from pydantic import BaseModel

# Two-sided 95% quantiles of Student's t for 1..30 degrees of freedom; the normal 1.96 beyond.
_T95 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


def t95(degrees_of_freedom: int) -> float:
    return _T95[degrees_of_freedom - 1] if degrees_of_freedom <= len(_T95) else 1.96


@dataclass(frozen=True)
class TimingConfig:
    warmup_calls: int = 3
    min_calls: int = 10
    max_calls: int = 300
    batch_calls: int = 10
    target_rel_stderr: float = 0.01
    max_seconds: float = 10.0


class TimingStats(BaseModel):
    clock: Literal["cuda_events", "cpu_wall"]
    mean_us: float
    median_us: float
    std_us: float
    min_us: float
    max_us: float
    n: int
    ci95_low_us: float
    ci95_high_us: float
    rel_stderr: float
    warmup_calls: int
    input_sets: int

    @classmethod
    def from_samples(cls, samples_us: list[float], clock: str, warmup_calls: int, input_sets: int) -> TimingStats:
        n = len(samples_us)
        mean = statistics.fmean(samples_us)
        std = statistics.stdev(samples_us) if n > 1 else 0.0
        stderr = std / math.sqrt(n)
        half_width = t95(n - 1) * stderr if n > 1 else 0.0
        return cls(
            clock=clock,
            mean_us=mean,
            median_us=statistics.median(samples_us),
            std_us=std,
            min_us=min(samples_us),
            max_us=max(samples_us),
            n=n,
            ci95_low_us=mean - half_width,
            ci95_high_us=mean + half_width,
            rel_stderr=stderr / mean if mean > 0 else 0.0,
            warmup_calls=warmup_calls,
            input_sets=input_sets,
        )


def _converged(samples: list[float], config: TimingConfig) -> bool:
    if len(samples) < max(config.min_calls, 2):
        return False
    mean = statistics.fmean(samples)
    return statistics.stdev(samples) / math.sqrt(len(samples)) < config.target_rel_stderr * mean


HEAD_START_CYCLES = 2_000_000  # about 1 ms at the H200's 1980 MHz


class L2Flusher:
    """Evicts the L2 cache by writing a buffer twice its size (queued on the current stream)."""

    def __init__(self, device: torch.device):
        l2_bytes = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 64 * 2**20)
        self.buffer = torch.empty(2 * l2_bytes // 4, dtype=torch.int32, device=device)

    def __call__(self) -> None:
        self.buffer.zero_()


def time_solution(
    call: Callable[[int], None],
    prepare: Callable[[int], None],
    input_sets: int,
    device: torch.device,
    config: TimingConfig = TimingConfig(),
) -> TimingStats:
    """Time `call(k)` on input set k, after `prepare(k)` outside the timed window, rotating k over the sets."""
    if device.type == "cuda":
        return _time_cuda(call, prepare, input_sets, device, config)
    return _time_cpu(call, prepare, input_sets, config)


def _time_cuda(
    call: Callable[[int], None], prepare: Callable[[int], None], input_sets: int, device: torch.device, config: TimingConfig
) -> TimingStats:
    flush = L2Flusher(device)
    for k in range(config.warmup_calls):
        prepare(k % input_sets)
        call(k % input_sets)
    torch.cuda.synchronize(device)

    samples: list[float] = []
    started = time.perf_counter()
    k = 0
    while len(samples) < config.max_calls:
        events = []
        # After a synchronisation the GPU's queue is empty, so the first call of a batch would also time
        # the host's launch latency (seen on the H200: one slow call in ten for eager PyTorch). A short
        # spin on the GPU lets the host queue ahead again, as it is in every later call of the batch.
        torch.cuda._sleep(HEAD_START_CYCLES)
        for _ in range(config.batch_calls):
            prepare(k % input_sets)
            flush()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            call(k % input_sets)
            end.record()
            events.append((start, end))
            k += 1
        torch.cuda.synchronize(device)
        samples.extend(start.elapsed_time(end) * 1e3 for start, end in events)
        if _converged(samples, config) or time.perf_counter() - started > config.max_seconds:
            break
    return TimingStats.from_samples(samples, "cuda_events", config.warmup_calls, input_sets)


def _time_cpu(
    call: Callable[[int], None], prepare: Callable[[int], None], input_sets: int, config: TimingConfig
) -> TimingStats:
    for k in range(config.warmup_calls):
        prepare(k % input_sets)
        call(k % input_sets)
    samples: list[float] = []
    started = time.perf_counter()
    k = 0
    while len(samples) < config.max_calls:
        for _ in range(config.batch_calls):
            prepare(k % input_sets)
            begin = time.perf_counter()
            call(k % input_sets)
            samples.append((time.perf_counter() - begin) * 1e6)
            k += 1
        if _converged(samples, config) or time.perf_counter() - started > config.max_seconds:
            break
    return TimingStats.from_samples(samples, "cpu_wall", config.warmup_calls, input_sets)
