"""``lstmgrad demo``, ``lstmgrad bench`` and ``lstmgrad --help`` as a user runs them."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import lstmgrad.tools.demo
from lstmgrad.tools.cli import main


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
    monkeypatch.setattr(lstmgrad.tools.demo, "SAMPLE_DC_PREV", 1.9)
    buf = io.StringIO()
    assert lstmgrad.tools.demo.run_demo(use_torch=False, out=buf) is False
    assert "FAIL" in buf.getvalue()
    assert main(["demo", "--no-torch"]) == 1


def test_bench_runs_a_tiny_shape_and_writes_json(tmp_path, capsys):
    pytest.importorskip("torch")
    path, png = tmp_path / "bench.json", tmp_path / "bench.png"
    argv = ["bench", "--shape", "3,2,4,5,1,1", "--rounds", "1", "--json", str(path)]
    assert main([*argv, "--png", str(png)]) == 0
    out = capsys.readouterr().out
    assert "peak" in out and "Backward alone" in out and "Forward + backward" in out
    assert "[1/1] custom" in out  # progress, shape by shape
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    doc = json.loads(path.read_text())
    assert set(doc) == {"machine", "config", "results"}
    assert doc["config"] == {"dtype": "float32", "rounds": 1, "input": "tensors", "batch_s": 0.05}
    for key in ("cpu", "cpu_count", "affinity", "torch_threads", "numba_threads", "peak_gflops"):
        assert key in doc["machine"]
    assert all(v > 0 for v in doc["machine"]["peak_gflops"].values())
    (res,) = doc["results"]
    assert res["dims"] == {"T": 3, "B": 2, "I": 4, "H": 5, "L": 1, "D": 1}
    assert res["torch_path"] in ("oneDNN", "native") and res["other_cores"] >= 0
    for item in ("bwd", "fwdbwd"):
        r = res[item]
        assert r["flops"] > 0 and r["ratio"] > 0
        for side in ("torch", "lstmgrad"):
            assert r[f"{side}_ms"] > 0 and r[f"{side}_gflops"] > 0 and r[f"{side}_peak_frac"] > 0


def test_bench_without_torch_says_so(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "torch", None)  # makes `import torch` raise ImportError
    assert main(["bench", "--shape", "3,2,4,5,1,1", "--rounds", "1"]) == 2
    assert (
        'lstmgrad bench needs PyTorch, which is not installed: pip install "lstmgrad[torch]"'
        in capsys.readouterr().err
    )


def test_bench_rejects_a_bad_shape(capsys):
    assert main(["bench", "--shape", "3,2,4"]) == 2
    assert main(["bench", "--shapes", "nope"]) == 2
    assert "bad shape" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, shapes, rounds",
    [
        (["--quick"], ["small-2", "med-3"], 3),
        (["--quick", "--rounds", "2"], ["small-2", "med-3"], 2),
        (["--quick", "--shapes", "large-1"], ["large-1"], 3),
        ([], ["med-3", "small-2", "large-1"], 5),
    ],
)
def test_bench_quick_picks_fewer_shapes_and_rounds(monkeypatch, argv, shapes, rounds):
    import lstmgrad.tools.bench

    seen = {}

    def run(got_shapes, dtype, got_rounds, inp, progress):
        seen.update(shapes=list(got_shapes), rounds=got_rounds)
        return {"machine": {}, "config": {}, "results": []}

    monkeypatch.setattr(lstmgrad.tools.bench, "run", run)
    monkeypatch.setattr("lstmgrad.tools.cli._bench_tables", lambda doc: "")
    assert main(["bench", *argv]) == 0
    assert seen == {"shapes": shapes, "rounds": rounds}


@pytest.mark.parametrize(
    "argv",
    [["--help"], ["bench", "--help"], ["tune", "--show", "--input", "numpy"]],
    ids=["help", "bench-help", "tune-show"],
)
def test_a_closed_pipe_ends_the_command_quietly(argv, tmp_path):
    # `lstmgrad ... | head`: the reader is gone before the command writes; its read end is
    # closed before the child starts, so every write meets EPIPE
    read, write = os.pipe()
    os.close(read)
    env = {**os.environ, "LSTMGRAD_CACHE_DIR": str(tmp_path)}
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "lstmgrad", *argv],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            env=env,
            check=False,
        )
    finally:
        os.close(write)
    # no traceback; argparse itself ignores a failed write of its help (status 0)
    assert proc.stderr == "" and proc.returncode == (0 if "--help" in argv else 1), proc.stderr


def test_tune_reset_says_what_it_deleted(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("LSTMGRAD_CACHE_DIR", str(tmp_path))
    assert main(["tune", "--reset", "--input", "numpy"]) == 0
    assert capsys.readouterr().out == f"nothing stored at {tmp_path}\n"
    (tmp_path / "wisdom-0123456789abcdef.json").write_text("{}")
    assert main(["tune", "--reset", "--input", "numpy"]) == 0
    assert capsys.readouterr().out == f"forgot {tmp_path / 'wisdom-0123456789abcdef.json'}\n"


def test_bench_help_says_how_long_it_takes(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "about half a minute on 2 cores" in out and "--quick: about 10 s" in out


def test_the_benchmark_scripts_end_quietly_on_a_closed_pipe(tmp_path):
    # `python benchmarks/run.py | head`: the scripts' entry point, on a reader already gone
    bench = Path(__file__).resolve().parent.parent / "benchmarks"
    code = (
        f"import sys; sys.path.insert(0, {str(bench)!r}); from _harness import run_main\n"
        "run_main(lambda: print('x\\n' * 100000) or 0)"
    )
    read, write = os.pipe()
    os.close(read)
    try:
        proc = subprocess.run(
            [sys.executable, "-c", code], stdout=write, stderr=subprocess.PIPE, text=True,
            timeout=60, check=False,
        )  # fmt: skip
    finally:
        os.close(write)
    assert proc.returncode == 1 and proc.stderr == "", proc.stderr


@pytest.mark.parametrize("busy", [False, True])
def test_tune_says_what_it_stored_and_fails_when_nothing(tmp_path, monkeypatch, capsys, busy):
    from lstmgrad.planning import plan

    monkeypatch.setenv("LSTMGRAD_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("LSTMGRAD_TUNE", "on")
    monkeypatch.setattr(plan, "machine_busy", lambda: busy)
    plan.forget()
    try:
        rc = main(["tune", "--shape", "4,2,3,5", "--input", "numpy"])
    finally:
        plan.forget()
    out, err = capsys.readouterr()
    if busy:  # measured while the CPUs were shared: for this process only
        assert rc == 1 and "not stored: measured while other processes used the CPUs" in out
        assert "1 of 1 shapes stored nothing" in err
        assert not list(tmp_path.glob("wisdom-*.json"))
    else:
        assert rc == 0 and "; stored]" in out and list(tmp_path.glob("wisdom-*.json"))
