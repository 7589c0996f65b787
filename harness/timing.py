"""Timing one solution on one workload, two ways, with CUDA events and the L2 cache flushed before every call.

- **Call latency** (`time_call_latency`, the headline): the device is synchronised before every call, as the
  public SOL-ExecBench evaluator does, so the solution's own host time to issue its launches counts wherever the
  GPU waits for it, as it does in a training step that cannot run ahead. Every call gets its inputs and outputs
  at addresses no earlier call used (`FreshAddresses`), so no cache keyed by pointers serves it. The host's time
  inside the call (its launches only: the redraw, flush and checks happen before it) is the solution's host cost.
- **Device time** (`time_device`): the GPU's queue kept full, a spin on the GPU ahead of each batch of calls
  letting the host queue the batch first, so every call starts when its predecessor ends. Calls rotate over a
  few input sets. This is the kernels' own time, the figure to tune kernels by.

Events time the caller's stream only. GPU work a call leaves on a stream its end event does not wait for (late
work: its outputs are not ready when the caller's stream goes on) is charged to its time: once the end event has
completed, the host times its wait for the whole device to go idle, less the same wait with the device idle just
before the call (`device_wait_after`) and a noise allowance. The device time charges what is still running when a
batch ends, spread over the batch's calls; work that ran beside the batch's later calls it cannot see. What was
charged, and how often, is kept with the timing (results.LateWork).

Before each call, outside the timed window, the caller's `prepare` redraws the call's inputs and poisons its
outputs. After a warm-up (a count of calls and a time, whichever ends later: TimingConfig), calls are taken in
batches until the standard error of the mean is under `target_rel_stderr` of the mean, or a cap on calls or seconds
is reached. On a CPU the same statistics come from a wall clock and are labelled as such.

Both leave the GPU idle between calls or batches (the spin ahead of a batch idles all but one of its SMs), and an
H200 whose load pauses stays below its power limit, at or near its boost clock. A training step keeps it busy: under
continuous heavy work the power limit brings the SM clock down within a fraction of a second. `time_sustained` times
calls back to back with no pause at all, after a settle time of the same calls (`bench --sustained`).
"""

from __future__ import annotations

import functools
import math
import statistics
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch

from harness.results import LateWork, TimingStats


@dataclass(frozen=True)
class TimingConfig:
    """The calls a timing makes: untimed warm-up calls until both `warmup_calls` have been made and `warmup_s` seconds
    have passed since the first began (clocks, caches and lazy initialisations settled by time as well as by count;
    Triton's do_bench warms up for 25 ms), at most max(warmup_calls, max_calls) of them; then timed calls, in batches,
    until the standard error of their mean is under `target_rel_stderr` of it, from `min_calls` on, or `max_calls` or
    `max_seconds` is reached."""

    warmup_calls: int = 3
    warmup_s: float = 0.025
    min_calls: int = 10
    max_calls: int = 300
    batch_calls: int = 10
    target_rel_stderr: float = 0.01
    max_seconds: float = 10.0

    @property
    def most_calls(self) -> int:
        """The most calls a timing makes, warm-ups included (what FreshAddresses must provide for)."""
        return max(self.warmup_calls, self.max_calls) + self.max_calls

    def warming_up(self, made: int, since: float) -> bool:
        """Whether the next call, after `made` warm-up calls, is a warm-up one too, the first having begun at `since`
        on the host's clock (time.perf_counter)."""
        if made < self.warmup_calls:
            return True
        return made < self.max_calls and time.perf_counter() - since < self.warmup_s


def _converged(samples: list[float], config: TimingConfig) -> bool:
    if len(samples) < max(config.min_calls, 2):
        return False
    mean = statistics.fmean(samples)
    return statistics.stdev(samples) / math.sqrt(len(samples)) < config.target_rel_stderr * mean


# Taken when the harness is imported, before any solution is, so that a solution replacing them cannot shorten a
# timing or hide late work. The wait for late work calls the C function under torch.cuda.synchronize (the current
# device): the Python wrapper allocates, and a garbage collection inside the wait would read as late work.
_clock = time.perf_counter
_device_synchronize = torch.cuda.synchronize
_synchronize_current_device = getattr(torch._C, "_cuda_synchronize", torch.cuda.synchronize)
_event_synchronize = torch.cuda.Event.synchronize

