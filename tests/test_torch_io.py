"""torch CPU tensors through the core API (Pythonic and C-style): the same results as NumPy
arrays, tensors back, zero copy in and out, any strides, the contract's errors."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import lstmgrad  # noqa: E402
import lstmgrad.planning.plan  # noqa: E402
from lstmgrad import aclnn  # noqa: E402
from lstmgrad.planning.plan import forced  # noqa: E402

SAVED = ("i", "g", "f", "o", "h", "c", "tanhc")


def make(dtype=np.float64, num_layers=2, bidirectional=True, t=4, b=3, i=5, h=6, seed=0):
    rng = np.random.default_rng(seed)
    d = 2 if bidirectional else 1
    params = []
    for layer in range(num_layers):
        width = i if layer == 0 else d * h
        for _ in range(d):
            params += [rng.uniform(-0.4, 0.4, s).astype(dtype) for s in
                       [(4 * h, width), (4 * h, h), (4 * h,), (4 * h,)]]  # fmt: skip
    x = rng.standard_normal((t, b, i)).astype(dtype)
    hx = [rng.standard_normal((num_layers * d, b, h)).astype(dtype) for _ in range(2)]
    dy = rng.standard_normal((t, b, d * h)).astype(dtype)
    kw = dict(num_layers=num_layers, bidirectional=bidirectional)
    return x, hx, params, dy, kw


def tensors(value):
    if isinstance(value, np.ndarray):
        return torch.from_numpy(value.copy())
    if isinstance(value, (list, tuple)):
        return [tensors(v) for v in value]
    return value


def assert_close(got, want, rtol):
    assert isinstance(got, torch.Tensor), type(got)
    want = torch.from_numpy(np.asarray(want))
    assert got.shape == want.shape and got.dtype == want.dtype
    err = ((got - want).abs().max() / want.abs().max().clamp_min(1e-30)).item()
    assert err <= rtol, err


def assert_backward_close(got, want, rtol):
    """Every output of two backward results: the same ones present (output_mask), each close."""
    for name in ("dx", "dh_prev", "dc_prev"):
        assert (getattr(got, name) is None) == (getattr(want, name) is None), name
        if getattr(want, name) is not None:
            assert_close(getattr(got, name), getattr(want, name), rtol)
    assert (got.dparams is None) == (want.dparams is None)
    for g, w in zip(got.dparams or [], want.dparams or [], strict=True):
        assert_close(g, w, rtol)


SIZES = {
    "small": dict(t=4, b=3, i=5, h=6),
    # T*B < 4H (the "nt" layout's case)
    "onednn": dict(t=4, b=16, i=64, h=128),
    # T*B >= 4H: more rows than the gates' width
    "tall": dict(t=14, b=16, i=48, h=56),
}
# the GEMM methods of the big products a plan can name ("onednn" runs torch.mm where this torch
# build lacks it)
BIG_METHODS = lstmgrad.planning.plan.BIG_METHODS
BATCH_SIZES = {
    "small": [3, 3, 2, 1],
    "onednn": [16, 13, 9, 2],
    "tall": [16] * 8 + [14, 12, 12, 9, 5, 2],
}


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize(
    "dtype,rtol", [(np.float64, 1e-12), (np.float32, 1e-5)], ids=["f64", "f32"]
)
@pytest.mark.parametrize("varlen", [False, True], ids=["dense", "varlen"])
def test_tensors_give_the_numpy_results(dtype, rtol, varlen, size):
    x, hx, params, dy, kw = make(dtype, **SIZES[size])
    bs = None
    if varlen:
        bs = np.array(BATCH_SIZES[size], dtype=np.int64)
        x, dy = x.reshape(-1, x.shape[-1]), dy.reshape(-1, dy.shape[-1])
    fw_np = lstmgrad.lstm_forward(x, params, hx, bs, **kw)
    fw_t = lstmgrad.lstm_forward(tensors(x), tensors(params), tensors(hx), tensors(bs), **kw)
    assert isinstance(fw_t, lstmgrad.LstmForwardResult)
    for got, want in zip(fw_t[:3], fw_np[:3], strict=True):
        assert_close(got, want, rtol)
    for got, want in zip(fw_t.saved[:7], fw_np.saved[:7], strict=True):
        for a, b in zip(got, want, strict=True):
            assert_close(a, b, rtol)
    bw_np = lstmgrad.lstm_backward(x, hx, params, dy, None, None, *fw_np.saved[:7], bs, **kw)
    bw_t = lstmgrad.lstm_backward(
        tensors(x), tensors(hx), tensors(params), tensors(dy), None, None,
        *[tensors(s) for s in fw_np.saved[:7]], tensors(bs), **kw,
    )  # fmt: skip
    assert isinstance(bw_t, lstmgrad.LstmBackwardResult)
    for got, want in zip([bw_t.dx, bw_t.dh_prev, bw_t.dc_prev, *bw_t.dparams],
                         [bw_np.dx, bw_np.dh_prev, bw_np.dc_prev, *bw_np.dparams], strict=True):  # fmt: skip
        assert_close(got, want, rtol)


def test_strided_tensors_and_requires_grad():
    x, hx, params, dy, kw = make(np.float64)
    # batch_first views of a time-major buffer, a transposed weight copy read back through .T
    xt = torch.from_numpy(x).transpose(0, 1).requires_grad_()
    pt = [torch.from_numpy(np.ascontiguousarray(p.T)).T if p.ndim == 2 else torch.from_numpy(p)
          for p in params]  # fmt: skip
    assert not xt.is_contiguous() and not pt[0].is_contiguous()
    got = lstmgrad.lstm_forward(xt, pt, tensors(hx), batch_first=True, **kw)
    want = lstmgrad.lstm_forward(np.ascontiguousarray(x.transpose(1, 0, 2)), params, hx,
                                 batch_first=True, **kw)  # fmt: skip
    assert_close(got.output, want.output, 1e-12)
    assert not got.output.requires_grad


def test_zero_copy_in_and_out():
    """Tensors are read through NumPy views of their own memory (any strides), and the results
    are tensors over the engine's result blocks (output, hy, cy back to back; the saved lists
    back to back in a block of their own, so the output alone does not pin them), not copies."""
    from lstmgrad.ops.tensors import to_numpy

    x, hx, params, dy, kw = make(np.float32)
    xt = torch.from_numpy(x).transpose(0, 1)
    view = to_numpy("f", "input", xt)
    assert view.ctypes.data == xt.data_ptr() and view.strides == (4 * x.shape[2], 4 * x[0].size, 4)
    fw = lstmgrad.lstm_forward(torch.from_numpy(x), tensors(params), tensors(hx), **kw)
    out, hy, cy = fw.output, fw.hy, fw.cy
    assert hy.data_ptr() == out.data_ptr() + out.numel() * 4
    assert cy.data_ptr() == hy.data_ptr() + hy.numel() * 4
    act = fw.saved.i[-1]
    assert fw.saved.g[0].data_ptr() == act.data_ptr() + act.numel() * 4


def test_gemms_run_on_torch(monkeypatch):
    """With tensor arguments every GEMM of the fused engine goes through torch (never NumPy's
    BLAS); with arrays, none does."""
    import lstmgrad.ops.api
    from lstmgrad.ops.tensors import TorchGemm

    calls = []

    class Counting(TorchGemm):
        def product(self, a, b, scratch, method, /):
            calls.append("product")
            return super().product(a, b, scratch, method)

        def fixed(self, b, method, rows, threads=1):
            product = super().fixed(b, method, rows, threads)

            def counted(a, out):
                calls.append("fixed")
                return product(a, out)

            return counted

    monkeypatch.setattr(lstmgrad.ops.api, "torch_gemm", Counting)
    x, hx, params, dy, kw = make(np.float32, num_layers=1, bidirectional=False)
    with lstmgrad.planning.plan.forced(pair_walks=False):
        fw = lstmgrad.lstm_forward(tensors(x), tensors(params), tensors(hx), **kw)
        # the input projection, then one recurrent product per step
        assert calls == ["product"] + ["fixed"] * x.shape[0]
        calls.clear()
        lstmgrad.lstm_backward(tensors(x), tensors(hx), tensors(params), tensors(dy), None, None,
                               *fw.saved[:7], **kw)  # fmt: skip
        # one recurrent product per step but the last (dh_prev needs it too), then dx, dW_ih
        # and dW_hh
        assert calls == ["fixed"] * x.shape[0] + ["product"] * 3
        calls.clear()
        lstmgrad.lstm_forward(x, params, hx, **kw)
        assert calls == []


@pytest.mark.parametrize(
    "bad,param,match",
    [
        ("bfloat16", "input", "input must have dtype float16, float32 or float64, got torch.bfloat16"),
        ("meta", "input", "input must be a CPU tensor, got a tensor on meta"),
        ("param-bf16", "params", "params\\[1\\] must have dtype"),
        ("param-meta", "params", "params\\[2\\] must be a CPU tensor, got a tensor on meta"),
        ("int-input", "input", "input must have dtype float16, float32 or float64, got int32"),
    ],
)  # fmt: skip
def test_tensor_errors_name_the_argument(bad, param, match):
    x, hx, params, dy, kw = make(np.float32)
    xt, pt = tensors(x), tensors(params)
    if bad == "bfloat16":
        xt = xt.bfloat16()
    elif bad == "meta":
        xt = torch.empty(x.shape, device="meta")
    elif bad == "param-bf16":
        pt[1] = pt[1].bfloat16()
    elif bad == "param-meta":
        pt[2] = torch.empty(pt[2].shape, device="meta")
    elif bad == "int-input":
        xt = xt.int()
    with pytest.raises(lstmgrad.LstmInvalidArgumentError, match=match) as exc:
        lstmgrad.lstm_forward(xt, pt, tensors(hx), **kw)
    assert exc.value.code == 161002 and exc.value.param == param


@pytest.mark.parametrize("size", ["small", "onednn", "tall"])
def test_aclnn_mirror_writes_into_tensors(size):
    # "onednn", "tall": the workspace holds a transposed operand of the weight gradient ("nt")
    x, hx, params, dy, kw = make(np.float32, **SIZES[size])
    k, b, h = hx[0].shape
    want = lstmgrad.lstm_forward(x, params, hx, **kw)
    out = torch.empty(dy.shape)
    hy, cy = torch.empty(k, b, h), torch.empty(k, b, h)
    lists = [[torch.empty(x.shape[0], b, h) for _ in range(k)] for _ in SAVED]
    status, size, ex = aclnn.aclnnLSTMGetWorkspaceSize(
        tensors(x), tensors(params), tensors(hx), None, True, 2, 0.0, True, True, False,
        out, hy, cy, *lists,
    )  # fmt: skip
    assert status == aclnn.ACLNN_SUCCESS, aclnn.aclGetRecentErrMsg()
    assert aclnn.aclnnLSTM(torch.empty(size, dtype=torch.uint8), size, ex, None) == 0
    assert_close(out, want.output, 1e-5)
    assert_close(cy, want.cy, 1e-5)
    dx = torch.empty(x.shape)
    dh_prev, dc_prev = torch.empty(k, b, h), torch.empty(k, b, h)
    dparams = [torch.empty(p.shape) for p in params]
    status, size, ex = aclnn.aclnnLstmBackwardGetWorkspaceSize(
        tensors(x), tensors(hx), tensors(params), tensors(dy), None, None, *lists, None,
        True, 2, 0.0, True, True, False, None, dx, dh_prev, dc_prev, dparams,
    )  # fmt: skip
    assert status == aclnn.ACLNN_SUCCESS, aclnn.aclGetRecentErrMsg()
    assert aclnn.aclnnLstmBackward(torch.empty(size, dtype=torch.uint8), size, ex, None) == 0
    bw = lstmgrad.lstm_backward(x, hx, params, dy, None, None, *want.saved[:7], **kw)
    assert_close(dx, bw.dx, 1e-5)
    for got, want_p in zip(dparams, bw.dparams, strict=True):
        assert_close(got, want_p, 2e-5)
    bad = aclnn.aclnnLSTMGetWorkspaceSize(
        tensors(x).bfloat16(), tensors(params), tensors(hx), None, True, 2, 0.0, True, True,
        False, out, hy, cy, *lists,
    )  # fmt: skip
    assert bad[0] == aclnn.ACLNN_ERR_PARAM_INVALID and "bfloat16" in aclnn.aclGetRecentErrMsg()


@pytest.mark.parametrize("big", BIG_METHODS)
@pytest.mark.parametrize("size", ["onednn", "tall"])
@pytest.mark.parametrize(
    "mask", [(False, True, True, True), (True, False, False, True), (False, False, False, True)]
)
def test_weight_gradient_with_output_masks(size, mask, big):
    """Only the requested outputs, equal to the reference's, whatever the method."""
    x, hx, params, dy, kw = make(np.float32, **SIZES[size])
    fw = lstmgrad.lstm_forward(x, params, hx, **kw)
    args = (x, hx, params, dy, hx[0], hx[1], *fw.saved[:7])
    want = lstmgrad.lstm_backward(*args, output_mask=mask, impl="reference", **kw)
    for transpose_threads in (1, 2):  # the transposing copies on one and two threads
        with forced(big=big, transpose_threads=transpose_threads):
            got = lstmgrad.lstm_backward(*[tensors(a) for a in args], output_mask=mask, **kw)
        assert_backward_close(got, want, 2e-5)


