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
    for argv in (["--shape", "3,2,4"], ["--shapes", "nope"]):
        with pytest.raises(SystemExit) as exc:
            main(["bench", *argv])
        assert exc.value.code == 2
        assert f"argument {argv[0]}: " in capsys.readouterr().err


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
    monkeypatch.setattr(plan, "others_cpus", lambda start: 0.0)
    plan.forget()
    try:
        rc = main(["tune", "--shape", "4,2,3,5", "--input", "numpy"])
    finally:
        plan.forget()
    out, err = capsys.readouterr()
    if busy:  # the CPUs are shared: nothing is measured, nothing kept
        assert rc == 1 and "not stored: other processes used the CPUs" in out
        assert "1 of 1 shapes stored nothing" in err
        assert not list(tmp_path.glob("wisdom-*.json"))
    else:
        assert rc == 0 and "; stored" in out and list(tmp_path.glob("wisdom-*.json"))


# ``lstmgrad bench --workload``: the workloads of lstmgrad.tools.workloads behind the command


@pytest.mark.parametrize(
    "argv, option",
    [
        (["--workload", "nope"], "--workload must be grid, word-lm or tagger, got 'nope'"),
        (["--workload", "grid", "--busy", "3"], "--busy must be 0, 1 or 2"),
        (["--busy", "3"], "--busy must be 0, 1 or 2"),
        (["--busy", "x"], "--busy must be 0, 1 or 2"),
        (["--busy", "1"], "--busy applies to --workload"),
        (["--workload", "grid", "--rounds", "0"], "--rounds must be at least 1"),
        (["--workload", "tagger", "--shape", "3,2,4,5,1,1"], "--shape apply to the shape"),
        (["--workload", "word-lm", "--dtype", "float16", "--png", "x.png"], "--dtype, --png"),
    ],
)
def test_bench_workload_refuses_bad_options(monkeypatch, capsys, argv, option):
    from lstmgrad.tools import workloads as w

    for name in ("run_grid", "run_word_lm", "run_tagger"):  # none of them may start
        monkeypatch.setattr(w, name, lambda *a, **k: pytest.fail("the workload ran"))
    assert main(["bench", *argv]) == 2
    out, err = capsys.readouterr()
    assert err.startswith("lstmgrad bench: ") and option in err and out == ""


def test_bench_workload_without_torch_says_so(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "torch", None)  # makes `import torch` raise ImportError
    assert main(["bench", "--workload", "word-lm", "--quick"]) == 2
    assert "lstmgrad bench needs PyTorch, which is not installed" in capsys.readouterr().err


def _fake_meta(busy_n: int) -> dict:
    """A workload record's meta as lstmgrad.tools.workloads.meta writes it, without probing."""
    return {
        "date": "2026-12-06T00:00:00+00:00", "cpu": "a fake CPU", "cpu_count": 2,
        "loadavg_before": (0.1, 0.1, 0.1), "loadavg_after": (0.2, 0.1, 0.1), "python": "3",
        "torch": "2", "numpy": "2", "numba": "0", "torch_threads": 2, "numba_threads": 2,
        "env": {}, "tune_mode": "off", "busy": busy_n, "git": None, "total_s": 1.0, "t0": 0.0,
    }  # fmt: skip


def test_bench_workload_grid_quick_prints_the_table_and_writes_json(monkeypatch, tmp_path, capsys):
    from lstmgrad.tools import workloads as w

    seen = {}

    def run_grid(shapes, rounds, busy_n=0, progress=None, **kw):
        seen.update(shapes=shapes, rounds=rounds, busy_n=busy_n)
        doc = {"workload": "grid", "meta": _fake_meta(busy_n), "results": []}
        for s in shapes:
            pair = w._pair([2.0, 2.2], [1.0, 1.0])
            doc["results"].append({"shape": s.id, "dims": s.record(), "step_macs": w.step_macs(s),
                                   "train": pair, "eval": pair, "other_cores": 0.1})  # fmt: skip
            doc["summary"] = w.grid_summary(doc["results"])
            if progress:
                progress(doc)
        return doc

    monkeypatch.setattr(w, "run_grid", run_grid)
    path = tmp_path / "out" / "grid.json"
    assert main(["bench", "--workload", "grid", "--quick", "--busy", "2", "--json", str(path)]) == 0
    assert seen == {"shapes": w.quick_shapes(), "rounds": 2, "busy_n": 2}
    out = capsys.readouterr().out
    assert "busy processes 2" in out and "a fake CPU" in out  # the meta's lines
    assert "train lstmgrad ms" in out and "geometric mean 2.10x over 3 shapes" in out
    assert f"[3/3] {seen['shapes'][-1].id}" in out and f"json {path}" in out  # progress, file
    doc = json.loads(path.read_text())
    assert doc["workload"] == "grid" and doc["meta"]["busy"] == 2 and "t0" not in doc["meta"]
    assert [r["shape"] for r in doc["results"]] == [s.id for s in w.quick_shapes()]

    assert main(["bench", "--workload", "grid", "--rounds", "3"]) == 0  # the whole sample
    assert seen == {"shapes": w.grid_sample(), "rounds": 3, "busy_n": 0}


