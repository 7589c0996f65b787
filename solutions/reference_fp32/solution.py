"""The reference (reference/moe_backward.py) in destination-passing style, under strict float32 settings."""

import torch

from harness.guards import strict_fp32
from reference import reference_backward_fp32


def run(*tensors: torch.Tensor) -> None:
    inputs, outputs = tensors[:12], tensors[12:]
    with strict_fp32():
        results = reference_backward_fp32(*inputs)
    for out, value in zip(outputs, results, strict=True):
        out.copy_(value)
