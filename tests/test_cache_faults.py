"""The plan cache whatever its files hold (lstmgrad.planning.store): every call under every
LSTMGRAD_TUNE mode returns what it returns with a clean cache, one CacheWarning per file and
process names the file, the next store (or the exit, for the budget) rewrites the file valid;
processes storing at once lose nothing; ``lstmgrad tune`` says "stored" only when the file read
back holds the measurements. docs/testing.md, "Faults and hostile input", lists each fault with
its test here."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

import lstmgrad
from lstmgrad.core.layout import Dims
from lstmgrad.fused.gemm import NUMPY_GEMM
from lstmgrad.planning import plan, store, tune
from lstmgrad.tools.cli import main

try:
    import torch
except ImportError:  # the torch drop-in's calls are left out
    torch = None

TINY = Dims(T=4, B=2, I=3, H=5, L=1, D=1, has_bias=True)
F32 = np.dtype(np.float32)
MODES = ("on", "eager", "cached", "off")
KINDS = ("numpy", "torch") if torch is not None else ("numpy",)

# what the tuner stores for a class (tune.measure_big, measure_steps, gate; "took" from
# plan._measure), as a real measurement of a small class wrote it: scripted, so that every
# measurement gives the same plan and results compare bit for bit
BIG_ENTRY = {
    "measured_at": "2026-12-08T01:10:02",
    "plan": {"big": "blas", "convert": "kernels", "transpose_threads": 1},
    "seconds": {"blas/products": 4.6e-06, "transpose/1": 3.3e-06, "transpose/2": 4.8e-06},
    "took": 1.2,  # seconds: the budget waits for about that much spare
}
_REC = {
    "blas": {"call": 1.8e-06, "prep": {"1": 5.7e-06, "2": 1.5e-05}},
    "blas_t": {"call": float("inf"), "prep": {"1": 3.8e-06, "2": 3.2e-06}},  # dropped: inf
    "loop": {"call": 4.0e-07, "prep": {"1": 5.3e-06, "2": 2.7e-06}},
}
_CANDIDATE = {"bwd_rec": "loop", "fwd_rec": "loop", "threads": 1, "walk_product": "loop"}
STEPS_ENTRY = {
    "arrangement": {
        "D": 1,
        "candidates": {"one": _CANDIDATE, "walk": {**_CANDIDATE, "walk": True}},
        "phases": {"one": [2.8e-04, 2.5e-04], "walk": [8.8e-05, 1.0e-04]},
        "steps": 48,
    },
    "measured_at": "2026-12-08T01:10:02",
    "passes": {"one": 5.3e-04, "walk": 1.9e-04, "split": float("inf")},
    "plan": {
        "fwd_walk": True,
        "pair_walks": False,
        "split_min": 0,
        "threads": 1,
        "walk": True,
        "walk_product": "loop",
        "walk_rows": 1,
    },
    "recurrent": {"bwd": copy.deepcopy(_REC), "fwd": copy.deepcopy(_REC)},
    "took": 1.1,
    "walk_products": {"loop": 1.2e-07},
}
GATE_ENTRY = {"default": 2.4e-04, "measured": 2.0e-04, "ratio": 1.18, "steps": 3, "took": 0.9}


def _key(cls: dict) -> str:
    return json.dumps(cls, sort_keys=True)


def _classes(kind: str) -> dict[str, str]:
    return {"big": _key(plan.big_class(TINY, F32, kind)),
            "steps": _key(plan.step_class(TINY, F32, kind)),
            "gate": _key(plan.gate_class(TINY, F32, kind))}  # fmt: skip


def _valid(kind: str) -> dict:
    """A store holding TINY's three classes, as the tuner writes them."""
    c = _classes(kind)
    entries = {c["big"]: BIG_ENTRY, c["steps"]: STEPS_ENTRY, c["gate"]: GATE_ENTRY}
    return {"facts": plan.wisdom(kind).facts, "entries": copy.deepcopy(entries)}


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def _with(kind: str, what: str, change) -> str:
    """TINY's valid store with ``change`` applied to its ``what`` entry (in place)."""
    data = _valid(kind)
    change(data["entries"][_classes(kind)[what]])
    return json.dumps(data)


