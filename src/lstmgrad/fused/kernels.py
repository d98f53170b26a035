"""Numba kernels of the fused engine: the per-step gate maths and the row packing around it.

Every kernel here is single-threaded (the multi-threaded ones, on Numba's OpenMP layer, are in
fused.walks) and cached on disk. They work on float32 or float64 arrays (Numba has no float16: the engine converts).
Rows are "packed": step t's n_t active rows b < n_t sit at rows offsets[t] .. offsets[t]+n_t-1
of a [N, *] array, N = sum(n_t); without batch sizes n_t = B and offsets[t] = t*B.
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np
from llvmlite import ir as llvmlite_ir
from numba import types
from numba.core.extending import intrinsic

# vsigmoid and vtanh are compiled into these kernels. Numba's disk cache keys a kernel on the
# stamp of the file that defines it: a change to vmath.py alone leaves the old code cached, so
# it comes with a change here (and in fused/walks.py, whose loops compile these kernels in).
from .vmath import one, vsigmoid, vtanh


# error_model="numpy": no zero-division checks, whose branches would stop vectorisation.
# fastmath "contract" only: a * b + c may become one fused multiply-add (one rounding instead of
# two, never less accurate; faster sigmoid and tanh: docs/design.md#kernel-measurements).
# No other fast-math flag: NaN, infinities and signed zeros keep IEEE semantics and nothing is
# reassociated, so results stay deterministic.
def jit(*, parallel: bool = False) -> Any:
    """The kernels' Numba decorator (also fused.walks'): these flags, in one place."""
    return numba.njit(
        cache=True, nogil=True, fastmath={"contract"}, error_model="numpy", parallel=parallel
    )


_jit = jit()


@numba.njit(cache=True, nogil=True, inline="always")
def row_block(n, parts, q):  # pragma: no cover
    """Rows [lo, hi) of block q when n rows split into ``parts`` blocks of ceil(n / parts)."""
    size = (n + parts - 1) // parts
    lo = min(q * size, n)
    return lo, min(lo + size, n)


# How these kernels stay vectorised: every inner loop starts at 0 and indexes a view
# (a[hid + j] with an offset of unknown sign keeps Numba's negative-index wraparound, which
# blocks SIMD); each loop touches few arrays (LLVM needs a runtime check per pair that might
# alias); no slice assignment (each is a call into Numba's runtime).


@_jit
def _copy(dst, src):  # pragma: no cover
    """dst[:] = src (1-D, same length)."""
    for j in range(dst.shape[0]):
        dst[j] = src[j]


@_jit
def _row_by_row(a, b, out):  # pragma: no cover
    """out = a @ b one row of out at a time, four rows of b at a time applied to it (each
    element accumulated over k in order: (((o + a0 b0) + a1 b1) + ...), vectorised along n."""
    m, k = a.shape
    n = b.shape[1]
    k4 = k - k % 4
    for i in range(m):
        o = out[i]
        for j in range(n):
            o[j] = 0.0
    for p in range(0, k4, 4):
        b0, b1, b2, b3 = b[p], b[p + 1], b[p + 2], b[p + 3]
        for i in range(m):
            a0, a1, a2, a3 = a[i, p], a[i, p + 1], a[i, p + 2], a[i, p + 3]
            o = out[i]
            for j in range(n):
                o[j] = o[j] + a0 * b0[j] + a1 * b1[j] + a2 * b2[j] + a3 * b3[j]
    for p in range(k4, k):
        b_p = b[p]
        for i in range(m):
            av = a[i, p]
            o = out[i]
            for j in range(n):
                o[j] += av * b_p[j]


@_jit
def _four_rows(a, b, out, i):  # pragma: no cover
    """:func:`_row_by_row` of rows i .. i + 3 in one pass over b: each load of b serves four
    rows of out (the same additions in the same order)."""
    k = a.shape[1]
    n = b.shape[1]
    k4 = k - k % 4
    o0, o1, o2, o3 = out[i], out[i + 1], out[i + 2], out[i + 3]
    for j in range(n):
        o0[j] = 0.0
        o1[j] = 0.0
        o2[j] = 0.0
        o3[j] = 0.0
    for p in range(0, k4, 4):
        b0, b1, b2, b3 = b[p], b[p + 1], b[p + 2], b[p + 3]
        a00, a01, a02, a03 = a[i, p], a[i, p + 1], a[i, p + 2], a[i, p + 3]
        a10, a11, a12, a13 = a[i + 1, p], a[i + 1, p + 1], a[i + 1, p + 2], a[i + 1, p + 3]
        a20, a21, a22, a23 = a[i + 2, p], a[i + 2, p + 1], a[i + 2, p + 2], a[i + 2, p + 3]
        a30, a31, a32, a33 = a[i + 3, p], a[i + 3, p + 1], a[i + 3, p + 2], a[i + 3, p + 3]
        for j in range(n):
            x0, x1, x2, x3 = b0[j], b1[j], b2[j], b3[j]
            o0[j] = o0[j] + a00 * x0 + a01 * x1 + a02 * x2 + a03 * x3
            o1[j] = o1[j] + a10 * x0 + a11 * x1 + a12 * x2 + a13 * x3
            o2[j] = o2[j] + a20 * x0 + a21 * x1 + a22 * x2 + a23 * x3
            o3[j] = o3[j] + a30 * x0 + a31 * x1 + a32 * x2 + a33 * x3
    for p in range(k4, k):
        b_p = b[p]
        for r in range(i, i + 4):
            av = a[r, p]
            o = out[r]
            for j in range(n):
                o[j] += av * b_p[j]


@_jit
def matmul_into(a, b, out):  # pragma: no cover
    """out = a @ b for small products (a [m, k] any strides, b [k, n] and out [m, n]
    C-contiguous), deterministic: each element of out is accumulated over k in order
    ((((o + a0 b0) + a1 b1) + ...), bitwise the results of one k at a time), vectorised along
    n. Rows go in blocks of four (:func:`_four_rows`), the last block ending at row m (it
    recomputes up to three rows of the one before, to the same bits), fewer than four rows
    row by row (docs/design.md#kernel-measurements).
    """
    m = a.shape[0]
    if m < 4:
        _row_by_row(a, b, out)
        return
    for i in range(0, m - 3, 4):
        _four_rows(a, b, out, i)
    if m % 4:
        _four_rows(a, b, out, m - 4)


def _addresses_call(typingctx, fn, *args):  # pragma: no cover - compiled
    """The typing and codegen of a call to the Fortran-convention routine at address ``fn``
    with ``args``, every one an address (uintp), in the routine's order; None where one is
    not an integer."""
    if not all(isinstance(t, types.Integer) for t in (fn, *args)):
        return None

    def codegen(context, builder, sig, values):
        ptr = llvmlite_ir.IntType(8).as_pointer()
        fnty = llvmlite_ir.FunctionType(llvmlite_ir.VoidType(), [ptr] * len(args))
        callee = builder.inttoptr(values[0], fnty.as_pointer())
        builder.call(callee, [builder.inttoptr(v, ptr) for v in values[1:]])
        return context.get_dummy_value()

    return types.none(fn, *args), codegen


@intrinsic
def _fortran_gemm(typingctx, fn, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):  # pragma: no cover - compiled  # fmt: skip
    """Calls the Fortran-convention GEMM (sgemm_ / dgemm_) at address ``fn``: every argument
    an address (uintp), of the library's arguments in order. The address is an argument, not
    a constant, so the kernels calling this stay cacheable across processes."""
    return _addresses_call(typingctx, fn, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)


@intrinsic
def _fortran_gemm_compute(typingctx, fn, ta, tb, m, n, k, a, lda, b, ldb, beta, c, ldc):  # pragma: no cover - compiled  # fmt: skip
    """Calls the Fortran-convention packed GEMM (MKL's sgemm_compute: sgemm_'s arguments
    without alpha, which packing applied) at address ``fn``, every argument an address, as
    :func:`_fortran_gemm`."""
    return _addresses_call(typingctx, fn, ta, tb, m, n, k, a, lda, b, ldb, beta, c, ldc)


@_jit
def gemm_scratch(like):  # pragma: no cover
    """The argument memory of :func:`library_matmul`, made once per step loop: ``ints`` [8]
    int64 (the integer arguments, stored as 64 bits, so a library with 32-bit integers reads
    the same values, little-endian) and ``alpha_beta`` [2] in ``like``'s dtype (1 and 0)."""
    alpha_beta = np.zeros(2, like.dtype)
    alpha_beta[0] = 1.0
    return np.empty(8, np.int64), alpha_beta


@_jit
def library_matmul(fn, a, b, out, ints, alpha_beta):  # pragma: no cover
    """out = a @ b by the library GEMM at address ``fn`` (sgemm_ for float32, dgemm_ for
    float64: the caller's choice), on the calling thread's library settings; a's rows and b,
    out C-contiguous rows (a may be a block of a wider array's rows). Row-major as the library's
    column-major: out^T = b^T a^T; b may also be the transposed view of a C-contiguous matrix
    (its columns contiguous: the library reads it transposed, no copy is made). ``ints``,
    ``alpha_beta``: :func:`gemm_scratch`'s."""
    m, k = a.shape
    n = b.shape[1]
    ints[0], ints[1], ints[2] = n, m, k
    ints[6] = 78  # "N": no transposition
    ints[7] = 78
    if b.strides[1] == b.itemsize or n == 1:  # b's rows contiguous
        # (one row: its stride is never used, but the library checks it is at least n)
        ints[3] = b.strides[0] // b.itemsize if k > 1 else max(n, 1)
    else:  # b = w.T of a C-contiguous w [n, k]: the library transposes w
        ints[3] = b.strides[1] // b.itemsize
        ints[7] = 84  # "T"
    ints[4] = a.strides[0] // a.itemsize
    ints[5] = out.strides[0] // out.itemsize
    _fortran_gemm(
        fn, ints[7:].ctypes.data, ints[6:].ctypes.data, ints[0:].ctypes.data,
        ints[1:].ctypes.data, ints[2:].ctypes.data, alpha_beta[0:].ctypes.data, b.ctypes.data,
        ints[3:].ctypes.data, a.ctypes.data, ints[4:].ctypes.data, alpha_beta[1:].ctypes.data,
        out.ctypes.data, ints[5:].ctypes.data,
    )  # fmt: skip


@_jit
def packed_matmul(fn, a, packed, out, ints, alpha_beta):  # pragma: no cover
    """out = a @ b by the library's packed GEMM at address ``fn`` (MKL's sgemm_compute), b
    [k, n] packed once for every step (a back end's ``walk_pack``): ``packed`` is a [k, n]
    uint8 view with zero strides whose data is the packed matrix (its shape gives k and n).
    a's rows and out's rows dense, as in :func:`library_matmul`; the library's column-major
    out^T = b^T a^T with b^T the packed operand ("P")."""
    m = a.shape[0]
    k, n = packed.shape
    ints[0], ints[1], ints[2] = n, m, k
    ints[6] = 80  # "P": the packed operand
    ints[7] = 78  # "N"
    ints[3] = max(n, 1)  # not read for a packed operand; a valid value all the same
    ints[4] = a.strides[0] // a.itemsize if m > 1 else max(k, 1)
    ints[5] = out.strides[0] // out.itemsize if m > 1 else max(n, 1)
    _fortran_gemm_compute(
        fn, ints[6:].ctypes.data, ints[7:].ctypes.data, ints[0:].ctypes.data,
        ints[1:].ctypes.data, ints[2:].ctypes.data, packed.ctypes.data, ints[3:].ctypes.data,
        a.ctypes.data, ints[4:].ctypes.data, alpha_beta[1:].ctypes.data, out.ctypes.data,
        ints[5:].ctypes.data,
    )  # fmt: skip


@_jit
def bfloat16_bits(a):  # pragma: no cover
    """float32 [m, k] rounded to bfloat16 (to nearest even; a NaN stays a quiet NaN of the same
    sign), as the uint16 bit patterns of a new C-contiguous [m, k] array."""
    m, k = a.shape
    bits = np.ascontiguousarray(a).reshape(-1).view(np.uint32)
    out = np.empty(m * k, np.uint16)
    for i in range(m * k):
        u = bits[i]
        if (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000):
            out[i] = np.uint16((u >> np.uint32(16)) | np.uint32(0x40))
        else:
            rounding = np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))
            out[i] = np.uint16((u + rounding) >> np.uint32(16))
    return out.reshape(m, k)