@pytest.mark.parametrize("big", BIG_METHODS)
@pytest.mark.parametrize("size", ["small", "onednn", "tall"])
def test_weight_gradient_keeps_float16_storage(size, big):
    """float16 storage computes in float32: the weight gradients come back float16, rounded,
    as the NumPy path's."""
    x, hx, params, dy, kw = make(np.float16, **SIZES[size])
    fw = lstmgrad.lstm_forward(x, params, hx, **kw)
    want = lstmgrad.lstm_backward(x, hx, params, dy, None, None, *fw.saved[:7], **kw)
    with forced(big=big, fwd_rec="loop", bwd_rec="loop"):
        got = lstmgrad.lstm_backward(
            tensors(x), tensors(hx), tensors(params), tensors(dy), None, None,
            *[tensors(s) for s in fw.saved[:7]], **kw,
        )  # fmt: skip
    for g, w in zip([got.dx, *got.dparams], [want.dx, *want.dparams], strict=True):
        assert g.dtype == torch.float16
        assert_close(g.float(), w.astype(np.float32), 4e-3)  # a few float16 steps


@pytest.mark.parametrize("big", BIG_METHODS)
@pytest.mark.parametrize("size", ["onednn", "tall"])
def test_weight_gradient_with_dropout_masks_and_any_lengths(size, big):
    """The weight gradient packs the layers' inputs (dropout masks applied) for any batch_sizes
    (unsorted too), or reads them in place: the same gradients as NumPy's GEMMs, and as the
    reference."""
    x, hx, params, dy, kw = make(np.float32, num_layers=3, **SIZES[size])
    rng = np.random.default_rng(5)
    t, b = x.shape[:2]
    masks = [(rng.random((t, b, 2 * SIZES[size]["h"])) > 0.3).astype(np.float32) / 0.7
             for _ in range(2)]  # fmt: skip
    for bs in (None, np.array(BATCH_SIZES[size][::-1], dtype=np.int64)):  # unsorted
        xs, dys = (x, dy) if bs is None else (x.reshape(t * b, -1), dy.reshape(t * b, -1))
        kw2 = dict(kw, dropout=0.3, train=True)
        fw = lstmgrad.lstm_forward(xs, params, hx, bs, dropout_masks=masks, **kw2)
        args = (xs, hx, params, dys, hx[0], hx[1], *fw.saved[:7], bs)
        want = lstmgrad.lstm_backward(*args, dropout_masks=masks, **kw2)
        ref = lstmgrad.lstm_backward(*args, dropout_masks=masks, impl="reference", **kw2)
        with forced(big=big):
            got = lstmgrad.lstm_backward(
                *[tensors(a) for a in args], dropout_masks=tensors(masks), **kw2
            )
        for g, w, r in zip([got.dx, got.dh_prev, got.dc_prev, *got.dparams],
                           [want.dx, want.dh_prev, want.dc_prev, *want.dparams],
                           [ref.dx, ref.dh_prev, ref.dc_prev, *ref.dparams], strict=True):  # fmt: skip
            assert_close(g, w, 2e-5)
            assert_close(g, r, 2e-5)


