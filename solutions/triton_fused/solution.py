"""Launcher of the fused Triton backward: buffers, tensor descriptors, the per-T-bucket tile plan, and the
launches of kernels.py (and, where the plan says, of the warp-specialised Gluon kernels: dh in dh_warp_specialized.py
from T = 257, dx in dx_swap_ab.py at 128 < T <= 224 and 256 < T <= 384 and in dx_warp_specialized.py at
224 < T <= 256, dx with grad_w1/grad_w3 in dx_grad_weight_warp_specialized.py at 64 < T <= 128, and the weight
gradients in weight_grad_warp_specialized.py: grad_w2 from T = 65, grad_w1/grad_w3 from T = 129).

Tile plans are chosen per bucket of T (not per exact T) and the kernels do not specialise on T or B, so
each bucket compiles once, on its first call, and never inside timed calls. The folder is self-contained:
it needs torch and triton only, so an exported copy runs without this repository.
"""

from __future__ import annotations

import collections
import contextlib
import functools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal, get_args

import torch
import triton
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonTensorDescriptor
from triton.tools.tensor_descriptor import TensorDescriptor

from .dh_warp_specialized import dh_swiglu_ws_kernel
from .dx_grad_weight_warp_specialized import dx_grad_weight_ws_kernel
from .dx_swap_ab import dx_swap_ab_kernel
from .dx_warp_specialized import dx_ws_kernel
from .kernels import (
    dh_swiglu_kernel,
    dx_kernel,
    gather_kernel,
    routing_x16_kernel,
    scatter_kernel,
    weight_grad_kernel,
    zero_unselected_kernel,
)
from .launch import CallProgram
from .weight_grad_warp_specialized import weight_grad_ws_kernel

# The destination-passing calling convention of the problem: 12 inputs, then 5 outputs, in this order.
INPUT_NAMES = (
    "grad_output", "token_indices", "selected_tokens", "w1_output", "gate_output", "up_output", "gated_output",
    "expert_output", "selected_weights", "w1_weight", "w2_weight", "w3_weight",
)  # fmt: skip
OUTPUT_NAMES = ("grad_hidden_states", "grad_routing_weights", "grad_w1_weight", "grad_w2_weight", "grad_w3_weight")

ROW_BLOCK_H = 512  # columns per program of the per-token kernels (gather, routing_x16, scatter): 8 per token at H = 4096
# Rows of the (T, .) intermediates (g, ge, x16, dd) are padded with zeros to a multiple of this: a multiple of every
# tile's block_m and block_k, so that no GEMM operand block of them reaches past their end (weight_grad_kernel).
ROW_PAD = 128
ZERO_BLOCK_H = 1024  # columns per program of zero_unselected: 4 per gap between selected rows at H = 4096
WS_BLOCK_M = 128  # rows of the warp-specialised dh's and weight gradient's tiles (two warpgroups of 64-row wgmma)
WS_BLOCK_N = 256  # columns of the warp-specialised weight gradient's tile (the dh's: WarpSpecializedDh.block_n)
WS_BLOCK_K = 64  # the warp-specialised weight gradient's whole K step (tokens)
# Its short last K step: where at most this many tokens are left after the whole steps, they are a step of this many
# rows rather than of 64 (a step of 16 rows, where at most 16 are left, was slower than one of 32 in every A/B of v25).
WS_SHORT_STEP = 32
WS_STORE_WIDTH = 64  # columns per TMA store of the warp-specialised weight gradient
# Tile-claim counters per call (Problem.counters): grad_w2 and up to two launches of grad_w1/grad_w3 (one per weight
# where F is not a multiple of the tile's rows)
TILE_COUNTERS = 3
WS_RESIDENT_STEPS = 4  # K steps of B's resident slab (WarpSpecializedWeightGrad.b_resident): 128 KB at 256 columns
SWAP_AB_BLOCK_H = 128  # hidden columns per program of the swap-AB dx (two warpgroups of 64-column wgmma)
# dx with grad_w1/grad_w3 in one pass (dx_grad_weight_warp_specialized.py): all the tokens (T <= 128) by 128 hidden
# columns per program, K steps of 64 of the 2F columns; each product warpgroup stores 64 of a gradient block's columns.
FUSED_BLOCK_M = 128
FUSED_BLOCK_N = 128
FUSED_BLOCK_K = 64
# Registers per thread of the warp-specialised weight gradient's second product warpgroup (Triton's compiler then
# gives the first 248 and the loader warp 24: the 12 warps' share of an SM's 64K registers).
PRODUCT_REGS = 232


@dataclass(frozen=True)
class Tile:
    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    epilogue_split: int = 1  # column pieces of the epilogue: 1, 2 or 4 for dh_swiglu, 1 or 2 for weight_grad
    programs_per_sm: int = 0  # dh_swiglu and weight_grad: persistent grid of this many programs per SM; 0 = one per tile
    flatten: bool = False  # with a persistent grid: pipeline the loads of the next tile under this tile's epilogue
    group_m: int = 1  # weight_grad: rows of tiles per group of its tile order (0: all rows, row tile fastest)


@dataclass(frozen=True)
class WarpSpecializedDh:
    """The Gluon dh's configuration (tiles of 128 tokens x block_n ffn columns, 8 product warps; dh_warp_specialized.py)."""

    block_k: int  # hidden columns per operand stage
    stages: int  # operand stages in shared memory
    act_width: int  # ffn columns per epilogue piece
    act_buffers: int  # epilogue pieces whose activations are in flight
    block_n: int = 256  # ffn columns per tile: 128 gives twice the tiles, so the busiest program is nearer the average
    # As few programs as keep the busiest one's tile count (tiles / SMs, rounded up) rather than one per SM: the
    # makespan is the same, and the SMs left free run the side stream's kernels from the start rather than only
    # once the programs with fewer tiles end.
    fewest_programs: bool = False


@dataclass(frozen=True)
class WarpSpecializedWeightGrad:
    """The Gluon weight gradient's configuration, for grad_w1/grad_w3 or grad_w2 (tiles of 128 output rows x 256
    columns, two product warpgroups of 64 rows taking turns at the tensor cores, K steps of 64 tokens;
    weight_grad_warp_specialized.py)."""

    stages: int  # operand stages in shared memory
    # The tiles column by column (else row by row): for grad_w2 from T = 257 a wave of tiles then shares a few
    # column slabs of gated_output, as Triton's kernel in _WGRAD_WIDE_BY_COLUMN.
    by_column: bool = False
    # B's column slab (T x 256) resident in shared memory, loaded once per column of tiles that a program's contiguous
    # run of tiles reaches, so that a tile reads only A's block from L2 (at most WS_RESIDENT_STEPS K steps: T <= 256;
    # grad_w1/grad_w3 alone at T = 196-256 -7.0 to -7.7 us, grad_w2 +1.5 to +3.0: docs/performance.md, v23).
    b_resident: bool = False
    # The tiles claimed one at a time from a counter in memory, in the same order, by each program's loader as it is
    # ready for the next, rather than dealt out in advance (not with b_resident): programs that start late, on SMs that
    # the stage before frees last, take fewer tiles, and the stage ends at about one time on every SM.
    dynamic: bool = False
    # Persistent programs: 0 = one per SM; fewer leave SMs to a kernel on the other stream that is issued after it
    # but should start beside it (the tiles claimed one by one, so that the programs share them as they free up).
    programs: int = 0


@dataclass(frozen=True)
class SwapAbDx:
    """The swap-AB Gluon dx's configuration (dx_swap_ab.py): programs of 128 hidden columns by a block of tokens in up
    to three accumulators of these widths (powers of two from 8 to 256), K steps of 64 of the 2F columns. T pays for
    padding to the block (sum of the widths) rather than to 128-row tiles."""

    chunks: tuple[int, ...]  # the token block's accumulator widths
    stages: int  # operand stages in shared memory

    @property
    def block_tokens(self) -> int:
        return sum(self.chunks)


@dataclass(frozen=True)
class WarpSpecializedDxGradW13:
    """The Gluon kernel of dx and grad_w1/grad_w3 in one pass over the weights (dx_grad_weight_warp_specialized.py):
    programs of all T <= FUSED_BLOCK_M tokens by FUSED_BLOCK_N hidden columns, K steps of FUSED_BLOCK_K."""

    stages: int  # operand stages in shared memory


X16At = Literal["start", "after_gather", "after_dh"]
ZerosAt = Literal["start", "after_grad_w2", "after_dh", "after_dx", "last"]


