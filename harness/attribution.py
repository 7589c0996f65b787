"""Kernel attribution: which GPU activities one call runs, when each starts and how long it takes.

The public SOL-ExecBench evaluator times a call as the span from its first kernel's start to its last kernel's end,
read through the CUDA profiling interface (CUPTI). torch.profiler reads the same interface through Kineto and ships
with every CUDA build of torch, so it needs no extra package. Each profiled call starts on an idle device (as under
the call-latency timer), so the start offsets show where the GPU waits for the host to issue the next launch; or, with
a head start, behind a GPU spin long enough for the host to queue every launch first (as under the device-time timer),
so they show how the kernels share the GPU.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch
from torch.profiler import ProfilerActivity, profile

from harness.results import KernelProfile, KernelRun
from harness.timing import SPIN_CYCLES_PER_SECOND, L2Flusher

PROFILED_CALLS = 3


def _activities(prof: profile, skip: int = 0) -> list[KernelRun]:
    """The GPU activities (kernels, copies, fills) of one profiled window but its first `skip`, in start order, offsets
    from the first start."""
    events = sorted(
        (e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA), key=lambda e: e.time_range.start
    )[skip:]
    if not events:
        return []
    first = events[0].time_range.start
    return [
        KernelRun(
            name=e.name,
            stream=int(getattr(e, "device_resource_id", 0) or 0),
            start_us=e.time_range.start - first,
            duration_us=e.time_range.end - e.time_range.start,
        )
        for e in events
    ]


def profile_kernels(
    call: Callable[[int], None],
    prepare: Callable[[int], None],
    device: torch.device,
    calls: int = PROFILED_CALLS,
    head_start_s: float = 0.0,
) -> KernelProfile:
    """Profile `calls` single calls, each after `prepare(i)` and an L2 flush outside the profiled window; with
    `head_start_s`, behind a GPU spin of that long inside the window (the spin is left out of the activities)."""
    flush = L2Flusher(device)
    runs: list[list[KernelRun]] = []
    for i in range(calls):
        prepare(i)
        flush()
        torch.cuda.synchronize(device)
        try:
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                if head_start_s:
                    torch.cuda._sleep(int(head_start_s * SPIN_CYCLES_PER_SECOND))
                call(i)
                torch.cuda.synchronize(device)
        except RuntimeError as exc:  # the profiler unavailable: attribution is informational, the timings stand
            return KernelProfile(calls=0, span_us=0.0, busy_us=0.0, kernels=[], note=f"the profiler failed: {exc}")
        runs.append(_activities(prof, skip=1 if head_start_s else 0))
    seen = [run for run in runs if run]
    if not seen:
        return KernelProfile(calls=calls, span_us=0.0, busy_us=0.0, kernels=[], note="the profiler recorded no GPU activity")
    spans = [max(k.start_us + k.duration_us for k in run) for run in seen]
    median_run = seen[sorted(range(len(seen)), key=spans.__getitem__)[len(seen) // 2]]
    return KernelProfile(
        calls=len(seen),
        span_us=statistics.median(spans),
        busy_us=statistics.median(sum(k.duration_us for k in run) for run in seen),
        kernels=median_run,
    )
