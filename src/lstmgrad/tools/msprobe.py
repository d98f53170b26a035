"""Reading what Ascend's msProbe dumps, and finding the LSTM calls in it (docs/check.md).

Two routes lead to a :class:`lstmgrad.tools.golden.Case`:

- an API / module dump (task "tensor" or "statistics"): ``step*/rank*/dump.json`` with its
  ``dump_tensor_data/`` folder. Every ``VF.lstm``, ``Torch.lstm`` and ``Aten.lstm`` forward
  (dense or packed overload) and every ``Module.*.LSTM.forward.*`` becomes a case, with its
  ``.backward`` entry and the module's ``parameters_grad`` where present; ``NPU.npu_lstm`` is
  listed and skipped (its argument layout is not known);
- a kernel-level dump turned into ``.npy`` files by ``msprobe parse -t npy``: one file per
  argument of aclnnLstmBackward or aclnnLSTM, in the kernel's order.

Tensor files are read on the CPU with ``torch.load(..., weights_only=True)`` (``.pt``) or
``numpy.load`` (``.npy``, older dumps); nothing in a dump is executed. A dump is untrusted input
(docs/check.md#what-a-dump-can-make-the-checker-do): every file read lies inside the dump (a
``data_name`` that leads out of the tensor folder refuses the dump), and no size a dump declares
is allocated before the file holding the data is known to hold that much.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..core.errors import torch_missing
from ..core.layout import Dims, num_params, param_name
from .check import one_line, torch_file_problem, torch_load_problem
from .golden import SAVED, CallReport, Case, CaseError, Device, expected_params, judge
from .metrics import BOUND_FACTOR

API_FORWARD = re.compile(r"^(VF|Torch|Aten)\.lstm(\.[A-Za-z_]\w*)?\.(\d+)\.forward$")
MODULE_FORWARD = re.compile(r"^Module\.(.+)\.LSTM\.forward\.(\d+)$")
API_BACKWARD = re.compile(r"^(VF|Torch|Aten)\.lstm(\.[A-Za-z_]\w*)?\.(\d+)\.backward$")
MODULE_BACKWARD = re.compile(r"^Module\.(.+)\.LSTM\.backward\.(\d+)$")
PARAMETERS_GRAD = re.compile(r"^Module\.(.+)\.LSTM\.parameters_grad(\.\d+)?$")
NPU_LSTM = re.compile(r"^NPU\.npu_lstm\w*\.(\d+)\.forward$")
PARAM_NAME = re.compile(r"^(weight|bias)_(ih|hh|hr)_l(\d{1,4})(_reverse)?$")
NPU_LSTM_REASON = (
    "torch_npu's own LSTM op: its argument layout is not documented, so it is not recomputed "
    "(a torch.nn.LSTM in the model appears as a Module.*.LSTM entry and is checked)"
)
FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")
MAX_DEPTH = 32  # nesting of a dump.json value; msProbe's LSTM entries nest 4 levels
MAX_ELEMENTS = 2**34  # more than any tensor an NPU could have dumped (64 GiB in float32)
MAX_LAYERS = 1024
MAX_PADDED = 2**28  # elements of a packed input padded to [T, B, I] for the engines
ALLOW_OPTION = "--allow-dump-data-dir"


class DumpReadError(Exception):
    """A dump that cannot be read at all: no dump.json, or one that is not msProbe's JSON."""


class DumpRefused(Exception):
    """A dump that points outside itself: a ``data_name`` leading out of its tensor folder, a
    dump.json or tensor folder that links out of the dump, or a recorded ``dump_data_dir``
    elsewhere (followed only when allowed). Nothing of such a dump is judged."""


