"""``lstmgrad tune --show``: a line per stored class with what it decided and when, on a store
written here with known entries; ``--json`` the raw record."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from lstmgrad.core.layout import Dims
from lstmgrad.planning import plan
from lstmgrad.tools.cli import main

DIMS = Dims(5, 3, 4, 6, 1, 1, True)  # T, B, I, H, L, D, has_bias
F32 = np.dtype(np.float32)


@pytest.fixture
def empty_store(monkeypatch, tmp_path):
    monkeypatch.setenv("LSTMGRAD_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("LSTMGRAD_TUNE", "cached")
    plan.forget()
    yield plan.wisdom("numpy")
    plan.forget()


ENTRIES = {
    "big": {"plan": {"big": "blas", "transpose_threads": 2, "convert": "kernels"},
            "measured_at": "2026-12-01T10:00:00", "took": 1.5},
    "steps": {"plan": {"threads": 2, "split_min": 0, "walk": True, "walk_product": "loop"},
              "measured_at": "2026-12-01T10:00:05", "recurrent": {}},
    "gate": {"steps": 8, "default": 0.002, "measured": 0.0015, "ratio": 1.33},
    "probe": {"recurrent": {}, "measured_at": "2026-12-01T09:59:58", "probed_in": 0.1},
}  # fmt: skip


def fill(store: plan.Wisdom) -> None:
    store.put(plan.probe_class(DIMS, F32, "numpy"), ENTRIES["probe"])
    store.put(plan.gate_class(DIMS, F32, "numpy"), ENTRIES["gate"])
    store.put(plan.step_class(DIMS, F32, "numpy"), ENTRIES["steps"])
    store.put(plan.big_class(DIMS, F32, "numpy"), ENTRIES["big"])


def show(capsys, *extra: str) -> str:
    assert main(["tune", "--show", "--input", "numpy", *extra]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    return captured.out


def test_show_prints_a_line_per_class(empty_store, capsys):
    fill(empty_store)
    lines = show(capsys).splitlines()
    assert lines[0] == "mode     cached (LSTMGRAD_TUNE)"
    assert lines[2] == f"numpy    {empty_store.path}: 4 entries"
    rows = [line.split("  ") for line in lines[3:8]]
    cells = [[c.strip() for c in row if c.strip()] for row in rows]
    assert cells == [
        ["kind", "class", "plan (fields other than the safe plan's)", "measured"],
        ["big", "float32 N16 I4 H6", "transpose_threads=2", "2026-12-01T10:00:00"],
        ["steps", "float32 B4 H6 D1", "threads=2, walk=True", "2026-12-01T10:00:05"],
        ["gate", "float32 T8 B4 I4 H6 D1",
         "measured plan 1.33x as fast as the default: measured plan used", "-"],
        ["probe", "float32 N16 B4 I4 H6 D1", "probe (product speeds for the default plan)",
         "2026-12-01T09:59:58"],
    ]  # fmt: skip
    assert lines[-1] == "the whole record: lstmgrad tune --show --json"
    assert lines[8] == ""  # the table ends (a torch store follows where torch is imported)
    assert not any(w in line for line in lines for w in ("took", "seconds", "recurrent"))


def test_a_gate_below_the_margin_and_a_safe_plan(empty_store, capsys):
    empty_store.put(plan.gate_class(DIMS, F32, "numpy"), {**ENTRIES["gate"], "ratio": 1.01})
    empty_store.put(plan.big_class(DIMS, F32, "numpy"), {"plan": {"big": "blas"},
                                                         "measured_at": "x"})  # fmt: skip
    out = show(capsys)
    assert "measured plan 1.01x as fast as the default: default plan kept" in out
    assert re.search(r"^big +float32 N16 I4 H6 +safe +x$", out, re.M), out


def test_forced_fields_are_shown(empty_store, capsys, monkeypatch):
    monkeypatch.setenv("LSTMGRAD_PLAN", "threads=1,fwd_rec=blas")
    assert "forced   threads=1, fwd_rec=blas (LSTMGRAD_PLAN)" in show(capsys)


def test_an_empty_store_says_so(empty_store, capsys):
    assert f"numpy    {empty_store.path}: 0 entries\n" in show(capsys)


def test_json_gives_the_raw_record(empty_store, capsys):
    fill(empty_store)
    record = json.loads(show(capsys, "--json"))
    assert record["mode"] == "cached"
    entries = record["numpy"]["entries"]
    assert {json.loads(k)["what"]: v for k, v in entries.items()} == ENTRIES
    assert main(["tune", "--json", "--input", "numpy"]) == 0  # --json alone shows too
    assert json.loads(capsys.readouterr().out) == record
