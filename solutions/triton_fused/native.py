"""A call program replayed by one C call (replay.c): the launches' parameters as the kernels take them, recorded once.

Replaying through Triton's launcher still costs 5-20 us per launch: its C entry point parses every argument from
Python, asks the driver about every pointer and, through Triton's Python wrapper, encodes every TMA descriptor again.
Here each launch is described once, at recording, as the kernel's parameters in bytes (Triton 3.6 to 3.9's layout:
the launcher's signature with every tensor descriptor expanded, constexprs left out, two scratch pointers at the end),
with the positions that take the call's tensors; replay.c then writes each call's addresses in and calls the driver
directly. The layout is checked against the kernel's own (cuFuncGetParamInfo) when the program is built; a launcher
of another shape (another Triton) or parameters this cannot write leave the calls to the launcher's code (launch.py).
"""

from __future__ import annotations

import functools
import inspect
import re
import struct
import subprocess
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

# Bytes of each scalar type of Triton's signatures; floats are written as their bits (FLOAT_FORMATS).
SIZES = {"i1": 1, "i8": 1, "u1": 1, "u8": 1, "i16": 2, "u16": 2, "i32": 4, "u32": 4, "i64": 8, "u64": 8, "fp32": 4,
         "f32": 4, "fp64": 8, "nvTmaDesc": 128}  # fmt: skip
FLOAT_FORMATS = {"fp32": ("<f", "<I"), "f32": ("<f", "<I"), "fp64": ("<d", "<Q")}
POINTER_SIZE = 8
SCRATCH_POINTERS = 2  # global and profile scratch, which Triton's launcher appends to every launch


def layout(tensor: torch.Tensor) -> tuple:
    """What a recorded call's replay depends on in each of its tensors: dtype, shape, strides and 16-byte alignment
    (the kernels' specialisation); replay.c checks these of every call, and call contexts are keyed by them."""
    return tensor.dtype, tensor.shape, tensor.stride(), tensor.data_ptr() % 16


class Unsupported(Exception):
    """A launch whose parameters the native replay cannot write (the context's calls then run the launcher's code)."""


@dataclass
class NativeLaunch:
    """One launch as replay.c's `launch` takes it: configuration, (size, value) per parameter, and which parameters
    take a call tensor's address (pointers) or a TMA descriptor over a call tensor (maps), as (parameter, tensor)."""

    function: int
    grid: tuple[int, int, int]
    num_warps: int
    num_ctas: int
    shared_memory: int
    stream: int
    pdl: bool
    cooperative: bool
    params: list[tuple[int, Any]]
    pointers: list[tuple[int, int]]
    maps: list[tuple[int, int]]


def describe_launch(
    compiled: Any, grid: tuple[int, int, int], stream: int, values: Sequence[Any], call_tensors: Sequence[torch.Tensor]
) -> NativeLaunch:
    """The native description of a launch of `compiled` with `values` (every parameter of the kernel, constexprs
    included, as the JIT was handed them); raises Unsupported where it cannot be made."""
    run, signature, descriptors, encode = _launcher_layout(compiled)
    if len(signature) != len(values):
        raise Unsupported(f"{len(values)} values for {len(signature)} parameters")
    flat_types: list[str] = []
    flat_values: list[Any] = []
    maps_of: dict[int, torch.Tensor] = {}  # flat position of a descriptor's map -> its base
    for kind, value in zip(signature, values):
        if kind in descriptors:
            meta, ndim = descriptors[kind]
            encoded = encode(value, meta)
            if meta is not None:
                maps_of[len(flat_values)] = value.base
                head = ["nvTmaDesc"]
            else:  # base, shape and strides, then one flag (3.6: padding) or two (from 3.7: and TF32 rounding)
                head = ["*", *["i64"] * (2 * ndim), *["i1"] * (len(encoded) - 1 - 4 * ndim)]
            flat_types += [*head, *["i32"] * ndim, *["i64"] * ndim]
            flat_values += encoded
        else:
            flat_types.append(kind)
            flat_values.append(value)
    if len(flat_types) != len(flat_values):
        raise Unsupported("a descriptor's encoding does not match its expanded signature")
    index_of = {id(t): i for i, t in enumerate(call_tensors)}
    launch = NativeLaunch(compiled.function, grid, compiled.metadata.num_warps, compiled.metadata.num_ctas,
                          compiled.metadata.shared, stream, bool(run.launch_pdl), bool(run.launch_cooperative_grid),
                          [], [], [])  # fmt: skip
    for position, (kind, value) in enumerate(zip(flat_types, flat_values)):
        if kind == "constexpr":
            continue
        param = len(launch.params)
        if kind.startswith("*"):
            if isinstance(value, torch.Tensor) and id(value) in index_of:
                launch.pointers.append((param, index_of[id(value)]))
            launch.params.append((POINTER_SIZE, _address(value)))
        elif kind == "nvTmaDesc":
            base = maps_of[position]
            if id(base) in index_of:
                launch.maps.append((param, index_of[id(base)]))
            launch.params.append((SIZES[kind], value))
        elif kind in FLOAT_FORMATS:
            pack, unpack = FLOAT_FORMATS[kind]
            launch.params.append((SIZES[kind], struct.unpack(unpack, struct.pack(pack, value))[0]))
        elif kind in SIZES:
            launch.params.append((SIZES[kind], int(value)))
        else:
            raise Unsupported(f"parameter type {kind}")
    launch.params += [(POINTER_SIZE, 0)] * SCRATCH_POINTERS
    return launch


