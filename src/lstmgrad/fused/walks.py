"""The fused engine's multi-threaded parts, on Numba's OpenMP threading layer: whole step loops
in Numba, several at once (the directions of a layer, blocks of its batch rows), step kernels
with their rows split over several threads, the weight gradient's transposing copy and the float16
conversions.

On small models the per-step GEMM call dominates. A direction's steps depend on each other,
but not its batch rows: a row's gate maths and its row of the recurrent product read that row
alone. So each walk runs a whole step loop, recurrent product included, in one Numba call, and
walks run at once on several threads, one per part: the two directions of a bidirectional
layer, blocks of the batch's rows, or both (:func:`forward_walk_parts`,
:func:`backward_walk_parts`). Larger models keep their recurrent product in the GEMM library,
one step at a time, and run each step's gate maths with its rows split over threads
(:func:`forward_step_split`, :func:`backward_step_split`). The execution plan
(lstmgrad.planning) decides which runs, from measurements taken between the GEMM library's calls
(Numba's threads spin a while after a parallel region, which can hold the CPUs a library's own
threads wait for); these run only where Numba's layer is GNU OpenMP, the runtime torch uses
(lstmgrad.planning.openmp): another layer, or an LLVM or Intel OpenMP runtime, would keep a
pool of threads spinning against torch's.

Each walk is one (layer, direction)'s step loop on a block of batch rows, in the walk ``order``
(0..T-1 for the forward direction, T-1..0 for the reverse), with the recurrent product in
:func:`kernels.matmul_into` (or the GEMM library's own, called on the walk's thread:
:func:`kernels.walk_product`) and the gate maths in the per-step kernels; variable lengths as
in the engine (step t: rows < ns[t], packed at offsets[t]). A row's gate maths are the same
whatever the blocks; its product row is the same with the Numba loop, and may differ in the
last bits with the library's (which may pick another kernel for fewer rows).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import prange

from .kernels import (
    backward_step,
    forward_step,
    gemm_scratch,
    jit,
    row_block,
    transpose_region,
    walk_product,
)
from .kernels import transpose_cols as _transpose_cols

# The kernels (and vmath's functions in them) are compiled into these loops, whose disk cache
# is keyed on this file alone: a change to kernels.py or vmath.py comes with a change here.

_jit = jit()  # the kernels' own flags
_parallel = jit(parallel=True)


# fmt: off
@_jit
def forward_walk(
    gx, w_t, bias, h, c, gh, ns, offsets, order, s_i, s_g, s_f, s_o, s_h, s_c, s_tc, y, fn, r0,
    r1,
):  # pragma: no cover
    # fmt: on
    """The forward's step loop of one (layer, direction) on the batch rows [r0, r1): per step
    t, gh = h @ w_t on the block's active rows (w_t [H, 4H]: W_hh^T, C-contiguous, or W_hh.T
    itself where the library multiplies;
    kernels.walk_product, by the library GEMM at address ``fn`` where it is not 0) and
    kernels.forward_step on gx's rows of the step and block. The saved activations s_* hold
    every step ([T, B, H]) or one step's slot that all steps share ([1, B, H]: an inference
    forward keeps none, and its writes stay in cache)."""
    ints, alpha_beta = gemm_scratch(gh)
    last = s_i.shape[0] - 1
    for q in range(order.shape[0]):
        t = order[q]
        ts = min(t, last)
        k = max(min(ns[t], r1) - r0, 0)  # the block's active rows: a prefix of it
        lo = offsets[t] + r0
        if k > 0:
            walk_product(fn, h[r0 : r0 + k], w_t, gh[r0 : r0 + k], ints, alpha_beta)
        forward_step(
            gx[lo : lo + k], gh[r0:r1], bias, h[r0:r1], c[r0:r1], k,
            s_i[ts][r0:r1], s_g[ts][r0:r1], s_f[ts][r0:r1], s_o[ts][r0:r1], s_h[ts][r0:r1],
            s_c[ts][r0:r1], s_tc[ts][r0:r1], y[t][r0:r1],
        )  # fmt: skip


class ForwardWalk(NamedTuple):
    """One direction's arguments of :func:`forward_walk_parts` (those of :func:`forward_walk`)."""

    gx: np.ndarray  # [N, 4H] input projection
    w_t: np.ndarray  # [H, 4H] W_hh^T: C-contiguous, or W_hh.T (the library product only)
    bias: np.ndarray  # [4H]
    h: np.ndarray  # [B, H] running state
    c: np.ndarray  # [B, H]
    gh: np.ndarray  # [B, 4H] scratch
    order: np.ndarray  # [T] walk order
    # saved activations, [T, B, H] each ([1, B, H]: one slot for all steps), and output [T, B, H]
    s_i: np.ndarray
    s_g: np.ndarray
    s_f: np.ndarray
    s_o: np.ndarray
    s_h: np.ndarray
    s_c: np.ndarray
    s_tc: np.ndarray
    y: np.ndarray