def _set(path: str, value):
    """A change of an entry: the item at ``path`` (keys joined by "/") set to ``value``."""

    def change(entry: dict) -> None:
        *parents, leaf = path.split("/")
        for p in parents:
            entry = entry[p]
        entry[leaf] = value

    return change


def _drop(path: str):
    def change(entry: dict) -> None:
        *parents, leaf = path.split("/")
        for p in parents:
            entry = entry[p]
        del entry[leaf]

    return change


def _rekeyed(kind: str, key: str) -> str:
    data = _valid(kind)
    data["entries"][key] = data["entries"].pop(_classes(kind)["steps"])
    return json.dumps(data)


def _entry(kind: str, what: str, entry) -> str:
    data = _valid(kind)
    data["entries"][_classes(kind)[what]] = entry
    return json.dumps(data)


def _store_with(kind: str, **fields) -> str:
    return json.dumps({**_valid(kind), **fields})


# a store's content per fault: raw text (json.dumps writes NaN and Infinity as Python's json
# reads them). The entry faults leave TINY's other classes valid: they are kept, and a call
# must still run as with a clean cache (its plan needs all of them)
WISDOM_FAULTS = {
    "not-json": lambda k: "{not json",
    "cut-short": lambda k: json.dumps(_valid(k))[:200],
    "top-list": lambda k: "[1, 2]",
    "top-null": lambda k: "null",
    "no-entries": lambda k: json.dumps({"facts": plan.wisdom(k).facts}),
    "extra-key": lambda k: _store_with(k, more=1),
    "entries-null": lambda k: _store_with(k, entries=None),
    "entries-list": lambda k: _store_with(k, entries=[1, 2]),
    "other-format": lambda k: _store_with(
        k, facts={**plan.wisdom(k).facts, "format": plan.WISDOM_FORMAT - 1}
    ),
    "other-facts": lambda k: _store_with(k, facts={**plan.wisdom(k).facts, "numpy": "0.0"}),
    "deep-100000": lambda k: _store_with(k, entries="@").replace('"@"', _nested(100000)),
    "deep-50": lambda k: _store_with(k, entries="@").replace('"@"', _nested(50)),
    "deep-in-entry": lambda k: _with(k, "steps", _set("passes", "@")).replace('"@"', _nested(9)),
    "entry-1": lambda k: _entry(k, "steps", 1),
    "entry-list": lambda k: _entry(k, "big", [1, 2]),
    "entry-empty": lambda k: _with(k, "steps", lambda e: e.clear()),
    "entry-unknown-key": lambda k: _with(k, "big", _set("speed", 3)),
    "plan-unknown-field": lambda k: _with(k, "steps", _set("plan/speed", 3)),
    "plan-field-of-another-kind": lambda k: _with(k, "big", _set("plan/threads", 2)),
    "plan-text-for-int": lambda k: _with(k, "steps", _set("plan/threads", "2")),
    "plan-float-for-int": lambda k: _with(k, "steps", _set("plan/threads", 2.0)),
    "plan-bool-for-int": lambda k: _with(k, "steps", _set("plan/walk_rows", True)),
    "plan-int-for-bool": lambda k: _with(k, "steps", _set("plan/walk", 1)),
    "plan-text-for-bool": lambda k: _with(k, "steps", _set("plan/walk", "true")),
    "plan-zero-threads": lambda k: _with(k, "steps", _set("plan/threads", 0)),
    "plan-huge-int": lambda k: _with(k, "steps", _set("plan/split_min", 10**30)),
    "plan-infinite-int": lambda k: _with(k, "steps", _set("plan/split_min", float("inf"))),
    "plan-unknown-choice": lambda k: _with(k, "big", _set("plan/big", "fast")),
    "plan-null": lambda k: _with(k, "big", _set("plan", None)),
    "plan-missing": lambda k: _with(k, "big", _drop("plan")),
    "took-nan": lambda k: _with(k, "big", _set("took", float("nan"))),
    "took-infinite": lambda k: _with(k, "big", _set("took", float("inf"))),
    "took-1e308": lambda k: _with(k, "big", _set("took", 1e308)),
    "took-negative": lambda k: _with(k, "big", _set("took", -1.0)),
    "ratio-nan": lambda k: _with(k, "gate", _set("ratio", float("nan"))),
    "ratio-infinite": lambda k: _with(k, "gate", _set("ratio", float("inf"))),
    "ratio-text": lambda k: _with(k, "gate", _set("ratio", "1.5")),
    "ratio-missing": lambda k: _with(k, "gate", _drop("ratio")),
    "timing-negative": lambda k: _with(k, "steps", _set("recurrent/fwd/loop/call", -1.0)),
    "timing-nan": lambda k: _with(k, "steps", _set("arrangement/phases/one", [float("nan"), 1])),
    "phase-of-three": lambda k: _with(k, "steps", _set("arrangement/phases/one", [1, 2, 3])),
    "recurrent-missing": lambda k: _with(k, "steps", _drop("recurrent")),
    "recurrent-empty": lambda k: _with(k, "steps", _set("recurrent/fwd", {})),
    "recurrent-unknown-method": lambda k: _with(k, "steps", _set("recurrent/fwd/fast", {})),
    "prep-without-one-thread": lambda k: _with(k, "steps", _drop("recurrent/bwd/loop/prep/1")),
    "prep-bad-thread-count": lambda k: _with(k, "steps", _set("recurrent/bwd/loop/prep/x", 1.0)),
    "candidate-method-unmeasured": lambda k: _with(
        k, "steps", _set("arrangement/candidates/walk/fwd_rec", "packed")
    ),
    "candidate-one-missing": lambda k: _with(k, "steps", _drop("arrangement/candidates/one")),
    "candidate-threads-missing": lambda k: _with(
        k, "steps", _drop("arrangement/candidates/one/threads")
    ),
    "phase-of-no-candidate": lambda k: _with(
        k, "steps", _set("arrangement/phases/ghost", [1e-4, 1e-4])
    ),
    "arrangement-three-directions": lambda k: _with(k, "steps", _set("arrangement/D", 3)),
    "class-not-json": lambda k: _rekeyed(k, "{steps"),
    "class-unknown-kind": lambda k: _rekeyed(k, _key({"what": "x", "n": 1})),
    "class-not-canonical": lambda k: _rekeyed(k, json.dumps(plan.step_class(TINY, F32, k))),
    "class-zero-batch": lambda k: _rekeyed(k, _key({**plan.step_class(TINY, F32, k), "B": 0})),
}
WISDOM_BYTES = {"not-utf8": b'{"facts": "\xff\xfe"}'}

