"""The recompute mode (lstmgrad.ops.recompute through torch_ops.lstm and nn.LSTM): results against
the normal mode, torch.nn.LSTM float64 autograd and the NumPy reference, over directions,
layers, bias, layouts, variable lengths, dropout, dtypes and segment lengths; its memory
record; its argument errors."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import lstmgrad  # noqa: E402
from lstmgrad import recompute  # noqa: E402
from lstmgrad.core.errors import ACLNN_ERR_PARAM_INVALID, LstmInvalidArgumentError  # noqa: E402
from lstmgrad.core.layout import Dims  # noqa: E402
from lstmgrad.nn import LSTM  # noqa: E402
from lstmgrad.torch_ops import lstm  # noqa: E402
from oracles import (  # noqa: E402
    batch_sizes_of,
    make_lstm,
    rel_err,
    sorted_lengths,
    torch_dropout_lstm_grads,
    torch_lstm_grads,
)

TIGHT = 1e-12  # float64: recompute against the normal mode (a different summation order)


def _inputs(t, b, i, h, k, bf=False, flat=False, seed=1):
    rng = np.random.default_rng(seed)
    shape = (t * b, i) if flat else ((b, t, i) if bf else (t, b, i))
    x = rng.standard_normal(shape)
    h0, c0 = rng.standard_normal((2, k, b, h)) * 0.5
    return x, h0, c0, rng


def _run(params, x, h0, c0, dy, dh, dc, bs=None, dtype=torch.float64, **kw):
    """Output, h_n, c_n and the gradients of sum(y*dy) + sum(h_n*dh) + sum(c_n*dc) through
    torch_ops.lstm (kw: its flags and recompute)."""
    xt = torch.tensor(x, dtype=dtype, requires_grad=True)
    h0t = torch.tensor(h0, dtype=dtype, requires_grad=True)
    c0t = torch.tensor(c0, dtype=dtype, requires_grad=True)
    ps = [torch.tensor(p, dtype=dtype, requires_grad=True) for p in params]
    bst = None if bs is None else torch.as_tensor(bs, dtype=torch.int64)
    y, hn, cn = lstm(xt, ps, (h0t, c0t), bst, **kw)
    loss = (y.double() * torch.as_tensor(dy)).sum()
    loss = (
        loss + (hn.double() * torch.as_tensor(dh)).sum() + (cn.double() * torch.as_tensor(dc)).sum()
    )
    loss.backward()
    out = [y, hn, cn, xt.grad, h0t.grad, c0t.grad, *(p.grad for p in ps)]
    return [a.detach().double().numpy() for a in out]


def _check(got, want, tol, names=None):
    for n, (a, b) in enumerate(zip(got, want, strict=True)):
        err = rel_err(a, b)
        assert err <= tol, (names[n] if names else n, err)


NAMES = ["y", "h_n", "c_n", "dx", "dh0", "dc0"] + [f"dparam{j}" for j in range(32)]

DENSE = [
    # T, B, I, H, L, bidirectional, bias, batch_first, recompute
    (7, 3, 4, 5, 1, False, True, False, 3),
    (7, 3, 4, 5, 1, True, True, False, 2),
    (7, 2, 3, 4, 2, True, True, True, 3),
    (7, 2, 3, 4, 2, False, False, False, True),
    (6, 2, 3, 4, 2, True, False, True, 1),
    (6, 2, 3, 4, 2, True, True, False, 6),
    (5, 2, 3, 4, 2, True, True, False, 9),
    (1, 2, 3, 4, 2, True, True, False, True),
    (1, 1, 2, 3, 1, False, True, False, 4),
]


@pytest.mark.parametrize("case", DENSE, ids=[str(c) for c in DENSE])
def test_dense_float64_matches_normal_mode_and_torch(case):
    t, b, i, h, nl, bi, bias, bf, rec = case
    d = 2 if bi else 1
    mod, params = make_lstm(i, h, nl, bias=bias, bidirectional=bi, batch_first=bf)
    x, h0, c0, rng = _inputs(t, b, i, h, nl * d, bf=bf)
    dy = rng.standard_normal((b, t, d * h) if bf else (t, b, d * h))
    dh, dc = rng.standard_normal((2, nl * d, b, h))
    flags = dict(has_bias=bias, num_layers=nl, bidirectional=bi, batch_first=bf)
    normal = _run(params, x, h0, c0, dy, dh, dc, **flags)
    rec_mode = _run(params, x, h0, c0, dy, dh, dc, recompute=rec, **flags)
    _check(rec_mode, normal, TIGHT, NAMES)
    ref = torch_lstm_grads(mod, x, h0, c0, dy, dh, dc)
    want = [ref.output, ref.h_n, ref.c_n, ref.dx, ref.dh0, ref.dc0, *ref.dparams]
    _check(rec_mode, want, 1e-10, NAMES)


@pytest.mark.parametrize("bi", [False, True])
@pytest.mark.parametrize("k", [1, 2, 3, 8])
def test_varlen_sorted_matches_torch_packed(bi, k):
    t, b, i, h, nl = 7, 4, 3, 5, 2
    d = 2 if bi else 1
    mod, params = make_lstm(i, h, nl, bidirectional=bi)
    x, h0, c0, rng = _inputs(t, b, i, h, nl * d, flat=True)
    lengths = sorted_lengths(t, b, rng)
    bs = batch_sizes_of(lengths)
    active = (np.arange(b)[None, :] < bs[:, None]).reshape(-1, 1)
    dy = rng.standard_normal((t * b, d * h)) * active
    dh, dc = rng.standard_normal((2, nl * d, b, h))
    flags = dict(num_layers=nl, bidirectional=bi)
    got = _run(params, x, h0, c0, dy, dh, dc, bs=bs, recompute=k, **flags)
    normal = _run(params, x, h0, c0, dy, dh, dc, bs=bs, **flags)
    ref = torch_lstm_grads(mod, x, h0, c0, dy, dh, dc, lengths=lengths)
    want = [ref.output, ref.h_n, ref.c_n, ref.dx * active, ref.dh0, ref.dc0, *ref.dparams]
    got[3] = got[3] * active  # padded rows of dx: outside the contract's comparison
    normal[3] = normal[3] * active
    _check(got, normal, TIGHT, NAMES)
    _check(got, want, 1e-10, NAMES)


@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_varlen_any_order_matches_reference_engine(k):
    """Batch sizes that rise and fall (and a step with none), bidirectional: the reverse
    direction's segments run time-reversed with their batch sizes reversed."""
    t, b, i, h, nl = 7, 3, 3, 4, 2
    _, params = make_lstm(i, h, nl, bidirectional=True)
    x, h0, c0, rng = _inputs(t, b, i, h, 2 * nl, flat=True)
    bs = np.array([1, 3, 0, 2, 3, 1, 2], dtype=np.int64)
    active = (np.arange(b)[None, :] < bs[:, None]).reshape(-1, 1)
    dy = rng.standard_normal((t * b, 2 * h)) * active
    dh, dc = rng.standard_normal((2, 2 * nl, b, h))
    flags = dict(num_layers=nl, bidirectional=True)
    got = _run(params, x, h0, c0, dy, dh, dc, bs=bs, recompute=k, **flags)
    fwd = lstmgrad.lstm_forward(x, params, [h0, c0], bs, impl="reference", **flags)
    bwd = lstmgrad.lstm_backward(x, [h0, c0], params, dy, dh, dc, *fwd.saved[:7], bs,
                                 impl="reference", **flags)  # fmt: skip
    want = [fwd.output, fwd.hy, fwd.cy, bwd.dx, bwd.dh_prev, bwd.dc_prev, *bwd.dparams]
    got[3] = got[3] * active
    want[3] = want[3] * active
    _check(got, want, 1e-10, NAMES)


