"""What the launcher runs for a given T: a kernel choice per stage, its tiles, and the schedule of the two streams.

A Plan names one kernel for each of the backward's stages, each choice a type of its own that carries only what that
kernel takes and checks it:

- dh (g @ w2 with the SwiGLU backward in its epilogue): Triton's kernel (`TritonDh`, which may gather its own rows of
  grad_output), the warp-specialised Gluon kernel (`GluonDh`), or, for T <= 160, its product transposed (swap-AB)
  with grad_w2 in the same pass over w2 (`DhGradW2`, which then also stands for grad_w2);
- each weight gradient (grad_w2, and grad_w1 with grad_w3): Triton's persistent kernel (`TritonWeightGrad`) or the
  Gluon one (`GluonWeightGrad`, with a short last K step and tiles dealt out or claimed from a counter);
- dx: Triton's split-K kernel (`TritonDx`), the Gluon kernel over the fp16 dd (`GluonDx`), or one Gluon kernel for dx
  with grad_w1 and grad_w3 (`FusedDxGradW13`, which then also stands for the weight gradient);

and a `Schedule`: which stages run on the second ("side") stream and where the per-token kernels (x16 with the routing
sums, the zeros of unselected rows, the scatter) go. Plans are chosen per bucket of T (PLANS), and above 1024 by how
dx's tiles fill the SMs' waves (plan_for); the kernels do not specialise on T or B, so each plan compiles once. Why each
bucket's plan is what it is, with the A/B figures that chose it, is in docs/performance.md ("Plans per bucket").
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import Literal, get_args

# The rows of the (T, .) intermediates (g, ge, x16, dd) are padded with zeros to a multiple of ROW_PAD, a multiple of
# every tile's block_m and block_k (Plan.check), so that no GEMM operand block of them reaches past their end.
ROW_PAD = 128
WS_BLOCK_M = 128  # rows of the Gluon dh's and weight gradient's tiles (two warpgroups of 64-row wgmma)
WS_BLOCK_K = 64  # the Gluon weight gradient's whole K step (tokens)
# Its short last K step: where at most this many tokens are left after the whole steps, they are a step of this many
# rows rather than of 64.
WS_SHORT_STEP = 32
# Registers per thread of the Gluon weight gradient's second product warpgroup (Triton's compiler then gives the first
# 248 and the loader warp 24: the 12 warps' share of an SM's 64K registers).
WS_PRODUCT_REGS = 232
FUSED_HEAD_ROWS = 128  # FusedDxGradW13: all the tokens in one block of rows (this many, then a tail of 32 or 64),
FUSED_BLOCK_N = 128  # by this many hidden columns per program,
FUSED_BLOCK_K = 64  # in K steps of this many of the 2F columns
# Registers per thread of each product warpgroup after the first of FusedDxGradW13, by its block of tokens (block_m):
# with a tail, three product warpgroups and the loader (padded to a warpgroup), 2 x 160 + 24 per thread leave the first
# 168.
FUSED_PRODUCT_REGS = {128: WS_PRODUCT_REGS, 160: 160, 192: 160}
SWAP_BLOCK_F = 128  # DhGradW2: columns of F per program (wgmma's M),
SWAP_TAIL_ROWS = 32  # the tokens past the first WS_BLOCK_M in its tail's accumulator,
SWAP_ACT_WIDTH = 32  # and the columns of its epilogue's pieces


@dataclass(frozen=True, kw_only=True)
class Tile:
    """A Triton kernel's tile (kernels.py): block sizes, warps and pipeline stages."""

    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int


@dataclass(frozen=True)
class TritonDh:
    """dh by Triton's dh_swiglu_kernel, one program per tile. With gathers_rows it loads its rows of grad_output itself
    (pointer loads, slower than TMA), so that no kernel stands between the call's start and dh: the launcher then issues
    dh first and the gather, which writes only the weighted copy ge for grad_w2, on the side stream."""

    tile: Tile
    gathers_rows: bool = False
    epilogue_split: int = 1  # the epilogue on the tile's columns in this many pieces: 1, 2 or 4

    def __post_init__(self) -> None:
        if self.epilogue_split not in (1, 2, 4):
            raise ValueError(f"dh_swiglu_kernel splits its epilogue into 1, 2 or 4 pieces, not {self.epilogue_split}")


