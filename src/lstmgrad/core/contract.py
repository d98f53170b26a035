"""Validation of every argument of the contract (docs/contract.md) and the result types; no math.

``check_backward`` / ``check_forward`` turn the public arguments into a validated, normalised
call record (time-major views, resolved dims, boolean mask) or raise an
:class:`~lstmgrad.core.errors.LstmArgumentError` naming the argument, the expected and the actual
value. They allocate nothing proportional to the data: every check runs before any computation.
"""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from .errors import LstmInvalidArgumentError, LstmNullArgumentError
from .layout import W_HH, W_IH, Dims, num_params, param_name, params_per_direction
from .varlen import mask_from_batch_sizes

IMPLS = ("fused", "reference")  # the engines, api.ENGINES maps them to their modules
DEFAULT_IMPL = "fused"
SUPPORTED_DTYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))
SAVED_NAMES = ("i", "g", "f", "o", "h", "c", "tanhc")
OUTPUT_NAMES = ("dx", "dh_prev", "dc_prev", "dparams")


class LstmSaved(NamedTuple):
    """Activations saved by the training forward, consumed by the backward.

    i, g, f, o, h, c, tanhc: lists of L*D arrays [T, B, H], time-major, indexed by real time.
    dropout_masks: list of L-1 arrays [T, B, D*H] (0 or 1/(1-p)), or None without dropout.
    """

    i: list[np.ndarray]
    g: list[np.ndarray]
    f: list[np.ndarray]
    o: list[np.ndarray]
    h: list[np.ndarray]
    c: list[np.ndarray]
    tanhc: list[np.ndarray]
    dropout_masks: list[np.ndarray] | None


class LstmForwardResult(NamedTuple):
    """output [T, B, D*H] (layout of input), hy and cy [L*D, B, H], saved (None unless train)."""

    output: np.ndarray
    hy: np.ndarray
    cy: np.ndarray
    saved: LstmSaved | None


class LstmBackwardResult(NamedTuple):
    """dx (shape of input), dh_prev and dc_prev [L*D, B, H], dparams (list like params).

    An output switched off by ``output_mask`` is None.
    """

    dx: np.ndarray | None
    dh_prev: np.ndarray | None
    dc_prev: np.ndarray | None
    dparams: list[np.ndarray] | None


@dataclass
class Layout:
    """How input/dy/dx/output map to the time-major [T, B, *] view the engines use."""

    kind: str  # "tbi" (time-major), "bti" (batch_first) or "flat" ([T*B, *], batch sizes)

    def to_time_major(self, a: np.ndarray, steps: int, batch: int) -> np.ndarray:
        """View (or, for a non-reshapeable flat array, copy) of ``a`` as [T, B, *]."""
        if self.kind == "bti":
            return a.transpose(1, 0, 2)
        if self.kind == "flat":
            return a.reshape(steps, batch, a.shape[-1])
        return a

    def from_time_major(self, a: np.ndarray) -> np.ndarray:
        """A new C-contiguous array in the caller's layout from a time-major [T, B, *] array."""
        if self.kind == "bti":
            return np.ascontiguousarray(a.transpose(1, 0, 2))
        if self.kind == "flat":
            return np.ascontiguousarray(a).reshape(a.shape[0] * a.shape[1], a.shape[2])
        return np.ascontiguousarray(a)


@dataclass
class BackwardCall:
    """A validated backward call, normalised to time-major views."""

    dims: Dims
    dtype: np.dtype
    layout: Layout
    x: np.ndarray  # [T, B, I]
    h0: np.ndarray  # [L*D, B, H]
    c0: np.ndarray  # [L*D, B, H]
    params: list[np.ndarray]
    dy: np.ndarray | None  # [T, B, D*H]
    dh: np.ndarray | None  # [L*D, B, H]
    dc: np.ndarray | None  # [L*D, B, H]
    saved: tuple[list[np.ndarray], ...]  # i, g, f, o, h, c, tanhc
    mask: np.ndarray | None  # bool [T, B]
    dropout_masks: list[np.ndarray] | None  # L-1 x [T, B, D*H], only when dropout applies
    need: tuple[bool, bool, bool, bool]  # dx, dh_prev, dc_prev, dparams


