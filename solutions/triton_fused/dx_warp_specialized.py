"""dx = [d_a | d_up] @ [w1; w3] as a warp-specialised Gluon kernel (Hopper) that reads dd in fp16 (the plans use it at
T <= 64 and 192 < T <= 1024).

Triton's `dx_kernel` (kernels.py) needs a bf16 copy of dd, which the dh epilogue writes beside the fp16 dd that the
weight gradients read: two more (T, F) stores per tile. Converting the fp16 tile to bf16 in registers before
tl.dot gave wrong sums that changed from run to run in Triton 3.6 (docs/performance.md); this kernel does that
conversion itself and feeds the tensor cores from registers (wgmma with A in registers, B in shared memory):

- one loader warp streams the K steps' blocks by TMA into a ring of STAGES shared-memory stages: dd[rows, k] (fp16,
  one (ROWS, 2F) descriptor, so K runs over all 2F columns) and the matching weight block, w1[k] for k < F and
  w3[k - F] after, so dx is one GEMM of K = 2F over both weights without concatenating them;
- the default partition (num_warps warps: 8 for a 128 x 256 tile, two warpgroups of 64 x 256 wgmma; 4, one
  warpgroup, for a 64 x 256 tile) loads each dd block from shared memory into registers, rounds it to bf16 and issues
  its wgmma, with one wgmma in flight while the next is issued.

A wgmma reads its A registers until it completes, and a loop rewrites the same registers on every pass: with one
register set for A, a step's load overwrote the registers that the previous step's wgmma, still in flight, was
reading (wrong sums that varied from run to run on the H200, as Triton's kernel gave: probably the same hazard).
So the loop takes the K steps in pairs with one register set each: a step reloads a set only after the wait that
completes the wgmma two steps back (an odd last step takes the first set).

Split-K as in Triton's kernel: axis 1 of the grid takes K_PER_SPLIT columns of the 2F (whole K steps, none
straddling F) into partial FIRST_SPLIT + axis 1, each stored rounded to the partials' dtype (bf16), and
scatter_kernel adds the partials in a fixed order. With TO_ROWS (one launch over all the slices) the last of a tile's
programs to arrive on the tile's counter adds them itself, in the same order and to the same bits, and stores the
selected rows of grad_hidden_states: no scatter at the end of the call. The partial leaves wgmma's layout for one
whose warps store whole rows (each warp's store otherwise touches 8 rows, 16 bytes each), which the last program's
wait for its stores and its reads of the partials would otherwise pay for. Rows of dd past T may hold anything: they reach only rows of the
partials past T, which are not stored.

Precision: dd's fp16 values (rounded once from the fp32 SwiGLU backward) are rounded to bf16, the operand dtype of
dx that the tolerance admits (SPEC section 4); the product accumulates in fp32. bf16(fp16(x)) can differ from the
bf16(x) of the copy by one unit of the last place, where the first rounding lands x on a bf16 tie, and keeps fewer
bits below fp16's normal range (2^-14): the weight gradients read the same fp16 values.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, warpgroup_mma, warpgroup_mma_wait

from .gluon_common import (
    load_weight_block,
    operand_ring,
    release_stage,
    tma_load,
    wait_stage_free,
    wait_stage_ready,
    warps_barrier,
    wgmma_layout,
)


@gluon.jit
def _load_operands(dd_desc, w1_desc, w3_desc, a_bufs, b_bufs, ready, empty, T, F, K_PER_SPLIT, FIRST_SPLIT):
    """Loader partition: the (dd, weight) blocks of this program's K steps, into stage step % STAGES once the products
    have released it (`empty`); `ready` counts their bytes in."""
    BLOCK_M: gl.constexpr = dd_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = dd_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = w1_desc.block_type.shape[1]
    num_m = gl.cdiv(T, BLOCK_M)
    off_m = (gl.program_id(0) % num_m) * BLOCK_M
    off_n = (gl.program_id(0) // num_m) * BLOCK_N
    k_first = (FIRST_SPLIT + gl.program_id(1)) * K_PER_SPLIT
    for step in range(K_PER_SPLIT // BLOCK_K):
        s = wait_stage_free(empty, step)
        k = k_first + step * BLOCK_K
        bar = ready.index(s)
        mbarrier.expect(bar, dd_desc.block_type.nbytes + w1_desc.block_type.nbytes)
        tma_load(dd_desc, [off_m, k], bar, a_bufs.index(s))
        load_weight_block(w1_desc, w3_desc, k, off_n, F, bar, b_bufs.index(s))


@gluon.jit
def _issue_step(a_bufs, b_bufs, ready, acc, step, a_layout: gl.constexpr):
    """Wait for step's stage, load its dd block into registers as bf16 and issue its wgmma (asynchronous)."""
    s = wait_stage_ready(ready, step)
    a = a_bufs.index(s).load(a_layout).to(gl.bfloat16)
    return warpgroup_mma(a, b_bufs.index(s), acc, is_async=True), a


