"""GPU work issued outside the solution's calls, seen through CUPTI (the optional `cupti` extra).

The checks inside the solution's process see the threads Python knows of and the streams the harness waits on. A
native thread the solution starts sees the device too: it can issue the rest of a call's work once the call has
returned (the moment the device goes idle, say, ahead of the harness's reads of the outputs), outside every timed
window, and none of those checks would notice. CUPTI's activity records see every runtime and driver call of the
process, each with the host thread that made it and the time. So while a workload is measured, the harness notes the
host span of every call (`LaunchAudit.call`, through reward_hacks.SolutionCaller) and lists, at the end, the calls of
the functions that issue GPU work (ISSUING_APIS: launches, copies, fills, graph launches, stream memory operations) that
a thread other than its own made while no call was running. No honest solution makes one: it has nothing to issue
between calls. The calls themselves are judged rather than the kernel, copy and fill records they produce, because some
work (a stream memory operation such as cuStreamWriteValue32) leaves no record of its own.

The public evaluator times calls with CUPTI recording runtime and driver calls too; the audit records only the
functions that issue work, which keeps its host cost to a few percent of a host-bound call's (docs/performance.md).
Without cupti-python (or off the GPU) the audit records nothing and says so (`LaunchAudit.method`); the results keep
which it was (BenchConfig.launch_audit).

Another process the solution starts can write the outputs too, through CUDA IPC handles, and CUPTI in this process
does not see it. Such a process must hold a CUDA context of its own, ready when a call returns, so before every call
at fresh addresses and at the end of the workload the audit asks NVML (the driver's management library, found by name
at run time) which processes hold a context on the GPUs; one descended from this process is a verdict of its own
(`describe_processes`). Compilers' worker processes open the device files but create no context (checked on the H200
with torch.compile's max-autotune workers), so they are not listed.

What it cannot see: work issued by a process that is not this one's descendant (one started through a server);
work the device issues itself (a launch from a kernel); and a solution's native code that tampers with CUPTI or NVML
in its own process.
"""

from __future__ import annotations

import bisect
import contextlib
import ctypes
import functools
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
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
ISSUING_APIS = (
    "cudaLaunch", "cudaMemcpy", "cudaMemset", "cudaGraphLaunch",
    "cuLaunch", "cuMemcpy", "cuMemset", "cuGraphLaunch", "cuStreamWriteValue", "cuStreamBatchMemOp",
)  # fmt: skip
_NOT_FUNCTIONS = ("INVALID", "SIZE", "FORCE_INT")

# Large enough that a workload's records (thousands of calls of up to a few hundred operations) fill few buffers: a
# full buffer is handed to the callback on CUPTI's own thread, which then takes the interpreter's lock from the
# harness's timing loop.
BUFFER_BYTES = 32 * 2**20


@dataclass(frozen=True)
class Issued:
    """One call of a function that issues GPU work: the calling thread's native id, when the call started (ns on
    CUPTI's clock, cupti.get_timestamp) and the function's name."""

    thread: int
    at_ns: int
    function: str


def issued_outside_calls(issued: list[Issued], spans: list[tuple[int, int]], harness_thread: int) -> list[Issued]:
    """The calls of `issued` that a thread other than `harness_thread` issued outside every (start, end) span
    of `spans` (the calls, one after another on the harness's thread: they do not overlap)."""
    spans = sorted(spans)
    starts = [start for start, _ in spans]

    def during_a_call(at_ns: int) -> bool:
        i = bisect.bisect_right(starts, at_ns) - 1
        return i >= 0 and at_ns <= spans[i][1]

    return [op for op in issued if op.thread != harness_thread and not during_a_call(op.at_ns)]


def describe(outside: list[Issued]) -> str:
    """The verdict's message on the work issued outside the calls (empty where there is none)."""
    if not outside:
        return ""
    threads = sorted({op.thread for op in outside})
    named = ", ".join(map(str, threads[:3])) + (", ..." if len(threads) > 3 else "")
    by = f"thread {named}" if len(threads) == 1 else f"{len(threads)} threads ({named})"
    return (f"{len(outside)} calls issuing GPU work made by {by} while no call was running (the first: "
            f"{outside[0].function}): work left for after the call returned is outside the timed window")  # fmt: skip


class _ProcessInfo(ctypes.Structure):
    """NVML's nvmlProcessInfo_t (version 3 of nvmlDeviceGetComputeRunningProcesses)."""

    _fields_ = [("pid", ctypes.c_uint), ("used_gpu_memory", ctypes.c_ulonglong), ("gpu_instance", ctypes.c_uint),
                ("compute_instance", ctypes.c_uint)]  # fmt: skip


@dataclass(frozen=True)
class _Nvml:
    """NVML, initialised, with a handle on each of the machine's GPUs."""

    library: ctypes.CDLL
    devices: tuple[ctypes.c_void_p, ...]