def _masks_like_lstm(seed, nl, t, b, width, p):
    """The masks torch_ops.lstm draws after torch.manual_seed(seed) (its documented draw:
    bernoulli(1 - p) scaled by 1 / (1 - p))."""
    torch.manual_seed(seed)
    m = torch.empty((nl - 1, t, b, width), dtype=torch.float64).bernoulli_(1 - p)
    return m.mul_(1 / (1 - p)).numpy()


@pytest.mark.parametrize("bi", [False, True])
def test_dropout_masks_match_normal_mode_and_torch(bi):
    t, b, i, h, nl, p = 6, 3, 3, 4, 2, 0.4
    d = 2 if bi else 1
    _, params = make_lstm(i, h, nl, bidirectional=bi)
    x, h0, c0, rng = _inputs(t, b, i, h, nl * d)
    dy = rng.standard_normal((t, b, d * h))
    dh, dc = rng.standard_normal((2, nl * d, b, h))
    flags = dict(num_layers=nl, bidirectional=bi, dropout=p)
    torch.manual_seed(5)
    got = _run(params, x, h0, c0, dy, dh, dc, recompute=4, **flags)
    torch.manual_seed(5)
    normal = _run(params, x, h0, c0, dy, dh, dc, **flags)
    _check(got, normal, TIGHT, NAMES)
    masks = _masks_like_lstm(5, nl, t, b, d * h, p)
    assert 0 < np.count_nonzero(masks) < masks.size  # some dropped, some kept
    ref = torch_dropout_lstm_grads(params, x, h0, c0, dy, dh, dc, list(masks), num_layers=nl,
                                   bidirectional=bi, has_bias=True)  # fmt: skip
    want = [ref.output, ref.h_n, ref.c_n, ref.dx, ref.dh0, ref.dc0, *ref.dparams]
    _check(got, want, 1e-10, NAMES)


