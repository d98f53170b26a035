"""The char-LM training example (examples/char_lm.py, examples/compare.py), end to end, tiny."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("matplotlib")

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
# One thread: fast and steady even when other processes share the CPU.
TINY = "--steps 6 --batch 4 --seq-len 16 --hidden 16 --embed 8 --eval-every 3 --threads 1".split()


def run(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / script), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, f"{script} exited {proc.returncode}:\n{proc.stderr}"
    return proc


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    out = tmp_path_factory.mktemp("char_lm")
    results = {}
    for impl in ("torch", "lstmgrad"):
        run("char_lm.py", "--impl", impl, "--out", str(out), *TINY)
        assert (out / f"char_lm-{impl}.png").stat().st_size > 0
        results[impl] = json.loads((out / f"char_lm-{impl}.json").read_text())
    return results


@pytest.mark.parametrize("impl", ["torch", "lstmgrad"])
def test_char_lm_outputs(runs: dict[str, dict], impl: str) -> None:
    r = runs[impl]
    assert r["impl"] == impl
    assert (
        r["lstm_class"]
        == {"torch": "torch.nn.modules.rnn.LSTM", "lstmgrad": "lstmgrad.nn.LSTM"}[impl]
    )
    assert len(r["train_losses"]) == len(r["step_ms"]) == 6
    assert [e["step"] for e in r["eval"]] == [3, 6]
    losses = r["train_losses"] + [e["loss"] for e in r["eval"]]
    assert all(math.isfinite(x) for x in losses)
    # Untrained on a vocabulary of ~100 characters: about ln(100) nats per character.
    assert abs(r["train_losses"][0] - math.log(r["data"]["vocab"])) < 0.5
    assert r["threads"] == 1 and r["median_ms_per_step"] > 0
    assert r["sample"]["text"].startswith(r["sample"]["prompt"])
    assert len(r["sample"]["text"]) == len(r["sample"]["prompt"]) + 200


def test_impls_track_each_other(runs: dict[str, dict]) -> None:
    """Same initial weights and batches: the curves differ only by float32 rounding."""
    torch_run, ours = runs["torch"], runs["lstmgrad"]
    assert ours["train_losses"] == pytest.approx(torch_run["train_losses"], rel=1e-4)
    assert [e["loss"] for e in ours["eval"]] == pytest.approx(
        [e["loss"] for e in torch_run["eval"]], rel=1e-4
    )


def test_compare(tmp_path: Path) -> None:
    png = tmp_path / "plot" / "char_lm.png"
    proc = run("compare.py", "--out", str(tmp_path), "--png", str(png), "--rounds", "2", *TINY)
    assert "| impl | median ms/step | speedup vs torch |" in proc.stdout
    assert "| lstmgrad |" in proc.stdout and "max |torch - lstmgrad|" in proc.stdout
    assert png.stat().st_size > 0
    summary = json.loads((tmp_path / "compare.json").read_text())
    assert set(summary["runs"]) == {"torch", "lstmgrad"}
    assert summary["train_loss_difference"]["max_rel"] < 1e-4
    # two rounds, each side's run times kept; the speedup is the median of the rounds' ratios
    ms = {k: v["round_median_ms_per_step"] for k, v in summary["runs"].items()}
    assert summary["rounds"] == 2 and all(len(v) == 2 and min(v) > 0 for v in ms.values())
    ratios = [t / o for t, o in zip(ms["torch"], ms["lstmgrad"], strict=True)]
    assert summary["round_speedups"] == pytest.approx(ratios)
    assert summary["speedup_vs_torch"] == pytest.approx(sum(ratios) / 2)
    line = next(x for x in proc.stdout.splitlines() if x.startswith("| lstmgrad |"))
    assert f"{sum(ratios) / 2:.2f}x [{min(ratios):.2f}-{max(ratios):.2f}]" in line


@pytest.mark.parametrize(
    "args, message",
    [
        (["--rounds", "0"], "--rounds must be at least 1, got 0"),
        (["--impl", "torch"], "--impl is chosen by compare.py"),
    ],
)
def test_compare_rejects_bad_arguments(tmp_path: Path, args: list[str], message: str) -> None:
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / "compare.py"), *args, "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2 and message in proc.stderr


@pytest.mark.parametrize("script", ["char_lm.py", "compare.py"])
def test_help_states_each_default_once(script: str) -> None:
    out = " ".join(run(script, "--help").stdout.split())
    assert "(default: None)" not in out and ") (default:" not in out, out
    assert "(default: examples/out)" in out and "minute" in out  # and how long a run takes