BUDGET_FAULTS = {
    "not-json": "{calls",
    "deep-100000": _nested(100000),
    "deep-50": '{"calls": ' + _nested(50) + "}",
    "null": "null",
    "list": "[3]",
    "calls-infinite": '{"calls": Infinity}',
    "calls-nan": '{"calls": NaN}',
    "calls-1e308": '{"calls": 1e308}',
    "calls-above-max": json.dumps({"calls": store.CARRY_MAX * 2}),
    "calls-negative": '{"calls": -1}',
    "calls-text": '{"calls": "3"}',
    "calls-bool": '{"calls": true}',
    "calls-missing": "{}",
    "extra-key": '{"calls": 1, "more": 2}',
}


_ONE = {"blas": {"prep": {"1": 0.0}, "call": 1e-3}}
PROBE_ENTRY = {"recurrent": {"fwd": _ONE, "bwd": _ONE}, "walk": {"library": 1e-4},
               "walk_prep": {}, "gate": 1e-5, "measured_at": "2026-12-08T00:00:00"}  # fmt: skip


@pytest.fixture
def scripted(monkeypatch):
    """Measurements scripted (the entries above, at once, the same every time; each recorded),
    the machine said to be quiet, a fresh process state."""
    seen: list[str] = []

    def fake(name: str, entry: dict):
        return lambda *args: seen.append(name) or copy.deepcopy(entry)

    monkeypatch.setattr(tune, "measure_big", fake("big", BIG_ENTRY))
    monkeypatch.setattr(tune, "measure_steps", fake("steps", STEPS_ENTRY))
    gate = {k: v for k, v in GATE_ENTRY.items() if k != "took"}
    monkeypatch.setattr(tune, "gate", fake("gate", gate))
    # the default plan's probe too: a timed one may pick another walk product from run to run,
    # whose results differ in the last bits
    monkeypatch.setattr(tune, "probe", lambda *args: copy.deepcopy(PROBE_ENTRY))
    monkeypatch.setattr(plan, "machine_busy", lambda: False)
    monkeypatch.setattr(plan, "others_cpus", lambda start: 0.0)
    plan.forget()
    yield seen
    plan.forget()


