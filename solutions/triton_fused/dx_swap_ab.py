"""dx = [d_a | d_up] @ [w1; w3] computed as its transpose, dx^T = [w1; w3]^T @ dd^T ("swap AB"), as a
warp-specialised Gluon kernel (Hopper) that puts the tokens on the N side of wgmma.

With the tokens as wgmma's M, as in Triton's `dx_kernel` and dx_warp_specialized.py, T is padded to whole tiles of
128 rows: T = 296 computes 384 rows, and each 128-row tile reads the whole of w1 and w3 again from L2. Here a program
takes 128 columns of H (wgmma's M: the weights' block, read transposed from shared memory) and a block of tokens
(wgmma's N) held in up to three accumulators whose widths are powers of two (say 256 + 64 for T <= 320): the padding
is what the chunk widths leave, and the weights' block serves every token of the block. It gives the bits of
Triton's dx; where it pays, by how much, is in docs/performance.md.

- one loader warp streams the K steps by TMA into a ring of STAGES shared-memory stages: the weights' block
  w1[k, h] for k < F and w3[k - F, h] after (so K runs over all 2F without concatenating them), and each chunk's
  block of the bf16 copy of dd, dd_low[tokens, k] (a descriptor per chunk width);
- the default partition (8 warps: two warpgroups of 64 columns of H) issues one wgmma per chunk and K step, one K
  step's wgmmas in flight while the next step's are issued, then stores each chunk's accumulator into its split-K
  partial, transposed back to (tokens, H) rows.

Split-K as in Triton's kernel: axis 1 of the grid takes K_PER_SPLIT of the 2F columns (whole K steps, none straddling
F) into partial FIRST_SPLIT + axis 1, stored rounded to the partials' dtype (bf16), and scatter_kernel adds the
partials in a fixed order. Axis 0 is the H block, axis 2 the token block. Tokens past T (dd_low's padding rows, or
past its end, which TMA reads as zeros) reach only columns of the accumulators that are not stored.

Precision: the bf16 copy of dd (dh's one rounding of the fp32 SwiGLU backward to bf16, the operand dtype that the
tolerance admits for dx: SPEC section 4) times the bf16 weights, accumulated in fp32: the products and their order
within a K step are Triton's dx's, so the partials are the same bits.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

from .gluon_common import (
    load_weight_block,
    operand_ring,
    release_stage,
    wait_stage_free,
    wait_stage_ready,
    wgmma_layout,
)


@gluon.constexpr_function
def _block_tokens(n0, n1, n2, chunks):
    """The tokens of a block: the widths of its first `chunks` chunks."""
    return sum((n0, n1, n2)[:chunks])


@gluon.jit
def _load_operands(w1_desc, w3_desc, dd0_desc, dd1_desc, dd2_desc, w_bufs, dd0_bufs, dd1_bufs, dd2_bufs, ready, empty,
                   F, K_PER_SPLIT, FIRST_SPLIT, CHUNKS: gl.constexpr, STAGE_BYTES: gl.constexpr):  # fmt: skip
    """Loader partition: each K step's weight block and chunk blocks into stage step % STAGES once the products have
    released it (`empty`); `ready` counts STAGE_BYTES in."""
    BLOCK_K: gl.constexpr = w1_desc.block_type.shape[0]
    BLOCK_M: gl.constexpr = w1_desc.block_type.shape[1]
    N0: gl.constexpr = dd0_desc.block_type.shape[0]
    N1: gl.constexpr = dd1_desc.block_type.shape[0]
    N2: gl.constexpr = dd2_desc.block_type.shape[0]
    off_h = gl.program_id(0) * BLOCK_M
    first_token = gl.program_id(2) * _block_tokens(N0, N1, N2, CHUNKS)
    k_first = (FIRST_SPLIT + gl.program_id(1)) * K_PER_SPLIT
    for step in range(K_PER_SPLIT // BLOCK_K):
        s = wait_stage_free(empty, step)
        k = k_first + step * BLOCK_K
        bar = ready.index(s)
        mbarrier.expect(bar, STAGE_BYTES)
        load_weight_block(w1_desc, w3_desc, k, off_h, F, bar, w_bufs.index(s))
        tma.async_copy_global_to_shared(dd0_desc, [first_token, k], bar, dd0_bufs.index(s))
        if CHUNKS > 1:
            tma.async_copy_global_to_shared(dd1_desc, [first_token + N0, k], bar, dd1_bufs.index(s))
        if CHUNKS > 2:
            tma.async_copy_global_to_shared(dd2_desc, [first_token + N0 + N1, k], bar, dd2_bufs.index(s))


@gluon.jit
def _store_chunk(acc, partials, first_token, T, H, num_warps: gl.constexpr):
    """One chunk's accumulator (H columns x tokens) into rows first_token.. of this program's partial, bf16, each
    thread four consecutive H columns of a token (the accumulator's layout has them on four threads)."""
    BLOCK_M: gl.constexpr = acc.shape[0]
    WIDTH: gl.constexpr = acc.shape[1]
    layout: gl.constexpr = gl.BlockedLayout([4, 1], [32, 1], [1, num_warps], [0, 1])
    values = gl.convert_layout(acc.to(partials.dtype.element_ty), layout)
    cols = gl.program_id(0) * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, layout))
    tokens = first_token + gl.arange(0, WIDTH, layout=gl.SliceLayout(0, layout))
    out = partials + (gl.program_id(1) * T + tokens)[None, :] * H + cols[:, None]
    gl.store(out, values, mask=(tokens < T)[None, :] & (cols < H)[:, None])