@_jit
def walk_product(fn, a, b, out, ints, alpha_beta):  # pragma: no cover
    """out = a @ b for the walks' recurrent products: by the library GEMM at ``fn``
    (:func:`library_matmul`, its scratch from :func:`gemm_scratch`) where it is not 0, else
    :func:`matmul_into`. A b of bfloat16 bits (uint16: the bfloat16 back end's operand, its
    GEMM at ``fn``) gets a rounded to bfloat16 too; a packed b (uint8: :func:`packed_matmul`)
    goes to the packed GEMM at ``fn``."""
    if fn != 0:
        if b.itemsize == 1:
            packed_matmul(fn, a, b, out, ints, alpha_beta)
        elif b.itemsize == 2:
            library_matmul(fn, bfloat16_bits(a), b, out, ints, alpha_beta)
        else:
            library_matmul(fn, a, b, out, ints, alpha_beta)
    else:
        matmul_into(a, b, out)


@_jit
def transpose_region(src, dst, r0, r1, c0, c1):  # pragma: no cover
    """dst[c, r] = src[r, c] for r0 <= r < r1, c0 <= c < c1 (2-D views). Cache-oblivious: the
    region's longer side is halved (at multiples of 8) until a leaf of at most 64 x 64
    remains, so neither side's stride (a power of two, often) makes the leaf's lines evict each
    other whatever the caches' sizes. A leaf is walked one dst row at a time, its 64 elements
    read down a column of src: loops of 8 took 3x longer on 16 MiB matrices
    (docs/design.md#kernel-measurements)."""
    stack = np.empty((128, 4), np.int64)
    stack[0, 0], stack[0, 1], stack[0, 2], stack[0, 3] = r0, r1, c0, c1
    top = 1
    while top > 0:
        top -= 1
        a, b, c, d = stack[top, 0], stack[top, 1], stack[top, 2], stack[top, 3]
        if b - a <= 64 and d - c <= 64:
            for x in range(c, d):
                row = dst[x]
                for y in range(a, b):
                    row[y] = src[y, x]
            continue
        if b - a >= d - c:  # halve the rows: the second half is pushed first, walked last
            m = a + (b - a) // 16 * 8
            m = m if m > a else (a + b) // 2
            stack[top, 0], stack[top, 1], stack[top, 2], stack[top, 3] = m, b, c, d
            stack[top + 1, 0], stack[top + 1, 1], stack[top + 1, 2], stack[top + 1, 3] = a, m, c, d
        else:
            m = c + (d - c) // 16 * 8
            m = m if m > c else (c + d) // 2
            stack[top, 0], stack[top, 1], stack[top, 2], stack[top, 3] = a, b, m, d
            stack[top + 1, 0], stack[top + 1, 1], stack[top + 1, 2], stack[top + 1, 3] = a, b, c, m
        top += 2


