"""Launching compiled kernels without the JIT's per-call work.

`kernel[grid](*args)` binds every argument, computes each one's specialisation, looks the binary up in Triton's
cache and only then launches it: tens of microseconds of host time per launch for kernels of twenty-odd arguments,
which a caller that synchronises before every call (the public benchmark, a training step that cannot run ahead)
waits for. A `LaunchSite` does that once, on its first call, keeps the compiled kernel and from then on hands the
arguments straight to the kernel's launcher.

That is only right while nothing the specialisation depends on changes: the constexprs and launch options, the
integer arguments that are specialised on, the dtypes and 16-byte alignment of the pointers, the descriptors'
block shapes and layouts. The launcher (solution.CallContext) keeps one set of sites per key that fixes all of
these: the plan, the shapes, strides, dtypes and alignment of the call's tensors, and its scratch buffers. Under
Triton's CPU interpreter, which returns no compiled kernel, every launch takes the JIT's path.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Sequence
from typing import Any

import torch


class LaunchSite:
    """One launch of a call's fixed sequence: the kernel it launches, and once launched its compiled binary and the
    names and defaults of its parameters (the launcher takes every parameter positionally, constexprs included)."""

    def __init__(self, kernel: Any):
        self.kernel = kernel
        self.compiled: Any = None
        parameters = inspect.signature(kernel.fn).parameters
        self.names = list(parameters)
        self.defaults = {name: p.default for name, p in parameters.items() if p.default is not inspect.Parameter.empty}

    def __call__(
        self, grid: Sequence[int], stream: torch.cuda.Stream | None, device_index: int, args: tuple, kwargs: dict[str, Any]
    ) -> None:
        """Launch on `stream` (None: torch's current stream)."""
        compiled = self.compiled
        if compiled is None:
            with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
                compiled = self.kernel[tuple(grid)](*args, **kwargs)
            if getattr(compiled, "function", None) is not None:  # None under the interpreter
                self.compiled = compiled
            return
        values = [*args, *(kwargs[name] if name in kwargs else self.defaults[name] for name in self.names[len(args) :])]
        grid_y = grid[1] if len(grid) > 1 else 1
        grid_z = grid[2] if len(grid) > 2 else 1
        raw = stream.cuda_stream if stream is not None else torch._C._cuda_getCurrentRawStream(device_index)
        compiled.run(grid[0], grid_y, grid_z, raw, compiled.function, compiled.packed_metadata, None, None, None, *values)


class LaunchSequence:
    """The launch sites of one call context, in the order the call makes its launches: the i-th launch of every call
    in the context is the same kernel with the same specialisation, so it goes through the i-th site."""

    def __init__(self, device: torch.device):
        self.device_index = (
            device.index if device.index is not None else torch.cuda.current_device() if device.type == "cuda" else 0
        )
        self.sites: list[LaunchSite] = []
        self.next = 0

    def restart(self) -> None:
        self.next = 0

    def launch(self, kernel: Any, grid: Sequence[int], stream: torch.cuda.Stream | None, *args: Any, **kwargs: Any) -> None:
        """Launch `kernel` as the call's next launch, on `stream` (None: torch's current stream)."""
        if self.next == len(self.sites):
            self.sites.append(LaunchSite(kernel))
        site = self.sites[self.next]
        if site.kernel is not kernel:
            raise RuntimeError(f"launch {self.next} of this call context was {site.kernel.fn.__name__}, not {kernel.fn.__name__}")
        self.next += 1
        site(grid, stream, self.device_index, args, kwargs)
