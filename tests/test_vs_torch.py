"""lstmgrad.lstm_forward / lstm_backward against PyTorch autograd, finite differences and the
contract's documented properties (docs/contract.md, docs/math.md)."""

from __future__ import annotations

import functools
import itertools
import math

import numpy as np
import pytest

import lstmgrad

torch = pytest.importorskip("torch")

from oracles import (  # noqa: E402
    batch_sizes_of,
    make_lstm,
    rel_err,
    sorted_lengths,
    torch_dropout_lstm_grads,
    torch_lstm_grads,
)

F64 = np.float64
SAVED = ("i", "g", "f", "o", "h", "c", "tanhc")


@pytest.fixture(autouse=True, params=["reference", "fused"])
def impl(request, monkeypatch):
    """Every test here runs on both engines: the float64 reference (the oracle of the faster
    engines) and the default fused engine."""
    for name in ("lstm_forward", "lstm_backward"):
        api_fn = getattr(lstmgrad.ops.api, name)
        monkeypatch.setattr(lstmgrad, name, functools.partial(api_fn, impl=request.param))
    return request.param


# ---------------------------------------------------------------------------------------------
# helpers


def cfg(num_layers=1, num_dirs=1, has_bias=True, batch_first=False, **extra):
    return dict(
        num_layers=num_layers,
        bidirectional=num_dirs == 2,
        has_bias=has_bias,
        batch_first=batch_first,
        **extra,
    )


def run_both(x, hx, params, dy, dh, dc, bs=None, *, output_mask=None, seed=None, **kw):
    """lstm_forward(train=True) then lstm_backward on its saved activations."""
    fw = lstmgrad.lstm_forward(x, params, hx, bs, train=True, seed=seed, **kw)
    bw = lstmgrad.lstm_backward(
        x,
        hx,
        params,
        dy,
        dh,
        dc,
        *fw.saved[:7],
        bs,
        train=True,
        output_mask=output_mask,
        dropout_masks=fw.saved.dropout_masks,
        **kw,
    )
    return fw, bw


def random_case(T, B, I, H, L, D, bias, bf, varlen, seed, scale=0.5):
    """A random problem in lstmgrad's layout, with the matching float64 torch module."""
    rng = np.random.default_rng(1000 + seed)
    lstm, params = make_lstm(
        I,
        H,
        L,
        bias=bias,
        bidirectional=D == 2,
        batch_first=bf and not varlen,
        seed=seed,
        scale=scale,
    )
    lengths = bs = None
    if varlen:
        lengths = sorted_lengths(T, B, rng)
        bs = batch_sizes_of(lengths)
        x = rng.standard_normal((T * B, I))
        dy = rng.standard_normal((T * B, D * H))
    elif bf:
        x = rng.standard_normal((B, T, I))
        dy = rng.standard_normal((B, T, D * H))
    else:
        x = rng.standard_normal((T, B, I))
        dy = rng.standard_normal((T, B, D * H))
    hx = [rng.standard_normal((L * D, B, H)) for _ in range(2)]
    dh = rng.standard_normal((L * D, B, H))
    dc = rng.standard_normal((L * D, B, H))
    return dict(lstm=lstm, params=params, x=x, hx=hx, dy=dy, dh=dh, dc=dc, bs=bs, lengths=lengths)


def assert_close(actual, expected, tol, what):
    assert actual.shape == expected.shape, (what, actual.shape, expected.shape)
    err = rel_err(actual, expected)
    assert err <= tol, f"{what}: relative error {err:.3e} > {tol:.1e}"


def assert_grads_close(bw, ref, tol):
    assert_close(bw.dx, ref.dx, tol, "dx")
    assert_close(bw.dh_prev, ref.dh0, tol, "dh_prev")
    assert_close(bw.dc_prev, ref.dc0, tol, "dc_prev")
    assert len(bw.dparams) == len(ref.dparams)
    for j, (a, b) in enumerate(zip(bw.dparams, ref.dparams, strict=True)):
        assert_close(a, b, tol, f"dparams[{j}]")


def fwd_loss(x, hx, params, dy, dh, dc, bs, kw):
    fw = lstmgrad.lstm_forward(x, params, hx, bs, train=False, **kw)
    return float(np.sum(fw.output * dy) + np.sum(fw.hy * dh) + np.sum(fw.cy * dc))


def finite_differences(x, hx, params, dy, dh, dc, bs, kw, eps=1e-6):
    """Central differences of the forward's loss w.r.t. x, h0, c0 and every param."""
    x = x.copy()
    hx = [a.copy() for a in hx]
    params = [p.copy() for p in params]
    out = []
    for arr in [x, hx[0], hx[1], *params]:
        g = np.zeros_like(arr)
        flat, gflat = arr.reshape(-1), g.reshape(-1)
        for n in range(flat.size):
            keep = flat[n]
            flat[n] = keep + eps
            lp = fwd_loss(x, hx, params, dy, dh, dc, bs, kw)
            flat[n] = keep - eps
            lm = fwd_loss(x, hx, params, dy, dh, dc, bs, kw)
            flat[n] = keep
            gflat[n] = (lp - lm) / (2 * eps)
        out.append(g)
    return out