class BackwardWalk(NamedTuple):
    """One direction's arguments of :func:`backward_walk_parts` (those of
    :func:`backward_walk`)."""

    dy: np.ndarray  # [T, B, H] (a dummy without has_dy)
    dh: np.ndarray  # [B, H] running gradients
    dc: np.ndarray  # [B, H]
    w: np.ndarray  # [4H, H] W_hh, C-contiguous
    # saved activations, [T, B, H] each
    s_i: np.ndarray
    s_g: np.ndarray
    s_f: np.ndarray
    s_o: np.ndarray
    s_tc: np.ndarray
    s_c: np.ndarray  # [T, B, H] saved c: c_prev of dense steps
    c0: np.ndarray  # [B, H] initial c, C-contiguous
    cp: np.ndarray  # [N, H] packed c_prev (steps with fewer than B rows)
    dg: np.ndarray  # [N, 4H] gate gradients, written
    db: np.ndarray  # [B, 4H] per-row bias gradients, accumulated (with_db)
    order: np.ndarray  # [T] walk order (the reverse of the forward's)


@_jit
def forward_walk_of(w, ns, offsets, fn, r0, r1):  # pragma: no cover
    """:func:`forward_walk` of one direction given as a :class:`ForwardWalk`."""
    forward_walk(w.gx, w.w_t, w.bias, w.h, w.c, w.gh, ns, offsets, w.order,
                 w.s_i, w.s_g, w.s_f, w.s_o, w.s_h, w.s_c, w.s_tc, w.y, fn, r0, r1)  # fmt: skip


@_parallel
def forward_walk_parts(walk0, walk1, parts, ns, offsets, fn):  # pragma: no cover
    """:func:`forward_walk` of the ``parts`` (rows of [walk, r0, r1]: walk 0 or 1, a block of
    batch rows), each on a thread of its own (a library GEMM called within runs on its calling
    thread alone: the library sees the parallel region)."""
    for q in prange(parts.shape[0]):
        if parts[q, 0] == 0:
            forward_walk_of(walk0, ns, offsets, fn, parts[q, 1], parts[q, 2])
        else:
            forward_walk_of(walk1, ns, offsets, fn, parts[q, 1], parts[q, 2])


