"""[grad_w1; grad_w3] = [d_a | d_up]^T @ x16, and grad_w2 = ge^T @ gated_output, as a warp-specialised Gluon kernel
(Hopper) whose two product warpgroups work independently, with a short last K step (the plans use it for grad_w2 from
T = 65 and for grad_w1/grad_w3 from T = 193).

Triton's `weight_grad_kernel` (kernels.py) reduces over the T tokens in whole steps of 64 rows, so a T just past a
multiple of 64 pays a whole step for a few tokens. A smaller last step inside Triton's pipelined loop costs more than
it saves (its loads are multi-buffered like the others). Here the loads are the kernel's own. With K = T this short,
a tile's products take about as long as storing it, so the stores must run under products:

- one loader warp streams each tile's K steps by TMA into a ring of STAGES shared-memory stages, across tile
  boundaries: A[k rows, tile's 128 columns] and B[k rows, tile's 256 columns] (for grad_w1/grad_w3 the fp16 dd, one
  (ROWS, 2F) descriptor, and x16; for grad_w2 ge and gated_output, bf16); a last step of at most TAIL rows comes
  through descriptors of TAIL-row blocks into the first TAIL rows of a stage;
- two product warpgroups, each a partition of its own (the default one and a worker, 4 warps each), read every
  stage, each for its own 64 rows of the tile (A's block read transposed from shared memory); a stage is free once
  both have arrived on `empty`. Each accumulates its 64 x 256 half in fp32, one wgmma in flight while the next is
  issued, then rounds it to bf16 and keeps it in registers while it starts the next tile: at each of that tile's
  first four K steps, while the step's wgmma runs, one 64-column block of the tile before goes out by TMA through one
  of the warpgroup's two staging buffers (the blocks that find no step, after the last one).

A tile stored right after its products, each block waiting for the store before it, leaves the tensor cores idle
for the whole store; storing it under the next tile's steps hides it (narrower blocks through more buffers were
slower; docs/performance.md).

No barrier joins the two warpgroups, so they drift apart, and while one converts and stages, the other's wgmma have
the tensor cores (ping-pong); running both on the tile in step stalls the tensor cores at every tile end.

The tile is 128 rows of the output (of the 2F rows of [grad_w1; grad_w3], or the H of grad_w2) by 256 of its columns (of
H, or of F); program p takes tiles p, p + programs, ..., one program per SM, row by row of tiles (the column tile
fastest) or, with BY_COLUMN, column by column. With DYNAMIC the tiles go in the same order to whichever program's loader
asks next: it claims a tile number from a counter in global memory (one atomic add by one lane) as its ring has room for
the tile's first step, and hands the number to the product warpgroups through a two-slot ring in shared memory. A stage
whose programs start at different times (on SMs that the kernel before frees at different times) then ends at about one
time on every SM instead of inheriting the lag. The tiles' products are the same, so are the bits. Where F is a multiple
of 128 one launch covers both weights: rows [0, F) go to grad_w1 through c_desc, rows [F, 2F) to grad_w3 through
c_high_desc; otherwise the launcher makes one launch per weight, with c_high_desc the same as c_desc. Shared memory:
STAGES x (16 + 32) KB of operands and 2 x 16 KB of staging: 4 stages take 224 KB. Registers: 12 warps (4 + 4 + the
loader, padded to a warpgroup) leave each product warpgroup more than the 192 registers per thread of its accumulator
(128) and of the tile before in bf16 (64): ptxas spills none.

For grad_w1/grad_w3 the rows past T in the last step are zeros in both operands (the launcher pads dd and x16 to
whole steps), so the sums are those of Triton's kernel bit for bit: the same products, accumulated in fp32 in the
same order, less those of the padded step's 16-row chunks past the short step, which hold only zeros. For grad_w2
(A = ge, B = gated_output, bf16, M = H) B is an input of T rows: the last step, short or whole, reads B's rows that
end at row T, and the gather has shifted ge's last block behind as many zero rows (the rule of Triton's kernel, with
the step's own rows), so the bits are again Triton's. Precision: as in Triton's kernel (SPEC section 4): fp16 or bf16
operands exact or rounded once, fp32 accumulation, one rounding to bf16.
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
    operand_ring,
    program_tile_count,
    release_stage,
    split_columns,
    tma_load,
    tma_store,
    wait_stage_free,
    wait_stage_ready,
    warps_barrier,
    wgmma_layout,
)

# Slots for tile numbers on their way from the loader to the product warpgroups (DYNAMIC): the loader runs at most a
# tile ahead of the products (its ring holds STAGES K steps, one tile's at T = 256), so two suffice.
TILE_SLOTS = gl.constexpr(2)


@gluon.jit
def _tile_origin(tile, M, N, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BY_COLUMN: gl.constexpr):
    """Tile number -> (first row, first column) of the output: row by row of tiles, or column by column."""
    if BY_COLUMN:
        num_m = gl.cdiv(M, BLOCK_M)
        return (tile % num_m) * BLOCK_M, (tile // num_m) * BLOCK_N
    num_n = gl.cdiv(N, BLOCK_N)
    return (tile // num_n) * BLOCK_M, (tile % num_n) * BLOCK_N


@gluon.jit
def _load_operands(a_desc, b_desc, a_tail_desc, b_tail_desc, a_bufs, b_bufs, ready, empty, tile_counter, tile_ids,
                   tile_ready, tile_free, M, N, B_ROWS, FULL_STEPS, TAIL_STEPS, BY_COLUMN: gl.constexpr,
                   DYNAMIC: gl.constexpr):  # fmt: skip
    """Loader partition: each tile's FULL_STEPS whole K steps, then its TAIL_STEPS (0 or 1) short one, into stage
    step % STAGES once both product warpgroups have released it (`empty`); `ready` counts the bytes in (_load_step).
    With DYNAMIC the loader claims each next tile from tile_counter as it is ready to load it and hands its number to
    the product warpgroups."""
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[1]
    k_steps = FULL_STEPS + TAIL_STEPS
    if DYNAMIC:
        num_tiles = gl.cdiv(M, BLOCK_M) * gl.cdiv(N, BLOCK_N)
        step = 0
        j = 0
        tile = _claim_tile(tile_counter)
        while tile < num_tiles:
            _publish_tile(tile_ids, tile_ready, tile_free, j, tile)
            off_m, off_n = _tile_origin(tile, M, N, BLOCK_M, BLOCK_N, BY_COLUMN)
            for kk in range(k_steps):
                s = wait_stage_free(empty, step)
                _load_step(a_desc, b_desc, a_tail_desc, b_tail_desc, a_bufs.index(s), b_bufs.index(s), ready.index(s), kk,
                           off_m, off_n, B_ROWS, FULL_STEPS)  # fmt: skip
                step += 1
            j += 1
            tile = _claim_tile(tile_counter)
        _publish_tile(tile_ids, tile_ready, tile_free, j, num_tiles)  # no more tiles: the product warpgroups stop
        return
    total = program_tile_count(M, N, BLOCK_M, BLOCK_N) * k_steps
    for step in range(total):
        s = wait_stage_free(empty, step)
        tile = gl.program_id(0) + (step // k_steps) * gl.num_programs(0)
        off_m, off_n = _tile_origin(tile, M, N, BLOCK_M, BLOCK_N, BY_COLUMN)
        _load_step(a_desc, b_desc, a_tail_desc, b_tail_desc, a_bufs.index(s), b_bufs.index(s), ready.index(s),
                   step % k_steps, off_m, off_n, B_ROWS, FULL_STEPS)  # fmt: skip


@gluon.jit
def _load_step(a_desc, b_desc, a_tail_desc, b_tail_desc, a_buf, b_buf, bar, kk, off_m, off_n, B_ROWS, FULL_STEPS):
    """K step kk of the tile at (off_m, off_n) into one stage (B streaming with A), counted in by bar: a whole step of
    BLOCK_K rows, or the short one of TAIL rows into the stage's first rows. The step at A's row k reads B's rows from
    min(k, B_ROWS - its rows), as in Triton's kernel."""
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[0]
    TAIL: gl.constexpr = a_tail_desc.block_type.shape[0]
    if kk < FULL_STEPS:
        mbarrier.expect(bar, a_desc.block_type.nbytes + b_desc.block_type.nbytes)
        tma_load(a_desc, [kk * BLOCK_K, off_m], bar, a_buf)
        tma_load(b_desc, [gl.minimum(kk * BLOCK_K, B_ROWS - BLOCK_K), off_n], bar, b_buf)
    else:
        mbarrier.expect(bar, a_tail_desc.block_type.nbytes + b_tail_desc.block_type.nbytes)
        tma_load(a_tail_desc, [kk * BLOCK_K, off_m], bar, a_buf.slice(0, TAIL))
        tma_load(b_tail_desc, [gl.minimum(kk * BLOCK_K, B_ROWS - TAIL), off_n], bar, b_buf.slice(0, TAIL))


