"""The two timings: call latency at fresh addresses and device time over rotating input sets."""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, ClassVar

import pytest
import torch
from rich.console import Console
from typer.testing import CliRunner

from harness import attribution, runner, timing
from harness import compare as comparing
from harness.attribution import after_first, covered_us
from harness.cli import app, kernel_tables, workload_table
from harness.correctness import compute_reference
from harness.registry import get_solution
from harness.results import RESULTS_DIR, KernelProfile, KernelRun, LateWork, SustainedTiming, TimingStats, load_result, save
from harness.reward_hacks import (
    FRESH_WEIGHT_AXES,
    FRESH_WEIGHT_SHARE,
    SAMPLED_CALLS,
    SAMPLED_ELEMENTS,
    VERIFIED_TIMED_CALLS,
    SampledElements,
    TimedCall,
    TimedOutputChecks,
    draw_sustained,
    late_work_habit,
    stale_outputs,
)
from harness.runner import MIXED_TOKEN_COUNTS, MIXED_TOKEN_ROUNDS, Bench, BenchOptions, mixed_token_counts
from harness.status import Status
from harness.timing import (
    LATE_WORK_NOISE_US,
    FreshAddresses,
    TimingConfig,
    keep_busy,
    time_call_latency,
    time_device,
    time_launch_floor,
    time_sustained,
)
from harness.workloads import load_named_suite
from reference import generate_inputs
from reference.problem import INPUTS, OUTPUT_NAMES, OUTPUTS, Dims
from tests.conftest import ONE_SHAPE, WRONG_WHEN_WARM, cpu_bench

if TYPE_CHECKING:
    from typing import Self  # Python 3.11's, and the project supports 3.10

SMOKE = load_named_suite("smoke")
FAST = TimingConfig(warmup_calls=1, min_calls=4, max_calls=6, batch_calls=2)


def test_fresh_addresses_never_repeat_and_stay_aligned() -> None:
    templates = [torch.empty(7, 3, dtype=torch.bfloat16), torch.empty(5, dtype=torch.int64), torch.empty(2, 2)]
    fresh = FreshAddresses(templates, calls=20)
    seen: set[int] = set()
    for i in range(20):
        views = fresh.at(i)
        assert [(v.shape, v.dtype) for v in views] == [(t.shape, t.dtype) for t in templates]
        assert all(v.is_contiguous() and v.data_ptr() % FreshAddresses.SHIFT == fresh.at(0)[k].data_ptr() % FreshAddresses.SHIFT
                   for k, v in enumerate(views))  # fmt: skip
        pointers = {v.data_ptr() for v in views}
        assert not pointers & seen
        seen |= pointers
    with pytest.raises(IndexError, match="outside the 20 calls"):
        fresh.at(20)


def test_call_latency_counts_every_call_after_the_warm_up() -> None:
    calls: list[int] = []
    latency, host = time_call_latency(calls.append, lambda i: None, torch.device("cpu"), FAST)
    assert calls[0] == 0 and calls == list(range(len(calls)))
    assert latency.warmup_calls == host.warmup_calls >= FAST.warmup_calls
    assert latency.n == host.n == len(calls) - latency.warmup_calls and latency.input_sets == 0
    assert latency.clock == "cpu_wall" and host.clock == "host_wall"


WARMING_TIMERS = {
    "call latency": lambda call, prepare, config: time_call_latency(call, prepare, torch.device("cpu"), config)[0],
    "device time": lambda call, prepare, config: time_device(call, prepare, 2, torch.device("cpu"), config),
}


@pytest.mark.parametrize("timer", WARMING_TIMERS)
def test_the_warm_up_lasts_its_time_as_well_as_its_count(timer: str) -> None:
    """Calls of 1 ms against a warm-up of one call and 50 ms: the warm-up goes on until 50 ms have passed since it
    began, and the first timed call starts after them."""
    config = TimingConfig(warmup_calls=1, warmup_s=0.05, min_calls=4, max_calls=200, batch_calls=2)
    prepared: list[float] = []
    stats = WARMING_TIMERS[timer](lambda i: time.sleep(0.001), lambda i: prepared.append(time.perf_counter()), config)
    assert stats.warmup_calls > config.warmup_calls and len(prepared) == stats.warmup_calls + stats.n
    # the timer's clock starts just before the first call's prepare: a millisecond's leeway
    assert prepared[stats.warmup_calls] - prepared[0] >= config.warmup_s - 1e-3


@pytest.mark.parametrize("timer", WARMING_TIMERS)
def test_the_warm_up_makes_no_more_calls_than_the_timing_may(timer: str) -> None:
    config = TimingConfig(warmup_calls=1, warmup_s=60.0, min_calls=4, max_calls=6, batch_calls=2)
    stats = WARMING_TIMERS[timer](lambda i: None, lambda i: None, config)
    assert stats.warmup_calls == config.max_calls and config.most_calls == 2 * config.max_calls


def test_the_launch_floor_is_timed_like_a_solutions_call() -> None:
    """One kernel's call, by the same timer and counts: on the CPU its latency is its host time."""
    latency, host = time_launch_floor(torch.device("cpu"), FAST)
    assert FAST.min_calls <= latency.n == host.n <= FAST.max_calls
    assert latency.clock == "cpu_wall" and 0 < host.median_us <= latency.max_us


RECORDING = """
import torch
from reference import reference_backward

POINTERS = []

def run(*tensors):
    POINTERS.append(tuple(t.data_ptr() for t in tensors))
    for out, value in zip(tensors[12:], reference_backward(*tensors[:12])):
        out.copy_(value)
"""


def test_no_two_call_latency_calls_share_an_address(make_solution) -> None:
    """Every call under the call-latency timer sees every input and output at addresses that no other call of the
    workload used (the device-time calls rotate over their input sets, at their own addresses)."""
    root = make_solution("recording", RECORDING)
    options = BenchOptions(trials=1, timing=FAST)
    result = cpu_bench(root, "recording", options).run(SMOKE, SMOKE.workloads[:1])
    workload = result.workloads[0]
    assert workload.status.value == "PASSED", workload.message
    pointers = sys.modules["harness_solutions.recording.solution"].POINTERS
    fresh = pointers[-(workload.call_latency.n + workload.call_latency.warmup_calls) :]
    assert len(fresh) == workload.call_latency.n + workload.call_latency.warmup_calls
    flat = [p for call in fresh for p in call]
    assert len(set(flat)) == len(flat)
    earlier = {p for call in pointers[: -len(fresh)] for p in call}
    assert not earlier & set(flat)


def test_the_result_names_the_call_latency_calls_whose_sampled_elements_were_compared(make_solution) -> None:
    """The recorded calls are SAMPLED_CALLS (or all, where fewer were made) distinct call-latency calls, numbered as the
    timing made them, warm-ups counted."""
    root = make_solution("recording", RECORDING)
    result = cpu_bench(root, "recording", BenchOptions(trials=1, timing=FAST)).run(SMOKE, SMOKE.workloads[:1])
    workload = result.workloads[0]
    assert workload.status.value == "PASSED", workload.message
    made = workload.call_latency.n + workload.call_latency.warmup_calls
    sampled = workload.timed_checks.sampled_call_latency_calls
    assert sampled == sorted(set(sampled)) and len(sampled) == min(SAMPLED_CALLS, made)
    assert all(0 <= c < made for c in sampled)


