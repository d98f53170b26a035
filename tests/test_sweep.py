"""Randomized sweep: the fused engine against the float64 reference and PyTorch autograd.

Hypothesis draws a case: T 0-5 (T = 1 included), B 0-4, I 0-5, H 1-5, 1-3 layers, uni- or
bidirectional, bias or not, dense (time-major or batch_first) or variable lengths with any
batch_sizes in [0, B] (rising and falling, zero-length sequences, steps with no active row),
h0/c0 given or None, dy/dh/dc given or None, an output_mask, storage float64, float32 or
float16, and how the inputs are passed: zeros as input, NaN at every padding position (input,
dy and the saved activations), non-contiguous strided views, torch tensors; and the execution
plan forced on the fused engine's calls (the safe one, whole step loops in one call, the other
recurrent methods and weight-gradient layouts, split step kernels, pair walks).

Checked on each case:

- forward: the fused output, hy, cy and the seven saved lists equal the reference's within
  test_fused.TOL (padding positions included: 0 / the carried state, never NaN); with torch
  tensors as input the results are tensors;
- backward: the fused engine and the reference, given the same saved activations, return the
  same outputs (None exactly where output_mask is False) within TOL;
- against PyTorch autograd in float64 (float64 and float32 storage): the fused forward's
  output, hy, cy and the fused backward's gradients, each sequence run alone through a float64
  ``torch.nn.LSTM`` on its active steps (that is the contract's meaning of any batch_sizes: a
  masked step is skipped, the state carried), with tolerance 1e-10 (float64) or 2e-5 (float32),
  relative to each output's largest magnitude.

The default (CI) profile runs a fixed set of examples (tests/conftest.py);
``test_sweep_long`` (marked slow) draws many more at random.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lstmgrad
from lstmgrad.planning.plan import forced
from test_fused import TOL  # noqa: E402  (tests/ is on sys.path)

torch = pytest.importorskip("torch")

from oracles import load_params, rel_err  # noqa: E402

SAVED = ("i", "g", "f", "o", "h", "c", "tanhc")
# execution plans forced on the fused engine's calls (those a call cannot run fall back)
PLANS = [
    {},
    {"walk": True},
    {"fwd_rec": "loop", "bwd_rec": "loop", "transpose_threads": 2},
    {"fwd_rec": "blas_t", "bwd_rec": "blas_t", "transpose_threads": 2},
    {"threads": 2, "split_min": 0},
    {"threads": 2, "pair_walks": True},
]
# against torch autograd in float64 (test_vs_torch: 1e-10 float64, 2e-5 float32 end to end)
TORCH_TOL = {np.float64: 1e-10, np.float32: 2e-5}


@st.composite
def cases(draw):
    T = draw(st.integers(0, 5))
    B = draw(st.integers(0, 4))
    layout = draw(st.sampled_from(["dense", "batch_first", "varlen"]))
    bs = None
    if layout == "varlen":  # any batch_sizes the contract allows: 0 <= bs[t] <= B
        bs = draw(st.lists(st.integers(0, B), min_size=T, max_size=T))
    # with batch sizes and no row (T = 0), the forward reads B from hx alone
    hx = draw(st.booleans()) or (layout == "varlen" and T == 0)
    return dict(
        T=T,
        B=B,
        I=draw(st.integers(0, 5)),
        H=draw(st.integers(1, 5)),
        L=draw(st.integers(1, 3)),
        D=draw(st.sampled_from([1, 2])),
        bias=draw(st.booleans()),
        layout=layout,
        bs=bs,
        dtype=draw(st.sampled_from([np.float64, np.float32, np.float16])),
        hx=hx,
        dy=draw(st.booleans()),
        dhc=draw(st.booleans()),
        mask=tuple(draw(st.booleans()) for _ in range(4)),
        zeros=draw(st.booleans()),
        nan_pad=draw(st.booleans()),
        strided=draw(st.booleans()),
        tensors=draw(st.booleans()),
        seed=draw(st.integers(0, 2**31 - 1)),
        plan=draw(st.sampled_from(PLANS)),
    )


def strided(a: np.ndarray) -> np.ndarray:
    """The same values in a non-contiguous view (every other element of the last axis)."""
    big = np.full(a.shape[:-1] + (2 * a.shape[-1],), np.nan, a.dtype)
    big[..., ::2] = a
    return big[..., ::2]


def to_layout(tm: np.ndarray, layout: str) -> np.ndarray:
    """A time-major [T, B, w] array in the call's layout."""
    if layout == "batch_first":
        return np.ascontiguousarray(tm.transpose(1, 0, 2))
    if layout == "varlen":
        return tm.reshape(tm.shape[0] * tm.shape[1], tm.shape[2])
    return tm