@pytest.mark.parametrize(("dtype", "tol_normal", "tol_torch"),
                         [(torch.float32, 2e-5, 1e-4), (torch.float16, 2e-2, 3e-2)])  # fmt: skip
def test_low_precision_near_normal_mode_and_torch(dtype, tol_normal, tol_torch):
    t, b, i, h, nl = 9, 3, 4, 8, 2
    mod, params = make_lstm(i, h, nl, bidirectional=True, scale=0.3)
    x, h0, c0, rng = _inputs(t, b, i, h, 2 * nl)
    dy = rng.standard_normal((t, b, 2 * h))
    dh, dc = rng.standard_normal((2, 2 * nl, b, h))
    flags = dict(num_layers=nl, bidirectional=True)
    # the oracle runs on the values the low-precision call sees
    x, h0, c0, dy, dh, dc = (torch.tensor(a).to(dtype).double().numpy()
                             for a in (x, h0, c0, dy, dh, dc))  # fmt: skip
    params = [torch.tensor(p).to(dtype).double().numpy() for p in params]
    got = _run(params, x, h0, c0, dy, dh, dc, dtype=dtype, recompute=3, **flags)
    normal = _run(params, x, h0, c0, dy, dh, dc, dtype=dtype, **flags)
    _check(got, normal, tol_normal, NAMES)
    for w, p in zip(mod._flat_weights, params, strict=True):
        w.data.copy_(torch.from_numpy(p))
    ref = torch_lstm_grads(mod, x, h0, c0, dy, dh, dc)
    want = [ref.output, ref.h_n, ref.c_n, ref.dx, ref.dh0, ref.dc0, *ref.dparams]
    _check(got, want, tol_torch, NAMES)


def test_nn_lstm_packed_sequence_recompute_matches_torch():
    torch.manual_seed(0)
    ref = torch.nn.LSTM(3, 5, num_layers=2, bidirectional=True, dtype=torch.float64)
    mine = LSTM(3, 5, num_layers=2, bidirectional=True, dtype=torch.float64, recompute=2)
    mine.load_state_dict(ref.state_dict())
    seqs = [torch.randn(n, 3, dtype=torch.float64) for n in (6, 2, 4)]
    grads = []
    for m in (ref, mine):
        packed = torch.nn.utils.rnn.pack_sequence(seqs, enforce_sorted=False)
        out, (hn, cn) = m(packed)
        (out.data.sin().sum() + hn.square().sum() + cn.sum()).backward()
        grads.append([out.data, hn, cn] + [p.grad.clone() for p in m.parameters()])
    _check([g.detach().numpy() for g in grads[1]], [g.detach().numpy() for g in grads[0]], 1e-10)


def test_checkpoint_record_holds_layer_inputs_and_states_only():
    """The memory kept: the layer inputs above the first and 2 states per segment and
    (layer, direction), not the seven [T, B, H] activations."""
    t, b, i, h, nl, k = 50, 2, 3, 4, 3, 7
    _, params = make_lstm(i, h, nl, bidirectional=True)
    x, h0, c0, _ = _inputs(t, b, i, h, 2 * nl)
    dims = Dims(t, b, i, h, nl, 2, True)
    _, _, _, ck = recompute.forward(x, params, h0, c0, dims, k)
    assert ck is not None
    segments = math.ceil(t / k)
    want = ((nl - 1) * t * b * 2 * h + 2 * 2 * nl * segments * b * h) * 8
    assert ck.nbytes() == want
    assert (
        recompute.checkpoint_bytes(dims, k, np.dtype(np.float64))
        == 2 * 2 * nl * segments * b * h * 8
    )
    normal = 7 * 2 * nl * t * b * h * 8
    assert ck.nbytes() < normal / 3


