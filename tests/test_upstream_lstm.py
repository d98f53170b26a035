"""PyTorch's own LSTM tests, ported to pytest and run against lstmgrad.nn.LSTM.

Three upstream sources, rewritten here (same grids, shapes, tolerances and assertions):

- test/test_nn.py: the LSTM tests that run on a CPU (argument checks, initial state, projections,
  weight norm, zero-length and zero-batch inputs, dropout, retained graphs, variable-length
  PackedSequence against per-sequence runs, gradients of gradients);
- test/test_mkldnn.py ``test_lstm``: the oneDNN-against-native grid (dtypes float32, bfloat16,
  float16; bias, bidirectional, batch_first, layers, dropout, training), here lstmgrad against
  torch's native kernels (oneDNN off);
- test/test_modules.py with the ``torch.nn.LSTM`` ModuleInfo (its samples and error samples of
  torch/testing/_internal/common_modules.py, rebuilt here): forward against the batched
  reference, factory kwargs, repr, pickle, non-contiguous inputs, gradcheck and gradgradcheck
  with batched gradients, memory format, train/eval, meta-device construction, errors. The CUDA
  items (device transfer, CPU/GPU parity) do not apply.

``LSTMGRAD_UPSTREAM_CONTROL=1`` runs the same items against torch.nn.LSTM itself: the control
that the port asks what upstream asks. Where a test compares training-mode dropout with
0 < p < 1 between two implementations, torch's masks cannot be matched: for lstmgrad the
reference is torch's layers stacked by hand with lstmgrad's masks (drawn again from the same
seed), and the dropout statistics are checked on their own.
"""

from __future__ import annotations

import copy
import io
import itertools
import os
import warnings
from contextlib import nullcontext
from functools import partial

import pytest

torch = pytest.importorskip("torch")

import torch.nn.utils.rnn as rnn_utils  # noqa: E402
from torch.testing import make_tensor  # noqa: E402
from torch.testing._utils import freeze_rng_state  # noqa: E402
from torch.utils._pytree import tree_flatten, tree_unflatten  # noqa: E402

import lstmgrad.nn  # noqa: E402

pytestmark = [
    pytest.mark.filterwarnings("ignore:TF32 acceleration on top of oneDNN"),
    pytest.mark.filterwarnings("ignore:LSTM with projections is not supported with oneDNN"),
    pytest.mark.filterwarnings("ignore:`torch.nn.utils.weight_norm` is deprecated"),
]

CONTROL = os.environ.get("LSTMGRAD_UPSTREAM_CONTROL", "0").strip() not in ("", "0")
LSTM = torch.nn.LSTM if CONTROL else lstmgrad.nn.LSTM

# torch.testing.assert_close's defaults, as upstream's TestCase.assertEqual uses them
_DEFAULT_TOL = {
    torch.float16: (1e-3, 1e-5),
    torch.bfloat16: (1.6e-2, 1e-5),
    torch.float32: (1.3e-6, 1e-5),
    torch.float64: (1e-7, 1e-7),
}


def assert_equal(actual, expected, *, rtol=None, atol=None, rel_tol=0.0, precision=0.0):
    """upstream's ``TestCase.assertEqual``: nested sequences leaf by leaf, tensors with
    assert_close (dtype checked), the tolerances raised to the test class's ``rel_tol`` and
    ``precision``; non-tensor leaves equal."""
    a_leaves, a_spec = tree_flatten(actual)
    e_leaves, e_spec = tree_flatten(expected)
    assert len(a_leaves) == len(e_leaves), (a_spec, e_spec)
    for a, e in zip(a_leaves, e_leaves, strict=True):
        if not isinstance(a, torch.Tensor):
            assert a == e
            continue
        r, t = (rtol, atol) if rtol is not None else _DEFAULT_TOL.get(a.dtype, (0.0, 0.0))
        torch.testing.assert_close(a, e, rtol=max(r, rel_tol), atol=max(t, precision))


# ---------------------------------------------------------------------------------------------
# test/test_nn.py


def test_rnn_args_check():
    """Wrong batch or feature size of the input, or a wrong dimension of h_0 or of c_0:
    RuntimeError."""
    input_size, hidden_size, num_layers, batch_size, seq_len, num_directions = 3, 5, 2, 4, 6, 1
    good_input = (seq_len, batch_size, input_size)
    good_hidden = (num_layers * num_directions, batch_size, hidden_size)

    def changed(shape, dim, size):
        return tuple(size if d == dim else s for d, s in enumerate(shape))

    def check(input_shape, hidden_shape):
        for h_shape, c_shape in ((hidden_shape, good_hidden), (good_hidden, hidden_shape)):
            model = LSTM(input_size, hidden_size, num_layers)
            x = torch.randn(input_shape)
            hx = (torch.randn(h_shape), torch.randn(c_shape))
            with pytest.raises(RuntimeError):
                model(x, hx)

    check(changed(good_input, 1, batch_size + 1), good_hidden)  # input batch size
    check(changed(good_input, 2, input_size + 1), good_hidden)  # input feature size
    for dim in range(3):
        check(good_input, changed(good_hidden, dim, good_hidden[dim] + 1))


