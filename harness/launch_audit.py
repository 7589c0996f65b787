"""GPU work issued outside the solution's calls, seen through CUPTI (the optional `cupti` extra).

The checks inside the solution's process see the threads Python knows of and the streams the harness waits on. A
native thread the solution starts sees the device too: it can issue the rest of a call's work once the call has
returned (the moment the device goes idle, say, ahead of the harness's reads of the outputs), outside every timed
window, and none of those checks would notice. CUPTI's activity records see every launch of the process: each
kernel, copy and fill carries the correlation id of the runtime or driver call that issued it, whose record names the
host thread and the time. So while a workload is measured, the harness notes the host span of every call
(`LaunchAudit.call`, through runner.SolutionCaller) and lists, at the end, the GPU work that a thread other than its
own issued while no call was running. No honest solution does that: it has nothing to issue between calls.

The public evaluator times calls with CUPTI recording the same kinds of activity (runtime and driver calls, kernels,
copies, fills); the audit records only the runtime and driver functions that issue work (ISSUING_APIS), which keeps
its host cost to a few percent of a host-bound call's (docs/performance.md). Without cupti-python (or off the GPU) the
audit records nothing and says so (`LaunchAudit.method`); the results keep which it was (BenchConfig.launch_audit).

What it cannot see: work issued by another process (through CUDA IPC handles); GPU work that leaves no kernel, copy
or fill record (stream memory operations such as cuStreamWriteValue) or no record of the call that issued it (a launch
from the device itself); and a solution's native code that tampers with CUPTI in its own process.
"""

from __future__ import annotations

import bisect
import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import metadata
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from typing import Self

try:
    from cupti import cupti
except ImportError:  # the extra is not installed: the audit is off
    cupti = None

# The runtime and driver functions that issue GPU work, by the prefix of their names: only their calls are recorded (every
# other API call's record would only cost the host time to make and read it; torch makes many per operation).
ISSUING_APIS = ("cudaLaunch", "cudaMemcpy", "cudaMemset", "cudaGraphLaunch", "cuLaunch", "cuMemcpy", "cuMemset", "cuGraphLaunch")
_NOT_FUNCTIONS = ("INVALID", "SIZE", "FORCE_INT")

# Large enough that a workload's records (thousands of calls of up to a few hundred operations) fill few buffers: a
# full buffer is handed to the callback on CUPTI's own thread, which then takes the interpreter's lock from the
# harness's timing loop.
BUFFER_BYTES = 32 * 2**20


@dataclass(frozen=True)
class Issued:
    """One GPU operation and the host call that issued it: the calling thread's native id, when the call started (ns
    on CUPTI's clock, cupti.get_timestamp) and what ran (a kernel's name, or a copy or fill and its size)."""

    thread: int
    at_ns: int
    work: str


def issued_outside_calls(issued: list[Issued], spans: list[tuple[int, int]], harness_thread: int) -> list[Issued]:
    """The operations of `issued` that a thread other than `harness_thread` issued outside every (start, end) span
    of `spans` (the calls, one after another on the harness's thread: they do not overlap)."""
    spans = sorted(spans)
    starts = [start for start, _ in spans]

    def during_a_call(at_ns: int) -> bool:
        i = bisect.bisect_right(starts, at_ns) - 1
        return i >= 0 and at_ns <= spans[i][1]

    return [op for op in issued if op.thread != harness_thread and not during_a_call(op.at_ns)]


def describe(outside: list[Issued]) -> str:
    """The verdict's message on the operations issued outside the calls (empty where there are none)."""
    if not outside:
        return ""
    threads = sorted({op.thread for op in outside})
    return (f"{len(outside)} GPU operations issued by thread {', '.join(map(str, threads))} while no call was running "
            f"(the first: {outside[0].work}): work left for after the call returned is outside the timed window")  # fmt: skip


