"""The rounding points of docs/math.md, checked exactly by composing smaller calls of the API.

Each (layer, direction) is rounded to the storage dtype once; the layer below receives the
rounded dx; the two directions' dx are summed in the storage dtype. These identities hold bit
for bit, so the tests compare with np.array_equal.
"""

from __future__ import annotations

import numpy as np
import pytest

import lstmgrad

DTYPES = [np.float16, np.float32, np.float64]


def _params(rng, layers, dirs, isz, hidden, dtype):
    out = []
    for layer in range(layers):
        for _ in range(dirs):
            w_in = isz if layer == 0 else dirs * hidden
            out += [
                rng.uniform(-0.5, 0.5, s).astype(dtype)
                for s in [(4 * hidden, w_in), (4 * hidden, hidden), (4 * hidden,), (4 * hidden,)]
            ]
    return out


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_direction_sum_is_done_in_storage_dtype(dtype):
    rng = np.random.default_rng(1)
    t, b, i, h = 6, 3, 5, 4
    params = _params(rng, 1, 2, i, h, dtype)
    x = rng.standard_normal((t, b, i)).astype(dtype)
    hx = [rng.standard_normal((2, b, h)).astype(dtype) for _ in range(2)]
    fwd = lstmgrad.lstm_forward(x, params, hx, bidirectional=True)
    dy = rng.standard_normal((t, b, 2 * h)).astype(dtype)
    dh = rng.standard_normal((2, b, h)).astype(dtype)
    dc = rng.standard_normal((2, b, h)).astype(dtype)
    full = lstmgrad.lstm_backward(x, hx, params, dy, dh, dc, *fwd.saved[:7], bidirectional=True)
    parts = []
    for d in range(2):
        dy_d, dh_d, dc_d = np.zeros_like(dy), np.zeros_like(dh), np.zeros_like(dc)
        dy_d[..., d * h : (d + 1) * h] = dy[..., d * h : (d + 1) * h]
        dh_d[d], dc_d[d] = dh[d], dc[d]
        parts.append(
            lstmgrad.lstm_backward(
                x, hx, params, dy_d, dh_d, dc_d, *fwd.saved[:7], bidirectional=True
            )
        )
    assert full.dx.dtype == np.dtype(dtype)
    assert np.array_equal(full.dx, (parts[0].dx + parts[1].dx).astype(dtype))
    for d in range(2):  # each direction's own outputs are unaffected by the other
        assert np.array_equal(full.dh_prev[d], parts[d].dh_prev[d])
        for j in range(4 * d, 4 * d + 4):
            assert np.array_equal(full.dparams[j], parts[d].dparams[j])


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("varlen", [False, True], ids=["dense", "varlen"])
def test_layer_below_receives_the_rounded_dx(dtype, varlen):
    """A 2-layer call equals layer 1 alone, then layer 0 alone fed layer 1's rounded dx."""
    rng = np.random.default_rng(2)
    t, b, i, h = 5, 4, 3, 6
    params = _params(rng, 2, 1, i, h, dtype)
    bs = np.array([4, 4, 3, 1, 1], np.int64) if varlen else None
    x = rng.standard_normal((t * b, i) if varlen else (t, b, i)).astype(dtype)
    hx = [rng.standard_normal((2, b, h)).astype(dtype) for _ in range(2)]
    fwd = lstmgrad.lstm_forward(x, params, hx, bs, num_layers=2)
    dy = rng.standard_normal(fwd.output.shape).astype(dtype)
    dh = rng.standard_normal((2, b, h)).astype(dtype)
    dc = rng.standard_normal((2, b, h)).astype(dtype)
    full = lstmgrad.lstm_backward(x, hx, params, dy, dh, dc, *fwd.saved[:7], bs, num_layers=2)

    def saved_of(k):
        return [[s[k]] for s in fwd.saved[:7]]

    def layer_input(a):  # layer 1's input is layer 0's output, in the caller's layout
        return a.reshape(t * b, h) if varlen else a

    top = lstmgrad.lstm_backward(
        layer_input(fwd.saved.h[0] * (np.arange(b)[None, :, None] < (bs[:, None, None] if varlen else b))),
        [hx[0][1:], hx[1][1:]], params[4:], dy, dh[1:], dc[1:], *saved_of(1), bs,
    )  # fmt: skip
    bottom = lstmgrad.lstm_backward(
        x, [hx[0][:1], hx[1][:1]], params[:4], top.dx, dh[:1], dc[:1], *saved_of(0), bs
    )
    assert np.array_equal(full.dx, bottom.dx)
    assert np.array_equal(full.dh_prev, np.concatenate([bottom.dh_prev, top.dh_prev]))
    assert np.array_equal(full.dc_prev, np.concatenate([bottom.dc_prev, top.dc_prev]))
    for got, want in zip(full.dparams, bottom.dparams + top.dparams, strict=True):
        assert np.array_equal(got, want)


def test_float16_outputs_are_float16_and_close_to_the_float32_computation():
    """float16 = the float32 result rounded once per (layer, direction), up to float16 steps."""
    rng = np.random.default_rng(3)
    t, b, i, h = 8, 3, 5, 7
    p16 = _params(rng, 1, 1, i, h, np.float16)
    x16 = rng.standard_normal((t, b, i)).astype(np.float16)
    hx16 = [rng.standard_normal((1, b, h)).astype(np.float16) for _ in range(2)]
    dy16 = rng.standard_normal((t, b, h)).astype(np.float16)
    f16 = lstmgrad.lstm_forward(x16, p16, hx16)
    r16 = lstmgrad.lstm_backward(x16, hx16, p16, dy16, None, None, *f16.saved[:7])
    up = lambda a: a.astype(np.float32)  # noqa: E731
    saved32 = [[up(a) for a in lst] for lst in f16.saved[:7]]
    r32 = lstmgrad.lstm_backward(
        up(x16), [up(a) for a in hx16], [up(p) for p in p16], up(dy16), None, None, *saved32
    )
    # Same float16 inputs: the only difference is the final rounding to float16 (at most half a
    # float16 step, plus float32's own rounding before it).
    for a16, a32 in [
        (r16.dx, r32.dx),
        (r16.dh_prev, r32.dh_prev),
        (r16.dc_prev, r32.dc_prev),
        *zip(r16.dparams, r32.dparams, strict=True),
    ]:
        assert a16.dtype == np.float16
        assert np.abs(a16.astype(np.float32) - a32).max() <= np.abs(a32).max() * 2**-11 * 1.01