@dataclass(frozen=True)
class Plan:
    dh: Tile
    grad_w2: Tile
    grad_w13: Tile  # grad_w1 and grad_w3 (one launch of M = 2F rows where F allows, see grad_w13)
    dx: Tile
    dx_split: int  # split-K factor of each of dx's two launches (upper bound; reduced until it divides F)
    # Which stages run on the second ("side") stream; the rest run on the caller's stream, in the order grad_w2, dh,
    # dx's halves, grad_w1/grad_w3, scatter. Stages on different streams share the SMs; which one starts first
    # decides how.
    grad_w2_on_side: bool = True  # beside dh_swiglu
    # dx's two launches (the w1 half, the w3 half): on the side stream beside grad_w1/grad_w3, or on the caller's
    # stream right behind dh (a half there runs ahead of grad_w1/grad_w3 unless grad_w13_on_side)
    dx_on_side: tuple[bool, bool] = (True, True)
    grad_w13_on_side: bool = False  # behind grad_w2 (and any dx half, and scatter if there too) on the side stream
    # scatter on the side stream as soon as all of dx is done, beside grad_w1/grad_w3 (ahead of them if they are on
    # the side stream too), instead of last on the caller's stream. Where dx ends last, the call ends some us later
    # when its last kernel runs on the side stream (T = 128-336: +3 to +6 us).
    scatter_on_side: bool = False
    # scatter on the caller's stream right behind dx (both halves there), once x16's routing sums are written, instead
    # of last: beside grad_w1/grad_w3 on the side stream, where those end the call.
    scatter_after_dx: bool = False
    # dh loads its rows of grad_output itself, and the gather, which then writes ge only, runs first on the side
    # stream: no kernel stands between the call's start and dh. Its pointer loads are slower than TMA (dh alone +2 us
    # at T = 64, +5 at 256, +9 at 512, +46 at 2048), so this pays only where the gather's 5-7 us weigh more.
    dh_gathers_rows: bool = False
    # dh as the warp-specialised Gluon kernel, its epilogue under the next tile's products (GPU only; needs the
    # gathered copy of g, so not with dh_gathers_rows). Pays where a program has several tiles (docs/performance.md,
    # v12 and v18); `dh` is then unused.
    dh_warp_specialized: WarpSpecializedDh | None = None
    # The Gluon dh launched as a programmatic dependent of the gather right before it on the caller's stream: its
    # programs are launched once the gather's last programs have started, and its loader waits for the gather's end
    # before reading g. grad_w2, released on the side stream by that end, then finds the SMs taken (without it grad_w2
    # took them first in 5 of 15 profiled calls at T = 296-496, +6 to +22 us each: v18).
    dh_programmatic_launch: bool = False
    # dx as the warp-specialised Gluon kernel, one launch over K = 2F that reads the fp16 dd and rounds it to bf16 in
    # registers (GPU only; `dx` gives its tile, whose block_k divides each split of F into whole steps): dh then
    # writes no bf16 copy of dd (docs/performance.md, v15). Not with the Gluon dh, which always writes that copy.
    dx_warp_specialized: bool = False
    # dx as the swap-AB Gluon kernel over the bf16 copy of dd (GPU only; `dx` gives its split's K step): the tokens on
    # wgmma's N side, so T is padded to the chunks' widths rather than to 128-row tiles, and the weights' block serves
    # every token of a program's block (docs/performance.md, v22). Not with dx_warp_specialized.
    dx_swap_ab: SwapAbDx | None = None
    # grad_w1/grad_w3 as the warp-specialised Gluon kernel, whose last K step may be short (GPU only; `grad_w13` is then
    # unused): a T a few tokens past a multiple of 64 pays for those tokens rather than for a whole step.
    grad_w13_warp_specialized: WarpSpecializedWeightGrad | None = None
    # grad_w2 by the same Gluon kernel (`grad_w2` is then unused): its last step, short or whole, reads the rows of
    # gated_output that end at row T, against ge's last block as the gather shifts it for that step's rows.
    grad_w2_warp_specialized: WarpSpecializedWeightGrad | None = None
    # dx and grad_w1/grad_w3 by one Gluon kernel that reads each block of w1 and w3 and writes the same block of its
    # gradient (GPU only; T <= FUSED_BLOCK_M, on the caller's stream after dh; dx_split is then the split of each
    # weight's F): `dx`, `grad_w13`, `dx_on_side`, `grad_w13_on_side` and `scatter_on_side` are unused, dh writes no
    # bf16 copy of dd, and scatter runs last on the caller's stream.
    dx_grad_w13: WarpSpecializedDxGradW13 | None = None
    # Where routing_x16 (x16 and the routing sums, which grad_w1/grad_w3 and scatter read) runs on the side stream.
    # "start": first, beside dh. "after_gather": once the gather is done, ahead of grad_w2; with the Gluon dh launched
    # as a programmatic dependent of the gather, dh's programs hold their SMs by then, and x16 runs on those that dh's
    # fewest_programs grid leaves free (T = 2048: dh starts at 20 us instead of 41). "after_dh": once dh is done, so
    # that nothing delays dh (from T = 257, where only the gather runs ahead of it).
    x16_at: X16At = "start"
    # dx as one launch over both halves of K = 2F that stores each tile into the selected rows of grad_hidden_states
    # (Triton's kernel, split or not, or the warp-specialised Gluon kernel, whose programs each take one half: the last
    # of a tile's programs adds their partials): no scatter at the end of the call, whose routing weights are finished
    # right behind routing_x16 instead. Both halves on one stream.
    dx_writes_rows: bool = False
    # Where zero_unselected (the rows and routing entries no token selects, which only the end of the call needs) runs:
    # on the side stream "start", "after_grad_w2", "after_dh" (ahead of x16 when that is after dh too), or "last",
    # after everything else there (not with scatter_on_side, which must follow it); or "after_dx", on the caller's
    # stream right behind dx (both halves there) and scatter_after_dx's scatter, out of the side stream's way.
    zeros_at: ZerosAt = "start"

    @property
    def uses_side_stream(self) -> bool:
        return self.grad_w2_on_side or any(self.dx_on_side) or self.grad_w13_on_side or self.scatter_on_side

    def on_one_stream(self) -> Plan:
        """The same tiles with every stage on the caller's stream (the sweeps' and tests' point of comparison)."""
        return replace(
            self, grad_w2_on_side=False, dx_on_side=(False, False), grad_w13_on_side=False, scatter_on_side=False
        )


# (largest T of the bucket, plan); the last bucket takes every larger T. Tiles from the sweeps of
# benchmarks/sweep_triton_fused.py on the H200 (docs/performance.md). Every bucket uses the side stream: grad_w2
# fills the SMs that dh leaves idle (56-112 tiles on 132 SMs at T <= 256), and dx, bound by reading the
# weights, runs beside grad_w1/grad_w3, bound by writing theirs (T = 336: 530 -> 502 us). Up to T = 256 dh gathers
# its own rows (same-process A/B, flag on against off: T = 64 -2.6 to -3.8 us, 128 -5.5 to -6.5, 196-215 -1.5 to
# -3.3, 256 -1.9 to +0.6; with Triton's dh at 296-336 -2.7 to -7.2, at 512 -2.1 to +4.1, at 2048 +46).
_DX_WIDE = Tile(128, 256, 64, 8, 4)
_WGRAD_SMALL = Tile(128, 128, 64, 4, 4, 1, 1, True)
# Two co-resident programs per SM, each storing in halves (3 stages fit twice in shared memory): one program's
# stores overlap the other's loads and products (T = 128: 269 -> 256 us with both weight gradients so; grad_w2's tile
# at 64 < T <= 256).
_WGRAD_PAIR = Tile(128, 128, 64, 4, 3, 2, 2, True)
_WGRAD_WIDE = Tile(128, 256, 64, 8, 4, 2, 1, True)
# grad_w1/grad_w3 one program per SM and dx in 128x128 tiles of 3 stages: one program of each fits an SM beside the
# other (115 + 98 KB of shared memory), so on every SM dx's products run under grad_w1/grad_w3's stores
# (T = 128: 253 -> 250 us; either tile alone is 7-9 us slower, and at T = 64 or from T = 196 the pair is slower).
_WGRAD_BESIDE_DX = Tile(128, 128, 64, 4, 3, 2, 1, True)
_DX_BESIDE_WGRAD = Tile(128, 128, 64, 4, 3)
# grad_w2 column by column of tiles: a wave of tiles then shares a few column slabs of gated_output (T x F, 58 MB
# at T = 2048, more than L2) and re-reads ge (T x H, 16 MB), which stays in L2 (T = 2048: 364 -> 314 us).
_WGRAD_WIDE_BY_COLUMN = Tile(128, 256, 64, 8, 4, 2, 1, True, group_m=0)
# The plans that the buckets of 128 < T <= 256 and 256 < T <= 1024 vary (their comments in PLANS).
_PLAN_256 = Plan(Tile(128, 256, 64, 8, 4, 4), _WGRAD_PAIR, _WGRAD_WIDE, _DX_WIDE, 2, dh_gathers_rows=True,
                 zeros_at="after_grad_w2", dx_warp_specialized=True,
                 grad_w13_warp_specialized=WarpSpecializedWeightGrad(4, b_resident=True),
                 grad_w2_warp_specialized=WarpSpecializedWeightGrad(4, dynamic=True))  # fmt: skip
_PLAN_512 = Plan(Tile(128, 256, 64, 8, 4, 4), _WGRAD_WIDE_BY_COLUMN, _WGRAD_WIDE, _DX_WIDE, 2,
                 dx_on_side=(False, False), grad_w13_on_side=True, x16_at="after_dh", zeros_at="after_dh",
                 dh_warp_specialized=WarpSpecializedDh(64, 5, 16, 2, 128), dh_programmatic_launch=True,
                 grad_w13_warp_specialized=WarpSpecializedWeightGrad(4, dynamic=True),
                 grad_w2_warp_specialized=WarpSpecializedWeightGrad(4, by_column=True), dx_writes_rows=True)  # fmt: skip