def test_mixed_token_counts_take_the_nearest_other_t_within_the_batch() -> None:
    assert mixed_token_counts(Dims(512, 64)) == [63, 65, 62, 66, 61, 67, 60, 68, 59, 69, 58, 70, 57, 71, 56, 72]
    assert mixed_token_counts(Dims(9, 1)) == [2, 3, 4, 5, 6, 7, 8, 9]
    assert mixed_token_counts(Dims(12, 12)) == [11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1]
    assert mixed_token_counts(Dims(3, 2)) == [1, 3] and mixed_token_counts(Dims(1, 1)) == []


SHAPES = """
import time
import torch
from reference import reference_backward

CALLS = []  # (T, pointers) per call

def run(*tensors):
    CALLS.append((tensors[1].numel(), tuple(t.data_ptr() for t in tensors)))
    if tensors[1].numel() == 75:  # one T past a limit of the solution's, slower than a loaded CPU makes any other
        time.sleep(0.25)
    for out, value in zip(tensors[12:], reference_backward(*tensors[:12])):
        out.copy_(value)
"""


def test_mixed_tokens_cycle_through_other_t_at_fresh_addresses(make_solution) -> None:
    """bench --mixed-tokens: after the workload's own timings, rounds over the nearest other T, each call at addresses
    no other call used; the timed rounds are the timing, with each T's mean, and compare reads its mean. bench's table
    names the slowest T."""
    root = make_solution("shapes", SHAPES)
    options = BenchOptions(trials=1, timing=FAST, mixed_tokens=True)
    workload = SMOKE.workloads[4]  # B = 197, T = 67
    result = cpu_bench(root, "shapes", options).run(SMOKE, [workload])
    mixed = result.workloads[0].mixed_tokens
    assert result.workloads[0].status.value == "PASSED" and mixed.error == ""
    assert mixed.tokens == mixed_token_counts(workload.dims) and mixed.rounds == MIXED_TOKEN_ROUNDS
    assert mixed.timing.n == mixed.host.n == len(mixed.tokens) * (MIXED_TOKEN_ROUNDS - 1)
    calls = sys.modules["harness_solutions.shapes.solution"].CALLS[-len(mixed.tokens) * MIXED_TOKEN_ROUNDS :]
    assert [t for t, _ in calls] == mixed.tokens * MIXED_TOKEN_ROUNDS
    flat = [p for _, pointers in calls for p in pointers]
    assert len(set(flat)) == len(flat)
    slowest = max(zip(mixed.tokens_us, mixed.tokens))
    assert slowest[1] == 75 and slowest[0] > 250_000
    assert math.isclose(sum(mixed.tokens_us) / len(mixed.tokens), mixed.timing.mean_us)
    console = Console(width=300, record=True)
    console.print(workload_table(result))
    assert f"75: {slowest[0]:,.1f}" in console.export_text()
    save(result, root.parent / "results" / "cpu" / "shapes.json")
    frame = comparing.load_frame(root.parent / "results")
    assert frame.mixed_us.iloc[0] == mixed.timing.mean_us == comparing.summary(frame).mean_mixed_us.iloc[0]


# Right at the T of its first call; at any other T it raises.
RAISES_AT_ANOTHER_T = """
from reference import reference_backward

FIRST = []

def run(*tensors):
    FIRST[:] = FIRST or [tensors[1].numel()]
    if tensors[1].numel() != FIRST[0]:
        raise RuntimeError("no plan for this T")
    for out, value in zip(tensors[12:], reference_backward(*tensors[:12])):
        out.copy_(value)
"""


@pytest.mark.parametrize(
    ("source", "status", "words"),
    [
        (ONE_SHAPE, Status.INCORRECT_NUMERICAL, "checked mixed-T calls fail: T = "),
        (RAISES_AT_ANOTHER_T, Status.RUNTIME_ERROR, "during the mixed-T calls: RuntimeError: no plan for this T"),
    ],
)
def test_a_solution_wrong_at_another_t_fails_the_mixed_timing_and_the_workload(
    make_solution, source: str, status: Status, words: str
) -> None:
    """A solution right only at the T of its first call (zeros elsewhere, or an exception) passes the trials and the
    short timings; its mixed-T timing, whose calls change T as a step's do, reports the failure instead of a time and
    is the workload's verdict: a wrong answer, as a shape bug would give (not cheating), or a RUNTIME_ERROR."""
    root = make_solution("one_shape", source)
    options = BenchOptions(trials=1, timing=FAST, mixed_tokens=True)
    result = cpu_bench(root, "one_shape", options).run(SMOKE, [SMOKE.workloads[4]])
    workload = result.workloads[0]
    mixed = workload.mixed_tokens
    assert workload.device_time is not None and workload.call_latency is not None
    assert workload.status is status and workload.message == mixed.error
    assert mixed.timing is None and mixed.error.startswith(words), mixed.error
    save(result, root.parent / "results" / "cpu" / "one_shape.json")
    assert comparing.summary(comparing.load_frame(root.parent / "results")).failed.iloc[0] == 1


# Honest while T stays put; of the calls whose T differs from the call before, every fifth returns without writing.
SKIPS_SOME_MIXED_T_CALLS = """
from reference import reference_backward

SEEN = []

def run(*tensors):
    SEEN.append(tensors[1].numel())
    if len(SEEN) > 1 and SEEN[-1] != SEEN[-2] and len(SEEN) % 5 == 0:
        return
    for out, value in zip(tensors[12:], reference_backward(*tensors[:12])):
        out.copy_(value)
"""


def test_a_mixed_t_call_that_leaves_its_outputs_unwritten_is_caught_whichever_it_is(make_solution) -> None:
    """Every mixed-T call's outputs are scanned for the NaN poison, not only the calls checked in full: a solution that
    skips a few of them is REWARD_HACK, as in the short timings."""
    root = make_solution("skips_some", SKIPS_SOME_MIXED_T_CALLS)
    options = BenchOptions(trials=1, timing=FAST, mixed_tokens=True)
    result = cpu_bench(root, "skips_some", options).run(SMOKE, [SMOKE.workloads[4]])
    workload = result.workloads[0]
    assert workload.status is Status.REWARD_HACK and workload.message == workload.mixed_tokens.error
    assert " mixed-T calls left output elements unwritten or NaN (calls " in workload.message, workload.message


