"""The C-style two-phase mirror of the operator, under the original names and argument order.

Phase 1, ``aclnnLstmBackwardGetWorkspaceSize(...)`` / ``aclnnLSTMGetWorkspaceSize(...)``, checks
every argument (the caller-allocated outputs included) and returns ``(status, workspace_size,
executor)``. Phase 2, ``aclnnLstmBackward(workspace, workspace_size, executor, stream)`` /
``aclnnLSTM(...)``, runs the computation with ``workspace`` (a uint8 array of at least
``workspace_size`` bytes) as its scratch memory and writes the results in place into the
caller's output arrays; it returns a status. The executor holds the execution plan phase 1
sized the workspace for, and phase 2 runs that plan whatever the planner would choose by then
(LSTMGRAD_PLAN, thread counts or stored measurements may change in between; threads no longer
allowed are dropped, which never needs more scratch). These functions never raise an
Exception: a bad argument is status 161001/161002, anything unexpected 561103 (a
KeyboardInterrupt passes through; the interrupted executor counts as run), and the message of
the last failure is available from :func:`aclGetRecentErrMsg`. That message is kept per thread, as in CANN: a thread
reads the message of its own last failed call, never another thread's.

torch CPU tensors work wherever arrays do, outputs and workspace included (zero copy: results
are written into the caller's tensors); with any tensor argument the GEMMs run on torch's BLAS.

As in the original, ``dropout`` is ignored (its type and range are still checked). Decisions of
ours: an output switched off by ``outputMask`` may be None and is left untouched; an executor
runs once (a second run returns 161002).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..core.contract import (
    BackwardCall,
    ForwardCall,
    check_array,
    check_backward,
    check_bool,
    check_forward,
    check_list,
    input_shape,
    output_shape,
)
from ..core.errors import (
    ACLNN_ERR_INNER,
    ACLNN_ERR_PARAM_INVALID,
    ACLNN_ERR_PARAM_NULLPTR,
    ACLNN_SUCCESS,
    LstmError,
    LstmInvalidArgumentError,
    LstmNullArgumentError,
)
from ..core.workspace import Arena, workspace_bytes
from ..fused.plan import Plan
from .api import DEFAULT_IMPL, ENGINES, run_backward, run_forward, sized_plan
from .tensors import array_gemm, from_torch, tensor_to_numpy, torch_gemm

__all__ = [
    "ACLNN_SUCCESS",
    "ACLNN_ERR_PARAM_NULLPTR",
    "ACLNN_ERR_PARAM_INVALID",
    "ACLNN_ERR_INNER",
    "aclnnLstmBackwardGetWorkspaceSize",
    "aclnnLstmBackward",
    "aclnnLSTMGetWorkspaceSize",
    "aclnnLSTM",
    "aclGetRecentErrMsg",
    "AclOpExecutor",
]

# per thread, as CANN's: with a module global, a thread could read another thread's failure
_recent = threading.local()


def aclGetRecentErrMsg() -> str:
    """Message of the calling thread's most recent failed call of this module ('' if none of
    its calls failed yet). A successful call leaves it unchanged; other threads never change it.
    """
    return getattr(_recent, "message", "")


def _fail(exc: BaseException) -> int:
    if isinstance(exc, LstmError):
        _recent.message = str(exc)
        return exc.code
    _recent.message = f"internal error: {exc!r}"
    return ACLNN_ERR_INNER


@dataclass
class AclOpExecutor:
    """What phase 1 prepared for phase 2: the validated call, the outputs, the execution plan
    and the scratch size of that plan. Phase 2 runs that plan whatever the planner would choose
    by then (LSTMGRAD_PLAN, thread counts or stored measurements changed in between), less any
    threads no longer allowed, which only ever lowers its need."""

    op: str
    workspace_size: int
    run: Callable[[Arena], None]
    used: bool = field(default=False)
    plan: Plan | None = field(default=None)


def _out_array(
    fn: str, name: str, a: Any, shape: tuple[int, ...], legend: str, dtype: np.dtype
) -> np.ndarray:
    """A caller-allocated output: present, of the right shape and dtype, writeable."""
    if a is None:
        raise LstmNullArgumentError(f"{fn}: {name} is required, got None", name)
    check_array(fn, name, a, shape, legend, dtype)
    if not a.flags.writeable:
        raise LstmInvalidArgumentError(
            f"{fn}: {name} must be writeable, got a read-only array", name
        )
    return a


def aclnnLstmBackwardGetWorkspaceSize(
    input: Any,
    hx: Any,
    params: Any,
    dy: Any,
    dh: Any,
    dc: Any,
    i: Any,
    g: Any,
    f: Any,
    o: Any,
    h: Any,
    c: Any,
    tanhc: Any,
    batchSizesOptional: Any,
    hasBias: Any,
    numLayers: Any,
    dropout: Any,
    train: Any,
    bidirectional: Any,
    batchFirst: Any,
    outputMask: Any,
    dxOut: Any,
    dhPrevOut: Any,
    dcPrevOut: Any,
    dparamsOut: Any,
) -> tuple[int, int, AclOpExecutor | None]:
    """Phase 1 of the backward: check everything, size the workspace, make the executor.

    Arguments as :func:`lstmgrad.lstm_backward` (in aclnn order and names), plus the outputs
    dxOut (shape of input), dhPrevOut and dcPrevOut ([L*D, B, H]) and dparamsOut (a list shaped
    like params), all of input's dtype. Returns ``(status, workspace_size, executor)``.
    """
    fn = "aclnnLstmBackwardGetWorkspaceSize"
    try:
        args, torch_io = from_torch(fn, {
            "input": input, "hx": hx, "params": params, "dy": dy, "dh": dh, "dc": dc, "i": i,
            "g": g, "f": f, "o": o, "h": h, "c": c, "tanhc": tanhc,
            "batchSizesOptional": batchSizesOptional, "dxOut": dxOut, "dhPrevOut": dhPrevOut,
            "dcPrevOut": dcPrevOut, "dparamsOut": dparamsOut,
        })  # fmt: skip
        (input, hx, params, dy, dh, dc, i, g, f, o, h, c, tanhc, batchSizesOptional, dxOut,
         dhPrevOut, dcPrevOut, dparamsOut) = args.values()  # fmt: skip
        gemm = torch_gemm() if torch_io else array_gemm()
        check_bool(fn, "train", train)
        call = check_backward(
            fn, input, hx, params, dy, dh, dc, (i, g, f, o, h, c, tanhc), batchSizesOptional,
            hasBias, numLayers, dropout, False, bidirectional, batchFirst, outputMask, None,
        )  # fmt: skip
        dims, dtype = call.dims, call.dtype
        need_dx, need_dh, need_dc, need_dw = call.need
        state = (dims.K, dims.B, dims.H)
        dx_out = dh_out = dc_out = None
        if need_dx or dxOut is not None:
            dx_out = _out_array(
                fn, "dxOut", dxOut, input_shape(call.layout, dims), "shape of input", dtype
            )
        if need_dh or dhPrevOut is not None:
            dh_out = _out_array(fn, "dhPrevOut", dhPrevOut, state, "L*D, B, H", dtype)
        if need_dc or dcPrevOut is not None:
            dc_out = _out_array(fn, "dcPrevOut", dcPrevOut, state, "L*D, B, H", dtype)
        dw_out = None
        if need_dw or dparamsOut is not None:
            items = check_list(fn, "dparamsOut", dparamsOut, len(call.params), "shaped like params")
            dw_out = [
                _out_array(fn, f"dparamsOut[{j}]", a, p.shape, "shape of params", dtype)
                for j, (a, p) in enumerate(zip(items, call.params, strict=True))
            ]
        # the engine's scratch depends on the call's plan (fused.lstm.backward_workspace_slots):
        # fixed now, phase 2 runs it
        planned = sized_plan(fn, call, gemm)
        size = workspace_bytes(
            ENGINES[DEFAULT_IMPL].backward_workspace_slots(dims, dtype, planned[0])
        )

        def run(arena: Arena, call: BackwardCall = call) -> None:
            dx, dh_prev, dc_prev, dparams = run_backward(call, arena, gemm=gemm, planned=planned)
            for out, res in ((dx_out, dx), (dh_out, dh_prev), (dc_out, dc_prev)):
                if out is not None and res is not None:
                    np.copyto(out, res)
            if dw_out is not None and dparams is not None:
                for out, res in zip(dw_out, dparams, strict=True):
                    np.copyto(out, res)

        return ACLNN_SUCCESS, size, AclOpExecutor("aclnnLstmBackward", size, run, plan=planned[0])
    except Exception as exc:  # the mirror never raises
        return _fail(exc), 0, None


def aclnnLSTMGetWorkspaceSize(
    input: Any,
    params: Any,
    hx: Any,
    batchSizes: Any,
    hasBias: Any,
    numLayers: Any,
    dropout: Any,
    train: Any,
    bidirectional: Any,
    batchFirst: Any,
    output: Any,
    hy: Any,
    cy: Any,
    iOut: Any,
    jOut: Any,
    fOut: Any,
    oOut: Any,
    hOut: Any,
    cOut: Any,
    tanhCOut: Any,
) -> tuple[int, int, AclOpExecutor | None]:
    """Phase 1 of the forward: check everything, size the workspace, make the executor.

    Arguments as :func:`lstmgrad.lstm_forward`, plus the outputs: output (layout of input,
    [T*B, D*H] with batchSizes), hy and cy ([L*D, B, H]) and, with train, the seven lists of
    L*D arrays [T, B, H] (iOut ... tanhCOut; may be None without train). Dropout is ignored.
    """
    fn = "aclnnLSTMGetWorkspaceSize"
    try:
        args, torch_io = from_torch(fn, {
            "input": input, "params": params, "hx": hx, "batchSizes": batchSizes,
            "output": output, "hy": hy, "cy": cy, "iOut": iOut, "jOut": jOut, "fOut": fOut,
            "oOut": oOut, "hOut": hOut, "cOut": cOut, "tanhCOut": tanhCOut,
        })  # fmt: skip
        (input, params, hx, batchSizes, output, hy, cy, iOut, jOut, fOut, oOut, hOut, cOut,
         tanhCOut) = args.values()  # fmt: skip
        gemm = torch_gemm() if torch_io else array_gemm()
        call = check_forward(
            fn, input, params, hx, batchSizes, hasBias, numLayers, dropout, False,
            bidirectional, batchFirst, None,
        )  # fmt: skip
        train = check_bool(fn, "train", train)
        dims, dtype = call.dims, call.dtype
        state = (dims.K, dims.B, dims.H)
        y_out = _out_array(
            fn,
            "output",
            output,
            output_shape(call.layout, dims),
            "layout of input, width D*H",
            dtype,
        )
        hy_out = _out_array(fn, "hy", hy, state, "L*D, B, H", dtype)
        cy_out = _out_array(fn, "cy", cy, state, "L*D, B, H", dtype)
        lists_out = None
        names = ("iOut", "jOut", "fOut", "oOut", "hOut", "cOut", "tanhCOut")
        given = (iOut, jOut, fOut, oOut, hOut, cOut, tanhCOut)
        if train:
            lists_out = []
            for name, value in zip(names, given, strict=True):
                items = check_list(fn, name, value, dims.K, "L*D")
                lists_out.append(
                    [
                        _out_array(
                            fn, f"{name}[{j}]", a, (dims.T, dims.B, dims.H), "T, B, H", dtype
                        )
                        for j, a in enumerate(items)
                    ]
                )
        call.train = train  # checked with train=False above so that dropout stays ignored
        # the engine's scratch depends on the call's plan (fused.lstm.forward_workspace_slots):
        # fixed now, phase 2 runs it
        planned = sized_plan(fn, call, gemm)
        size = workspace_bytes(
            ENGINES[DEFAULT_IMPL].forward_workspace_slots(dims, dtype, planned[0])
        )

        def run(arena: Arena, call: ForwardCall = call) -> None:
            res = run_forward(call, arena, gemm=gemm, planned=planned)
            np.copyto(y_out, res.output)
            np.copyto(hy_out, res.hy)
            np.copyto(cy_out, res.cy)
            if lists_out is not None and res.saved is not None:
                for outs, got in zip(lists_out, res.saved[:7], strict=True):
                    for out, a in zip(outs, got, strict=True):
                        np.copyto(out, a)

        return ACLNN_SUCCESS, size, AclOpExecutor("aclnnLSTM", size, run, plan=planned[0])
    except Exception as exc:
        return _fail(exc), 0, None


def _execute(op: str, workspace: Any, workspace_size: Any, executor: Any) -> int:
    try:
        if executor is None:
            raise LstmNullArgumentError(f"{op}: executor is required, got None", "executor")
        if not isinstance(executor, AclOpExecutor) or executor.op != op:
            raise LstmInvalidArgumentError(
                f"{op}: executor must come from {op}GetWorkspaceSize, got {type(executor).__name__}"
                + (f" of {executor.op}" if isinstance(executor, AclOpExecutor) else ""),
                "executor",
            )
        if executor.used:
            raise LstmInvalidArgumentError(
                f"{op}: executor has already run (an executor runs once; call "
                f"{op}GetWorkspaceSize again)",
                "executor",
            )
        need = executor.workspace_size
        if (
            isinstance(workspace_size, bool)
            or not isinstance(workspace_size, (int, np.integer))
            or workspace_size < need
        ):
            raise LstmInvalidArgumentError(
                f"{op}: workspaceSize must be an int >= {need} (from {op}GetWorkspaceSize), "
                f"got {workspace_size!r}",
                "workspaceSize",
            )
        workspace = tensor_to_numpy(op, "workspace", workspace)
        buf = None
        if need > 0:
            if workspace is None:
                raise LstmNullArgumentError(
                    f"{op}: workspace is required ({need} bytes), got None", "workspace"
                )
            if (
                not isinstance(workspace, np.ndarray)
                or workspace.dtype != np.uint8
                or workspace.ndim != 1
                or not workspace.flags.c_contiguous
                or not workspace.flags.writeable
            ):
                raise LstmInvalidArgumentError(
                    f"{op}: workspace must be a writeable contiguous 1-D uint8 array, got "
                    f"{type(workspace).__name__}"
                    + (
                        f" of dtype {workspace.dtype}, shape {list(workspace.shape)}"
                        if isinstance(workspace, np.ndarray)
                        else ""
                    ),
                    "workspace",
                )
            if workspace.nbytes < workspace_size:
                raise LstmInvalidArgumentError(
                    f"{op}: workspace must hold at least workspaceSize = {workspace_size} bytes, "
                    f"got {workspace.nbytes}",
                    "workspace",
                )
            buf = workspace[:need]
        executor.used = True
        executor.run(Arena(buf) if buf is not None else Arena(np.zeros(0, np.uint8)))
        return ACLNN_SUCCESS
    except Exception as exc:
        return _fail(exc)


def aclnnLstmBackward(
    workspace: Any, workspace_size: Any, executor: Any, stream: Any = None
) -> int:
    """Phase 2 of the backward: compute into the outputs given to phase 1. Returns a status."""
    return _execute("aclnnLstmBackward", workspace, workspace_size, executor)


def aclnnLSTM(workspace: Any, workspace_size: Any, executor: Any, stream: Any = None) -> int:
    """Phase 2 of the forward: compute into the outputs given to phase 1. Returns a status."""
    return _execute("aclnnLSTM", workspace, workspace_size, executor)