def test_projections_lstm_args_check():
    input_size, hidden_size, proj_size = 3, 5, 2
    num_layers, batch_size, seq_len, num_directions = 2, 4, 6, 1
    good_input = (seq_len, batch_size, input_size)
    good_h = (num_layers * num_directions, batch_size, proj_size)
    good_c = (num_layers * num_directions, batch_size, hidden_size)

    def changed(shape, dim, size):
        return tuple(size if d == dim else s for d, s in enumerate(shape))

    def check(input_shape, h_shape, c_shape):
        model = LSTM(input_size, hidden_size, num_layers, proj_size=proj_size)
        with pytest.raises(RuntimeError):
            model(torch.randn(input_shape), (torch.randn(h_shape), torch.randn(c_shape)))

    check(changed(good_input, 1, batch_size + 1), good_h, good_c)
    check(changed(good_input, 2, input_size + 1), good_h, good_c)
    for dim in range(3):
        check(good_input, changed(good_h, dim, good_h[dim] + 1), good_c)
        check(good_input, good_h, changed(good_c, dim, good_c[dim] + 1))
    # h_0 with the hidden size instead of the projection size
    check(good_input, good_c, good_c)


def test_rnn_initial_hidden_state():
    rnn = LSTM(10, 20, num_layers=2)
    x = torch.randn(3, 1, 10)
    hidden = torch.zeros(2, 1, 20)
    output1, hidden1 = rnn(x, (hidden, hidden))
    output2, hidden2 = rnn(x)
    assert_equal(output1, output2)
    assert_equal(hidden1, hidden2)


@pytest.mark.parametrize("bidirectional", [False, True])
def test_projections_lstm_initial_hidden_state(bidirectional):
    num_dirs = 2 if bidirectional else 1
    rnn = LSTM(10, 20, num_layers=2, proj_size=15, bidirectional=bidirectional)
    x = torch.randn(3, 1, 10)
    hidden_h = torch.zeros(2 * num_dirs, 1, 15)
    hidden_c = torch.zeros(2 * num_dirs, 1, 20)
    output1, hidden1 = rnn(x, (hidden_h, hidden_c))
    output2, hidden2 = rnn(x)
    assert_equal(output1, output2)
    assert_equal(hidden1, hidden2)


@pytest.mark.parametrize(
    "name,proj_size,num_params", [("weight_ih_l0", 0, 4), ("weight_hr_l0", 16, 5)]
)
def test_rnn_weight_norm(name, proj_size, num_params):
    """Weight norm turns one flat weight into a computed tensor, removing it restores the
    Parameter; the module still runs in between."""
    m = LSTM(32, 32, proj_size=proj_size)
    m = torch.nn.utils.weight_norm(m, name=name)
    assert sum(isinstance(p, torch.nn.Parameter) for p in m._flat_weights) == num_params - 1
    y = m(torch.randn(4, 2, 32))[0]
    assert y.shape == (4, 2, proj_size or 32)
    m = torch.nn.utils.remove_weight_norm(m, name=name)
    assert sum(isinstance(p, torch.nn.Parameter) for p in m._flat_weights) == num_params
    assert name in m._parameters
    assert name + "_g" not in m._parameters and name + "_v" not in m._parameters
    assert name in dict(m.named_parameters())


@pytest.mark.parametrize("bidirectional", [False, True])
def test_error_RNN_seq_len_zero(bidirectional):
    x = torch.ones(0, 10, 5)
    rnn = LSTM(5, 6, bidirectional=bidirectional)
    with pytest.raises(RuntimeError, match="Expected sequence length to be larger than 0 in RNN"):
        rnn(x)


def test_RNN_input_size_zero():
    x = torch.zeros((5, 0, 3))
    rnn = LSTM(input_size=3, hidden_size=4)
    outs = rnn(x)
    assert outs[0].shape == torch.Size([5, 0, 4])
    outs[0].sum().backward()


def test_RNN_dropout_warning():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        LSTM(1, 1, num_layers=1, dropout=0.1)
    assert any("non-zero dropout expects num_layers greater than 1" in str(w.message)
               for w in caught)  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        LSTM(1, 1, num_layers=2, dropout=0.1)


