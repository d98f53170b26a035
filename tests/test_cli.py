"""``lstmgrad demo`` and ``lstmgrad --help`` as a user runs them."""

from __future__ import annotations

import io
import subprocess
import sys

import lstmgrad.demo
from lstmgrad.cli import main


def test_demo_runs_as_module_and_passes():
    proc = subprocess.run(
        [sys.executable, "-m", "lstmgrad", "demo"], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "1.8399487" in out and "0.3696064" in out and "0.5567699" in out
    assert "float64 ref vs PyTorch autograd" in out and "float32 fused vs float64 ref" in out
    assert "all checks passed" in out


def test_help_lists_the_commands(capsys):
    try:
        main(["--help"])
    except SystemExit as exc:
        assert exc.code == 0
    assert "demo" in capsys.readouterr().out
    assert main([]) == 2


def test_demo_exits_non_zero_when_a_check_fails(monkeypatch):
    monkeypatch.setattr(lstmgrad.demo, "SAMPLE_DC_PREV", 1.9)
    buf = io.StringIO()
    assert lstmgrad.demo.run_demo(use_torch=False, out=buf) is False
    assert "FAIL" in buf.getvalue()
    assert main(["demo", "--no-torch"]) == 1
