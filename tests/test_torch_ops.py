"""The lstmgrad:: custom ops: torch.library.opcheck, gradcheck in float64 (finite differences),
torch.compile fullgraph, and the error of a forward that saved nothing (second derivatives and
torch.func: test_torch_func.py)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch.library import opcheck  # noqa: E402

from lstmgrad.torch_ops import lstm  # noqa: E402

OPS = torch.ops.lstmgrad


def weights(i, h, num_layers, bidirectional, bias, dtype=torch.float64, seed=0):
    torch.manual_seed(seed)
    m = torch.nn.LSTM(i, h, num_layers=num_layers, bidirectional=bidirectional, bias=bias)
    return [w.detach().to(dtype) for w in m._flat_weights]


CASES = [
    # id, T, B, I, H, L, bidirectional, bias, batch_first, batch_sizes
    ("T3-B2-I4-H5-L1-D1", 3, 2, 4, 5, 1, False, True, False, None),
    ("T4-B3-I3-H4-L2-D2-bf", 4, 3, 3, 4, 2, True, True, True, None),
    ("T1-B1-I2-H3-L1-D1-nobias", 1, 1, 2, 3, 1, False, False, False, None),
    ("T4-B3-I3-H4-L2-D2-varlen", 4, 3, 3, 4, 2, True, True, False, [3, 2, 2, 1]),
]


def case_args(case, dtype=torch.float64, requires_grad=False):
    _, t, b, i, h, nl, bi, bias, bf, bs = case
    g = torch.Generator().manual_seed(1)
    k = nl * (2 if bi else 1)
    if bs is not None:
        x = torch.randn(t * b, i, generator=g, dtype=dtype)
    else:
        x = torch.randn(*((b, t, i) if bf else (t, b, i)), generator=g, dtype=dtype)
    h0 = torch.randn(k, b, h, generator=g, dtype=dtype)
    c0 = torch.randn(k, b, h, generator=g, dtype=dtype)
    ps = weights(i, h, nl, bi, bias, dtype)
    if requires_grad:
        for a in [x, h0, c0, *ps]:
            a.requires_grad_()
    bs_t = None if bs is None else torch.tensor(bs, dtype=torch.int64)
    flags = dict(has_bias=bias, num_layers=nl, bidirectional=bi, batch_first=bf)
    return x, ps, h0, c0, bs_t, flags


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_opcheck_forward(case):
    x, ps, h0, c0, bs, fl = case_args(case, torch.float32, requires_grad=True)
    args = (x, ps, h0, c0, bs, None, fl["has_bias"], fl["num_layers"], 0.0, True,
            fl["bidirectional"], fl["batch_first"])  # fmt: skip
    opcheck(OPS.lstm_forward.default, args)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize(
    "mask", [[True] * 4, [False, True, True, True], [True, False, False, False]],
    ids=["all", "no-dx", "dx-only"],
)  # fmt: skip
def test_opcheck_backward(case, mask):
    x, ps, h0, c0, bs, fl = case_args(case, torch.float32)
    flags = (fl["has_bias"], fl["num_layers"], 0.0, True, fl["bidirectional"], fl["batch_first"])
    y, _, _, saved = OPS.lstm_forward(x, ps, h0, c0, bs, None, *flags)
    dy = torch.randn_like(y)
    dh = torch.randn_like(h0)
    opcheck(OPS.lstm_backward.default, (x, ps, h0, c0, dy, dh, None, saved, bs, None, *flags, mask))


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_gradcheck(case):
    x, ps, h0, c0, bs, fl = case_args(case, requires_grad=True)

    def f(x, h0, c0, *ps):
        return lstm(x, list(ps), (h0, c0), bs, **fl)

    assert torch.autograd.gradcheck(f, (x, h0, c0, *ps))


def test_gradcheck_with_dropout_masks():
    """Dropout masks come from torch's generator: reseeding makes the function deterministic, so
    finite differences check the gradient through the masks."""
    x, ps, h0, c0, bs, fl = case_args(CASES[3], requires_grad=True)
    fl["num_layers"] = 2

    def f(x, h0, c0, *ps):
        torch.manual_seed(3)
        return lstm(x, list(ps), (h0, c0), bs, dropout=0.5, **fl)

    assert torch.autograd.gradcheck(f, (x, h0, c0, *ps))
    torch.manual_seed(3)
    y_drop = lstm(x, ps, (h0, c0), bs, dropout=0.5, **fl)[0]
    y_plain = lstm(x, ps, (h0, c0), bs, **fl)[0]
    assert not torch.allclose(y_drop, y_plain)


def test_compile_fullgraph_functional():
    x, ps, h0, c0, bs, fl = case_args(CASES[1], torch.float32, requires_grad=True)

    def loss(x, h0, c0, ps):
        y, h_n, c_n = lstm(x, ps, (h0, c0), **fl)
        return (y**2).sum() + h_n.sum() + (c_n * 0.5).sum()

    leaves = [x, h0, c0, *ps]
    want = torch.autograd.grad(loss(x, h0, c0, ps), leaves)
    compiled = torch.compile(loss, backend="aot_eager", fullgraph=True)
    got = torch.autograd.grad(compiled(x, h0, c0, ps), leaves)
    for a, b in zip(got, want, strict=True):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6)


def test_no_grad_forward_saves_nothing():
    x, ps, h0, c0, bs, fl = case_args(CASES[0])
    flags = (fl["has_bias"], fl["num_layers"], 0.0, False, fl["bidirectional"], fl["batch_first"])
    y, hy, cy, saved = OPS.lstm_forward(x, ps, h0, c0, bs, None, *flags)
    assert saved.shape == (0,)
    with torch.no_grad():
        y2 = lstm(x, ps, (h0, c0), **fl)[0]
    assert torch.equal(y, y2)


def test_backward_op_rejects_missing_saved():
    x, ps, h0, c0, bs, fl = case_args(CASES[0])
    flags = (fl["has_bias"], fl["num_layers"], 0.0, True, fl["bidirectional"], fl["batch_first"])
    import lstmgrad

    with pytest.raises(lstmgrad.LstmInvalidArgumentError, match="saved must have shape") as exc:
        OPS.lstm_backward(x, ps, h0, c0, None, None, None, torch.empty(0, dtype=x.dtype), bs,
                          None, *flags, [True] * 4)  # fmt: skip
    assert exc.value.code == 161002 and exc.value.param == "saved"


@pytest.mark.parametrize("variant", ["dropout-masks", "no-train"])
def test_opcheck_forward_variants(variant):
    # without train nothing is saved: the op is for calls that need no gradient (see below)
    x, ps, h0, c0, bs, fl = case_args(CASES[3], torch.float32, requires_grad=variant != "no-train")
    masks, p, train = None, 0.0, variant != "no-train"
    if variant == "dropout-masks":
        t, b, dh = bs.shape[0], h0.shape[1], 2 * ps[1].shape[1]
        masks = (torch.rand(fl["num_layers"] - 1, t, b, dh) > 0.5).float() * 2.0
        p = 0.5
    args = (x, ps, h0, c0, bs, masks, fl["has_bias"], fl["num_layers"], p, train,
            fl["bidirectional"], fl["batch_first"])  # fmt: skip
    opcheck(OPS.lstm_forward.default, args)


def test_gradient_of_a_forward_that_saved_nothing_raises_clearly():
    x, ps, h0, c0, bs, fl = case_args(CASES[0], requires_grad=True)
    flags = (fl["has_bias"], fl["num_layers"], 0.0, False, fl["bidirectional"], fl["batch_first"])
    y = OPS.lstm_forward(x, ps, h0, c0, bs, None, *flags)[0]
    with pytest.raises(RuntimeError, match="no gradient without saved activations"):
        y.sum().backward()


@pytest.mark.parametrize("rows", [4, 64])
def test_saved_stacking_is_exact(rows):
    """The forward op's [7, L*D, T, B, H] saved tensor from the engine's lists: a view of the
    engine's block where its arrays lie back to back, a copy otherwise, and np.stack's values
    in every case."""
    import numpy as np

    from lstmgrad.core.workspace import block
    from lstmgrad.torch_ops import _stacked

    cols = 6 if rows == 4 else 48
    arrays = block([(rows, cols)] * 5, np.float32)
    for j, a in enumerate(arrays):
        a[...] = np.arange(a.size, dtype=np.float32).reshape(a.shape) + 1000 * j
    got = _stacked(arrays)
    np.testing.assert_array_equal(got, np.stack(arrays))
    assert np.shares_memory(got, arrays[0])
    swapped = [arrays[0], arrays[2], arrays[1], arrays[3], arrays[4]]  # same block, out of order
    got = _stacked(swapped)
    np.testing.assert_array_equal(got, np.stack(swapped))
    assert not np.shares_memory(got, arrays[0])


# a saved array of 5 * 4 * 3 * 8 bytes: written into the op's tensor; of 5 * 4 * 120 * 8: viewed
@pytest.mark.parametrize("hidden", [3, 120])
def test_saved_activations_of_the_op_are_the_engines(hidden):
    """The forward op's saved tensor, whether the engine wrote into it (small arrays) or it
    views the engine's own block: bit for bit the core API's saved lists on the same tensors,
    and the engine refuses a saved_into of the wrong shape with the contract's internal error."""
    import numpy as np

    import lstmgrad
    from lstmgrad import torch_ops
    from lstmgrad.core.contract import check_forward
    from lstmgrad.core.errors import LstmInternalError
    from lstmgrad.ops.api import run_forward
    from lstmgrad.ops.tensors import torch_gemm

    torch.manual_seed(3)
    steps, batch, inp, layers = 5, 4, 6, 2
    m = torch.nn.LSTM(inp, hidden, num_layers=layers, bidirectional=True, dtype=torch.float64)
    x = torch.randn(steps, batch, inp, dtype=torch.float64)
    ps = [p.detach() for p in m._flat_weights]
    h0 = torch.randn(2 * layers, batch, hidden, dtype=torch.float64)
    c0 = torch.randn(2 * layers, batch, hidden, dtype=torch.float64)
    assert (steps * batch * hidden * 8 <= torch_ops._SAVED_INTO_MAX_BYTES) == (hidden == 3)
    out = OPS.lstm_forward(x, ps, h0, c0, None, None, True, layers, 0.0, True, True, False)
    res = lstmgrad.lstm_forward(x, ps, [h0, c0], num_layers=layers, bidirectional=True)
    want = np.stack([np.stack(lst) for lst in res.saved[:7]])
    assert out[3].shape == want.shape
    np.testing.assert_array_equal(out[3].numpy(), want)
    np.testing.assert_array_equal(out[0].numpy(), res.output.numpy())
    call = check_forward("t", x.numpy(), [p.numpy() for p in ps], [h0.numpy(), c0.numpy()],
                         None, True, layers, 0.0, True, True, False, None, None)  # fmt: skip
    into = np.full(want.shape, np.nan)
    got = run_forward(call, None, "fused", torch_gemm(), into)
    np.testing.assert_array_equal(into, want)
    assert all(np.shares_memory(a, into) for lst in got.saved[:7] for a in lst)
    with pytest.raises(LstmInternalError, match="saved_into must be"):
        run_forward(call, None, "fused", torch_gemm(), np.empty((7, 1, 1, 1, 1)))