@_jit
def transpose_into(dst, src, n):  # pragma: no cover
    """dst[:n, :] = src[:, :n].T (src [W, >=n], dst [>=n, W])."""
    transpose_region(src, dst, 0, src.shape[0], 0, n)


def transposed(a: np.ndarray) -> np.ndarray:
    """a.T, C-contiguous (a 2-D): a new array written by :func:`transpose_region`, or ``a.T``
    itself where that is already C-contiguous. NumPy's own transposing copy takes several
    times longer on large matrices with power-of-two sides."""
    if a.T.flags.c_contiguous:
        return a.T
    out = np.empty((a.shape[1], a.shape[0]), dtype=a.dtype)
    if a.ndim == 2 and a.flags.c_contiguous and a.dtype in (np.float32, np.float64) and a.size:
        transpose_region(a, out, 0, a.shape[0], 0, a.shape[1])
    else:
        np.copyto(out, a.T)
    return out


def contiguous(a: np.ndarray) -> np.ndarray:
    """a C-contiguous (a 2-D), through :func:`transposed` where a is a transposed view."""
    if a.flags.c_contiguous:
        return a
    if a.ndim == 2 and a.T.flags.c_contiguous:
        return transposed(a.T)
    return np.ascontiguousarray(a)


@_jit
def _sigmoid_into(dst, a, x, b):  # pragma: no cover
    """dst = sigmoid(a + x + b), 1-D views of one gate block."""
    for j in range(dst.shape[0]):
        dst[j] = vsigmoid(a[j] + x[j] + b[j])