# The claim: lane 0 of the loader warp adds 1 to the counter in global memory (relaxed: the counter orders nothing but
# the claims) and the old value is broadcast to the warp's 32 lanes, which each run this once.
_CLAIM_ASM = gl.constexpr("""{
    .reg .pred first;
    .reg .u32 lane, claimed;
    mov.u32 lane, %laneid;
    setp.eq.u32 first, lane, 0;
    mov.u32 claimed, 0;
    @first atom.relaxed.gpu.global.add.u32 claimed, [$1], 1;
    shfl.sync.idx.b32 $0, claimed, 0, 0x1f, 0xffffffff;
}""")


@gluon.jit
def _claim_tile(tile_counter):
    """The loader warp's next tile: the counter's value before this claim's increment (the tiles in order 0, 1, ...
    across all programs, each taken once)."""
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [1], [0])
    counter = tile_counter + gl.zeros([1], gl.int32, layout)
    claimed = gl.inline_asm_elementwise(_CLAIM_ASM, "=r,l", [counter], dtype=gl.int32, is_pure=False, pack=1)
    return gl.max(claimed, axis=0)


@gluon.jit
def _publish_tile(tile_ids, tile_ready, tile_free, j, tile):
    """The loader hands the tile number of this program's j-th tile to both product warpgroups through slot
    j % TILE_SLOTS, once both have taken the number that slot held before (the operand ring's protocol, gluon_common,
    on a ring of tile numbers)."""
    slot = wait_stage_free(tile_free, j)
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [1], [0])
    tile_ids.index(slot).store(gl.full([1], tile, gl.int32, layout))
    warps_barrier()  # the number is in shared memory before the arrival that publishes it
    release_stage(tile_ready, j)


