"""The fused engine against the float64 reference (docs/math.md), over a readable grid.

Scratch memory is filled with NaN (all-ones bytes) so that a row the engine forgot to write
cannot pass; determinism and concurrent calls are checked bit for bit.
"""

from __future__ import annotations

import itertools
import threading

import numpy as np
import pytest

import lstmgrad
from lstmgrad import fused
from lstmgrad.core.contract import check_backward, check_forward
from lstmgrad.core.workspace import Arena, workspace_bytes
from lstmgrad.ops.api import engine_plan, run_backward, run_forward

# float32 / float16 results of the fused engine vs the reference, relative to the largest
# magnitude of each output (float16: a few float16 steps; both round to float16 at the end).
TOL = {np.float64: 1e-12, np.float32: 2e-5, np.float16: 4e-3}


def make_case(T, B, I, H, L, D, dtype, *, bias=True, lengths=None, batch_first=False, seed=0):
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
    elif batch_first:
        x = rng.standard_normal((B, T, I)).astype(dtype)
    else:
        x = rng.standard_normal((T, B, I)).astype(dtype)
    hx = [rng.standard_normal((L * D, B, H)).astype(dtype) for _ in range(2)]
    kw = dict(num_layers=L, bidirectional=D == 2, has_bias=bias, batch_first=batch_first)
    fw = lstmgrad.lstm_forward(x, params, hx, bs, impl="reference", **kw)
    out_shape = fw.output.shape
    dy = rng.standard_normal(out_shape).astype(dtype)
    dh = rng.standard_normal(hx[0].shape).astype(dtype)
    dc = rng.standard_normal(hx[0].shape).astype(dtype)
    return dict(x=x, hx=hx, params=params, bs=bs, kw=kw, fw=fw, dy=dy, dh=dh, dc=dc)


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max(initial=0.0) / max(np.abs(b).max(initial=0.0), 1e-30))


def nan_arena(slots):
    return Arena(np.full(workspace_bytes(slots), 0xFF, np.uint8))


def fused_backward(c, output_mask=None):
    """The fused backward through the contract with NaN-filled scratch."""
    call = check_backward(
        "lstm_backward", c["x"], c["hx"], c["params"], c["dy"], c["dh"], c["dc"],
        tuple(c["fw"].saved[:7]), c["bs"], c["kw"]["has_bias"], c["kw"]["num_layers"], 0.0,
        True, c["kw"]["bidirectional"], c["kw"]["batch_first"], output_mask, None,
    )  # fmt: skip
    return run_backward(
        call,
        nan_arena(
            fused.backward_workspace_slots(
                call.dims, call.dtype, engine_plan(call.dims, call.dtype)
            )
        ),
        "fused",
    )


def fused_forward(c):
    call = check_forward(
        "lstm_forward", c["x"], c["params"], c["hx"], c["bs"], c["kw"]["has_bias"],
        c["kw"]["num_layers"], 0.0, True, c["kw"]["bidirectional"], c["kw"]["batch_first"], None,
    )  # fmt: skip
    return run_forward(
        call,
        nan_arena(
            fused.forward_workspace_slots(call.dims, call.dtype, engine_plan(call.dims, call.dtype))
        ),
        "fused",
    )


def assert_identical(got, want):
    """Every output of two backward results equal bit for bit."""
    got_all = [got.dx, got.dh_prev, got.dc_prev, *got.dparams]
    want_all = [want.dx, want.dh_prev, want.dc_prev, *want.dparams]
    for a, b in zip(got_all, want_all, strict=True):
        assert np.array_equal(a, b)


def compare(got, want, tol):
    for name in ("dx", "dh_prev", "dc_prev"):
        g, w = getattr(got, name), getattr(want, name)
        assert (g is None) == (w is None), name
        if w is not None:
            assert g.dtype == w.dtype and g.shape == w.shape, name
            assert not np.isnan(g).any(), name
            assert rel(g, w) <= tol, (name, rel(g, w))
    assert (got.dparams is None) == (want.dparams is None)
    if want.dparams is not None:
        for j, (g, w) in enumerate(zip(got.dparams, want.dparams, strict=True)):
            assert g.dtype == w.dtype and g.shape == w.shape
            assert rel(g, w) <= tol, (j, rel(g, w))