def test_bench_workload_word_lm_quick_prints_the_table_and_writes_json(
    monkeypatch, tmp_path, capsys
):
    from lstmgrad.tools import workloads as w

    seen = {}

    def run_word_lm(rounds, chunk, warmup, busy_n, progress=None, **kw):
        seen.update(rounds=rounds, chunk=chunk, warmup=warmup, busy_n=busy_n)
        progress("round 1/2: a line of progress")
        side = {"ms": 30.0, "loss_first": 9.2, "loss_last": 7.1, "valid_loss": 7.3}
        return {"workload": "word_lm", "meta": _fake_meta(busy_n),
                "config": {"chunk": chunk}, "sides": {"torch": side, "lstmgrad": side},
                "summary": w._pair([33.0, 36.0], [30.0, 30.0])}  # fmt: skip

    monkeypatch.setattr(w, "run_word_lm", run_word_lm)
    path = tmp_path / "lm.json"
    argv = ["bench", "--workload", "word-lm", "--quick", "--busy", "1", "--json", str(path)]
    assert main(argv) == 0
    assert seen == {"rounds": 2, "chunk": 3, "warmup": 2, "busy_n": 1}
    out = capsys.readouterr().out
    assert "  round 1/2: a line of progress" in out and "busy processes 1" in out
    assert "valid loss" in out and "ratio torch / lstmgrad 1.15x" in out
    assert json.loads(path.read_text())["meta"]["busy"] == 1

    assert main(["bench", "--workload", "word-lm", "--rounds", "4"]) == 0
    assert seen == {"rounds": 4, "chunk": 20, "warmup": 5, "busy_n": 0}
    assert [f.name for f in tmp_path.iterdir()] == ["lm.json"]  # no --json: nothing written


def test_bench_workload_tagger_passes_runs_and_quick(monkeypatch, capsys):
    from lstmgrad.tools import workloads as w

    seen = {}

    def run_tagger(epochs, runs, busy_n, n_sentences, progress=None, **kw):
        seen.update(epochs=epochs, runs=runs, busy_n=busy_n, sentences=n_sentences)
        side = {"epochs": [{"seconds": 1.0}], "wall_s": 4.0}
        return {"workload": "packed_tagger", "meta": _fake_meta(busy_n),
                "runs": [{"run": 1, "torch": side, "lstmgrad": side, "ratio_epoch": [1.0],
                          "ratio_wall": 1.0}]}  # fmt: skip

    monkeypatch.setattr(w, "run_tagger", run_tagger)
    assert main(["bench", "--workload", "tagger", "--quick", "--rounds", "1"]) == 0
    assert seen == {"epochs": 1, "runs": 1, "busy_n": 0, "sentences": 96}
    assert "run 1 epoch 1" in capsys.readouterr().out
    assert main(["bench", "--workload", "tagger", "--busy", "2"]) == 0
    assert seen == {"epochs": 2, "runs": 2, "busy_n": 2, "sentences": 640}


def test_bench_workload_grid_runs_for_real(monkeypatch, tmp_path, capsys):
    pytest.importorskip("torch")
    from lstmgrad.tools import workloads as w

    monkeypatch.setenv("LSTMGRAD_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("LSTMGRAD_TUNE", "off")
    # the quick grid's smallest shape alone, one round (a few seconds)
    monkeypatch.setattr(w, "quick_shapes", lambda: [w.GridShape(H=8, B=2, T=3, L=1, D=1)])
    path = tmp_path / "grid.json"
    argv = ["bench", "--workload", "grid", "--quick", "--rounds", "1", "--json", str(path)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "H8-B2-T3-L1-D1" in out and "geometric mean" in out and "peak" in out
    (r,) = json.loads(path.read_text())["results"]
    assert "error" not in r and r["train"]["ratio"] > 0 and r["eval"]["ratio"] > 0