# fmt: off
@_jit
def backward_walk(
    dy, has_dy, dh, dc, w, s_i, s_g, s_f, s_o, s_tc, s_c, c0, cp, dg, db, ns, offsets, order,
    flags, fn, r0, r1,
):  # pragma: no cover
    # fmt: on
    """The backward's step loop of one (layer, direction) on the batch rows [r0, r1): per step
    t (in ``order``, the reverse of the forward's), kernels.backward_step into dg's rows of the
    step and block, then dh = dG @ w on them (w [4H, H] C-contiguous: W_hh;
    kernels.walk_product with ``fn`` as in :func:`forward_walk`), skipped after the last step
    unless it is wanted (it only feeds dh_prev). ``flags``: (need_last, dense, with_db); dense
    steps read c_prev where it is saved (the step before in the forward's order, c0 for the
    first), others from cp, packed."""
    need_last, dense, with_db = flags
    steps = order.shape[0]
    ints, alpha_beta = gemm_scratch(dh)
    for q in range(steps):
        t = order[q]
        k = max(min(ns[t], r1) - r0, 0)  # the block's active rows
        if k == 0:
            continue
        lo = offsets[t] + r0
        if not dense:
            c_prev = cp[lo : lo + k]
        elif q + 1 < steps:
            c_prev = s_c[order[q + 1]][r0:r1]
        else:
            c_prev = c0[r0:r1]
        backward_step(
            dy[t if has_dy else 0][r0:r1], has_dy, dh[r0:r1], dc[r0:r1], s_i[t][r0:r1],
            s_g[t][r0:r1], s_f[t][r0:r1], s_o[t][r0:r1], s_tc[t][r0:r1], c_prev,
            dg[lo : lo + k], k, db[r0:r1], with_db,
        )  # fmt: skip
        if q < steps - 1 or need_last:
            walk_product(fn, dg[lo : lo + k], w, dh[r0 : r0 + k], ints, alpha_beta)


@_jit
def backward_walk_of(w, has_dy, ns, offsets, flags, fn, r0, r1):  # pragma: no cover
    """:func:`backward_walk` of one direction given as a :class:`BackwardWalk`."""
    backward_walk(w.dy, has_dy, w.dh, w.dc, w.w, w.s_i, w.s_g, w.s_f, w.s_o, w.s_tc, w.s_c,
                  w.c0, w.cp, w.dg, w.db, ns, offsets, w.order, flags, fn, r0, r1)  # fmt: skip


@_parallel
def backward_walk_parts(walk0, walk1, parts, has_dy, ns, offsets, flags, fn):  # pragma: no cover
    """:func:`backward_walk` of the ``parts`` (as in :func:`forward_walk_parts`), each on a
    thread of its own."""
    for q in prange(parts.shape[0]):
        if parts[q, 0] == 0:
            backward_walk_of(walk0, has_dy, ns, offsets, flags, fn, parts[q, 1], parts[q, 2])
        else:
            backward_walk_of(walk1, has_dy, ns, offsets, flags, fn, parts[q, 1], parts[q, 2])


def walk_parts(ns: np.ndarray, batch: int, walks: int, blocks: int) -> np.ndarray:
    """The parts of :func:`forward_walk_parts`: each of ``walks`` walks' batch rows in
    ``blocks`` consecutive blocks (fewer where the batch has fewer rows) of about equal work,
    the active row-steps (a row is active in the steps with more rows than its index)."""
    blocks = max(1, min(blocks, batch))
    if blocks == 1:  # each walk whole
        return np.array([(d, 0, batch) for d in range(walks)], dtype=np.int64)
    # active steps of each row b: the steps with ns > b; their running sum is the work
    work = np.cumsum(len(ns) - np.searchsorted(np.sort(ns), np.arange(batch), side="right"))
    total = int(work[-1]) if batch else 0
    bounds = [0]
    for q in range(1, blocks):
        cut = int(np.searchsorted(work, total * q / blocks, side="left")) + 1
        bounds.append(min(max(cut, bounds[-1] + 1), batch - (blocks - q)))
    bounds.append(batch)
    return np.array([(d, lo, hi) for d in range(walks) for lo, hi in zip(bounds[:-1],
                     bounds[1:], strict=True)], dtype=np.int64).reshape(-1, 3)  # fmt: skip


@_jit
def walk_products(fn, a_fwd, w_t, out_fwd, a_bwd, w, out_bwd, reps):  # pragma: no cover
    """``reps`` times a forward walk's and a backward walk's recurrent product
    (kernels.walk_product with ``fn``), one after the other as in the walks: what the tuner
    times to choose a walk's product."""
    ints, alpha_beta = gemm_scratch(out_fwd)
    for _ in range(reps):
        walk_product(fn, a_fwd, w_t, out_fwd, ints, alpha_beta)
        walk_product(fn, a_bwd, w, out_bwd, ints, alpha_beta)