class Unavailable(Exception):
    """A tensor whose values cannot be had: ``.kind`` is "statistics" (task "statistics", no
    file), "missing" (the file is not there) or "unloadable"."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


class Skip(Exception):
    """A call that is an LSTM but cannot be recomputed (the message says why)."""


class Unreadable(Exception):
    """A call that could not be checked because something in the dump is missing or broken."""


# --------------------------------------------------------------------------- dump.json values


@dataclass
class TensorRef:
    """A tensor described in dump.json: its key, dtype, shape, statistics and file."""

    key: str
    dtype: str
    shape: tuple[int, ...]
    stats: dict[str, Any]
    path: Path | None  # the file data_name names, inside the tensor folder; None: no file
    requires_grad: bool | None = None

    def load(self) -> np.ndarray:
        """The values on the CPU (bfloat16 widened to float32), checked against dump.json.

        Raises:
            Unavailable: no file (statistics task), a missing file, or one that does not load.
        """
        if self.path is None:
            raise Unavailable(f"{self.key}: no tensor file (dump.json was written by task "
                              "'statistics'; a golden needs task 'tensor')", "statistics")  # fmt: skip
        path = self.path
        if not path.is_file():
            raise Unavailable(f"{self.key}: tensor file {path} is missing", "missing")
        arr = _read_npy(path) if path.suffix == ".npy" else _read_pt(path)
        if tuple(arr.shape) != self.shape:
            raise Unavailable(f"{self.key}: {path.name} holds shape {list(arr.shape)}, dump.json "
                              f"says {list(self.shape)}", "unloadable")  # fmt: skip
        if self.dtype in FLOAT_DTYPES and arr.dtype.kind != "f":
            raise Unavailable(f"{self.key}: {path.name} holds {arr.dtype}, dump.json says "
                              f"{self.dtype}", "unloadable")  # fmt: skip
        return arr


def _read_npy(path: Path) -> np.ndarray:
    """A .npy file's array; its header is read first, and the data only when the file holds
    as many bytes as the header declares (so a header cannot make numpy allocate more)."""
    fmt = np.lib.format
    try:
        with open(path, "rb") as fh:
            version = fmt.read_magic(fh)
            if version not in ((1, 0), (2, 0)):
                raise ValueError(f".npy format version {version[0]}.{version[1]}")
            read_header = (fmt.read_array_header_1_0 if version == (1, 0) else
                           fmt.read_array_header_2_0)  # fmt: skip
            shape, _, dtype = read_header(fh)
            if dtype.hasobject:
                raise ValueError("it holds Python objects (a pickle), which are never loaded")
            if dtype.kind not in "biuf":
                raise ValueError(f"dtype {dtype} is not numbers")
            declared = math.prod(shape) * dtype.itemsize
            held = path.stat().st_size - fh.tell()
            if held < declared:
                raise ValueError(f"its header declares {list(shape)} {dtype} ({declared} bytes), "
                                 f"the file holds {held}")  # fmt: skip
            fh.seek(0)
            return fmt.read_array(fh, allow_pickle=False)
    except Exception as exc:
        raise Unavailable(f"{path.name}: not a readable .npy file ({one_line(exc)})",
                          "unloadable") from exc  # fmt: skip


def _read_pt(path: Path) -> np.ndarray:
    try:
        import torch
    except ImportError as exc:
        raise Unavailable(str(torch_missing("reading msProbe's .pt tensor files")),
                          "unloadable") from exc  # fmt: skip
    problem = torch_file_problem(path)
    if problem is not None:
        raise Unavailable(f"{path.name}: {problem}", "unloadable")
    try:
        t = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        text = str(exc)
        if "torch_npu" in text:
            raise Unavailable(
                f"{path.name} holds a tensor saved on an Ascend NPU, which loads only where "
                "torch_npu is installed: run lstmgrad check there, or have the dump's tensors "
                "moved to the CPU before saving", "unloadable",
            ) from exc  # fmt: skip
        raise Unavailable(f"{path.name}: not a readable torch.save file "
                          f"({torch_load_problem(exc)})", "unloadable") from exc  # fmt: skip
    if not isinstance(t, torch.Tensor):
        raise Unavailable(f"{path.name}: holds a {type(t).__name__}, not a tensor", "unloadable")
    try:
        t = t.detach().cpu()
        arr = (t.float() if t.dtype == torch.bfloat16 else t).numpy()
    except (TypeError, RuntimeError) as exc:
        raise Unavailable(f"{path.name}: a {t.dtype} tensor, which NumPy cannot hold "
                          f"({one_line(exc)})", "unloadable") from exc  # fmt: skip
    if arr.dtype.kind not in "biuf":
        raise Unavailable(f"{path.name}: a {t.dtype} tensor, not real numbers", "unloadable")
    return arr


def _decode(node: Any, key: str, folder: Path, depth: int = 0) -> Any:
    """A dump.json value as Python: TensorRef, bool/int/float/str, list, dict or None.

    Raises:
        Unreadable: a tensor entry with a field of the wrong kind, or nesting beyond MAX_DEPTH.
        DumpRefused: a tensor's data_name leads out of the tensor folder ``folder`` (resolved).
    """
    if node is None:
        return None
    if depth > MAX_DEPTH:
        raise Unreadable(f"{_short_key(key)}: nested deeper than {MAX_DEPTH} levels (msProbe's "
                         "entries nest a few)")  # fmt: skip
    if isinstance(node, list):
        return [_decode(v, f"{key}.{i}", folder, depth + 1) for i, v in enumerate(node)]
    if not isinstance(node, dict):
        return node
    kind = node.get("type")
    if kind in ("torch.Tensor", "numpy.ndarray", "mindspore.Tensor"):
        return _tensor_ref(node, key, folder)
    if kind is not None and "value" in node or kind in _SCALAR_KINDS:
        value = node.get("value")
        if _deeper(value, MAX_DEPTH - depth):  # kept as it is: its nesting is bounded here
            raise Unreadable(f"{_short_key(key)}: field 'value' nested deeper than {MAX_DEPTH} "
                             "levels")  # fmt: skip
        return value
    return {k: _decode(v, f"{key}.{k}", folder, depth + 1) for k, v in node.items()}


_SCALAR_KINDS = ("bool", "int", "float", "str", "torch.dtype", "slice", "ellipsis")


def _deeper(v: Any, levels: int) -> bool:
    """Whether lists and objects nest in ``v`` deeper than ``levels``."""
    if not isinstance(v, (list, dict)):
        return False
    if levels <= 0:
        return True
    return any(_deeper(e, levels - 1) for e in (v.values() if isinstance(v, dict) else v))


def _short_key(key: str, limit: int = 120) -> str:
    return key if len(key) <= limit else key[: limit - 3] + "..."


def _tensor_ref(node: dict[str, Any], key: str, folder: Path) -> TensorRef:
    """A tensor entry of dump.json, its fields checked (each error names the field)."""
    dtype = node.get("dtype")
    if not isinstance(dtype, str):
        raise Unreadable(f"{key}: field 'dtype' must be a dtype name, got {_brief(dtype)}")
    shape = node.get("shape")
    if not (isinstance(shape, list) and len(shape) <= 64 and
            all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in shape)):  # fmt: skip
        raise Unreadable(f"{key}: field 'shape' must be a list of non-negative integers, got "
                         f"{_brief(shape)}")  # fmt: skip
    if math.prod(shape) > MAX_ELEMENTS:
        raise Unreadable(f"{key}: field 'shape' {shape} declares more than 2^34 elements, more "
                         "than any device tensor")  # fmt: skip
    name = node.get("data_name")
    if name is not None and not isinstance(name, str):
        raise Unreadable(f"{key}: field 'data_name' must be a file name, got {_brief(name)}")
    stats = {s: _number(node.get(s)) for s in ("Max", "Min", "Mean", "Norm")}
    rg = node.get("requires_grad")
    path = _tensor_path(folder, name, key) if name else None
    return TensorRef(key, dtype.replace("torch.", ""), tuple(shape), stats, path,
                     rg if isinstance(rg, bool) else None)  # fmt: skip


def _number(v: Any) -> float | None:
    """A recorded statistic as a float (None when it is not a number)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    try:
        return float(v)
    except OverflowError:  # an integer beyond float's range
        return math.inf if v > 0 else -math.inf


def _tensor_path(folder: Path, name: str, key: str) -> Path:
    """The file a data_name names: relative to the tensor folder ``folder`` (resolved), with no
    '..', and inside it once links are followed.

    Raises:
        DumpRefused: the name leads anywhere else.
    """
    where = f"{key}: field 'data_name' {_brief(name)}"
    if "\x00" in name:
        raise DumpRefused(f"{where} holds a NUL character")
    rel = Path(name)
    if rel.is_absolute():
        raise DumpRefused(f"{where} is an absolute path; a dump names its tensor files relative "
                          "to its tensor folder")  # fmt: skip
    if ".." in rel.parts:
        raise DumpRefused(f"{where} climbs out of the tensor folder with '..'")
    try:
        real = (folder / rel).resolve()
    except (OSError, RuntimeError, ValueError) as exc:
        raise DumpRefused(f"{where} cannot be resolved ({one_line(exc)})") from exc
    if not real.is_relative_to(folder):
        raise DumpRefused(f"{where} is a link to {real}, outside the tensor folder {folder}")
    return real


# --------------------------------------------------------------------------- finding dumps


def dump_root(path: str | Path) -> Path:
    """The folder a dump may read from: ``path`` itself, or the folder of the dump.json given,
    links resolved."""
    p = Path(path)
    return (p if p.is_dir() else p.parent).resolve()


def dump_files(path: str | Path) -> list[Path]:
    """Every dump.json a path stands for: the file itself, a rank or step folder, or the dump
    root (searched below; links to folders are not followed).

    Raises:
        DumpReadError: the path does not exist or holds no dump.json.
        DumpRefused: a dump.json below ``path`` is a link to a file outside it.
    """
    p = Path(path)
    if p.is_file():
        return [p]
    if not p.is_dir():
        raise DumpReadError(f"{p}: no such file or folder")
    found = [p / "dump.json"] if (p / "dump.json").is_file() else sorted(
        p.rglob("dump.json"), key=lambda f: _natural(str(f.relative_to(p))))  # fmt: skip
    if not found:
        raise DumpReadError(f"{p}: no dump.json in it or below it (msProbe writes "
                            "step{N}/rank{R}/dump.json under its dump_path)")  # fmt: skip
    root = dump_root(p)
    for f in found:
        real = f.resolve()
        if not real.is_relative_to(root):
            raise DumpRefused(f"{f} is a link to {real}, outside the dump {root}")
    return found


def _natural(text: str) -> list[Any]:
    return [int(s) if s.isdigit() else s for s in re.split(r"(\d+)", text)]


def read_dump_json(path: Path) -> dict[str, Any]:
    """dump.json's top level, checked to be msProbe's.

    Raises:
        DumpReadError: unreadable, not JSON, or without a "data" object.
    """
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except RecursionError as exc:
        raise DumpReadError(f"{path}: not readable as JSON (nested too deeply to parse): not "
                            "an msProbe dump.json") from exc  # fmt: skip
    except (OSError, UnicodeDecodeError, ValueError) as exc:  # JSONDecodeError is a ValueError
        raise DumpReadError(f"{path}: not readable as JSON ({one_line(exc)}): not an msProbe "
                            "dump.json") from exc  # fmt: skip
    if not isinstance(doc, dict) or not isinstance(doc.get("data"), dict):
        raise DumpReadError(f"{path}: not an msProbe dump.json (no \"data\" object at the top "
                            "level)")  # fmt: skip
    fw = doc.get("framework")
    if fw not in (None, "pytorch"):
        raise DumpReadError(f"{path}: framework {_brief(fw)}; lstmgrad check reads PyTorch dumps")
    return doc


