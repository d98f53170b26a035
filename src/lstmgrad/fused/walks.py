"""The fused engine's two-thread parts: whole step loops in Numba for the two directions of a
bidirectional layer at once, and step kernels with their rows split over two threads.

On small models the per-step GEMM call dominates (small-2's [8, 128] x [128, 512] costs ~12 us
through torch, about what a Numba loop takes), and a direction's steps depend on each other,
so the one parallelism left is the two directions. Measured on small-2's two forward walks
(8.0-8.6 ms one after the other): a Numba ``prange`` over the directions on Numba's OpenMP
threading layer (GNU OpenMP, as torch's) takes 4.0-4.2 ms, also right after a torch op; on its
"workqueue" layer, or as two Python threads, 4.2-5.4 ms when the machine is idle but 8.2-10 ms
right after a torch op, whose OpenMP workers hold the second core. So the pairs run only on the
OpenMP layer (:func:`pairs_available`).

Larger models keep their recurrent product in the GEMM library, one step at a time, but run
each step's gate maths on two threads, rows split in two halves (``forward_step_split``,
``backward_step_split``, where ``Gemm.split_steps`` says so: the same OpenMP layer).

Each walk is one (layer, direction)'s step loop, in the walk ``order`` (0..T-1 for the forward
direction, T-1..0 for the reverse), with the recurrent product in :func:`kernels.matmul_into`
and the gate maths in the per-step kernels; variable lengths as in the engine (step t: rows
< ns[t], packed at offsets[t]).
"""

from __future__ import annotations

import os
import sys

import numba
import numpy as np
from numba import prange

from .kernels import backward_step, forward_step, jit, matmul_into

_jit = jit()  # the kernels' own flags
_parallel = jit(parallel=True)


@_jit
def forward_walk(
    gx, w_t, bias, h, c, gh, ns, offsets, order, s_i, s_g, s_f, s_o, s_h, s_c, s_tc, y
):  # pragma: no cover
    """The forward's step loop of one (layer, direction): per step t, gh = h[:n] @ w_t (w_t
    [H, 4H] C-contiguous: W_hh^T) and kernels.forward_step on gx's rows of the step."""
    for q in range(order.shape[0]):
        t = order[q]
        n = ns[t]
        off = offsets[t]
        if n > 0:
            matmul_into(h[:n], w_t, gh[:n])
        forward_step(
            gx[off : off + n], gh, bias, h, c, n,
            s_i[t], s_g[t], s_f[t], s_o[t], s_h[t], s_c[t], s_tc[t], y[t],
        )  # fmt: skip


@_parallel
def forward_walk_pair(
    gx0, w0, b0, h0, c0, gh0, o0, i0, g0, f0, out0, hs0, cs0, tc0, y0,
    gx1, w1, b1, h1, c1, gh1, o1, i1, g1, f1, out1, hs1, cs1, tc1, y1,
    ns, offsets,
):  # pragma: no cover  # fmt: skip
    """:func:`forward_walk` of the two directions on two threads (o0, o1: their orders)."""
    for d in prange(2):
        if d == 0:
            forward_walk(gx0, w0, b0, h0, c0, gh0, ns, offsets, o0,
                         i0, g0, f0, out0, hs0, cs0, tc0, y0)  # fmt: skip
        else:
            forward_walk(gx1, w1, b1, h1, c1, gh1, ns, offsets, o1,
                         i1, g1, f1, out1, hs1, cs1, tc1, y1)  # fmt: skip


@_jit
def backward_walk(
    dy, has_dy, dh, dc, w, s_i, s_g, s_f, s_o, s_tc, cp, dg, ns, offsets, order, need_last
):  # pragma: no cover
    """The backward's step loop of one (layer, direction): per step t (in ``order``, the
    reverse of the forward's), kernels.backward_step into dg's rows of the step, then dh[:n] =
    dG @ w (w [4H, H] C-contiguous: W_hh), skipped after the last step unless ``need_last``
    (it only feeds dh_prev)."""
    steps = order.shape[0]
    for q in range(steps):
        t = order[q]
        n = ns[t]
        off = offsets[t]
        if n == 0:
            continue
        backward_step(
            dy[t if has_dy else 0], has_dy, dh, dc, s_i[t], s_g[t], s_f[t], s_o[t], s_tc[t],
            cp[off : off + n], dg[off : off + n], n,
        )  # fmt: skip
        if q < steps - 1 or need_last:
            matmul_into(dg[off : off + n], w, dh[:n])


@_parallel
def backward_walk_pair(
    dy0, dh0, dc0, w0, i0, g0, f0, o0, tc0, cp0, dg0, ord0,
    dy1, dh1, dc1, w1, i1, g1, f1, o1, tc1, cp1, dg1, ord1,
    has_dy, ns, offsets, need_last,
):  # pragma: no cover  # fmt: skip
    """:func:`backward_walk` of the two directions on two threads."""
    for d in prange(2):
        if d == 0:
            backward_walk(dy0, has_dy, dh0, dc0, w0, i0, g0, f0, o0, tc0, cp0, dg0,
                          ns, offsets, ord0, need_last)  # fmt: skip
        else:
            backward_walk(dy1, has_dy, dh1, dc1, w1, i1, g1, f1, o1, tc1, cp1, dg1,
                          ns, offsets, ord1, need_last)  # fmt: skip


