"""lstmgrad.nn.LSTM against torch.nn.LSTM: outputs and every gradient, over a grid of inputs
(Tensor batched / unbatched / batch_first, PackedSequence sorted / unsorted, with and without
h0, no bias, deep bidirectional stacks), state_dict both ways, dropout, torch.compile."""

from __future__ import annotations

import itertools

import pytest

torch = pytest.importorskip("torch")

from torch.nn.utils.rnn import PackedSequence, pack_sequence  # noqa: E402

from lstmgrad.nn import LSTM  # noqa: E402

TOL = {torch.float64: 1e-10, torch.float32: 2e-5}
I_SIZE, H_SIZE = 5, 7


def rel(a, b):
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def make_pair(dtype, **kw):
    """A torch.nn.LSTM and an lstmgrad.nn.LSTM holding the same weights."""
    torch.manual_seed(1)
    ref = torch.nn.LSTM(I_SIZE, H_SIZE, **kw).to(dtype)
    ours = LSTM(I_SIZE, H_SIZE, **kw).to(dtype)
    ours.load_state_dict(ref.state_dict())
    return ref, ours


def make_input(kind, dtype, batch_first):
    """(input, B) for one input kind; padding/garbage never reaches a valid position."""
    g = torch.Generator().manual_seed(2)
    if kind == "dense":
        shape = (4, 6, I_SIZE) if batch_first else (6, 4, I_SIZE)
        return torch.randn(*shape, generator=g, dtype=dtype), 4
    if kind == "unbatched":
        return torch.randn(6, I_SIZE, generator=g, dtype=dtype), None
    lengths = (3, 6, 1, 4) if kind == "packed-unsorted" else (6, 4, 3, 1)
    seqs = [torch.randn(n, I_SIZE, generator=g, dtype=dtype) for n in lengths]
    return pack_sequence(seqs, enforce_sorted=kind == "packed-sorted"), 4


def run(model, x, hx):
    """Outputs and all gradients (input, h0, c0, every parameter) of a fixed scalar loss."""
    model.zero_grad()
    y, (h_n, c_n) = model(x, hx) if hx is not None else model(x)
    y_data = y.data if isinstance(y, PackedSequence) else y
    # weights that differ per position so a permuted or shifted result cannot pass
    wy = torch.linspace(-1, 1, y_data.numel(), dtype=y_data.dtype).reshape(y_data.shape)
    loss = (y_data * wy).sum() + (h_n * 1.3).sum() + (c_n**2).sum()
    leaves = [x.data if isinstance(x, PackedSequence) else x] + (list(hx) if hx else [])
    grads = torch.autograd.grad(loss, leaves + list(model.parameters()))
    return y, h_n, c_n, grads


GRID = [
    pytest.param(kind, nl, nd, bias, bf, with_hx, id=f"{kind}-L{nl}-D{nd}"
                 + ("" if bias else "-nobias") + ("-bf" if bf else "") + ("-hx" if with_hx else ""))
    for kind, (nl, nd), bias, bf, with_hx in itertools.product(
        ["dense", "unbatched", "packed-sorted", "packed-unsorted"],
        [(1, 1), (2, 2), (3, 2)],
        [True, False],
        [False, True],
        [False, True],
    )
    if not (bf and kind.startswith("packed"))
]  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("kind,num_layers,num_dirs,bias,batch_first,with_hx", GRID)
def test_matches_torch(kind, num_layers, num_dirs, bias, batch_first, with_hx, dtype):
    ref, ours = make_pair(
        dtype, num_layers=num_layers, bidirectional=num_dirs == 2, bias=bias,
        batch_first=batch_first,
    )  # fmt: skip
    results = []
    for model in (ref, ours):
        x, batch = make_input(kind, dtype, batch_first)
        if isinstance(x, PackedSequence):
            x = PackedSequence(x.data.requires_grad_(), x.batch_sizes, x.sorted_indices,
                               x.unsorted_indices)  # fmt: skip
        else:
            x.requires_grad_()
        hx = None
        if with_hx:
            g = torch.Generator().manual_seed(3)
            shape = (num_layers * num_dirs,) + ((batch,) if batch else ()) + (H_SIZE,)
            hx = tuple(torch.randn(*shape, generator=g, dtype=dtype).requires_grad_() for _ in "hc")
        results.append(run(model, x, hx))
    (y0, h0, c0, g0), (y1, h1, c1, g1) = results
    assert type(y1) is type(y0)
    if isinstance(y0, PackedSequence):
        assert torch.equal(y1.batch_sizes, y0.batch_sizes)
        for a, b in (
            (y1.sorted_indices, y0.sorted_indices),
            (y1.unsorted_indices, y0.unsorted_indices),
        ):
            assert (a is None and b is None) or torch.equal(a, b)
        y0, y1 = y0.data, y1.data
    for a, b in [(y1, y0), (h1, h0), (c1, c0), *zip(g1, g0, strict=True)]:
        assert a.shape == b.shape and a.dtype == b.dtype
        assert rel(a, b) <= TOL[dtype]


