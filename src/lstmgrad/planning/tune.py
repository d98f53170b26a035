"""Measurements behind the execution plans (:mod:`lstmgrad.planning.plan`), taken on the machine in use.

Two classes of shapes are measured, each the first time a call needs it, and stored:

- big products (rows of all steps N, bucketed to a power of two; input size I; hidden H): the
  input projection, dx and the weight gradient in each layout, with each GEMM method of the
  back end; the plan takes the fastest method and layout.
- step loops (batch B, hidden H, directions D): the recurrent product per method (preparation
  and per-call time, so that the plan picks per sequence length: a packed weight pays only
  over enough steps), the step kernels on one thread and split over the available threads (the
  smallest step where the split pays), and short forward + backward passes of the engine on
  each arrangement (one thread, each direction's whole step loop in one Numba call, split
  steps, blocks of each direction's rows walking at once, both directions walking at once
  (with blocks of rows where there are more threads than directions); the walks only where
  their recurrent product, by the Numba loop or the library's own routine, whichever is faster
  on one thread, takes under 3x the best library product on all threads), in the context where
  threads may fight (the library's GEMMs between the kernels).

Each measurement is bounded: a candidate slower than 3x the best so far is dropped after its
first run. Compilation (Numba's first call) is kept out of the timings by a warm-up run.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ..core.contract import check_backward, check_forward
from ..core.layout import Dims
from ..fused import lstm as fused_lstm
from ..fused.gemm import product_into
from ..fused.plan import SAFE, Plan, compute_dtype
from . import openmp
from .feasible import feasible

_STEPS = 48  # steps of the short passes that compare thread arrangements (at most)
_PASS_SECONDS = 0.02  # about the recurrent products' time in one such pass
_PASS_ROUNDS = 3  # rounds of those passes, the candidates taking turns
_CLOSE = 1.05  # candidates within this factor of the best get up to _PASS_ROUNDS more rounds
_PRIVATE_MARGIN = 1.05  # a private op's products must beat the public GEMM's by this factor
_PASS_INPUT = 128  # their input width at most: the big products' share stays small
# a walk whose products alone take over this factor of the library's best (all threads, and
# its per-step calls and kernels, which a walk saves) is not timed in the passes
_WALK_BOUND = 3.0
# walks on threads side by side also try each product within this factor of the fastest alone:
# two threads' library calls at once can lose to the loops (they share the caches, the cores)
_SIDE_BY_SIDE = 2.0


def _timed(
    fn: Callable[[], Any], reps: int, limit: float = float("inf"), warm: bool = True
) -> float:
    """The least seconds of up to ``reps`` runs of fn, after one untimed warm-up run unless
    ``warm`` is False (first calls compile, load or create what later calls reuse); inf where
    the first timed run exceeds ``limit``. The least, not the median: other processes' load
    only ever adds time."""
    if warm:
        fn()
    times: list[float] = []
    for _ in range(max(1, reps)):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        if times[0] > limit:
            return float("inf")
    return min(times)


def _reps(seconds: float) -> int:
    """Repetitions for a run of about ``seconds``: more for short ones (noisier), one for a
    run long enough to time alone (its warm-up skipped too: a first call's extra cost is small
    beside it)."""
    if seconds < 2e-4:
        return 15
    if seconds < 5e-3:
        return 5
    return 2 if seconds < 2e-2 else 1


def _rand(rng: np.random.Generator, shape: tuple[int, ...], cd: np.dtype) -> np.ndarray:
    return rng.standard_normal(shape).astype(cd)


def _best(times: dict[str, float]) -> str:
    return min(times, key=lambda k: times[k])


# --------------------------------------------------------------------------------------------
# big products


def _product_method(products: dict[str, float], public: str) -> str:
    """The fastest method of ``products`` (seconds per method), but ``public`` (the library's
    public GEMM: torch.mm, NumPy's) unless another beats it by over :data:`_PRIVATE_MARGIN`: a
    private op is kept for clear wins, not for the machine's noise."""
    method = _best(products)
    return method if products[method] * _PRIVATE_MARGIN <= products[public] else public


def measure_big(cls: dict[str, Any], gemm: Any) -> dict[str, Any]:
    """Times of the input projection, dx and the weight gradient per method, for N rows, input
    size I and hidden H, and of a transposing copy per thread count; the entry's plan: the
    fastest method and thread count."""
    cd = np.dtype(cls["dtype"])
    ops = _BigOperands(cls, cd)
    transposes = _transpose_times(gemm, ops)
    tt = int(_best(transposes))
    conversions = _conversion_times(gemm, ops.n, ops.h, cd, tt)
    products = _product_times(gemm, ops)
    return {
        "plan": {
            "big": _product_method(products, gemm.product_methods(cd)[0]),
            "transpose_threads": tt,
            "convert": _best(conversions) if conversions else "kernels",
        },
        "seconds": {
            **{f"{m}/products": t for m, t in products.items()},
            **{f"transpose/{k}": t for k, t in transposes.items()},
            **{f"convert/{k}": t for k, t in conversions.items()},
        },  # fmt: skip
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }


class _BigOperands:
    """Random operands of a big-products class (N rows, input size I, hidden H) and the
    arrays the timed products and copies write."""

    def __init__(self, cls: dict[str, Any], cd: np.dtype) -> None:
        n, i, h = self.n, self.i, self.h = cls["N"], cls["I"], cls["H"]
        g = self.g = 4 * h
        rng = np.random.default_rng(0)
        self.x, self.hp = _rand(rng, (n, i), cd), _rand(rng, (n, h), cd)  # x, h_prev rows
        self.dg = _rand(rng, (n, g), cd)
        self.w_ih = _rand(rng, (g, i), cd)
        self.proj, self.dx = np.empty((n, g), cd), np.empty((n, i), cd)
        self.dgt = np.empty((g, n), cd)
        self.dw_ih, self.dw_hh = np.empty((g, i), cd), np.empty((g, h), cd)  # the results

    def transpose_dg(self, threads: int) -> None:
        """dG's transposing copy into dgt (the copies a plan's transpose_threads runs), on
        ``threads``."""
        from ..fused.walks import transpose_cols

        n, g = self.n, self.g
        transpose_cols(self.dg.reshape(-1), g, n, 0, g, self.dgt.reshape(-1), threads)


def _transpose_times(gemm: Any, ops: _BigOperands) -> dict[str, float]:
    """The transposing copy of dG on one thread, or split over the threads Numba's pool has,
    per thread count, each timed with the library's product that follows it in the engine: the
    pool's threads spin a while after the copy, and a library with threads of its own
    (OpenBLAS's) can wait for the CPUs they hold, which the copy alone does not show."""
    method = gemm.product_methods(ops.dg.dtype)[0]
    follow = functools.partial(gemm.product, ops.dg, ops.w_ih, ops.dx, method)
    times: dict[str, float] = {}
    for threads in sorted({1, openmp.parallel_threads() if openmp.pairs_available() else 1}):

        def copy_then_product(threads: int = threads) -> None:
            ops.transpose_dg(threads)
            follow()

        times[str(threads)] = _timed(copy_then_product, _reps(_timed(copy_then_product, 1)))
    return times


def _product_times(gemm: Any, ops: _BigOperands) -> dict[str, float]:
    """Per GEMM method, the input projection's time plus dx's and the weight gradient's."""
    out: dict[str, float] = {}
    for method in gemm.product_methods(ops.dg.dtype):
        projection = functools.partial(gemm.product, ops.x, ops.w_ih.T, ops.proj, method)
        first = _timed(projection, 1)
        reps = _reps(first)
        if reps > 1:
            first = min(first, _timed(projection, reps - 1, warm=False))
        dx_product = functools.partial(gemm.product, ops.dg, ops.w_ih, ops.dx, method)

        def weight_grad(method: str = method) -> None:  # two products, as the engine's
            product_into(gemm, ops.dg.T, ops.x, ops.dw_ih, method)
            product_into(gemm, ops.dg.T, ops.hp, ops.dw_hh, method)

        out[method] = (first + _timed(dx_product, reps, warm=reps > 1)
                       + _timed(weight_grad, reps, warm=reps > 1))  # fmt: skip
    return out


def _conversion_times(gemm: Any, n: int, h: int, cd: np.dtype, threads: int) -> dict[str, float]:
    """Times of float16 -> float32 and back of an [n, h] array by the engine's kernels (on
    ``threads`` threads) and by the back end's own conversion, where it has one (float32
    compute only: float16 storage's)."""
    from ..fused import half

    if cd != np.float32:
        return {}
    rng = np.random.default_rng(3)
    wide = _rand(rng, (n, h), cd)
    narrow = np.empty((n, h), np.float16)
    if not gemm.convert(narrow[:1], wide[:1]):
        return {}

    def run(how: half.Conversion) -> Callable[[], None]:
        def both() -> None:
            half.assign(narrow, wide, how)
            half.assign(wide, narrow, how)

        return both

    kernels, library = run(half.Conversion(threads)), run(half.Conversion(1, gemm.convert))
    reps = _reps(_timed(kernels, 1))
    return {"kernels": _timed(kernels, reps), "library": _timed(library, reps)}


# --------------------------------------------------------------------------------------------
# step loops


def _recurrent_times(
    gemm: Any,
    b_mat: np.ndarray,
    rows: int,
    cd: np.dtype,
    thread_counts: list[int],
    tries: int = 3,
) -> dict[str, dict[str, Any]]:
    """Per fixed-product method for a [rows, K] x b_mat: "prep", the seconds of its preparation
    with its transposing copy on each of ``thread_counts`` threads (keyed by the count, as
    text; the least of ``tries``), and "call", the seconds of one product."""
    rng = np.random.default_rng(1)
    a = _rand(rng, (rows, b_mat.shape[0]), cd)
    out = np.empty((rows, b_mat.shape[1]), cd)
    times: dict[str, dict[str, Any]] = {}
    best = float("inf")
    for method in gemm.fixed_methods(cd):
        gemm.fixed(b_mat, method, rows, thread_counts[0])(a, out)  # compiles / loads
        prep: dict[str, float] = {}
        for threads in thread_counts:
            prep[str(threads)] = float("inf")
            for _ in range(tries):  # the least of a few: a page fault or another process adds
                t0 = time.perf_counter()
                product = gemm.fixed(b_mat, method, rows, threads)
                prep[str(threads)] = min(prep[str(threads)], time.perf_counter() - t0)
        run = functools.partial(product, a, out)
        call = _timed(run, 2, limit=3 * best)
        if call < float("inf"):
            call = min(call, _timed(run, _reps(call), warm=False))
        times[method] = {"prep": prep, "call": call}
        best = min(best, call)
    return times


def _walk_product_times(gemm: Any, w_hh: np.ndarray, rows: int, cd: np.dtype, parts: int = 1,
                        prep: dict[str, float] | None = None) -> dict[str, float]:  # fmt: skip
    """Seconds of a walk's two recurrent products (the forward's and the backward's, [rows, H]
    x W_hh^T and [rows, 4H] x W_hh) on this thread: "loop" (the engine's Numba loop) and,
    where the back end has them to call, "library" (its own GEMM: :meth:`Gemm.walk_gemm`) and
    "packed" (its packed GEMM, W_hh packed once, as a walk does for all its steps). With
    ``parts`` > 1, the rows in that many blocks on as many threads at once (blocks of rows
    walking side by side). ``prep`` gets each product's preparation of both operands (the
    packing, or the Numba loop's transposing copy) in seconds."""
    from ..fused.kernels import transposed
    from ..fused.walks import walk_products, walk_products_parts

    h = w_hh.shape[1]
    rng = np.random.default_rng(5)
    w_t, w = np.ascontiguousarray(w_hh.T), np.ascontiguousarray(w_hh)
    a_fwd, a_bwd = _rand(rng, (rows, h), cd), _rand(rng, (rows, 4 * h), cd)
    out_fwd, out_bwd = np.empty((rows, 4 * h), cd), np.empty((rows, h), cd)
    fns = {"loop": 0, "library": gemm.walk_gemm(cd), "packed": gemm.walk_gemm(cd, True)}
    block = -(-rows // parts)
    times: dict[str, float] = {}
    for name, fn in fns.items():
        if name != "loop" and not fn:
            continue
        t0 = time.perf_counter()
        if not fn:  # the Numba loop reads W_hh^T as a copy
            transposed(w_hh)
        bt, b = (fused_lstm.walk_operand(name, gemm, fn, m, block, slot)
                 for slot, m in enumerate((w_t, w)))  # as the walks take them  # fmt: skip
        if prep is not None:
            prep[name] = time.perf_counter() - t0

        def run(reps: int, fn: int = fn, bt: np.ndarray = bt, b: np.ndarray = b) -> None:
            if parts > 1:
                walk_products_parts(fn, a_fwd, bt, out_fwd, a_bwd, b, out_bwd, reps, parts)
            else:
                walk_products(fn, a_fwd, bt, out_fwd, a_bwd, b, out_bwd, reps)

        one = _timed(functools.partial(run, 1), 1)  # compiles (warm-up), then one pair
        reps = max(1, min(1000, int(1e-3 / max(one, 1e-9))))  # about a millisecond a run
        times[name] = _timed(functools.partial(run, reps), 5) / reps
    return times


def _gate_step(b: int, h: int, cd: np.dtype) -> Callable[[int, int], Callable[[], None]]:
    """Random operands of one step's gate maths for b rows, and ``step(n, parts)``: a run of
    the forward's and the backward's step kernels on the first n rows, on one thread (parts 1)
    or with the rows split over ``parts`` threads, as the engine calls them."""
    from ..fused import kernels, walks

    rng = np.random.default_rng(2)
    gx, gh = _rand(rng, (b, 4 * h), cd), _rand(rng, (b, 4 * h), cd)
    bias = np.zeros(4 * h, cd)
    st = np.zeros((2, b, h), cd)
    acts = np.zeros((8, b, h), cd) + cd.type(0.5)
    dg, db = np.empty((b, 4 * h), cd), np.zeros((b, 4 * h), cd)
    dy = _rand(rng, (b, h), cd)

    def step(n: int, parts: int) -> Callable[[], None]:
        def run() -> None:
            if parts > 1:
                walks.forward_step_split(gx, gh, bias, st[0], st[1], n, parts, *acts)
                walks.backward_step_split(dy, True, st[0], st[1], *acts[:4], acts[6], acts[7],
                                          dg, n, db, True, parts)  # fmt: skip
            else:
                kernels.forward_step(gx, gh, bias, st[0], st[1], n, *acts)
                kernels.backward_step(dy, True, st[0], st[1], *acts[:4], acts[6], acts[7], dg,
                                      n, db, True)  # fmt: skip

        return run

    return step


def _gate_seconds(b: int, h: int, cd: np.dtype, parts: int = 1) -> float:
    """Seconds of one step's gate maths, forward and backward, for b rows on one thread, or
    with the rows split over ``parts`` threads."""
    run = _gate_step(b, h, cd)(b, parts)
    return _timed(run, _reps(_timed(run, 1)) * 3)


PROBE_BIG_ROWS = 256
"""The rows the probe's big products are timed with (at most): enough for the library's
kernel of many rows, few enough that the probe stays a fraction of a second at H 1024."""


def probe(cls: dict[str, Any], gemm: Any, big_sizes: tuple[int, int] | None = None
          ) -> dict[str, Any]:  # fmt: skip
    """The default plan's inputs (:mod:`lstmgrad.planning.model`) for a step-loop class (B, H,
    D), measured at its sizes: the per-step library products per method on all the library's
    threads (preparation and call), a walk's products per walk product on one thread for all
    B rows, and for blocks of rows (one direction) or both directions (two) walking side by
    side on the usable threads at once, one step's gate maths (on one thread, and split over
    the usable threads); with ``big_sizes`` (I, and the
    rows of all steps) the big products per method (at most :data:`PROBE_BIG_ROWS` rows).
    Well under a second at H 1024, milliseconds for small layers."""
    cd = np.dtype(cls["dtype"])
    b, h, d = cls["B"], cls["H"], cls["D"]
    rng = np.random.default_rng(4)
    w_hh = _rand(rng, (4 * h, h), cd) * cd.type(1 / np.sqrt(h))
    rec = {
        "fwd": _recurrent_times(gemm, w_hh.T, b, cd, [1], tries=1),  # the engine's view
        "bwd": _recurrent_times(gemm, w_hh, b, cd, [1], tries=1),
    }
    prep: dict[str, float] = {}
    out: dict[str, Any] = {
        "recurrent": rec,
        "walk": _walk_product_times(gemm, w_hh, b, cd, prep=prep),
        "walk_prep": prep,
        "gate": _gate_seconds(b, h, cd),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    usable = max(1, min(openmp.parallel_threads(), gemm.threads()))
    if usable >= 2 and b >= 2:  # the gate maths of a step split over the threads
        out["gate_split"] = _gate_seconds(b, h, cd, min(usable, b))
        out["split_parts"] = min(usable, b)
    if usable >= 2 and d == 2:  # both directions at once: two parts of all B rows
        out["pairs"] = _walk_product_times(gemm, w_hh, 2 * b, cd, parts=2)
    elif usable >= 2 and d == 1 and b >= 2:
        parts = min(usable, b)
        out["rows"] = _walk_product_times(gemm, w_hh, b, cd, parts=parts)
        out["rows_parts"] = parts
    if big_sizes is not None:
        i, n = big_sizes
        ops = _BigOperands({"N": min(n, PROBE_BIG_ROWS), "I": i, "H": h}, cd)
        out["big"] = _product_times(gemm, ops)
    return out


def choose_recurrent(times: dict[str, dict[str, Any]], steps: int, threads: int = 1) -> str:
    """The method with the least preparation (its transposing copy on ``threads`` threads; the
    slowest measured count where that one was not) + ``steps`` calls."""

    def cost(method: str) -> float:
        prep = times[method]["prep"]
        return prep.get(str(threads), max(prep.values())) + steps * times[method]["call"]

    return min(times, key=cost)


def _split_min(b: int, h: int, cd: np.dtype, parts: int) -> int:
    """The smallest step (rows * H) from which the step kernels split over ``parts`` threads
    beat one thread, forward and backward together, for row counts B, B/2, B/4, ... (a step
    larger than B * H splits where B does); B * H + 1 where they never do."""
    step = _gate_step(b, h, cd)
    split_min = b * h + 1
    n = b
    while n >= 1:
        serial, split = step(n, 1), step(n, parts)
        one = _timed(serial, 1)
        reps = _reps(one) * 3
        if _timed(split, reps) >= _timed(serial, reps):
            break
        split_min = n * h
        n //= 2
    return split_min


class _Engine:
    """One training pass (forward, then backward) of the engine on random data of one layer's
    sizes, run with an explicit plan: what the passes and the gate time."""

    def __init__(self, t: int, b: int, i: int, h: int, d: int, cd: np.dtype, gemm: Any) -> None:
        rng = np.random.default_rng(3)
        scale = cd.type(1 / np.sqrt(h))
        self.x = _rand(rng, (t, b, i), cd)
        self.params: list[np.ndarray] = []
        for _ in range(d):
            self.params += [_rand(rng, (4 * h, i), cd) * scale, _rand(rng, (4 * h, h), cd) * scale]
            self.params += [_rand(rng, (4 * h,), cd) * scale, _rand(rng, (4 * h,), cd) * scale]
        self.hx = [np.zeros((d, b, h), cd), np.zeros((d, b, h), cd)]
        self.dy = _rand(rng, (t, b, d * h), cd)
        self.bidir = d == 2
        self.gemm = gemm
        self.forward = check_forward("tune", self.x, self.params, self.hx, None, True, 1, 0.0,
                                     True, self.bidir, False, 0)  # fmt: skip
        self.dims = self.forward.dims

    def run(self, plan: Plan) -> tuple[float, float]:
        """The forward's and the backward's seconds under ``plan``."""
        t0 = time.perf_counter()
        _, _, _, s = fused_lstm.lstm_forward(self.forward, gemm=self.gemm, plan=plan)
        t1 = time.perf_counter()
        assert s is not None  # a training forward saves its activations
        saved = (s.i, s.g, s.f, s.o, s.h, s.c, s.tanhc)
        backward = check_backward("tune", self.x, self.hx, self.params, self.dy, None, None,
                                  saved, None, True, 1, 0.0, True, self.bidir, False, None,
                                  None)  # fmt: skip
        t2 = time.perf_counter()
        fused_lstm.lstm_backward(backward, gemm=self.gemm, plan=plan)
        return t1 - t0, time.perf_counter() - t2


GATE_SECONDS = 0.03
"""About the seconds of one pass in the gate (its steps are cut to this): enough to time, short
enough that the gate costs a fraction of a measurement."""

GATE_ROUNDS = 5
"""Rounds of the gate, the two plans taking turns (A B A B ...)."""


def gate(dims: Dims, dtype: np.dtype, gemm: Any, default: Plan, measured: Plan) -> dict[str, Any]:
    """The default plan and the measured one timed against each other on one layer of the call's
    sizes (steps cut so that a pass takes about :data:`GATE_SECONDS`): a warm-up run each, then
    :data:`GATE_ROUNDS` rounds in which both run once, in turns; their median seconds and the
    median of the rounds' ratios (default / measured: above 1, the measured plan is faster)."""
    cd = compute_dtype(dtype)
    probe = _Engine(min(dims.T, 4), dims.B, dims.I, dims.H, dims.D, cd, gemm)
    probe.run(default)  # compiles, allocates
    step = sum(probe.run(default)) / probe.dims.T
    steps = max(1, min(dims.T, int(GATE_SECONDS / max(step, 1e-9))))
    engine = _Engine(steps, dims.B, dims.I, dims.H, dims.D, cd, gemm)
    plans = (default, measured)
    for p in plans:
        engine.run(p)
    seconds: tuple[list[float], list[float]] = ([], [])
    for r in range(GATE_ROUNDS):
        for j in (0, 1) if r % 2 == 0 else (1, 0):  # A B, then B A: neither always first
            seconds[j].append(sum(engine.run(plans[j])))
    ratios = [a / b for a, b in zip(*seconds, strict=True) if b > 0]
    return {"steps": steps, "default": float(np.median(seconds[0])),
            "measured": float(np.median(seconds[1])),
            "ratio": float(np.median(ratios)) if ratios else 0.0}  # fmt: skip


def _pass_times(dims_args: dict[str, Any], gemm: Any, candidates: dict[str, dict[str, Any]],
                phase_seconds: dict[str, list[float]] | None = None) -> dict[str, float]:  # fmt: skip
    """Least seconds of one forward + backward of the engine (called with each candidate's plan,
    on ``gemm``, on random data whose narrow input keeps the big products' share small) per
    candidate, the candidates taking turns for
    :data:`_PASS_ROUNDS` rounds so that a drift of the machine's speed reaches them alike,
    each timed run after an untimed one of the same candidate (the caches and thread pools as
    a repeated call finds them); inf for one whose first run took over three times the best
    first run. Candidates still within :data:`_CLOSE` of the best take up to
    :data:`_PASS_ROUNDS` more rounds among themselves: on a machine whose speed varies, one
    lucky run would otherwise decide a close call, and the decision is kept on disk.
    ``phase_seconds`` gets, per candidate not dropped, the seconds of its forward and of its
    backward as the least of the best candidate's (the least total) times the
    median over the rounds of the candidate's ratio to it in each round: runs side by side in
    one round see the machine alike, the least of each over all rounds may come from
    different moments of a drifting machine and flipped close calls."""
    cd = np.dtype(dims_args["dtype"])
    t, b, i, h, d = (int(dims_args[k]) for k in "TBIHD")
    engine = _Engine(t, b, i, h, d, cd, gemm)
    plans = {name: feasible(dataclasses.replace(SAFE, **fields), engine.dims, cd, gemm)
             for name, fields in candidates.items()}  # fmt: skip
    phases = [0.0, 0.0]  # the last run's forward and backward seconds

    def timed(name: str) -> float:  # the seconds of a run after an untimed one
        engine.run(plans[name])
        phases[:] = engine.run(plans[name])
        rounds[-1][name] = list(phases)
        return sum(phases)

    rounds: list[dict[str, list[float]]] = [{}]  # per round, each candidate's phase seconds
    seconds: dict[str, float] = {}
    for name in candidates:  # warm: compiles, allocates, first plans
        seconds[name] = timed(name)
    rounds[:] = []  # the first runs are not paired: they compile and allocate
    first = min(seconds.values())
    alive = [name for name, t in seconds.items() if t <= 3 * first]
    seconds = {name: (t if name in alive else float("inf")) for name, t in seconds.items()}
    for round_ in range(2 * _PASS_ROUNDS):
        if round_ >= _PASS_ROUNDS:  # the extra rounds: the close candidates only
            best = min(seconds[name] for name in alive)
            alive = [name for name in alive if seconds[name] <= _CLOSE * best]
            if len(alive) < 2:
                break
        rounds.append({})
        for name in alive:  # each timed run after one of its own, as in a training loop
            seconds[name] = min(seconds[name], timed(name))
    if phase_seconds is not None:
        kept = [n for n, t in seconds.items() if t != float("inf")]
        phase_seconds.update(_paired_phases(rounds, kept, min(kept, key=seconds.__getitem__)))
    return seconds


def _paired_phases(rounds: list[dict[str, list[float]]], names: list[str],
                   ref: str) -> dict[str, list[float]]:  # fmt: skip
    """Per candidate of ``names``, its [forward, backward] seconds: the least of ``ref``'s
    over the rounds times the median of its ratios to ``ref`` in the rounds both ran."""
    out: dict[str, list[float]] = {}
    ran = [r for r in rounds if ref in r]
    for name in names:
        own = [r[name] for r in rounds if name in r]
        out[name] = []
        for p in range(2):
            ratios = [r[name][p] / r[ref][p] for r in ran if name in r and r[ref][p] > 0]
            if ratios:
                out[name].append(min(r[ref][p] for r in ran) * float(np.median(ratios)))
            else:  # never side by side with ref: its own least
                out[name].append(min((s[p] for s in own), default=float("inf")))
    return out


def measure_steps(cls: dict[str, Any], gemm: Any) -> dict[str, Any]:
    """The recurrent products' times per method, the split step kernels' smallest paying step,
    and the thread arrangement of the fastest short forward + backward pass."""
    cd = np.dtype(cls["dtype"])
    b, h, d = cls["B"], cls["H"], cls["D"]
    rng = np.random.default_rng(4)
    w_hh = _rand(rng, (4 * h, h), cd)
    threads = openmp.parallel_threads() if openmp.pairs_available() else 1
    # a preparation's transposing copy on each thread count the big products' copies may get
    # (the plan prices it with theirs); the passes below run it on one (the safe plan's)
    counts = sorted({1, threads})
    rec = {
        "fwd": _recurrent_times(gemm, w_hh.T, b, cd, counts),  # the view the engine passes
        "bwd": _recurrent_times(gemm, w_hh, b, cd, counts),
    }
    fields = {
        "fwd_rec": choose_recurrent(rec["fwd"], _STEPS),
        "bwd_rec": choose_recurrent(rec["bwd"], _STEPS),
    }
    walk = _walk_product_times(gemm, w_hh, b, cd)
    fields["walk_product"] = _best(walk)
    # a walk's products on its one thread over _WALK_BOUND x the best library's on all
    # threads: neither a walk nor a pair of them can win
    best = sum(min(times["call"] for times in rec[k].values()) for k in rec)
    walks_may_win = walk[fields["walk_product"]] < _WALK_BOUND * best
    candidates: dict[str, dict[str, Any]] = {"one": {**fields, "threads": 1}}
    if walks_may_win:
        candidates["walk"] = {**fields, "threads": 1, "walk": True}  # no library call per step
    if threads > 1:
        split_min = _split_min(b, h, cd, threads)
        # timed alone the split kernels can lose where, between the library's products, they
        # win: the passes judge it, splitting full steps at least
        candidates["split"] = {**fields, "threads": threads, "split_min": min(split_min, b * h)}
        # one direction's rows in blocks, a thread each, unless a block's products on its
        # thread take over _WALK_BOUND x the library's of all rows on all threads
        block = -(-b // threads)
        if d == 1 and walks_may_win and b > 1:
            in_block = _walk_product_times(gemm, w_hh, block, cd)
            if min(in_block.values()) < _WALK_BOUND * best:
                rows = {**fields, "threads": threads, "walk": True, "walk_rows": threads}
                candidates.update(_side_by_side("rows", rows, in_block))
        if d == 2 and walks_may_win:  # more threads than directions: blocks of rows too
            pairs = {**fields, "threads": threads, "pair_walks": True, "split_min": split_min,
                     "walk_rows": max(1, min(b, threads // 2))}  # fmt: skip
            candidates.update(_side_by_side("pairs", pairs, walk))
    seconds: dict[str, float] = {}
    phases: dict[str, list[float]] = {}
    steps = 0
    if len(candidates) > 1:
        # the step loops are what the candidates change: a narrow input keeps the big products
        # from dominating (but as in a model: a 16-wide one misjudged small-2), and a short
        # run bounds the time of slow steps
        step = rec["fwd"][fields["fwd_rec"]]["call"] + rec["bwd"][fields["bwd_rec"]]["call"]
        steps = max(3, min(_STEPS, int(_PASS_SECONDS / max(step, 1e-9))))
        shape = {"T": steps, "B": b, "I": min(h, _PASS_INPUT), "H": h, "D": d, "dtype": str(cd)}
        seconds = _pass_times(shape, gemm, candidates, phases)
    arrangement = {"candidates": candidates, "phases": phases, "steps": steps, "D": d}
    chosen = _arrangement(arrangement, rec, _STEPS)
    return {
        "arrangement": arrangement,
        "plan": {
            "threads": chosen["threads"],
            "split_min": chosen.get("split_min", 0),
            "pair_walks": chosen.get("pair_walks", False),
            "walk": chosen.get("walk", False),
            "walk_product": chosen.get("walk_product", fields["walk_product"]),
            "walk_rows": chosen.get("walk_rows", 1),
            "fwd_walk": chosen.get("fwd_walk", True),
        },
        "recurrent": rec,
        "walk_products": walk,
        "passes": seconds,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }


def _side_by_side(name: str, fields: dict[str, Any], products: dict[str, float]
                  ) -> dict[str, dict[str, Any]]:  # fmt: skip
    """Candidates of walks on threads side by side: ``name`` with the product fastest alone
    (``products``: seconds per walk product at a walk's rows), ``name-<product>`` with each
    other one within :data:`_SIDE_BY_SIDE` of it."""
    ranked = sorted(products, key=products.__getitem__)
    kept = [p for p in ranked if products[p] <= _SIDE_BY_SIDE * products[ranked[0]]]
    return {(name if p == ranked[0] else f"{name}-{p}"): {**fields, "walk_product": p}
            for p in kept}  # fmt: skip


def _arrangement(arrangement: dict[str, Any], rec: dict[str, Any], steps: int) -> dict[str, Any]:
    """The fields of the candidate with the least forward + backward seconds at ``steps``
    steps, from the passes' phases ([forward, backward] seconds per candidate timed, at
    arrangement["steps"] steps): a phase that calls the library per step pays its recurrent
    weight's preparation once a direction and the rest per step, a walking phase per step
    only. A walking candidate may also keep its backward's walks and run its forward as the
    candidate without walks on as many threads does ("split", else "one"): the library's
    packed product can beat the walk's plain GEMM in the forward while the backward's walks
    win."""
    candidates, phases = arrangement["candidates"], arrangement["phases"]
    if not phases:
        return candidates["one"]
    scale = steps / max(arrangement["steps"], 1)

    def at_steps(fields: dict[str, Any], phase: int, seconds: float) -> float:
        walks = fields.get("walk", False) or fields.get("pair_walks", False)
        if walks and (phase == 1 or fields.get("fwd_walk", True)):
            return seconds * scale
        times = rec["fwd" if phase == 0 else "bwd"][fields["fwd_rec" if phase == 0 else "bwd_rec"]]
        prep = arrangement["D"] * times["prep"]["1"]  # the passes copy on one thread
        return prep + max(seconds - prep, 0.0) * scale

    best: tuple[float, dict[str, Any]] = (float("inf"), candidates["one"])
    for name, (fwd, bwd) in phases.items():
        fields = candidates[name]
        total = at_steps(fields, 0, fwd) + at_steps(fields, 1, bwd)
        best = min(best, (total, fields), key=lambda pair: pair[0])
        alt = "split" if fields["threads"] > 1 and "split" in phases else "one"
        if (fields.get("walk") or fields.get("pair_walks")) and alt in phases:
            mixed = {**fields, "fwd_walk": False, "threads": candidates[alt]["threads"],
                     "split_min": candidates[alt].get("split_min", 0)}  # fmt: skip
            total = at_steps(mixed, 0, phases[alt][0]) + at_steps(fields, 1, bwd)
            best = min(best, (total, mixed), key=lambda pair: pair[0])
    return best[1]


def step_fields(entry: dict[str, Any], steps: int, threads: int = 1) -> dict[str, Any]:
    """The plan fields of a step-loop entry for a call of ``steps`` steps whose transposing
    copies run on ``threads`` threads (the plan's transpose_threads)."""
    fields = dict(entry["plan"])
    rec = entry.get("recurrent", {})
    if "arrangement" in entry:  # the thread arrangement for this many steps
        chosen = _arrangement(entry["arrangement"], rec, steps)
        fields.update({k: chosen.get(k, v) for k, v in dataclasses.asdict(SAFE).items()
                       if k in fields})  # fmt: skip
    if rec:
        fields["fwd_rec"] = choose_recurrent(rec["fwd"], steps, threads)
        fields["bwd_rec"] = choose_recurrent(rec["bwd"], steps, threads)
    return fields


def describe(p: Plan) -> str:
    """A plan in one line (``lstmgrad tune --show``)."""
    return p.describe() if p != SAFE else f"safe ({p.describe()})"


# --------------------------------------------------------------------------------------------
# ``lstmgrad tune``


SHOW_KINDS = ("big", "steps", "gate", "probe")
"""The kinds of stored entries, in the order ``lstmgrad tune --show`` lists them."""

_CLASS_SIZES = ("N", "T", "B", "I", "H", "D")


def _class_text(key: str) -> tuple[str, str]:
    """(kind, "dtype sizes") of a stored entry's key (its class as JSON)."""
    try:
        cls = json.loads(key)
    except ValueError:
        return "?", key
    if not isinstance(cls, dict):
        return "?", key
    sizes = " ".join(f"{k}{cls[k]}" for k in _CLASS_SIZES if k in cls)
    return str(cls.get("what", "?")), f"{cls.get('dtype', '?')} {sizes}".strip()


def _plan_text(kind: str, entry: dict[str, Any], gate_margin: float) -> str:
    """What an entry decided, compactly: the plan fields that differ from :data:`SAFE`
    ("safe" where none does), a gate's ratio and verdict, or "probe"."""
    if kind == "probe":
        return "probe (product speeds for the default plan)"
    if kind == "gate":
        ratio = entry.get("ratio")
        if not isinstance(ratio, (int, float)):
            return "-"
        used = "measured plan used" if ratio >= gate_margin else "default plan kept"
        return f"measured plan {ratio:.2f}x as fast as the default: {used}"
    fields = entry.get("plan")
    if not isinstance(fields, dict):
        return "-"
    safe = dataclasses.asdict(SAFE)
    changed = [f"{k}={v}" for k, v in fields.items() if safe.get(k, v) != v or k not in safe]
    return ", ".join(changed) if changed else "safe"


def show_lines(record: dict[str, Any], gate_margin: float) -> list[str]:
    """``lstmgrad tune --show``: the mode, the store and a table of its entries (kind, class
    sizes, what it decided, when it was measured) from :func:`lstmgrad.planning.plan.show`'s
    record; ``gate_margin`` is the ratio a gate needs for the measured plan
    (:data:`lstmgrad.planning.plan.GATE_MARGIN`)."""
    out = [f"mode     {record.get('mode')} (LSTMGRAD_TUNE)"]
    if record.get("overrides"):
        forced = ", ".join(f"{k}={v}" for k, v in record["overrides"].items())
        out.append(f"forced   {forced} (LSTMGRAD_PLAN)")
    for backend in ("numpy", "torch"):
        store = record.get(backend)
        if not isinstance(store, dict):
            continue
        entries = store.get("entries") or {}
        out += ["", f"{backend:8s} {store.get('file')}: {len(entries)} entries"]
        if not entries:
            continue
        rows = [("kind", "class", "plan (fields other than the safe plan's)", "measured")]
        order = {k: j for j, k in enumerate(SHOW_KINDS)}
        for kind, key, entry in sorted(
            ((*_class_text(k), e) for k, e in entries.items()),
            key=lambda r: (order.get(r[0], len(order)), r[1]),
        ):
            when = entry.get("measured_at", "-") if isinstance(entry, dict) else "-"
            what = _plan_text(kind, entry, gate_margin) if isinstance(entry, dict) else "-"
            rows.append((kind, key, what, str(when)))
        width = [max(len(r[j]) for r in rows) for j in range(3)]
        out += ["  ".join(v.ljust(width[j]) if j < 3 else v for j, v in enumerate(r)).rstrip()
                for r in rows]  # fmt: skip
    out += ["", "the whole record: lstmgrad tune --show --json"]
    return out