@_jit
def _tanh_into(dst, a, x, b):  # pragma: no cover
    """dst = tanh(a + x + b), 1-D views of one gate block."""
    for j in range(dst.shape[0]):
        dst[j] = vtanh(a[j] + x[j] + b[j])


@_jit
def forward_step(gx, gh, bias, h, c, n, s_i, s_g, s_f, s_o, s_h, s_c, s_tc, y):  # pragma: no cover
    """One step of one (layer, direction) (docs/math.md F1-F9, F11).

    gx [n, 4H]: the input projection of the step's rows; gh [>=n, 4H]: h_prev @ W_hh^T; bias
    [4H]: b_ih + b_hh (zeros without bias); h, c [B, H]: the running state, updated in place
    for rows < n. Writes the step's saved activations s_* [B, H] (rows >= n: gates and tanhc 0,
    h and c the carried state) and y [B, H] (0 for rows >= n).
    """
    rows, hid = h.shape
    b_i, b_f, b_g, b_o = bias[:hid], bias[hid : 2 * hid], bias[2 * hid : 3 * hid], bias[3 * hid :]
    for r in range(n):
        a = gh[r]
        x = gx[r]
        i_r = s_i[r]
        f_r = s_f[r]
        g_r = s_g[r]
        o_r = s_o[r]
        _sigmoid_into(i_r, a[:hid], x[:hid], b_i)  # (F1, F2)
        _sigmoid_into(f_r, a[hid : 2 * hid], x[hid : 2 * hid], b_f)  # (F1, F3)
        _tanh_into(g_r, a[2 * hid : 3 * hid], x[2 * hid : 3 * hid], b_g)  # (F1, F4)
        _sigmoid_into(o_r, a[3 * hid :], x[3 * hid :], b_o)  # (F1, F5)
        c_r = c[r]
        for j in range(hid):
            c_r[j] = f_r[j] * c_r[j] + i_r[j] * g_r[j]  # (F6)
        tc_r = s_tc[r]
        for j in range(hid):
            tc_r[j] = vtanh(c_r[j])  # (F7)
        h_r = h[r]
        for j in range(hid):
            h_r[j] = o_r[j] * tc_r[j]  # (F8)
        _copy(s_c[r], c_r)  # (F11)
        _copy(s_h[r], h_r)
        _copy(y[r], h_r)
    for r in range(n, rows):  # (F9) masked rows: the state carries, y and the gates are 0
        for j in range(hid):
            s_i[r, j] = 0.0
            s_f[r, j] = 0.0
            s_g[r, j] = 0.0
            s_o[r, j] = 0.0
            s_tc[r, j] = 0.0
            s_c[r, j] = c[r, j]
            s_h[r, j] = h[r, j]
            y[r, j] = 0.0