def test_state_dict_both_ways_and_names():
    ref = torch.nn.LSTM(4, 6, num_layers=2, bidirectional=True)
    ours = LSTM(4, 6, num_layers=2, bidirectional=True)
    assert isinstance(ours, torch.nn.LSTM)
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in ref.named_parameters()]
    ours.load_state_dict(ref.state_dict())
    back = torch.nn.LSTM(4, 6, num_layers=2, bidirectional=True)
    back.load_state_dict(ours.state_dict())
    for a, b in zip(back.parameters(), ref.parameters(), strict=True):
        assert torch.equal(a, b)
    x = torch.randn(3, 2, 4)
    assert rel(ours(x)[0], ref(x)[0]) <= 2e-5


@pytest.mark.parametrize("bidirectional", [False, True], ids=["D1", "D2"])
def test_proj_size_runs_torch_and_matches_it(bidirectional):
    ref, ours = make_pair(torch.float64, num_layers=2, proj_size=3, bidirectional=bidirectional)
    x = torch.randn(5, 4, I_SIZE, dtype=torch.float64, requires_grad=True)
    k = 2 * (2 if bidirectional else 1)
    hx = (torch.randn(k, 4, 3, dtype=torch.float64, requires_grad=True),
          torch.randn(k, 4, H_SIZE, dtype=torch.float64, requires_grad=True))  # fmt: skip
    (y0, h0, c0, g0), (y1, h1, c1, g1) = run(ref, x, hx), run(ours, x, hx)
    for a, b in [(y1, y0), (h1, h0), (c1, c0), *zip(g1, g0, strict=True)]:
        assert a.shape == b.shape and torch.equal(a, b)
    assert "weight_hr_l0" in ours.state_dict()
    back = torch.nn.LSTM(I_SIZE, H_SIZE, num_layers=2, proj_size=3, bidirectional=bidirectional)
    back.double().load_state_dict(ours.state_dict())
    assert all(torch.equal(p, q) for p, q in zip(back.parameters(), ref.parameters(), strict=True))


@pytest.mark.parametrize(
    "shape,batch_first", [((0, 3, 4), False), ((3, 0, 4), True), ((0, 4), False)]
)
def test_zero_time_steps_raise_like_torch(shape, batch_first):
    """torch.nn.LSTM refuses an input with no time step; so does the drop-in (the core API
    keeps its own T = 0 semantics, tested in tests/test_aclnn.py)."""
    for cls in (torch.nn.LSTM, LSTM):
        with pytest.raises(RuntimeError, match="Expected sequence length to be larger than 0"):
            cls(4, 6, batch_first=batch_first)(torch.randn(*shape))


