"""`lstmgrad check` on msProbe dumps written by tests/msprobe_writer.py from msProbe's documented
schema (not by lstmgrad): correct devices pass, one perturbed element in any output is found and
located, float16 rounding passes, and every broken dump ends in a named reason with the right
exit status. The device here is torch.nn.LSTM on the CPU, an implementation independent of
lstmgrad's engines."""

from __future__ import annotations

import csv
import json
import pathlib
from typing import Any

import numpy as np
import pytest
import torch
from torch.nn.utils.rnn import pack_padded_sequence

from lstmgrad.tools import metrics
from lstmgrad.tools.cli import main
from lstmgrad.tools.msprobe import check_dump
from lstmgrad.tools.report import exit_status, summary
from msprobe_writer import (
    MsprobeDump,
    add_npu_lstm,
    make_npu_tensor_file,
    record_lstm,
    record_lstm_rounded,
)


def _lstm(I=5, H=6, L=1, bidir=False, bias=True, batch_first=False, dtype=torch.float32,
          seed=0, dropout=0.0) -> torch.nn.LSTM:  # fmt: skip
    torch.manual_seed(seed)
    return torch.nn.LSTM(I, H, num_layers=L, bidirectional=bidir, bias=bias,
                         batch_first=batch_first, dropout=dropout).to(dtype)  # fmt: skip


def _x(shape: tuple[int, ...], dtype=torch.float32, seed=1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g, dtype=torch.float64).to(dtype).requires_grad_()


def _write(
    path: pathlib.Path, lstm: torch.nn.LSTM, *args: Any, level: str = "L1", **kwargs: Any
) -> None:
    """A dump at ``level`` of one call of ``lstm`` (record_lstm's arguments) under ``path``."""
    d = MsprobeDump(path, level=level)
    record_lstm(d, lstm, *args, **kwargs)
    d.write()


def _calls(reports: list[Any]) -> dict[str, Any]:
    return {r.name: r for r in reports}


def _judged(rep: Any) -> dict[str, Any]:
    return {r.label: r for r in rep.rows if r.status in ("pass", "warning", "error")}


# --------------------------------------------------------------------------- correct devices

CORRECT = {
    "T5-B3-I5-H6-L1-D1": dict(),
    "T5-B3-I5-H6-L2-D2": dict(L=2, bidir=True),
    "T5-B3-I5-H6-L2-D1-nobias": dict(L=2, bias=False),
    "T4-B1-I3-H7-L1-D2-batchfirst": dict(I=3, H=7, bidir=True, batch_first=True, T=4, B=1),
    "T1-B2-I4-H3-L1-D1": dict(I=4, H=3, T=1, B=2),
}


@pytest.mark.parametrize("level", ["L1", "L0", "mix"])
@pytest.mark.parametrize("cfg", list(CORRECT.values()), ids=list(CORRECT))
def test_dense_correct_device_passes(tmp_path: pathlib.Path, cfg: dict[str, Any],
                                     level: str) -> None:  # fmt: skip
    cfg = dict(cfg)
    T, B = cfg.pop("T", 5), cfg.pop("B", 3)
    lstm = _lstm(**cfg)
    shape = (B, T, lstm.input_size) if lstm.batch_first else (T, B, lstm.input_size)
    _write(tmp_path, lstm, _x(shape), level=level)
    reports = check_dump(tmp_path, no_dropout=True)
    assert reports and all(r.verdict == "passed" for r in reports), summary(reports)
    assert exit_status(reports) == 0
    for rep in reports:
        judged = _judged(rep)
        assert {"y", "h_n", "c_n", "dx"} <= set(judged), (rep.name, [r.label for r in rep.rows])
        if rep.name.startswith("Module"):
            names = {n for n, _ in lstm.named_parameters()}
            assert names <= set(judged)  # parameters_grad judged by name
        for r in judged.values():  # lstmgrad's fused engine stays well inside its own bound
            assert r.fused_bound_max < 0.5, (rep.name, r.label, r.fused_bound_max)


