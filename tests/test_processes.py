"""Processes and interrupts: the library in worker processes, and after a call was cut short.

- Workers: forward + backward (NumPy float64, and torch float32 tensors on the two-thread
  kernels: a small bidirectional layer's pair walks, a larger layer's split steps) in
  ``multiprocessing`` pools (fork, spawn, forkserver) and torch DataLoader workers, started
  before and after the engine (and Numba's OpenMP threads) ran in the parent; each parent runs
  in a fresh interpreter so that "before" holds. Worker results equal the parent's (NumPy:
  bit for bit; tensors: 1e-6 relative, the parent may walk the directions at once).
- A fork while another thread holds the result pool's lock, and a result finalizer run while
  the lock is held: neither may hang (both did before workspace made the lock reentrant and
  renewed it in forked children).
- A KeyboardInterrupt or an exception raised in the middle of a call (from a function the
  engine calls per layer, from a torch function mode around its GEMMs, from a tensor hook,
  in the middle of a result allocation) leaves the library usable: the next calls give the
  same results as before, results held across the interrupt are unchanged, and the pool of
  recycled result blocks is consistent (byte count, at most two per size, lock free, no block
  shared with a live result).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import lstmgrad
from lstmgrad import aclnn
from lstmgrad.core import workspace

torch = pytest.importorskip("torch")

from oracles import rel_err  # noqa: E402

TESTS = os.path.dirname(os.path.abspath(__file__))
TIMEOUT = 90  # seconds for any child process: a hang fails instead of blocking the suite


# ---------------------------------------------------------------------------------------------
# the work a worker does


def make_case(idx: int, dtype=np.float64) -> dict:
    """idx 0: T5-B3-I4-H6, 2 layers, bidirectional, dense (pair walks with tensors);
    idx 1: T4-B16-I8-H128, 1 layer, variable lengths (split steps with tensors)."""
    rng = np.random.default_rng(100 + idx)
    T, B, I, H, L, D = (5, 3, 4, 6, 2, 2) if idx == 0 else (4, 16, 8, 128, 1, 1)
    params = []
    for layer in range(L):
        for _ in range(D):
            w_in = I if layer == 0 else D * H
            for s in [(4 * H, w_in), (4 * H, H), (4 * H,), (4 * H,)]:
                params.append(rng.uniform(-0.5, 0.5, s).astype(dtype))
    bs = None if idx == 0 else np.array([16, 12, 12, 5], np.int64)
    x = rng.standard_normal((T, B, I) if bs is None else (T * B, I)).astype(dtype)
    hx = [rng.standard_normal((L * D, B, H)).astype(dtype) for _ in range(2)]
    dy_shape = (T, B, D * H) if bs is None else (T * B, D * H)
    dy = rng.standard_normal(dy_shape).astype(dtype)
    kw = dict(num_layers=L, bidirectional=D == 2)
    return dict(x=x, params=params, hx=hx, bs=bs, dy=dy, kw=kw)


def run_case(c: dict) -> list[np.ndarray]:
    """Forward + backward; every result as a NumPy copy (tensors converted)."""
    fw = lstmgrad.lstm_forward(c["x"], c["params"], c["hx"], c["bs"], **c["kw"])
    bw = lstmgrad.lstm_backward(
        c["x"], c["hx"], c["params"], c["dy"], None, None, *fw.saved[:7], c["bs"], **c["kw"]
    )
    out = [fw.output, fw.hy, fw.cy, bw.dx, bw.dh_prev, bw.dc_prev, *bw.dparams]
    return [np.array(a.numpy() if isinstance(a, torch.Tensor) else a) for a in out]


def tensors_of(c: dict) -> dict:
    def tt(a):
        return None if a is None else torch.from_numpy(np.ascontiguousarray(a, np.float32))

    return dict(
        x=tt(c["x"]), params=[tt(p) for p in c["params"]], hx=[tt(a) for a in c["hx"]],
        bs=None if c["bs"] is None else torch.from_numpy(c["bs"]), dy=tt(c["dy"]), kw=c["kw"],
    )  # fmt: skip


def work(idx: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(NumPy float64 results, torch float32 results) of case idx."""
    c = make_case(idx)
    return run_case(c), run_case(tensors_of(c))