def tensor_folder(dump_json: Path, doc: dict[str, Any], root: Path | None = None,
                  allow_outside: bool = False) -> Path:  # fmt: skip
    """Where the tensor files are, resolved: dump_tensor_data beside dump.json (the dump may
    have been copied from another machine, so its recorded dump_data_dir comes second).

    Args:
        dump_json: the file.
        doc: its contents.
        root: the dump's folder (default: dump.json's).
        allow_outside: follow a tensor folder that lies outside ``root``.

    Raises:
        DumpRefused: the folder lies outside ``root`` and ``allow_outside`` is False.
    """
    root = dump_json.parent.resolve() if root is None else root
    local = dump_json.parent / "dump_tensor_data"
    recorded = doc.get("dump_data_dir")
    if not local.is_dir() and isinstance(recorded, str) and recorded and Path(recorded).is_dir():
        real = Path(recorded).resolve()
        if not (real.is_relative_to(root) or allow_outside):
            raise DumpRefused(f"{dump_json}: no dump_tensor_data folder beside it, and the "
                              f"dump_data_dir it records, {_brief(recorded, 200)}, lies outside "
                              f"the dump {root}: give {ALLOW_OPTION} to read its tensor files "
                              "there")  # fmt: skip
        return real
    real = local.resolve()
    if not (real.is_relative_to(root) or allow_outside):
        raise DumpRefused(f"{local} is a link to {real}, outside the dump {root}: give "
                          f"{ALLOW_OPTION} to read its tensor files there")  # fmt: skip
    return real


# --------------------------------------------------------------------------- LSTM calls


@dataclass
class Found:
    """An LSTM call found in a dump.json: a case to judge, or the reason it is not checked."""

    name: str
    source: str
    kind: str  # "api dense", "api packed", "module", "npu_lstm", "backward only"
    case: Case | None = None
    skipped: str | None = None
    unreadable: str | None = None


def lstm_calls(dump_json: Path, *, no_dropout: bool = False, label: str = "",
               root: Path | None = None, allow_dump_data_dir: bool = False) -> Iterator[Found]:  # fmt: skip
    """Every LSTM call of one dump.json, in the order the dump lists them.

    Args:
        dump_json: the file.
        no_dropout: module calls ran without dropout between layers (Module entries do not
            record dropout or training mode).
        label: how the source is named in the report (default: the path).
        root: the dump's folder, resolved: tensor files are read inside it only (default:
            dump.json's folder).
        allow_dump_data_dir: read the tensor files from a folder outside ``root`` where the
            dump's tensor folder lies there (a recorded dump_data_dir, or a link).

    Raises:
        DumpReadError: the file is unreadable.
        DumpRefused: the dump points outside itself (see :class:`DumpRefused`).
    """
    doc = read_dump_json(dump_json)
    data: dict[str, Any] = doc["data"]
    folder = tensor_folder(dump_json, doc, root, allow_dump_data_dir)
    src = label or str(dump_json)
    module_calls: dict[str, int] = {}
    grads_of: dict[str, list[str]] = {}  # module path -> its parameters_grad entries
    for name in data:
        if m := MODULE_FORWARD.match(name):
            module_calls[m.group(1)] = module_calls.get(m.group(1), 0) + 1
        elif m := PARAMETERS_GRAD.match(name):
            grads_of.setdefault(m.group(1), []).append(name)
    forwards = set()
    for name, entry in data.items():
        if NPU_LSTM.match(name):
            yield Found(name, src, "npu_lstm", skipped=NPU_LSTM_REASON)
            continue
        api, mod = API_FORWARD.match(name), MODULE_FORWARD.match(name)
        if not (api or mod):
            continue
        forwards.add(name)
        try:
            if not isinstance(entry, dict):
                raise Unreadable(f"{name}: entry is {type(entry).__name__}, not an object")
            back = _backward_name(name)
            if api:
                yield _found(name, src, _api_case(name, entry, data.get(back), back, folder, src))
            else:
                assert mod is not None
                path, n = mod.group(1), mod.group(2)
                recorded = grads_of.get(path, [])
                grads_name = next((g for g in (f"Module.{path}.LSTM.parameters_grad.{n}",
                                               f"Module.{path}.LSTM.parameters_grad") if g in data),
                                  f"Module.{path}.LSTM.parameters_grad")  # fmt: skip
                grads = data.get(grads_name) if module_calls.get(path) == 1 else None
                case = _module_case(name, entry, data.get(back), back, grads, grads_name,
                                    folder, src, no_dropout)  # fmt: skip
                if module_calls.get(path, 0) > 1 and recorded:
                    case.notes.append(f"{recorded[0]}: the module ran {module_calls[path]} times, "
                                      "and its recorded parameter gradients accumulate over the "
                                      "calls: not judged per call")  # fmt: skip
                yield _found(name, src, case)
        except DumpRefused as exc:
            raise DumpRefused(f"{src}: {exc}") from None
        except Skip as exc:
            yield Found(name, src, "module" if mod else "api", skipped=str(exc))
        except (Unreadable, Unavailable) as exc:
            kind = getattr(exc, "kind", "")
            if kind == "statistics":
                yield Found(name, src, "module" if mod else "api", skipped=(
                    "statistics only: recomputing the call needs its inputs' values, which "
                    "only task 'tensor' dumps (its outputs' Max/Min/Mean/Norm alone cannot be "
                    "recomputed without them)"))  # fmt: skip
            else:
                yield Found(name, src, "module" if mod else "api", unreadable=str(exc))
    paired = {_backward_name(f) for f in forwards}
    for name in data:
        if (API_BACKWARD.match(name) or MODULE_BACKWARD.match(name)) and name not in paired:
            fwd = _forward_name(name)
            yield Found(name, src, "backward only", skipped=(
                f"its forward entry {fwd} is not in the dump, so the call's inputs are "
                "unknown (dump the forward too: scope or step settings may have left it "
                "out)"))  # fmt: skip


def _backward_name(forward: str) -> str:
    """``VF.lstm.0.forward`` -> ``VF.lstm.0.backward``; ``Module.p.LSTM.forward.0`` ->
    ``Module.p.LSTM.backward.0``."""
    if forward.endswith(".forward"):
        return forward[: -len("forward")] + "backward"
    return forward.replace(".LSTM.forward.", ".LSTM.backward.")


def _forward_name(backward: str) -> str:
    """The inverse of :func:`_backward_name`."""
    if backward.endswith(".backward"):
        return backward[: -len("backward")] + "forward"
    return backward.replace(".LSTM.backward.", ".LSTM.forward.")


def _found(name: str, src: str, case: Case) -> Found:
    return Found(name, src, case.kind, case)


def _flag(value: Any, kind: type, key: str) -> Any:
    ok = isinstance(value, bool) if kind is bool else (
        isinstance(value, kind) and not isinstance(value, bool) or
        (kind is float and isinstance(value, int) and not isinstance(value, bool)))  # fmt: skip
    if not ok:
        raise Unreadable(f"{key}: expected a {kind.__name__}, got {_brief(value)}")
    try:
        return kind(value)
    except OverflowError:  # an integer beyond float's range
        raise Unreadable(f"{key}: expected a {kind.__name__}, got {_brief(value)}") from None


def _describe(v: Any, limit: int = 300) -> str:
    text = _describe_all(v, 6)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _describe_all(v: Any, depth: int) -> str:
    if isinstance(v, TensorRef):
        return f"tensor {v.dtype} {list(v.shape)}"
    if isinstance(v, (list, dict)):
        if depth == 0:
            return "{...}" if isinstance(v, dict) else "[...]"
        items = list(v.items() if isinstance(v, dict) else enumerate(v))
        parts = [f"{k}: {_describe_all(e, depth - 1)}" if isinstance(v, dict) else
                 _describe_all(e, depth - 1) for k, e in items[:16]]  # fmt: skip
        inner = ", ".join(parts) + (", ..." if len(items) > 16 else "")
        return f"{{{inner}}}" if isinstance(v, dict) else f"[{inner}]"
    return _brief(v)


