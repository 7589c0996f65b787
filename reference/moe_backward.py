"""Float32 reference of the MoE expert SwiGLU backward with weighted token scatter (SPEC section 1).

Every input is bf16 (or int64 indices) and upcast exactly to float32; all arithmetic is float32 with
TF32 disabled; the five outputs are rounded to bf16 once, at the end. The caller is responsible for
the backend flags (the harness runs this under `harness.guards.strict_fp32()`), so that this module
stays a plain transcription of the math.
"""

from __future__ import annotations

import torch


def reference_backward_fp32(
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
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The backward pass in float32; returns the five outputs unrounded (float32)."""
    f32 = torch.float32
    batch, _ = grad_output.shape
    x = selected_tokens.to(f32)
    a = w1_output.to(f32)
    up = up_output.to(f32)
    gate = gate_output.to(f32)
    weights = selected_weights.to(f32)

    g = grad_output.to(f32)[token_indices]
    grad_routing_t = (g * expert_output.to(f32)).sum(dim=1)
    grad_routing_weights = torch.zeros(batch, dtype=f32, device=g.device)
    grad_routing_weights[token_indices] = grad_routing_t

    ge = g * weights[:, None]
    grad_w2_weight = ge.t() @ gated_output.to(f32)
    dh = ge @ w2_weight.to(f32)
    d_gate = dh * up
    d_up = dh * gate
    s = torch.sigmoid(a)
    d_a = d_gate * s * (1 + a * (1 - s))
    grad_w1_weight = d_a.t() @ x
    grad_w3_weight = d_up.t() @ x
    dx = d_a @ w1_weight.to(f32) + d_up @ w3_weight.to(f32)
    grad_hidden_states = torch.zeros(batch, x.shape[1], dtype=f32, device=g.device)
    grad_hidden_states[token_indices] = dx
    return grad_hidden_states, grad_routing_weights, grad_w1_weight, grad_w2_weight, grad_w3_weight


def reference_backward(*inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The reference as the benchmark defines it: float32 math, outputs rounded to bf16 once."""
    return tuple(out.to(torch.bfloat16) for out in reference_backward_fp32(*inputs))
