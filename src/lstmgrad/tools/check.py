"""Checking a device's aclnnLstmBackward results: the dump format, its writer and reader, and
the comparison behind ``lstmgrad check`` (docs/check.md).

A dump holds one backward call's inputs under their aclnn names, its flags and, optionally, the
outputs a device produced. :func:`check` recomputes the outputs with the float64 reference (on
float64 copies of the dump's values) and the fused engine (in the dump's dtype), and measures
the device's outputs against the reference under two rules: torch_npu's ``assertRtolEqual``
rule and a bound growing with each output's accumulation length.
"""

from __future__ import annotations

import math
import re
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..core.contract import LstmBackwardResult, check_backward
from ..core.errors import LstmArgumentError, torch_missing
from ..core.layout import num_params, param_name
from ..ops.api import lstm_backward
from ..ops.tensors import from_torch
from .metrics import BOUND_FACTOR, bound

SAVED = ("i", "g", "f", "o", "h", "c", "tanhc")
FLAGS = ("hasBias", "numLayers", "dropout", "train", "bidirectional", "batchFirst")
OUTPUTS = ("dxOut", "dhPrevOut", "dcPrevOut", "dparamsOut")
# Python argument name -> dump key (the aclnn name; dropout_masks has none in aclnn)
KEY_OF = {
    "batch_sizes": "batchSizesOptional", "has_bias": "hasBias", "num_layers": "numLayers",
    "batch_first": "batchFirst", "output_mask": "outputMask",
}  # fmt: skip
# assertRtolEqual: tolerated fraction and error (prec) and the denominator's floor, per dtype
RTOL_PREC = {"float16": (1e-3, 6e-8), "float32": (1e-4, 1e-9), "float64": (1e-4, 1e-9)}