@functools.cache
def _launcher_layout(compiled: Any) -> tuple[Any, list, dict[Any, tuple[Any, int]], Callable | None]:
    """What describe_launch reads of a compiled kernel, once per kernel: its launcher, its signature with each tensor
    descriptor parameter as a key of `descriptors`, which gives the descriptor's metadata and rank, and Triton's
    descriptor encoder."""
    run = compiled.run
    if getattr(run, "global_scratch_size", 1) or getattr(run, "profile_scratch_size", 1):
        raise Unsupported("the kernel needs scratch memory allocated per launch")
    descriptor_positions, metadata, encode = _descriptor_handling(run)
    signature: list[Any] = []
    descriptors: dict[Any, tuple[Any, int]] = {}
    for position, kind in enumerate(compiled.src.signature.values()):
        if not isinstance(kind, str):
            raise Unsupported(f"parameter type {kind!r}")
        if position in descriptor_positions:
            meta = metadata[len(descriptors)] if metadata else None
            ndim = re.match(r"tensordesc<[^[>]*\[([^]]*)\]", kind).group(1).count(",") + 1
            kind = ("descriptor", position)  # a key no scalar type can equal
            descriptors[kind] = meta, ndim
        signature.append(kind)
    return run, signature, descriptors, encode


def _address(value: Any) -> int:
    if value is None:
        return 0
    if isinstance(value, torch.Tensor):
        return value.data_ptr()
    if isinstance(value, int):
        return value
    raise Unsupported(f"a pointer parameter of type {type(value).__name__}")


def _descriptor_handling(run: Any) -> tuple[set[int], list, Callable | None]:
    """Which of a launcher's parameters are tensor descriptors, their metadata and Triton's encoder, for the
    CudaLauncher of Triton 3.6 to 3.9: its `launch` is the C entry point itself (no descriptors) or a closure over it
    that encodes them, over their positions and a module's encoder (3.6, 3.7) or over a tree of their paths into
    tuple parameters and an encoder taking the launch's other arguments too, which CUDA's ignores (from 3.8)."""
    wrapper = getattr(run, "launch", None)
    if inspect.isbuiltin(wrapper):
        return set(), [], None
    closure = getattr(wrapper, "__closure__", None) or ()
    cells = dict(zip(getattr(getattr(wrapper, "__code__", None), "co_freevars", ()), (c.cell_contents for c in closure)))
    if {"tensordesc_indices", "tensordesc_meta"} <= cells.keys():
        encode = getattr(wrapper, "__globals__", {}).get("make_tensordesc_arg")
        if encode is not None:
            return cells["tensordesc_indices"], cells["tensordesc_meta"], encode
    if {"relevant_paths", "tensordesc_meta", "make_tensordesc_arg"} <= cells.keys():
        paths, encode_with = cells["relevant_paths"], cells["make_tensordesc_arg"]
        if any(paths.values()):
            raise Unsupported("a tensor descriptor inside a tuple parameter")
        return set(paths), cells["tensordesc_meta"] or [None] * len(paths), lambda value, meta: encode_with(value, meta, ())
    raise Unsupported("not the CUDA launcher of Triton 3.6 to 3.9")


@functools.cache
def _compiled_module() -> Any | None:
    """replay.c, compiled once per machine by Triton's own tool for its launchers (and kept in Triton's cache); None,
    with a warning, where it cannot be (every call then runs the launcher's code)."""
    try:
        from triton.backends.nvidia import driver
        from triton.runtime.build import compile_module_from_src

        return compile_module_from_src(
            src=(Path(__file__).parent / "replay.c").read_text(),
            name="triton_fused_replay",
            library_dirs=driver.library_dirs(),
            include_dirs=driver.include_dirs,
            libraries=driver.libraries,
        )
    # no C compiler, no libcuda, a compiler error: slower calls, the same work
    except (ImportError, OSError, RuntimeError, AssertionError, subprocess.SubprocessError) as error:
        warnings.warn(f"triton_fused issues every call from Python: replay.c did not build ({error})", stacklevel=2)
        return None


class NativeProgram:
    """The launches, event records and stream waits of a recorded call, as one C program."""

    def __init__(self, module: Any, program: Any) -> None:
        self._replay = functools.partial(module.replay, program)

    @classmethod
    def build(cls, operations: Sequence[tuple[str, Any]], tensors: Sequence[torch.Tensor]) -> NativeProgram | None:
        """The program of ("launch", NativeLaunch), ("record", (event, stream)) and ("wait", (stream, event)) operations
        for calls of tensors laid out as `tensors` (the recorded call's); None where replay.c is not available, a launch
        does not match its kernel or the driver cannot tell (before CUDA 12.4 it has no cuFuncGetParamInfo)."""
        module = _compiled_module()
        if module is None:
            return None
        try:
            program = module.new([layout(t) for t in tensors])
            for kind, operation in operations:
                if kind == "launch":
                    o = operation
                    module.launch(program, o.function, o.grid, o.num_warps, o.num_ctas, o.shared_memory, o.stream,
                                  o.pdl, o.cooperative, o.params, o.pointers, o.maps)  # fmt: skip
                else:
                    getattr(module, kind)(program, *operation)
        except (TypeError, ValueError, RuntimeError) as error:
            warnings.warn(f"triton_fused issues every call of this shape from Python: {error}", stacklevel=2)
            return None
        return cls(module, program)

    def __call__(self, call_tensors: Sequence[torch.Tensor]) -> bool:
        """Issue the call with these tensors: False, and nothing issued, where one's dtype, shape, strides or 16-byte
        alignment differs from the recorded call's."""
        return self._replay(call_tensors)