def assert_fd_close(bw, fd, tol=1e-7):
    names = ["dx", "dh_prev", "dc_prev"] + [f"dparams[{j}]" for j in range(len(fd) - 3)]
    got = [bw.dx, bw.dh_prev, bw.dc_prev, *bw.dparams]
    for name, a, b in zip(names, got, fd, strict=True):
        assert a.shape == b.shape, name
        err = np.max(np.abs(a - b)) / max(1.0, float(np.max(np.abs(b)))) if a.size else 0.0
        assert err <= tol, f"{name}: finite-difference mismatch {err:.3e}"


# ---------------------------------------------------------------------------------------------
# 1. the grid against torch autograd

GRID = list(itertools.product([True, False], [2, 1], [True, False], [1, 2, 3], [False, True]))


def _grid_id(p):
    bias, D, bf, L, varlen = p
    return (
        f"T5-B3-I4-H6-L{L}-D{D}-{'bias' if bias else 'nobias'}-{'bf' if bf else 'tb'}-"
        f"{'varlen' if varlen else 'dense'}"
    )


@pytest.mark.parametrize("bias,D,bf,L,varlen", GRID, ids=[_grid_id(p) for p in GRID])
def test_grid_vs_torch(bias, D, bf, L, varlen):
    T, B, I, H = 5, 3, 4, 6
    seed = 8 * L + 4 * D + 2 * bf + varlen + (100 if bias else 0)
    c = random_case(T, B, I, H, L, D, bias, bf, varlen, seed)
    kw = cfg(L, D, bias, bf)  # batch_first is passed also in varlen mode, where it is ignored
    fw, bw = run_both(c["x"], c["hx"], c["params"], c["dy"], c["dh"], c["dc"], c["bs"], **kw)
    ref = torch_lstm_grads(
        c["lstm"], c["x"], c["hx"][0], c["hx"][1], c["dy"], c["dh"], c["dc"], c["lengths"]
    )
    if varlen:
        np.testing.assert_array_equal(c["bs"], ref.batch_sizes)
    assert_close(fw.output, ref.output, 1e-12, "output")
    assert_close(fw.hy, ref.h_n, 1e-12, "hy")
    assert_close(fw.cy, ref.c_n, 1e-12, "cy")
    assert_grads_close(bw, ref, 1e-10)
    # saved activations: L*D arrays [T, B, H], time-major whatever the layout
    for name in SAVED:
        lst = getattr(fw.saved, name)
        assert len(lst) == L * D
        assert all(a.shape == (T, B, H) and a.dtype == F64 for a in lst)
    assert fw.saved.dropout_masks is None


def test_saved_activations_meaning():
    """Saved activations: gates post-activation, h/c after step t, tanhc = tanh(c), reverse by
    real time."""
    T, B, I, H = 4, 2, 3, 5
    c = random_case(T, B, I, H, 1, 2, True, False, False, 7)
    fw = lstmgrad.lstm_forward(c["x"], c["params"], c["hx"], bidirectional=True)
    s = fw.saved
    for k in range(2):
        np.testing.assert_allclose(s.tanhc[k], np.tanh(s.c[k]), rtol=0, atol=1e-15)
        np.testing.assert_allclose(s.h[k], s.o[k] * s.tanhc[k], rtol=0, atol=1e-15)
        order = range(T) if k == 0 else range(T - 1, -1, -1)
        prev = c["hx"][1][k]
        for t in order:
            np.testing.assert_allclose(
                s.c[k][t], s.f[k][t] * prev + s.i[k][t] * s.g[k][t], rtol=0, atol=1e-14
            )
            prev = s.c[k][t]
        np.testing.assert_array_equal(fw.output[..., k * H : (k + 1) * H], s.h[k])
    np.testing.assert_array_equal(fw.hy[0], s.h[0][T - 1])
    np.testing.assert_array_equal(fw.hy[1], s.h[1][0])
    np.testing.assert_array_equal(fw.cy[1], s.c[1][0])


# ---------------------------------------------------------------------------------------------
# 2. finite differences of lstm_forward itself


def test_finite_differences_dense():
    T, B, I, H, L, D = 3, 2, 3, 2, 2, 2
    c = random_case(T, B, I, H, L, D, True, False, False, 11, scale=0.8)
    kw = cfg(L, D, True)
    _, bw = run_both(c["x"], c["hx"], c["params"], c["dy"], c["dh"], c["dc"], **kw)
    fd = finite_differences(c["x"], c["hx"], c["params"], c["dy"], c["dh"], c["dc"], None, kw)
    assert_fd_close(bw, fd)


def test_finite_differences_varlen():
    T, B, I, H, L, D = 3, 3, 2, 2, 2, 2
    c = random_case(T, B, I, H, L, D, True, False, True, 12, scale=0.8)
    bs = np.array([3, 2, 1], dtype=np.int64)
    kw = cfg(L, D, True)
    _, bw = run_both(c["x"], c["hx"], c["params"], c["dy"], c["dh"], c["dc"], bs, **kw)
    fd = finite_differences(c["x"], c["hx"], c["params"], c["dy"], c["dh"], c["dc"], bs, kw)
    assert_fd_close(bw, fd)


