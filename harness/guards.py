"""What the harness does around every call of a solution so that a broken or cheating one cannot pass.

- Outputs are poisoned with NaN before every call: an element the solution does not write fails. They sit between
  guard bands of a known byte: a write past either end of one fails.
- Inputs are snapshotted before and compared bit for bit after: an in-place mutation fails. (A full
  copy is stronger than a checksum and the inputs are at most a few hundred MB.)
- An output that shares memory with an input fails.
- Process-wide numeric settings (TF32 flags, default dtype, autocast, torch function and dispatch modes, ...) are
  recorded before and compared after: a solution that passes only by changing them (and thereby the reference) is
  caught. The global RNGs are not among them: the harness draws every input from generators of its own, so their
  state decides nothing.
- Timing, synchronisation and harness functions, the methods of the harness's classes, the statistics and builtins it
  computes with, and torch's functions and tensor methods are compared by identity after every call (patching), and
  once more after each workload by a check taken before the solution was imported, which also compares the kernels
  torch's dispatcher holds for every aten operator (a kernel registered over torch's would compute the reference too).
- After a call returns, no thread may still run the solution's code, and every output must be a plain
  torch.Tensor (a subclass can compute lazily, when the checker reads it).
- The L2 set-aside for persisting accesses is held where it was before the solution is imported
  (harness.persisting_l2): changed after a call or a workload's timings, it is caught.
"""

from __future__ import annotations

import builtins
import contextlib
import json
import math
import os
import random
import secrets
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from inspect import getattr_static  # bound here: a solution that replaces inspect's cannot hide a method from the check
from pathlib import Path

import numpy
import pydantic
import torch
from torch.utils import _python_dispatch

from harness.persisting_l2 import PersistingL2

# Bytes of a known pattern on each side of every output buffer the harness passes: a multiple of 256, so that the
# output keeps the alignment of the allocation it sits in.
GUARD_BYTES = 4096
GUARD_FILL = 0x5A


def guarded_empty(shape: Sequence[int], dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """An uninitialised tensor with GUARD_BYTES of GUARD_FILL on each side of it in the same allocation, so that a
    kernel writing past either end of it changes them (written_guard_bands)."""
    nbytes = math.prod(shape) * dtype.itemsize
    buffer = torch.full((nbytes + 2 * GUARD_BYTES,), GUARD_FILL, dtype=torch.uint8, device=device)
    return buffer[GUARD_BYTES : GUARD_BYTES + nbytes].view(dtype).view(tuple(shape))


def written_guard_bands(tensor: torch.Tensor) -> list[str]:
    """Which bands around a guarded_empty tensor no longer hold GUARD_FILL ("before its start", "past its end")."""
    storage = tensor.untyped_storage()
    if storage.nbytes() != tensor.nbytes + 2 * GUARD_BYTES or tensor.storage_offset() * tensor.itemsize != GUARD_BYTES:
        return []  # not guarded (a solution's own tensor, or one it replaced)
    buffer = torch.empty(0, dtype=torch.uint8, device=tensor.device).set_(storage)
    bands = {"before its start": buffer[:GUARD_BYTES], "past its end": buffer[GUARD_BYTES + tensor.nbytes :]}
    return [where for where, band in bands.items() if bool((band != GUARD_FILL).any())]


def poison(outputs: Sequence[torch.Tensor]) -> None:
    for out in outputs:
        if out.is_floating_point():
            out.fill_(float("nan"))
        else:
            out.fill_(-1)


def snapshot(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: tensor.clone() for name, tensor in tensors.items()}


def bits(tensor: torch.Tensor) -> torch.Tensor:
    """Reinterpret as integers so that NaN payloads and -0.0 compare exactly."""
    if tensor.is_floating_point():
        return tensor.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[tensor.element_size()])
    return tensor