PLANS: tuple[tuple[int, Plan], ...] = (
    # dx's w3 half behind dh on the caller's stream, ahead of grad_w1/grad_w3, its w1 half beside them on the side
    # stream: reading w3 overlaps grad_w2's stores (T = 64: 223-226 -> 218-220 us; slower at every larger T). scatter
    # then runs beside grad_w1/grad_w3, which end the call (219 -> 217 us).
    (64, Plan(Tile(64, 64, 64, 4, 4), _WGRAD_SMALL, Tile(128, 128, 64, 4, 2, 1, 2, True), Tile(64, 128, 64, 4, 4), 4,
              dx_on_side=(True, False), scatter_on_side=True, dh_gathers_rows=True)),
    # dx and grad_w1/grad_w3 by one Gluon kernel, each step reading a block of w1 or w3 and writing the same block of its
    # gradient, right after dh on the caller's stream (same-process A/B against the two stages apart with dx split 4
    # ways, whose tiles stay here for that comparison, means of three: T = 128 -20.3 and -21.1 us; alone 132.8 us
    # against 84.6 + 107.0: docs/performance.md, v27). Its programs hold every token, so dx is split 2 ways per weight:
    # 128 programs.
    # grad_w2 by the Gluon weight gradient rather than Triton's 128 x 128 pair (same-process A/B, means of three: T = 128
    # -3.0 and -2.9 us, with its tiles claimed one by one -2.7 and -2.3; at T = 64 +0.4 to +1.4; v31).
    (128, Plan(Tile(64, 128, 64, 4, 4, 2), _WGRAD_PAIR, _WGRAD_BESIDE_DX, _DX_BESIDE_WGRAD, 2, dh_gathers_rows=True,
               dx_grad_w13=WarpSpecializedDxGradW13(4), grad_w2_warp_specialized=WarpSpecializedWeightGrad(4))),
    # dx as the Gluon kernel over the fp16 dd, in 128x256 tiles, and no bf16 copy of dd from dh (same-process A/B
    # against Triton's dx in 128x128 tiles over the copy, means of three: T = 196 -9.0 us, 215 -6.0, 256 -6.9 to -8.5;
    # Triton's dx in 128x256 tiles is 53-60 us slower here; the Gluon dx is slower at T = 64, 128 and 296: v15).
    # grad_w1/grad_w3 as the Gluon kernel with a last step of up to 32 tokens (A/B against Triton's kernel, means of
    # three: T = 196 -13.3 us, 215 -13.9, 256 -0.6 to -5.6: v17).
    # grad_w2 by the same Gluon kernel, its last step reading the rows of gated_output that end at T (A/B against
    # Triton's 128 x 128 pair, means of three: T = 196 -3.1 us, 215 -3.7, 256 +0.1 and +1.0: v19). Since v21 the
    # Gluon kernel's two warpgroups work independently (A/B of both weight gradients so against v20's kernel, means of
    # three: T = 196 -10.5 us, 215 -10.6, 256 -14.3, -13.8 and -14.5 at B = 4096, 2053 and 512).
    # The zeros right behind grad_w2 rather than first: grad_w2 starts earlier, the zeros run beside grad_w1/grad_w3
    # (same-process A/B, means of three: T = 196-256 -0.5 to -7.7 us, the most at B = 4096; again with
    # benchmarks/plan_ab_triton_fused.py: -2.1 (196), -1.7 (215), -7.5 / -1.4 / -0.4 / +0.5 at T = 256 with
    # B = 4096 / 2053 / 2048 / 512: v14).
    # grad_w1/grad_w3 with B's column slab resident in shared memory, so that a tile reads only A's block (alone: T = 196
    # -7.7 us, 215 -7.7, 256 -7.0, the bits unchanged; v23).
    # grad_w2's tiles claimed one by one (WarpSpecializedWeightGrad.dynamic): its programs start on the 20 SMs that dh's
    # 112 tiles leave free and on the rest only at dh's end, and dealt out in advance the late ones ended up to 45 us
    # after the early ones, a lag that grad_w1/grad_w3's programs then inherit. Same-process A/B, means of four, on three
    # machines: T = 196 -5.9 and -4.4 us, 215 -4.5, 256 -6.0 and -6.1 (B = 512), -4.1 (2053), -3.8 and -4.9 (2048),
    # +2.6, +1.9 and +2.2 (4096: the zeros behind grad_w2, 31 MB, no longer run on SMs that grad_w2's early programs
    # leave idle, and dx waits for them; first or last they cost more); edges T = 129 -7.6, 224 -4.7, 225 -5.8 (v31).
    # Up to T = 224 dx is the swap-AB kernel over the bf16 copy in one block of 128 + 64 + 32 tokens, which pays for
    # 224 rows where 128-row tiles pay for 256 (same-process A/B against the Gluon dx, means of three: T = 196 -5.1 us,
    # 215 -2.9; in one chunk of 256 tokens -4.6 and -2.2, and at T = 256 +1.0, so not there: v22).
    (224, replace(_PLAN_256, dx_warp_specialized=False, dx_swap_ab=SwapAbDx((128, 64, 32), 4))),
    # dx right behind dh on the caller's stream in 64 programs (split-K 1), beside grad_w2 and then grad_w1/grad_w3 on
    # the side stream, both claiming their tiles, grad_w2 in fewer programs than SMs so that dx finds SMs free at
    # dh's end, and the zeros first on the side stream, beside dh. dx reads the weights and grad_w1/grad_w3 writes
    # theirs; alone at T = 256 each runs 26% faster per SM on half the SMs than on all of them (dx 142.6 us on 64 SMs
    # against 90.7 on 128, grad_w1/grad_w3 170.0 on 66 against 107.4 on 132), and side by side they share the GPU's
    # bound instead of taking turns at it (same-process A/B against the layout above, means of four: T = 256 -5.9,
    # -5.9, -5.3 and -5.3 us at B = 2048, 4096, 512 and 2053 with grad_w2 in 88 programs, on one machine; -3.2 to -6.2
    # in all 132, three runs on two machines; edges T = 225 -7.0, 256 (B = 999) -4.4; at T = 196 and 215, where the
    # swap-AB dx and the resident B of grad_w1/grad_w3 pay, +17 to +20, so not the 224 bucket: v32).
    # dx stores the selected rows itself, the last of a tile's two programs adding their partials, so that no scatter
    # ends the call (same-process A/B against 6714034's plan, means of three or four, two runs on two machines: T = 256
    # -2.1 to -4.3 us per workload, -3.6 on average; with the partials left in wgmma's layout +9.8 to +11.8 against
    # scatter, with them coalesced and still summed by scatter -0.8 to -2.6; the swap-AB dx so at 196-336 +2.1 to +8.1,
    # and the fused dx with grad_w1/grad_w3 at T = 128 +0.2 to +0.6, so not those: v34). With dx so, grad_w2 in 96
    # programs rather than 88 (-1.7 to -2.6 us on the four workloads, v34), and since the weight gradient stores each
    # tile under the next one's products, in all 132 (same-process A/B against 96, means of three, two runs on one
    # machine: -4.4 to -5.2 us on the four workloads, in 112 programs -3.6 to -4.7, in 88 +3.6 and +5.4; edges T = 225
    # -6.6, 256 (B = 999) -5.0: v35).
    (256, replace(_PLAN_256, dx_split=1, dx_on_side=(False, False), grad_w13_on_side=True, zeros_at="start",
                  grad_w13_warp_specialized=WarpSpecializedWeightGrad(4, dynamic=True), dx_writes_rows=True)),
    # dx first after dh: the two launches of dx (96 programs each at T = 336) no longer run last and alone, on
    # a third of the SMs, while the persistent grad_w1/grad_w3 fills the GPU to the end (T = 336: 491 -> 472 us; with
    # v18's dh this layout also pays at T = 496, -7.2 and -7.9 us in two A/B runs, and is even at 512: +0.3, -0.4).
    # From T = 257 on dh is the warp-specialised Gluon kernel (same-process A/B of the whole backward against the
    # Triton dh, means of three: T = 496 -7.5 us, 512 -15.1, 1024 -44.7, 2048 -51.8; docs/performance.md, v12). Up to
    # T = 512, where a program has 1.3-1.7 tiles of 128 x 256, its tiles are 128 x 128 (2.5-3.4 per program): the
    # busiest program is nearer the average, and its last epilogue, which nothing hides, is half as long (two A/B
    # runs, means of three each, against Triton's 64 x 256 dh gathering its own rows and against the Gluon dh's 128 x
    # 256 tiles in K steps of 32: T = 296 -2.5 and -2.9 us, 336 -2.5 and -1.6, 496 -1.4 and -1.0, 512 -4.4 and -3.4;
    # slower in the 256 bucket (+5 to +12) and at 2048 (+60); v18). dh is launched as a programmatic dependent of
    # the gather, so grad_w2 no longer takes the SMs first in some calls (A/B, means of three: T = 296 -4.0 us, 336
    # -2.7, 496 -2.3, 512 -2.3; at 2048 -0.6, within its noise, so that bucket goes without; v19).
    # x16 and the zeros once dh is done, beside dx, so that grad_w2 starts beside dh as soon as ge is written (T = 296
    # -4.6 us, 336 -5.7 against both first with Triton's dh, +19 with the Gluon dh behind the gather: v13, v18).
    # Both weight gradients by the Gluon kernel, grad_w2's tiles column by column as in Triton's (same-process A/B
    # against Triton's kernels, means of three: T = 296 -3.0 us, 336 -9.8, 496 -3.1, 512 -2.4; grad_w1/grad_w3 alone
    # -1.6, -6.5, -2.2, -1.8: v21).
    # Up to T = 384 dx is the swap-AB kernel in one block of 256 + 64 or 256 + 128 tokens rather than Triton's two
    # launches over 128-row tiles (T = 296 pays for 320 rows instead of 384, and w1 and w3 are read by one block of
    # tokens instead of three; same-process A/B, means of three: T = 296 -11.1 us, 336 -8.2; in two blocks of 256 at
    # T = 496 and 512 +13.1 and +11.1, so not there: v22).
    # scatter right behind dx on the caller's stream, beside grad_w1/grad_w3 on the side stream, rather than after them
    # (same-process A/B, means of three: T = 296 -4.7 us, 336 -5.8; +1.2 and +2.6 at 512 and 496; docs/performance.md,
    # v28).
    # Up to T = 320 grad_w2's tiles claimed one by one, with x16 behind the gather on the side stream, ahead of grad_w2,
    # rather than behind the zeros once dh is done (same-process A/B, means of three and four: T = 296 -1.7 and -2.7 us;
    # at 336 +0.5 and +1.5, and grad_w2 claimed with x16 after dh +4.7 and +5.3, so not the 384 bucket; v31).
    # From T = 257 to 1024 grad_w1/grad_w3 claims its tiles too, since the weight gradient stores each tile under the
    # next one's products (same-process A/B against them dealt out, means of three or four, two runs on one machine:
    # T = 296 -2.5 and -2.9 us, 336 -0.8 and -1.1, 512 -3.5 and -3.1, 496 +1.0 and +0.7; edges T = 257 -1.9, 320
    # -2.4, 321 -3.4, 384 -0.8, 385 -3.6, 512 (B = 513) -2.6, 513 -89.4, 1024 -1.5; at 2048 +2.8, so not the last
    # bucket: v35).
    (320, replace(_PLAN_512, dx_swap_ab=SwapAbDx((256, 64), 3), dx_writes_rows=False, scatter_after_dx=True,
                  grad_w2_warp_specialized=WarpSpecializedWeightGrad(4, by_column=True, dynamic=True),
                  x16_at="after_gather")),
    (384, replace(_PLAN_512, dx_swap_ab=SwapAbDx((256, 128), 3), dx_writes_rows=False, scatter_after_dx=True)),
    # Up to T = 1024 rather than 512: just past 512 the last bucket's plan was 74 us slower (T = 513 739 us against 665
    # with this plan, 640 786 against 712, 768 851 against 815, 1024 1043 against 1028; same-process A/B, means of
    # three, the weight gradients' bits equal: v24).
    # dx as one launch over both halves whose last program per tile adds the split's partials and stores the selected
    # rows, so that no scatter ends the call (same-process A/B, means of four: T = 496 -6.1 us, 512 -6.0; edges T = 385
    # -7.5, 1024 -13.7; v28).
    # grad_w2's tiles claimed one by one, so that the SMs that dh's programs of fewer tiles free first take more of them
    # (same-process A/B, means of four: T = 512 -11.1 and -8.4 us, 496 +1.2 and +2.0; edges T = 385 -7.9, 512 (B = 513)
    # -9.8, 513 +8.3, 1024 -2.4; at T = 296 +0.4 and 336 +4.7 and +5.3, where x16 and the zeros behind grad_w2 then
    # reach grad_w1/grad_w3 later, so not the 320 and 384 buckets; v31).
    # The zeros on the caller's stream behind dx rather than on the side stream ahead of x16, which then no longer waits
    # for them before grad_w1/grad_w3 (same-process A/B, means of three or four, four runs on one machine: T = 496
    # -5.3, -5.0, -5.1 and -4.8 us, 512 -0.1, -0.1, +0.5, +0.3; edges T = 385 +0.2, 512 (B = 513) +0.7, 513 +1.4, 1024
    # -0.1; at 296 and 336 +0.1 to +0.4, so not the 320 and 384 buckets: v32).
    (1024, replace(_PLAN_512, grad_w2_warp_specialized=WarpSpecializedWeightGrad(4, by_column=True, dynamic=True),
                   zeros_at="after_dx")),
    # From T = 1025: dh launched as a programmatic dependent of the gather on the fewest programs that keep its busiest
    # one at the same tile count (T = 2048: 128 for 896 tiles, 7 each), and x16 behind the gather on the side stream:
    # dh's programs hold their SMs by then, and x16 runs on the 4 left free for all of dh, the zeros behind grad_w2
    # (timeline at T = 2048: dh starts at 20 us instead of 41, x16 22-404 us beside it, grad_w2 starts at dh's end
    # and takes 311 us instead of 365 in dh's tail; same-process A/B against x16 and the zeros first, means of six:
    # -12.1, -8.9 and -17.2 us in three runs; the fewest programs alone -5.9; v20). grad_w1/grad_w3 by the Gluon
    # kernel (A/B at T = 2048, means of three: -7.0 and -5.2 us; grad_w2 so too, column by column, +2.1: v21).
    # dx unsplit in one launch over both halves into the selected rows, no partials and no scatter (A/B at T = 2048,
    # means of six and four: -19.9 and -16.4 us, one run of three +20.7 with one call at 2027; edges T = 1025 -15.7,
    # 1500 -3.1; v28).
    # grad_w2 by the Gluon kernel, column by column, its tiles claimed one by one: its programs start as grad_w1/grad_w3's
    # end, 112 of them with 27 tiles about 22 us before the 20 with 28 (A/B at T = 2048, means of four and six: -7.1 and
    # -11.1 us, dealt out -5.5; v31).
    (1 << 30, Plan(Tile(128, 256, 64, 8, 3, 4, 1, True), _WGRAD_WIDE_BY_COLUMN, _WGRAD_WIDE, _DX_WIDE, 1,
                   dh_warp_specialized=WarpSpecializedDh(64, 3, 16, 1, fewest_programs=True), dh_programmatic_launch=True,
                   x16_at="after_gather", zeros_at="after_grad_w2", grad_w13_warp_specialized=WarpSpecializedWeightGrad(4),
                   grad_w2_warp_specialized=WarpSpecializedWeightGrad(4, by_column=True, dynamic=True),
                   dx_writes_rows=True)),
)


