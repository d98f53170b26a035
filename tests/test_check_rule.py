"""`lstmgrad check --rule msprobe` read as msProbe's benchmark standard defines it: small values
judged by absolute error, relative errors over the others, ratios divided by no less than
msProbe's floor for the dtype. The two dumps msProbe wrote around torch's correct CPU LSTM end
in their documented verdicts (docs/check.md#the-shipped-dumps-under---rule-msprobe): float32
passes; bfloat16 is unjudged under msprobe (its ratios are information) and passes the bound.
Real faults still fail the rule."""

from __future__ import annotations

import math
import pathlib
import shutil
from typing import Any

import numpy as np
import pytest

from lstmgrad.tools import metrics
from lstmgrad.tools.cli import main
from lstmgrad.tools.golden import BENCHMARK_INFO
from lstmgrad.tools.msprobe import check_dump
from lstmgrad.tools.report import exit_status, summary

torch = pytest.importorskip("torch")

DATA = pathlib.Path(__file__).parent / "data"
REAL32 = DATA / "msprobe-26.2.0-cpu"
REAL16 = DATA / "msprobe-26.2.0-cpu-bfloat16"


def _rows(rep: Any) -> dict[str, Any]:
    return {r.label: r for r in rep.rows}


def _perturbed_copy(src: pathlib.Path, dst: pathlib.Path, file: str, change: Any) -> pathlib.Path:
    """A copy of a shipped dump with one tensor file changed by ``change(tensor)``."""
    shutil.copytree(src, dst)
    (f,) = dst.rglob(file)
    t = torch.load(f, weights_only=True)
    torch.save(change(t.clone()), f)
    return dst


# --------------------------------------------------------------------------- the metrics


def test_ratio_divides_by_no_less_than_msprobes_floor():
    assert metrics.ratio(3e-4, 1e-7, "float32") == pytest.approx(3e-4 * 2**14)
    assert metrics.ratio(3e-4, 1e-3, "float32") == pytest.approx(0.3)
    assert metrics.ratio(-3e-4, 1e-3, "float64") == pytest.approx(0.3)
    assert metrics.ratio(1.0, 0.0, "bfloat16") == 256.0
    assert metrics.ratio(1.0, 0.0, "float16") == 2048.0
    assert metrics.ratio(0.0, 0.0, "float32") == 0.0


def test_small_values_by_absolute_error_the_others_by_relative_error_float32():
    ref = np.array([1e-6, -(2.0**-14), 1.0, -2.0])
    err = np.array([2e-9, 5e-10, 1e-3, 0.0])  # small: 2e-9 > 2^-30 is an error, 5e-10 is not
    m = metrics.benchmark_metrics((ref + err).astype(np.float32).astype(np.float64), ref,
                                  "float32")  # fmt: skip
    got = (ref + err).astype(np.float32).astype(np.float64) - ref
    assert m.small_value_err_ratio == 0.5
    assert m.rmse == pytest.approx(math.sqrt((got[2] ** 2 + got[3] ** 2) / 2))
    assert m.max_rel_err == pytest.approx(abs(got[2]) / 1.0)
    assert m.mean_rel_err == pytest.approx((abs(got[2]) + abs(got[3]) / 2) / 2)


def test_bfloat16_small_value_threshold_and_relative_error_epsilon():
    ref = np.array([2.0**-8, 2.0**-8 + 2.0**-12, 0.5])
    dev = ref + np.array([2.0**-15, 0.0, 2.0**-9])
    m = metrics.benchmark_metrics(dev, ref, "bfloat16")
    assert m.small_value_err_ratio == 1.0  # |ref| <= 2^-8: one element, off by > 2^-16
    rel = [0.0, 2.0**-9 / (0.5 + 2.0**-8)]  # |N - B| / (|B| + 2^-8)
    assert m.max_rel_err == pytest.approx(max(rel)) and m.mean_rel_err == pytest.approx(
        sum(rel) / 2
    )