def _brief(v: Any, limit: int = 100) -> str:
    """A dump.json value as text: three levels deep, eight items a level, ``limit`` characters."""
    text = _render(v, 3)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _render(v: Any, depth: int) -> str:
    if isinstance(v, dict):
        if depth == 0:
            return "{...}"
        parts = [f"{k!r}: {_render(e, depth - 1)}" for k, e in list(v.items())[:8]]
        return "{" + ", ".join(parts) + (", ..." if len(v) > 8 else "") + "}"
    if isinstance(v, list):
        if depth == 0:
            return "[...]"
        parts = [_render(e, depth - 1) for e in v[:8]]
        return "[" + ", ".join(parts) + (", ..." if len(v) > 8 else "") + "]"
    return repr(v)


def _tensor(v: Any, key: str, what: str) -> TensorRef:
    if not isinstance(v, TensorRef):
        raise Unreadable(f"{key}: expected {what} (a tensor), got {_describe(v)}")
    return v


def _float_dtype(ref: TensorRef) -> str:
    if ref.dtype not in FLOAT_DTYPES:
        raise Skip(f"{ref.key} is {ref.dtype}; the operator takes float16, bfloat16, float32 or "
                   "float64")  # fmt: skip
    return ref.dtype


def _device_list(call: str, kind: str, values: list[Any], labels: list[str],
                 notes: list[str]) -> list[Device]:  # fmt: skip
    """Device tensors from a list of TensorRefs (a null entry is noted, not judged)."""
    out = []
    for i, (v, lab) in enumerate(zip(values, labels, strict=False)):
        key = v.key if isinstance(v, TensorRef) else f"{call}.{kind}.{i}"
        if v is None:
            notes.append(f"{key} ({lab}) is null in dump.json: not judged")
            continue
        out.append(_device(_tensor(v, key, lab), lab))
    return out


def _device(ref: TensorRef, label: str) -> Device:
    try:
        return Device(ref.key, label, ref.load(), ref.stats, None, ref.shape)
    except Unavailable as exc:
        problem = None if exc.kind == "statistics" else str(exc)
        return Device(ref.key, label, None, ref.stats, problem, ref.shape)


class _Packing:
    """PackedSequence rows <-> lstmgrad's padded time-major [T*B, *] rows.

    Raises:
        Unreadable: batch sizes that are not a PackedSequence's, or do not add up to the
            packed data's rows.
        Skip: padding would take more than MAX_PADDED elements.
    """

    def __init__(self, batch_sizes: np.ndarray, key: str, data: np.ndarray, data_key: str) -> None:
        if batch_sizes.dtype.kind not in "iu" or batch_sizes.ndim != 1 or batch_sizes.size == 0:
            raise Unreadable(f"{key}: batch_sizes must be a non-empty 1-D integer tensor, got "
                             f"{batch_sizes.dtype} {list(batch_sizes.shape)}")  # fmt: skip
        if data.ndim != 2:
            raise Unreadable(f"{data_key}: packed data must be 2-D [rows, I], got "
                             f"{list(data.shape)}")  # fmt: skip
        rows = data.shape[0]
        if (batch_sizes < 1).any() or (batch_sizes > rows).any():
            raise Unreadable(f"{key}: batch_sizes must be counts from 1 to {rows} (the packed "
                             f"data's rows), got {_brief(batch_sizes.tolist())}")  # fmt: skip
        bs = batch_sizes.astype(np.int64)
        if (np.diff(bs) > 0).any():
            raise Unreadable(f"{key}: batch_sizes must not increase (a PackedSequence's), got "
                             f"{_brief(bs.tolist())}")  # fmt: skip
        if int(bs.sum()) != rows:
            raise Unreadable(f"{key}: batch_sizes add up to {int(bs.sum())}, the packed data "
                             f"{data_key} has {rows} rows")  # fmt: skip
        if bs.size * int(bs[0]) * max(data.shape[1], 1) > MAX_PADDED:
            raise Skip(f"{data_key}: padded to [T {bs.size}, B {int(bs[0])}, I "
                       f"{data.shape[1]}] for the engines it would exceed 2^28 elements")  # fmt: skip
        self.bs, self.T, self.B = bs, int(bs.size), int(bs[0])
        self.offsets = np.concatenate([[0], np.cumsum(bs)[:-1]])
        self.rows = np.concatenate([t * self.B + np.arange(n) for t, n in enumerate(bs)])

    def pad(self, packed: np.ndarray) -> np.ndarray:
        out = np.zeros((self.T * self.B,) + packed.shape[1:], dtype=packed.dtype)
        out[self.rows] = packed
        return out

    def pack(self, padded: np.ndarray) -> np.ndarray:
        return padded[self.rows]


def _api_case(name: str, entry: dict[str, Any], back: Any, back_name: str, folder: Path,
              src: str) -> Case:  # fmt: skip
    args = _decode(entry.get("input_args"), f"{name}.input", folder)
    kwargs = _decode(entry.get("input_kwargs") or {}, f"{name}.kwargs", folder)
    out = _decode(entry.get("output"), f"{name}.output", folder)
    if not isinstance(args, list):
        raise Unreadable(f"{name}: field 'input_args' must be a list, got {_describe(args)}")
    if not isinstance(kwargs, dict):
        raise Unreadable(f"{name}: field 'input_kwargs' must be an object, got {_describe(kwargs)}")
    if kwargs:
        raise Unreadable(f"{name}: unexpected keyword arguments {_brief(sorted(kwargs))} "
                         "(torch.nn.LSTM passes every argument by position)")  # fmt: skip
    if len(args) != 9:
        raise Skip(f"input_args hold {_describe(args)}; expected the dense overload (input, "
                   "[h0, c0], params, has_biases, num_layers, dropout, train, bidirectional, "
                   "batch_first) or the packed one (data, batch_sizes, [h0, c0], params, "
                   "has_biases, num_layers, dropout, train, bidirectional)")  # fmt: skip
    packed = isinstance(args[1], TensorRef)
    if packed:
        x, bs_ref, hx, params, *flags = args
        batch_first = False
    else:
        x, hx, params, *flags, batch_first = args
        batch_first = _flag(batch_first, bool, f"{name}.input.8")
    first = 3 if not packed else 4
    has_bias, layers, dropout, train, bidir = (
        _flag(v, t, f"{name}.input.{first + i}")
        for i, (v, t) in enumerate(zip(flags, (bool, int, float, bool, bool), strict=True))
    )  # fmt: skip
    if not 1 <= layers <= MAX_LAYERS:
        raise Unreadable(f"{name}.input.{first + 1}: num_layers must be 1 to {MAX_LAYERS}, got "
                         f"{layers}")  # fmt: skip
    if not 0 <= dropout <= 1:
        raise Unreadable(f"{name}.input.{first + 2}: dropout must be 0 to 1, got {dropout}")
    x_ref = _tensor(x, f"{name}.input.0", "the input")
    dtype = _float_dtype(x_ref)
    hx_at = 2 if packed else 1
    if not (isinstance(hx, list) and len(hx) == 2):
        raise Unreadable(f"{name}.input.{hx_at}: expected [h0, c0], got {_describe(hx)}")
    n = num_params(layers, bidir, has_bias)
    if not (isinstance(params, list) and len(params) == n):
        raise Unreadable(f"{name}.input.{hx_at + 1}: expected {n} weights "
                         f"({', '.join(expected_params(layers, bidir, has_bias)[:4])}, ...), got "
                         f"{_describe(params)}")  # fmt: skip
    p_refs = [_tensor(p, f"{name}.input.{hx_at + 1}.{i}", "a weight") for i, p in enumerate(params)]
    h_refs = [_tensor(h, f"{name}.input.{hx_at}.{i}", "h0 / c0") for i, h in enumerate(hx)]
    packing = None
    xv = x_ref.load()
    if packed:
        bs_tensor = _tensor(bs_ref, f"{name}.input.1", "batch_sizes")
        packing = _Packing(bs_tensor.load(), bs_tensor.key, xv, x_ref.key)
        xv = packing.pad(xv)
    case = Case(
        name=name, source=src, dtype=dtype, x=xv, params=[p.load() for p in p_refs],
        hx=[h.load() for h in h_refs], batch_sizes=packing.bs if packing else None,
        has_bias=has_bias, num_layers=layers, bidirectional=bidir, batch_first=batch_first,
        keys={"input": x_ref.key, "params": f"{name}.input.{hx_at + 1}",
              "hx": f"{name}.input.{hx_at}", "batch_sizes": f"{name}.input.1"},
        kind="api packed" if packed else "api dense",
    )  # fmt: skip
    if packing is not None:
        _use_packing(case, packing)
    if train and dropout > 0 and layers > 1:
        case.upper_layers_unknown = (
            f"train with dropout {dropout:g} between layers: the dropout masks are not in the "
            "dump, so the layers above the first, y and the backward cannot be recomputed")  # fmt: skip
    outs = out if isinstance(out, list) else [out]
    case.forward = _device_list(name, "output", outs[:3], ["y", "h_n", "c_n"], case.notes)
    if back is not None:
        labels = {id(x): "dx", id(hx[0]): "dh0", id(hx[1]): "dc0"}
        labels.update({id(p): param_name(i, 2 if bidir else 1, has_bias)
                       for i, p in enumerate(params)})  # fmt: skip
        _backward(case, back, back_name, folder, args, outs[:3], labels,
                  {id(outs[i]): g for i, g in enumerate(("dy", "dh", "dc")) if i < len(outs)})  # fmt: skip
    return case