@pytest.mark.parametrize("level", ["L1", "L0"])
@pytest.mark.parametrize("bidir", [False, True])
def test_packed_correct_device_passes(tmp_path: pathlib.Path, level: str, bidir: bool) -> None:
    lstm = _lstm(L=2, bidir=bidir)
    x = _x((6, 4, 5))
    # enforce_sorted=False: the module sorts the batch and unsorts h_n, c_n and the gradients
    packed = pack_padded_sequence(x, torch.tensor([3, 6, 1, 4]), enforce_sorted=False)
    hx = (_x((2 * (1 + bidir), 4, 6), seed=2), _x((2 * (1 + bidir), 4, 6), seed=3))
    _write(tmp_path, lstm, packed, hx, level=level)
    reports = check_dump(tmp_path, no_dropout=True)
    assert [r.verdict for r in reports] == ["passed"], summary(reports)
    judged = _judged(reports[0])
    assert {"y", "h_n", "c_n", "dx"} <= set(judged)
    if level == "L0":
        assert {"dh0", "dc0", "weight_ih_l1"} <= set(judged)
    assert "packed" in reports[0].kind


def test_float16_rounding_passes_and_fp16_device_is_judged_in_float16(tmp_path):
    lstm = _lstm(I=8, H=16, L=2, bidir=True)
    d = MsprobeDump(tmp_path, level="mix")
    record_lstm_rounded(d, lstm, _x((7, 4, 8)), dtype=torch.float16)
    d.write()
    reports = check_dump(tmp_path, no_dropout=True)
    assert all(r.verdict == "passed" for r in reports), summary(reports)
    assert {r.dtype for r in reports} == {"float16"}
    for r in _judged(reports[0]).values():  # exactly the rounded reference: never worse
        assert r.status == metrics.PASS, (r.label, r.ratios)


def test_bfloat16_dump(tmp_path):
    lstm = _lstm(I=8, H=16)
    d = MsprobeDump(tmp_path, level="L1")
    record_lstm_rounded(d, lstm, _x((5, 3, 8)), dtype=torch.bfloat16)
    d.write()
    reports = check_dump(tmp_path)
    assert [r.verdict for r in reports] == ["passed"], summary(reports)
    assert reports[0].dtype == "bfloat16"


def test_float16_device_with_a_real_error_fails(tmp_path):
    lstm = _lstm(I=8, H=16)
    d = MsprobeDump(tmp_path, level="L1")

    def wrong(name, key, t):
        if name.endswith("forward") and key == (0,):  # y: one element 5% off
            t = t.clone()
            t.view(-1)[int(t.abs().argmax())] *= 1.05
        return t

    record_lstm_rounded(d, lstm, _x((5, 3, 8)), dtype=torch.float16, perturb=wrong)
    d.write()
    reports = check_dump(tmp_path)
    assert reports[0].verdict == "failed"
    assert [r.label for r in reports[0].rows if r.failed] == ["y"]


# --------------------------------------------------------------------------- one wrong element


def _perturber(target: tuple[str, tuple[Any, ...]], hit: dict[str, Any], factor=1.001):
    """Multiply the largest element of one output by ``factor``; remember its index."""

    def perturb(name: str, key: tuple[Any, ...], t: torch.Tensor) -> torch.Tensor:
        if name == target[0] and tuple(key) == target[1]:
            t = t.clone()
            flat = int(t.abs().argmax())
            t.view(-1)[flat] *= factor
            hit["index"] = tuple(int(v) for v in np.unravel_index(flat, t.shape))
        return t

    return perturb


PERTURBED = {
    "y": ("VF.lstm.0.forward", (0,), "L1"),
    "h_n": ("VF.lstm.0.forward", (1,), "L1"),
    "c_n": ("VF.lstm.0.forward", (2,), "L1"),
    "dx": ("VF.lstm.0.backward", (0,), "L1"),
    "module-h_n": ("Module.lstm.LSTM.forward.0", (1, 0), "L0"),
    "module-dh0": ("Module.lstm.LSTM.backward.0", (1, 0), "L0"),
    "module-dc0": ("Module.lstm.LSTM.backward.0", (1, 1), "L0"),
    "weight_hh_l1_reverse": ("Module.lstm.LSTM.parameters_grad", ("weight_hh_l1_reverse",), "L0"),
    "bias_ih_l0": ("Module.lstm.LSTM.parameters_grad", ("bias_ih_l0",), "L0"),
}