# --------------------------------------------------------------------------- the shipped dumps


def test_shipped_float32_dump_passes_the_msprobe_rule(capsys):
    assert main(["check", str(REAL32), "--rule", "msprobe"]) == 0
    assert "2 checked (2 passed, 0 failed)" in capsys.readouterr().out
    for rep in check_dump(REAL32, rule="msprobe"):
        assert rep.verdict == "passed"
        for r in rep.rows:
            assert r.status == r.msprobe_status == metrics.PASS, (rep.name, r.label, r.ratios)
    rows = _rows(check_dump(REAL32, rule="msprobe")[0])
    bias = rows["bias_ih_l0"]  # an RMSE ratio of 2.55 undivided by the floor: 24 elements
    assert bias.device is not None and bias.device.rmse < 2.0**-14
    assert bias.ratios["rmse"] == pytest.approx(bias.device.rmse * 2**14)


def test_shipped_bfloat16_dump_is_unjudged_by_msprobe_and_passes_the_bound(capsys):
    assert main(["check", str(REAL16), "--rule", "msprobe"]) == 2
    out = capsys.readouterr().out
    assert "bfloat16: --rule msprobe's ratios are information only" in out
    (rep,) = check_dump(REAL16, rule="msprobe")
    assert rep.verdict == "unjudged" and exit_status([rep]) == 2
    assert len(rep.rows) == 20
    for r in rep.rows:
        assert r.status == "unjudged" and r.msprobe_status == metrics.INFO
        assert r.columns is not None and r.columns.cosine is not None
        assert r.columns.cosine > metrics.COSINE_MIN and r.nonfinite == 0
    # the ratios themselves stay large: torch's bfloat16 LSTM rounds inside the call
    assert sum(r.benchmark_status == metrics.ERROR for r in rep.rows) >= 5
    assert max(r.ratios["max_rel_err"] for r in rep.rows) > 30
    assert rep.notes.count(BENCHMARK_INFO) == 1
    assert "information only" in summary([rep])
    for rule in ("both", "bound"):
        assert main(["check", str(REAL16), "--rule", rule]) == 0
    (rep,) = check_dump(REAL16, rule="both")
    assert rep.verdict == "passed" and all(r.status == metrics.PASS for r in rep.rows)


# --------------------------------------------------------------------------- faults still fail


def test_one_element_off_by_a_thousandth_fails_the_msprobe_rule_in_float32(tmp_path):
    def change(t):
        t[2, 1, 7] *= 1.001
        return t

    d = _perturbed_copy(REAL32, tmp_path / "d", "Module.lstm.LSTM.forward.0.output.0.pt", change)
    reports = {r.name: r for r in check_dump(d, rule="msprobe")}
    rep = reports["Module.lstm.LSTM.forward.0"]
    assert [r.label for r in rep.rows if r.failed] == ["y"]
    y = _rows(rep)["y"]
    assert y.ratios["max_rel_err"] > 10  # 1e-3 relative: 16 times the floor 2^-14
    assert y.worst[0][2].startswith("[2, 1, 7]")
    assert "elements above layer 0 differ" in y.note  # the bound sees it too
    assert reports["Module.packed.LSTM.forward.0"].verdict == "passed"
    assert main(["check", str(d), "--rule", "msprobe"]) == 1


def test_an_error_finer_than_msprobes_floor_passes_msprobe_and_fails_the_bound(tmp_path):
    def change(t):
        t[2, 1, 7] *= 1 + 2e-5  # a third of 2^-14: within msProbe's floor, 100s of bounds
        return t

    d = _perturbed_copy(REAL32, tmp_path / "d", "Module.lstm.LSTM.forward.0.output.0.pt", change)
    (rep, _) = check_dump(d, rule="msprobe")
    assert rep.verdict == "passed"
    (rep, _) = check_dump(d, rule="bound")
    assert [r.label for r in rep.rows if r.failed] == ["y"]