@gluon.jit
def _products(a_bufs, b_bufs, ready, empty, partials, arrivals, token_indices, grad_hidden_states, T, H, K_PER_SPLIT,
              FIRST_SPLIT, TO_ROWS: gl.constexpr, num_warps: gl.constexpr):  # fmt: skip
    """Default partition: acc = bf16(dd block) @ weight block over the K steps, two steps per pass (A register sets
    a0 and a1), then the tile's rows below T into its partial (and with TO_ROWS, if this program is the tile's last,
    the sum of the tile's partials into the selected rows: _add_partials_into_rows)."""
    BLOCK_M: gl.constexpr = a_bufs.shape[1]
    BLOCK_K: gl.constexpr = a_bufs.shape[2]
    BLOCK_N: gl.constexpr = b_bufs.shape[2]
    mma_layout: gl.constexpr = wgmma_layout(BLOCK_N, num_warps)
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_layout, k_width=2)
    steps = K_PER_SPLIT // BLOCK_K
    acc = gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.float32, layout=mma_layout)
    # Each wait names both register sets, so neither is free for reuse before the wait that completes its wgmma: after
    # a wait one wgmma is left in flight, and it reads the set just loaded.
    a1 = gl.zeros((BLOCK_M, BLOCK_K), dtype=gl.bfloat16, layout=a_layout)
    for step in range(0, steps - 1, 2):
        acc, a0 = _issue_step(a_bufs, b_bufs, ready, acc, step, a_layout)
        acc, a0, a1 = warpgroup_mma_wait(num_outstanding=1, deps=(acc, a0, a1))
        if step > 0:  # the previous pass's second wgmma is done with a1 and its stage
            release_stage(empty, step - 1)
        acc, a1 = _issue_step(a_bufs, b_bufs, ready, acc, step + 1, a_layout)
        acc, a1, a0 = warpgroup_mma_wait(num_outstanding=1, deps=(acc, a1, a0))
        release_stage(empty, step)  # this pass's first wgmma is done with a0 and its stage
    if steps % 2 == 1:
        acc, a0 = _issue_step(a_bufs, b_bufs, ready, acc, steps - 1, a_layout)
        acc, a0, a1 = warpgroup_mma_wait(num_outstanding=1, deps=(acc, a0, a1))
        if steps > 1:
            release_stage(empty, steps - 2)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    release_stage(empty, steps - 1)
    # Out of wgmma's layout into one whose warp stores 512 contiguous bytes of a row (module docstring).
    out_layout: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [num_warps, 1], [1, 0])
    partial = gl.convert_layout(acc.to(partials.dtype.element_ty), out_layout)
    num_m = gl.cdiv(T, BLOCK_M)
    rows = (gl.program_id(0) % num_m) * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, out_layout))
    cols = (gl.program_id(0) // num_m) * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, out_layout))
    mask = (rows < T)[:, None] & (cols < H)[None, :]
    out = partials + ((FIRST_SPLIT + gl.program_id(1)) * T + rows)[:, None] * H + cols[None, :]
    gl.store(out, partial, mask=mask)
    if TO_ROWS:  # noqa: SIM102 (a compile-time branch around a run-time one); the tile's programs: one per slice of K
        if _arrives_last(arrivals + gl.program_id(0), gl.num_programs(1), num_warps):
            _add_partials_into_rows(partials, token_indices, grad_hidden_states, rows, cols, T, H, out_layout)


# The arrival on a counter: the one thread whose flag is set adds 1 (acquire-release, so that the partials stored
# before it are seen by whichever program arrives last, and that one sees all of theirs); every thread returns the
# count before it, or 0.
_ARRIVE_ASM = gl.constexpr("""{
    .reg .pred chosen;
    setp.ne.u32 chosen, $2, 0;
    mov.u32 $0, 0;
    @chosen atom.acq_rel.gpu.global.add.u32 $0, [$1], 1;
}""")


@gluon.jit
def _arrives_last(counter, ARRIVALS, num_warps: gl.constexpr):
    """Count the calling partition in on `counter` (a dx tile's counter, zeroed by gather_kernel) once the stores of its
    partial are issued: one atomic add by its first thread, after a barrier of its warps, so that every warp's stores
    come before it. Whether it was the last of ARRIVALS (then it adds the tile's partials: _add_partials_into_rows)."""
    warps_barrier()
    layout: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [num_warps, 1], [1, 0])  # one element per thread
    warp = gl.arange(0, num_warps, layout=gl.SliceLayout(1, layout))[:, None]
    lane = gl.arange(0, 32, layout=gl.SliceLayout(0, layout))[None, :]
    first = ((warp == 0) & (lane == 0)).to(gl.int32)
    old = gl.inline_asm_elementwise(_ARRIVE_ASM, "=r,l,r", [counter + first * 0, first], dtype=gl.int32, is_pure=False,
                                    pack=1)  # fmt: skip
    return gl.max(gl.max(old, axis=1), axis=0) == ARRIVALS - 1


