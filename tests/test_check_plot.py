"""`lstmgrad check --plot`: the data behind each picture (golden.error_profile) puts a synthetic
fault where it was made (a drift growing along T, one bad step, one bad batch row, one gate, one
layer and direction), and the command writes PNG files without changing its exit status.

``python tests/test_check_plot.py docs/check-plot.png`` draws the picture docs/check.md shows."""

from __future__ import annotations

import json
import pathlib
import sys
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from lstmgrad.tools.cli import main  # noqa: E402
from lstmgrad.tools.msprobe import check_dump  # noqa: E402
from msprobe_writer import MsprobeDump, record_lstm  # noqa: E402

PNG = b"\x89PNG\r\n\x1a\n"
T, B, I, H = 10, 4, 5, 6


def _lstm(L: int = 1, bidir: bool = True) -> Any:
    torch.manual_seed(0)
    return torch.nn.LSTM(I, H, num_layers=L, bidirectional=bidir)


def _x(shape: tuple[int, ...] = (T, B, I)) -> Any:
    g = torch.Generator().manual_seed(1)
    return torch.randn(shape, generator=g, dtype=torch.float64).float().requires_grad_()


def _dump(path: pathlib.Path, entry: str, key: tuple[Any, ...], change: Any, *, L: int = 1,
          level: str = "L1", x: Any = None) -> pathlib.Path:  # fmt: skip
    """A dump of a correct torch LSTM with ``change`` applied to one output (a private copy)."""

    def perturb(name: str, k: tuple[Any, ...], t: Any) -> Any:
        return change(t.clone().double()).float() if (name, tuple(k)) == (entry, key) else t

    d = MsprobeDump(path, level=level)
    record_lstm(d, _lstm(L), _x() if x is None else x, perturb=perturb)
    d.write()
    return path


def _row(path: pathlib.Path, label: str) -> Any:
    (rep,) = check_dump(path, no_dropout=True)
    (row,) = [r for r in rep.rows if r.label == label]
    assert row.profile is not None
    return row


def _scale(t: Any) -> Any:
    """|t| + rms(t): the bound's shape, so a perturbation of s * _scale(t) is s / bound-unit
    everywhere."""
    return t.abs() + t.square().mean().sqrt()


# --------------------------------------------------------------------------- the data


def test_drift_along_t_rises_step_after_step(tmp_path):
    steps = torch.arange(T, dtype=torch.float64)[:, None, None]

    def drift(t):  # direction 0 of y drifts: an error growing as (step + 1)^2
        t[..., :H] += 2e-6 * (steps + 1) ** 2 * _scale(t)[..., :H]
        return t

    row = _row(_dump(tmp_path, "VF.lstm.0.forward", (0,), drift), "y")
    assert row.failed
    prof = row.profile
    assert set(prof.steps) == {"layer 0, direction 0", "layer 0, direction 1"}
    d0, d1 = prof.steps["layer 0, direction 0"], prof.steps["layer 0, direction 1"]
    assert len(d0) == T and np.all(np.diff(d0) > 0), d0
    assert int(np.argmax(d0)) == T - 1 and d0[-1] > 20 * d0[0]
    assert d1.max() < 1  # the other direction is untouched, inside the bound


def test_one_bad_step_is_a_spike_at_that_step(tmp_path):
    def step(t):
        t[6] *= 1.001
        return t

    prof = _row(_dump(tmp_path, "VF.lstm.0.forward", (0,), step), "y").profile
    for curve in prof.steps.values():
        others = np.delete(curve, 6)
        assert int(np.argmax(curve)) == 6 and curve[6] > 10 * others.max() and others.max() < 1


def test_one_bad_batch_row_is_a_spike_at_that_row(tmp_path):
    def batch_row(t):
        t[:, 2] *= 1.001
        return t

    prof = _row(_dump(tmp_path, "VF.lstm.0.forward", (0,), batch_row), "y").profile
    for name, curve in prof.rows.items():
        assert len(curve) == B and int(np.argmax(curve)) == 2, name
        assert curve[2] > 10 * np.delete(curve, 2).max()
        assert prof.steps[name].min() > 1  # every step holds the bad row