def test_a_failure_of_the_msprobe_rule_alone_is_not_blamed_on_dropout(tmp_path):
    def change(t):
        t[2, 1, 7] *= 1.001
        return t

    d = _perturbed_copy(REAL32, tmp_path / "d", "Module.lstm.LSTM.forward.0.output.0.pt", change)
    (rep, _) = check_dump(d, rule="msprobe", factor=1e6)  # nothing beyond so wide a bound
    y = _rows(rep)["y"]
    assert y.failed and y.bound_off == 0
    assert "dropout" not in y.note and "differ" not in y.note


@pytest.mark.parametrize("fault", ["nan", "sign"])
def test_gross_faults_in_bfloat16_fail_the_msprobe_rule(tmp_path, fault: str):
    def change(t):
        if fault == "nan":
            t[0, 3, 5] = float("nan")
        else:
            t[:, :, 16:] = -t[:, :, 16:]  # the reverse direction's half of y: cosine drops
        return t

    d = _perturbed_copy(REAL16, tmp_path / "d", "Module.lstm.LSTM.forward.0.output.0.pt", change)
    (rep,) = check_dump(d, rule="msprobe")
    rows = _rows(rep)
    assert rows["y"].failed and rep.verdict == "failed" and exit_status([rep]) == 1
    assert rows["y"].msprobe_status == metrics.ERROR
    assert (rows["y"].nonfinite > 0) if fault == "nan" else (rows["y"].columns.cosine < 0.99)
    assert all(r.status == "unjudged" for r in rep.rows if r.label != "y")


# --------------------------------------------------------------------------- synthetic devices


def _write(path: pathlib.Path, lstm: Any, x: Any, *args: Any, level: str = "L1",
           rounded: Any = None) -> pathlib.Path:  # fmt: skip
    from msprobe_writer import MsprobeDump, record_lstm, record_lstm_rounded

    d = MsprobeDump(path, level=level)
    if rounded is not None:
        record_lstm_rounded(d, lstm, x, dtype=rounded)
    else:
        record_lstm(d, lstm, x, *args)
    d.write()
    return path


def _x(shape: tuple[int, ...], seed: int = 1) -> Any:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g, dtype=torch.float64).float().requires_grad_()


@pytest.mark.parametrize("cfg", [
    dict(L=1, bidir=False, level="L1"), dict(L=2, bidir=True, level="L1"),
    dict(L=2, bidir=True, level="L0"), dict(L=1, bidir=True, level="L0", batch_first=True),
], ids=["L1-D1-api", "L2-D2-api", "L2-D2-module", "L1-D2-module-batchfirst"])  # fmt: skip
def test_correct_float32_devices_pass_the_msprobe_rule(tmp_path, cfg: dict[str, Any]):
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(5, 6, num_layers=cfg["L"], bidirectional=cfg["bidir"],
                         batch_first=cfg.get("batch_first", False))  # fmt: skip
    x = _x((3, 7, 5) if cfg.get("batch_first") else (7, 3, 5))
    _write(tmp_path, lstm, x, level=cfg["level"])
    reports = check_dump(tmp_path, rule="msprobe", no_dropout=True)
    assert [r.verdict for r in reports] == ["passed"], summary(reports)
    assert all(r.msprobe_status in (metrics.PASS, metrics.WARNING) for r in reports[0].rows)


def test_float16_ratios_are_information_too(tmp_path):
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(8, 16)
    _write(tmp_path, lstm, _x((5, 3, 8)), rounded=torch.float16)
    (rep,) = check_dump(tmp_path, rule="msprobe")
    assert rep.dtype == "float16" and rep.verdict == "unjudged"
    assert all(r.msprobe_status == metrics.INFO for r in rep.rows)
    (rep,) = check_dump(tmp_path, rule="both")
    assert rep.verdict == "passed"