@pytest.mark.parametrize("rule", ["msprobe", "bound"])
@pytest.mark.parametrize("which", list(PERTURBED))
def test_one_perturbed_element_is_found_and_located(tmp_path, which: str, rule: str) -> None:
    entry, key, level = PERTURBED[which]
    lstm = _lstm(I=5, H=6, L=2, bidir=True)
    hx = (_x((4, 3, 6), seed=2), _x((4, 3, 6), seed=3))
    hit: dict[str, Any] = {}
    _write(tmp_path, lstm, _x((5, 3, 5)), hx, perturb=_perturber((entry, key), hit), level=level)
    reports = check_dump(tmp_path, rule=rule)  # no --no-dropout: one element is no dropout
    assert exit_status(reports) == 1
    (rep,) = reports
    failed = [r for r in rep.rows if r.failed]
    label = which.split("-")[-1]
    if rule == "bound":  # the bound names the perturbed output alone
        assert [r.label for r in failed] == [label], [(r.label, r.status) for r in rep.rows]
    row = next(r for r in failed if r.label == label)
    assert row.key.endswith(".".join(str(k) for k in key))
    where = row.worst[0][2]
    assert where.startswith("[" + ", ".join(map(str, hit["index"])) + "]"), where


# --------------------------------------------------------------------------- what real dumps hold


def test_training_with_dropout_judges_layer0_and_says_why(tmp_path):
    lstm = _lstm(L=3, dropout=0.3)
    lstm.train()
    _write(tmp_path, lstm, _x((5, 3, 5)))
    (rep,) = check_dump(tmp_path)
    judged = _judged(rep)
    assert set(judged) == {"h_n", "c_n"} and all(r.shape[0] == 1 for r in judged.values())
    unjudged = {r.label for r in rep.rows if r.status == "unjudged"}
    assert unjudged == {"y", "dx"}
    assert any("dropout masks are not in the dump" in n for n in rep.notes)
    assert rep.verdict == "passed"


def test_module_without_dropout_is_judged_whole(tmp_path):
    _write(tmp_path, _lstm(L=2), _x((5, 3, 5)), level="L0")
    (rep,) = check_dump(tmp_path)
    assert rep.verdict == "passed"
    assert {"y", "h_n", "c_n", "dx", "weight_ih_l1"} <= set(_judged(rep))
    assert all(r.status != "undecided" for r in rep.rows)


def test_module_trained_with_dropout_is_undecided_above_layer0(tmp_path):
    lstm = _lstm(L=2, dropout=0.5)
    lstm.train()
    _write(tmp_path, lstm, _x((5, 3, 5)), level="L0")
    (rep,) = check_dump(tmp_path)
    undecided = {r.label for r in rep.rows if r.status == "undecided"}
    assert {"y", "h_n", "c_n", "dx", "weight_ih_l1"} <= undecided
    layer0 = [r for r in rep.rows if r.key.endswith("(layer 0 rows)")]
    assert {r.label for r in layer0} == {"h_n", "c_n"} and not any(r.failed for r in layer0)
    assert rep.verdict == "undecided" and exit_status([rep]) == 2
    assert "--no-dropout" in summary([rep]) and "--no-dropout" in " ".join(rep.notes)
    (rep,) = check_dump(tmp_path, no_dropout=True)  # the user says there was none: a failure
    assert rep.verdict == "failed"


def test_module_batch_first_cannot_be_told_when_T_equals_B(tmp_path):
    lstm = _lstm(batch_first=True)
    _write(tmp_path, lstm, _x((4, 4, 5)), level="L0")
    (rep,) = check_dump(tmp_path)
    assert rep.verdict == "skipped" and "T == B" in rep.skipped
    assert exit_status([rep]) == 2  # nothing checked