def _calls() -> list[np.ndarray]:
    """lstm_forward, lstm_backward and (with torch) lstmgrad.nn.LSTM's forward and backward on
    TINY's sizes: their results."""
    rng = np.random.default_rng(0)
    t, b, i, h = TINY.T, TINY.B, TINY.I, TINY.H
    x = rng.standard_normal((t, b, i)).astype(np.float32)
    params = [rng.standard_normal(s).astype(np.float32) * 0.3
              for s in [(4 * h, i), (4 * h, h), (4 * h,), (4 * h,)]]  # fmt: skip
    fwd = lstmgrad.lstm_forward(x, params)
    dy = rng.standard_normal(fwd.output.shape).astype(np.float32)
    zeros = [np.zeros((1, b, h), np.float32)] * 2
    grads = lstmgrad.lstm_backward(x, zeros, params, dy, None, None, *fwd.saved[:7])
    out = [fwd.output, fwd.hy, fwd.cy, grads.dx, grads.dh_prev, *grads.dparams]
    if torch is not None:
        torch.manual_seed(0)
        from lstmgrad.nn import LSTM

        lstm = LSTM(i, h)
        xt = torch.from_numpy(x).requires_grad_()
        y, _ = lstm(xt)
        y.backward(torch.from_numpy(dy))
        out += [y.detach().numpy(), xt.grad.numpy()]
        out += [p.grad.numpy() for p in lstm.parameters()]
    return out


_clean: dict[str, tuple[list[np.ndarray], plan.Plan]] = {}


def _results(mode: str) -> tuple[list[np.ndarray], plan.Plan]:
    """The calls' results and TINY's plan under the current cache directory and ``mode``."""
    os.environ["LSTMGRAD_TUNE"] = mode
    plan.forget()
    return _calls(), plan.plan_for(TINY, F32, NUMPY_GEMM)


@pytest.fixture
def clean(scripted, tmp_path, monkeypatch):
    """Per mode: the results and plan of calls with a clean cache (computed once)."""
    monkeypatch.setenv("LSTMGRAD_TUNE", "off")
    for mode in MODES:
        if mode not in _clean:
            monkeypatch.setenv("LSTMGRAD_CACHE_DIR", str(tmp_path / f"clean-{mode}"))
            _clean[mode] = _results(mode)
    scripted.clear()
    return _clean


def _cache_warnings(caught) -> dict[str, int]:
    """CacheWarning count per file named."""
    out: dict[str, int] = {}
    for w in caught:
        if issubclass(w.category, store.CacheWarning):
            path = str(w.message).split(": ")[1]
            out[path] = out.get(path, 0) + 1
    return out


def _assert_same(got, want) -> None:
    (arrays, chosen), (want_arrays, want_plan) = got, want
    assert chosen == want_plan
    assert len(arrays) == len(want_arrays)
    for a, b in zip(arrays, want_arrays, strict=True):
        np.testing.assert_array_equal(a, b)


def _store_is_valid(path: Path, kind: str) -> dict:
    data = json.loads(path.read_text())
    entries, problem = store.store_entries(data, plan.wisdom(kind).facts)
    assert problem is None and entries == data["entries"]
    return entries


def _write_wisdom(directory: Path, fault: str) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for kind in KINDS:
        path = directory / plan.wisdom(kind).path.name
        if fault in WISDOM_BYTES:
            path.write_bytes(WISDOM_BYTES[fault])
        else:
            path.write_text(WISDOM_FAULTS[fault](kind))
        paths.append(path)
    return paths


# --------------------------------------------------------------------------------------------
# any content, any mode: the calls run as with a clean cache, one warning per file, rewritten