class DumpError(ValueError):
    """A dump that cannot be checked: ``.key`` names the missing or ill-shaped key."""

    def __init__(self, message: str, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key


# --------------------------------------------------------------------------- writing a dump


def dump(
    path: str | Path,
    input: Any,
    hx: Sequence[Any],
    params: Sequence[Any],
    dy: Any,
    dh: Any,
    dc: Any,
    i: Sequence[Any],
    g: Sequence[Any],
    f: Sequence[Any],
    o: Sequence[Any],
    h: Sequence[Any],
    c: Sequence[Any],
    tanhc: Sequence[Any],
    batch_sizes: Any = None,
    *,
    has_bias: bool = True,
    num_layers: int = 1,
    dropout: float = 0.0,
    train: bool = True,
    bidirectional: bool = False,
    batch_first: bool = False,
    output_mask: Sequence[bool] | None = None,
    dropout_masks: Sequence[Any] | None = None,
    outputs: Sequence[Any] | None = None,
) -> Path:
    """Write one aclnnLstmBackward call, and the outputs a device produced for it, to a file.

    The arguments are :func:`lstmgrad.lstm_backward`'s (NumPy arrays or torch CPU tensors),
    validated by the same rules before anything is written. Keys are the aclnn names
    (docs/check.md#the-dump-format).

    Args:
        path: ``.npz`` (NumPy) or ``.pt`` (``torch.save``, needs PyTorch).
        input, hx, params, dy, dh, dc, i, g, f, o, h, c, tanhc, batch_sizes: as in
            :func:`lstmgrad.lstm_backward`.
        has_bias, num_layers, dropout, train, bidirectional, batch_first, output_mask,
            dropout_masks: as in :func:`lstmgrad.lstm_backward`.
        outputs: the device's ``(dx, dh_prev, dc_prev, dparams)`` (an ``LstmBackwardResult``
            or a 4-sequence; an entry may be None), or None to write the inputs only.

    Returns:
        The path written.

    Raises:
        LstmArgumentError: an argument breaks the contract (named as in lstm_backward).
        ValueError: ``path`` has another suffix, or ``outputs`` is not 4 entries.
        ModuleNotFoundError: a ``.pt`` path without PyTorch.
    """
    fn = "lstmgrad.dump"
    path = Path(path)
    if path.suffix not in (".npz", ".pt"):
        raise ValueError(f"{fn}: path must end in .npz or .pt, got {str(path)!r}")
    a, _ = from_torch(fn, {
        "input": input, "hx": hx, "params": params, "dy": dy, "dh": dh, "dc": dc, "i": i,
        "g": g, "f": f, "o": o, "h": h, "c": c, "tanhc": tanhc, "batch_sizes": batch_sizes,
        "dropout_masks": dropout_masks,
    })  # fmt: skip
    call = check_backward(
        fn, a["input"], a["hx"], a["params"], a["dy"], a["dh"], a["dc"],
        tuple(a[n] for n in SAVED), a["batch_sizes"], has_bias, num_layers, dropout, train,
        bidirectional, batch_first, output_mask, a["dropout_masks"],
    )  # fmt: skip
    keys: dict[str, Any] = {"input": a["input"]}
    for name in ("hx", "params", *SAVED):
        keys.update({f"{name}.{k}": v for k, v in enumerate(a[name])})
    for name in ("dy", "dh", "dc"):
        if a[name] is not None:
            keys[name] = a[name]
    if call.mask is not None:
        keys["batchSizesOptional"] = np.asarray(a["batch_sizes"], dtype=np.int64)
    if call.dropout_masks:
        keys.update({f"dropout_masks.{k}": v for k, v in enumerate(call.dropout_masks)})
    flags = (has_bias, num_layers, dropout, train, bidirectional, batch_first)
    keys.update({k: np.asarray(v) for k, v in zip(FLAGS, flags, strict=True)})
    keys["outputMask"] = np.asarray(call.need, dtype=bool)
    if outputs is not None:
        if len(outputs) != 4:
            raise ValueError(f"{fn}: outputs must be (dx, dh_prev, dc_prev, dparams), got "
                             f"{len(outputs)} entries")  # fmt: skip
        out, _ = from_torch(fn, dict(zip(OUTPUTS, outputs, strict=True)))
        for name in OUTPUTS[:3]:
            if out[name] is not None:
                keys[name] = out[name]
        for k, v in enumerate(out["dparamsOut"] or ()):
            keys[f"dparamsOut.{k}"] = v
    keys = {k: np.asarray(v, order="C") for k, v in keys.items()}
    if path.suffix == ".pt":
        torch = _torch("lstmgrad.dump to a .pt file")
        torch.save({k: torch.from_numpy(v) for k, v in keys.items()}, path)
    else:
        with open(path, "wb") as fh:  # np.savez would append .npz to any other name
            np.savez(fh, **keys)
    return path


def _torch(feature: str) -> Any:
    try:
        import torch
    except ImportError as exc:
        raise torch_missing(feature) from exc
    return torch


# --------------------------------------------------------------------------- reading a dump


@dataclass
class Dump:
    """A dump read back: ``args`` and ``kwargs`` of lstm_backward, the device's ``outputs``
    (dump keys dxOut, dhPrevOut, dcPrevOut, dparamsOut; absent ones left out) and the keys it
    holds that the format does not know (ignored)."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    outputs: dict[str, Any]
    ignored: list[str] = field(default_factory=list)


def torch_file_problem(path: Path) -> str | None:
    """Why a file is not one that ``torch.load`` may be given, or None.

    torch.save writes a zip archive of uncompressed records, and torch.load allocates each
    record at the size the archive declares: an archive whose records are compressed, or
    declare more bytes than the file holds, could make it allocate far more than the file's
    size, so it is refused before torch sees it (as is the legacy format, which is not a zip).
    """
    try:
        with zipfile.ZipFile(path) as z:
            records = z.infolist()
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as exc:
        return f"not a torch.save file (not a zip archive: {one_line(exc)})"
    if any(r.compress_type != zipfile.ZIP_STORED for r in records):
        return "not a torch.save file (its zip archive holds compressed records)"
    if sum(r.file_size for r in records) > path.stat().st_size:
        return "not a torch.save file (its records declare more bytes than the file holds)"
    return None


def torch_load_problem(exc: BaseException) -> str:
    """One line saying why ``torch.load(..., weights_only=True)`` refused a file (torch's own
    message is several paragraphs, and suggests loading without weights_only)."""
    text = str(exc)
    if "Weights only load failed" in text or "WeightsUnpickler" in text:
        found = re.search(r"GLOBAL ([\w.]+)", text)
        what = f" ({found.group(1)})" if found else ""
        return (f"it holds Python objects besides tensors{what}, which lstmgrad never "
                "unpickles (torch.load with weights_only=True refused them)")  # fmt: skip
    return one_line(exc)


def one_line(exc: BaseException, limit: int = 200) -> str:
    """An exception's message as one line of at most ``limit`` characters."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _read_raw(path: Path) -> dict[str, np.ndarray]:
    if not path.is_file():
        raise DumpError(f"no such dump file: {path}")
    if path.suffix == ".pt":
        torch = _torch("lstmgrad check of a .pt dump")
        problem = torch_file_problem(path)
        if problem is not None:
            raise DumpError(f"{path}: {problem}")
        try:
            raw = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:
            raise DumpError(f"{path}: not a lstmgrad.dump file: {torch_load_problem(exc)}") from exc
        if not isinstance(raw, dict):
            raise DumpError(f"{path}: expected a dict of tensors, got {type(raw).__name__}")
        out = {}
        for k, v in raw.items():
            if isinstance(v, torch.Tensor):
                try:
                    out[str(k)] = v.detach().cpu().numpy()
                except (TypeError, RuntimeError) as exc:
                    raise DumpError(f"key {str(k)!r}: a tensor NumPy cannot hold ({one_line(exc)})",
                                    str(k)) from exc  # fmt: skip
            elif isinstance(v, (bool, int, float)):
                out[str(k)] = np.asarray(v)
            else:
                raise DumpError(f"key {str(k)!r} must be a tensor or a number, got "
                                f"{type(v).__name__}", str(k))  # fmt: skip
        return out
    with open(path, "rb") as fh:
        magic = fh.read(4)
    if magic != b"PK\x03\x04":  # NumPy's .npz is a zip archive
        raise DumpError(f"{path}: not a .npz archive (no zip header; lstmgrad.dump writes one "
                        "with numpy.savez)")  # fmt: skip
    try:
        with np.load(path, allow_pickle=False) as z:
            raw = {k: z[k] for k in z.files}
    except Exception as exc:
        raise DumpError(f"{path}: not a readable .npz file: {one_line(exc)}") from exc
    for k, v in raw.items():
        if v.dtype.kind not in "biuf":
            raise DumpError(f"key {k!r} must hold numbers, got dtype {v.dtype}", k)
    return raw


def _scalar(raw: dict[str, np.ndarray], key: str, kind: type, default: Any = None) -> Any:
    if key not in raw:
        if default is not None:
            return default
        raise DumpError(f"missing key {key!r} (a {kind.__name__} flag of the call)", key)
    v = raw[key]
    if v.shape != ():
        raise DumpError(f"key {key!r} must be a scalar, got shape {list(v.shape)}", key)
    item = v.item()
    if kind is int and not (isinstance(item, int) or float(item).is_integer()):
        raise DumpError(f"key {key!r} must be an integer, got {item!r}", key)
    if kind is float and not math.isfinite(item):
        raise DumpError(f"key {key!r} must be a finite number, got {item!r}", key)
    return kind(item)


def _listed(raw: dict[str, np.ndarray], name: str, n: int, what: str) -> list[np.ndarray]:
    """``name.0`` .. ``name.{n-1}``, or one stacked array ``name`` of n entries."""
    if f"{name}.0" not in raw and name in raw:
        stacked = raw[name]
        if stacked.ndim < 1 or stacked.shape[0] != n:
            raise DumpError(f"key {name!r}: expected {n} stacked {what} along axis 0, got "
                            f"shape {list(stacked.shape)}", name)  # fmt: skip
        return list(stacked)
    for k in range(n):
        if f"{name}.{k}" not in raw:
            raise DumpError(f"missing key '{name}.{k}' ({what}, entry {k} of {n})", f"{name}.{k}")
    return [raw[f"{name}.{k}"] for k in range(n)]


def load_dump(path: str | Path) -> Dump:
    """Read a dump written by :func:`dump` (or by a device-side script following
    docs/check.md#the-dump-format).

    Raises:
        DumpError: the file is unreadable, a key is missing or is not a scalar where a flag is
            expected (shapes are checked when the call is recomputed, by :func:`check`).
    """
    path = Path(path)
    raw = _read_raw(path)
    has_bias, layers = _scalar(raw, "hasBias", bool), _scalar(raw, "numLayers", int)
    bidirectional = _scalar(raw, "bidirectional", bool)
    kwargs: dict[str, Any] = {
        "has_bias": has_bias, "num_layers": layers, "dropout": _scalar(raw, "dropout", float),
        "train": _scalar(raw, "train", bool), "bidirectional": bidirectional,
        "batch_first": _scalar(raw, "batchFirst", bool),
    }  # fmt: skip
    known = {"input", "dy", "dh", "dc", "batchSizesOptional", "outputMask", *FLAGS, *OUTPUTS[:3]}
    if "outputMask" in raw:
        mask = raw["outputMask"]
        if mask.shape != (4,):
            raise DumpError(f"key 'outputMask' must hold 4 booleans, got shape {list(mask.shape)}",
                            "outputMask")  # fmt: skip
        kwargs["output_mask"] = [bool(v) for v in mask]
    if "input" not in raw:
        raise DumpError("missing key 'input' (the forward's input)", "input")
    k_count = max(layers, 0) * (2 if bidirectional else 1)
    n_params = num_params(max(layers, 0), bidirectional, has_bias)
    lists = {
        "hx": _listed(raw, "hx", 2, "h0 and c0, [L*D, B, H]"),
        "params": _listed(raw, "params", n_params, "params in _flat_weights order"),
    }
    for name in SAVED:
        lists[name] = _listed(raw, name, k_count, f"saved {name}, [T, B, H] per (layer, dir)")
    masks = sorted(k for k in raw if k.startswith("dropout_masks"))
    if masks:
        kwargs["dropout_masks"] = _listed(raw, "dropout_masks", max(layers - 1, 0),
                                          "dropout masks, [T, B, D*H] per layer above the first")  # fmt: skip
    args = (
        raw["input"], lists["hx"], lists["params"], raw.get("dy"), raw.get("dh"), raw.get("dc"),
        *(lists[n] for n in SAVED), raw.get("batchSizesOptional"),
    )  # fmt: skip
    outputs: dict[str, Any] = {k: raw[k] for k in OUTPUTS[:3] if k in raw}
    if any(k.startswith("dparamsOut") for k in raw):
        outputs["dparamsOut"] = _listed(raw, "dparamsOut", n_params, "parameter gradients")
    listed = ("hx", "params", *SAVED, "dropout_masks", "dparamsOut")
    ignored = [
        k for k in raw
        if k not in known and not any(k == n or k.startswith(n + ".") for n in listed)
    ]  # fmt: skip
    return Dump(args, kwargs, outputs, sorted(ignored))


# --------------------------------------------------------------------------- the comparison


@dataclass
class OutputReport:
    """One output tensor compared: errors against the float64 reference, both rules' verdicts,
    and the worst elements with their locations."""

    key: str  # dump key, e.g. "dxOut" or "dparamsOut.1"
    name: str  # what it is, e.g. "dx" or "weight_hh_l0"
    size: int
    accumulation: int  # K of the bound
    max_abs: float
    max_rel: float
    fused_max_abs: float  # lstmgrad's fused engine against the same reference
    rtol_fraction: float  # assertRtolEqual: fraction of elements off under both criteria
    rtol_prec: float
    rtol_ok: bool
    bound_fraction: float  # elements beyond the bound / size
    bound_ok: bool
    worst: list[tuple[float, float, str]]  # (abs error, error / bound, location)

    def ok(self, rule: str = "bound") -> bool:
        """The verdict under ``rule``: "bound", "rtol" or "both"."""
        return {"bound": self.bound_ok, "rtol": self.rtol_ok}.get(
            rule, self.bound_ok and self.rtol_ok
        )


@dataclass
class CheckReport:
    """Everything ``lstmgrad check`` prints."""

    dtype: str
    dims: dict[str, int]
    outputs: list[OutputReport]
    ignored: list[str]

    def ok(self, rule: str = "bound") -> bool:
        """Every output passes ``rule`` ("bound", "rtol" or "both")."""
        return all(r.ok(rule) for r in self.outputs)


def rtol_rule(device: np.ndarray, expected: np.ndarray, dtype: str) -> tuple[float, bool, float]:
    """torch_npu's ``assertRtolEqual`` rule (docs/check.md#the-two-rules).

    Returns:
        (fraction, passed, prec): fraction = min(#abs-off, #rel-off) / size.
    """
    prec, floor = RTOL_PREC[dtype]
    x, y = device.astype(np.float64), expected.astype(np.float64)
    if not np.array_equal(np.isnan(x), np.isnan(y)):
        return 1.0, False, prec
    err = np.abs(np.where(np.isnan(x), 0.0, y - x))
    rel = err / (np.maximum(np.abs(x), np.abs(y)) + floor)
    n_off = min(int(np.count_nonzero(err > prec)), int(np.count_nonzero(rel > prec)))
    size = max(x.size, 1)
    return n_off / size, not n_off > x.size * prec, prec


def _locate(key: str, index: tuple[int, ...], meta: dict[str, Any]) -> str:
    """Where an element of an output sits: (layer, direction, step, batch row) and column."""
    d = meta["D"]
    if key == "dxOut":
        t, b, column = index
        dirs = "both directions summed" if d == 2 else "direction 0"
        return f"layer 0, {dirs}, step {t}, batch row {b}, input column {column}"
    if key in ("dhPrevOut", "dcPrevOut"):
        k, b, unit = index
        return (f"layer {k // d}, direction {k % d}, initial state, batch row {b}, "
                f"hidden unit {unit}")  # fmt: skip
    p = int(key.split(".")[1])
    name = param_name(p, d, meta["has_bias"])
    h = meta["H"]
    row = index[0]
    gate = "ifgo"[row // h]
    col = f", column {index[1]}" if len(index) > 1 else ""
    group = p // (4 if meta["has_bias"] else 2)
    return (f"layer {group // d}, direction {group % d}, {name} gate {gate} unit {row % h}"
            f"{col} (summed over steps and batch rows)")  # fmt: skip


def _compare(
    key: str, name: str, device: np.ndarray, ref: np.ndarray, fused: np.ndarray, dtype: str,
    accumulation: int, factor: float, meta: dict[str, Any], top: int,
) -> OutputReport:  # fmt: skip
    dev = device.astype(np.float64)
    err = np.abs(dev - ref)
    err = np.where(np.isnan(err), np.inf, err)  # a NaN is as far off as it gets
    with np.errstate(over="ignore"):  # an error where the reference is 0: inf relative
        rel = err / np.maximum(np.abs(ref), np.finfo(np.float64).tiny)
    tol = bound(ref, dtype, accumulation, factor)
    beyond = err > tol
    frac, rtol_ok, prec = rtol_rule(device, ref.astype(dtype), dtype)
    ratio = err / np.maximum(tol, np.finfo(np.float64).tiny)
    order: Any = np.argsort(ratio, axis=None)[::-1][:top] if err.size else []
    worst = []
    for flat in order:
        idx = tuple(int(v) for v in np.unravel_index(int(flat), err.shape))
        if err[idx] > 0:
            worst.append((float(err[idx]), float(ratio[idx]), _locate(key, idx, meta)))
    return OutputReport(
        key=key, name=name, size=int(err.size), accumulation=accumulation,
        max_abs=float(err.max(initial=0.0)), max_rel=float(rel.max(initial=0.0)),
        fused_max_abs=float(np.abs(fused.astype(np.float64) - ref).max(initial=0.0)),
        rtol_fraction=frac, rtol_prec=prec, rtol_ok=rtol_ok,
        bound_fraction=float(np.count_nonzero(beyond)) / max(err.size, 1),
        bound_ok=not beyond.any(), worst=worst,
    )  # fmt: skip


def _bad_call(exc: LstmArgumentError) -> DumpError:
    key = KEY_OF.get(exc.param or "", exc.param)
    return DumpError(f"key {key!r}: {exc}", key)


def _time_major(a: np.ndarray, kind: str, steps: int, batch: int) -> np.ndarray:
    if kind == "bti":
        return a.transpose(1, 0, 2)
    if kind == "flat":
        return a.reshape(steps, batch, a.shape[-1])
    return a


def check(path: str | Path, factor: float = BOUND_FACTOR, top: int = 3) -> CheckReport:
    """Recompute a dump's outputs and compare the device's against them.

    Args:
        path: the dump (.npz or .pt).
        factor: c of the bound c * eps * sqrt(K) * (|ref| + rms(ref)).
        top: how many of the worst elements to locate per output.

    Returns:
        The report; ``report.ok`` is False on a mismatch.

    Raises:
        DumpError: a missing or ill-shaped key, no device outputs, or an output of the wrong
            shape or dtype (the message names the key).
    """
    d = load_dump(path)
    try:
        fused: Any = lstm_backward(*d.args, **d.kwargs)
    except LstmArgumentError as exc:
        raise _bad_call(exc) from exc
    call = check_backward(
        "lstmgrad check", d.args[0], d.args[1], d.args[2], d.args[3], d.args[4], d.args[5],
        d.args[6:13], d.args[13], d.kwargs["has_bias"], d.kwargs["num_layers"],
        d.kwargs["dropout"], d.kwargs["train"], d.kwargs["bidirectional"],
        d.kwargs["batch_first"], d.kwargs.get("output_mask"), d.kwargs.get("dropout_masks"),
    )  # fmt: skip
    dtype = str(call.dtype)
    if not d.outputs:
        raise DumpError(f"{path}: no device outputs (keys {', '.join(OUTPUTS)}): nothing to "
                        "check", "dxOut")  # fmt: skip
    ref: Any = _reference(d)
    dims = call.dims
    meta: dict[str, Any] = {"D": dims.D, "H": dims.H, "has_bias": dims.has_bias}
    rows = int(call.mask.sum()) if call.mask is not None else dims.T * dims.B
    k_of = {"dxOut": dims.D * dims.G, "dhPrevOut": dims.G, "dcPrevOut": dims.G}
    reports = []
    for j, (key, fused_v, ref_v) in enumerate(zip(OUTPUTS[:3], fused[:3], ref[:3], strict=True)):
        if not call.need[j]:
            continue
        dev = _output(d, key, fused_v, call.dtype)
        if key == "dxOut":
            fused_v, ref_v, dev = (_time_major(a, call.layout.kind, dims.T, dims.B)
                                   for a in (fused_v, ref_v, dev))  # fmt: skip
        name = key[:-3].replace("Prev", "_prev").lower()
        reports.append(_compare(key, name, dev, ref_v, fused_v, dtype, k_of[key], factor,
                                meta, top))  # fmt: skip
    if call.need[3]:
        devs = _output(d, "dparamsOut", fused.dparams, call.dtype)
        for p, (dev, fused_v, ref_v) in enumerate(zip(devs, fused.dparams, ref.dparams,
                                                      strict=True)):  # fmt: skip
            name = param_name(p, dims.D, dims.has_bias)
            reports.append(_compare(f"dparamsOut.{p}", name, dev, ref_v, fused_v, dtype, rows,
                                    factor, meta, top))  # fmt: skip
    shape = {"T": dims.T, "B": dims.B, "I": dims.I, "H": dims.H, "L": dims.L, "D": dims.D}
    return CheckReport(dtype, shape, reports, d.ignored)


def to_float64(v: Any) -> Any:
    """A float64 copy of a floating-point array, or of each in a list; anything else as is."""
    if isinstance(v, list):
        return [to_float64(e) for e in v]
    if isinstance(v, np.ndarray) and v.dtype.kind == "f":
        return v.astype(np.float64)
    return v


def _reference(d: Dump) -> LstmBackwardResult:
    """The float64 reference on float64 copies of the dump's floating-point values."""
    kwargs = {k: to_float64(v) for k, v in d.kwargs.items()}
    return lstm_backward(*(to_float64(a) for a in d.args), **kwargs, impl="reference")


def _output(d: Dump, key: str, expected: Any, dtype: np.dtype) -> Any:
    """The device's output under ``key``, checked against the recomputed one's shape."""
    if key not in d.outputs:
        raise DumpError(f"missing key {key!r}: outputMask asks for it (write outputMask with "
                        "False for an output the device did not produce)", key)  # fmt: skip
    got = d.outputs[key]
    pairs = [(key, got, expected)] if key != "dparamsOut" else [
        (f"dparamsOut.{p}", g, e) for p, (g, e) in enumerate(zip(got, expected, strict=True))
    ]  # fmt: skip
    for k, g, e in pairs:
        if g.shape != e.shape:
            raise DumpError(f"key {k!r} must have shape {list(e.shape)}, got {list(g.shape)}", k)
        if g.dtype != dtype:
            raise DumpError(f"key {k!r} must have the input's dtype {dtype}, got {g.dtype}", k)
    return got