LENGTHS = {"dense": None, "sorted": [5, 4, 4, 2, 1], "unsorted": [2, 5, 1, 4, 3]}
GRID = [
    # T, B, I, H, L, D, dtype, bias, lengths, batch_first
    (1, 1, 3, 5, 1, 1, np.float32, True, "dense", False),
    (6, 1, 4, 7, 2, 2, np.float32, True, "dense", False),
    (5, 5, 3, 9, 1, 1, np.float32, False, "sorted", False),
    (5, 5, 3, 9, 3, 2, np.float32, True, "sorted", False),
    (5, 5, 6, 4, 2, 2, np.float32, True, "unsorted", False),
    (7, 4, 5, 6, 2, 1, np.float32, True, "dense", True),
    (7, 4, 5, 6, 3, 2, np.float64, False, "dense", True),
    (5, 5, 5, 6, 2, 2, np.float64, True, "sorted", False),
    (6, 3, 4, 5, 2, 2, np.float16, True, "dense", False),
    (5, 5, 4, 5, 2, 2, np.float16, True, "sorted", False),
    (9, 8, 33, 31, 1, 2, np.float32, True, "dense", False),
    # H >= 256 and B <= 64: the forward's transposed recurrent GEMM
    (5, 5, 8, 256, 2, 2, np.float32, True, "sorted", False),
    (3, 2, 8, 256, 1, 1, np.float64, True, "dense", True),
]


def _id(p):
    T, B, I, H, L, D, dt, bias, lengths, bf = p
    return (
        f"T{T}-B{B}-I{I}-H{H}-L{L}-D{D}-{np.dtype(dt).name}-{'bias' if bias else 'nobias'}-"
        f"{lengths}{'-bf' if bf else ''}"
    )


@pytest.mark.parametrize("T,B,I,H,L,D,dtype,bias,lengths,bf", GRID, ids=[_id(p) for p in GRID])
def test_fused_matches_reference(T, B, I, H, L, D, dtype, bias, lengths, bf):
    lens = LENGTHS[lengths]
    c = make_case(T, B, I, H, L, D, dtype, bias=bias, lengths=lens, batch_first=bf)
    want = lstmgrad.lstm_backward(
        c["x"], c["hx"], c["params"], c["dy"], c["dh"], c["dc"], *c["fw"].saved[:7], c["bs"],
        impl="reference", **c["kw"],
    )  # fmt: skip
    compare(fused_backward(c), want, TOL[dtype])
    # forward: outputs and every saved activation
    got_f = fused_forward(c)
    want_f = c["fw"]
    for g, w in [(got_f.output, want_f.output), (got_f.hy, want_f.hy), (got_f.cy, want_f.cy)]:
        assert g.dtype == w.dtype and g.shape == w.shape
        assert rel(g, w) <= TOL[dtype]
    for lg, lw in zip(got_f.saved[:7], want_f.saved[:7], strict=True):
        for g, w in zip(lg, lw, strict=True):
            assert rel(g, w) <= TOL[dtype]


@pytest.mark.parametrize("lengths", ["dense", "sorted"])
@pytest.mark.parametrize(
    "mask",
    list(itertools.product([True, False], repeat=4)),
    ids=lambda m: "".join("1" if v else "0" for v in m),
)
def test_every_output_mask(mask, lengths):
    c = make_case(5, 5, 4, 6, 2, 2, np.float32, lengths=LENGTHS[lengths], seed=3)
    want = lstmgrad.lstm_backward(
        c["x"], c["hx"], c["params"], c["dy"], c["dh"], c["dc"], *c["fw"].saved[:7], c["bs"],
        impl="reference", output_mask=mask, **c["kw"],
    )  # fmt: skip
    compare(fused_backward(c, output_mask=mask), want, TOL[np.float32])


def test_strided_inputs_give_identical_results():
    c = make_case(6, 4, 5, 6, 2, 2, np.float32, seed=5)
    base = fused_backward(c)
    s = dict(c)

    def strided(a):
        big = np.zeros((2,) + a.shape, a.dtype, order="F")
        big[1] = a
        return big[1]  # same values, non-contiguous strides

    s["x"] = strided(c["x"])
    s["dy"] = strided(c["dy"])
    s["params"] = [strided(p) for p in c["params"]]
    s["hx"] = [strided(a) for a in c["hx"]]
    saved = c["fw"].saved
    s["fw"] = saved.__class__(
        *[[strided(a) for a in lst] for lst in saved[:7]], saved.dropout_masks
    )
    s["fw"] = c["fw"]._replace(saved=s["fw"])
    got = fused_backward(s)
    assert_identical(got, base)


def test_dropout_masks_match_reference():
    c = make_case(5, 3, 4, 6, 3, 2, np.float32, seed=7)
    kw = c["kw"]
    fr = lstmgrad.lstm_forward(
        c["x"], c["params"], c["hx"], dropout=0.3, seed=11, impl="reference", **kw
    )
    ff = lstmgrad.lstm_forward(c["x"], c["params"], c["hx"], dropout=0.3, seed=11, **kw)
    for a, b in zip(ff.saved.dropout_masks, fr.saved.dropout_masks, strict=True):
        assert np.array_equal(a, b)  # the same seed draws the same masks in both engines
    assert rel(ff.output, fr.output) <= TOL[np.float32]
    args = (c["x"], c["hx"], c["params"], c["dy"], c["dh"], c["dc"], *fr.saved[:7])
    want = lstmgrad.lstm_backward(
        *args, dropout=0.3, dropout_masks=fr.saved.dropout_masks, impl="reference", **kw
    )
    got = lstmgrad.lstm_backward(*args, dropout=0.3, dropout_masks=fr.saved.dropout_masks, **kw)
    compare(got, want, TOL[np.float32])