def assert_same(got, want) -> None:
    arrays, tensors = got
    want_arrays, want_tensors = want
    for a, b in zip(arrays, want_arrays, strict=True):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    for a, b in zip(tensors, want_tensors, strict=True):
        assert a.shape == b.shape and rel_err(a, b) <= 1e-6


class WorkDataset(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 2

    def __getitem__(self, idx: int):
        return work(idx)


def dataloader_results(timeout: float = TIMEOUT) -> list:
    loader = torch.utils.data.DataLoader(
        WorkDataset(), batch_size=None, num_workers=2, timeout=timeout,
        collate_fn=lambda item: item,
    )  # fmt: skip
    return list(loader)


def scenario(method: str) -> None:
    """Run in a fresh interpreter: workers started before the engine ran here, then after it
    ran (NumPy and tensors, so Numba's OpenMP threads started where available)."""
    ctx = mp.get_context(method)
    # forked workers take one torch thread, as DataLoader's do: a forked child's first
    # multi-threaded torch op waits for the parent's GNU OpenMP threads, engine or not
    init = _one_torch_thread if method == "fork" else None
    for phase in ("before", "after"):
        with ctx.Pool(2 if method == "fork" else 1, initializer=init) as pool:
            got = pool.map_async(work, [0, 1]).get(timeout=TIMEOUT)
        loaded = dataloader_results() if method == "fork" else None
        if phase == "before":
            want = [work(0), work(1)]  # the parent's own results
        for g, w in zip(got, want, strict=True):
            assert_same(g, w)
        if loaded is not None:
            for g, w in zip(loaded, want, strict=True):
                assert_same(g, w)
        print(method, phase, "ok", flush=True)


def _one_torch_thread() -> None:
    torch.set_num_threads(1)


def run_python(code: str, timeout: float = 2 * TIMEOUT) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [TESTS, os.path.dirname(os.path.dirname(lstmgrad.__file__)), env.get("PYTHONPATH", "")]
    )
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_workers_before_and_after_the_engine_ran_in_the_parent(method):
    if method not in mp.get_all_start_methods():
        pytest.skip(f"no {method} start method here")
    res = run_python(f"import test_processes as tp; tp.scenario({method!r})")
    assert res.returncode == 0, res.stdout + res.stderr[-3000:]
    assert f"{method} after ok" in res.stdout


def test_dataloader_workers_in_this_process():
    want = [work(0), work(1)]  # the engine has run here: forked workers after it
    for g, w in zip(dataloader_results(), want, strict=True):
        assert_same(g, w)


# ---------------------------------------------------------------------------------------------
# the result pool's lock: reentrant finalizers, fork while another thread holds it


def test_finalizer_while_the_pool_lock_is_held_does_not_deadlock():
    # the cyclic GC runs finalizers wherever it runs, also in a thread that holds the lock
    res = run_python(
        """
        import numpy as np
        from lstmgrad.core import workspace
        a = workspace.block([(1000,)], np.float32)[0]
        with workspace._pool_lock:
            del a  # its finalizer returns the block to the pool, in this thread
        assert workspace._pool_bytes == 4000, workspace._pool_bytes
        print("no deadlock")
        """,
        timeout=30,
    )
    assert res.returncode == 0 and "no deadlock" in res.stdout, res.stderr[-3000:]


def _child_forward(queue) -> None:
    c = make_case(0)
    queue.put(np.array(lstmgrad.lstm_forward(c["x"], c["params"], c["hx"], **c["kw"]).output))


