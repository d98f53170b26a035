"""Reference LSTM forward and backward, one line per formula of docs/math.md.

Everything is computed in float64 and rounded to the storage dtype (the dtype of input) at the
rounding points (docs/math.md#rounding): once per (layer, direction), the layer-to-layer glue
(direction sum, dropout) in the storage dtype. Time-major throughout; the engine trusts its
validated call.
"""

from __future__ import annotations

import numpy as np

from ..core.contract import BackwardCall, ForwardCall, LstmSaved
from ..core.layout import B_HH, B_IH, W_HH, W_IH, Dims
from ..core.workspace import Arena, Slot

F64 = np.dtype(np.float64)


def _f64(a: np.ndarray) -> np.ndarray:
    """A C-ordered float64 copy: BLAS sees one memory layout whatever the caller's strides, so
    results are bit-identical for any layout of the same values."""
    return np.ascontiguousarray(a, dtype=F64)


def _sigmoid(a: np.ndarray) -> np.ndarray:
    """1 / (1 + exp(-a)), evaluated without overflow."""
    return np.exp(-np.logaddexp(0.0, -a))


def _gates(a: np.ndarray, hidden: int) -> tuple[np.ndarray, ...]:
    """Split [.., 4H] into the i, f, g, o blocks."""
    return tuple(a[..., n * hidden : (n + 1) * hidden] for n in range(4))


def forward_workspace_slots(dims: Dims, dtype: np.dtype) -> list[Slot]:
    """Scratch of the forward: the float64 input of a layer above the first, [T, B, D*H]."""
    return [((dims.T, dims.B, dims.D * dims.H), F64)]


def backward_workspace_slots(dims: Dims, dtype: np.dtype) -> list[Slot]:
    """Scratch of the backward (float64 unless noted).

    dG [T, B, 4H] gate gradients of one direction; h_prev, c_prev [T, B, H] previous states;
    x [T, B, max(I, D*H)] the float64 layer input; dx [D, T, B, max(I, D*H)] each direction's
    rounded dx (storage dtype); dy [T, B, D*H] the gradient passed to the layer below (storage).
    """
    t, b, h = dims.T, dims.B, dims.H
    width = max(dims.I, dims.D * h)
    return [
        ((t, b, 4 * h), F64),
        ((t, b, h), F64),
        ((t, b, h), F64),
        ((t, b, width), F64),
        ((dims.D, t, b, width), np.dtype(dtype)),
        ((t, b, dims.D * h), np.dtype(dtype)),
    ]