@dataclass
class ForwardCall:
    """A validated forward call, normalised to time-major views."""

    dims: Dims
    dtype: np.dtype
    layout: Layout
    x: np.ndarray  # [T, B, I]
    h0: np.ndarray | None  # [L*D, B, H]
    c0: np.ndarray | None  # [L*D, B, H]
    params: list[np.ndarray]
    mask: np.ndarray | None  # bool [T, B]
    dropout: float  # probability applied between layers (0 when not training)
    train: bool
    seed: int | None
    dropout_masks: list[np.ndarray] | None = None  # L-1 x [T, B, D*H], given or drawn by the API


# ---------------------------------------------------------------------------------------------
# Small checks. Each raises with the function name, the argument, what was expected and got.


def _fmt_shape(shape: Sequence[int]) -> str:
    return "[" + ", ".join(str(int(s)) for s in shape) + "]"


def _type_name(value: Any) -> str:
    if isinstance(value, np.ndarray):
        return f"numpy.ndarray of dtype {value.dtype} and shape {_fmt_shape(value.shape)}"
    if value is None or isinstance(value, (numbers.Number, str, np.generic)):
        text = repr(value)
        return f"{type(value).__name__} {text[:40] + '...' if len(text) > 40 else text}"
    return type(value).__name__


def check_impl(fn: str, impl: Any) -> str:
    """``impl`` names an engine: "fused" (the default) or "reference"."""
    if not isinstance(impl, str) or impl not in IMPLS:
        raise LstmInvalidArgumentError(
            f"{fn}: impl must be one of {list(IMPLS)}, got {impl!r}", "impl"
        )
    return impl


def require(fn: str, name: str, value: Any) -> None:
    """161001 when a required argument is None."""
    if value is None:
        raise LstmNullArgumentError(f"{fn}: {name} is required, got None", name)


def check_bool(fn: str, name: str, value: Any) -> bool:
    """A Python or NumPy bool."""
    if not isinstance(value, (bool, np.bool_)):
        raise LstmInvalidArgumentError(
            f"{fn}: {name} must be a bool, got {_type_name(value)}", name
        )
    return bool(value)


def check_num_layers(fn: str, value: Any) -> int:
    """An integer >= 1."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise LstmInvalidArgumentError(
            f"{fn}: num_layers must be an int >= 1, got {_type_name(value)}", "num_layers"
        )
    if value <= 0:
        raise LstmInvalidArgumentError(
            f"{fn}: num_layers must be an int >= 1, got {int(value)}", "num_layers"
        )
    return int(value)


def check_dropout(fn: str, value: Any) -> float:
    """A probability in [0, 1]."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise LstmInvalidArgumentError(
            f"{fn}: dropout must be a float in [0, 1], got {_type_name(value)}", "dropout"
        )
    p = float(value)
    if not (math.isfinite(p) and 0.0 <= p <= 1.0):
        raise LstmInvalidArgumentError(
            f"{fn}: dropout must be a float in [0, 1], got {p}", "dropout"
        )
    return p


def check_output_mask(fn: str, value: Any) -> tuple[bool, bool, bool, bool]:
    """None (all True) or exactly 4 booleans: dx, dh_prev, dc_prev, dparams."""
    if value is None:
        return (True, True, True, True)
    if isinstance(value, np.ndarray) and value.dtype == np.bool_ and value.ndim == 1:
        value = list(value)
    if (
        not isinstance(value, (list, tuple))
        or len(value) != 4
        or not all(isinstance(v, (bool, np.bool_)) for v in value)
    ):
        got = (
            f"{type(value).__name__} of length {len(value)}: {list(value)!r}"
            if isinstance(value, (list, tuple))
            else _type_name(value)
        )
        raise LstmInvalidArgumentError(
            f"{fn}: output_mask must be 4 booleans (dx, dh_prev, dc_prev, dparams), got {got}",
            "output_mask",
        )
    m = tuple(bool(v) for v in value)
    return (m[0], m[1], m[2], m[3])