def test_the_faults_are_what_they_say(scripted, tmp_path, monkeypatch):
    """Each fault's file as written is read as the reviewer's repro reads it: the old loader's
    json.loads either fails or gives data the schema refuses (the test of each fault can
    fail)."""
    monkeypatch.setenv("LSTMGRAD_CACHE_DIR", str(tmp_path))
    facts = plan.wisdom("numpy").facts
    assert store.store_entries(_valid("numpy"), facts) == (_valid("numpy")["entries"], None)
    for fault in [*WISDOM_FAULTS, *WISDOM_BYTES]:
        (path,) = _write_wisdom(tmp_path / fault, fault)[:1]
        try:
            data = json.loads(path.read_bytes())
        except (ValueError, RecursionError):
            continue
        if store._too_deep(data):
            continue
        entries, problem = store.store_entries(data, facts)
        assert problem is not None and len(entries) < 3, fault
    for fault, text in BUDGET_FAULTS.items():
        try:
            data = json.loads(text)
        except (ValueError, RecursionError):
            continue
        assert store._too_deep(data) or store.budget_calls(data)[1] is not None, fault


@pytest.mark.parametrize("fault", [*WISDOM_FAULTS, *WISDOM_BYTES])
def test_a_bad_store_never_fails_a_call(fault, clean, tmp_path, monkeypatch):
    for mode in MODES:
        directory = tmp_path / mode
        monkeypatch.setenv("LSTMGRAD_CACHE_DIR", str(directory))
        paths = _write_wisdom(directory, fault)
        written = [p.read_bytes() for p in paths]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = _results(mode)
            _calls()  # the same process again: no second warning
        _assert_same(got, clean[mode])
        said = _cache_warnings(caught)
        if mode == "off":  # the safe plan: nothing read
            assert said == {} and [p.read_bytes() for p in paths] == written
        else:
            assert said == {str(p): 1 for p in paths}, (mode, said)
        # the next store rewrites the file: valid, the valid entries kept, the new one added
        extra = {**plan.big_class(TINY, F32, "numpy"), "H": 99}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", store.CacheWarning)
            plan.wisdom("numpy").put(extra, {"plan": {"big": "blas"}})
        entries = _store_is_valid(paths[0], "numpy")
        assert _key(extra) in entries
        if mode == "eager":  # measured in the call: stored
            assert set(_classes("numpy").values()) <= set(entries)


@pytest.mark.parametrize("fault", BUDGET_FAULTS)
def test_a_bad_budget_never_fails_a_call_nor_lifts_the_share(fault, clean, scripted, tmp_path,
                                                             monkeypatch):  # fmt: skip
    for mode in MODES:
        directory = tmp_path / mode
        directory.mkdir()
        monkeypatch.setenv("LSTMGRAD_CACHE_DIR", str(directory))
        budget = directory / "budget.json"
        budget.write_text(BUDGET_FAULTS[fault])
        measured = len(scripted)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = _results(mode)
            _calls()
            plan._carry_over()  # at exit: the budget rewritten (under LSTMGRAD_TUNE=on)
        _assert_same(got, clean[mode])
        if mode == "on":  # read, ignored: nothing carried, nothing measured
            assert _cache_warnings(caught) == {str(budget): 1}
            assert len(scripted) == measured
            calls, problem = store.budget_calls(json.loads(budget.read_text()))
            assert problem is None and 0 < calls < 1.0  # this process's calls only
        else:  # not read
            assert _cache_warnings(caught) == {} and budget.read_text() == BUDGET_FAULTS[fault]