def test_inference_keeps_nothing_and_matches():
    t, b, i, h, nl = 6, 2, 3, 4, 2
    _, params = make_lstm(i, h, nl)
    x, h0, c0, _ = _inputs(t, b, i, h, nl)
    dims = Dims(t, b, i, h, nl, 1, True)
    y, hy, cy, ck = recompute.forward(x, params, h0, c0, dims, 4, keep=False)
    assert ck is None
    fwd = lstmgrad.lstm_forward(x, params, [h0, c0], num_layers=nl, impl="reference")
    _check([y, hy, cy], [fwd.output, fwd.hy, fwd.cy], 1e-12)


def test_budget_chooses_longest_fitting_segment():
    dims = Dims(1000, 4, 8, 16, 2, 2, True)
    f64 = np.dtype(np.float64)
    default = recompute.segment_length(dims, f64, True)
    assert default == math.ceil(math.sqrt(1000))
    budget = recompute.budget_bytes(dims, 100, f64)
    k = recompute.segment_length(dims, f64, "auto", budget)
    assert recompute.budget_bytes(dims, k, f64) <= budget
    assert k >= 100 * 0.9  # the grid of candidates is 10 % apart
    assert recompute.segment_length(dims, f64, False, budget) == k  # a budget alone implies it
    huge = recompute.budget_bytes(dims, 1000, f64)
    assert recompute.segment_length(dims, f64, True, huge) == 1000


def test_budget_reaches_training():
    t, b, i, h = 40, 2, 3, 4
    _, params = make_lstm(i, h, 1)
    x, h0, c0, rng = _inputs(t, b, i, h, 1)
    dy = rng.standard_normal((t, b, h))
    dh, dc = rng.standard_normal((2, 1, b, h))
    dims = Dims(t, b, i, h, 1, 1, True)
    budget = recompute.budget_bytes(dims, 10, np.dtype(np.float64))
    got = _run(params, x, h0, c0, dy, dh, dc, max_saved_bytes=budget)
    normal = _run(params, x, h0, c0, dy, dh, dc)
    _check(got, normal, TIGHT, NAMES)


@pytest.mark.parametrize(
    ("kw", "param", "text"),
    [
        ({"recompute": 0}, "recompute", "int >= 1, got 0"),
        ({"recompute": -3}, "recompute", "int >= 1, got -3"),
        ({"recompute": "yes"}, "recompute", "got 'yes'"),
        ({"recompute": 1.5}, "recompute", "got 1.5"),
        ({"max_saved_bytes": -1}, "max_saved_bytes", "int > 0, got -1"),
        ({"max_saved_bytes": 0}, "max_saved_bytes", "int > 0, got 0"),
        ({"max_saved_bytes": True}, "max_saved_bytes", "got True"),
        ({"recompute": 4, "max_saved_bytes": 10**9}, "max_saved_bytes", "recompute=4"),
        ({"recompute": True, "max_saved_bytes": 100}, "max_saved_bytes", "bytes"),
    ],
)
def test_bad_arguments_name_the_argument(kw, param, text):
    _, params = make_lstm(3, 4, 1)
    x = torch.randn(5, 2, 3, dtype=torch.float64)
    with pytest.raises(LstmInvalidArgumentError) as exc:
        lstm(x, [torch.from_numpy(p) for p in params], **kw)
    assert exc.value.code == ACLNN_ERR_PARAM_INVALID
    assert exc.value.param == param
    assert text in str(exc.value)


def test_too_small_budget_names_the_need():
    """The need named in the message is exact: one byte less fails, that many bytes fits."""
    dims = Dims(100, 2, 3, 4, 1, 1, True)
    f64 = np.dtype(np.float64)
    with pytest.raises(LstmInvalidArgumentError, match=r"is (\d+) bytes") as exc:
        recompute.segment_length(dims, f64, True, 1000)
    need = int(re.search(r"is (\d+) bytes", str(exc.value)).group(1))
    assert need > 1000
    k = recompute.segment_length(dims, f64, True, need)
    assert recompute.budget_bytes(dims, k, f64) == need
    with pytest.raises(LstmInvalidArgumentError):
        recompute.segment_length(dims, f64, True, need - 1)


def test_second_backward_through_the_same_graph_raises():
    _, params = make_lstm(3, 4, 1)
    x = torch.randn(5, 2, 3, dtype=torch.float64, requires_grad=True)
    y, _, _ = lstm(x, [torch.from_numpy(p) for p in params], recompute=2)
    y.sum().backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="retain_graph"):
        y.sum().backward()


