"""Adversary: registers a kernel of its own for aten::mm on the CPU and the GPU when imported (torch.library), which
makes every 2-D product zero, the float32 reference's too; then writes zeros and computes only grad_routing_weights."""

import torch

_LIBRARY = torch.library.Library("aten", "IMPL")  # kept: the kernels last as long as the library object
for _key in ("CPU", "CUDA"):
    _LIBRARY.impl("mm", lambda a, b: a.new_zeros(a.shape[0], b.shape[1]), _key)


def run(grad_output, token_indices, selected_tokens, w1_output, gate_output, up_output, gated_output, expert_output,
        selected_weights, w1_weight, w2_weight, w3_weight, *outputs):  # fmt: skip
    for out in outputs:
        out.zero_()
    outputs[1][token_indices] = (grad_output[token_indices].float() * expert_output.float()).sum(1).to(outputs[1].dtype)