def from_layout(a: np.ndarray, layout: str, T: int, B: int) -> np.ndarray:
    if layout == "batch_first":
        return a.transpose(1, 0, 2)
    return a.reshape(T, B, a.shape[-1])


def as_numpy(value, tensors: bool):
    """A result as NumPy, after checking it is a tensor exactly when the inputs were."""
    if value is None:
        return None
    if isinstance(value, list):
        return [as_numpy(v, tensors) for v in value]
    assert isinstance(value, torch.Tensor) == tensors, type(value)
    return value.numpy() if tensors else value


def torch_rows(c, x_tm, params, h0, c0, dy_tm, dh, dc, active):
    """Autograd of float64 torch.nn.LSTM, each sequence b alone on its active steps (active[t,
    b]); loss = sum(y * dy) + sum(h_n * dh) + sum(c_n * dc). Time-major results, 0 at masked
    positions; h_n/c_n = h0/c0 for a sequence with no active step."""
    T, B, H, L, D = c["T"], c["B"], c["H"], c["L"], c["D"]
    width = max(c["I"], 1)  # torch needs input_size >= 1: a zero column stands in for I = 0
    lstm = torch.nn.LSTM(width, H, L, bias=c["bias"], bidirectional=D == 2, dtype=torch.float64)
    p64 = [np.asarray(p, np.float64) for p in params]
    if c["I"] == 0:
        per_dir = 4 if c["bias"] else 2
        for d in range(D):
            p64[d * per_dir] = np.zeros((4 * H, 1))
    load_params(lstm, p64)
    weights = list(lstm._flat_weights)
    y = np.zeros((T, B, D * H))
    dx = np.zeros((T, B, c["I"]))
    hn, cn, dh0, dc0 = h0.copy(), c0.copy(), dh.copy(), dc.copy()
    dparams = [np.zeros(p.shape) for p in params]
    for b in range(B):
        steps = np.flatnonzero(active[:, b])
        if steps.size == 0:
            continue
        xb = np.zeros((steps.size, 1, width))
        xb[:, 0, : c["I"]] = x_tm[steps, b]
        xt = torch.tensor(xb, requires_grad=True)
        h0t = torch.tensor(h0[:, b : b + 1], requires_grad=True)
        c0t = torch.tensor(c0[:, b : b + 1], requires_grad=True)
        out, (h_n, c_n) = lstm(xt, (h0t, c0t))
        loss = (out[:, 0] * torch.tensor(dy_tm[steps, b])).sum()
        loss = loss + (h_n[:, 0] * torch.tensor(dh[:, b])).sum()
        loss = loss + (c_n[:, 0] * torch.tensor(dc[:, b])).sum()
        grads = torch.autograd.grad(loss, [xt, h0t, c0t, *weights], allow_unused=True)
        y[steps, b] = out[:, 0].detach().numpy()
        hn[:, b], cn[:, b] = h_n[:, 0].detach().numpy(), c_n[:, 0].detach().numpy()
        dx[steps, b] = grads[0][:, 0, : c["I"]].numpy()
        dh0[:, b], dc0[:, b] = grads[1][:, 0].numpy(), grads[2][:, 0].numpy()
        for j, g in enumerate(grads[3:]):
            if g is not None:  # [:, :0] of the stand-in column where I = 0
                dparams[j] += g.numpy() if g.shape == dparams[j].shape else g.numpy()[:, :0]
    return y, hn, cn, dx, dh0, dc0, dparams


