"""dh with its SwiGLU backward and grad_w2 in one pass over w2's columns, as a warp-specialised Gluon kernel (Hopper),
for T = 65-160.

At small T both dh = g @ w2 and grad_w2 = (w g)^T gated_output are bound by memory: each reads or writes every byte
of a weight once (117 MB at the public shapes) for little arithmetic. Run as two kernels, grad_w2's programs hold the
SMs that dx with grad_w1/grad_w3 waits for, and dh's tiles of 128 (or 64) tokens leave a last row of tiles nearly
empty just past 128, each row of tiles reading all of w2 again. Here dh is transposed (swap-AB), dh^T = w2^T g^T, so
that the tokens are wgmma's N dimension, which may be 32 wide: program f takes 128 columns of F (wgmma's M; F / 128 =
112 programs, one per SM, the other 20 SMs free for the side stream) and every token, in accumulators of 128 and, with
HAS_TAIL, 32 more (the head and the tail). Per K step of 64 hidden rows h it computes both products that touch w2[h,
f]'s block: dh^T[f, :] += w2[h, f]^T g[:, h]^T, and grad_w2[h, f] = g[:, h]^T (w * gated)[:, f] over all the
tokens, stored at once. Each byte of w2 is read once and g, read by both, once per step.

- one loader warp loads (w * gated)'s tokens x 128 columns once, then per K step the w2 block [64, 128] and g's blocks
  [128, 64] and [32, 64] (the gathered, zero-padded copy) by TMA into a ring of STAGES stages;
- grad_w2's warpgroup scales gated by the routing weights in place (bf16, rounded once), then per K step computes the
  [64, 128] block of grad_w2 over all the tokens and stores it by TMA through two staging buffers;
- dh's 8 warps (the default partition, two warpgroups of 64 rows of F) accumulate acc_h = w2^T g_head^T and acc_t =
  w2^T g_tail^T in fp32, both operands seen transposed through permuted shared-memory views (wgmma reads 16-bit
  operands in either major order); each stage is free once both consumers have released it.
- After the K loop dh's warps run the epilogue (a program has one tile and nothing to overlap it with) through the freed
  buffers: the activation blocks ([rows, 32] by TMA, issued first so that they land while dh^T is handed over), the
  head's a and up into the w2 stages at once (only dh's wgmmas read them), its gate into (w * gated)'s head buffer once
  grad_w2's warpgroup has read its last operands, the tail's into the staging buffers once grad_w2's last store has left
  them; dh^T in fp32, stored transposed as [tokens, 128] in the g stages (head) and the tail stages. Then, piece by
  piece as its blocks arrive, they scale its rows by the routing weights, compute d_a and d_up in [rows, 32] pieces in
  fp32 and store them into dd (fp16) with plain stores marked to stay in L2, every row: the padding rows as zeros (g's
  padding rows are zero, and TMA zero-fills the activations past row T), because dx with grad_w1/grad_w3 reads them.

Precision: dh reaches the SwiGLU backward in fp32, never rounded, so d_a and d_up are Triton's dh kernel's up to the
order of the fp32 sums; grad_w2 from g and bf16(w * gated), where the separate weight gradient reads bf16(w * g) and
gated: one bf16 rounding of a product either way (SPEC section 4).

Shared memory: 4 stages of 16 + 16 + 4 KB, (w * gated) 32 + 8 KB, two 16 KB staging buffers: 216 KB of the 227 with a
tail, 192 KB without (5 stages fit there, 224 KB, and made the call slower).
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
    release_stage,
    swiglu_backward,
    tma_load,
    tma_store,
    wait_stage_free,
    wait_stage_ready,
    warps_barrier,
    wgmma_layout,
)

GRAD_REGS = gl.constexpr(160)  # registers per thread of grad_w2's warpgroup (its [64, 128] fp32 accumulator takes 64)


@gluon.jit
def _load_operands(w2_desc, head_desc, tail_desc, gated_head, gated_tail, w_bufs, head_bufs, tail_bufs, gw_head,
                   gw_tail, gated_ready, ready, empty, H, HAS_TAIL: gl.constexpr):  # fmt: skip
    """Loader partition: gated_output's rows of this program's columns (`gated_ready`), then per K step the w2 block
    and g's blocks into stage step % STAGES once both consumers have released it. The kernel is launched as a
    programmatic dependent of the gather, which may still be writing g: first wait for that grid to complete."""
    BLOCK_K: gl.constexpr = w2_desc.block_type.shape[0]
    BLOCK_F: gl.constexpr = w2_desc.block_type.shape[1]
    HEAD: gl.constexpr = head_desc.block_type.shape[0]
    off_f = gl.program_id(0) * BLOCK_F
    mbarrier.expect(gated_ready, gated_head.block_type.nbytes + HAS_TAIL * gated_tail.block_type.nbytes)
    tma_load(gated_head, [0, off_f], gated_ready, gw_head)
    if HAS_TAIL:
        tma_load(gated_tail, [HEAD, off_f], gated_ready, gw_tail)
    gl.inline_asm_elementwise("griddepcontrol.wait; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)
    nbytes: gl.constexpr = w2_desc.block_type.nbytes + head_desc.block_type.nbytes + HAS_TAIL * tail_desc.block_type.nbytes
    for step in range(gl.cdiv(H, BLOCK_K)):
        s = wait_stage_free(empty, step)
        bar = ready.index(s)
        k = step * BLOCK_K
        mbarrier.expect(bar, nbytes)
        tma_load(w2_desc, [k, off_f], bar, w_bufs.index(s))
        tma_load(head_desc, [0, k], bar, head_bufs.index(s))
        if HAS_TAIL:
            tma_load(tail_desc, [HEAD, k], bar, tail_bufs.index(s))


@gluon.jit
def _scale_rows(buf, selected_weights, row0, T, num_warps: gl.constexpr):
    """buf (rows x columns of bf16 in shared memory) times the routing weight of token row0 + row, rounded once."""
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [num_warps, 1], [1, 0])
    x = buf.load(layout).to(gl.float32)
    rows = row0 + gl.arange(0, buf.shape[0], layout=gl.SliceLayout(1, layout))
    w = gl.load(selected_weights + rows, mask=rows < T, other=0.0).to(gl.float32)
    buf.store((x * w[:, None]).to(buf.dtype))


@gluon.jit
def _grad_w2(head_bufs, tail_bufs, gw_head, gw_tail, staging, gated_ready, ready, empty, grad_read, grad_done,
             grad_w2_desc, selected_weights, T, H, HAS_TAIL: gl.constexpr):  # fmt: skip
    """grad_w2's warpgroup: gated_output's rows times the routing weights in place, then per K step grad_w2's block
    [64, 128] over all the tokens, into staging buffer step % 2 once the store that last read it is done, stored by
    TMA; arrives on grad_read once its last wgmma is done (the ring and gated_output's buffers are then free) and, with
    a tail (whose activations dh's warps then load into the staging buffers), on grad_done once its last store is."""
    BLOCK_K: gl.constexpr = head_bufs.shape[2]
    HEAD: gl.constexpr = head_bufs.shape[1]
    BLOCK_F: gl.constexpr = gw_head.shape[1]
    layout: gl.constexpr = wgmma_layout(BLOCK_F, 4)
    off_f = gl.program_id(0) * BLOCK_F
    mbarrier.wait(gated_ready, 0)
    _scale_rows(gw_head, selected_weights, 0, T, 4)
    if HAS_TAIL:
        _scale_rows(gw_tail, selected_weights, HEAD, T, 4)
    fence_async_shared()  # the scaled blocks, written by these threads, are read by wgmma (the async proxy)
    warps_barrier()
    for step in range(gl.cdiv(H, BLOCK_K)):
        s = wait_stage_ready(ready, step)
        grad = gl.zeros((BLOCK_K, BLOCK_F), dtype=gl.float32, layout=layout)
        grad = warpgroup_mma(head_bufs.index(s).permute((1, 0)), gw_head, grad, use_acc=False, is_async=True)
        if HAS_TAIL:
            grad = warpgroup_mma(tail_bufs.index(s).permute((1, 0)), gw_tail, grad, is_async=True)
        grad = warpgroup_mma_wait(num_outstanding=0, deps=(grad,))
        release_stage(empty, step)
        buffer = staging.index(step % 2)
        tma.store_wait(1)
        warps_barrier()  # no warp writes the buffer before the store that read it is done
        buffer.store(grad.to(staging.dtype))
        fence_async_shared()
        warps_barrier()
        tma_store(grad_w2_desc, [step * BLOCK_K, off_f], buffer)
    mbarrier.arrive(grad_read, count=1)
    tma.store_wait(0)
    if HAS_TAIL:
        warps_barrier()  # every warp's stores are done
        mbarrier.arrive(grad_done, count=1)


@gluon.jit
def _load_pieces(desc, row, col, bars, bufs, B0: gl.constexpr):
    """desc's blocks at row `row` of this program's column pieces from column `col`: piece p into bufs.index(B0 + p),
    counted in by bars.index(p) (one barrier per piece)."""
    WIDTH: gl.constexpr = desc.block_type.shape[1]
    PIECES: gl.constexpr = bars.shape[0]
    for p in gl.static_range(PIECES):
        tma_load(desc, [row, col + p * WIDTH], bars.index(p), bufs.index(B0 + p))


@gluon.jit
def _store_rows(dh_t, a_bufs, A0: gl.constexpr, up_bufs, U0: gl.constexpr, gate_bufs, G0: gl.constexpr, act_ready, dd,
                selected_weights, T, row0, col0, F, ROWS, layout: gl.constexpr):  # fmt: skip
    """d_a and d_up of rows row0.. (as many as dh_t, [rows, BLOCK_F] fp32 in shared memory, holds; those below ROWS)
    in column pieces, each once its activation blocks, placed by _load_pieces, have arrived (act_ready.index(p)),
    stored into dd = [d_a | d_up] (fp16). dh is dh_t's rows times their tokens' routing weights, applied here rather
    than to the accumulator, whose layout would hold a weight per accumulator column in every thread."""
    WIDTH: gl.constexpr = a_bufs.shape[2]
    rows = row0 + gl.arange(0, dh_t.shape[0], layout=gl.SliceLayout(1, layout))
    weights = gl.load(selected_weights + rows, mask=rows < T, other=0.0).to(gl.float32)
    PIECES: gl.constexpr = act_ready.shape[0]
    for p in gl.static_range(PIECES):
        mbarrier.wait(act_ready.index(p), 0)
        dh = dh_t.slice(p * WIDTH, WIDTH, dim=1).load(layout) * weights[:, None]
        a = a_bufs.index(A0 + p).load(layout).to(gl.float32)
        up = up_bufs.index(U0 + p).load(layout).to(gl.float32)
        gate = gate_bufs.index(G0 + p).load(layout).to(gl.float32)
        grad_a, grad_up = swiglu_backward(dh, a, up, gate)
        cols = col0 + p * WIDTH + gl.arange(0, WIDTH, layout=gl.SliceLayout(0, layout))
        out = rows[:, None] * (2 * F) + cols[None, :]
        mask = (rows < ROWS)[:, None] & (cols < F)[None, :]
        # Kept in L2 (evict_last): dx with grad_w1/grad_w3 reads dd right after this kernel, once per block of its
        # columns, while it streams w1, w3 and their gradients (about 470 MB) through the cache.
        gl.store(dd + out, grad_a.to(dd.dtype.element_ty), mask=mask, eviction_policy="evict_last")
        gl.store(dd + out + F, grad_up.to(dd.dtype.element_ty), mask=mask, eviction_policy="evict_last")


@gluon.jit
def _dh(w_bufs, head_bufs, tail_bufs, gw_head, staging, ready, empty, grad_read, grad_done, act_ready, act_descs,
        dd, selected_weights, T, H, F, ROWS, HAS_TAIL: gl.constexpr, num_warps: gl.constexpr):  # fmt: skip
    """Default partition: dh^T over the K steps (a step's wgmmas in flight while the next step's are issued), then,
    as grad_w2's warpgroup frees them, the SwiGLU backward through its buffers (see the module's docstring)."""
    BLOCK_K: gl.constexpr = w_bufs.shape[1]
    BLOCK_F: gl.constexpr = w_bufs.shape[2]
    HEAD: gl.constexpr = head_bufs.shape[1]
    TAIL: gl.constexpr = tail_bufs.shape[1]
    WIDTH: gl.constexpr = act_descs[0].block_type.shape[1]
    PIECES: gl.constexpr = BLOCK_F // WIDTH
    head_layout: gl.constexpr = wgmma_layout(HEAD, num_warps)
    tail_layout: gl.constexpr = wgmma_layout(TAIL, num_warps)
    acc_h = gl.zeros((BLOCK_F, HEAD), dtype=gl.float32, layout=head_layout)
    acc_t = gl.zeros((BLOCK_F, TAIL), dtype=gl.float32, layout=tail_layout)
    for step in range(gl.cdiv(H, BLOCK_K)):
        s = wait_stage_ready(ready, step)
        w_t = w_bufs.index(s).permute((1, 0))
        if HAS_TAIL:
            acc_t = warpgroup_mma(w_t, tail_bufs.index(s).permute((1, 0)), acc_t, is_async=True)
        acc_h = warpgroup_mma(w_t, head_bufs.index(s).permute((1, 0)), acc_h, is_async=True)
        acc_h, acc_t = warpgroup_mma_wait(num_outstanding=1 + HAS_TAIL, deps=(acc_h, acc_t))
        if step > 0:  # the previous step's wgmmas are done with its stage
            release_stage(empty, step - 1)
    acc_h, acc_t = warpgroup_mma_wait(num_outstanding=0, deps=(acc_h, acc_t))

    # The head's a and up into the w2 stages, which only these warps' wgmmas read; its gate, once grad_w2's warpgroup
    # has read its last operands, into gated_output's buffer; the tail's into the staging buffers once its last store
    # has left them. A barrier per column piece, so that each piece's SwiGLU backward starts once its blocks are in.
    off_f = gl.program_id(0) * BLOCK_F
    head_acts = w_bufs._reinterpret(act_descs[0].dtype, [2 * PIECES, HEAD, WIDTH], act_descs[0].layout)  # a, up
    head_gate = gw_head._reinterpret(act_descs[0].dtype, [PIECES, HEAD, WIDTH], act_descs[0].layout)
    tail_acts = staging._reinterpret(act_descs[3].dtype, [4 * PIECES, TAIL, WIDTH], act_descs[3].layout)  # a, up, gate
    piece_bytes: gl.constexpr = 3 * (act_descs[0].block_type.nbytes + HAS_TAIL * act_descs[3].block_type.nbytes)
    for p in gl.static_range(PIECES):
        mbarrier.expect(act_ready.index(p), piece_bytes)
    _load_pieces(act_descs[0], 0, off_f, act_ready, head_acts, 0)
    _load_pieces(act_descs[1], 0, off_f, act_ready, head_acts, PIECES)
    mbarrier.wait(grad_read, 0)  # the g stages and gated_output's buffers are free
    _load_pieces(act_descs[2], 0, off_f, act_ready, head_gate, 0)
    if HAS_TAIL:
        mbarrier.wait(grad_done, 0)
        for i in gl.static_range(3):
            _load_pieces(act_descs[3 + i], HEAD, off_f, act_ready, tail_acts, i * PIECES)

    # dh^T as [tokens, BLOCK_F] fp32 (the routing weights are applied as its rows are read); the swizzle of 4-element
    # vectors by row keeps both the transposed stores and the row reads free of bank conflicts.
    handoff: gl.constexpr = gl.SwizzledSharedLayout(4, 1, 8, [1, 0])
    dh_head = head_bufs._reinterpret(gl.float32, [HEAD, BLOCK_F], handoff)
    dh_head.permute((1, 0)).store(acc_h)
    dh_tail = tail_bufs._reinterpret(gl.float32, [TAIL, BLOCK_F], handoff)
    if HAS_TAIL:
        dh_tail.permute((1, 0)).store(acc_t)
    warps_barrier()

    layout: gl.constexpr = gl.BlockedLayout([1, 4], [32 // (WIDTH // 4), WIDTH // 4], [num_warps, 1], [1, 0])
    _store_rows(dh_head, head_acts, 0, head_acts, PIECES, head_gate, 0, act_ready, dd, selected_weights, T, 0, off_f, F,
                ROWS, layout)  # fmt: skip
    if HAS_TAIL:
        _store_rows(dh_tail, tail_acts, 0, tail_acts, PIECES, tail_acts, 2 * PIECES, act_ready, dd, selected_weights, T,
                    HEAD, off_f, F, ROWS, layout)  # fmt: skip


@gluon.jit(do_not_specialize=["T", "ROWS"])
def dh_grad_w2_kernel(
    w2_desc, head_desc, tail_desc, gated_head, gated_tail, grad_w2_desc,
    a_head, up_head, gate_head, a_tail, up_tail, gate_tail, dd, selected_weights,
    T, H, F, ROWS,
    STAGES: gl.constexpr,  # ring stages of (w2, g head, g tail) blocks: [64, 128], [128, 64], [32, 64] (descriptors)
    HAS_TAIL: gl.constexpr,  # 32 tokens past the first 128 (their descriptors are there either way)
    num_warps: gl.constexpr,  # 8: dh's warps
):  # fmt: skip
    """dd = [d_a | d_up] (fp16, 2F columns) of the first 128 (+ 32) rows (those below dd's ROWS) from dh = diag(w)
    (g @ w2), and grad_w2 = (diag(w) g)^T gated_output (bf16, H x F), one program per 128 columns of F. g is the
    gathered, zero-padded copy of the T rows (at most 128, or 160 with HAS_TAIL); gated_output and the activations are
    the (T, F) inputs, read in blocks of 128 and 32 rows."""
    BLOCK_F: gl.constexpr = w2_desc.block_type.shape[1]
    HEAD: gl.constexpr = head_desc.block_type.shape[0]
    WIDTH: gl.constexpr = a_head.block_type.shape[1]
    gl.static_assert(STAGES * w2_desc.block_type.nbytes >= 2 * BLOCK_F * HEAD * 2, "the w2 stages hold a and up")
    gl.static_assert(STAGES * head_desc.block_type.nbytes >= HEAD * BLOCK_F * 4, "the g stages hold dh^T of the head")
    gl.static_assert(STAGES * tail_desc.block_type.nbytes >= tail_desc.block_type.shape[0] * BLOCK_F * 4,
                     "the tail stages hold dh^T of the tail")  # fmt: skip
    gl.static_assert(2 * grad_w2_desc.block_type.nbytes >= 3 * BLOCK_F // WIDTH * a_tail.block_type.nbytes,
                     "the staging buffers hold the tail's activations")  # fmt: skip
    w_bufs = gl.allocate_shared_memory(w2_desc.dtype, [STAGES] + w2_desc.block_type.shape, w2_desc.layout)
    head_bufs = gl.allocate_shared_memory(head_desc.dtype, [STAGES] + head_desc.block_type.shape, head_desc.layout)
    tail_bufs = gl.allocate_shared_memory(tail_desc.dtype, [STAGES] + tail_desc.block_type.shape, tail_desc.layout)
    gw_head = gl.allocate_shared_memory(gated_head.dtype, gated_head.block_type.shape, gated_head.layout)
    gw_tail = gl.allocate_shared_memory(gated_tail.dtype, gated_tail.block_type.shape, gated_tail.layout)
    staging = gl.allocate_shared_memory(grad_w2_desc.dtype, [2] + grad_w2_desc.block_type.shape, grad_w2_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    gated_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    grad_read = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    grad_done = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    act_ready = gl.allocate_shared_memory(gl.int64, [BLOCK_F // WIDTH, 1], mbarrier.MBarrierLayout())  # per piece
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)  # dh's warps and grad_w2's warpgroup
    mbarrier.init(gated_ready, count=1)
    mbarrier.init(grad_read, count=1)
    mbarrier.init(grad_done, count=1)
    for i in gl.static_range(BLOCK_F // WIDTH):
        mbarrier.init(act_ready.index(i), count=1)
    act_descs = (a_head, up_head, gate_head, a_tail, up_tail, gate_tail)
    gl.warp_specialize(
        [
            (_dh, (w_bufs, head_bufs, tail_bufs, gw_head, staging, ready, empty, grad_read, grad_done, act_ready,
                   act_descs, dd, selected_weights, T, H, F, ROWS, HAS_TAIL, num_warps)),
            (_load_operands, (w2_desc, head_desc, tail_desc, gated_head, gated_tail, w_bufs, head_bufs, tail_bufs,
                              gw_head, gw_tail, gated_ready, ready, empty, H, HAS_TAIL)),
            (_grad_w2, (head_bufs, tail_bufs, gw_head, gw_tail, staging, gated_ready, ready, empty, grad_read,
                        grad_done, grad_w2_desc, selected_weights, T, H, HAS_TAIL)),
        ],
        [1, 4],  # the loader warp, grad_w2's warpgroup
        [24, GRAD_REGS],
    )  # fmt: skip