def test_each_ts_first_timed_call_is_checked_and_later_ones_by_a_draw_as_they_end(make_solution, monkeypatch) -> None:
    """The mixed-T timing checks every T's call in the first timed round, then each later one with probability 1/j
    (round j) drawn as it ends, so that no pause after a check tells a solution that its T will not be checked again:
    over 16 T some T is checked twice or more, but for a chance of (1/3)^16."""
    checked: list[int] = []
    failure = TimedCall.failure

    def recorded(call: TimedCall, workload, device, audit: bool = False):
        checked.append(workload.num_tokens)
        return failure(call, workload, device, audit)

    monkeypatch.setattr(TimedCall, "failure", recorded)
    root = make_solution("honest", RECORDING)
    options = BenchOptions(trials=1, timing=FAST, mixed_tokens=True)
    workload = cpu_bench(root, "honest", options).run(SMOKE, [SMOKE.workloads[4]]).workloads[0]
    tokens = workload.mixed_tokens.tokens
    assert workload.status is Status.PASSED and len(tokens) == MIXED_TOKEN_COUNTS
    assert checked[: len(tokens)] == tokens and len(checked) > len(tokens)
    assert max(checked.count(t) for t in tokens) <= MIXED_TOKEN_ROUNDS - 1


# Honest until T changes on three calls in a row, which only the mixed-T timing does: then it zeroes grad_output in
# place and writes zeros, which the reference on the inputs as the call left them would agree with.
ZEROES_ITS_INPUTS_AT_MIXED_T = """
from reference import reference_backward

TOKENS = []

def run(*tensors):
    TOKENS.append(tensors[1].numel())
    if len(set(TOKENS[-3:])) == 3:
        tensors[0].zero_()
    for out, value in zip(tensors[12:], reference_backward(*tensors[:12])):
        out.copy_(value)
"""


def test_mixed_t_calls_are_checked_against_their_inputs_drawn_again(make_solution) -> None:
    """A call that rewrites its inputs cannot bring the reference to its outputs: the checked calls' inputs are drawn
    again from their seeds, and compared with what the call left; a modified input is REWARD_HACK, as in the trials."""
    root = make_solution("zeroes_inputs", ZEROES_ITS_INPUTS_AT_MIXED_T)
    options = BenchOptions(trials=2, timing=FAST, mixed_tokens=True)
    result = cpu_bench(root, "zeroes_inputs", options).run(SMOKE, [SMOKE.workloads[4]])
    mixed = result.workloads[0].mixed_tokens
    assert result.workloads[0].status is Status.REWARD_HACK and result.workloads[0].message == mixed.error
    assert mixed.timing is None and "inputs modified by the call (seed " in mixed.error and "): grad_output" in mixed.error


def test_keep_busy_makes_the_calls_in_turn_until_its_time_is_up() -> None:
    """One round at least, then whole rounds until the host's clock passes the time given."""
    made: list[str] = []
    calls = [lambda: made.append("a"), lambda: made.append("b")]
    assert keep_busy(calls, 0.0, torch.device("cpu")) == 2 and made == ["a", "b"]
    made.clear()
    count = keep_busy(calls, 0.05, torch.device("cpu"))
    assert count == len(made) >= 4 and made[:4] == ["a", "b", "a", "b"]


class _FakeEvent:
    """A CUDA event on the CPU: its number in the order of recording; a call whose start event's number is a multiple
    of 4 takes 1 ms, any other 3 ms (no timing of a few calls converges)."""

    recorded: ClassVar[list[_FakeEvent]] = []
    read: ClassVar[list[int]] = []  # the numbers of the start events read, in order
    answers: ClassVar[list[bool]] = []  # query()'s answers in turn (whether the GPU has run the event), then False

    def __init__(self, enable_timing: bool = False) -> None:
        self.number = -1

    def record(self) -> None:
        self.number = len(self.recorded)
        self.recorded.append(self)

    def elapsed_time(self, end: _FakeEvent) -> float:
        self.read.append(self.number)
        return 1.0 if self.number % 4 == 0 else 3.0

    def query(self) -> bool:
        return self.answers.pop(0) if self.answers else False


def _fake_cuda(monkeypatch: pytest.MonkeyPatch, synchronize: Callable[[_FakeEvent], None]) -> None:
    """time_sustained's CUDA calls faked: events of _FakeEvent's times, `synchronize` for the host's wait on one."""
    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    monkeypatch.setattr(_FakeEvent, "recorded", [])
    monkeypatch.setattr(_FakeEvent, "read", [])
    monkeypatch.setattr(_FakeEvent, "answers", [])
    monkeypatch.setattr(timing, "L2Flusher", lambda device: lambda: None)
    monkeypatch.setattr(timing, "_event_synchronize", synchronize)
    monkeypatch.setattr(timing, "device_wait_after", lambda event: 0.0)
    monkeypatch.setattr(timing, "_idle_wait", lambda: 0.0)


