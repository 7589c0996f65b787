"""Issuing a call's launches with as little host time as possible: record once, replay with the call's tensors.

`kernel[grid](*args)` binds every argument, computes each one's specialisation, looks the binary up in Triton's
cache and only then launches it: for kernels of twenty-odd arguments, most of a launch's host time.
On top of that the launcher's Python builds descriptors, picks streams and records events. A caller that
synchronises before every call (the public benchmark, a training step that cannot run ahead) waits for all of it.

A `CallProgram` belongs to one call context (solution.call_context), which fixes everything that the kernels'
specialisation and the launcher's decisions depend on: the plan, the shapes, strides, dtypes and 16-byte alignment
of the call's tensors, its stream and its scratch buffers. The first call of the context runs the launcher's code
normally; every launch, event record and stream wait it makes goes through the program, which records it: a launch
as the compiled kernel's parameters in bytes, with the positions that take the call's own tensors (or descriptors
over them; native.py). Later calls replay that list with the call's tensors put in, as one C program (replay.c) that
writes each call's addresses into the recorded parameters and calls the driver directly. Where the program cannot be
recorded or built, every call of the context runs the launcher's code: under Triton's CPU interpreter (which returns
no compiled kernel), for a launch whose arguments include a view of one of the call's tensors (a new object each
call, which the program could not put in), and, with a warning, for parameters the replay cannot write or where
replay.c does not build.
"""

from __future__ import annotations

import contextlib
import inspect
import warnings
from collections.abc import Sequence
from typing import Any

import torch

from .native import NativeProgram, Unsupported, describe_launch


def _parameters(kernel: Any) -> tuple[list[str], dict[str, Any]]:
    parameters = inspect.signature(kernel.fn).parameters
    return list(parameters), {name: p.default for name, p in parameters.items() if p.default is not inspect.Parameter.empty}


class CallProgram:
    """The launches, event records and stream waits of one call context's calls (see the module's docstring)."""

    def __init__(self) -> None:
        # ("launch", NativeLaunch), ("record", (event, stream)) and ("wait", (stream, event)) in the order of the first
        # call; the events and streams are kept alive here while the program replays them by handle.
        self.operations: list[tuple[str, Any]] = []
        self.native: NativeProgram | None = None  # the recorded operations as one C program, once built
        # Recording starts with a call's begin, not before: launches of a context's kernels outside a call (a test or a
        # sweep driving single stages) are never kept, and stops at the first call's end or at an operation it cannot
        # record.
        self._may_record = True
        self._recording = False
        self._tensors: Sequence[torch.Tensor] = ()
        self._storages: set[int] = set()

    def begin(self, call_tensors: Sequence[torch.Tensor]) -> None:
        """Start a call that runs the launcher's code: the first one to end records (a call that raised leaves
        nothing behind), later ones (only where recording failed) just launch."""
        self._recording = self._may_record
        if self._recording:
            self.operations.clear()
            self._tensors = call_tensors
            self._storages = {t.untyped_storage().data_ptr() for t in call_tensors}

    def end(self) -> None:
        """The call's operations are all issued: a complete recording is built into the C program that replays the
        later calls. The program keeps none of the call's tensors."""
        if self._recording:
            self._recording = self._may_record = False
            handles = [
                (kind, operation) if kind == "launch"
                else (kind, (operation[0].cuda_event, operation[1].cuda_stream)) if kind == "record"
                else (kind, (operation[0].cuda_stream, operation[1].cuda_event))
                for kind, operation in self.operations
            ]  # fmt: skip
            self.native = NativeProgram.build(handles, self._tensors)
        self._tensors, self._storages = (), set()

    def _stop(self) -> None:
        """Give up recording: every call of the context runs the launcher's code."""
        self._recording = self._may_record = False
        self.operations.clear()

    def launch(
        self, kernel: Any, grid: Sequence[int], stream: torch.cuda.Stream | None, caller: Any, *args: Any, **kwargs: Any
    ) -> None:
        """Launch `kernel` through the JIT on `stream` (None: the caller's stream, torch's current one), recording it
        on the first call."""
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            compiled = kernel[tuple(grid)](*args, **kwargs)
        if not self._recording:
            return
        if getattr(compiled, "function", None) is None:  # Triton's interpreter: nothing to replay
            self._stop()
            return
        names, defaults = _parameters(kernel)
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
            and all(tensor is not t for t in self._tensors)
            and tensor.untyped_storage().data_ptr() in self._storages
        )

    def record(self, event: torch.cuda.Event, stream: torch.cuda.Stream) -> None:
        event.record(stream)
        if self._recording:
            self.operations.append(("record", (event, stream)))

    def wait(self, stream: torch.cuda.Stream, event: torch.cuda.Event) -> None:
        stream.wait_event(event)
        if self._recording:
            self.operations.append(("wait", (stream, event)))