def test_valid_entries_beside_a_bad_one_are_kept(scripted, tmp_path, monkeypatch):
    """An entry that fails the schema is dropped; the store's others serve, with one warning
    that counts what was ignored."""
    monkeypatch.setenv("LSTMGRAD_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("LSTMGRAD_TUNE", "cached")
    (path,) = _write_wisdom(tmp_path, "plan-unknown-field")[:1]
    plan.forget()
    with pytest.warns(store.CacheWarning, match=r"ignored 1 of 3 entries .*unknown plan field"):
        entries = plan.wisdom("numpy").entries
    c = _classes("numpy")
    assert entries == {c["big"]: BIG_ENTRY, c["gate"]: GATE_ENTRY}
    assert str(path) in str(store._warned)


def test_a_valid_store_serves_without_measuring_or_warning(scripted, tmp_path, monkeypatch):
    """The schema takes what the tuner writes (infinite timings of dropped candidates too):
    a store of valid entries is read whole, and its plan serves under LSTMGRAD_TUNE=cached."""
    monkeypatch.setenv("LSTMGRAD_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("LSTMGRAD_TUNE", "cached")
    path = tmp_path / plan.wisdom("numpy").path.name
    path.write_text(json.dumps(_valid("numpy")))
    plan.forget()
    with warnings.catch_warnings():
        warnings.simplefilter("error", store.CacheWarning)
        chosen = plan.plan_for(TINY, F32, NUMPY_GEMM)
    assert chosen.walk and not scripted  # the stored walk, nothing measured


def test_an_oversized_file_is_ignored(scripted, tmp_path, monkeypatch):
    monkeypatch.setenv("LSTMGRAD_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("LSTMGRAD_TUNE", "cached")
    path = tmp_path / plan.wisdom("numpy").path.name
    text = json.dumps(_valid("numpy"))
    path.write_text(text + " " * 100)
    monkeypatch.setattr(store, "MAX_BYTES", len(text) + 50)
    plan.forget()
    with pytest.warns(store.CacheWarning, match=f"{path}: ignored: larger than"):
        assert plan.wisdom("numpy").entries == {}


def test_the_budget_written_at_exit_is_bounded(scripted, tmp_path, monkeypatch):
    monkeypatch.setenv("LSTMGRAD_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("LSTMGRAD_TUNE", "on")
    plan.note_call(1e9)
    plan._carry_over()
    assert json.loads((tmp_path / "budget.json").read_text()) == {"calls": store.CARRY_MAX}
    plan.forget()
    assert plan.budget.carried() == store.CARRY_MAX  # read back: valid


def test_a_measurements_duration_is_stored_capped(scripted, tmp_path, monkeypatch):
    """A measurement said to take longer than TOOK_MAX (a machine suspended while it ran) is
    stored with TOOK_MAX: never a value the schema refuses on reading it back."""
    monkeypatch.setenv("LSTMGRAD_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("LSTMGRAD_TUNE", "eager")
    monkeypatch.setattr(store, "TOOK_MAX", 1e-12)  # any measurement takes longer
    plan.plan_for(TINY, F32, NUMPY_GEMM)
    entries = _store_is_valid(plan.wisdom("numpy").path, "numpy")
    assert {e["took"] for e in entries.values()} == {1e-12} and len(entries) == 3


_CHILD = """
import json
import numpy as np
import lstmgrad
rng = np.random.default_rng(0)
x = rng.standard_normal((4, 2, 3)).astype(np.float32)  # TINY's sizes: its classes are read
params = [rng.standard_normal(s).astype(np.float32) for s in [(20, 3), (20, 5), (20,), (20,)]]
for _ in range(3):
    out = lstmgrad.lstm_forward(x, params)
print(json.dumps(out.output.tolist()))
"""


def test_at_exit_a_bad_budget_or_store_prints_no_traceback(tmp_path):
    """Under LSTMGRAD_TUNE=on, processes whose budget.json and store hold each fault: status 0,
    no traceback, the results of a clean cache, one warning per file, a valid budget left."""
    env = {**os.environ, "LSTMGRAD_TUNE": "on", "PYTHONWARNINGS": "always"}
    reference = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True,
                               env={**env, "LSTMGRAD_CACHE_DIR": str(tmp_path / "clean")},
                               timeout=300, check=True)  # fmt: skip
    facts = json.loads(subprocess.run(
        [sys.executable, "-c", "import json; from lstmgrad.planning import plan; "
         "w = plan.wisdom('numpy'); print(json.dumps([w.facts, w.path.name]))"],
        capture_output=True, text=True, env=env, timeout=300, check=True).stdout)  # fmt: skip
    wisdom_faults = list(WISDOM_FAULTS)
    runs = []
    for n, (fault, text) in enumerate(BUDGET_FAULTS.items()):
        directory = tmp_path / fault
        directory.mkdir()
        (directory / "budget.json").write_text(text)
        store_fault = wisdom_faults[n * 3 % len(wisdom_faults)]
        (directory / facts[1]).write_text(
            WISDOM_FAULTS[store_fault]("numpy").replace(
                json.dumps(plan.wisdom("numpy").facts), json.dumps(facts[0])
            )
        )
        proc = subprocess.Popen([sys.executable, "-c", _CHILD], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True,
                                env={**env, "LSTMGRAD_CACHE_DIR": str(directory)})  # fmt: skip
        runs.append((fault, store_fault, directory, proc))
        if len(runs) % 4 == 0:  # a few at a time: 2 cores
            runs[-4][3].wait()
    for fault, store_fault, directory, proc in runs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0 and "Traceback" not in err, (fault, err)
        assert out == reference.stdout, fault
        assert err.count(f"{directory / 'budget.json'}: ignored") == 1, (fault, err)
        assert err.count(f"{directory / facts[1]}: ") == 1, (fault, store_fault, err)
        calls, problem = store.budget_calls(json.loads((directory / "budget.json").read_text()))
        assert problem is None and calls > 0, fault


# --------------------------------------------------------------------------------------------
# processes storing at once


_WRITER = """
import os, sys, time
from lstmgrad.planning import plan
rank, go = int(sys.argv[1]), sys.argv[2]
w = plan.wisdom("numpy")
open(f"{go}.{rank}", "w").close()  # ready
while not os.path.exists(go):
    time.sleep(0.005)
for i in range(50):
    w.put({"what": "big", "kind": "numpy", "dtype": "float32", "N": rank + 1, "I": i + 1, "H": 1},
          {"plan": {"big": "blas"}, "took": 0.5})
"""


def _start(go: Path, names, procs) -> None:
    """Once every process said it is ready (imported, about to store), let them all go."""
    deadline = time.monotonic() + 300
    while not all(Path(f"{go}.{n}").exists() for n in names):
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs)
        time.sleep(0.01)
    go.touch()


def test_six_processes_storing_at_once_lose_nothing(tmp_path):
    """Six processes put 50 entries each into one store, all at once (each put reads, merges
    and replaces the file): all 300 are there, in a valid file."""
    env = {**os.environ, "LSTMGRAD_CACHE_DIR": str(tmp_path / "cache")}
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, str(rank), str(go)], env=env,
                              stderr=subprocess.PIPE, text=True) for rank in range(6)]  # fmt: skip
    _start(go, range(6), procs)
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
    (path,) = (tmp_path / "cache").glob("wisdom-*.json")
    data = json.loads(path.read_text())
    assert len(data["entries"]) == 300
    assert store.store_entries(data, data["facts"]) == (data["entries"], None)


