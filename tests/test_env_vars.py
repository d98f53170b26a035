"""Every LSTMGRAD_* variable the package reads is checked: a value outside its choices raises
ValueError naming the variable, the value and the choices at the first call that reads it,
never at ``import lstmgrad``."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import lstmgrad
from lstmgrad.core import env
from lstmgrad.ops import tensors
from lstmgrad.planning import plan
from lstmgrad.tools.cli import main

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "lstmgrad"

CHECKED = {  # variable -> (its reader, a bad value, the choices the message must list)
    "LSTMGRAD_TUNE": (plan.mode, "offf", "'on', 'eager', 'cached' or 'off'"),
    "LSTMGRAD_BLAS": (tensors.array_gemm, "mkl", "'numpy' or 'torch'"),
    "LSTMGRAD_PRIVATE_OPS": (tensors.private_ops_allowed, "maybe", "'on' or 'off'"),
}
FREE_FORM = {
    "LSTMGRAD_PLAN": "fields checked one by one (tests/test_plan.py)",
    "LSTMGRAD_CACHE_DIR": "a path: any value names a folder",
}


def small_call():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 2, 4)).astype(np.float32)
    params = [rng.standard_normal(s).astype(np.float32) for s in [(20, 4), (20, 5), (20,), (20,)]]
    return x, params


@pytest.mark.parametrize("name", sorted(CHECKED))
def test_a_bad_value_names_the_variable_the_value_and_the_choices(monkeypatch, name):
    read, bad, choices = CHECKED[name]
    monkeypatch.setenv(name, f" {bad.upper()}")
    with pytest.raises(ValueError) as exc:
        read()
    assert str(exc.value).startswith(f"{name}: expected {choices}")
    assert str(exc.value).endswith(f"got ' {bad.upper()}'")


@pytest.mark.parametrize("name", ["LSTMGRAD_TUNE", "LSTMGRAD_BLAS"])
def test_a_call_raises_before_it_runs(monkeypatch, name):
    """The bad value stops the call itself (LSTMGRAD_TUNE is read when the call is planned)."""
    x, params = small_call()
    monkeypatch.setenv(name, CHECKED[name][1])
    with pytest.raises(ValueError, match=f"^{name}: expected .*got '{CHECKED[name][1]}'$"):
        lstmgrad.lstm_forward(x, params)
    monkeypatch.setenv(name, {"LSTMGRAD_TUNE": "off", "LSTMGRAD_BLAS": "numpy"}[name])
    assert lstmgrad.lstm_forward(x, params).output.shape == (3, 2, 5)


def test_a_call_with_tensors_checks_private_ops(monkeypatch):
    torch = pytest.importorskip("torch")
    x, params = small_call()
    monkeypatch.setenv("LSTMGRAD_PRIVATE_OPS", "nope")
    with pytest.raises(ValueError, match="^LSTMGRAD_PRIVATE_OPS: expected 'on' or 'off'"):
        lstmgrad.lstm_forward(torch.from_numpy(x), [torch.from_numpy(p) for p in params])


@pytest.mark.parametrize(
    "value, want",
    [("", "on"), ("on", "on"), (" Yes ", "on"), ("true", "on"), ("1", "on"), ("eager", "eager"),
     ("cache", "cached"), ("CACHED", "cached"), ("off", "off"), ("0", "off"), ("no", "off"),
     ("false", "off"), ("safe", "off")],
)  # fmt: skip
def test_every_tune_spelling_selects_its_mode(monkeypatch, value, want):
    monkeypatch.setenv("LSTMGRAD_TUNE", value)
    assert plan.mode() == want
    with plan.eager():  # a block's eagerness makes "on" eager, never another mode
        assert plan.mode() == ("eager" if want == "on" else want)


@pytest.mark.parametrize(
    "value, allowed",
    [("", True), ("1", True), ("on", True), ("TRUE", True), ("yes", True), ("0", False),
     ("off", False), (" No", False), ("false", False)],
)  # fmt: skip
def test_every_private_ops_spelling(monkeypatch, value, allowed):
    monkeypatch.setenv("LSTMGRAD_PRIVATE_OPS", value)
    assert tensors.private_ops_allowed() is allowed


def test_choice_lists_other_spellings_once_per_value(monkeypatch):
    monkeypatch.setenv("LSTMGRAD_X", "y")
    with pytest.raises(ValueError) as exc:
        env.choice("LSTMGRAD_X", "a", {"a": "a", "A1": "a", "b": "b"})
    assert str(exc.value) == "LSTMGRAD_X: expected 'a' or 'b' (A1 for a), got 'y'"
    monkeypatch.setenv("LSTMGRAD_X", " B ")
    assert env.choice("LSTMGRAD_X", "a", {"a": "a", "b": "b"}) == "b"


def test_import_never_fails_on_a_bad_value():
    """``import lstmgrad`` (and the process's exit, which leaves the measuring budget to the
    next process under LSTMGRAD_TUNE=on) reads none of them."""
    bad = {name: CHECKED[name][1] for name in CHECKED}
    proc = subprocess.run(
        [sys.executable, "-c", "import lstmgrad, lstmgrad.tools.cli; print('imported')"],
        capture_output=True, text=True, timeout=120, check=False, env={**os.environ, **bad},
    )  # fmt: skip
    assert proc.returncode == 0 and proc.stdout == "imported\n", proc.stderr
    assert proc.stderr == ""


@pytest.mark.parametrize(
    "name, value, says, got",
    [("LSTMGRAD_TUNE", "offf", "LSTMGRAD_TUNE: expected 'on', 'eager', 'cached' or 'off'", "offf"),
     ("LSTMGRAD_BLAS", "mkl", "LSTMGRAD_BLAS: expected 'numpy' or 'torch'", "mkl"),
     ("LSTMGRAD_PRIVATE_OPS", "2", "LSTMGRAD_PRIVATE_OPS: expected 'on' or 'off'", "2"),
     ("LSTMGRAD_PLAN", "threads=x", "LSTMGRAD_PLAN: threads must be an integer >= 1", "x")],
)  # fmt: skip
@pytest.mark.parametrize(
    "argv",
    [["tune", "--show"], ["tune"], ["tune", "--shape", "5,2,3,4"], ["bench", "--quick"],
     ["bench", "--workload", "grid", "--quick"],
     ["check", str(Path(__file__).parent / "data" / "msprobe-26.2.0-cpu")]],
    ids=["tune-show", "tune", "tune-shape", "bench", "bench-workload", "check"],
)  # fmt: skip
def test_commands_say_which_variable_is_wrong(monkeypatch, capsys, tmp_path, argv, name, value,
                                              says, got):  # fmt: skip
    """Before any work (bench would time nothing; tune measure nothing), exit 2."""
    monkeypatch.setenv("LSTMGRAD_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv(name, value)
    assert main([*argv, *(["--input", "numpy"] if argv[0] == "tune" else [])]) == 2
    captured = capsys.readouterr()
    err = captured.err
    assert err.startswith(f"lstmgrad {argv[0]}: {says}") and err.count("\n") == 1, err
    assert err.endswith(f", got {got!r}\n"), err
    assert captured.out == ""


def test_tune_reset_needs_no_valid_mode(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("LSTMGRAD_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("LSTMGRAD_TUNE", "offf")
    assert main(["tune", "--reset", "--input", "numpy"]) == 0
    assert capsys.readouterr().out == f"nothing stored at {tmp_path}\n"


def test_every_variable_read_is_checked_and_documented():
    """A new LSTMGRAD_* variable in the package needs a check (or a reason it needs none) here
    and a row in the README's table of environment variables."""
    used = set()
    for path in SRC.rglob("*.py"):
        used |= set(re.findall(r"[\"'](LSTMGRAD_[A-Z_]+)[\"']", path.read_text()))
    assert used == set(CHECKED) | set(FREE_FORM)
    readme = (ROOT / "README.md").read_text()
    for name in used:
        assert re.search(rf"^\| `{name}[`=]", readme, re.M), name
