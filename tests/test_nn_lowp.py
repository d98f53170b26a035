"""lstmgrad.nn.LSTM in bfloat16 and under CPU autocast, against torch autograd in float64 on
the same (rounded) weights and inputs, with tolerances from the low-precision epsilon; and the
dtypes of outputs and gradients against torch.nn.LSTM under autocast."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch.nn.utils.rnn import pack_sequence  # noqa: E402

import lstmgrad.pytorch.nn as nn_mod  # noqa: E402
from lstmgrad.nn import LSTM  # noqa: E402
from lstmgrad.ops import tensors as tensors_mod  # noqa: E402
from lstmgrad.torch_ops import lstm  # noqa: E402

BF16_EPS = 2.0**-8  # bfloat16's machine epsilon (8 significand bits)
F16_EPS = 2.0**-11
# bfloat16 products (operands rounded to bfloat16) where the CPU has the units; float32 else
BF16_PRODUCTS = tensors_mod._probe_bf16_gemm(torch)
BF16_TOL = 4 * BF16_EPS if BF16_PRODUCTS else BF16_EPS


def rel(a, b):
    return ((a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(1e-30)).item()


def exact_in(dtype, *shape, seed):
    """float64 values exactly representable in ``dtype``."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype).double()


def loss_and_grads(model, x, hx, cast_to=torch.float64):
    """A loss whose upstream gradients are exact in every dtype used (bfloat16-representable
    weights), and the gradients of input, state and every parameter."""
    y, (h_n, c_n) = model(x, hx)
    wy, wh, wc = (
        exact_in(torch.bfloat16, *t.shape, seed=9 + j) for j, t in enumerate((y, h_n, c_n))
    )
    loss = (y.double() * wy).sum() + (h_n.double() * wh).sum() + (c_n.double() * wc).sum()
    grads = torch.autograd.grad(loss, [x, *hx, *model.parameters()])
    return (y, h_n, c_n), grads


@pytest.mark.parametrize("num_layers,bidirectional", [(1, False), (2, True)], ids=["L1D1", "L2D2"])
@pytest.mark.parametrize("batch_first", [False, True], ids=["tb", "bf"])
def test_bfloat16_against_float64(num_layers, bidirectional, batch_first):
    torch.manual_seed(0)
    ours = LSTM(6, 8, num_layers=num_layers, bidirectional=bidirectional, batch_first=batch_first)
    ours = ours.bfloat16()
    oracle = torch.nn.LSTM(6, 8, num_layers=num_layers, bidirectional=bidirectional,
                           batch_first=batch_first).double()  # fmt: skip
    oracle.load_state_dict({k: v.double() for k, v in ours.state_dict().items()})
    k = num_layers * (2 if bidirectional else 1)
    shape = (3, 5, 6) if batch_first else (5, 3, 6)
    x64 = exact_in(torch.bfloat16, *shape, seed=1)
    h64, c64 = exact_in(torch.bfloat16, k, 3, 8, seed=2), exact_in(torch.bfloat16, k, 3, 8, seed=3)
    ins = [t.bfloat16().requires_grad_() for t in (x64, h64, c64)]
    ref = [t.clone().requires_grad_() for t in (x64, h64, c64)]
    outs, grads = loss_and_grads(ours, ins[0], (ins[1], ins[2]))
    outs_ref, grads_ref = loss_and_grads(oracle, ref[0], (ref[1], ref[2]))
    for a, b in [*zip(outs, outs_ref, strict=True), *zip(grads, grads_ref, strict=True)]:
        assert a.dtype == torch.bfloat16 and a.shape == b.shape
        # one rounding to bfloat16 of a float32 result: half an epsilon, plus float32 noise;
        # with bfloat16 products, operands rounded too (as torch's bfloat16 products)
        assert rel(a, b) <= BF16_TOL


def _bf16_products(monkeypatch):
    """lstmgrad.nn.LSTM in float32 runs the bfloat16 products its bfloat16 calls run."""

    def with_bf16_products(*args, **kwargs):
        return lstm(*args, **{**kwargs, "products": "bfloat16"})

    monkeypatch.setattr(nn_mod, "lstm", with_bf16_products)


def test_bfloat16_runs_lstmgrad_not_torch(monkeypatch):
    """The bfloat16 result is lstmgrad's float32 computation (with bfloat16 products) rounded
    once (torch's own bfloat16 LSTM rounds inside and differs)."""
    torch.manual_seed(0)
    m = LSTM(6, 8).bfloat16()
    x = torch.randn(5, 3, 6).bfloat16()
    y = m(x)[0]
    m32 = LSTM(6, 8)
    m32.load_state_dict({k: v.float() for k, v in m.state_dict().items()})
    _bf16_products(monkeypatch)
    assert torch.equal(y, m32(x.float())[0].bfloat16())


def pair(dtype=torch.float32):
    torch.manual_seed(1)
    ref = torch.nn.LSTM(6, 8, num_layers=2).to(dtype)
    ours = LSTM(6, 8, num_layers=2).to(dtype)
    ours.load_state_dict(ref.state_dict())
    return ref, ours


