"""The plan field library_lstm: a dense float32 inference forward of tensors runs torch's own
fused LSTM (oneDNN's RNN primitive) instead of the engine; everything else runs the engine."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import lstmgrad  # noqa: E402
import lstmgrad.nn  # noqa: E402
from lstmgrad.core.layout import Dims  # noqa: E402
from lstmgrad.ops.tensors import TorchGemm, torch_gemm  # noqa: E402
from lstmgrad.planning import plan  # noqa: E402
from lstmgrad.planning.plan import forced  # noqa: E402

pytestmark = pytest.mark.skipif(
    not torch_gemm().library_lstm(np.dtype(np.float32)),
    reason="torch's CPU LSTM does not run on oneDNN here",
)


@pytest.fixture(autouse=True)
def fresh(monkeypatch, tmp_path):
    monkeypatch.setenv("LSTMGRAD_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("LSTMGRAD_TUNE", "cached")
    plan.forget()
    yield
    plan.forget()


@pytest.fixture
def calls(monkeypatch):
    """The calls of the library's LSTM (counted, then run)."""
    seen = []
    real = TorchGemm.lstm_inference

    def counting(self, call):
        seen.append(call.dims)
        return real(self, call)

    monkeypatch.setattr(TorchGemm, "lstm_inference", counting)
    return seen


CASES = [
    # T, B, I, H, L, bidirectional, bias, batch_first, hx
    (5, 3, 4, 6, 2, True, True, False, True),
    (1, 1, 3, 5, 1, False, False, True, False),
    (7, 2, 8, 16, 3, False, True, True, True),
    (4, 5, 6, 7, 1, True, False, False, False),
]
IDS = [f"T{c[0]}-B{c[1]}-I{c[2]}-H{c[3]}-L{c[4]}-D{2 if c[5] else 1}"
       + ("" if c[6] else "-nobias") + ("-bf" if c[7] else "") + ("-hx" if c[8] else "")
       for c in CASES]  # fmt: skip


@pytest.mark.parametrize("T, B, I, H, L, bidir, bias, bf, with_hx", CASES, ids=IDS)
def test_inference_runs_the_library_lstm_and_matches_torch(calls, T, B, I, H, L, bidir, bias,
                                                          bf, with_hx):  # fmt: skip
    """Under no_grad the drop-in's forward is torch's own (the same bits); with the field
    forced off the engine's, within float32 rounding of it; the engine's float64 the oracle of
    both."""
    torch.manual_seed(0)
    ref = torch.nn.LSTM(I, H, L, bias=bias, bidirectional=bidir, batch_first=bf).eval()
    ours = lstmgrad.nn.LSTM(I, H, L, bias=bias, bidirectional=bidir, batch_first=bf).eval()
    ours.load_state_dict(ref.state_dict())
    x = torch.randn((B, T, I) if bf else (T, B, I))
    k = L * (2 if bidir else 1)
    hx = (torch.randn(k, B, H), torch.randn(k, B, H)) if with_hx else None
    with torch.no_grad():
        want = ref(x, hx)
        got = ours(x, hx)
        assert len(calls) == 1
        with forced(library_lstm=False):
            engine = ours(x, hx)
        assert len(calls) == 1
    for a, b, c in ((want[0], got[0], engine[0]), (want[1][0], got[1][0], engine[1][0]),
                    (want[1][1], got[1][1], engine[1][1])):  # fmt: skip
        assert torch.equal(a, b)
        torch.testing.assert_close(c, a, atol=2e-6, rtol=1e-5)
    # the same through the core API, against the reference in float64
    params = [p.detach() for p in ref._flat_weights]
    hx_list = None if hx is None else list(hx)
    core = lstmgrad.lstm_forward(x, params, hx_list, has_bias=bias, num_layers=L, train=False,
                                 bidirectional=bidir, batch_first=bf)  # fmt: skip
    oracle = lstmgrad.lstm_forward(
        x.double().numpy(),
        [p.double().numpy() for p in params],
        None if hx is None else [h.double().numpy() for h in hx],
        has_bias=bias,
        num_layers=L,
        train=False,
        bidirectional=bidir,
        batch_first=bf,
        impl="reference",
    )
    assert len(calls) == 2 and core.saved is None
    np.testing.assert_allclose(core.output.numpy(), oracle.output, atol=2e-6)
    np.testing.assert_allclose(core.hy.numpy(), oracle.hy, atol=2e-6)
    np.testing.assert_allclose(core.cy.numpy(), oracle.cy, atol=2e-6)


