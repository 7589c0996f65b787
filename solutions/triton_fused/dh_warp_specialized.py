"""dh with its SwiGLU backward as a warp-specialised Gluon kernel (Hopper), from T = 257.

Triton's `dh_swiglu_kernel` (kernels.py) runs its epilogue after its main loop in the same warps: at large T the
epilogue's traffic (three activation tiles in, d_a and d_up twice out) takes a large share of the kernel while the
tensor cores idle (docs/performance.md). Here three groups of warps share each SM and work on different tiles at once:

- one loader warp streams the operand blocks of g and w2 by TMA into a ring of STAGES shared-memory stages,
  running ahead of the products across tile boundaries;
- the default partition, num_warps = 8 warps (two warpgroups of 64 x BLOCK_N wgmma), accumulates a 128 x BLOCK_N
  tile of g @ w2 in fp32 (BLOCK_N = 256 or 128, the w2 descriptor's block), multiplies it by the routing weight and
  hands it over in fp16 through shared memory, then starts on its next tile at once;
- two epilogue warps take the previous tile's dh from the handoff buffer, ACT_WIDTH columns at a time, with the
  three activation blocks of those columns loaded by TMA (ACT_BUFFERS pieces in flight), and store d_a and d_up in
  fp16, and in bf16 where the plan's dx reads that copy (LOW_COPY), with plain stores; with LAST_TILE_IN_RING the
  last tile's activations, whose epilogue runs under no products, come through the operand ring, free by then.

So a tile's epilogue runs under the next tile's products, and a program needs several tiles for it to pay: the
plans use this kernel from T = 257, with 128 x 128 tiles up to T = 1024 so that every program has several. The register file bounds the layout: the 64 x 256 fp32 accumulator of each
product warpgroup needs at least 154 registers per thread, which ptxas grants only if the whole kernel has at most
12 warps (8 + 1 + 2, padded to whole warpgroups).

Precision: as in Triton's kernel (SPEC section 4), with one more rounding: the routing weight multiplies the fp32
accumulator, and the product is handed over rounded to fp16 (11 significant bits; the path to grad_w1/grad_w3
keeps at least 10), so d_a and d_up differ from the Triton kernel's by about one fp16 rounding of dh. The SwiGLU
backward runs in fp32.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, warpgroup_mma, warpgroup_mma_wait

from .gluon_common import (
    operand_ring,
    program_tile_count,
    release_stage,
    split_columns,
    swiglu_backward,
    tma_load,
    wait_stage_free,
    wait_stage_ready,
    warps_barrier,
    wgmma_layout,
)


@gluon.jit
def _load_operands(g_desc, w2_desc, g_bufs, w_bufs, ready, empty, T, H, F, WAIT_FOR_GATHER: gl.constexpr):
    """Loader partition: the (g, w2) blocks of every K step of this program's tiles, into stage step % STAGES once the
    products have released it (`empty`); `ready` counts their bytes in. With WAIT_FOR_GATHER the kernel was launched
    as a programmatic dependent of the gather, which may still be writing g: the loader, the one reader of g, first
    waits for that grid to complete (griddepcontrol.wait)."""
    if WAIT_FOR_GATHER:
        gl.inline_asm_elementwise("griddepcontrol.wait; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)
    BLOCK_M: gl.constexpr = g_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = g_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = w2_desc.block_type.shape[1]
    num_m = gl.cdiv(T, BLOCK_M)
    k_steps = gl.cdiv(H, BLOCK_K)
    total = program_tile_count(T, F, BLOCK_M, BLOCK_N) * k_steps
    for step in range(total):
        s = wait_stage_free(empty, step)
        tile = gl.program_id(0) + (step // k_steps) * gl.num_programs(0)
        k = (step % k_steps) * BLOCK_K
        bar = ready.index(s)
        mbarrier.expect(bar, g_desc.block_type.nbytes + w2_desc.block_type.nbytes)
        tma_load(g_desc, [(tile % num_m) * BLOCK_M, k], bar, g_bufs.index(s))
        tma_load(w2_desc, [k, (tile // num_m) * BLOCK_N], bar, w_bufs.index(s))


@gluon.jit
def _products(g_bufs, w_bufs, ready, empty, handoff, dh_ready, dh_free, selected_weights, T, H, F,
              num_warps: gl.constexpr):  # fmt: skip
    """Default partition: per tile, acc = g @ w2 over the K steps (one wgmma in flight while the next is issued),
    then w * acc in fp16 into the handoff buffer once the epilogue has emptied it.

    The K loop is nested inside the tile loop, with no branch in it: with the handoff inside one flat loop over
    every step, ptxas made each step wait for all its wgmmas ("warpgroup.wait is injected")."""
    BLOCK_M: gl.constexpr = g_bufs.shape[1]
    BLOCK_K: gl.constexpr = g_bufs.shape[2]
    BLOCK_N: gl.constexpr = w_bufs.shape[2]
    PIECES: gl.constexpr = handoff.shape[0]
    mma_layout: gl.constexpr = wgmma_layout(BLOCK_N, num_warps)
    num_m = gl.cdiv(T, BLOCK_M)
    k_steps = gl.cdiv(H, BLOCK_K)
    my_tiles = program_tile_count(T, F, BLOCK_M, BLOCK_N)
    step = 0
    for j in range(my_tiles):
        # The tile's routing weights are loaded before its main loop, which hides their latency (loaded after it,
        # they held up every tile's handoff).
        tile = gl.program_id(0) + j * gl.num_programs(0)
        rows = (tile % num_m) * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, mma_layout))
        weights = gl.load(selected_weights + rows, mask=rows < T, other=0.0).to(gl.float32)
        acc = gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.float32, layout=mma_layout)
        for kk in range(k_steps):
            s = wait_stage_ready(ready, step)
            acc = warpgroup_mma(g_bufs.index(s), w_bufs.index(s), acc, use_acc=kk > 0, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
            if kk > 0:  # the previous step's wgmma is done with its stage
                release_stage(empty, step - 1)
            step += 1
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        release_stage(empty, step - 1)
        dh = acc * weights[:, None]
        mbarrier.wait(dh_free, (j & 1) ^ 1)
        pieces = split_columns(dh, PIECES)
        for i in gl.static_range(PIECES):
            handoff.index(i).store(pieces[i].to(handoff.dtype))
        mbarrier.arrive(dh_ready, count=1)


@gluon.jit
def _load_piece(a_desc, up_desc, gate_desc, a_buf, up_buf, gate_buf, bar, piece, live, num_m, PIECES: gl.constexpr):
    """The three activation blocks of this program's piece-th piece into (a_buf, up_buf, gate_buf), their bytes counted
    in by `bar`; nothing where not `live`."""
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
    WIDTH: gl.constexpr = a_desc.block_type.shape[1]
    tile = gl.program_id(0) + (piece // PIECES) * gl.num_programs(0)
    off_m = (tile % num_m) * BLOCK_M
    off_n = (tile // num_m) * (WIDTH * PIECES) + (piece % PIECES) * WIDTH
    mbarrier.expect(bar, 3 * a_desc.block_type.nbytes, pred=live)
    tma_load(a_desc, [off_m, off_n], bar, a_buf, pred=live)
    tma_load(up_desc, [off_m, off_n], bar, up_buf, pred=live)
    tma_load(gate_desc, [off_m, off_n], bar, gate_buf, pred=live)


@gluon.jit
def _load_activations(a_desc, up_desc, gate_desc, a_bufs, up_bufs, gate_bufs, act_ready, piece, total, num_m,
                      PIECES: gl.constexpr):  # fmt: skip
    """The activation blocks of the piece-th piece into buffer piece % ACT_BUFFERS (none from piece `total` on)."""
    b = piece % a_bufs.shape[0]
    _load_piece(a_desc, up_desc, gate_desc, a_bufs.index(b), up_bufs.index(b), gate_bufs.index(b), act_ready.index(b),
                piece, piece < total, num_m, PIECES)  # fmt: skip


@gluon.jit
def _slot(slots, s):
    """Ring slot s's three activation blocks (a, up, gate): blocks 3 x s to 3 x s + 2 of the operand ring's B stages,
    seen as activation blocks (see _last_tile_through_ring)."""
    return slots.index(3 * s), slots.index(3 * s + 1), slots.index(3 * s + 2)


@gluon.jit
def _swiglu_epilogue(handoff, dh_ready, dh_free, a_desc, up_desc, gate_desc, a_bufs, up_bufs, gate_bufs, act_ready,
                     w_bufs, ring_ready, dd, dd_low, T, F, ROWS, LOW_COPY: gl.constexpr,
                     LAST_TILE_IN_RING: gl.constexpr):  # fmt: skip
    """Epilogue partition: d_a = dh * up * silu'(a) (from w1_output) and d_up = dh * gate in fp32, ACT_WIDTH columns
    at a time, stored into dd = [d_a | d_up] (fp16) and, with LOW_COPY, dd_low (bf16), (ROWS, 2F) row-major. Every
    row of a tile is stored, the padding rows from T to ROWS as zeros (g's padding rows are zero, and TMA zero-fills
    the activations past row T), because the weight gradients read them. With LAST_TILE_IN_RING the last tile's
    activations come through the operand ring (_last_tile_through_ring)."""
    PIECES: gl.constexpr = handoff.shape[0]
    BLOCK_M: gl.constexpr = handoff.shape[1]
    WIDTH: gl.constexpr = handoff.shape[2]
    BUFFERS: gl.constexpr = a_bufs.shape[0]
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [32 // (WIDTH // 8), WIDTH // 8], [gl.num_warps(), 1], [1, 0])
    num_m = gl.cdiv(T, BLOCK_M)
    total = program_tile_count(T, F, BLOCK_M, WIDTH * PIECES) * PIECES
    buffered = total - PIECES if LAST_TILE_IN_RING else total  # pieces whose activations come through a_bufs
    for first in gl.static_range(BUFFERS - 1):
        _load_activations(a_desc, up_desc, gate_desc, a_bufs, up_bufs, gate_bufs, act_ready, first, buffered, num_m,
                          PIECES)  # fmt: skip
    for j in range(buffered):
        warps_barrier()  # both warps are done with the buffer of piece j - 1, which piece j + BUFFERS - 1 takes
        _load_activations(a_desc, up_desc, gate_desc, a_bufs, up_bufs, gate_bufs, act_ready, j + BUFFERS - 1, buffered,
                          num_m, PIECES)  # fmt: skip
        b = j % BUFFERS
        piece = j % PIECES
        if piece == 0:
            mbarrier.wait(dh_ready, (j // PIECES) & 1)
        dh = handoff.index(piece).load(layout).to(gl.float32)
        if piece == PIECES - 1:
            mbarrier.arrive(dh_free, count=1)
        mbarrier.wait(act_ready.index(b), (j // BUFFERS) & 1)
        _store_piece(dh, a_bufs.index(b), up_bufs.index(b), gate_bufs.index(b), dd, dd_low, j, num_m, F, ROWS, layout,
                     PIECES, LOW_COPY)  # fmt: skip
    if LAST_TILE_IN_RING:
        _last_tile_through_ring(handoff, dh_ready, a_desc, up_desc, gate_desc, w_bufs, ring_ready, dd, dd_low, total,
                                num_m, F, ROWS, layout, LOW_COPY)  # fmt: skip


@gluon.jit
def _last_tile_through_ring(handoff, dh_ready, a_desc, up_desc, gate_desc, w_bufs, ring_ready, dd, dd_low, total,
                            num_m, F, ROWS, layout: gl.constexpr, LOW_COPY: gl.constexpr):  # fmt: skip
    """The epilogue of this program's last tile, whose activations come through the operand ring's w2 stages.

    Every other tile's epilogue runs under the next tile's products, but the last one's runs under none, and where
    the kernel's shared memory leaves room for one activation buffer (128 x 256 tiles) it waits on every piece's
    loads in turn. Once the products have handed that tile over, the loader and the products are done with the ring:
    its w2 stages, seen as SLOTS sets of three activation blocks, take the tile's first SLOTS pieces at once and each
    later piece as soon as the piece SLOTS before it is read."""
    PIECES: gl.constexpr = handoff.shape[0]
    BLOCK_M: gl.constexpr = handoff.shape[1]
    WIDTH: gl.constexpr = handoff.shape[2]
    SLOTS: gl.constexpr = ring_ready.shape[0]
    first = total - PIECES
    mbarrier.wait(dh_ready, (first // PIECES) & 1)
    slots = w_bufs._reinterpret(a_desc.dtype, [3 * SLOTS, BLOCK_M, WIDTH], a_desc.layout)
    for i in gl.static_range(SLOTS):  # piece i into slot i
        _load_piece(a_desc, up_desc, gate_desc, *_slot(slots, i), ring_ready.index(i), first + i, i < PIECES, num_m,
                    PIECES)  # fmt: skip
    for i in range(PIECES):
        warps_barrier()  # both warps are done with the slot of piece i - 1, which piece i - 1 + SLOTS takes
        refill = (i + SLOTS - 1) % SLOTS
        _load_piece(a_desc, up_desc, gate_desc, *_slot(slots, refill), ring_ready.index(refill), first + i - 1 + SLOTS,
                    (i > 0) & (i - 1 + SLOTS < PIECES), num_m, PIECES)  # fmt: skip
        s = i % SLOTS
        dh = handoff.index(i).load(layout).to(gl.float32)
        mbarrier.wait(ring_ready.index(s), (i // SLOTS) & 1)
        _store_piece(dh, *_slot(slots, s), dd, dd_low, first + i, num_m, F, ROWS, layout, PIECES, LOW_COPY)


@gluon.jit
def _store_piece(dh, a_buf, up_buf, gate_buf, dd, dd_low, piece, num_m, F, ROWS, layout: gl.constexpr,
                 PIECES: gl.constexpr, LOW_COPY: gl.constexpr):  # fmt: skip
    """The SwiGLU backward of this program's piece-th piece from its dh (fp32, in `layout`) and activation blocks in
    shared memory, stored into dd and, with LOW_COPY, dd_low."""
    BLOCK_M: gl.constexpr = a_buf.shape[0]
    WIDTH: gl.constexpr = a_buf.shape[1]
    a = a_buf.load(layout).to(gl.float32)
    up = up_buf.load(layout).to(gl.float32)
    gate = gate_buf.load(layout).to(gl.float32)
    grad_a, grad_up = swiglu_backward(dh, a, up, gate)
    tile = gl.program_id(0) + (piece // PIECES) * gl.num_programs(0)
    rows = (tile % num_m) * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, layout))
    cols = (tile // num_m) * (WIDTH * PIECES) + (piece % PIECES) * WIDTH + gl.arange(0, WIDTH, layout=gl.SliceLayout(0, layout))
    mask = (rows < ROWS)[:, None] & (cols < F)[None, :]
    out = rows[:, None] * (2 * F) + cols[None, :]
    gl.store(dd + out, grad_a.to(dd.dtype.element_ty), mask=mask)
    gl.store(dd + out + F, grad_up.to(dd.dtype.element_ty), mask=mask)
    if LOW_COPY:
        gl.store(dd_low + out, grad_a.to(dd_low.dtype.element_ty), mask=mask)
        gl.store(dd_low + out + F, grad_up.to(dd_low.dtype.element_ty), mask=mask)


@gluon.jit(do_not_specialize=["T", "ROWS"])
def dh_swiglu_ws_kernel(
    g_desc, w2_desc, a_desc, up_desc, gate_desc, dd, dd_low, selected_weights,
    T, H, F, ROWS,
    STAGES: gl.constexpr,  # shared-memory stages of (g, w2) blocks: [128, BLOCK_K] and [BLOCK_K, BLOCK_N] (descriptors)
    ACT_BUFFERS: gl.constexpr,  # activation pieces in flight, each three [128, ACT_WIDTH] blocks (descriptors)
    WAIT_FOR_GATHER: gl.constexpr,  # launched as a programmatic dependent of the gather (see _load_operands)
    LOW_COPY: gl.constexpr,  # also store dd_low: Triton's dx reads it, the Gluon dx converts dd itself
    LAST_TILE_IN_RING: gl.constexpr,  # the last tile's activations through the operand ring (_last_tile_through_ring)
    num_warps: gl.constexpr,  # 8: the product warps
):  # fmt: skip
    """dd = [d_a | d_up] (and with LOW_COPY its bf16 copy dd_low) from dh = diag(w) (g @ w2), persistent programs (one
    per SM, or as few as keep the busiest one's tile count; the launcher decides) walking the 128 x BLOCK_N tiles
    `program_id, program_id + programs, ...`, token tile fastest (each byte of w2 from HBM once). g is the gathered,
    zero-padded copy of the T rows (ROWS of them); the activations are the (T, F) inputs.

    Shared memory at BLOCK_K = 64 and ACT_WIDTH = 16: STAGES x (16 + BLOCK_N / 8) KB of operand stages, the
    BLOCK_N / 4 KB fp16 handoff and ACT_BUFFERS x 3 x 4 KB: with 128 x 256 tiles 3 stages and one activation buffer
    fill 220 KB of the 227 KB, with 128 x 128 tiles 5 stages and two buffers 216 KB.
    """
    BLOCK_M: gl.constexpr = g_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = w2_desc.block_type.shape[1]
    WIDTH: gl.constexpr = a_desc.block_type.shape[1]
    g_bufs, w_bufs, ready, empty = operand_ring(g_desc, w2_desc, STAGES)
    handoff = gl.allocate_shared_memory(gl.float16, [BLOCK_N // WIDTH, BLOCK_M, WIDTH], gl.SwizzledSharedLayout(8, 1, 8, [1, 0]))
    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [ACT_BUFFERS] + a_desc.block_type.shape, a_desc.layout)
    up_bufs = gl.allocate_shared_memory(up_desc.dtype, [ACT_BUFFERS] + up_desc.block_type.shape, up_desc.layout)
    gate_bufs = gl.allocate_shared_memory(gate_desc.dtype, [ACT_BUFFERS] + gate_desc.block_type.shape, gate_desc.layout)
    act_ready = gl.allocate_shared_memory(gl.int64, [ACT_BUFFERS, 1], mbarrier.MBarrierLayout())
    dh_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    dh_free = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    # As many slots of three activation blocks as the w2 stages hold, for the last tile's epilogue
    SLOTS: gl.constexpr = STAGES * w2_desc.block_type.nbytes // (3 * a_desc.block_type.nbytes)
    ring_ready = gl.allocate_shared_memory(gl.int64, [SLOTS, 1], mbarrier.MBarrierLayout())
    if LAST_TILE_IN_RING:
        for i in gl.static_range(SLOTS):
            mbarrier.init(ring_ready.index(i), count=1)
    for i in gl.static_range(ACT_BUFFERS):
        mbarrier.init(act_ready.index(i), count=1)
    mbarrier.init(dh_ready, count=1)
    mbarrier.init(dh_free, count=1)
    gl.warp_specialize(
        [
            (_products, (g_bufs, w_bufs, ready, empty, handoff, dh_ready, dh_free, selected_weights, T, H, F, num_warps)),
            (_load_operands, (g_desc, w2_desc, g_bufs, w_bufs, ready, empty, T, H, F, WAIT_FOR_GATHER)),
            (_swiglu_epilogue, (handoff, dh_ready, dh_free, a_desc, up_desc, gate_desc, a_bufs, up_bufs, gate_bufs,
                                act_ready, w_bufs, ring_ready, dd, dd_low, T, F, ROWS, LOW_COPY, LAST_TILE_IN_RING)),
        ],
        [1, 2],  # loader warp, epilogue warps
        [24, 184],  # their registers: the loader needs few, the epilogue's fp32 pieces many
    )  # fmt: skip
