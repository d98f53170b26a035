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
from test_fused import TOL, make_case, rel  # noqa: E402  (tests/ is on sys.path)

pytestmark = pytest.mark.slow


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


@settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_fused_matches_reference_random(case):
    T, B, I, H, L, D, bias, dtype, lengths, seed, mask = case
    c = make_case(T, B, I, H, L, D, dtype, bias=bias, lengths=lengths, seed=seed)
    kw = c["kw"]
    ff = lstmgrad.lstm_forward(c["x"], c["params"], c["hx"], c["bs"], **kw)
    assert rel(ff.output, c["fw"].output) <= TOL[dtype]
    args = (c["x"], c["hx"], c["params"], c["dy"], c["dh"], c["dc"], *c["fw"].saved[:7], c["bs"])
    want = lstmgrad.lstm_backward(*args, output_mask=mask, impl="reference", **kw)
    got = lstmgrad.lstm_backward(*args, output_mask=mask, **kw)
    for g, w in zip(got[:3], want[:3], strict=True):
        assert (g is None) == (w is None)
        if w is not None:
            assert g.shape == w.shape and g.dtype == w.dtype
            assert rel(g, w) <= TOL[dtype]
    if want.dparams is not None:
        for g, w in zip(got.dparams, want.dparams, strict=True):
            assert rel(g, w) <= TOL[dtype]