def _use_packing(case: Case, packing: _Packing) -> None:
    case.packed_offsets = packing.offsets
    flat = ("y", "dx")
    case.present = lambda label, a: packing.pack(a) if label in flat else a
    case.unpresent = lambda label, a: packing.pad(a) if label == "dy" else a


def _pairs(fwd: Any, grad: Any, key: str) -> Iterator[tuple[Any, TensorRef]]:
    """(forward tensor, its gradient) where the gradient structure mirrors the forward's; a
    null gradient stands for a whole subtree without one."""
    if grad is None:
        return
    if isinstance(fwd, TensorRef):
        if not isinstance(grad, TensorRef):
            raise Skip(f"{key} is {_describe(grad)} where the forward had {_describe(fwd)}")
        if grad.shape != fwd.shape:
            raise Skip(f"{key} has shape {list(grad.shape)}, the forward's tensor "
                       f"{list(fwd.shape)}")  # fmt: skip
        yield fwd, grad
    elif isinstance(fwd, list):
        if not isinstance(grad, list) or len(grad) > len(fwd):
            raise Skip(f"{key} is {_describe(grad)}, which does not mirror the forward's "
                       f"{_describe(fwd)}")  # fmt: skip
        for i, (f, g) in enumerate(zip(fwd, grad, strict=False)):
            yield from _pairs(f, g, f"{key}.{i}")
    elif isinstance(fwd, dict):
        if isinstance(grad, TensorRef) and isinstance(fwd.get("data"), TensorRef):
            yield from _pairs(fwd["data"], grad, key)  # a PackedSequence's gradient: its data's
            return
        if not isinstance(grad, dict):
            raise Skip(f"{key} is {_describe(grad)} where the forward had {_describe(fwd)}")
        for k, g in grad.items():
            yield from _pairs(fwd.get(k), g, f"{key}.{k}")
    elif isinstance(grad, TensorRef):
        raise Skip(f"{key} is a tensor where the forward had {fwd!r}")


def _leaves(v: Any) -> list[Any]:
    """The floating-point tensors of a nested forward value, depth first (None for a missing
    one): the ones a backward hook records gradients for."""
    if isinstance(v, list):
        return [leaf for e in v for leaf in _leaves(e)]
    if isinstance(v, dict):
        return [leaf for e in v.values() for leaf in _leaves(e)]
    if isinstance(v, TensorRef):  # a hook records only tensors that require grad
        return [v] if v.dtype in FLOAT_DTYPES and v.requires_grad is not False else []
    return [None] if v is None else []


def _grad_pairs(fwd: Any, grad: Any, key: str) -> list[tuple[Any, TensorRef]]:
    """Gradients matched to forward tensors: a structure mirroring the forward's, or a flat
    list in the order of the forward's tensors (what a module's backward hook records)."""
    try:
        return list(_pairs(fwd, grad, key))
    except Skip:
        flat = isinstance(grad, list) and all(g is None or isinstance(g, TensorRef) for g in grad)
        leaves = _leaves(fwd)
        if not flat or len(grad) > len(leaves):
            raise
        pairs = []
        for i, (f, g) in enumerate(zip(leaves, grad, strict=False)):
            if g is None:
                continue
            if f is None or g.shape != f.shape:
                raise Skip(f"{key}.{i} has shape {list(g.shape)}, where the forward's tensor "
                           f"{i} is {_describe(f)}") from None  # fmt: skip
            pairs.append((f, g))
        return pairs


def _backward(case: Case, back: Any, back_name: str, folder: Path, fwd_in: Any, fwd_out: Any,
              labels: dict[int, str], grads_of: dict[int, str]) -> None:  # fmt: skip
    """The device's gradients and the ones that flowed in, from a .backward entry."""
    if not isinstance(back, dict):
        case.notes.append(f"{back_name}: entry is not an object: backward not judged")
        return
    g_in = _decode(back.get("input"), f"{back_name}.input", folder)
    g_out = _decode(back.get("output"), f"{back_name}.output", folder)
    try:
        flowing = _grad_pairs(fwd_out, g_in, f"{back_name}.input")
        produced = _grad_pairs(fwd_in, g_out, f"{back_name}.output")
    except Skip as exc:
        case.notes.append(f"backward not judged: its layout is not the one expected ({exc}); "
                          "msProbe's backward entry of an LSTM is read as the gradients of the "
                          "forward's outputs (input) and of its inputs (output)")  # fmt: skip
        return
    grads: dict[str, np.ndarray | None] = {"dy": None, "dh": None, "dc": None}
    try:
        for f, g in flowing:
            if id(f) in grads_of:
                grads[grads_of[id(f)]] = case.unpresent(grads_of[id(f)], g.load())
    except Unavailable as exc:
        case.notes.append(f"backward not recomputed: {exc}")
        case.grads_in = None
    else:
        got = {grads_of[id(f)] for f, _ in flowing if id(f) in grads_of}
        zero = [n for n in ("dy", "dh", "dc") if n not in got]
        if zero:
            outs = ", ".join({"dy": "y", "dh": "h_n", "dc": "c_n"}[n] for n in zero)
            case.notes.append(f"{back_name}: no gradient recorded for {outs}: taken as zero, "
                              "as autograd does for an output the loss did not use")  # fmt: skip
        case.grads_in = grads
    for f, g in produced:
        label = labels.get(id(f))
        if label is not None:
            case.backward.append(_device(g, label))