def test_training_varlen_other_dtypes_and_numpy_run_the_engine(calls):
    """The library's LSTM serves dense float32 inference only: a training forward (which saves
    the activations), variable lengths (a PackedSequence), float64 and float16 storage,
    bfloat16 modules and NumPy inputs run the engine."""
    torch.manual_seed(1)
    m = lstmgrad.nn.LSTM(4, 6, 2, bidirectional=True)
    x = torch.randn(5, 3, 4)
    m(x)[0].sum().backward()  # training
    with torch.no_grad():
        m.eval()
        packed = torch.nn.utils.rnn.pack_padded_sequence(x, [5, 3, 2])
        m(packed)
        m.double()(x.double())
        m.bfloat16()(x.bfloat16())
    params = [np.asarray(0.3 * np.random.default_rng(0).standard_normal(s), np.float32)
              for s in [(24, 4), (24, 6), (24,), (24,)]]  # fmt: skip
    lstmgrad.lstm_forward(np.ones((2, 1, 4), np.float32), params, train=False)
    half = lstmgrad.lstm_forward(
        torch.ones(2, 1, 4, dtype=torch.float16),
        [torch.from_numpy(p).half() for p in params],
        train=False,
    )
    assert half.output.dtype == torch.float16
    assert calls == []
    with torch.no_grad():  # and the same module as float32 inference: the library
        m.float()(x)
    assert len(calls) == 1


def test_lstmgrad_tune_off_runs_the_engine(calls, monkeypatch):
    monkeypatch.setenv("LSTMGRAD_TUNE", "off")
    m = lstmgrad.nn.LSTM(4, 6).eval()
    with torch.no_grad():
        m(torch.randn(3, 2, 4))
    assert calls == []


def test_in_use_check_moves_inference_to_the_engine_where_it_is_faster(monkeypatch):
    """The library's LSTM serves an inference forward first; once its samples of the engine
    run faster by the gate's margin, the engine serves (and a training forward's calls keep
    the engine's plans throughout)."""
    monkeypatch.setattr(plan.tune, "probe", _fast_walk_probe)
    gemm = torch_gemm()
    dims = Dims(T=20, B=8, I=16, H=32, L=1, D=1, has_bias=True)
    f32 = np.dtype(np.float32)
    part = ("forward", (False, False), False)
    used = []
    for _ in range(plan.WATCH_EVERY * 2):
        p, done = plan.plan_call(dims, f32, gemm, part, inference=True)
        used.append(p.library_lstm)
        done(0.010 if p.library_lstm else 0.004)  # the engine faster
    assert used[0] and not used[-2]  # (the last call samples the library again)
    train, _ = plan.plan_call(dims, f32, gemm, ("forward", (True, False), False))
    assert train.library_lstm  # the field is set; the engine ignores it when training


def _fast_walk_probe(cls, gemm, big_sizes=None):
    """A probe in which one walk is the cheapest arrangement (no product method is timed)."""
    one = {"blas": {"prep": {"1": 0.0}, "call": 1e-3}}
    return {"recurrent": {"fwd": one, "bwd": one}, "walk": {"library": 1e-4}, "walk_prep": {},
            "gate": 1e-5, "measured_at": "2026-12-08T00:00:00"}  # fmt: skip


def test_drop_in_calls_torchs_forward_directly_once_the_library_serves(calls, monkeypatch):
    """After the first call (through the API, which sets up the in-use check), the drop-in's
    inference calls torch's own forward directly, but for the check's samples of the engine;
    every result is torch's or the engine's, within float32 rounding of torch's."""
    monkeypatch.setattr(plan.tune, "probe", _fast_walk_probe)
    monkeypatch.setattr(plan, "GATE_MARGIN", 1e9)  # whatever the samples' times: no switch
    direct = []
    real_forward = torch.nn.LSTM.forward

    def counting(self, *args, **kwargs):
        direct.append(1)
        return real_forward(self, *args, **kwargs)

    monkeypatch.setattr(torch.nn.LSTM, "forward", counting)
    torch.manual_seed(2)
    ref = torch.nn.LSTM(8, 16, 2)
    ours = lstmgrad.nn.LSTM(8, 16, 2).eval()
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(6, 3, 8)
    n = 2 * plan.WATCH_EVERY
    with torch.no_grad():
        want = real_forward(ref.eval(), x)[0]
        for _ in range(n):
            torch.testing.assert_close(ours(x)[0], want, atol=2e-6, rtol=1e-5)
    assert len(calls) == 1  # the first call: the API, on torch's LSTM
    assert n - 8 <= len(direct) < n  # the rest torch's forward, but for the engine's samples