@pytest.mark.parametrize("train", [True, False])
def test_RNN_change_dropout(train):
    """Changing ``dropout`` after construction takes effect: p = 0, p = 1 and eval mode are
    deterministic, 0 < p < 1 in training draws new masks each call."""
    torch.manual_seed(0)
    rnn = LSTM(100, 100, 2, dropout=0)
    x = torch.rand(1, 2, 100)
    rnn.train(train)
    prev = None
    for p in (0, 0.276, 0.731, 1, 0.1):
        rnn.dropout = p
        out1, _ = rnn(x)
        out2, _ = rnn(x)
        if p in (0, 1) or not train:
            assert_equal(out1, out2)
        else:
            assert not torch.equal(out1, out2)
        if prev is not None and (p == 0 or not train):
            assert_equal(out1, prev)  # no dropout at all: the same function throughout
        if p == 0 or not train:
            prev = out1


@pytest.mark.parametrize("p", [0.3, 0.7])
def test_RNN_dropout_statistics(p):
    """Inverted dropout between layers, seen through a second layer whose units each read one
    input unit (g gate only, no recurrence, T = 1): a dropped unit gives exactly 0, a kept
    one 0.5 tanh(0.5 tanh(y1 / (1 - p))); the dropped fraction is p within 5 standard
    deviations (upstream checks torch's own draws; any implementation's draws are checked here)."""
    torch.manual_seed(0)
    hidden, batch = 64, 128
    rnn = LSTM(8, hidden, num_layers=2, dropout=p).double().train()
    with torch.no_grad():
        rnn.weight_hh_l1.zero_()
        rnn.bias_ih_l1.zero_()
        rnn.bias_hh_l1.zero_()
        rnn.weight_ih_l1.zero_()
        rnn.weight_ih_l1[2 * hidden : 3 * hidden].copy_(torch.eye(hidden))  # the g gate
    x = torch.randn(1, batch, 8, dtype=torch.float64)
    y2 = rnn(x)[0][0]
    rnn.eval()
    one = LSTM(8, hidden).double()
    one.load_state_dict({k[:-1] + "0": v for k, v in rnn.state_dict().items() if k.endswith("l0")})
    y1 = one(x)[0][0]
    assert bool((y1 != 0).all())
    kept = y2 != 0
    expected = 0.5 * torch.tanh(0.5 * torch.tanh(y1 / (1 - p)))
    assert_equal(y2[kept], expected[kept])
    dropped = 1 - kept.double().mean().item()
    sigma = (p * (1 - p) / kept.numel()) ** 0.5
    assert abs(dropped - p) <= 5 * sigma


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
def test_rnn_retain_variables(dtype):
    rnn = LSTM(10, 20, num_layers=2).to(dtype)
    x = torch.randn(5, 6, 10, dtype=dtype, requires_grad=True)
    output = rnn(x)
    output[0].sum().backward(retain_graph=True)
    grads = [x.grad.clone()] + [p.grad.clone() for p in rnn.parameters()]
    for _ in range(4):
        rnn.zero_grad()
        x.grad.zero_()
        output[0].sum().backward(retain_graph=True)
        grads2 = [x.grad] + [p.grad for p in rnn.parameters()]
        assert_equal(grads, grads2)


_PREC = {torch.float32: 1e-5, torch.float64: 1e-5, torch.float16: 1e-2, torch.bfloat16: 1e-1}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
@pytest.mark.parametrize(
    "enforce_sorted,lengths",
    [(True, [5]), (False, [5]), (True, [10, 10, 6, 2, 2, 1, 1]),
     (False, [10, 10, 6, 2, 2, 1, 1]), (False, [2, 1, 3, 2, 10, 5, 3])],
)  # fmt: skip
@pytest.mark.parametrize("use_default_hiddens", [True, False])
@pytest.mark.parametrize("proj_size", [0, 2])
def test_variable_sequence(dtype, enforce_sorted, lengths, use_default_hiddens, proj_size):
    """A PackedSequence against each sequence run alone: outputs, final states, and the
    gradients of input and weights."""
    input_size, hidden_size, num_layers, bidirectional = 3, 4, 2, True
    max_length = max(lengths)
    x_leaf = torch.randn(max_length, len(lengths), input_size, dtype=dtype, requires_grad=True)
    num_directions = 2
    lstm = LSTM(input_size, hidden_size, bidirectional=bidirectional, num_layers=num_layers,
                proj_size=proj_size).to(dtype)  # fmt: skip
    lstm2 = copy.deepcopy(lstm).to(dtype)
    hidden0 = None
    if not use_default_hiddens:
        real_hidden = proj_size or hidden_size
        hidden0 = (
            torch.randn(num_directions * num_layers, len(lengths), real_hidden, dtype=dtype),
            torch.randn(num_directions * num_layers, len(lengths), hidden_size, dtype=dtype),
        )

    def pad(t, length):
        if t.size(0) == length:
            return t
        return torch.cat([t, t.new_zeros(length - t.size(0), *t.size()[1:])])

    seq_outs, seq_hiddens = [], []
    for i, n in enumerate(lengths):
        hidden_i = None if hidden0 is None else tuple(h[:, i : i + 1] for h in hidden0)
        out, hid = lstm2(x_leaf[:n, i : i + 1], hidden_i)
        seq_outs.append(pad(out, max_length))
        seq_hiddens.append(hid)
    seq_out = torch.cat(seq_outs, 1)
    seq_hidden = tuple(torch.cat(hids, 1) for hids in zip(*seq_hiddens, strict=True))

    packed = rnn_utils.pack_padded_sequence(x_leaf, lengths, enforce_sorted=enforce_sorted)
    packed_out, packed_hidden = lstm(packed, hidden0)
    unpacked, unpacked_len = rnn_utils.pad_packed_sequence(packed_out)

    prec = _PREC[dtype]
    assert_equal(packed_hidden, seq_hidden, atol=prec, rtol=0)
    assert_equal(unpacked, seq_out, atol=prec, rtol=0)
    assert unpacked_len.tolist() == lengths

    seq_out.sum().backward()
    grad_x = x_leaf.grad.clone()
    x_leaf.grad.zero_()
    unpacked.sum().backward()
    assert_equal(x_leaf.grad, grad_x, atol=prec, rtol=0)
    for p1, p2 in zip(lstm.parameters(), lstm2.parameters(), strict=True):
        assert_equal(p1.grad, p2.grad, atol=prec, rtol=0)