def test_statistics_only_dump_is_skipped_with_the_reason(tmp_path):
    d = MsprobeDump(tmp_path, task="statistics", level="L1")
    record_lstm(d, _lstm(), _x((5, 3, 5)))
    d.write()
    reports = check_dump(tmp_path)
    assert [r.verdict for r in reports] == ["skipped"]
    assert "task 'tensor'" in reports[0].skipped
    assert exit_status(reports) == 2


@pytest.mark.parametrize("wrong", [False, True])
def test_outputs_without_files_are_judged_by_their_statistics(tmp_path, wrong: bool):
    def skip(name: str, kind: str, key: Any) -> bool:
        return name == "VF.lstm.0.forward" and kind == "output"

    hit: dict[str, Any] = {}
    perturb = _perturber(("VF.lstm.0.forward", (0,)), hit, 1.01) if wrong else None
    d = MsprobeDump(tmp_path, level="L1", skip_files=skip)
    record_lstm(d, _lstm(), _x((5, 3, 5)), perturb=perturb)
    d.write()
    (rep,) = check_dump(tmp_path)
    rows = {r.label: r for r in rep.rows}
    assert {s for s, *_ in rows["y"].stats} == {"Max", "Min", "Mean", "Norm"}
    assert "missing" in rows["y"].note and "Max/Min/Mean/Norm" in rows["y"].note
    assert rows["dx"].status in ("pass", "warning")
    if wrong:  # the largest element 1% off moves Max (or Min) and Norm beyond their tolerance
        assert rows["y"].status == "error" and rep.verdict == "failed"
    else:  # the files should be there: judged by statistics only, so not fully checked
        assert rows["y"].status == "unreadable" and rep.verdict == "unreadable"
        assert exit_status([rep]) == 2


def test_npu_tensors_missing_files_null_entries_and_npu_lstm(tmp_path):
    d = MsprobeDump(tmp_path, level="L1")
    lstm = _lstm()
    for seed in range(3):
        record_lstm(d, lstm, _x((5, 3, 5), seed=seed))
    add_npu_lstm(d)
    d.data["VF.lstm.2.forward"]["output"][1] = None  # h_n not recorded
    folder = d.write()
    data_dir = folder / "dump_tensor_data"
    make_npu_tensor_file(data_dir / "VF.lstm.0.forward.input.0.pt", torch.zeros(5, 3, 5))
    (data_dir / "VF.lstm.1.forward.input.2.1.pt").unlink()
    reports = _calls(check_dump(tmp_path))
    assert "torch_npu" in reports["VF.lstm.0.forward"].unreadable
    assert "VF.lstm.1.forward.input.2.1" in reports["VF.lstm.1.forward"].unreadable
    assert "missing" in reports["VF.lstm.1.forward"].unreadable
    rep2 = reports["VF.lstm.2.forward"]
    assert rep2.verdict == "passed" and "h_n" not in _judged(rep2)
    assert any("null" in n for n in rep2.notes)
    assert reports["NPU.npu_lstm.0.forward"].verdict == "skipped"
    assert "argument layout" in reports["NPU.npu_lstm.0.forward"].skipped
    line = summary(list(reports.values()))
    assert line.startswith("LSTM calls: 4 found, 1 checked (1 passed, 0 failed)"), line
    assert "1 skipped" in line and "2 could not be checked" in line
    assert exit_status(list(reports.values())) == 2


def test_every_rank_and_step_is_checked_and_a_bad_dump_json_reported(tmp_path):
    for step in (0, 1):
        for rank in (0, 1):
            d = MsprobeDump(tmp_path, level="L1", step=step, rank=rank)
            record_lstm(d, _lstm(seed=rank), _x((4, 2, 5), seed=step))
            d.write()
    reports = check_dump(tmp_path)
    assert [r.source for r in reports] == [f"step{s}/rank{r}/dump.json" for s in (0, 1)
                                           for r in (0, 1)]  # fmt: skip
    assert exit_status(reports) == 0
    assert len(check_dump(tmp_path / "step1")) == 2
    assert len(check_dump(tmp_path / "step1" / "rank0" / "dump.json")) == 1
    (tmp_path / "step1" / "rank1" / "dump.json").write_text("{not json")
    reports = check_dump(tmp_path)
    assert [r.verdict for r in reports].count("passed") == 3
    assert "not readable as JSON" in reports[-1].unreadable and exit_status(reports) == 2