@pytest.mark.parametrize("lib", ["numpy", "torch", "torch-public"])
# (16, 1024, 256): a recurrent product of the backward's shape (b with more rows than columns)
# (3, 1, 4), (3, 4, 1): one row or one column of b (a layer with H = 1)
@pytest.mark.parametrize("m,k,n", [(5, 7, 3), (64, 256, 512), (512, 64, 256), (16, 1024, 256),
                                   (3, 1, 4), (3, 4, 1)])  # fmt: skip
def test_gemm_products_against_float64(monkeypatch, lib, m, k, n):
    """Every method of every product of the Gemm interface (lstmgrad.fused.gemm.Gemm) equals float64
    matmul, for both libraries; with LSTMGRAD_PRIVATE_OPS=0 torch offers its public torch.mm
    only (and computes the same); results C-contiguous."""
    from lstmgrad.fused.gemm import NUMPY_GEMM
    from lstmgrad.ops import tensors as tensors_mod
    from lstmgrad.ops.tensors import TorchGemm

    if lib == "torch-public":
        monkeypatch.setenv("LSTMGRAD_PRIVATE_OPS", "0")
    gemm = NUMPY_GEMM if lib == "numpy" else TorchGemm()
    f32 = np.dtype(np.float32)
    if lib == "torch-public":
        assert gemm.product_methods(f32) == ("blas",)
        assert not {"onednn", "packed", "mkl"} & set(gemm.fixed_methods(f32))
    elif lib == "torch":
        if tensors_mod._probe_onednn(torch):
            assert "onednn" in gemm.product_methods(f32) and "packed" in gemm.fixed_methods(f32)
        assert ("mkl" in gemm.fixed_methods(f32)) == tensors_mod._probe_mkl(torch)
        assert "mkl" not in gemm.fixed_methods(np.dtype(np.float64))
    rng = np.random.default_rng(7)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    want = a.astype(np.float64) @ b.astype(np.float64)

    def check(got, want):
        assert got.shape == want.shape and got.dtype == np.float32
        assert got.flags.c_contiguous
        assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()

    for method in gemm.product_methods(f32):
        check(gemm.product(a, b, np.full((m, n), np.nan, np.float32), method), want)
        check(gemm.nt(a, b, method), want)  # at @ b
    out = np.full((m, n), np.nan, np.float32)
    b_view = np.ascontiguousarray(b.T).T  # b as the transposed view the forward passes
    for method in gemm.fixed_methods(f32):
        out[...] = np.nan
        product = gemm.fixed(b, method, m)
        got = product(a, out)
        check(got, want)
        assert got is out or np.isnan(out).all()  # out, or the library's own result
        check(product(a[: m // 2 + 1], out[: m // 2 + 1]), want[: m // 2 + 1])  # fewer rows
        # a transposing copy on two threads: the same bits as on one (b's layout may choose
        # the library's kernel: MKL's torch.mm rounds b and its transposed view differently)
        for mat in (b, b_view):
            one = np.array(gemm.fixed(mat, method, m, 1)(a, out))
            check(one, want)
            assert np.array_equal(np.array(gemm.fixed(mat, method, m, 2)(a, out)), one)
    # the walks' product: the library's own GEMM where it has one to call (torch with MKL and
    # private ops allowed), on rows of a wider array as the walks pass them
    from lstmgrad.fused.kernels import gemm_scratch, walk_product

    for dtype in (np.float32, np.float64):
        fn = gemm.walk_gemm(np.dtype(dtype))
        if lib == "torch" and torch.backends.mkl.is_available():
            assert fn != 0
        elif lib != "torch":
            assert fn == 0
        wide = np.concatenate([a, a[:3]]).astype(dtype)  # rows 2 .. m + 1: a block of rows
        want_d = wide[2 : m + 2].astype(np.float64) @ b.astype(np.float64)
        tol = 1e-5 if dtype == np.float32 else 1e-12
        # b C-contiguous, and (the library only) the transposed view of a C-contiguous matrix,
        # which the library reads transposed in place (the forward's W_hh.T)
        views = [b.astype(dtype)] + ([np.ascontiguousarray(b.T.astype(dtype)).T] if fn else [])
        for mat in views:
            got = np.full((m, n), np.nan, dtype)
            walk_product(fn, wide[2 : m + 2], mat, got, *gemm_scratch(got))
            assert np.abs(got - want_d).max() <= tol * np.abs(want_d).max()
    # the packed product (MKL's, float32 only): b packed once, then products of m rows, of
    # fewer (variable lengths) and of one, both layouts of b; packed for one row, two rows
    packed_fn = gemm.walk_gemm(f32, True)
    assert gemm.walk_gemm(np.dtype(np.float64), True) == 0
    if lib == "torch":
        assert (packed_fn != 0) == tensors_mod._probe_packed_gemm(torch)
    else:
        assert packed_fn == 0
    if packed_fn:
        wide = np.concatenate([a, a[:3]])
        for mat in (b, b_view):
            for rows in (m, 1):
                buf = np.full(gemm.walk_pack_bytes(mat.shape, rows), 255, np.uint8)
                packed = gemm.walk_pack(mat, rows, buf)
                assert packed.shape == (k, n) and packed.dtype == np.uint8
                for r in sorted({m, m // 2 + 1, 1}) if rows == m else (1,):
                    got = np.full((r, n), np.nan, np.float32)
                    walk_product(packed_fn, wide[2 : r + 2], packed, got, *gemm_scratch(got))
                    check(got, wide[2 : r + 2].astype(np.float64) @ b.astype(np.float64))


def test_lazy_negation_views_are_read_as_their_values():
    """A tensor with the negative bit set (a lazy view torch.Tensor.numpy refuses) is read as
    the values it stands for, like any other tensor."""
    x, hx, params, dy, kw = make(np.float64)
    neg_view = torch.from_numpy(-x)._neg_view()  # holds -x in memory, reads as x
    assert neg_view.is_neg()
    got = lstmgrad.lstm_forward(neg_view, tensors(params), tensors(hx), **kw)
    want = lstmgrad.lstm_forward(x, params, hx, **kw)
    assert_close(got.output, want.output, 1e-12)


@pytest.mark.parametrize("method", ["blas", "blas_t", "loop", "onednn", "packed", "mkl"])
def test_recurrent_product_methods_over_long_runs(method):
    """Each recurrent-product method of a plan (the packed weight of a long run too), forward
    and backward, gives NumPy's GEMMs' and the reference's gradients, dense and with unsorted
    lengths (steps with fewer rows than the weight was packed for); "onednn", "packed" and
    "mkl" run torch.mm where this torch build lacks them."""
    t, b, i, h = 130, 16, 32, 128
    x, hx, params, dy, kw = make(np.float32, num_layers=1, t=t, b=b, i=i, h=h)
    rng = np.random.default_rng(3)
    lengths = rng.integers(1, t + 1, b)
    bs = np.array([(lengths > s).sum() for s in range(t)], dtype=np.int64)
    for batch_sizes in (None, bs):
        xs, dys = (x, dy) if batch_sizes is None else (x.reshape(t * b, -1), dy.reshape(t * b, -1))
        fw = lstmgrad.lstm_forward(xs, params, hx, batch_sizes, **kw)
        args = (xs, hx, params, dys, hx[0], hx[1], *fw.saved[:7], batch_sizes)
        want = lstmgrad.lstm_backward(*args, **kw)
        ref = lstmgrad.lstm_backward(*args, impl="reference", **kw)
        with forced(fwd_rec=method, bwd_rec=method):
            fw_t = lstmgrad.lstm_forward(*[tensors(a) for a in (xs, params, hx, batch_sizes)],
                                         **kw)  # fmt: skip
            got = lstmgrad.lstm_backward(*[tensors(a) for a in args], **kw)
        assert_close(fw_t.output, fw.output, 2e-5)
        for g, w, r in zip([got.dx, got.dh_prev, got.dc_prev, *got.dparams],
                           [want.dx, want.dh_prev, want.dc_prev, *want.dparams],
                           [ref.dx, ref.dh_prev, ref.dc_prev, *ref.dparams], strict=True):  # fmt: skip
            assert_close(g, w, 2e-5)
            assert_close(g, r, 2e-5)


@pytest.fixture
def two_threads(monkeypatch):
    """Two threads for the multi-threaded kernels, whatever this run's thread settings: skipped
    only where they cannot run at all (Numba's layer not GNU OpenMP, or a pool of one thread);
    on one visible CPU, or with torch on one thread, both threads are forced (they then take
    turns on the CPU: the results must not change)."""
    import numba

    from lstmgrad.core import machine
    from lstmgrad.planning import openmp

    if not openmp.pairs_available():
        pytest.skip("Numba's threading layer here is not GNU OpenMP: no multi-threaded kernels")
    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("Numba's thread pool has one thread (NUMBA_NUM_THREADS=1, or one CPU "
                    "visible to the process at start)")  # fmt: skip
    real = machine.visible_cpus()
    monkeypatch.setattr(machine, "visible_cpus", lambda: max(2, real))
    numba_before, torch_before = numba.get_num_threads(), torch.get_num_threads()
    numba.set_num_threads(2)
    torch.set_num_threads(max(2, torch_before))
    lstmgrad.planning.plan.forget()
    try:
        yield 2
    finally:
        numba.set_num_threads(numba_before)
        torch.set_num_threads(torch_before)
        lstmgrad.planning.plan.forget()


def _record_results(monkeypatch, module, name):
    """Wrap module.<name> so that the values its calls return are listed in the result."""
    results: list = []
    fn = getattr(module, name)
    monkeypatch.setattr(module, name, lambda *a: (results.append(fn(*a)), results[-1])[1])
    return results


def _record_calls(monkeypatch, module, names):
    """Wrap module.<name> for each name so that its calls are listed (by name) in the result."""
    taken: list[str] = []
    for name in names:
        fn = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, _f=fn, _n=name: (taken.append(_n), _f(*a))[1])
    return taken


@pytest.mark.parametrize(
    "dtype,rtol", [(np.float64, 1e-12), (np.float32, 2e-5)], ids=["f64", "f32"]
)
@pytest.mark.parametrize(
    "case", ["dense", "lengths-with-empty-steps", "no-dy", "dh-prev-off"]
)  # fmt: skip
@pytest.mark.parametrize("walk_product", ["loop", "library", "packed"])
def test_bidirectional_pair_walks(monkeypatch, two_threads, dtype, rtol, case, walk_product):
    """A plan's pair walks (both directions of a bidirectional layer at once, fused.walks),
    their recurrent products by the Numba loop, by torch's own GEMM or by its packed GEMM
    (float32; float64 falls back to the GEMM): taken, and equal to NumPy's path (one direction
    at a time through NumPy's BLAS) and to the reference, with any batch sizes (empty steps
    included), without dy, and without dh_prev."""
    from lstmgrad.fused import lstm, walks

    _skip_without(walk_product, dtype)
    taken = _record_calls(monkeypatch, walks, ("forward_walk_parts", "backward_walk_parts"))
    fns = _record_results(monkeypatch, lstm, "_walk_gemm")
    t, b, i, h = 6, 4, 5, 7
    x, hx, params, dy, kw = make(dtype, num_layers=2, t=t, b=b, i=i, h=h)
    bs = None
    if case == "lengths-with-empty-steps":
        bs = np.array([4, 0, 3, 3, 0, 1], dtype=np.int64)
        x, dy = x.reshape(t * b, -1), dy.reshape(t * b, -1)
    fw_np = lstmgrad.lstm_forward(x, params, hx, bs, **kw)
    with forced(pair_walks=True, threads=two_threads, walk_product=walk_product):
        fw_t = lstmgrad.lstm_forward(tensors(x), tensors(params), tensors(hx), tensors(bs), **kw)
    for got, want in zip(fw_t[:3], fw_np[:3], strict=True):
        assert_close(got, want, rtol)
    dy_arg = None if case == "no-dy" else dy
    dh = hx[0] if case == "no-dy" else None  # some gradient must flow
    mask = (True, False, True, True) if case == "dh-prev-off" else None
    args = (x, hx, params, dy_arg, dh, None, *fw_np.saved[:7], bs)
    want = lstmgrad.lstm_backward(*args, output_mask=mask, **kw)
    ref = lstmgrad.lstm_backward(*args, output_mask=mask, impl="reference", **kw)
    with forced(pair_walks=True, threads=two_threads, walk_product=walk_product):
        got = lstmgrad.lstm_backward(*[tensors(a) for a in args], output_mask=mask, **kw)
    assert taken == ["forward_walk_parts"] * 2 + ["backward_walk_parts"] * 2  # 2 layers
    assert len(fns) >= 4 and all(fn == _walk_fn(walk_product, dtype) for fn in fns)
    assert_backward_close(got, want, rtol)
    assert_backward_close(got, ref, max(rtol, 1e-5))


@pytest.mark.parametrize(
    "dtype,rtol", [(np.float64, 1e-12), (np.float32, 2e-5), (np.float16, 4e-3)],
    ids=["f64", "f32", "f16"],
)  # fmt: skip
@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
@pytest.mark.parametrize("case", ["dense", "lengths-with-empty-steps", "no-dy", "dh-prev-off"])
@pytest.mark.parametrize("kind", ["numpy", "tensors"])
@pytest.mark.parametrize("walk_product", ["loop", "library", "packed"])
def test_whole_step_loops_in_one_call(monkeypatch, dtype, rtol, bidirectional, case, kind,
                                      walk_product):  # fmt: skip
    """A plan's walks (each direction's step loop in one Numba call, one thread), their
    recurrent products by the Numba loop, by torch's own GEMM or its packed GEMM (NumPy
    inputs: the loop whatever the plan asks): taken for every layer and direction, equal to
    the reference, for every storage dtype, with any batch sizes (empty steps included),
    without dy and without dh_prev."""
    from lstmgrad.fused import lstm, walks

    cd = lstmgrad.planning.plan.compute_dtype(dtype)
    if kind == "tensors":
        _skip_without(walk_product, cd)
    taken = _record_calls(monkeypatch, walks, ("forward_walk_of", "backward_walk_of"))
    fns = _record_results(monkeypatch, lstm, "_walk_gemm")
    bs = [4, 0, 3, 3, 0, 1] if case == "lengths-with-empty-steps" else None
    fields = dict(walk=True, pair_walks=False, walk_product=walk_product)
    _forced_against_reference(fields, dtype, rtol, bidirectional, case, kind, 4, bs)
    layers_dirs = 2 * (2 if bidirectional else 1)
    assert taken == ["forward_walk_of"] * layers_dirs + ["backward_walk_of"] * layers_dirs
    want = _walk_fn(walk_product, cd) if kind == "tensors" else 0
    assert len(fns) == 2 * layers_dirs and all(fn == want for fn in fns)


def _walk_fn(walk_product: str, dtype) -> int:  # type: ignore[no-untyped-def]
    """The address a walk of torch tensors calls for ``walk_product`` (0: the Numba loop):
    the packed GEMM for float32 only, the plain GEMM in its place for float64."""
    from lstmgrad.ops.tensors import TorchGemm

    gemm = TorchGemm()
    if walk_product == "packed" and gemm.walk_gemm(dtype, True):
        return gemm.walk_gemm(dtype, True)
    return gemm.walk_gemm(dtype) if walk_product != "loop" else 0


def _skip_without(walk_product: str, dtype) -> None:  # type: ignore[no-untyped-def]
    from lstmgrad.ops.tensors import TorchGemm

    if walk_product != "loop" and not TorchGemm().walk_gemm(dtype):
        pytest.skip("this torch build exports no GEMM for the walks to call (no MKL)")


def _forced_against_reference(fields, dtype, rtol, bidirectional, case, kind, b, bs):  # type: ignore[no-untyped-def]
    """A 2-layer forward and backward (T = 6, I = 5, H = 7, ``b`` rows, batch sizes ``bs`` or
    dense) of NumPy arrays or torch tensors (``kind``) under the forced plan ``fields``, each
    result within 2 * rtol of the reference's largest; ``case`` "no-dy" (no dy, a dh instead) and
    "dh-prev-off" (no dh_prev asked) as in the walk tests."""
    t, i, h = 6, 5, 7
    x, hx, params, dy, kw = make(dtype, num_layers=2, bidirectional=bidirectional, t=t, b=b,
                                 i=i, h=h)  # fmt: skip
    if bs is not None:
        bs = np.array(bs, dtype=np.int64)
        x, dy = x.reshape(t * b, -1), dy.reshape(t * b, -1)
    conv = tensors if kind == "tensors" else (lambda a: a)
    ref_fw = lstmgrad.lstm_forward(x, params, hx, bs, impl="reference", **kw)
    with forced(**fields):
        fw = lstmgrad.lstm_forward(conv(x), conv(params), conv(hx), conv(bs), **kw)
    for got, want in zip(fw[:3], ref_fw[:3], strict=True):
        got = got.numpy() if kind == "tensors" else got
        scale = np.abs(want.astype(np.float64)).max()
        assert np.abs(got.astype(np.float64) - want).max() <= 2 * rtol * scale
    dy_arg = None if case == "no-dy" else dy
    dh = hx[0] if case == "no-dy" else None  # some gradient must flow
    mask = (True, False, True, True) if case == "dh-prev-off" else None
    saved = [[a.numpy() for a in s] for s in fw.saved[:7]] if kind == "tensors" else fw.saved[:7]
    args = (x, hx, params, dy_arg, dh, None, *saved, bs)
    ref = lstmgrad.lstm_backward(*args, output_mask=mask, impl="reference", **kw)
    with forced(**fields):
        got = lstmgrad.lstm_backward(*[conv(a) for a in args], output_mask=mask, **kw)
    for name in ("dx", "dh_prev", "dc_prev"):
        assert (getattr(got, name) is None) == (getattr(ref, name) is None), name
    pairs = [(got.dx, ref.dx), (got.dc_prev, ref.dc_prev), (got.dh_prev, ref.dh_prev)]
    for g, w in pairs + list(zip(got.dparams, ref.dparams, strict=True)):
        if w is None:
            continue
        g = (g.numpy() if kind == "tensors" else g).astype(np.float64)
        w = np.asarray(w, dtype=np.float64)
        assert np.abs(g - w).max() <= 2 * rtol * max(np.abs(w).max(), 1e-30)


@pytest.mark.parametrize(
    "dtype,rtol", [(np.float64, 1e-12), (np.float32, 2e-5), (np.float16, 4e-3)],
    ids=["f64", "f32", "f16"],
)  # fmt: skip
@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
@pytest.mark.parametrize("case", ["dense", "lengths-with-empty-steps", "no-dy"])
@pytest.mark.parametrize("fwd_walk", [True, False], ids=["both-walk", "backward-walks"])
def test_row_block_walks(monkeypatch, two_threads, dtype, rtol, bidirectional, case, fwd_walk):
    """A plan's walks with each direction's batch rows in two blocks, each on a thread of its
    own (fused.walks.forward_walk_parts / backward_walk_parts; with fwd_walk False the forward
    calls the library per step instead): taken with two row blocks covering the batch, equal to
    the reference for every storage dtype, with any batch sizes (rows of a block idle at some
    steps, empty steps) and without dy."""
    from lstmgrad.fused import walks

    parts: list = []
    for name in ("forward_walk_parts", "backward_walk_parts"):
        fn = getattr(walks, name)
        monkeypatch.setattr(walks, name, lambda *a, _f=fn, _n=name: (
            parts.append((_n, a[2].tolist())), _f(*a))[1])  # fmt: skip
    b = 5
    bs = [5, 0, 4, 2, 0, 1] if case == "lengths-with-empty-steps" else None
    fields = dict(walk=True, pair_walks=False, walk_rows=two_threads, fwd_walk=fwd_walk)
    _forced_against_reference(fields, dtype, rtol, bidirectional, case, "tensors", b, bs)
    walked = 2 * (2 if bidirectional else 1)  # layers x directions, each in two row blocks
    names = ["forward_walk_parts"] * (walked if fwd_walk else 0) + ["backward_walk_parts"] * walked
    assert [name for name, _ in parts] == names
    for _, blocks in parts:  # one walk's rows [0, b) in two non-empty consecutive blocks
        assert [blk[0] for blk in blocks] == [0, 0]
        assert blocks[0][1] == 0 and blocks[0][2] == blocks[1][1] and blocks[1][2] == b
        assert 0 < blocks[0][2] < b


@pytest.mark.parametrize("blocks", [1, 2, 3, 8])
@pytest.mark.parametrize("walks_n", [1, 2])
@pytest.mark.parametrize(
    "ns", [[8] * 5, [8, 8, 6, 3, 1], [1, 8, 0, 2, 5], [0, 0, 0], [3]], ids=str
)  # fmt: skip
def test_walk_parts_cover_the_rows_in_balanced_blocks(ns, walks_n, blocks):
    """walk_parts: per walk, consecutive non-empty blocks covering [0, B) (fewer blocks than
    asked where B has fewer rows), each holding its share of the active row-steps to within
    one row's."""
    from lstmgrad.fused.walks import walk_parts

    ns_a = np.array(ns, dtype=np.int64)
    batch = 8 if max(ns) > 3 or ns == [0, 0, 0] else 3
    got = walk_parts(ns_a, batch, walks_n, blocks)
    per_walk = min(blocks, batch) if batch else 1
    assert got.shape == (walks_n * per_walk, 3) and got.dtype == np.int64
    steps_of_row = [(ns_a > r).sum() for r in range(batch)]  # independent of the searchsorted
    for w in range(walks_n):
        mine = got[got[:, 0] == w]
        assert mine[0, 1] == 0 and mine[-1, 2] == batch
        assert all(mine[k, 2] == mine[k + 1, 1] for k in range(len(mine) - 1))
        if batch:
            assert all(lo < hi for _, lo, hi in mine)
            work = [sum(steps_of_row[lo:hi]) for _, lo, hi in mine]
            share = sum(steps_of_row) / per_walk
            assert all(abs(wk - share) <= max(steps_of_row) for wk in work), work


def _pair_output(queue=None):
    if queue is not None:  # a forked child: one torch thread, as DataLoader workers take
        torch.set_num_threads(1)
    x, hx, params, dy, kw = make(np.float32, num_layers=1, t=5, b=3, i=4, h=6)
    with forced(pair_walks=True, threads=2):
        fw = lstmgrad.lstm_forward(tensors(x), tensors(params), tensors(hx), **kw)
    out = fw.output.numpy()
    if queue is None:
        return out
    from lstmgrad.planning import openmp

    queue.put((openmp.pairs_available(), out.copy()))


def test_pair_walks_off_in_a_forked_child(monkeypatch, two_threads):
    """GNU OpenMP is not fork-safe: a process forked after the pair walks ran reports them
    unavailable (Numba would wait for the parent's threads) and gets the parent's results.
    The child takes one torch thread: torch's own OpenMP team has the same limit."""
    import multiprocessing

    from lstmgrad.fused import walks

    taken = _record_calls(monkeypatch, walks, ("forward_walk_parts",))
    want = _pair_output()
    assert taken == ["forward_walk_parts"]
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_pair_output, args=(queue,), daemon=True)
    child.start()
    try:
        pairs_in_child, got = queue.get(timeout=120)
        child.join(120)
    finally:
        if child.is_alive():  # never leave a hung child for the interpreter's exit to wait on
            child.kill()
    assert child.exitcode == 0 and pairs_in_child is False
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize(
    "size",
    [
        dict(bidirectional=True, t=7, b=3, i=4, h=6),
        dict(bidirectional=False, t=5, b=16, i=8, h=128),
    ],
    ids=["pair-walks", "split-steps"],
)
def test_two_thread_paths_from_concurrent_threads(monkeypatch, two_threads, size):
    """Two Python threads running pair walks, or split step kernels, at once (Numba's OpenMP
    layer is thread-safe): the path runs, and each gets the result of a call alone bit for
    bit."""
    import threading

    from lstmgrad.fused import walks

    paths = ("forward_walk_parts", "backward_walk_parts", "forward_step_split",
             "backward_step_split")  # fmt: skip
    taken = _record_calls(monkeypatch, walks, paths)
    x, hx, params, dy, kw = make(np.float32, num_layers=2, **size)
    args = [tensors(a) for a in (x, params, hx)]
    fields = {"threads": two_threads, "split_min": 0, "pair_walks": size["bidirectional"]}

    def run():
        with forced(**fields):  # per thread: forced() is a context variable
            fw = lstmgrad.lstm_forward(*args, **kw)
            bw = lstmgrad.lstm_backward(args[0], args[2], args[1], tensors(dy), None, None,
                                        *fw.saved[:7], **kw)  # fmt: skip
        return [fw.output.numpy().copy(), bw.dx.numpy().copy(),
                *[p.numpy().copy() for p in bw.dparams]]  # fmt: skip

    want = run()
    expected = paths[:2] if size["bidirectional"] else paths[2:]
    assert set(taken) == set(expected), taken
    results, errors = [], []

    def worker():
        try:
            for _ in range(5):
                results.append(run())
        except Exception as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(2)]
    taken.clear()
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    assert not errors and len(results) == 10
    assert set(taken) == set(expected)
    for got in results:
        for g, w in zip(got, want, strict=True):
            np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("parts", [1, 2, 3, 5])
@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("rows,n", [(32, 32), (33, 33), (33, 20), (16, 1), (5, 0), (7, 6)])
def test_split_step_kernels_equal_the_one_thread_kernels_bitwise(dtype, rows, n, parts):
    """fused.walks' row-split step kernels (any number of parts; more parts than rows too) give
    the one-thread kernels' results bit for bit: active rows split unevenly, masked rows
    carried (forward), with and without dy (backward). Numba runs the parts on as many threads
    as its pool has (one included)."""
    from lstmgrad.fused import kernels, walks

    rng = np.random.default_rng(rows * 100 + n)
    hid = 24
    gx = rng.standard_normal((n, 4 * hid)).astype(dtype)
    gh = rng.standard_normal((rows, 4 * hid)).astype(dtype)
    bias = rng.standard_normal(4 * hid).astype(dtype)
    state = [rng.standard_normal((rows, hid)).astype(dtype) for _ in range(2)]
    outs = [np.full((rows, hid), 7.0, dtype) for _ in range(8)]  # s_i .. s_tc, y
    one = [a.copy() for a in state + outs]
    two = [a.copy() for a in state + outs]
    kernels.forward_step(gx, gh, bias, one[0], one[1], n, *one[2:])
    walks.forward_step_split(gx, gh, bias, two[0], two[1], n, parts, *two[2:])
    for a, b in zip(one, two, strict=True):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(one[0], state[0]) or n == 0  # the state did move
    acts = [rng.uniform(0.05, 0.95, (rows, hid)).astype(dtype) for _ in range(5)]
    dy = rng.standard_normal((rows, hid)).astype(dtype)
    c_prev = rng.standard_normal((n, hid)).astype(dtype)
    for has_dy in (True, False):
        grads = [rng.standard_normal((rows, hid)).astype(dtype) for _ in range(2)]
        db = np.full((rows, 4 * hid), 0.5, dtype)  # each row's running bias gradient
        one = [*(g.copy() for g in grads), np.zeros((n, 4 * hid), dtype), db.copy()]
        two = [*(g.copy() for g in grads), np.zeros((n, 4 * hid), dtype), db.copy()]
        kernels.backward_step(dy, has_dy, one[0], one[1], *acts, c_prev, one[2], n, one[3], True)
        walks.backward_step_split(dy, has_dy, two[0], two[1], *acts, c_prev, two[2], n, two[3],
                                  True, parts)  # fmt: skip
        for a, b in zip(one, two, strict=True):
            np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(one[3][:n], db[:n] + one[2])  # active rows' dG added
        np.testing.assert_array_equal(one[3][n:], db[n:])


@pytest.mark.parametrize("case", ["dense", "lengths", "no-dy", "dh-prev-off"])
def test_split_steps_through_the_engine(monkeypatch, two_threads, case):
    """A plan's split steps: steps of at least split_min active elements run their gate maths
    on the plan's threads, smaller ones on one: the split path is taken, gives the one-thread
    path's results bit for bit (the same GEMMs around it), and matches the reference."""
    from lstmgrad.fused import kernels, walks

    t, b, i, h = 6, 16, 8, 128
    split_min = 14 * h  # full steps split, 13 active rows do not
    x, hx, params, dy, kw = make(np.float64, num_layers=2, t=t, b=b, i=i, h=h)
    bs = None
    if case == "lengths":  # split, one-thread and empty steps
        bs = np.array([16, 16, 13, 0, 16, 2], dtype=np.int64)
        x, dy = x.reshape(t * b, -1), dy.reshape(t * b, -1)
    dy_arg = None if case == "no-dy" else dy
    dh = hx[0] if case == "no-dy" else None
    mask = (True, False, True, True) if case == "dh-prev-off" else None
    taken: dict[str, list[int]] = {"forward": [], "backward": [], "one": []}
    # (module, kernel, where its calls are recorded, the position of n in its arguments)
    for module, name, key, pos in ((walks, "forward_step_split", "forward", 5),
                                   (walks, "backward_step_split", "backward", 11),
                                   (kernels, "forward_step", "one", 5),
                                   (kernels, "backward_step", "one", 11)):  # fmt: skip
        fn = getattr(module, name)

        def record(*a, _f=fn, _k=key, _p=pos):
            taken[_k].append(a[_p])
            return _f(*a)

        monkeypatch.setattr(module, name, record)

    def run(**fields):
        with forced(pair_walks=False, **fields):
            fw = lstmgrad.lstm_forward(tensors(x), tensors(params), tensors(hx), tensors(bs),
                                       **kw)  # fmt: skip
            saved = [[a.numpy() for a in s] for s in fw.saved[:7]]
            args = (x, hx, params, dy_arg, dh, None, *saved, bs)
            bw = lstmgrad.lstm_backward(*[tensors(a) for a in args], output_mask=mask, **kw)
        return fw, bw, args

    fw, bw, args = run(threads=two_threads, split_min=split_min)
    assert taken["forward"] and taken["backward"]
    assert all(n * h >= split_min for n in taken["forward"] + taken["backward"])
    if case == "lengths":
        assert set(taken["one"]) == {0, 2, 13}  # the small steps took the one-thread kernels
    else:
        assert not taken["one"]
    fw1, bw1, _ = run(threads=1)  # every step on one thread
    assert len(taken["one"]) > 0
    for got, want in zip([*fw[:3], bw.dx, bw.dh_prev, bw.dc_prev, *bw.dparams],
                         [*fw1[:3], bw1.dx, bw1.dh_prev, bw1.dc_prev, *bw1.dparams], strict=True):  # fmt: skip
        assert (got is None) == (want is None)
        if got is not None:
            np.testing.assert_array_equal(got.numpy(), want.numpy())
    ref_fw = lstmgrad.lstm_forward(x, params, hx, bs, impl="reference", **kw)
    assert_close(fw.output, ref_fw.output, 1e-12)
    ref = lstmgrad.lstm_backward(*args, output_mask=mask, impl="reference", **kw)
    assert_backward_close(bw, ref, 1e-10)


def _float16_training_call(wrap, seed, batch_sizes=None):
    """A two-layer bidirectional float16 case with dropout masks (and ``batch_sizes`` where
    given): a function running its forward and backward with ``wrap``ped arguments under
    forced plan fields, returning every result."""
    t, b, i, h = 5, 6, 7, 8
    x, hx, params, dy, kw = make(np.float16, num_layers=2, t=t, b=b, i=i, h=h)
    rng = np.random.default_rng(seed)
    masks = [((rng.random((t, b, 2 * h)) > 0.3) / 0.7).astype(np.float16)]
    kw.update(dropout=0.3, train=True, dropout_masks=masks)
    bs = None
    if batch_sizes is not None:
        bs = np.array(batch_sizes, dtype=np.int64)
        x, dy = x.reshape(t * b, -1), dy.reshape(t * b, -1)

    def run(**fields):
        with forced(**fields):
            fw = lstmgrad.lstm_forward(wrap(x), wrap(params), wrap(hx), wrap(bs), **kw)
            bw = lstmgrad.lstm_backward(wrap(x), wrap(hx), wrap(params), wrap(dy), None, None,
                                        *fw.saved[:7], wrap(bs), **kw)  # fmt: skip
        return [fw.output, fw.hy, fw.cy, bw.dx, bw.dh_prev, bw.dc_prev, *bw.dparams]

    return run


def _assert_same_float16_bits(got, want):
    for g, w in zip(got, want, strict=True):
        g, w = np.asarray(g), np.asarray(w)
        assert g.dtype == np.float16
        np.testing.assert_array_equal(g.view(np.uint16), w.view(np.uint16))


@pytest.mark.parametrize("inputs", ["numpy", "tensors"])
@pytest.mark.parametrize("lengths", [False, True], ids=["dense", "lengths"])
def test_float16_conversions_on_the_plans_threads(monkeypatch, two_threads, inputs, lengths):
    """float16 storage: the engine's conversions (inputs, saved activations, results, dropout
    masks, dx rounding) run split over the plan's transpose_threads, and every result is the
    one-thread run's bit for bit."""
    from lstmgrad.fused import half

    wrap = tensors if inputs == "tensors" else (lambda a: a)
    run = _float16_training_call(wrap, 11, [6, 6, 4, 1, 3] if lengths else None)  # not sorted
    split = []
    for kernel in ("to_half", "to_float_table", "round_to_half"):
        fn = half._SPLIT[kernel]

        def record(*a, _f=fn, _n=f"{kernel}_split"):
            split.append(_n)
            return _f(*a)

        monkeypatch.setitem(half._SPLIT, kernel, record)
    fields = dict(pair_walks=False, convert="kernels")
    got = run(transpose_threads=two_threads, **fields)
    assert {"to_half_split", "to_float_table_split", "round_to_half_split"} <= set(split)
    split.clear()
    want = run(transpose_threads=1, **fields)
    assert not split
    _assert_same_float16_bits(got, want)


def test_torch_conversion_rounds_as_the_kernels():
    """The torch back end's float16 <-> float32 conversion (the plan's convert="library") gives
    the engine's kernels' bits on every float16 value, every rounding boundary and random bit
    patterns, strided views included; where it cannot take the arrays it says so (False)."""
    from lstmgrad.fused import half
    from test_half import ALL_HALVES, _boundaries, _same

    gemm = lstmgrad.ops.tensors.torch_gemm()
    rng = np.random.default_rng(2)
    bits = rng.integers(0, 1 << 32, 1 << 18, dtype=np.uint64).astype(np.uint32)
    values = np.concatenate([_boundaries(), bits.view(np.float32)])
    got, want = np.empty(values.shape, np.float16), np.empty(values.shape, np.float16)
    assert gemm.convert(got, values)
    half.assign(want, values)
    _same(got, want)
    back, ref = np.empty(ALL_HALVES.shape, np.float32), np.empty(ALL_HALVES.shape, np.float32)
    assert gemm.convert(back, ALL_HALVES)
    half.assign(ref, ALL_HALVES)
    _same(back, ref)
    wide = np.full((6, 10), 7.0, np.float32)
    assert gemm.convert(wide[:, 2:8], ALL_HALVES[:36].reshape(6, 6))  # rows of a wider array
    _same(wide[:, 2:8], ALL_HALVES[:36].reshape(6, 6).astype(np.float32))
    assert (wide[:, :2] == 7).all() and (wide[:, 8:] == 7).all()
    frozen = values[:8].copy()
    frozen.flags.writeable = False
    assert not gemm.convert(got[:8], frozen)  # torch cannot wrap a read-only array
    assert not gemm.convert(got[:8], values[7::-1])  # nor negative strides
    assert not lstmgrad.fused.gemm.NUMPY_GEMM.convert(got, values)


@pytest.mark.parametrize("lengths", [False, True], ids=["dense", "lengths"])
def test_float16_conversions_by_the_library(monkeypatch, lengths):
    """convert="library": float16 storage's conversions go through torch's copy, with every
    result the kernels' run's bit for bit."""
    from lstmgrad.ops.tensors import TorchGemm

    run = _float16_training_call(tensors, 12, [6, 5, 4, 4, 1] if lengths else None)
    done = []
    convert = TorchGemm.convert

    def record(self, dst, src):
        ok = convert(self, dst, src)
        done.append(ok)
        return ok

    monkeypatch.setattr(TorchGemm, "convert", record)
    got = run(convert="library")
    assert sum(done) >= 20  # inputs, weights, the saved activations both ways, results
    done.clear()
    want = run(convert="kernels")
    assert not done
    assert all(isinstance(g, torch.Tensor) for g in got)
    _assert_same_float16_bits(got, want)


_THREADS_CHILD = """
import os
os.environ["LSTMGRAD_PLAN"] = "threads=4,pair_walks=1,split_min=0"  # as many as allowed
import torch
torch.set_num_threads(1)
import lstmgrad.nn
assert torch.get_num_threads() == 1  # (read before the first call: the case that lost it)
for h, b in ((16, 4), (128, 16)):
    for d in (False, True):
        m = lstmgrad.nn.LSTM(8, h, bidirectional=d)
        m(torch.randn(3, b, 8))[0].sum().backward()
        assert torch.get_num_threads() == 1, (h, d, torch.get_num_threads())
import numpy as np
from lstmgrad.planning import openmp
from lstmgrad.core.layout import Dims
from lstmgrad.planning.plan import plan_for
from lstmgrad.ops.tensors import TorchGemm
p = plan_for(Dims(3, 16, 8, 128, 1, 2, True), np.dtype(np.float32), TorchGemm())
print(openmp.pairs_available(), torch.get_num_threads(), p.threads, p.pair_walks)
"""


def test_torch_thread_count_is_kept():
    """A process that set torch.set_num_threads(1) keeps it through lstmgrad's calls (starting
    Numba's OpenMP pool would set it to Numba's count), and lstmgrad then uses one thread too,
    whatever a plan asks (no split steps, no pair walks)."""
    import subprocess
    import sys

    from lstmgrad.planning import openmp

    if not openmp.pairs_available():
        pytest.skip("Numba's threading layer here is not GNU OpenMP")
    out = subprocess.run([sys.executable, "-c", _THREADS_CHILD], capture_output=True,
                         text=True, timeout=300, check=True).stdout.split()  # fmt: skip
    assert out == ["True", "1", "1", "False"], out


def test_thread_limits_cap_the_plan(monkeypatch, two_threads):
    """A plan's threads never exceed Numba's (numba.set_num_threads, per calling thread), the
    visible CPUs (affinity, cgroup quota) and torch's (torch.set_num_threads); pair walks need
    two."""
    import numba

    from lstmgrad.core import machine
    from lstmgrad.core.layout import Dims
    from lstmgrad.ops.tensors import TorchGemm
    from lstmgrad.planning.plan import plan_for

    dims, f32, gemm = Dims(3, 16, 8, 128, 1, 2, True), np.dtype(np.float32), TorchGemm()
    want = {"threads": 8, "pair_walks": True}
    with forced(**want):
        assert plan_for(dims, f32, gemm).threads == 2  # two_threads: two of everything
        assert plan_for(dims, f32, gemm).pair_walks
        numba.set_num_threads(1)
        assert plan_for(dims, f32, gemm).threads == 1
        assert not plan_for(dims, f32, gemm).pair_walks
        numba.set_num_threads(2)
        torch.set_num_threads(1)
        assert plan_for(dims, f32, gemm).threads == 1
        torch.set_num_threads(2)
        monkeypatch.setattr(machine, "visible_cpus", lambda: 1)
        lstmgrad.planning.plan.forget()
        assert plan_for(dims, f32, gemm).threads == 1


def test_big_products_measure_the_conversions():
    """The big products' measurement times float16 conversions by the kernels and by the back
    end's own where it has one (torch), and the plan takes the faster; NumPy has none."""
    from lstmgrad.fused.gemm import NUMPY_GEMM
    from lstmgrad.planning import tune

    cls = {"what": "big", "kind": "torch", "dtype": "float32", "N": 64, "I": 8, "H": 16}
    entry = tune.measure_big(cls, lstmgrad.ops.tensors.torch_gemm())
    times = {k: entry["seconds"][f"convert/{k}"] for k in ("kernels", "library")}
    assert all(0 < t < 1 for t in times.values())
    assert entry["plan"]["convert"] == min(times, key=lambda k: times[k])
    numpy_entry = tune.measure_big({**cls, "kind": "numpy"}, NUMPY_GEMM)
    assert numpy_entry["plan"]["convert"] == "kernels"
    assert not any(k.startswith("convert/") for k in numpy_entry["seconds"])
    f64 = tune.measure_big({**cls, "dtype": "float64"}, lstmgrad.ops.tensors.torch_gemm())
    assert f64["plan"]["convert"] == "kernels"  # float64 storage converts nothing


# --------------------------------------------------------------------------- LSTMGRAD_BLAS


def _grads_of(x, hx, params, dy, kw):
    fw = lstmgrad.lstm_forward(x, params, hx, **kw)
    bw = lstmgrad.lstm_backward(x, hx, params, dy, None, None, *fw.saved[:7], **kw)
    return [fw.output, fw.hy, fw.cy, bw.dx, bw.dh_prev, bw.dc_prev, *bw.dparams]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_numpy_calls_on_torchs_blas(monkeypatch, dtype):
    """LSTMGRAD_BLAS=torch: a call with NumPy arrays runs its GEMMs on torch's libraries (the
    tensor call's back end), returns NumPy arrays, and gives the tensor call's results; the
    float64 ones agree with the NumPy back end's to rounding."""
    from lstmgrad.ops import tensors as tensors_mod

    x, hx, params, dy, kw = make(dtype)
    numpy_side = _grads_of(x, hx, params, dy, kw)
    products = []
    original = tensors_mod.TorchGemm.product

    def counted(self, a, b, scratch, method, /):
        products.append(method)
        return original(self, a, b, scratch, method)

    monkeypatch.setattr(tensors_mod.TorchGemm, "product", counted)
    monkeypatch.setenv("LSTMGRAD_BLAS", "torch")
    with forced(threads=1, walk_rows=1, pair_walks=False):
        got = _grads_of(x, hx, params, dy, kw)
        assert products, "the NumPy call's GEMMs did not run on torch's back end"
        want = _grads_of(tensors(x), tensors(hx), tensors(params), tensors(dy), kw)
    for a, t, n in zip(got, want, numpy_side, strict=True):
        assert isinstance(a, np.ndarray)
        np.testing.assert_array_equal(a, t.numpy())
        rtol = 1e-12 if dtype == np.float64 else 1e-4
        np.testing.assert_allclose(a, n, rtol=rtol, atol=rtol)


def test_lstmgrad_blas_values(monkeypatch):
    """numpy (or unset) is NumPy's BLAS; an unknown value names the variable and the choices."""
    from lstmgrad.fused.gemm import NUMPY_GEMM
    from lstmgrad.ops.tensors import array_gemm

    for value in ("", "numpy", " NumPy "):
        monkeypatch.setenv("LSTMGRAD_BLAS", value)
        assert array_gemm() is NUMPY_GEMM
    monkeypatch.setenv("LSTMGRAD_BLAS", "mkl")
    x, hx, params, dy, kw = make(np.float32)
    with pytest.raises(ValueError, match="LSTMGRAD_BLAS: expected 'numpy' or 'torch', got 'mkl'"):
        lstmgrad.lstm_forward(x, params, hx, **kw)


def test_lstmgrad_blas_torch_without_torch(monkeypatch):
    """LSTMGRAD_BLAS=torch where torch cannot be imported: an ImportError that says what to do."""
    import sys

    from lstmgrad.ops.tensors import array_gemm

    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    monkeypatch.setenv("LSTMGRAD_BLAS", "torch")
    with pytest.raises(ImportError, match="LSTMGRAD_BLAS=torch: PyTorch is not installed"):
        array_gemm()


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16], ids=["f64", "f32", "f16"])
@pytest.mark.parametrize("case", ["dense", "lengths-with-empty-steps"])
@pytest.mark.parametrize(
    "fields",
    [
        dict(walk=True, pair_walks=False, walk_product="packed"),
        dict(walk=True, pair_walks=False, walk_rows=2, walk_product="library", threads=2),
        dict(pair_walks=True, walk_product="loop", threads=2),
        dict(walk=False, pair_walks=False, fwd_rec="blas"),
        dict(walk=False, pair_walks=False, fwd_rec="loop", split_min=0, threads=2),
    ],
    ids=["walk-packed", "walk-rows", "pair-walks", "per-step", "per-step-split"],
)
def test_inference_forward_gives_the_training_forwards_bits(two_threads, dtype, case, fields):
    """Without train the forward keeps one step's activations, a slot every step overwrites
    (fused.walks.forward_walk): output, hy and cy are the training forward's bits under every
    arrangement of the step loops (threads forced to two where one asks for them), for every
    storage dtype, with batch sizes (empty steps included); nothing is returned as saved."""
    t, b = 6, 4
    x, hx, params, _, kw = make(dtype, num_layers=2, bidirectional=True, t=t, b=b, i=5, h=7)
    bs = None
    if case == "lengths-with-empty-steps":
        bs = np.array([4, 0, 3, 3, 0, 1], dtype=np.int64)
        x = x.reshape(t * b, -1)
    fields = {**fields, "threads": two_threads if fields.get("threads") == 2 else 1}
    args = (tensors(x), tensors(params), tensors(hx), tensors(bs))
    with forced(**fields):
        trained = lstmgrad.lstm_forward(*args, **kw)
        inferred = lstmgrad.lstm_forward(*args, train=False, **kw)
    assert trained.saved is not None and inferred.saved is None
    for got, want in zip(inferred[:3], trained[:3], strict=True):
        assert torch.equal(got, want)