def _module_case(name: str, entry: dict[str, Any], back: Any, back_name: str, grads: Any,
                 grads_name: str, folder: Path, src: str, no_dropout: bool) -> Case:  # fmt: skip
    args = _decode(entry.get("input_args"), f"{name}.input", folder)
    kwargs = _decode(entry.get("input_kwargs") or {}, f"{name}.kwargs", folder)
    out = _decode(entry.get("output"), f"{name}.output", folder)
    params = _decode(entry.get("parameters") or {}, f"{name}.parameters", folder)
    if not isinstance(kwargs, dict):
        raise Unreadable(f"{name}: field 'input_kwargs' must be an object, got {_describe(kwargs)}")
    if not isinstance(args, list) or not args:
        raise Unreadable(f"{name}: input_args hold {_describe(args)}; expected [input] or "
                         "[input, (h0, c0)]")  # fmt: skip
    hx = args[1] if len(args) > 1 else kwargs.get("hx")
    layers, bidir, has_bias, order = _module_config(name, params)
    inp = args[0]
    packed = isinstance(inp, dict)
    if packed and not (isinstance(inp.get("data"), TensorRef) and
                       isinstance(inp.get("batch_sizes"), TensorRef)):  # fmt: skip
        raise Unreadable(f"{name}.input.0: expected a tensor or a PackedSequence, got "
                         f"{_describe(inp)}")  # fmt: skip
    x_ref = _tensor(inp["data"] if packed else inp, f"{name}.input.0", "the input")
    dtype = _float_dtype(x_ref)
    outs = out if isinstance(out, list) else [out]
    y = outs[0] if outs else None
    states = outs[1] if len(outs) == 2 and isinstance(outs[1], list) else outs[1:3]
    states = list(states) + [None] * (2 - len(states))
    if hx is not None and not (isinstance(hx, list) and len(hx) == 2):
        raise Unreadable(f"{name}.input.1: expected (h0, c0), got {_describe(hx)}")
    batch_first = False
    packing = None
    if packed:
        bs_ref = inp["batch_sizes"]
        packing = _Packing(bs_ref.load(), bs_ref.key, x_ref.load(), x_ref.key)
        xv = packing.pad(x_ref.load())
    else:
        batch_first = _module_batch_first(name, x_ref, hx, states)
        xv = x_ref.load()
    sort = unsort = None
    if packing is not None and isinstance(inp.get("sorted_indices"), TensorRef):
        sort = _permutation(inp["sorted_indices"], packing.B)
        unsort = (_permutation(inp["unsorted_indices"], packing.B)
                  if isinstance(inp.get("unsorted_indices"), TensorRef) else np.argsort(sort))  # fmt: skip
    hv = None
    if hx is not None:
        hv = [_tensor(h, f"{name}.input.1.{i}", "h0 / c0").load() for i, h in enumerate(hx)]
        if sort is not None:
            for i, h in enumerate(hv):
                if h.ndim != 3 or h.shape[1] != sort.size:
                    raise Unreadable(f"{name}.input.1.{i}: expected [L*D, {sort.size}, H] (the "
                                     f"packed batch), got {list(h.shape)}")  # fmt: skip
            hv = [h[:, sort] for h in hv]  # the module hands the sorted batch to the kernel
    case = Case(
        name=name, source=src, dtype=dtype, x=xv,
        params=[_tensor(params[p], f"{name}.parameters.{p}", p).load() for p in order],
        hx=hv, batch_sizes=packing.bs if packing else None, has_bias=has_bias,
        num_layers=layers, bidirectional=bidir, batch_first=batch_first,
        keys={"input": x_ref.key, "params": f"{name}.parameters", "hx": f"{name}.input.1"},
        kind="module packed" if packed else "module",
    )  # fmt: skip
    if packing is not None:
        _use_packing(case, packing)
    if unsort is not None:
        base_present, base_unpresent = case.present, case.unpresent
        states_l = ("h_n", "c_n", "dh0", "dc0")
        case.present = lambda lab, a: a[:, unsort] if lab in states_l else base_present(lab, a)
        case.unpresent = lambda lab, a: (
            a[:, sort] if lab in ("dh", "dc") else base_unpresent(lab, a)
        )
    if layers > 1 and not no_dropout:
        case.dropout_unknown = True
        case.notes.append("a Module entry records neither the LSTM's dropout nor its training "
                          "mode: judged as without dropout; an output that differs in most of its "
                          "elements above layer 0, as dropout would make it, is left undecided "
                          "(give --no-dropout to judge it as a failure)")  # fmt: skip
    y_data = y.get("data") if isinstance(y, dict) else y
    case.forward = _device_list(name, "output", [y_data, *states], ["y", "h_n", "c_n"],
                                case.notes)  # fmt: skip
    fwd_in: list[Any] = [inp, hx]
    labels: dict[int, str] = {id(x_ref): "dx"}
    if isinstance(hx, list):
        labels.update({id(hx[0]): "dh0", id(hx[1]): "dc0"})
    fwd_out: list[Any] = [y, states]
    grads_of = {id(y_data): "dy", id(states[0]): "dh", id(states[1]): "dc"}
    if back is not None:
        _backward(case, back, back_name, folder, fwd_in, fwd_out, labels, grads_of)
    if isinstance(grads, dict):
        g = _decode(grads, grads_name, folder)
        for pname in order:
            v = g.get(pname)
            if isinstance(v, list) and len(v) == 1:
                v = v[0]  # msProbe writes each parameter's gradient as a one-tensor list
            if isinstance(v, TensorRef):
                case.backward.append(_device(v, pname))
            elif pname in g:
                case.notes.append(f"{grads_name}.{pname}: {_describe(v)} is not a gradient "
                                  "tensor: not judged")  # fmt: skip
        if case.grads_in is None and back is None:
            case.notes.append(f"{grads_name}: no backward entry gives the gradients that "
                              "flowed in: parameter gradients not judged")  # fmt: skip
    return case


def _permutation(ref: TensorRef, n: int) -> np.ndarray:
    """A PackedSequence's sorted_indices / unsorted_indices: a permutation of range(n)."""
    v = ref.load()
    if v.dtype.kind not in "iu" or v.shape != (n,) or not np.array_equal(np.sort(v), np.arange(n)):
        raise Unreadable(f"{ref.key}: expected a permutation of 0..{n - 1} (the packed batch), "
                         f"got {v.dtype} {list(v.shape)}")  # fmt: skip
    return v.astype(np.int64)


def _module_config(name: str, params: Any) -> tuple[int, bool, bool, list[str]]:
    """(num_layers, bidirectional, has_bias, names in _flat_weights order) from the parameter
    names a Module entry records."""
    if not isinstance(params, dict) or not params:
        raise Unreadable(f"{name}: no parameters recorded (msProbe records a module's "
                         "parameters by name; a golden needs them)")  # fmt: skip
    seen = {}
    for p in params:
        m = PARAM_NAME.match(p)
        if not m:
            raise Skip(f"{_short_key(f'{name}.parameters.{p}')}: not a torch.nn.LSTM parameter "
                       "name")  # fmt: skip
        if m.group(2) == "hr":
            raise Skip("proj_size > 0 (weight_hr_l* recorded): LSTMs with projections are "
                       "outside the operator")  # fmt: skip
        seen[p] = m
    layers = 1 + max(int(m.group(3)) for m in seen.values())
    if layers > MAX_LAYERS:
        raise Unreadable(f"{name}.parameters: layer {layers - 1} named; an LSTM of more than "
                         f"{MAX_LAYERS} layers is not read")  # fmt: skip
    bidir = any(m.group(4) for m in seen.values())
    has_bias = any(m.group(1) == "bias" for m in seen.values())
    order = expected_params(layers, bidir, has_bias)
    missing = [p for p in order if p not in params]
    if missing:
        more = f" and {len(missing) - 8} more" if len(missing) > 8 else ""
        raise Unreadable(f"{name}.parameters: missing {', '.join(missing[:8])}{more}")
    return layers, bidir, has_bias, order


