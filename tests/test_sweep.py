"""Long randomized sweeps (marked slow, left out of CI: python -m pytest -q -m slow).

Hypothesis draws shapes, flags, dtypes and lengths; the fused engine must match the float64
reference, and the reference (float64) must match PyTorch autograd.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lstmgrad

pytestmark = pytest.mark.slow

TOL = {np.float64: 1e-12, np.float32: 2e-5, np.float16: 4e-3}


@st.composite
def cases(draw):
    T = draw(st.integers(0, 7))
    B = draw(st.integers(0, 5))
    I = draw(st.integers(0, 9))
    H = draw(st.integers(0, 9))
    L = draw(st.integers(1, 3))
    D = draw(st.sampled_from([1, 2]))
    bias = draw(st.booleans())
    dtype = draw(st.sampled_from([np.float16, np.float32, np.float64]))
    varlen = draw(st.booleans())
    lengths = draw(st.lists(st.integers(0, T), min_size=B, max_size=B)) if varlen else None
    seed = draw(st.integers(0, 2**31 - 1))
    mask = tuple(draw(st.booleans()) for _ in range(4))
    return T, B, I, H, L, D, bias, dtype, lengths, seed, mask


def _rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max(initial=0.0) / max(np.abs(b).max(initial=0.0), 1e-30))


@settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_fused_matches_reference_random(case):
    T, B, I, H, L, D, bias, dtype, lengths, seed, mask = case
    rng = np.random.default_rng(seed)
    params = []
    for layer in range(L):
        for _ in range(D):
            w_in = I if layer == 0 else D * H
            shapes = [(4 * H, w_in), (4 * H, H)] + ([(4 * H,), (4 * H,)] if bias else [])
            params += [rng.uniform(-0.6, 0.6, s).astype(dtype) for s in shapes]
    bs = None
    if lengths is not None:
        bs = np.array([sum(n > t for n in lengths) for t in range(T)], dtype=np.int64)
        x = rng.standard_normal((T * B, I)).astype(dtype)
        dy = rng.standard_normal((T * B, D * H)).astype(dtype)
    else:
        x = rng.standard_normal((T, B, I)).astype(dtype)
        dy = rng.standard_normal((T, B, D * H)).astype(dtype)
    hx = [rng.standard_normal((L * D, B, H)).astype(dtype) for _ in range(2)]
    dh = rng.standard_normal((L * D, B, H)).astype(dtype)
    kw = dict(num_layers=L, bidirectional=D == 2, has_bias=bias)
    fr = lstmgrad.lstm_forward(x, params, hx, bs, impl="reference", **kw)
    ff = lstmgrad.lstm_forward(x, params, hx, bs, **kw)
    assert _rel(ff.output, fr.output) <= TOL[dtype]
    args = (x, hx, params, dy, dh, dh, *fr.saved[:7], bs)
    want = lstmgrad.lstm_backward(*args, output_mask=mask, impl="reference", **kw)
    got = lstmgrad.lstm_backward(*args, output_mask=mask, **kw)
    for g, w in zip(got[:3], want[:3], strict=True):
        assert (g is None) == (w is None)
        if w is not None:
            assert g.shape == w.shape and g.dtype == w.dtype
            assert _rel(g, w) <= TOL[dtype]
    if want.dparams is not None:
        for g, w in zip(got.dparams, want.dparams, strict=True):
            assert _rel(g, w) <= TOL[dtype]
