"""The mirror's executor runs the execution plan its workspace was sized for: whatever changes
between phase 1 and phase 2 (LSTMGRAD_PLAN, :func:`lstmgrad.planning.plan.forced`, Numba's or
torch's thread count, a measurement stored), phase 2 returns 0 with a workspace of exactly
``workspaceSize`` bytes and results equal to the float64 reference engine's; the engine gets
the executor's plan (less threads no longer allowed)."""

from __future__ import annotations

import dataclasses
import multiprocessing as mp

import numba
import numpy as np
import pytest

import lstmgrad
from lstmgrad import aclnn, fused
from lstmgrad.core import machine
from lstmgrad.core.layout import Dims
from lstmgrad.fused.gemm import NUMPY_GEMM
from lstmgrad.fused.lstm import backward_workspace_slots, forward_workspace_slots
from lstmgrad.planning import openmp, plan, tune

T, B, I, H, L = 10, 8, 16, 32, 1
DIMS = Dims(T, B, I, H, L, 2, True)
F32 = np.dtype(np.float32)
TOL = 2e-5  # float32 against the float64 reference, relative to the largest entry


def _case(seed=0):
    rng = np.random.default_rng(seed)
    params = []
    for layer in range(L):
        for _ in range(2):
            width = I if layer == 0 else 2 * H
            params += [rng.uniform(-0.5, 0.5, s).astype(np.float32)
                       for s in [(4 * H, width), (4 * H, H), (4 * H,), (4 * H,)]]  # fmt: skip
    x = rng.standard_normal((T, B, I)).astype(np.float32)
    hx = [rng.standard_normal((2 * L, B, H)).astype(np.float32) for _ in range(2)]
    kw = dict(num_layers=L, bidirectional=True)
    fwd = lstmgrad.lstm_forward(x, params, hx, impl="reference", **kw)
    dy = rng.standard_normal(fwd.output.shape).astype(np.float32)
    dh, dc = (rng.standard_normal(hx[0].shape).astype(np.float32) for _ in range(2))
    want_b = lstmgrad.lstm_backward(x, hx, params, dy, dh, dc, *fwd.saved[:7], impl="reference",
                                    **kw)  # fmt: skip
    return dict(x=x, hx=hx, params=params, fwd=fwd, dy=dy, dh=dh, dc=dc, want_b=want_b)


CASE = _case()


def _rel(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))


def _backward_phase1(c, wrap=lambda a: a):
    """Phase 1 of the backward; its status, size, executor and the outputs (NaN-filled)."""
    outs = (np.full_like(c["x"], np.nan), np.full_like(c["hx"][0], np.nan),
            np.full_like(c["hx"][0], np.nan), [np.full_like(p, np.nan) for p in c["params"]])  # fmt: skip
    status, size, ex = aclnn.aclnnLstmBackwardGetWorkspaceSize(
        wrap(c["x"]), [wrap(a) for a in c["hx"]], [wrap(p) for p in c["params"]], wrap(c["dy"]),
        wrap(c["dh"]), wrap(c["dc"]), *[[wrap(a) for a in s] for s in c["fwd"].saved[:7]], None,
        True, L, 0.0, True, True, False, [True] * 4, wrap(outs[0]), wrap(outs[1]), wrap(outs[2]),
        [wrap(p) for p in outs[3]],
    )  # fmt: skip
    assert status == 0, aclnn.aclGetRecentErrMsg()
    return size, ex, outs


def _forward_phase1(c, wrap=lambda a: a):
    """Phase 1 of the forward with train; its size, executor and the outputs (NaN-filled)."""
    y = np.full((T, B, 2 * H), np.nan, np.float32)
    hy, cy = np.full_like(c["hx"][0], np.nan), np.full_like(c["hx"][0], np.nan)
    lists = [[np.full((T, B, H), np.nan, np.float32) for _ in range(2 * L)] for _ in range(7)]
    status, size, ex = aclnn.aclnnLSTMGetWorkspaceSize(
        wrap(c["x"]), [wrap(p) for p in c["params"]], [wrap(a) for a in c["hx"]], None, True, L,
        0.0, True, True, False, wrap(y), wrap(hy), wrap(cy),
        *[[wrap(a) for a in lst] for lst in lists],
    )  # fmt: skip
    assert status == 0, aclnn.aclGetRecentErrMsg()
    return size, ex, (y, hy, cy, lists)


