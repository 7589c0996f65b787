"""Issuing a call's launches with as little host time as possible: record once, replay with the call's tensors.

`kernel[grid](*args)` binds every argument, computes each one's specialisation, looks the binary up in Triton's
cache and only then launches it: for kernels of twenty-odd arguments, most of a launch's host time.
On top of that the launcher's Python builds descriptors, picks streams and records events. A caller that
synchronises before every call (the public benchmark, a training step that cannot run ahead) waits for all of it.

A `CallProgram` belongs to one call context (solution.call_context), which fixes everything that the kernels'
specialisation and the launcher's decisions depend on: the plan, the shapes, strides, dtypes and 16-byte alignment
of the call's tensors, its stream and its scratch buffers. The first call of the context runs the launcher's code
normally; every launch, event record and stream wait it makes goes through the program, which records it with the
compiled kernel the JIT returned and notes which arguments are the call's own tensors (or descriptors over them).
Later calls replay that list with the call's tensors put in: on the GPU as one C program (native.py, replay.c),
which writes each call's addresses into the recorded parameters and calls the driver directly; where that program
cannot be built, each launch hands its recorded arguments to the compiled kernel's launcher from Python. A launch whose
arguments include a view of one of the call's tensors (a new object each call, which the program could not
substitute) leaves the program unrecorded, and every call then runs the launcher's code. Under Triton's CPU
interpreter, which returns no compiled kernel, the same holds.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .native import NativeLaunch, NativeProgram, Unsupported, describe_launch


@dataclass
class _Launch:
    compiled: Any  # the CompiledKernel
    grid: tuple[int, int, int]
    stream: int  # the raw CUDA stream
    values: list[Any]  # every parameter, constexprs included, in order, as the first call passed them
    tensors: list[tuple[int, int]]  # (parameter position, index of the call's tensor) to put in
    descriptors: list[tuple[Any, int]]  # (descriptor, index of the call's tensor that is its base)
    native: NativeLaunch | None = None  # the launch as the native replay takes it, where it can be described

    def __call__(self, call_tensors: Sequence[torch.Tensor]) -> None:
        """Launch through the compiled kernel's launcher (the Python replay)."""
        values = self.values.copy()
        for position, index in self.tensors:
            values[position] = call_tensors[index]
        for descriptor, index in self.descriptors:
            descriptor.base = call_tensors[index]
        c = self.compiled
        c.run(*self.grid, self.stream, c.function, c.packed_metadata, None, None, None, *values)
        self.release()

    def release(self) -> None:
        """Let go of the call's tensors, which the program must not keep alive between calls."""
        for descriptor, _ in self.descriptors:
            descriptor.base = None


@dataclass
class _Record:
    event: torch.cuda.Event
    stream: torch.cuda.Stream

    def __call__(self, call_tensors: Sequence[torch.Tensor]) -> None:
        self.event.record(self.stream)


@dataclass
class _Wait:
    stream: torch.cuda.Stream
    event: torch.cuda.Event

    def __call__(self, call_tensors: Sequence[torch.Tensor]) -> None:
        self.stream.wait_event(self.event)


def _parameters(kernel: Any) -> tuple[list[str], dict[str, Any]]:
    parameters = inspect.signature(kernel.fn).parameters
    return list(parameters), {name: p.default for name, p in parameters.items() if p.default is not inspect.Parameter.empty}


class CallProgram:
    """The launches, event records and stream waits of one call context's calls (see the module's docstring)."""

    def __init__(self) -> None:
        self.operations: list[_Launch | _Record | _Wait] = []
        self.recorded = False  # the first call ended and every operation could be recorded
        self.native: NativeProgram | None = None  # the recorded operations as one C program, where it could be built
        # Recording starts with a call's begin, not before: launches of a context's kernels outside a call (a test or a
        # sweep driving single stages) are never kept, and stops at the first call's end or at an operation it cannot
        # record.
        self._may_record = True
        self._recording = False
        self._tensors: Sequence[torch.Tensor] = ()
        self._storages: dict[int, int] = {}

    def begin(self, call_tensors: Sequence[torch.Tensor]) -> None:
        """Start a call that runs the launcher's code: the first one to end records (a call that raised leaves
        nothing behind), later ones (only where recording failed) just launch."""
        self._tensors = call_tensors
        self._recording = self._may_record
        if self._recording:
            self.operations.clear()
            self._storages = {t.untyped_storage().data_ptr(): i for i, t in enumerate(call_tensors)}

    def end(self) -> None:
        """The call's operations are all issued: a complete recording can replay from now on."""
        if self._recording:
            self.recorded = all(not isinstance(op, _Launch) or op.compiled is not None for op in self.operations)
            self._recording = self._may_record = False
            if not self.recorded:
                self.operations.clear()
            self.native = self._native_program()
            for operation in self.operations:
                if isinstance(operation, _Launch):
                    operation.release()

    def replay(self, call_tensors: Sequence[torch.Tensor]) -> None:
        if self.native is not None and self.native(call_tensors):
            return
        for operation in self.operations:
            operation(call_tensors)

    def _native_program(self) -> NativeProgram | None:
        if not self.recorded or any(isinstance(op, _Launch) and op.native is None for op in self.operations):
            return None
        return NativeProgram.build(
            [
                ("launch", op.native) if isinstance(op, _Launch)
                else ("record", (op.event.cuda_event, op.stream.cuda_stream)) if isinstance(op, _Record)
                else ("wait", (op.stream.cuda_stream, op.event.cuda_event))
                for op in self.operations
            ],
            self._tensors,
        )  # fmt: skip

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
            self._recording = self._may_record = False
            self.operations.clear()
            return
        names, defaults = _parameters(kernel)
        values = [*args, *(kwargs[name] if name in kwargs else defaults[name] for name in names[len(args) :])]
        grid3 = (*grid, *(1,) * (3 - len(grid)))
        launch = _Launch(compiled, grid3, (stream or caller).cuda_stream, values, [], [])
        for position, value in enumerate(values):
            if isinstance(value, torch.Tensor):
                self._note(value, lambda index, p=position: launch.tensors.append((p, index)))
            elif hasattr(value, "base") and isinstance(value.base, torch.Tensor):  # a tensor descriptor
                self._note(value.base, lambda index, d=value: launch.descriptors.append((d, index)))
        if not self._recording:  # an argument could not be recorded
            return
        try:
            launch.native = describe_launch(compiled, grid3, launch.stream, values, self._tensors)
        except Unsupported:
            launch.native = None
        for position, _ in launch.tensors:
            launch.values[position] = None
        self.operations.append(launch)

    def _note(self, tensor: torch.Tensor, substitute: Any) -> None:
        """An argument that is one of the call's tensors is put in on replay; one that is a view of one cannot be, and
        stops the recording; any other (the context's scratch) stays as recorded."""
        index = next((i for i, t in enumerate(self._tensors) if t is tensor), None)
        if index is not None:
            substitute(index)
        elif tensor.untyped_storage().data_ptr() in self._storages:
            self._recording = self._may_record = False
            self.operations.clear()

    def record(self, event: torch.cuda.Event, stream: torch.cuda.Stream) -> None:
        event.record(stream)
        if self._recording:
            self.operations.append(_Record(event, stream))

    def wait(self, stream: torch.cuda.Stream, event: torch.cuda.Event) -> None:
        stream.wait_event(event)
        if self._recording:
            self.operations.append(_Wait(stream, event))