def check_list(fn: str, name: str, value: Any, length: int, what: str) -> list[Any]:
    """A list/tuple of ``length`` elements, none of them None."""
    require(fn, name, value)
    if not isinstance(value, (list, tuple)):
        raise LstmInvalidArgumentError(
            f"{fn}: {name} must be a list of {length} arrays ({what}), got {_type_name(value)}",
            name,
        )
    if len(value) != length:
        raise LstmInvalidArgumentError(
            f"{fn}: {name} must be a list of length {length} ({what}), got length {len(value)}",
            name,
        )
    for j, v in enumerate(value):
        if v is None:
            raise LstmNullArgumentError(f"{fn}: {name}[{j}] is required, got None", name)
    return list(value)


def check_array(
    fn: str,
    name: str,
    a: Any,
    shape: Sequence[int],
    legend: str,
    dtype: np.dtype,
    param: str | None = None,
    hint: str = "",
) -> np.ndarray:
    """An ndarray of exactly ``shape`` and ``dtype`` (the dtype of input); ``hint`` ends the
    message of a wrong shape (a likely cause)."""
    param = param or name
    if not isinstance(a, np.ndarray):
        raise LstmInvalidArgumentError(
            f"{fn}: {name} must be a numpy.ndarray of shape {_fmt_shape(shape)} ({legend}), "
            f"got {_type_name(a)}",
            param,
        )
    if a.dtype != dtype:
        raise LstmInvalidArgumentError(
            f"{fn}: {name} must have dtype {dtype} (the dtype of input), got {a.dtype}", param
        )
    if tuple(a.shape) != tuple(shape):
        raise LstmInvalidArgumentError(
            f"{fn}: {name} must have shape {_fmt_shape(shape)} ({legend}), got "
            f"{_fmt_shape(a.shape)}{hint}",
            param,
        )
    return a


def _valid(a: Any, shape: tuple[int, ...], dtype: np.dtype) -> bool:
    """Whether ``check_array`` would accept ``a`` (its fast path, for long lists: it spares
    formatting a label per element, ~2 us each)."""
    return isinstance(a, np.ndarray) and a.dtype == dtype and a.shape == shape


def _check_input_array(fn: str, x: Any) -> np.ndarray:
    if not isinstance(x, np.ndarray):
        raise LstmInvalidArgumentError(
            f"{fn}: input must be a numpy.ndarray, got {_type_name(x)}", "input"
        )
    if x.dtype not in SUPPORTED_DTYPES:
        raise LstmInvalidArgumentError(
            f"{fn}: input must have dtype float16, float32 or float64, got {x.dtype}", "input"
        )
    return x


def _check_batch_sizes(fn: str, value: Any) -> np.ndarray:
    """1-D int64 array (or a sequence of Python ints); the range is checked once B is known."""
    if isinstance(value, np.ndarray):
        if value.dtype != np.int64 or value.ndim != 1:
            raise LstmInvalidArgumentError(
                f"{fn}: batch_sizes must be a 1-D int64 array [T], got {_type_name(value)}",
                "batch_sizes",
            )
        return value
    if isinstance(value, (list, tuple)) and all(
        isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_)) for v in value
    ):
        big = [int(v) for v in value if not -(2**63) <= int(v) < 2**63]
        if big:
            raise LstmInvalidArgumentError(
                f"{fn}: batch_sizes must be int64 values in [0, B], got {big[0]}", "batch_sizes"
            )
        return np.asarray(value, dtype=np.int64).reshape(len(value))
    raise LstmInvalidArgumentError(
        f"{fn}: batch_sizes must be a 1-D int64 array [T], got {_type_name(value)}", "batch_sizes"
    )


def _check_batch_sizes_range(fn: str, bs: np.ndarray, batch: int) -> None:
    bad = np.flatnonzero((bs < 0) | (bs > batch))
    if bad.size:
        t = int(bad[0])
        raise LstmInvalidArgumentError(
            f"{fn}: batch_sizes must lie in [0, B] with B = {batch}, got batch_sizes[{t}] = "
            f"{int(bs[t])}",
            "batch_sizes",
        )


