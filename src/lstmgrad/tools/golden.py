"""The CPU golden of one LSTM call: recompute it with both engines and judge a device's results
(docs/check.md).

A :class:`Case` is one call as a dump describes it, already in lstmgrad's argument layout: the
inputs, the flags, the device's outputs and gradients (each a :class:`Device` tensor under its
dump key) and, for the backward, the gradients that flowed in. :func:`judge` recomputes the call
with the float64 reference (on float64 copies of the dump's values) and with the fused engine
in the dump's dtype (bfloat16: in float32, results rounded to bfloat16), then measures the
device and the fused engine against the reference (:mod:`lstmgrad.tools.metrics`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..core.errors import LstmArgumentError
from ..core.layout import num_params, param_name
from ..ops.api import lstm_backward, lstm_forward
from . import metrics
from .check import to_float64

RULES = ("msprobe", "bound", "both")
STATS = ("Max", "Min", "Mean", "Norm")
SAVED = ("i", "g", "f", "o", "h", "c", "tanhc")


class CaseError(ValueError):
    """A call whose dump cannot be turned into the operator's arguments (the message names the
    dump key)."""


@dataclass
class Device:
    """One tensor the device produced: its dump key, what it is (``y``, ``h_n``, ``dx``,
    ``weight_ih_l0`` ...), the values (None when the dump holds statistics only or the file
    could not be read), the statistics dump.json recorded, and why the values are missing."""

    key: str
    label: str
    value: np.ndarray | None = None
    stats: dict[str, Any] | None = None
    problem: str | None = None  # a file missing or not loadable: the call cannot be fully checked
    shape: tuple[int, ...] | None = None


@dataclass
class Case:
    """One LSTM call in lstmgrad's layout (see :func:`lstmgrad.lstm_forward` for shapes).

    ``present`` maps a result from lstmgrad's layout onto the layout the device's tensor has in
    the dump (identity unless the dump holds packed data); ``unpresent`` does the reverse for
    gradients flowing in. ``saved`` holds the device's own saved activations where the dump
    gives them (kernel-level backward): the backward is then recomputed from them.
    """

    name: str
    source: str
    dtype: str  # float16, bfloat16, float32 or float64
    x: np.ndarray
    params: list[np.ndarray]
    hx: list[np.ndarray] | None
    batch_sizes: np.ndarray | None
    has_bias: bool
    num_layers: int
    bidirectional: bool
    batch_first: bool
    forward: list[Device] = field(default_factory=list)
    backward: list[Device] = field(default_factory=list)
    grads_in: dict[str, np.ndarray | None] | None = None  # dy, dh, dc; None entries are zeros
    saved: dict[str, list[np.ndarray]] | None = None
    upper_layers_unknown: str | None = None  # why layers above the first cannot be judged
    # a module call: dropout between layers unknown; a mismatch above layer 0 is not a verdict
    dropout_unknown: bool = False
    keys: dict[str, str] = field(default_factory=dict)  # lstmgrad argument -> dump key
    notes: list[str] = field(default_factory=list)
    kind: str = ""  # api dense, api packed, module, aclnn backward, aclnn forward
    present: Callable[[str, np.ndarray], np.ndarray] = lambda label, a: a
    unpresent: Callable[[str, np.ndarray], np.ndarray] = lambda label, a: a
    packed_offsets: np.ndarray | None = None  # first packed row of each step (packed dumps)


@dataclass
class Profile:
    """Where an output's error sits: the largest error / bound along each axis of the operator,
    the other axes reduced by their maximum (NaN where a padded step holds no element).

    Each field maps a curve's name (a layer and direction, e.g. "layer 1, direction 0") to its
    values; a field is empty where the output has no such axis (h_n has no time steps, a
    parameter gradient neither steps nor batch rows).
    """

    key: str
    label: str
    steps: dict[str, np.ndarray] = field(default_factory=dict)  # [T] per layer and direction
    rows: dict[str, np.ndarray] = field(default_factory=dict)  # [B] per layer and direction
    units: dict[str, np.ndarray] = field(default_factory=dict)  # per unit, gate row or column
    unit_axis: str = "hidden unit"  # what ``units`` runs over
    gate_size: int = 0  # H where ``units`` runs over the 4H gate rows (blocks i, f, g, o)


@dataclass
class Row:
    """One (call, output) judged: msProbe's columns for the device, the benchmark standard for
    the device and the fused engine, lstmgrad's bound, and the verdict under the rule."""

    call: str
    key: str
    label: str
    dtype: str
    shape: tuple[int, ...]
    status: str  # pass, warning, error, unjudged, undecided, unreadable
    note: str = ""
    columns: metrics.Columns | None = None
    device: metrics.Benchmark | None = None
    fused: metrics.Benchmark | None = None
    ratios: dict[str, float] = field(default_factory=dict)
    benchmark_status: str = ""  # the benchmark standard's ratios alone
    # with cosine and NaN/Inf: the msprobe rule's verdict ("info" in float16 and bfloat16, where
    # the ratios do not decide and NaN/Inf and cosine find nothing)
    msprobe_status: str = ""
    bound_status: str = ""  # the accumulation-length bound's verdict
    nonfinite: int = 0
    bound_off: float = 0.0  # share of elements beyond the bound
    fused_bound_max: float = 0.0  # the fused engine's largest error / bound
    worst: list[tuple[float, float, str]] = field(default_factory=list)
    stats: list[tuple[str, float, float, float, bool]] = field(default_factory=list)
    profile: Profile | None = None  # where the error sits (:func:`error_profile`)

    @property
    def failed(self) -> bool:
        return self.status == metrics.ERROR