def plan_for(num_tokens: int) -> Plan:
    return next(plan for limit, plan in PLANS if num_tokens <= limit)


def _steps(tokens: int) -> tuple[int, int]:
    """(whole K steps, short ones) of the Gluon weight gradient: a last step of at most WS_SHORT_STEP tokens is a
    short one."""
    left = tokens % WS_BLOCK_K
    if 0 < left <= WS_SHORT_STEP:
        return tokens // WS_BLOCK_K, 1
    return triton.cdiv(tokens, WS_BLOCK_K), 0


def needs_low_copy(plan: Plan) -> bool:
    """Whether dh writes dd_low, the bf16 copy of dd: Triton's dx and the swap-AB dx read it, and the Gluon dh always
    writes it, whichever dx follows."""
    return plan.dh_warp_specialized is not None or (not plan.dx_warp_specialized and plan.dx_grad_w13 is None)


def grad_w2_last_step(plan: Plan, tokens: int) -> int:
    """The rows of grad_w2's last K step, whose block of ge the gather shifts (gather_kernel)."""
    if plan.grad_w2_warp_specialized is None:
        return plan.grad_w2.block_k
    return WS_SHORT_STEP if _steps(tokens)[1] else WS_BLOCK_K


def dx_split_for(plan: Plan, ffn_dim: int) -> int:
    """The largest split-K factor up to plan.dx_split whose slices are whole BLOCK_K steps."""
    block_k = FUSED_BLOCK_K if plan.dx_grad_w13 else plan.dx.block_k
    return max(s for s in range(1, plan.dx_split + 1) if ffn_dim % (s * block_k) == 0)


@functools.cache
def _multiprocessors(device: torch.device) -> int:
    if device.type != "cuda":
        return 4  # Triton's CPU interpreter: a small persistent grid still walks several tiles per program
    return torch.cuda.get_device_properties(device).multi_processor_count


def _check_tma_alignment(tensor: torch.Tensor) -> None:
    if tensor.data_ptr() % 16 or any(stride * tensor.element_size() % 16 for stride in tensor.stride()[:-1]):
        raise ValueError(f"TMA needs 16-byte aligned bases and row strides; got a tensor of shape {tuple(tensor.shape)}")


def _descriptor(tensor: torch.Tensor, block_shape: list[int]) -> TensorDescriptor:
    _check_tma_alignment(tensor)
    return TensorDescriptor.from_tensor(tensor, block_shape)


def _grid(tiles: int, tile: Tile, device: torch.device) -> tuple[int]:
    if tile.programs_per_sm == 0:
        return (tiles,)
    return (min(tiles, tile.programs_per_sm * _multiprocessors(device)),)