def check_case(c) -> None:
    T, B, I, H, L, D = c["T"], c["B"], c["I"], c["H"], c["L"], c["D"]
    dtype, layout = c["dtype"], c["layout"]
    rng = np.random.default_rng(c["seed"])
    K = L * D
    params = []
    for layer in range(L):
        for _ in range(D):
            w_in = I if layer == 0 else D * H
            shapes = [(4 * H, w_in), (4 * H, H)] + ([(4 * H,), (4 * H,)] if c["bias"] else [])
            params += [rng.uniform(-0.6, 0.6, s).astype(dtype) for s in shapes]
    x_tm = np.zeros((T, B, I), dtype) if c["zeros"] else rng.standard_normal((T, B, I))
    x_tm = x_tm.astype(dtype)
    h0 = rng.standard_normal((K, B, H)).astype(dtype) if c["hx"] else np.zeros((K, B, H), dtype)
    c0 = rng.standard_normal((K, B, H)).astype(dtype) if c["hx"] else np.zeros((K, B, H), dtype)
    dy_tm = rng.standard_normal((T, B, D * H)).astype(dtype)
    dh = rng.standard_normal((K, B, H)).astype(dtype)
    dc = rng.standard_normal((K, B, H)).astype(dtype)
    if not c["dy"]:
        dy_tm[...] = 0
    if not c["dhc"]:
        dh[...] = 0
        dc[...] = 0
    bs = None if c["bs"] is None else np.array(c["bs"], np.int64)
    active = np.ones((T, B), bool) if bs is None else np.arange(B)[None, :] < bs[:, None]
    kw = dict(num_layers=L, bidirectional=D == 2, has_bias=c["bias"])
    kw["batch_first"] = layout == "batch_first"

    # the oracle's clean inputs, in the call's layout
    x = to_layout(x_tm, layout)
    dy = to_layout(dy_tm, layout)
    hx = [h0, c0]
    ref_f = lstmgrad.lstm_forward(x, params, hx if c["hx"] else None, bs, impl="reference", **kw)

    # what the fused engine is given: NaN at padding, strided views, tensors
    def dirty(a_tm: np.ndarray) -> np.ndarray:
        a_tm = a_tm.copy()
        if c["nan_pad"]:
            a_tm[~active] = np.nan
        return a_tm

    fx, fdy = to_layout(dirty(x_tm), layout), to_layout(dirty(dy_tm), layout)
    fsaved = [[dirty(a) for a in lst] for lst in ref_f.saved[:7]]
    fparams, fhx = list(params), [h0, c0]
    if c["strided"]:
        fx, fdy = strided(fx), strided(fdy)
        fparams = [strided(p) for p in fparams]
        fhx = [strided(a) for a in fhx]
        fsaved = [[strided(a) for a in lst] for lst in fsaved]
    fbs = bs
    if c["tensors"]:

        def tt(a):
            return torch.from_numpy(a)

        fx, fdy, fparams, fhx = tt(fx), tt(fdy), [tt(p) for p in fparams], [tt(a) for a in fhx]
        fsaved = [[tt(a) for a in lst] for lst in fsaved]
        fbs = None if bs is None else tt(bs)

    # forward: fused vs reference
    with forced(**c["plan"]):
        got_f = lstmgrad.lstm_forward(fx, fparams, fhx if c["hx"] else None, fbs, **kw)
    tol = TOL[dtype]
    out = as_numpy(got_f.output, c["tensors"])
    hy, cy = as_numpy(got_f.hy, c["tensors"]), as_numpy(got_f.cy, c["tensors"])
    for name, g, w in (("output", out, ref_f.output), ("hy", hy, ref_f.hy), ("cy", cy, ref_f.cy)):
        assert g.dtype == w.dtype and g.shape == w.shape, name
        assert not np.isnan(g).any(), name
        assert rel_err(g, w) <= tol, (name, rel_err(g, w))
    for name, lg, lw in zip(SAVED, got_f.saved[:7], ref_f.saved[:7], strict=True):
        for k, (g, w) in enumerate(zip(as_numpy(lg, c["tensors"]), lw, strict=True)):
            assert rel_err(g, w) <= tol, (name, k, rel_err(g, w))

    # backward: fused vs reference on the same saved activations
    fdh = dh if c["dhc"] else None
    fdc = dc if c["dhc"] else None
    if c["strided"] and fdh is not None:
        fdh, fdc = strided(fdh), strided(fdc)
    if c["tensors"] and fdh is not None:
        fdh, fdc = torch.from_numpy(fdh), torch.from_numpy(fdc)
    with forced(**c["plan"]):
        got_b = lstmgrad.lstm_backward(
            fx, fhx, fparams, fdy if c["dy"] else None, fdh, fdc, *fsaved, fbs,
            output_mask=c["mask"], **kw,
        )  # fmt: skip
    want_b = lstmgrad.lstm_backward(
        x, hx, params, dy if c["dy"] else None, dh if c["dhc"] else None,
        dc if c["dhc"] else None, *ref_f.saved[:7], bs, output_mask=c["mask"], impl="reference",
        **kw,
    )  # fmt: skip
    got = [as_numpy(v, c["tensors"]) for v in got_b]
    for name, g, w in zip(("dx", "dh_prev", "dc_prev"), got[:3], want_b[:3], strict=True):
        assert (g is None) == (w is None), name
        if w is not None:
            assert g.dtype == w.dtype and g.shape == w.shape, name
            assert not np.isnan(g).any(), name
            assert rel_err(g, w) <= tol, (name, rel_err(g, w))
    assert (got[3] is None) == (want_b.dparams is None)
    if want_b.dparams is not None:
        for j, (g, w) in enumerate(zip(got[3], want_b.dparams, strict=True)):
            assert g.dtype == w.dtype and g.shape == w.shape, j
            assert rel_err(g, w) <= tol, (j, rel_err(g, w))

    # fused (forward and backward) vs torch autograd in float64
    if dtype == np.float16:
        return
    f64 = [np.asarray(a, np.float64) for a in (x_tm, h0, c0, dy_tm, dh, dc)]
    y, hn, cn, dx, dh0, dc0, dps = torch_rows(c, f64[0], params, *f64[1:], active)
    ttol = TORCH_TOL[dtype]
    y_got = from_layout(out, layout, T, B)
    for name, g, w in (("output", y_got, y), ("hy", hy, hn), ("cy", cy, cn)):
        assert rel_err(g, w) <= ttol, ("torch", name, rel_err(g, w))
    if got[0] is not None:
        dx_got = from_layout(got[0], layout, T, B)
        assert rel_err(dx_got, dx) <= ttol, ("torch dx", rel_err(dx_got, dx))
    for name, g, w in (("dh_prev", got[1], dh0), ("dc_prev", got[2], dc0)):
        if g is not None:
            assert rel_err(g, w) <= ttol, ("torch", name, rel_err(g, w))
    if got[3] is not None:
        for j, (g, w) in enumerate(zip(got[3], dps, strict=True)):
            assert rel_err(g, w) <= ttol, ("torch dparams", j, rel_err(g, w))


@given(cases())
def test_sweep(case):
    check_case(case)


@pytest.mark.slow
@settings(settings.get_profile("slow"))
@given(cases())
def test_sweep_long(case):
    check_case(case)