_RANK = """
import json, os, sys, time
import numpy as np
import lstmgrad
from lstmgrad.planning import plan
plan.machine_busy = lambda: False  # the other rank measures beside this one: by design
plan.others_cpus = lambda start: 0.0
h, d, go = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
rng = np.random.default_rng(h)
x = rng.standard_normal((3, 2, 3)).astype(np.float32)
params = [rng.standard_normal(s).astype(np.float32)
          for s in [(4 * h, 3), (4 * h, h), (4 * h,), (4 * h,)] * d]
open(f"{go}.{h}", "w").close()  # ready
while not os.path.exists(go):
    time.sleep(0.005)
lstmgrad.lstm_forward(x, params, bidirectional=d == 2)
"""


def test_two_ranks_measuring_into_one_cache_keep_both(tmp_path):
    """Two processes of one job (DDP ranks) measure different shape classes under
    LSTMGRAD_TUNE=eager into one cache directory at once, for real: both ranks' classes are
    stored, in a file the schema takes whole (what the tuner writes passes it)."""
    cache = tmp_path / "cache"
    env = {**os.environ, "LSTMGRAD_CACHE_DIR": str(cache), "LSTMGRAD_TUNE": "eager"}
    go = tmp_path / "go"
    ranks = [(2, 1), (3, 2)]  # (H, D): one class each
    procs = [subprocess.Popen([sys.executable, "-c", _RANK, str(h), str(d), str(go)], env=env,
                              stderr=subprocess.PIPE, text=True) for h, d in ranks]  # fmt: skip
    _start(go, [h for h, _ in ranks], procs)
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0 and "CacheWarning" not in err, err
    (path,) = cache.glob("wisdom-*.json")
    data = json.loads(path.read_text())
    assert store.store_entries(data, data["facts"]) == (data["entries"], None)
    for h, d in ranks:
        dims = Dims(T=3, B=2, I=3, H=h, L=1, D=d, has_bias=True)
        for cls in (plan.big_class(dims, F32, "numpy"), plan.step_class(dims, F32, "numpy")):
            assert _key(cls) in data["entries"], cls


