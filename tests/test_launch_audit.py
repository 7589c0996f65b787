"""The launch audit (harness.launch_audit): which calls count as issuing GPU work outside the solution's calls, and what
a run without CUPTI records. The audit itself runs on the H200 (tests/adversarial: finishes_on_native_thread)."""

from __future__ import annotations

import enum
import os
import subprocess
import threading
from types import SimpleNamespace

import torch

from harness import launch_audit
from harness.launch_audit import Issued, LaunchAudit, descends_from, describe, issued_outside_calls

HARNESS, OTHER = 100, 200
CALLS = [(1_000, 2_000), (5_000, 6_000)]


def test_only_another_threads_operations_between_calls_count() -> None:
    issued = [
        Issued(HARNESS, 500, "cudaMemsetAsync"),  # the harness before a call: its own
        Issued(OTHER, 1_000, "first"),  # another thread during a call (its first instant): the call's
        Issued(OTHER, 2_000, "last"),  # ... and its last instant
        Issued(HARNESS, 3_000, "check"),  # the harness between calls
        Issued(OTHER, 2_001, "cuMemcpyDtoDAsync_v2"),  # another thread just after a call returned
        Issued(OTHER, 7_000, "late"),  # another thread after the last call
        Issued(OTHER, 999, "early"),  # another thread before the first call
    ]
    outside = issued_outside_calls(issued, CALLS, HARNESS)
    assert [op.function for op in outside] == ["cuMemcpyDtoDAsync_v2", "late", "early"]


def test_spans_in_any_order() -> None:
    assert issued_outside_calls([Issued(OTHER, 5_500, "k")], list(reversed(CALLS)), HARNESS) == []


def test_no_operations_or_no_calls() -> None:
    assert issued_outside_calls([], CALLS, HARNESS) == []
    assert issued_outside_calls([Issued(OTHER, 1, "k")], [], HARNESS) == [Issued(OTHER, 1, "k")]


def test_the_verdict_names_the_threads_and_the_first_function() -> None:
    assert describe([]) == ""
    message = describe([Issued(OTHER, 1, "cuStreamBatchMemOp_v2"), Issued(OTHER, 2, "cuLaunchKernel")])
    assert message.startswith("2 calls issuing GPU work made by thread 200 while no call was running")
    assert "(the first: cuStreamBatchMemOp_v2)" in message
    many = describe([Issued(OTHER + i, i, "cuLaunchKernel") for i in range(5)])
    assert many.startswith("5 calls issuing GPU work made by 5 threads (200, 201, 202, ...) while no call")


def test_off_the_gpu_the_audit_records_nothing_and_says_so() -> None:
    cpu = torch.device("cpu")
    assert LaunchAudit.method(cpu) == "off: not on a GPU"
    with LaunchAudit(cpu) as audit, audit.call():
        pass
    assert not audit.active and audit.spans == [] and audit.outside_calls() == [] and audit.failure == ""


class FakeCupti:
    """What the audit uses of cupti-python, with the records of one workload handed over at the flush."""

    class ActivityKind(enum.IntEnum):
        RUNTIME, DRIVER = range(2)

    ActivityThreadIdType = SimpleNamespace(SYSTEM=1)
    ActivityFlag = SimpleNamespace(FLUSH_FORCED=1)
    runtime_api_trace_cbid = enum.IntEnum("runtime", "INVALID cudaLaunchKernel cudaGetDevice cudaMemcpyAsync")
    driver_api_trace_cbid = enum.IntEnum("driver", "cuLaunchKernelEx cuCtxGetCurrent cuStreamBatchMemOp_v2")

    def __init__(self, records: list[SimpleNamespace], refuse: bool = False):
        self.records, self.refuse, self.clock = records, refuse, 0
        self.enabled: set[int] = set()
        self.not_recorded: list[str] = []
        self.finalized = False

    def set_thread_id_type(self, kind: int) -> None:
        pass

    def activity_enable(self, kind: int) -> None:
        if self.refuse:
            raise RuntimeError("CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED")
        self.enabled.add(kind)

    def activity_disable(self, kind: int) -> None:
        self.enabled.discard(kind)

    def activity_enable_runtime_api(self, function: enum.IntEnum, enable: int) -> None:
        self.not_recorded.append(function.name)

    activity_enable_driver_api = activity_enable_runtime_api

    def activity_register_callbacks(self, requested, completed) -> None:
        self.completed = completed

    def get_timestamp(self) -> int:
        self.clock += 1_000
        return self.clock

    def activity_flush_all(self, flag: int) -> None:
        self.completed(self.records)

    def finalize(self) -> None:
        self.finalized = True


