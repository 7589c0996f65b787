"""dh with its SwiGLU backward, its product transposed (swap-AB), as a warp-specialised Gluon kernel (Hopper), for
T = 129-160.

Just past 128 tokens, dh's tiles of 128 (or 64) tokens leave a last row of tiles nearly empty, and each row of tiles
reads all of w2 again. Transposed, dh^T = w2^T g^T makes the tokens wgmma's N dimension, which may be 32 wide: a
program takes one 128-column block of F (128 rows of w2^T, wgmma's M) and every token at once, in accumulators of 128
and 32 tokens (the head and the tail). Each byte of w2 is read once, by one of F / 128 = 112 programs (one per SM; the
other 20 SMs run the side stream's kernels).

- one loader warp streams, per K step of 64 hidden columns, the w2 block [64, 128] and g's blocks of the head rows
  [128, 64] and of the tail rows [32, 64] by TMA into a ring of STAGES stages (g: the gathered, zero-padded copy);
- the default partition, num_warps = 8 warps (two warpgroups of 64 rows of F), accumulates acc_h = w2^T g_head^T and
  acc_t = w2^T g_tail^T in fp32, both operands seen transposed through permuted shared-memory views (wgmma reads
  16-bit operands in either major order);
- after the K loop the same warps run the epilogue, since a program has one tile and nothing to overlap it with. The
  ring is free then: its w2 and tail stages take the tile's activation blocks ([rows, 32] by TMA, issued first so that
  they land while dh^T is handed over), its g stages dh^T scaled by the routing weights, in fp32, stored transposed
  as [tokens, 128]; then the warps compute d_a and d_up in [rows, 32] pieces in fp32 and store them into dd (fp16)
  with plain stores, all 160 rows: the padding rows as zeros (g's padding rows are zero, and TMA zero-fills the
  activations past row T), because dx with grad_w1/grad_w3 reads them.

Precision: dh reaches the SwiGLU backward in fp32, never rounded, so d_a and d_up are Triton's kernel's up to the
order of the fp32 sums (SPEC section 4).

Shared memory: STAGES = 6 stages of 16 + 16 + 4 KB (216 KB of the 227), as many as hold the epilogue's buffers: the 3 x
4 activation blocks of the head rows (96 KB) in the w2 stages, those of the tail rows (24 KB) in the tail stages, dh^T
of the head (64 KB fp32) in the first four g stages and of the tail in the fifth.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

from .gluon_common import release_stage, swiglu_backward, wait_stage_free, wait_stage_ready, wgmma_layout


@gluon.jit
def _load_operands(w2_desc, head_desc, tail_desc, w_bufs, head_bufs, tail_bufs, ready, empty, H):
    """Loader partition: per K step, this program's w2 block and the two blocks of g into stage step % STAGES once
    the products have released it. The kernel is launched as a programmatic dependent of the gather, which may
    still be writing g: first wait for that grid to complete (griddepcontrol.wait)."""
    gl.inline_asm_elementwise("griddepcontrol.wait; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)
    BLOCK_K: gl.constexpr = w2_desc.block_type.shape[0]
    BLOCK_F: gl.constexpr = w2_desc.block_type.shape[1]
    HEAD: gl.constexpr = head_desc.block_type.shape[0]
    nbytes: gl.constexpr = w2_desc.block_type.nbytes + head_desc.block_type.nbytes + tail_desc.block_type.nbytes
    off_f = gl.program_id(0) * BLOCK_F
    for step in range(gl.cdiv(H, BLOCK_K)):
        s = wait_stage_free(empty, step)
        bar = ready.index(s)
        k = step * BLOCK_K
        mbarrier.expect(bar, nbytes)
        tma.async_copy_global_to_shared(w2_desc, [k, off_f], bar, w_bufs.index(s))
        tma.async_copy_global_to_shared(head_desc, [0, k], bar, head_bufs.index(s))
        tma.async_copy_global_to_shared(tail_desc, [HEAD, k], bar, tail_bufs.index(s))


@gluon.jit
def _load_activations(descs, bufs, row, col, bar, PIECES: gl.constexpr):
    """The activation blocks (a, up, gate) of rows `row`.. of this program's PIECES column pieces, from column `col`,
    into bufs (a's pieces, then up's, then gate's), their bytes counted in by `bar`."""
    for i in gl.static_range(3):
        for p in gl.static_range(PIECES):
            tma.async_copy_global_to_shared(descs[i], [row, col + p * descs[i].block_type.shape[1]], bar,
                                            bufs.index(i * PIECES + p))  # fmt: skip


@gluon.jit
def _store_rows(dh_t, acts, dd, row0, col0, F, ROWS, PIECES: gl.constexpr, layout: gl.constexpr):
    """d_a and d_up of rows row0.. (as many as dh_t, [rows, BLOCK_F] fp32 in shared memory, holds; those below
    ROWS) in PIECES pieces of the activations' width, stored into dd = [d_a | d_up] (fp16, 2F columns) from column
    col0."""
    WIDTH: gl.constexpr = acts.shape[2]
    rows = row0 + gl.arange(0, acts.shape[1], layout=gl.SliceLayout(1, layout))
    for p in gl.static_range(PIECES):
        dh = dh_t.slice(p * WIDTH, WIDTH, dim=1).load(layout)
        a = acts.index(p).load(layout).to(gl.float32)
        up = acts.index(PIECES + p).load(layout).to(gl.float32)
        gate = acts.index(2 * PIECES + p).load(layout).to(gl.float32)
        grad_a, grad_up = swiglu_backward(dh, a, up, gate)
        cols = col0 + p * WIDTH + gl.arange(0, WIDTH, layout=gl.SliceLayout(0, layout))
        out = rows[:, None] * (2 * F) + cols[None, :]
        mask = (rows < ROWS)[:, None] & (cols < F)[None, :]
        gl.store(dd + out, grad_a.to(dd.dtype.element_ty), mask=mask)
        gl.store(dd + out + F, grad_up.to(dd.dtype.element_ty), mask=mask)


@gluon.jit
def _products_and_epilogue(w_bufs, head_bufs, tail_bufs, ready, empty, act_ready, act_descs, dd, selected_weights, T,
                           H, F, ROWS, num_warps: gl.constexpr):  # fmt: skip
    """Default partition: acc_h, acc_t = w2^T g^T over the K steps (the step's wgmmas in flight while the next
    step's are issued), then the epilogue through the freed ring (see the module's docstring)."""
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
        acc_t = warpgroup_mma(w_t, tail_bufs.index(s).permute((1, 0)), acc_t, is_async=True)
        acc_h = warpgroup_mma(w_t, head_bufs.index(s).permute((1, 0)), acc_h, is_async=True)
        acc_h, acc_t = warpgroup_mma_wait(num_outstanding=2, deps=(acc_h, acc_t))
        if step > 0:  # the previous step's wgmmas are done with its stage
            release_stage(empty, step - 1)
    acc_h, acc_t = warpgroup_mma_wait(num_outstanding=0, deps=(acc_h, acc_t))

    # The loader's last loads have landed and every wgmma is done: the ring is free. Its w2 stages take the head
    # rows' activation blocks, its tail stages the tail rows'.
    off_f = gl.program_id(0) * BLOCK_F
    head_acts = w_bufs._reinterpret(act_descs[0].dtype, [3 * PIECES, HEAD, WIDTH], act_descs[0].layout)
    tail_acts = tail_bufs._reinterpret(act_descs[3].dtype, [3 * PIECES, TAIL, WIDTH], act_descs[3].layout)
    mbarrier.expect(act_ready, 3 * PIECES * (act_descs[0].block_type.nbytes + act_descs[3].block_type.nbytes))
    _load_activations(act_descs, head_acts, 0, off_f, act_ready, PIECES)
    _load_activations((act_descs[3], act_descs[4], act_descs[5]), tail_acts, HEAD, off_f, act_ready, PIECES)

    # dh^T scaled by the routing weights (per token: per accumulator column) into the g stages as [tokens, BLOCK_F]
    # fp32; the swizzle of 4-element vectors by row keeps both the transposed stores and the row reads free of bank
    # conflicts.
    handoff: gl.constexpr = gl.SwizzledSharedLayout(4, 1, 8, [1, 0])
    dh_head = head_bufs._reinterpret(gl.float32, [HEAD, BLOCK_F], handoff)
    tokens = gl.arange(0, HEAD, layout=gl.SliceLayout(0, head_layout))
    weights = gl.load(selected_weights + tokens, mask=tokens < T, other=0.0).to(gl.float32)
    dh_head.permute((1, 0)).store(acc_h * weights[None, :])
    dh_tail = head_bufs.index(4)._reinterpret(gl.float32, [TAIL, BLOCK_F], handoff)
    tokens = HEAD + gl.arange(0, TAIL, layout=gl.SliceLayout(0, tail_layout))
    weights = gl.load(selected_weights + tokens, mask=tokens < T, other=0.0).to(gl.float32)
    dh_tail.permute((1, 0)).store(acc_t * weights[None, :])
    gl.thread_barrier()
    mbarrier.wait(act_ready, 0)

    layout: gl.constexpr = gl.BlockedLayout([1, 4], [32 // (WIDTH // 4), WIDTH // 4], [num_warps, 1], [1, 0])
    _store_rows(dh_head, head_acts, dd, 0, off_f, F, ROWS, PIECES, layout)
    _store_rows(dh_tail, tail_acts, dd, HEAD, off_f, F, ROWS, PIECES, layout)


@gluon.jit(do_not_specialize=["T", "ROWS"])
def dh_swiglu_swap_ab_kernel(
    w2_desc, head_desc, tail_desc, a_head, up_head, gate_head, a_tail, up_tail, gate_tail, dd, selected_weights,
    T, H, F, ROWS,
    STAGES: gl.constexpr,  # ring stages of (w2, g head, g tail) blocks: [64, 128], [128, 64], [32, 64] (descriptors)
    num_warps: gl.constexpr,  # 8: the product warps
):  # fmt: skip
    """dd = [d_a | d_up] (fp16, 2F columns) of the first 128 + 32 rows (those of dd's ROWS) from dh = diag(w) (g @ w2),
    one program per 128 columns of F. g is the gathered, zero-padded copy of the T rows, at most 160; the activations
    are the (T, F) inputs, read in [128, 32] and [32, 32] blocks (their six descriptors)."""
    BLOCK_F: gl.constexpr = w2_desc.block_type.shape[1]
    HEAD: gl.constexpr = head_desc.block_type.shape[0]
    WIDTH: gl.constexpr = a_head.block_type.shape[1]
    gl.static_assert(STAGES * w2_desc.block_type.nbytes >= 3 * BLOCK_F * HEAD * 2, "the w2 stages hold the activations")
    gl.static_assert(STAGES * tail_desc.block_type.nbytes >= 3 * BLOCK_F // WIDTH * a_tail.block_type.nbytes,
                     "the tail stages hold the tail's")  # fmt: skip
    gl.static_assert(4 * head_desc.block_type.nbytes >= HEAD * BLOCK_F * 4, "four g stages hold dh^T of the head")
    gl.static_assert(head_desc.block_type.nbytes >= tail_desc.block_type.shape[0] * BLOCK_F * 4,
                     "the fifth g stage holds dh^T of the tail")  # fmt: skip
    gl.static_assert(BLOCK_F % WIDTH == 0)
    w_bufs = gl.allocate_shared_memory(w2_desc.dtype, [STAGES] + w2_desc.block_type.shape, w2_desc.layout)
    head_bufs = gl.allocate_shared_memory(head_desc.dtype, [STAGES] + head_desc.block_type.shape, head_desc.layout)
    tail_bufs = gl.allocate_shared_memory(tail_desc.dtype, [STAGES] + tail_desc.block_type.shape, tail_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    act_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    mbarrier.init(act_ready, count=1)
    act_descs = (a_head, up_head, gate_head, a_tail, up_tail, gate_tail)
    gl.warp_specialize(
        [
            (_products_and_epilogue, (w_bufs, head_bufs, tail_bufs, ready, empty, act_ready, act_descs, dd,
                                      selected_weights, T, H, F, ROWS, num_warps)),
            (_load_operands, (w2_desc, head_desc, tail_desc, w_bufs, head_bufs, tail_bufs, ready, empty, H)),
        ],
        [1],  # the loader warp
        [24],  # its registers: it needs few
    )  # fmt: skip