@_parallel
def walk_products_parts(fn, a_fwd, w_t, out_fwd, a_bwd, w, out_bwd, reps, parts):  # pragma: no cover
    """:func:`walk_products` on ``parts`` threads at once, each on its block of the rows (of
    ceil(rows / parts)) and reading the same weights, as blocks of rows walking side by side
    do: what the default plan's probe times (they share the caches and the memory's
    bandwidth, which one walk alone does not show)."""
    rows = a_fwd.shape[0]
    for q in prange(parts):
        lo, hi = row_block(rows, parts, q)
        if hi > lo:
            walk_products(fn, a_fwd[lo:hi], w_t, out_fwd[lo:hi], a_bwd[lo:hi], w, out_bwd[lo:hi],
                          reps)  # fmt: skip


# Rows split over ``parts`` threads: a step's gate maths on ``parts`` blocks of the batch's
# rows at once (the rows of a step are independent), for models too large to walk whole steps
# in Numba, where the recurrent product runs in the GEMM library between the steps. Each row is
# computed exactly as by the one-thread kernel, so results are bitwise the same whatever the
# number of parts. Whether and from which step size it pays is measured (lstmgrad.planning.tune).


@_parallel
def forward_step_split(
    gx, gh, bias, h, c, n, parts, s_i, s_g, s_f, s_o, s_h, s_c, s_tc, y
):  # pragma: no cover
    """:func:`kernels.forward_step` on ``parts`` threads: active rows in blocks of
    ceil(n / parts), the last block also holding the masked rows [n, B)."""
    rows = h.shape[0]
    for q in prange(parts):
        lo, end = row_block(n, parts, q)
        k = end - lo
        hi = rows if q == parts - 1 else end
        forward_step(
            gx[lo : lo + k], gh[lo:hi], bias, h[lo:hi], c[lo:hi], k,
            s_i[lo:hi], s_g[lo:hi], s_f[lo:hi], s_o[lo:hi], s_h[lo:hi], s_c[lo:hi],
            s_tc[lo:hi], y[lo:hi],
        )  # fmt: skip


@_parallel
def backward_step_split(
    dy, has_dy, dh, dc, s_i, s_g, s_f, s_o, s_tc, c_prev, dg, n, db, with_db, parts
):  # pragma: no cover
    """:func:`kernels.backward_step` on ``parts`` threads, active rows in blocks of
    ceil(n / parts) (dy: any array without has_dy, as there; each row's db on the thread of
    its row)."""
    for q in prange(parts):
        lo, hi = row_block(n, parts, q)
        if hi > lo:
            backward_step(
                dy[lo:hi], has_dy, dh[lo:hi], dc[lo:hi], s_i[lo:hi], s_g[lo:hi],
                s_f[lo:hi], s_o[lo:hi], s_tc[lo:hi], c_prev[lo:hi], dg[lo:hi], hi - lo,
                db[lo:hi], with_db,
            )  # fmt: skip


@_parallel
def transpose_cols_split(src, width, n, c0, c1, dst, parts):  # pragma: no cover
    """:func:`kernels.transpose_cols` on ``parts`` threads, each writing its own block of
    dst's rows (src's columns c0 .. c1 in blocks of a multiple of 8). Transposing is bound by
    its loads and stores, not by memory bandwidth, so it scales with the threads."""
    a = src[: n * width].reshape((n, width))
    b = dst[: c1 * n].reshape((c1, n))
    size = ((c1 - c0 + parts - 1) // parts + 7) // 8 * 8
    for q in prange(parts):
        lo = min(c0 + q * size, c1)
        hi = min(lo + size, c1)
        if hi > lo:
            transpose_region(a, b, 0, n, lo, hi)


def transpose_cols(src, width, n, c0, c1, dst, threads):  # type: ignore[no-untyped-def]
    """:func:`kernels.transpose_cols`, on ``threads`` threads where more than one."""
    if threads > 1:
        transpose_cols_split(src, width, n, c0, c1, dst, threads)
    else:
        _transpose_cols(src, width, n, c0, c1, dst)
