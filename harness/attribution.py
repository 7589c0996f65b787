"""Kernel attribution: which GPU activities one call runs, when each starts and how long it takes.

The public SOL-ExecBench evaluator times a call as the span from its first kernel's start to its last kernel's end,
read through the CUDA profiling interface (CUPTI). torch.profiler reads the same interface through Kineto and ships
with every CUDA build of torch, so it needs no extra package. Each profiled call starts on an idle device (as under
the call-latency timer), so the start offsets show where the GPU waits for the host to issue the next launch; or, with
a head start, behind a GPU spin long enough for the host to queue every launch first (as under the device-time timer),
so they show how the kernels share the GPU.

From an idle device a one-element fill is launched right before the call: the GPU starts it as soon as the host has
issued it, so its start marks the call's entry on the GPU's clock, and the call's first activity starts later by the
host's time to its first launch (the launch latency, the same for both, cancels). That lead-in, which the public
evaluator's span leaves out, and the idle time inside the span (the GPU waiting for launches) are what a call's
latency adds to its kernels' time. Both are read under the profiler, whose callbacks add host time to every launch,
so the lead-in is an upper bound (call latency less the span bounds it from below); the span and the activities'
durations are the GPU's own.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch
from torch.profiler import ProfilerActivity, profile

from harness.results import KernelProfile, KernelRun
from harness.timing import SPIN_CYCLES_PER_SECOND, L2Flusher

PROFILED_CALLS = 3


def _activities(prof: profile) -> list[KernelRun]:
    """The GPU activities (kernels, copies, fills) of one profiled window, in start order, offsets from the first."""
    events = sorted(
        (e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA), key=lambda e: e.time_range.start
    )
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


def after_first(runs: list[KernelRun]) -> tuple[float | None, list[KernelRun]]:
    """The activities after the window's first (the marker fill or the head start's spin), offsets from the earliest of
    them, and how long after the first's start that one started; (None, []) where nothing followed the first."""
    if len(runs) < 2:
        return None, []
    later = runs[1:]
    start = later[0].start_us
    return start - runs[0].start_us, [run.model_copy(update={"start_us": run.start_us - start}) for run in later]


def covered_us(runs: list[KernelRun]) -> float:
    """Time in which at least one of the activities runs (overlapping ones, on several streams, counted once)."""
    covered, reach = 0.0, float("-inf")
    for run in sorted(runs, key=lambda r: r.start_us):
        end = run.start_us + run.duration_us
        if end > reach:
            covered += end - max(run.start_us, reach)
            reach = end
    return covered


def profile_kernels(
    call: Callable[[int], None],
    prepare: Callable[[int], None],
    device: torch.device,
    calls: int = PROFILED_CALLS,
    head_start_s: float = 0.0,
) -> KernelProfile:
    """Profile `calls` single calls, each after `prepare(i)` and an L2 flush outside the profiled window, behind the
    marker fill (the module's docstring) or, with `head_start_s`, behind a GPU spin of that long; the marker or the spin
    is left out of the activities."""
    flush = L2Flusher(device)
    marker = torch.zeros(1, device=device)
    runs: list[list[KernelRun]] = []
    lead_ins: list[float] = []
    for i in range(calls):
        prepare(i)
        flush()
        torch.cuda.synchronize(device)
        try:
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                if head_start_s:
                    torch.cuda._sleep(int(head_start_s * SPIN_CYCLES_PER_SECOND))
                else:
                    marker.fill_(float(i))
                call(i)
                torch.cuda.synchronize(device)
        except RuntimeError as exc:  # the profiler unavailable: attribution is informational, the timings stand
            return KernelProfile(calls=0, span_us=0.0, busy_us=0.0, kernels=[], note=f"the profiler failed: {exc}")
        lead_in, run = after_first(_activities(prof))
        if run:
            runs.append(run)
            lead_ins.append(lead_in)
    if not runs:
        return KernelProfile(calls=calls, span_us=0.0, busy_us=0.0, kernels=[], note="the profiler recorded no GPU activity")
    spans = [max(k.start_us + k.duration_us for k in run) for run in runs]
    median_run = runs[sorted(range(len(runs)), key=spans.__getitem__)[len(runs) // 2]]
    return KernelProfile(
        calls=len(runs),
        span_us=statistics.median(spans),
        busy_us=statistics.median(sum(k.duration_us for k in run) for run in runs),
        idle_us=statistics.median(span - covered_us(run) for span, run in zip(spans, runs)),
        lead_in_us=None if head_start_s else statistics.median(lead_ins),
        kernels=median_run,
    )