@dataclass(frozen=True, kw_only=True)
class GluonDh:
    """dh by the warp-specialised Gluon kernel (dh_warp_specialized.py): tiles of 128 tokens x block_n ffn columns, a
    tile's epilogue under the next tile's products; it reads the gathered copy of g."""

    block_k: int  # hidden columns per operand stage
    stages: int  # operand stages in shared memory
    act_width: int  # ffn columns per epilogue piece
    act_buffers: int  # epilogue pieces whose activations are in flight
    block_n: int = 256  # ffn columns per tile: 128 gives twice the tiles, so the busiest program is nearer the average
    # As few programs as keep the busiest one's tile count rather than one per SM: the SMs left free run the side
    # stream's kernels from the start.
    fewest_programs: bool = False
    # Launched as a programmatic dependent of the gather right before it: its programs hold their SMs before grad_w2,
    # released on the side stream by the gather's end, can take them; its loader waits for the gather before reading g.
    after_gather: bool = False
    # The last tile's activations loaded through the operand ring, free by then: its epilogue, under no products,
    # has as many pieces in flight as the ring's w2 stages hold (8 with 3 stages of 256 columns), not act_buffers.
    last_tile_in_ring: bool = False


@dataclass(frozen=True, kw_only=True)
class DhGradW2:
    """dh with grad_w2 in one Gluon kernel (dh_grad_w2.py): dh^T = w2^T g^T (swap-AB), one program per SWAP_BLOCK_F
    columns of F over all the tokens (at most `rows`: 128, or 160 with a tail), whose warpgroup for grad_w2 computes,
    at each K step, the block of grad_w2 that step's block of w2 matches. Writes all those rows of dd and no bf16
    copy; launched as a programmatic dependent of the gather right before it, whose g it reads."""

    stages: int  # ring stages: 4 (5 fit without a tail, and are slower)
    tail: bool
    block_k = WS_BLOCK_K  # hidden columns per K step

    @property
    def rows(self) -> int:
        return WS_BLOCK_M + SWAP_TAIL_ROWS * self.tail


Dh = TritonDh | GluonDh | DhGradW2


@dataclass(frozen=True)
class TritonWeightGrad:
    """A weight gradient by Triton's weight_grad_kernel: one program per tile, or a persistent grid of programs_per_sm
    programs per SM, each walking several tiles."""

    tile: Tile
    programs_per_sm: int = 0
    flatten: bool = False  # with a persistent grid: pipeline the loads of the next tile under this tile's epilogue


@dataclass(frozen=True, kw_only=True)
class GluonWeightGrad:
    """A weight gradient by the warp-specialised Gluon kernel (weight_grad_warp_specialized.py): tiles of 128 output
    rows x 256 columns, two product warpgroups of 64 rows, K steps of 64 tokens and a last one as short as 32."""

    stages: int = 4  # operand stages in shared memory
    by_column: bool = False  # tiles column by column, so that a wave of tiles shares a few column slabs of B
    # Tiles claimed one at a time from a counter in memory rather than dealt out in advance: programs that start late,
    # on SMs the stage before frees last, take fewer tiles
    dynamic: bool = False


WeightGrad = TritonWeightGrad | GluonWeightGrad


@dataclass(frozen=True, kw_only=True)
class TritonDx:
    """dx by Triton's dx_kernel over the bf16 copy of dd: one launch per half of K (d_a @ w1, d_up @ w3) into split-K
    partials that the scatter sums, or with to_rows one unsplit launch over both halves whose programs store their
    tiles into the selected rows of grad_hidden_states: no scatter then."""

    tile: Tile
    split: int  # split-K factor per half (an upper bound: reduced until its slices are whole K steps of F)
    to_rows: bool = False

    def __post_init__(self) -> None:
        if self.to_rows and self.split != 1:
            raise ValueError(f"Triton's dx into the rows runs unsplit, each program over all of K: split 1, not {self.split}")


@dataclass(frozen=True, kw_only=True)
class GluonDx:
    """dx by the warp-specialised Gluon kernel (dx_warp_specialized.py): one launch over K = 2F that reads the fp16 dd
    and rounds it to bf16 in registers, so dh writes no bf16 copy. With to_rows no scatter ends the call: the last of a
    tile's programs (one per slice of each half) to arrive adds their partials and stores the selected rows."""

    tile: Tile
    split: int
    to_rows: bool = False


