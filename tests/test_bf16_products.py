"""bfloat16 products (``products="bfloat16"``, what lstmgrad.nn.LSTM runs for bfloat16): every
GEMM rounds its operands to bfloat16 and accumulates in float32. The oracle is a float64 LSTM
whose every product rounds its operands to bfloat16 (forward and backward, written here with
torch operations), against which the engine must be far closer than its float32 products are.
Skipped where the CPU has no bfloat16 units (the products then stay float32)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from lstmgrad.ops import tensors as tensors_mod  # noqa: E402
from lstmgrad.torch_ops import lstm  # noqa: E402

pytestmark = pytest.mark.skipif(
    not tensors_mod._probe_bf16_gemm(torch), reason="no bfloat16 units or no MKL bfloat16 GEMM"
)


def r(t):
    """Rounded to bfloat16 (nearest even), back in t's dtype."""
    return t.to(torch.bfloat16).to(t.dtype)


class _Bf16Mm(torch.autograd.Function):
    """a @ b with both operands rounded to bfloat16, and its gradients likewise."""

    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return r(a) @ r(b)

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        return r(g) @ r(b).T, r(a).T @ r(g)


def oracle(x, params, h0, c0, num_layers, bidirectional):
    """The LSTM (torch's gate order i, f, g, o) in float64 with bfloat16 products."""
    d = 2 if bidirectional else 1
    layer_in = x
    hy, cy = [], []
    for layer in range(num_layers):
        outs = []
        for k in range(d):
            j = 4 * (layer * d + k)
            w_ih, w_hh, b_ih, b_hh = params[j : j + 4]
            h, c = h0[layer * d + k], c0[layer * d + k]
            steps = range(x.shape[0] - 1, -1, -1) if k == 1 else range(x.shape[0])
            ys = {}
            gx = _Bf16Mm.apply(layer_in.reshape(-1, layer_in.shape[-1]), w_ih.T)
            gx = gx.reshape(x.shape[0], x.shape[1], -1)
            for t in steps:
                gates = gx[t] + _Bf16Mm.apply(h, w_hh.T) + b_ih + b_hh
                i, f, g, o = gates.chunk(4, 1)
                c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
                h = torch.sigmoid(o) * torch.tanh(c)
                ys[t] = h
            outs.append(torch.stack([ys[t] for t in range(x.shape[0])]))
            hy.append(h)
            cy.append(c)
        layer_in = torch.cat(outs, -1)
    return layer_in, torch.stack(hy), torch.stack(cy)


@pytest.mark.parametrize("num_layers,bidirectional", [(1, False), (2, True)])
def test_bf16_products_against_the_float64_oracle(num_layers, bidirectional):
    torch.manual_seed(0)
    t, b, i, h = 7, 5, 24, 32
    d = 2 if bidirectional else 1
    m = torch.nn.LSTM(i, h, num_layers=num_layers, bidirectional=bidirectional)
    params = [r(p.detach()) for p in m._flat_weights]  # bfloat16 data, as nn.LSTM passes
    x = r(torch.randn(t, b, i))
    h0 = r(torch.randn(num_layers * d, b, h))
    c0 = r(torch.randn(num_layers * d, b, h))
    g = torch.Generator().manual_seed(1)
    weights = [torch.randn(s, generator=g, dtype=torch.float64)
               for s in ((t, b, d * h), (num_layers * d, b, h), (num_layers * d, b, h))]  # fmt: skip

    def run(fn, dtype, **kw):
        leaves = [a.to(dtype).requires_grad_() for a in (x, h0, c0, *params)]
        xs, hs, cs, *ps = leaves
        outs = fn(xs, ps, hs, cs, **kw)
        loss = sum((o.double() * w).sum() for o, w in zip(outs, weights, strict=True))
        grads = torch.autograd.grad(loss, leaves)
        return [o.detach().double() for o in outs] + [gr.double() for gr in grads]

    def ours(xs, ps, hs, cs, products):
        return lstm(xs, ps, (hs, cs), num_layers=num_layers, bidirectional=bidirectional,
                    products=products)  # fmt: skip

    def ref(xs, ps, hs, cs):
        return oracle(xs, ps, hs, cs, num_layers, bidirectional)

    want = run(ref, torch.float64)
    bf16 = run(ours, torch.float32, products="bfloat16")
    f32 = run(ours, torch.float32, products="float32")
    for n, (got, alt, w) in enumerate(zip(bf16, f32, want, strict=True)):
        scale = float(w.norm()) or 1.0
        err = float((got - w).norm()) / scale
        err_f32 = float((alt - w).norm()) / scale
        # one layer: float32 accumulation alone; above it, the layer below's output (float32
        # here, float64 in the oracle) now and then rounds to the other bfloat16 neighbour:
        # still well below the bfloat16 products' own effect, which float32 products lack
        assert err < (1e-5 if num_layers == 1 else 1e-3), (n, err, err_f32)
        assert err < err_f32 / 3, (n, err, err_f32)