@functools.cache
def _load_nvml() -> _Nvml | None:
    """NVML, loaded and initialised once per process; None where there is no NVIDIA driver (the process watch is off)."""
    try:
        library = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return None
    count = ctypes.c_uint()
    if library.nvmlInit_v2() != 0 or library.nvmlDeviceGetCount_v2(ctypes.byref(count)) != 0:
        return None
    devices = [ctypes.c_void_p() for _ in range(count.value)]
    found = [d for i, d in enumerate(devices) if library.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(d)) == 0]
    return _Nvml(library, tuple(found))


def gpu_processes(nvml: _Nvml) -> set[int]:
    """The processes that hold a CUDA context on any of the machine's GPUs, by NVML."""
    pids = set()
    for device in nvml.devices:
        listed = ctypes.c_uint(256)
        infos = (_ProcessInfo * listed.value)()
        nvml.library.nvmlDeviceGetComputeRunningProcesses_v3(device, ctypes.byref(listed), infos)
        pids.update(infos[i].pid for i in range(min(listed.value, len(infos))))
    return pids


def proc_stat_fields(path: str) -> list[str] | None:
    """The fields of a /proc stat file after the command's name, which may hold spaces (state, parent id, process group,
    ...), or None where the process or thread is gone or not visible from here."""
    try:
        return Path(path).read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def descends_from(pid: int, ancestor: int) -> bool:
    """Whether process `pid` is a child, grandchild, ... of `ancestor` (by the parent ids in /proc)."""
    while pid > 1:
        fields = proc_stat_fields(f"/proc/{pid}/stat")
        if fields is None:
            return False
        pid = int(fields[1])
        if pid == ancestor:
            return True
    return False


def describe_processes(pids: set[int]) -> str:
    """The verdict's message on descendant processes that held a CUDA context (empty where there were none)."""
    if not pids:
        return ""
    return (f"process {', '.join(map(str, sorted(pids)))}, started by the solution, held a CUDA context of its own while "
            "no call was running: another process can write the outputs (CUDA IPC) outside the timed window")  # fmt: skip


class LaunchAudit:
    """Records, while active, every call of the process that issues GPU work, with the thread that made it, and the
    host span of every call made through `call`. Use as a context manager around the calls; `outside_calls` afterwards."""

    KINDS = ("RUNTIME", "DRIVER")

    def __init__(self, device: torch.device):
        self.active = cupti is not None and device.type == "cuda"
        self.failure = ""  # why CUPTI refused to start, or the watch on GPU processes, where it did
        self._nvml = _load_nvml() if device.type == "cuda" else None
        self.processes: set[int] = set()  # descendants seen holding a CUDA context
        self.spans: list[tuple[int, int]] = []
        self._names: dict[tuple[int, int], str] = {}  # (record kind, function id) -> name, of the issuing functions
        self.issued: list[Issued] = []  # every recorded call that issues GPU work, in the order read
        self._harness_thread = threading.get_native_id()

    @staticmethod
    def method(device: torch.device) -> str:
        """How a run on `device` audits launches, as its results record it."""
        if device.type != "cuda":
            return "off: not on a GPU"
        processes = "GPU processes by NVML" if _load_nvml() is not None else "GPU processes: off, NVML not found"
        if cupti is None:
            return f"off: cupti-python is not installed (pip install '.[cupti]'); {processes}"
        return f"cupti-python {metadata.version('cupti-python')}; {processes}"

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

    def _record_issuing_apis_only(self) -> None:
        for kind, functions, enable in (
            (cupti.ActivityKind.RUNTIME, cupti.runtime_api_trace_cbid, cupti.activity_enable_runtime_api),
            (cupti.ActivityKind.DRIVER, cupti.driver_api_trace_cbid, cupti.activity_enable_driver_api),
        ):
            for function in functions:
                if function.name.startswith(ISSUING_APIS):
                    self._names[kind, function.value] = function.name
                elif function.name not in _NOT_FUNCTIONS:
                    enable(function, 0)

    def _stop(self) -> None:
        for kind in self.KINDS:
            with contextlib.suppress(Exception):
                cupti.activity_disable(getattr(cupti.ActivityKind, kind))
        cupti.finalize()  # so that torch.profiler (harness.attribution) can take CUPTI over after this

    def watch_processes(self) -> None:
        """Notes the descendants of this process that hold a CUDA context now (call while no call runs, once this
        process holds its own)."""
        if self._nvml is None:
            return
        me, pids = os.getpid(), gpu_processes(self._nvml)
        if me not in pids:  # NVML counts processes in another PID namespace (a container's host): the ids mean nothing here
            self._nvml, self.failure = None, "NVML does not list this process: the watch on GPU processes is off"
            return
        self.processes.update(pid for pid in pids if pid != me and descends_from(pid, me))

    def __exit__(self, *exc: object) -> None:
        self.watch_processes()
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
        for a in activities:
            if (name := self._names.get((a.kind, a.cbid))) is not None:
                self.issued.append(Issued(a.thread_id, a.start, name))

    def outside_calls(self) -> list[Issued]:
        return issued_outside_calls(self.issued, self.spans, self._harness_thread)

    def verdict(self) -> str:
        """Why the workload is REWARD_HACK by the audit, or "": calls issuing work outside the calls, else processes."""
        return describe(self.outside_calls()) or describe_processes(self.processes)