def _phase1(op, c, wrap=lambda a: a):
    return (_backward_phase1 if op == "backward" else _forward_phase1)(c, wrap)


def _run(op, size, ex, offset=0):
    """Phase 2 on a NaN-filled workspace of exactly ``size`` bytes, ``offset`` bytes into a
    buffer (any alignment)."""
    buf = np.full(size + 64, 0xFF, np.uint8)
    workspace = buf[offset : offset + size]
    run = aclnn.aclnnLstmBackward if op == "backward" else aclnn.aclnnLSTM
    status = run(workspace, size, ex, None)
    assert status == 0, aclnn.aclGetRecentErrMsg()


def _check(op, outs, c=CASE):
    """The outputs against the float64 reference engine."""
    if op == "backward":
        want = c["want_b"]
        pairs = [(outs[0], want.dx), (outs[1], want.dh_prev), (outs[2], want.dc_prev),
                 *zip(outs[3], want.dparams, strict=True)]  # fmt: skip
    else:
        fwd = c["fwd"]
        y, hy, cy, lists = outs
        pairs = [(y, fwd.output), (hy, fwd.hy), (cy, fwd.cy)]
        pairs += [(a, w) for got, want in zip(lists, fwd.saved[:7], strict=True)
                  for a, w in zip(got, want, strict=True)]  # fmt: skip
    for got, want in pairs:
        assert _rel(got, want) <= TOL


@pytest.fixture
def two_threads(monkeypatch):
    """Plans may have two threads whatever this machine allows (a parallel loop of two parts
    runs alike on fewer threads)."""
    monkeypatch.setattr(openmp, "parallel_threads", lambda: 2)
    monkeypatch.setattr(machine, "blas_threads", lambda: 2)


@pytest.fixture
def ran(monkeypatch):
    """The plans the fused engine was called with."""
    seen: list[plan.Plan] = []
    for name in ("lstm_forward", "lstm_backward"):
        engine = getattr(fused, name)

        def recording(call, arena=None, *, engine=engine, **kwargs):
            seen.append(kwargs["plan"])
            return engine(call, arena, **kwargs)

        monkeypatch.setattr(fused, name, recording)
    return seen


# (LSTMGRAD_PLAN in phase 1, in phase 2): each changes the plan between the phases; the first
# three change the workspace's size (pair walks take a second set of per-direction scratch)
CHANGES = {
    "pair_walks-on": ("", "pair_walks=true,threads=2"),
    "pair_walks-off": ("pair_walks=true,threads=2", ""),
    "threads": ("pair_walks=true,threads=1", "pair_walks=true,threads=2"),
    "walk": ("", "walk=true"),
    "walk_rows": ("walk=true", "walk=true,walk_rows=2,threads=2"),
    "fwd_walk": ("walk=true,fwd_walk=false", "walk=true"),
    "fwd_rec-bwd_rec": ("", "fwd_rec=loop,bwd_rec=blas_t"),
    "split": ("", "threads=2,split_min=0"),
    "transpose_threads": ("", "transpose_threads=2"),
}


@pytest.mark.parametrize("op", ["backward", "forward"])
@pytest.mark.parametrize("change", CHANGES, ids=list(CHANGES))
def test_forced_fields_changed_between_the_phases(monkeypatch, two_threads, ran, op, change):
    before, after = CHANGES[change]
    monkeypatch.setenv("LSTMGRAD_PLAN", before)
    size, ex, outs = _phase1(op, CASE)
    monkeypatch.setenv("LSTMGRAD_PLAN", after)
    later = _phase1(op, CASE)[1].plan  # what phase 1 would fix now
    assert later != ex.plan
    slots = backward_workspace_slots if op == "backward" else forward_workspace_slots
    if change.startswith(("pair_walks", "threads")):  # sized for another workspace
        assert later.pair_walks != ex.plan.pair_walks
        assert slots(DIMS, F32, later) != slots(DIMS, F32, ex.plan)
    _run(op, size, ex)
    assert ran == [ex.plan]
    _check(op, outs)


@pytest.mark.parametrize("op", ["backward", "forward"])
def test_forced_block_changed_between_the_phases(two_threads, ran, op):
    with plan.forced(pair_walks=False):
        size, ex, outs = _phase1(op, CASE)
    with plan.forced(pair_walks=True, threads=2):
        assert _phase1(op, CASE)[1].plan.pair_walks and not ex.plan.pair_walks
        _run(op, size, ex)
    assert ran == [ex.plan]
    _check(op, outs)