def record(kind: str, function: str, thread: int, start: int) -> SimpleNamespace:
    functions = FakeCupti.runtime_api_trace_cbid if kind == "RUNTIME" else FakeCupti.driver_api_trace_cbid
    return SimpleNamespace(kind=FakeCupti.ActivityKind[kind], cbid=functions[function].value, thread_id=thread, start=start)


def test_the_audit_keeps_the_calls_that_issue_work_with_their_threads(monkeypatch) -> None:
    """Records as CUPTI hands them over: a launch by the harness's thread during a call and a copy after it, a native
    thread's stream memory operation between the calls (work that leaves no kernel, copy or fill record), and a call
    that issues nothing; the memory operation alone is found, named by its function."""
    harness = threading.get_native_id()
    fake = FakeCupti([
        record("RUNTIME", "cudaLaunchKernel", harness, 1_500),
        record("DRIVER", "cuStreamBatchMemOp_v2", harness + 1, 2_500),
        record("RUNTIME", "cudaMemcpyAsync", harness, 2_600),
        record("DRIVER", "cuCtxGetCurrent", harness + 1, 2_700),
    ])  # fmt: skip
    monkeypatch.setattr(launch_audit, "cupti", fake)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    with LaunchAudit(torch.device("cuda")) as audit, audit.call():  # the call's span: 1,000 to 2,000 on the fake clock
        assert fake.enabled == set(FakeCupti.ActivityKind)
    assert fake.not_recorded == ["cudaGetDevice", "cuCtxGetCurrent"] and fake.enabled == set() and fake.finalized
    with audit.call():  # after the audit: a call is no longer noted, and CUPTI's clock is not read
        pass
    assert audit.spans == [(1_000, 2_000)] and fake.clock == 2_000
    assert [op.function for op in audit.issued] == ["cudaLaunchKernel", "cuStreamBatchMemOp_v2", "cudaMemcpyAsync"]
    assert audit.outside_calls() == [launch_audit.Issued(harness + 1, 2_500, "cuStreamBatchMemOp_v2")]


def test_a_refused_audit_is_off_and_says_why(monkeypatch) -> None:
    fake = FakeCupti([], refuse=True)
    monkeypatch.setattr(launch_audit, "cupti", fake)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    with LaunchAudit(torch.device("cuda")) as audit, audit.call():
        pass
    assert not audit.active and "MULTIPLE_SUBSCRIBERS" in audit.failure and fake.finalized and audit.spans == []


def test_a_child_process_descends_from_this_one() -> None:
    child = subprocess.Popen(["sleep", "30"])
    try:
        assert descends_from(child.pid, os.getpid()) and not descends_from(os.getpid(), child.pid)
        assert not descends_from(2**22 + 1, os.getpid())  # no such process
    finally:
        child.kill()
        child.wait()


def test_a_descendant_holding_a_context_is_a_verdict(monkeypatch) -> None:
    """Of the processes NVML lists, the harness's own and others' are passed over; a child of this process is kept."""
    child = subprocess.Popen(["sleep", "30"])
    try:
        audit = LaunchAudit(torch.device("cpu"))
        assert audit.verdict() == ""
        monkeypatch.setattr(launch_audit, "gpu_processes", lambda nvml: {os.getpid(), child.pid, 1})
        audit._nvml = object()  # as if NVML had loaded
        audit.watch_processes()
    finally:
        child.kill()
        child.wait()
    assert audit.processes == {child.pid}
    assert audit.verdict().startswith(f"process {child.pid}, started by the solution, held a CUDA context of its own")


def test_a_watch_that_cannot_see_this_process_turns_itself_off(monkeypatch) -> None:
    """In a container whose host NVML reports other process ids, the watch would compare unrelated ids: it stops, and
    the workload is marked as not audited."""
    monkeypatch.setattr(launch_audit, "gpu_processes", lambda nvml: {1, 2})
    audit = LaunchAudit(torch.device("cpu"))
    audit._nvml = object()
    audit.watch_processes()
    assert audit._nvml is None and "does not list this process" in audit.failure and audit.verdict() == ""