def _module_batch_first(name: str, x: TensorRef, hx: Any, states: list[Any]) -> bool:
    """A module call's batch_first, told from the shapes (dump.json does not record it)."""
    if len(x.shape) != 3:
        raise Unreadable(f"{x.key}: expected a 3-D input, got shape {list(x.shape)} (an "
                         "unbatched 2-D input is not supported)")  # fmt: skip
    ref = next((s for s in [*(hx or []), *states] if isinstance(s, TensorRef)), None)
    if ref is None or len(ref.shape) != 3:
        raise Unreadable(f"{name}: no h0, h_n or c_n to tell the batch size from")
    b = ref.shape[1]
    if x.shape[0] == x.shape[1]:
        raise Skip(f"batch_first is not recorded for a module call and cannot be told from "
                   f"the input's shape {list(x.shape)} (T == B); a dump whose time and batch "
                   "sizes differ can be checked")  # fmt: skip
    if b == x.shape[1]:
        return False
    if b == x.shape[0]:
        return True
    raise Unreadable(f"{x.key}: shape {list(x.shape)} has no batch axis of size {b} (the "
                     "states' batch)")  # fmt: skip


# --------------------------------------------------------------------------- kernel-level .npy


def _kernel_files(folder: Path) -> dict[str, dict[str, dict[int, Path]]]:
    """{call prefix: {"input": {i: path}, "output": {i: path}}} of msprobe parse's files.

    Raises:
        DumpRefused: a file is a link to one outside ``folder``.
    """
    calls: dict[str, dict[str, dict[int, Path]]] = {}
    root = folder.resolve()
    for f in sorted(folder.glob("*.npy")):
        m = re.match(r"^(.*)\.(input|output)\.(\d{1,9})\.npy$", f.name)
        if m and not f.resolve().is_relative_to(root):
            raise DumpRefused(f"{f} is a link to {f.resolve()}, outside the dump {root}")
        if m:
            calls.setdefault(m.group(1), {"input": {}, "output": {}})[m.group(2)][
                int(m.group(3))
            ] = f
    return calls


def _ordered(files: dict[int, Path], prefix: str, kind: str) -> list[tuple[str, np.ndarray]]:
    n = len(files)
    if sorted(files) != list(range(n)):
        gaps = [g for g in range(n) if g not in files][:8]
        raise Unreadable(f"{prefix}: {kind} files are not numbered 0..{n - 1} (missing "
                         f"{', '.join(f'{kind}.{g}' for g in gaps)})")  # fmt: skip
    return [(files[i].name, _read_npy(files[i])) for i in range(n)]


@dataclass
class KernelConfig:
    """What a kernel-level dump does not record: the flags of the call (None: inferred from
    the shapes where they tell)."""

    num_layers: int | None = None
    bidirectional: bool | None = None
    has_bias: bool | None = None
    batch_first: bool = False


def _groups(weights: list[tuple[str, np.ndarray]], input_size: int, k_count: int | None,
            cfg: KernelConfig, prefix: str) -> tuple[int, bool, bool, int]:  # fmt: skip
    """(num_layers, bidirectional, has_bias, number of weight files) of a flat weight list."""
    if len(weights) < 2 or weights[0][1].ndim != 2:
        raise Unreadable(f"{prefix}: expected weight_ih [4H, I] after the input, got "
                         f"{[list(a.shape) for _, a in weights[:2]]}")  # fmt: skip
    has_bias = cfg.has_bias
    if has_bias is None:
        has_bias = len(weights) > 2 and weights[2][1].ndim == 1
    per = 4 if has_bias else 2
    options = []
    for layers in range(1, 65):
        for bidir in (False, True):
            if cfg.num_layers not in (None, layers) or cfg.bidirectional not in (None, bidir):
                continue
            kk = layers * (2 if bidir else 1)
            if k_count not in (None, kk) or kk * per > len(weights):
                continue
            dims = Dims(1, 1, input_size, weights[0][1].shape[0] // 4, layers, 2 if bidir else 1,
                        has_bias)  # fmt: skip
            if all(weights[p][1].shape == dims.param_shape(p) for p in range(kk * per)):
                options.append((layers, bidir))
    if not options:
        raise Unreadable(f"{prefix}: the weight files' shapes fit no LSTM configuration "
                         f"({[list(a.shape) for _, a in weights[:8]]}...); give --num-layers, "
                         "--bidirectional, --no-bias")  # fmt: skip
    if len(options) > 1:
        raise Unreadable(f"{prefix}: the weight shapes fit {len(options)} configurations "
                         f"({', '.join(f'L {lay} D {2 if b else 1}' for lay, b in options[:4])}): "
                         "give --num-layers and --bidirectional")  # fmt: skip
    layers, bidir = options[0]
    return layers, bidir, has_bias, layers * (2 if bidir else 1) * per


def _take_saved(files: list[tuple[str, np.ndarray]], k: int, prefix: str,
                what: str) -> tuple[dict[str, list[np.ndarray]], int]:  # fmt: skip
    """The seven saved lists i, g(j), f, o, h, c, tanhc: 7*k files [T, B, H], or 7 files
    [k, T, B, H] (stacked)."""
    if len(files) >= 7 * k and all(a.ndim == 3 for _, a in files[: 7 * k]):
        return {n: [a for _, a in files[j * k : (j + 1) * k]] for j, n in enumerate(SAVED)}, 7 * k
    if len(files) >= 7 and all(a.ndim == 4 and a.shape[0] == k for _, a in files[:7]):
        return {n: list(files[j][1]) for j, n in enumerate(SAVED)}, 7
    raise Unreadable(f"{prefix}: expected the saved {what} i, j, f, o, h, c, tanhc as {7 * k} "
                     f"files [T, B, H] or 7 files [{k}, T, B, H], got "
                     f"{[list(a.shape) for _, a in files[:8]]}")  # fmt: skip


def kernel_cases(folder: str | Path, kind: str, cfg: KernelConfig) -> Iterator[Found]:
    """The aclnnLstmBackward (``kind`` "backward") or aclnnLSTM ("forward") calls of a folder
    of ``msprobe parse -t npy`` files.

    Raises:
        DumpReadError: the folder does not exist or holds no ``*.input.N.npy`` file.
    """
    p = Path(folder)
    if not p.is_dir():
        raise DumpReadError(f"{p}: no such folder")
    calls = _kernel_files(p)
    if not calls:
        raise DumpReadError(f"{p}: no '<name>.input.<N>.npy' files (what msprobe parse -t npy "
                            "writes for a kernel-level dump)")  # fmt: skip
    for prefix, files in calls.items():
        try:
            ins = _ordered(files["input"], prefix, "input")
            outs = _ordered(files["output"], prefix, "output")
            build = _kernel_backward if kind == "backward" else _kernel_forward
            yield Found(prefix, str(p), f"aclnn {kind}", build(prefix, str(p), ins, outs, cfg))
        except (Unavailable, Unreadable) as exc:
            yield Found(prefix, str(p), f"aclnn {kind}", unreadable=str(exc))


def _dtype_of(a: np.ndarray, name: str) -> str:
    if a.dtype.name not in ("float16", "float32", "float64"):
        raise Unreadable(f"{name}: {a.dtype}; the operator takes float16, float32 or float64 "
                         "(.npy has no bfloat16)")  # fmt: skip
    return a.dtype.name