def test_nan_in_padding_never_reaches_a_result():
    c = make_case(5, 5, 4, 6, 2, 2, np.float32, lengths=LENGTHS["sorted"], seed=9)
    clean = fused_backward(c)
    bs = c["bs"]
    pad = (np.arange(5)[None, :] >= bs[:, None]).reshape(-1)  # rows t*B + b of the padding
    dirty = dict(c)
    dirty["x"] = c["x"].copy()
    dirty["x"][pad] = np.nan
    dirty["dy"] = c["dy"].copy()
    dirty["dy"][pad] = np.nan
    saved = [[a.copy() for a in lst] for lst in c["fw"].saved[:7]]
    for lst in saved:
        for a in lst:
            a.reshape(-1, a.shape[-1])[pad] = np.nan
    dirty["fw"] = c["fw"]._replace(
        saved=c["fw"].saved._replace(
            **dict(zip(("i", "g", "f", "o", "h", "c", "tanhc"), saved, strict=True))
        )
    )
    got = fused_backward(dirty)
    assert_identical(got, clean)


def test_nan_and_inf_propagate():
    """Plain IEEE arithmetic: a NaN in the input reaches the outputs it feeds."""
    c = make_case(3, 2, 3, 4, 1, 1, np.float32, seed=13)
    x = c["x"].copy()
    x[1, 0, 0] = np.nan
    fw = lstmgrad.lstm_forward(x, c["params"], c["hx"])
    assert np.isnan(fw.output[1:, 0]).all() and not np.isnan(fw.output[:, 1]).any()
    x[1, 0, 0] = np.inf
    fr = lstmgrad.lstm_forward(x, c["params"], c["hx"], impl="reference")
    ff = lstmgrad.lstm_forward(x, c["params"], c["hx"])
    assert np.array_equal(np.isnan(ff.output), np.isnan(fr.output))


