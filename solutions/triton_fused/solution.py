"""Launcher of the fused Triton backward: buffers, the per-T-bucket tile plan, and the five launches.

Tile plans are chosen per bucket of T (not per exact T) and the kernels do not specialise on T or B, so
each bucket compiles once, on its first call, and never inside timed calls.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

from .kernels import dh_swiglu_kernel, dx_kernel, finalise_kernel, prologue_kernel, weight_grad_kernel


@dataclass(frozen=True)
class Tile:
    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int


@dataclass(frozen=True)
class Plan:
    dh: Tile
    weight_grad: Tile
    dx: Tile
    dx_split: int  # split-K factor of dx (upper bound; reduced until it divides F)


# (largest T of the bucket, plan); the last bucket takes every larger T.
PLANS: tuple[tuple[int, Plan], ...] = (
    (64, Plan(Tile(64, 128, 64, 4, 4), Tile(128, 128, 64, 8, 2), Tile(64, 128, 64, 4, 4), 4)),
    (128, Plan(Tile(64, 128, 64, 4, 4), Tile(128, 128, 64, 8, 2), Tile(64, 128, 64, 4, 4), 4)),
    (256, Plan(Tile(128, 128, 64, 8, 3), Tile(128, 128, 64, 8, 2), Tile(128, 128, 64, 8, 3), 4)),
    (512, Plan(Tile(128, 128, 64, 8, 3), Tile(128, 128, 64, 8, 3), Tile(128, 128, 64, 8, 3), 2)),
    (1 << 30, Plan(Tile(128, 256, 64, 8, 3), Tile(128, 128, 64, 8, 3), Tile(128, 256, 64, 8, 3), 1)),
)


def plan_for(num_tokens: int) -> Plan:
    return next(plan for limit, plan in PLANS if num_tokens <= limit)


def dx_split_for(plan: Plan, ffn_dim: int) -> int:
    """The largest split-K factor up to plan.dx_split whose slices are whole BLOCK_K steps."""
    return max(s for s in range(1, plan.dx_split + 1) if ffn_dim % (s * plan.dx.block_k) == 0)


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
    grad_hidden_states: torch.Tensor,
    grad_routing_weights: torch.Tensor,
    grad_w1_weight: torch.Tensor,
    grad_w2_weight: torch.Tensor,
    grad_w3_weight: torch.Tensor,
    plan: Plan | None = None,
    precise_dtype: torch.dtype = torch.float16,
) -> None:
    """The whole backward; `precise_dtype` holds d_a, d_up and x for the weight gradients (fp16 on the GPU)."""
    batch, hidden = grad_output.shape
    tokens = token_indices.numel()
    ffn = w1_weight.shape[0]
    plan = plan or plan_for(tokens)
    if hidden % plan.dh.block_k or ffn % plan.weight_grad.block_m or ffn % plan.dx.block_k:
        raise ValueError(f"hidden_dim {hidden} and ffn_dim {ffn} must be multiples of the tile sizes of {plan}")
    device, operand_dtype = grad_output.device, grad_output.dtype
    split = dx_split_for(plan, ffn)

    g = torch.empty(tokens, hidden, device=device, dtype=operand_dtype)
    ge = torch.empty_like(g)
    x_precise = torch.empty(tokens, hidden, device=device, dtype=precise_dtype)
    grad_routing_t = torch.empty(tokens, device=device, dtype=torch.float32)
    dd_precise = torch.empty(tokens, 2 * ffn, device=device, dtype=precise_dtype)
    dd_operand = torch.empty(tokens, 2 * ffn, device=device, dtype=operand_dtype)
    partials = torch.empty(split, tokens, hidden, device=device, dtype=torch.float32)

    prologue_kernel[(tokens,)](
        grad_output, token_indices, selected_tokens, expert_output, selected_weights,
        g, ge, x_precise, grad_routing_t, tokens, hidden, BLOCK_H=1024 if hidden >= 1024 else triton.next_power_of_2(hidden),
    )  # fmt: skip

    t = plan.dh
    dh_swiglu_kernel[(triton.cdiv(tokens, t.block_m) * triton.cdiv(ffn, t.block_n),)](
        g, w2_weight, selected_weights, w1_output, up_output, gate_output, dd_precise, dd_operand,
        tokens, hidden, ffn,
        BLOCK_M=t.block_m, BLOCK_N=t.block_n, BLOCK_K=t.block_k, num_warps=t.num_warps, num_stages=t.num_stages,
    )  # fmt: skip

    t = plan.weight_grad
    for a, m, b, n, top, bottom, m_top in (
        (ge, hidden, gated_output, ffn, grad_w2_weight, grad_w2_weight, hidden),
        (dd_precise, 2 * ffn, x_precise, hidden, grad_w1_weight, grad_w3_weight, ffn),
    ):
        weight_grad_kernel[(triton.cdiv(m, t.block_m) * triton.cdiv(n, t.block_n),)](
            a, b, top, bottom, tokens, m, n, m_top,
            BLOCK_M=t.block_m, BLOCK_N=t.block_n, BLOCK_K=t.block_k, num_warps=t.num_warps, num_stages=t.num_stages,
        )  # fmt: skip

    t = plan.dx
    dx_kernel[(triton.cdiv(tokens, t.block_m) * triton.cdiv(hidden, t.block_n), split)](
        dd_operand, w1_weight, w3_weight, partials, tokens, hidden, ffn, ffn // split,
        BLOCK_M=t.block_m, BLOCK_N=t.block_n, BLOCK_K=t.block_k, num_warps=t.num_warps, num_stages=t.num_stages,
    )  # fmt: skip

    finalise_kernel[(batch,)](
        token_indices, partials, grad_routing_t, grad_hidden_states, grad_routing_weights,
        tokens, batch, hidden, tokens.bit_length(),
        SPLIT_K=split, BLOCK_H=1024 if hidden >= 1024 else triton.next_power_of_2(hidden),
    )  # fmt: skip


def run(*tensors: torch.Tensor) -> None:
    backward(*tensors)


def compiled_variants() -> int:
    """How many compiled binaries the five kernels hold (Triton's per-device caches): a test uses it to prove
    that a bucket compiles once and that later calls in the bucket compile nothing."""
    kernels = (prologue_kernel, dh_swiglu_kernel, weight_grad_kernel, dx_kernel, finalise_kernel)
    return sum(len(caches[0]) for kernel in kernels for caches in kernel.device_caches.values())