@dataclass
class CallReport:
    """Every row of one call and the call's verdict: passed, failed, skipped or unreadable."""

    name: str
    source: str
    kind: str
    dtype: str = ""
    dims: str = ""
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    skipped: str | None = None  # why the call was not checked at all
    unreadable: str | None = None  # why it could not be checked (I/O or a malformed entry)

    @property
    def verdict(self) -> str:
        if self.skipped is not None:
            return "skipped"
        if any(r.failed for r in self.rows):
            return "failed"
        if self.unreadable is not None or any(r.status == "unreadable" for r in self.rows):
            return "unreadable"
        if any(r.status == "undecided" for r in self.rows):
            return "undecided"
        if not any(r.status in (metrics.PASS, metrics.WARNING) for r in self.rows):
            return "unjudged"
        return "passed"


# --------------------------------------------------------------------------- recomputation


def round_bf16(a: np.ndarray) -> np.ndarray:
    """float32 values rounded to the nearest bfloat16 (ties to even), kept as float32."""
    a = np.ascontiguousarray(a, dtype=np.float32)
    u = a.view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).astype(np.uint32).view(np.float32)
    return np.where(np.isnan(a), a, r)


def _rounded(a: np.ndarray, dtype: str) -> np.ndarray:
    """float64 values rounded to the dump's dtype (bfloat16 through float32)."""
    return round_bf16(a.astype(np.float32)) if dtype == "bfloat16" else a.astype(dtype)


def _in_dtype(v: Any, dtype: str) -> Any:
    """The dump's values as the fused engine takes them: bfloat16 widened to float32."""
    if isinstance(v, list):
        return [_in_dtype(e, dtype) for e in v]
    if isinstance(v, np.ndarray) and v.dtype.kind == "f":
        return v.astype(np.float32 if dtype == "bfloat16" else dtype)
    return v


def _out_dtype(v: Any, dtype: str) -> Any:
    if v is None:
        return None
    if isinstance(v, (list, tuple)):
        return [_out_dtype(e, dtype) for e in v]
    return round_bf16(v) if dtype == "bfloat16" else v


@dataclass
class _Results:
    forward: dict[str, np.ndarray]
    backward: dict[str, np.ndarray]


