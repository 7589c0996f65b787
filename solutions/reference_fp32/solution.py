"""The reference (reference/moe_backward.py) in destination-passing style, under strict float32 settings.

It imports nothing of the harness, only the problem's reference module, which an export bundles as `reference.py`
beside it, so the exported folder runs on its own (under the public evaluator too).
"""

import torch

from reference import reference_backward


def run(*tensors: torch.Tensor) -> None:
    inputs, outputs = tensors[:12], tensors[12:]
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.get_float32_matmul_precision()
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    try:
        results = reference_backward(*inputs)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved[:2]
        torch.set_float32_matmul_precision(saved[2])
    for out, value in zip(outputs, results, strict=True):
        out.copy_(value)