def test_older_npy_tensor_files(tmp_path):
    d = MsprobeDump(tmp_path, level="L1", npy=True)
    record_lstm(d, _lstm(bidir=True), _x((5, 3, 5)))
    d.write()
    assert [r.verdict for r in check_dump(tmp_path)] == ["passed"]


def test_backward_entry_with_an_unexpected_layout_is_not_guessed(tmp_path):
    d = MsprobeDump(tmp_path, level="L1")
    record_lstm(d, _lstm(), _x((5, 3, 5)))
    back = d.data["VF.lstm.0.backward"]
    back["input"] = [back["input"][1], back["input"][0]]  # h_n's gradient where y's belongs
    d.write()
    (rep,) = check_dump(tmp_path)
    assert any("layout is not the one expected" in n for n in rep.notes), rep.notes
    assert "dx" not in _judged(rep) and rep.verdict == "passed"


def test_backward_only_entry_is_listed(tmp_path):
    d = MsprobeDump(tmp_path, level="L1")
    record_lstm(d, _lstm(), _x((5, 3, 5)))
    del d.data["VF.lstm.0.forward"]
    d.write()
    (rep,) = check_dump(tmp_path)
    assert rep.verdict == "skipped" and "forward entry" in rep.skipped


# --------------------------------------------------------------------------- the command


@pytest.fixture
def perturbed_dump(tmp_path: pathlib.Path) -> pathlib.Path:
    d = MsprobeDump(tmp_path / "dump", level="L1")
    lstm = _lstm(L=2, bidir=True)
    record_lstm(d, lstm, _x((5, 3, 5)))
    record_lstm(d, lstm, _x((5, 3, 5), seed=4),
                perturb=_perturber(("VF.lstm.1.forward", (0,)), {}))  # fmt: skip
    add_npu_lstm(d)
    d.write()
    return tmp_path / "dump"


def test_cli_table_csv_json_and_exit_status(perturbed_dump, tmp_path, capsys):
    out_csv, out_json = tmp_path / "r.csv", tmp_path / "r.json"
    rc = main(["check", str(perturbed_dump), "--csv", str(out_csv), "--json", str(out_json)])
    out = capsys.readouterr().out
    assert rc == 1
    assert "VF.lstm.1.forward" in out and "FAIL" in out and "largest error" in out
    assert "LSTM calls: 3 found, 2 checked (1 passed, 1 failed), 1 skipped" in out
    rows = list(csv.DictReader(out_csv.open()))
    keys = [r["NPU Name"] for r in rows]
    assert "VF.lstm.1.forward.output.0" in keys and "NPU.npu_lstm.0.forward" in keys
    bad = [r for r in rows if r["Accuracy Reached or Not"] == "No"]
    assert [r["NPU Name"] for r in bad] == ["VF.lstm.1.forward.output.0"]
    # one element 0.1% off: its relative error is 16 times msProbe's float32 floor, 2^-14
    assert float(bad[0]["Max Rel Err Ratio"]) > 10 and float(bad[0]["Cosine"]) > 0.99
    doc = json.loads(out_json.read_text())
    assert doc["exit_status"] == 1 and len(doc["calls"]) == 3
    assert main(["check", str(perturbed_dump), "--rule", "bound", "--factor", "1e6"]) == 0