def run_autocast(model, x, dtype):
    with torch.autocast("cpu", dtype=dtype):
        y, (h, c) = model(x)
    (y.double().sum() + h.double().sum() + c.double().sum()).backward()
    return y, h, c


def test_autocast_bfloat16_dtypes_and_values_like_torch():
    ref, ours = pair()
    x0 = torch.randn(5, 3, 6)
    got = {}
    for name, model in (("torch", ref), ("ours", ours)):
        x = x0.clone().requires_grad_()
        outs = run_autocast(model, x, torch.bfloat16)
        got[name] = (outs, x.grad, [p.grad for p in model.parameters()])
    (o0, gx0, gp0), (o1, gx1, gp1) = got["torch"], got["ours"]
    assert [t.dtype for t in o1] == [t.dtype for t in o0] == [torch.bfloat16] * 3
    assert gx1.dtype == gx0.dtype == torch.float32
    assert [g.dtype for g in gp1] == [g.dtype for g in gp0]
    # the oracle: float64 on the values autocast feeds the LSTM (input and weights in bfloat16)
    oracle = torch.nn.LSTM(6, 8, num_layers=2).double()
    oracle.load_state_dict({k: v.bfloat16().double() for k, v in ours.state_dict().items()})
    x = x0.bfloat16().double().requires_grad_()
    y, (h, c) = oracle(x)
    (y.sum() + h.sum() + c.sum()).backward()
    for a, b in [(o1[0], y), (o1[1], h), (o1[2], c), (gx1, x.grad),
                 *zip(gp1, [p.grad for p in oracle.parameters()], strict=True)]:  # fmt: skip
        assert rel(a, b) <= BF16_EPS


def test_autocast_float16_runs_in_float16():
    """torch's own CPU LSTM fails under float16 autocast (oneDNN has no float16 primitive);
    the drop-in runs the float16 path, with torch's autocast dtypes."""
    ref, ours = pair()
    x0 = torch.randn(5, 3, 6)
    x = x0.clone().requires_grad_()
    y1, h1, c1 = run_autocast(ours, x, torch.float16)
    assert (y1.dtype, h1.dtype, c1.dtype) == (torch.float16,) * 3 and x.grad.dtype == torch.float32
    oracle = torch.nn.LSTM(6, 8, num_layers=2).double()
    oracle.load_state_dict({k: v.half().double() for k, v in ours.state_dict().items()})
    xr = x0.half().double().requires_grad_()
    y, (h, c) = oracle(xr)
    (y.sum() + h.sum() + c.sum()).backward()
    # float16 rounds once per (layer, direction) in both passes: a few epsilons over 2 layers
    for a, b in [(y1, y), (h1, h), (c1, c), (x.grad, xr.grad),
                 *zip([p.grad for p in ours.parameters()], [p.grad for p in oracle.parameters()],
                      strict=True)]:  # fmt: skip
        assert rel(a, b) <= 8 * F16_EPS


def test_autocast_leaves_packed_sequences_in_float32_like_torch():
    """torch does not cast a PackedSequence LSTM's tensors under autocast (its inner products
    run in bfloat16 but the results are float32); the drop-in computes it in float32 as
    without autocast."""
    ref, ours = pair()
    seqs = [torch.randn(n, 6) for n in (5, 3, 2)]
    plain = ref(pack_sequence(seqs))
    outs = []
    for model in (ref, ours):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y, (h, c) = model(pack_sequence(seqs))
        outs.append((y.data, h, c))
    for a, b, c in zip(outs[1], outs[0], (plain[0].data, *plain[1]), strict=True):
        assert a.dtype == b.dtype == torch.float32
        assert rel(a, c) <= 2e-5 and rel(b, c) <= 4 * BF16_EPS  # torch: bfloat16 products


def test_bfloat16_packed_unsorted_is_float32_rounded_once(monkeypatch):
    torch.manual_seed(0)
    m = LSTM(6, 8, num_layers=2, bidirectional=True).bfloat16()
    m32 = LSTM(6, 8, num_layers=2, bidirectional=True)
    m32.load_state_dict({k: v.float() for k, v in m.state_dict().items()})
    seqs = [torch.randn(n, 6).bfloat16() for n in (3, 5, 1, 4)]
    y, (h, c) = m(pack_sequence(seqs, enforce_sorted=False))
    _bf16_products(monkeypatch)
    y32, (h32, c32) = m32(pack_sequence([s.float() for s in seqs], enforce_sorted=False))
    for a, b in [(y.data, y32.data), (h, h32), (c, c32)]:
        assert a.dtype == torch.bfloat16 and torch.equal(a, b.bfloat16())


def test_autocast_keeps_float64_like_torch():
    ref, ours = pair(torch.float64)
    x = torch.randn(5, 3, 6, dtype=torch.float64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y0 = ref(x)[0]
        y1 = ours(x)[0]
    assert y1.dtype == y0.dtype == torch.float64
    assert rel(y1, y0) <= 1e-12
