"""The fused CPU engine: GEMMs (NumPy's BLAS, or torch's for tensors: lstmgrad.gemm) around
single-threaded Numba kernels.

Small bidirectional layers with torch's GEMMs walk their two directions at once instead, each
step loop in one Numba call with its recurrent product, on two OpenMP threads (fused.walks;
where ``gemm.walk_pairs`` says so); larger ones run each step's gate maths on two threads, the
rows split in halves (where ``gemm.split_steps`` says so, for steps of at least
fused.walks.SPLIT_MIN_ELEMENTS active elements).

Per (layer, direction), the forward projects the input of all steps with one GEMM and then runs,
per step, the recurrent GEMM and one kernel for the gate maths; the backward runs, per step, one
kernel for the gate gradients (stored for all steps in one packed [N, 4H] buffer) and the
recurrent GEMM, then after the loop one GEMM for dx, dW_ih and dW_hh (dG^T @ [x | h_prev],
K = N) in the layout the GEMM library runs fastest (Gemm.weight_grad_layout: one GEMM from the
rows of [x | h_prev], one from its transpose, or one each from the transpose of dG) and a
reduction for the bias.

Variable lengths: step t works on its active rows b < n_t only, "packed" at rows
offsets[t] .. offsets[t] + n_t - 1 (N = sum n_t; without batch sizes packed == padded), so
padding costs no FLOPs and is never read. The previous state of each row is read from its
previous active step (h0/c0 before the first), which makes any batch_sizes (not only
non-increasing ones) exact.

Compute dtype: float32 for float16 and float32 storage, float64 for float64. Results are
rounded to the storage dtype at the points of SPEC 7, as in the reference; the values passed
between layers are kept in the compute dtype but hold storage-rounded values.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..contract import BackwardCall, ForwardCall, LstmSaved
from ..gemm import NUMPY_GEMM, Gemm
from ..layout import B_HH, B_IH, W_HH, W_IH, Dims
from ..workspace import Arena, Slot, block
from . import kernels, walks

F32, F64 = np.dtype(np.float32), np.dtype(np.float64)


def compute_dtype(dtype: np.dtype) -> np.dtype:
    """float64 for float64 storage, float32 otherwise (SPEC 7: float16 computes in float32)."""
    return F64 if np.dtype(dtype) == F64 else F32


class _Steps:
    """Active rows per step (n_t) and their packed offsets."""

    def __init__(self, dims: Dims, mask: np.ndarray | None) -> None:
        if mask is None:
            self.ns = np.full(dims.T, dims.B, dtype=np.int64)
        else:  # m[t, b] = b < batch_sizes[t]: the active rows of a step are a prefix
            self.ns = mask.sum(axis=1).astype(np.int64)
        self.offsets = np.zeros(dims.T, dtype=np.int64)
        np.cumsum(self.ns[:-1], out=self.offsets[1:])
        self.total = int(self.ns.sum())
        self.orders = [
            np.arange(dims.T, dtype=np.int64),
            np.arange(dims.T - 1, -1, -1, dtype=np.int64),
        ]
        # (t, n_t, offset_t) in each walk order, as Python ints, for the step loops (no NumPy
        # scalar lookups per step: a few hundred ns of the ~10 us of Python a step costs)
        self.walks = [
            list(zip(o.tolist(), self.ns[o].tolist(), self.offsets[o].tolist(), strict=True))
            for o in self.orders
        ]


def _c(a: np.ndarray, cd: np.dtype) -> np.ndarray:
    """C-contiguous in the compute dtype (no copy when already so): BLAS sees one layout, so
    results do not depend on the caller's strides."""
    return np.ascontiguousarray(a, dtype=cd)