def test_zero_batch_matches_torch():
    ref, ours = make_pair(torch.float32, num_layers=2)
    x = torch.randn(3, 0, I_SIZE, requires_grad=True)
    (y0, h0, c0), (y1, h1, c1) = ([t for t in (r[0], *r[1])] for r in (ref(x), ours(x)))
    assert y1.shape == y0.shape and h1.shape == h0.shape and c1.shape == c0.shape
    y1.sum().backward()
    assert x.grad.shape == x.shape


def test_bad_inputs_raise_like_torch():
    ours = LSTM(4, 6)
    with pytest.raises(ValueError, match="Expected input to be 2D or 3D"):
        ours(torch.randn(2, 3, 4, 5))
    with pytest.raises(RuntimeError, match="input.size\\(-1\\) must be equal to input_size"):
        ours(torch.randn(3, 2, 5))
    with pytest.raises(RuntimeError, match="hx and cx should also be 3-D"):
        ours(torch.randn(3, 2, 4), (torch.zeros(2, 6), torch.zeros(2, 6)))
    with pytest.raises(RuntimeError, match="Expected hidden\\[0\\] size"):
        ours(torch.randn(3, 2, 4), (torch.zeros(1, 3, 6), torch.zeros(1, 3, 6)))
    packed = pack_sequence([torch.randn(3, 4), torch.randn(2, 4)])
    with pytest.raises(RuntimeError, match="Expected hidden\\[0\\] size"):
        ours(packed, (torch.zeros(1, 3, 6), torch.zeros(1, 3, 6)))


@pytest.mark.filterwarnings("ignore:Complex modules")
def test_unsupported_dtype_runs_torch_forward():
    ref = torch.nn.LSTM(4, 6).to(torch.complex64)
    ours = LSTM(4, 6).to(torch.complex64)
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(3, 2, 4, dtype=torch.complex64)
    assert torch.equal(ours(x)[0], ref(x)[0])


@pytest.mark.parametrize("bidirectional", [False, True], ids=["D1", "D2"])
def test_dropout_eval_mode_equals_torch(bidirectional):
    ref, ours = make_pair(torch.float64, num_layers=3, dropout=0.5, bidirectional=bidirectional)
    ref.eval()
    ours.eval()
    x = torch.randn(5, 3, I_SIZE, dtype=torch.float64, requires_grad=True)
    r0, r1 = run(ref, x, None), run(ours, x, None)
    for a, b in [(r1[0], r0[0]), (r1[1], r0[1]), *zip(r1[3], r0[3], strict=True)]:
        assert rel(a, b) <= 1e-10


def test_dropout_train_mode_exact_gradient_by_finite_differences():
    """Training-mode dropout: the masks come from torch's generator, so reseeding before each
    call fixes them and the function is deterministic: gradcheck (central finite differences in
    float64) then checks the gradient through the dropped-out layers."""
    torch.manual_seed(0)
    model = LSTM(3, 4, num_layers=3, dropout=0.4, bidirectional=True).double().train()
    x = torch.randn(4, 2, 3, dtype=torch.float64, requires_grad=True)
    params = list(model.parameters())
    inputs = (x, *[p.detach().clone().requires_grad_() for p in params])
    names = [n for n, _ in model.named_parameters()]

    def g(x, *ps):
        torch.manual_seed(7)
        return torch.func.functional_call(model, dict(zip(names, ps, strict=True)), (x,))[0]

    assert torch.autograd.gradcheck(g, inputs, eps=1e-6, atol=1e-6, rtol=1e-5)
    # and the masks really drop: a different seed gives a different output
    torch.manual_seed(7)
    y7 = model(x)[0]
    torch.manual_seed(8)
    assert not torch.equal(model(x)[0], y7)


def test_compile_fullgraph_matches_eager():
    ref, ours = make_pair(torch.float32, num_layers=2, bidirectional=True, batch_first=True)
    compiled = torch.compile(ours, backend="aot_eager", fullgraph=True)
    x = torch.randn(3, 5, I_SIZE, requires_grad=True)
    y, (h, c) = compiled(x)
    (y.sum() + h.sum()).backward()
    y_ref, (h_ref, _) = ref(x.detach())
    assert rel(y, y_ref) <= 2e-5 and rel(h, h_ref) <= 2e-5
    x2 = x.detach().requires_grad_()
    y2, (h2, _) = ref(x2)
    (y2.sum() + h2.sum()).backward()
    assert rel(x.grad, x2.grad) <= 2e-5
    for a, b in zip(ours.parameters(), ref.parameters(), strict=True):
        assert rel(a.grad, b.grad) <= 2e-5


