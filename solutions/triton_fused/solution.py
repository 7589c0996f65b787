"""Launcher of the fused Triton backward: buffers, the per-T-bucket tile plan, and the five launches.

Tile plans are chosen per bucket of T (not per exact T) and the kernels do not specialise on T or B, so
each bucket compiles once, on its first call, and never inside timed calls.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

from harness.problem import INPUT_NAMES, OUTPUT_NAMES

from .kernels import dh_swiglu_kernel, dx_kernel, finalise_kernel, prologue_kernel, weight_grad_kernel


@dataclass(frozen=True)
class Tile:
    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    epilogue_split: int = 1  # dh_swiglu only: column chunks of its epilogue


@dataclass(frozen=True)
class Plan:
    dh: Tile
    grad_w2: Tile
    grad_w13: Tile
    dx: Tile
    dx_split: int  # split-K factor of dx (upper bound; reduced until it divides F)
    overlap_grad_w2: bool = False  # run grad_w2 on a second stream, beside dh_swiglu and grad_w13


# (largest T of the bucket, plan); the last bucket takes every larger T. Tiles from the sweeps of
# benchmarks/sweep_triton_fused.py on the H200 (docs/performance.md); the side stream for grad_w2 pays only
# where the GPU is memory-bound (T <= 128: 258 -> 243 us at T = 64) and costs above T = 256.
PLANS: tuple[tuple[int, Plan], ...] = (
    (64, Plan(Tile(64, 64, 64, 4, 4), Tile(128, 128, 32, 4, 3), Tile(128, 128, 32, 4, 3), Tile(64, 128, 64, 4, 4), 4, True)),
    (128, Plan(Tile(64, 128, 64, 4, 4, 2), Tile(128, 128, 32, 4, 3), Tile(128, 128, 32, 4, 3), Tile(128, 256, 64, 8, 3), 8, True)),
    (256, Plan(Tile(128, 256, 64, 8, 3, 2), Tile(128, 128, 32, 4, 4), Tile(128, 128, 32, 4, 3), Tile(128, 256, 64, 8, 3), 4)),
    (512, Plan(Tile(128, 256, 64, 8, 3, 2), Tile(128, 128, 32, 4, 3), Tile(128, 256, 64, 8, 3), Tile(128, 256, 64, 8, 3), 2)),
    (1 << 30, Plan(Tile(128, 256, 64, 8, 3, 2), Tile(128, 256, 64, 8, 3), Tile(128, 256, 64, 8, 3), Tile(128, 256, 64, 8, 3), 1)),
)


def plan_for(num_tokens: int) -> Plan:
    return next(plan for limit, plan in PLANS if num_tokens <= limit)


def dx_split_for(plan: Plan, ffn_dim: int) -> int:
    """The largest split-K factor up to plan.dx_split whose slices are whole BLOCK_K steps."""
    return max(s for s in range(1, plan.dx_split + 1) if ffn_dim % (s * plan.dx.block_k) == 0)


@dataclass
class Problem:
    """The 12 inputs and 5 outputs of one call, with the intermediate buffers the stages pass along."""

    inputs: dict[str, torch.Tensor]
    outputs: dict[str, torch.Tensor]
    precise_dtype: torch.dtype
    dx_split: int

    def __post_init__(self) -> None:
        batch, hidden = self.inputs["grad_output"].shape
        self.batch, self.hidden = batch, hidden
        self.tokens = self.inputs["token_indices"].numel()
        self.ffn = self.inputs["w1_weight"].shape[0]
        device, operand = self.inputs["grad_output"].device, self.inputs["grad_output"].dtype
        self.g = torch.empty(self.tokens, hidden, device=device, dtype=operand)
        self.ge = torch.empty_like(self.g)
        self.x_precise = torch.empty(self.tokens, hidden, device=device, dtype=self.precise_dtype)
        self.grad_routing_t = torch.empty(self.tokens, device=device, dtype=torch.float32)
        self.dd = torch.empty(self.tokens, 2 * self.ffn, device=device, dtype=self.precise_dtype)
        self.partials = torch.empty(self.dx_split, self.tokens, hidden, device=device, dtype=torch.float32)

    @property
    def row_block(self) -> int:
        return min(1024, triton.next_power_of_2(self.hidden))


def prologue(p: Problem) -> None:
    i = p.inputs
    prologue_kernel[(p.tokens,)](
        i["grad_output"], i["token_indices"], i["selected_tokens"], i["expert_output"], i["selected_weights"],
        p.g, p.ge, p.x_precise, p.grad_routing_t, p.tokens, p.hidden, BLOCK_H=p.row_block,
    )  # fmt: skip


def dh_swiglu(p: Problem, t: Tile) -> None:
    i = p.inputs
    dh_swiglu_kernel[(triton.cdiv(p.tokens, t.block_m) * triton.cdiv(p.ffn, t.block_n),)](
        p.g, i["w2_weight"], i["selected_weights"], i["w1_output"], i["up_output"], i["gate_output"],
        p.dd, p.tokens, p.hidden, p.ffn,
        BLOCK_M=t.block_m, BLOCK_N=t.block_n, BLOCK_K=t.block_k, EPILOGUE_SPLIT=t.epilogue_split,
        num_warps=t.num_warps, num_stages=t.num_stages,
    )  # fmt: skip


def _weight_grad(p: Problem, t: Tile, a, m: int, b, n: int, top, bottom, m_top: int) -> None:
    weight_grad_kernel[(triton.cdiv(m, t.block_m) * triton.cdiv(n, t.block_n),)](
        a, b, top, bottom, p.tokens, m, n, m_top,
        BLOCK_M=t.block_m, BLOCK_N=t.block_n, BLOCK_K=t.block_k, num_warps=t.num_warps, num_stages=t.num_stages,
    )  # fmt: skip


def grad_w2(p: Problem, t: Tile) -> None:
    out = p.outputs["grad_w2_weight"]
    _weight_grad(p, t, p.ge, p.hidden, p.inputs["gated_output"], p.ffn, out, out, p.hidden)


def grad_w13(p: Problem, t: Tile) -> None:
    o = p.outputs
    _weight_grad(p, t, p.dd, 2 * p.ffn, p.x_precise, p.hidden, o["grad_w1_weight"], o["grad_w3_weight"], p.ffn)


def dx(p: Problem, t: Tile) -> None:
    i = p.inputs
    dx_kernel[(triton.cdiv(p.tokens, t.block_m) * triton.cdiv(p.hidden, t.block_n), p.dx_split)](
        p.dd, i["w1_weight"], i["w3_weight"], p.partials, p.tokens, p.hidden, p.ffn, p.ffn // p.dx_split,
        BLOCK_M=t.block_m, BLOCK_N=t.block_n, BLOCK_K=t.block_k, num_warps=t.num_warps, num_stages=t.num_stages,
    )  # fmt: skip


def finalise(p: Problem) -> None:
    o = p.outputs
    finalise_kernel[(p.batch,)](
        p.inputs["token_indices"], p.partials, p.grad_routing_t, o["grad_hidden_states"], o["grad_routing_weights"],
        p.tokens, p.batch, p.hidden, p.tokens.bit_length(), SPLIT_K=p.dx_split, BLOCK_H=p.row_block,
    )  # fmt: skip


def backward(*tensors: torch.Tensor, plan: Plan | None = None, precise_dtype: torch.dtype = torch.float16) -> None:
    """The whole backward on the 12 inputs and 5 outputs of harness.problem, in that order.

    `precise_dtype` holds d_a, d_up and x for the weight gradients (fp16 on the GPU; the CPU tests use fp32).
    """
    inputs = dict(zip(INPUT_NAMES, tensors[:12]))
    outputs = dict(zip(OUTPUT_NAMES, tensors[12:]))
    hidden, ffn = inputs["grad_output"].shape[1], inputs["w1_weight"].shape[0]
    plan = plan or plan_for(inputs["token_indices"].numel())
    if hidden % plan.dh.block_k or ffn % plan.grad_w13.block_m or ffn % plan.dx.block_k:
        raise ValueError(f"hidden_dim {hidden} and ffn_dim {ffn} must be multiples of the tile sizes of {plan}")
    p = Problem(inputs, outputs, precise_dtype, dx_split_for(plan, ffn))
    prologue(p)
    if plan.overlap_grad_w2 and p.g.is_cuda:
        # grad_w2 needs only the prologue's ge. The main stream waits for the side stream before returning,
        # so every buffer outlives its use there and the caller's stream sees all of the work.
        main, side = torch.cuda.current_stream(), _side_stream(p.g.device)
        side.wait_stream(main)
        with torch.cuda.stream(side):
            grad_w2(p, plan.grad_w2)
        dh_swiglu(p, plan.dh)
        grad_w13(p, plan.grad_w13)
        dx(p, plan.dx)
        finalise(p)
        main.wait_stream(side)
        return
    dh_swiglu(p, plan.dh)
    grad_w2(p, plan.grad_w2)
    grad_w13(p, plan.grad_w13)
    dx(p, plan.dx)
    finalise(p)


_SIDE_STREAMS: dict[torch.device, torch.cuda.Stream] = {}


def _side_stream(device: torch.device) -> torch.cuda.Stream:
    if device not in _SIDE_STREAMS:
        _SIDE_STREAMS[device] = torch.cuda.Stream(device)
    return _SIDE_STREAMS[device]


def run(*tensors: torch.Tensor) -> None:
    backward(*tensors)


def compiled_variants() -> int:
    """How many compiled binaries the five kernels hold (Triton's per-device caches): a test uses it to prove
    that a bucket compiles once and that later calls in the bucket compile nothing."""
    kernels = (prologue_kernel, dh_swiglu_kernel, weight_grad_kernel, dx_kernel, finalise_kernel)
    return sum(len(caches[0]) for kernel in kernels for caches in kernel.device_caches.values())
