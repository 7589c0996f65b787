"""Adversary: replaces torch.Tensor.__matmul__ when imported so that every float32 product is zero, which zeroes four of
the float32 reference's outputs; then writes zeros there and computes only grad_routing_weights, which needs no
product."""

import torch

_matmul = torch.Tensor.__matmul__


def _zero_in_float32(a, b):
    product = _matmul(a, b)
    return product.zero_() if product.dtype == torch.float32 else product


torch.Tensor.__matmul__ = _zero_in_float32


def run(grad_output, token_indices, selected_tokens, w1_output, gate_output, up_output, gated_output, expert_output,
        selected_weights, w1_weight, w2_weight, w3_weight, *outputs):  # fmt: skip
    for out in outputs:
        out.zero_()
    outputs[1][token_indices] = (grad_output[token_indices].float() * expert_output.float()).sum(1).to(outputs[1].dtype)