def _run(case: Case, impl: str, want_backward: bool) -> _Results:
    """One engine's results by label, in lstmgrad's layout."""
    conv = to_float64 if impl == "reference" else (lambda v: _in_dtype(v, case.dtype))
    flags: dict[str, Any] = {
        "has_bias": case.has_bias, "num_layers": case.num_layers,
        "bidirectional": case.bidirectional, "batch_first": case.batch_first,
    }  # fmt: skip
    x, params = conv(case.x), conv(case.params)
    hx = conv(case.hx) if case.hx is not None else None
    fwd: dict[str, np.ndarray] = {}
    saved: Any = None
    if case.saved is None:
        out = lstm_forward(x, params, hx, case.batch_sizes, dropout=0.0, train=True, impl=impl,
                           **flags)  # fmt: skip
        fwd = {"y": out.output, "h_n": out.hy, "c_n": out.cy}
        if out.saved is not None:
            saved = out.saved[:7]
            fwd.update({f"{n}.{k}": a for n, lst in zip(SAVED, saved, strict=True)
                        for k, a in enumerate(lst)})  # fmt: skip
    else:
        saved = [conv(case.saved[n]) for n in SAVED]
    bwd: dict[str, np.ndarray] = {}
    if want_backward and case.grads_in is not None:
        g = {k: conv(v) if v is not None else None for k, v in case.grads_in.items()}
        if hx is None:
            h0 = np.zeros_like(fwd["h_n"])
            hx = [h0, h0.copy()]
        res: Any = lstm_backward(x, hx, params, g.get("dy"), g.get("dh"), g.get("dc"), saved[0],
                                 saved[1], saved[2], saved[3], saved[4], saved[5], saved[6],
                                 case.batch_sizes, dropout=0.0, train=True, impl=impl, **flags)  # fmt: skip
        bwd = {"dx": res.dx, "dh0": res.dh_prev, "dc0": res.dc_prev}
        d = 2 if case.bidirectional else 1
        for p, a in enumerate(res.dparams or []):
            bwd[param_name(p, d, case.has_bias)] = a
    if impl != "reference":
        fwd = {k: _out_dtype(v, case.dtype) for k, v in fwd.items()}
        bwd = {k: _out_dtype(v, case.dtype) for k, v in bwd.items()}
    return _Results(fwd, bwd)


# --------------------------------------------------------------------------- judging


def _accumulation(case: Case, label: str) -> int:
    """K of the bound: the reduction length behind the output (docs/check.md)."""
    d = 2 if case.bidirectional else 1
    h = case.params[1].shape[-1] if len(case.params) > 1 else 1
    i = case.x.shape[-1]
    if label in ("y", "h_n", "c_n") or label.split(".")[0] in SAVED:
        return max(i, d * h) + h
    if label == "dx":
        return d * 4 * h
    if label in ("dh0", "dc0"):
        return 4 * h
    if case.batch_sizes is not None:
        return int(np.sum(case.batch_sizes))
    t_axis = 1 if case.batch_first else 0
    return int(case.x.shape[t_axis] * case.x.shape[1 - t_axis])


def _locate(case: Case, label: str, index: tuple[int, ...]) -> str:
    """Where an element sits, in the operator's terms."""
    d = 2 if case.bidirectional else 1
    idx = "[" + ", ".join(map(str, index)) + "]"
    if label in ("y", "dx"):
        if case.packed_offsets is not None:
            row = index[0]
            t = int(np.searchsorted(case.packed_offsets, row, side="right")) - 1
            where = f"step {t}, batch row {row - int(case.packed_offsets[t])}"
        elif case.batch_sizes is not None:
            b = len(case.batch_sizes) and case.x.shape[0] // len(case.batch_sizes)
            where = f"step {index[0] // max(b, 1)}, batch row {index[0] % max(b, 1)}"
        else:
            t, b = (index[1], index[0]) if case.batch_first else (index[0], index[1])
            where = f"step {t}, batch row {b}"
        if label == "y":
            h = case.params[1].shape[-1]
            return f"{idx}: {where}, direction {index[-1] // h}, hidden unit {index[-1] % h}"
        return f"{idx}: {where}, input column {index[-1]}"
    if label in ("h_n", "c_n", "dh0", "dc0"):
        k, b, u = index
        return f"{idx}: layer {k // d}, direction {k % d}, batch row {b}, hidden unit {u}"
    if label.split(".")[0] in SAVED:
        t, b, u = index
        return f"{idx}: step {t}, batch row {b}, hidden unit {u}"
    h = case.params[1].shape[-1]
    col = f", column {index[1]}" if len(index) > 1 else ""
    return f"{idx}: gate {'ifgo'[index[0] // h]}, hidden unit {index[0] % h}{col}"