# ---------------------------------------------------------------------------------------------
# 3. The documented sample

SAMPLE_TOL = {np.float16: 1e-3, np.float32: 1e-7, np.float64: 1e-7}


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64], ids=lambda d: d.__name__)
def test_spec11_backward_sample(dtype):
    one = lambda *s: np.ones(s, dtype=dtype)  # noqa: E731
    params = [one(32, 8), one(32, 8), one(32), one(32)]
    act = [one(1, 1, 8)]
    tanhc = np.full((1, 1, 8), math.tanh(1.0), dtype=dtype)
    bw = lstmgrad.lstm_backward(
        one(1, 1, 8),
        [one(1, 1, 8), one(1, 1, 8)],
        params,
        one(1, 1, 8),
        one(1, 1, 8),
        one(1, 1, 8),
        act,
        act,
        act,
        act,
        act,
        act,
        [tanhc],
    )
    assert bw.dx.dtype == dtype and bw.dc_prev.dtype == dtype
    for name, a in [
        ("dx", bw.dx),
        ("dh_prev", bw.dh_prev),
        *((f"dparams[{j}]", p) for j, p in enumerate(bw.dparams)),
    ]:
        assert np.all(a == 0), name
    assert [p.shape for p in bw.dparams] == [(32, 8), (32, 8), (32,), (32,)]
    assert bw.dc_prev.shape == (1, 1, 8)
    np.testing.assert_allclose(
        bw.dc_prev.astype(F64), np.full((1, 1, 8), 1.8399487), rtol=0, atol=SAMPLE_TOL[dtype]
    )
    if dtype is np.float64:
        t = float(tanhc[0, 0, 0])
        assert np.all(bw.dc_prev == 1 + 2 * (1 - t**2))


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64], ids=lambda d: d.__name__)
def test_spec11_forward_sample(dtype):
    x = np.ones((1, 1, 1), dtype=dtype)
    params = [np.ones((4, 1), dtype=dtype), np.ones((4, 1), dtype=dtype)]
    fw = lstmgrad.lstm_forward(x, params, None, has_bias=False)
    tol = SAMPLE_TOL[dtype]
    assert fw.output.dtype == dtype and fw.hy.dtype == dtype and fw.cy.dtype == dtype
    assert abs(float(fw.output[0, 0, 0]) - 0.3696064) <= tol
    assert abs(float(fw.hy[0, 0, 0]) - 0.3696064) <= tol
    assert abs(float(fw.cy[0, 0, 0]) - 0.5567699) <= tol


# ---------------------------------------------------------------------------------------------
# 4. variable lengths


def _flat_rows(T, B, b, length):
    return [t * B + b for t in range(length)]


@pytest.mark.parametrize("L,D", [(1, 1), (1, 2), (2, 2)], ids=["L1-D1", "L1-D2", "L2-D2"])
def test_varlen_equals_each_sequence_alone(L, D):
    T, B, I, H = 6, 4, 3, 5
    c = random_case(T, B, I, H, L, D, True, False, True, 20 + L * D)
    lengths = np.array([6, 4, 4, 1])
    bs = batch_sizes_of(lengths)
    kw = cfg(L, D, True)
    fw, bw = run_both(c["x"], c["hx"], c["params"], c["dy"], c["dh"], c["dc"], bs, **kw)
    dparams_sum = [np.zeros_like(p) for p in c["params"]]
    for b, n in enumerate(lengths):
        rows = _flat_rows(T, B, b, n)
        xs = c["x"][rows][:, None, :]
        dys = c["dy"][rows][:, None, :]
        hxs = [a[:, b : b + 1] for a in c["hx"]]
        fws, bws = run_both(
            xs, hxs, c["params"], dys, c["dh"][:, b : b + 1], c["dc"][:, b : b + 1], **kw
        )
        assert_close(fw.output[rows], fws.output[:, 0], 1e-12, f"output of sequence {b}")
        assert_close(fw.hy[:, b], fws.hy[:, 0], 1e-12, f"hy of sequence {b}")
        assert_close(fw.cy[:, b], fws.cy[:, 0], 1e-12, f"cy of sequence {b}")
        assert_close(bw.dx[rows], bws.dx[:, 0], 1e-10, f"dx of sequence {b}")
        pad = [t * B + b for t in range(n, T)]
        assert np.all(bw.dx[pad] == 0) and np.all(fw.output[pad] == 0)
        assert_close(bw.dh_prev[:, b], bws.dh_prev[:, 0], 1e-10, f"dh_prev of sequence {b}")
        assert_close(bw.dc_prev[:, b], bws.dc_prev[:, 0], 1e-10, f"dc_prev of sequence {b}")
        for acc, p in zip(dparams_sum, bws.dparams, strict=True):
            acc += p
    for j, (a, b) in enumerate(zip(bw.dparams, dparams_sum, strict=True)):
        assert_close(a, b, 1e-10, f"dparams[{j}]")


