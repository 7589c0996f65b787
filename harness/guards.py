"""What the harness does around every call of a solution so that a broken or cheating one cannot pass.

- Outputs are poisoned with NaN before every call: an element the solution does not write fails.
- Inputs are snapshotted before and compared bit for bit after: an in-place mutation fails. (A full
  copy is stronger than a checksum and the inputs are at most a few hundred MB.)
- An output that shares memory with an input fails.
- Process-wide numeric settings (TF32 flags, default dtype, ...) are recorded before and compared
  after: a solution that passes only by changing them (and thereby the reference) is caught.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch


def poison(outputs: Sequence[torch.Tensor]) -> None:
    for out in outputs:
        if out.is_floating_point():
            out.fill_(float("nan"))
        else:
            out.fill_(-1)


def snapshot(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: tensor.clone() for name, tensor in tensors.items()}


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    """Reinterpret as integers so that NaN payloads and -0.0 compare exactly."""
    if tensor.is_floating_point():
        return tensor.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[tensor.element_size()])
    return tensor


def mutated_inputs(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> list[str]:
    """Names of the inputs whose shape, dtype or bits differ from their snapshot."""
    changed = []
    for name, original in before.items():
        current = after[name]
        if (
            current.shape != original.shape
            or current.dtype != original.dtype
            or not torch.equal(_bits(current), _bits(original))
        ):
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


def numeric_settings() -> dict[str, object]:
    """Process-wide settings that change what a float32 matmul computes."""
    return {
        "torch.backends.cuda.matmul.allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        "torch.backends.cudnn.allow_tf32": torch.backends.cudnn.allow_tf32,
        "torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction": (
            torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction
        ),
        "torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction": (
            torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction
        ),
        "torch.get_float32_matmul_precision()": torch.get_float32_matmul_precision(),
        "torch.get_default_dtype()": torch.get_default_dtype(),
    }


def restore_numeric_settings(settings: dict[str, object]) -> None:
    torch.backends.cuda.matmul.allow_tf32 = settings["torch.backends.cuda.matmul.allow_tf32"]
    torch.backends.cudnn.allow_tf32 = settings["torch.backends.cudnn.allow_tf32"]
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = settings[
        "torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction"
    ]
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = settings[
        "torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction"
    ]
    torch.set_float32_matmul_precision(settings["torch.get_float32_matmul_precision()"])
    torch.set_default_dtype(settings["torch.get_default_dtype()"])


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


def changed_settings(before: dict[str, object]) -> list[str]:
    after = numeric_settings()
    return [name for name, value in before.items() if after[name] != value]
