"""Issuing a call's launches with as little host time as possible: record once, replay with the call's tensors.

`kernel[grid](*args)` binds every argument, computes each one's specialisation, looks the binary up in Triton's
cache and only then launches it: for kernels of twenty-odd arguments, most of a launch's host time.
On top of that the launcher's Python builds descriptors, picks streams and records events. A caller that
synchronises before every call (the public benchmark, a training step that cannot run ahead) waits for all of it.

A `CallProgram` belongs to one call context (solution.call_context), which fixes everything that the kernels'
specialisation and the launcher's decisions depend on: the plan, the shapes, strides, dtypes and 16-byte alignment
of the call's tensors, its stream and its scratch buffers. The first call of the context runs the launcher's code to
record it: every launch, event record and stream wait goes through the program, a launch described, not issued, as
the compiled kernel's parameters in bytes (the JIT only looks the kernel up), with the positions that take the call's
own tensors (or descriptors over them; native.py). That call and the later ones replay the list with the call's
tensors put in, as one C program (replay.c) that writes each call's addresses into the recorded parameters and calls
the driver directly. Where the program cannot be recorded or built, every call of the context runs the launcher's
code, which then issues its launches through the JIT: under Triton's CPU interpreter (no compiled kernel to describe),
for a launch whose arguments include a view of one of the call's tensors (a new object each call, which the program
could not put in), and, with a warning, for parameters the replay cannot write or where replay.c does not build.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import warnings
from collections.abc import Sequence
from typing import Any

import torch

from .native import NativeProgram, Unsupported, describe_launch


@functools.cache
def _parameters(fn: Any) -> tuple[list[str], dict[str, Any]]:
    """A kernel's parameter names and defaults (inspect.signature costs tens of microseconds: once per kernel)."""
    parameters = inspect.signature(fn).parameters
    return list(parameters), {name: p.default for name, p in parameters.items() if p.default is not inspect.Parameter.empty}


class CallProgram:
    """The launches, event records and stream waits of one call context's calls (see the module's docstring)."""

    def __init__(self, record: bool = True) -> None:
        # ("launch", NativeLaunch), ("record", (event, stream)) and ("wait", (stream, event)) in the order of the first
        # call; the events and streams are kept alive here while the program replays them by handle.
        self.operations: list[tuple[str, Any]] = []
        self.native: NativeProgram | None = None  # the recorded operations as one C program, once built
        # The next call that runs the launcher's code records (without `record`, as under Triton's CPU interpreter,
        # none does): launches of a context's kernels outside a call (a test or a sweep driving single stages) are
        # issued and never kept.
        self.records_next_call = record
        self._recording = False  # this call's launches are described, not issued
        self._complete = False  # no operation of this call has been left undescribed
        self._tensors: Sequence[torch.Tensor] = ()
        self._tensor_ids: set[int] = set()
        self._storages: set[int] = set()

    def begin(self, call_tensors: Sequence[torch.Tensor]) -> None:
        """Start a call that runs the launcher's code: the first one records (see records_next_call), later ones (only
        where recording failed) issue their launches."""
        self._recording = self._complete = self.records_next_call
        if self._recording:
            self.operations.clear()
            self._tensors, self._tensor_ids = call_tensors, {id(t) for t in call_tensors}
            self._storages = {t.untyped_storage().data_ptr() for t in call_tensors}

    def end(self, completed: bool = True) -> None:
        """The call's operations are all described: a complete recording is built into the C program that replays
        this call and the later ones. A call that raised (not `completed`) leaves nothing behind: the next call
        records. The program keeps none of the call's tensors."""
        if self._recording and not completed:
            self._recording = False
            self.operations.clear()
        elif self._recording:
            self._recording = self.records_next_call = False
            handles = [
                (kind, operation) if kind == "launch"
                else (kind, (operation[0].cuda_event, operation[1].cuda_stream)) if kind == "record"
                else (kind, (operation[0].cuda_stream, operation[1].cuda_event))
                for kind, operation in self.operations
            ]  # fmt: skip
            self.native = NativeProgram.build(handles, self._tensors) if self._complete else None
        self._tensors, self._tensor_ids, self._storages = (), set(), set()

    def _stop(self) -> None:
        """Give up recording: the rest of this call is not described, and every call of the context runs the
        launcher's code."""
        self._complete = False
        self.operations.clear()

    def launch(
        self, kernel: Any, grid: Sequence[int], stream: torch.cuda.Stream | None, caller: Any, *args: Any, **kwargs: Any
    ) -> None:
        """Launch `kernel` through the JIT on `stream` (None: the caller's stream, torch's current one), or, on the
        recording call, describe the launch."""
        if not self._recording:
            with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
                kernel[tuple(grid)](*args, **kwargs)
            return
        if not self._complete:
            return
        compiled = kernel.warmup(*args, grid=tuple(grid), **kwargs)  # looked up (or compiled), not launched
        if compiled is None or compiled.run is None or not compiled.function:  # `run` loads the kernel's module
            self._stop()
            return
        names, defaults = _parameters(kernel.fn)
        values = [*args, *(kwargs[name] if name in kwargs else defaults[name] for name in names[len(args) :])]
        if any(self._view_of_a_call_tensor(value) for value in values):
            self._stop()
            return
        grid3 = (*grid, *(1,) * (3 - len(grid)))
        try:
            described = describe_launch(compiled, grid3, (stream or caller).cuda_stream, values, self._tensors)
        except Unsupported as error:
            warnings.warn(f"triton_fused issues every call of this shape from Python: {error}", stacklevel=2)
            self._stop()
            return
        self.operations.append(("launch", described))

    def _view_of_a_call_tensor(self, value: Any) -> bool:
        """An argument (or a descriptor's base) that shares a call tensor's memory without being that tensor: the
        program puts in the call's tensors themselves, and anything else stays as recorded (the context's scratch)."""
        tensor = value if isinstance(value, torch.Tensor) else getattr(value, "base", None)
        return (
            isinstance(tensor, torch.Tensor)
            and id(tensor) not in self._tensor_ids
            and tensor.untyped_storage().data_ptr() in self._storages
        )

    def record(self, event: torch.cuda.Event, stream: torch.cuda.Stream) -> None:
        """Record `event` on `stream` (on the recording call too: only ordering, and the event then exists)."""
        event.record(stream)
        if self._recording:
            self.operations.append(("record", (event, stream)))

    def wait(self, stream: torch.cuda.Stream, event: torch.cuda.Event) -> None:
        stream.wait_event(event)
        if self._recording:
            self.operations.append(("wait", (stream, event)))