@gluon.jit
def _take_tile(tile_ids, tile_ready, tile_free, j, num_warps: gl.constexpr):
    """A product warpgroup's j-th tile number, from the loader (_publish_tile); the slot is handed back once read."""
    slot = wait_stage_ready(tile_ready, j)
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [num_warps], [0])
    tile = gl.max(tile_ids.index(slot).load(layout), axis=0)
    warps_barrier()  # every warp has read the number before the slot is handed back
    release_stage(tile_free, j)
    return tile


@gluon.jit
def _products(a_bufs, b_bufs, ready, empty, tile_ids, tile_ready, tile_free, staging, c_desc, c_high_desc, M, N,
              HIGH_FROM, FULL_STEPS, TAIL_STEPS, TAIL: gl.constexpr, BY_COLUMN: gl.constexpr, DYNAMIC: gl.constexpr,
              WARPGROUP: gl.constexpr, num_warps: gl.constexpr):  # fmt: skip
    """Product warpgroup WARPGROUP (0 or 1): rows [64 * WARPGROUP, +64) of each of this program's tiles (_product_tile):
    the tiles dealt out in advance, or with DYNAMIC the tile numbers the loader claims, until it hands over the tile
    count. Each tile's bf16 result is stored under the next tile's products; the last one's after them all."""
    BLOCK_M: gl.constexpr = a_bufs.shape[2]
    BLOCK_N: gl.constexpr = b_bufs.shape[2]
    ROWS: gl.constexpr = staging.shape[1]
    step = 0
    done = gl.zeros((ROWS, BLOCK_N), dtype=staging.dtype, layout=wgmma_layout(BLOCK_N, num_warps))
    done_m = 0
    done_n = 0
    if DYNAMIC:
        num_tiles = gl.cdiv(M, BLOCK_M) * gl.cdiv(N, BLOCK_N)
        j = 0
        tile = _take_tile(tile_ids, tile_ready, tile_free, j, num_warps)
        while tile < num_tiles:
            step, done, done_m, done_n = _product_tile(
                a_bufs, b_bufs, ready, empty, staging, c_desc, c_high_desc, tile, j, step, done, done_m, done_n, M, N,
                HIGH_FROM, FULL_STEPS, TAIL_STEPS, TAIL, BY_COLUMN, WARPGROUP, num_warps)  # fmt: skip
            j += 1
            tile = _take_tile(tile_ids, tile_ready, tile_free, j, num_warps)
        tiles_done = j
    else:
        my_tiles = program_tile_count(M, N, BLOCK_M, BLOCK_N)
        for j in range(my_tiles):
            step, done, done_m, done_n = _product_tile(
                a_bufs, b_bufs, ready, empty, staging, c_desc, c_high_desc, gl.program_id(0) + j * gl.num_programs(0), j,
                step, done, done_m, done_n, M, N, HIGH_FROM, FULL_STEPS, TAIL_STEPS, TAIL, BY_COLUMN, WARPGROUP,
                num_warps)  # fmt: skip
        tiles_done = my_tiles
    if tiles_done > 0:
        pieces = split_columns(done, BLOCK_N // staging.shape[2])
        for r in gl.static_range(len(pieces)):
            _store_piece(staging, pieces[r], r, c_desc, c_high_desc, done_m, done_n, HIGH_FROM, WARPGROUP)
    tma.store_wait(0)


@gluon.jit
def _store_piece(staging, piece, r: gl.constexpr, c_desc, c_high_desc, tile_m, off_n, HIGH_FROM, WARPGROUP: gl.constexpr):
    """Column block r of this warpgroup's rows of the tile at (tile_m, off_n), in bf16, out by TMA through staging
    buffer r % BUFFERS. The store that read that buffer BUFFERS blocks ago is done first; the BUFFERS - 1 issued since
    may still be reading theirs, so a block does not wait for the store just issued."""
    BUFFERS: gl.constexpr = staging.shape[0]
    ROWS: gl.constexpr = staging.shape[1]
    WIDTH: gl.constexpr = staging.shape[2]
    buffer = staging.index(r % BUFFERS)
    tma.store_wait(BUFFERS - 1)
    warps_barrier()  # no warp writes the buffer before the store that read it is done
    buffer.store(piece)
    fence_async_shared()
    warps_barrier()
    # The tile decides: the second warpgroup's rows of a last tile can start past M = HIGH_FROM (clipped).
    off_m = tile_m + WARPGROUP * ROWS
    if tile_m < HIGH_FROM:
        tma_store(c_desc, [off_m, off_n + r * WIDTH], buffer)
    else:
        tma_store(c_high_desc, [off_m - HIGH_FROM, off_n + r * WIDTH], buffer)


@gluon.jit
def _product_tile(a_bufs, b_bufs, ready, empty, staging, c_desc, c_high_desc, tile, j, step, done, done_m, done_n, M, N,
                  HIGH_FROM, FULL_STEPS, TAIL_STEPS, TAIL: gl.constexpr, BY_COLUMN: gl.constexpr,
                  WARPGROUP: gl.constexpr, num_warps: gl.constexpr):  # fmt: skip
    """This warpgroup's 64 rows of `tile` (the program's j-th): acc = A block^T @ B block over the tile's K
    steps (a short last one of TAIL rows where TAIL_STEPS = 1). Under these products the tile before (`done`, in bf16,
    at (done_m, done_n); none where j = 0) goes out a column block per K step, each block while the step's wgmma
    runs, the blocks left when the steps run out after them. Nothing here waits for the other warpgroup, so where one
    stages a block, the other's wgmma have the tensor cores too. Returns the ring's step count and this tile in bf16
    with its origin, to go out under the next tile."""
    BLOCK_M: gl.constexpr = a_bufs.shape[2]
    BLOCK_N: gl.constexpr = b_bufs.shape[2]
    ROWS: gl.constexpr = staging.shape[1]
    ROUNDS: gl.constexpr = BLOCK_N // staging.shape[2]
    mma_layout: gl.constexpr = wgmma_layout(BLOCK_N, num_warps)
    tile_m, off_n = _tile_origin(tile, M, N, BLOCK_M, BLOCK_N, BY_COLUMN)
    pieces = split_columns(done, ROUNDS)
    acc = gl.zeros((ROWS, BLOCK_N), dtype=gl.float32, layout=mma_layout)
    for kk in range(FULL_STEPS):
        s = wait_stage_ready(ready, step)
        a = a_bufs.index(s).slice(WARPGROUP * ROWS, ROWS, dim=1)
        acc = warpgroup_mma(a.permute((1, 0)), b_bufs.index(s), acc, use_acc=kk > 0, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
        if kk > 0:  # the wgmma of the step before is done with its stage
            release_stage(empty, step - 1)
        for r in gl.static_range(ROUNDS):
            if (kk == r) & (j > 0):
                _store_piece(staging, pieces[r], r, c_desc, c_high_desc, done_m, done_n, HIGH_FROM, WARPGROUP)
        step += 1
    # The short step after the loop rather than a branch in it: an in-flight wgmma cannot leave an if, so a branch in
    # the loop would issue and wait at every step.
    if TAIL_STEPS > 0:
        s = wait_stage_ready(ready, step)
        a = a_bufs.index(s).slice(WARPGROUP * ROWS, ROWS, dim=1).slice(0, TAIL)
        acc = warpgroup_mma(a.permute((1, 0)), b_bufs.index(s).slice(0, TAIL), acc, use_acc=FULL_STEPS > 0, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
        if FULL_STEPS > 0:
            release_stage(empty, step - 1)
        step += 1
    for r in gl.static_range(ROUNDS):  # the blocks that found no whole K step to go out under
        if (r >= FULL_STEPS) & (j > 0):
            _store_piece(staging, pieces[r], r, c_desc, c_high_desc, done_m, done_n, HIGH_FROM, WARPGROUP)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    release_stage(empty, step - 1)
    return step, acc.to(staging.dtype), tile_m, off_n


@gluon.jit(do_not_specialize=["tile_counter", "B_ROWS", "FULL_STEPS", "TAIL_STEPS"])
def weight_grad_ws_kernel(
    a_desc, b_desc, a_tail_desc, b_tail_desc, c_desc, c_high_desc, tile_counter,
    M, N, HIGH_FROM, B_ROWS, FULL_STEPS, TAIL_STEPS,
    STAGES: gl.constexpr,  # shared-memory stages of (A, B) blocks: [BLOCK_K, BLOCK_M] and [BLOCK_K, BLOCK_N]
    BY_COLUMN: gl.constexpr,  # the tiles column by column (else row by row)
    # The tiles claimed one at a time from tile_counter (an int32 in global memory, zero at launch) by each program's
    # loader as it is ready for the next, in the same order, rather than dealt out in advance.
    DYNAMIC: gl.constexpr,
    PRODUCT_REGS: gl.constexpr,  # registers per thread of the second product warpgroup (a worker partition)
    num_warps: gl.constexpr,  # 4: the first product warpgroup (the default partition)
):  # fmt: skip
    """[c; c_high] (M rows, split at HIGH_FROM) = A^T @ B over FULL_STEPS K steps of BLOCK_K rows and TAIL_STEPS
    (0 or 1) of TAIL rows. a_desc and b_desc are A (rows padded with zeros, M columns) and B (B_ROWS rows, N columns)
    in [BLOCK_K, BLOCK_M] and [BLOCK_K, BLOCK_N] blocks: the fp16 dd and x16 for grad_w1/grad_w3 (M = 2F, B padded
    too), or ge and the input gated_output of T rows for grad_w2 (M = H), whose last step is read as the block that
    ends at row T against the block of ge that the gather has shifted to match (gather_kernel, with that step's rows).
    a_tail_desc and b_tail_desc are the same tensors in [TAIL, .] blocks, c_desc and c_high_desc the bf16 outputs in
    [BLOCK_M / 2, WIDTH] pieces (a product warpgroup's rows)."""
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[1]
    WIDTH: gl.constexpr = c_desc.block_type.shape[1]
    a_bufs, b_bufs, ready, empty = operand_ring(a_desc, b_desc, STAGES, RELEASES=2)
    # Two 64-column blocks per warpgroup: staging the whole 64 x 256 would cost an operand stage, which the pipeline
    # needs more.
    staging_shape: gl.constexpr = [BLOCK_N // WIDTH // 2] + c_desc.block_type.shape
    staging = gl.allocate_shared_memory(c_desc.dtype, staging_shape, c_desc.layout)
    staging_second = gl.allocate_shared_memory(c_desc.dtype, staging_shape, c_desc.layout)
    # With DYNAMIC, the loader's claimed tile numbers on their way to the product warpgroups: TILE_SLOTS slots, each
    # with a `tile_ready` barrier (the loader has written it) and a `tile_free` one (both warpgroups have read it).
    tile_ids = gl.allocate_shared_memory(gl.int32, [TILE_SLOTS, 1], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    tile_ready = gl.allocate_shared_memory(gl.int64, [TILE_SLOTS, 1], mbarrier.MBarrierLayout())
    tile_free = gl.allocate_shared_memory(gl.int64, [TILE_SLOTS, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(TILE_SLOTS):
        mbarrier.init(tile_ready.index(i), count=1)
        mbarrier.init(tile_free.index(i), count=2)
    TAIL: gl.constexpr = a_tail_desc.block_type.shape[0]
    gl.warp_specialize(
        [
            (_products, (a_bufs, b_bufs, ready, empty, tile_ids, tile_ready, tile_free, staging, c_desc, c_high_desc, M,
                         N, HIGH_FROM, FULL_STEPS, TAIL_STEPS, TAIL, BY_COLUMN, DYNAMIC, 0, num_warps)),
            (_products, (a_bufs, b_bufs, ready, empty, tile_ids, tile_ready, tile_free, staging_second, c_desc,
                         c_high_desc, M, N, HIGH_FROM, FULL_STEPS, TAIL_STEPS, TAIL, BY_COLUMN, DYNAMIC, 1, 4)),
            (_load_operands, (a_desc, b_desc, a_tail_desc, b_tail_desc, a_bufs, b_bufs, ready, empty, tile_counter,
                              tile_ids, tile_ready, tile_free, M, N, B_ROWS, FULL_STEPS, TAIL_STEPS, BY_COLUMN,
                              DYNAMIC)),
        ],
        [4, 1],  # the second product warpgroup, the loader warp
        [PRODUCT_REGS, 24],  # the loader needs few registers
    )  # fmt: skip
