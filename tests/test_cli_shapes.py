"""One shape syntax for every command: ``T,B,I,H[,L[,D]]`` or a name of the one table of named
shapes (lstmgrad.tools.shapes), read by ``lstmgrad bench``, ``lstmgrad tune`` and benchmarks/."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from lstmgrad.tools import shapes
from lstmgrad.tools.cli import main

ROOT = Path(__file__).resolve().parent.parent
DENSE = [s.id for s in shapes.SHAPES if not s.varlen]


@pytest.mark.parametrize(
    "text, sizes",
    [
        ("100,32,256,256", (100, 32, 256, 256, 1, 1)),
        ("5,2,3,4,3", (5, 2, 3, 4, 3, 1)),
        (" 5, 2, 3, 4, 2, 2 ", (5, 2, 3, 4, 2, 2)),
        ("med-6", (100, 64, 512, 512, 2, 1)),
        ("small-1", (3, 12, 16, 16, 8, 2)),
    ],
)
def test_a_shape_is_sizes_or_a_name(text, sizes):
    s = shapes.parse_shape(text)
    assert (s.T, s.B, s.I, s.H, s.L, s.D) == sizes
    assert s.sizes() == dict(zip("TBIHLD", sizes, strict=True))
    assert not s.varlen


def test_sizes_get_their_label_as_id():
    assert shapes.parse_shape("5,2,3,4").id == "T5-B2-I3-H4-L1-D1"


@pytest.mark.parametrize(
    "text, why",
    [
        ("a,b,c,d", "T = 'a' is not an integer"),
        ("5,2,x,4", "I = 'x' is not an integer"),
        ("5,2,3", "3 values, not 4 to 6"),
        ("5,2,3,4,1,1,1", "7 values, not 4 to 6"),
        ("7", "1 value, not 4 to 6"),
        ("5,2,3,0", "H = 0 is not positive"),
        ("5,-2,3,4", "B = -2 is not positive"),
        ("5,2,3,4,1,3", "D = 3 (directions) must be 1 or 2"),
        ("med-7", "no shape has that name (known: small-1, "),
    ],
)
def test_a_malformed_shape_names_the_fault_and_the_form(text, why):
    with pytest.raises(ValueError) as exc:
        shapes.parse_shape(text)
    msg = str(exc.value)
    assert msg.startswith("expected T,B,I,H[,L[,D]] (positive integers, D 1 or 2) or a shape name")
    assert f"got {text.strip()!r}: " in msg and why in msg, msg


def test_variable_lengths_only_where_the_caller_runs_them():
    with pytest.raises(ValueError, match="varlen-1 has variable lengths .*dense shapes only"):
        shapes.parse_shape("varlen-1")
    with pytest.raises(ValueError, match="varlen-2 has variable lengths"):
        shapes.parse_names("med-3,varlen-2")
    assert shapes.parse_shape("varlen-1", varlen=True).lengths_range == (50, 100)
    assert [s.id for s in shapes.parse_names("varlen-2,med-1", varlen=True)] == [
        "varlen-2",
        "med-1",
    ]


def test_names_keep_their_order_and_reject_a_bad_one():
    assert [s.id for s in shapes.parse_names(" large-2 ,small-1")] == ["large-2", "small-1"]
    with pytest.raises(ValueError, match=r"unknown shape name 'med-7'; known: small-1, .*large-2$"):
        shapes.parse_names("med-3,med-7")
    with pytest.raises(ValueError, match="an empty name"):
        shapes.parse_names("med-3,")


def test_the_readme_table_names_only_shapes_of_the_table():
    """Every shape of the README's benchmark table, with its sizes, is one of the table's."""
    rows = re.findall(r"^\| ([a-z]+-\d) (?:\(([\d ]+)\)|\(lengths)", (ROOT / "README.md").read_text(),
                      re.M)  # fmt: skip
    assert [name for name, _ in rows] == [s.id for s in shapes.SHAPES]
    for name, sizes in rows:
        if sizes:
            assert tuple(map(int, sizes.split())) == tuple(shapes.BY_ID[name].sizes().values())


# --------------------------------------------------------------------------------------------
# lstmgrad bench


@pytest.fixture
def bench_run(monkeypatch):
    """bench.run replaced by a recorder of the shapes it is given."""
    import lstmgrad.tools.bench

    seen: dict = {}

    def run(got_shapes, dtype, rounds, inp, progress):
        seen.update(got_shapes)
        return {"machine": {}, "config": {}, "results": []}

    monkeypatch.setattr(lstmgrad.tools.bench, "run", run)
    monkeypatch.setattr("lstmgrad.tools.cli._bench_tables", lambda doc: "")
    return seen


def test_bench_takes_four_sizes(bench_run):
    assert main(["bench", "--shape", "100,32,256,256"]) == 0
    assert bench_run == {"custom": (100, 32, 256, 256, 1, 1)}


def test_bench_takes_a_name_as_its_shape(bench_run):
    assert main(["bench", "--shape", "med-6"]) == 0
    assert bench_run == {"med-6": (100, 64, 512, 512, 2, 1)}


def test_bench_takes_every_dense_shape_of_the_table(bench_run):
    assert main(["bench", "--shapes", ",".join(DENSE)]) == 0
    assert bench_run == {n: tuple(shapes.BY_ID[n].sizes().values()) for n in DENSE}
    assert len(bench_run) == 10


def run_rejected(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--shape", "a,b,c,d"], "argument --shape: expected T,B,I,H[,L[,D]]"),
        (["--shape", "3,2,4"], "argument --shape: expected T,B,I,H[,L[,D]]"),
        (["--shapes", "med-7"], "argument --shapes: unknown shape name 'med-7'; known: small-1"),
        (["--shapes", "varlen-1"], "argument --shapes: varlen-1 has variable lengths"),
        (["--shape", "varlen-2"], "argument --shape: varlen-2 has variable lengths"),
    ],
)
def test_bench_rejects_a_bad_shape_naming_the_option(argv, says, bench_run, capsys):
    err = run_rejected(["bench", *argv], capsys)
    assert says in err and "invalid literal" not in err, err
    assert "Traceback" not in err and not bench_run


def test_bench_help_lists_the_named_shapes(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    out = capsys.readouterr().out
    for s in shapes.SHAPES:
        if s.varlen:
            assert s.id in out  # named as timed by benchmarks/run.py
        else:
            assert re.search(rf"^  {s.id} +{s.T},{s.B},{s.I},{s.H},{s.L},{s.D}\b", out, re.M), s.id
    assert "T,B,I,H[,L[,D]]" in out


# --------------------------------------------------------------------------------------------
# lstmgrad tune


@pytest.fixture
def tune_shapes(monkeypatch):
    import lstmgrad.ops.api

    seen: list = []

    def fake(got, kind, dtype):
        seen.extend(got)
        return []

    monkeypatch.setattr(lstmgrad.ops.api, "tune_shapes", fake)
    return seen


def test_tune_takes_sizes_and_names(tune_shapes, tmp_path, monkeypatch):
    monkeypatch.setenv("LSTMGRAD_CACHE_DIR", str(tmp_path))
    argv = ["tune", "--shape", "5,2,3,4", "--shape", "med-3", "--input", "numpy"]
    assert main(argv) == 0
    assert tune_shapes == [
        {"T": 5, "B": 2, "I": 3, "H": 4, "L": 1, "D": 1},
        {"T": 100, "B": 32, "I": 256, "H": 256, "L": 1, "D": 1},
    ]


def test_tune_rejects_what_bench_rejects(tune_shapes, capsys):
    err = run_rejected(["tune", "--shape", "a,b,c,d"], capsys)
    assert "argument --shape: expected T,B,I,H[,L[,D]]" in err and "'a' is not an integer" in err
    assert "varlen-1 has variable lengths" in run_rejected(["tune", "--shape", "varlen-1"], capsys)
    assert not tune_shapes


def test_tune_help_lists_the_named_shapes(capsys):
    with pytest.raises(SystemExit):
        main(["tune", "--help"])
    out = capsys.readouterr().out
    assert all(n in out for n in DENSE) and "T,B,I,H[,L[,D]]" in out


# --------------------------------------------------------------------------------------------
# benchmarks/


def test_benchmarks_read_the_package_table_without_importing_lstmgrad():
    """benchmarks/shapes.py serves the package's table to the worker that times torch, which
    must not import lstmgrad; its select() exits with the parser's message."""
    code = (
        "import sys; sys.path.insert(0, 'benchmarks')\n"
        "import shapes\n"
        "assert 'lstmgrad' not in sys.modules, 'lstmgrad imported'\n"
        "print(','.join(s.label() for s in shapes.SHAPES))\n"
        "print(','.join(s.id for s in shapes.select('med-6,small-1')))\n"
        "print(len(shapes.select(None)), len(shapes.select(None, varlen=False)))\n"
        "shapes.select('med-3,nope')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env={**os.environ}, check=False)  # fmt: skip
    lines = proc.stdout.splitlines()
    assert lines[0] == ",".join(s.label() for s in shapes.SHAPES), proc.stderr
    assert lines[1:] == ["med-6,small-1", "12 10"]
    assert proc.returncode == 1 and "--shapes: unknown shape name 'nope'" in proc.stderr