@pytest.mark.parametrize("bias", [True, False])
def test_LSTM_grad_and_gradgrad(bias):
    """gradcheck and gradgradcheck of every output with respect to the input (float64)."""
    hsize = 4
    inp = torch.rand(1, 3, hsize, dtype=torch.float64, requires_grad=True)
    mod = LSTM(hsize, hsize, bias=bias).to(torch.float64)

    def flat(x):
        out, (h, c) = mod(x)
        return out, h, c

    assert torch.autograd.gradcheck(flat, inp, check_batched_grad=False)
    assert torch.autograd.gradgradcheck(flat, inp, check_batched_grad=False)


def test_LSTM_differentiable_backward_using_oneDNN():
    """The input gradient, itself differentiated (create_graph): torch's native kernels (oneDNN
    off) against the module, 20 layers."""
    batch, seq_len, input_size = 10, 12, 3
    net = torch.nn.LSTM(input_size, 3, 20, batch_first=True)
    net_clone = LSTM(input_size, 3, 20, batch_first=True)
    net_clone.load_state_dict(net.state_dict())
    x = torch.rand(batch, seq_len, input_size)
    x1 = x.clone().requires_grad_(True)
    x2 = x.clone().requires_grad_(True)
    with torch.backends.mkldnn.flags(enabled=False):
        out1, _ = net(x1)
        der_out1 = torch.autograd.grad(out1, x1, grad_outputs=torch.ones_like(out1),
                                       retain_graph=True, create_graph=True)[0]  # fmt: skip
        der_out1.sum().backward(retain_graph=True)
    out2, _ = net_clone(x2)
    der_out2 = torch.autograd.grad(out2, x2, grad_outputs=torch.ones_like(out2),
                                   retain_graph=True, create_graph=True)[0]  # fmt: skip
    der_out2.sum().backward(retain_graph=True)
    assert torch.allclose(der_out1, der_out2)
    assert torch.allclose(x1.grad, x2.grad)


# ---------------------------------------------------------------------------------------------
# test/test_mkldnn.py: test_lstm

_MKLDNN_GRID = list(itertools.product(
    [1, 5],  # input_size
    [5, 16],  # hidden_size
    [1, 3],  # num_layers
    [False, True],  # bidirectional
    [False, True],  # bias
    [False, True],  # batch_first
    [0, 0.4, 0.7, 1],  # dropout
    [1, 2],  # batch_size
    [1, 3],  # seq_len
    [False, True],  # training
))  # fmt: skip
_MKLDNN_TOL = {torch.float32: (1.3e-6, 1e-5), torch.bfloat16: (0.02, 0.02),
               torch.float16: (1e-3, 1e-3)}  # fmt: skip