@gluon.jit
def _products(w_bufs, dd0_bufs, dd1_bufs, dd2_bufs, ready, empty, partials, T, H, K_PER_SPLIT, FIRST_SPLIT,
              CHUNKS: gl.constexpr, num_warps: gl.constexpr):  # fmt: skip
    """Default partition: per chunk, acc = weight block^T @ dd block^T over the K steps (one wgmma per chunk and step,
    the step before's in flight), then the chunks into the partial."""
    BLOCK_K: gl.constexpr = w_bufs.shape[1]
    BLOCK_M: gl.constexpr = w_bufs.shape[2]
    N0: gl.constexpr = dd0_bufs.shape[1]
    N1: gl.constexpr = dd1_bufs.shape[1]
    N2: gl.constexpr = dd2_bufs.shape[1]
    acc0 = gl.zeros((BLOCK_M, N0), dtype=gl.float32, layout=wgmma_layout(N0, num_warps))
    acc1 = gl.zeros((BLOCK_M, N1), dtype=gl.float32, layout=wgmma_layout(N1, num_warps))
    acc2 = gl.zeros((BLOCK_M, N2), dtype=gl.float32, layout=wgmma_layout(N2, num_warps))
    for step in range(K_PER_SPLIT // BLOCK_K):
        s = wait_stage_ready(ready, step)
        w = w_bufs.index(s).permute((1, 0))
        acc0 = warpgroup_mma(w, dd0_bufs.index(s).permute((1, 0)), acc0, use_acc=step > 0, is_async=True)
        if CHUNKS == 1:
            acc0 = warpgroup_mma_wait(num_outstanding=1, deps=(acc0,))
        if CHUNKS == 2:
            acc1 = warpgroup_mma(w, dd1_bufs.index(s).permute((1, 0)), acc1, use_acc=step > 0, is_async=True)
            acc0, acc1 = warpgroup_mma_wait(num_outstanding=2, deps=(acc0, acc1))
        if CHUNKS == 3:
            acc1 = warpgroup_mma(w, dd1_bufs.index(s).permute((1, 0)), acc1, use_acc=step > 0, is_async=True)
            acc2 = warpgroup_mma(w, dd2_bufs.index(s).permute((1, 0)), acc2, use_acc=step > 0, is_async=True)
            acc0, acc1, acc2 = warpgroup_mma_wait(num_outstanding=3, deps=(acc0, acc1, acc2))
        if step > 0:  # the step before's wgmmas are done with its stage
            release_stage(empty, step - 1)
    first_token = gl.program_id(2) * _block_tokens(N0, N1, N2, CHUNKS)
    partial = partials + FIRST_SPLIT * T * H
    acc0 = warpgroup_mma_wait(num_outstanding=0, deps=(acc0,))
    _store_chunk(acc0, partial, first_token, T, H, num_warps)
    if CHUNKS > 1:
        acc1 = warpgroup_mma_wait(num_outstanding=0, deps=(acc1,))
        _store_chunk(acc1, partial, first_token + N0, T, H, num_warps)
    if CHUNKS > 2:
        acc2 = warpgroup_mma_wait(num_outstanding=0, deps=(acc2,))
        _store_chunk(acc2, partial, first_token + N0 + N1, T, H, num_warps)


@gluon.jit(do_not_specialize=["T", "FIRST_SPLIT"])
def dx_swap_ab_kernel(
    w1_desc, w3_desc, dd0_desc, dd1_desc, dd2_desc, partials,
    T, H, F, K_PER_SPLIT, FIRST_SPLIT,
    CHUNKS: gl.constexpr,  # 1-3: the token block's accumulators, dd0_desc.. giving their widths (unused ones: any)
    STAGES: gl.constexpr,  # shared-memory stages of a [BLOCK_K, 128] weight block and the chunks' [width, BLOCK_K]
    STAGE_BYTES: gl.constexpr,  # the bytes of one stage's blocks
    num_warps: gl.constexpr,  # 8: two warpgroups of 64 columns of H
):  # fmt: skip
    """partials[FIRST_SPLIT + s][tokens, h] = (dd_low[tokens, Ks] @ [w1; w3][Ks, h]) for the s-th slice Ks of K_PER_SPLIT
    of the 2F columns (axis 1 of the grid), 128 columns h per program (axis 0) and one block of tokens (axis 2).
    w1_desc and w3_desc are the bf16 (F, H) weights in [BLOCK_K, 128] blocks, dd0_desc.. the bf16 (rows, 2F) dd_low in
    [chunk width, BLOCK_K] blocks.

    Shared memory: STAGES x (16 + the chunks' widths / 8) KB at BLOCK_K = 64, and the epilogue's layout conversion:
    4 stages of 256 tokens take 213 KB, 3 of 256 + 128 tokens 213 KB.
    """
    w_bufs, dd0_bufs, ready, empty = operand_ring(w1_desc, dd0_desc, STAGES)
    dd1_bufs = dd0_bufs
    dd2_bufs = dd0_bufs
    if CHUNKS > 1:
        dd1_bufs = gl.allocate_shared_memory(dd1_desc.dtype, [STAGES] + dd1_desc.block_type.shape, dd1_desc.layout)
    if CHUNKS > 2:
        dd2_bufs = gl.allocate_shared_memory(dd2_desc.dtype, [STAGES] + dd2_desc.block_type.shape, dd2_desc.layout)
    gl.warp_specialize(
        [
            (_products, (w_bufs, dd0_bufs, dd1_bufs, dd2_bufs, ready, empty, partials, T, H, K_PER_SPLIT, FIRST_SPLIT,
                         CHUNKS, num_warps)),
            (_load_operands, (w1_desc, w3_desc, dd0_desc, dd1_desc, dd2_desc, w_bufs, dd0_bufs, dd1_bufs, dd2_bufs,
                              ready, empty, F, K_PER_SPLIT, FIRST_SPLIT, CHUNKS, STAGE_BYTES)),
        ],
        [1],  # the loader warp
        [24],  # its registers: it needs few
    )  # fmt: skip