# Rows split over two threads: a step's gate maths on the rows of two halves of the batch at
# once (the rows of a step are independent), for models too large to walk whole steps in Numba,
# where the recurrent product runs in the GEMM library between the steps. Each row is computed
# exactly as by the one-thread kernel, so results are bitwise the same. Measured here in a loop
# of torch's recurrent product and the kernel (float32, 100 steps unless noted): forward
# kernels 3.3 -> 1.7 ms at B = 32, H = 256 (product + kernel 9.1 -> 7.2 ms), 13.8 -> 6.8 ms at
# B = 64, H = 512, 0.76 -> 0.57 ms at B = 16, H = 128; no gain at 512 elements a step (B = 8,
# H = 64: 0.39 vs 0.40 ms; B = 4, H = 128: 0.32 -> 0.40 ms). The backward kernel (no
# transcendentals) gains less: 7.4 -> 5.2 ms at B = 64, H = 512, 4.9 -> 3.6 ms at B = 32,
# H = 256, T = 250. Whole forward + backward passes (BENCH shapes, split and one-thread
# alternated in one process): med-3 38.5 -> 36.0 ms, med-4 77.3 -> 70.7, med-5 136 -> 123,
# med-6 455 -> 436, large-1 129 -> 117, large-2 218 -> 215, med-1 18.5 -> 17.9.
SPLIT_MIN_ELEMENTS = 2048  # active rows * H of a step, from which the split pays


@_parallel
def forward_step_split(
    gx, gh, bias, h, c, n, s_i, s_g, s_f, s_o, s_h, s_c, s_tc, y
):  # pragma: no cover
    """:func:`kernels.forward_step` on two threads: rows [0, m) and [m, B), m = ceil(n / 2)
    (the second half holds the step's other n - m active rows and the masked ones)."""
    rows = h.shape[0]
    m = (n + 1) // 2
    for q in prange(2):
        lo = 0 if q == 0 else m
        hi = m if q == 0 else rows
        k = m if q == 0 else n - m
        forward_step(
            gx[lo : lo + k], gh[lo:hi], bias, h[lo:hi], c[lo:hi], k,
            s_i[lo:hi], s_g[lo:hi], s_f[lo:hi], s_o[lo:hi], s_h[lo:hi], s_c[lo:hi],
            s_tc[lo:hi], y[lo:hi],
        )  # fmt: skip


@_parallel
def backward_step_split(
    dy, has_dy, dh, dc, s_i, s_g, s_f, s_o, s_tc, c_prev, dg, n
):  # pragma: no cover
    """:func:`kernels.backward_step` on two threads: active rows [0, m) and [m, n) (dy: any
    array without has_dy, as there)."""
    m = (n + 1) // 2
    for q in prange(2):
        lo = 0 if q == 0 else m
        hi = m if q == 0 else n
        backward_step(
            dy[lo:hi], has_dy, dh[lo:hi], dc[lo:hi], s_i[lo:hi], s_g[lo:hi],
            s_f[lo:hi], s_o[lo:hi], s_tc[lo:hi], c_prev[lo:hi], dg[lo:hi], hi - lo,
        )  # fmt: skip


_decided: tuple[int, bool] | None = None  # (pid, answer) of the process that decided


def pairs_available() -> bool:
    """Whether the pair walks pay here: Numba's threading layer is OpenMP and no OpenMP runtime
    but GNU's is loaded (Linux; False elsewhere, and False where another layer was chosen, e.g.
    NUMBA_THREADING_LAYER=tbb or workqueue). Decided once a process, at the first call, which
    also makes Numba pick its threading layer (as its first parallel function would).

    A process forked after that answers False: GNU OpenMP is not fork-safe, and Numba stops a
    forked child that launches a parallel region of its parent's OpenMP layer; such a child
    walks one direction at a time."""
    global _decided
    pid = os.getpid()
    if _decided is None:
        _decided = (pid, _check_pairs())
    owner, answer = _decided
    return answer and owner == pid


def two_threads() -> bool:
    """:func:`pairs_available`, and Numba may use two threads in the calling thread
    (NUMBA_NUM_THREADS, numba.set_num_threads): where the two-thread kernels run."""
    return pairs_available() and numba.get_num_threads() >= 2


@numba.njit(parallel=True, cache=True)
def _probe(a):  # pragma: no cover
    for j in prange(a.shape[0]):
        a[j] = j


def _check_pairs() -> bool:
    # Starting Numba's OpenMP pool sets the calling thread's OpenMP thread count to Numba's
    # (seen through torch.get_num_threads()): a count torch was given is put back.
    torch = sys.modules.get("torch")
    torch_threads = torch.get_num_threads() if torch is not None else 0
    try:
        _probe(np.zeros(2))
        if numba.threading_layer() != "omp":
            return False
        with open("/proc/self/maps") as maps:
            libs = {line.split()[-1] for line in maps if ".so" in line}
    except Exception:  # no threading layer loads, no /proc: walk one direction at a time
        return False
    finally:
        if torch is not None and torch.get_num_threads() != torch_threads:
            torch.set_num_threads(torch_threads)
    return not any("libiomp" in lib or "/libomp" in lib for lib in libs)