@_jit
def backward_step(
    dy, has_dy, dh, dc, s_i, s_g, s_f, s_o, s_tc, c_prev, dg, n, db, with_db
):  # pragma: no cover
    """One step of the backward walk of one (layer, direction), rows < n (docs/math.md B2-B8, B10,
    B14).

    dy [B, H]: the step's output gradient (read only if has_dy); dh, dc [B, H]: dh_next and
    dc_next (dh becomes dh_t, then the caller's recurrent GEMM replaces it; dc becomes
    dc_t * f); s_* [B, H]: saved activations of the step; c_prev [n, H] packed previous cell
    state; dg [n, 4H]: the gate gradients, written; db [B, 4H]: where ``with_db``, each row's
    gate gradients summed over the steps (B14, row by row: the same sums whatever splits the
    rows, and dG is not read again from memory for the bias).
    """
    hid = dh.shape[1]
    for r in range(n):
        dh_r = dh[r]
        dc_r = dc[r]
        i_r = s_i[r]
        g_r = s_g[r]
        f_r = s_f[r]
        o_r = s_o[r]
        tc_r = s_tc[r]
        cp_r = c_prev[r]
        d_i = dg[r, :hid]
        d_f = dg[r, hid : 2 * hid]
        d_g = dg[r, 2 * hid : 3 * hid]
        d_o = dg[r, 3 * hid :]
        if has_dy:
            dy_r = dy[r]
            for j in range(hid):
                dh_r[j] += dy_r[j]  # (B2)
        for j in range(hid):
            u = one(tc_r[j])
            dc_r[j] = dh_r[j] * o_r[j] * (u - tc_r[j] * tc_r[j]) + dc_r[j]  # (B3)
        for j in range(hid):
            u = one(o_r[j])
            d_o[j] = dh_r[j] * tc_r[j] * o_r[j] * (u - o_r[j])  # (B4)
        for j in range(hid):
            u = one(g_r[j])
            d_g[j] = dc_r[j] * i_r[j] * (u - g_r[j] * g_r[j])  # (B5)
        for j in range(hid):
            u = one(i_r[j])
            d_i[j] = dc_r[j] * g_r[j] * i_r[j] * (u - i_r[j])  # (B6)
        for j in range(hid):
            u = one(f_r[j])
            d_f[j] = dc_r[j] * cp_r[j] * f_r[j] * (u - f_r[j])  # (B7)
        for j in range(hid):
            dc_r[j] *= f_r[j]  # (B10)
        if with_db:
            db_r = db[r]
            dg_r = dg[r]
            for j in range(4 * hid):
                db_r[j] += dg_r[j]  # (B14)