@dataclass(frozen=True, kw_only=True)
class FusedDxGradW13:
    """dx with grad_w1 and grad_w3 in one pass over the weights (dx_grad_weight_warp_specialized.py): each step reads a
    block of w1 or w3 and writes the same block of its gradient. All T <= block_m tokens in one block of rows, 64 to
    a product warpgroup; on the caller's stream right behind dh."""

    stages: int
    split: int  # split of each weight's F
    block_m: int = 128  # a key of FUSED_PRODUCT_REGS: 128, 160 or 192

    def __post_init__(self) -> None:
        if self.block_m not in FUSED_PRODUCT_REGS:
            rows = ", ".join(map(str, FUSED_PRODUCT_REGS))
            raise ValueError(f"dx with grad_w1/grad_w3 takes its tokens in {rows} rows, not {self.block_m}")


Dx = TritonDx | GluonDx | FusedDxGradW13

X16At = Literal["start", "after_gather", "after_dh"]
ZerosAt = Literal["start", "after_grad_w2", "after_dh", "after_dx"]
ScatterAt = Literal["end", "side"]


@dataclass(frozen=True, kw_only=True)
class Schedule:
    """Where the stages run. The caller's stream runs, in order: dh (first, where it gathers its own rows; else behind
    the gather), the dx halves not on the side stream, and grad_w1/grad_w3 unless on the side stream; the side stream
    runs grad_w2 once ge is written (beside dh), then whatever of dx and grad_w1/grad_w3 this puts there once dh is done.
    """

    side_stream: bool = True  # False: every stage on the caller's stream, in the order above
    # routing_x16 (x16 and the routing sums, which grad_w1/grad_w3 and scatter read) on the side stream: "start" beside
    # dh, "after_gather" once the gather is done (ahead of grad_w2), "after_dh" once dh is done
    x16_at: X16At = "start"
    # zero_unselected (rows and routing entries no token selects): on the side stream at "start", "after_grad_w2" (once
    # the gather is done, behind grad_w2 where the plan has one) or "after_dh", or on the caller's stream right behind
    # dx ("after_dx")
    zeros_at: ZerosAt = "start"
    dx_on_side: tuple[bool, bool] = (False, False)  # dx's w1 half, its w3 half (one launch takes both where they agree)
    grad_w13_on_side: bool = False
    # scatter: last on the caller's stream ("end"), or on the side stream once dx is done ("side", beside
    # grad_w1/grad_w3)
    scatter_at: ScatterAt = "end"
    # dh issued right behind the gather, ahead of the side stream's launches (x16, grad_w2, the zeros), so that a call
    # made on an idle GPU starts dh as soon as the gather ends rather than once the host has issued those (where dh
    # gathers its own rows it is issued first anyway)
    dh_behind_gather: bool = False

    def __post_init__(self) -> None:
        for name, allowed in (("x16_at", X16At), ("zeros_at", ZerosAt), ("scatter_at", ScatterAt)):
            if getattr(self, name) not in get_args(allowed):
                raise ValueError(f"{name} must be one of {get_args(allowed)}, not {getattr(self, name)!r}")
        if self.zeros_at == "after_dx" and any(self.dx_on_side):
            raise ValueError(
                "zeros_at 'after_dx' runs the zeros behind dx on the caller's stream: both halves of dx must be there"
            )