def _kernel_backward(prefix: str, src: str, ins: list[tuple[str, np.ndarray]],
                     outs: list[tuple[str, np.ndarray]], cfg: KernelConfig) -> Case:  # fmt: skip
    if len(ins) < 5:
        raise Unreadable(f"{prefix}: {len(ins)} input files; aclnnLstmBackward takes input, "
                         "h0, c0, params, dy, dh, dc and the seven saved lists")  # fmt: skip
    x, h0, c0 = ins[0][1], ins[1][1], ins[2][1]
    if h0.ndim != 3:
        raise Unreadable(f"{prefix}: {ins[1][0]} should be h0 [L*D, B, H], got {list(h0.shape)}")
    layers, bidir, has_bias, n = _groups(ins[3:], x.shape[-1], h0.shape[0], cfg, prefix)
    rest = ins[3 + n :]
    bs = None
    if rest and rest[-1][1].dtype.kind in "iu" and rest[-1][1].ndim == 1:
        bs = rest.pop()[1].astype(np.int64)
    if len(rest) < 3:
        raise Unreadable(f"{prefix}: expected dy, dh, dc after the {n} weights, got "
                         f"{len(rest)} files")  # fmt: skip
    (_, dy), (_, dh), (_, dc) = rest[:3]
    saved, used = _take_saved(rest[3:], h0.shape[0], prefix, "activations")
    if len(rest) != 3 + used:
        raise Unreadable(f"{prefix}: {len(rest) - 3 - used} input files left over after the "
                         "saved activations")  # fmt: skip
    d = 2 if bidir else 1
    case = Case(
        name=prefix, source=src, dtype=_dtype_of(x, ins[0][0]), x=x,
        params=[a for _, a in ins[3:3 + n]], hx=[h0, c0], batch_sizes=bs, has_bias=has_bias,
        num_layers=layers, bidirectional=bidir, batch_first=cfg.batch_first and bs is None,
        grads_in={"dy": dy, "dh": dh, "dc": dc}, saved=saved,
        keys={"input": ins[0][0], "hx": ins[1][0], "params": f"{prefix}.input.3..{2 + n}"},
        kind="aclnn backward",
    )  # fmt: skip
    labels = ["dx", "dh0", "dc0", *[param_name(q, d, has_bias) for q in range(n)]]
    if len(outs) != len(labels):
        raise Unreadable(f"{prefix}: {len(outs)} output files; aclnnLstmBackward gives dx, "
                         f"dh_prev, dc_prev and {n} parameter gradients ({len(labels)})")  # fmt: skip
    case.backward = [Device(f"{prefix}.output.{i}", lab, a, None, None, a.shape)
                     for i, (lab, (_, a)) in enumerate(zip(labels, outs, strict=True))]  # fmt: skip
    return case


def _kernel_forward(prefix: str, src: str, ins: list[tuple[str, np.ndarray]],
                    outs: list[tuple[str, np.ndarray]], cfg: KernelConfig) -> Case:  # fmt: skip
    if len(outs) < 3:
        raise Unreadable(f"{prefix}: {len(outs)} output files; aclnnLSTM gives output, hy, cy "
                         "and, in training, the seven saved lists")  # fmt: skip
    x = ins[0][1]
    k = outs[1][1].shape[0] if outs[1][1].ndim == 3 else None
    layers, bidir, has_bias, n = _groups(ins[1:], x.shape[-1], k, cfg, prefix)
    rest = ins[1 + n :]
    bs = None
    if rest and rest[-1][1].dtype.kind in "iu" and rest[-1][1].ndim == 1:
        bs = rest.pop()[1].astype(np.int64)
    if len(rest) not in (0, 2):
        raise Unreadable(f"{prefix}: after the {n} weights expected h0, c0 (or nothing) and "
                         f"batch sizes, got {[list(a.shape) for _, a in rest]}")  # fmt: skip
    case = Case(
        name=prefix, source=src, dtype=_dtype_of(x, ins[0][0]), x=x,
        params=[a for _, a in ins[1:1 + n]], hx=[a for _, a in rest] or None, batch_sizes=bs,
        has_bias=has_bias, num_layers=layers, bidirectional=bidir,
        batch_first=cfg.batch_first and bs is None,
        keys={"input": ins[0][0], "params": f"{prefix}.input.1..{n}"}, kind="aclnn forward",
    )  # fmt: skip
    kk = layers * (2 if bidir else 1)
    devices = [Device(f"{prefix}.output.{i}", lab, outs[i][1], None, None, outs[i][1].shape)
               for i, lab in enumerate(("y", "h_n", "c_n"))]  # fmt: skip
    if len(outs) > 3:
        saved, used = _take_saved(outs[3:], kk, prefix, "outputs")
        if len(outs) != 3 + used:
            raise Unreadable(f"{prefix}: {len(outs) - 3 - used} output files left over")
        for j, name in enumerate(SAVED):
            for k, a in enumerate(saved[name]):
                # one file per (layer, direction), or one stacked [L*D, T, B, H] file per list
                key = (f"{prefix}.output.{3 + j * kk + k}" if used == 7 * kk else
                       f"{prefix}.output.{3 + j}[{k}]")  # fmt: skip
                devices.append(Device(key, f"{name}.{k}", a, None, None, a.shape))
    case.forward = devices
    return case


# --------------------------------------------------------------------------- checking


def _report(found: Found, rule: str, factor: float, top: int) -> CallReport:
    rep = CallReport(found.name, found.source, found.kind)
    if found.skipped is not None:
        rep.skipped = found.skipped
        return rep
    if found.unreadable is not None or found.case is None:
        rep.unreadable = found.unreadable or "no case"
        return rep
    try:
        judged = judge(found.case, rule, factor, top)
    except CaseError as exc:
        rep.unreadable = f"its arguments break the operator's contract: {exc}"
        rep.notes = list(found.case.notes)
        return rep
    judged.kind = found.kind
    return judged


def check_dump(
    path: str | Path, *, rule: str = "bound", factor: float = BOUND_FACTOR, top: int = 3,
    no_dropout: bool = False, allow_dump_data_dir: bool = False,
) -> list[CallReport]:  # fmt: skip
    """Judge every LSTM call of an msProbe dump (a dump.json, a rank or step folder, or the
    dump root). Files are read inside the dump's folder only (and, with
    ``allow_dump_data_dir``, inside a tensor folder outside it that the dump records or links).

    Returns:
        One report per LSTM call found (and one, unreadable, per dump.json found below a folder
        that could not be read), in the order of the dump's steps, ranks and entries.

    Raises:
        DumpReadError: the path holds no dump.json at all, or is one file that is not a
            readable dump.json.
        DumpRefused: the dump points outside itself (see :class:`DumpRefused`).
    """
    files = dump_files(path)
    one_file = Path(path).is_file()
    base = Path(path) if Path(path).is_dir() else Path(path).parent
    root = dump_root(path)
    reports = []
    for f in files:
        label = str(f.relative_to(base)) if f.is_relative_to(base) else str(f)
        try:
            for found in lstm_calls(f, no_dropout=no_dropout, label=label, root=root,
                                    allow_dump_data_dir=allow_dump_data_dir):  # fmt: skip
                reports.append(_report(found, rule, factor, top))
        except DumpReadError as exc:
            if one_file:
                raise
            reports.append(CallReport("(dump.json)", label, "", unreadable=str(exc)))
    return reports


def check_kernel(
    folder: str | Path, kind: str, cfg: KernelConfig, *, rule: str = "bound",
    factor: float = BOUND_FACTOR, top: int = 3,
) -> list[CallReport]:  # fmt: skip
    """Judge every aclnnLstmBackward (``kind`` "backward") or aclnnLSTM ("forward") call of a
    folder of ``msprobe parse -t npy`` files.

    Raises:
        DumpReadError: no such folder, or no kernel files in it.
    """
    return [_report(f, rule, factor, top) for f in kernel_cases(folder, kind, cfg)]