def _dropout_reference(model, dtype, seed, x, hx, batch_first):
    """torch's single-layer LSTMs (native kernels) stacked by hand, with the masks lstmgrad
    draws: drawn again from ``seed`` as lstmgrad.torch_ops.lstm draws them (one bernoulli over
    [L-1, T, B, D*H] in the compute dtype, scaled by 1 / (1 - p)); the parameters are the
    model's own, so gradients reach them."""
    p, layers, hidden = model.dropout, model.num_layers, model.hidden_size
    dirs = 2 if model.bidirectional else 1
    seq = x.transpose(0, 1) if batch_first else x
    compute = torch.float32 if dtype == torch.bfloat16 else dtype
    torch.manual_seed(seed)
    keep = 1.0 - p
    masks = torch.empty(layers - 1, seq.shape[0], seq.shape[1], dirs * hidden, dtype=compute)
    masks = masks.bernoulli_(keep).mul_(1.0 / keep).to(dtype)
    h0, c0 = hx
    hs, cs = [], []
    layer_in = seq
    for layer in range(layers):
        one = torch.nn.LSTM(layer_in.shape[-1], hidden, bias=model.bias,
                            bidirectional=model.bidirectional, device="meta")  # fmt: skip
        params = {}
        for name, _ in one.named_parameters():
            source = name.replace("_l0", f"_l{layer}")
            params[name] = getattr(model, source)
        state = (h0[layer * dirs : (layer + 1) * dirs], c0[layer * dirs : (layer + 1) * dirs])
        with torch.backends.mkldnn.flags(enabled=False):
            y, (h, c) = torch.func.functional_call(one, params, (layer_in, state))
        hs.append(h)
        cs.append(c)
        layer_in = y * masks[layer] if layer < layers - 1 else y
    out = layer_in.transpose(0, 1) if batch_first else layer_in
    return out, (torch.cat(hs), torch.cat(cs))


_MKLDNN_DTYPES = pytest.mark.parametrize(
    "dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["f32", "bf16", "f16"]
)
# every 23rd combination (23 is prime to every axis' length: each value of each axis occurs),
# a different slice per dtype; the whole grid is the slow test below
_MKLDNN_STRIDE = 23


@_MKLDNN_DTYPES
def test_mkldnn_lstm(dtype):
    """upstream's grid, one combination in 23 (the whole grid: ``-m slow``)."""
    offset = [torch.float32, torch.bfloat16, torch.float16].index(dtype)
    _mkldnn_lstm(dtype, _MKLDNN_GRID[offset::_MKLDNN_STRIDE])


@pytest.mark.slow
@_MKLDNN_DTYPES
def test_mkldnn_lstm_whole_grid(dtype):
    _mkldnn_lstm(dtype, _MKLDNN_GRID)


def _mkldnn_lstm(dtype, grid):
    """torch's native kernels (oneDNN off; upstream's first model) against the module under
    test (upstream's second, oneDNN on): outputs, states and, in training, the gradients of
    input, weights, h_0 and c_0 (float16: inference only, as upstream)."""
    seed = 2023
    torch.manual_seed(seed)
    rtol, atol = _MKLDNN_TOL[dtype]
    for (input_size, hidden_size, num_layers, bidirectional, bias, batch_first, dropout,
         batch_size, seq_len, training) in grid:  # fmt: skip
        if dtype == torch.float16:
            training = False
        num_directions = 2 if bidirectional else 1
        shape = (batch_size, seq_len, input_size) if batch_first else (seq_len, batch_size,
                                                                        input_size)  # fmt: skip
        x = torch.randn(*shape)
        h = torch.randn(num_layers * num_directions, batch_size, hidden_size)
        c = torch.randn(num_layers * num_directions, batch_size, hidden_size)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # dropout with one layer
            model = torch.nn.LSTM(input_size, hidden_size, num_layers, bidirectional=bidirectional,
                                  bias=bias, dropout=dropout, batch_first=batch_first)  # fmt: skip
            model2 = LSTM(input_size, hidden_size, num_layers, bidirectional=bidirectional,
                          bias=bias, dropout=dropout, batch_first=batch_first)  # fmt: skip
        model2.load_state_dict(model.state_dict())
        model.train(training)
        model2.train(training)
        model1, model2 = model.to(dtype), model2.to(dtype)
        x1, x2 = (x.clone().requires_grad_(training) for _ in "12")
        h1, h2 = (h.clone().requires_grad_(training) for _ in "12")
        c1, c2 = (c.clone().requires_grad_(training) for _ in "12")
        masked = training and 0 < dropout < 1 and num_layers > 1 and not CONTROL
        with torch.no_grad() if not training else nullcontext():
            torch.manual_seed(seed)
            args1 = (x1.to(dtype), (h1.to(dtype), c1.to(dtype)))
            if masked:  # lstmgrad's masks are not torch's: the hand-stacked reference
                output1, (hn1, cn1) = _dropout_reference(model1, dtype, seed, *args1,
                                                         batch_first)  # fmt: skip
            else:
                with torch.backends.mkldnn.flags(enabled=False):
                    output1, (hn1, cn1) = model1(*args1)
            torch.manual_seed(seed)
            output2, (hn2, cn2) = model2(x2.to(dtype), (h2.to(dtype), c2.to(dtype)))
            assert_equal(output1, output2, rtol=rtol, atol=atol)
            assert_equal(hn1, hn2, rtol=rtol, atol=atol)
            assert_equal(cn1, cn2, rtol=rtol, atol=atol)
            if training:
                output1.sum().backward(retain_graph=True)
                output2.sum().backward(retain_graph=True)
                assert_equal(x1.grad, x2.grad, rtol=rtol, atol=atol)
                for name, para in model1.named_parameters():
                    assert_equal(para, getattr(model2, name))
                    assert_equal(para.grad, getattr(model2, name).grad, rtol=rtol, atol=atol)
                hn1.sum().backward(retain_graph=True)
                hn2.sum().backward(retain_graph=True)
                assert_equal(h1.grad, h2.grad, rtol=rtol, atol=atol)
                cn1.sum().backward(retain_graph=True)
                cn2.sum().backward(retain_graph=True)
                assert_equal(c1.grad, c2.grad, rtol=rtol, atol=atol)


