"""Triton kernels of the fused MoE expert SwiGLU backward.

Seven kernels (T tokens, H hidden, F ffn, B batch rows; shapes of SPEC section 1), up to nine launches on two
streams. On the caller's stream:

- `gather_kernel`           g = grad_output[idx] and ge = g*w (bf16), the operands of dh and grad_w2 (where the
                            plan has dh gather its own rows, ge only, on the second stream)
- `dh_swiglu_kernel`        dh = (g @ w2) * w in fp32, then the SwiGLU backward in its epilogue -> dd = [d_a | d_up],
                            in fp16 (for the weight gradients, and for dx where it is the Gluon kernel) and, where
                            dx is dx_kernel, once more in bf16; from T = 257 the warp-specialised Gluon kernel of
                            dh_warp_specialized.py takes its place
- `weight_grad_kernel`      [grad_w1; grad_w3] = [d_a | d_up]^T @ x16, one GEMM of M = 2F rows (at 64 < T <= 192
                            the Gluon kernel of dx_grad_weight_warp_specialized.py computes them with dx, in one
                            pass over w1 and w3, right after dh); from T = 193
                            the warp-specialised Gluon kernel of weight_grad_warp_specialized.py takes its place
                            (a short last K step, stores under products)
- `scatter_kernel`          the T selected rows of grad_hidden_states (fixed-order sum of dx's partials) and
                            their entries of grad_routing_weights; where dx stores the rows itself (the Gluon dx
                            at 192 < T <= 1024, dx_kernel above), only the latter, on the second stream right
                            behind routing_x16_kernel

and beside them, on a second stream (the launcher orders the two with events):

- `zero_unselected_kernel`  the B - T rows of grad_hidden_states and entries of grad_routing_weights that no
                            token selects, as zeros: memory traffic hidden under dh's tensor-core work
- `routing_x16_kernel`      x16 = fp16(x) for grad_w1/grad_w3, and the per-chunk partial sums of
                            grad_routing_t = sum_h g*e (fp32)
- `weight_grad_kernel`      again, for grad_w2 = ge^T @ gated (the Gluon kernel from T = 65)
- `dx_kernel`               from T = 1025, once over both halves of K (d_a @ w1 and d_up @ w3) into the selected
                            rows of grad_hidden_states (TO_ROWS); it can also run once per half, into split-K
                            partials that the scatter sums. At T <= 64 dx_warp_specialized.py's Gluon kernel
                            (over the fp16 dd) takes its place, once per half into split-K partials, the w3
                            half on the caller's stream; at 64 < T <= 192 the fused Gluon kernel above, on the
                            caller's stream, and at 192 < T <= 1024 the Gluon kernel again, one launch over both

The GEMM operands move by TMA, both of them into shared memory and from there to the tensor cores: the
launcher passes host tensor descriptors (16-byte aligned bases and row strides, contiguous rows), whose
out-of-bounds reads are zero-filled and whose out-of-bounds stores are dropped, so a T that is a multiple of
no tile needs no masks on the operands. A block partly out of bounds is slow, though, so the launcher pads the
T rows of the intermediates with zero rows and no operand block reaches past its tensor (weight_grad_kernel).
(An operand that passes through registers on its way to tl.dot, to
change its dtype, next to a TMA-loaded one, gave wrong results that varied from run to run for some tiles on
the H200 with Triton 3.6; docs/performance.md. So dx_kernel gets its own bf16 copy of dd and one K loop per
launch. The Gluon dx, which controls its registers, converts in registers without that copy.)

The weight-gradient kernel is persistent when the launcher gives it fewer programs than tiles: each program
walks the tiles `program_id, program_id + num_programs, ...`, and with FLATTEN Triton's pipeliner merges that
loop with the K loop, so the loads of the next tile are in flight while this tile's epilogue stores (K = T is
short, so the kernel is bound by those stores). dh runs one program per tile.

Precision (SPEC section 4): the path g -> dh -> (d_a, d_up) -> grad_w1/grad_w3 keeps at least 10 mantissa
bits: g and w2 are exact bf16 inputs, the routing weight multiplies the fp32 accumulator (ge is never
rounded on this path), the SwiGLU backward runs in fp32 and d_a, d_up are stored in fp16 for the weight
gradients, whose other operand x is exact in fp16. grad_w2 (one rounding of ge) and dx (d_a, d_up rounded
to bf16 by the dh epilogue, or by the Gluon dx from fp16) take bf16 operands, which the tolerance admits. Every tl.dot accumulates in fp32.

The kernels take their operand dtypes from the descriptors and pointers, so the CPU tests can run them
under TRITON_INTERPRET=1 with float32/float16 operands.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit(do_not_specialize=["T", "LAST_STEP", "SHIFT", "COUNTERS"])
def gather_kernel(
    grad_output, token_indices, selected_weights, g_out, ge_out, counters,
    T, H, LAST_STEP, SHIFT, COUNTERS,
    BLOCK_H: tl.constexpr,  # columns per program
    WRITE_G: tl.constexpr,  # False where dh gathers its own rows: ge only
    WRITE_GE: tl.constexpr,  # False where dh computes grad_w2 (the only reader of ge): g only
    LAUNCH_DEPENDENTS: tl.constexpr,  # let the next kernel on the stream, launched as a programmatic dependent, start
):  # fmt: skip
    """Program (r, c) writes columns [c*BLOCK_H, (c+1)*BLOCK_H) of row r of g and of ge, over the rows that the
    launcher pads T to: g = grad_output[idx] (zero rows from T on) and ge = g*w, rounded to bf16 once (grad_w2's
    operand; dh multiplies its fp32 accumulator by w instead).

    ge's rows from LAST_STEP (the start of grad_w2's last K step) are shifted down by SHIFT (that step's rows
    past T) behind SHIFT zero rows, so that grad_w2 can load that step's rows of gated_output, an input of T
    rows, as the in-bounds block ending at row T (see weight_grad_kernel). A 2-D grid rather than a loop over
    H per token: at T = 64 a loop gives 64 programs with dependent steps, too few to stream even these few MB
    at full speed. The only kernel ahead of dh, unless dh gathers its own rows: it moves as little as it can
    (read g, write g and ge). With LAUNCH_DEPENDENTS every program allows the dependent launch as it starts, so a dh
    launched as a programmatic dependent (the Gluon dh, which waits for this grid before it reads g) is launched
    once the last of these programs has started, before the end of the grid releases anything on other streams.

    The first COUNTERS programs (at most rows x column blocks) each set one int32 of `counters` to zero: the call's
    counters that later kernels count up (the Gluon weight gradient's tile claims, the Gluon dx's arrivals), zeroed by
    the first kernel of the call rather than by a launch of their own.
    """
    if LAUNCH_DEPENDENTS:
        tl.extra.cuda.gdc_launch_dependents()
    r = tl.program_id(0)
    program = r * tl.num_programs(1) + tl.program_id(1)
    if program < COUNTERS:
        tl.store(counters + program, 0)
    cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    mask = cols < H
    if r < T:
        row = tl.load(token_indices + r)
        weight = tl.load(selected_weights + r).to(tl.float32)
        g = tl.load(grad_output + row * H + cols, mask=mask, other=0.0)
        if WRITE_G:
            tl.store(g_out + r * H + cols, g, mask=mask)
        if WRITE_GE:
            ge_row = tl.where(r >= LAST_STEP, r + SHIFT, r)
            tl.store(ge_out + ge_row * H + cols, (g.to(tl.float32) * weight).to(ge_out.dtype.element_ty), mask=mask)
    else:
        if WRITE_G:
            tl.store(g_out + r * H + cols, tl.zeros([BLOCK_H], dtype=g_out.dtype.element_ty), mask=mask)
        if WRITE_GE and r < T + SHIFT:
            tl.store(ge_out + (LAST_STEP + r - T) * H + cols, tl.zeros([BLOCK_H], dtype=ge_out.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["T"])
def routing_x16_kernel(
    grad_output, token_indices, selected_tokens, expert_output, x16_out, routing_partials,
    T, H,
    BLOCK_H: tl.constexpr,  # columns per program
):  # fmt: skip
    """Program (r, c), columns [c*BLOCK_H, (c+1)*BLOCK_H) of row r: for a token (r < T), x16 = fp16(x) (exact
    for these bf16 values; the weight gradients' operand) and routing_partials[r, c] = sum over those columns
    of g*e in fp32, which scatter_kernel adds in a fixed order; for a padding row (r >= T), zeros in x16.
    Runs on the second stream: only grad_w1/grad_w3 and scatter, late in the backward, need its outputs. It
    reads the gathered rows of grad_output itself rather than gather's g, so that it need not wait for the
    caller's stream (at most 16.7 MB more, at T = 2048).
    """
    r = tl.program_id(0)
    chunk = tl.program_id(1)
    cols = chunk * BLOCK_H + tl.arange(0, BLOCK_H)
    mask = cols < H
    if r < T:
        row = tl.load(token_indices + r)
        g = tl.load(grad_output + row * H + cols, mask=mask, other=0.0).to(tl.float32)
        e = tl.load(expert_output + r * H + cols, mask=mask, other=0.0).to(tl.float32)
        x = tl.load(selected_tokens + r * H + cols, mask=mask, other=0.0)
        tl.store(x16_out + r * H + cols, x.to(x16_out.dtype.element_ty), mask=mask)
        tl.store(routing_partials + r * tl.num_programs(1) + chunk, tl.sum(g * e, axis=0))
    else:
        tl.store(x16_out + r * H + cols, tl.zeros([BLOCK_H], dtype=x16_out.dtype.element_ty), mask=mask)


@triton.jit
def _swiglu_backward_store(
    dh, off_m, off_n, T, F, w1_output, up_output, gate_output, dd, dd_low,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, LOW_COPY: tl.constexpr, FAST_MATH: tl.constexpr,
):  # fmt: skip
    """d_a = dh * up * silu'(a) (from w1_output, not gate_output) and d_up = dh * gate, in fp32; each is
    stored into dd = [d_a | d_up] (fp16) and, with LOW_COPY, again into dd_low (bf16). With FAST_MATH (on a GPU;
    Triton's CPU interpreter runs no PTX) silu's exp and reciprocal are PTX's flush-to-zero forms, which carry none of
    the range fix-ups tl.sigmoid's do: they differ only where exp(-a) leaves fp32's normal range, far past what the
    fp16 and bf16 outputs resolve.

    The activations come through plain loads straight into registers: staged through shared memory by TMA,
    their three tiles would crowd out the pipeline buffers. The outputs leave by plain stores too, from the same
    coalesced layout: stores by TMA, staged in shared memory, took longer. Every row of the tile is stored, those past
    T as zeros (their activations load as zeros), because the weight gradients and dx read dd's padding rows. The
    stores ask L2 to keep dd (evict_last): the weight gradients and dx read it right after, while the weights stream
    through L2 past it.
    """
    rows = off_m + tl.arange(0, BLOCK_M)
    cols = off_n + tl.arange(0, BLOCK_N)
    mask = (rows < T)[:, None] & (cols < F)[None, :]
    act = rows[:, None] * F + cols[None, :]
    a = tl.load(w1_output + act, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(up_output + act, mask=mask, other=0.0).to(tl.float32)
    gate = tl.load(gate_output + act, mask=mask, other=0.0).to(tl.float32)
    if FAST_MATH:
        e = tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=r,r", [a * -1.4426950408889634],
                                      dtype=tl.float32, is_pure=True, pack=1)  # fmt: skip
        s = tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=r,r", [1.0 + e], dtype=tl.float32,
                                      is_pure=True, pack=1)  # fmt: skip
    else:
        s = tl.sigmoid(a)
    grad_a = dh * up * s * (1.0 + a * (1.0 - s))
    grad_up = dh * gate
    out = rows[:, None] * (2 * F) + cols[None, :]
    in_f = (cols < F)[None, :]
    tl.store(dd + out, grad_a.to(dd.dtype.element_ty), mask=in_f, eviction_policy="evict_last")
    tl.store(dd + out + F, grad_up.to(dd.dtype.element_ty), mask=in_f, eviction_policy="evict_last")
    if LOW_COPY:
        tl.store(dd_low + out, grad_a.to(dd_low.dtype.element_ty), mask=in_f, eviction_policy="evict_last")
        tl.store(dd_low + out + F, grad_up.to(dd_low.dtype.element_ty), mask=in_f, eviction_policy="evict_last")


@triton.jit
def _halves(x, BLOCK_M: tl.constexpr, WIDTH: tl.constexpr):
    """The left and right column halves of a (BLOCK_M, WIDTH) tile."""
    return tl.split(tl.permute(tl.reshape(x, (BLOCK_M, 2, WIDTH // 2)), (0, 2, 1)))


@triton.jit(do_not_specialize=["T"])
def dh_swiglu_kernel(
    g, token_indices, w2, w1_output, up_output, gate_output, dd, dd_low, selected_weights,
    T, H, F,
    BLOCK_M: tl.constexpr,  # tokens per tile
    BLOCK_N: tl.constexpr,  # ffn columns per tile
    BLOCK_K: tl.constexpr,  # hidden columns per step
    EPILOGUE_SPLIT: tl.constexpr,  # 1, 2 or 4: the epilogue works on BLOCK_N / EPILOGUE_SPLIT columns at a time
    GATHERED: tl.constexpr,  # g is gather_kernel's copy of the T rows (a descriptor); else grad_output itself
    LOW_COPY: tl.constexpr,  # also store d_a and d_up in bf16, for Triton's dx (not for the Gluon dx, which reads fp16)
    FAST_MATH: tl.constexpr,  # silu by PTX's flush-to-zero exp and reciprocal (see _swiglu_backward_store)
):  # fmt: skip
    """dh = diag(w) (g @ w2) with the SwiGLU backward fused into the epilogue.

    w2 is a descriptor with blocks [BLOCK_K, BLOCK_N]. With GATHERED, g is one too, with blocks [BLOCK_M, BLOCK_K],
    over gather_kernel's copy of the T rows; without, g is grad_output itself and each tile loads its rows
    token_indices[off_m:off_m + BLOCK_M] with pointer loads (cp.async, pipelined like the TMA loads), so that no
    gather kernel stands between the call's start and dh: that saves the gather at small T, but the loop runs slower
    than with both operands by TMA, the more so the larger T. The (T, F) activations are
    pointers, and so are the outputs, (rows, 2F) with rows padded past T: dd = [d_a | d_up] in fp16 and, with
    LOW_COPY, dd_low, the same values in bf16 for Triton's dx. A tile's columns past F are masked, not stored into
    the other half.

    One program per tile, numbered token-tile fastest, so the programs that read one column block of w2 run together
    and each byte of w2 comes from HBM once. No loop over tiles: inside one, even one that runs once per program,
    Triton compiles a slower main loop (docs/performance.md, v69). Three fp32 activation tiles beside the
    accumulator overflow the registers, so the epilogue can run on column halves or quarters (EPILOGUE_SPLIT = 2 or
    4).
    """
    num_m = tl.cdiv(T, BLOCK_M)
    tile = tl.program_id(0)
    off_m = (tile % num_m) * BLOCK_M
    off_n = (tile // num_m) * BLOCK_N
    rows = off_m + tl.arange(0, BLOCK_M)
    tokens = rows < T
    # The routing weights are loaded before the main loop, which hides their latency.
    weights = tl.load(selected_weights + rows, mask=tokens, other=0.0).to(tl.float32)
    if not GATHERED:
        g_rows = g + tl.load(token_indices + rows, mask=tokens, other=0)[:, None] * H + tl.arange(0, BLOCK_K)[None, :]
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k in range(0, H, BLOCK_K):
        if GATHERED:
            g_block = g.load([off_m, k])
        else:
            g_block = tl.load(g_rows + k, mask=tokens[:, None], other=0.0)
        acc = tl.dot(g_block, w2.load([k, off_n]), acc)

    dh = acc * weights[:, None]
    # fmt: off
    if EPILOGUE_SPLIT == 1:
        _swiglu_backward_store(dh, off_m, off_n, T, F, w1_output, up_output, gate_output,
                               dd, dd_low, BLOCK_M, BLOCK_N, LOW_COPY, FAST_MATH)
    elif EPILOGUE_SPLIT == 2:
        half: tl.constexpr = BLOCK_N // 2
        left, right = _halves(dh, BLOCK_M, BLOCK_N)
        _swiglu_backward_store(left, off_m, off_n, T, F, w1_output, up_output, gate_output,
                               dd, dd_low, BLOCK_M, half, LOW_COPY, FAST_MATH)
        _swiglu_backward_store(right, off_m, off_n + half, T, F, w1_output, up_output, gate_output,
                               dd, dd_low, BLOCK_M, half, LOW_COPY, FAST_MATH)
    else:
        half: tl.constexpr = BLOCK_N // 2
        quarter: tl.constexpr = BLOCK_N // 4
        left, right = _halves(dh, BLOCK_M, BLOCK_N)
        q0, q1 = _halves(left, BLOCK_M, half)
        q2, q3 = _halves(right, BLOCK_M, half)
        _swiglu_backward_store(q0, off_m, off_n, T, F, w1_output, up_output, gate_output,
                               dd, dd_low, BLOCK_M, quarter, LOW_COPY, FAST_MATH)
        _swiglu_backward_store(q1, off_m, off_n + quarter, T, F, w1_output, up_output, gate_output,
                               dd, dd_low, BLOCK_M, quarter, LOW_COPY, FAST_MATH)
        _swiglu_backward_store(q2, off_m, off_n + half, T, F, w1_output, up_output, gate_output,
                               dd, dd_low, BLOCK_M, quarter, LOW_COPY, FAST_MATH)
        _swiglu_backward_store(q3, off_m, off_n + 3 * quarter, T, F, w1_output, up_output, gate_output,
                               dd, dd_low, BLOCK_M, quarter, LOW_COPY, FAST_MATH)
    # fmt: on


@triton.jit
def _weight_grad_tile(
    a, b, c, a_col, c_row, off_n, T, B_ROWS,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """One (BLOCK_M, BLOCK_N) tile: A's columns [a_col, a_col + BLOCK_M) against B's [off_n, off_n + BLOCK_N),
    stored at c[c_row, off_n]. The K step at A's row k reads B's rows from min(k, B_ROWS - BLOCK_K)."""
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k in range(0, T, BLOCK_K):
        acc = tl.dot(a.load([k, a_col]).T, b.load([tl.minimum(k, B_ROWS - BLOCK_K), off_n]), acc)
    c.store([c_row, off_n], acc.to(c.dtype))


@triton.jit(do_not_specialize=["T", "B_ROWS", "HIGH_FROM"])
def weight_grad_kernel(
    a, b, c, c_high,
    T, B_ROWS, M, N, HIGH_FROM,
    BLOCK_M: tl.constexpr,  # output rows per tile
    BLOCK_N: tl.constexpr,  # output columns per tile
    BLOCK_K: tl.constexpr,  # tokens per step (the reduction runs over the T tokens)
    FLATTEN: tl.constexpr,  # pipeline across the tiles of a persistent program
):  # fmt: skip
    """C = A^T @ B with A (T x M), B (T x N): a weight gradient, reduction over the tokens.

    Descriptor blocks: a [BLOCK_K, BLOCK_M], b [BLOCK_K, BLOCK_N], c and c_high [BLOCK_M, BLOCK_N].
    No K step reads past the end of its operands: a TMA block that is partly out of bounds costs far more than
    one in bounds (docs/performance.md). A is padded by the launcher (rows past T are zeros, A has at least
    ceil(T / BLOCK_K) * BLOCK_K rows); B has B_ROWS rows: padded too (B_ROWS >= that, B read at A's rows), or
    an input of T rows, whose last step is read as the block that ends at row T, against an A whose last
    block the gather has shifted to match (gather_kernel).
    C is stored in two parts: rows [0, HIGH_FROM) through c, rows [HIGH_FROM, M) through c_high (HIGH_FROM a
    multiple of BLOCK_M). So grad_w1 and grad_w3 are one launch, M = 2F rows over A = dd = [d_a | d_up] with
    HIGH_FROM = F, and the last wave of tiles is shared by both; grad_w2 passes HIGH_FROM = M. The two parts
    are two loops over one round-robin numbering of the tiles (program p takes the tiles p, p + programs, ...):
    a store whose descriptor depends on the tile, inside one pipelined loop, does not compile in Triton 3.6.
    K = T is short (one to eight steps below T = 512), so the kernel is bound by storing C. Tiles go row by
    row (column tile fastest), so a wave of tiles shares a few row blocks of A in L2.
    """
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    low_tiles = (HIGH_FROM // BLOCK_M) * num_n
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    for tile in tl.range(pid, low_tiles, programs, flatten=FLATTEN):
        off_m = (tile // num_n) * BLOCK_M
        _weight_grad_tile(a, b, c, off_m, off_m, (tile % num_n) * BLOCK_N, T, B_ROWS, BLOCK_M, BLOCK_N, BLOCK_K)
    first_high = low_tiles + (pid - low_tiles % programs + programs) % programs
    for tile in tl.range(first_high, num_m * num_n, programs, flatten=FLATTEN):
        off_m = (tile // num_n) * BLOCK_M
        _weight_grad_tile(a, b, c_high, off_m, off_m - HIGH_FROM, (tile % num_n) * BLOCK_N, T, B_ROWS, BLOCK_M, BLOCK_N,
                          BLOCK_K)  # fmt: skip


@triton.jit(do_not_specialize=["T"])
def dx_kernel(
    a, b, a_up, b_up, partials, token_indices, grad_hidden_states,
    T, N, K_PER_SPLIT, FIRST_PARTIAL,
    BLOCK_M: tl.constexpr,  # tokens per tile
    BLOCK_N: tl.constexpr,  # hidden columns per tile
    BLOCK_K: tl.constexpr,  # ffn rows per step; K_PER_SPLIT % BLOCK_K == 0
    TO_ROWS: tl.constexpr,  # both halves in one unsplit launch, into the selected rows of grad_hidden_states (below)
):  # fmt: skip
    """partials[FIRST_PARTIAL + s] = a[:, Ks] @ b[Ks] for the s-th slice Ks (axis 1 of the grid) of the K range.

    Launched twice, (a, b) = (d_a, w1) and (d_up, w3), with a the bf16 copy of dd that the dh epilogue writes
    (descriptor blocks [BLOCK_M, BLOCK_K] and [BLOCK_K, BLOCK_N]): dx = sum of all partials is the K = 2F
    product [d_a | d_up] @ [w1; w3] without concatenating the weights. Split-K fills the GPU when T is small
    (N / BLOCK_N tiles alone are too few); scatter_kernel adds the partials in fp32 in a fixed order, so the
    result is deterministic. Rows of a past T may hold anything (dh writes its padding rows only as far as its
    own tiles reach): they reach only rows of the partials past T, which are not stored. Each partial is
    stored rounded to the partials' dtype (bf16 on the GPU, as dx's operands and output are; its fp32 range):
    half the bytes of fp32 to write here and read back there, for one more rounding of 2^-9 relative to the
    partial, as large as the rounding of dx itself and far inside the tolerance. Plain masked stores: a tile
    staged for a TMA store would take the pipeline's shared memory.

    With TO_ROWS a single unsplit launch takes both halves: (a, b) then (a_up, b_up), in two K loops over one
    accumulator, and each program stores its tile's rows into rows token_indices[t] of grad_hidden_states, rounded
    once to bf16, with no scatter_kernel at the end of the call (partials is then unused).
    """
    pid = tl.program_id(0)
    split = tl.program_id(1)
    num_m = tl.cdiv(T, BLOCK_M)
    off_m = (pid % num_m) * BLOCK_M
    off_n = (pid // num_m) * BLOCK_N
    k_start = split * K_PER_SPLIT
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k in range(k_start, k_start + K_PER_SPLIT, BLOCK_K):
        acc = tl.dot(a.load([off_m, k]), b.load([k, off_n]), acc)

    rows = off_m + tl.arange(0, BLOCK_M)
    cols = off_n + tl.arange(0, BLOCK_N)
    mask = (rows < T)[:, None] & (cols < N)[None, :]
    if TO_ROWS:
        for k in range(k_start, k_start + K_PER_SPLIT, BLOCK_K):
            acc = tl.dot(a_up.load([off_m, k]), b_up.load([k, off_n]), acc)
        selected = tl.load(token_indices + rows, mask=rows < T, other=0)
        out = grad_hidden_states + selected[:, None] * N + cols[None, :]
        tl.store(out, acc.to(grad_hidden_states.dtype.element_ty), mask=mask)
    else:
        partial = partials + ((FIRST_PARTIAL + split) * T + rows)[:, None] * N + cols[None, :]
        tl.store(partial, acc.to(partials.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["T", "B"])
def zero_unselected_kernel(
    token_indices, grad_hidden_states, grad_routing_weights,
    T, B, H,
    BLOCK_H: tl.constexpr,  # columns per program
):  # fmt: skip
    """Program (t, c), t in [0, T]: the rows that no token selects between idx[t-1] and idx[t] (idx[-1] = -1,
    idx[T] = B; the idx are sorted and unique), columns [c*BLOCK_H, (c+1)*BLOCK_H) of grad_hidden_states as zeros,
    and with c = 0 their entries of grad_routing_weights. A selected row is scatter's (or dx_kernel's) and is left
    alone, so the kernels write disjoint elements and may run in any order. One program per gap between selected
    rows rather than per batch row: two independent index loads instead of a binary search's chain of log2(T)
    dependent ones.
    """
    t = tl.program_id(0)
    first = tl.load(token_indices + t - 1, mask=t > 0, other=-1) + 1
    end = tl.load(token_indices + t, mask=t < T, other=B)
    cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    zeros = tl.zeros([BLOCK_H], dtype=grad_hidden_states.dtype.element_ty)
    for b in range(first, end):
        tl.store(grad_hidden_states + b * H + cols, zeros, mask=cols < H)
        if tl.program_id(1) == 0:
            tl.store(grad_routing_weights + b, tl.full((), 0, grad_routing_weights.dtype.element_ty))


@triton.jit(do_not_specialize=["T"])
def scatter_kernel(
    token_indices, partials, routing_partials, grad_hidden_states, grad_routing_weights,
    T, H,
    SPLIT_K: tl.constexpr,  # number of dx partials to sum; 0: dx wrote its rows itself (dx_kernel's TO_ROWS)
    ROUTING_CHUNKS: tl.constexpr,  # number of partial sums per token in routing_partials
    BLOCK_H: tl.constexpr,  # columns per program
):  # fmt: skip
    """Program (t, c): columns [c*BLOCK_H, (c+1)*BLOCK_H) of row idx[t] of grad_hidden_states, the SPLIT_K
    partials of dx row t added in fp32 in a fixed order (deterministic, no atomics) and rounded to bf16 once;
    the programs of chunk 0 also write grad_routing_weights[idx[t]] (routing_x16_kernel's partial sums, in
    order). A 2-D grid, so that even T = 64 streams the partials with enough programs. With SPLIT_K = 0 only the
    routing weights, launched with one chunk per token.
    """
    t = tl.program_id(0)
    chunk = tl.program_id(1)
    row = tl.load(token_indices + t)
    if SPLIT_K > 0:
        cols = chunk * BLOCK_H + tl.arange(0, BLOCK_H)
        mask = cols < H
        total = tl.zeros([BLOCK_H], dtype=tl.float32)
        for s in tl.static_range(SPLIT_K):
            total += tl.load(partials + (s * T + t) * H + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(grad_hidden_states + row * H + cols, total.to(grad_hidden_states.dtype.element_ty), mask=mask)
    if chunk == 0:
        routing = 0.0
        for c in tl.static_range(ROUTING_CHUNKS):
            routing += tl.load(routing_partials + t * ROUTING_CHUNKS + c)
        tl.store(grad_routing_weights + row, routing.to(grad_routing_weights.dtype.element_ty))
