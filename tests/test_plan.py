"""Execution plans: forced fields and their errors, the tuning modes, the store of measurements
(round trip, clear, other machines' files, busy machines), a calibration on a small shape, the
plans' fallbacks, the NumPy back end's results under every plan field, ``lstmgrad tune``."""

from __future__ import annotations

import dataclasses
import json
import os
import threading
import time

import numpy as np
import pytest

import lstmgrad
from lstmgrad.core.layout import Dims
from lstmgrad.fused.gemm import NUMPY_GEMM
from lstmgrad.ops import api
from lstmgrad.planning import openmp, plan, tune
from lstmgrad.planning import store as store_module
from lstmgrad.planning.plan import SAFE, Plan, forced
from lstmgrad.planning.store import CacheWarning

TINY = Dims(T=4, B=2, I=3, H=5, L=1, D=1, has_bias=True)
TINY_BI = dataclasses.replace(TINY, D=2)


@pytest.fixture
def store(monkeypatch, tmp_path):
    """Measurements at first sight, in an empty directory of their own; this process's memory
    cleared."""
    monkeypatch.setenv("LSTMGRAD_TUNE", "eager")
    monkeypatch.setenv("LSTMGRAD_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(plan, "machine_busy", lambda: False)
    monkeypatch.setattr(plan, "others_cpus", lambda start: 0.0)  # whatever else runs here
    plan.forget()
    yield tmp_path
    plan.forget()


def _no_measuring(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("measured although the plan should come from the store")

    monkeypatch.setattr(tune, "measure_big", refuse)
    monkeypatch.setattr(tune, "measure_steps", refuse)


# --------------------------------------------------------------------------------------------
# forced fields


def test_plan_environment_variable_parsed(monkeypatch):
    monkeypatch.setenv("LSTMGRAD_PLAN", " threads=3, fwd_rec=loop ,pair_walks=off,split_min=0")
    assert plan.overrides() == {"threads": 3, "fwd_rec": "loop", "pair_walks": False,
                                "split_min": 0}  # fmt: skip
    with forced(threads=1, big="onednn"):  # forced() wins over the environment
        assert plan.overrides()["threads"] == 1 and plan.overrides()["big"] == "onednn"
    assert plan.overrides()["threads"] == 3


@pytest.mark.parametrize(
    "text, names",
    [
        ("threads", "field=value"),
        ("thread=2", "'thread'"),
        ("threads=0", "threads must be an integer >= 1, got '0'"),
        ("threads=two", "threads"),
        ("split_min=-1", "split_min must be an integer >= 0"),
        ("fwd_rec=fast", "fwd_rec must be one of"),
        ("big=loop", "big must be one of ('blas', 'onednn')"),
        ("weight_grad=rows", "'weight_grad'"),  # a field no longer in the plan
        ("pair_walks=maybe", "pair_walks must be true or false"),
        ("walk=2", "walk must be true or false"),
    ],
)
def test_bad_plan_environment_variable_named_in_the_error(monkeypatch, text, names):
    monkeypatch.setenv("LSTMGRAD_PLAN", text)
    with pytest.raises(ValueError, match="LSTMGRAD_PLAN") as info:
        plan.overrides()
    assert names in str(info.value)


@pytest.mark.parametrize(
    "fields, names",
    [
        (dict(thread=2), "unknown plan field 'thread'"),
        (dict(threads=0), "threads must be an integer >= 1"),
        (dict(threads=1.5), "threads must be an integer"),
        (dict(bwd_rec="fast"), "bwd_rec must be one of"),
    ],
)
def test_bad_forced_fields_named_in_the_error(fields, names):
    with pytest.raises(ValueError, match="forced") as info:
        with forced(**fields):
            pass
    assert names in str(info.value)


def test_forced_fields_nest_and_stay_in_their_thread():
    seen = {}

    def other():
        seen["other"] = plan.overrides()

    with forced(threads=1):
        with forced(fwd_rec="loop"):
            assert plan.overrides() == {"threads": 1, "fwd_rec": "loop"}
            t = threading.Thread(target=other)
            t.start()
            t.join()
        assert plan.overrides() == {"threads": 1}
    assert plan.overrides() == {} and seen["other"] == {}


@pytest.mark.parametrize(
    "value, want",
    [
        ("on", "on"),
        ("", "on"),
        ("OFF", "off"),
        ("0", "off"),
        ("safe", "off"),
        ("cached", "cached"),
        ("eager", "eager"),
    ],
)
def test_tune_modes(monkeypatch, value, want):
    monkeypatch.setenv("LSTMGRAD_TUNE", value)
    assert plan.mode() == want


# --------------------------------------------------------------------------------------------
# feasible plans


class _FourThreadGemm:
    """NumPy's methods on a BLAS said to have four threads (the cap is the other limit)."""

    kind = "numpy"
    product_methods = staticmethod(NUMPY_GEMM.product_methods)
    fixed_methods = staticmethod(NUMPY_GEMM.fixed_methods)
    walk_gemm = staticmethod(NUMPY_GEMM.walk_gemm)
    library_lstm = staticmethod(NUMPY_GEMM.library_lstm)

    @staticmethod
    def threads() -> int:
        return 4


def test_feasible_replaces_what_the_call_cannot_run(monkeypatch):

    gemm = _FourThreadGemm()
    monkeypatch.setattr(openmp, "parallel_threads", lambda: 2)
    assert plan.feasible(Plan(threads=8), TINY, np.float32, NUMPY_GEMM).threads <= max(
        1, NUMPY_GEMM.threads()
    )  # never more than the BLAS itself may use
    wild = Plan(big="onednn", fwd_rec="packed", bwd_rec="onednn", threads=8, split_min=5,
                pair_walks=True, transpose_threads=8)  # fmt: skip
    got = plan.feasible(wild, TINY, np.float32, gemm)
    # NumPy has no oneDNN or packed weights; one direction has no pairs; at most 2 threads
    assert got == Plan(big="blas", fwd_rec="blas", bwd_rec="blas", threads=2, split_min=5,
                       pair_walks=False, transpose_threads=2)  # fmt: skip
    assert plan.feasible(wild, TINY_BI, np.float32, gemm).pair_walks
    # a walk runs anywhere, but the pair walks take precedence where they run
    walking = dataclasses.replace(wild, walk=True)
    assert plan.feasible(walking, TINY, np.float16, gemm).walk
    assert not plan.feasible(walking, TINY_BI, np.float32, gemm).walk
    # float16 storage: its activations pass through one scratch, so no pairs
    assert not plan.feasible(wild, TINY_BI, np.float16, gemm).pair_walks
    monkeypatch.setattr(openmp, "parallel_threads", lambda: 1)
    one = plan.feasible(wild, TINY_BI, np.float32, gemm)
    assert one.threads == 1 and not one.pair_walks and one.transpose_threads == 1


def test_tune_off_runs_the_safe_plan(monkeypatch, tmp_path):
    monkeypatch.setenv("LSTMGRAD_TUNE", "off")
    monkeypatch.setenv("LSTMGRAD_CACHE_DIR", str(tmp_path))
    _no_measuring(monkeypatch)
    plan.forget()
    assert plan.plan_for(TINY, np.dtype(np.float32), NUMPY_GEMM) == SAFE
    with forced(fwd_rec="loop"):
        assert plan.plan_for(TINY, np.dtype(np.float32), NUMPY_GEMM).fwd_rec == "loop"
    assert not list(tmp_path.iterdir())


# --------------------------------------------------------------------------------------------
# the measuring budget (LSTMGRAD_TUNE=on)


@pytest.fixture
def budgeted(store, monkeypatch):
    monkeypatch.setenv("LSTMGRAD_TUNE", "on")
    return store


def test_budget_serves_the_safe_plan_until_the_calls_pay_for_a_measurement(budgeted, monkeypatch):
    seen = []
    real = tune.measure_steps
    monkeypatch.setattr(tune, "measure_steps", lambda *a: seen.append(1) or real(*a))
    # the big products' class measured at once: the budget left for the steps' class must not
    # depend on how fast this machine measures (a loaded one took the whole 1.1 s)
    monkeypatch.setattr(tune, "measure_big", lambda cls, gemm: {"plan": {}})
    monkeypatch.setattr(plan, "MEASURE_GUESS", 1.0)
    f32 = np.dtype(np.float32)
    assert plan.plan_for(TINY, f32, NUMPY_GEMM) == SAFE and not seen  # nothing spent yet
    plan.note_call(5.0)  # 10% of 5 s: 0.5 s, less than a measurement is expected to take
    assert plan.plan_for(TINY, f32, NUMPY_GEMM) == SAFE and not seen
    plan.note_call(6.0)  # 1.1 s: one measurement; the plan is made again
    measured = plan.plan_for(TINY, f32, NUMPY_GEMM)
    assert seen == [1] and "steps" in _stored(budgeted)
    assert plan.budget.measured > 0 and plan.budget.runs
    assert measured == plan.plan_for(TINY, f32, NUMPY_GEMM) and seen == [1]  # final: kept
    # a budget spent: another class waits, served by the safe plan
    plan.budget.measured = plan.MEASURE_SHARE * plan.budget.calls
    assert plan.plan_for(dataclasses.replace(TINY, H=7), f32, NUMPY_GEMM) == SAFE


def _stored(directory) -> set[str]:
    """The kinds of entries ("probe", "big", "steps", "gate") stored in ``directory``."""
    return {json.loads(key)["what"] for path in directory.glob("wisdom-*.json")
            for key in json.loads(path.read_text())["entries"]}  # fmt: skip


def test_budget_carries_unspent_call_time_to_the_next_process(budgeted, monkeypatch):
    plan.note_call(3.0)
    plan._carry_over()
    assert json.loads((budgeted / "budget.json").read_text())["calls"] == pytest.approx(3.0)
    plan.forget()  # a new process: it starts with what the last one left
    assert plan.budget.carried() == pytest.approx(3.0) and plan.budget.calls == pytest.approx(3.0)
    monkeypatch.setenv("LSTMGRAD_TUNE", "off")  # only the budgeted mode carries
    plan.note_call(4.0)
    plan._carry_over()
    assert json.loads((budgeted / "budget.json").read_text())["calls"] == pytest.approx(3.0)


def test_tune_measures_whatever_the_budget(budgeted):
    (row,) = api.tune_shapes([{"T": 4, "B": 2, "I": 3, "H": 5, "L": 1, "D": 1}], "numpy",
                              "float32")  # fmt: skip
    assert row["not_stored"] == "" and row["plan"] != SAFE or list(budgeted.glob("wisdom-*"))


def test_batch_sizes_share_classes_by_power_of_two():
    f32 = np.dtype(np.float32)
    cls = [plan.step_class(dataclasses.replace(TINY, B=b), f32, "numpy")["B"]
           for b in (1, 2, 3, 4, 5, 33, 64, 65)]  # fmt: skip
    assert cls == [1, 2, 4, 4, 8, 64, 64, 128]


# --------------------------------------------------------------------------------------------
# measurements and their store


def test_calibration_stored_and_reused(store, monkeypatch):
    got = plan.plan_for(TINY_BI, np.dtype(np.float32), NUMPY_GEMM)
    assert got == plan.feasible(got, TINY_BI, np.float32, NUMPY_GEMM)  # already runnable
    files = list(store.glob("wisdom-*.json"))
    assert len(files) == 1
    data = json.loads(files[0].read_text())
    assert data["facts"]["kind"] == "numpy"
    classes = [json.loads(k) for k in data["entries"]]
    whats = sorted(c["what"] for c in classes)  # the gate where the measured plan differs
    assert whats in (["big", "steps"], ["big", "gate", "steps"])
    steps = data["entries"][json.dumps(plan.step_class(TINY_BI, np.float32, "numpy"),
                                       sort_keys=True)]  # fmt: skip
    assert set(steps["recurrent"]["fwd"]) == set(NUMPY_GEMM.fixed_methods(np.float32))
    # a later process (here: this one, its memory cleared) reads it without measuring
    plan.forget()
    _no_measuring(monkeypatch)
    assert plan.plan_for(TINY_BI, np.dtype(np.float32), NUMPY_GEMM) == got
    monkeypatch.setenv("LSTMGRAD_TUNE", "cached")
    plan.forget()
    assert plan.plan_for(TINY_BI, np.dtype(np.float32), NUMPY_GEMM) == got
    # cached mode, an unseen class: the safe plan, nothing measured
    unseen = dataclasses.replace(TINY_BI, H=7)
    assert plan.plan_for(unseen, np.dtype(np.float32), NUMPY_GEMM) == SAFE


def test_recurrent_method_follows_the_sequence_length():
    # packing pays after 1000 steps with its copy on two threads, after 3000 on one
    times = {"blas": {"prep": {"1": 0.0, "2": 0.0}, "call": 2e-6},
             "packed": {"prep": {"1": 3e-3, "2": 1e-3}, "call": 1e-6}}  # fmt: skip
    assert tune.choose_recurrent(times, 10) == "blas"
    assert tune.choose_recurrent(times, 5000) == "packed"
    assert tune.choose_recurrent(times, 2000, threads=2) == "packed"
    assert tune.choose_recurrent(times, 2000, threads=1) == "blas"
    assert tune.choose_recurrent(times, 2000, threads=4) == "blas"  # unmeasured: the slowest
    entry = {"plan": {"threads": 1, "split_min": 0, "pair_walks": False},
             "recurrent": {"fwd": times, "bwd": times}}  # fmt: skip
    assert tune.step_fields(entry, 5000)["fwd_rec"] == "packed"
    assert tune.step_fields(entry, 3)["bwd_rec"] == "blas"
    assert tune.step_fields(entry, 2000, 2)["bwd_rec"] == "packed"
    assert tune.step_fields(entry, 2000, 1)["bwd_rec"] == "blas"


def _scripted_passes(monkeypatch, seconds_of) -> None:
    """The passes' engine calls replaced: the forward and the backward each take
    ``seconds_of(threads, phase)`` on the clock the passes read (tune.time), nothing else; the
    engine is called with each candidate's plan, on a back end and OpenMP layer said to have
    four threads."""
    import types

    clock = [0.0]
    monkeypatch.setattr(tune, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    monkeypatch.setattr(openmp, "parallel_threads", lambda: 4)

    def forward(call, arena=None, *, gemm, plan):
        clock[0] += seconds_of(plan.threads, 0)
        saved = types.SimpleNamespace(**{k: None for k in ("i", "g", "f", "o", "h", "c", "tanhc")})
        return None, None, None, saved

    def backward(call, arena=None, *, gemm, plan):
        clock[0] += seconds_of(plan.threads, 1)

    monkeypatch.setattr(tune.fused_lstm, "lstm_forward", forward)
    monkeypatch.setattr(tune.fused_lstm, "lstm_backward", backward)
    monkeypatch.setattr(tune, "check_backward", lambda *args: None)


def test_close_passes_get_more_rounds(monkeypatch):
    """The passes' candidates within tune._CLOSE of the best run more rounds among themselves;
    a far one does not, and a candidate's later, faster runs decide."""
    # scripted step-loop seconds per candidate (told apart by the forced field) and timed run
    scripts = {
        1: [1.00, 1.00, 1.00, 1.00, 0.90, 0.90, 0.90],  # threads=1: faster later
        2: [0.98] * 7,  # threads=2: the best after the first rounds
        3: [1.50] * 7,  # threads=3: alive (under 3x the best) but far
    }
    runs = {1: 0, 2: 0, 3: 0}  # forward + backward runs: two a timed run (untimed, timed)

    def seconds_of(threads, phase):
        if phase == 0:
            return 0.0
        runs[threads] += 1
        return scripts[threads][(runs[threads] - 1) // 2]

    _scripted_passes(monkeypatch, seconds_of)
    candidates = {"one": {"threads": 1}, "two": {"threads": 2}, "three": {"threads": 3}}
    dims = {"T": 3, "B": 2, "I": 3, "H": 4, "D": 1, "dtype": "float32"}
    seconds = tune._pass_times(dims, _FourThreadGemm(), candidates)
    assert seconds == pytest.approx({"one": 0.90, "two": 0.98, "three": 1.50})
    rounds = tune._PASS_ROUNDS
    assert runs[3] == 2 * (1 + rounds)  # the first run and the common rounds only
    # one extra round each: then "two" (0.98) is past _CLOSE * 0.90 and the rounds stop
    assert runs[1] == runs[2] == 2 * (1 + rounds + 1)


def test_paired_phases_follow_the_rounds_not_the_luckiest_runs():
    """On a machine whose speed drifts between rounds, each candidate's phases are the best
    candidate's least times its median ratio to the best within the rounds: "b" is 10% slower
    than "a" side by side in every round, though its own least (in the fast round) is under
    a's least in the slow ones; a candidate missing from a round (extra rounds) is paired
    only where both ran."""
    rounds = [
        {"a": [2.0, 4.0], "b": [2.2, 4.4], "c": [3.0, 8.0]},  # slow machine
        {"a": [1.0, 2.0], "b": [1.1, 2.2], "c": [1.5, 4.0]},  # fast machine
        {"a": [2.0, 4.0], "b": [2.2, 4.4]},  # an extra round without c
    ]
    phases = tune._paired_phases(rounds, ["a", "b", "c"], "a")
    assert phases["a"] == [1.0, 2.0]
    assert phases["b"] == pytest.approx([1.1, 2.2])
    assert phases["c"] == pytest.approx([1.5, 4.0])


def test_pass_phases_are_paired_within_rounds(monkeypatch):
    """_pass_times pairs the candidates within its rounds: the machine running twice as fast
    during one run of "two" (10% slower than "one" side by side) does not make it look the
    faster, as the least of each candidate's runs would."""
    runs = {"two": 0}

    def seconds_of(threads, phase):
        factor = 1.0 if threads == 1 else 1.1
        if threads == 2:  # its fourth and fifth runs (second round: untimed + timed) are fast
            factor *= 0.5 if runs["two"] in (4, 5) else 1.0
            runs["two"] += phase
        return (1.0, 2.0)[phase] * factor

    _scripted_passes(monkeypatch, seconds_of)
    candidates = {"one": {"threads": 1}, "two": {"threads": 2}}
    dims = {"T": 3, "B": 2, "I": 3, "H": 4, "D": 1, "dtype": "float32"}
    phases: dict[str, list[float]] = {}
    seconds = tune._pass_times(dims, _FourThreadGemm(), candidates, phases)
    assert seconds["two"] < seconds["one"]  # its lucky run, as the least of each sees it
    assert phases["two"][0] > phases["one"][0] and phases["two"][1] > phases["one"][1]
    assert phases["two"][1] / phases["one"][1] == pytest.approx(1.1)


def test_passes_run_the_engine_with_each_candidates_plan(monkeypatch):
    """A real pass calls the engine itself with each candidate's plan (made feasible), never the
    API or the planner: its seconds are the forward's and the backward's, both timed."""
    from lstmgrad.fused import lstm as fused_lstm

    def no_planner(*args, **kwargs):
        raise AssertionError("the passes asked the planner for a plan")

    monkeypatch.setattr(plan, "plan_for", no_planner)
    monkeypatch.setattr(api, "engine_plan", no_planner)
    seen = []
    forward = fused_lstm.lstm_forward

    def recording(call, arena=None, *, gemm, plan):
        seen.append(plan)
        return forward(call, arena, gemm=gemm, plan=plan)

    monkeypatch.setattr(fused_lstm, "lstm_forward", recording)
    dims = {"T": 3, "B": 4, "I": 8, "H": 4, "D": 2, "dtype": "float32"}
    candidates = {"one": {"threads": 1}, "walk": {"threads": 1, "walk": True}}
    phases: dict[str, list[float]] = {}
    seconds = tune._pass_times(dims, NUMPY_GEMM, candidates, phases)
    assert {p.walk for p in seen} == {False, True}
    kept = [name for name in candidates if seconds[name] < float("inf")]
    assert kept and set(phases) == set(kept)
    for name in kept:
        assert all(0 < s < float("inf") for s in phases[name])


def _scripted_step_measurements(monkeypatch, walk_times) -> dict[str, dict]:
    """measure_steps on scripted measurements, two threads with pairs available: one library
    method ("blas", 1e-6 a product, so 2e-6 the best forward + backward pair), the walks'
    products from ``walk_times``, passes that take every candidate alike. Returns the dict
    the passes fill with the candidates they were given."""
    times = {"blas": {"prep": {"1": 0.0}, "call": 1e-6}}
    monkeypatch.setattr(tune, "_recurrent_times", lambda *args: times)
    monkeypatch.setattr(tune, "_walk_product_times", walk_times)
    monkeypatch.setattr(tune, "_split_min", lambda *args: 4)
    timed: dict[str, dict] = {}

    def passes(shape, kind, candidates, phase_seconds=None):
        timed.update(candidates)
        phase_seconds.update({name: [0.5, 0.5] for name in candidates})
        return {name: 1.0 for name in candidates}

    monkeypatch.setattr(tune, "_pass_times", passes)
    monkeypatch.setattr(openmp, "pairs_available", lambda: True)
    monkeypatch.setattr(openmp, "parallel_threads", lambda: 2)
    return timed


@pytest.mark.parametrize("walk_slow", [False, True])
def test_walk_product_chosen_and_walks_not_timed_where_they_cannot_win(monkeypatch, walk_slow):
    """The walks' recurrent product is the faster of the measured ways (here the library's);
    where even it takes over 3x the best library product (on all threads), the passes do not
    time walks or pair walks; otherwise they do, with that product."""
    walk = {"loop": 9e-6, "library": 7e-6 if walk_slow else 3e-6}  # best library pair: 2e-6
    timed = _scripted_step_measurements(monkeypatch, lambda *args: walk)
    cls = plan.step_class(TINY_BI, np.dtype(np.float32), "numpy")
    entry = tune.measure_steps(cls, NUMPY_GEMM)
    assert entry["plan"]["walk_product"] == "library"
    assert {"one", "split"} <= set(timed)
    walks = {"walk", "pairs"}
    if walk_slow:
        assert walks.isdisjoint(timed)
    else:
        assert walks <= set(timed)
        assert all(timed[name]["walk_product"] == "library" for name in walks)


@pytest.mark.parametrize("block_fast", [False, True])
def test_row_walks_timed_unless_a_block_product_is_far_slower_than_the_library(monkeypatch,
                                                                                block_fast):  # fmt: skip
    """One direction, two threads: the row-block walks are a candidate unless the walk's
    product of one block's rows (B / threads) on its thread takes over tune._WALK_BOUND times
    the library's product of all rows on all threads (2e-6 here)."""
    bound = tune._WALK_BOUND * 2e-6

    def walk_times(gemm, w_hh, rows, cd):  # whole batch 3e-6 (may win), a block as asked
        if rows == TINY.B:
            return {"loop": 3e-6}
        return {"loop": 0.9 * bound if block_fast else 1.1 * bound}

    timed = _scripted_step_measurements(monkeypatch, walk_times)
    tune.measure_steps(plan.step_class(TINY, np.dtype(np.float32), "numpy"), NUMPY_GEMM)
    assert ("rows" in timed) == block_fast
    if block_fast:
        assert timed["rows"]["walk"] and timed["rows"]["walk_rows"] == 2
    assert "pairs" not in timed  # one direction


@pytest.mark.parametrize("library_block", [2.5e-6, 4e-6])
def test_row_walks_try_each_product_near_the_fastest_alone(monkeypatch, library_block):
    """Walks side by side are timed with each walk product within tune._SIDE_BY_SIDE of the
    fastest one timed alone (two threads' library calls at once can lose to the loops): the
    chosen arrangement's product becomes the plan's."""
    side = tune._SIDE_BY_SIDE

    def walk_times(gemm, w_hh, rows, cd):
        if rows == TINY.B:
            return {"loop": 3e-6, "library": 2.5e-6}
        return {"loop": 1.5e-6, "library": library_block}

    timed = _scripted_step_measurements(monkeypatch, walk_times)

    def passes(dims_args, kind, candidates, phase_seconds=None):
        timed.update(candidates)  # the loop's rows walk fastest
        phase_seconds.update({n: [0.5, 0.2 if n == "rows-loop" else 0.5] for n in candidates})
        return {n: 1.0 for n in candidates}

    monkeypatch.setattr(tune, "_pass_times", passes)
    tune.measure_steps(plan.step_class(TINY, np.dtype(np.float32), "numpy"), NUMPY_GEMM)
    assert timed["rows"]["walk_product"] == "loop"  # the fastest at a block's rows
    assert ("rows-library" in timed) == (library_block <= side * 1.5e-6)
    if "rows-library" in timed:
        assert timed["rows-library"]["walk_product"] == "library"
    assert timed["walk"]["walk_product"] == "library"  # one thread: the fastest at B rows
    assert "rows-loop" not in timed


def test_side_by_side_product_decides_the_plan(monkeypatch):
    """The plan takes the walk product of the arrangement chosen, not the fastest alone."""

    def walk_times(gemm, w_hh, rows, cd):
        if rows == TINY.B:
            return {"loop": 3e-6, "library": 2.5e-6}
        return {"loop": 1.6e-6, "library": 1.5e-6}

    timed = _scripted_step_measurements(monkeypatch, walk_times)

    def passes(dims_args, kind, candidates, phase_seconds=None):
        timed.update(candidates)
        phase_seconds.update({n: [0.5, 0.2 if n == "rows-loop" else 0.5] for n in candidates})
        return {n: 1.0 for n in candidates}

    monkeypatch.setattr(tune, "_pass_times", passes)
    entry = tune.measure_steps(plan.step_class(TINY, np.dtype(np.float32), "numpy"), NUMPY_GEMM)
    assert {"rows", "rows-loop"} <= set(timed)
    assert entry["plan"]["walk"] and entry["plan"]["walk_rows"] == 2
    assert entry["plan"]["walk_product"] == "loop"
    assert tune.step_fields(entry, 48)["walk_product"] == "loop"


def test_private_product_method_only_for_a_clear_win():
    """The big products take a private op (oneDNN) only where it beats the public GEMM by over
    the margin; the public one otherwise, and whenever it is the fastest."""
    margin = tune._PRIVATE_MARGIN
    assert tune._product_method({"blas": 1.0, "onednn": 0.99}, "blas") == "blas"
    assert tune._product_method({"blas": 1.0, "onednn": 0.99 / margin}, "blas") == "onednn"
    assert tune._product_method({"blas": 0.9, "onednn": 1.0}, "blas") == "blas"
    assert tune._product_method({"blas": 1.0}, "blas") == "blas"


def test_arrangement_by_call_length_and_phase():
    """The arrangement is chosen for the call's length from the passes' per-phase seconds: the
    library's recurrent weight preparation (paid once a direction) makes the walks win short
    calls and lose long ones; a walking candidate's backward may go with the forward of the
    candidate without walks on as many threads (fwd_walk False)."""
    rec = {
        "fwd": {"mkl": {"prep": {"1": 0.010}, "call": 1e-4}},
        "bwd": {"mkl": {"prep": {"1": 0.010}, "call": 1e-4}},
    }
    base = {"fwd_rec": "mkl", "bwd_rec": "mkl"}
    candidates = {
        "one": {**base, "threads": 1},
        "split": {**base, "threads": 2, "split_min": 64},
        "rows": {**base, "threads": 2, "walk": True, "walk_rows": 2},
    }
    # passes of 10 steps, one direction: "split" 10 ms of preparation + 10 ms a phase,
    # "rows" 25 ms a phase walking (2.5 ms a step against split's 1 ms)
    phases = {"one": [0.030, 0.030], "split": [0.020, 0.020], "rows": [0.025, 0.025]}
    arrangement = {"candidates": candidates, "phases": phases, "steps": 10, "D": 1}
    assert tune._arrangement(arrangement, rec, 5)["walk"]  # 12.5 ms against 15 ms a phase
    long = tune._arrangement(arrangement, rec, 100)  # 250 ms against 110 ms a phase
    assert not long.get("walk") and long["threads"] == 2
    # the walk's forward slower, its backward faster: its backward with split's forward
    phases["rows"] = [0.040, 0.012]
    mixed = tune._arrangement(arrangement, rec, 10)
    assert mixed["walk"] and mixed["fwd_walk"] is False
    assert (mixed["threads"], mixed["split_min"]) == (2, 64)
    entry = {"plan": {"threads": 1, "split_min": 0, "pair_walks": False, "walk": False,
                      "walk_product": "loop", "walk_rows": 1, "fwd_walk": True},
             "recurrent": rec, "arrangement": arrangement}  # fmt: skip
    fields = tune.step_fields(entry, 10)
    assert fields["walk"] and fields["walk_rows"] == 2 and fields["fwd_walk"] is False
    assert tune._arrangement({**arrangement, "phases": {}}, rec, 10) == candidates["one"]


def test_walk_product_falls_back_without_a_library_gemm():
    """A plan asking for the library's product in the walks gets the Numba loop from a back
    end with no GEMM to call (NumPy's)."""
    wanted = Plan(walk=True, walk_product="library")
    assert plan.feasible(wanted, TINY, np.float32, NUMPY_GEMM).walk_product == "loop"


def test_measured_on_a_busy_machine_kept_for_this_process_only(store, monkeypatch):
    monkeypatch.setattr(plan, "machine_busy", lambda: True)
    got = plan.plan_for(TINY, np.dtype(np.float32), NUMPY_GEMM)
    assert not list(store.glob("wisdom-*.json"))
    _no_measuring(monkeypatch)  # but not measured again in this process
    plan._memo.clear()  # the remembered plans, not the measurements
    assert plan.plan_for(TINY, np.dtype(np.float32), NUMPY_GEMM) == got


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="reads /proc/stat")
def test_others_cpus_sees_a_busy_process_at_once():
    """others_cpus counts another process's CPU time over the block (not this process's own
    work), without waiting for the load average: a spinning child reads as about one CPU."""
    import subprocess
    import sys

    from lstmgrad.core.machine import cpu_clock, others_cpus

    start = cpu_clock()
    sum(i * i for i in range(300_000))  # this process's own work is not the others'
    own = others_cpus(start)
    child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)  # the child has started
        start = cpu_clock()
        time.sleep(1.0)
        spinning = others_cpus(start)
    finally:
        child.kill()
        child.wait()
    assert spinning >= 0.5 and own < spinning  # (own: whatever else this machine runs)


def test_a_measurement_beside_busy_processes_is_dropped(store, monkeypatch):
    """Other processes kept the CPUs busy while a class was measured (the load average had not
    risen yet): nothing is stored, and no measuring is tried again for a while."""
    seen = []
    monkeypatch.setattr(plan, "others_cpus", lambda start: seen.append(start) or 1.0)
    got = plan.plan_for(TINY, np.dtype(np.float32), NUMPY_GEMM)
    assert seen and not list(store.glob("wisdom-*.json"))
    assert got == plan.feasible(plan.default_plan(TINY, np.dtype(np.float32), NUMPY_GEMM), TINY,
                                np.dtype(np.float32), NUMPY_GEMM)  # fmt: skip
    assert plan.budget.busy >= 1 and not plan.budget.allows("numpy")


def test_store_round_trip_merge_and_clear(store):
    facts = plan.fingerprint("numpy")
    a, b = plan.Wisdom(facts), plan.Wisdom(facts)
    big = plan.big_class(TINY, np.float32, "numpy")
    one, two, three = ({**big, "N": n} for n in (1, 2, 3))
    a.put(one, {"plan": {"big": "blas"}})
    b.put(two, {"plan": {"transpose_threads": 2}})  # another process's entry kept
    fresh = plan.Wisdom(facts)
    assert fresh.get(dict(reversed(one.items()))) == {"plan": {"big": "blas"}}  # key order
    assert fresh.get(two) == {"plan": {"transpose_threads": 2}}
    a.put(three, {"plan": {}}, keep=False)
    assert plan.Wisdom(facts).get(three) is None and not a.stored(three) and a.stored(one)
    a.put(dict(one), {"plan": {}})  # an entry kept for this process only stays off the disk
    assert plan.Wisdom(facts).get(three) is None
    fresh.clear()
    assert not fresh.path.exists() and plan.Wisdom(facts).entries == {}


def test_store_of_another_configuration_or_unreadable_is_ignored(store):
    facts = plan.fingerprint("numpy")
    w = plan.Wisdom(facts)
    w.put(plan.big_class(TINY, np.float32, "numpy"), {"plan": {}})
    data = json.loads(w.path.read_text())
    data["facts"] = {**facts, "numpy": "0.0"}  # written by other library versions
    w.path.write_text(json.dumps(data))
    with pytest.warns(CacheWarning, match="written for other facts"):
        assert plan.Wisdom(facts).entries == {}
    w.path.write_text("{not json")
    store_module._warned.clear()  # one warning per file and process: a new process
    with pytest.warns(CacheWarning, match="not JSON"):
        assert plan.Wisdom(facts).entries == {}


def test_read_only_store_keeps_measurements_in_memory(store, monkeypatch):
    monkeypatch.setenv("LSTMGRAD_CACHE_DIR", str(store / "file-not-dir"))
    (store / "file-not-dir").write_text("")
    plan.forget()
    got = plan.plan_for(TINY, np.dtype(np.float32), NUMPY_GEMM)
    assert got == plan.feasible(got, TINY, np.float32, NUMPY_GEMM)


# --------------------------------------------------------------------------------------------
# the NumPy back end's results under every plan field


def _case(dtype, d, t=6, b=4, i=5, h=7, seed=3):
    rng = np.random.default_rng(seed)
    params = []
    for _ in range(d):
        params += [rng.uniform(-0.4, 0.4, s).astype(dtype)
                   for s in [(4 * h, i), (4 * h, h), (4 * h,), (4 * h,)]]  # fmt: skip
    x = rng.standard_normal((t, b, i)).astype(dtype)
    hx = [rng.standard_normal((d, b, h)).astype(dtype) for _ in range(2)]
    dy = rng.standard_normal((t, b, d * h)).astype(dtype)
    return x, hx, params, dy, dict(num_layers=1, bidirectional=d == 2)


NUMPY_PLANS = (
    [dict(transpose_threads=2)]
    + [dict(fwd_rec=m, bwd_rec=m) for m in NUMPY_GEMM.fixed_methods(np.float32)]
    + [dict(threads=2, split_min=0), dict(threads=2, pair_walks=True), dict(walk=True)]
)


@pytest.mark.parametrize("fields", NUMPY_PLANS, ids=lambda f: ",".join(f"{k}={v}" for k, v in
                                                                     f.items()))  # fmt: skip
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_numpy_results_under_every_plan_field(fields, dtype):
    x, hx, params, dy, kw = _case(dtype, d=2)
    fw_ref = lstmgrad.lstm_forward(x, params, hx, impl="reference", **kw)
    with forced(**fields):
        fw = lstmgrad.lstm_forward(x, params, hx, **kw)
        args = (x, hx, params, dy, None, None, *fw.saved[:7])
        got = lstmgrad.lstm_backward(*args, **kw)
    ref = lstmgrad.lstm_backward(x, hx, params, dy, None, None, *fw_ref.saved[:7],
                                 impl="reference", **kw)  # fmt: skip
    tol = 1e-12 if dtype == np.float64 else 2e-5
    for g, w in zip([fw.output, fw.hy, fw.cy], [fw_ref.output, fw_ref.hy, fw_ref.cy],
                    strict=True):  # fmt: skip
        np.testing.assert_allclose(g, w, rtol=tol, atol=tol)
    for g, w in zip([got.dx, got.dh_prev, got.dc_prev, *got.dparams],
                    [ref.dx, ref.dh_prev, ref.dc_prev, *ref.dparams], strict=True):  # fmt: skip
        scale = max(np.abs(w).max(), 1.0)
        np.testing.assert_allclose(g, w, rtol=tol, atol=tol * scale)


@pytest.mark.parametrize("transpose_threads", [1, 2])
def test_numpy_float16_storage_weight_gradient(transpose_threads):
    """float16 storage computes in float32 and rounds its results: the weight gradient's two
    products through float32 scratch give float16 results within float16's rounding of the
    reference's, its conversions on one thread or two."""
    x, hx, params, dy, kw = _case(np.float16, d=2)
    fw = lstmgrad.lstm_forward(x, params, hx, **kw)
    args = (x, hx, params, dy, None, None, *fw.saved[:7])
    with forced(transpose_threads=transpose_threads):
        got = lstmgrad.lstm_backward(*args, **kw)
    ref = lstmgrad.lstm_backward(*args, impl="reference", **kw)
    for g, w in zip(got.dparams, ref.dparams, strict=True):
        assert g.dtype == np.float16
        scale = max(float(np.abs(w.astype(np.float32)).max()), 1.0)
        np.testing.assert_allclose(g.astype(np.float32), w.astype(np.float32), rtol=4e-3,
                                   atol=4e-3 * scale)  # fmt: skip


@pytest.mark.parametrize(
    "t,b,layers,d,strided",
    [
        (1, 1, 1, 1, False),
        (5, 3, 3, 1, True),
        (4, 2, 2, 2, False),
        (6, 0, 2, 2, False),
        (3, 0, 2, 1, True),
    ],  # fmt: skip
)
def test_dense_steps_read_their_rows_in_place(t, b, layers, d, strided):
    """Dense steps (no batch_sizes) read the layer input, c_prev and dx's rows in place: the
    forward and every requested gradient equal the reference's, for T = 1, B = 1, an empty
    batch, stacked layers of one or two directions and a strided input."""
    rng = np.random.default_rng(t * 10 + b)
    i, h = 5, 4
    params = []
    for layer in range(layers):
        for _ in range(d):
            width = i if layer == 0 else d * h
            params += [rng.uniform(-0.4, 0.4, s) for s in [(4 * h, width), (4 * h, h), (4 * h,),
                                                           (4 * h,)]]  # fmt: skip
    wide = rng.standard_normal((t, b, 2 * i))
    x = wide[:, :, ::2] if strided else np.ascontiguousarray(wide[:, :, :i])
    hx = [rng.standard_normal((layers * d, b, h)) for _ in range(2)]
    dy = rng.standard_normal((t, b, d * h))
    kw = dict(num_layers=layers, bidirectional=d == 2)
    ref = lstmgrad.lstm_forward(x, params, hx, impl="reference", **kw)
    for mask in [
        (True, True, True, True),
        (False, False, False, True),
        (True, False, False, False),
    ]:
        fw = lstmgrad.lstm_forward(x, params, hx, **kw)
        got = lstmgrad.lstm_backward(x, hx, params, dy, None, None, *fw.saved[:7],
                                     output_mask=mask, **kw)  # fmt: skip
        want = lstmgrad.lstm_backward(x, hx, params, dy, None, None, *ref.saved[:7],
                                      output_mask=mask, impl="reference", **kw)  # fmt: skip
        np.testing.assert_allclose(fw.output, ref.output, rtol=1e-12, atol=1e-12)
        for g, w in zip([got.dx, got.dh_prev, got.dc_prev, *(got.dparams or [])],
                        [want.dx, want.dh_prev, want.dc_prev, *(want.dparams or [])],
                        strict=True):  # fmt: skip
            if w is None:
                assert g is None
            else:
                np.testing.assert_allclose(g, w, rtol=1e-11, atol=1e-11)


# --------------------------------------------------------------------------------------------
# lstmgrad tune


def test_tune_command_measures_shows_and_resets(store, capsys):
    from lstmgrad.tools.cli import main

    assert main(["tune", "--shape", "5,2,3,4", "--shape", "3,2,4,4,2,2", "--input", "numpy"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("T5 B2 I3 H4 L1 D1 (numpy, float32): ") and "threads=" in lines[0]
    assert lines[1].startswith("T3 B2 I4 H4 L2 D2 (numpy, float32): ")
    assert main(["tune", "--show", "--json", "--input", "numpy"]) == 0
    shown = json.loads(capsys.readouterr().out)
    whats = sorted(json.loads(k)["what"] for k in shown["numpy"]["entries"])
    # per shape its big products and step loops, and a gate where the measured plan differs
    assert shown["mode"] == "eager" and whats.count("big") == whats.count("steps") == 2
    assert set(whats) <= {"big", "steps", "gate"}
    assert main(["tune", "--reset", "--input", "numpy"]) == 0
    assert "forgot" in capsys.readouterr().out
    assert not list(store.glob("wisdom-*.json"))


@pytest.mark.parametrize("shape", ["5,2,3", "5,2,3,0", "5,2,3,4,1,3", "a,b,c,d"])
def test_tune_command_rejects_bad_shapes(store, capsys, shape):
    from lstmgrad.tools.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["tune", "--shape", shape])
    assert exc.value.code == 2
    assert "argument --shape: expected T,B,I,H[,L[,D]]" in capsys.readouterr().err


@pytest.mark.parametrize("shape", [(1, 1), (3, 5), (64, 48), (1024, 256), (17, 1000)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_dense_copies_a_transposed_view_on_any_thread_count(shape, dtype):
    """gemm.dense: a C-contiguous array equal to its argument, the array itself where it is
    one, a copy of a transposed view whether the copy runs on one thread or several (the
    recurrent product's preparation, at the plan's transpose_threads)."""
    from lstmgrad.fused.gemm import dense

    a = np.random.default_rng(0).standard_normal(shape).astype(dtype)
    assert dense(a) is a and dense(a, 2) is a
    for threads in (1, 2):
        got = dense(a.T, threads)
        assert got.flags.c_contiguous and got.dtype == dtype
        assert np.array_equal(got, a.T)
    strided = a[:, ::2]  # neither layout: NumPy's copy
    assert np.array_equal(dense(strided, 2), strided) and dense(strided, 2).flags.c_contiguous


def test_transposing_copy_timed_with_the_product_after_it(monkeypatch):
    """The big products' measurement times the transposing copy on each thread count together
    with the library product that follows it in the engine (a pool's spinning threads can
    delay the next library's threads, which the copy timed alone does not show): in that
    phase every copy is followed by a product, every thread count is timed, and the plan takes
    one of them."""
    from lstmgrad.fused import walks
    from lstmgrad.planning import tune

    events: list[str] = []
    copy = walks.transpose_cols

    def recorded_copy(*a):
        events.append(f"copy/{a[-1]}")
        return copy(*a)

    class Recorded:
        kind = "numpy"

        def __getattr__(self, name):
            return getattr(NUMPY_GEMM, name)

        def product(self, *a):
            events.append("product")
            return NUMPY_GEMM.product(*a)

    def end_of_phase(*a):
        events.append("end")
        return {}

    monkeypatch.setattr(walks, "transpose_cols", recorded_copy)
    monkeypatch.setattr(tune, "_conversion_times", end_of_phase)  # measured right after
    cls = {"what": "big", "kind": "numpy", "dtype": "float32", "N": 32, "I": 8, "H": 8}
    entry = tune.measure_big(cls, Recorded())
    phase = events[: events.index("end")]
    counts = sorted({1, openmp.parallel_threads() if openmp.pairs_available() else 1})
    assert phase[0::2] and all(e.startswith("copy/") for e in phase[0::2])
    assert phase[1::2] == ["product"] * len(phase[0::2])
    assert sorted({int(e.split("/")[1]) for e in phase[0::2]}) == counts
    timed = sorted(int(k.split("/")[1]) for k in entry["seconds"] if k.startswith("transpose/"))
    assert timed == counts and entry["plan"]["transpose_threads"] in counts


def test_big_class_rows_are_bucketed_up_to_big_rows():
    """The big products' class: the call's rows of all steps bucketed (a power of two), at
    most BIG_ROWS; I and H as they are."""
    f32 = np.dtype(np.float32)

    def cls(t, b, h):
        return plan.big_class(Dims(T=t, B=b, I=h, H=h, L=1, D=1, has_bias=True), f32, "numpy")

    assert cls(3, 8, 16) == {"what": "big", "kind": "numpy", "dtype": "float32", "N": 32,
                             "I": 16, "H": 16}  # fmt: skip
    assert cls(100, 32, 256)["N"] == cls(100_000, 8, 256)["N"] == plan.BIG_ROWS


def test_big_products_time_the_weight_gradient_with_each_method():
    """measure_big's per-method time holds the projection, dx and the weight gradient's two
    products; its plan names the method, the copies' threads and the conversions only."""
    cls = {"what": "big", "kind": "numpy", "dtype": "float32", "N": 32, "I": 8, "H": 8}
    entry = tune.measure_big(cls, NUMPY_GEMM)
    assert set(entry["plan"]) == {"big", "transpose_threads", "convert"}
    assert entry["plan"]["big"] == "blas" and 0 < entry["seconds"]["blas/products"] < 1


# --------------------------------------------------------------------------------------------
# the default plan of an unmeasured class


class _WalkGemm(_FourThreadGemm):
    """A back end with a product a walk can call, plain or packed (as torch's MKL has)."""

    @staticmethod
    def walk_gemm(dtype: np.dtype, packed: bool = False) -> int:
        return 1


def _probe(walk=1e-3, rows=None, pairs=None, lib=(1e-3, 1e-3), prep=0.0, gate=1e-4,
           gate_split=None, walk_prep=None, big=None):  # fmt: skip
    """A probe (tune.probe's record) with these seconds: a walk's product pair alone (a dict
    per walk product, or one number for "library"), side by side in two blocks of rows or
    as a pair of directions, the library's per-step forward and backward products (method
    "blas", ``prep`` its preparation), one step's gate maths."""

    def per_product(v):
        return dict(v) if isinstance(v, dict) else {"library": v}

    out = {
        "recurrent": {k: {"blas": {"prep": {"1": prep}, "call": c}}
                      for k, c in zip(("fwd", "bwd"), lib, strict=True)},
        "walk": per_product(walk), "walk_prep": walk_prep or {}, "gate": gate,
        "measured_at": "2026-12-08T00:00:00",
    }  # fmt: skip
    if rows is not None:
        out.update(rows=per_product(rows), rows_parts=2)
    if pairs is not None:
        out["pairs"] = per_product(pairs)
    if gate_split is not None:
        out.update(gate_split=gate_split, split_parts=2)
    if big is not None:
        out["big"] = big
    return out


D1, D2 = Dims(100, 32, 64, 64, 1, 1, True), Dims(100, 32, 64, 64, 1, 2, True)


@pytest.mark.parametrize(
    "dims, probe, want",
    [
        # library products 5x a walk's: a call per step wins
        (D1, _probe(walk=4e-3, rows=2.5e-3, lib=(4e-4, 4e-4)),
         dict(walk=False, fwd_rec="blas", threads=1)),
        # walks side by side twice as fast as one walk: blocks of rows
        (D1, _probe(walk=1e-3, rows=5e-4), dict(walk=True, walk_rows=2, threads=2)),
        # side by side slower than alone (a W_hh read by each block): one walk
        (D1, _probe(walk=1e-3, rows=1.2e-3), dict(walk=True, walk_rows=1, threads=1)),
        (D2, _probe(walk=1e-3, pairs=6e-4), dict(pair_walks=True, threads=2)),
        (D2, _probe(walk=1e-3, pairs=2.5e-3), dict(walk=True, pair_walks=False, threads=1)),
        # the gate maths split over the threads pay between library products
        (D1, _probe(walk=4e-3, lib=(4e-4, 4e-4), gate=4e-4, gate_split=2e-4),
         dict(walk=False, threads=2)),
        (D1, _probe(walk=4e-3, lib=(4e-4, 4e-4), gate=4e-4, gate_split=5e-4),
         dict(walk=False, threads=1)),
        # the fastest walk product alone, its preparation spread over the steps
        (D1, _probe(walk={"packed": 5e-4, "library": 6e-4}), dict(walk_product="packed")),
        (Dims(1, 32, 64, 64, 1, 1, True),
         _probe(walk={"packed": 5e-4, "library": 6e-4}, walk_prep={"packed": 5e-4}),
         dict(walk_product="library")),
        # a preparation paid once a call: no library method that pays it at T = 1
        (Dims(1, 32, 64, 64, 1, 1, True), _probe(walk=1e-3, prep=1e-2), dict(walk=True)),
    ],
    ids=["library", "rows", "rows-no-gain", "pairs", "pairs-slow", "split", "split-slow",
         "packed", "packed-T1", "prep-T1"],
)  # fmt: skip
def test_cost_model_picks_the_cheapest_arrangement(dims, probe, want):
    """The default plan's cost model prices each arrangement from the probe's seconds (the
    oracle: the cases are built so that one arrangement is clearly cheapest)."""
    from lstmgrad.planning import model

    got = model.engine_fields(probe, dims, "blas")
    assert {k: got.get(k, getattr(SAFE, k)) for k in want} == want


@pytest.mark.parametrize(
    "big, want",
    [
        ({"blas": 1.0, "onednn": 0.9}, "onednn"),  # over the margin
        ({"blas": 1.0, "onednn": 0.97}, "blas"),  # within it: the public GEMM
        ({"blas": 1.0, "onednn": 1.5}, "blas"),
        (None, "blas"),
    ],
)
def test_cost_model_big_products_take_a_private_op_only_past_the_margin(big, want):
    from lstmgrad.planning import model

    assert model.engine_fields(_probe(big=big), D1, "blas")["big"] == want


def test_arrangements_price_steps_and_directions():
    """The prices themselves: a library call per step pays its preparation once a direction
    and its calls and gate maths each step; a walk its product and gate maths each step."""
    from lstmgrad.planning import model

    probe = _probe(walk=1e-3, lib=(3e-4, 2e-4), prep=5e-3, gate=1e-4, pairs=6e-4)
    got = model.arrangements(probe, D2)
    assert got["library"][0] == pytest.approx(2 * (2 * 5e-3 + 100 * (3e-4 + 2e-4 + 1e-4)))
    assert got["walk"][0] == pytest.approx(2 * 100 * (1e-3 + 1e-4))
    assert got["pairs"][0] == pytest.approx(100 * (6e-4 + 1e-4))


def test_default_plan_probes_a_class_once_and_stores_it(store, monkeypatch):
    """The probe runs the first time a class is seen (LSTMGRAD_TUNE=cached too), is stored,
    and serves later processes; a probe beside busy processes serves this process only."""
    monkeypatch.setenv("LSTMGRAD_TUNE", "cached")
    monkeypatch.setattr(openmp, "parallel_threads", lambda: 2)
    calls = []

    def fake(cls, gemm, big_sizes=None):
        calls.append(cls)
        return _probe(walk=1e-3, rows=4e-4)

    monkeypatch.setattr(plan.tune, "probe", fake)
    f32 = np.dtype(np.float32)
    got = plan.default_plan(D1, f32, _WalkGemm())
    assert (got.walk, got.walk_rows, got.threads) == (True, 2, 2)
    assert plan.default_plan(D1, f32, _WalkGemm()) == got and len(calls) == 1
    plan.forget()  # a new process reads it from disk
    assert plan.default_plan(D1, f32, _WalkGemm()) == got and len(calls) == 1
    other = dataclasses.replace(D1, H=32)
    monkeypatch.setattr(plan, "others_cpus", lambda start: 1.0)  # busy meanwhile
    plan.default_plan(other, f32, _WalkGemm())
    plan.forget()
    plan.default_plan(other, f32, _WalkGemm())
    assert len(calls) == 3  # not stored: probed again


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_probe_measures_every_product_at_the_class_sizes(store, kind):
    """The real probe on a small class: finite positive seconds for each method the back end
    has, the walks side by side where there are threads for them."""
    from lstmgrad.planning import model

    if kind == "torch":
        pytest.importorskip("torch")
        from lstmgrad.ops.tensors import torch_gemm

        gemm = torch_gemm()
    else:
        gemm = NUMPY_GEMM
    f32 = np.dtype(np.float32)
    cls = plan.probe_class(Dims(10, 4, 8, 16, 1, 2, True), f32, gemm.kind)
    got = plan.tune.probe(cls, gemm, (8, cls["N"]))
    for direction in ("fwd", "bwd"):
        assert set(got["recurrent"][direction]) == set(gemm.fixed_methods(f32))
    assert "loop" in got["walk"] and all(0 < s < 1 for s in got["walk"].values())
    assert 0 < got["gate"] < 1 and set(got["big"]) == set(gemm.product_methods(f32))
    assert ("pairs" in got) == (openmp.parallel_threads() >= 2 and gemm.threads() >= 2)
    # what the probe stores passes the cache's schema; a probe that contradicts itself does not
    from lstmgrad.planning import store

    key = json.dumps(cls, sort_keys=True)
    assert store.entry_problem(key, got) is None
    broken = {k: v for k, v in got.items() if k != "split_parts"} if "gate_split" in got else {
        **got, "walk": {}}  # fmt: skip
    assert store.entry_problem(key, broken) is not None
    fields = model.engine_fields(got, Dims(10, 4, 8, 16, 1, 2, True), "blas")
    assert plan.feasible(dataclasses.replace(SAFE, **fields), Dims(10, 4, 8, 16, 1, 2, True),
                         f32, gemm)  # fmt: skip


def test_core_cache_bytes_reads_a_cache_of_the_core_or_none():
    from lstmgrad.core.machine import core_cache_bytes

    got = core_cache_bytes()
    assert got is None or (got >= 1 << 14 and got % 1024 == 0)


@pytest.mark.parametrize("D", [1, 2])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_default_plan_runs_an_unmeasured_class_to_the_reference(monkeypatch, tmp_path, D, dtype):
    torch = pytest.importorskip("torch")
    import lstmgrad

    monkeypatch.setenv("LSTMGRAD_TUNE", "cached")  # nothing stored: the default plan
    monkeypatch.setenv("LSTMGRAD_CACHE_DIR", str(tmp_path))
    plan.forget()
    rng = np.random.default_rng(3)
    T, B, I, H = 40, 6, 5, 64
    x = rng.standard_normal((T, B, I)).astype(dtype)
    params = [(0.3 * rng.standard_normal(s)).astype(dtype)
              for s in [(4 * H, I), (4 * H, H), (4 * H,), (4 * H,)] * D]  # fmt: skip
    as_t = [torch.from_numpy(p) for p in params]
    fwd = lstmgrad.lstm_forward(torch.from_numpy(x), as_t, bidirectional=D == 2)
    ref = lstmgrad.lstm_forward(x.astype(np.float64), [p.astype(np.float64) for p in params],
                                bidirectional=D == 2, impl="reference")  # fmt: skip
    tol = 4e-3 if dtype == np.float16 else 2e-5
    np.testing.assert_allclose(fwd.output.numpy().astype(np.float64), ref.output, atol=tol)
    dy = rng.standard_normal(ref.output.shape)
    hx = [np.zeros((D, B, H))] * 2
    got = lstmgrad.lstm_backward(torch.from_numpy(x), [torch.from_numpy(h.astype(dtype)) for h in hx],
                                 as_t, torch.from_numpy(dy.astype(dtype)), None, None,
                                 *fwd.saved[:7], bidirectional=D == 2)  # fmt: skip
    want = lstmgrad.lstm_backward(x.astype(np.float64), hx, [p.astype(np.float64) for p in params],
                                  dy, None, None, *ref.saved[:7], bidirectional=D == 2,
                                  impl="reference")  # fmt: skip
    scale = max(float(np.abs(w).max()) for w in want.dparams)
    for g, w in zip(got.dparams, want.dparams, strict=True):
        np.testing.assert_allclose(g.numpy().astype(np.float64), w, atol=tol * 10 * scale)
    plan.forget()


# --------------------------------------------------------------------------------------------
# the gate, the busy rule, the in-use check


def _scripted_classes(monkeypatch, ratio):
    """Measurements that give TINY a plan other than the default (a one-call walk on NumPy,
    whose default is SAFE), and a gate that finds it ``ratio`` times as fast."""
    monkeypatch.setattr(tune, "measure_big", lambda cls, gemm: {"plan": {"transpose_threads": 2}})
    monkeypatch.setattr(tune, "measure_steps", lambda cls, gemm: {"plan": {"walk": True}})
    gates = []

    def gate(dims, dtype, gemm, default, measured):
        gates.append((dims, default, measured))
        return {"steps": dims.T, "default": ratio, "measured": 1.0, "ratio": ratio}

    monkeypatch.setattr(tune, "gate", gate)
    return gates


@pytest.mark.parametrize("ratio, wins", [(1.03, False), (plan.GATE_MARGIN, True), (1.5, True)])
def test_a_measured_plan_replaces_the_default_only_past_the_margin(store, monkeypatch, ratio, wins):
    gates = _scripted_classes(monkeypatch, ratio)
    f32 = np.dtype(np.float32)
    got = plan.plan_for(TINY, f32, NUMPY_GEMM)
    ((dims, default, measured),) = gates
    assert dims == dataclasses.replace(TINY, L=1) and default == SAFE
    assert measured.walk and measured.transpose_threads == min(
        2, NUMPY_GEMM.threads(), openmp.parallel_threads()
    )
    assert got == (measured if wins else default)
    plan.forget()  # a later process reads the gate's decision, measures nothing
    _no_measuring(monkeypatch)
    monkeypatch.setattr(tune, "gate", lambda *a: pytest.fail("gate run again"))
    assert plan.plan_for(TINY, f32, NUMPY_GEMM) == got


def test_no_gate_where_the_measurements_give_the_default(store, monkeypatch):
    monkeypatch.setattr(tune, "measure_big", lambda cls, gemm: {"plan": {}})
    monkeypatch.setattr(tune, "measure_steps", lambda cls, gemm: {"plan": {}})
    monkeypatch.setattr(tune, "gate", lambda *a: pytest.fail("gated the default against itself"))
    assert plan.plan_for(TINY, np.dtype(np.float32), NUMPY_GEMM) == SAFE


@pytest.mark.parametrize("when", ["before", "after"])
def test_a_busy_machine_measures_nothing_and_keeps_nothing(store, monkeypatch, when):
    """Busy before measuring: nothing runs; busy once it ran: the result is dropped (neither
    used nor stored). Either way the default serves, and measuring waits BUSY_RETRY seconds."""
    monkeypatch.setenv("LSTMGRAD_TUNE", "on")
    monkeypatch.setattr(plan.budget, "allows", lambda kind: True)
    ran = []
    states = iter([False, True] if when == "after" else [True])
    monkeypatch.setattr(plan, "machine_busy", lambda: next(states, True))
    monkeypatch.setattr(tune, "measure_big", lambda cls, gemm: ran.append(1) or {"plan": {}})
    f32 = np.dtype(np.float32)
    assert plan.plan_for(TINY, f32, NUMPY_GEMM) == SAFE
    assert ran == ([1] if when == "after" else [])
    assert not list(store.glob("wisdom-*.json")) and plan.budget.busy >= 1
    monkeypatch.undo()  # the real budget: it waits BUSY_RETRY seconds before measuring again
    assert not plan.budget.allows("numpy")


def test_the_in_use_check_goes_back_to_the_default_when_it_loses(store, monkeypatch):
    """A measured plan in use runs the default on calls 4, 8, 12, then every WATCH_EVERY-th; once the sampled
    default calls are faster by the margin (the measured plan collapsed) the default serves,
    and the stored decision is turned for later processes. Calls of a sized workspace (the
    mirror's) are never sampled."""
    _scripted_classes(monkeypatch, 2.0)
    f32 = np.dtype(np.float32)
    measured = plan.plan_for(TINY, f32, NUMPY_GEMM)
    assert measured != SAFE
    picked = []
    for _ in range(plan.WATCH_EVERY * (plan.WATCH_SAMPLES + 1)):
        p, done = plan.plan_call(TINY, f32, NUMPY_GEMM, "backward")
        picked.append(p)
        done(0.010 if p == measured else 0.005)  # the default is twice as fast now
        if p == SAFE and picked.count(SAFE) == plan.WATCH_SAMPLES:
            break
    assert picked.count(SAFE) == plan.WATCH_SAMPLES  # samples at calls 4, 8, 12
    assert [i for i, p in enumerate(picked) if p == SAFE] == [3, 7, 11]
    assert plan.plan_for(TINY, f32, NUMPY_GEMM) == SAFE  # lost: the default from now on
    assert plan.plan_call(TINY, f32, NUMPY_GEMM, "forward")[0] == SAFE
    plan.forget()
    assert plan.plan_for(TINY, f32, NUMPY_GEMM) == SAFE  # and in a later process


def test_the_in_use_check_keeps_a_plan_that_holds_and_never_samples_a_sized_call(
    store, monkeypatch
):
    _scripted_classes(monkeypatch, 2.0)
    f32 = np.dtype(np.float32)
    measured = plan.plan_for(TINY, f32, NUMPY_GEMM)
    for _ in range(plan.WATCH_EVERY * 6):
        p, done = plan.plan_call(TINY, f32, NUMPY_GEMM, "forward")
        done(0.005 if p == measured else 0.010)  # the default still twice as slow
    assert plan.plan_for(TINY, f32, NUMPY_GEMM) == measured
    sized = {plan.plan_call(TINY, f32, NUMPY_GEMM, "forward", sample=False)[0]
             for _ in range(plan.WATCH_EVERY * 2)}  # fmt: skip
    assert sized == {measured}


def test_the_gate_times_both_plans_in_turns_on_the_engine():
    """The real gate: both plans run on one layer of the call's sizes, in alternating rounds,
    steps cut to about GATE_SECONDS a pass; the ratio is default / measured."""
    dims = Dims(T=6, B=3, I=4, H=5, L=1, D=1, has_bias=True)
    walk = dataclasses.replace(SAFE, walk=True)
    got = tune.gate(dims, np.dtype(np.float32), NUMPY_GEMM, SAFE, walk)
    assert 1 <= got["steps"] <= dims.T and got["default"] > 0 and got["measured"] > 0
    assert got["ratio"] > 0


def test_the_in_use_check_compares_like_with_like(store, monkeypatch):
    """Calls of the same sizes that do different work (a training forward, an inference one;
    per row of packed batches) are watched apart: interleaved, the cheap ones never make the
    measured plan look slower than the default."""
    _scripted_classes(monkeypatch, 2.0)
    f32 = np.dtype(np.float32)
    measured = plan.plan_for(TINY, f32, NUMPY_GEMM)
    for n in range(plan.WATCH_EVERY * 8):
        part = ("forward", (False, False), False) if n % 2 else ("forward", (True, False), False)
        p, done = plan.plan_call(TINY, f32, NUMPY_GEMM, part)
        cost = 0.001 if n % 2 else 0.010  # training costs 10x inference, whatever the plan
        done(cost * (1.0 if p == measured else 1.5))  # the default 1.5x slower in both
    assert plan.plan_for(TINY, f32, NUMPY_GEMM) == measured
    p, done = plan.plan_call(TINY, f32, NUMPY_GEMM, ("backward", (True,) * 4, True))
    done(0.05, 50)  # per unit of work: 1 ms a row
    (watch,) = [w for (_, part), w in plan._watches.items() if part[0] == "backward"]
    assert watch.recent == [pytest.approx(0.001)]


class _WalkingGemm(_FourThreadGemm):
    """A back end with a library GEMM for the walks (the default plan walks with it)."""

    @staticmethod
    def walk_gemm(dtype, packed=False) -> int:
        return 1


def test_a_multi_threaded_plan_falls_back_to_one_thread_and_comes_back(store, monkeypatch):
    """The default plan on two threads, beside a busy process: once the one-thread samples are
    faster by the margin the one-thread plan serves; once the machine is quiet again and the
    two-thread samples win, they serve again. Threads the caller forced are never dropped."""
    monkeypatch.setenv("LSTMGRAD_TUNE", "cached")  # nothing measured: the default plan
    monkeypatch.setattr(openmp, "parallel_threads", lambda: 2)
    monkeypatch.setattr(plan.tune, "probe", lambda *a: _probe(walk=1e-3, pairs=6e-4))
    dims = Dims(T=100, B=64, I=256, H=256, L=1, D=2, has_bias=True)
    f32, gemm, part = np.dtype(np.float32), _WalkingGemm(), ("backward", (True,) * 4, False)
    default = plan.plan_for(dims, f32, gemm)
    assert default.pair_walks and default.threads == 2
    busy = [True]
    monkeypatch.setattr(plan, "cpus_contended", lambda: busy[0])

    def run(calls: int, cost_of) -> list:
        used = []
        for _ in range(calls):
            p, done = plan.plan_call(dims, f32, gemm, part)
            used.append(p)
            done(cost_of(p))
        return used

    # (the last call of each run is a sample of the other plan)
    used = run(plan.WATCH_EVERY * 4, lambda p: 0.030 if p.pair_walks else 0.010)  # a busy core
    assert not used[-2].pair_walks and used[-2].threads == 1  # one thread serves now
    busy[0] = False  # quiet again: two threads twice as fast; every 16th call samples them
    used = run(plan.WATCH_EVERY * 4, lambda p: 0.005 if p.pair_walks else 0.010)
    assert used[-2] == default
    with forced(threads=2):  # forced threads: no one-thread fallback
        forced_plan = plan.plan_for(dims, f32, gemm)
        used = run(plan.WATCH_EVERY * 8, lambda p: 0.030 if p.threads > 1 else 0.010)
        assert set(used) == {forced_plan}