# ---------------------------------------------------------------------------------------------
# test/test_modules.py with the torch.nn.LSTM ModuleInfo

# the test class's own tolerance floor (TestModule.precision, TestModule.rel_tol)
_MODULE_TOL = dict(precision=1e-5, rel_tol=1e-5)
_MODULE_DTYPES = pytest.mark.parametrize("dtype", [torch.float32, torch.float64],
                                         ids=["f32", "f64"])  # fmt: skip
_TRAINING = pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])


def module_inputs(dtype, requires_grad):
    """The LSTM ModuleInfo's samples: for bias, batch_first, bidirectional and proj_size in
    {0, 2}, LSTM(2, 3, num_layers=2) with an unbatched [2, 2] input alone, and with an
    unbatched [3, 2] input and its (h_0, c_0). Each is (constructor kwargs, forward args)."""
    make = partial(make_tensor, device="cpu", dtype=dtype, requires_grad=requires_grad)
    samples = []
    for bias, batch_first, bidirectional, proj_size in itertools.product(
        (False, True), (False, True), (False, True), (0, 2)
    ):
        kwargs = dict(input_size=2, hidden_size=3, num_layers=2, proj_size=proj_size,
                      batch_first=batch_first, bias=bias, bidirectional=bidirectional)  # fmt: skip
        samples.append((kwargs, (make((2, 2)),)))
        k = 4 if bidirectional else 2
        hx = (make((k, proj_size or 3)), make((k, 3)))
        samples.append((kwargs, (make((3, 2)), hx)))
    return samples


def _sample_id(sample):
    kw = sample[0]
    return (f"b{int(kw['bias'])}bf{int(kw['batch_first'])}d{int(kw['bidirectional'])}"
            f"p{kw['proj_size']}" + ("-hx" if len(sample[1]) > 1 else ""))  # fmt: skip


def batched_reference(m, batch_first, x, hx=None):
    """The unbatched input run as a batch of one, the results squeezed back."""
    batch_dim = 0 if batch_first else 1
    if hx is not None:
        hx = (hx[0].unsqueeze(1), hx[1].unsqueeze(1))
    with freeze_rng_state():
        out, (h, c) = m(x.unsqueeze(batch_dim), hx)
    return out.squeeze(batch_dim), (h.squeeze(1), c.squeeze(1))


def _assert_params_are(m, dtype, device="cpu"):
    for _, p in itertools.chain(m.named_parameters(), m.named_buffers()):
        assert p.device == torch.device(device)
        if p.dtype.is_floating_point:
            assert p.dtype == dtype


@_MODULE_DTYPES
@_TRAINING
def test_module_forward(dtype, training):
    for kwargs, args in module_inputs(dtype, requires_grad=False):
        with freeze_rng_state():
            m = LSTM(**kwargs).to(dtype)
            m.train(training)
            outputs = m(*args)
            ref = batched_reference(m, kwargs["batch_first"], *args)
            assert_equal(outputs, ref, **_MODULE_TOL)
            (m.float if dtype == torch.float32 else m.double)()
            m(*args)
            _assert_params_are(m, dtype)


@_MODULE_DTYPES
@_TRAINING
def test_module_factory_kwargs(dtype, training):
    for kwargs, _ in module_inputs(dtype, requires_grad=False):
        m = LSTM(**kwargs)
        assert len(list(m.parameters())) > 0  # it creates parameters: the kwargs must reach them
        m = LSTM(**kwargs, device="cpu", dtype=dtype)
        m.train(training)
        _assert_params_are(m, dtype)


@_MODULE_DTYPES
@_TRAINING
def test_module_repr(dtype, training):
    for kwargs, _ in module_inputs(dtype, requires_grad=False):
        m = LSTM(**kwargs).to(dtype)
        m.train(training)
        assert repr(m).startswith("LSTM(2, 3, ") and "num_layers=2" in repr(m)
        assert str(m) == repr(m)