def test_deterministic_and_thread_safe():
    c = make_case(8, 6, 7, 9, 2, 2, np.float32, lengths=[8, 8, 6, 5, 2, 1], seed=17)
    args = (c["x"], c["hx"], c["params"], c["dy"], c["dh"], c["dc"], *c["fw"].saved[:7], c["bs"])
    first = lstmgrad.lstm_backward(*args, **c["kw"])
    results = [None] * 4

    def work(j):
        results[j] = lstmgrad.lstm_backward(*args, **c["kw"])

    threads = [threading.Thread(target=work, args=(j,)) for j in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for r in results:
        assert_identical(r, first)


def test_default_engine_is_fused_and_impl_is_validated():
    import inspect

    assert inspect.signature(lstmgrad.lstm_backward).parameters["impl"].default == "fused"
    assert inspect.signature(lstmgrad.lstm_forward).parameters["impl"].default == "fused"
    c = make_case(2, 2, 2, 2, 1, 1, np.float32)
    with pytest.raises(lstmgrad.LstmInvalidArgumentError) as err:
        lstmgrad.lstm_forward(c["x"], c["params"], impl="fast")
    assert err.value.param == "impl" and "fast" in str(err.value)


def test_recycled_memory_never_aliases_live_results():
    """Result blocks are recycled once collected: results still held must never change."""
    a = make_case(6, 4, 5, 7, 2, 2, np.float32, seed=21)
    b = make_case(6, 4, 5, 7, 2, 2, np.float32, seed=22)
    kept_f = lstmgrad.lstm_forward(a["x"], a["params"], a["hx"], **a["kw"])
    kept_b = lstmgrad.lstm_backward(
        a["x"], a["hx"], a["params"], a["dy"], a["dh"], a["dc"], *kept_f.saved[:7], **a["kw"]
    )
    snapshot = [x.copy() for x in [kept_f.output, *kept_f.saved.h, kept_b.dx, *kept_b.dparams]]
    for _ in range(3):  # later calls, their results dropped at once, recycle their own blocks
        f = lstmgrad.lstm_forward(b["x"], b["params"], b["hx"], **b["kw"])
        lstmgrad.lstm_backward(
            b["x"], b["hx"], b["params"], b["dy"], b["dh"], b["dc"], *f.saved[:7], **b["kw"]
        )
        del f
    for x, y in zip(
        [kept_f.output, *kept_f.saved.h, kept_b.dx, *kept_b.dparams], snapshot, strict=True
    ):
        assert np.array_equal(x, y)
    only_h = kept_f.saved.h[0]  # one array alone keeps its block alive
    del kept_f, kept_b
    lstmgrad.lstm_forward(b["x"], b["params"], b["hx"], **b["kw"])
    assert np.array_equal(only_h, snapshot[1])


def test_float32_exp_tanh_sigmoid_within_their_documented_ulps():
    """vmath's float32 exp, tanh and sigmoid, compiled with the kernels' own flags, against
    float64 NumPy on dense sweeps: the bounds docs/math.md states (1.01, 1.26, 2.5 ulp)."""
    from lstmgrad.fused import kernels
    from lstmgrad.fused.vmath import vexp, vsigmoid, vtanh

    @kernels._jit
    def run(x, e, t, s):  # pragma: no cover - compiled
        for j in range(x.shape[0]):
            e[j] = vexp(x[j])
            t[j] = vtanh(x[j])
            s[j] = vsigmoid(x[j])

    def max_ulps(got, want):
        spacing = np.spacing(np.abs(want.astype(np.float32))).astype(np.float64)
        return float(np.max(np.abs(got.astype(np.float64) - want) / spacing))

    for lo, hi in ((-20.0, 20.0), (-87.0, 88.0)):
        x = np.linspace(lo, hi, 1_000_001).astype(np.float32)
        e, t, s = (np.empty_like(x) for _ in range(3))
        run(x, e, t, s)
        xd = x.astype(np.float64)
        assert max_ulps(e, np.exp(xd)) <= 1.01
        if hi == 20.0:  # tanh and sigmoid saturate to 1 ulp of +-1 beyond
            assert max_ulps(t, np.tanh(xd)) <= 1.26
            assert max_ulps(s, 1.0 / (1.0 + np.exp(-xd))) <= 2.5


@pytest.mark.parametrize("rows, cols", [(0, 5), (1, 1), (3, 5), (8, 8), (64, 64), (65, 129),
                                        (200, 7), (513, 260), (2048, 64)])  # fmt: skip
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_transposes_match_numpy(rows, cols, dtype):
    """The engine's tiled transposes (weights, dG, [x | h_prev]) against NumPy's, edges
    included: sides that are not multiples of the tile, one row, no rows, column ranges."""
    from lstmgrad.fused import kernels, walks

    a = np.random.default_rng(rows * 1000 + cols).standard_normal((rows, cols)).astype(dtype)
    got = kernels.transposed(a)
    assert got.flags.c_contiguous and np.array_equal(got, a.T)
    assert np.array_equal(kernels.transposed(a.T), a)
    back = kernels.contiguous(a.T)
    assert back.flags.c_contiguous and np.array_equal(back, a.T)
    assert kernels.contiguous(a) is a
    c0, c1 = cols // 3, cols - cols // 4
    want = np.full((cols, rows), -7.0, dtype=dtype)
    want[c0:c1] = a.T[c0:c1]
    for threads in (1, 2, 3):  # split over threads: each its own block of columns
        flat = np.full(rows * cols + 3, -7.0, dtype=dtype)
        walks.transpose_cols(a.reshape(-1), cols, rows, c0, c1, flat, threads)
        assert np.array_equal(flat[: rows * cols].reshape(cols, rows), want)
        assert np.all(flat[rows * cols :] == -7.0)  # nothing written past the result
    if rows:
        src = np.zeros((cols, rows + 5), dtype=dtype)
        src[:, :rows] = a.T
        dst = np.zeros((rows + 2, cols), dtype=dtype)
        kernels.transpose_into(dst, src, rows)
        assert np.array_equal(dst[:rows], a) and not dst[rows:].any()


@pytest.mark.parametrize(
    "m,k,n",
    [(1, 1, 1), (3, 7, 5), (7, 8, 200), (5, 17, 33), (4, 64, 16), (2, 0, 3), (13, 9, 70)],
)
def test_matmul_into_is_the_product_accumulated_in_order(m, k, n):
    """kernels.matmul_into (the walks' recurrent product) against float64 NumPy, for k below,
    at and off its blocks of four, rows below four, in whole blocks of four and with a last
    block overlapping the one before; the same bits whatever a's strides, and as one row at
    a time."""
    from lstmgrad.fused import kernels

    rng = np.random.default_rng(m * 100 + k * 10 + n)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    out = np.full((m, n), np.nan, dtype=np.float32)
    kernels.matmul_into(a, b, out)
    want = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5 * max(k, 1))
    strided = np.asfortranarray(a)  # a of any strides
    again = np.empty_like(out)
    kernels.matmul_into(strided, b, again)
    assert np.array_equal(again, out)
    for r in range(m):  # a row's bits do not depend on the rows computed beside it
        row = np.empty((1, n), dtype=np.float32)
        kernels.matmul_into(a[r : r + 1], b, row)
        assert np.array_equal(row[0], out[r])