def test_dx_is_profiled_over_steps_rows_and_input_columns(tmp_path):
    def column(t):
        t[3, 1, 4] *= 1.01
        return t

    prof = _row(_dump(tmp_path, "VF.lstm.0.backward", (0,), column), "dx").profile
    (name,) = prof.steps
    assert "both directions summed" in name and prof.unit_axis == "input column"
    assert int(np.argmax(prof.steps[name])) == 3 and int(np.argmax(prof.rows[name])) == 1
    assert len(prof.units[name]) == I and int(np.argmax(prof.units[name])) == 4


def test_a_parameter_gradient_is_profiled_over_its_gate_rows(tmp_path):
    def gate_f(t):
        t[H : 2 * H] *= 1.001  # gate f's rows (torch's order i, f, g, o)
        return t

    path = _dump(tmp_path, "Module.lstm.LSTM.parameters_grad", ("weight_hh_l0",), gate_f,
                 level="L0")  # fmt: skip
    row = _row(path, "weight_hh_l0")
    prof = row.profile
    assert row.failed and not prof.steps and not prof.rows
    assert prof.unit_axis == "gate row" and prof.gate_size == H
    (curve,) = prof.units.values()
    assert len(curve) == 4 * H and H <= int(np.argmax(curve)) < 2 * H
    assert curve[H : 2 * H].min() > 10 * max(curve[:H].max(), curve[2 * H :].max())


def test_states_are_profiled_per_layer_and_direction(tmp_path):
    def layer1_reverse(t):
        t[3, 1] *= 1.001  # h_n of layer 1, direction 1, batch row 1
        return t

    prof = _row(_dump(tmp_path, "VF.lstm.0.forward", (1,), layer1_reverse, L=2), "h_n").profile
    assert not prof.steps  # h_n has no time axis
    names = ["layer 0, direction 0", "layer 0, direction 1", "layer 1, direction 0",
             "layer 1, direction 1"]  # fmt: skip
    assert list(prof.rows) == names
    peaks = {n: prof.rows[n].max() for n in names}
    assert max(peaks, key=peaks.__getitem__) == "layer 1, direction 1"
    assert int(np.argmax(prof.rows["layer 1, direction 1"])) == 1
    assert all(peaks[n] < 1 for n in names[:3])


def test_packed_rows_are_placed_at_their_step_and_batch_row(tmp_path):
    from torch.nn.utils.rnn import pack_padded_sequence

    lengths = torch.tensor([T, 7, 3, 5])
    packed = pack_padded_sequence(_x(), lengths, enforce_sorted=False)
    sizes = packed.batch_sizes.tolist()  # rows per step, sequences sorted by length
    start = sum(sizes[:4])

    def step4(t):
        t[start : start + sizes[4]] *= 1.001
        return t

    prof = _row(_dump(tmp_path, "VF.lstm.0.forward", (0,), step4, x=packed), "y").profile
    for curve in prof.steps.values():
        assert len(curve) == T and int(np.argmax(curve)) == 4
        assert np.isnan(curve).sum() == 0  # every step has rows
    for curve in prof.rows.values():  # sorted by length: the last row (3 steps) ends before
        assert len(curve) == B and np.all(curve[:3] > 1) and curve[3] < 1


# --------------------------------------------------------------------------- the command


def _failing(tmp_path: pathlib.Path) -> pathlib.Path:
    def step(t):
        t[6] *= 1.001
        return t

    return _dump(tmp_path / "dump", "VF.lstm.0.forward", (0,), step, L=2)


def test_plot_writes_one_png_per_failing_output_and_keeps_the_exit_status(tmp_path, capsys):
    dump = _failing(tmp_path)
    assert main(["check", str(dump)]) == 1
    capsys.readouterr()
    plots, out_json = tmp_path / "plots", tmp_path / "r.json"
    assert main(["check", str(dump), "--plot", str(plots), "--json", str(out_json)]) == 1
    out = capsys.readouterr().out
    files = sorted(plots.iterdir())
    assert [f.name for f in files] == ["step0_rank0-VF.lstm.0.forward.output.0.png"]
    assert files[0].read_bytes().startswith(PNG) and 2_000 < files[0].stat().st_size < 200_000
    assert f"plots    1 PNG files in {plots}" in out
    assert "profile" not in out_json.read_text() and json.loads(out_json.read_text())
    every = tmp_path / "every"
    assert main(["check", str(dump), "--plot", str(every), "--plot-all"]) == 1
    (rep,) = check_dump(dump)
    judged = [r for r in rep.rows if r.status in ("pass", "warning", "error")]
    pngs = list(every.iterdir())
    assert len(pngs) == len(judged) == 4 and all(p.read_bytes()[:8] == PNG for p in pngs)


