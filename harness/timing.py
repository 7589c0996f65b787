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
    # Host time to issue one call (CUDA) or the call itself (CPU); above mean_us, the solution is host-bound.
    # None in files of schema 1, which did not record it.
    host_us: float | None = None

    @classmethod
    def from_samples(
        cls, samples_us: list[float], clock: str, warmup_calls: int, input_sets: int, host_us: float
    ) -> TimingStats:
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
            host_us=host_us,
        )


def _converged(samples: list[float], config: TimingConfig) -> bool:
    if len(samples) < max(config.min_calls, 2):
        return False
    mean = statistics.fmean(samples)
    return statistics.stdev(samples) / math.sqrt(len(samples)) < config.target_rel_stderr * mean


# GPU cycles per second assumed when sizing the head start (the H200 runs at up to 1980 MHz); it only
# needs to be long enough, not exact.
SPIN_CYCLES_PER_SECOND = 2.0e9


class L2Flusher:
    """Evicts the L2 cache by writing a buffer twice its size (queued on the current stream).

    Writing leaves the L2 full of dirty lines, whose write-back falls inside the timed call that follows: on the
    H200 up to about 8 us of a memory-bound call (reading 117 MB: 43.1 us after this flush, 35.3 after one that
    reads the buffer; docs/performance.md, v9). Triton's do_bench flushes the same way, so figures stay comparable.
    """

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
    host_seconds = []
    for k in range(config.warmup_calls):
        torch.cuda.synchronize(device)
        begin = time.perf_counter()
        prepare(k % input_sets)
        flush()
        call(k % input_sets)
        host_seconds.append(time.perf_counter() - begin)
    torch.cuda.synchronize(device)
    host_per_call = statistics.median(host_seconds)
    # The events time the GPU's work. After each synchronisation the GPU's queue is empty, and where the
    # host needs longer to issue an iteration (prepare, flush, the solution's launches) than the GPU needs
    # to run it, later calls would time the host instead (seen on the H200: eager PyTorch and small-T
    # Triton calls varied 1.5x). A spin on the GPU as long as 1.5x the host's time for the whole batch
    # keeps the queue full, so every call of a batch starts when its predecessor ends.
    head_start_cycles = int(max(1e-3, 1.5 * config.batch_calls * host_per_call) * SPIN_CYCLES_PER_SECOND)

    samples: list[float] = []
    started = time.perf_counter()
    k = 0
    while len(samples) < config.max_calls:
        events = []
        torch.cuda._sleep(head_start_cycles)
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
    return TimingStats.from_samples(samples, "cuda_events", config.warmup_calls, input_sets, host_per_call * 1e6)


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
    return TimingStats.from_samples(samples, "cpu_wall", config.warmup_calls, input_sets, statistics.fmean(samples))