def test_the_brief_failure_case_now_runs(monkeypatch, two_threads):
    """Sized without pair walks, pair walks forced before the run: it used to run out of the
    workspace (561103, 'workspace exhausted')."""
    monkeypatch.delenv("LSTMGRAD_PLAN", raising=False)
    size, ex, outs = _backward_phase1(CASE)
    monkeypatch.setenv("LSTMGRAD_PLAN", "pair_walks=true,threads=2")
    assert aclnn.aclnnLstmBackward(np.empty(size, np.uint8), size, ex, None) == 0
    _check("backward", outs)


@pytest.mark.parametrize("op", ["backward", "forward"])
@pytest.mark.parametrize("pairs", [False, True], ids=["one-direction-at-a-time", "pair-walks"])
@pytest.mark.parametrize("offset", [0, 1, 8, 63])
def test_a_workspace_of_exactly_the_size_is_enough(monkeypatch, two_threads, op, pairs, offset):
    """Exactly workspaceSize bytes at any alignment; one byte less is refused (161002)."""
    monkeypatch.setenv("LSTMGRAD_PLAN", "pair_walks=true,threads=2" if pairs else "")
    size, ex, outs = _phase1(op, CASE)
    assert ex.plan.pair_walks == pairs
    _run(op, size, ex, offset)
    _check(op, outs)
    size, ex, _ = _phase1(op, CASE)
    run = aclnn.aclnnLstmBackward if op == "backward" else aclnn.aclnnLSTM
    assert run(np.empty(size - 1, np.uint8), size - 1, ex, None) == 161002
    assert "workspaceSize must be an int >= " in aclnn.aclGetRecentErrMsg()


def _numba_threads(n):
    if numba.config.NUMBA_NUM_THREADS < n:
        pytest.skip(f"Numba may start {numba.config.NUMBA_NUM_THREADS} threads here, not {n}")
    numba.set_num_threads(n)


@pytest.mark.parametrize("op", ["backward", "forward"])
def test_numba_threads_raised_between_the_phases(monkeypatch, ran, op):
    """Sized on one Numba thread (pair walks forced but not allowed), run after the thread
    count went up (the planner would now pair the directions)."""
    monkeypatch.setattr(machine, "blas_threads", lambda: 2)
    monkeypatch.setattr(openmp, "pairs_available", lambda: True)
    monkeypatch.setenv("LSTMGRAD_PLAN", "pair_walks=true,threads=2")
    saved = numba.get_num_threads()
    try:
        _numba_threads(1)
        size, ex, outs = _phase1(op, CASE)
        assert not ex.plan.pair_walks
        _numba_threads(2)
        if openmp.parallel_threads() < 2:
            pytest.skip("one CPU visible here: no plan has two threads")
        assert _phase1(op, CASE)[1].plan.pair_walks
        _run(op, size, ex)
    finally:
        numba.set_num_threads(saved)
    assert ran == [ex.plan]
    _check(op, outs)


@pytest.mark.parametrize("op", ["backward", "forward"])
def test_numba_threads_lowered_between_the_phases(monkeypatch, ran, op):
    """Sized for pair walks on two threads, run on one: the engine gets the plan without the
    threads no longer allowed (never more scratch), and computes the same."""
    monkeypatch.setattr(machine, "blas_threads", lambda: 2)
    monkeypatch.setattr(openmp, "pairs_available", lambda: True)
    monkeypatch.setenv("LSTMGRAD_PLAN", "pair_walks=true,threads=2")
    saved = numba.get_num_threads()
    try:
        _numba_threads(2)
        if openmp.parallel_threads() < 2:
            pytest.skip("one CPU visible here: no plan has two threads")
        size, ex, outs = _phase1(op, CASE)
        assert ex.plan.pair_walks and ex.plan.threads == 2
        _numba_threads(1)
        _run(op, size, ex)
    finally:
        numba.set_num_threads(saved)
    (got,) = ran
    assert got == dataclasses.replace(ex.plan, threads=1, pair_walks=False)
    _check(op, outs)