@pytest.mark.skipif("fork" not in mp.get_all_start_methods(), reason="no fork here")
def test_fork_while_another_thread_holds_the_pool_lock():
    c = make_case(0)
    want = np.array(lstmgrad.lstm_forward(c["x"], c["params"], c["hx"], **c["kw"]).output)
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with workspace._pool_lock:
            held.set()
            release.wait(TIMEOUT)

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    assert held.wait(TIMEOUT)
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    try:
        child = ctx.Process(target=_child_forward, args=(queue,), daemon=True)
        child.start()
        got = queue.get(timeout=20)  # the child's forward allocates its results from the pool
        child.join(TIMEOUT)
    finally:
        release.set()
        holder.join(TIMEOUT)
        if child.is_alive():
            child.kill()
    assert np.array_equal(got, want)


# ---------------------------------------------------------------------------------------------
# interrupts and exceptions in the middle of a call


def assert_pool_consistent(live: list[np.ndarray]) -> None:
    """The pool's byte count matches its blocks, at most two a size, its lock is free (seen
    from another thread), and no pooled block is the memory of a live result."""
    free = []

    def probe() -> None:
        got = workspace._pool_lock.acquire(timeout=5)
        free.append(got)
        if got:
            workspace._pool_lock.release()

    t = threading.Thread(target=probe)
    t.start()
    t.join()
    assert free == [True]
    blocks = [m for lst in workspace._pool.values() for m in lst]
    assert sum(m.nbytes for m in blocks) == workspace._pool_bytes
    assert all(len(lst) <= 2 for lst in workspace._pool.values())
    for m in blocks:
        for a in live:
            assert not np.shares_memory(m, a)


class Once:
    """Wraps ``fn``: the ``when``-th call raises ``exc``, every other call passes through."""

    def __init__(self, fn, exc: BaseException, when: int = 2) -> None:
        self.fn, self.exc, self.when, self.calls = fn, exc, when, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        if self.calls == self.when:
            raise self.exc
        return self.fn(*args, **kwargs)


def _live(results: list[np.ndarray]) -> list[np.ndarray]:
    return [r for r in results if r.size]


@pytest.mark.parametrize("exc", [KeyboardInterrupt(), RuntimeError("user hook")],
                         ids=["KeyboardInterrupt", "RuntimeError"])  # fmt: skip
@pytest.mark.parametrize("target", ["_bias", "_initial_grads", "_gather"])
def test_interrupt_inside_a_layer_leaves_the_library_usable(monkeypatch, target, exc):
    """``target`` is called once per (layer, direction) (forward: _bias; backward: the
    others); its second call raises."""
    from lstmgrad.fused import lstm as fused_lstm

    c = make_case(0)
    before = run_case(c)  # held across the interrupt: must not change
    snapshot = [a.copy() for a in before]
    fw = lstmgrad.lstm_forward(c["x"], c["params"], c["hx"], **c["kw"])
    monkeypatch.setattr(fused_lstm, target, Once(getattr(fused_lstm, target), exc))
    with pytest.raises(type(exc) if isinstance(exc, KeyboardInterrupt) else lstmgrad.LstmError):
        if target == "_bias":
            lstmgrad.lstm_forward(c["x"], c["params"], c["hx"], **c["kw"])
        else:
            lstmgrad.lstm_backward(
                c["x"], c["hx"], c["params"], c["dy"], None, None, *fw.saved[:7], **c["kw"]
            )
    monkeypatch.undo()
    for _ in range(3):
        after = run_case(c)
        for a, b in zip(after, snapshot, strict=True):
            assert np.array_equal(a, b)
    for a, b in zip(before, snapshot, strict=True):
        assert np.array_equal(a, b)
    assert_pool_consistent(_live(before) + [fw.output, *fw.saved.h])