def lstm_forward(
    call: ForwardCall, arena: Arena | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, LstmSaved | None]:
    """Forward of every (layer, direction); returns time-major output [T, B, D*H], hy, cy, saved."""
    arena = arena or Arena()
    dims, dtype, m = call.dims, call.dtype, call.mask
    t_steps, batch, hidden = dims.T, dims.B, dims.H
    (layer_x,) = arena.take_all(forward_workspace_slots(dims, dtype))
    hy = np.zeros((dims.K, batch, hidden), dtype=dtype)
    cy = np.zeros((dims.K, batch, hidden), dtype=dtype)
    saved = [
        [np.zeros((t_steps, batch, hidden), dtype=dtype) for _ in range(dims.K)] for _ in range(7)
    ]
    y = np.zeros((t_steps, batch, dims.D * hidden), dtype=dtype)
    valid = np.ones((t_steps, batch), dtype=bool) if m is None else m
    for layer in range(dims.L):
        if layer == 0:
            x = _f64(call.x)
        else:
            x = layer_x
            np.copyto(x, y, casting="unsafe")
            if call.dropout_masks:
                x *= call.dropout_masks[layer - 1]  # (F10) inverted dropout between layers
        y_next = np.zeros_like(y)
        for d in range(dims.D):
            k = layer * dims.D + d
            w_ih = _f64(call.params[dims.index(layer, d, W_IH)])
            w_hh = _f64(call.params[dims.index(layer, d, W_HH)])
            b_ih = b_hh = np.zeros(dims.G, dtype=F64)
            if dims.has_bias:
                b_ih = _f64(call.params[dims.index(layer, d, B_IH)])
                b_hh = _f64(call.params[dims.index(layer, d, B_HH)])
            h = np.zeros((batch, hidden)) if call.h0 is None else _f64(call.h0[k])
            c = np.zeros((batch, hidden)) if call.c0 is None else _f64(call.c0[k])
            acts = np.zeros((7, t_steps, batch, hidden))  # i, g, f, o, h, c, tanhc
            ys = np.zeros((t_steps, batch, hidden))
            for t in dims.time_order(d):
                mt = valid[t][:, None]
                a = x[t] @ w_ih.T + b_ih + h @ w_hh.T + b_hh  # (F1)
                a_i, a_f, a_g, a_o = _gates(a, hidden)
                i_t = _sigmoid(a_i)  # (F2)
                f_t = _sigmoid(a_f)  # (F3)
                g_t = np.tanh(a_g)  # (F4)
                o_t = _sigmoid(a_o)  # (F5)
                c_t = f_t * c + i_t * g_t  # (F6)
                tanhc_t = np.tanh(c_t)  # (F7)
                h_t = o_t * tanhc_t  # (F8)
                c = np.where(mt, c_t, c)  # (F9) a masked step carries the state
                h = np.where(mt, h_t, h)  # (F9)
                ys[t] = np.where(mt, h_t, 0.0)  # (F9) y is 0 at a masked step
                for n, v in enumerate((i_t, g_t, f_t, o_t)):
                    acts[n, t] = np.where(mt, v, 0.0)  # (F11) gates saved as 0 when masked
                acts[4, t], acts[5, t] = h, c  # (F11) states after step t (carried when masked)
                acts[6, t] = np.where(mt, tanhc_t, 0.0)  # (F11)
            for n in range(7):
                saved[n][k][...] = acts[n]  # rounding point (docs/math.md#rounding)
            hy[k], cy[k] = h, c
            y_next[..., d * hidden : (d + 1) * hidden] = ys
        y = y_next
    lists = [list(s) for s in saved]
    result_saved = None
    if call.train:
        lists_masks = call.dropout_masks if call.dropout > 0 else None
        result_saved = LstmSaved(
            lists[0], lists[1], lists[2], lists[3], lists[4], lists[5], lists[6], lists_masks
        )
    return y, hy, cy, result_saved