def _hidden_size(fn: str, params: list[Any], others: Sequence[Any] = ()) -> int:
    """H, as most of its sources agree: weight_hh_l0's columns and rows / 4, weight_ih_l0's rows
    / 4, and the last dim of ``others`` (hx[0], i[0] in the backward). Taking the majority makes
    the later shape checks blame the one tensor that disagrees; ties go to weight_hh_l0's columns.
    """
    w_hh, w_ih = params[1], params[0]
    if not isinstance(w_hh, np.ndarray) or w_hh.ndim != 2:
        got = _fmt_shape(w_hh.shape) if isinstance(w_hh, np.ndarray) else _type_name(w_hh)
        raise LstmInvalidArgumentError(
            f"{fn}: params[1] (weight_hh_l0) must be a 2-D array [4H, H], got {got}", "params"
        )
    votes = [int(w_hh.shape[1])]
    if w_hh.shape[0] % 4 == 0:
        votes.append(int(w_hh.shape[0]) // 4)
    if isinstance(w_ih, np.ndarray) and w_ih.ndim == 2 and w_ih.shape[0] % 4 == 0:
        votes.append(int(w_ih.shape[0]) // 4)
    votes += [int(a.shape[-1]) for a in others if isinstance(a, np.ndarray) and a.ndim == 3]
    return max(votes, key=votes.count)  # first of the most common: a stable tie-break


@functools.lru_cache(maxsize=64)
def _param_shapes(dims: Dims) -> tuple[tuple[int, ...], ...]:
    """Every params element's shape, in order (the same for every call of these sizes)."""
    return tuple(dims.param_shape(j) for j in range(dims.K * params_per_direction(dims.has_bias)))


def check_params(fn: str, params: list[Any], dims: Dims, dtype: np.dtype) -> list[np.ndarray]:
    """Every params element against its [4H, I|D*H], [4H, H] or [4H] shape."""
    out = []
    per_dir = params_per_direction(dims.has_bias)
    for j, (p, shape) in enumerate(zip(params, _param_shapes(dims), strict=True)):
        if _valid(p, shape, dtype):
            out.append(p)
            continue
        kind = j % per_dir
        if kind == W_IH:
            legend = "4H, I" if j < per_dir * dims.D else "4H, D*H"
        else:
            legend = "4H, H" if kind == W_HH else "4H"
        label = f"params[{j}] ({param_name(j, dims.D, dims.has_bias)})"
        out.append(check_array(fn, label, p, shape, legend, dtype, param="params"))
    return out


def _layout_hint(x: np.ndarray, layout: Layout, state: Any, dims: Dims) -> str:
    """A hint for a state [L*D, B', H] whose B' is not input's B but the other of input's
    first two axes: input is likely batch-first without batch_first (or the reverse)."""
    if layout.kind == "flat" or x.ndim != 3 or x.shape[0] == x.shape[1]:
        return ""
    if not (isinstance(state, np.ndarray) and state.ndim == 3):
        return ""
    other = int(x.shape[0] if layout.kind == "tbi" else x.shape[1])
    if (int(state.shape[0]), int(state.shape[1]), int(state.shape[2])) != (dims.K, other, dims.H):
        return ""
    if layout.kind == "tbi":
        return " (input looks batch-first, [B, T, I]: pass batch_first=True)"
    return " (input looks time-major, [T, B, I]: pass batch_first=False)"


def _check_state_list(
    fn: str, name: str, value: Any, dims: Dims, dtype: np.dtype, x: np.ndarray, layout: Layout
) -> list[np.ndarray]:
    """hx: [h0, c0], each [L*D, B, H]; a wrong B that matches input's other leading axis gets
    a hint about batch_first (:func:`_layout_hint`)."""
    items = check_list(fn, name, value, 2, "h0, c0")
    shape = (dims.K, dims.B, dims.H)
    return [
        a if _valid(a, shape, dtype) else check_array(
            fn, f"{name}[{j}]", a, shape, "L*D, B, H", dtype, param=name,
            hint=_layout_hint(x, layout, a, dims),
        )
        for j, a in enumerate(items)
    ]  # fmt: skip


def _resolve_time_batch(
    fn: str, x: np.ndarray, bs: np.ndarray | None, batch_first: bool, batch_hint: int | None
) -> tuple[int, int, Layout]:
    """T, B and the layout of input; ``batch_hint`` is B where batch sizes leave it open."""
    if bs is None:
        if x.ndim != 3:
            raise LstmInvalidArgumentError(
                f"{fn}: input must be 3-D [{'B, T' if batch_first else 'T, B'}, I] without "
                f"batch_sizes, got shape {_fmt_shape(x.shape)}",
                "input",
            )
        if batch_first:
            return int(x.shape[1]), int(x.shape[0]), Layout("bti")
        return int(x.shape[0]), int(x.shape[1]), Layout("tbi")
    if x.ndim != 2:
        raise LstmInvalidArgumentError(
            f"{fn}: input must be 2-D [T*B, I] with batch_sizes, got shape {_fmt_shape(x.shape)}",
            "input",
        )
    steps = int(bs.shape[0])
    rows = int(x.shape[0])
    if batch_hint is None:
        if steps == 0 or rows % steps:
            raise LstmInvalidArgumentError(
                f"{fn}: input must have T*B rows with T = len(batch_sizes) = {steps}, got "
                f"{rows} rows",
                "input",
            )
        batch_hint = rows // steps
    if rows != steps * batch_hint:
        raise LstmInvalidArgumentError(
            f"{fn}: input must have shape [{steps * batch_hint}, {x.shape[1]}] (T*B, I) with "
            f"T = {steps}, B = {batch_hint}, got {_fmt_shape(x.shape)}",
            "input",
        )
    return steps, batch_hint, Layout("flat")


def _check_dropout_masks(
    fn: str, value: Any, dims: Dims, dtype: np.dtype, applies: bool, name: str = "dropout_masks"
) -> list[np.ndarray] | None:
    """L-1 masks [T, B, D*H] when dropout applies (dropout > 0 and train), else None; ``name``
    is what the caller passed them as (``saved.dropout_masks`` through ``saved``)."""
    if not applies:
        if value is not None and not (isinstance(value, (list, tuple)) and len(value) == 0):
            got = (
                f"a list of {len(value)}" if isinstance(value, (list, tuple)) else _type_name(value)
            )
            advice = "" if name == "dropout_masks" else ": pass the forward's dropout and train"
            raise LstmInvalidArgumentError(
                f"{fn}: {name} must be None when dropout is 0 or train is False (they "
                f"would be ignored{advice}), got {got}",
                "dropout_masks",
            )
        return None
    if dims.L == 1 and (value is None or (isinstance(value, (list, tuple)) and len(value) == 0)):
        return []
    if value is None:
        raise LstmInvalidArgumentError(
            f"{fn}: dropout_masks are required with dropout > 0 and train (the exact gradient "
            f"needs the forward's masks: pass saved.dropout_masks), got None",
            "dropout_masks",
        )
    items = check_list(fn, "dropout_masks", value, dims.L - 1, "one per layer above the first")
    shape = (dims.T, dims.B, dims.D * dims.H)
    return [
        check_array(fn, f"dropout_masks[{j}]", a, shape, "T, B, D*H", dtype, param="dropout_masks")
        for j, a in enumerate(items)
    ]


def _looks_saved(value: Any) -> bool:
    """Whether ``value`` is the forward's whole saved tuple rather than one list of it: an
    LstmSaved, or 7 or 8 items whose first seven are lists."""
    if isinstance(value, LstmSaved):
        return True
    return (isinstance(value, (list, tuple)) and len(value) in (7, 8)
            and all(isinstance(v, (list, tuple)) for v in value[:7]))  # fmt: skip


def _looks_like_masks(value: Any, input: Any) -> bool:
    """Whether ``value``, given as batch_sizes, looks like ``saved.dropout_masks``: a list of
    3-D arrays (or tensors), or an empty list beside a 3-D input (one layer's masks)."""
    if not isinstance(value, (list, tuple)):
        return False
    if not value:
        return getattr(input, "ndim", None) == 3
    return all(getattr(v, "ndim", None) == 3 for v in value)


def unpack_saved(
    fn: str,
    saved: Any,
    lists: Sequence[Any],
    batch_sizes: Any,
    dropout_masks: Any,
    input: Any,
) -> tuple[tuple[Any, ...], Any, str]:
    """The backward's seven saved lists (i, g, f, o, h, c, tanhc), its dropout masks and the
    name they came by (for messages), from either form: ``saved`` (the forward's ``LstmSaved``:
    its seven lists and its masks) or the seven lists in aclnn order (``lists``) with
    ``dropout_masks``.

    The forward's whole saved tuple where one list or batch_sizes was expected is named as
    such (161002): ``saved`` passed as ``i``, and ``*saved``, whose eighth item (the masks)
    lands in batch_sizes. Without dropout ``*saved`` puts None there, which is the right
    batch_sizes of a dense call.
    """
    pass_saved = (
        "pass saved=fwd.saved (or *fwd.saved[:7] and dropout_masks=fwd.saved.dropout_masks)"
    )
    if saved is None:
        if all(v is None for v in lists):
            raise LstmNullArgumentError(
                f"{fn}: saved is required (the forward's LstmForwardResult.saved; or the lists "
                f"i, g, f, o, h, c, tanhc in aclnn order), got None",
                "saved",
            )
        if _looks_saved(lists[0]):
            raise LstmInvalidArgumentError(
                f"{fn}: i must be a list of L*D arrays [T, B, H], got the forward's whole saved "
                f"tuple ({len(lists[0])} items): {pass_saved}",
                "i",
            )
        if _looks_like_masks(batch_sizes, input):
            raise LstmInvalidArgumentError(
                f"{fn}: batch_sizes must be a 1-D int64 array [T], got a list of "
                f"{len(batch_sizes)} arrays: it looks like saved.dropout_masks, the 8th item of "
                f"the forward's saved (was *fwd.saved passed?): {pass_saved}",
                "batch_sizes",
            )
        return tuple(lists), dropout_masks, "dropout_masks"
    if isinstance(saved, LstmForwardResult):
        raise LstmInvalidArgumentError(
            f"{fn}: saved must be the forward's saved activations (an LstmSaved), got the "
            f"whole LstmForwardResult: pass saved=fwd.saved",
            "saved",
        )
    if not (isinstance(saved, (list, tuple)) and len(saved) in (7, 8)):
        got = _type_name(saved)
        if isinstance(saved, (list, tuple)):
            got = f"a {type(saved).__name__} of length {len(saved)}"
        raise LstmInvalidArgumentError(
            f"{fn}: saved must be an LstmSaved (i, g, f, o, h, c, tanhc, dropout_masks) or its "
            f"first 7 lists, got {got}",
            "saved",
        )
    given = [n for n, v in zip(SAVED_NAMES, lists, strict=True) if v is not None]
    if given:
        raise LstmInvalidArgumentError(
            f"{fn}: saved must come alone, not with {', '.join(given)}: pass saved=fwd.saved or "
            f"the seven lists i, g, f, o, h, c, tanhc, not both",
            "saved",
        )
    masks = saved[7] if len(saved) == 8 else None
    if masks is not None and dropout_masks is not None and dropout_masks is not masks:
        raise LstmInvalidArgumentError(
            f"{fn}: dropout_masks must be None when saved holds masks (saved.dropout_masks "
            f"are used), got a second set",
            "dropout_masks",
        )
    if dropout_masks is not None:
        return tuple(saved[:7]), dropout_masks, "dropout_masks"
    return tuple(saved[:7]), masks, "saved.dropout_masks"


# ---------------------------------------------------------------------------------------------


def check_backward(
    fn: str,
    input: Any,
    hx: Any,
    params: Any,
    dy: Any,
    dh: Any,
    dc: Any,
    saved: Sequence[Any],
    batch_sizes: Any,
    has_bias: Any,
    num_layers: Any,
    dropout: Any,
    train: Any,
    bidirectional: Any,
    batch_first: Any,
    output_mask: Any,
    dropout_masks: Any,
    masks_name: str = "dropout_masks",
) -> BackwardCall:
    """Validate a backward call and normalise it; raise before any computation.
    ``masks_name``: what the caller passed ``dropout_masks`` as, for the messages."""
    for name, value in (("input", input), ("hx", hx), ("params", params)):
        require(fn, name, value)
    for name, value in zip(SAVED_NAMES, saved, strict=True):
        require(fn, name, value)
    has_bias = check_bool(fn, "has_bias", has_bias)
    num_layers = check_num_layers(fn, num_layers)
    p = check_dropout(fn, dropout)
    train = check_bool(fn, "train", train)
    bidirectional = check_bool(fn, "bidirectional", bidirectional)
    batch_first = check_bool(fn, "batch_first", batch_first)
    need = check_output_mask(fn, output_mask)
    x = _check_input_array(fn, input)
    dtype = x.dtype
    num_dirs = 2 if bidirectional else 1
    k = num_layers * num_dirs

    n_params = num_params(num_layers, bidirectional, has_bias)
    plist = check_list(fn, "params", params, n_params, "L * D * (4 if has_bias else 2)")
    saved_lists = [check_list(fn, n, v, k, "L*D") for n, v in zip(SAVED_NAMES, saved, strict=True)]

    bs = None if batch_sizes is None else _check_batch_sizes(fn, batch_sizes)
    batch_hint = None
    if bs is not None:
        i0 = saved_lists[0][0]
        if not isinstance(i0, np.ndarray) or i0.ndim != 3:
            got = _fmt_shape(i0.shape) if isinstance(i0, np.ndarray) else _type_name(i0)
            raise LstmInvalidArgumentError(
                f"{fn}: i[0] must be a 3-D array [T, B, H] (B is read from it with "
                f"batch_sizes), got {got}",
                "i",
            )
        batch_hint = int(i0.shape[1])
    steps, batch, layout = _resolve_time_batch(fn, x, bs, batch_first, batch_hint)
    if bs is not None:
        _check_batch_sizes_range(fn, bs, batch)
    hx_first = hx[0] if isinstance(hx, (list, tuple)) and len(hx) > 0 else None
    hidden = _hidden_size(fn, plist, (hx_first, saved_lists[0][0]))
    dims = Dims(steps, batch, int(x.shape[-1]), hidden, num_layers, num_dirs, has_bias)

    checked_params = check_params(fn, plist, dims, dtype)
    h0, c0 = _check_state_list(fn, "hx", hx, dims, dtype, x, layout)
    out_shape = _layout_shape(layout, dims, dims.D * dims.H)
    out_legend = {"tbi": "T, B, D*H", "bti": "B, T, D*H", "flat": "T*B, D*H"}[layout.kind]
    dy_t = None
    if dy is not None:
        check_array(fn, "dy", dy, out_shape, out_legend, dtype)
        dy_t = layout.to_time_major(dy, steps, batch)
    state_shape = (dims.K, batch, hidden)
    dh_a = None if dh is None else check_array(fn, "dh", dh, state_shape, "L*D, B, H", dtype)
    dc_a = None if dc is None else check_array(fn, "dc", dc, state_shape, "L*D, B, H", dtype)
    act_shape = (steps, batch, hidden)
    saved_checked = tuple(
        [
            a
            if _valid(a, act_shape, dtype)
            else check_array(fn, f"{n}[{j}]", a, act_shape, "T, B, H", dtype, param=n)
            for j, a in enumerate(lst)
        ]
        for n, lst in zip(SAVED_NAMES, saved_lists, strict=True)
    )
    masks = _check_dropout_masks(fn, dropout_masks, dims, dtype, p > 0 and train, masks_name)
    return BackwardCall(
        dims=dims,
        dtype=dtype,
        layout=layout,
        x=layout.to_time_major(x, steps, batch),
        h0=h0,
        c0=c0,
        params=checked_params,
        dy=dy_t,
        dh=dh_a,
        dc=dc_a,
        saved=saved_checked,
        mask=None if bs is None else mask_from_batch_sizes(bs, batch),
        dropout_masks=masks,
        need=need,
    )


def _layout_shape(layout: Layout, dims: Dims, width: int) -> tuple[int, ...]:
    if layout.kind == "bti":
        return (dims.B, dims.T, width)
    if layout.kind == "flat":
        return (dims.T * dims.B, width)
    return (dims.T, dims.B, width)


def input_shape(layout: Layout, dims: Dims) -> tuple[int, ...]:
    """Shape of input (and dx) in the caller's layout."""
    return _layout_shape(layout, dims, dims.I)


def output_shape(layout: Layout, dims: Dims) -> tuple[int, ...]:
    """Shape of dy (and the forward's output) in the caller's layout."""
    return _layout_shape(layout, dims, dims.D * dims.H)


def check_forward(
    fn: str,
    input: Any,
    params: Any,
    hx: Any,
    batch_sizes: Any,
    has_bias: Any,
    num_layers: Any,
    dropout: Any,
    train: Any,
    bidirectional: Any,
    batch_first: Any,
    seed: Any,
    dropout_masks: Any = None,
) -> ForwardCall:
    """Validate a forward call and normalise it.

    ``dropout_masks`` (L-1 arrays [T, B, D*H], only where dropout applies) are the caller's own
    masks; None lets the API draw them from ``seed``.
    """
    require(fn, "input", input)
    require(fn, "params", params)
    has_bias = check_bool(fn, "has_bias", has_bias)
    num_layers = check_num_layers(fn, num_layers)
    p = check_dropout(fn, dropout)
    train = check_bool(fn, "train", train)
    bidirectional = check_bool(fn, "bidirectional", bidirectional)
    batch_first = check_bool(fn, "batch_first", batch_first)
    if seed is not None and (
        isinstance(seed, (bool, np.bool_)) or not isinstance(seed, numbers.Integral) or seed < 0
    ):
        raise LstmInvalidArgumentError(
            f"{fn}: seed must be None or an int >= 0, got {seed!r}", "seed"
        )
    x = _check_input_array(fn, input)
    dtype = x.dtype
    num_dirs = 2 if bidirectional else 1
    n_params = num_params(num_layers, bidirectional, has_bias)
    plist = check_list(fn, "params", params, n_params, "L * D * (4 if has_bias else 2)")
    hx_items = None if hx is None else check_list(fn, "hx", hx, 2, "h0, c0")
    bs = None if batch_sizes is None else _check_batch_sizes(fn, batch_sizes)
    batch_hint = None
    if bs is not None:
        if hx_items is not None:
            h0 = hx_items[0]
            if not isinstance(h0, np.ndarray) or h0.ndim != 3:
                got = _fmt_shape(h0.shape) if isinstance(h0, np.ndarray) else _type_name(h0)
                raise LstmInvalidArgumentError(
                    f"{fn}: hx[0] must be a 3-D array [L*D, B, H], got {got}", "hx"
                )
            batch_hint = int(h0.shape[1])
        elif bs.shape[0] == 0:
            batch_hint = 0
    steps, batch, layout = _resolve_time_batch(fn, x, bs, batch_first, batch_hint)
    if bs is not None:
        _check_batch_sizes_range(fn, bs, batch)
    hidden = _hidden_size(fn, plist, () if hx_items is None else (hx_items[0],))
    dims = Dims(steps, batch, int(x.shape[-1]), hidden, num_layers, num_dirs, has_bias)
    checked_params = check_params(fn, plist, dims, dtype)
    h0 = c0 = None
    if hx_items is not None:
        h0, c0 = _check_state_list(fn, "hx", hx_items, dims, dtype, x, layout)
    masks = None
    if dropout_masks is not None:
        masks = _check_dropout_masks(fn, dropout_masks, dims, dtype, applies=p > 0 and train)
    return ForwardCall(
        dims=dims,
        dtype=dtype,
        layout=layout,
        x=layout.to_time_major(x, steps, batch),
        h0=h0,
        c0=c0,
        params=checked_params,
        mask=None if bs is None else mask_from_batch_sizes(bs, batch),
        dropout=p if train else 0.0,
        train=train,
        seed=None if seed is None else int(seed),
        dropout_masks=masks,
    )
