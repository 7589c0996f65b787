"""The launch audit (harness.launch_audit): which GPU operations count as issued outside the calls, and what a run
without CUPTI records. The audit itself runs on the H200 (tests/adversarial: finishes_on_native_thread)."""

from __future__ import annotations

import torch

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
