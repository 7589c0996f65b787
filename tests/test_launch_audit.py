"""The launch audit (harness.launch_audit): which GPU operations count as issued outside the calls, and what a run
without CUPTI records. The audit itself runs on the H200 (tests/adversarial: finishes_on_native_thread)."""

from __future__ import annotations

import enum
import threading
from types import SimpleNamespace

import torch

from harness import launch_audit
from harness.launch_audit import Issued, LaunchAudit, describe, issued_outside_calls

HARNESS, OTHER = 100, 200
CALLS = [(1_000, 2_000), (5_000, 6_000)]


def test_only_another_threads_operations_between_calls_count() -> None:
    issued = [
        Issued(HARNESS, 500, "fill of 4 bytes"),  # the harness before a call: its own
        Issued(OTHER, 1_000, "kernel first"),  # another thread during a call (its first instant): the call's
        Issued(OTHER, 2_000, "kernel last"),  # ... and its last instant
        Issued(HARNESS, 3_000, "kernel check"),  # the harness between calls
        Issued(OTHER, 2_001, "copy of 8 bytes"),  # another thread just after a call returned
        Issued(OTHER, 7_000, "kernel late"),  # another thread after the last call
        Issued(OTHER, 999, "kernel early"),  # another thread before the first call
    ]
    outside = issued_outside_calls(issued, CALLS, HARNESS)
    assert [op.work for op in outside] == ["copy of 8 bytes", "kernel late", "kernel early"]


def test_spans_in_any_order() -> None:
    assert issued_outside_calls([Issued(OTHER, 5_500, "k")], list(reversed(CALLS)), HARNESS) == []


def test_no_operations_or_no_calls() -> None:
    assert issued_outside_calls([], CALLS, HARNESS) == []
    assert issued_outside_calls([Issued(OTHER, 1, "k")], [], HARNESS) == [Issued(OTHER, 1, "k")]


def test_the_verdict_names_the_threads_and_the_first_operation() -> None:
    assert describe([]) == ""
    message = describe([Issued(OTHER, 1, "copy of 8 bytes"), Issued(OTHER + 1, 2, "kernel k")])
    assert message.startswith("2 GPU operations issued by thread 200, 201 while no call was running")
    assert "(the first: copy of 8 bytes)" in message


def test_off_the_gpu_the_audit_records_nothing_and_says_so() -> None:
    cpu = torch.device("cpu")
    assert LaunchAudit.method(cpu) == "off: not on a GPU"
    with LaunchAudit(cpu) as audit, audit.call():
        pass
    assert not audit.active and audit.spans == [] and audit.outside_calls() == [] and audit.failure == ""


class FakeCupti:
    """What the audit uses of cupti-python, with the records of one workload handed over at the flush."""

    class ActivityKind(enum.IntEnum):
        RUNTIME, DRIVER, CONCURRENT_KERNEL, MEMCPY, MEMSET = range(5)

    ActivityThreadIdType = SimpleNamespace(SYSTEM=1)
    ActivityFlag = SimpleNamespace(FLUSH_FORCED=1)
    runtime_api_trace_cbid = enum.IntEnum("runtime", "INVALID cudaLaunchKernel cudaGetDevice cudaMemcpyAsync")
    driver_api_trace_cbid = enum.IntEnum("driver", "cuLaunchKernelEx cuCtxGetCurrent cuMemcpyDtoDAsync_v2")

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


def record(kind: str, correlation: int, **fields) -> SimpleNamespace:
    return SimpleNamespace(kind=FakeCupti.ActivityKind[kind], correlation_id=correlation, **fields)


def test_the_audit_joins_each_operation_to_the_thread_that_issued_it(monkeypatch) -> None:
    """Records as CUPTI hands them over: a call by the harness's thread during a call, one after it, and a native
    thread's copy between the calls; the copy alone is found, described by its activity record."""
    harness = threading.get_native_id()
    fake = FakeCupti([
        record("RUNTIME", 1, thread_id=harness, start=1_500),
        record("CONCURRENT_KERNEL", 1, name="gemm"),
        record("DRIVER", 2, thread_id=harness + 1, start=2_500),
        record("MEMCPY", 2, bytes=512),
        record("RUNTIME", 3, thread_id=harness, start=2_600),
        record("MEMSET", 3, bytes=64),
        record("CONCURRENT_KERNEL", 4, name="no issuing record"),
    ])  # fmt: skip
    monkeypatch.setattr(launch_audit, "cupti", fake)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    with LaunchAudit(torch.device("cuda")) as audit, audit.call():  # the call's span: 1,000 to 2,000 on the fake clock
        assert fake.enabled == set(FakeCupti.ActivityKind)
    assert fake.not_recorded == ["cudaGetDevice", "cuCtxGetCurrent"] and fake.enabled == set() and fake.finalized
    with audit.call():  # after the audit: a call is no longer noted, and CUPTI's clock is not read
        pass
    assert audit.spans == [(1_000, 2_000)] and fake.clock == 2_000
    assert [op.work for op in audit.issued()] == ["kernel gemm", "copy of 512 bytes", "fill of 64 bytes"]
    assert audit.outside_calls() == [launch_audit.Issued(harness + 1, 2_500, "copy of 512 bytes")]


def test_a_refused_audit_is_off_and_says_why(monkeypatch) -> None:
    fake = FakeCupti([], refuse=True)
    monkeypatch.setattr(launch_audit, "cupti", fake)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    with LaunchAudit(torch.device("cuda")) as audit, audit.call():
        pass
    assert not audit.active and "MULTIPLE_SUBSCRIBERS" in audit.failure and fake.finalized and audit.spans == []