def test_plot_of_a_passing_dump_draws_nothing_and_exits_0(tmp_path, capsys):
    dump = _dump(tmp_path / "dump", "none", (), lambda t: t)
    assert main(["check", str(dump), "--plot", str(tmp_path / "plots")]) == 0
    assert "plots    none: no failing output" in capsys.readouterr().out
    assert not (tmp_path / "plots").exists()


@pytest.mark.parametrize("argv, message", [
    (["--plot", "FILE"], "--plot {tmp}/file: is a file; give a folder"),
    (["--plot", "NOPARENT"], "--plot {tmp}/no/such/plots: no folder {tmp}/no/such to make it in"),
    (["--plot-all"], "--plot-all needs --plot DIR"),
])  # fmt: skip
def test_plot_options_are_checked_before_any_work(tmp_path, capsys, monkeypatch, argv, message):
    from lstmgrad.tools import msprobe

    (tmp_path / "file").write_text("x")
    paths = {"FILE": str(tmp_path / "file"), "NOPARENT": str(tmp_path / "no" / "such" / "plots")}
    monkeypatch.setattr(msprobe, "check_dump", lambda *a, **k: pytest.fail("work was done"))
    assert main(["check", str(tmp_path), *[paths.get(a, a) for a in argv]]) == 2
    err = capsys.readouterr().err
    assert err.strip() == "lstmgrad check: " + message.format(tmp=tmp_path)


def test_plot_without_matplotlib_names_the_extra(tmp_path, capsys, monkeypatch):
    from lstmgrad.tools import msprobe

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    monkeypatch.setattr(msprobe, "check_dump", lambda *a, **k: pytest.fail("work was done"))
    assert main(["check", str(tmp_path), "--plot", str(tmp_path / "p")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "matplotlib" in err and "lstmgrad[bench]" in err


def test_plot_applies_to_msprobe_and_kernel_dumps_only(tmp_path, capsys):
    assert main(["check", str(tmp_path / "d.npz"), "--plot", str(tmp_path)]) == 2
    assert "--plot apply to msProbe and kernel dumps" in capsys.readouterr().err


# --------------------------------------------------------------------------- docs/check.md's picture


def draw_doc_picture(path: pathlib.Path, folder: pathlib.Path) -> pathlib.Path:
    """The picture in docs/check.md: a 2-layer bidirectional LSTM whose y drifts along T in
    direction 0 (an error growing with each step) and is 0.1% off at step 7 in direction 1."""
    from lstmgrad.tools import plot

    steps = torch.arange(T, dtype=torch.float64)[:, None, None]

    def faults(t):
        t[..., :H] += 1e-6 * (steps + 1) ** 2 * _scale(t)[..., :H]
        t[7, :, H:] *= 1.001
        return t

    dump = _dump(folder, "VF.lstm.0.forward", (0,), faults, L=2)
    (rep,) = check_dump(dump)
    (row,) = [r for r in rep.rows if r.label == "y"]
    assert row.profile is not None
    return plot.draw(row.profile, path, f"{rep.name}: y, {rep.dtype}, 2 layers both ways: "
                     "direction 0 drifts along T, direction 1 is 0.1% off at step 7")  # fmt: skip


def test_doc_picture_is_drawn(tmp_path):
    out = draw_doc_picture(tmp_path / "p.png", tmp_path / "dump")
    assert out.read_bytes().startswith(PNG) and out.stat().st_size < 80_000


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        print(draw_doc_picture(pathlib.Path(sys.argv[1]), pathlib.Path(tmp) / "dump"))