@_MODULE_DTYPES
@_TRAINING
def test_module_pickle(dtype, training):
    for kwargs, args in module_inputs(dtype, requires_grad=False):
        with freeze_rng_state():
            m = LSTM(**kwargs).to(dtype)
            m.train(training)
            output = m(*args)
            buffer = io.BytesIO()
            torch.save(m, buffer)
            buffer.seek(0)
            m_copy = torch.load(buffer, weights_only=False)
            assert type(m_copy) is type(m)
            assert_equal(m_copy(*args), output, **_MODULE_TOL)


def _non_contiguous(obj):
    def one(t):
        if not isinstance(t, torch.Tensor) or t.dim() == 0:
            return t
        out = torch.repeat_interleave(t, 2, dim=-1)[..., ::2].detach()
        out.requires_grad = t.requires_grad
        return out

    leaves, spec = tree_flatten(obj)
    return tree_unflatten([one(t) for t in leaves], spec)


def _zero_grads(tensors):
    for t in tensors:
        t.grad = None


@_MODULE_DTYPES
@_TRAINING
def test_module_non_contiguous_tensors(dtype, training):
    for kwargs, args in module_inputs(dtype, requires_grad=True):
        m = LSTM(**kwargs).to(dtype)
        m.train(training)
        in_leaves = tree_flatten(args)[0]
        with freeze_rng_state():
            default_output = m(*args)
            grad_output = tree_unflatten(
                [o.clone().detach().normal_() for o in tree_flatten(default_output)[0]],
                tree_flatten(default_output)[1],
            )
            for o, g in zip(tree_flatten(default_output)[0], tree_flatten(grad_output)[0],
                            strict=True):  # fmt: skip
                o.backward(g, retain_graph=True)
        default_in_grads = [t.grad.clone() for t in in_leaves]
        default_param_grads = [p.grad.clone() for p in m.parameters()]

        nc_args = _non_contiguous(args)
        nc_grad_output = _non_contiguous(grad_output)
        for in_args, g_out in itertools.product([args, nc_args], [grad_output, nc_grad_output]):
            leaves = tree_flatten(in_args)[0]
            _zero_grads(leaves)
            _zero_grads(m.parameters())
            with freeze_rng_state():
                out = m(*in_args)
                for o, g in zip(tree_flatten(out)[0], tree_flatten(g_out)[0], strict=True):
                    o.backward(g.clone(), retain_graph=True)
            assert_equal(out, default_output, **_MODULE_TOL)
            assert_equal([t.grad for t in leaves], default_in_grads, atol=1e-4, rtol=0,
                         **_MODULE_TOL)  # fmt: skip
            assert_equal([p.grad for p in m.parameters()], default_param_grads, **_MODULE_TOL)


def _gradients_helper(training, check, partials):
    """upstream's check of the total derivative (input, state and every parameter) and, with
    ``partials``, of each parameter's partial derivative alone, float64."""
    for kwargs, args in module_inputs(torch.float64, requires_grad=True):
        m = LSTM(**kwargs).to(torch.float64)
        m.train(training)
        params = tuple(m.parameters())
        n_args = len(args)

        def fn(*flat, spec, m=m, n_args=n_args):
            new_args = tree_unflatten(list(flat), spec)[:n_args]
            with freeze_rng_state():
                return tree_flatten(m(*new_args))[0]

        flat, spec = tree_flatten(args + params)
        assert check(partial(fn, spec=spec), flat)
        if not partials:
            continue
        saved = [p.requires_grad for p in params]
        for p in params:
            p.requires_grad = False
        for p, old in zip(params, saved, strict=True):
            p.requires_grad = old
            flat, spec = tree_flatten(args + params)
            assert check(partial(fn, spec=spec), flat)
            p.requires_grad = False


# upstream's testing gradcheck: batched gradients (vmap over the backward) and fast mode
_gradcheck = partial(torch.autograd.gradcheck, check_batched_grad=True, fast_mode=True)
_gradgradcheck = partial(torch.autograd.gradgradcheck, check_batched_grad=True, fast_mode=True)


@_TRAINING
def test_module_grad(training):
    """The total derivative; each parameter's partial derivative: the slow tests below."""
    _gradients_helper(training, _gradcheck, partials=False)


@_TRAINING
def test_module_gradgrad(training):
    _gradients_helper(training, _gradgradcheck, partials=False)


@pytest.mark.slow
@_TRAINING
def test_module_grad_partials(training):
    _gradients_helper(training, _gradcheck, partials=True)


@pytest.mark.slow
@_TRAINING
def test_module_gradgrad_partials(training):
    _gradients_helper(training, _gradgradcheck, partials=True)


