"""The Pythonic API: validate -> normalise -> dispatch to the engine -> wrap the results."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

import numpy as np

from .. import fused, reference
from ..core import machine
from ..core.contract import (
    DEFAULT_IMPL,
    SAVED_NAMES,
    BackwardCall,
    ForwardCall,
    LstmBackwardResult,
    LstmForwardResult,
    LstmSaved,
    check_backward,
    check_forward,
    check_impl,
    unpack_saved,
)
from ..core.dropout import make_dropout_masks
from ..core.errors import LstmError, LstmInternalError, LstmMemoryError
from ..core.layout import Dims
from ..core.workspace import Arena, scratch_held, workspace_bytes
from ..fused.gemm import NUMPY_GEMM, Gemm
from ..fused.plan import SAFE, Plan
from ..planning.feasible import feasible
from ..planning.plan import (
    big_class,
    eager,
    gate_class,
    mode,
    plan_call,
    plan_for,
    step_class,
    wisdom,
)
from ..planning.plan import library_inference as plan_library_inference
from .tensors import array_gemm, from_torch, to_tensors, torch_gemm

ENGINES: dict[str, ModuleType] = {"fused": fused, "reference": reference}  # contract.IMPLS


def engine_plan(dims: Dims, dtype: np.dtype, gemm: Gemm | None = None) -> Plan:
    """The fused engine's plan for a call of these sizes on ``gemm`` (NumPy's by default): the
    one place a plan is asked for (the planner measures, remembers, falls back)."""
    return plan_for(dims, dtype, gemm or NUMPY_GEMM)


INFERENCE_PART = ("forward", (False, False), False)
"""The in-use check's key of dense inference forwards (``part`` in :func:`_engine_args`), which
the drop-in's own path to torch's LSTM shares (:func:`lstmgrad.planning.plan.library_inference`)."""


def library_inference(dims: Dims) -> Callable[..., None] | None:
    """For a dense float32 inference forward of tensors of these sizes, the planner's say
    (:func:`lstmgrad.planning.plan.library_inference`): what to call with its seconds where
    torch's own LSTM is to run it now (the drop-in then calls torch's forward directly), else
    None (the call goes through :func:`lstm_forward`)."""
    return plan_library_inference(dims, np.dtype(np.float32), torch_gemm(), INFERENCE_PART)


Planned = tuple[Plan, Callable[[float], None]]
"""A fused call's plan and what to call with the call's seconds once it ran."""


def _plan_of(call: ForwardCall | BackwardCall, gemm: Gemm, plan_dims: Dims | None,
             sample: bool) -> Planned:  # fmt: skip
    """The call's plan (for a call of ``plan_dims`` where given) and its cost callback: the
    planner wants the call's seconds (:func:`lstmgrad.planning.plan.plan_call`), per active row
    where the batch sizes of packed calls vary. ``sample``: the in-use check may run a fallback
    instead (never where the caller's workspace was sized for the plan)."""
    # calls compared by the in-use check do the same work: the same part and flags, timed per
    # active row (the batch sizes of packed calls vary)
    part = "backward" if isinstance(call, BackwardCall) else "forward"
    flags = call.need if isinstance(call, BackwardCall) else (call.train, call.dropout > 0)
    rows = call.dims.T * call.dims.B if call.mask is None else int(np.count_nonzero(call.mask))
    key = (part, flags, call.mask is not None)
    inference = isinstance(call, ForwardCall) and not call.train and call.mask is None
    plan, done = plan_call(plan_dims or call.dims, call.dtype, gemm, key, sample=sample,
                           inference=inference)  # fmt: skip

    def timed(seconds: float) -> None:
        done(seconds, max(rows, 1))

    return plan, timed


def sized_plan(fn: str, call: ForwardCall | BackwardCall, gemm: Gemm) -> Planned:
    """The plan a caller sizes the fused engine's workspace for (the mirror's phase 1), fixed
    then: hand it to :func:`run_backward` / :func:`run_forward` as ``planned`` so that the run
    executes that plan whatever the planner says by then (LSTMGRAD_PLAN, thread counts or
    measurements changed in between). A call whose results and copies cannot fit fails first,
    as in :func:`run_backward` (``fn``: the name in the message).

    Raises:
        LstmMemoryError: (code 561103) the call's results and copies alone exceed the available
            memory (checked before the plan is made).
    """
    if isinstance(call, ForwardCall):
        _check_before_plan(fn, call, gemm, fused.forward_bytes(call, SAFE))
    elif any(call.need):
        _check_before_plan(fn, call, gemm, fused.backward_bytes(call))
    return _plan_of(call, gemm, None, sample=False)


def _engine_args(impl: str, call: ForwardCall | BackwardCall, gemm: Gemm | None,
                 plan_dims: Dims | None, sample: bool,
                 planned: Planned | None) -> tuple[dict[str, Any], Callable[[float], None] | None]:  # fmt: skip
    """The fused engine takes the GEMMs to use and the call's plan (made once, for the memory
    check and the run alike): ``planned`` where the caller fixed it (less any threads no
    longer allowed, :func:`lstmgrad.planning.feasible.feasible`: that only ever lowers the
    scratch a plan needs), else the planner's. The reference always computes with NumPy."""
    if impl != "fused":
        return {}, None
    g = gemm or NUMPY_GEMM
    if planned is None:
        plan, timed = _plan_of(call, g, plan_dims, sample)
    else:
        plan, timed = feasible(planned[0], call.dims, call.dtype, g), planned[1]
    return {"gemm": g, "plan": plan}, timed


_last_reading: tuple[float, int | None] = (-1e9, None)  # (monotonic time, bytes available)


def _available(need: int) -> int | None:
    """Available bytes, re-read unless a reading under a second old had twice ``need`` (the
    probe reads several files: tens of microseconds, a few percent of a small call)."""
    global _last_reading
    when, avail = _last_reading
    now = time.monotonic()
    if avail is None or now - when > 1.0 or 2 * need > avail:
        avail = machine.available_memory()
        _last_reading = (now, avail)
    return avail


def check_memory(fn: str, need: int, results_only: bool = False) -> None:
    """Raise LstmMemoryError before a call that needs more bytes than the machine can give now
    (:func:`lstmgrad.core.machine.available_memory`; no check where that cannot be read).
    ``results_only``: ``need`` counts the results and the copies whatever the plan alone (the
    check before a plan is made)."""
    avail = _available(need)
    if avail is not None and need > avail:
        what = (f"at least {need} bytes (its results and copies alone)" if results_only
                else f"{need} bytes")  # fmt: skip
        raise LstmMemoryError(
            f"{fn}: needs {what} of memory, only {avail} bytes are available (the "
            f"machine's available memory, within the cgroup's limit if any)"
        )


def _layout_bytes(call: ForwardCall | BackwardCall) -> int:
    """Bytes of the result put back in the caller's batch-first layout (a transposing copy of
    the output, or of dx; :meth:`lstmgrad.core.contract.Layout.from_time_major`)."""
    if call.layout.kind != "bti":
        return 0
    dims = call.dims
    if isinstance(call, ForwardCall):
        return dims.T * dims.B * dims.D * dims.H * call.dtype.itemsize
    return dims.T * dims.B * dims.I * call.dtype.itemsize if call.need[0] else 0


def _check_before_plan(fn: str, call: ForwardCall | BackwardCall, gemm: Gemm | None,
                       results: int) -> None:  # fmt: skip
    """The check before a plan is made (which may measure the machine for a new class of
    shapes): ``results`` bytes of results and the copies every plan makes."""
    copies = fused.copy_bytes(call, None, gemm or NUMPY_GEMM) + _layout_bytes(call)
    check_memory(fn, results + copies, results_only=True)


def _need(fn: str, call: ForwardCall | BackwardCall, arena: Arena | None, gemm: Gemm,
          plan: Plan, forward: bool, given: int = 0, results: int | None = None) -> None:  # fmt: skip
    """The fused engine's memory need of ``call`` under ``plan`` checked against what is
    available: its results (less ``given`` bytes of them the caller allocated; ``results``:
    their bytes where the caller has them already), conversions and copies
    (:func:`lstmgrad.fused.lstm.copy_bytes`, the batch-first result), plus the scratch beyond
    the calling thread's kept buffer (none with a caller's workspace)."""
    if forward:
        assert isinstance(call, ForwardCall)
        need = fused.forward_bytes(call, plan) - given if results is None else results
        slots = fused.forward_workspace_slots(call.dims, call.dtype, plan)
    else:
        assert isinstance(call, BackwardCall)
        need = fused.backward_bytes(call) if results is None else results
        slots = fused.backward_workspace_slots(call.dims, call.dtype, plan)
    if arena is None:
        need += max(workspace_bytes(slots) - scratch_held(), 0)
    need += fused.copy_bytes(call, plan, gemm) + _layout_bytes(call)
    check_memory(fn, need + fused.walk_pack_bytes(call.dims, call.dtype, plan, gemm))


def run_backward(
    call: BackwardCall,
    arena: Arena | None = None,
    impl: str = DEFAULT_IMPL,
    gemm: Gemm | None = None,
    plan_dims: Dims | None = None,
    planned: Planned | None = None,
) -> LstmBackwardResult:
    """Run a validated backward call; results in the caller's layout. ``plan_dims``: plan it as
    a call of these sizes (the recompute mode's segments run the whole sequence's plan).
    ``planned``: run this plan (:func:`sized_plan`, which ``arena`` was sized for) instead of
    asking the planner.

    Raises:
        LstmMemoryError: (code 561103) the fused engine would need more memory than available.
    """
    results = None
    if impl == "fused" and any(call.need):  # the results and copies, before a plan is measured
        # (the backward's results do not depend on the plan: counted once for both checks)
        results = fused.backward_bytes(call)
        _check_before_plan("lstm_backward", call, gemm, results)
    args, done = _engine_args(impl, call, gemm, plan_dims, arena is None, planned)
    if args and any(call.need):
        _need("lstm_backward", call, arena, **args, forward=False, results=results)
    start = time.perf_counter()
    try:
        dx, dh_prev, dc_prev, dparams = ENGINES[impl].lstm_backward(call, arena, **args)
    except LstmError:
        raise
    except Exception as exc:  # anything unexpected is the contract's internal error
        raise LstmInternalError(f"lstm_backward: internal error: {exc!r}") from exc
    if done is not None:  # the measuring budget grows with the calls; the in-use check
        done(time.perf_counter() - start)
    if dx is not None:
        dx = call.layout.from_time_major(dx)
    return LstmBackwardResult(dx, dh_prev, dc_prev, dparams)


def run_forward(
    call: ForwardCall,
    arena: Arena | None = None,
    impl: str = DEFAULT_IMPL,
    gemm: Gemm | None = None,
    saved_into: np.ndarray | None = None,
    plan_dims: Dims | None = None,
    planned: Planned | None = None,
) -> LstmForwardResult:
    """Run a validated forward call (drawing its dropout masks unless given); output in the
    caller's layout. ``plan_dims`` and ``planned`` as in :func:`run_backward`. ``saved_into``: a
    C-contiguous [7, L*D, T, B, H] array of the storage
    dtype the fused engine writes the saved activations into (i, g, f, o, h, c, tanhc), the
    lists then its views.

    Raises:
        LstmMemoryError: (code 561103) the fused engine would need more memory than available.
    """
    if call.dropout > 0 and call.dropout_masks is None:
        call.dropout_masks = make_dropout_masks(call.dims, call.dropout, call.seed, call.dtype)
    given = 0 if saved_into is None else saved_into.nbytes
    if impl == "fused":  # the results and copies, before a plan is measured
        _check_before_plan("lstm_forward", call, gemm, fused.forward_bytes(call, SAFE) - given)
    args, done = _engine_args(impl, call, gemm, plan_dims, arena is None, planned)
    if args:
        _need("lstm_forward", call, arena, **args, forward=True, given=given)
        if saved_into is not None:
            args["saved_into"] = saved_into
    start = time.perf_counter()
    try:
        y, hy, cy, saved = ENGINES[impl].lstm_forward(call, arena, **args)
    except LstmError:
        raise
    except Exception as exc:
        raise LstmInternalError(f"lstm_forward: internal error: {exc!r}") from exc
    if done is not None:
        done(time.perf_counter() - start)
    return LstmForwardResult(call.layout.from_time_major(y), hy, cy, saved)


def lstm_backward(
    input: np.ndarray,
    hx: Sequence[np.ndarray],
    params: Sequence[np.ndarray],
    dy: np.ndarray | None,
    dh: np.ndarray | None,
    dc: np.ndarray | None,
    i: Sequence[np.ndarray] | None = None,
    g: Sequence[np.ndarray] | None = None,
    f: Sequence[np.ndarray] | None = None,
    o: Sequence[np.ndarray] | None = None,
    h: Sequence[np.ndarray] | None = None,
    c: Sequence[np.ndarray] | None = None,
    tanhc: Sequence[np.ndarray] | None = None,
    batch_sizes: np.ndarray | Sequence[int] | None = None,
    *,
    saved: LstmSaved | Sequence[Any] | None = None,
    has_bias: bool = True,
    num_layers: int = 1,
    dropout: float = 0.0,
    train: bool = True,
    bidirectional: bool = False,
    batch_first: bool = False,
    output_mask: Sequence[bool] | None = None,
    dropout_masks: Sequence[np.ndarray] | None = None,
    impl: str = DEFAULT_IMPL,
) -> LstmBackwardResult:
    """Gradients of an LSTM w.r.t. its input, initial state and parameters (aclnnLstmBackward).

    Legend: T steps, B batch, I input size, H hidden size, L num_layers, D = 2 if bidirectional
    else 1, k = layer * D + direction. All arrays share input's dtype (float16, float32 or
    float64); any strides are accepted and nothing is written into them.

    torch CPU tensors are accepted wherever an array is (zero copy, any strides; they are read
    detached, this function is not differentiable: :mod:`lstmgrad.torch_ops` is). Given any
    tensor, the GEMMs run on torch's BLAS and the results are torch tensors.

    Args:
        input: ``input`` [T, B, I]; [B, T, I] if batch_first; [T*B, I] (padded, time-major)
            with batch_sizes.
        hx: ``hx`` [h0, c0], each [L*D, B, H] (zeros if the forward had no initial state).
        params: ``params`` in PyTorch ``_flat_weights`` order: per layer weight_ih [4H, I or
            D*H], weight_hh [4H, H], (bias_ih [4H], bias_hh [4H]), then the reverse direction's.
        dy: ``dy`` gradient of the last layer's output, layout of input with width D*H; None = 0.
        dh, dc: ``dh``/``dc`` gradients of h_n and c_n, [L*D, B, H]; None = 0.
        i, g, f, o, h, c, tanhc: the forward's saved activations, lists of L*D arrays
            [T, B, H], time-major: ``*fwd.saved[:7]`` (aclnn order), or None with ``saved``.
        batch_sizes: ``batchSizesOptional`` int64 [T]; number of sequences still running at
            each step. Variable lengths in the padded layout; padding never influences a result.
        has_bias, num_layers, dropout, train, bidirectional, batch_first: as in the forward.
        output_mask: ``outputMask`` 4 booleans (dx, dh_prev, dc_prev, dparams); a False output
            is neither computed nor returned (None). Default: all True.
        saved: the forward's ``LstmForwardResult.saved`` whole, instead of i ... tanhc and
            dropout_masks: ``lstm_backward(x, hx, params, dy, dh, dc, saved=fwd.saved)``.
        dropout_masks: the forward's ``saved.dropout_masks`` (L-1 arrays [T, B, D*H]); required
            when dropout > 0, train and num_layers > 1 (taken from ``saved`` where given).
        impl: the engine: "fused" (the default: NumPy GEMMs + Numba kernels, float32 compute
            for float16/float32) or "reference" (the float64 oracle of docs/math.md).

    Returns:
        LstmBackwardResult(dx, dh_prev, dc_prev, dparams): dx shaped like input, dh_prev and
        dc_prev [L*D, B, H], dparams a list in params order (both bias gradients hold the same
        sum of gate gradients).

    Raises:
        LstmNullArgumentError: (code 161001) a required argument or list element is None.
        LstmInvalidArgumentError: (code 161002) a type, dtype, shape, length or value is wrong.
        LstmInternalError: (code 561103) an unexpected failure while computing.
        LstmMemoryError: (code 561103) the call needs more memory than the machine has
            available now (checked before it starts; the message names both in bytes).

    Example:
        >>> import numpy as np, lstmgrad
        >>> rng = np.random.default_rng(0)
        >>> x = rng.standard_normal((5, 3, 4)).astype(np.float32)          # T, B, I
        >>> params = [rng.standard_normal(s).astype(np.float32) * 0.3
        ...           for s in [(24, 4), (24, 6), (24,), (24,)]]           # H = 6
        >>> fwd = lstmgrad.lstm_forward(x, params)
        >>> dy = np.ones_like(fwd.output)
        >>> grads = lstmgrad.lstm_backward(x, [np.zeros((1, 3, 6), np.float32)] * 2, params,
        ...                                dy, None, None, saved=fwd.saved)
        >>> grads.dx.shape, grads.dh_prev.shape, [p.shape for p in grads.dparams][:2]
        ((5, 3, 4), (1, 3, 6), [(24, 4), (24, 6)])
    """
    fn = "lstm_backward"
    impl = check_impl(fn, impl)
    lists, dropout_masks, masks_name = unpack_saved(
        fn, saved, (i, g, f, o, h, c, tanhc), batch_sizes, dropout_masks, input
    )
    a, torch_io = from_torch(fn, {
        "input": input, "hx": hx, "params": params, "dy": dy, "dh": dh, "dc": dc,
        **dict(zip(SAVED_NAMES, lists, strict=True)), "batch_sizes": batch_sizes,
        "dropout_masks": dropout_masks,
    })  # fmt: skip
    call = check_backward(
        fn, a["input"], a["hx"], a["params"], a["dy"], a["dh"], a["dc"],
        tuple(a[n] for n in SAVED_NAMES), a["batch_sizes"], has_bias, num_layers, dropout,
        train, bidirectional, batch_first, output_mask, a["dropout_masks"], masks_name,
    )  # fmt: skip
    if not torch_io:
        return run_backward(call, None, impl, array_gemm())
    return to_tensors(run_backward(call, None, impl, torch_gemm()))


def lstm_forward(
    input: np.ndarray,
    params: Sequence[np.ndarray],
    hx: Sequence[np.ndarray] | None = None,
    batch_sizes: np.ndarray | Sequence[int] | None = None,
    *,
    has_bias: bool = True,
    num_layers: int = 1,
    dropout: float = 0.0,
    train: bool = True,
    bidirectional: bool = False,
    batch_first: bool = False,
    seed: Any = None,
    dropout_masks: Sequence[np.ndarray] | None = None,
    impl: str = DEFAULT_IMPL,
) -> LstmForwardResult:
    """LSTM forward (aclnnLSTM), saving the activations the backward consumes.

    Legend as in :func:`lstm_backward`; torch CPU tensors are accepted and returned as there.

    Args:
        input: ``input`` [T, B, I]; [B, T, I] if batch_first; [T*B, I] with batch_sizes
            (then B is read from hx, or is the number of rows / T).
        params: ``params`` in PyTorch ``_flat_weights`` order (see :func:`lstm_backward`).
        hx: ``hx`` [h0, c0], each [L*D, B, H], or None for zeros.
        batch_sizes: ``batchSizes`` int64 [T], variable lengths in the padded layout: at a
            masked step the state carries through and the output is 0.
        has_bias, num_layers, bidirectional, batch_first: the LSTM's configuration.
        dropout, train: with train and dropout > 0, inverted dropout (probability dropout,
            scale 1/(1-dropout)) on the input of every layer above the first.
        seed: seed of the dropout masks (None: fresh entropy); the same seed gives the same
            masks with either engine.
        dropout_masks: instead of drawing them, use these masks (L-1 arrays [T, B, D*H], e.g.
            0 or 1/(1-dropout)); only where dropout applies (dropout > 0 and train).
        impl: the engine, as in :func:`lstm_backward`.

    Returns:
        LstmForwardResult(output, hy, cy, saved): output [T, B, D*H] in the layout of input
        ([T*B, D*H] with batch_sizes); hy, cy [L*D, B, H], each sequence's last valid state;
        saved (only with train, else None) = LstmSaved(i, g, f, o, h, c, tanhc, dropout_masks),
        seven lists of L*D arrays [T, B, H] (time-major; at masked steps the gates and tanhc
        are 0 and h, c hold the carried state) and the masks (L-1 arrays [T, B, D*H] or None).

    Raises:
        LstmNullArgumentError, LstmInvalidArgumentError, LstmInternalError, LstmMemoryError: as
            lstm_backward.

    Example:
        >>> import numpy as np, lstmgrad
        >>> x = np.ones((1, 1, 1))
        >>> out = lstmgrad.lstm_forward(x, [np.ones((4, 1)), np.ones((4, 1))], has_bias=False)
        >>> round(float(out.output[0, 0, 0]), 7), round(float(out.cy[0, 0, 0]), 7)
        (0.3696064, 0.5567699)
    """
    fn = "lstm_forward"
    impl = check_impl(fn, impl)
    a, torch_io = from_torch(fn, {
        "input": input, "params": params, "hx": hx, "batch_sizes": batch_sizes,
        "dropout_masks": dropout_masks,
    })  # fmt: skip
    call = check_forward(
        fn, a["input"], a["params"], a["hx"], a["batch_sizes"], has_bias, num_layers, dropout,
        train, bidirectional, batch_first, seed, a["dropout_masks"],
    )  # fmt: skip
    if not torch_io:
        return run_forward(call, None, impl, array_gemm())
    return to_tensors(run_forward(call, None, impl, torch_gemm()))


def tune_shapes(shapes: list[dict[str, int]], kind: str, dtype: str) -> list[dict[str, Any]]:
    """Measure (where not stored yet) the classes of ``shapes`` for back end ``kind`` ("numpy"
    or "torch"); per shape the plan it gets, the seconds it took and, where its measurements
    are not on disk for later processes, why ("not_stored"; empty when stored)."""
    gemm: Any
    if kind == "torch":
        import torch  # noqa: F401  (the torch back end needs it loaded)

        gemm = torch_gemm()
    else:
        gemm = NUMPY_GEMM

    rows: list[dict[str, Any]] = []
    for shape in shapes:
        dims = Dims(shape["T"], shape["B"], shape["I"], shape["H"], shape["L"], shape["D"], True)
        t0 = time.perf_counter()
        with eager():  # asked for: measured now, whatever the budget
            chosen = plan_for(dims, np.dtype(dtype), gemm)
        seconds = time.perf_counter() - t0
        store = wisdom(gemm.kind)
        classes = [big_class(dims, np.dtype(dtype), gemm.kind),
                   step_class(dims, np.dtype(dtype), gemm.kind)]  # fmt: skip
        gate = store.get(gate_class(dims, np.dtype(dtype), gemm.kind))
        if gate is not None:  # measured too: on disk too
            classes.append(gate_class(dims, np.dtype(dtype), gemm.kind))
        missing = ""
        if not all(store.stored(c) for c in classes):  # the file read back
            if mode() in ("off", "cached"):
                missing = f"LSTMGRAD_TUNE={mode()}: nothing is measured"
            elif all(store.get(c) is not None for c in classes):  # measured, but not on disk
                missing = (f"the cache could not be written ({store.error})" if store.error else
                           f"{store.path} read back lacks the measurements")  # fmt: skip
            else:
                missing = (
                    "other processes used the CPUs: nothing measured is kept (run again "
                    "on a quiet machine)"
                )
        rows.append({"shape": shape, "plan": chosen, "seconds": seconds, "not_stored": missing,
                     "gate": None if gate is None else gate["ratio"]})  # fmt: skip
    return rows