@gluon.jit
def _add_partials_into_rows(partials, token_indices, grad_hidden_states, rows, cols, T, H, layout: gl.constexpr):
    """dx's (T, H) partials (one per slice of K) over `rows` x `cols` (in `layout`; rows from T on are left out) added
    in fixed order in fp32, as scatter_kernel would, and stored rounded to bf16 into rows token_indices[t] of
    grad_hidden_states. The partials are read from L2 (.cg): this SM's L1 never held them."""
    mask = (rows < T)[:, None] & (cols < H)[None, :]
    total = gl.zeros(mask.shape, dtype=gl.float32, layout=layout)
    for s in range(gl.num_programs(1)):
        theirs = partials + (s * T + rows)[:, None] * H + cols[None, :]
        total += gl.load(theirs, mask=mask, other=0.0, cache_modifier=".cg").to(gl.float32)
    selected = gl.load(token_indices + rows, mask=rows < T, other=0)
    out = grad_hidden_states + selected[:, None] * H + cols[None, :]
    gl.store(out, total.to(grad_hidden_states.dtype.element_ty), mask=mask)


@gluon.jit(do_not_specialize=["T", "FIRST_SPLIT"])
def dx_ws_kernel(
    dd_desc, w1_desc, w3_desc, partials, arrivals, token_indices, grad_hidden_states,
    T, H, F, K_PER_SPLIT, FIRST_SPLIT,
    STAGES: gl.constexpr,  # shared-memory stages of (dd, weight) blocks: [BLOCK_M, BLOCK_K] and [BLOCK_K, BLOCK_N]
    TO_ROWS: gl.constexpr,  # one launch over all slices of K, the last of a tile's programs storing its selected rows
    num_warps: gl.constexpr,  # the product warps: 8 for two warpgroups of 64 rows
):  # fmt: skip
    """partials[FIRST_SPLIT + s] = bf16(dd[:, Ks]) @ [w1; w3][Ks] for the s-th slice Ks of K_PER_SPLIT of the 2F
    columns (axis 1 of the grid), one (BLOCK_M, BLOCK_N) tile of the (T, H) partial per program (axis 0, token
    tile fastest). dd_desc is the fp16 (ROWS, 2F) dd, w1_desc and w3_desc the bf16 (F, H) weights.

    Shared memory: STAGES x (16 + 32) KB at 128 x 256 x 64, and 32 KB for the partial's layout conversion: 4 stages
    take 224 KB.
    """
    a_bufs, b_bufs, ready, empty = operand_ring(dd_desc, w1_desc, STAGES)
    gl.warp_specialize(
        [
            (_products, (a_bufs, b_bufs, ready, empty, partials, arrivals, token_indices, grad_hidden_states, T, H,
                         K_PER_SPLIT, FIRST_SPLIT, TO_ROWS, num_warps)),
            (_load_operands, (dd_desc, w1_desc, w3_desc, a_bufs, b_bufs, ready, empty, T, F, K_PER_SPLIT, FIRST_SPLIT)),
        ],
        [1],  # the loader warp
        [24],  # its registers: it needs few
    )  # fmt: skip