@_MODULE_DTYPES
@_TRAINING
def test_module_memory_format(dtype, training):
    """Inputs are 2-D: contiguous format only; the module converted to preserve_format and
    contiguous_format; outputs and gradients equal and contiguous."""
    for kwargs, args in module_inputs(dtype, requires_grad=True):
        with freeze_rng_state():
            m = LSTM(**kwargs).to(dtype)
            m.train(training)
            desired = m(*args)
            diff_out = tuple(t for t in tree_flatten(desired)[0] if t.requires_grad)
            diff_in = tuple(t for t in tree_flatten((args, tuple(m.parameters())))[0]
                            if t.requires_grad)  # fmt: skip
            ref_grad_out = tuple(torch.rand_like(t) for t in diff_out)
            ref_grads = torch.autograd.grad(diff_out, diff_in, grad_outputs=ref_grad_out)
            d_args = tree_unflatten(
                [t.clone().to(memory_format=torch.contiguous_format).detach()
                 .requires_grad_(t.requires_grad) for t in tree_flatten(args)[0]],
                tree_flatten(args)[1],
            )  # fmt: skip
            for module_format in (torch.preserve_format, torch.contiguous_format):
                m.to(memory_format=module_format)
                outputs = m(*d_args)
                assert_equal(outputs, desired, **_MODULE_TOL)
                for t in tree_flatten(outputs)[0]:
                    assert t.is_contiguous()
                outs = tuple(t for t in tree_flatten(outputs)[0] if t.requires_grad)
                ins = tuple(t for t in tree_flatten((d_args, tuple(m.parameters())))[0]
                            if t.requires_grad)  # fmt: skip
                grads = torch.autograd.grad(
                    outs, ins, grad_outputs=tuple(torch.empty_like(a).copy_(b)
                                                  for a, b in zip(outs, ref_grad_out, strict=True))
                )  # fmt: skip
                assert_equal(grads, ref_grads, **_MODULE_TOL)
                for g in grads:
                    assert g.is_contiguous()


@_MODULE_DTYPES
def test_module_if_train_and_eval_modes_differ(dtype):
    """The ModuleInfo says training and eval differ: the forward reads ``training``."""
    for kwargs, args in module_inputs(dtype, requires_grad=False):
        m = LSTM(**kwargs).to(dtype)
        m.train(True)
        delattr(m, "training")
        try:
            m(*args)
        except AttributeError as exc:
            assert "'training'" in str(exc)


@_MODULE_DTYPES
@_TRAINING
def test_module_device_ctx_init(dtype, training):
    for kwargs, _ in module_inputs(dtype, requires_grad=False):
        m_cpu = LSTM(**kwargs)
        with torch.device("meta"):
            m = LSTM(**kwargs)
        for p_meta, p_cpu in itertools.chain(
            zip(m.parameters(), m_cpu.parameters(), strict=True),
            zip(m.buffers(), m_cpu.buffers(), strict=True),
        ):
            assert p_meta.is_meta
            assert (p_meta.shape, p_meta.dtype, p_meta.stride()) == (
                p_cpu.shape, p_cpu.dtype, p_cpu.stride())  # fmt: skip


# the RNN/GRU/LSTM ModuleInfo's error samples: (constructor args, kwargs, error, pattern)
_CONSTRUCTION_ERRORS = [
    ((10, 0, 1), {}, ValueError, "hidden_size must be greater than zero"),
    ((10, 10, 0), {}, ValueError, "num_layers must be greater than zero"),
    ((3, 5), {"bias": 0}, TypeError, "bias should be of type bool, got: int"),
    ((3, 5), {"bias": 1}, TypeError, "bias should be of type bool, got: int"),
    ((3, 5), {"bias": "True"}, TypeError, "bias should be of type bool, got: str"),
    ((3, 5), {"batch_first": 0}, TypeError, "batch_first should be of type bool, got: int"),
    ((3, 5), {"batch_first": 1}, TypeError, "batch_first should be of type bool, got: int"),
    ((3, 5), {"batch_first": "False"}, TypeError, "batch_first should be of type bool, got: str"),
    ((3.0, 5), {}, TypeError, "input_size should be of type int, got: float"),
    (("10", 5), {}, TypeError, "input_size should be of type int, got: str"),
    ((0, 5), {}, ValueError, "input_size must be greater than zero"),
    ((-1, 5), {}, ValueError, "input_size must be greater than zero"),
    ((3, 5.0), {}, TypeError, "hidden_size should be of type int, got: float"),
]


@_MODULE_DTYPES
@_TRAINING
def test_module_errors(dtype, training):
    for args, kwargs, error, pattern in _CONSTRUCTION_ERRORS:
        with pytest.raises(error, match=pattern):
            LSTM(*args, **kwargs)
    mismatched = torch.float64 if dtype == torch.float32 else torch.float32
    m = LSTM(3, 5, dtype=dtype, device="cpu")
    with pytest.raises(
        ValueError,
        match=r"RNN input dtype .* does not match weight dtype .* "
        r"Convert input: input\.to\(.*\), or convert model: model\.to\(.*\)",
    ):
        m(make_tensor((2, 4, 3), device="cpu", dtype=mismatched))