def _padded(bs, B):
    """(t, b) pairs of the masked positions and the flat rows t*B + b."""
    pos = [(t, b) for t in range(len(bs)) for b in range(B) if b >= bs[t]]
    return pos, [t * B + b for t, b in pos]


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")
@pytest.mark.parametrize("L,D", [(1, 1), (2, 2)], ids=["L1-D1", "L2-D2"])
def test_varlen_nan_in_padding_changes_nothing(L, D):
    T, B, I, H = 5, 3, 3, 4
    c = random_case(T, B, I, H, L, D, True, False, True, 30 + L)
    bs = np.array([3, 3, 2, 1, 1], dtype=np.int64)
    kw = cfg(L, D, True)
    fw, bw = run_both(c["x"], c["hx"], c["params"], c["dy"], c["dh"], c["dc"], bs, **kw)
    pos, rows = _padded(bs, B)
    assert rows
    x_nan, dy_nan = c["x"].copy(), c["dy"].copy()
    x_nan[rows] = np.nan
    dy_nan[rows] = np.nan
    fw2 = lstmgrad.lstm_forward(x_nan, c["params"], c["hx"], bs, **kw)
    for a, b in [(fw.output, fw2.output), (fw.hy, fw2.hy), (fw.cy, fw2.cy)]:
        np.testing.assert_array_equal(a, b)
    for name in SAVED:
        for a, b in zip(getattr(fw.saved, name), getattr(fw2.saved, name), strict=True):
            np.testing.assert_array_equal(a, b, err_msg=name)
    saved_nan = []
    for name in SAVED:
        lst = [a.copy() for a in getattr(fw.saved, name)]
        for a in lst:
            for t, b in pos:
                a[t, b] = np.nan
        saved_nan.append(lst)
    bw2 = lstmgrad.lstm_backward(
        x_nan, c["hx"], c["params"], dy_nan, c["dh"], c["dc"], *saved_nan, bs, **kw
    )
    got = [bw2.dx, bw2.dh_prev, bw2.dc_prev, *bw2.dparams]
    want = [bw.dx, bw.dh_prev, bw.dc_prev, *bw.dparams]
    for a, b in zip(got, want, strict=True):
        assert not np.isnan(a).any()
        np.testing.assert_array_equal(a, b)


ODD_BATCH_SIZES = {
    "2-3-1": [2, 3, 1],  # not non-increasing
    "0-3-2-0": [0, 3, 2, 0],  # steps where nothing runs, at both ends
    "1-0-1": [1, 0, 1],  # sequences 1 and 2 never run, sequence 0 has a hole
}


@pytest.mark.parametrize("bs_list", ODD_BATCH_SIZES.values(), ids=ODD_BATCH_SIZES.keys())
def test_varlen_unusual_batch_sizes(bs_list):
    """batch_sizes that PyTorch never produces are accepted; checked against finite
    differences of the forward and against torch running each sequence over its active steps
    only (a masked step carries the state)."""
    bs = np.array(bs_list, dtype=np.int64)
    T, B, I, H, L, D = len(bs), 3, 2, 2, 2, 2
    c = random_case(T, B, I, H, L, D, True, False, True, 40 + T, scale=0.8)
    kw = cfg(L, D, True)
    fw, bw = run_both(c["x"], c["hx"], c["params"], c["dy"], c["dh"], c["dc"], bs, **kw)
    fd = finite_differences(c["x"], c["hx"], c["params"], c["dy"], c["dh"], c["dc"], bs, kw)
    assert_fd_close(bw, fd)
    mask = np.arange(B)[None, :] < bs[:, None]
    dparams_sum = [np.zeros_like(p) for p in c["params"]]
    for b in range(B):
        rows = [t * B + b for t in range(T) if mask[t, b]]
        pad = [t * B + b for t in range(T) if not mask[t, b]]
        assert np.all(bw.dx[pad] == 0) and np.all(fw.output[pad] == 0)
        if not rows:  # never runs: identity
            np.testing.assert_array_equal(fw.hy[:, b], c["hx"][0][:, b])
            np.testing.assert_array_equal(fw.cy[:, b], c["hx"][1][:, b])
            np.testing.assert_array_equal(bw.dh_prev[:, b], c["dh"][:, b])
            np.testing.assert_array_equal(bw.dc_prev[:, b], c["dc"][:, b])
            continue
        ref = torch_lstm_grads(
            c["lstm"],
            c["x"][rows][:, None],
            c["hx"][0][:, b : b + 1],
            c["hx"][1][:, b : b + 1],
            c["dy"][rows][:, None],
            c["dh"][:, b : b + 1],
            c["dc"][:, b : b + 1],
        )
        assert_close(fw.output[rows], ref.output[:, 0], 1e-12, "output")
        assert_close(fw.hy[:, b], ref.h_n[:, 0], 1e-12, "hy")
        assert_close(fw.cy[:, b], ref.c_n[:, 0], 1e-12, "cy")
        assert_close(bw.dx[rows], ref.dx[:, 0], 1e-10, "dx")
        assert_close(bw.dh_prev[:, b], ref.dh0[:, 0], 1e-10, "dh_prev")
        assert_close(bw.dc_prev[:, b], ref.dc0[:, 0], 1e-10, "dc_prev")
        for acc, p in zip(dparams_sum, ref.dparams, strict=True):
            acc += p
    for j, (a, b) in enumerate(zip(bw.dparams, dparams_sum, strict=True)):
        assert_close(a, b, 1e-10 if b.any() else 0.0, f"dparams[{j}]")