def test_sustained_timing_never_waits_for_the_latest_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    """time_sustained's GPU path with the CUDA calls faked: the host only ever waits for a batch's end event once
    BATCHES_AHEAD later batches are queued (until the last, drained), and every call after the settle calls is timed,
    each by the events it recorded (the events are reused: none is recorded again before it was read)."""
    issued: list[int] = []  # calls issued, by the host's order
    waits: list[tuple[int, int]] = []  # (calls issued when the host waited, the call whose end event it waited for)
    _fake_cuda(monkeypatch, lambda event: waits.append((len(issued), event.number // 2)))
    config = TimingConfig(min_calls=4, max_calls=20, batch_calls=2)
    made: list[int] = []
    run = timing.time_sustained(lambda k: issued.append(k), lambda k: None, 3, torch.device("cuda"), config, 0.01, made.append)
    stats = run.timing
    assert made == list(range(len(issued))) and issued == [i % 3 for i in range(len(issued))]
    assert len(issued) == run.settle_calls + stats.n and stats.n == config.max_calls and stats.mean_us == 2000.0
    ahead = timing.BATCHES_AHEAD * config.batch_calls
    drained = [waited for count, waited in waits if count == len(issued)]
    assert all(count - (waited + 1) >= ahead for count, waited in waits if count < len(issued))
    assert len(drained) == timing.BATCHES_AHEAD + 1  # the timed batches still queued when the issuing stopped
    assert [number // 2 for number in _FakeEvent.read] == list(range(run.settle_calls, len(issued)))
    assert len(set(_FakeEvent.recorded)) < len(_FakeEvent.recorded)


def test_the_device_timer_leaves_out_batches_the_host_fell_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    """time_device's GPU path (faked): a batch whose head-start spin the GPU had run before the host had queued the
    batch is not timed, and the next spin is twice as long; MAX_SPIN_DOUBLINGS times at most."""
    _fake_cuda(monkeypatch, lambda event: None)
    spins: list[int] = []
    monkeypatch.setattr(torch.cuda, "_sleep", spins.append)
    monkeypatch.setattr(timing, "_device_synchronize", lambda device: None)
    config = TimingConfig(warmup_calls=1, min_calls=4, max_calls=8, batch_calls=2, target_rel_stderr=0.0)
    monkeypatch.setattr(_FakeEvent, "answers", [True, True])
    stats = timing.time_device(lambda k: None, lambda k: None, 2, torch.device("cuda"), config)
    assert spins[1:3] == [2 * spins[0], 4 * spins[0]] and len(spins) == 2 + 4 and stats.n == 8
    monkeypatch.setattr(_FakeEvent, "answers", [True] * 100)  # a host always behind: timed as it comes, after 4 doublings
    spins.clear()
    stats = timing.time_device(lambda k: None, lambda k: None, 2, torch.device("cuda"), config)
    assert spins == [spins[0] * 2 ** min(i, timing.MAX_SPIN_DOUBLINGS) for i in range(timing.MAX_SPIN_DOUBLINGS + 4)]
    assert stats.n == 8


@pytest.mark.gpu
def test_device_time_keeps_a_host_that_slows_down_out() -> None:
    """Calls of a 100 us kernel whose host time grows from microseconds to 0.5 ms after the warm-up: the spin sized by
    the warm-up runs out before the host has queued a batch, is doubled until it does not, and the device time stays
    the kernel's."""
    config = TimingConfig(warmup_calls=3, min_calls=20, max_calls=40, batch_calls=10)
    cycles = int(1e-4 * timing.SPIN_CYCLES_PER_SECOND)
    made = [0]

    def slowing(k: int) -> None:
        made[0] += 1
        if made[0] > config.warmup_calls:
            time.sleep(5e-4)
        torch.cuda._sleep(cycles)

    alone = time_device(lambda k: torch.cuda._sleep(cycles), lambda k: None, 2, torch.device("cuda"), config)
    slowed = time_device(slowing, lambda k: None, 2, torch.device("cuda"), config)
    assert slowed.mean_us < 1.2 * alone.mean_us < 300, (slowed.mean_us, alone.mean_us)


@pytest.mark.parametrize("drained", [False, True])
def test_the_sustained_timing_tells_the_harness_host_time_from_the_solution_s(monkeypatch, drained: bool) -> None:
    """time_sustained's GPU path (faked, on a fake host clock) counts the calls' own host time apart from the rest of
    the host's busy time, its waits for events left out, and asks the GPU, as each timed call is to start, whether it
    has run the previous call: where it had on most calls and the calls' host time alone is under the device time,
    the sustained timing is HARNESS_PACED; the host times alone decide nothing (they hold its waits on a full queue)."""
    now = [0.0]

    def spend(seconds: float) -> None:
        now[0] += seconds

    monkeypatch.setattr(timing, "_clock", lambda: now[0])
    _fake_cuda(monkeypatch, lambda event: spend(0.004))
    monkeypatch.setattr(_FakeEvent, "answers", [drained] * 100)
    config = TimingConfig(min_calls=4, max_calls=20, batch_calls=2)
    run = timing.time_sustained(lambda k: spend(0.0015), lambda k: spend(0.001), 3, torch.device("cuda"), config, 0.01)
    assert run.host_us == pytest.approx(1500.0) and run.harness_host_us == pytest.approx(1000.0)
    assert run.drained_share == (1.0 if drained else 0.0)
    paced = SustainedTiming(settle_s=0.01, timing=run.timing, host_us=run.host_us, harness_host_us=run.harness_host_us,
                            drained_share=run.drained_share)  # fmt: skip
    assert run.timing.mean_us == 2000.0 and paced.harness_paced(device_us=2000.0) == drained
    # the solution's own pace (HOST_BOUND): its calls' mean follows its host, a little above it
    assert not paced.model_copy(update={"host_us": 1900.0}).harness_paced(device_us=1500.0)
    assert not paced.model_copy(update={"drained_share": None}).harness_paced(device_us=2000.0)  # on a CPU
    # a tenth of the calls finding the GPU idle is enough: each of them times the solution's own lead-in
    assert paced.model_copy(update={"drained_share": 0.2}).harness_paced(2000.0)
    assert not paced.model_copy(update={"drained_share": 0.05}).harness_paced(2000.0)


@pytest.mark.gpu
@pytest.mark.parametrize("harness_ms", [0.0, 3.0])
def test_the_gpu_waiting_for_the_harness_is_seen_on_the_gpu(harness_ms: float) -> None:
    """Calls of 2 ms on the GPU, issued in microseconds: the host runs ahead and the GPU never waits for it, unless the
    harness's work before each call (a sleep here) outlasts the call; then the GPU has run the previous call before
    every start, and the sustained timing is HARNESS_PACED."""
    cycles = int(2e-3 * timing.SPIN_CYCLES_PER_SECOND)  # at least 2 ms at the H200's clocks
    run = time_sustained(lambda k: torch.cuda._sleep(cycles), lambda k: time.sleep(harness_ms / 1e3), 2,
                         torch.device("cuda"), FAST, 0.05)  # fmt: skip
    sustained = SustainedTiming(settle_s=0.05, timing=run.timing, host_us=run.host_us, drained_share=run.drained_share)
    assert run.host_us < 100 and run.timing.mean_us > 1000
    if harness_ms:
        assert run.drained_share > 0.9 and sustained.harness_paced(device_us=run.timing.mean_us)
    else:
        assert run.drained_share < 0.1 and not sustained.harness_paced(device_us=run.timing.mean_us)


@pytest.mark.gpu
def test_sustained_calls_are_all_timed_after_the_settle_calls() -> None:
    """On the GPU every call after the settle calls is timed, batches read once complete, `after` numbering them all."""
    a = torch.randn(2048, 2048, device="cuda")
    seen: list[int] = []
    run = time_sustained(lambda k: torch.mm(a, a), lambda k: None, 2, torch.device("cuda"), FAST, 0.05, seen.append)
    timing, settled = run.timing, run.settle_calls
    assert seen == list(range(len(seen))) and len(seen) == settled + timing.n
    assert settled >= FAST.batch_calls and FAST.min_calls <= timing.n and timing.clock == "cuda_events"
    assert 0 < run.host_us < timing.mean_us and 0 < run.harness_host_us


def test_the_sustained_timing_follows_calls_back_to_back(make_solution) -> None:
    """bench --sustained: after the workload's own timings, calls on the input sets in turn, the first settle time of
    them untimed; the result, bench's table and compare carry it."""
    root = make_solution("recording", RECORDING)
    options = BenchOptions(trials=1, timing=FAST, sustained_s=0.2)
    bench = cpu_bench(root, "recording", options)
    result = bench.run(SMOKE, SMOKE.workloads[:1])
    workload, sustained = result.workloads[0], result.workloads[0].sustained
    assert workload.status.value == "PASSED" and sustained.error == "" and result.config.sustained_s == 0.2
    assert sustained.settle_s == 0.2 and sustained.settle_calls >= options.input_sets
    assert FAST.min_calls <= sustained.timing.n <= FAST.max_calls and sustained.timing.input_sets == options.input_sets
    pointers = sys.modules["harness_solutions.recording.solution"].POINTERS
    back_to_back = pointers[-(sustained.settle_calls + sustained.timing.n) :]
    assert back_to_back[: options.input_sets] == back_to_back[options.input_sets : 2 * options.input_sets]
    assert len(set(back_to_back)) == options.input_sets  # the input sets in turn, as the device time's calls
    console = Console(width=300, record=True)
    console.print(workload_table(result))
    text = console.export_text()
    assert "sustained" in text and f"{sustained.timing.mean_us:,.1f}" in text
    save(result, root.parent / "results" / "cpu" / "recording.json")
    frame = comparing.load_frame(root.parent / "results")
    assert frame.sustained_us.iloc[0] == sustained.timing.mean_us == comparing.summary(frame).mean_sustained_us.iloc[0]


def test_a_sustained_timing_the_harness_paced_is_flagged(make_solution, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the sustained run measured the solution's host ahead of the GPU and the harness's work beside it not
    (faked here: a CPU run measures neither), the workload carries HARNESS_PACED, bench's table shows it and compare
    notes it."""

    def paced(*args, **kwargs) -> timing.SustainedRun:
        run = time_sustained(*args, **kwargs)
        return replace(run, host_us=0.5 * run.timing.mean_us, harness_host_us=0.6 * run.timing.mean_us, drained_share=0.8)

    monkeypatch.setattr(runner, "time_sustained", paced)
    root = make_solution("recording", RECORDING)
    options = BenchOptions(trials=1, timing=FAST, sustained_s=0.05)
    result = cpu_bench(root, "recording", options).run(SMOKE, SMOKE.workloads[:1])
    workload = result.workloads[0]
    assert workload.flags == ["HARNESS_PACED"] and workload.sustained.harness_paced(workload.device_time.mean_us)
    console = Console(width=300, record=True)
    console.print(workload_table(result))
    assert "HARNESS_PACED" in console.export_text()
    save(result, root.parent / "results" / "cpu" / "recording.json")
    compared = CliRunner().invoke(app, ["compare", "--results-dir", str(root.parent / "results"), "--format", "csv"])
    note = f"recording's sustained time on cpu at #0 (T = {workload.num_tokens}) was paced by the harness's host"
    assert compared.exit_code == 0 and note in " ".join(compared.output.split())


RAISES_WHEN_WARM = """
from reference import reference_backward

CALLS = []

def run(*tensors):
    CALLS.append(1)
    if len(CALLS) > 25:
        raise RuntimeError("out of some resource after 25 calls")
    for out, value in zip(tensors[12:], reference_backward(*tensors[:12])):
        out.copy_(value)
"""


@pytest.mark.parametrize(
    ("source", "status", "words"),
    [
        (WRONG_WHEN_WARM, Status.REWARD_HACK, "outputs of sustained calls (seed "),
        (RAISES_WHEN_WARM, Status.RUNTIME_ERROR, "during the sustained calls: RuntimeError: out of some resource"),
    ],
)
def test_a_solution_that_fails_under_sustained_load_fails_the_workload(
    make_solution, source: str, status: Status, words: str
) -> None:
    """A solution that goes wrong (all zeros: grossly wrong, as the short timings judge it) or raises only after its
    first 25 calls passes the trials and the short timings; the sustained timing, at the workload's own T, reports the
    failure instead of a time and is the workload's verdict."""
    root = make_solution("fails_when_warm", source)
    options = BenchOptions(trials=1, timing=FAST, sustained_s=0.3)
    bench = cpu_bench(root, "fails_when_warm", options)
    workload = bench.run(SMOKE, SMOKE.workloads[:1]).workloads[0]
    assert workload.device_time is not None and workload.call_latency is not None
    assert workload.status is status and workload.message.startswith(words), workload.message
    assert workload.sustained.timing is None and workload.sustained.error == workload.message


# Honest in every trial and timing whose inputs are all drawn anew; from call to call on an unchanged weight (its
# address and a few values) it computes with the copy it kept, as a solution keeping a converted weight would.
KEEPS_A_WEIGHT = """
from reference import reference_backward

KEPT = {}

def run(*tensors):
    inputs = list(tensors[:12])
    key = (inputs[WEIGHT].data_ptr(), tuple(inputs[WEIGHT].view(-1)[:4].tolist()))
    inputs[WEIGHT] = KEPT.setdefault(key, inputs[WEIGHT].clone())
    for out, value in zip(tensors[12:], reference_backward(*inputs)):
        out.copy_(value)
"""


def test_a_sustained_calls_inputs_replay_from_two_seeds_and_are_put_back() -> None:
    """draw_sustained: grad_output and one block of FRESH_WEIGHT_SHARE of each weight's F slices drawn anew, what the
    check draws again from the two seeds; putting back restores the base set's weights."""
    dims = SMOKE.workloads[5].dims
    base = generate_inputs(dims, 7)
    inputs = {name: tensor.clone() for name, tensor in base.items()}
    put_back = draw_sustained(inputs, 11, fresh_weights=True)
    again = TimedCall(inputs, 11, base_seed=7, fresh_weights=True).drawn_inputs(dims, torch.device("cpu"))
    assert all(torch.equal(inputs[name], again[name]) for name in inputs)
    width = math.ceil(FRESH_WEIGHT_SHARE * dims.ffn_dim)
    for name, f_axis in (("w1_weight", 0), ("w2_weight", 1), ("w3_weight", 0)):
        fresh = (inputs[name] != base[name]).any(dim=1 - f_axis).nonzero().flatten().tolist()
        assert fresh == list(range(fresh[0], fresh[0] + width)), name  # one block of F slices
    changed = [name for name in inputs if not torch.equal(inputs[name], base[name])]
    assert changed == ["grad_output", "w1_weight", "w2_weight", "w3_weight"]
    put_back()
    assert all(torch.equal(inputs[name], base[name]) for name in inputs if name != "grad_output")


def test_a_sustained_call_without_fresh_weights_draws_grad_output_alone() -> None:
    """The calls that draw no weight blocks change grad_output alone, the same as a call with blocks would, and the
    check draws them again so."""
    dims = SMOKE.workloads[5].dims
    base = generate_inputs(dims, 7)
    inputs = {name: tensor.clone() for name, tensor in base.items()}
    draw_sustained(inputs, 11, fresh_weights=False)
    assert [name for name in inputs if not torch.equal(inputs[name], base[name])] == ["grad_output"]
    again = TimedCall(inputs, 11, base_seed=7).drawn_inputs(dims, torch.device("cpu"))
    assert all(torch.equal(inputs[name], again[name]) for name in inputs)
    with_blocks = {name: tensor.clone() for name, tensor in base.items()}
    draw_sustained(with_blocks, 11, fresh_weights=True)
    assert torch.equal(with_blocks["grad_output"], inputs["grad_output"])


def test_a_sustained_draw_issues_one_operation_per_draw_and_block_copy() -> None:
    """The host issues draw_sustained between calls that follow each other with no pause, where each operation is a
    launch on a GPU: without fresh blocks grad_output's draw alone; with them a draw and a saved copy per block, and
    putting back a copy per block (views aside)."""
    inputs = generate_inputs(SMOKE.workloads[5].dims, 7)
    issued = {}
    for fresh_weights in (False, True):
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
            draw_sustained(inputs, 11, fresh_weights)()
        top = [event.name for event in profile.events() if event.cpu_parent is None and event.name != "aten::narrow"]
        issued[fresh_weights] = top
    assert issued[False] == ["aten::normal_"]
    assert issued[True] == ["aten::normal_", *["aten::clone", "aten::normal_"] * 3, *["aten::copy_"] * 3]


def test_the_sustained_samples_are_drawn_from_every_call_and_from_those_with_fresh_weights() -> None:
    """TimedOutputChecks(fresh_weights_too=True) keeps VERIFIED_TIMED_CALLS calls drawn from all of them and as many
    drawn from those whose weight blocks were drawn anew, with their seeds and flags, so that their verification
    replays the blocks and judges staleness; a call both samples keep is verified once."""

    def kept(fresh: Callable[[int], bool], calls: int) -> list[TimedCall]:
        checks = TimedOutputChecks(scan_unwritten=False, fresh_weights_too=True)
        for i in range(calls):
            checks.current = TimedCall({}, seed=100 + i, outputs=[torch.zeros(2)], base_seed=7, fresh_weights=fresh(i))
            checks.after(i)
        assert checks.calls == calls
        return checks.kept

    mixed = kept(lambda i: i % 5 == 0, 40)
    fresh = [call for call in mixed if call.fresh_weights]
    assert len(fresh) >= VERIFIED_TIMED_CALLS and len(mixed) <= 2 * VERIFIED_TIMED_CALLS
    assert all(call.index % 5 == 0 and call.seed == 100 + call.index for call in fresh)
    assert len(kept(lambda i: False, 40)) == VERIFIED_TIMED_CALLS  # the first sample: any call
    assert [call.index for call in kept(lambda i: True, VERIFIED_TIMED_CALLS)] == list(range(VERIFIED_TIMED_CALLS))


@pytest.mark.parametrize("weight", ["w1_weight", "w2_weight", "w3_weight"])
def test_outputs_of_a_stale_weight_are_named_and_fresh_ones_are_not(weight: str) -> None:
    """stale_outputs at T = 1 of 9 rows, where a stale block of w1 or w3 moves dx by a few percent: outputs computed
    with the weight of an earlier call are named, the reference's own outputs rounded to bf16 are not."""
    dims = SMOKE.workloads[1].dims
    base = generate_inputs(dims, 7)
    earlier = {name: tensor.clone() for name, tensor in base.items()}
    draw_sustained(earlier, 11, fresh_weights=True)
    inputs = {name: tensor.clone() for name, tensor in base.items()}
    draw_sustained(inputs, 13, fresh_weights=True)
    reference = compute_reference(inputs)
    without_each = [compute_reference({**inputs, name: base[name]}) for name in FRESH_WEIGHT_AXES]
    honest = [r.to(spec.dtype) for spec, r in zip(OUTPUTS, reference)]
    assert stale_outputs(honest, reference, without_each) == ""
    kept = compute_reference({**inputs, weight: earlier[weight]})
    moved = ["grad_hidden_states", "grad_w1_weight", "grad_w3_weight"] if weight == "w2_weight" else ["grad_hidden_states"]
    named = stale_outputs([k.to(spec.dtype) for spec, k in zip(OUTPUTS, kept)], reference, without_each)
    assert [part.split(" (")[0] for part in named.split(", ")] == moved, named


def _sampled_calls(
    workload, outputs_of: Callable[[int, dict[str, torch.Tensor]], list[torch.Tensor]], device: str = "cpu"
) -> SampledElements:
    """Five calls through SampledElements as the call-latency timing makes them: inputs drawn from a seed, the
    outputs `outputs_of(call, inputs)` gathered as the call ends."""
    elements = SampledElements(torch.device(device))
    for i in range(5):
        call = TimedCall(generate_inputs(workload.dims, 100 + i, torch.device(device)), 100 + i)
        call.outputs = outputs_of(i, call.inputs)
        elements.after(call, i)
    return elements


def _honest(inputs: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    return [r.to(spec.dtype) for spec, r in zip(OUTPUTS, compute_reference(inputs))]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda:0", marks=pytest.mark.gpu)])
def test_sampled_elements_pass_honest_calls_and_catch_one_faked_call(device: str) -> None:
    """Every call's elements are gathered; the calls compared afterwards (all five here, fewer than SAMPLED_CALLS) pass
    where computed, and one call whose grad_w2_weight is a cheap fill is REWARD_HACK, named with its seed."""
    workload = SMOKE.workloads[1]
    honest = _sampled_calls(workload, lambda i, inputs: _honest(inputs), device)
    assert honest.chosen == [0, 1, 2, 3, 4] and honest.verdict(workload, "call-latency") is None
    assert all(values.numel() == SAMPLED_ELEMENTS for _, gathered in honest.calls for _, values in gathered)

    def faked(i: int, inputs: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        outputs = _honest(inputs)
        if i == 3:
            outputs[OUTPUT_NAMES.index("grad_w2_weight")].fill_(0.01)
        return outputs

    status, message = _sampled_calls(workload, faked, device).verdict(workload, "call-latency")
    assert status is Status.REWARD_HACK and message.startswith("call-latency call 3 (seed 103): grad_w2_weight"), message


def test_sampled_positions_cannot_be_read_from_the_generator_before_the_call() -> None:
    """A solution runs in the harness's process and can reach SampledElements' generator (gc.get_objects): the
    positions are drawn from a seed taken after the call, so a copy of the generator's state taken during it does not
    predict them, for the first call or a later one."""
    workload = SMOKE.workloads[1]
    elements = SampledElements(torch.device("cpu"))
    for i in range(2):
        call = TimedCall(generate_inputs(workload.dims, 100 + i), 100 + i)
        call.outputs = _honest(call.inputs)
        copy = torch.Generator().set_state(elements._generator.get_state())  # what a call could read
        elements.after(call, i)
        rows, width = call.inputs["token_indices"], workload.hidden_dim  # grad_hidden_states, the first drawn
        predicted = rows[torch.randint(rows.numel(), (SAMPLED_ELEMENTS,), generator=copy)] * width + torch.randint(
            width, (SAMPLED_ELEMENTS,), generator=copy
        )
        assert not torch.equal(predicted, elements.calls[i][1][0][0])


@pytest.mark.gpu
def test_sampled_elements_leave_the_device_idle_for_the_next_call() -> None:
    """The gathers are waited for before the next call's inputs are drawn (work or host time left there raised
    triton_fused's host time: docs/performance.md): with a kernel still running as a call ends, after() returns with
    the device idle."""
    workload, cuda = SMOKE.workloads[1], torch.device("cuda", 0)
    call = TimedCall(generate_inputs(workload.dims, 100, cuda), 100)
    call.outputs = _honest(call.inputs)
    torch.cuda._sleep(100_000_000)  # tens of milliseconds of the GPU's clock
    SampledElements(cuda).after(call, 0)
    assert torch.cuda.current_stream().query()


def test_sampled_elements_of_an_output_scattered_to_the_batch_lie_in_the_tokens_rows() -> None:
    """grad_hidden_states is zero outside the T rows the tokens scatter to: sampled there, a call that leaves those rows
    zero is caught although most of the tensor (every other row) matches."""
    workload = max(SMOKE.workloads, key=lambda w: w.batch_seq_len / w.num_tokens)
    elements = _sampled_calls(workload, lambda i, inputs: _honest(inputs))
    (call, gathered), width = elements.calls[0], workload.hidden_dim
    rows = set(generate_inputs(workload.dims, call.seed)["token_indices"].tolist())
    assert {int(p) // width for p in gathered[OUTPUT_NAMES.index("grad_hidden_states")][0]} <= rows

    def rows_left_zero(i: int, inputs: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        outputs = _honest(inputs)
        outputs[0][inputs["token_indices"]] = 0
        return outputs

    status, message = _sampled_calls(workload, rows_left_zero).verdict(workload, "call-latency")
    assert status is Status.REWARD_HACK and "call 0 (seed 100): grad_hidden_states" in message, message


def test_sampled_elements_leave_an_unusable_output_to_the_other_checks() -> None:
    """An output that is no contiguous tensor is not gathered (the trials and the calls verified in full say what is
    wrong with it), rather than failing the timing with an exception of the harness's own."""
    workload = SMOKE.workloads[1]

    def odd(i: int, inputs: dict[str, torch.Tensor]) -> list[object]:
        outputs = _honest(inputs)
        return [None, outputs[1], outputs[2].t(), *outputs[3:]]

    elements = _sampled_calls(workload, odd)
    assert all(gathered[0] is None and gathered[2] is None for _, gathered in elements.calls)
    assert elements.verdict(workload, "call-latency") is None


def test_a_verified_sustained_call_judges_staleness_against_its_own_draw() -> None:
    """TimedCall.verify of a call with fresh weight blocks, whose base weights it gets back through draw_sustained's
    put-back: the reference's outputs pass, outputs computed with the base set's w1 (a copy kept from an earlier call)
    are INCORRECT_NUMERICAL (without the put-back no block would move the reference and nothing would be stale)."""
    workload = SMOKE.workloads[1]
    call = TimedCall({}, 11, base_seed=7, fresh_weights=True)
    inputs = call.drawn_inputs(workload.dims, torch.device("cpu"))
    honest = [r.to(spec.dtype) for spec, r in zip(OUTPUTS, compute_reference(inputs))]
    base_w1 = generate_inputs(workload.dims, 7)["w1_weight"]
    stale = [r.to(spec.dtype) for spec, r in zip(OUTPUTS, compute_reference({**inputs, "w1_weight": base_w1}))]
    assert replace(call, outputs=honest).verify(workload, torch.device("cpu"))[1] is Status.PASSED
    _, status, detail = replace(call, outputs=stale).verify(workload, torch.device("cpu"))
    assert status is Status.INCORRECT_NUMERICAL and detail.startswith("grad_hidden_states"), detail


@pytest.mark.parametrize("weight", ["w1_weight", "w2_weight", "w3_weight"])
def test_a_weight_kept_from_call_to_call_fails_the_sustained_timing_and_the_workload(make_solution, weight: str) -> None:
    """The sustained timing's calls keep the weights' addresses and draw only blocks of them anew, before one call in
    FRESH_WEIGHT_CALLS and a last call on each input set: a solution that keeps a copy of one weight, found by address
    and a few values, passes the trials and the other timings and fails this one, and so the workload, on every
    smoke shape."""
    source = f"WEIGHT = {[spec.name for spec in INPUTS].index(weight)}\n" + KEEPS_A_WEIGHT
    root = make_solution("keeps_a_weight", source)
    options = BenchOptions(trials=2, timing=FAST, sustained_s=0.1)
    bench = cpu_bench(root, "keeps_a_weight", options)
    for workload in bench.run(SMOKE, SMOKE.workloads).workloads:
        # grossly wrong where the fresh block is a large part of the weight (REWARD_HACK), else narrowly
        assert workload.status in (Status.REWARD_HACK, Status.INCORRECT_NUMERICAL), workload.message
        assert workload.message.startswith("outputs of sustained calls (seed "), workload.message
        assert workload.sustained.timing is None and workload.sustained.error == workload.message


# Honest in its trials and wherever its weights differ from every earlier call's on their addresses, which it sees
# by one element of each F slice of w1 (a few kilobytes read, where the weights are hundreds of megabytes); where they
# do not, as in the sustained calls that draw no fresh block, it skips the call and leaves the outputs of an earlier one.
SKIPS_WHERE_THE_WEIGHTS_STAYED = """
from reference import reference_backward

TRIALS = 3
CALLS = {}
SEEN = {}

def run(*tensors):
    w1 = tensors[9]
    shape = tuple(tensors[0].shape) + tuple(tensors[1].shape)
    CALLS[shape] = CALLS.get(shape, 0) + 1
    probe = tuple(w1[:, 0].tolist())
    seen = SEEN.setdefault(w1.data_ptr(), set())
    if CALLS[shape] > TRIALS and probe in seen:
        return
    seen.add(probe)
    for out, value in zip(tensors[12:], reference_backward(*tensors[:12])):
        out.copy_(value)
"""


def test_calls_skipped_where_the_weights_stayed_fail_the_sustained_timing(make_solution) -> None:
    """Which sustained calls drew fresh weight blocks a call can see by a glance at its weights, so the sustained
    sample is drawn from every call too: a solution that skips the calls whose weights stayed passes the trials and
    the other timings, whose inputs are all drawn anew, and fails this one where a skipped call is sampled, which
    misses it with a chance of about (1/8)^3 per workload (here on none of six but for about 1e-16)."""
    root = make_solution("skips_where_the_weights_stayed", SKIPS_WHERE_THE_WEIGHTS_STAYED)
    options = BenchOptions(trials=3, timing=FAST, sustained_s=0.2)
    workloads = cpu_bench(root, "skips_where_the_weights_stayed", options).run(SMOKE, SMOKE.workloads).workloads
    for workload in workloads:
        assert workload.device_time is not None and workload.call_latency is not None
        assert workload.status in (Status.PASSED, Status.REWARD_HACK), workload.message
    caught = [w for w in workloads if w.status is Status.REWARD_HACK]
    assert caught and all(w.message.startswith("outputs of sustained calls (seed ") for w in caught), caught


HOST_SLEEP = """
import time
import torch
from reference import reference_backward

def run(*tensors):
    results = reference_backward(*tensors[:12])
    tensors[12].copy_(results[0])
    time.sleep(0.02)  # the host busy between two launches
    for out, value in zip(tensors[13:], results[1:]):
        out.copy_(value)
"""


@pytest.mark.gpu
def test_host_time_counts_in_call_latency_not_in_device_time(make_solution, tmp_path: Path) -> None:
    root = make_solution("host_sleep", HOST_SLEEP)
    options = BenchOptions(trials=1, timing=TimingConfig(max_calls=20))
    suite = load_named_suite("public")
    workload = (
        Bench(get_solution("host_sleep", root), torch.device("cuda"), options, tmp_path)
        .run(suite, [suite.workloads[14]])
        .workloads[0]
    )
    assert workload.status.value == "PASSED", workload.message
    assert workload.host.median_us >= 20_000
    assert workload.call_latency.mean_us >= workload.host.median_us
    assert workload.device_time.mean_us < 20_000 and "HOST_BOUND" in workload.flags


def test_late_work_is_a_verdict_only_as_a_habit(make_solution, tmp_path: Path) -> None:
    """Late work seen on a few measurements may be the host descheduled, and is only charged; on three and at least
    half of them, it is the verdict, naming the timing."""
    root = make_solution("recording", RECORDING)
    bench = Bench(get_solution("recording", root), torch.device("cpu"), BenchOptions(trials=1, timing=FAST), tmp_path)
    workload = bench.run(SMOKE, SMOKE.workloads[:1]).workloads[0]
    assert workload.status.value == "PASSED" and late_work_habit(workload) == ""  # the CPU measures none

    def timing(late: int, measured: int) -> TimingStats:
        stats = TimingStats.from_samples([300.0, 310.0], "cuda_events", 3, 0)
        stats.late_work = LateWork(measured=measured, late=late, mean_us=25.0, max_us=90.0)
        return stats

    workload.call_latency = timing(2, 3)
    assert late_work_habit(workload) == ""
    workload.call_latency = timing(14, 30)
    assert late_work_habit(workload) == ""
    workload.call_latency = timing(15, 30)
    assert late_work_habit(workload).startswith("GPU work ran after 15 of 30 call-latency calls")
    workload.call_latency, workload.device_time = timing(0, 30), timing(3, 4)
    assert "3 of 4 device-time batches" in late_work_habit(workload)


@pytest.mark.gpu
def test_work_left_on_a_side_stream_is_charged_to_both_timings() -> None:
    """A call that leaves about 200 us of GPU work on a stream its end event does not wait for, and runs nothing on
    the caller's stream: both timers charge that work (per call, and per batch spread over its calls) and count it;
    an empty call is charged no more than the noise."""
    device, side = torch.device("cuda"), torch.cuda.Stream()

    def deferring(i: int) -> None:
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            torch.cuda._sleep(400_000)

    latency, _ = time_call_latency(deferring, lambda i: None, device, FAST)
    assert latency.mean_us > 100 and latency.late_work.late == latency.late_work.measured == latency.n
    device_time = time_device(deferring, lambda k: None, 1, device, FAST)
    assert device_time.mean_us > 100 and device_time.late_work.late == device_time.late_work.measured > 0
    empty, _ = time_call_latency(lambda i: None, lambda i: None, device, FAST)
    assert empty.late_work.mean_us < LATE_WORK_NOISE_US and empty.mean_us < 100


def test_a_profiled_call_is_read_after_its_marker_with_overlaps_counted_once(tmp_path: Path) -> None:
    """`bench --kernels` drops the window's first activity (the marker fill, or timeline.py's spin), re-bases the call's
    activities to the first of them and reads the host's lead-in against the marker's start; the idle time inside the
    span counts activities that overlap on two streams once. The table's title shows both, and compare's per-workload
    values the lead-in and the span ("-" where a workload was not profiled)."""
    runs = [
        KernelRun(name="marker", stream=7, start_us=0.0, duration_us=2.0),
        KernelRun(name="dh", stream=7, start_us=30.0, duration_us=50.0),  # 0-50 after re-basing
        KernelRun(name="gather", stream=9, start_us=70.0, duration_us=20.0),  # 40-60: past dh's end by 10
        KernelRun(name="dx", stream=7, start_us=100.0, duration_us=20.0),  # 70-90, after 10 us idle
    ]
    lead_in, call = after_first(runs)
    assert lead_in == 30.0 and [(r.name, r.start_us) for r in call] == [("dh", 0.0), ("gather", 40.0), ("dx", 70.0)]
    assert covered_us(call) == 80.0 and covered_us([]) == 0.0
    assert after_first(runs[:1]) == (None, [])
    profile = KernelProfile(calls=1, span_us=90.0, busy_us=90.0, idle_us=10.0, lead_in_us=lead_in, kernels=call)
    result = load_result(RESULTS_DIR / "nvidia-h200" / "triton_fused.json")
    result.workloads[0].kernels = profile
    (table,) = kernel_tables(result)
    assert "lead-in to the first activity 30.0 us, span 90.0 us, idle inside it 10.0 us" in table.title
    save(result, tmp_path / "nvidia-h200" / "triton_fused.json")
    values = ("compare", "--results-dir", str(tmp_path), "--by-workload", "--value", "lead_in_us,span_us", "--format", "csv")
    rows = CliRunner().invoke(app, values).stdout.splitlines()
    assert rows[1].endswith(",30.0,90.0") and rows[2].endswith(",-,-"), rows[:3]


class _FakeProfile:
    """torch.profiler.profile as profile_kernels uses it, whose i-th window holds, listed out of order, the marker (or
    spin) and a call's three kernels: dh 25 + i us after the marker's start, gather beside it on another stream and past
    its end, then dx after a gap."""

    calls = 0

    def __init__(self, activities) -> None:
        self.index = _FakeProfile.calls
        _FakeProfile.calls += 1

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        pass

    def events(self) -> list[SimpleNamespace]:
        def event(name: str, stream: int, start: float, duration: float) -> SimpleNamespace:
            return SimpleNamespace(name=name, device_type=torch.autograd.DeviceType.CUDA, device_resource_id=stream,
                                   time_range=SimpleNamespace(start=start, end=start + duration))  # fmt: skip

        lead = 25.0 + self.index
        return [event("dx", 7, 1000 + lead + 70, 20), event("first", 7, 1000, 2), event("dh", 7, 1000 + lead, 50),
                event("gather", 9, 1000 + lead + 40, 20)]  # fmt: skip


def test_profile_kernels_reads_each_call_after_its_marker(monkeypatch: pytest.MonkeyPatch) -> None:
    """profile_kernels with the profiler and CUDA calls faked: the window's first activity is dropped, the lead-in is the
    median over the calls of the first kernel's start after it (none behind a head start), the idle time the span's gap
    between gather's end and dx's start."""
    monkeypatch.setattr(attribution, "profile", _FakeProfile)
    monkeypatch.setattr(_FakeProfile, "calls", 0)
    monkeypatch.setattr(attribution, "L2Flusher", lambda device: lambda: None)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: None)
    calls = []
    idle = attribution.profile_kernels(calls.append, lambda i: None, torch.device("cpu"))
    assert calls == [0, 1, 2] and idle.calls == 3 and idle.lead_in_us == 26.0
    assert [(k.name, k.start_us) for k in idle.kernels] == [("dh", 0.0), ("gather", 40.0), ("dx", 70.0)]
    assert idle.span_us == 90.0 and idle.idle_us == 10.0 and idle.busy_us == 90.0
    ahead = attribution.profile_kernels(calls.append, lambda i: None, torch.device("cpu"), head_start_s=1e-3)
    assert ahead.lead_in_us is None and ahead.span_us == 90.0
