"""Infinite inputs: the outputs and every gradient hold NaN, +Inf and -Inf where torch.nn.LSTM's
autograd does (the same weights, torch's float32 or float64), with either engine and any plan.

An infinite entry of x makes its row's gate pre-activations infinite; sigmoid(-inf) must be 0
exactly (not the smallest value the float32 exp reaches), so that the gate's derivative is 0 and
dW_ih = dG^T x holds 0 * inf = NaN in the entry's column, as torch's does.
"""

from __future__ import annotations

import numpy as np
import pytest

import lstmgrad
from lstmgrad.planning import plan

torch = pytest.importorskip("torch")

T, B, I, H = 4, 3, 5, 6


def _torch_lstm(params, x, h0, c0, dy, dh, dc, layers, bidirectional):
    """torch.nn.LSTM's output, h_n, c_n and the gradients of sum(y dy) + sum(h_n dh) + sum(c_n
    dc) w.r.t. x, h0, c0 and every parameter, in x's dtype."""
    dtype = torch.from_numpy(x).dtype
    lstm = torch.nn.LSTM(I, H, layers, bidirectional=bidirectional, dtype=dtype)
    with torch.no_grad():
        for w, p in zip(lstm._flat_weights, params, strict=True):
            w.copy_(torch.from_numpy(p))
    xt, h0t, c0t = (torch.from_numpy(a.copy()).requires_grad_() for a in (x, h0, c0))
    y, (hn, cn) = lstm(xt, (h0t, c0t))
    loss = (y * torch.from_numpy(dy)).sum() + (hn * torch.from_numpy(dh)).sum()
    loss = loss + (cn * torch.from_numpy(dc)).sum()
    grads = torch.autograd.grad(loss, [xt, h0t, c0t, *lstm._flat_weights])
    return [a.detach().numpy() for a in (y, hn, cn, *grads)]


def _kinds(a):
    """Each entry as NaN, +Inf, -Inf or finite."""
    return np.where(np.isnan(a), "nan", np.where(np.isposinf(a), "+inf",
                                                 np.where(np.isneginf(a), "-inf", "finite")))  # fmt: skip


PLANS = {"safe": {}, "walk": {"walk": True}, "pair_walks": {"pair_walks": True, "threads": 2},
         "loop": {"fwd_rec": "loop", "bwd_rec": "loop"}}  # fmt: skip


@pytest.mark.parametrize("opposite", [False, True], ids=["one-per-row", "opposite-in-a-row"])
@pytest.mark.parametrize("impl_plan", ["reference", *PLANS])
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("layers, bidirectional", [(1, False), (2, True)], ids=["L1", "L2-bi"])
def test_infinite_inputs_give_torchs_nan_and_inf(impl_plan, dtype, layers, bidirectional,
                                                 opposite):  # fmt: skip
    """One infinite entry per row of x (each gate pre-activation of the row infinite), or
    also a row with +Inf and -Inf (NaN pre-activations, which reach every column of dW_ih)."""
    rng = np.random.default_rng(7)
    d = 2 if bidirectional else 1
    params = []
    for layer in range(layers):
        for _ in range(d):
            width = I if layer == 0 else d * H
            params += [rng.uniform(-0.5, 0.5, s).astype(dtype)
                       for s in [(4 * H, width), (4 * H, H), (4 * H,), (4 * H,)]]  # fmt: skip
    x = rng.standard_normal((T, B, I)).astype(dtype)
    x[1, 0, 2] = np.inf
    x[2, 1, 3] = -np.inf
    if opposite:
        x[3, 2, 0], x[3, 2, 4] = np.inf, -np.inf
    h0, c0 = (rng.standard_normal((layers * d, B, H)).astype(dtype) for _ in range(2))
    dy = rng.standard_normal((T, B, d * H)).astype(dtype)
    dh, dc = (rng.standard_normal(h0.shape).astype(dtype) for _ in range(2))
    want = _torch_lstm(params, x, h0, c0, dy, dh, dc, layers, bidirectional)
    impl = "reference" if impl_plan == "reference" else "fused"
    kw = dict(num_layers=layers, bidirectional=bidirectional, impl=impl)
    with plan.forced(**PLANS.get(impl_plan, {})):
        with np.errstate(invalid="ignore", over="ignore"):
            fwd = lstmgrad.lstm_forward(x, params, [h0, c0], **kw)
            grads = lstmgrad.lstm_backward(x, [h0, c0], params, dy, dh, dc, *fwd.saved[:7], **kw)
    got = [fwd.output, fwd.hy, fwd.cy, grads.dx, grads.dh_prev, grads.dc_prev, *grads.dparams]
    names = ["output", "hy", "cy", "dx", "dh_prev", "dc_prev"]
    names += [f"dparams[{j}]" for j in range(len(params))]
    # the case reaches dW_ih: NaN columns (0 * inf), finite ones where no row is infinite
    assert np.isnan(want[6]).any() and (opposite or np.isfinite(want[6]).any())
    for name, a, b in zip(names, got, want, strict=True):
        assert np.array_equal(_kinds(a), _kinds(b)), name
        finite = np.isfinite(b)
        scale = max(float(np.abs(b[finite]).max(initial=0.0)), 1.0)
        tol = 1e-4 if dtype == np.float32 else 1e-10
        assert np.abs(a[finite] - b[finite]).max(initial=0.0) <= tol * scale, name