@pytest.mark.parametrize("argv, message", [
    (["--factor", "nan"], "finite number above 0"),
    (["--factor", "0"], "finite number above 0"),
    (["--factor", "-3"], "finite number above 0"),
    (["--top", "0"], "at least 1"),
    (["--rule", "rtol"], "lstmgrad.dump files only"),
])  # fmt: skip
def test_cli_rejects_bad_options(perturbed_dump, capsys, argv, message):
    with pytest.raises(SystemExit) if "rtol" not in argv else _no_raise():
        rc = main(["check", str(perturbed_dump), *argv])
        assert rc == 2
    assert message in capsys.readouterr().err


class _no_raise:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> bool:
        return False


def test_cli_no_dump_here(tmp_path, capsys):
    assert main(["check", str(tmp_path)]) == 2
    assert "no dump.json" in capsys.readouterr().err


# --------------------------------------------------------------------------- kernel-level route


def _sig(v: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-v))


def _formula_forward(x, params, h0, c0, L, D):
    """The LSTM forward written from its formulas (float64, time-major), with the seven saved
    lists per (layer, direction) k = layer * D + direction."""
    T = x.shape[0]
    per = len(params) // (L * D)
    saved: dict[str, list[np.ndarray]] = {n: [] for n in "i g f o h c tanhc".split()}
    inp = x
    for layer in range(L):
        outs = []
        for d in range(D):
            k = layer * D + d
            w_ih, w_hh = params[k * per], params[k * per + 1]
            b = params[k * per + 2] + params[k * per + 3] if per == 4 else 0.0
            H = w_hh.shape[1]
            h, c = h0[k], c0[k]
            rec = {n: np.zeros((T, h.shape[0], H)) for n in saved}
            for t in range(T) if d == 0 else range(T - 1, -1, -1):
                gates = inp[t] @ w_ih.T + h @ w_hh.T + b
                i, f = _sig(gates[:, :H]), _sig(gates[:, H : 2 * H])
                g, o = np.tanh(gates[:, 2 * H : 3 * H]), _sig(gates[:, 3 * H :])
                c = f * c + i * g
                h = o * np.tanh(c)
                for n, v in zip(rec, (i, g, f, o, h, c, np.tanh(c)), strict=True):
                    rec[n][t] = v
            for n in saved:
                saved[n].append(rec[n])
            outs.append(rec["h"])
        inp = np.concatenate(outs, axis=-1)
    return inp, saved


def _kernel_dump(folder: pathlib.Path, kind: str, L=2, D=2, bias=True, perturb=None,
                 stacked=False) -> None:  # fmt: skip
    """aclnnLstmBackward / aclnnLSTM arguments as msprobe parse -t npy writes them (float32),
    from the formulas (saved lists) and torch autograd in float64 (results)."""
    lstm = _lstm(I=5, H=6, L=L, bidir=D == 2, bias=bias).double()
    x = _x((4, 3, 5)).detach().double().requires_grad_()
    h0, c0 = (_x((L * D, 3, 6), seed=s).detach().double().requires_grad_() for s in (2, 3))
    params = list(lstm._flat_weights)
    y, (hn, cn) = lstm(x, (h0, c0))
    dy, dh, dc = (_x(t.shape, seed=9 + s).detach().double() for s, t in enumerate((y, hn, cn)))
    grads = torch.autograd.grad((y, hn, cn), (x, h0, c0, *params), (dy, dh, dc))
    as_np = [t.detach().numpy() for t in (x, h0, c0, *params)]
    y_f, saved = _formula_forward(as_np[0], as_np[3:], as_np[1], as_np[2], L, D)
    np.testing.assert_allclose(y_f, y.detach().numpy(), atol=1e-12)  # the two oracles agree
    lists = [a for n in saved for a in saved[n]]
    if stacked:  # one [L*D, T, B, H] file per saved list
        lists = [np.stack(saved[n]) for n in saved]
    if kind == "backward":
        ins = [*as_np, dy.numpy(), dh.numpy(), dc.numpy(), *lists]
        outs = [g.numpy() for g in grads]
    else:  # aclnnLSTM: input, params, hx
        ins = [as_np[0], *as_np[3:], as_np[1], as_np[2]]
        outs = [y.detach().numpy(), hn.detach().numpy(), cn.detach().numpy(), *lists]
    if perturb is not None:
        outs[perturb] = outs[perturb].copy()
        outs[perturb].flat[int(np.abs(outs[perturb]).argmax())] *= 1.001
    folder.mkdir()
    op = "LstmGrad" if kind == "backward" else "LSTM"
    for what, arrays in (("input", ins), ("output", outs)):
        for i, a in enumerate(arrays):
            np.save(folder / f"{op}.{op}_1.12.0.1700000000.{what}.{i}.npy", a.astype(np.float32))