# --------------------------------------------------------------------------- the eager path


def _run_lstm(case, dtype=torch.float64):
    """lstm()'s output, h_n, c_n and every leaf's gradient of a fixed weighted sum."""
    x, ps, h0, c0, bs, fl = case_args(case, dtype, requires_grad=True)
    y, hy, cy = lstm(x, ps, (h0, c0), bs, **fl)
    g = torch.Generator().manual_seed(2)
    loss = sum((t * torch.randn(t.shape, generator=g, dtype=dtype)).sum() for t in (y, hy, cy))
    grads = torch.autograd.grad(loss, [x, h0, c0, *ps])
    return (y, hy, cy, *grads), y.grad_fn


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_eager_path_is_the_op_bit_for_bit(case, monkeypatch):
    """Plain eager calls skip torch's op dispatcher (lstm_forward's body under an
    autograd.Function); their results and gradients are the op's exactly."""
    import lstmgrad.pytorch.torch_ops as torch_ops

    got, grad_fn = _run_lstm(case, torch.float32)
    assert type(grad_fn).__name__ == "_EagerBackward"
    monkeypatch.setattr(torch_ops, "_eager", lambda tensors: False)
    want, op_grad_fn = _run_lstm(case, torch.float32)
    assert type(op_grad_fn).__name__ != "_EagerBackward"
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b)


