"""lstmgrad.tools.workloads (benchmarks/grid.py, word_lm.py, packed_tagger.py): the grid's sample, the
corpus, each workload in a tiny configuration (a well-formed record, no timing asserted) and the
busy processes."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time

import pytest

from lstmgrad.tools import workloads as w


@pytest.fixture
def tmp_cache(tmp_path, monkeypatch):
    """An empty plan cache and the safe plan: nothing measured, nothing of the user's touched."""
    monkeypatch.setenv("LSTMGRAD_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("LSTMGRAD_TUNE", "off")
    return tmp_path


def test_the_module_imports_without_torch():
    code = "import sys, lstmgrad.tools.workloads; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0


def test_grid_sample_is_fixed_covers_every_h_and_b_and_keeps_the_caps():
    shapes = w.grid_sample()
    assert shapes == w.grid_sample() and len(shapes) == 40 == len(set(shapes))
    assert {s.H for s in shapes} == set(w.GRID_H) and {s.B for s in shapes} == set(w.GRID_B)
    for s in shapes:
        assert w.step_macs(s) <= w.STEP_MACS_CAP and w.lstm_weights(s) <= w.WEIGHTS_CAP
        assert s.T in w.GRID_T and s.L in w.GRID_L and s.D in w.GRID_D and s.I == s.H
        assert s.dropout in w.GRID_DROPOUT and s.hx in w.GRID_HX
        assert w.parse_shape(s.id) == s
    assert w.grid_sample(seed=1) != shapes
    assert len(w.grid_sample(n=13)) == 13 and len(w.quick_shapes()) == 3
    with pytest.raises(ValueError):
        w.grid_sample(n=12)  # too few to cover every H and B
    with pytest.raises(ValueError):
        w.parse_shape("H64-B4")


def test_step_macs_counts_the_lstm_and_the_decoder():
    s = w.GridShape(H=10, B=2, T=3, L=2, D=2)
    lstm = 2 * 4 * 10 * (10 + 10) + 2 * 4 * 10 * (20 + 10)  # layer 0, layer 1 (input D*H)
    assert w.step_macs(s, vocab=7) == 3 * 2 * 3 * (lstm + 20 * 7)


def test_the_corpus_is_fixed_and_in_the_vocabulary():
    a = w.corpus(5000, vocab=300, seed=0)
    assert (a == w.corpus(5000, vocab=300, seed=0)).all()
    assert not (a == w.corpus(5000, vocab=300, seed=1)).all()
    assert a.dtype.kind == "i" and a.min() >= 0 and a.max() < 300 and len(a) == 5000
    counts = sorted((a == k).sum() for k in range(300))
    assert counts[-1] > 10 * counts[len(counts) // 2]  # Zipf: a few words are most of the text


def test_busy_starts_processes_and_kills_them():
    with w.busy(1) as procs:
        (p,) = procs
        time.sleep(0.3)
        assert p.poll() is None
        with open(f"/proc/{p.pid}/stat") as f:
            assert int(f.read().rsplit(")", 1)[1].split()[11]) > 0  # utime: it spins
    assert p.poll() is not None
    with pytest.raises(KeyboardInterrupt), w.busy(2) as procs:
        raise KeyboardInterrupt
    assert all(p.poll() is not None for p in procs)


def test_the_grid_runs_a_tiny_shape(tmp_cache):
    s = w.GridShape(H=8, B=2, T=3, L=2, D=2, dropout=0.5, hx=True)
    doc = w.run_grid([s], rounds=2, warmup=1, busy_n=0, batch_s=0.001, vocab=20, probe=False)
    (r,) = doc["results"]
    assert "error" not in r, r.get("error")
    assert r["shape"] == s.id and r["dims"]["I"] == 8 and r["warmup_rounds"] >= 1
    for item in ("train", "eval"):
        assert len(r[item]["ratio_round"]) == 2 and r[item]["ratio"] > 0
        assert doc["summary"][item]["shapes"] == 1
    assert doc["meta"]["busy"] == 0 and len(doc["meta"]["loadavg_after"]) == 3
    assert s.id in w.format_grid(doc) and "geometric mean" in w.format_grid(doc)
    w.write_json(doc, tmp_cache / "grid.json")
    assert json.loads((tmp_cache / "grid.json").read_text())["results"][0]["shape"] == s.id


def test_a_failing_grid_shape_is_recorded(tmp_cache, monkeypatch):
    def fail(*args):
        raise RuntimeError("no such kernel\nsecond line")

    monkeypatch.setattr(w, "_grid_items", fail)
    doc = w.run_grid([w.GridShape(H=8, B=2, T=3, L=1, D=1)], rounds=1, probe=False)
    assert doc["results"][0]["error"] == "RuntimeError: no such kernel second line"
    assert "error" in doc["results"][0] and doc["summary"]["errors"] == ["H8-B2-T3-L1-D1"]
    assert "error" in w.format_grid(doc)


def test_the_word_lm_runs_tiny_with_the_same_initial_weights(tmp_cache):
    cfg = w.WordLMConfig(vocab=50, emsize=8, nhid=8, dropout=0.0, tied=True, bptt=4,
                         batch_size=3, eval_batch_size=2, valid_batches=2)  # fmt: skip
    doc = w.run_word_lm(rounds=2, chunk=2, warmup=1, busy_n=1, cfg=cfg, probe=False)
    t, g = doc["sides"]["torch"], doc["sides"]["lstmgrad"]
    assert len(t["ms_round"]) == len(g["ms_round"]) == 2 and len(t["ms_batch"]) == 4
    assert math.isclose(t["loss_first"], g["loss_first"], rel_tol=1e-5)  # same init, no dropout
    assert all(math.isfinite(x[k]) for x in (t, g) for k in ("loss_last", "valid_loss"))
    assert doc["summary"]["ratio"] > 0 and doc["config"]["tied"] and doc["meta"]["busy"] == 1
    assert doc["other_cores"] >= 0  # recorded (its size depends on the machine)
    assert "valid loss" in w.format_word_lm(doc)
    json.dumps(doc)


def test_the_tagger_runs_in_fresh_processes_on_one_cache(tmp_cache, monkeypatch):
    # the children on one thread: quicker where other processes hold the CPUs
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("NUMBA_NUM_THREADS", "1")
    cache = tmp_cache / "tagger-cache"
    doc = w.run_tagger(epochs=1, runs=2, n_sentences=2, batch=2, cache_dir=cache,
                       fresh_numba=False, probe=False, timeout=120)  # fmt: skip
    assert doc["config"]["cache_dir"] == str(cache) and doc["config"]["cache_was_empty"]
    assert [r["run"] for r in doc["runs"]] == [1, 2]
    for rec in doc["runs"]:
        for side in w.SIDES:
            assert rec[side]["impl"] == side and rec[side]["batches"] == 1
            assert len(rec[side]["epochs"]) == 1
            assert rec[side]["wall_s"] >= rec[side]["import_s"] > 0
        assert len(rec["ratio_epoch"]) == 1
    assert "run 2 epoch 1" in w.format_tagger(doc)
    assert os.environ["LSTMGRAD_CACHE_DIR"] != str(cache)  # the children's setting only
