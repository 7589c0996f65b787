"""torch.compile of the backward written plainly; inductor fuses the elementwise work around cuBLAS GEMMs.

Compiled with dynamic shapes, so the workloads' different T and B reuse one graph instead of compiling
sixteen; the first calls (the harness's correctness trials) pay the compilation. `run_max_autotune` is the
entry point of the torch_compile_max_autotune peer: the same backward with inductor's max-autotune GEMM
templates (Triton matmuls benchmarked against cuBLAS at compile time, at the first call's sizes), without CUDA
graphs, which the harness's fresh addresses per call would defeat.
"""

import torch


def backward(
    grad_output: torch.Tensor,
    token_indices: torch.Tensor,
    selected_tokens: torch.Tensor,
    w1_output: torch.Tensor,
    gate_output: torch.Tensor,
    up_output: torch.Tensor,
    gated_output: torch.Tensor,
    expert_output: torch.Tensor,
    selected_weights: torch.Tensor,
    w1_weight: torch.Tensor,
    w2_weight: torch.Tensor,
    w3_weight: torch.Tensor,
) -> tuple[torch.Tensor, ...]:
    g = grad_output[token_indices]
    weights = selected_weights.float()[:, None]
    grad_routing_t = (g.float() * expert_output.float()).sum(dim=1)
    ge = (g.float() * weights).to(torch.bfloat16)
    grad_w2 = ge.t() @ gated_output
    dh = (g @ w2_weight).float() * weights
    a = w1_output.float()
    s = torch.sigmoid(a)
    d_a = dh * up_output.float() * s * (1 + a * (1 - s))
    d_up = dh * gate_output.float()
    x16 = selected_tokens.to(torch.float16)
    grad_w1 = (d_a.to(torch.float16).t() @ x16).to(torch.bfloat16)
    grad_w3 = (d_up.to(torch.float16).t() @ x16).to(torch.bfloat16)
    dx = d_a.to(torch.bfloat16) @ w1_weight + d_up.to(torch.bfloat16) @ w3_weight
    grad_hidden = torch.zeros_like(grad_output).index_copy(0, token_indices, dx)
    grad_routing = torch.zeros(grad_output.shape[0], dtype=torch.bfloat16, device=grad_output.device)
    grad_routing = grad_routing.index_copy(0, token_indices, grad_routing_t.to(torch.bfloat16))
    return grad_hidden, grad_routing, grad_w1, grad_w2, grad_w3


run = torch.compile(backward, dynamic=True)
run_max_autotune = torch.compile(backward, dynamic=True, mode="max-autotune-no-cudagraphs")