@dataclass
class Problem:
    """The 12 inputs and 5 outputs of the current call, with the scratch buffers the stages pass along.

    One Problem serves every call whose plan and tensors' shapes, strides, dtypes and alignment are the same
    (call_context): its scratch buffers, the descriptors over them, its events and its launch sites (launch.py) are
    made once, and each call binds its own inputs and outputs (begin). Calls on one stream are ordered, and each
    ends with the caller's stream waiting for the side stream, so a call's scratch is free when the next one starts.
    """

    inputs: dict[str, torch.Tensor]
    outputs: dict[str, torch.Tensor]
    precise_dtype: torch.dtype
    dx_split: int
    k_step: int  # the rows of grad_w2's last K step (grad_w2_last_step): the gather shifts ge's last block of that many
    low_copy: bool = True  # dd_low, the bf16 copy of dd (where needs_low_copy says; None without)
    dx_to_rows: bool = False  # Plan.dx_writes_rows: dx stores the rows; the routing weights finished after routing_x16
    dx_tiles: int = 0  # dx's output tiles: with dx_to_rows and more than one partial, one arrival counter each
    # Each of dx's programs sums both halves of K (Triton's dx into the rows): one partial per slice of the split
    # rather than per half and slice
    dx_sums_halves: bool = False
    # Launches of the Gluon weight gradient so far in this call that claim their tiles, each from its own counter
    weight_grad_launches: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        batch, hidden = self.inputs["grad_output"].shape
        self.batch, self.hidden = batch, hidden
        self.tokens = self.inputs["token_indices"].numel()
        self.rows = triton.cdiv(self.tokens, ROW_PAD) * ROW_PAD
        self.ffn = self.inputs["w1_weight"].shape[0]
        self.device, operand = self.inputs["grad_output"].device, self.inputs["grad_output"].dtype
        self.routing_chunks = triton.cdiv(hidden, ROW_BLOCK_H)
        self.g = torch.empty(self.rows, hidden, device=self.device, dtype=operand)
        self.ge = torch.empty_like(self.g)
        self.x_precise = torch.empty(self.rows, hidden, device=self.device, dtype=self.precise_dtype)
        self.routing_partials = torch.empty(self.tokens, self.routing_chunks, device=self.device, dtype=torch.float32)
        self.dd = torch.empty(self.rows, 2 * self.ffn, device=self.device, dtype=self.precise_dtype)
        self.dd_low = torch.empty_like(self.dd, dtype=operand) if self.low_copy else None
        # one partial per half and slice of K, or per slice where a program sums both halves; none for a single one
        # that dx stores into the rows itself
        partials = self.dx_split if self.dx_sums_halves else 2 * self.dx_split
        self.partials = torch.empty(partials, self.tokens, hidden, device=self.device, dtype=operand) if partials > 1 else None
        # The call's counters, which the gather (the first kernel on either stream) zeroes: the dynamic Gluon weight
        # gradient's tile claims, one per launch, then dx's arrivals (with dx_to_rows and more than one partial)
        split_to_rows = self.dx_to_rows and partials > 1
        self.counters = torch.empty(TILE_COUNTERS + (self.dx_tiles if split_to_rows else 0), device=self.device,
                                    dtype=torch.int32)  # fmt: skip
        if self.counters.numel() > self.rows * self.routing_chunks:
            raise ValueError(f"the gather's {self.rows * self.routing_chunks} programs zero the call's counters, one each: "
                             f"too few for {self.counters.numel()}")
        self.arrivals = self.counters[TILE_COUNTERS:] if split_to_rows else None
        self.program = CallProgram([*self.inputs.values(), *self.outputs.values()])
        # The call's descriptors and events, in the order the call asks for them (the same in every call of this
        # Problem), made on the first call and reused: a descriptor gets the call's tensor as its base (shape, strides
        # and block are the Problem's), an event is recorded again.
        self._descriptors: list[TensorDescriptor | GluonTensorDescriptor] = []
        self._events: list[torch.cuda.Event] = []
        self._next_descriptor = self._next_event = 0
        # the stream the calls are made on (call_context keys the Problem by it; CUDA only)
        self.caller = torch.cuda.current_stream(self.device) if self.device.type == "cuda" else None
        self.issuing: torch.cuda.Stream | None = None  # where launches go: None for the caller's stream

    def begin(self, tensors: Sequence[torch.Tensor]) -> None:
        """Bind one call's inputs and outputs (INPUT_NAMES, then OUTPUT_NAMES) for the launcher's code; its launches,
        descriptors, events and tile counters start from the first."""
        self.inputs, self.outputs = dict(zip(INPUT_NAMES, tensors[:12])), dict(zip(OUTPUT_NAMES, tensors[12:]))
        self.program.begin(tensors)
        self.weight_grad_launches = self._next_descriptor = self._next_event = 0
        self.issuing = None

    def end(self) -> None:
        """The launcher's code has issued the call: let go of its tensors."""
        self.program.end()
        self.inputs = self.outputs = {}

    def launch(self, kernel: object, grid: tuple[int, ...], *args: object, **kwargs: object) -> None:
        self.program.launch(kernel, grid, self.issuing, self.caller, *args, **kwargs)

    def wait(self, stream: torch.cuda.Stream, event: torch.cuda.Event | None) -> None:
        """`stream` waits for the work that `event` marks (nothing without an event: all work is on one stream)."""
        if event is not None:
            self.program.wait(stream, event)

    @contextlib.contextmanager
    def issuing_on(self, stream: torch.cuda.Stream) -> Iterator[None]:
        """Launches of the block go to `stream` (set here rather than as torch's current stream, which costs more)."""
        self.issuing = stream
        try:
            yield
        finally:
            self.issuing = None

    def descriptor(self, tensor: torch.Tensor, block_shape: list[int]) -> TensorDescriptor:
        return self._descriptor_of(tensor, block_shape, _descriptor)

    def gluon_descriptor(self, tensor: torch.Tensor, block_shape: list[int]) -> GluonTensorDescriptor:
        return self._descriptor_of(tensor, block_shape, _gluon_descriptor)

    def _descriptor_of(self, tensor: torch.Tensor, block_shape: list[int], make: Callable) -> object:
        """The call's next descriptor, over `tensor`: made (and checked) on the first call, on later ones the same
        object with `tensor` as its base; call_context keys the Problem by everything else a descriptor holds."""
        if self._next_descriptor == len(self._descriptors):
            self._descriptors.append(make(tensor, block_shape))
        descriptor = self._descriptors[self._next_descriptor]
        self._next_descriptor += 1
        descriptor.base = tensor
        return descriptor

    def recorded_event(self, stream: torch.cuda.Stream | None) -> torch.cuda.Event | None:
        """An event marking the work issued so far on `stream` (None without a side stream: all work is in order)."""
        if stream is None:
            return None
        if self._next_event == len(self._events):
            self._events.append(torch.cuda.Event())
        event = self._events[self._next_event]
        self._next_event += 1
        self.program.record(event, stream)
        return event

    def tile_counter(self) -> torch.Tensor:
        """The tile-claim counter of the next launch of the Gluon weight gradient in this call."""
        if self.weight_grad_launches == TILE_COUNTERS:
            raise ValueError(f"the call has {TILE_COUNTERS} tile counters for the Gluon weight gradient's launches")
        self.weight_grad_launches += 1
        return self.counters[self.weight_grad_launches - 1 :]

    def halves(self, dd: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The d_a and d_up column halves of a (rows, 2F) buffer (dd or dd_low)."""
        return dd[:, : self.ffn], dd[:, self.ffn :]


def gather(p: Problem, write_g: bool = True, launch_dependents: bool = False) -> None:
    """ge, and g unless dh gathers its own rows (write_g False: p.g is then left unwritten and unused); with
    launch_dependents the next kernel on the stream may be launched as a programmatic dependent before it ends."""
    i = p.inputs
    last_step = (p.tokens - 1) // p.k_step * p.k_step
    p.launch(gather_kernel, (p.rows, p.routing_chunks),
        i["grad_output"], i["token_indices"], i["selected_weights"], p.g, p.ge, p.counters, p.tokens, p.hidden,
        last_step, last_step + p.k_step - p.tokens, p.counters.numel(), BLOCK_H=ROW_BLOCK_H, WRITE_G=write_g,
        LAUNCH_DEPENDENTS=launch_dependents,
    )  # fmt: skip


def routing_x16(p: Problem) -> None:
    """x16 and the routing sums' partials; where dx writes its rows itself and no scatter ends the call, the routing
    weights are finished right behind, on the same stream."""
    i = p.inputs
    p.launch(routing_x16_kernel, (p.rows, p.routing_chunks),
        i["grad_output"], i["token_indices"], i["selected_tokens"], i["expert_output"], p.x_precise, p.routing_partials,
        p.tokens, p.hidden, BLOCK_H=ROW_BLOCK_H,
    )  # fmt: skip
    if p.dx_to_rows:
        scatter(p, routing_only=True)


def zero_unselected(p: Problem) -> None:
    o = p.outputs
    block_h = min(ZERO_BLOCK_H, triton.next_power_of_2(p.hidden))
    p.launch(zero_unselected_kernel, (p.tokens + 1, triton.cdiv(p.hidden, block_h)),
        p.inputs["token_indices"], o["grad_hidden_states"], o["grad_routing_weights"], p.tokens, p.batch, p.hidden,
        BLOCK_H=block_h,
    )  # fmt: skip


def dh_swiglu(p: Problem, t: Tile, gathered: bool = True) -> None:
    """dh and the SwiGLU backward, reading g (gathered) or the rows of grad_output that token_indices selects."""
    i = p.inputs
    g = p.descriptor(p.g, [t.block_m, t.block_k]) if gathered else i["grad_output"]
    block = [t.block_m, t.block_n // t.epilogue_split]
    outputs = [p.descriptor(half, block) for half in p.halves(p.dd)]
    outputs += [p.descriptor(half, block) for half in p.halves(p.dd_low)] if p.low_copy else [None, None]
    tiles = triton.cdiv(p.tokens, t.block_m) * triton.cdiv(p.ffn, t.block_n)
    p.launch(dh_swiglu_kernel, _grid(tiles, t, p.device),
        g, i["token_indices"], p.descriptor(i["w2_weight"], [t.block_k, t.block_n]),
        i["w1_output"], i["up_output"], i["gate_output"], *outputs, i["selected_weights"], p.tokens, p.hidden, p.ffn,
        BLOCK_M=t.block_m, BLOCK_N=t.block_n, BLOCK_K=t.block_k, EPILOGUE_SPLIT=t.epilogue_split, FLATTEN=t.flatten,
        GATHERED=gathered, LOW_COPY=p.low_copy, num_warps=t.num_warps, num_stages=t.num_stages,
    )  # fmt: skip


def _require_gpu(tensor: torch.Tensor, kernel: str) -> None:
    if not tensor.is_cuda:
        raise ValueError(f"the warp-specialised {kernel} is a Gluon kernel for Hopper GPUs: Triton's CPU interpreter cannot run it")


def _gluon_descriptor(tensor: torch.Tensor, block_shape: list[int]) -> GluonTensorDescriptor:
    _check_tma_alignment(tensor)
    return GluonTensorDescriptor.from_tensor(tensor, block_shape, _shared_layout(tuple(block_shape), tensor.dtype))


@functools.cache
def _shared_layout(block_shape: tuple[int, ...], dtype: torch.dtype) -> gl.NVMMASharedLayout:
    """The Gluon descriptors' shared-memory layout, computed once per block and dtype (several microseconds each)."""
    return gl.NVMMASharedLayout.get_default_for(list(block_shape), {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16}[dtype])


def dh_swiglu_warp_specialized(p: Problem, w: WarpSpecializedDh, after_gather: bool = False) -> None:
    """dh and the SwiGLU backward by the Gluon kernel: one persistent program per multiprocessor (or fewer:
    w.fewest_programs); after_gather: launched as a programmatic dependent of the gather, the kernel issued just before
    it on this stream."""
    _require_gpu(p.g, "dh")
    i = p.inputs
    activations = [p.gluon_descriptor(i[name], [WS_BLOCK_M, w.act_width]) for name in ("w1_output", "up_output", "gate_output")]
    tiles = triton.cdiv(p.tokens, WS_BLOCK_M) * triton.cdiv(p.ffn, w.block_n)
    programs = min(tiles, _multiprocessors(p.device))
    if w.fewest_programs:
        programs = triton.cdiv(tiles, triton.cdiv(tiles, programs))
    p.launch(dh_swiglu_ws_kernel, (programs,),
        p.gluon_descriptor(p.g, [WS_BLOCK_M, w.block_k]), p.gluon_descriptor(i["w2_weight"], [w.block_k, w.block_n]),
        *activations, p.dd, p.dd_low, i["selected_weights"], p.tokens, p.hidden, p.ffn, p.rows,
        STAGES=w.stages, ACT_BUFFERS=w.act_buffers, WAIT_FOR_GATHER=after_gather, num_warps=8, launch_pdl=after_gather,
    )  # fmt: skip


def _weight_grad(p: Problem, t: Tile, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, c_high: torch.Tensor | None = None) -> None:
    """[c; c_high] = a^T @ b over the T tokens, with a (p.rows x M, padded), b (p.rows or T rows, N columns; see
    weight_grad_kernel), c and c_high (N columns each) stacked into M rows."""
    m, n = a.shape[1], b.shape[1]
    store = [t.block_m, t.block_n // t.epilogue_split]
    row_tiles = triton.cdiv(m, t.block_m)
    high_from = c.shape[0] if c_high is not None else row_tiles * t.block_m  # a whole number of tiles
    group_m = t.group_m or row_tiles
    if (high_from // t.block_m) % group_m:
        raise ValueError(f"group_m {group_m} must divide the {high_from // t.block_m} rows of tiles stored through c")
    p.launch(weight_grad_kernel, _grid(row_tiles * triton.cdiv(n, t.block_n), t, p.device),
        p.descriptor(a, [t.block_k, t.block_m]), p.descriptor(b, [t.block_k, t.block_n]),
        p.descriptor(c, store), p.descriptor(c if c_high is None else c_high, store), p.tokens, b.shape[0], m, n, high_from,
        group_m,
        BLOCK_M=t.block_m, BLOCK_N=t.block_n, BLOCK_K=t.block_k, EPILOGUE_SPLIT=t.epilogue_split, FLATTEN=t.flatten,
        num_warps=t.num_warps, num_stages=t.num_stages,
    )  # fmt: skip


def _weight_grad_launch(p: Problem, t: Tile, warp_specialized: WarpSpecializedWeightGrad | None) -> Callable[..., None]:
    """launch(a, b, c, c_high=None) of _weight_grad: by Triton's kernel in tile t, or by the Gluon kernel."""
    if warp_specialized is None:
        return functools.partial(_weight_grad, p, t)
    return functools.partial(_weight_grad_warp_specialized, p, warp_specialized)


def grad_w2(p: Problem, t: Tile, warp_specialized: WarpSpecializedWeightGrad | None = None) -> None:
    """grad_w2 = ge^T @ gated_output by Triton's kernel in tile t, or by the Gluon kernel."""
    _weight_grad_launch(p, t, warp_specialized)(p.ge, p.inputs["gated_output"], p.outputs["grad_w2_weight"])


def grad_w13(p: Problem, t: Tile, warp_specialized: WarpSpecializedWeightGrad | None = None) -> None:
    """One launch over the 2F rows of [grad_w1; grad_w3] when F is a multiple of the tile's rows (no tile then
    straddles the two outputs), else one launch per weight; by Triton's kernel in tile t, or by the Gluon kernel."""
    w1, w3 = p.outputs["grad_w1_weight"], p.outputs["grad_w3_weight"]
    launch = _weight_grad_launch(p, t, warp_specialized)
    if p.ffn % (t.block_m if warp_specialized is None else WS_BLOCK_M) == 0:
        launch(p.dd, p.x_precise, w1, w3)
    else:
        d_a, d_up = p.halves(p.dd)
        launch(d_a, p.x_precise, w1)
        launch(d_up, p.x_precise, w3)


def _check_dx_grad_w13(plan: Plan, tokens: int, ffn: int) -> None:
    """The fused dx and grad_w1/grad_w3 kernel reads all the tokens in one block of FUSED_BLOCK_M rows of dd: T must fit
    it, and dh must have written every row of it (rows past T as zeros: the weight gradients multiply them by x16's zero
    rows, and an unwritten row could hold a NaN)."""
    if plan.dx_warp_specialized or plan.dx_swap_ab or plan.grad_w13_warp_specialized:
        raise ValueError("dx with grad_w1/grad_w3 (dx_grad_w13) replaces the dx and grad_w1/grad_w3 kernels the plan also names")
    if ffn % FUSED_BLOCK_K:
        raise ValueError(f"dx with grad_w1/grad_w3 takes K steps of {FUSED_BLOCK_K} of ffn_dim {ffn}: it must be a multiple")
    dh_rows = WS_BLOCK_M if plan.dh_warp_specialized else plan.dh.block_m
    if tokens > FUSED_BLOCK_M or triton.cdiv(tokens, dh_rows) * dh_rows < FUSED_BLOCK_M:
        raise ValueError(f"dx with grad_w1/grad_w3 reads {FUSED_BLOCK_M} rows of dd: T = {tokens} must be at most that, "
                         f"and dh's tiles of {dh_rows} rows must cover them")


def _check_dx_writes_rows(plan: Plan) -> None:
    """dx into the rows of grad_hidden_states is Triton's kernel or the warp-specialised Gluon one, in one launch over
    both halves."""
    if plan.dx_swap_ab or plan.dx_grad_w13:
        raise ValueError("dx into the rows of grad_hidden_states (dx_writes_rows) is Triton's dx kernel or the "
                         "warp-specialised one: not the swap-AB dx or dx with grad_w1/grad_w3")
    if plan.dx_on_side[0] != plan.dx_on_side[1] or plan.scatter_on_side:
        raise ValueError("dx into the rows of grad_hidden_states (dx_writes_rows) takes both halves of K in one launch on "
                         "one stream (equal dx_on_side) and leaves no scatter (not scatter_on_side)")


def _check_weight_grad(w: WarpSpecializedWeightGrad, tokens: int) -> None:
    """What the Gluon weight gradient can run: B's resident slab holds WS_RESIDENT_STEPS K steps, its runs of tiles
    are dealt out in advance (not claimed), and its programs are one per SM (0) or a given count."""
    k_steps = sum(_steps(tokens))
    if w.b_resident and k_steps > WS_RESIDENT_STEPS:
        raise ValueError(f"the weight gradient's resident B holds {WS_RESIDENT_STEPS} K steps of {WS_BLOCK_K} tokens, not {k_steps}")
    if w.dynamic and w.b_resident:
        raise ValueError("the weight gradient's tiles are claimed one by one (dynamic) or runs of them keep B resident")
    if w.programs < 0:
        raise ValueError(f"the weight gradient's programs must be 0 (one per SM) or more, not {w.programs}")


def _weight_grad_warp_specialized(p: Problem, w: WarpSpecializedWeightGrad, a: torch.Tensor, b: torch.Tensor,
                                  c: torch.Tensor, c_high: torch.Tensor | None = None) -> None:  # fmt: skip
    """As _weight_grad, by the Gluon kernel: whole K steps of 64 tokens, and a last one of WS_SHORT_STEP rows where at
    most that many tokens are left (a's rows past T are zeros, padded to ROW_PAD; b's too where it is padded, else its
    last step is read as the rows that end at T, as weight_grad_kernel reads it)."""
    full_steps, tail_steps = _steps(p.tokens)
    _require_gpu(a, "weight gradient")
    m, n = a.shape[1], b.shape[1]
    tiles = triton.cdiv(m, WS_BLOCK_M) * triton.cdiv(n, WS_BLOCK_N)
    store = [WS_BLOCK_M // 2, WS_STORE_WIDTH]
    p.launch(weight_grad_ws_kernel, (min(tiles, w.programs or _multiprocessors(p.device)),),
        p.gluon_descriptor(a, [WS_BLOCK_K, WS_BLOCK_M]), p.gluon_descriptor(b, [WS_BLOCK_K, WS_BLOCK_N]),
        p.gluon_descriptor(a, [WS_SHORT_STEP, WS_BLOCK_M]), p.gluon_descriptor(b, [WS_SHORT_STEP, WS_BLOCK_N]),
        p.gluon_descriptor(c, store), p.gluon_descriptor(c if c_high is None else c_high, store),
        p.tile_counter() if w.dynamic else p.counters, m, n, m if c_high is None else c.shape[0], b.shape[0], full_steps,
        tail_steps, STAGES=w.stages, BY_COLUMN=w.by_column, SLAB_STEPS=WS_RESIDENT_STEPS if w.b_resident else 0,
        DYNAMIC=w.dynamic,
        PRODUCT_REGS=PRODUCT_REGS, num_warps=4,
    )  # fmt: skip


def dx(p: Problem, t: Tile, halves: Sequence[int] = (0, 1), warp_specialized: bool = False,
       swap_ab: SwapAbDx | None = None) -> None:
    """dx's launches for the given halves of K: 0 = d_a @ w1, 1 = d_up @ w3 (each into its own split-K partials).
    Triton's kernel, one launch per half, reads dd_low (with p.dx_to_rows one launch over both, into the selected
    rows of grad_hidden_states); the Gluon kernels take both halves in one launch where both are asked for: the
    warp-specialised one reads dd, the swap-AB one dd_low."""
    if swap_ab is not None:
        _dx_swap_ab(p, t, swap_ab, halves)
        return
    tiles = triton.cdiv(p.tokens, t.block_m) * triton.cdiv(p.hidden, t.block_n)
    if warp_specialized:
        _dx_warp_specialized(p, t, tiles, halves)
        return
    rows = p.outputs["grad_hidden_states"]
    launches = []  # (a, b, a_up, b_up, first partial) per launch of dx_kernel
    if p.dx_to_rows:  # one launch over both halves, into the selected rows
        if list(halves) not in ([], [0, 1]):
            raise ValueError("dx into the rows of grad_hidden_states takes both halves of K in one launch")
        if halves:
            launches.append((*_dx_operands(p, t, 0), *_dx_operands(p, t, 1), 0))
    for half in [] if p.dx_to_rows else halves:
        a, b = _dx_operands(p, t, half)
        launches.append((a, b, a, b, half * p.dx_split))
    unused = rows  # a stand-in for the partials and counters that a launch does not use (a pointer all the same)
    for a, b, a_up, b_up, first_partial in launches:
        p.launch(dx_kernel, (tiles, p.dx_split),
            a, b, a_up, b_up, unused if p.partials is None else p.partials, unused if p.arrivals is None else p.arrivals,
            p.inputs["token_indices"], rows, p.tokens, p.hidden, p.ffn // p.dx_split, first_partial,
            BLOCK_M=t.block_m, BLOCK_N=t.block_n, BLOCK_K=t.block_k, TO_ROWS=p.dx_to_rows,
            num_warps=t.num_warps, num_stages=t.num_stages,
        )  # fmt: skip


def _dx_operands(p: Problem, t: Tile, half: int) -> tuple[TensorDescriptor, TensorDescriptor]:
    """The descriptors of Triton's dx over one half of K: (d_a, w1) or (d_up, w3), d_a and d_up from the bf16 copy."""
    return (p.descriptor(p.halves(p.dd_low)[half], [t.block_m, t.block_k]),
            p.descriptor(p.inputs[("w1_weight", "w3_weight")[half]], [t.block_k, t.block_n]))  # fmt: skip


def _dx_warp_specialized(p: Problem, t: Tile, tiles: int, halves: Sequence[int]) -> None:
    _require_gpu(p.dd, "dx")
    if p.dx_to_rows and list(halves) not in ([], [0, 1]):
        raise ValueError("dx into the rows of grad_hidden_states takes both halves of K in one launch")
    dd = p.gluon_descriptor(p.dd, [t.block_m, t.block_k])
    w1, w3 = (p.gluon_descriptor(p.inputs[name], [t.block_k, t.block_n]) for name in ("w1_weight", "w3_weight"))
    rows = p.outputs["grad_hidden_states"]
    for first, count in _launches(halves):
        p.launch(dx_ws_kernel, (tiles, count * p.dx_split),
            dd, w1, w3, p.partials, rows if p.arrivals is None else p.arrivals, p.inputs["token_indices"], rows,
            p.tokens, p.hidden, p.ffn, p.ffn // p.dx_split, first * p.dx_split,
            STAGES=t.num_stages, TO_ROWS=p.dx_to_rows, num_warps=t.num_warps,
        )  # fmt: skip


def _launches(halves: Sequence[int]) -> list[tuple[int, int]]:
    """(first half, halves) per launch of a Gluon dx: one launch where both halves are asked for."""
    return [(0, 2)] if list(halves) == [0, 1] else [(half, 1) for half in halves]


def _dx_swap_ab(p: Problem, t: Tile, s: SwapAbDx, halves: Sequence[int]) -> None:
    _require_gpu(p.dd_low, "dx")
    w1, w3 = (p.gluon_descriptor(p.inputs[name], [t.block_k, SWAP_AB_BLOCK_H]) for name in ("w1_weight", "w3_weight"))
    chunks = [p.gluon_descriptor(p.dd_low, [width, t.block_k]) for width in s.chunks]
    chunks += chunks[:1] * (3 - len(chunks))  # unused
    stage_bytes = 2 * t.block_k * (SWAP_AB_BLOCK_H + s.block_tokens)
    token_blocks = triton.cdiv(p.tokens, s.block_tokens)
    for first, count in _launches(halves):
        p.launch(dx_swap_ab_kernel, (triton.cdiv(p.hidden, SWAP_AB_BLOCK_H), count * p.dx_split, token_blocks),
            w1, w3, *chunks, p.partials, p.tokens, p.hidden, p.ffn, p.ffn // p.dx_split, first * p.dx_split,
            CHUNKS=len(s.chunks), STAGES=s.stages, STAGE_BYTES=stage_bytes, num_warps=8,
        )  # fmt: skip


def dx_grad_w13(p: Problem, w: WarpSpecializedDxGradW13) -> None:
    """dx's 2 * p.dx_split partials and grad_w1, grad_w3 by the Gluon kernel, one launch (T and dh's rows checked by
    _check_dx_grad_w13)."""
    _require_gpu(p.dd, "dx with grad_w1/grad_w3")
    i, o = p.inputs, p.outputs
    weights = [p.gluon_descriptor(i[name], [FUSED_BLOCK_K, FUSED_BLOCK_N]) for name in ("w1_weight", "w3_weight")]
    grads = [p.gluon_descriptor(o[name], [FUSED_BLOCK_K, FUSED_BLOCK_N // 2]) for name in ("grad_w1_weight", "grad_w3_weight")]
    splits = 2 * p.dx_split
    p.launch(dx_grad_weight_ws_kernel, (triton.cdiv(p.hidden, FUSED_BLOCK_N), splits),
        p.gluon_descriptor(p.dd, [FUSED_BLOCK_M, FUSED_BLOCK_K]), p.gluon_descriptor(p.x_precise, [FUSED_BLOCK_M, FUSED_BLOCK_N]),
        *weights, *grads, p.partials, p.tokens, p.hidden, p.ffn, 2 * p.ffn // splits,
        STAGES=w.stages, PRODUCT_REGS=PRODUCT_REGS, num_warps=4,
    )  # fmt: skip


def scatter(p: Problem, routing_only: bool = False) -> None:
    """The selected rows of grad_hidden_states from dx's partials and their routing weights, or only the latter."""
    o = p.outputs
    p.launch(scatter_kernel, (p.tokens, 1 if routing_only else p.routing_chunks),
        p.inputs["token_indices"], o["grad_hidden_states"] if routing_only else p.partials, p.routing_partials,
        o["grad_hidden_states"], o["grad_routing_weights"], p.tokens, p.hidden,
        SPLIT_K=0 if routing_only else 2 * p.dx_split, ROUTING_CHUNKS=p.routing_chunks, BLOCK_H=ROW_BLOCK_H,
    )  # fmt: skip


# Call contexts kept (call_context): a training run meets a few shapes, a benchmark suite ten; each context holds the
# scratch of one shape (about 0.3 GB at T = 2048).
CONTEXTS_KEPT = 8
_CONTEXTS: collections.OrderedDict[tuple, Problem] = collections.OrderedDict()


def call_context(tensors: Sequence[torch.Tensor], plan: Plan, precise_dtype: torch.dtype) -> Problem:
    """The Problem that serves calls of this plan on tensors of these shapes, strides, dtypes and 16-byte alignment
    (which is all the kernels' specialisation depends on) on the current stream: made, and the plan checked against
    the shapes, on the first such call."""
    first = tensors[0]
    stream = torch._C._cuda_getCurrentRawStream(first.device.index) if first.is_cuda else None
    key = (plan, precise_dtype, first.device, stream, *((t.dtype, t.shape, t.stride(), t.data_ptr() % 16) for t in tensors))
    p = _CONTEXTS.get(key)
    if p is None:
        p = _new_problem(tensors, plan, precise_dtype)
        _CONTEXTS[key] = p
        if len(_CONTEXTS) > CONTEXTS_KEPT:
            _CONTEXTS.popitem(last=False)
    else:
        _CONTEXTS.move_to_end(key)
    return p


def _new_problem(tensors: Sequence[torch.Tensor], plan: Plan, precise_dtype: torch.dtype) -> Problem:
    """Check that the plan can run on these tensors and make their Problem."""
    if len(tensors) != len(INPUT_NAMES) + len(OUTPUT_NAMES):
        raise ValueError(f"backward takes the {len(INPUT_NAMES)} inputs and {len(OUTPUT_NAMES)} outputs, not {len(tensors)} tensors")
    inputs = dict(zip(INPUT_NAMES, tensors[:12]))
    outputs = dict(zip(OUTPUT_NAMES, tensors[12:]))
    hidden, ffn = inputs["grad_output"].shape[1], inputs["w1_weight"].shape[0]
    tokens = inputs["token_indices"].numel()
    if hidden % plan.dh.block_k or ffn % plan.dx.block_k:
        raise ValueError(f"hidden_dim {hidden} and ffn_dim {ffn} must be multiples of the K steps of {plan}")
    if any(ROW_PAD % t.block_m for t in (plan.dh, plan.dx)) or any(ROW_PAD % t.block_k for t in (plan.grad_w2, plan.grad_w13)):
        raise ValueError(f"the rows of the intermediates are padded to {ROW_PAD}: a multiple of every tile's rows and K steps")
    for name, allowed in (("x16_at", X16At), ("zeros_at", ZerosAt)):
        if getattr(plan, name) not in get_args(allowed):
            raise ValueError(f"{name} must be one of {get_args(allowed)}, not {getattr(plan, name)!r}")
    if plan.dh_warp_specialized is not None and plan.dh_gathers_rows:
        raise ValueError("the warp-specialised dh reads the gathered copy of g: it cannot gather its own rows")
    for gluon_weight_grad in (plan.grad_w13_warp_specialized, plan.grad_w2_warp_specialized):
        if gluon_weight_grad is not None:
            _check_weight_grad(gluon_weight_grad, tokens)
    if plan.x16_at == "after_gather" and (plan.dh_gathers_rows or not plan.grad_w2_on_side):
        raise ValueError("x16_at 'after_gather' runs x16 on the side stream behind the gather on the caller's stream")
    if plan.zeros_at == "after_dx" and (any(plan.dx_on_side) or plan.dx_grad_w13 is not None):
        raise ValueError("zeros_at 'after_dx' runs the zeros behind dx on the caller's stream: both halves of dx must be there")
    if plan.zeros_at == "last" and plan.scatter_on_side:
        raise ValueError("zeros_at 'last' puts the zeros behind everything on the side stream, scatter_on_side's scatter too")
    if plan.dh_programmatic_launch and plan.dh_warp_specialized is None:
        raise ValueError("the programmatic launch of dh behind the gather needs the warp-specialised dh, which waits for it")
    if plan.dx_swap_ab is not None:
        if plan.dx_warp_specialized:
            raise ValueError("dx is either the swap-AB kernel (over the bf16 copy) or the warp-specialised one (over dd)")
        chunks = plan.dx_swap_ab.chunks
        if not 1 <= len(chunks) <= 3 or any(c not in (8, 16, 32, 64, 128, 256) for c in chunks):
            raise ValueError(f"the swap-AB dx takes one to three token chunks, powers of two from 8 to 256, not {chunks}")
    if plan.dh_warp_specialized is not None and plan.dx_warp_specialized:
        raise ValueError("the warp-specialised dx needs Triton's dh: the Gluon dh writes the bf16 copy of dd for Triton's dx")
    if plan.dx_writes_rows:
        _check_dx_writes_rows(plan)
    if plan.dx_grad_w13 is not None:
        _check_dx_grad_w13(plan, tokens, ffn)
    if plan.scatter_after_dx and (any(plan.dx_on_side) or plan.scatter_on_side or plan.dx_writes_rows or plan.dx_grad_w13):
        raise ValueError("scatter_after_dx runs scatter behind both halves of dx on the caller's stream: not with dx on the "
                         "side stream, scatter_on_side, dx_writes_rows or dx_grad_w13")
    return Problem(inputs, outputs, precise_dtype, dx_split_for(plan, ffn), grad_w2_last_step(plan, tokens),
                needs_low_copy(plan), plan.dx_writes_rows,
                triton.cdiv(tokens, plan.dx.block_m) * triton.cdiv(hidden, plan.dx.block_n),
                dx_sums_halves=plan.dx_writes_rows and not plan.dx_warp_specialized)  # fmt: skip


def backward(*tensors: torch.Tensor, plan: Plan | None = None, precise_dtype: torch.dtype = torch.float16) -> None:
    """The whole backward on the 12 inputs and 5 outputs named by INPUT_NAMES and OUTPUT_NAMES, in that order.

    `precise_dtype` holds d_a, d_up and x for the weight gradients (fp16 on the GPU; the CPU tests use fp32).
    """
    plan = plan or plan_for(tensors[1].numel())
    p = call_context(tensors, plan, precise_dtype)
    if p.program.recorded:
        p.program.replay(tensors)
        return
    p.begin(tensors)
    _issue(p, plan)
    p.end()


def _issue(p: Problem, plan: Plan) -> None:
    """The launcher's code: every launch of the call on the streams the plan names, through p (which records them on
    a context's first call)."""
    # Two streams where the plan asks. The side stream first writes ge if dh gathers its own rows, then what needs
    # nothing computed (x16 and the routing sums, the zeros of unselected rows: memory traffic beside dh's tensor-core
    # work, unless the plan's x16_at and zeros_at put them later), then grad_w2 once the gather has written ge, then
    # whatever of dx, scatter and grad_w1/grad_w3 the plan puts there once dh (for scatter: all of dx) is done. The
    # caller's stream waits for x16 (and ge, if it runs grad_w2) before grad_w1/grad_w3 (and its scatter) and for all of
    # the side stream at the end, so every buffer outlives its use there and the caller's stream sees all of the work.
    side = _side_stream(p.g.device) if p.g.is_cuda and plan.uses_side_stream else None
    caller = p.caller if side is not None else None  # only used with a side stream
    with _beside(p, side, True):
        if plan.dh_gathers_rows:
            gather(p, write_g=False)
        # dx's arrival counters, which the gather zeroes, where the gather runs on the side stream
        counters_zeroed = p.recorded_event(side) if plan.dh_gathers_rows and p.arrivals is not None else None
        if plan.zeros_at == "start":
            zero_unselected(p)
        if plan.x16_at == "start":
            routing_x16(p)
        side_operands_ready = p.recorded_event(side)
    if not plan.dh_gathers_rows:
        gather(p, launch_dependents=plan.dh_programmatic_launch)
    with _beside(p, side, plan.grad_w2_on_side):
        if side_operands_ready is not None and not plan.grad_w2_on_side:
            p.wait(caller, side_operands_ready)  # ge may come from the side stream
        if plan.x16_at == "after_gather":
            routing_x16(p)
            side_operands_ready = p.recorded_event(side)
        grad_w2(p, plan.grad_w2, plan.grad_w2_warp_specialized)
        if plan.zeros_at == "after_grad_w2":
            zero_unselected(p)
    if plan.dh_warp_specialized is not None:
        dh_swiglu_warp_specialized(p, plan.dh_warp_specialized, plan.dh_programmatic_launch)
    else:
        dh_swiglu(p, plan.dh, gathered=not plan.dh_gathers_rows)
    dh_done = p.recorded_event(caller)
    if "after_dh" in (plan.x16_at, plan.zeros_at):
        with _after(p, side, dh_done):
            if plan.zeros_at == "after_dh":
                zero_unselected(p)
            if plan.x16_at == "after_dh":
                routing_x16(p)
                side_operands_ready = p.recorded_event(side)
    scatter_on_side = side is not None and plan.scatter_on_side and plan.dx_grad_w13 is None
    if counters_zeroed is not None:
        p.wait(caller, counters_zeroed)
    if plan.dx_grad_w13 is not None:
        if side_operands_ready is not None:
            p.wait(caller, side_operands_ready)
        dx_grad_w13(p, plan.dx_grad_w13)
    else:
        _dx_and_grad_w13(p, plan, side, caller, dh_done, side_operands_ready, scatter_on_side)
    if plan.zeros_at == "last":
        with _after(p, side, dh_done):  # the side stream is past dh_done already
            zero_unselected(p)
    if side is not None:
        p.wait(caller, p.recorded_event(side))
    if not (scatter_on_side or plan.scatter_after_dx or plan.dx_writes_rows):
        scatter(p)


def _dx_and_grad_w13(p: Problem, plan: Plan, side: torch.cuda.Stream | None, caller: torch.cuda.Stream | None,
                     dh_done: torch.cuda.Event | None, side_operands_ready: torch.cuda.Event | None,
                     scatter_on_side: bool) -> None:  # fmt: skip
    """dx's halves and grad_w1/grad_w3 (and scatter, where the plan puts it on the side stream or right behind dx) as
    separate stages, on the streams the plan names, once dh is done (dh_done) and x16 is written (side_operands_ready)."""
    on_side = [half for half in (0, 1) if side is not None and plan.dx_on_side[half]]
    dx(p, plan.dx, [half for half in (0, 1) if half not in on_side], plan.dx_warp_specialized, plan.dx_swap_ab)
    if plan.scatter_after_dx:
        if side_operands_ready is not None:
            p.wait(caller, side_operands_ready)  # the routing sums
        scatter(p)
    if plan.zeros_at == "after_dx":
        zero_unselected(p)
    caller_dx_done = p.recorded_event(caller) if scatter_on_side else None
    if on_side:
        with _after(p, side, dh_done):
            dx(p, plan.dx, on_side, plan.dx_warp_specialized, plan.dx_swap_ab)
    if scatter_on_side:
        with _after(p, side, caller_dx_done):  # the routing sums are ordered before it on the side stream already
            scatter(p)
    if side is not None and plan.grad_w13_on_side:
        with _after(p, side, dh_done):  # x16 is ordered before it on the side stream already
            grad_w13(p, plan.grad_w13, plan.grad_w13_warp_specialized)
    else:
        if side_operands_ready is not None:
            p.wait(caller, side_operands_ready)
        grad_w13(p, plan.grad_w13, plan.grad_w13_warp_specialized)


@contextlib.contextmanager
def _beside(p: Problem, side: torch.cuda.Stream | None, enabled: bool) -> Iterator[None]:
    """Issue the block's launches on the side stream, after everything issued so far on the caller's, if enabled."""
    if side is None or not enabled:
        yield
        return
    p.wait(side, p.recorded_event(p.caller))
    with p.issuing_on(side):
        yield


@contextlib.contextmanager
def _after(p: Problem, side: torch.cuda.Stream | None, event: torch.cuda.Event | None) -> Iterator[None]:
    """Issue the block's launches on the side stream, after the work that `event` marks (without a side stream: in
    order)."""
    if side is None:
        yield
        return
    p.wait(side, event)
    with p.issuing_on(side):
        yield


_SIDE_STREAMS: dict[torch.device, torch.cuda.Stream] = {}


def _side_stream(device: torch.device) -> torch.cuda.Stream:
    if device not in _SIDE_STREAMS:
        _SIDE_STREAMS[device] = torch.cuda.Stream(device)
    return _SIDE_STREAMS[device]


def run(*tensors: torch.Tensor) -> None:
    backward(*tensors)


def compiled_variants() -> int:
    """How many compiled binaries the twelve kernels hold (Triton's per-device caches): a test uses it to prove
    that a bucket compiles once and that later calls in the bucket compile nothing."""
    kernels = (
        gather_kernel, routing_x16_kernel, zero_unselected_kernel, dh_swiglu_kernel, dh_swiglu_ws_kernel, weight_grad_kernel,
        weight_grad_ws_kernel, dx_kernel, dx_ws_kernel, dx_swap_ab_kernel, dx_grad_weight_ws_kernel, scatter_kernel,
    )  # fmt: skip
    return sum(len(caches[0]) for kernel in kernels for caches in kernel.device_caches.values())