def test_interrupt_in_the_mirror_passes_through_and_the_next_executor_works(monkeypatch):
    from lstmgrad.fused import lstm as fused_lstm

    c = make_case(0)
    want = run_case(c)
    fw = lstmgrad.lstm_forward(c["x"], c["params"], c["hx"], **c["kw"])

    def phase1():
        outs = (np.empty_like(c["x"]), np.empty_like(c["hx"][0]), np.empty_like(c["hx"][0]),
                [np.empty_like(p) for p in c["params"]])  # fmt: skip
        status, size, executor = aclnn.aclnnLstmBackwardGetWorkspaceSize(
            c["x"], c["hx"], c["params"], c["dy"], None, None, *fw.saved[:7], None, True, 2,
            0.0, True, True, False, [True] * 4, *outs,
        )  # fmt: skip
        assert status == 0
        return outs, size, executor

    outs, size, executor = phase1()
    monkeypatch.setattr(
        fused_lstm, "_initial_grads", Once(fused_lstm._initial_grads, KeyboardInterrupt())
    )
    with pytest.raises(KeyboardInterrupt):  # not turned into a status
        aclnn.aclnnLstmBackward(np.empty(size, np.uint8), size, executor, None)
    monkeypatch.setattr(
        fused_lstm, "_initial_grads", Once(fused_lstm._initial_grads, ValueError("hook"), 1)
    )
    outs, size, executor = phase1()
    assert aclnn.aclnnLstmBackward(np.empty(size, np.uint8), size, executor, None) == 561103
    assert "hook" in aclnn.aclGetRecentErrMsg()
    monkeypatch.undo()
    outs, size, executor = phase1()
    assert aclnn.aclnnLstmBackward(np.empty(size, np.uint8), size, executor, None) == 0
    dx, dh, dc, dw = outs
    for a, b in zip([dx, dh, dc, *dw], want[3:], strict=True):
        assert np.array_equal(a, b)
    assert_pool_consistent([fw.output])


def test_interrupt_in_a_torch_function_mode_around_the_gemms():
    """A user's TorchFunctionMode (a profiler, say) sees the engine's torch.mm calls on tensor
    inputs; a KeyboardInterrupt from it mid-call leaves the library usable."""
    from torch.overrides import TorchFunctionMode

    c = tensors_of(make_case(0))
    want = run_case(c)

    class Interrupt(TorchFunctionMode):
        def __init__(self) -> None:
            super().__init__()
            self.mm = 0

        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func is torch.mm:
                self.mm += 1
                if self.mm == 2:
                    raise KeyboardInterrupt
            return func(*args, **(kwargs or {}))

    mode = Interrupt()
    with pytest.raises(KeyboardInterrupt), mode:
        run_case(c)
    assert mode.mm == 2  # the interrupt came from inside the engine's GEMMs
    for _ in range(2):
        for a, b in zip(run_case(c), want, strict=True):
            assert np.array_equal(a, b)
    assert_pool_consistent([])


def test_exception_in_a_backward_hook_of_nn_lstm():
    """A tensor hook that raises during loss.backward(): the next step's gradients equal
    torch.nn.LSTM's (float64)."""
    from lstmgrad.nn import LSTM

    torch.manual_seed(0)
    ref = torch.nn.LSTM(4, 6, num_layers=2, bidirectional=True, dtype=torch.float64)
    ours = LSTM(4, 6, num_layers=2, bidirectional=True, dtype=torch.float64)
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(5, 3, 4, dtype=torch.float64)

    def boom(grad):
        raise KeyboardInterrupt

    y, _ = ours(x)
    y.register_hook(boom)
    with pytest.raises(KeyboardInterrupt):
        y.sum().backward()
    ours.zero_grad()
    for module in (ref, ours):
        out, (h, c) = module(x)
        (out.sum() + h.sum() + c.sum()).backward()
    for (name, p), q in zip(ours.named_parameters(), ref.parameters(), strict=True):
        assert rel_err(p.grad.numpy(), q.grad.numpy()) <= 1e-10, name


def test_interrupt_between_taking_a_pooled_block_and_its_finalizer(monkeypatch):
    c = make_case(0)
    want = run_case(c)
    run_case(c)  # its blocks are back in the pool now
    real = workspace.weakref.finalize
    monkeypatch.setattr(workspace.weakref, "finalize", Once(real, KeyboardInterrupt(), 1))
    with pytest.raises(KeyboardInterrupt):
        run_case(c)
    monkeypatch.undo()
    assert_pool_consistent([])
    got = run_case(c)
    for a, b in zip(got, want, strict=True):
        assert np.array_equal(a, b)
    assert_pool_consistent([])