# ---------------------------------------------------------------------------------------------
# 5. dropout


@pytest.mark.parametrize("D,bf", [(1, False), (2, False), (2, True)], ids=["D1", "D2", "D2-bf"])
def test_dropout_vs_torch(D, bf):
    T, B, I, H, L, p = 5, 3, 4, 5, 3, 0.4
    c = random_case(T, B, I, H, L, D, True, bf, False, 50 + D)
    kw = cfg(L, D, True, bf, dropout=p)
    fw, bw = run_both(c["x"], c["hx"], c["params"], c["dy"], c["dh"], c["dc"], seed=123, **kw)
    masks = fw.saved.dropout_masks
    assert isinstance(masks, list) and len(masks) == L - 1
    for m in masks:
        assert m.shape == (T, B, D * H) and m.dtype == F64
        assert set(np.unique(m)) <= {0.0, 1.0 / (1.0 - p)}
        assert (m == 0).any() and (m != 0).any()
    fw_again = lstmgrad.lstm_forward(c["x"], c["params"], c["hx"], seed=123, **kw)
    for a, b in zip(masks, fw_again.saved.dropout_masks, strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(fw.output, fw_again.output)
    ref = torch_dropout_lstm_grads(
        c["params"],
        c["x"],
        c["hx"][0],
        c["hx"][1],
        c["dy"],
        c["dh"],
        c["dc"],
        masks,
        num_layers=L,
        bidirectional=D == 2,
        has_bias=True,
        batch_first=bf,
    )
    assert_close(fw.output, ref.output, 1e-12, "output")
    assert_close(fw.hy, ref.h_n, 1e-12, "hy")
    assert_close(fw.cy, ref.c_n, 1e-12, "cy")
    assert_grads_close(bw, ref, 1e-10)


def test_dropout_train_false_and_single_layer():
    T, B, I, H = 4, 2, 3, 4
    c = random_case(T, B, I, H, 3, 1, True, False, False, 60)
    ev = lstmgrad.lstm_forward(
        c["x"], c["params"], c["hx"], num_layers=3, dropout=0.4, train=False, seed=1
    )
    assert ev.saved is None
    plain = lstmgrad.lstm_forward(c["x"], c["params"], c["hx"], num_layers=3)
    np.testing.assert_array_equal(ev.output, plain.output)
    np.testing.assert_array_equal(ev.hy, plain.hy)
    assert plain.saved.dropout_masks is None
    # backward with train=False ignores dropout (no masks needed)
    bw_ev = lstmgrad.lstm_backward(
        c["x"],
        c["hx"],
        c["params"],
        c["dy"],
        c["dh"],
        c["dc"],
        *plain.saved[:7],
        num_layers=3,
        dropout=0.4,
        train=False,
    )
    bw_plain = lstmgrad.lstm_backward(
        c["x"], c["hx"], c["params"], c["dy"], c["dh"], c["dc"], *plain.saved[:7], num_layers=3
    )
    for a, b in zip([bw_ev.dx, *bw_ev.dparams], [bw_plain.dx, *bw_plain.dparams], strict=True):
        np.testing.assert_array_equal(a, b)
    # dropout > 0, train, L > 1 and no masks: the exact gradient is impossible -> 161002
    with pytest.raises(lstmgrad.LstmInvalidArgumentError) as ei:
        lstmgrad.lstm_backward(
            c["x"],
            c["hx"],
            c["params"],
            c["dy"],
            c["dh"],
            c["dc"],
            *plain.saved[:7],
            num_layers=3,
            dropout=0.4,
            train=True,
        )
    assert ei.value.code == lstmgrad.ACLNN_ERR_PARAM_INVALID
    # one layer: nothing to drop, masks == []
    c1 = random_case(T, B, I, H, 1, 1, True, False, False, 61)
    fw1, bw1 = run_both(
        c1["x"], c1["hx"], c1["params"], c1["dy"], c1["dh"], c1["dc"], seed=5, dropout=0.4
    )
    assert fw1.saved.dropout_masks == []
    ref = torch_lstm_grads(c1["lstm"], c1["x"], *c1["hx"], c1["dy"], c1["dh"], c1["dc"])
    assert_grads_close(bw1, ref, 1e-10)


# ---------------------------------------------------------------------------------------------
# 6. float16 / float32 against float64

# Measured (6 seeds x 3 configs, T6-B3-I5-H8): max error relative to max magnitude
#   backward only (same saved activations): float32 7.3e-8, float16 5.7e-4
#   forward + backward end to end:           float32 1.6e-7, float16 9.4e-4
LOW_TOL = {np.float32: 1e-5, np.float16: 3e-3}


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=lambda d: d.__name__)
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize(
    "L,D,varlen",
    [(1, 1, False), (2, 2, False), (2, 2, True)],
    ids=["L1-D1", "L2-D2", "L2-D2-varlen"],
)
def test_low_precision_vs_float64(dtype, seed, L, D, varlen):
    T, B, I, H = 6, 3, 5, 8
    c = random_case(T, B, I, H, L, D, True, False, varlen, 70 + seed)
    kw = cfg(L, D, True)

    def cast(a):
        return a.astype(dtype)

    def back(a):
        return a.astype(F64)

    xl, pl = cast(c["x"]), [cast(p) for p in c["params"]]
    hxl = [cast(a) for a in c["hx"]]
    dyl, dhl, dcl = cast(c["dy"]), cast(c["dh"]), cast(c["dc"])
    fw, bw = run_both(xl, hxl, pl, dyl, dhl, dcl, c["bs"], **kw)
    for a in [fw.output, fw.hy, fw.cy, bw.dx, bw.dh_prev, bw.dc_prev, *bw.dparams]:
        assert a.dtype == dtype
    for name in SAVED:
        assert all(a.dtype == dtype for a in getattr(fw.saved, name))
    x64, p64, hx64 = back(xl), [back(p) for p in pl], [back(a) for a in hxl]
    dy64, dh64, dc64 = back(dyl), back(dhl), back(dcl)
    tol = LOW_TOL[dtype]
    # forward
    fw64 = lstmgrad.lstm_forward(x64, p64, hx64, c["bs"], **kw)
    assert_close(fw.output, fw64.output, tol, "output")
    assert_close(fw.hy, fw64.hy, tol, "hy")
    assert_close(fw.cy, fw64.cy, tol, "cy")
    # backward on the same (cast back) saved activations
    saved64 = [[back(a) for a in s] for s in fw.saved[:7]]
    bw64 = lstmgrad.lstm_backward(x64, hx64, p64, dy64, dh64, dc64, *saved64, c["bs"], **kw)
    for name, a, b in zip(
        ["dx", "dh_prev", "dc_prev"],
        [bw.dx, bw.dh_prev, bw.dc_prev],
        [bw64.dx, bw64.dh_prev, bw64.dc_prev],
        strict=True,
    ):
        assert_close(a, b, tol, name)
    for j, (a, b) in enumerate(zip(bw.dparams, bw64.dparams, strict=True)):
        assert_close(a, b, tol, f"dparams[{j}]")
    # end to end (forward + backward in float64 from the cast inputs)
    _, bw64e = run_both(x64, hx64, p64, dy64, dh64, dc64, c["bs"], **kw)
    for a, b in zip(
        [bw.dx, bw.dh_prev, bw.dc_prev, *bw.dparams],
        [bw64e.dx, bw64e.dh_prev, bw64e.dc_prev, *bw64e.dparams],
        strict=True,
    ):
        assert rel_err(a, b) <= 2 * tol