def lstm_backward(
    call: BackwardCall, arena: Arena | None = None
) -> tuple[np.ndarray | None, np.ndarray | None, np.ndarray | None, list[np.ndarray] | None]:
    """Backward of every (layer, direction), top layer first; time-major dx [T, B, I]."""
    arena = arena or Arena()
    dims, dtype = call.dims, call.dtype
    need_dx, need_dh, need_dc, need_dw = call.need
    if not any(call.need):
        return None, None, None, None
    t_steps, batch, hidden = dims.T, dims.B, dims.H
    dG, h_prev, c_prev, x_buf, dx_dirs, dy_below = arena.take_all(
        backward_workspace_slots(dims, dtype)
    )
    valid = np.ones((t_steps, batch), dtype=bool) if call.mask is None else call.mask
    s_i, s_g, s_f, s_o, s_h, s_c, s_tanhc = call.saved
    dh_prev = np.zeros((dims.K, batch, hidden), dtype=dtype)
    dc_prev = np.zeros((dims.K, batch, hidden), dtype=dtype)
    dparams = [np.zeros(p.shape, dtype=dtype) for p in call.params] if need_dw else None
    dy = call.dy  # gradient of this layer's output, storage dtype, [T, B, D*H] or None
    dx_out = None
    for layer in reversed(range(dims.L)):
        width = dims.layer_input_size(layer)
        want_dx = layer > 0 or need_dx
        x = x_buf[..., :width]
        if layer == 0:
            np.copyto(x, call.x, casting="unsafe")
        else:
            below = layer - 1
            for d in range(dims.D):
                np.copyto(
                    x[..., d * hidden : (d + 1) * hidden], s_h[below * dims.D + d], casting="unsafe"
                )
            if call.dropout_masks is not None:
                x *= call.dropout_masks[below]  # (F10) the input this layer saw
        x[...] = np.where(valid[..., None], x, 0.0)  # padding never reaches dW_ih
        for d in range(dims.D):
            k = layer * dims.D + d
            w_ih = _f64(call.params[dims.index(layer, d, W_IH)])
            w_hh = _f64(call.params[dims.index(layer, d, W_HH)])
            i_s, g_s, f_s, o_s = (_f64(s[k]) for s in (s_i, s_g, s_f, s_o))
            tanhc_s = _f64(s_tanhc[k])
            order = list(dims.time_order(d))
            # (B1) previous states: the state after the previous valid step, h0/c0 at the start
            hp = _f64(call.h0[k])
            cp = _f64(call.c0[k])
            for t in order:
                mt = valid[t][:, None]
                h_prev[t], c_prev[t] = hp, cp
                hp = np.where(mt, s_h[k][t], hp)
                cp = np.where(mt, s_c[k][t], cp)
            dh_next = np.zeros((batch, hidden)) if call.dh is None else _f64(call.dh[k])
            dc_next = np.zeros((batch, hidden)) if call.dc is None else _f64(call.dc[k])
            dy_d = None if dy is None else dy[..., d * hidden : (d + 1) * hidden]
            for step, t in enumerate(reversed(order)):
                mt = valid[t][:, None]
                dy_t = 0.0 if dy_d is None else np.where(mt, _f64(dy_d[t]), 0.0)
                i_t, g_t, f_t, o_t, tanhc_t = i_s[t], g_s[t], f_s[t], o_s[t], tanhc_s[t]
                dh_t = dy_t + dh_next  # (B2)
                dc_t = dh_t * o_t * (1.0 - tanhc_t**2) + dc_next  # (B3)
                d_o = dh_t * tanhc_t * o_t * (1.0 - o_t)  # (B4)
                d_g = dc_t * i_t * (1.0 - g_t**2)  # (B5)
                d_i = dc_t * g_t * i_t * (1.0 - i_t)  # (B6)
                d_f = dc_t * c_prev[t] * f_t * (1.0 - f_t)  # (B7)
                dG[t] = np.where(mt, np.concatenate([d_i, d_f, d_g, d_o], axis=1), 0.0)  # (B8)
                last = step == t_steps - 1
                if not last or need_dh:
                    dh_next = np.where(mt, dG[t] @ w_hh, dh_next)  # (B9)
                if not last or need_dc:
                    dc_next = np.where(mt, dc_t * f_t, dc_next)  # (B10)
            if need_dh:
                dh_prev[k] = dh_next  # (B16)
            if need_dc:
                dc_prev[k] = dc_next  # (B16)
            if want_dx:
                dx_d = dx_dirs[d, ..., :width]
                np.copyto(dx_d, dG @ w_ih, casting="unsafe")  # (B11) rounding point
            if dparams is not None:
                rows = t_steps * batch
                g2 = dG.reshape(rows, dims.G)
                dparams[dims.index(layer, d, W_IH)][...] = g2.T @ x.reshape(rows, width)  # (B12)
                dparams[dims.index(layer, d, W_HH)][...] = g2.T @ h_prev.reshape(
                    rows, hidden
                )  # (B13)
                if dims.has_bias:
                    db = g2.sum(axis=0)  # (B14)
                    dparams[dims.index(layer, d, B_IH)][...] = db
                    dparams[dims.index(layer, d, B_HH)][...] = db
        if want_dx:
            # (B15) the layer below receives the sum over directions (storage dtype) ...
            total = (
                dx_dirs[0, ..., :width]
                if dims.D == 1
                else dx_dirs[0, ..., :width] + dx_dirs[1, ..., :width]
            )
            if layer > 0:
                dy = dy_below
                np.copyto(dy, total)
                if call.dropout_masks is not None:
                    dy *= call.dropout_masks[layer - 1]  # (B15) ... through the dropout mask
            else:
                dx_out = np.array(total, dtype=dtype)
    return (
        dx_out,
        dh_prev if need_dh else None,
        dc_prev if need_dc else None,
        dparams,
    )