@pytest.mark.parametrize("op", ["backward", "forward"])
def test_torch_threads_changed_between_the_phases(monkeypatch, ran, op):
    """Tensors (torch's GEMMs, whose thread count bounds the plan's): sized on one torch
    thread, run after it went up to two, and the other way round."""
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(openmp, "parallel_threads", lambda: 2)
    monkeypatch.setattr(machine, "visible_cpus", lambda: 2)
    monkeypatch.setenv("LSTMGRAD_PLAN", "pair_walks=true,threads=2")
    saved = torch.get_num_threads()
    try:
        for first, second in ((1, 2), (2, 1)):
            ran.clear()
            torch.set_num_threads(first)
            size, ex, outs = _phase1(op, CASE, torch.from_numpy)
            assert ex.plan.pair_walks == (first == 2)
            torch.set_num_threads(second)
            _run(op, size, ex)
            (got,) = ran
            assert got.pair_walks == (first == 2 and second == 2)
            assert got == (ex.plan if first == 1 else dataclasses.replace(ex.plan, threads=1,
                                                                         pair_walks=False))  # fmt: skip
            _check(op, outs)
    finally:
        torch.set_num_threads(saved)


@pytest.mark.parametrize("op", ["backward", "forward"])
def test_a_measurement_stored_between_the_phases(monkeypatch, tmp_path, two_threads, ran, op):
    """Sized for the default plan (nothing measured), run after a measurement of the call's
    classes was stored that gives it pair walks."""
    monkeypatch.setenv("LSTMGRAD_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("LSTMGRAD_PLAN", raising=False)
    monkeypatch.setattr(plan, "machine_busy", lambda: False)
    monkeypatch.setattr(plan, "others_cpus", lambda start: 0.0)
    monkeypatch.setattr(tune, "measure_big", lambda cls, gemm: {"plan": {}})
    monkeypatch.setattr(tune, "measure_steps",
                        lambda cls, gemm: {"plan": {"pair_walks": True, "threads": 2}})  # fmt: skip
    monkeypatch.setattr(tune, "gate", lambda dims, dtype, gemm, default, measured: {"ratio": 2.0})
    plan.forget()
    try:
        monkeypatch.setenv("LSTMGRAD_TUNE", "cached")  # nothing stored: the default plan
        size, ex, outs = _phase1(op, CASE)
        assert ex.plan == plan.default_plan(DIMS, F32, NUMPY_GEMM)
        assert not ex.plan.pair_walks
        monkeypatch.setenv("LSTMGRAD_TUNE", "eager")
        assert plan.plan_for(DIMS, F32, NUMPY_GEMM).pair_walks  # measured, stored
        assert list(tmp_path.glob("wisdom-*.json"))
        _run(op, size, ex)
    finally:
        plan.forget()
    assert ran[-1] == ex.plan
    _check(op, outs)


def _run_in_child(op, size, ex, outs, conn):
    run = aclnn.aclnnLstmBackward if op == "backward" else aclnn.aclnnLSTM
    status = run(np.empty(size, np.uint8), size, ex, None)
    conn.send((status, aclnn.aclGetRecentErrMsg(), outs))
    conn.close()


@pytest.mark.skipif("fork" not in mp.get_all_start_methods(), reason="no fork here")
@pytest.mark.parametrize("op", ["backward", "forward"])
def test_an_executor_with_pair_walks_runs_in_a_forked_child(monkeypatch, op):
    """GNU OpenMP is not fork-safe: a forked child walks one direction at a time
    (openmp.pairs_available), also with an executor its parent sized for pair walks."""
    monkeypatch.setattr(machine, "blas_threads", lambda: 2)
    if openmp.parallel_threads() < 2:
        pytest.skip("no parallel walks in this process")
    monkeypatch.setenv("LSTMGRAD_PLAN", "pair_walks=true,threads=2")
    lstmgrad.lstm_forward(CASE["x"], CASE["params"], CASE["hx"], bidirectional=True)  # the pool
    size, ex, outs = _phase1(op, CASE)
    assert ex.plan.pair_walks
    ctx = mp.get_context("fork")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_run_in_child, args=(op, size, ex, outs, child))
    proc.start()
    child.close()
    try:  # a child stopped by its OpenMP runtime sends nothing
        got = parent.recv() if parent.poll(120) else None
    except EOFError:
        got = None
    proc.join(60)
    assert proc.exitcode == 0 and got is not None, proc.exitcode
    status, message, child_outs = got
    assert status == 0, message
    _check(op, child_outs)