# The host's wait for an idle device after an honest call exceeds the same wait just before it by 10-30 us at the
# 99th percentile on the H200, more after long calls (up to ~1% of the call's own time), and by 25-70 us after a
# batch of ten; late work within this allowance per call is neither charged nor counted (docs/performance.md, at
# its top).
LATE_WORK_NOISE_US = 20.0
LATE_WORK_NOISE_SHARE = 0.01


def device_wait_after(event: torch.cuda.Event) -> float:
    """Microseconds the host waits for the whole device to go idle once `event` has completed: GPU work on streams
    the event's stream did not wait for, plus the cost of the synchronisation itself."""
    _event_synchronize(event)
    waited = _clock()
    _synchronize_current_device()
    return (_clock() - waited) * 1e6


def _late_charge(waited_us: float, idle_us: float, own_us: float, calls: int = 1) -> float:
    """The late work charged to `calls` calls whose own stream took `own_us` in all: their wait for an idle device
    beyond the same wait on an idle device and the noise allowance of as many calls."""
    return max(0.0, waited_us - idle_us - max(LATE_WORK_NOISE_US * calls, LATE_WORK_NOISE_SHARE * own_us))


def _idle_wait() -> float:
    """device_wait_after on a device with nothing left to run: what an honest call's wait costs."""
    done = torch.cuda.Event()
    done.record()
    return device_wait_after(done)


def _late_work(charges_us: list[float]) -> LateWork:
    return LateWork(
        measured=len(charges_us),
        late=sum(c > 0 for c in charges_us),
        mean_us=statistics.fmean(charges_us),
        max_us=max(charges_us),
    )


# GPU cycles per second assumed when sizing the head start (the H200 runs at up to 1980 MHz); it only
# needs to be long enough, not exact.
SPIN_CYCLES_PER_SECOND = 2.0e9


