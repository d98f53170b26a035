"""Adopting lstmgrad.nn.LSTM in an existing model, saving it and deploying it, each path beside
torch.nn.LSTM (the "torch" column, the control); the oracle is always torch.nn.LSTM's eager
result on the same weights.

- convert / revert: nested models, a DDP-wrapped model, an optimizer across both, hooks, training
  mode, state_dict keys; subclasses and proj_size > 0 left alone and named.
- checkpoints: whole-model torch.save then torch.load(weights_only=True) as PyTorch's
  word_language_model example does (lm_example.py), also in a fresh process; a reverted
  checkpoint, a state_dict and the TorchScript / torch.export artifacts in a process without
  lstmgrad.
- torch.jit.trace, torch.jit.script, torch.onnx.export (both exporters; onnxruntime runs the
  file), torch.export (run_decompositions, torch.compile).
"""

from __future__ import annotations

import copy
import operator
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any, NamedTuple

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402
from torch import Tensor  # noqa: E402

import lm_example  # noqa: E402  (tests/ is on sys.path)
import lm_example_adopted  # noqa: E402
import lstmgrad.nn  # noqa: E402
from lstmgrad.nn import LSTM  # noqa: E402

TESTS = Path(__file__).resolve().parent
I_SIZE, H_SIZE, T, B = 5, 7, 6, 4
TOL = 1e-5  # float32, absolute: what the deployment paths are held to
COLUMNS = ["torch", "lstmgrad"]


@pytest.fixture
def engine_calls(monkeypatch):
    """Each call of lstmgrad's engine by lstmgrad.nn.LSTM (its functional form), recorded."""
    calls: list[int] = []
    original = lstmgrad.nn.lstm

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(lstmgrad.nn, "lstm", counting)
    return calls


def close(got: Any, want: Any, tol: float) -> None:
    got = [got] if isinstance(got, Tensor) else list(got)
    want = [want] if isinstance(want, Tensor) else list(want)
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        a = torch.as_tensor(a)
        assert a.shape == b.shape and a.dtype == b.dtype
        assert (a - b).abs().max().item() <= tol


def failure(fn: Any) -> str:
    """The name of the exception ``fn()`` raises, or "no failure"."""
    try:
        fn()
    except Exception as exc:
        return type(exc).__name__
    return "no failure"


# ---------------------------------------------------------------------------------------------
# models and inputs