@dataclass(frozen=True, kw_only=True)
class Plan:
    """One bucket's kernels, tiles and schedule; the combinations that cannot run are refused here, and what depends on
    the shapes by `check`."""

    dh: Dh
    grad_w2: WeightGrad | None  # None where dh is DhGradW2, which computes grad_w2 too
    grad_w13: WeightGrad | None  # None where dx is FusedDxGradW13, which computes grad_w1/grad_w3 too
    dx: Dx
    schedule: Schedule = Schedule()

    def __post_init__(self) -> None:
        s, fused = self.schedule, isinstance(self.dx, FusedDxGradW13)
        if fused != (self.grad_w13 is None):
            raise ValueError("grad_w13 is None exactly where dx is FusedDxGradW13, which computes grad_w1/grad_w3 with dx")
        if isinstance(self.dh, DhGradW2) != (self.grad_w2 is None):
            raise ValueError("grad_w2 is None exactly where dh is DhGradW2, which computes grad_w2 with dh")
        if fused and (any(s.dx_on_side) or s.grad_w13_on_side or s.scatter_at != "end" or s.zeros_at == "after_dx"):
            raise ValueError("dx with grad_w1/grad_w3 runs behind dh on the caller's stream, and scatter last")
        if self.to_rows and (s.dx_on_side[0] != s.dx_on_side[1] or s.scatter_at != "end"):
            raise ValueError("dx into the rows of grad_hidden_states takes both halves of K in one launch on one stream "
                             "(equal dx_on_side) and leaves no scatter (scatter_at 'end')")  # fmt: skip
        if s.x16_at == "after_gather" and self.gathers_rows:
            raise ValueError("x16_at 'after_gather' needs the gather on the caller's stream: where dh gathers its own rows "
                             "it runs first on the side stream")  # fmt: skip
        if isinstance(self.dh, DhGradW2) and self.low_copy:
            raise ValueError("dh with grad_w2 writes no bf16 copy of dd, which Triton's dx reads")

    @property
    def gathers_rows(self) -> bool:
        return isinstance(self.dh, TritonDh) and self.dh.gathers_rows

    @property
    def dh_after_gather(self) -> bool:
        """dh is launched as a programmatic dependent of the gather right before it (which then allows it early)."""
        return isinstance(self.dh, DhGradW2) or (isinstance(self.dh, GluonDh) and self.dh.after_gather)

    @property
    def to_rows(self) -> bool:
        """dx stores the selected rows of grad_hidden_states itself: no scatter ends the call."""
        return isinstance(self.dx, (TritonDx, GluonDx)) and self.dx.to_rows

    @property
    def low_copy(self) -> bool:
        """Whether dh writes dd_low, the bf16 copy of dd: Triton's dx reads it; the Gluon dx and the fused dx with
        grad_w1/grad_w3 read the fp16 dd."""
        return isinstance(self.dx, TritonDx)

    def dx_k_step(self) -> int:
        """dx's K step (of F)."""
        return FUSED_BLOCK_K if isinstance(self.dx, FusedDxGradW13) else self.dx.tile.block_k

    def dx_split(self, ffn: int) -> int:
        """The largest split-K factor up to the plan's whose slices are whole K steps of F."""
        step = self.dx_k_step()
        return max(s for s in range(1, self.dx.split + 1) if ffn % (s * step) == 0)

    def grad_w2_last_step(self, tokens: int) -> int:
        """The rows of grad_w2's last K step, whose block of ge the gather shifts (gather_kernel; where dh computes
        grad_w2, no kernel reads ge)."""
        if self.grad_w2 is None:
            return WS_BLOCK_K
        if isinstance(self.grad_w2, TritonWeightGrad):
            return self.grad_w2.tile.block_k
        return WS_SHORT_STEP if weight_grad_steps(tokens)[1] else WS_BLOCK_K

    def on_one_stream(self) -> Plan:
        """The same kernels and tiles with every stage on the caller's stream (the tests' point of comparison)."""
        return replace(self, schedule=replace(self.schedule, side_stream=False))

    def check(self, tokens: int, hidden: int, ffn: int) -> None:
        """Refuse shapes this plan cannot run."""
        dh_step = self.dh.tile.block_k if isinstance(self.dh, TritonDh) else self.dh.block_k
        if hidden % dh_step or ffn % self.dx_k_step():
            raise ValueError(f"hidden_dim {hidden} and ffn_dim {ffn} must be multiples of the K steps of {self}")
        tiles = [t.tile for t in (self.dh, self.dx) if hasattr(t, "tile")]
        weight_tiles = [t.tile for t in (self.grad_w2, self.grad_w13) if isinstance(t, TritonWeightGrad)]
        if any(ROW_PAD % t.block_m for t in tiles) or any(ROW_PAD % t.block_k for t in weight_tiles):
            raise ValueError(
                f"the rows of the intermediates are padded to {ROW_PAD}: a multiple of every tile's rows and K steps"
            )
        if isinstance(self.dh, DhGradW2) and tokens > self.dh.rows:
            raise ValueError(f"dh with grad_w2 takes at most {self.dh.rows} tokens, not {tokens}")
        if isinstance(self.dx, FusedDxGradW13):
            block_m = self.dx.block_m
            if isinstance(self.dh, DhGradW2):
                dh_rows = self.dh.rows
                written = min(dh_rows, -(-tokens // ROW_PAD) * ROW_PAD)  # all its rows, those of dd
            else:
                dh_rows = self.dh.tile.block_m if isinstance(self.dh, TritonDh) else WS_BLOCK_M
                written = -(-tokens // dh_rows) * dh_rows
            if tokens > block_m or written < block_m:
                # it reads block_m rows of dd, which dh must all have written (rows past T as zeros)
                raise ValueError(f"dx with grad_w1/grad_w3 reads {block_m} rows of dd: T = {tokens} must be at most "
                                 f"that, and dh's tiles of {dh_rows} rows must cover them")  # fmt: skip


def weight_grad_steps(tokens: int) -> tuple[int, int]:
    """(whole K steps, short ones) of the Gluon weight gradient: a last step of at most WS_SHORT_STEP tokens is short."""
    left = tokens % WS_BLOCK_K
    if 0 < left <= WS_SHORT_STEP:
        return tokens // WS_BLOCK_K, 1
    return -(-tokens // WS_BLOCK_K), 0


# Tiles shared by several buckets.
_DX_WIDE = Tile(block_m=128, block_n=256, block_k=64, num_warps=8, num_stages=4)
_DH_WIDE = Tile(block_m=128, block_n=256, block_k=64, num_warps=8, num_stages=4)
_GLUON_DH_SMALL_TILES = GluonDh(block_k=64, stages=5, act_width=16, act_buffers=2, block_n=128, after_gather=True)
_GLUON_DX_INTO_ROWS = GluonDx(tile=_DX_WIDE, split=1, to_rows=True)

# (largest T of the bucket, plan); the last bucket takes every larger T.
PLANS: tuple[tuple[int, Plan], ...] = (
    # Memory-bound: Triton's dh and weight gradients; dx's w3 half behind dh, its w1 half and scatter beside
    # grad_w1/grad_w3. dh streams w2 with 6 stages in flight per program: deeper pipelines read it faster, until its 224
    # programs no longer fit on the SMs at once. Its loads wait on memory with few warps to issue from: 8 warps per tile
    # issue more. dx is the Gluon kernel over the fp16 dd, one warpgroup per 64 x 256 tile, 5 stages: dh writes no bf16
    # copy of dd.
    (64, Plan(
        dh=TritonDh(Tile(block_m=64, block_n=64, block_k=64, num_warps=8, num_stages=6), gathers_rows=True),
        grad_w2=TritonWeightGrad(Tile(block_m=128, block_n=128, block_k=64, num_warps=4, num_stages=4),
                                 programs_per_sm=1, flatten=True),
        grad_w13=TritonWeightGrad(Tile(block_m=128, block_n=128, block_k=64, num_warps=4, num_stages=2),
                                  programs_per_sm=2, flatten=True),
        dx=GluonDx(tile=Tile(block_m=64, block_n=256, block_k=64, num_warps=4, num_stages=5), split=4),
        schedule=Schedule(dx_on_side=(True, False), scatter_at="side"),
    )),
    # One pass over w1 and w3 for dx and their gradients, and over w2 for dh and grad_w2: each weight read once and its
    # gradient written beside, dx right behind dh with all the SMs. The host issues the gather and dh before x16 and the
    # zeros, which an idle GPU would otherwise start first.
    (128, _FUSED_PLAN := Plan(
        dh=DhGradW2(stages=4, tail=False),
        grad_w2=None,
        grad_w13=None,
        dx=FusedDxGradW13(stages=4, split=2),
        schedule=Schedule(x16_at="after_gather", zeros_at="after_grad_w2", dh_behind_gather=True),
    )),
    # The same over 160 or 192 token rows, a third product warpgroup taking the tail past 128 (the gradient's product
    # over the tail is as long as the tail; at 192 rows 4 stages exceed shared memory). Up to 160 dh with grad_w2, 32
    # tokens in their tail; above, dh in 128 x 256 tiles, two rows of them (three rows of 64 were slower), grad_w2
    # beside it.
    (160, replace(_FUSED_PLAN, dh=replace(_FUSED_PLAN.dh, tail=True), dx=FusedDxGradW13(stages=4, split=2, block_m=160))),
    (192, Plan(
        dh=TritonDh(_DH_WIDE, gathers_rows=True, epilogue_split=4),
        grad_w2=GluonWeightGrad(),
        grad_w13=None,
        dx=FusedDxGradW13(stages=3, split=2, block_m=192),
    )),
    # dx, which reads the weights, beside grad_w1/grad_w3, which writes theirs: they share the GPU's bound.
    # dh's tiles in 16 warps, 128 registers a thread rather than 255 in 8, its epilogue in halves.
    (256, Plan(
        dh=TritonDh(replace(_DH_WIDE, num_warps=16), gathers_rows=True, epilogue_split=2),
        grad_w2=GluonWeightGrad(dynamic=True),
        grad_w13=GluonWeightGrad(dynamic=True),
        dx=_GLUON_DX_INTO_ROWS,
        schedule=Schedule(grad_w13_on_side=True),
    )),
    # From here the Gluon dh, right behind the gather; dx first after it, grad_w1/grad_w3 beside dx. Up to 1024 the
    # Gluon dx over the fp16 dd, into the selected rows: dh writes no bf16 copy and no scatter ends the call.
    (320, Plan(
        dh=_GLUON_DH_SMALL_TILES,
        grad_w2=GluonWeightGrad(by_column=True, dynamic=True),
        grad_w13=GluonWeightGrad(dynamic=True),
        dx=_GLUON_DX_INTO_ROWS,
        schedule=Schedule(x16_at="after_gather", zeros_at="after_dh", grad_w13_on_side=True, dh_behind_gather=True),
    )),
    (384, Plan(
        dh=_GLUON_DH_SMALL_TILES,
        grad_w2=GluonWeightGrad(by_column=True),
        grad_w13=GluonWeightGrad(dynamic=True),
        dx=_GLUON_DX_INTO_ROWS,
        schedule=Schedule(x16_at="after_dh", zeros_at="after_dh", grad_w13_on_side=True, dh_behind_gather=True),
    )),
    # The zeros behind dx, out of the side stream's way.
    (1024, Plan(
        dh=_GLUON_DH_SMALL_TILES,
        grad_w2=GluonWeightGrad(by_column=True, dynamic=True),
        grad_w13=GluonWeightGrad(dynamic=True),
        dx=_GLUON_DX_INTO_ROWS,
        schedule=Schedule(x16_at="after_dh", zeros_at="after_dx", grad_w13_on_side=True, dh_behind_gather=True),
    )),
    # Compute-bound: the Gluon dh in 128 x 256 tiles on the fewest programs, its last tile's activations through the
    # operand ring (one activation buffer fits beside the ring), x16 on the SMs it leaves free; dx's tiles of 128 rows
    # or, where they pay (short_dx_tiles_pay), of 64.
    (1 << 30, _LARGE_T_PLAN := Plan(
        dh=GluonDh(block_k=64, stages=3, act_width=16, act_buffers=1, fewest_programs=True, after_gather=True,
                   last_tile_in_ring=True),
        grad_w2=GluonWeightGrad(by_column=True, dynamic=True),
        grad_w13=GluonWeightGrad(),
        dx=TritonDx(tile=_DX_WIDE, split=1, to_rows=True),
        schedule=Schedule(x16_at="after_gather", zeros_at="after_grad_w2", dx_on_side=(True, True)),
    )),
)  # fmt: skip
_LARGE_T_PLAN_SHORT_DX = replace(_LARGE_T_PLAN, dx=TritonDx(tile=replace(_DX_WIDE, block_m=64), split=1, to_rows=True))

# Above 1024 dx's tiles (T / 128 rows by H / 256 columns, H = 4096 here) run in whole waves over the H200's 132 SMs, so
# a T whose tiles just pass a multiple of 132 pays a nearly empty wave: T = 2049 runs 272 tiles in 3 waves where 2048
# runs 256 in 2. Tiles of 64 rows, each taking about 0.56 of a 128-row tile's time, fill their waves differently.
DX_COLUMN_TILES = 4096 // _DX_WIDE.block_n
H200_MULTIPROCESSORS = 132
SHORT_DX_TILE_TIME = 0.56


def short_dx_tiles_pay(tokens: int) -> bool:
    """Whether dx in 64-row tiles takes less time than in 128-row ones at T = `tokens`, counting whole waves."""

    def waves(block_m: int) -> int:
        tiles = -(-tokens // block_m) * DX_COLUMN_TILES
        return -(-tiles // H200_MULTIPROCESSORS)

    return SHORT_DX_TILE_TIME * waves(64) < waves(128)


@functools.cache
def plan_for(num_tokens: int) -> Plan:
    """The plan of the first bucket of PLANS whose limit holds T = `num_tokens`; above 1024, with dx in 64-row tiles
    where short_dx_tiles_pay."""
    plan = next(plan for limit, plan in PLANS if num_tokens <= limit)
    if plan is _LARGE_T_PLAN and short_dx_tiles_pay(num_tokens):
        return _LARGE_T_PLAN_SHORT_DX
    return plan
