"""dx's split-K partials and [grad_w1; grad_w3] in one pass over the weights, as a warp-specialised Gluon kernel
(Hopper), for T <= 192 tokens.

At small T the backward is bound by memory: reading w1 and w3 (dx) and writing their gradients are 470 of its
721-756 MB. Here every K step of a program reads one (BLOCK_K, BLOCK_N) block of a weight and writes the same block of
its gradient, so the kernel moves its bytes as a copy does:

- one loader warp loads this program's block of x16 (all BLOCK_M tokens by its BLOCK_N hidden columns, fp16) once, then
  streams the K steps by TMA into a ring of STAGES stages: dd[:, k] (fp16, one (ROWS, 2F) descriptor, so K runs over the
  2F columns of [d_a | d_up]) and the matching block of w1 (k < F) or w3 (k - F). At BLOCK_M = 160 or 192 the tokens
  past the first 128 come as a tail block of 32 or 64 rows of dd and of x16 each (TMA's blocks are powers of two);
- two product warpgroups at BLOCK_M = 128, three with a tail, each a partition of its own, read every stage. Warpgroup i
  accumulates dx's tokens [64 i, 64 i + 64) over the program's K range: dd's rows loaded into registers and rounded to
  bf16 (wgmma with A in registers, as dx_warp_specialized.py), against the weight block. The first two also compute the
  gradient block's columns [64 i, 64 i + 64): dd block^T (fp16, read transposed from shared memory) @ x16's columns, K =
  the BLOCK_M tokens in one product (two with the tail, whose product over 32 rows is half the one over 64),
  rounded to bf16 and stored by TMA through the warpgroup's own staging buffer into grad_w1 or grad_w3. A third
  warpgroup takes dx's tail rows alone (the 128 gradient columns split in halves, not thirds): the warpgroups share the
  SM's tensor cores, so the work in all, not its split, is what they wait for. Its wgmma takes 64 rows whatever the
  tail's: those past the tail's rows in its stage buffer, which TMA never writes, give rows of dx past T, which are not
  stored. Nothing joins the warpgroups, so while one rounds and stores, the others' wgmma have the tensor cores.

Each step waits for its wgmma before the warpgroup reloads its A registers, so no wgmma in flight reads registers
that a later load rewrites (the hazard dx_warp_specialized.py describes).

Split-K as dx's other kernels: axis 1 of the grid takes K_PER_SPLIT of the 2F columns (whole K steps) into partial
axis 1, stored rounded to the partials' dtype, and scatter_kernel adds the partials in a fixed order. The rows of dd
and x16 past T are zeros (dh writes zero rows for its padding rows, routing_x16 zero rows past T; the launcher checks
that dh's tiles cover BLOCK_M rows), so the gradient's sums are those of the weight-gradient kernels over the same
padded tokens; rows of the partials past T are not stored.

Precision: the weight gradients' operands are the fp16 dd and x16 (SPEC section 4), dx's the bf16 rounding of dd's
fp16 values and the bf16 weights, as dx_warp_specialized.py's; every product accumulates in fp32.

Shared memory: STAGES x (BLOCK_M / 8 + 16) KB of operands, BLOCK_M / 4 KB of x16, 8 KB of staging per product
warpgroup: 176 KB at BLOCK_M = 128 with 4 stages, 224 KB at 160 with 4 (the tail's stage buffers keep 64 rows), 192
KB at 192 with 3.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from .gluon_common import (
    load_weight_block,
    operand_ring,
    release_stage,
    split_columns,
    tma_load,
    tma_store,
    wait_stage_free,
    wait_stage_ready,
    warps_barrier,
    wgmma_layout,
)

WGMMA_ROWS = gl.constexpr(64)  # a warpgroup's wgmma rows: dx's tokens per product warpgroup


@gluon.jit
def _load_operands(dd_desc, tail_desc, x_desc, x_tail_desc, w1_desc, w3_desc, a_bufs, tail_bufs, b_bufs, x_buf, x_tail,
                   x_ready, ready, empty, F, K_PER_SPLIT, TAIL: gl.constexpr):  # fmt: skip
    """Loader partition: x16's block once (`x_ready`), then the (dd, weight) blocks of this program's K steps into
    stage step % STAGES once every product warpgroup has released it (`empty`); `ready` counts their bytes in. With
    TAIL, dd's and x16's rows from 128 come as tail blocks of their own (into the first rows of a 64-row buffer)."""
    BLOCK_K: gl.constexpr = dd_desc.block_type.shape[1]
    HEAD_ROWS: gl.constexpr = dd_desc.block_type.shape[0]  # the tail's first row
    TAIL_ROWS: gl.constexpr = tail_desc.block_type.shape[0]
    off_n = gl.program_id(0) * x_desc.block_type.shape[1]
    if TAIL:
        mbarrier.expect(x_ready, x_desc.block_type.nbytes + x_tail_desc.block_type.nbytes)
        tma_load(x_tail_desc, [HEAD_ROWS, off_n], x_ready, x_tail)
    else:
        mbarrier.expect(x_ready, x_desc.block_type.nbytes)
    tma_load(x_desc, [0, off_n], x_ready, x_buf)
    k_first = gl.program_id(1) * K_PER_SPLIT
    for step in range(K_PER_SPLIT // BLOCK_K):
        s = wait_stage_free(empty, step)
        k = k_first + step * BLOCK_K
        bar = ready.index(s)
        if TAIL:
            mbarrier.expect(bar, dd_desc.block_type.nbytes + tail_desc.block_type.nbytes + w1_desc.block_type.nbytes)
            tma_load(tail_desc, [HEAD_ROWS, k], bar, tail_bufs.index(s).slice(0, TAIL_ROWS, dim=0))
        else:
            mbarrier.expect(bar, dd_desc.block_type.nbytes + w1_desc.block_type.nbytes)
        tma_load(dd_desc, [0, k], bar, a_bufs.index(s))
        load_weight_block(w1_desc, w3_desc, k, off_n, F, bar, b_bufs.index(s))


@gluon.jit
def _products(a_bufs, tail_bufs, b_bufs, x_buf, x_tail, x_ready, ready, empty, staging, g1_desc, g3_desc, partials, T,
              H, F, K_PER_SPLIT, WARPGROUP: gl.constexpr, TAIL: gl.constexpr, num_warps: gl.constexpr):  # fmt: skip
    """Product warpgroup WARPGROUP: dx's tokens [64 WARPGROUP, +64) over the K steps (the tail block's for the third),
    stored into the program's partial at the end, and, for the first BLOCK_N / WIDTH warpgroups, at every step the
    gradient block's columns [WIDTH WARPGROUP, +WIDTH) over all the tokens, stored by TMA."""
    ROWS: gl.constexpr = WGMMA_ROWS
    HEAD_ROWS: gl.constexpr = a_bufs.shape[1]  # the head block's tokens
    BLOCK_K: gl.constexpr = a_bufs.shape[2]
    BLOCK_N: gl.constexpr = b_bufs.shape[2]
    WIDTH: gl.constexpr = staging.shape[1]  # the gradient columns of a warpgroup
    GRADIENT: gl.constexpr = WARPGROUP * WIDTH < BLOCK_N  # whether this warpgroup computes gradient columns
    dx_layout: gl.constexpr = wgmma_layout(BLOCK_N, num_warps)
    grad_layout: gl.constexpr = wgmma_layout(WIDTH, num_warps)
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=dx_layout, k_width=2)
    off_n = gl.program_id(0) * BLOCK_N
    k_first = gl.program_id(1) * K_PER_SPLIT
    if GRADIENT:
        x_cols = x_buf.slice(WARPGROUP * WIDTH, WIDTH, dim=1)
        x_tail_cols = x_tail.slice(WARPGROUP * WIDTH, WIDTH, dim=1)
        mbarrier.wait(x_ready, 0)
    acc = gl.zeros((ROWS, BLOCK_N), dtype=gl.float32, layout=dx_layout)
    for step in range(K_PER_SPLIT // BLOCK_K):
        s = wait_stage_ready(ready, step)
        dd = a_bufs.index(s)
        if WARPGROUP * ROWS < HEAD_ROWS:
            a = dd.slice(WARPGROUP * ROWS, ROWS, dim=0).load(a_layout).to(gl.bfloat16)
        else:
            a = tail_bufs.index(s).load(a_layout).to(gl.bfloat16)
        acc = warpgroup_mma(a, b_bufs.index(s), acc, is_async=True)
        if GRADIENT:
            grad = gl.zeros((BLOCK_K, WIDTH), dtype=gl.float32, layout=grad_layout)
            grad = warpgroup_mma(dd.permute((1, 0)), x_cols, grad, use_acc=False, is_async=True)
            if TAIL:
                tail_rows = tail_bufs.index(s).slice(0, x_tail.shape[0], dim=0)
                grad = warpgroup_mma(tail_rows.permute((1, 0)), x_tail_cols, grad, is_async=True)
            acc, grad, a = warpgroup_mma_wait(num_outstanding=0, deps=(acc, grad, a))
            release_stage(empty, step)
            k = k_first + step * BLOCK_K
            tma.store_wait(0)
            warps_barrier()  # no warp writes the staging buffer before the store that read it is done
            staging.store(grad.to(staging.dtype))
            fence_async_shared()
            warps_barrier()
            if k < F:
                tma_store(g1_desc, [k, off_n + WARPGROUP * WIDTH], staging)
            else:
                tma_store(g3_desc, [k - F, off_n + WARPGROUP * WIDTH], staging)
        else:
            acc, a = warpgroup_mma_wait(num_outstanding=0, deps=(acc, a))
            release_stage(empty, step)
    # The partial goes out of wgmma's layout (a warp's store touches 8 rows, 16 bytes each) through the warpgroup's
    # staging buffer, a block of WIDTH columns at a time, into one whose warp stores four rows of 128 contiguous bytes,
    # so that its stores coalesce. convert_layout would do the same through scratch memory of its own, which at
    # BLOCK_M = 160 takes the shared memory of a fourth stage.
    tma.store_wait(0)  # the last gradient block's store is done with the staging buffer
    out_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])
    rows = WARPGROUP * ROWS + gl.arange(0, ROWS, layout=gl.SliceLayout(1, out_layout))
    blocks = split_columns(acc.to(partials.dtype.element_ty), BLOCK_N // WIDTH)
    for i in gl.static_range(BLOCK_N // WIDTH):
        warps_barrier()  # every warp has read the previous block out of the buffer
        staging.store(blocks[i])
        warps_barrier()
        cols = off_n + i * WIDTH + gl.arange(0, WIDTH, layout=gl.SliceLayout(0, out_layout))
        out = partials + (gl.program_id(1) * T + rows)[:, None] * H + cols[None, :]
        gl.store(out, staging.load(out_layout), mask=(rows < T)[:, None] & (cols < H)[None, :])


@gluon.jit(do_not_specialize=["T"])
def dx_grad_weight_ws_kernel(
    dd_desc, tail_desc, x_desc, x_tail_desc, w1_desc, w3_desc, g1_desc, g3_desc, partials,
    T, H, F, K_PER_SPLIT,
    TAIL: gl.constexpr,  # whether tokens from 128 come as tail blocks (BLOCK_M = 160, 192), read by a third warpgroup
    STAGES: gl.constexpr,  # shared-memory stages of (dd, weight) blocks: [BLOCK_M, BLOCK_K] and [BLOCK_K, BLOCK_N]
    PRODUCT_REGS: gl.constexpr,  # registers per thread of each product warpgroup after the first (worker partitions)
    num_warps: gl.constexpr,  # 4: the first product warpgroup (the default partition)
):  # fmt: skip
    """partials[s] = bf16(dd[:, Ks]) @ [w1; w3][Ks] for the s-th slice Ks of K_PER_SPLIT of the 2F columns (axis 1 of the
    grid), and [grad_w1; grad_w3][Ks] = dd[:, Ks]^T @ x16, over this program's BLOCK_N hidden columns (axis 0), for T <=
    BLOCK_M = 128 (160 or 192 with TAIL). dd_desc is the fp16 (ROWS, 2F) dd in [128, BLOCK_K] blocks, x_desc the fp16
    x16 in [128, BLOCK_N] blocks, tail_desc and x_tail_desc the same in blocks of 32 or 64 rows (with TAIL; else
    unused), w1_desc and w3_desc the bf16 (F, H) weights in [BLOCK_K, BLOCK_N] blocks, g1_desc and g3_desc grad_w1 and
    grad_w3 in [BLOCK_K, BLOCK_N / 2] blocks (a product warpgroup's columns)."""
    a_bufs, b_bufs, ready, empty = operand_ring(dd_desc, w1_desc, STAGES, RELEASES=3 if TAIL else 2)
    x_buf = gl.allocate_shared_memory(x_desc.dtype, x_desc.block_type.shape, x_desc.layout)
    x_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(x_ready, count=1)
    staging = gl.allocate_shared_memory(g1_desc.dtype, g1_desc.block_type.shape, g1_desc.layout)
    staging_second = gl.allocate_shared_memory(g1_desc.dtype, g1_desc.block_type.shape, g1_desc.layout)
    if TAIL:
        # a wgmma's rows for the third warpgroup, of which TMA fills the tail's (see the module's docstring)
        tail_bufs = gl.allocate_shared_memory(tail_desc.dtype, [STAGES, WGMMA_ROWS, tail_desc.block_type.shape[1]],
                                              tail_desc.layout)  # fmt: skip
        x_tail = gl.allocate_shared_memory(x_tail_desc.dtype, x_tail_desc.block_type.shape, x_tail_desc.layout)
        staging_tail = gl.allocate_shared_memory(g1_desc.dtype, g1_desc.block_type.shape, g1_desc.layout)
        gl.warp_specialize(
            [
                (_products, (a_bufs, tail_bufs, b_bufs, x_buf, x_tail, x_ready, ready, empty, staging, g1_desc, g3_desc,
                             partials, T, H, F, K_PER_SPLIT, 0, TAIL, num_warps)),
                (_products, (a_bufs, tail_bufs, b_bufs, x_buf, x_tail, x_ready, ready, empty, staging_second, g1_desc,
                             g3_desc, partials, T, H, F, K_PER_SPLIT, 1, TAIL, 4)),
                # dx's tail rows only: its staging buffer only takes its partial out
                (_products, (a_bufs, tail_bufs, b_bufs, x_buf, x_tail, x_ready, ready, empty, staging_tail, g1_desc,
                             g3_desc, partials, T, H, F, K_PER_SPLIT, 2, TAIL, 4)),
                (_load_operands, (dd_desc, tail_desc, x_desc, x_tail_desc, w1_desc, w3_desc, a_bufs, tail_bufs, b_bufs,
                                  x_buf, x_tail, x_ready, ready, empty, F, K_PER_SPLIT, TAIL)),
            ],
            [4, 4, 1],
            [PRODUCT_REGS, PRODUCT_REGS, 24],
        )  # fmt: skip
    else:
        # without a tail, its buffers' places are taken by the head's, which nothing reads in their stead
        gl.warp_specialize(
            [
                (_products, (a_bufs, a_bufs, b_bufs, x_buf, x_buf, x_ready, ready, empty, staging, g1_desc, g3_desc,
                             partials, T, H, F, K_PER_SPLIT, 0, TAIL, num_warps)),
                (_products, (a_bufs, a_bufs, b_bufs, x_buf, x_buf, x_ready, ready, empty, staging_second, g1_desc,
                             g3_desc, partials, T, H, F, K_PER_SPLIT, 1, TAIL, 4)),
                (_load_operands, (dd_desc, tail_desc, x_desc, x_tail_desc, w1_desc, w3_desc, a_bufs, a_bufs, b_bufs,
                                  x_buf, x_buf, x_ready, ready, empty, F, K_PER_SPLIT, TAIL)),
            ],
            [4, 1],  # the second product warpgroup, the loader warp
            [PRODUCT_REGS, 24],  # the loader needs few registers
        )  # fmt: skip