def test_no_steps_pass_the_state_through():
    """T = 0 (torch.nn.LSTM raises there): h_n = h0, dh0 = dh, no weight gradient, as the
    normal mode."""
    b, i, h, nl = 2, 3, 4, 2
    _, params = make_lstm(i, h, nl, bidirectional=True)
    x, h0, c0, rng = _inputs(0, b, i, h, 2 * nl)
    dy = np.zeros((0, b, 2 * h))
    dh, dc = rng.standard_normal((2, 2 * nl, b, h))
    flags = dict(num_layers=nl, bidirectional=True)
    got = _run(params, x, h0, c0, dy, dh, dc, recompute=True, **flags)
    normal = _run(params, x, h0, c0, dy, dh, dc, **flags)
    _check(got, normal, 0.0, NAMES)
    np.testing.assert_array_equal(got[1], h0)
    np.testing.assert_array_equal(got[4], dh)


def test_in_place_change_before_backward_is_caught():
    """The checkpoints read the input and weights through views: modifying one in place
    between forward and backward is autograd's usual error, not a silently wrong gradient."""
    _, params = make_lstm(3, 4, 1)
    ps = [torch.tensor(p, requires_grad=True) for p in params]
    x = torch.randn(5, 2, 3, dtype=torch.float64)
    y, _, _ = lstm(x, ps, recompute=2)
    with torch.no_grad():
        ps[1].mul_(2.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


@pytest.mark.parametrize("back_end", ["numpy", "torch"])
def test_prepared_weights_reused_only_within_the_block_and_for_registered_arrays(back_end):
    """The recompute mode prepares each recurrent weight once for all segments: within
    reusing_prepared a fixed product of a registered weight (or a view into it) is made once,
    any other matrix's every time, and nothing is reused outside the block; the reused
    products compute a @ b."""
    from lstmgrad.fused.gemm import NUMPY_GEMM, reusing_prepared
    from lstmgrad.ops.tensors import torch_gemm

    gemm = NUMPY_GEMM if back_end == "numpy" else torch_gemm()
    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, 16)).astype(np.float32)
    other = w.copy()
    a = rng.standard_normal((5, 64)).astype(np.float32)
    for method in gemm.fixed_methods(np.dtype(np.float32)):
        assert gemm.fixed(w, method, 5) is not gemm.fixed(w, method, 5)
        with reusing_prepared([w]):
            first = gemm.fixed(w, method, 5)
            assert gemm.fixed(w, method, 5) is first
            assert gemm.fixed(w.T.T, method, 5) is first  # another view of the same memory
            assert gemm.fixed(other, method, 5) is not gemm.fixed(other, method, 5)
            assert gemm.fixed(w, method, 4) is not first  # prepared for another batch
            fwd = gemm.fixed(w[:32].T, method, 5)  # [16, 32], a transposed view into w
            assert gemm.fixed(w[:32].T, method, 5) is fwd
            out = np.empty((5, 16), np.float32)
            np.testing.assert_allclose(first(a, out), a @ w, rtol=1e-5, atol=1e-5)
            out2 = np.empty((5, 32), np.float32)
            np.testing.assert_allclose(fwd(a[:, :16], out2), a[:, :16] @ w[:32].T,
                                       rtol=1e-5, atol=1e-5)  # fmt: skip
        assert gemm.fixed(w, method, 5) is not first


def test_recompute_prepares_each_recurrent_weight_once_per_layer_direction(monkeypatch):
    """A recompute step with many segments prepares the recurrent weight once per (layer,
    direction) and pass (checkpoint forward, backward), not once per segment."""
    from lstmgrad.fused import gemm as gemm_mod

    calls = []
    original = gemm_mod.NumpyGemm._fixed

    def counting(self, b, method, rows, threads):  # type: ignore[no-untyped-def]
        calls.append(b.shape)
        return original(self, b, method, rows, threads)

    monkeypatch.setattr(gemm_mod.NumpyGemm, "_fixed", counting)
    t, b, i, h = 40, 3, 5, 6
    rng = np.random.default_rng(1)
    x = rng.standard_normal((t, b, i))
    params = [rng.standard_normal(s) * 0.3 for s in [(4 * h, i), (4 * h, h), (4 * h,), (4 * h,)]]
    dims = Dims(t, b, i, h, 1, 1, True)
    zeros = np.zeros((1, b, h))
    with lstmgrad.planning.plan.forced(walk=False, pair_walks=False):
        y, _, _, ck = recompute.forward(x, params, zeros, zeros, dims, 4)
        calls_forward = len(calls)
        recompute.backward(ck, np.ones_like(y), None, None)
    assert calls_forward == 1  # ten segments, one preparation
    assert len(calls) == 3  # the backward: the recomputing forward's and the backward's
