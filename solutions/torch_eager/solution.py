"""Eager PyTorch, bf16 GEMMs: the straightforward implementation, numerically too coarse for large T."""

import torch


def run(
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
    grad_hidden_states: torch.Tensor,
    grad_routing_weights: torch.Tensor,
    grad_w1_weight: torch.Tensor,
    grad_w2_weight: torch.Tensor,
    grad_w3_weight: torch.Tensor,
) -> None:
    g = grad_output.index_select(0, token_indices)
    grad_routing = (g.float() * expert_output.float()).sum(dim=1)
    ge = g * selected_weights[:, None]

    torch.mm(ge.t(), gated_output, out=grad_w2_weight)
    dh = (ge @ w2_weight).float()
    a = w1_output.float()
    s = torch.sigmoid(a)
    d_a = (dh * up_output.float() * s * (1 + a * (1 - s))).to(torch.bfloat16)
    d_up = (dh * gate_output.float()).to(torch.bfloat16)
    torch.mm(d_a.t(), selected_tokens, out=grad_w1_weight)
    torch.mm(d_up.t(), selected_tokens, out=grad_w3_weight)
    dx = torch.addmm(d_a @ w1_weight, d_up, w3_weight)

    grad_hidden_states.zero_()
    grad_hidden_states.index_copy_(0, token_indices, dx)
    grad_routing_weights.zero_()
    grad_routing_weights.index_copy_(0, token_indices, grad_routing.to(torch.bfloat16))