def test_a_store_is_written_without_the_lock_where_it_cannot_be_had(scripted, tmp_path,
                                                                    monkeypatch):  # fmt: skip
    """No fcntl (another OS), a file system without locks, a lock another process holds too
    long: the store is written all the same (as before the lock)."""
    import fcntl

    monkeypatch.setenv("LSTMGRAD_CACHE_DIR", str(tmp_path))
    w = plan.wisdom("numpy")

    def put(n: int) -> None:
        w.put({**plan.big_class(TINY, F32, "numpy"), "H": n}, {"plan": {}})
        assert w.stored({**plan.big_class(TINY, F32, "numpy"), "H": n})

    with monkeypatch.context() as m:
        m.setitem(sys.modules, "fcntl", None)  # import fcntl fails
        put(1)

    def no_locks(fd, op):
        raise OSError(37, "No locks available")

    with monkeypatch.context() as m:
        m.setattr(fcntl, "flock", no_locks)
        put(2)
    monkeypatch.setattr(store, "LOCK_WAIT", 0.2)
    held = os.open(tmp_path / f".wisdom-{w.key}.lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(held, fcntl.LOCK_EX)  # another open file: the writer's flock waits
        t0 = time.monotonic()
        put(3)
        assert time.monotonic() - t0 >= 0.2
    finally:
        os.close(held)
    with store.locked(tmp_path / "free.lock") as got:
        assert got  # and one that is free is taken


def test_an_unwritable_cache_keeps_measurements_in_memory(scripted, tmp_path, monkeypatch):
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("LSTMGRAD_CACHE_DIR", str(tmp_path / "file" / "cache"))
    w = plan.wisdom("numpy")
    cls = plan.big_class(TINY, F32, "numpy")
    w.put(cls, {"plan": {}})
    assert w.get(cls) == {"plan": {}} and not w.stored(cls)
    assert w.error is not None and "Not a directory" in w.error


# --------------------------------------------------------------------------------------------
# lstmgrad tune tells the truth


def _unwritable(tmp_path: Path) -> str:
    (tmp_path / "file").write_text("")
    return str(tmp_path / "file" / "cache")


@pytest.mark.parametrize("where", ["proc", "under-a-file"])
def test_tune_fails_when_the_cache_cannot_be_written(where, scripted, tmp_path, monkeypatch,
                                                     capsys):  # fmt: skip
    if where == "proc" and not Path("/proc/self").exists():
        pytest.skip("no /proc here")
    directory = "/proc/lstmgrad-cache" if where == "proc" else _unwritable(tmp_path)
    monkeypatch.setenv("LSTMGRAD_CACHE_DIR", directory)
    monkeypatch.setenv("LSTMGRAD_TUNE", "on")
    rc = main(["tune", "--shape", "4,2,3,5", "--input", "numpy"])
    out, err = capsys.readouterr()
    assert rc == 1 and scripted  # measured, but not stored
    assert "; stored" not in out and "not stored: the cache could not be written ([Errno" in out
    assert "1 of 1 shapes stored nothing" in err


def test_tune_reads_back_what_it_says_is_stored(scripted, tmp_path, monkeypatch, capsys):
    """A write that failed without a word (here: none made) is caught by reading the file back;
    one that reached the disk is reported stored."""
    monkeypatch.setenv("LSTMGRAD_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("LSTMGRAD_TUNE", "on")
    with monkeypatch.context() as m:
        m.setattr(plan.Wisdom, "_save", lambda self: None)
        rc = main(["tune", "--shape", "4,2,3,5", "--input", "numpy"])
    out, err = capsys.readouterr()
    assert rc == 1 and "read back lacks the measurements" in out and "; stored" not in out
    plan.forget()
    rc = main(["tune", "--shape", "4,2,3,5", "--input", "numpy"])
    out, err = capsys.readouterr()
    assert rc == 0 and "; stored" in out and err == ""
    entries = _store_is_valid(plan.wisdom("numpy").path, "numpy")
    assert _key(plan.step_class(TINY, F32, "numpy")) in entries