class Tagger(torch.nn.Module):
    """An LSTM started from a given state, with a linear head: dense input."""

    def __init__(self, num_layers: int, bidirectional: bool, batch_first: bool) -> None:
        super().__init__()
        self.rnn = torch.nn.LSTM(
            I_SIZE, H_SIZE, num_layers, bidirectional=bidirectional, batch_first=batch_first
        )
        self.head = torch.nn.Linear(H_SIZE * (2 if bidirectional else 1), 3)

    def forward(self, x: Tensor, h0: Tensor, c0: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        y, (h, c) = self.rnn(x, (h0, c0))
        return self.head(y), h, c


class PackedTagger(torch.nn.Module):
    """Padded sequences and their lengths, packed (unsorted) for the LSTM and padded back."""

    def __init__(self, num_layers: int, bidirectional: bool, batch_first: bool) -> None:
        super().__init__()
        self.rnn = torch.nn.LSTM(I_SIZE, H_SIZE, num_layers, bidirectional=bidirectional)

    def forward(self, x: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        packed = torch.nn.utils.rnn.pack_padded_sequence(x, lengths, enforce_sorted=False)
        y, (h, c) = self.rnn(packed)
        y, _ = torch.nn.utils.rnn.pad_packed_sequence(y, total_length=x.shape[0])
        return y, h, c


class Case(NamedTuple):
    packed: bool
    num_layers: int
    bidirectional: bool
    batch_first: bool = False

    @property
    def id(self) -> str:
        kind = "packed" if self.packed else "dense"
        bf = "-batch_first" if self.batch_first else ""
        return f"{kind}-L{self.num_layers}-D{2 if self.bidirectional else 1}{bf}"

    def build(self) -> torch.nn.Module:
        cls = PackedTagger if self.packed else Tagger
        return cls(self.num_layers, self.bidirectional, self.batch_first).eval()

    def inputs(self, seed: int) -> tuple[Tensor, ...]:
        """Seed 0 is what a model is recorded with, seed 1 what the record then runs on
        (other values; for packed inputs other lengths)."""
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(*((B, T) if self.batch_first else (T, B)), I_SIZE, generator=g)
        if self.packed:
            return x, torch.tensor([(3, 6, 1, 4), (6, 2, 5, 5)][seed])
        k = self.num_layers * (2 if self.bidirectional else 1)
        return x, torch.randn(k, B, H_SIZE, generator=g), torch.randn(k, B, H_SIZE, generator=g)


DENSE = [Case(False, 1, False), Case(False, 2, True, batch_first=True)]
PACKED = [Case(True, 1, False), Case(True, 2, True)]
CASES = DENSE + PACKED


def pick(column: str, case: Case) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(control, model): the case's model with torch.nn.LSTM, and the model of the column
    (the control itself, or a converted deep copy of it)."""
    torch.manual_seed(0)
    control = case.build()
    if column == "torch":
        return control, control
    return control, lstmgrad.nn.convert(copy.deepcopy(control))


def op_kinds(graph: Any) -> set[str]:
    return {node.kind() for node in graph.nodes()}


# ---------------------------------------------------------------------------------------------
# convert / revert


class TwoLSTMs(torch.nn.Module):
    """A module holding two LSTMs, the second deep and bidirectional."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = torch.nn.LSTM(I_SIZE, H_SIZE, batch_first=True)
        self.decoder = torch.nn.LSTM(H_SIZE, 4, num_layers=2, bidirectional=True, batch_first=True)

    def forward(self, x: Tensor) -> Tensor:
        return self.decoder(self.encoder(x)[0])[0]


def nested() -> torch.nn.Module:
    shared = torch.nn.LSTM(I_SIZE, H_SIZE)
    model = torch.nn.ModuleDict(
        {
            "seq": torch.nn.Sequential(torch.nn.Linear(I_SIZE, I_SIZE), TwoLSTMs()),
            "stack": torch.nn.ModuleList([torch.nn.LSTM(I_SIZE, H_SIZE, bias=False), shared]),
            "again": shared,  # one module at two paths
        }
    )
    model.seq[1].decoder.eval()  # a training mode that differs from its parent's
    return model.double()


def test_convert_and_revert_nested_models_keep_parameters_keys_and_modes(engine_calls):
    torch.manual_seed(0)
    model = nested()
    control = copy.deepcopy(model)
    params = dict(model.named_parameters(remove_duplicate=False))
    state = model.state_dict()
    modes = {p: m.training for p, m in model.named_modules(remove_duplicate=False)}

    for fn, cls in ((lstmgrad.nn.convert, LSTM), (lstmgrad.nn.revert, torch.nn.LSTM)):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # nothing to report here
            assert fn(model) is model  # containers are changed in place
        kinds = {p: type(m) for p, m in model.named_modules(remove_duplicate=False)}
        assert [p for p, k in kinds.items() if k is cls] == [
            "seq.1.encoder", "seq.1.decoder", "stack.0", "stack.1", "again",
        ]  # fmt: skip
        assert model.stack[1] is model.again
        assert all(q is params[n] for n, q in model.named_parameters(remove_duplicate=False))
        assert list(model.state_dict()) == list(state)
        assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
        assert {p: m.training for p, m in model.named_modules(remove_duplicate=False)} == modes

    lstmgrad.nn.convert(model)
    x = torch.randn(3, T, I_SIZE, dtype=torch.float64)
    got, want = model.seq(x), control.seq(x)
    assert engine_calls and (got - want).abs().max() <= 1e-10 * want.abs().max()


def test_convert_and_revert_a_root_lstm():
    torch.manual_seed(0)
    root = torch.nn.LSTM(I_SIZE, H_SIZE, num_layers=2)
    ours = lstmgrad.nn.convert(root)
    assert type(ours) is LSTM and type(root) is torch.nn.LSTM
    assert ours.recompute is False and ours.max_saved_bytes is None
    assert all(p is q for p, q in zip(ours.parameters(), root.parameters(), strict=True))
    back = lstmgrad.nn.revert(ours)
    assert type(back) is torch.nn.LSTM and not hasattr(back, "recompute")
    assert all(p is q for p, q in zip(back.parameters(), root.parameters(), strict=True))
    x = torch.randn(T, B, I_SIZE)
    close(ours(x)[0], root(x)[0], TOL)


def test_hooks_are_kept_and_their_handles_still_remove_them(engine_calls):
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(I_SIZE, H_SIZE).double().eval()
    seen: list[tuple[str, str]] = []
    handles = [
        lstm.register_forward_pre_hook(lambda m, a: seen.append(("pre", type(m).__module__))),
        lstm.register_forward_hook(lambda m, a, o: seen.append(("post", type(m).__module__))),
        lstm.register_full_backward_hook(
            lambda m, gi, go: seen.append(("backward", type(m).__module__))
        ),
    ]
    x = torch.randn(T, B, I_SIZE, dtype=torch.float64, requires_grad=True)
    ours = lstmgrad.nn.convert(lstm)
    assert not ours.training
    ours(x)[0].sum().backward()
    assert seen == [("pre", "lstmgrad.nn"), ("post", "lstmgrad.nn"), ("backward", "lstmgrad.nn")]
    assert engine_calls
    seen.clear()
    back = lstmgrad.nn.revert(ours)
    back(x)[0].sum().backward()
    assert [kind for kind, _ in seen] == ["pre", "post", "backward"]
    assert {where for _, where in seen} == {"torch.nn.modules.rnn"}
    seen.clear()
    for handle in handles:  # made on the torch.nn.LSTM before both conversions
        handle.remove()
    ours(x)[0].sum().backward()
    back(x)[0].sum().backward()
    assert seen == []


class OwnForward(torch.nn.LSTM):
    def forward(self, input: Any, hx: Any = None) -> Any:
        return super().forward(input, hx)


class OwnInit(torch.nn.LSTM):
    def reset_parameters(self) -> None:
        for p in self.parameters():
            torch.nn.init.zeros_(p)


class MyLSTM(LSTM):
    pass


def test_subclasses_and_projections_are_left_alone_and_named():
    model = torch.nn.ModuleDict(
        {
            "a": OwnForward(I_SIZE, H_SIZE),
            "b": torch.nn.Sequential(OwnInit(I_SIZE, H_SIZE)),
            "c": torch.nn.LSTM(I_SIZE, H_SIZE, proj_size=3),
            "d": torch.nn.LSTM(I_SIZE, H_SIZE),
            "e": MyLSTM(I_SIZE, H_SIZE),  # already lstmgrad's: nothing to say
        }
    )
    with pytest.warns(UserWarning) as record:
        lstmgrad.nn.convert(model)
    (message,) = [str(w.message) for w in record]
    assert message.startswith("lstmgrad.nn.convert: left as they are: ")
    assert "'a' (OwnForward, a subclass of torch.nn.LSTM with its own forward)" in message
    assert "'b.0' (OwnInit, a subclass of torch.nn.LSTM)" in message
    assert "'c' (proj_size=3: lstmgrad.nn.LSTM runs torch's forward)" in message
    assert "'d'" not in message and "'e'" not in message
    assert [type(model[k]) for k in "acde"] == [OwnForward, torch.nn.LSTM, LSTM, MyLSTM]
    assert type(model.b[0]) is OwnInit

    with pytest.warns(UserWarning, match=r"'e' \(MyLSTM, a subclass of lstmgrad.nn.LSTM\)"):
        lstmgrad.nn.revert(model)
    assert type(model.d) is torch.nn.LSTM and type(model.e) is MyLSTM
    with pytest.warns(UserWarning, match="left as they are: the module itself"):
        assert type(lstmgrad.nn.convert(OwnInit(2, 3))) is OwnInit


def test_convert_names_a_wrong_argument():
    with pytest.raises(TypeError, match="lstmgrad.nn.convert: module must be a torch.nn.Module, got dict"):  # fmt: skip
        lstmgrad.nn.convert({"rnn": torch.nn.LSTM(2, 3)})


def test_an_optimizer_steps_on_across_convert_and_revert(engine_calls):
    """Adam built on the torch model: two steps with torch.nn.LSTM, two converted, two reverted,
    each step equal to the same six on the untouched torch model."""
    torch.manual_seed(0)
    control = TwoLSTMs().double()
    model = copy.deepcopy(control)
    opts = [torch.optim.Adam(m.parameters(), lr=0.05) for m in (control, model)]
    start = [p.detach().clone() for p in control.parameters()]
    x = torch.randn(3, T, I_SIZE, dtype=torch.float64)

    def step(m: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
        opt.zero_grad()
        (m(x) ** 2).sum().backward()
        opt.step()

    for change, engine in ((None, False), (lstmgrad.nn.convert, True), (lstmgrad.nn.revert, False)):
        if change is not None:
            change(model)
        engine_calls.clear()
        for _ in range(2):
            step(control, opts[0])
            step(model, opts[1])
            for p, q in zip(model.parameters(), control.parameters(), strict=True):
                assert (p - q).abs().max() <= 1e-10 * q.abs().max()
        assert bool(engine_calls) == engine
    assert set(opts[1].state) == set(model.parameters())  # Adam's state followed the Parameters
    assert all((p - p0).abs().max() > 0.1 for p, p0 in zip(model.parameters(), start, strict=True))


@pytest.fixture
def gloo_world_of_one():
    if not dist.is_available():
        pytest.skip("torch.distributed unavailable")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_convert_a_ddp_wrapped_model(gloo_world_of_one, engine_calls):
    """Converted inside DistributedDataParallel: DDP's reducer holds the same Parameters (new
    ones would leave it waiting for their gradients: it raises at the next step), and training
    equals the torch model's."""
    torch.manual_seed(0)
    control = TwoLSTMs().double()
    ddp = torch.nn.parallel.DistributedDataParallel(copy.deepcopy(control))
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (control, ddp)]
    x = torch.randn(3, T, I_SIZE, dtype=torch.float64)
    for n in range(4):
        if n == 1:
            weight = ddp.module.decoder.weight_hh_l1_reverse
            assert lstmgrad.nn.convert(ddp) is ddp
            assert type(ddp.module.decoder) is LSTM
            assert ddp.module.decoder.weight_hh_l1_reverse is weight
        for m, opt in zip((control, ddp), opts, strict=True):
            opt.zero_grad()
            (m(x) ** 2).sum().backward()
            opt.step()
        for p, q in zip(ddp.module.parameters(), control.parameters(), strict=True):
            assert (p - q).abs().max() <= 1e-10 * q.abs().max()
    assert engine_calls


# ---------------------------------------------------------------------------------------------
# checkpoints

LM = dict(ntoken=50, ninp=16, nhid=24, nlayers=2, dropout=0.2)


def trained(model_class: type) -> torch.nn.Module:
    torch.manual_seed(0)
    model = model_class(**LM)
    lm_example.train(model, steps=2)
    return model


def control_of(model: torch.nn.Module) -> lm_example.RNNModel:
    """A torch-only lm_example.RNNModel holding ``model``'s weights (a state_dict, moved)."""
    control = lm_example.RNNModel(**LM)
    control.load_state_dict(model.state_dict())
    return control


def run_child(code: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", f"import sys; sys.path.insert(0, {str(TESTS)!r})\n{code}"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("column", COLUMNS)
def test_whole_model_checkpoint_as_the_word_language_model_example(column, tmp_path, engine_calls):
    """main.py's path: train, torch.save(model, f), torch.load under safe_globals naming the
    model class and torch's (no lstmgrad class: importing lstmgrad.nn allowed it), generate."""
    model_class = lm_example.RNNModel if column == "torch" else lm_example_adopted.RNNModel
    model = trained(model_class)
    path = str(tmp_path / "model.pt")
    lm_example.save(model, path)
    loaded = lm_example.load(path, model_class)
    assert type(loaded.rnn) is (torch.nn.LSTM if column == "torch" else LSTM)
    engine_calls.clear()
    tokens, outputs = lm_example.generate(loaded, 12, seed=3)
    want_tokens, want_outputs = lm_example.generate(control_of(model), 12, seed=3)
    assert tokens == want_tokens
    close(outputs, want_outputs, TOL)
    assert bool(engine_calls) == (column == "lstmgrad")


def test_the_example_generate_path_in_a_fresh_process(tmp_path):
    """generate.py's path in a new process that imports only the (adopted) model module."""
    model = trained(lm_example_adopted.RNNModel)
    lm_example.save(model, str(tmp_path / "model.pt"))
    run_child(
        "import torch, lm_example, lm_example_adopted\n"
        f"model = lm_example.load({str(tmp_path / 'model.pt')!r}, lm_example_adopted.RNNModel)\n"
        "tokens, outputs = lm_example.generate(model, 12, seed=3)\n"
        "torch.save({'class': type(model.rnn).__module__, 'tokens': tokens, "
        f"'outputs': outputs}}, {str(tmp_path / 'out.pt')!r})\n"
    )
    got = torch.load(tmp_path / "out.pt")
    want_tokens, want_outputs = lm_example.generate(control_of(model), 12, seed=3)
    assert got["class"] == "lstmgrad.nn" and got["tokens"] == want_tokens
    close(got["outputs"], want_outputs, TOL)


def test_load_and_copies_let_torch_compile_trace_the_class(monkeypatch, tmp_path):
    """Instances made without __init__ (torch.load, copy.deepcopy, convert) get what the first
    construction sets up for torch.compile, and keep lstmgrad's own settings."""
    calls: list[int] = []
    monkeypatch.setattr(lstmgrad.nn, "_let_dynamo_trace_this_class", lambda: calls.append(1))
    lstm = lstmgrad.nn.convert(torch.nn.LSTM(I_SIZE, H_SIZE))
    assert calls == [1]
    lstm.recompute = 3
    torch.save(lstm, tmp_path / "lstm.pt")
    loaded = torch.load(tmp_path / "lstm.pt")  # weights_only: the class is allowed
    assert calls == [1, 1] and type(loaded) is LSTM and loaded.recompute == 3
    assert copy.deepcopy(loaded).recompute == 3 and calls == [1, 1, 1]


@pytest.fixture(scope="module")
def without_lstmgrad(tmp_path_factory):
    """Artifacts made here, used in a process where ``import lstmgrad`` fails: the example's
    model adopted in main.py (converted after it is built) and saved reverted, and not reverted;
    its state_dict; a model holding lstmgrad.nn.LSTM traced, scripted and exported."""
    art = tmp_path_factory.mktemp("without_lstmgrad")
    model = lstmgrad.nn.convert(trained(lm_example.RNNModel))
    lm_example.save(model, str(art / "converted.pt"))
    torch.save(model.state_dict(), art / "state_dict.pt")
    lm_example.save(lstmgrad.nn.revert(copy.deepcopy(model)), str(art / "reverted.pt"))
    case = DENSE[1]
    control, ours = pick("lstmgrad", case)
    torch.jit.trace(ours, case.inputs(0)).save(str(art / "traced.pt"))
    torch.export.save(torch.export.export(ours, case.inputs(0)), str(art / "exported.pt2"))
    torch.jit.script(ours).save(str(art / "scripted.pt"))  # last: it puts torch's LSTM in ours
    torch.save(case.inputs(1), art / "args.pt")
    run_child(
        "sys.modules['lstmgrad'] = None  # every import of lstmgrad fails\n"
        "import torch, lm_example\n"
        f"art = {str(art)!r}\n"
        "out = {}\n"
        "model = lm_example.load(art + '/reverted.pt', lm_example.RNNModel)\n"
        "out['reverted'] = (type(model.rnn).__module__, *lm_example.generate(model, 12, seed=3))\n"
        "try:\n"
        "    lm_example.load(art + '/converted.pt', lm_example.RNNModel)\n"
        "    out['converted'] = 'loaded'\n"
        "except Exception as exc:\n"
        "    out['converted'] = f'{type(exc).__name__}: {exc}'\n"
        "fresh = lm_example.RNNModel(50, 16, 24, 2, 0.2)\n"
        "fresh.load_state_dict(torch.load(art + '/state_dict.pt'))\n"
        "out['state_dict'] = lm_example.generate(fresh, 12, seed=3)\n"
        "args = torch.load(art + '/args.pt')\n"
        "out['traced'] = torch.jit.load(art + '/traced.pt')(*args)\n"
        "out['scripted'] = torch.jit.load(art + '/scripted.pt')(*args)\n"
        "out['exported'] = torch.export.load(art + '/exported.pt2').module()(*args)\n"
        "torch.save(out, art + '/out.pt')\n"
    )
    want = lm_example.generate(control_of(model), 12, seed=3)
    with torch.no_grad():
        want_tagger = control(*case.inputs(1))
    return torch.load(art / "out.pt"), want, want_tagger


def test_a_reverted_checkpoint_loads_without_lstmgrad(without_lstmgrad):
    got, (want_tokens, want_outputs), _ = without_lstmgrad
    module, tokens, outputs = got["reverted"]
    assert module == "torch.nn.modules.rnn" and tokens == want_tokens
    close(outputs, want_outputs, TOL)


def test_a_converted_checkpoint_needs_lstmgrad(without_lstmgrad):
    got, _, _ = without_lstmgrad
    assert got["converted"].startswith("UnpicklingError")
    assert "lstmgrad.nn.LSTM" in got["converted"]


def test_a_state_dict_loads_without_lstmgrad(without_lstmgrad):
    got, (want_tokens, want_outputs), _ = without_lstmgrad
    tokens, outputs = got["state_dict"]
    assert tokens == want_tokens
    close(outputs, want_outputs, TOL)


@pytest.mark.parametrize("artifact", ["traced", "scripted", "exported"])
def test_traced_scripted_exported_run_without_lstmgrad(without_lstmgrad, artifact):
    got, _, want = without_lstmgrad
    close(got[artifact], want, TOL)


# ---------------------------------------------------------------------------------------------
# TorchScript


@pytest.mark.parametrize("case", [DENSE[1], PACKED[1]], ids=lambda c: c.id)
@pytest.mark.parametrize("column", COLUMNS)
def test_jit_trace_records_torchs_lstm(column, case, engine_calls):
    control, model = pick(column, case)
    traced = torch.jit.trace(model, case.inputs(0))  # its check re-runs the eager model
    assert "aten::lstm" in op_kinds(traced.inlined_graph)
    assert not any(k.startswith("lstmgrad::") for k in op_kinds(traced.inlined_graph))
    engine_calls.clear()
    close(traced(*case.inputs(1)), control(*case.inputs(1)), TOL)
    assert not engine_calls


@pytest.mark.parametrize("case", [DENSE[1], PACKED[1]], ids=lambda c: c.id)
@pytest.mark.parametrize("column", COLUMNS)
def test_jit_script_compiles_torchs_lstm(column, case, engine_calls):
    control, model = pick(column, case)
    scripted = torch.jit.script(model)
    assert "aten::lstm" in op_kinds(scripted.inlined_graph)
    engine_calls.clear()
    close(scripted(*case.inputs(1)), control(*case.inputs(1)), TOL)
    assert not engine_calls


def test_jit_script_leaves_torchs_lstm_in_the_model_and_convert_undoes_it(engine_calls):
    """PyTorch writes what __prepare_scriptable__ returns into the scripted model: its eager
    copy then holds a torch.nn.LSTM on the same Parameters (documented); a root LSTM stays."""
    _, model = pick("lstmgrad", DENSE[1])
    params = list(model.parameters())
    torch.jit.script(model)
    assert type(model.rnn) is torch.nn.LSTM
    assert all(p is q for p, q in zip(model.parameters(), params, strict=True))
    lstmgrad.nn.convert(model)
    engine_calls.clear()
    model(*DENSE[1].inputs(1))
    assert type(model.rnn) is LSTM and engine_calls
    root = LSTM(I_SIZE, H_SIZE)
    torch.jit.script(root)
    assert type(root) is LSTM


# ---------------------------------------------------------------------------------------------
# ONNX

ONNX_CASES = [
    pytest.param(dynamo, case, id=f"dynamo={dynamo}-{case.id}")
    for dynamo in (False, True)
    for case in CASES
    if not (dynamo and case.packed)  # torch.export refuses packed input, torch's too: below
]


@pytest.mark.parametrize("dynamo,case", ONNX_CASES)
@pytest.mark.parametrize("column", COLUMNS)
def test_onnx_export_runs_in_onnxruntime(column, dynamo, case, tmp_path):
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    if dynamo:
        pytest.importorskip("onnxscript")
    control, model = pick(column, case)
    path = str(tmp_path / "model.onnx")
    torch.onnx.export(model, case.inputs(0), path, dynamo=dynamo)
    nodes = onnx.load(path).graph.node
    assert "LSTM" in {n.op_type for n in nodes}
    assert {n.domain for n in nodes} <= {"", "ai.onnx"}  # standard operators only
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    args = case.inputs(1)
    feeds = {i.name: a.numpy() for i, a in zip(session.get_inputs(), args, strict=True)}
    got = session.run(None, feeds)
    with torch.no_grad():
        close([torch.from_numpy(a) for a in got], control(*args), TOL)


@pytest.mark.parametrize("case", PACKED, ids=lambda c: c.id)
def test_onnx_dynamo_exporter_refuses_packed_input_for_torch_too(case, tmp_path):
    pytest.importorskip("onnxscript")
    control, ours = pick("lstmgrad", case)
    reasons = [
        failure(lambda m=m: torch.onnx.export(m, case.inputs(0), str(tmp_path / "m.onnx")))
        for m in (control, ours)
    ]
    assert reasons[0] == reasons[1] == "TorchExportError"


# ---------------------------------------------------------------------------------------------
# torch.export


def call_targets(ep: Any) -> set[Any]:
    return {n.target for n in ep.graph.nodes if n.op == "call_function"}


def is_aten(target: Any) -> bool:
    return target is operator.getitem or (
        isinstance(target, torch._ops.OpOverload) and target.namespace == "aten"
    )


@pytest.mark.parametrize("column", COLUMNS)
def test_torch_export_runs_decomposes_to_aten_and_compiles(column, engine_calls):
    case = DENSE[1]
    control, model = pick(column, case)
    args = case.inputs(1)
    with torch.no_grad():
        want = control(*args)
    ep = torch.export.export(model, case.inputs(0))
    assert torch.ops.aten.lstm.input in call_targets(ep)  # torch's LSTM, recorded whole
    close(ep.module()(*args), want, TOL)
    decomposed = ep.run_decompositions()
    assert all(is_aten(t) for t in call_targets(decomposed))
    assert torch.ops.aten.lstm.input not in call_targets(decomposed)
    close(decomposed.module()(*args), want, TOL)
    compiled = torch.compile(decomposed.module(), backend="aot_eager", fullgraph=True)
    close(compiled(*args), want, TOL)
    assert not engine_calls


def test_torch_compile_of_an_undecomposed_export_fails_for_torch_too():
    """torch 2.13 cannot compile ``ep.module()`` holding aten.lstm (compile the decomposed
    program instead, as above): the same failure with either LSTM."""
    case = DENSE[0]
    reasons = []
    for column in COLUMNS:
        _, model = pick(column, case)
        module = torch.export.export(model, case.inputs(0)).module()
        compiled = torch.compile(module, backend="aot_eager", fullgraph=True)
        reasons.append(failure(lambda c=compiled: c(*case.inputs(1))))
    assert reasons[0] == reasons[1] != "no failure"


def test_torch_export_refuses_packed_input_for_torch_too():
    control, ours = pick("lstmgrad", PACKED[0])
    reasons = [
        failure(lambda m=m: torch.export.export(m, PACKED[0].inputs(0))) for m in (control, ours)
    ]
    assert reasons[0] == reasons[1] != "no failure"


@pytest.mark.slow
@pytest.mark.parametrize("column", COLUMNS)
def test_torch_export_then_inductor(column):
    case = DENSE[1]
    control, model = pick(column, case)
    decomposed = torch.export.export(model, case.inputs(0)).run_decompositions()
    with torch.no_grad():
        close(torch.compile(decomposed.module())(*case.inputs(1)), control(*case.inputs(1)), TOL)