def mutated_inputs(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> list[str]:
    """Names of the inputs whose shape, dtype or bits differ from their snapshot."""
    changed = []
    for name, original in before.items():
        current = after[name]
        if current.shape != original.shape or current.dtype != original.dtype or not torch.equal(bits(current), bits(original)):
            changed.append(name)
    return changed


def _byte_range(tensor: torch.Tensor) -> tuple[int, int]:
    storage = tensor.untyped_storage()
    start = storage.data_ptr()
    return start, start + storage.nbytes()


def aliased_inputs(output: torch.Tensor, inputs: dict[str, torch.Tensor]) -> list[str]:
    """Names of the inputs whose storage overlaps the output's storage."""
    out_start, out_end = _byte_range(output)
    if out_start == out_end:
        return []
    hits = []
    for name, tensor in inputs.items():
        start, end = _byte_range(tensor)
        if start < out_end and out_start < end and tensor.device == output.device:
            hits.append(name)
    return hits


def _keys(keys: torch._C.DispatchKeySet) -> tuple[str, ...]:
    """The names in a dispatch key set ("DispatchKeySet(BackendSelect, ADInplaceOrView)")."""
    text = repr(keys)
    return tuple(sorted(name.strip() for name in text[text.index("(") + 1 : -1].split(",") if name.strip()))


def _thread_keys(included: bool) -> tuple[Callable[[], object], Callable[[object], None]]:
    """This thread's dispatch keys included (or excluded) beyond each operator's own: autocast's, the Python
    dispatcher's, a dispatch mode's."""
    read = torch._C._dispatch_tls_local_include_set if included else torch._C._dispatch_tls_local_exclude_set
    set_key = torch._C._dispatch_tls_set_dispatch_key_included if included else torch._C._dispatch_tls_set_dispatch_key_excluded

    def restore(keys: object) -> None:
        for name in set(keys) ^ set(_keys(read())):
            set_key(torch._C._parse_dispatch_key(name), name in keys)

    return (lambda: _keys(read())), restore


def _mode_stack(size: Callable[[], int], pop: Callable[[], object]) -> tuple[Callable[[], object], Callable[[object], None]]:
    """How many modes a stack holds, and what pops it back to a depth."""

    def restore(depth: object) -> None:
        while size() > depth:
            pop()

    return size, restore


def _fp32_precision(owner: object) -> tuple[Callable[[], object], Callable[[object], None]]:
    """Torch's newer per-backend float32 precision setting ("none", "ieee", "tf32", "bf16"), where it has one."""
    return (lambda: getattr(owner, "fp32_precision", None)), (
        lambda value: None if value is None else setattr(owner, "fp32_precision", value)
    )


_backends = torch.backends
# Process-wide (and this thread's) settings that change what a float32 product computes, each with how to read and set
# it, set in this order: the torch function and dispatch modes (which see every op, the reference's too) before the
# dispatch keys they include, and the older TF32 flags before torch's newer float32 precision settings, which their
# setters write. This thread's: the solution's calls run on it, and so does the reference.
_SETTINGS: dict[str, tuple[Callable[[], object], Callable[[object], None]]] = {
    "torch function modes": _mode_stack(torch._C._len_torch_function_stack, torch._C._pop_torch_function_stack),
    "torch dispatch modes": _mode_stack(_python_dispatch._len_torch_dispatch_stack, _python_dispatch._pop_mode),
    "dispatch keys included (autocast, Python dispatch)": _thread_keys(included=True),
    "dispatch keys excluded (autocast, Python dispatch)": _thread_keys(included=False),
    "torch.backends.cuda.matmul.allow_tf32": (
        lambda: _backends.cuda.matmul.allow_tf32,
        lambda value: setattr(_backends.cuda.matmul, "allow_tf32", value),
    ),
    "torch.backends.cudnn.allow_tf32": (
        lambda: _backends.cudnn.allow_tf32,
        lambda value: setattr(_backends.cudnn, "allow_tf32", value),
    ),
    "torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction": (
        lambda: _backends.cuda.matmul.allow_bf16_reduced_precision_reduction,
        lambda value: setattr(_backends.cuda.matmul, "allow_bf16_reduced_precision_reduction", value),
    ),
    "torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction": (
        lambda: _backends.cuda.matmul.allow_fp16_reduced_precision_reduction,
        lambda value: setattr(_backends.cuda.matmul, "allow_fp16_reduced_precision_reduction", value),
    ),
    "torch.get_float32_matmul_precision()": (torch.get_float32_matmul_precision, torch.set_float32_matmul_precision),
    "torch.get_default_dtype()": (torch.get_default_dtype, torch.set_default_dtype),
    "torch.backends.fp32_precision": _fp32_precision(_backends),
    "torch.backends.cuda.matmul.fp32_precision": _fp32_precision(_backends.cuda.matmul),
    "torch.backends.cudnn.fp32_precision": _fp32_precision(_backends.cudnn),
    "torch.backends.mkldnn.fp32_precision": _fp32_precision(_backends.mkldnn),
}


@dataclass(frozen=True)
class Unreadable:
    """A setting torch refuses to read (an older TF32 flag that a newer setting contradicts): what it said."""

    message: str


def _read(getter: Callable[[], object]) -> object:
    try:
        return getter()
    except RuntimeError as exc:
        return Unreadable(str(exc))


def numeric_settings() -> dict[str, object]:
    """Process-wide settings that change what a float32 product computes (_SETTINGS)."""
    return {name: _read(get) for name, (get, _) in _SETTINGS.items()}


def restore_numeric_settings(settings: dict[str, object]) -> None:
    """Set each setting named in `settings` to its value there, in _SETTINGS's order (an unreadable one left as it is)."""
    for name, (_, set_value) in _SETTINGS.items():
        if name in settings and not isinstance(settings[name], Unreadable):
            set_value(settings[name])


# The settings under which the reference always runs, whatever a solution did before.
STRICT_FP32: dict[str, object] = {
    "torch.backends.cuda.matmul.allow_tf32": False,
    "torch.backends.cudnn.allow_tf32": False,
    "torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction": True,
    "torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction": True,
    "torch.get_float32_matmul_precision()": "highest",
    "torch.get_default_dtype()": torch.float32,
}


@contextlib.contextmanager
def strict_fp32() -> Iterator[None]:
    """Run the float32 reference with TF32 off and float32 matmuls at full precision."""
    saved = numeric_settings()
    restore_numeric_settings(STRICT_FP32)
    try:
        yield
    finally:
        restore_numeric_settings(saved)


# Read and put back, not compared: the older flags' setters write these ("none" becomes "ieee", the same arithmetic), and
# any other value set here makes the older flags read otherwise, or not at all (Unreadable), which is compared.
_RESTORED_ONLY = frozenset(name for name in _SETTINGS if name.endswith(".fp32_precision"))


def changed_settings(before: dict[str, object]) -> list[str]:
    after = numeric_settings()
    return [name for name, value in before.items() if name not in _RESTORED_ONLY and after[name] != value]


# Functions whose identity is checked after every call: timing and synchronisation (a solution that patches them could
# fake its time), what carries a worker's result to the parent (json, pydantic), what draws the timed calls' seeds and
# picks those checked in full (with secrets, below) and what finds a thread still running the solution's code; with
# them the modules watched whole (below), Python's builtins (patch_check), and every function of the harness and the
# reference with every method of their classes (their checks).
_WATCHED_ATTRIBUTES: tuple[tuple[object, tuple[str, ...]], ...] = (
    (time, ("perf_counter", "perf_counter_ns", "time", "monotonic")),
    (torch.cuda, ("synchronize", "Event", "Stream", "current_stream", "_sleep")),
    (json, ("dumps", "loads")),
    (random.SystemRandom, ("randrange", "getrandbits", "random")),
    (sys, ("_current_frames",)),
    (threading, ("enumerate", "get_ident")),
    (pydantic.BaseModel, ("model_dump_json", "model_dump", "model_validate", "__setattr__")),
)
_WATCHED_PACKAGES = ("harness", "reference")
# Modules watched whole (every function and class in them), and classes (every method, operator and property, their
# constructors too): the CUDA events and streams that time the calls, the arithmetic of the timings' statistics (math,
# statistics: replacing statistics.fmean would halve a reported time), the entropy of the timed calls' seeds
# (secrets), numpy, with which harness.spot_check checks the reference, and torch, which the input draws, the
# reference and the output checks call (replacing torch.Tensor.__matmul__ or torch.randn would change the reference or
# the inputs, for the solution's benefit). torch.manual_seed is left out: torch._dynamo wraps it when torch.compile is
# first used, and the harness never draws from torch's global generator.
_WATCHED_MODULES = (math, statistics, secrets, numpy, torch, torch.nn.functional)
_WATCHED_CLASSES = (torch.Tensor, torch.cuda.Event, torch.cuda.Stream)
_UNWATCHED = frozenset({"torch.manual_seed"})


def _function(member: object) -> object:
    """The Python function behind a member (a method's, a property's getter), or the member itself."""
    return getattr(member, "__func__", None) or getattr(member, "fget", None) or member


def _identity(member: object) -> tuple:
    """A member and its function's code and defaults: replacing the member, or its function's code in place, shows."""
    function = _function(member)
    return (member, *(getattr(function, name, None) for name in ("__code__", "__defaults__", "__kwdefaults__")))


def _member(owner: object, attribute: str) -> object:
    """What a module holds under a name, or what a class resolves it to without binding it (a class method read
    through getattr is a new object each time)."""
    return getattr_static(owner, attribute, None) if isinstance(owner, type) else getattr(owner, attribute, None)


def _restore(owner: object, attribute: str, identity: tuple) -> None:
    setattr(owner, attribute, identity[0])
    if identity[1] is not None:  # a Python function: its code and defaults too
        function = _function(identity[0])
        function.__code__, function.__defaults__, function.__kwdefaults__ = identity[1:]


def _methods(cls: type) -> dict[str, object]:
    """A class's own callable members (functions, static and class methods, properties), as its __dict__ holds them."""
    return {
        name: member
        for name, member in vars(cls).items()
        if isinstance(member, (staticmethod, classmethod, property)) or (callable(member) and not isinstance(member, type))
    }


def _whole_namespaces() -> list[tuple[object, tuple[str, ...]]]:
    """The names watched in _WATCHED_MODULES, CUPTI's binding where the launch audit loaded it, and _WATCHED_CLASSES,
    by owner."""
    audit = [module for module in (sys.modules.get("cupti.cupti"),) if module is not None]
    modules = [
        (module, tuple(n for n, v in vars(module).items() if callable(v) and f"{module.__name__}.{n}" not in _UNWATCHED))
        for module in (*_WATCHED_MODULES, *audit)
    ]
    classes = [(cls, tuple(n for n in dir(cls) if hasattr(getattr_static(cls, n), "__get__"))) for cls in _WATCHED_CLASSES]
    return [*modules, *classes]


def aten_kernels() -> dict[str, str]:
    """Every aten operator's kernels as torch's dispatcher lists them, each with where it was registered, less the Meta
    kernels (fake tensors only: torch.compile's tracing may register some as it goes)."""
    return {
        op: "\n".join(line for line in torch._C._dispatch_dump(op).splitlines() if not line.startswith("Meta"))
        for op in torch._C._dispatch_get_all_op_names()
        if op.startswith("aten::")
    }


def _registered_since(before: str, now: str) -> str:
    """The kernels listed in `now` and not in `before` ("CPU: registered at solution.py:12 ...")."""
    added = sorted(set(now.splitlines()) - set(before.splitlines()))
    return "; ".join(line.split(" :: ")[0] for line in added if "(inactive)" not in line) or "a kernel removed"


def patch_check(kernels: bool = False) -> Callable[[], list[str]]:
    """Snapshot the watched functions now, and return the check against the snapshot: the names of those replaced
    since (a builtin, a module's or a class's attribute, a function's code swapped in place, a method added to a class
    of the harness over an inherited one), each put back.

    With `kernels`, also the kernels torch's dispatcher holds for every aten operator (aten_kernels): a kernel
    registered over one of torch's (torch.library) changes the reference's arithmetic for every caller. Reported once
    and not put back (torch cannot unregister another's kernel); about 50 ms a look on one CPU core, so the backstop
    after each workload looks (the registration must last until the timed calls' outputs are checked), not every call.

    Take it before a solution is imported. The check holds what it uses in its closure, so a solution that replaces
    functions of the harness or Python's builtins, this module's included, cannot change what it does; code that
    reaches into the closure, walks the interpreter's frames, or replaces a function only while the harness calls it
    can, which is the limit of checks inside the solution's process (harness.isolation).
    """
    watched: dict[str, tuple[object, str, tuple]] = {}  # name -> (owner, attribute, identity)
    for owner, names in (*_WATCHED_ATTRIBUTES, *_whole_namespaces()):
        for name in names:
            if hasattr(owner, name):
                watched[f"{getattr(owner, '__name__', owner)}.{name}"] = (owner, name, _identity(_member(owner, name)))
    classes: dict[type, frozenset[str]] = {}
    for module_name, module in list(sys.modules.items()):
        if module is None or module_name.split(".")[0] not in _WATCHED_PACKAGES:
            continue
        for name, value in list(vars(module).items()):
            if callable(value) and not name.startswith("__"):
                watched[f"{module_name}.{name}"] = (module, name, _identity(value))
            if isinstance(value, type) and value.__module__ == module_name:
                methods = _methods(value)
                classes[value] = frozenset(methods)
                for attribute, member in methods.items():
                    watched[f"{module_name}.{name}.{attribute}"] = (value, attribute, _identity(member))
    member_of, identity, restore, methods_of = _member, _identity, _restore, _methods
    list_kernels, registered_since = aten_kernels, _registered_since
    dispatched = list_kernels() if kernels else {}

    builtin = vars(builtins)
    builtins_before = [(name, value) for name, value in builtin.items() if callable(value) and not name.startswith("_")]

    def replaced() -> list[str]:
        found = []
        for name, before in builtins_before:  # first, by identity and dict methods alone: what follows calls builtins
            if builtin.get(name) is not before:
                found.append(f"builtins.{name}")
                builtin[name] = before
        for name, (owner, attribute, before) in watched.items():
            now = identity(member_of(owner, attribute))
            if any(a is not b for a, b in zip(now, before)):
                found.append(name)
                restore(owner, attribute, before)
        for cls, names in classes.items():
            for added in sorted(methods_of(cls).keys() - names):
                found.append(f"{cls.__module__}.{cls.__qualname__}.{added} (added)")
                delattr(cls, added)
        if kernels:
            now = list_kernels()
            for op, listed in dispatched.items():
                if now.get(op, "") != listed:
                    found.append(f"{op}'s kernels ({registered_since(listed, now.get(op, ''))})")
                    dispatched[op] = now.get(op, "")
        return found

    return replaced


def threads_running_code_in(folder: Path) -> list[str]:
    """Threads (other than this one) with a frame of a file under `folder` on their stack.

    Checked right after a call returns: a solution's thread still executing its code then is finishing
    the work outside the timed window. Idle worker threads (torch.compile's, say) sit in library code.
    """
    prefix = str(folder.resolve()) + os.sep
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    running = []
    for ident, frame in sys._current_frames().items():
        if ident == threading.get_ident():
            continue
        while frame is not None:
            if frame.f_code.co_filename.startswith(prefix):
                running.append(names.get(ident, str(ident)))
                break
            frame = frame.f_back
    return running


@dataclass(frozen=True)
class Pristine:
    """The numeric settings as they were before a solution was imported, the check of the watched functions against
    that moment (patch_check), and the persisting-L2 set-aside, held as it was at that moment (None off CUDA)."""

    settings: dict[str, object]
    patched: Callable[[], list[str]]
    persisting_l2: PersistingL2 | None

    @classmethod
    def now(cls, device: torch.device) -> Pristine:
        return cls(numeric_settings(), patch_check(), PersistingL2.held_as_found(device))

    def changed_persisting_l2(self) -> str:
        """What the solution set the persisting-L2 set-aside to since (set back to the held value), or ""."""
        return self.persisting_l2.changed() if self.persisting_l2 else ""

    def reset_persisting_lines(self) -> None:
        if self.persisting_l2:
            self.persisting_l2.reset_lines()


def not_plain_tensors(outputs: Sequence[object]) -> list[str]:
    """Outputs that are tensor subclasses (which can compute lazily, on access) rather than torch.Tensor."""
    return [type(out).__name__ for out in outputs if isinstance(out, torch.Tensor) and type(out) is not torch.Tensor]