@pytest.mark.parametrize("kind", ["backward", "forward"])
@pytest.mark.parametrize("L, D, bias", [(1, 1, True), (2, 2, True), (2, 1, False)])
def test_kernel_level_files(tmp_path, kind: str, L: int, D: int, bias: bool) -> None:
    _kernel_dump(tmp_path / "ok", kind, L, D, bias)
    assert main(["check", str(tmp_path / "ok"), f"--aclnn-{kind}"]) == 0
    n_out = 3 + L * D * (4 if bias else 2) if kind == "backward" else 3 + 7 * L * D
    _kernel_dump(tmp_path / "bad", kind, L, D, bias, perturb=n_out - 1)
    from lstmgrad.tools.msprobe import KernelConfig, check_kernel

    (rep,) = check_kernel(tmp_path / "bad", kind, KernelConfig())
    assert rep.verdict == "failed"
    assert [r.key for r in rep.rows if r.failed] == [f"{rep.name}.output.{n_out - 1}"]


@pytest.mark.parametrize("kind", ["backward", "forward"])
def test_kernel_level_stacked_saved_lists(tmp_path, kind: str) -> None:
    _kernel_dump(tmp_path / "ok", kind, stacked=True)
    assert main(["check", str(tmp_path / "ok"), f"--aclnn-{kind}"]) == 0
    if kind == "forward":  # the last stacked list (tanhc) with one wrong element
        _kernel_dump(tmp_path / "bad", kind, stacked=True, perturb=9)
        from lstmgrad.tools.msprobe import KernelConfig, check_kernel

        (rep,) = check_kernel(tmp_path / "bad", kind, KernelConfig())
        assert [r.label for r in rep.rows if r.failed] == ["tanhc.3"]


def test_kernel_level_ambiguous_configuration_asks_for_flags(tmp_path, capsys):
    # I == H and L * D == 2: one layer both ways, or two layers one way
    folder = tmp_path / "k"
    folder.mkdir()
    rng = np.random.default_rng(0)
    shapes = [(4, 3, 6)] + [(24, 6), (24, 6), (24,), (24,)] * 2 + [(2, 3, 6), (2, 3, 6)]
    for i, s in enumerate(shapes):
        np.save(folder / f"LSTM.x.input.{i}.npy", rng.standard_normal(s).astype(np.float32))
    for i, s in enumerate([(4, 3, 6), (2, 3, 6), (2, 3, 6)]):
        np.save(folder / f"LSTM.x.output.{i}.npy", rng.standard_normal(s).astype(np.float32))
    assert main(["check", str(folder), "--aclnn-forward"]) == 2
    assert "give --num-layers and --bidirectional" in capsys.readouterr().out


# --------------------------------------------------------------------------- a real msProbe dump

REAL = pathlib.Path(__file__).parent / "data" / "msprobe-26.2.0-cpu"


def test_a_dump_written_by_msprobe_itself_is_read_and_passes():
    reports = _calls(check_dump(REAL, no_dropout=True))
    assert sorted(reports) == ["Module.lstm.LSTM.forward.0", "Module.packed.LSTM.forward.0"]
    assert all(r.verdict == "passed" for r in reports.values()), summary(list(reports.values()))
    params = {f"{k}_{w}_l{layer}{s}" for k in ("weight", "bias") for w in ("ih", "hh")
              for layer in (0, 1) for s in ("", "_reverse")}  # fmt: skip
    assert set(_judged(reports["Module.lstm.LSTM.forward.0"])) == {"y", "h_n", "c_n", "dx"} | params
    packed = _judged(reports["Module.packed.LSTM.forward.0"])
    assert set(packed) == {"y", "h_n", "c_n", "dx", "weight_ih_l0", "weight_hh_l0",
                           "bias_ih_l0", "bias_hh_l0"}  # fmt: skip


