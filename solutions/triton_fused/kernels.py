"""Triton kernels of the fused MoE expert SwiGLU backward.

Five launches, in order (T tokens, H hidden, F ffn; shapes of SPEC section 1):

1. `prologue_kernel`      gather g = grad_output[idx], grad_routing_t = sum_h g*e (fp32), ge = g*w, x16 = fp16(x)
2. `dh_swiglu_kernel`     dh = (g @ w2) * w in fp32, then the SwiGLU backward in its epilogue -> dd = [d_a | d_up] (fp16)
3. `weight_grad_kernel`   twice: grad_w2 = ge^T @ gated (M = H) and [grad_w1; grad_w3] = dd^T @ x16 (M = 2F)
4. `dx_kernel`            dx = d_a @ w1 + d_up @ w3 as one GEMM with K = 2F, split-K into fp32 partials
5. `finalise_kernel`      every row of grad_hidden_states (fixed-order sum of the partials, or zeros) and
                          every entry of grad_routing_weights

Precision (SPEC section 4): the path g -> dh -> (d_a, d_up) -> grad_w1/grad_w3 keeps at least 10 mantissa
bits: g and w2 are exact bf16 inputs, the routing weight multiplies the fp32 accumulator (ge is never
rounded on this path), the SwiGLU backward runs in fp32 and d_a, d_up are stored in fp16 for the weight
gradients, whose other operand x is exact in fp16. grad_w2 (one rounding of ge) and dx (d_a, d_up rounded
to bf16 in registers) take bf16 operands, which the tolerance admits. Every tl.dot accumulates in fp32.

All matrices are row-major and contiguous. The kernels take their operand dtypes from the pointers, so
the CPU tests can run them under TRITON_INTERPRET=1 with float32/float16 operands.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit(do_not_specialize=["T"])
def prologue_kernel(
    grad_output, token_indices, selected_tokens, expert_output, selected_weights,
    g_out, ge_out, x16_out, grad_routing_t,
    T, H,
    BLOCK_H: tl.constexpr,  # columns per step of the row loop
):  # fmt: skip
    """One program per selected token t: a streaming pass over row idx[t] of grad_output and row t of x, e."""
    t = tl.program_id(0)
    row = tl.load(token_indices + t)
    weight = tl.load(selected_weights + t).to(tl.float32)
    dot = tl.zeros([BLOCK_H], dtype=tl.float32)
    for h0 in range(0, H, BLOCK_H):
        cols = h0 + tl.arange(0, BLOCK_H)
        mask = cols < H
        g = tl.load(grad_output + row * H + cols, mask=mask, other=0.0)
        e = tl.load(expert_output + t * H + cols, mask=mask, other=0.0)
        x = tl.load(selected_tokens + t * H + cols, mask=mask, other=0.0)
        dot += g.to(tl.float32) * e.to(tl.float32)
        tl.store(g_out + t * H + cols, g, mask=mask)
        tl.store(ge_out + t * H + cols, (g.to(tl.float32) * weight).to(ge_out.dtype.element_ty), mask=mask)
        tl.store(x16_out + t * H + cols, x.to(x16_out.dtype.element_ty), mask=mask)
    tl.store(grad_routing_t + t, tl.sum(dot, axis=0))


@triton.jit
def _swiglu_backward_store(dh, rows, cols, row_ok, F, w1_output, up_output, gate_output, dd):
    """d_a = dh * up * silu'(a) (from w1_output, not gate_output) and d_up = dh * gate, in fp32, into dd."""
    mask = row_ok[:, None] & (cols < F)[None, :]
    act = rows[:, None] * F + cols[None, :]
    a = tl.load(w1_output + act, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(up_output + act, mask=mask, other=0.0).to(tl.float32)
    gate = tl.load(gate_output + act, mask=mask, other=0.0).to(tl.float32)
    s = tl.sigmoid(a)
    out = rows[:, None] * (2 * F) + cols[None, :]
    tl.store(dd + out, (dh * up * s * (1.0 + a * (1.0 - s))).to(dd.dtype.element_ty), mask=mask)
    tl.store(dd + out + F, (dh * gate).to(dd.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["T"])
def dh_swiglu_kernel(
    g, w2, selected_weights, w1_output, up_output, gate_output, dd,
    T, H, F,
    BLOCK_M: tl.constexpr,  # tokens per tile
    BLOCK_N: tl.constexpr,  # ffn columns per tile
    BLOCK_K: tl.constexpr,  # hidden columns per step; H % BLOCK_K == 0
    EPILOGUE_SPLIT: tl.constexpr,  # 1 or 2: the epilogue works on BLOCK_N / EPILOGUE_SPLIT columns at a time
):  # fmt: skip
    """dh = diag(w) (g @ w2) with the SwiGLU backward fused into the epilogue.

    Tiles are numbered token-tile fastest, so the programs that read one column block of w2 run together
    and each byte of w2 comes from HBM once. The epilogue reads the (T, F) activations of its tile and
    writes dd = [d_a | d_up] (T x 2F, fp16): three fp32 activation tiles beside the accumulator overflow
    the registers, so the epilogue can run on column halves (EPILOGUE_SPLIT = 2).
    """
    pid = tl.program_id(0)
    num_m = tl.cdiv(T, BLOCK_M)
    pid_m = pid % num_m
    pid_n = pid // num_m
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    row_ok = rows < T

    a_ptrs = g + rows[:, None] * H + ks[None, :]
    b_ptrs = w2 + ks[:, None] * F + cols[None, :]
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for _ in range(0, H, BLOCK_K):
        a = tl.load(a_ptrs, mask=row_ok[:, None], other=0.0)
        b = tl.load(b_ptrs, mask=(cols < F)[None, :], other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K * F

    dh = acc * tl.load(selected_weights + rows, mask=row_ok, other=0.0).to(tl.float32)[:, None]
    if EPILOGUE_SPLIT == 1:
        _swiglu_backward_store(dh, rows, cols, row_ok, F, w1_output, up_output, gate_output, dd)
    else:
        halves = tl.permute(tl.reshape(dh, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1))
        left, right = tl.split(halves)
        half_cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N // 2)
        _swiglu_backward_store(left, rows, half_cols, row_ok, F, w1_output, up_output, gate_output, dd)
        _swiglu_backward_store(right, rows, half_cols + BLOCK_N // 2, row_ok, F, w1_output, up_output, gate_output, dd)


@triton.jit(do_not_specialize=["T"])
def weight_grad_kernel(
    a, b, c_top, c_bottom,
    T, M, N, M_TOP,
    BLOCK_M: tl.constexpr,  # output rows per tile; M_TOP % BLOCK_M == 0
    BLOCK_N: tl.constexpr,  # output columns per tile
    BLOCK_K: tl.constexpr,  # tokens per step (the reduction runs over the T tokens)
):  # fmt: skip
    """C = A^T @ B with A (T x M), B (T x N): a weight gradient, reduction over the tokens.

    Rows m < M_TOP of C go to c_top, the others to c_bottom (row m - M_TOP), so one launch writes grad_w1
    and grad_w3 from dd = [d_a | d_up] without concatenating them. K = T is small: the kernel is bound by
    writing C, and the A and B tiles it re-reads stay in L2.
    """
    pid = tl.program_id(0)
    num_n = tl.cdiv(N, BLOCK_N)
    pid_m = pid // num_n
    pid_n = pid % num_n
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    row_ok = rows < M
    col_ok = cols < N

    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, T, BLOCK_K):
        k_ok = (k0 + ks) < T
        at = tl.load(a + (k0 + ks)[:, None] * M + rows[None, :], mask=k_ok[:, None] & row_ok[None, :], other=0.0)
        bt = tl.load(b + (k0 + ks)[:, None] * N + cols[None, :], mask=k_ok[:, None] & col_ok[None, :], other=0.0)
        acc = tl.dot(tl.trans(at), bt, acc)

    mask = row_ok[:, None] & col_ok[None, :]
    if pid_m * BLOCK_M < M_TOP:
        c_ptrs = c_top + rows[:, None] * N + cols[None, :]
    else:
        c_ptrs = c_bottom + (rows - M_TOP)[:, None] * N + cols[None, :]
    tl.store(c_ptrs, acc.to(c_top.dtype.element_ty), mask=mask)


@triton.jit
def _accumulate_range(acc, a_ptrs, b_ptrs, steps, ldb, BLOCK_K: tl.constexpr, row_ok, col_ok):
    for _ in range(steps):
        b = tl.load(b_ptrs, mask=col_ok[None, :], other=0.0)
        a = tl.load(a_ptrs, mask=row_ok[:, None], other=0.0).to(b.dtype)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K * ldb
    return acc


@triton.jit(do_not_specialize=["T"])
def dx_kernel(
    dd, w1, w3, partials,
    T, H, F, K_PER_SPLIT,
    BLOCK_M: tl.constexpr,  # tokens per tile
    BLOCK_N: tl.constexpr,  # hidden columns per tile
    BLOCK_K: tl.constexpr,  # ffn rows per step; K_PER_SPLIT % BLOCK_K == 0
):  # fmt: skip
    """partials[s] = dd[:, Ks] @ w1[Ks] + dd[:, F + Ks] @ w3[Ks] for the s-th slice Ks of range(F).

    dd is the fp16 [d_a | d_up] of the weight gradients; each tile is rounded to bf16 in registers to meet
    the bf16 weights (the tolerance admits bf16 d_a, d_up here), so dd is stored once, not twice.

    dx = sum_s partials[s] is the K = 2F product [d_a | d_up] @ [w1; w3] without concatenating the weights.
    Split-K (axis 1 of the grid) fills the GPU when T is small (H / BLOCK_N tiles alone are too few); the
    partials are fp32 and reduced in a fixed order by finalise_kernel, so the result is deterministic.
    """
    pid = tl.program_id(0)
    split = tl.program_id(1)
    num_m = tl.cdiv(T, BLOCK_M)
    pid_m = pid % num_m
    pid_n = pid // num_m
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    row_ok = rows < T
    col_ok = cols < H
    k0 = split * K_PER_SPLIT
    steps = K_PER_SPLIT // BLOCK_K

    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    a_ptrs = dd + rows[:, None] * (2 * F) + (k0 + ks)[None, :]
    b_ptrs = (k0 + ks)[:, None] * H + cols[None, :]
    acc = _accumulate_range(acc, a_ptrs, w1 + b_ptrs, steps, H, BLOCK_K, row_ok, col_ok)
    acc = _accumulate_range(acc, a_ptrs + F, w3 + b_ptrs, steps, H, BLOCK_K, row_ok, col_ok)
    out = partials + (split * T + rows)[:, None] * H + cols[None, :]
    tl.store(out, acc, mask=row_ok[:, None] & col_ok[None, :])


@triton.jit(do_not_specialize=["T", "B", "SEARCH_STEPS"])
def finalise_kernel(
    token_indices, partials, grad_routing_t, grad_hidden_states, grad_routing_weights,
    T, B, H, SEARCH_STEPS,
    SPLIT_K: tl.constexpr,  # number of dx partials to sum
    BLOCK_H: tl.constexpr,  # columns per step of the row loop
):  # fmt: skip
    """One program per batch row b: find t with idx[t] == b by binary search (idx is sorted), then write
    row b of grad_hidden_states (the partials of row t summed in order, or zeros) and grad_routing_weights[b].
    Every element of both outputs is written, so no separate zero-fill pass is needed.
    """
    b = tl.program_id(0)
    lo = T * 0  # a runtime int32, so the loop-carried type is fixed
    hi = T + 0
    for _ in range(SEARCH_STEPS):
        active = lo < hi
        mid = (lo + hi) // 2
        value = tl.load(token_indices + tl.minimum(mid, T - 1))
        new_lo = tl.where(active & (value < b), mid + 1, lo)
        hi = tl.where(active & (value >= b), mid, hi)
        lo = new_lo
    t = tl.minimum(lo, T - 1)
    found = tl.load(token_indices + t) == b

    routing = tl.load(grad_routing_t + t)
    tl.store(grad_routing_weights + b, tl.where(found, routing, 0.0).to(grad_routing_weights.dtype.element_ty))
    read_limit = tl.where(found, H, 0)  # an unselected row reads nothing and writes zeros
    for h0 in range(0, H, BLOCK_H):
        cols = h0 + tl.arange(0, BLOCK_H)
        mask = cols < H
        total = tl.zeros([BLOCK_H], dtype=tl.float32)
        for s in tl.static_range(SPLIT_K):
            total += tl.load(partials + (s * T + t) * H + cols, mask=cols < read_limit, other=0.0)
        tl.store(grad_hidden_states + b * H + cols, total.to(grad_hidden_states.dtype.element_ty), mask=mask)
