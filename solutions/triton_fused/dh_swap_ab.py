"""dd = [d_a | d_up] from dh = diag(w) (g @ w2) computed as its transpose, dh^T = w2^T @ g^T ("swap AB"), with the
SwiGLU backward in the epilogue: a warp-specialised Gluon kernel (Hopper) that puts the tokens on the N side of wgmma,
for T up to one block of tokens (the plans use it at 128 < T <= 256).

With the tokens as wgmma's M (Triton's `dh_swiglu_kernel`, dh_warp_specialized.py) T is padded to whole tiles of 128
rows, and each 128-row tile reads the whole of w2 again. Here a program takes 128 columns of F (wgmma's M: w2's
block, read transposed from shared memory) and all T tokens (wgmma's N) in up to three accumulators of power-of-two
widths, as dx_swap_ab.py does for dx: the padding is what the widths leave, and each block of w2 serves every token.

- one loader warp streams the K steps (H) by TMA into a ring of STAGES shared-memory stages: w2[k, f] and each chunk's
  block of the gathered g[tokens, k] (a descriptor per chunk width; rows past the copy's end read as zeros);
- the default partition (8 warps: two warpgroups of 64 columns of F) issues one wgmma per chunk and K step, one K
  step's wgmmas in flight while the next step's are issued, then runs the epilogue on 32-token pieces of each
  chunk: dh = acc * w (the routing weight, in fp32 on the accumulator: ge is never rounded), the activations
  loaded straight into registers, d_a = dh * up * silu'(a) (from w1_output) and d_up = dh * gate in fp32, stored in
  fp16 (dd, for the weight gradients) and in bf16 (dd_low, for the swap-AB dx), F contiguous per thread.

A program has one tile, so its epilogue runs after its products, as in Triton's kernel at these T. Tokens from T to
the end of the block (or to ROWS, whichever is first) are written as zeros, because the weight gradients read the rows
of dd up to their last K step's end; the plans' readers stop within the block.

Precision: as Triton's dh (SPEC section 4): exact bf16 operands, fp32 accumulation and SwiGLU backward, one rounding
to fp16 (and one to bf16 for the copy).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

from .gluon_common import operand_ring, split_columns, wgmma_layout

PIECE = gl.constexpr(32)  # tokens per epilogue piece: its fp32 dh, a, up and gate fit the product warps' registers


@gluon.jit
def _load_operands(w2_desc, g0_desc, g1_desc, g2_desc, w_bufs, g0_bufs, g1_bufs, g2_bufs, ready, empty, H,
                   CHUNKS: gl.constexpr, STAGE_BYTES: gl.constexpr, WAIT_FOR_GATHER: gl.constexpr):  # fmt: skip
    """Loader partition: each K step's w2 block and chunk blocks of g into stage step % STAGES once the products have
    released it (`empty`); `ready` counts STAGE_BYTES in. With WAIT_FOR_GATHER the kernel was launched as a
    programmatic dependent of the gather, which may still be writing g: it first waits for that grid's end."""
    if WAIT_FOR_GATHER:
        gl.inline_asm_elementwise("griddepcontrol.wait; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)
    BLOCK_K: gl.constexpr = w2_desc.block_type.shape[0]
    BLOCK_F: gl.constexpr = w2_desc.block_type.shape[1]
    STAGES: gl.constexpr = w_bufs.shape[0]
    N0: gl.constexpr = g0_desc.block_type.shape[0]
    N1: gl.constexpr = g1_desc.block_type.shape[0]
    off_f = gl.program_id(0) * BLOCK_F
    for step in range(H // BLOCK_K):
        s = step % STAGES
        mbarrier.wait(empty.index(s), ((step // STAGES) & 1) ^ 1)  # the first pass finds every stage free
        k = step * BLOCK_K
        bar = ready.index(s)
        mbarrier.expect(bar, STAGE_BYTES)
        tma.async_copy_global_to_shared(w2_desc, [k, off_f], bar, w_bufs.index(s))
        tma.async_copy_global_to_shared(g0_desc, [0, k], bar, g0_bufs.index(s))
        if CHUNKS > 1:
            tma.async_copy_global_to_shared(g1_desc, [N0, k], bar, g1_bufs.index(s))
        if CHUNKS > 2:
            tma.async_copy_global_to_shared(g2_desc, [N0 + N1, k], bar, g2_bufs.index(s))


@gluon.jit
def _swiglu_piece(acc, first_token, w1_output, up_output, gate_output, dd, dd_low, selected_weights, T, F, ROWS,
                  num_warps: gl.constexpr):  # fmt: skip
    """The SwiGLU backward of one piece of the accumulator (F columns x tokens), stored into dd and dd_low rows."""
    BLOCK_F: gl.constexpr = acc.shape[0]
    WIDTH: gl.constexpr = acc.shape[1]
    layout: gl.constexpr = gl.BlockedLayout([4, 1], [32, 1], [1, num_warps], [0, 1])
    cols = gl.program_id(0) * BLOCK_F + gl.arange(0, BLOCK_F, layout=gl.SliceLayout(1, layout))
    tokens = first_token + gl.arange(0, WIDTH, layout=gl.SliceLayout(0, layout))
    weight = gl.load(selected_weights + tokens, mask=tokens < T, other=0.0).to(gl.float32)
    dh = gl.convert_layout(acc, layout) * weight[None, :]
    loaded = (tokens < T)[None, :] & (cols < F)[:, None]
    act = tokens[None, :] * F + cols[:, None]
    a = gl.load(w1_output + act, mask=loaded, other=0.0).to(gl.float32)
    up = gl.load(up_output + act, mask=loaded, other=0.0).to(gl.float32)
    gate = gl.load(gate_output + act, mask=loaded, other=0.0).to(gl.float32)
    s = 1.0 / (1.0 + gl.exp(-a))
    grad_a = dh * up * s * (1.0 + a * (1.0 - s))
    grad_up = dh * gate
    stored = (tokens < ROWS)[None, :] & (cols < F)[:, None]
    out = tokens[None, :] * (2 * F) + cols[:, None]
    gl.store(dd + out, grad_a.to(dd.dtype.element_ty), mask=stored)
    gl.store(dd + out + F, grad_up.to(dd.dtype.element_ty), mask=stored)
    gl.store(dd_low + out, grad_a.to(dd_low.dtype.element_ty), mask=stored)
    gl.store(dd_low + out + F, grad_up.to(dd_low.dtype.element_ty), mask=stored)


@gluon.jit
def _swiglu_chunk(acc, first_token, w1_output, up_output, gate_output, dd, dd_low, selected_weights, T, F, ROWS,
                  num_warps: gl.constexpr):  # fmt: skip
    """One chunk's epilogue, PIECE tokens at a time (a chunk narrower than PIECE in one piece)."""
    WIDTH: gl.constexpr = acc.shape[1]
    if WIDTH <= PIECE:
        _swiglu_piece(acc, first_token, w1_output, up_output, gate_output, dd, dd_low, selected_weights, T, F, ROWS,
                      num_warps)  # fmt: skip
    else:
        pieces = split_columns(acc, WIDTH // PIECE)
        for i in gl.static_range(WIDTH // PIECE):
            _swiglu_piece(pieces[i], first_token + i * PIECE, w1_output, up_output, gate_output, dd, dd_low,
                          selected_weights, T, F, ROWS, num_warps)  # fmt: skip


@gluon.jit
def _products(w_bufs, g0_bufs, g1_bufs, g2_bufs, ready, empty, w1_output, up_output, gate_output, dd, dd_low,
              selected_weights, T, H, F, ROWS, CHUNKS: gl.constexpr, num_warps: gl.constexpr):  # fmt: skip
    """Default partition: per chunk, acc = w2 block^T @ g block^T over the K steps (one wgmma per chunk and step, the
    step before's in flight), then the chunks' epilogue."""
    BLOCK_K: gl.constexpr = w_bufs.shape[1]
    BLOCK_F: gl.constexpr = w_bufs.shape[2]
    STAGES: gl.constexpr = w_bufs.shape[0]
    N0: gl.constexpr = g0_bufs.shape[1]
    N1: gl.constexpr = g1_bufs.shape[1]
    N2: gl.constexpr = g2_bufs.shape[1]
    acc0 = gl.zeros((BLOCK_F, N0), dtype=gl.float32, layout=wgmma_layout(N0, num_warps))
    acc1 = gl.zeros((BLOCK_F, N1), dtype=gl.float32, layout=wgmma_layout(N1, num_warps))
    acc2 = gl.zeros((BLOCK_F, N2), dtype=gl.float32, layout=wgmma_layout(N2, num_warps))
    for step in range(H // BLOCK_K):
        s = step % STAGES
        mbarrier.wait(ready.index(s), (step // STAGES) & 1)
        w = w_bufs.index(s).permute((1, 0))
        acc0 = warpgroup_mma(w, g0_bufs.index(s).permute((1, 0)), acc0, use_acc=step > 0, is_async=True)
        if CHUNKS == 1:
            acc0 = warpgroup_mma_wait(num_outstanding=1, deps=(acc0,))
        if CHUNKS == 2:
            acc1 = warpgroup_mma(w, g1_bufs.index(s).permute((1, 0)), acc1, use_acc=step > 0, is_async=True)
            acc0, acc1 = warpgroup_mma_wait(num_outstanding=2, deps=(acc0, acc1))
        if CHUNKS == 3:
            acc1 = warpgroup_mma(w, g1_bufs.index(s).permute((1, 0)), acc1, use_acc=step > 0, is_async=True)
            acc2 = warpgroup_mma(w, g2_bufs.index(s).permute((1, 0)), acc2, use_acc=step > 0, is_async=True)
            acc0, acc1, acc2 = warpgroup_mma_wait(num_outstanding=3, deps=(acc0, acc1, acc2))
        if step > 0:  # the step before's wgmmas are done with its stage
            mbarrier.arrive(empty.index((step + STAGES - 1) % STAGES), count=1)
    acc0 = warpgroup_mma_wait(num_outstanding=0, deps=(acc0,))
    _swiglu_chunk(acc0, 0, w1_output, up_output, gate_output, dd, dd_low, selected_weights, T, F, ROWS, num_warps)
    if CHUNKS > 1:
        acc1 = warpgroup_mma_wait(num_outstanding=0, deps=(acc1,))
        _swiglu_chunk(acc1, N0, w1_output, up_output, gate_output, dd, dd_low, selected_weights, T, F, ROWS, num_warps)
    if CHUNKS > 2:
        acc2 = warpgroup_mma_wait(num_outstanding=0, deps=(acc2,))
        _swiglu_chunk(acc2, N0 + N1, w1_output, up_output, gate_output, dd, dd_low, selected_weights, T, F, ROWS,
                      num_warps)  # fmt: skip


@gluon.jit(do_not_specialize=["T", "ROWS"])
def dh_swap_ab_kernel(
    w2_desc, g0_desc, g1_desc, g2_desc, w1_output, up_output, gate_output, dd, dd_low, selected_weights,
    T, H, F, ROWS,
    CHUNKS: gl.constexpr,  # 1-3: the token block's accumulators, g0_desc.. giving their widths (unused ones: any)
    STAGES: gl.constexpr,  # shared-memory stages of a [BLOCK_K, 128] w2 block and the chunks' [width, BLOCK_K] of g
    STAGE_BYTES: gl.constexpr,  # the bytes of one stage's blocks
    WAIT_FOR_GATHER: gl.constexpr,  # launched as a programmatic dependent of the gather (see _load_operands)
    num_warps: gl.constexpr,  # 8: two warpgroups of 64 columns of F
):  # fmt: skip
    """dd[t, f] = d_a and dd[t, F + f] = d_up (fp16), and the same in dd_low (bf16), for 128 columns f per program
    (axis 0) and every token t < ROWS of the block (T tokens and zeros after them), from g (the gathered, zero-padded
    rows, bf16), w2 (bf16 (H, F), [BLOCK_K, 128] blocks) and the (T, F) activations.

    Shared memory: STAGES x (16 + the chunks' widths / 8) KB at BLOCK_K = 64, and the epilogue's layout conversion.
    """
    w_bufs, g0_bufs, ready, empty = operand_ring(w2_desc, g0_desc, STAGES)
    g1_bufs = g0_bufs
    g2_bufs = g0_bufs
    if CHUNKS > 1:
        g1_bufs = gl.allocate_shared_memory(g1_desc.dtype, [STAGES] + g1_desc.block_type.shape, g1_desc.layout)
    if CHUNKS > 2:
        g2_bufs = gl.allocate_shared_memory(g2_desc.dtype, [STAGES] + g2_desc.block_type.shape, g2_desc.layout)
    gl.warp_specialize(
        [
            (_products, (w_bufs, g0_bufs, g1_bufs, g2_bufs, ready, empty, w1_output, up_output, gate_output, dd, dd_low,
                         selected_weights, T, H, F, ROWS, CHUNKS, num_warps)),
            (_load_operands, (w2_desc, g0_desc, g1_desc, g2_desc, w_bufs, g0_bufs, g1_bufs, g2_bufs, ready, empty, H,
                              CHUNKS, STAGE_BYTES, WAIT_FOR_GATHER)),
        ],
        [1],  # the loader warp
        [24],  # its registers: it needs few
    )  # fmt: skip