def test_bf16_gemm_is_float32_accumulation_of_rounded_operands():
    """The back end's product: exactly the float64 product of the bfloat16-rounded operands,
    to float32 accumulation, for dense, transposed and strided operands."""
    g = tensors_mod.bf16_gemm()
    assert g.kind == "torch-bf16"
    rng = np.random.default_rng(0)
    a = rng.standard_normal((37, 300)).astype(np.float32)
    b = rng.standard_normal((300, 45)).astype(np.float32)

    def rounded(v):
        return r(torch.from_numpy(np.ascontiguousarray(v))).double().numpy()

    for x, y in ((a, b), (np.asfortranarray(a), b), (a, np.asfortranarray(b)), (a[:, ::1], b)):
        out = np.empty((37, 45), np.float32)
        got = g.product(x, y, out, "blas")
        want = rounded(x) @ rounded(y)
        assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
        fixed = g.fixed(y, "blas", 37)
        assert np.array_equal(fixed(x, np.empty_like(out)), got)


def test_products_must_be_named():
    x = torch.randn(3, 2, 4)
    params = [p.detach() for p in torch.nn.LSTM(4, 5)._flat_weights]
    import lstmgrad

    with pytest.raises(
        lstmgrad.LstmInvalidArgumentError,
        match="products must be 'float32' or 'bfloat16', got 'fp8'",
    ):
        lstm(x, params, products="fp8")
    with pytest.raises(
        lstmgrad.LstmInvalidArgumentError, match="takes float32 tensors.*torch.float64"
    ):
        lstm(x.double(), [p.double() for p in params], products="bfloat16")


PLANS = {
    "per-step": dict(walk=False, pair_walks=False, fwd_walk=False),
    "walk": dict(walk=True, pair_walks=False, walk_product="library"),
    "walk-rows": dict(walk=True, pair_walks=False, walk_product="library", walk_rows=2, threads=2),
    "pair-walks": dict(pair_walks=True, threads=2, walk_product="library"),
    "loop-asked": dict(walk=True, pair_walks=False, walk_product="loop"),
}


@pytest.mark.parametrize("plan", list(PLANS))
def test_every_plan_multiplies_in_bfloat16(plan):
    """The one-call step loops call the same bfloat16 GEMM as the per-step products (their row
    operand rounded in the loop), a plan asking for the Numba loop gets the GEMM too: every
    plan's results are the per-step plan's, to float32 rounding, and far from float32
    products'."""
    from lstmgrad.planning.plan import forced

    torch.manual_seed(3)
    m = torch.nn.LSTM(16, 24, num_layers=2, bidirectional=True)
    params = [r(p.detach()).requires_grad_() for p in m._flat_weights]
    x = r(torch.randn(9, 6, 16)).requires_grad_()

    def run(products, **fields):
        with forced(**fields):
            y, h, c = lstm(x, params, num_layers=2, bidirectional=True, products=products)
            grads = torch.autograd.grad((y.square().sum() + h.sum() + c.sum()), [x, *params])
        return [y.detach(), *grads]

    base = run("bfloat16", **PLANS["per-step"])
    got = run("bfloat16", **PLANS[plan])
    f32 = run("float32", **PLANS["per-step"])
    for a, b, c in zip(got, base, f32, strict=True):
        diff = float((a - b).norm() / b.norm())
        assert diff < 1e-5, (plan, diff)
        assert float((c - b).norm() / b.norm()) > 10 * diff + 1e-5