# ---------------------------------------------------------------------------------------------
# 7. determinism, inputs untouched, strided inputs


def _all_outputs(fw, bw):
    out = [fw.output, fw.hy, fw.cy]
    for name in SAVED:
        out += getattr(fw.saved, name)
    return out + [bw.dx, bw.dh_prev, bw.dc_prev, *bw.dparams]


@pytest.mark.parametrize("varlen", [False, True], ids=["dense", "varlen"])
def test_deterministic_and_inputs_untouched(varlen):
    T, B, I, H, L, D = 5, 3, 4, 5, 2, 2
    c = random_case(T, B, I, H, L, D, True, False, varlen, 80)
    kw = cfg(L, D, True)
    args = (c["x"], c["hx"], c["params"], c["dy"], c["dh"], c["dc"], c["bs"])
    copies = [
        c["x"].copy(),
        [a.copy() for a in c["hx"]],
        [p.copy() for p in c["params"]],
        c["dy"].copy(),
        c["dh"].copy(),
        c["dc"].copy(),
    ]
    fw1, bw1 = run_both(*args, **kw)
    saved_copy = [[a.copy() for a in s] for s in fw1.saved[:7]]
    bw1b = lstmgrad.lstm_backward(
        c["x"], c["hx"], c["params"], c["dy"], c["dh"], c["dc"], *fw1.saved[:7], c["bs"], **kw
    )
    fw2, bw2 = run_both(*args, **kw)
    for a, b in zip(_all_outputs(fw1, bw1), _all_outputs(fw2, bw2), strict=True):
        np.testing.assert_array_equal(a, b)
    for a, b in zip([bw1.dx, *bw1.dparams], [bw1b.dx, *bw1b.dparams], strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(c["x"], copies[0])
    for a, b in zip(c["hx"] + c["params"], copies[1] + copies[2], strict=True):
        np.testing.assert_array_equal(a, b)
    for a, b in zip([c["dy"], c["dh"], c["dc"]], copies[3:], strict=True):
        np.testing.assert_array_equal(a, b)
    for s, sc in zip(fw1.saved[:7], saved_copy, strict=True):
        for a, b in zip(s, sc, strict=True):
            np.testing.assert_array_equal(a, b)
    # outputs are new C-contiguous arrays
    for a in _all_outputs(fw1, bw1):
        assert a.flags.c_contiguous


def _strided(a, rng):
    """Same values, non-contiguous storage: every other element of a larger array."""
    big = rng.standard_normal(a.shape[:-1] + (2 * a.shape[-1],))
    big[..., ::2] = a
    v = big[..., ::2]
    assert not v.flags.c_contiguous or v.size <= 1
    return v


STRIDED_CASES = [(False, False), (True, False), (False, True)]


@pytest.mark.parametrize("bf,varlen", STRIDED_CASES, ids=["tb", "bf", "varlen"])
def test_strided_inputs_equal_contiguous(bf, varlen):
    """input, dy, hx, dh, dc, biases, weights and the saved lists as non-contiguous views with
    the same values: bit-identical results."""
    T, B, I, H, L, D = 4, 3, 4, 5, 2, 2
    c = random_case(T, B, I, H, L, D, True, bf, varlen, 90)
    kw = cfg(L, D, True, bf)
    fw, bw = run_both(c["x"], c["hx"], c["params"], c["dy"], c["dh"], c["dc"], c["bs"], **kw)
    rng = np.random.default_rng(0)
    xs = _strided(c["x"], rng)
    dys = _strided(c["dy"], rng)
    hxs = [_strided(a, rng) for a in c["hx"]]
    ps = [_strided(p, rng) for p in c["params"]]  # every other element along the last axis
    dhs, dcs = _strided(c["dh"], rng), _strided(c["dc"], rng)
    fws = lstmgrad.lstm_forward(xs, ps, hxs, c["bs"], **kw)
    saved_s = [[_strided(a, rng) for a in s] for s in fws.saved[:7]]
    bws = lstmgrad.lstm_backward(xs, hxs, ps, dys, dhs, dcs, *saved_s, c["bs"], **kw)
    for a, b in zip(_all_outputs(fw, bw), _all_outputs(fws, bws), strict=True):
        np.testing.assert_array_equal(a, b)
    # a transposed view (time-major array from a batch-major buffer) and Fortran-ordered saved
    if not varlen:
        xt = np.ascontiguousarray(c["x"].transpose(1, 0, 2)).transpose(1, 0, 2)
        dyt = np.ascontiguousarray(c["dy"].transpose(1, 0, 2)).transpose(1, 0, 2)
        fwt = lstmgrad.lstm_forward(xt, c["params"], c["hx"], **kw)
        saved_f = [[np.asfortranarray(a) for a in s] for s in fwt.saved[:7]]
        bwt = lstmgrad.lstm_backward(
            xt, c["hx"], c["params"], dyt, c["dh"], c["dc"], *saved_f, **kw
        )
        for a, b in zip(_all_outputs(fw, bw), _all_outputs(fwt, bwt), strict=True):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("bf,varlen", STRIDED_CASES, ids=["tb", "bf", "varlen"])
def test_fortran_ordered_weights_equal_contiguous(bf, varlen):
    """Weights given as Fortran-ordered (transposed-storage) arrays with the same values:
    bit-identical results (fixed reduction order, any strides accepted)."""
    T, B, I, H, L, D = 4, 3, 4, 5, 2, 2
    c = random_case(T, B, I, H, L, D, True, bf, varlen, 90)
    kw = cfg(L, D, True, bf)
    fw, bw = run_both(c["x"], c["hx"], c["params"], c["dy"], c["dh"], c["dc"], c["bs"], **kw)
    ps = [np.asfortranarray(p) for p in c["params"]]
    assert all(not p.flags.c_contiguous for p in ps if p.ndim == 2)
    fws, bws = run_both(c["x"], c["hx"], ps, c["dy"], c["dh"], c["dc"], c["bs"], **kw)
    names = ["output", "hy", "cy"] + [f"{n}[{k}]" for n in SAVED for k in range(L * D)]
    names += ["dx", "dh_prev", "dc_prev"] + [f"dparams[{j}]" for j in range(len(ps))]
    bad = [
        f"{n} (max |diff| {np.max(np.abs(a - b)):.1e})"
        for n, a, b in zip(names, _all_outputs(fw, bw), _all_outputs(fws, bws), strict=True)
        if not np.array_equal(a, b)
    ]
    assert not bad, "results depend on the memory layout of the weights: " + ", ".join(bad)


# ---------------------------------------------------------------------------------------------
# 8. empty inputs and output_mask


def _params(I, H, L, D, bias, rng):
    """Random params in flat order, without torch (which rejects I = 0 or H = 0)."""
    params = []
    for layer in range(L):
        for _ in range(D):
            params += [
                rng.uniform(-0.5, 0.5, (4 * H, I if layer == 0 else D * H)),
                rng.uniform(-0.5, 0.5, (4 * H, H)),
            ]
            if bias:
                params += [rng.uniform(-0.5, 0.5, 4 * H), rng.uniform(-0.5, 0.5, 4 * H)]
    return params


EMPTY = [
    # (T, B, I, H, varlen)
    (0, 3, 4, 5, False),
    (0, 3, 4, 5, True),
    (4, 0, 4, 5, False),
    (4, 0, 4, 5, True),
    (4, 3, 0, 5, False),
    (4, 3, 0, 5, True),
    (4, 3, 4, 0, False),
    (4, 3, 4, 0, True),
    (0, 0, 0, 0, False),
]


@pytest.mark.parametrize("L,D", [(1, 1), (2, 2)], ids=["L1-D1", "L2-D2"])
@pytest.mark.parametrize(
    "T,B,I,H,varlen",
    EMPTY,
    ids=[f"T{t}-B{b}-I{i}-H{h}-{'varlen' if v else 'dense'}" for t, b, i, h, v in EMPTY],
)
def test_empty_inputs(T, B, I, H, varlen, L, D):
    rng = np.random.default_rng(T + 10 * B + 100 * I + 1000 * H)
    params = _params(I, H, L, D, True, rng)
    K = L * D
    hx = [rng.standard_normal((K, B, H)) for _ in range(2)]
    dh, dc = rng.standard_normal((K, B, H)), rng.standard_normal((K, B, H))
    if varlen:
        bs = np.full(T, B, dtype=np.int64)
        x, dy = rng.standard_normal((T * B, I)), rng.standard_normal((T * B, D * H))
    else:
        bs = None
        x, dy = rng.standard_normal((T, B, I)), rng.standard_normal((T, B, D * H))
    kw = cfg(L, D, True)
    fw, bw = run_both(x, hx, params, dy, dh, dc, bs, **kw)
    assert fw.output.shape == dy.shape
    assert fw.hy.shape == fw.cy.shape == (K, B, H)
    for name in SAVED:
        assert all(a.shape == (T, B, H) for a in getattr(fw.saved, name))
    assert bw.dx.shape == x.shape
    assert bw.dh_prev.shape == bw.dc_prev.shape == (K, B, H)
    assert [p.shape for p in bw.dparams] == [p.shape for p in params]
    for a in [fw.output, fw.hy, fw.cy, bw.dx, bw.dh_prev, bw.dc_prev, *bw.dparams]:
        assert a.dtype == F64
    if T == 0:
        # no step: the state is the initial one and the gradient passes straight through
        np.testing.assert_array_equal(fw.hy, hx[0])
        np.testing.assert_array_equal(fw.cy, hx[1])
        np.testing.assert_array_equal(bw.dh_prev, dh)
        np.testing.assert_array_equal(bw.dc_prev, dc)
        for p in bw.dparams:
            assert np.all(p == 0)


MASKS = list(itertools.product([True, False], repeat=4))


@pytest.mark.parametrize("varlen", [False, True], ids=["dense", "varlen"])
@pytest.mark.parametrize(
    "mask", MASKS, ids=["".join("1" if m else "0" for m in mk) for mk in MASKS]
)
def test_output_mask(mask, varlen):
    T, B, I, H, L, D = 4, 3, 3, 4, 2, 2
    c = random_case(T, B, I, H, L, D, True, False, varlen, 100)
    kw = cfg(L, D, True)
    fw, full = run_both(c["x"], c["hx"], c["params"], c["dy"], c["dh"], c["dc"], c["bs"], **kw)
    part = lstmgrad.lstm_backward(
        c["x"],
        c["hx"],
        c["params"],
        c["dy"],
        c["dh"],
        c["dc"],
        *fw.saved[:7],
        c["bs"],
        output_mask=list(mask),
        **kw,
    )
    for on, a, b in zip(mask, part, full, strict=True):
        if not on:
            assert a is None
        elif isinstance(b, list):
            assert len(a) == len(b)
            for u, v in zip(a, b, strict=True):
                np.testing.assert_array_equal(u, v)
        else:
            np.testing.assert_array_equal(a, b)


def test_none_gradients_are_zeros():
    """dy, dh, dc = None behave as zeros."""
    c = random_case(4, 2, 3, 4, 2, 2, True, False, False, 110)
    kw = cfg(2, 2, True)
    fw = lstmgrad.lstm_forward(c["x"], c["params"], c["hx"], **kw)
    z = [np.zeros_like(c["dy"]), np.zeros_like(c["dh"]), np.zeros_like(c["dc"])]
    for which in range(3):
        given = [c["dy"], c["dh"], c["dc"]]
        given_none, given_zero = list(given), list(given)
        given_none[which], given_zero[which] = None, z[which]
        a = lstmgrad.lstm_backward(c["x"], c["hx"], c["params"], *given_none, *fw.saved[:7], **kw)
        b = lstmgrad.lstm_backward(c["x"], c["hx"], c["params"], *given_zero, *fw.saved[:7], **kw)
        for u, v in zip(
            [a.dx, a.dh_prev, a.dc_prev, *a.dparams],
            [b.dx, b.dh_prev, b.dc_prev, *b.dparams],
            strict=True,
        ):
            np.testing.assert_array_equal(u, v)
