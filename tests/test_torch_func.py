"""Second derivatives and torch.func over the lstmgrad:: ops and lstmgrad.nn.LSTM.

Oracles: finite differences (gradgradcheck, float64), torch.nn.LSTM's own autograd in float64
(gradient penalties, jacobians, per-sample gradients), and per-sample calls of the fused op
(vmap folding).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch.func import functional_call, grad, jacfwd, jacrev, vmap  # noqa: E402
from torch.nn.utils.rnn import pack_sequence  # noqa: E402

import lstmgrad.torch_ops as torch_ops  # noqa: E402
from lstmgrad.nn import LSTM  # noqa: E402
from lstmgrad.pytorch.torch_grad import torch_lstm  # noqa: E402

OPS = torch.ops.lstmgrad
F64 = torch.float64


def pair(i, h, num_layers=1, bidirectional=False, bias=True, batch_first=False, dtype=F64):
    """torch.nn.LSTM and lstmgrad.nn.LSTM with the same weights."""
    torch.manual_seed(0)
    kw = dict(
        num_layers=num_layers, bidirectional=bidirectional, bias=bias, batch_first=batch_first
    )
    ref = torch.nn.LSTM(i, h, **kw).to(dtype)
    ours = LSTM(i, h, **kw).to(dtype)
    ours.load_state_dict(ref.state_dict())
    return ref, ours


def as_function(module):
    """f(x, h0, c0, *params) -> (y, h_n, c_n) of the module with those parameters."""
    names = [n for n, _ in module.named_parameters()]

    def f(x, h0, c0, *ps):
        y, (h_n, c_n) = functional_call(module, dict(zip(names, ps, strict=True)), (x, (h0, c0)))
        return y, h_n, c_n

    return f


def dense_inputs(module, t=3, b=2, requires_grad=True, seed=1):
    g = torch.Generator().manual_seed(seed)
    k = module.num_layers * (2 if module.bidirectional else 1)
    dt = module.weight_hh_l0.dtype
    shape = (b, t, module.input_size) if module.batch_first else (t, b, module.input_size)
    x = torch.randn(*shape, generator=g, dtype=dt)
    h0 = torch.randn(k, b, module.hidden_size, generator=g, dtype=dt)
    c0 = torch.randn(k, b, module.hidden_size, generator=g, dtype=dt)
    ps = [p.detach().clone() for p in module.parameters()]
    leaves = [x, h0, c0, *ps]
    if requires_grad:
        for a in leaves:
            a.requires_grad_()
    return leaves


# ---------------------------------------------------------------------------------------------
# double backward


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("num_layers", [1, 2, 3])
@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
def test_gradgradcheck_dense(bidirectional, num_layers, bias):
    _, ours = pair(2, 2, num_layers, bidirectional, bias)
    leaves = dense_inputs(ours)
    assert torch.autograd.gradgradcheck(as_function(ours), leaves, fast_mode=True)


def test_gradgradcheck_slow_mode_batch_first():
    # every entry of the second-derivative Jacobian, not a random projection of it
    _, ours = pair(2, 2, 1, True, True, batch_first=True)
    leaves = dense_inputs(ours, t=2)
    assert torch.autograd.gradgradcheck(as_function(ours), leaves)


@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
def test_gradgradcheck_packed(bidirectional):
    _, ours = pair(2, 2, 2, bidirectional)
    g = torch.Generator().manual_seed(2)
    seqs = [torch.randn(n, 2, generator=g, dtype=F64, requires_grad=True) for n in (2, 4, 1)]
    ps = [p.detach().clone().requires_grad_() for p in ours.parameters()]
    names = [n for n, _ in ours.named_parameters()]

    def f(a, b, c, *ps):
        packed = pack_sequence([a, b, c], enforce_sorted=False)
        y, (h_n, c_n) = functional_call(ours, dict(zip(names, ps, strict=True)), (packed,))
        return y.data, h_n, c_n

    assert torch.autograd.gradgradcheck(f, [*seqs, *ps], fast_mode=True)


def test_gradgradcheck_padding_and_dropout_masks_op():
    # the op itself: padded variable-length rows holding NaN and fixed inter-layer dropout masks
    t, b, i, h, nl = 3, 3, 2, 2, 2
    _, ours = pair(i, h, nl, True)
    g = torch.Generator().manual_seed(3)
    batch_sizes = torch.tensor([3, 2, 1])
    valid = (torch.arange(b) < batch_sizes.unsqueeze(1)).reshape(-1, 1)
    x = torch.where(valid, torch.randn(t * b, i, generator=g, dtype=F64), torch.nan)
    masks = torch.bernoulli(torch.full((nl - 1, t, b, 2 * h), 0.6, dtype=F64), generator=g) / 0.6
    h0, c0 = (torch.randn(2 * nl, b, h, generator=g, dtype=F64) for _ in range(2))
    ps = [p.detach().clone() for p in ours.parameters()]

    def f(x, h0, c0, *ps):
        flags = (True, nl, 0.4, True, True, False)
        y, h_n, c_n, _ = OPS.lstm_forward(x, list(ps), h0, c0, batch_sizes, masks, *flags)
        return y, h_n, c_n

    leaves = [a.requires_grad_() for a in (x, h0, c0, *ps)]
    # finite differences cannot perturb the NaN rows; their gradients must be exactly zero
    y = f(*leaves)[0]
    grads = torch.autograd.grad(y.sum(), leaves, create_graph=True)
    (gg,) = torch.autograd.grad(sum((a**2).sum() for a in grads[1:]), [x])
    assert torch.equal(gg[~valid.squeeze(1)], torch.zeros_like(gg[~valid.squeeze(1)]))
    assert gg[valid.squeeze(1)].abs().sum() > 0
    x_ok = torch.where(valid, x.detach(), 0.0).requires_grad_()
    assert torch.autograd.gradgradcheck(f, [x_ok, *leaves[1:]], fast_mode=True)


def penalty_grads(module, x, hx, wrt):
    """d/d(wrt) of ||dL/d(params, x)||^2 with L = sum(y^2) + sum(h_n) (create_graph=True)."""
    out, (h_n, _) = module(x() if callable(x) else x, hx)
    y = out.data if hasattr(out, "batch_sizes") else out
    params = list(module.parameters())
    first = torch.autograd.grad((y**2).sum() + h_n.sum(), [*params, *wrt], create_graph=True)
    penalty = sum((g**2).sum() for g in first)
    return torch.autograd.grad(penalty, [*params, *wrt])


@pytest.mark.parametrize("packed", [False, True], ids=["dense", "packed"])
def test_gradient_penalty_matches_torch_float64(packed):
    ref, ours = pair(3, 4, 2, True)
    g = torch.Generator().manual_seed(4)
    h0 = torch.randn(4, 3, 4, generator=g, dtype=F64, requires_grad=True)
    c0 = torch.randn(4, 3, 4, generator=g, dtype=F64)
    if packed:
        seqs = [torch.randn(n, 3, generator=g, dtype=F64, requires_grad=True) for n in (5, 2, 4)]
        x = lambda: pack_sequence(seqs, enforce_sorted=False)  # noqa: E731 (a graph per call)
        wrt = [*seqs, h0]
    else:
        x = torch.randn(5, 3, 3, generator=g, dtype=F64, requires_grad=True)
        wrt = [x, h0]
    want = penalty_grads(ref, x, (h0, c0), wrt)
    got = penalty_grads(ours, x, (h0, c0), wrt)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-4), (torch.float16, 2e-2)])
def test_gradient_penalty_low_precision_close_to_float64(dtype, tol):
    ref, _ = pair(3, 4, 2, False)
    _, ours = pair(3, 4, 2, False, dtype=dtype)
    g = torch.Generator().manual_seed(5)
    x = torch.randn(4, 2, 3, generator=g, dtype=F64)
    hx = tuple(torch.zeros(2, 2, 4, dtype=F64) for _ in range(2))
    want = penalty_grads(ref, x.clone().requires_grad_(), hx, [])
    got = penalty_grads(ours, x.to(dtype).requires_grad_(), tuple(a.to(dtype) for a in hx), [])
    for a, b in zip(got, want, strict=True):
        assert a.dtype == dtype
        err = (a.double() - b).abs().max() / b.abs().max()
        assert err < tol


@pytest.mark.parametrize(
    "second", [lambda f: jacrev(jacrev(f)), torch.func.hessian], ids=["jacrev-jacrev", "hessian"]
)
def test_second_order_through_torch_func(second):
    # the backward's own gradient (jacrev) and forward-mode derivative (hessian's jacfwd)
    ref, ours = pair(2, 3, 1, True)
    x = torch.randn(3, 1, 2, dtype=F64)

    def scalar(m):
        return lambda x: (m(x)[0] ** 2).sum()

    want = second(scalar(ref))(x)
    got = second(scalar(ours))(x)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_third_order_with_autograd_matches_torch():
    # create_graph=True twice: the double backward's result is differentiable again
    ref, ours = pair(2, 3, 2, True)
    x = torch.randn(3, 2, 2, dtype=F64, requires_grad=True)

    def third(m):
        y = m(x)[0]
        (g1,) = torch.autograd.grad((y**3).sum(), x, create_graph=True)
        (g2,) = torch.autograd.grad((g1**2).sum(), x, create_graph=True)
        return torch.autograd.grad((g2**2).sum(), [x, m.weight_hh_l0])

    want, got = third(ref), third(ours)
    for a, b in zip(got, want, strict=True):
        assert b.abs().max() > 0
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9 * float(b.abs().max()))


def test_torch_lstm_matches_the_fused_op():
    # the second-order path's forward is the op's forward
    ref, ours = pair(3, 4, 3, True)
    x, h0, c0, *ps = dense_inputs(ours, t=5, b=3, requires_grad=False)
    want = OPS.lstm_forward(x, ps, h0, c0, None, None, True, 3, 0.0, False, True, False)[:3]
    got = torch_lstm(x, ps, h0, c0, None, None, True, 3, True, False)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-13)


# ---------------------------------------------------------------------------------------------
# vmap


class _Counter:
    def __init__(self, fn):
        self.fn, self.calls = fn, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.fn(*args, **kwargs)


@pytest.mark.parametrize("batch_first", [False, True], ids=["time-major", "batch-first"])
def test_vmap_folds_input_and_state_into_one_call(monkeypatch, batch_first):
    ref, ours = pair(3, 4, 2, True, batch_first=batch_first)
    n, t, b = 4, 5, 2
    g = torch.Generator().manual_seed(6)
    xs = torch.randn(n, *((b, t, 3) if batch_first else (t, b, 3)), generator=g, dtype=F64)
    h0s = torch.randn(4, n, b, 4, generator=g, dtype=F64)  # vmapped at dim 1
    c0 = torch.randn(4, b, 4, generator=g, dtype=F64)  # shared
    forward = _Counter(torch_ops.run_forward)
    monkeypatch.setattr(torch_ops, "run_forward", forward)
    y, (h_n, c_n) = vmap(lambda x, h: ours(x, (h, c0)), in_dims=(0, 1))(xs, h0s)
    assert forward.calls == 1
    for j in range(n):
        wy, (wh, wc) = ref(xs[j], (h0s[:, j], c0))
        torch.testing.assert_close(y[j], wy, rtol=1e-12, atol=1e-13)
        torch.testing.assert_close(h_n[j], wh, rtol=1e-12, atol=1e-13)
        torch.testing.assert_close(c_n[j], wc, rtol=1e-12, atol=1e-13)


def test_vmap_variable_lengths_op_folds(monkeypatch):
    t, b, i, h, n = 4, 3, 2, 3, 3
    _, ours = pair(i, h, 1, True)
    ps = [p.detach() for p in ours.parameters()]
    batch_sizes = torch.tensor([3, 3, 2, 1])
    g = torch.Generator().manual_seed(7)
    xs = torch.randn(n, t * b, i, generator=g, dtype=F64)
    h0 = torch.randn(2, b, h, generator=g, dtype=F64)
    flags = (True, 1, 0.0, True, True, False)

    def f(x):
        return OPS.lstm_forward(x, ps, h0, h0, batch_sizes, None, *flags)

    forward = _Counter(torch_ops.run_forward)
    monkeypatch.setattr(torch_ops, "run_forward", forward)
    got = vmap(f)(xs)
    assert forward.calls == 1
    for j in range(n):
        for a, w in zip(got, f(xs[j]), strict=True):
            torch.testing.assert_close(a[j], w, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("need_dw", [False, True], ids=["fold", "loop"])
def test_vmap_backward_op_against_per_sample_calls(monkeypatch, need_dw):
    t, b, i, h, n = 3, 2, 2, 3, 3
    _, ours = pair(i, h, 2, True)
    ps = [p.detach() for p in ours.parameters()]
    g = torch.Generator().manual_seed(8)
    x = torch.randn(t, b, i, generator=g, dtype=F64)
    h0 = torch.randn(4, b, h, generator=g, dtype=F64)
    flags = (True, 2, 0.0, True, True, False)
    _, _, _, saved = OPS.lstm_forward(x, ps, h0, h0, None, None, *flags)
    dys = torch.randn(n, t, b, 2 * h, generator=g, dtype=F64)
    dhs = torch.randn(n, 4, b, h, generator=g, dtype=F64)
    mask = [True, True, True, need_dw]

    def f(dy, dh):
        return OPS.lstm_backward(x, ps, h0, h0, dy, dh, None, saved, None, None, *flags, mask)

    backward = _Counter(torch_ops.run_backward)
    monkeypatch.setattr(torch_ops, "run_backward", backward)
    got = vmap(f)(dys, dhs)
    assert backward.calls == (n if need_dw else 1)
    for j in range(n):
        want = f(dys[j], dhs[j])
        for a, w in zip(got[:3], want[:3], strict=True):
            torch.testing.assert_close(a[j], w, rtol=1e-12, atol=1e-13)
        assert len(got[3]) == len(want[3]) == (len(ps) if need_dw else 0)
        for a, w in zip(got[3], want[3], strict=True):
            torch.testing.assert_close(a[j], w, rtol=1e-12, atol=1e-13)


def test_vmap_over_weights_ensemble():
    models = [pair(3, 4, 1, False)[0] for _ in range(2)]
    with torch.no_grad():
        models[1].weight_hh_l0.mul_(-0.5)
    ours = LSTM(3, 4).to(F64)
    params, _ = torch.func.stack_module_state(models)
    x = torch.randn(5, 2, 3, dtype=F64)
    y = vmap(lambda p: functional_call(ours, p, (x,))[0])(params)
    for j, m in enumerate(models):
        torch.testing.assert_close(y[j], m(x)[0], rtol=1e-12, atol=1e-13)


# ---------------------------------------------------------------------------------------------
# torch.func transforms and batched gradients against torch.nn.LSTM


def test_functional_call_matches_module():
    ref, ours = pair(3, 4, 2, True)
    params = {k: torch.randn_like(v) * 0.3 for k, v in ours.named_parameters()}
    x = torch.randn(4, 2, 3, dtype=F64)
    got = functional_call(ours, params, (x,))
    want = functional_call(ref, params, (x,))
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("jac", [jacrev, jacfwd], ids=["jacrev", "jacfwd"])
def test_jacobians_match_torch(jac):
    ref, ours = pair(2, 3, 2, True)
    x = torch.randn(4, 2, 2, dtype=F64)
    h0 = torch.randn(4, 2, 3, dtype=F64)

    def of(m):
        return lambda x, h: m(x, (h, h))[0]

    want = jac(of(ref), argnums=(0, 1))(x, h0)
    got = jac(of(ours), argnums=(0, 1))(x, h0)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_jacrev_wrt_parameters_matches_torch():
    ref, ours = pair(2, 3, 1, False)
    x = torch.randn(3, 2, 2, dtype=F64)
    params = {k: v.detach() for k, v in ref.named_parameters()}

    def of(m):
        return lambda p: functional_call(m, p, (x,))[1][0]

    want = jacrev(of(ref))(params)
    got = jacrev(of(ours))(params)
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=1e-10, atol=1e-12)


def test_forward_mode_dual_matches_torch():
    import torch.autograd.forward_ad as fwad

    ref, ours = pair(2, 3, 1, True)
    x = torch.randn(4, 2, 2, dtype=F64)
    tangent = torch.randn_like(x)
    outs = []
    for m in (ref, ours):
        with fwad.dual_level():
            y = m(fwad.make_dual(x, tangent))[0]
            outs.append(fwad.unpack_dual(y).tangent)
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("packed", [False, True], ids=["dense", "packed"])
def test_is_grads_batched_matches_loop(packed):
    ref, ours = pair(2, 3, 2, True)
    g = torch.Generator().manual_seed(9)
    if packed:
        seqs = [torch.randn(n, 2, generator=g, dtype=F64, requires_grad=True) for n in (3, 1)]
        leaves = [*seqs, *ref.parameters()]
        outs = [m(pack_sequence(seqs, enforce_sorted=False))[0].data for m in (ref, ours)]
    else:
        x = torch.randn(3, 2, 2, generator=g, dtype=F64, requires_grad=True)
        leaves = [x, *ref.parameters()]
        outs = [m(x)[0] for m in (ref, ours)]
    vs = torch.randn(4, *outs[0].shape, generator=g, dtype=F64)
    params = list(ours.parameters())
    inputs = [*leaves[: -len(params)], *params]
    got = torch.autograd.grad(outs[1], inputs, vs, is_grads_batched=True)
    for j in range(len(vs)):
        # torch.nn.LSTM's, one cotangent at a time
        want = torch.autograd.grad(outs[0], leaves, vs[j], retain_graph=True)
        for a, w in zip(got, want, strict=True):
            torch.testing.assert_close(a[j], w, rtol=1e-10, atol=1e-12)


def test_gradcheck_check_batched_grad():
    _, ours = pair(2, 2, 2, True)
    leaves = dense_inputs(ours, t=2)
    assert torch.autograd.gradcheck(as_function(ours), leaves, check_batched_grad=True)


@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
def test_per_sample_gradients_opacus_style(bidirectional):
    ref, ours = pair(3, 4, 2, bidirectional, batch_first=True)
    head = torch.nn.Linear(ours.hidden_size * (2 if bidirectional else 1), 1).to(F64)
    n = 5
    g = torch.Generator().manual_seed(10)
    xs = torch.randn(n, 4, 3, generator=g, dtype=F64)
    ys = torch.randn(n, 1, generator=g, dtype=F64)

    def loss_fn(m):
        def loss(params, x, y):
            out, _ = functional_call(m, params, (x.unsqueeze(0),))
            return ((head(out[0, -1]) - y) ** 2).sum()

        return loss

    params = {k: v.detach() for k, v in ours.named_parameters()}
    got = vmap(grad(loss_fn(ours)), in_dims=(None, 0, 0))(params, xs, ys)
    for j in range(n):
        ref.zero_grad()
        loss_fn(ref)(dict(ref.named_parameters()), xs[j], ys[j]).backward()
        for k, p in ref.named_parameters():
            torch.testing.assert_close(got[k][j], p.grad, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("mask", [[True, True, True, True], [True, False, True, False]])
def test_opcheck_backward_flat(mask):
    from torch.library import opcheck

    _, ours = pair(2, 3, 2, True)
    x, h0, c0, *ps = dense_inputs(ours, requires_grad=False)
    flags = (True, 2, 0.0, True, True, False)
    y, _, _, saved = OPS.lstm_forward(x, ps, h0, c0, None, None, *flags)
    flat = torch.cat([p.reshape(-1) for p in ps])
    dy = torch.randn_like(y)
    args = (x, flat, h0, c0, dy, None, None, saved, None, None, *flags, mask)
    opcheck(OPS.lstm_backward_flat.default, args)
    got = OPS.lstm_backward_flat(*args)
    want = OPS.lstm_backward(x, ps, h0, c0, dy, None, None, saved, None, None, *flags, mask)
    for a, w in zip(got[:3], want[:3], strict=True):
        assert torch.equal(a, w)
    want_flat = torch.cat([p.reshape(-1) for p in want[3]]) if mask[3] else got[3].new_empty(0)
    assert torch.equal(got[3], want_flat)


def test_gradgradcheck_check_batched_grad():
    _, ours = pair(2, 2, 1, True)
    x, h0, c0, *_ = dense_inputs(ours, t=2)
    assert torch.autograd.gradgradcheck(
        lambda x, h0: ours(x, (h0, c0.detach()))[0], (x, h0), check_batched_grad=True
    )
