"""The L2 set-aside for persisting accesses, held where the harness found it while a solution runs.

Since Ampere a context can set aside part of the L2 (the limit CU_LIMIT_PERSISTING_L2_CACHE_SIZE) for lines that
accesses mark persisting, through an access-policy window on a stream or on one launch. The driver's default set-aside
is not 0 (9,830,400 bytes on an H100 with driver 580), and honest kernels run faster with it: triton_fused, whose
stores of an intermediate carry PTX's evict_last hint so that it stays in L2 while the weights stream past, takes
longer at small T under a set-aside of 0. So the harness holds the set-aside at the value it found before it loaded
the solution, as a training step and the public evaluator run, and a solution that changes it is caught
(REWARD_HACK): after every trial call (reward_hacks.check_call) and after each workload's timings
(runner.Bench.run_workload).

Marked lines survive the writes of timing.L2Flusher, so a solution that marks its weights finds part of them in L2 in
the next timed call, which the flush is there to prevent. And a call could raise the limit, mark its weights and lower
it again unseen (setting the limit waits for the device to go idle, which it is between call-latency calls anyway;
lowering it leaves marked lines persisting). So the timers that call on an idle device (call latency, mixed T) reset
every line to normal before each call's flush, which takes either gain away. The queue-full timers (device time,
sustained) cannot: a reset acts when the host makes it, not in stream order, and rewriting the marked lines in stream
order does not unmark them (neither the device-time timer's redraw of the inputs nor a write from a stream whose window
says Normal). A flush whose own writes are marked persisting does evict them in stream order, but it also moves an
honest solution's time, by a few percent either way depending on T. So the flush stays the plain one of Triton's
do_bench and the public evaluator, and in the queue-full timers marked lines keep their gain across it, as in theirs.
"""

from __future__ import annotations

import contextlib
import ctypes
from typing import Protocol

import torch

CU_LIMIT_PERSISTING_L2_CACHE_SIZE = 0x06


class Driver(Protocol):
    """The calls of the CUDA driver used here (libcuda), or a stand-in for tests."""

    def cuCtxGetLimit(self, value: ctypes.c_size_t, limit: int) -> int: ...
    def cuCtxSetLimit(self, limit: int, value: ctypes.c_size_t) -> int: ...
    def cuCtxResetPersistingL2Cache(self) -> int: ...


class PersistingL2:
    """Holds a CUDA context's persisting-L2 set-aside where it was found and says when a solution changed it."""

    def __init__(self, driver: Driver, device: torch.device | None = None):
        self.driver = driver
        self.device = device  # whose context the driver's calls act on (made current for them); None: the current one
        self.held = self.set_aside()  # the bytes set aside when the harness found it (None: the driver does not say)

    @classmethod
    def held_as_found(cls, device: torch.device) -> PersistingL2 | None:
        """Hold the set-aside of `device`'s context where it is now; None where there is none to hold (not a CUDA
        device, or a driver without the limit: no persisting accesses there)."""
        if device.type != "cuda":
            return None
        torch.cuda.synchronize(device)  # creates the device's context where torch has not yet
        return cls.holding(ctypes.CDLL("libcuda.so.1"), device)

    @classmethod
    def holding(cls, driver: Driver, device: torch.device | None = None) -> PersistingL2 | None:
        """The set-aside, held at what `driver` reads now; None where the driver has no such limit."""
        held = cls(driver, device)
        return None if held.held is None else held

    def set_aside(self) -> int | None:
        """The bytes set aside now, or None where the driver does not say."""
        value = ctypes.c_size_t()
        with self._context():
            read = self.driver.cuCtxGetLimit(ctypes.byref(value), CU_LIMIT_PERSISTING_L2_CACHE_SIZE) == 0
        return value.value if read else None

    def changed(self) -> str:
        """What the set-aside became, where it is no longer the held value (then set back to it), or ""."""
        if (nbytes := self.set_aside()) in (None, self.held):
            return ""
        with self._context():
            self.driver.cuCtxSetLimit(CU_LIMIT_PERSISTING_L2_CACHE_SIZE, ctypes.c_size_t(self.held))
        return (f"set aside {nbytes} bytes of L2 for persisting accesses (the harness holds it at the {self.held} it "
                f"found; the more, the more marked lines outlive the L2 flush before each timed call)")  # fmt: skip

    def reset_lines(self) -> None:
        """Make every line marked persisting a normal one again, at once (not in stream order; 4 us of host time)."""
        with self._context():
            self.driver.cuCtxResetPersistingL2Cache()

    def _context(self) -> contextlib.AbstractContextManager:
        return torch.cuda.device(self.device) if self.device is not None else contextlib.nullcontext()