def test_eager_path_gradients_against_float64_autograd():
    """The eager path's gradients against torch.nn.LSTM's autograd in float64 (an independent
    oracle), bidirectional, two layers, with h0 and c0."""
    case = CASES[1]
    x, ps, h0, c0, _, fl = case_args(case, requires_grad=True)
    ref = torch.nn.LSTM(3, 4, num_layers=2, bidirectional=True, batch_first=True,
                        dtype=torch.float64)  # fmt: skip
    with torch.no_grad():
        for w, p in zip(ref._flat_weights, ps, strict=True):
            w.copy_(p)
    y, (hy, cy) = ref(x, (h0, c0))
    want = torch.autograd.grad(
        (y.sum() + hy.square().sum() + cy.sum()), [x, h0, c0, *ref._flat_weights]
    )
    y2, hy2, cy2 = lstm(x, ps, (h0, c0), **fl)
    assert y2.grad_fn is not None and type(y2.grad_fn).__name__ == "_EagerBackward"
    got = torch.autograd.grad((y2.sum() + hy2.square().sum() + cy2.sum()), [x, h0, c0, *ps])
    for a, b in zip(got, want, strict=True):
        assert torch.allclose(a, b, rtol=1e-10, atol=1e-12)


def test_a_dispatch_mode_sees_the_op():
    """Under a TorchDispatchMode (a profiler, fake tensors) the call goes through the op, which
    the mode then sees by name."""
    from torch.utils._python_dispatch import TorchDispatchMode

    seen = []

    class Log(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(str(func))
            return func(*args, **(kwargs or {}))

    x, ps, h0, c0, bs, fl = case_args(CASES[0], requires_grad=True)
    with Log():
        y = lstm(x, ps, (h0, c0), bs, **fl)[0]
        y.sum().backward()
    assert "lstmgrad.lstm_forward.default" in seen and "lstmgrad.lstm_backward.default" in seen


def test_eager_path_catches_an_input_changed_in_place():
    """The eager path saves its inputs as autograd does (version counters): changing one in
    place between the forward and the backward raises instead of a wrong gradient."""
    x, ps, h0, c0, bs, fl = case_args(CASES[0], requires_grad=True)
    leaf = ps[0]
    w = leaf * 1.0  # a non-leaf that can be changed in place
    y = lstm(x, [w, *ps[1:]], (h0, c0), bs, **fl)[0]
    with torch.no_grad():
        w.mul_(2.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


def test_eager_path_without_grad_records_nothing():
    """Under no_grad (inference) the body runs alone: no graph, the same output as with one."""
    x, ps, h0, c0, bs, fl = case_args(CASES[2], requires_grad=True)
    with torch.no_grad():
        y = lstm(x, ps, (h0, c0), bs, **fl)[0]
    assert y.grad_fn is None and not y.requires_grad
    assert torch.equal(y, lstm(x, ps, (h0, c0), bs, **fl)[0].detach())
