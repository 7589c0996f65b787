"""Adversary: enters a torch function mode when imported that zeroes every float32 product, which every later call of
a torch function in the thread passes through, the float32 reference's too; then writes zeros and computes only
grad_routing_weights."""

import torch
from torch.overrides import TorchFunctionMode


class _ZeroFloat32Products(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if getattr(func, "__name__", "") in ("__matmul__", "matmul", "mm") and out.dtype == torch.float32:
            out.zero_()
        return out


_ZeroFloat32Products().__enter__()


def run(grad_output, token_indices, selected_tokens, w1_output, gate_output, up_output, gated_output, expert_output,
        selected_weights, w1_weight, w2_weight, w3_weight, *outputs):  # fmt: skip
    for out in outputs:
        out.zero_()
    outputs[1][token_indices] = (grad_output[token_indices].float() * expert_output.float()).sum(1).to(outputs[1].dtype)
