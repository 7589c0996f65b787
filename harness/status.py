"""Evaluation statuses, named as SOL-ExecBench names them, plus the harness's own SKIPPED and INVALID_TIMING."""

from __future__ import annotations

from enum import Enum


class Status(str, Enum):
    PASSED = "PASSED"
    INCORRECT_SHAPE = "INCORRECT_SHAPE"
    INCORRECT_DTYPE = "INCORRECT_DTYPE"
    INCORRECT_NUMERICAL = "INCORRECT_NUMERICAL"
    RUNTIME_ERROR = "RUNTIME_ERROR"
    COMPILE_ERROR = "COMPILE_ERROR"
    TIMEOUT = "TIMEOUT"
    REWARD_HACK = "REWARD_HACK"
    INVALID_REFERENCE = "INVALID_REFERENCE"
    # A measured time below the roofline with datasheet peaks: physically impossible, never a record.
    INVALID_TIMING = "INVALID_TIMING"
    # The solution cannot run on this device (for instance it needs CUDA and none is present).
    SKIPPED = "SKIPPED"

    @property
    def passed(self) -> bool:
        return self is Status.PASSED


# When several checks fail in one trial, the workload reports the most serious one.
SEVERITY: tuple[Status, ...] = (
    Status.REWARD_HACK,
    Status.RUNTIME_ERROR,
    Status.INCORRECT_SHAPE,
    Status.INCORRECT_DTYPE,
    Status.INCORRECT_NUMERICAL,
    Status.PASSED,
)


def worst(statuses: list[Status]) -> Status:
    for status in SEVERITY:
        if status in statuses:
            return status
    return Status.PASSED