class L2Flusher:
    """Evicts the L2 cache by writing a buffer twice its size (queued on the current stream).

    Writing leaves the L2 full of dirty lines, which cost the timed call that follows a few percent at most against
    an L2 left clean (docs/performance.md). Triton's do_bench and NVIDIA's evaluator flush the same way, so figures
    stay comparable, and a training step's earlier work leaves dirty lines too.
    """

    def __init__(self, device: torch.device):
        l2_bytes = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 64 * 2**20)
        self.buffer = torch.empty(2 * l2_bytes // 4, dtype=torch.int32, device=device)

    def __call__(self) -> None:
        self.buffer.zero_()


class FreshAddresses:
    """Tensors that sit at addresses no earlier call of a workload used, at about 1x memory.

    Each tensor gets one pool of its own size plus `SHIFT` bytes per call; call i's tensor is the view that starts
    i * SHIFT bytes into its pool (the public evaluator's ShiftingMemoryPoolAllocator does the same). So every call
    has distinct data pointers for every tensor, and a cache keyed by pointers (an output cache, a CUDA graph
    captured for given addresses) never serves a timed call. SHIFT keeps every view 256-byte aligned, as fresh
    allocations are.
    """

    SHIFT = 256

    def __init__(self, templates: list[torch.Tensor], calls: int):
        self.calls = calls
        self.templates = [(t.shape, t.dtype, t.numel() * t.element_size()) for t in templates]
        self.pools = [
            torch.empty(nbytes + self.SHIFT * calls, dtype=torch.uint8, device=t.device)
            for t, (_, _, nbytes) in zip(templates, self.templates)
        ]

    def at(self, call: int) -> list[torch.Tensor]:
        """The tensors of call `call` (0 <= call < calls): views of the pools at call * SHIFT bytes."""
        if not 0 <= call < self.calls:
            raise IndexError(f"call {call} is outside the {self.calls} calls these pools were sized for")
        offset = call * self.SHIFT
        return [
            pool[offset : offset + nbytes].view(dtype).view(shape)
            for pool, (shape, dtype, nbytes) in zip(self.pools, self.templates)
        ]


def _nothing(i: int) -> None:
    pass


def time_call_latency(
    call: Callable[[int], None],
    prepare: Callable[[int], None],
    device: torch.device,
    config: TimingConfig = TimingConfig(),
    after: Callable[[int], None] = _nothing,
    samples_out: list[float] | None = None,
) -> tuple[TimingStats, TimingStats]:
    """(call latency, host cost) of `call(i)` for i = 0, 1, ...: `prepare(i)` gives call i its fresh inputs (at
    addresses of its own, see FreshAddresses) outside the timed window; the device is idle when each call starts;
    `after(i)` runs once the call has finished, outside the window. At most config.most_calls calls are made.
    `samples_out`, where given, receives each timed call's latency in order (the warm-ups' left out)."""
    flush = L2Flusher(device) if device.type == "cuda" else None
    samples: list[float] = []
    host: list[float] = []
    charges: list[float] = []
    started = time.perf_counter()
    i = warmups = 0
    while len(samples) < config.max_calls:
        warming = not samples and config.warming_up(i, started)
        prepare(i)
        if flush is not None:
            flush()
            idle = _idle_wait()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        issue = time.perf_counter()
        call(i)
        issued = time.perf_counter()
        charge = 0.0
        if flush is not None:
            end.record()
            waited, own_us = device_wait_after(end), start.elapsed_time(end) * 1e3
            charge = _late_charge(waited, idle, own_us)
            elapsed_us = own_us + charge
        else:
            elapsed_us = (issued - issue) * 1e6
        after(i)
        i += 1
        if warming:
            warmups = i
            continue
        samples.append(elapsed_us)
        host.append((issued - issue) * 1e6)
        charges.append(charge)
        if len(samples) % config.batch_calls == 0 and (
            _converged(samples, config) or time.perf_counter() - started > config.max_seconds
        ):
            break
    clock = "cuda_events" if flush is not None else "cpu_wall"
    if samples_out is not None:
        samples_out.extend(samples)
    return (
        TimingStats.from_samples(samples, clock, warmups, input_sets=0, late_work=_late_work(charges) if flush else None),
        TimingStats.from_samples(host, "host_wall", warmups, input_sets=0),
    )


def time_launch_floor(device: torch.device, config: TimingConfig = TimingConfig()) -> tuple[TimingStats, TimingStats]:
    """(call latency, host cost) of a call that launches one kernel (a one-element fill), by time_call_latency: the
    least any call costs on this machine at this moment (results.LaunchFloor)."""
    one = torch.empty(1, device=device)
    return time_call_latency(lambda i: one.fill_(float(i)), _nothing, device, config)


def capture_graph(call: Callable[[], list[object]], device: torch.device) -> tuple[torch.cuda.CUDAGraph, list[object]]:
    """`call` captured once in a CUDA graph, after one warm-up call on a side stream (as torch.cuda.graph asks);
    returns the graph and the outputs the captured call returned (the replays write them)."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        call()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        produced = call()
    return graph, produced


def time_device(
    call: Callable[[int], None],
    prepare: Callable[[int], None],
    input_sets: int,
    device: torch.device,
    config: TimingConfig = TimingConfig(),
    after: Callable[[int], None] = _nothing,
) -> TimingStats:
    """Device time of `call(k)` on input set k, after `prepare(k)` outside the timed window, rotating k over the sets
    (on a CPU: the wall clock of the same calls). `after(i)` follows the i-th call (warm-ups counted), outside the
    window: on the GPU it is issued behind the call on the same stream, before the call has run."""
    if device.type == "cuda":
        return _time_cuda(call, prepare, input_sets, device, config, after)
    return _time_cpu(call, prepare, input_sets, config, after)


EventPair = tuple[torch.cuda.Event, torch.cuda.Event]


def _event_pairs(count: int) -> list[EventPair]:
    """Start and end events for `count` timed calls. The queue-full timers make them once and record them again once
    their last timings were read: creating an event costs the host more than recording one, and the back-to-back
    timer's host has to stay ahead of the GPU."""
    return [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(count)]


def _timed_call(
    call: Callable[[int], None], prepare: Callable[[int], None], flush: L2Flusher, k: int, input_sets: int, events: EventPair
) -> None:
    """Call k on input set k % input_sets, behind its prepare and an L2 flush (outside the window), between the start
    and end of `events` recorded on the current stream: how both queue-full timers issue a timed call."""
    prepare(k % input_sets)
    flush()
    start, end = events
    start.record()
    call(k % input_sets)
    end.record()


def _time_cuda(
    call: Callable[[int], None],
    prepare: Callable[[int], None],
    input_sets: int,
    device: torch.device,
    config: TimingConfig,
    after: Callable[[int], None],
) -> TimingStats:
    flush = L2Flusher(device)
    host_seconds = []
    warmup_started = time.perf_counter()
    while config.warming_up(len(host_seconds), warmup_started):
        k = len(host_seconds)
        _device_synchronize(device)
        begin = time.perf_counter()
        prepare(k % input_sets)
        flush()
        call(k % input_sets)
        after(k)
        host_seconds.append(time.perf_counter() - begin)
    _device_synchronize(device)
    warmups = len(host_seconds)
    host_per_call = statistics.median(host_seconds)
    # After each synchronisation the GPU's queue is empty, and where the host needs longer to issue an iteration
    # (prepare, flush, the solution's launches, the checks after it) than the GPU needs to run it, later calls would time the host
    # instead. A spin on the GPU as long as 1.5x the host's time for the whole batch keeps the queue full, so
    # every call of a batch starts when its predecessor ends.
    head_start_cycles = int(max(1e-3, 1.5 * config.batch_calls * host_per_call) * SPIN_CYCLES_PER_SECOND)

    samples: list[float] = []
    charges: list[float] = []
    started = time.perf_counter()
    k, lengthened = 0, 0
    events = _event_pairs(config.batch_calls)  # read before the next batch records them again
    spun = torch.cuda.Event()
    while len(samples) < config.max_calls:
        torch.cuda._sleep(head_start_cycles)
        spun.record()
        for pair in events:
            _timed_call(call, prepare, flush, k, input_sets, pair)
            after(warmups + k)
            k += 1
        # The spin ran out before the host had queued the batch (a slower host than the warm-up's): the batch's calls
        # may have waited for the host. Its times are left out, and the spin made twice as long.
        overtaken = spun.query() and lengthened < MAX_SPIN_DOUBLINGS
        # The batch's end, the harness's checks queued behind its last call included: what the device still runs
        # after it is late work.
        batch_done = torch.cuda.Event()
        batch_done.record()
        waited, own = device_wait_after(batch_done), [start.elapsed_time(end) * 1e3 for start, end in events]
        if overtaken:
            head_start_cycles, lengthened = 2 * head_start_cycles, lengthened + 1
            continue
        charges.append(_late_charge(waited, _idle_wait(), sum(own), len(own)))
        samples.extend(t + charges[-1] / len(own) for t in own)
        if _converged(samples, config) or time.perf_counter() - started > config.max_seconds:
            break
    return TimingStats.from_samples(samples, "cuda_events", warmups, input_sets, _late_work(charges))


# How many times the device-time timer doubles its spin for batches the host was too slow to queue behind it (after
# which it times them as they come: a host that slow paces every call anyway).
MAX_SPIN_DOUBLINGS = 4

# Batches of calls the host may queue ahead of the device under the back-to-back timers (keep_busy, time_sustained):
# enough that the device never waits for the host between batches, few enough that the host's clock bounds the time.
BATCHES_AHEAD = 4


def keep_busy(calls: Sequence[Callable[[], object]], seconds: float, device: torch.device) -> int:
    """Makes the calls in turn, over and over, for `seconds` of the host's clock (one round at least), the host waiting
    only for the rounds more than BATCHES_AHEAD behind it, so that the device's queue never runs dry; returns how many
    calls were made, once the device has finished them."""
    made = 0
    queued: deque[torch.cuda.Event] = deque()
    deadline = _clock() + seconds
    while made == 0 or _clock() < deadline:
        for call in calls:
            call()
        made += len(calls)
        if device.type == "cuda":
            queued.append(torch.cuda.Event())
            queued[-1].record()
            if len(queued) > BATCHES_AHEAD:
                _event_synchronize(queued.popleft())
    if device.type == "cuda":
        _device_synchronize(device)
    return made


@dataclass(frozen=True)
class SustainedRun:
    """What time_sustained measured: the timing, the untimed settle calls before it, and, on a GPU, the host's busy time
    per timed call (its clock less its waits for events) split into the calls' own issue time and the rest, the
    harness's work between the calls (prepare, L2 flush, events, `after`), both including any time the host spent
    blocked in a launch while the GPU's queue was full; and the share of timed calls before whose start the GPU had
    already run the previous call, its queue empty while the host prepared the call: the GPU waited for the host."""

    timing: TimingStats
    settle_calls: int
    host_us: float = 0.0
    harness_host_us: float = 0.0
    drained_share: float | None = None


def time_sustained(
    call: Callable[[int], None],
    prepare: Callable[[int], None],
    input_sets: int,
    device: torch.device,
    config: TimingConfig,
    settle_s: float,
    after: Callable[[int], None] = _nothing,
) -> SustainedRun:
    """The time of `call(k)` on input set k, `prepare(k)` and an L2 flush ahead of each call and outside its events as
    in time_device, with the calls back to back and never a pause: no spin, no synchronisation; the host stays at most
    BATCHES_AHEAD batches ahead and reads a batch's events once it has completed. The calls of the first `settle_s`
    seconds of the host's clock are not timed. `after(i)` follows the i-th call, settle calls counted. On a CPU: the
    settle calls, then time_device's wall clock. The late work still running once the last call has ended is charged
    over its batch."""
    made = 0
    if device.type != "cuda":

        def prepared(k: int) -> None:
            nonlocal made
            prepare(k)
            call(k)
            after(made)
            made += 1

        keep_busy([functools.partial(prepared, k) for k in range(input_sets)], settle_s, device)
        settle_calls = made
        timing = _time_cpu(
            call, prepare, input_sets, replace(config, warmup_calls=0, warmup_s=0.0), lambda i: after(settle_calls + i)
        )
        return SustainedRun(timing, settle_calls)
    flush = L2Flusher(device)
    call_seconds = 0.0  # the calls' own host time

    def issued(k: int) -> None:
        nonlocal call_seconds
        began = _clock()
        call(k)
        call_seconds += _clock() - began

    ends: list[torch.cuda.Event] = []  # the last call's end event
    looks = [0, 0]  # calls looked at, and of them those before which the GPU had run the previous call

    def flush_and_look() -> None:
        flush()
        if ends:  # the GPU's progress seen the moment the call is to start: immune to the host's waits on a full queue
            looks[0] += 1
            looks[1] += ends[0].query()

    # Batch b records the events of ring[b % len(ring)]: the host reads a timed batch's events before it is more than
    # BATCHES_AHEAD batches ahead of it, so a batch's events are read before they are recorded again (a settle batch's
    # are never read).
    ring = [_event_pairs(config.batch_calls) for _ in range(BATCHES_AHEAD + 2)]

    def batch() -> list[EventPair]:
        nonlocal made
        events = ring[made // config.batch_calls % len(ring)]
        for pair in events:
            _timed_call(issued, prepare, flush_and_look, made, input_sets, pair)
            ends[:] = [pair[1]]
            after(made)
            made += 1
        return events

    queued: deque[list[EventPair]] = deque()
    deadline = _clock() + settle_s
    while not queued or _clock() < deadline:
        queued.append(batch())
        if len(queued) > BATCHES_AHEAD:
            _event_synchronize(queued.popleft()[-1][1])
    settle_calls, timed, looks[:] = made, deque(), [0, 0]
    samples: list[float] = []
    started, waited, call_seconds = _clock(), 0.0, 0.0
    while True:
        more = (made - settle_calls < config.max_calls and not _converged(samples, config)
                and _clock() - started < config.max_seconds)  # fmt: skip
        if more:
            timed.append(batch())
        if timed and (not more or len(timed) > BATCHES_AHEAD):
            events = timed.popleft()
            began = _clock()
            _event_synchronize(events[-1][1])
            waited += _clock() - began
            samples.extend(start.elapsed_time(end) * 1e3 for start, end in events)
        elif not more:
            break
    busy, calls = _clock() - started - waited, made - settle_calls
    last_end = torch.cuda.Event()
    last_end.record()
    own = samples[-config.batch_calls :]
    charge = _late_charge(device_wait_after(last_end), _idle_wait(), sum(own), len(own))
    samples[-len(own) :] = [t + charge / len(own) for t in own]
    timing = TimingStats.from_samples(samples, "cuda_events", 0, input_sets, _late_work([charge]))
    return SustainedRun(
        timing, settle_calls, call_seconds / calls * 1e6, (busy - call_seconds) / calls * 1e6, looks[1] / max(looks[0], 1)
    )


def _time_cpu(
    call: Callable[[int], None],
    prepare: Callable[[int], None],
    input_sets: int,
    config: TimingConfig,
    after: Callable[[int], None],
) -> TimingStats:
    warmups, warmup_started = 0, time.perf_counter()
    while config.warming_up(warmups, warmup_started):
        prepare(warmups % input_sets)
        call(warmups % input_sets)
        after(warmups)
        warmups += 1
    samples: list[float] = []
    started = time.perf_counter()
    k = 0
    while len(samples) < config.max_calls:
        for _ in range(config.batch_calls):
            prepare(k % input_sets)
            begin = time.perf_counter()
            call(k % input_sets)
            samples.append((time.perf_counter() - begin) * 1e6)
            after(warmups + k)
            k += 1
        if _converged(samples, config) or time.perf_counter() - started > config.max_seconds:
            break
    return TimingStats.from_samples(samples, "cpu_wall", warmups, input_sets)