def test_a_real_dump_with_one_wrong_gradient_element_fails(tmp_path):
    import shutil

    shutil.copytree(REAL, tmp_path / "d")
    (f,) = (tmp_path / "d").rglob("Module.packed.LSTM.parameters_grad.0.weight_hh_l0.pt")
    t = torch.load(f, weights_only=True)
    t[5, 2] += 1e-3 * t.abs().max()
    torch.save(t, f)
    reports = _calls(check_dump(tmp_path / "d", no_dropout=True))
    rep = reports["Module.packed.LSTM.forward.0"]
    assert [r.label for r in rep.rows if r.failed] == ["weight_hh_l0"]
    assert next(r for r in rep.rows if r.failed).worst[0][2].startswith("[5, 2]")
    assert reports["Module.lstm.LSTM.forward.0"].verdict == "passed"


# --------------------------------------------------------------------------- lstmgrad.dump files


def _npz_dump(path: pathlib.Path) -> pathlib.Path:
    import lstmgrad

    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 2, 4)).astype(np.float32)
    params = [0.3 * rng.standard_normal(s).astype(np.float32)
              for s in [(20, 4), (20, 5), (20,), (20,)]]  # fmt: skip
    fwd = lstmgrad.lstm_forward(x, params)
    dy = rng.standard_normal(fwd.output.shape).astype(np.float32)
    hx = [np.zeros((1, 2, 5), np.float32)] * 2
    grads = lstmgrad.lstm_backward(x, hx, params, dy, None, None, *fwd.saved[:7])
    return lstmgrad.dump(path, x, hx, params, dy, None, None, *fwd.saved[:7], outputs=grads)


def test_lstmgrad_dump_file_messages(tmp_path, capsys):
    text = tmp_path / "notes.npz"
    text.write_text("not an archive\n")
    assert main(["check", str(text)]) == 2
    err = capsys.readouterr().err
    assert "not a .npz archive" in err and "pickle" not in err
    good = _npz_dump(tmp_path / "d.npz")
    assert main(["check", str(good)]) == 0
    keys = dict(np.load(good))
    keys["dy"] = keys["dy"][:, :, :2]
    with open(tmp_path / "bad.npz", "wb") as fh:
        np.savez(fh, **keys)
    assert main(["check", str(tmp_path / "bad.npz")]) == 2
    err = capsys.readouterr().err
    assert "key 'dy'" in err and err.count("bad dump") == 1, err
    for argv in (["--factor", "nan"], ["--top", "0"]):
        with pytest.raises(SystemExit):
            main(["check", str(good), *argv])
    assert main(["check", str(good), "--csv", str(tmp_path / "x.csv")]) == 2
    assert "apply to msProbe and kernel dumps" in capsys.readouterr().err


def test_check_measures_no_plans_and_leaves_the_environment_alone(perturbed_dump, monkeypatch):
    import os

    from lstmgrad.planning import plan

    monkeypatch.delenv("LSTMGRAD_TUNE", raising=False)
    seen = []
    real_mode = plan.mode
    monkeypatch.setattr(plan, "mode", lambda: seen.append(real_mode()) or seen[-1])
    assert main(["check", str(perturbed_dump)]) == 1
    assert seen and set(seen) == {"cached"}
    assert "LSTMGRAD_TUNE" not in os.environ


def test_a_bfloat16_batch_first_dump_written_by_msprobe_passes():
    (rep,) = check_dump(REAL.parent / "msprobe-26.2.0-cpu-bfloat16")
    assert rep.dtype == "bfloat16" and "batch_first" in rep.dims and rep.verdict == "passed"
    assert len(_judged(rep)) == 20  # y, h_n, c_n, dx and 16 parameter gradients