@_jit
def gather_prev(  # pragma: no cover
    s_h, s_c, h0, c0, ns, offsets, order, hp, cp, with_h, with_c
):
    """Packed previous states (docs/math.md B1): for each step in the forward's ``order``, rows
    < n_t get the saved state of their previous active step (h0/c0 if none) into hp (where
    ``with_h``) and cp (where ``with_c``). Saved states are read only at active
    positions, so padding never leaks in.
    """
    rows = h0.shape[0]
    last = np.full(rows, -1, dtype=np.int64)  # each row's previous active step
    for step in range(order.shape[0]):
        t = order[step]
        off = offsets[t]
        for r in range(ns[t]):
            p = last[r]
            if p < 0:
                if with_h:
                    _copy(hp[off + r], h0[r])
                if with_c:
                    _copy(cp[off + r], c0[r])
            else:
                if with_h:
                    _copy(hp[off + r], s_h[p, r])
                if with_c:
                    _copy(cp[off + r], s_c[p, r])
            last[r] = t


@_jit
def transpose_cols(src, width, n, c0, c1, dst):  # pragma: no cover
    """dst[c, r] = src[r, c] for c0 <= c < c1, r < n: src [n, width] and dst [*, n], both
    C-contiguous, given flat (1-D)."""
    transpose_region(src[: n * width].reshape((n, width)), dst[: c1 * n].reshape((c1, n)),
                     0, n, c0, c1)  # fmt: skip


@_jit
def pack_rows(src, ns, offsets, out, col):  # pragma: no cover
    """out[offsets[t] + r, col:col+W] = src[t, r, :] for r < n_t (src [T, B, W], any strides)."""
    width = src.shape[2]
    for t in range(src.shape[0]):
        off = offsets[t]
        for r in range(ns[t]):
            _copy(out[off + r, col : col + width], src[t, r])


@_jit
def pack_rows_scaled(src, scale, ns, offsets, out, col):  # pragma: no cover
    """As pack_rows, times scale[t, r, :] (the dropout mask of the columns)."""
    width = src.shape[2]
    for t in range(src.shape[0]):
        off = offsets[t]
        for r in range(ns[t]):
            dst = out[off + r, col : col + width]
            src_r = src[t, r]
            scale_r = scale[t, r]
            for j in range(width):
                dst[j] = src_r[j] * scale_r[j]


@_jit
def unpack_rows(packed, ns, offsets, out):  # pragma: no cover
    """out[t, r, :] = packed[offsets[t] + r, :] for r < n_t, 0 for the other rows."""
    steps, rows, width = out.shape
    for t in range(steps):
        off = offsets[t]
        n = ns[t]
        for r in range(rows):
            if r < n:
                _copy(out[t, r], packed[off + r])
            else:
                out_r = out[t, r]
                for j in range(width):
                    out_r[j] = 0.0