def _peak(a: np.ndarray, keep: int) -> np.ndarray:
    """The maximum over every axis but ``keep`` (NaN where all are NaN: padding)."""
    moved = np.moveaxis(a, keep, 0).reshape(a.shape[keep], -1)
    out = np.full(moved.shape[0], np.nan)
    seen = ~np.all(np.isnan(moved), axis=1)
    out[seen] = np.nanmax(moved[seen], axis=1)
    return out


def _steps_rows(case: Case, label: str, a: np.ndarray) -> np.ndarray:
    """y or dx as [T, B, C] time-major, padding NaN (packed or variable-length rows placed at
    their step and batch row)."""
    if case.packed_offsets is not None:
        offsets = case.packed_offsets
        counts = np.diff(np.append(offsets, a.shape[0]))
        out = np.full((len(offsets), int(counts.max(initial=0)), a.shape[-1]), np.nan)
        for t, (start, n) in enumerate(zip(offsets, counts, strict=True)):
            out[t, : int(n)] = a[int(start) : int(start) + int(n)]
        return out
    if case.batch_sizes is not None:
        steps = max(len(case.batch_sizes), 1)
        out = a.reshape(steps, a.shape[0] // steps, a.shape[-1]).astype(np.float64)
        for t, n in enumerate(case.batch_sizes):
            out[t, int(n) :] = np.nan  # rows past a sequence's end hold no element
        return out
    return a.transpose(1, 0, 2) if case.batch_first else a


def error_profile(case: Case, key: str, label: str, times: np.ndarray) -> Profile:
    """The data behind ``lstmgrad check --plot``: where an output's error / bound sits.

    Args:
        case: the call (its layout: batch_first, packing, directions, H).
        key, label: the output's dump key and what it is (``y``, ``dx``, ``h_n``, ``i.0``,
            ``weight_hh_l0`` ...).
        times: |device - reference| / bound per element, in the output's layout as dumped.

    Returns:
        The largest error / bound per time step and per batch row for each layer and direction
        the output covers, and per hidden unit (per gate row for parameter gradients, per input
        column for dx): a drift along T is a rising curve, one bad step or batch row a spike.
    """
    d = 2 if case.bidirectional else 1
    h = case.params[1].shape[-1] if len(case.params) > 1 else 1
    top = case.num_layers - 1
    prof = Profile(key, label)
    a = np.where(np.isnan(times), np.inf, times).astype(np.float64)
    if label in ("y", "dx"):
        tbc = _steps_rows(case, label, a)
        if label == "dx":
            parts = [("layer 0, both directions summed" if d == 2 else "layer 0", tbc)]
            prof.unit_axis = "input column"
        else:
            parts = [(f"layer {top}, direction {k}" if d == 2 else f"layer {top}",
                      tbc[..., k * h : (k + 1) * h]) for k in range(d)]  # fmt: skip
        for name, part in parts:
            prof.steps[name], prof.rows[name] = _peak(part, 0), _peak(part, 1)
            prof.units[name] = _peak(part, 2)
    elif label in ("h_n", "c_n", "dh0", "dc0") or label.split(".")[0] in SAVED:
        saved = label.split(".")[0] in SAVED
        # a saved activation: one [T, B, H] of (layer, direction) k; a state: [L*D, B, H]
        states = [(int(label.split(".")[1]), a)] if saved else list(enumerate(a[:, None]))
        for k, part in states:
            name = f"layer {k // d}, direction {k % d}" if d == 2 else f"layer {k // d}"
            if saved:  # only activations run along the time steps
                prof.steps[name] = _peak(part, 0)
            prof.rows[name], prof.units[name] = _peak(part, 1), _peak(part, 2)
    else:  # a parameter gradient [4H, C] or [4H]: summed over steps and batch rows
        prof.units[label] = _peak(a, 0) if a.ndim > 1 else a.copy()
        prof.unit_axis, prof.gate_size = "gate row", h
    return prof


def _stats_of(a: np.ndarray) -> dict[str, float]:
    a = a.astype(np.float64)
    if a.size == 0:
        return {}
    return {"Max": float(a.max()), "Min": float(a.min()), "Mean": float(a.mean()),
            "Norm": float(np.linalg.norm(a.ravel()))}  # fmt: skip


def _judge_stats(case: Case, dev: Device, ref: np.ndarray, k: int, factor: float) -> Row:
    """A device tensor known only by its recorded statistics."""
    row = Row(case.name, dev.key, dev.label, case.dtype, tuple(ref.shape), metrics.PASS)
    ref_stats = _stats_of(ref)
    rms = float(np.sqrt(np.mean(np.square(ref)))) if ref.size else 0.0
    recorded = {s: (dev.stats or {}).get(s) for s in STATS}
    compared = 0
    for s in STATS:
        got = recorded[s]
        if got is None or s not in ref_stats or isinstance(got, bool):
            continue
        compared += 1
        got = float(got)
        tol = metrics.stat_tolerance(s, ref_stats[s], rms, case.dtype, k, factor)
        ok = abs(got - ref_stats[s]) <= tol or (np.isnan(got) and np.isnan(ref_stats[s]))
        row.stats.append((s, got, ref_stats[s], tol, bool(ok)))
        if not ok:
            row.status = metrics.ERROR
    why = dev.problem or "the dump holds statistics only (task 'statistics')"
    if not compared:
        row.status = "unreadable" if dev.problem else "unjudged"
        row.note = f"{why}; no statistics recorded either"
        return row
    row.note = f"{why}: its recorded Max/Min/Mean/Norm compared, not its elements"
    if dev.problem and row.status == metrics.PASS:
        row.status = "unreadable"  # the file should be there: not a full check
    return row


def _judge_tensor(
    case: Case, dev: Device, ref: np.ndarray, fused: np.ndarray, rule: str, factor: float,
    top: int,
) -> Row:  # fmt: skip
    assert dev.value is not None
    a = dev.value
    row = Row(case.name, dev.key, dev.label, case.dtype, tuple(a.shape), metrics.PASS)
    if a.shape != ref.shape:
        row.status, row.note = (
            metrics.ERROR,
            (f"shape {list(a.shape)} where the operator gives {list(ref.shape)}"),
        )
        return row
    k = _accumulation(case, dev.label)
    row.nonfinite = metrics.finite_mismatch(a, ref)
    row.columns = metrics.compare_columns(a, ref)
    row.device = metrics.benchmark_metrics(a, ref, case.dtype)
    # no device beats the correctly rounded reference, and no correct platform gets a small
    # value within the atol where rounding moves it more: a lucky fused engine sets no lower bar
    row.fused = metrics.at_least(metrics.benchmark_metrics(fused, ref, case.dtype),
                                 metrics.benchmark_metrics(_rounded(ref, case.dtype), ref,
                                                           case.dtype))  # fmt: skip
    row.fused.small_value_err_ratio = max(row.fused.small_value_err_ratio,
                                          metrics.expected_small_share(ref, case.dtype, k))  # fmt: skip
    row.benchmark_status, row.ratios = metrics.benchmark_verdict(row.device, row.fused,
                                                                 case.dtype)  # fmt: skip
    tol = metrics.bound(ref, case.dtype, k, factor)
    err = np.abs(a.astype(np.float64) - ref)
    err = np.where(np.isnan(err), np.inf, err)
    tiny = np.finfo(np.float64).tiny
    times = err / np.maximum(tol, tiny)
    row.bound_off = float(np.count_nonzero(err > tol)) / max(a.size, 1)
    fused_err = np.abs(fused.astype(np.float64) - ref)
    row.fused_bound_max = float((fused_err / np.maximum(tol, tiny)).max(initial=0.0))
    if a.size:
        row.profile = error_profile(case, dev.key, dev.label, times)
    for flat in np.argsort(times, axis=None)[::-1][:top] if a.size else []:
        idx = tuple(int(v) for v in np.unravel_index(int(flat), a.shape))
        if err[idx] > 0:
            row.worst.append((float(err[idx]), float(times[idx]), _locate(case, dev.label, idx)))
    cos_bad = row.columns.cosine is not None and not row.columns.cosine > metrics.COSINE_MIN
    nan_bad = metrics.ERROR if row.nonfinite else metrics.PASS
    nan_cos = metrics.worst(nan_bad, metrics.ERROR if cos_bad else metrics.PASS)
    decisive = case.dtype in metrics.BENCHMARK_DECISIVE
    if decisive:
        row.msprobe_status = metrics.worst(row.benchmark_status, nan_cos)
    else:  # the ratios compare a rounding device with a float32 platform: information only
        row.msprobe_status = nan_cos if nan_cos == metrics.ERROR else metrics.INFO
    row.bound_status = metrics.worst(nan_bad, metrics.ERROR if row.bound_off else metrics.PASS)
    if row.nonfinite:
        row.note = f"{row.nonfinite} NaN/Inf where the reference differs"
    if rule == "msprobe":
        row.status = "unjudged" if row.msprobe_status == metrics.INFO else row.msprobe_status
    elif rule == "bound":
        row.status = row.bound_status
    else:
        row.status = metrics.worst(row.bound_status, row.msprobe_status if decisive else nan_cos)
    return row


def _judge_one(
    case: Case, dev: Device, ref: np.ndarray | None, fused: np.ndarray | None, rule: str,
    factor: float, top: int,
) -> Row:  # fmt: skip
    if ref is None or fused is None:
        return Row(case.name, dev.key, dev.label, case.dtype, dev.shape or (), "unjudged",
                   note="the operator has no such output here")  # fmt: skip
    ref, fused = case.present(dev.label, ref), case.present(dev.label, fused)
    if dev.value is None:
        return _judge_stats(case, dev, ref, _accumulation(case, dev.label), factor)
    return _judge_tensor(case, dev, ref, fused, rule, factor, top)


def _layer0(case: Case, label: str, a: np.ndarray) -> np.ndarray:
    """The first layer's rows of a [L*D, B, H] state."""
    return a[: 2 if case.bidirectional else 1] if label in ("h_n", "c_n") else a


def judge(case: Case, rule: str = "bound", factor: float = metrics.BOUND_FACTOR,
          top: int = 3) -> CallReport:  # fmt: skip
    """Recompute ``case`` and judge every device tensor it holds.

    Raises:
        CaseError: the dump's arguments break the operator's contract (names the dump key).
    """
    want_bwd = bool(case.backward) and case.grads_in is not None and not case.upper_layers_unknown
    try:  # the engines validate the call first: the shapes read below are the contract's
        ref = _run(case, "reference", want_bwd)
        fused = _run(case, "fused", want_bwd)
    except LstmArgumentError as exc:
        key = case.keys.get(exc.param or "", exc.param)
        raise CaseError(f"{key}: {exc}") from exc
    d = 2 if case.bidirectional else 1
    t_axis = 1 if case.batch_first else 0
    steps = len(case.batch_sizes) if case.batch_sizes is not None else case.x.shape[t_axis]
    h = case.params[1].shape[-1] if len(case.params) > 1 else 0
    batch = case.hx[0].shape[1] if case.hx else (
        case.x.shape[1 - t_axis] if case.batch_sizes is None else
        case.x.shape[0] // max(len(case.batch_sizes), 1))  # fmt: skip
    dims = (f"T {steps} B {batch} I {case.x.shape[-1]} H {h} L {case.num_layers} D {d}"
            f"{' batch_first' if case.batch_first else ''}"
            f"{' bias' if case.has_bias else ' no bias'}"
            f"{' variable lengths' if case.batch_sizes is not None else ''}")  # fmt: skip
    rep = CallReport(case.name, case.source, "", case.dtype, dims, notes=list(case.notes))
    for dev in case.forward:
        r, f = ref.forward.get(dev.label), fused.forward.get(dev.label)
        if case.upper_layers_unknown and case.num_layers > 1:
            if dev.label not in ("h_n", "c_n"):
                rep.rows.append(Row(case.name, dev.key, dev.label, case.dtype, dev.shape or (),
                                    "unjudged", note="not judged: see the call's note"))  # fmt: skip
                continue
            if dev.value is None:
                rep.rows.append(Row(case.name, dev.key, dev.label, case.dtype, dev.shape or (),
                                    "unjudged", note="its statistics cover every layer, and only "
                                    f"layer 0 can be judged ({case.upper_layers_unknown})"))  # fmt: skip
                continue
            dev = _first_layer(case, dev)
            r, f = (_layer0(case, dev.label, v) if v is not None else None for v in (r, f))
        rep.rows.extend(_tentative(case, _judge_one(case, dev, r, f, rule, factor, top), dev,
                                   r, f, rule, factor, top))  # fmt: skip
    for dev in case.backward:
        if not want_bwd:
            why = ("not judged: see the call's note" if case.upper_layers_unknown else
                   "not judged: no gradients flowing in are recorded")  # fmt: skip
            rep.rows.append(Row(case.name, dev.key, dev.label, case.dtype, dev.shape or (),
                                "unjudged", note=why))  # fmt: skip
            continue
        r, f = ref.backward.get(dev.label), fused.backward.get(dev.label)
        rep.rows.extend(_tentative(case, _judge_one(case, dev, r, f, rule, factor, top), dev,
                                   r, f, rule, factor, top))  # fmt: skip
    if case.upper_layers_unknown and case.num_layers > 1:
        rep.notes.append(f"judged: layer 0's h_n and c_n only: {case.upper_layers_unknown}")
    if rule == "msprobe" and any(r.msprobe_status == metrics.INFO for r in rep.rows):
        rep.notes.append(BENCHMARK_INFO)
    return rep


BENCHMARK_INFO = (
    "--rule msprobe judges float16 and bfloat16 outputs on NaN/Inf and Cosine only: lstmgrad "
    "computes them in float32 and rounds the results once, a more precise platform than a "
    "device that rounds inside the call, so the benchmark ratios are information here "
    "(docs/check.md#when-the-benchmark-ratios-decide); the bound judges them (--rule bound or both)"
)


UNDECIDED_SHARE = 0.5  # dropout moves nearly every element above layer 0: a few cannot be it


def _tentative(
    case: Case, row: Row, dev: Device, ref: np.ndarray | None, fused: np.ndarray | None,
    rule: str, factor: float, top: int,
) -> list[Row]:  # fmt: skip
    """A module call of several layers is judged as if without dropout. Where that fails in
    most elements above layer 0 (what dropout between layers does: it rescales every input of
    the upper layers), the row is "undecided" and layer 0's states are judged alone; a failure
    in a few elements is a failure."""
    if not (case.dropout_unknown and case.num_layers > 1 and row.failed and row.bound_off):
        return [row]  # no element beyond the bound: whatever failed, dropout did not do it
    upper = (case.num_layers - 1) / case.num_layers if dev.label in ("h_n", "c_n") else 1.0
    share = min(row.bound_off / upper, 1.0)
    if dev.value is not None and share < UNDECIDED_SHARE:
        n_upper = max(round(upper * int(np.prod(dev.value.shape))), 1)
        row.note = (f"{round(share * n_upper)} of its {n_upper} elements above layer 0 differ; "
                    "dropout between layers would move nearly all of them, so this is a "
                    "failure")  # fmt: skip
        return [row]
    row.status = "undecided"
    row.note = (f"differs from the recomputation without dropout in {share:.0%} of its "
                "elements above layer 0, as dropout between layers in training would (a Module "
                "entry does not record it): not a verdict; give --no-dropout if the model ran "
                "with dropout 0 or in eval mode")  # fmt: skip
    rows = [row]
    if (
        dev.label in ("h_n", "c_n")
        and dev.value is not None
        and ref is not None
        and fused is not None
    ):
        rows.append(_judge_one(case, _first_layer(case, dev), _layer0(case, dev.label, ref),
                               _layer0(case, dev.label, fused), rule, factor, top))  # fmt: skip
    return rows


def _first_layer(case: Case, dev: Device) -> Device:
    assert dev.value is not None
    value = _layer0(case, dev.label, dev.value)
    return Device(f"{dev.key} (layer 0 rows)", dev.label, value, None, dev.problem, value.shape)


def expected_params(num_layers: int, bidirectional: bool, has_bias: bool) -> list[str]:
    """Torch's names of the flat weights, in order."""
    d = 2 if bidirectional else 1
    return [param_name(p, d, has_bias) for p in range(num_params(num_layers, bidirectional,
                                                                 has_bias))]  # fmt: skip