def _dense(buf: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """A C-contiguous [rows, cols] view at the start of ``buf`` (a scratch slot sized for the
    widest layer): GEMM libraries take a dense operand on their fast path, while a row stride
    wider than the row sent oneDNN to a reference kernel 100x slower."""
    return buf.reshape(-1)[: rows * cols].reshape(rows, cols)


def _rounded(a: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``a`` rounded to the storage dtype, kept in a's dtype (in place)."""
    if a.dtype != dtype:
        a[...] = a.astype(dtype)
    return a


def _pair_walks(dims: Dims, dtype: np.dtype, gemm: Gemm) -> bool:
    """Whether a bidirectional layer's two directions walk at once, each step loop in one Numba
    call (fused.walks), where ``gemm.walk_pairs`` says so; float32/float64 storage (float16's
    activations pass through one scratch, one direction at a time)."""
    cd = compute_dtype(dtype)
    return dims.D == 2 and cd == np.dtype(dtype) and gemm.walk_pairs(cd, dims.B, dims.H)


def _step_kernels(
    gemm: Gemm, cd: np.dtype, serial: Callable, split: Callable
) -> tuple[Callable, float]:
    """(kernel, n) : the step kernel for steps of at least n active-row elements (n_t * H),
    ``split`` (its rows on two threads, fused.walks) where ``gemm.split_steps`` says so, and
    ``serial`` for smaller steps (every step where n is infinite)."""
    if gemm.split_steps(cd):
        return split, walks.SPLIT_MIN_ELEMENTS
    return serial, float("inf")


def forward_workspace_slots(dims: Dims, dtype: np.dtype, gemm: Gemm = NUMPY_GEMM) -> list[Slot]:
    """Scratch of the forward (compute dtype cd) with the GEMMs of ``gemm``.

    x [N, max(I, D*H)] packed layer input; gx [P, N, 4H] its projection; gh [P, B, 4H] the
    recurrent part (gh_t [4H * B] its transposed product); h, c [P, B, H] the running state;
    acts [7, T, B, H] the saved activations before rounding (float16 storage only); the layer
    input [T, B, D*H] (cd). P = 2 where the two directions walk at once (:func:`_pair_walks`),
    else 1.
    """
    cd = compute_dtype(dtype)
    t, b, h = dims.T, dims.B, dims.H
    n, width = t * b, max(dims.I, dims.D * h)
    acts = (7, t, b, h) if cd != dtype else (0,)
    p = 2 if _pair_walks(dims, dtype, gemm) else 1
    return [
        ((n, width), cd),
        ((p, n, 4 * h), cd),
        ((p, b, 4 * h), cd),
        ((4 * h * b,), cd),
        ((p, b, h), cd),
        ((p, b, h), cd),
        (acts, cd),
        ((t, b, dims.D * h), cd),
    ]


def backward_workspace_slots(dims: Dims, dtype: np.dtype, gemm: Gemm = NUMPY_GEMM) -> list[Slot]:
    """Scratch of the backward (compute dtype cd) with the GEMMs of ``gemm``.

    xh [N, max(I, D*H) + H] packed [layer input | h_prev]; dg [P, N, 4H] gate gradients; cp
    [P, N, H] packed c_prev; dw [4H, max(I, D*H) + H]; dh, dc [P, B, H]; dx [D, N, max(I, D*H)]
    each direction's dx; dy [T, B, D*H] the gradient of the layer's output; acts [7, T, B, H] the
    saved activations in cd (float16 storage only); xht [max(I, D*H) + H, N] xh transposed,
    where the weight gradient's layout is "tn"; dgt [4H, N] dg transposed, where it is "nt"
    (see :class:`lstmgrad.gemm.Gemm`). P = 2 where the two directions walk at once
    (:func:`_pair_walks`), else 1.
    """
    cd = compute_dtype(dtype)
    t, b, h = dims.T, dims.B, dims.H
    n, width = t * b, max(dims.I, dims.D * h)
    acts = (7, t, b, h) if cd != dtype else (0,)
    layout = gemm.weight_grad_layout(cd, n, 4 * h)
    p = 2 if _pair_walks(dims, dtype, gemm) else 1
    return [
        ((n, width + h), cd),
        ((p, n, 4 * h), cd),
        ((p, n, h), cd),
        ((4 * h, width + h) if layout == "rows" else (0,), cd),
        ((p, b, h), cd),
        ((p, b, h), cd),
        ((dims.D, n, width), cd),
        ((t, b, dims.D * h), cd),
        (acts, cd),
        ((width + h, n) if layout == "tn" else (0,), cd),
        ((4 * h, n) if layout == "nt" else (0,), cd),
    ]


def _bias(call: ForwardCall, layer: int, d: int, cd: np.dtype) -> np.ndarray:
    dims = call.dims
    if not dims.has_bias:
        return np.zeros(dims.G, dtype=cd)
    b_ih = call.params[dims.index(layer, d, B_IH)].astype(cd)
    return b_ih + call.params[dims.index(layer, d, B_HH)].astype(cd)


def lstm_forward(
    call: ForwardCall, arena: Arena | None = None, gemm: Gemm = NUMPY_GEMM
) -> tuple[np.ndarray, np.ndarray, np.ndarray, LstmSaved | None]:
    """Forward of every (layer, direction); returns time-major output [T, B, D*H], hy, cy, saved.

    ``gemm`` runs every GEMM (NumPy's by default; torch's for torch callers).
    """
    arena = arena or Arena()
    dims, dtype = call.dims, call.dtype
    cd = compute_dtype(dtype)
    t_steps, batch, hidden = dims.T, dims.B, dims.H
    st = _Steps(dims, call.mask)
    n_rows = st.total
    xp_buf, gx_buf, gh_buf, gh_t_buf, h_buf, c_buf, acts_buf, layer_in = arena.take_all(
        forward_workspace_slots(dims, dtype, gemm)
    )
    # every result in one (recycled) allocation: see workspace.block
    act = (t_steps, batch, hidden)
    state = (dims.K, batch, hidden)
    y, hy, cy, *flat = block(
        [(t_steps, batch, dims.D * hidden), state, state] + [act] * (7 * dims.K), dtype
    )
    saved = [flat[n * dims.K : (n + 1) * dims.K] for n in range(7)]
    masks = [_c(m, cd) for m in call.dropout_masks] if call.dropout_masks else None
    # The recurrent GEMM as (h W_hh^T)^T = W_hh h^T plus a tiled transpose: OpenBLAS runs up to
    # 1.9x faster with 4H than with a small batch as M. Measured here: 9-30% less forward time
    # for B <= 64 and H >= 256, slower for B = 128 or H = 128. (The same in the backward,
    # W_hh^T dG^T, measured within noise, +-5%: not done there.) Only where the GEMM library
    # says it pays (gemm.transposed_forward).
    transposed = gemm.transposed_forward and batch <= 64 and hidden >= 256
    pair = _pair_walks(dims, dtype, gemm)
    forward_step, split_min = _step_kernels(
        gemm, cd, kernels.forward_step, walks.forward_step_split
    )
    for layer in range(dims.L):
        width = dims.layer_input_size(layer)
        xp = _dense(xp_buf, n_rows, width)  # [N, I_l]
        if layer == 0:
            kernels.pack_rows(call.x.astype(cd, copy=False), st.ns, st.offsets, xp, 0)
        else:
            np.copyto(layer_in, y)  # the layer below's rounded output
            if masks is not None:
                kernels.pack_rows_scaled(layer_in, masks[layer - 1], st.ns, st.offsets, xp, 0)
            else:
                kernels.pack_rows(layer_in, st.ns, st.offsets, xp, 0)
        pending = []  # the pair walk's arguments, per direction
        for d in range(dims.D):
            k = layer * dims.D + d
            p = d if pair else 0  # the direction's scratch
            h, c, gh = h_buf[p], c_buf[p], gh_buf[p]
            # W_ih as given (a transposed operand costs the big GEMM ~2%; a transposed copy of
            # W_ih would cost more on large H)
            w_ih = _c(call.params[dims.index(layer, d, W_IH)], cd)  # [4H, I_l]
            w_hh = _c(call.params[dims.index(layer, d, W_HH)], cd)  # [4H, H]
            bias = _bias(call, layer, d, cd)
            # [N, 4H]: every step's input projection at once
            gx = gemm.result(xp, w_ih.T, gx_buf[p, :n_rows])
            h[...] = 0.0 if call.h0 is None else call.h0[k]
            c[...] = 0.0 if call.c0 is None else call.c0[k]
            if cd == dtype:
                s_i, s_g, s_f, s_o, s_h, s_c, s_tc = (saved[n][k] for n in range(7))
                y_d = y[..., d * hidden : (d + 1) * hidden]
            else:
                s_i, s_g, s_f, s_o, s_h, s_c, s_tc = acts_buf
                y_d = layer_in[..., d * hidden : (d + 1) * hidden]  # free once xp is packed
            if pair:
                acts = (s_i, s_g, s_f, s_o, s_h, s_c, s_tc, y_d)
                w_t = np.ascontiguousarray(w_hh.T)  # [H, 4H]
                pending += [gx, w_t, bias, h, c, gh, st.orders[d], *acts]
                continue
            # h [n, H] -> [n, 4H], once a step
            rec = None if transposed else gemm.fixed(w_hh.T, batch, t_steps)
            for t, n, off in st.walks[d]:
                g_rec = gh
                if n and rec is not None:
                    g_rec = rec(h[:n], gh[:n])  # [n, 4H], in gh or the library's own result
                elif n:
                    gh_t = gh_t_buf[: 4 * hidden * n].reshape(4 * hidden, n)
                    gemm(w_hh, h[:n].T, out=gh_t)  # [4H, n]
                    kernels.transpose_into(gh, gh_t, n)
                kernel = forward_step if n * hidden >= split_min else kernels.forward_step
                kernel(
                    gx[off : off + n], g_rec, bias, h, c, n,
                    s_i[t], s_g[t], s_f[t], s_o[t], s_h[t], s_c[t], s_tc[t], y_d[t],
                )  # fmt: skip
            hy[k], cy[k] = h, c  # rounding point (SPEC 7)
            if cd != dtype:
                for n_, a in enumerate((s_i, s_g, s_f, s_o, s_h, s_c, s_tc)):
                    saved[n_][k][...] = a
                y[..., d * hidden : (d + 1) * hidden] = y_d
        if pair:  # float32/float64 storage: the walks wrote saved and y themselves
            # both directions' 15 arguments, in forward_walk_pair's order (mypy cannot count a list)
            walks.forward_walk_pair(*pending, st.ns, st.offsets)  # type: ignore[call-arg]
            for d in range(2):
                hy[layer * 2 + d], cy[layer * 2 + d] = h_buf[d], c_buf[d]
    result_saved = None
    if call.train:
        result_saved = LstmSaved(
            saved[0], saved[1], saved[2], saved[3], saved[4], saved[5], saved[6],
            call.dropout_masks if call.dropout > 0 else None,
        )  # fmt: skip
    return y, hy, cy, result_saved


def _gather(call: BackwardCall, st: _Steps, k: int, acts: tuple, hp: np.ndarray, hp_col: int,
            cp: np.ndarray) -> None:  # fmt: skip
    """The packed previous states of (layer, direction) k (docs/math.md B1): h_prev into
    hp[:, hp_col:], c_prev into cp (kernels.gather_prev)."""
    cd = cp.dtype
    kernels.gather_prev(
        acts[4], acts[5], _c(call.h0[k], cd), _c(call.c0[k], cd), st.ns, st.offsets,
        st.orders[k % call.dims.D], hp, hp_col, cp,
    )  # fmt: skip


def _initial_grads(call: BackwardCall, k: int, dh: np.ndarray, dc: np.ndarray) -> None:
    dh[...] = 0.0 if call.dh is None else call.dh[k]
    dc[...] = 0.0 if call.dc is None else call.dc[k]


def lstm_backward(
    call: BackwardCall, arena: Arena | None = None, gemm: Gemm = NUMPY_GEMM
) -> tuple[np.ndarray | None, np.ndarray | None, np.ndarray | None, list[np.ndarray] | None]:
    """Backward of every (layer, direction), top layer first; time-major dx [T, B, I].

    ``gemm`` as in :func:`lstm_forward`.
    """
    need_dx, need_dh, need_dc, need_dw = call.need
    if not any(call.need):
        return None, None, None, None
    arena = arena or Arena()
    dims, dtype = call.dims, call.dtype
    cd = compute_dtype(dtype)
    t_steps, batch, hidden = dims.T, dims.B, dims.H
    st = _Steps(dims, call.mask)
    n_rows = st.total
    (xh_buf, dg_buf, cp_buf, dw_buf, dh_buf, dc_buf, dx_buf, dy_buf, acts_buf, xht_buf,
     dgt_buf) = arena.take_all(backward_workspace_slots(dims, dtype, gemm))  # fmt: skip
    pair = _pair_walks(dims, dtype, gemm)
    backward_step, split_min = _step_kernels(
        gemm, cd, kernels.backward_step, walks.backward_step_split
    )
    # the layout of dW = dG^T @ [x | h_prev] (see gemm.Gemm); "nt" packs x and h_prev each
    # dense (operands of their own GEMM), the others [x | h_prev] in the rows of xh
    layout = gemm.weight_grad_layout(cd, t_steps * batch, dims.G) if need_dw else "rows"
    # flat views for kernels.transpose_cols
    xh_flat, xht_flat, dgt_flat = xh_buf.reshape(-1), xht_buf.reshape(-1), dgt_buf.reshape(-1)
    # every result in one (recycled) allocation: see workspace.block
    state = (dims.K, batch, hidden)
    dx_shape = (t_steps, batch, dims.I) if need_dx else (0,)
    dw_shapes = [p.shape for p in call.params] if need_dw else []
    if layout == "nt":  # dW_ih, dW_hh: the GEMMs' results themselves
        for layer, d in np.ndindex(dims.L, dims.D):
            dw_shapes[dims.index(layer, d, W_IH)] = dw_shapes[dims.index(layer, d, W_HH)] = (0,)
    outs = block([dx_shape, state, state] + dw_shapes, dtype)
    dh_prev = outs[1] if need_dh else None
    dc_prev = outs[2] if need_dc else None
    dparams = outs[3:] if need_dw else None
    masks = [_c(m, cd) for m in call.dropout_masks] if call.dropout_masks else None
    dy = None if call.dy is None else call.dy.astype(cd, copy=False)
    dx_out = None
    dummy = np.zeros((1, 1, 1), dtype=cd)
    dx_parts: list[np.ndarray] = [dummy[0]] * dims.D  # each direction's dx of the layer
    for layer in reversed(range(dims.L)):
        width = dims.layer_input_size(layer)
        want_dx = layer > 0 or need_dx
        xh = _dense(xh_buf, n_rows, width + hidden)
        hp = xh  # where h_prev goes (from column hp_col)
        if layout == "nt":  # x [N, I_l] then h_prev [N, H], each dense
            xh = _dense(xh_buf, n_rows, width)
            hp = xh_flat[n_rows * width : n_rows * (width + hidden)].reshape(n_rows, hidden)
        hp_col = 0 if layout == "nt" else width
        if need_dw:  # the layer's input, packed, in xh[:, :width]
            if layer == 0:
                kernels.pack_rows(call.x.astype(cd, copy=False), st.ns, st.offsets, xh, 0)
            else:
                for d in range(dims.D):
                    h_below = _c(call.saved[4][(layer - 1) * dims.D + d], cd)
                    if masks is not None:
                        m = masks[layer - 1][..., d * hidden : (d + 1) * hidden]
                        kernels.pack_rows_scaled(h_below, m, st.ns, st.offsets, xh, d * hidden)
                    else:
                        kernels.pack_rows(h_below, st.ns, st.offsets, xh, d * hidden)
        if layout == "tn":  # and transposed
            kernels.transpose_cols(xh_flat, width + hidden, n_rows, 0, width, xht_flat)
        # each direction's saved activations (in cd), output gradient and scratch: its own
        # where the two directions walk at once
        dirs = []
        for d in range(dims.D):
            k = layer * dims.D + d
            p = d if pair else 0
            if cd == dtype:
                acts = tuple(_c(s[k], cd) for s in call.saved)
            else:  # filled just before this direction's walk (never a pair)
                acts = tuple(acts_buf)
            dy_d = dummy if dy is None else dy[..., d * hidden : (d + 1) * hidden]
            dirs.append((k, acts, dy_d, dg_buf[p, :n_rows], cp_buf[p, :n_rows], dh_buf[p],
                         dc_buf[p]))  # fmt: skip
        if pair:  # both directions' walks at once (fused.walks), then each one's GEMMs
            for k, acts, _, _, cp, dh, dc in dirs:
                _gather(call, st, k, acts, hp, hp_col, cp)
                _initial_grads(call, k, dh, dc)
            pending = []
            for k, acts, dy_d, dg, cp, dh, dc in dirs:
                w_hh = _c(call.params[dims.index(layer, k % 2, W_HH)], cd)  # [4H, H]
                s_i, s_g, s_f, s_o, _, _, s_tc = acts
                pending += [dy_d, dh, dc, w_hh, s_i, s_g, s_f, s_o, s_tc, cp, dg,
                            st.orders[1 - k % 2]]  # fmt: skip
            # both directions' 12 arguments, in backward_walk_pair's order
            walks.backward_walk_pair(  # type: ignore[call-arg]
                *pending, dy is not None, st.ns, st.offsets, need_dh
            )
        for k, acts, dy_d, dg, cp, dh, dc in dirs:
            d = k % dims.D
            if not pair:
                if cd != dtype:
                    for n_, s in enumerate(call.saved):
                        acts_buf[n_][...] = s[k]
                _gather(call, st, k, acts, hp, hp_col, cp)
                _initial_grads(call, k, dh, dc)
                w_hh = _c(call.params[dims.index(layer, d, W_HH)], cd)  # [4H, H]
                rec = gemm.fixed(w_hh, batch, t_steps)  # dG [n, 4H] -> dh [n, H]
                s_i, s_g, s_f, s_o, _, _, s_tc = acts
                for step, (t, n, off) in enumerate(st.walks[1 - d]):
                    if not n:
                        continue
                    kernel = backward_step if n * hidden >= split_min else kernels.backward_step
                    kernel(
                        dy_d[t if dy is not None else 0], dy is not None, dh, dc,
                        s_i[t], s_g[t], s_f[t], s_o[t], s_tc[t], cp[off : off + n],
                        dg[off : off + n], n,
                    )  # fmt: skip
                    if step < t_steps - 1 or need_dh:  # the last step's dh only feeds dh_prev
                        dh_n = dh[:n]
                        product = rec(dg[off : off + n], dh_n)
                        if product is not dh_n:  # the library's own result
                            np.copyto(dh_n, product)
            elif need_dw:  # this direction's h_prev again: the directions share hp
                _gather(call, st, k, acts, hp, hp_col, cp)
            if layout == "tn":
                kernels.transpose_cols(
                    xh_flat, width + hidden, n_rows, width, width + hidden, xht_flat
                )
            if dh_prev is not None:
                dh_prev[k] = dh
            if dc_prev is not None:
                dc_prev[k] = dc
            w_ih = _c(call.params[dims.index(layer, d, W_IH)], cd)  # [4H, I_l]
            if want_dx:
                dx_parts[d] = gemm.result(dg, w_ih, _dense(dx_buf[d], n_rows, width))  # [N, I_l]
            if dparams is not None and layout == "nt":
                kernels.transpose_cols(dg.reshape(-1), dims.G, n_rows, 0, dims.G, dgt_flat)
                dgt = _dense(dgt_buf, dims.G, n_rows)
                # the GEMMs' own results; rounded to the storage dtype where it differs (float16)
                dw_ih, dw_hh = gemm.nt(dgt, xh), gemm.nt(dgt, hp)
                dparams[dims.index(layer, d, W_IH)] = dw_ih.astype(dtype, copy=False)
                dparams[dims.index(layer, d, W_HH)] = dw_hh.astype(dtype, copy=False)
            elif dparams is not None:  # [4H, I_l + H]: dW_ih and dW_hh in one GEMM
                if layout == "tn":
                    dw = gemm.tn(dg, _dense(xht_buf, width + hidden, n_rows))
                else:
                    dw = _dense(dw_buf, dims.G, width + hidden)
                    gemm(dg.T, xh, out=dw)
                dparams[dims.index(layer, d, W_IH)][...] = dw[:, :width]
                dparams[dims.index(layer, d, W_HH)][...] = dw[:, width:]
            if dparams is not None and dims.has_bias:
                db = dg.sum(axis=0)
                dparams[dims.index(layer, d, B_IH)][...] = db
                dparams[dims.index(layer, d, B_HH)][...] = db
        if want_dx:
            # each direction's dx rounded to the storage dtype, summed in it (SPEC 7)
            total = _rounded(dx_parts[0], dtype)
            if dims.D == 2:
                np.add(total, _rounded(dx_parts[1], dtype), out=total)
                _rounded(total, dtype)
            if layer > 0:
                dy = dy_buf
                kernels.unpack_rows(total, st.ns, st.offsets, dy)
                if masks is not None:
                    np.multiply(dy, masks[layer - 1], out=dy)
                    _rounded(dy, dtype)
            elif cd == dtype:
                dx_out = outs[0]
                kernels.unpack_rows(total, st.ns, st.offsets, dx_out)
            else:
                dx_cd = np.empty((t_steps, batch, dims.I), dtype=cd)
                kernels.unpack_rows(total, st.ns, st.offsets, dx_cd)
                dx_out = outs[0]
                dx_out[...] = dx_cd  # exact: the values are already float16-rounded
    return dx_out, dh_prev, dc_prev, dparams
