"""benchmarks/plan_fields.py: the wins it reads from stored measurements, computed by hand from
the entries below."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import plan_fields  # noqa: E402

BIG = {"what": "big", "kind": "torch", "dtype": "float32", "N": 1024, "I": 64, "H": 64}
BIG_ENTRY = {
    "plan": {"big": "blas", "transpose_threads": 2, "convert": "kernels"},
    "seconds": {
        "blas/products": 2.0,
        "onednn/products": 1.6,
        "transpose/1": 1.0,
        "transpose/2": 0.8,
    },  # fmt: skip
}
STEPS = {"what": "steps", "kind": "torch", "dtype": "float32", "B": 4, "H": 64, "D": 1}
STEPS_ENTRY = {
    "plan": {"threads": 1},
    "recurrent": {
        "fwd": {"blas": {"call": 2e-6}, "mkl": {"call": 1e-6}},
        "bwd": {"blas": {"call": 2e-6}, "loop": {"call": 4e-6}},
    },  # fmt: skip
    "walk_products": {"loop": 3e-6, "library": 2e-6, "packed": 1e-6},
    "passes": {"one": 1.0, "walk": 0.5, "split": 1.02, "pairs-loop": 2.0},
    "arrangement": {"phases": {"one": [0.4, 0.6], "walk": [0.2, 0.3]}},
}


def test_wins_are_the_safe_choice_over_the_value():
    big = plan_fields.wins_of(BIG, BIG_ENTRY)
    assert big == pytest.approx({"big=onednn": 1.25, "transpose_threads=2": 1.25})
    steps = plan_fields.wins_of(STEPS, STEPS_ENTRY)
    assert steps == pytest.approx({
        "fwd_rec=mkl": 2.0, "bwd_rec=loop": 0.5, "walk_product=library": 1.5,
        "walk_product=packed": 2.0, "walk": 2.0,
        "threads+split_min": 1 / 1.02, "pair_walks": 0.5,
        "fwd_walk=False": (0.2 + 0.3) / (0.4 + 0.3),  # walking backward, forward as "one"
    })  # fmt: skip


def test_the_table_counts_classes_and_wins_past_the_bar(tmp_path, monkeypatch, capsys):
    entries = {json.dumps(BIG, sort_keys=True): BIG_ENTRY,
               json.dumps(STEPS, sort_keys=True): STEPS_ENTRY}  # fmt: skip
    facts = {"format": plan_fields.WISDOM_FORMAT}
    (tmp_path / "wisdom-x.json").write_text(json.dumps({"facts": facts, "entries": entries}))
    old = {"facts": {"format": plan_fields.WISDOM_FORMAT - 1}, "entries": entries}
    (tmp_path / "wisdom-old.json").write_text(json.dumps(old))  # another format: not read
    monkeypatch.setenv("LSTMGRAD_CACHE_DIR", str(tmp_path))
    out = tmp_path / "out.json"
    assert plan_fields.main(["--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert len(doc["big=onednn"]["won"]) == 1 and len(doc["walk_product=packed"]["won"]) == 1
    assert doc["big=onednn"]["classes"] == 1  # the older store's entries were left out
    assert doc["threads+split_min"]["won"] == [] and doc["walk"]["max"] == pytest.approx(2.0)
    assert "field=value" in capsys.readouterr().out
    monkeypatch.setenv("LSTMGRAD_CACHE_DIR", str(tmp_path / "none"))
    assert plan_fields.main([]) == 1
