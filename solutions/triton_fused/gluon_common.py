"""Pieces the warp-specialised Gluon kernels share (dh_warp_specialized.py, dh_grad_w2.py, dx_warp_specialized.py,
dx_grad_weight_warp_specialized.py, weight_grad_warp_specialized.py): the operand ring between the loader warp and the
product warps, and how each side waits on it and hands a stage back, the dx kernels' weight block on the K axis of 2F,
the persistent programs' tile count, the wgmma accumulator layout, the SwiGLU backward of the dh kernels' epilogues."""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

# Gluon's API moves between Triton releases, each name on its own. Triton 3.6 (the H200 machine's) names TMA's copies
# async_copy_global_to_shared and async_copy_shared_to_global, 3.8 on async_load and async_store (and refuse the old
# names); the barrier of a partition's warps is thread_barrier in 3.6, barrier from 3.7. The kernels call the names
# bound here, so that one source compiles under all of them. A shared buffer's view under another type, 3.6's
# _reinterpret, is public from 3.9 as reinterpret: the kernels call the old name, which is given to the new method
# where it is missing.
if hasattr(tma, "async_load"):
    tma_load, tma_store = tma.async_load, tma.async_store
else:
    tma_load, tma_store = tma.async_copy_global_to_shared, tma.async_copy_shared_to_global
warps_barrier = gl.barrier if hasattr(gl, "barrier") else gl.thread_barrier
if not hasattr(gl.shared_memory_descriptor, "_reinterpret"):
    gl.shared_memory_descriptor._reinterpret = gl.shared_memory_descriptor.reinterpret


@gluon.jit
def operand_ring(a_desc, b_desc, STAGES: gl.constexpr, RELEASES: gl.constexpr = 1):
    """The loader-to-products ring: STAGES shared-memory stages of one A block and one B block (the descriptors'
    block shapes and layouts), and per stage a `ready` barrier (the loader's bytes have arrived) and an `empty` one
    (the RELEASES groups of product warps that read the stage are done with it), each completed once per use."""
    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES] + a_desc.block_type.shape, a_desc.layout)
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES] + b_desc.block_type.shape, b_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=RELEASES)
    return a_bufs, b_bufs, ready, empty


@gluon.jit
def wait_stage_free(empty, step):
    """The loader's side of the ring: wait until step's stage, step % STAGES, has been released by the products of
    the step STAGES before it (the first pass over the ring finds every stage free); returns the stage."""
    STAGES: gl.constexpr = empty.shape[0]
    s = step % STAGES
    mbarrier.wait(empty.index(s), ((step // STAGES) & 1) ^ 1)
    return s


@gluon.jit
def wait_stage_ready(ready, step):
    """The products' side of the ring: wait until step's operands have arrived in its stage; returns the stage."""
    STAGES: gl.constexpr = ready.shape[0]
    s = step % STAGES
    mbarrier.wait(ready.index(s), (step // STAGES) & 1)
    return s


@gluon.jit
def release_stage(empty, step):
    """The products' side of the ring: step's wgmma are done with its stage, which the loader may refill."""
    STAGES: gl.constexpr = empty.shape[0]
    mbarrier.arrive(empty.index(step % STAGES), count=1)


@gluon.jit
def load_weight_block(w1_desc, w3_desc, k, off_n, F, bar, buf):
    """The dx kernels' K axis runs over the 2F rows of [w1; w3] without concatenating the weights: the block at row k
    and column off_n is w1's rows k for k < F, else w3's rows k - F. Loads it into buf by TMA, counted in by bar."""
    if k < F:
        tma_load(w1_desc, [k, off_n], bar, buf)
    else:
        tma_load(w3_desc, [k - F, off_n], bar, buf)


@gluon.jit
def program_tile_count(rows, cols, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr):
    """How many of the cdiv(rows, BLOCK_M) x cdiv(cols, BLOCK_N) output tiles this persistent program takes: the
    tiles program_id, program_id + num_programs, ..."""
    return gl.cdiv(gl.cdiv(rows, BLOCK_M) * gl.cdiv(cols, BLOCK_N) - gl.program_id(0), gl.num_programs(0))


@gluon.constexpr_function
def wgmma_layout(block_n, num_warps):
    """The fp32 accumulator layout of a BLOCK_M x block_n tile whose rows the num_warps product warps share, 16 rows
    to a warp: one 64-row wgmma of N = block_n per warpgroup and K step of 16."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, block_n, 16])


@gluon.jit
def split_columns(x, PIECES: gl.constexpr):
    """The PIECES column blocks of x, left to right (PIECES a power of two)."""
    xs = (x,)
    for _ in gl.static_range(PIECES.bit_length() - 1):
        parts = ()
        for j in gl.static_range(len(xs)):
            y = xs[j]
            parts += y.reshape(y.shape[0], 2, y.shape[1] // 2).permute(0, 2, 1).split()
        xs = parts
    return xs


@gluon.jit
def swiglu_backward(dh, a, up, gate):
    """d_a = dh * up * silu'(a) and d_up = dh * gate in fp32 (a from w1_output; all four fp32 tensors)."""
    # silu's exp and reciprocal in PTX's flush-to-zero forms: gl.exp and `/` wrap each in range fix-ups (a compare and a
    # rescale on either side of the MUFU) that only matter where exp(-a) leaves fp32's normal range, far past what the
    # fp16 and bf16 outputs resolve, and cost the epilogue several instructions per element.
    e = gl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=r,r", [a * -1.4426950408889634], dtype=gl.float32,
                                  is_pure=True, pack=1)  # fmt: skip
    s = gl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=r,r", [1.0 + e], dtype=gl.float32, is_pure=True,
                                  pack=1)  # fmt: skip
    grad_a = dh * up * s * (1.0 + a * (1.0 - s))
    # An fp32 multiply LLVM cannot see through: with dh and gate both widened from 16 bits and the product only
    # rounded to fp16 (no bf16 copy), it would multiply in fp16 instead, rounding gate (bf16) to fp16 first:
    # wrong in the last place where |gate| is below fp16's normal range, inf above 65504.
    grad_up = gl.inline_asm_elementwise("mul.rn.f32 $0, $1, $2;", "=r,r,r", [dh, gate], dtype=gl.float32, is_pure=True,
                                        pack=1)  # fmt: skip
    return grad_a, grad_up