class LaunchAudit:
    """Records, while active, every GPU operation of the process with the thread that issued it, and the host span of
    every call made through `call`. Use as a context manager around the calls; `outside_calls` afterwards."""

    KINDS = ("RUNTIME", "DRIVER", "CONCURRENT_KERNEL", "MEMCPY", "MEMSET")

    def __init__(self, device: torch.device):
        self.active = cupti is not None and device.type == "cuda"
        self.failure = ""  # why CUPTI refused to start, where it did
        self.spans: list[tuple[int, int]] = []
        self._issuers: dict[int, tuple[int, int]] = {}  # correlation id -> (thread, start) of the issuing call
        self._work: list[tuple[int, str]] = []  # (correlation id, what ran)
        self._harness_thread = threading.get_native_id()

    @staticmethod
    def method(device: torch.device) -> str:
        """How a run on `device` audits launches, as its results record it."""
        if device.type != "cuda":
            return "off: not on a GPU"
        if cupti is None:
            return "off: cupti-python is not installed (pip install '.[cupti]')"
        return f"cupti-python {metadata.version('cupti-python')}"

    def __enter__(self) -> Self:
        if self.active:
            torch.cuda.synchronize()
            try:
                cupti.set_thread_id_type(cupti.ActivityThreadIdType.SYSTEM)  # the ids threading.get_native_id gives
                for kind in self.KINDS:
                    cupti.activity_enable(getattr(cupti.ActivityKind, kind))
                self._record_issuing_apis_only()
                cupti.activity_register_callbacks(lambda: (BUFFER_BYTES, 0), self._read)
            except Exception as exc:  # noqa: BLE001 - another CUPTI client holds it: the workload is marked unaudited
                self.active, self.failure = False, f"{type(exc).__name__}: {exc}"
                self._stop()
        return self

    @staticmethod
    def _record_issuing_apis_only() -> None:
        for functions, enable in (
            (cupti.runtime_api_trace_cbid, cupti.activity_enable_runtime_api),
            (cupti.driver_api_trace_cbid, cupti.activity_enable_driver_api),
        ):
            for function in functions:
                if function.name not in _NOT_FUNCTIONS and not function.name.startswith(ISSUING_APIS):
                    enable(function, 0)

    def _stop(self) -> None:
        for kind in self.KINDS:
            with contextlib.suppress(Exception):
                cupti.activity_disable(getattr(cupti.ActivityKind, kind))
        cupti.finalize()  # so that torch.profiler (harness.attribution) can take CUPTI over after this

    def __exit__(self, *exc: object) -> None:
        if self.active:
            torch.cuda.synchronize()
            cupti.activity_flush_all(cupti.ActivityFlag.FLUSH_FORCED)
            self._stop()
            self.active = False  # CUPTI is handed back: calls after it (the kernel profile's) are not noted

    @contextlib.contextmanager
    def call(self) -> Iterator[None]:
        """Marks one call's host span."""
        if not self.active:
            yield
            return
        start = cupti.get_timestamp()
        try:
            yield
        finally:
            self.spans.append((start, cupti.get_timestamp()))

    def _read(self, activities: list) -> None:
        """CUPTI's buffer callback: keeps what the audit needs of each record (the buffer is reused after it)."""
        api = (cupti.ActivityKind.RUNTIME, cupti.ActivityKind.DRIVER)
        for a in activities:
            if a.kind in api:
                self._issuers[a.correlation_id] = (a.thread_id, a.start)
            elif a.kind == cupti.ActivityKind.CONCURRENT_KERNEL:
                self._work.append((a.correlation_id, f"kernel {a.name[:80]}"))
            elif a.kind in (cupti.ActivityKind.MEMCPY, cupti.ActivityKind.MEMSET):
                what = "copy" if a.kind == cupti.ActivityKind.MEMCPY else "fill"
                self._work.append((a.correlation_id, f"{what} of {a.bytes} bytes"))

    def issued(self) -> list[Issued]:
        """Every GPU operation recorded whose issuing call was recorded too, in the order they were read."""
        return [Issued(*self._issuers[correlation], work) for correlation, work in self._work if correlation in self._issuers]

    def outside_calls(self) -> list[Issued]:
        return issued_outside_calls(self.issued(), self.spans, self._harness_thread)