def test_compile_fullgraph_packed_unsorted():
    ref, ours = make_pair(torch.float64, num_layers=2, bidirectional=True)
    compiled = torch.compile(ours, backend="aot_eager", fullgraph=True)
    x, _ = make_input("packed-unsorted", torch.float64, False)
    x = PackedSequence(x.data.requires_grad_(), x.batch_sizes, x.sorted_indices, x.unsorted_indices)
    r0, r1 = run(ref, x, None), run(compiled, x, None)
    assert torch.equal(r1[0].unsorted_indices, r0[0].unsorted_indices)
    for a, b in [(r1[0].data, r0[0].data), (r1[1], r0[1]), *zip(r1[3], r0[3], strict=True)]:
        assert rel(a, b) <= 1e-10


def test_compile_leaves_dynamo_alone_for_other_modules():
    """Dynamo traces this class without the process-wide allow_rnn switch, which stays off:
    a torch.nn.LSTM is still refused under fullgraph=True, with Dynamo's own message."""
    import torch._dynamo.config

    _, ours = make_pair(torch.float32)
    assert torch._dynamo.config.allow_rnn is False
    y = torch.compile(ours, backend="aot_eager", fullgraph=True)(torch.randn(3, 2, I_SIZE))[0]
    assert y.shape == (3, 2, H_SIZE)
    assert torch._dynamo.config.allow_rnn is False
    torch._dynamo.reset()
    with pytest.raises(torch._dynamo.exc.Unsupported, match="Attempted to wrap RNN, GRU, or LSTM"):
        torch.compile(torch.nn.LSTM(4, 6), backend="aot_eager", fullgraph=True)(
            torch.randn(3, 2, 4)
        )


@pytest.mark.slow
def test_compile_inductor_matches_eager():
    ref, ours = make_pair(torch.float32, num_layers=2)
    compiled = torch.compile(ours, fullgraph=True)
    x = torch.randn(6, 3, I_SIZE, requires_grad=True)
    r0, r1 = run(ref, x, None), run(compiled, x, None)
    for a, b in [(r1[0], r0[0]), (r1[1], r0[1]), *zip(r1[3], r0[3], strict=True)]:
        assert rel(a, b) <= 2e-5


@pytest.mark.parametrize("packed", [False, True], ids=["dense", "packed-unsorted"])
def test_matches_torch_float32_at_onednn_sizes(packed):
    """Sizes where the GEMMs run on oneDNN (plain and with the packed recurrent weight)."""
    torch.manual_seed(1)
    ref = torch.nn.LSTM(64, 128, num_layers=2, bidirectional=True)
    ours = LSTM(64, 128, num_layers=2, bidirectional=True)
    ours.load_state_dict(ref.state_dict())
    g = torch.Generator().manual_seed(2)
    if packed:
        seqs = [torch.randn(n, 64, generator=g) for n in (5, 9, 3, 9, 7) * 4]
        x = pack_sequence(seqs, enforce_sorted=False)
        x = PackedSequence(x.data.requires_grad_(), x.batch_sizes, x.sorted_indices,
                           x.unsorted_indices)  # fmt: skip
    else:
        x = torch.randn(9, 20, 64, generator=g, requires_grad=True)
    r0, r1 = run(ref, x, None), run(ours, x, None)
    y0, y1 = (r.data if packed else r for r in (r0[0], r1[0]))
    for a, b in [(y1, y0), (r1[1], r0[1]), (r1[2], r0[2]), *zip(r1[3], r0[3], strict=True)]:
        assert rel(a, b) <= 2e-5
