"""Test fixtures: dump folders laid out as Ascend msProbe (MindStudio Probe) writes them.

An independent writer of msProbe's PyTorch "tensor" and "statistics" dumps, made from the
documented schema only (nothing from lstmgrad is imported):

    DUMP_PATH/step{N}/rank{R}/            (proc{pid} when no rank is known)
        dump.json  stack.json  construct.json  dump_tensor_data/   (no folder for "statistics")

``MsprobeDump`` records entries (API calls, module calls, parameter gradients) and writes them;
``record_lstm`` runs a real ``torch.nn.LSTM`` the way msProbe sees it (``torch._VF.lstm``
wrapped at level L1, module hooks at level L0, both at "mix") and records forward and backward;
``record_lstm_rounded`` emulates a device that computes in float64 and rounds once to float16;
``make_npu_tensor_file`` writes a .pt file that needs torch_npu to load; ``add_npu_lstm`` adds a
``NPU.npu_lstm`` entry that a reader must list and skip.
"""

from __future__ import annotations

import copy
import json
import os
import pathlib
import sys
import traceback
import types
import zlib
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
from torch.nn.utils.rnn import PackedSequence

__all__ = [
    "API_PREFIXES",
    "MsprobeDump",
    "add_npu_lstm",
    "crc32_hex",
    "make_npu_tensor_file",
    "record_lstm",
    "record_lstm_rounded",
    "tensor_file_name",
    "tensor_stats",
]

API_PREFIXES = ("Tensor", "Torch", "Functional", "NPU", "VF", "Aten")
TASKS = ("tensor", "statistics")
LEVELS = ("L0", "L1", "mix")

KeyPath = tuple[int | str, ...]
FileFilter = Callable[[str, str, KeyPath], bool]
PerturbFn = Callable[[str, KeyPath, torch.Tensor], torch.Tensor]
TensorFn = Callable[[torch.Tensor], torch.Tensor]

_STACK_DEPTH = 30  # frames kept per stack.json entry, innermost first


# --------------------------------------------------------------------------- tensor summaries


def tensor_stats(t: torch.Tensor) -> dict[str, Any]:
    """Max, Min, Mean and Norm (L2) as msProbe writes them.

    Floating tensors: Python floats, computed in float64 for float64 and in float32 otherwise
    (float16 and bfloat16 are widened first). Integer tensors: Max/Min ints, Mean/Norm None.
    Bool tensors: Max/Min bools, Mean/Norm None. Empty tensors: all four None.
    """
    t = t.detach().cpu()
    if t.numel() == 0:
        return {"Max": None, "Min": None, "Mean": None, "Norm": None}
    if t.dtype == torch.bool:
        return {"Max": bool(t.any()), "Min": bool(t.all()), "Mean": None, "Norm": None}
    if t.is_complex():
        raise TypeError(f"msprobe_writer: complex tensors are not supported ({t.dtype})")
    if not t.is_floating_point():
        return {"Max": int(t.max()), "Min": int(t.min()), "Mean": None, "Norm": None}
    work = t.to(torch.float64 if t.dtype == torch.float64 else torch.float32)
    return {
        "Max": float(work.max()),
        "Min": float(work.min()),
        "Mean": float(work.mean()),
        "Norm": float(torch.linalg.vector_norm(work)),
    }


def tensor_bytes(t: torch.Tensor) -> bytes:
    """The tensor's elements as stored, C order, in its own dtype."""
    flat = t.detach().cpu().contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy().tobytes()


def crc32_hex(t: torch.Tensor) -> str:
    """msProbe's "md5" field: the CRC32 of the tensor bytes, 8 lower-case hex digits."""
    return f"{zlib.crc32(tensor_bytes(t)) & 0xFFFFFFFF:08x}"


def tensor_file_name(call: str, kind: str, key_path: KeyPath, *, npy: bool = False) -> str:
    """A tensor's file name in dump_tensor_data.

    ``.pt``: "{call}.{kind}.{k1}.{k2}....pt" (e.g. "VF.lstm.0.forward.input.1.0.pt");
    ``.npy`` (older msProbe): "{call with dots as underscores}_{kind}.{k1}.{k2}....npy"
    (e.g. "VF_lstm_0_forward_input.1.0.npy"). ``kind`` is input, kwargs, output, parameters,
    or parameters_grad (then ``call`` is the module prefix, e.g. "Module.lstm.LSTM").
    """
    keys = [str(k) for k in key_path]
    if npy:
        return ".".join([f"{call.replace('.', '_')}_{kind}", *keys]) + ".npy"
    return ".".join([call, kind, *keys]) + ".pt"


def _is_namedtuple(v: Any) -> bool:
    return isinstance(v, tuple) and hasattr(type(v), "_fields")


def _as_list(v: Any) -> list[Any]:
    """Top-level args/outputs as msProbe lists them: a tuple or list as is, else one item."""
    if v is None:
        return []
    if isinstance(v, (list, tuple)) and not _is_namedtuple(v):
        return list(v)
    return [v]


def _caller_stack() -> list[str]:
    """The current Python stack, innermost first, in msProbe's line format, without this file."""
    lines = []
    for fs in reversed(traceback.extract_stack()):
        if os.path.abspath(fs.filename) == os.path.abspath(__file__):
            continue
        lines.append(f"File {fs.filename}, line {fs.lineno}, in {fs.name}, \n {fs.line or ''}")
    return lines[:_STACK_DEPTH]


# --------------------------------------------------------------------------- the dump


class MsprobeDump:
    """One msProbe dump (one step, one rank): entries recorded in memory, written by ``write``.

    ``skip_files(name, kind, key_path) -> bool``: tensors whose files are not written (the
    entry keeps its data_name, so the file is missing). ``npu_files(name, kind, key_path) ->
    bool``: tensors written with ``make_npu_tensor_file`` (need torch_npu to load).
    ``data`` is the dump.json "data" dict (tests may edit it before ``write``); ``tensors`` holds,
    per entry, the same structure with the tensors as written; ``construct`` the module tree.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        task: str = "tensor",
        level: str = "L1",
        step: int = 0,
        rank: int | None = 0,
        npy: bool = False,
        skip_files: FileFilter | None = None,
        npu_files: FileFilter | None = None,
    ) -> None:
        if task not in TASKS:
            raise ValueError(f"task must be one of {TASKS}, got {task!r}")
        if level not in LEVELS:
            raise ValueError(f"level must be one of {LEVELS}, got {level!r}")
        self.root = pathlib.Path(root).absolute()
        self.task = task
        self.level = level
        self.step = step
        self.rank = rank
        self.npy = npy
        self.skip_files = skip_files
        self.npu_files = npu_files
        proc = f"rank{rank}" if rank is not None else f"proc{os.getpid()}"
        self.folder: pathlib.Path = self.root / f"step{step}" / proc
        self.data: dict[str, Any] = {}
        self.tensors: dict[str, dict[str, Any]] = {}
        self.construct: dict[str, str | None] = {}
        self.stacks: list[tuple[list[str], list[str]]] = []
        self._files: dict[str, tuple[torch.Tensor, bool]] = {}
        self._counters: dict[str, int] = {}

    @property
    def data_dir(self) -> pathlib.Path:
        """dump_tensor_data (written only for task "tensor")."""
        return self.folder / "dump_tensor_data"

    def next_index(self, key: str) -> int:
        """The per-API (or per-module) call counter: 0, 1, 2, ... for each ``key``."""
        n = self._counters.get(key, 0)
        self._counters[key] = n + 1
        return n

    # ---- encoding

    def _tensor(self, t: torch.Tensor, call: str, kind: str, key_path: KeyPath) -> dict[str, Any]:
        saved = t.detach().clone().contiguous()  # stats from it: the file's reduction order
        entry: dict[str, Any] = {
            "type": "torch.Tensor",
            "dtype": str(t.dtype),
            "shape": list(t.shape),
            **tensor_stats(saved),
            "requires_grad": bool(t.requires_grad),
            "md5": crc32_hex(saved),
        }
        if self.task == "tensor":
            name = tensor_file_name(call, kind, key_path, npy=self.npy)
            entry["data_name"] = name
            if not (self.skip_files and self.skip_files(call, kind, key_path)):
                npu = bool(self.npu_files and self.npu_files(call, kind, key_path))
                self._files[name] = (saved, npu)
        return entry

    def _encode(self, v: Any, call: str, kind: str, key_path: KeyPath) -> Any:
        """One value in msProbe's JSON form; tensors also queued for dump_tensor_data."""
        if v is None:
            return None
        if isinstance(v, torch.Tensor):
            return self._tensor(v, call, kind, key_path)
        if isinstance(v, bool):
            return {"type": "bool", "value": v}
        if isinstance(v, int):
            return {"type": "int", "value": v}
        if isinstance(v, float):
            return {"type": "float", "value": v}
        if isinstance(v, str):
            return {"type": "str", "value": v}
        if isinstance(v, torch.dtype):
            return {"type": "torch.dtype", "value": str(v)}
        if isinstance(v, slice):
            return [v.start, v.stop, v.step]
        if _is_namedtuple(v):
            return {f: self._encode(getattr(v, f), call, kind, (*key_path, f)) for f in v._fields}
        if isinstance(v, Mapping):
            return {str(k): self._encode(x, call, kind, (*key_path, str(k))) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [self._encode(x, call, kind, (*key_path, i)) for i, x in enumerate(v)]
        raise TypeError(f"msprobe_writer: cannot dump a {type(v).__name__} ({call}, {kind})")

    def _add(self, name: str, entry: dict[str, Any], raw: dict[str, Any]) -> None:
        self.data[name] = entry
        self.tensors[name] = raw

    def _add_stack(self, name: str) -> None:
        stack = _caller_stack()
        for lines, names in self.stacks:
            if lines == stack:
                names.append(name)
                return
        self.stacks.append((stack, [name]))

    # ---- entries

    def api_forward(
        self,
        name: str,
        input_args: Any,
        input_kwargs: Mapping[str, Any] | None = None,
        output: Any = None,
    ) -> dict[str, Any]:
        """An API's forward entry, e.g. "VF.lstm.0.forward"."""
        args, kwargs, out = _as_list(input_args), dict(input_kwargs or {}), _as_list(output)
        entry = {
            "input_args": self._encode(args, name, "input", ()),
            "input_kwargs": {k: self._encode(v, name, "kwargs", (k,)) for k, v in kwargs.items()},
            "output": self._encode(out, name, "output", ()),
        }
        self._add(name, entry, {"input_args": args, "input_kwargs": kwargs, "output": out})
        self._add_stack(name)
        return entry

    def api_backward(self, name: str, input: Any, output: Any) -> dict[str, Any]:
        """An API's backward entry: "input" = grads of its outputs, "output" = grads of its inputs."""
        inp, out = _as_list(input), _as_list(output)
        entry = {
            "input": self._encode(inp, name, "input", ()),
            "output": self._encode(out, name, "output", ()),
        }
        self._add(name, entry, {"input": inp, "output": out})
        return entry

    def module_forward(
        self,
        name: str,
        input_args: Any,
        output: Any,
        parameters: Mapping[str, torch.Tensor | None],
        input_kwargs: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """A module's forward entry, e.g. "Module.lstm.LSTM.forward.0", with its parameters."""
        args, kwargs, out = _as_list(input_args), dict(input_kwargs or {}), _as_list(output)
        params = dict(parameters)
        entry = {
            "input_args": self._encode(args, name, "input", ()),
            "input_kwargs": {k: self._encode(v, name, "kwargs", (k,)) for k, v in kwargs.items()},
            "output": self._encode(out, name, "output", ()),
            "parameters": {k: self._encode(p, name, "parameters", (k,)) for k, p in params.items()},
        }
        raw = {"input_args": args, "input_kwargs": kwargs, "output": out, "parameters": params}
        self._add(name, entry, raw)
        self._add_stack(name)
        self.construct.setdefault(name, None)
        return entry

    def module_backward(self, name: str, input: Any, output: Any) -> dict[str, Any]:
        """A module's backward entry, e.g. "Module.lstm.LSTM.backward.0"."""
        entry = self.api_backward(name, input, output)
        self.construct.setdefault(name, None)
        return entry

    def parameters_grad(self, prefix: str, grads: Mapping[str, torch.Tensor | None]) -> str:
        """ "{prefix}.parameters_grad" (prefix like "Module.lstm.LSTM"); returns the entry name."""
        name = f"{prefix}.parameters_grad"
        g = dict(grads)
        entry = {k: self._encode(v, prefix, "parameters_grad", (k,)) for k, v in g.items()}
        self._add(name, entry, g)
        return name

    # ---- output

    def write(self) -> pathlib.Path:
        """Write dump.json, stack.json, construct.json and the tensor files; return the folder."""
        self.folder.mkdir(parents=True, exist_ok=True)
        tensor_task = self.task == "tensor"
        if tensor_task:
            self.data_dir.mkdir(exist_ok=True)
            for fname, (t, npu) in self._files.items():
                path = self.data_dir / fname
                if self.npy:
                    arr = (t.float() if t.dtype == torch.bfloat16 else t).cpu().numpy()
                    np.save(path, arr)
                elif npu:
                    make_npu_tensor_file(path, t)
                else:
                    torch.save(t, path)
        dump = {
            "task": self.task,
            "level": self.level,
            "framework": "pytorch",
            "dump_data_dir": str(self.data_dir) if tensor_task else None,
            "data": self.data,
        }
        stack = {str(i): [lines, names] for i, (lines, names) in enumerate(self.stacks)}
        construct = {} if self.level == "L1" else self.construct
        for fname, obj in (
            ("dump.json", dump),
            ("stack.json", stack),
            ("construct.json", construct),
        ):
            with open(self.folder / fname, "w", encoding="utf-8") as f:
                json.dump(obj, f, indent=1)
        return self.folder


# --------------------------------------------------------------------------- broken files


def make_npu_tensor_file(path: str | os.PathLike[str], tensor: torch.Tensor) -> None:
    """Write ``tensor`` the way a tensor saved on an Ascend NPU is written: loading needs torch_npu.

    The pickle names the global ``torch_npu._rebuild_npu_tensor``: ``torch.load(...,
    weights_only=True)`` refuses it ("Unsupported global") and a full load fails with
    ModuleNotFoundError. A temporary fake ``torch_npu`` module is put in sys.modules to save it.
    """
    if "torch_npu" in sys.modules and not getattr(sys.modules["torch_npu"], "_msprobe_fake", 0):
        raise RuntimeError("make_npu_tensor_file: a real torch_npu is imported")
    fake = types.ModuleType("torch_npu")
    fake._msprobe_fake = True  # type: ignore[attr-defined]

    def _rebuild_npu_tensor(t: torch.Tensor) -> torch.Tensor:
        return t

    _rebuild_npu_tensor.__module__ = "torch_npu"
    _rebuild_npu_tensor.__qualname__ = "_rebuild_npu_tensor"
    fake._rebuild_npu_tensor = _rebuild_npu_tensor  # type: ignore[attr-defined]

    class _NpuTensor:
        def __init__(self, t: torch.Tensor) -> None:
            self.t = t

        def __reduce_ex__(self, protocol: Any) -> tuple[Any, ...]:
            return (_rebuild_npu_tensor, (self.t,))

    previous = sys.modules.get("torch_npu")
    sys.modules["torch_npu"] = fake
    try:
        torch.save(_NpuTensor(tensor.detach().cpu().clone().contiguous()), path)
    finally:
        if previous is None:
            del sys.modules["torch_npu"]
        else:
            sys.modules["torch_npu"] = previous


def add_npu_lstm(
    dump: MsprobeDump, *, T: int = 4, B: int = 2, I: int = 3, H: int = 5, seed: int = 7
) -> str:
    """Add a plausible "NPU.npu_lstm.{n}.forward" entry (torch_npu's fused LSTM: gates i, j, f, o).

    Inputs [x, weight (4H, I+H), bias, seq_mask, h, c, has_biases, num_layers, dropout, train,
    bidirectional, batch_first, flag_seq, direction]; outputs [y, h, c, i, j, f, o, tanhc], each
    (T, B, H). Its real layout is not documented; a reader should list it and skip it.
    """
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, B, I, generator=g)
    w = 0.3 * torch.randn(4 * H, I + H, generator=g)
    b = 0.1 * torch.randn(4 * H, generator=g)
    h = torch.zeros(1, B, H)
    c = torch.zeros(1, B, H)
    mask = torch.ones(T, B, H)
    outs: dict[str, list[torch.Tensor]] = {k: [] for k in ("y", "h", "c", "i", "j", "f", "o", "t")}
    ht, ct = h[0], c[0]
    for step in range(T):
        gates = torch.cat([x[step], ht], 1) @ w.T + b
        i, j, f, o = gates.chunk(4, 1)
        i, j, f, o = i.sigmoid(), j.tanh(), f.sigmoid(), o.sigmoid()
        ct = f * ct + i * j
        tc = ct.tanh()
        ht = o * tc
        for k, v in zip("yhcijfot", (ht, ht, ct, i, j, f, o, tc), strict=True):
            outs[k].append(v)
    output = [torch.stack(outs[k]) for k in "yhcijfot"]
    name = f"NPU.npu_lstm.{dump.next_index('NPU.npu_lstm')}.forward"
    args = [x, w, b, mask, h, c, True, 1, 0.0, False, False, False, False, False]
    dump.api_forward(name, args, {}, output)
    return name


# --------------------------------------------------------------------------- recording an LSTM


class _Tap(torch.autograd.Function):
    """Identity on tensors whose backward stores the gradients that reach it in ``sink``."""

    @staticmethod
    def forward(ctx: Any, sink: dict[str, Any], *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.sink = sink
        ctx.set_materialize_grads(False)
        return tuple(t.clone() for t in tensors)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor | None) -> tuple[Any, ...]:
        ctx.sink["grads"] = tuple(None if g is None else g.detach().clone() for g in grads)
        return (None, *grads)


def _tap(sink: dict[str, Any], *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return _Tap.apply(sink, *tensors)


def _map_tensors(v: Any, fn: Callable[[KeyPath, torch.Tensor], Any], key: KeyPath = ()) -> Any:
    """``v`` with each tensor t replaced by fn(key_path, t); lists/tuples/namedtuples/dicts kept."""
    if isinstance(v, torch.Tensor):
        return fn(key, v)
    if _is_namedtuple(v):
        return type(v)._make(_map_tensors(getattr(v, f), fn, (*key, f)) for f in v._fields)
    if isinstance(v, Mapping):
        return {k: _map_tensors(x, fn, (*key, k)) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return type(v)(_map_tensors(x, fn, (*key, i)) for i, x in enumerate(v))
    return v


def _finish(t: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """``r`` detached, flagged requires_grad like ``t`` (what msProbe saw) where it can be."""
    r = r.detach()
    if t.requires_grad and (r.is_floating_point() or r.is_complex()):
        r.requires_grad_(True)
    return r


def _as_written_input(device_inputs: TensorFn | None) -> Callable[[KeyPath, torch.Tensor], Any]:
    def fn(key: KeyPath, t: torch.Tensor) -> torch.Tensor:
        r = t.detach().clone()
        if device_inputs is not None and r.is_floating_point():
            r = device_inputs(r)
        return _finish(t, r)

    return fn


def _as_written_output(
    name: str, device_outputs: TensorFn | None, perturb: PerturbFn | None
) -> Callable[[KeyPath, torch.Tensor], Any]:
    def fn(key: KeyPath, t: torch.Tensor) -> torch.Tensor:
        r = t.detach().clone()
        if device_outputs is not None and r.is_floating_point():
            r = device_outputs(r)
        if perturb is not None:
            r = perturb(name, key, r)
        return _finish(t, r)

    return fn


def _tap_value(v: Any, sinks: dict[KeyPath, dict[str, Any]], key: KeyPath = ()) -> Any:
    """``v`` with each tensor that requires grad passed through its own tap (sinks[key_path])."""

    def fn(k: KeyPath, t: torch.Tensor) -> torch.Tensor:
        if not t.requires_grad:
            return t
        sinks[k] = {}
        return _tap(sinks[k], t)[0]

    return _map_tensors(v, fn, key)


def _grad_of(sinks: dict[KeyPath, dict[str, Any]], key: KeyPath) -> torch.Tensor | None:
    sink = sinks.get(key)
    if not sink or "grads" not in sink:
        return None
    return sink["grads"][0]


def _mirror(v: Any, sinks: dict[KeyPath, dict[str, Any]], key: KeyPath = ()) -> Any:
    """The gradient structure mirroring ``v``: a tensor's grad (None when none reached it)."""
    if isinstance(v, torch.Tensor):
        return _grad_of(sinks, key)
    if _is_namedtuple(v):
        return {f: _mirror(getattr(v, f), sinks, (*key, f)) for f in v._fields}
    if isinstance(v, Mapping):
        return {k: _mirror(x, sinks, (*key, k)) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_mirror(x, sinks, (*key, i)) for i, x in enumerate(v)]
    return None


_MISSING = object()


def record_lstm(
    dump: MsprobeDump,
    lstm: torch.nn.LSTM,
    x: torch.Tensor | PackedSequence,
    hx: tuple[torch.Tensor, torch.Tensor] | None = None,
    *,
    dy: torch.Tensor | None = None,
    dh: torch.Tensor | None = None,
    dc: torch.Tensor | None = None,
    level: str | None = None,
    module_path: str = "lstm",
    perturb: PerturbFn | None = None,
    device_outputs: TensorFn | None = None,
    backward: bool = True,
    device_inputs: TensorFn | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """Run ``lstm(x[, hx])`` (and its backward) as msProbe sees it and record the entries.

    Level "L1": "VF.lstm.{n}.forward" / ".backward" (``torch._VF.lstm`` replaced by a recording
    wrapper while it runs); "L0": "Module.{module_path}.LSTM.forward.{n}" / ".backward.{n}" and
    "Module.{module_path}.LSTM.parameters_grad"; "mix": both. ``level=None``: the dump's level.
    Backward: dy, dh, dc (random, seeded by ``seed``, where None) are fed for (y or y.data, h_n,
    c_n); the gradients fed are exactly the ones written (device_inputs applied, then cast back).

    Inputs, parameters and backward inputs are written through ``device_inputs`` (floating
    tensors only); forward outputs, backward outputs and parameter grads through
    ``device_outputs`` (floating tensors only) and then ``perturb(entry name, key path within the
    output or (param name,), tensor)`` (every tensor). The functions get a private copy.

    Returns {"names", "api_forward", "api_backward", "module_forward", "module_backward",
    "parameters_grad", "output", "h_n", "c_n", "dy", "dh", "dc", "dx", "dh0", "dc0",
    "param_grads", "written"}: the entry names (all, in the order recorded), the run's results
    (unperturbed, in the run's dtype), the grads fed and got, and per entry the tensors written.
    """
    level = dump.level if level is None else level
    if level not in LEVELS:
        raise ValueError(f"level must be one of {LEVELS}, got {level!r}")
    api_on, module_on = level in ("L1", "mix"), level in ("L0", "mix")
    written_input = _as_written_input(device_inputs)
    names: list[str] = []
    vf_calls: list[tuple[int, list[Any], dict[KeyPath, dict[str, Any]], dict[str, Any]]] = []
    mod: dict[str, Any] = {}
    prefix = f"Module.{module_path}.{type(lstm).__name__}"

    def vf_wrapper(*args: Any, **kwargs: Any) -> Any:
        n = dump.next_index("VF.lstm")
        name = f"VF.lstm.{n}.forward"
        in_sinks: dict[KeyPath, dict[str, Any]] = {}
        run_args = list(args)
        if backward:
            for i, a in enumerate(run_args):
                if isinstance(a, torch.Tensor) and a.requires_grad:
                    in_sinks[(i,)] = {}
                    run_args[i] = _tap(in_sinks[(i,)], a)[0]
        out = original(*run_args, **kwargs)
        dump.api_forward(
            name,
            _map_tensors(list(args), written_input),
            _map_tensors(dict(kwargs), written_input),
            _map_tensors(list(out), _as_written_output(name, device_outputs, perturb)),
        )
        names.append(name)
        if "forward" in mod:
            dump.construct[name] = mod["forward"]
        out_sink: dict[str, Any] = {}
        if backward and any(o.requires_grad for o in out):
            out = _tap(out_sink, *out)
        vf_calls.append((n, list(args), in_sinks, out_sink))
        return tuple(out)

    def pre_hook(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        n = dump.next_index(prefix)
        mod.update(n=n, forward=f"{prefix}.forward.{n}", args=args, kwargs=kwargs, sinks={})
        if not backward:
            return None
        return _tap_value(args, mod["sinks"]), _tap_value(kwargs, mod["sinks"], ("kwargs",))

    def fwd_hook(module: Any, args: Any, kwargs: Any, output: Any) -> Any:
        name = mod["forward"]
        dump.module_forward(
            name,
            _map_tensors(list(mod["args"]), written_input),
            _map_tensors(output, _as_written_output(name, device_outputs, perturb)),
            {k: written_input((k,), p) for k, p in module.named_parameters()},
            _map_tensors(dict(mod["kwargs"]), written_input),
        )
        names.append(name)
        mod["out_sinks"] = {}
        return _tap_value(output, mod["out_sinks"]) if backward else output

    original = torch._VF.lstm
    saved_attr = torch._VF.__dict__.get("lstm", _MISSING)
    handles = []
    if module_on:
        handles.append(lstm.register_forward_pre_hook(pre_hook, with_kwargs=True))
        handles.append(lstm.register_forward_hook(fwd_hook, with_kwargs=True))
    if api_on:
        torch._VF.lstm = vf_wrapper  # type: ignore[attr-defined]
    try:
        result = lstm(x) if hx is None else lstm(x, hx)
    finally:
        if api_on:
            if saved_attr is _MISSING:
                del torch._VF.lstm  # type: ignore[attr-defined]
            else:
                torch._VF.lstm = saved_attr  # type: ignore[attr-defined]
        for h in handles:
            h.remove()

    y, (h_n, c_n) = result
    packed = isinstance(y, PackedSequence)
    y_t = y.data if packed else y
    x_t = x.data if isinstance(x, PackedSequence) else x
    rec: dict[str, Any] = {
        "names": names,
        "api_forward": [f"VF.lstm.{c[0]}.forward" for c in vf_calls] if api_on else [],
        "api_backward": [],
        "module_forward": mod.get("forward"),
        "module_backward": None,
        "parameters_grad": None,
        "output": y.data.detach() if packed else y.detach(),
        "h_n": h_n.detach(),
        "c_n": c_n.detach(),
        "dy": None,
        "dh": None,
        "dc": None,
        "dx": None,
        "dh0": None,
        "dc0": None,
        "param_grads": {},
    }
    if backward:
        g = torch.Generator().manual_seed(seed)
        fed = []
        for given, ref in ((dy, y_t), (dh, h_n), (dc, c_n)):
            d = torch.randn(ref.shape, generator=g, dtype=torch.float64) if given is None else given
            d = d.detach().to(ref.dtype)
            if device_inputs is not None:
                d = device_inputs(d.clone()).to(ref.dtype)
            fed.append(d)
        rec["dy"], rec["dh"], rec["dc"] = fed
        params = [p for p in lstm.parameters() if p.requires_grad]
        leaves = [t for t in (x_t, *(hx or ())) if t.requires_grad]
        got = torch.autograd.grad(
            [y_t, h_n, c_n], [*leaves, *params], grad_outputs=fed, allow_unused=True
        )
        by_id = {id(t): gr for t, gr in zip([*leaves, *params], got, strict=True)}
        rec["dx"] = by_id.get(id(x_t))
        if hx is not None:
            rec["dh0"], rec["dc0"] = by_id.get(id(hx[0])), by_id.get(id(hx[1]))
        rec["param_grads"] = {k: by_id.get(id(p)) for k, p in lstm.named_parameters()}

        if api_on:  # backward runs the calls in reverse order
            for n, args, in_sinks, out_sink in reversed(vf_calls):
                name = f"VF.lstm.{n}.backward"
                grads_in = list(out_sink.get("grads", (None, None, None)))
                grads_out = [_grad_of(in_sinks, (i,)) for i in range(len(args))]
                dump.api_backward(
                    name,
                    _map_tensors(grads_in, written_input),
                    _map_tensors(grads_out, _as_written_output(name, device_outputs, perturb)),
                )
                names.append(name)
                rec["api_backward"].append(name)
                if module_on:
                    dump.construct[name] = f"{prefix}.backward.{mod['n']}"
        if module_on:
            name = f"{prefix}.backward.{mod['n']}"
            grads_in = _mirror(result, mod["out_sinks"])
            grads_out = _mirror(list(mod["args"]), mod["sinks"])
            dump.module_backward(
                name,
                _map_tensors(grads_in, written_input),
                _map_tensors(grads_out, _as_written_output(name, device_outputs, perturb)),
            )
            names.append(name)
            rec["module_backward"] = name
            pname = f"{prefix}.parameters_grad"
            pg = _map_tensors(
                rec["param_grads"], _as_written_output(pname, device_outputs, perturb)
            )
            dump.parameters_grad(prefix, pg)
            names.append(pname)
            rec["parameters_grad"] = pname
    rec["written"] = {name: dump.tensors[name] for name in names}
    return rec


def _round_trip(v: Any, dtype: torch.dtype) -> Any:
    """Floating tensors rounded to ``dtype`` and widened to float64 (requires_grad kept)."""

    def fn(key: KeyPath, t: torch.Tensor) -> torch.Tensor:
        if not t.is_floating_point():
            return t
        return _finish(t, t.detach().to(dtype).to(torch.float64))

    return _map_tensors(v, fn)


def record_lstm_rounded(
    dump: MsprobeDump,
    lstm: torch.nn.LSTM,
    x: torch.Tensor | PackedSequence,
    hx: tuple[torch.Tensor, torch.Tensor] | None = None,
    *,
    dtype: torch.dtype = torch.float16,
    **kwargs: Any,
) -> dict[str, Any]:
    """A device that computes in float64 and rounds each result once to ``dtype``.

    The weights, x, hx and dy/dh/dc are rounded to ``dtype``; the LSTM runs in float64 on those
    values (a float64 copy of ``lstm``); inputs, parameters and fed gradients are written in
    ``dtype`` (exactly), outputs, input gradients and parameter gradients as the float64 results
    cast to ``dtype``. Other keywords as ``record_lstm``. The result also has "lstm64", "x64" and
    "hx64" (what ran); its tensors are float64.
    """
    lstm64 = copy.deepcopy(lstm).to(dtype).to(torch.float64)
    x64 = _round_trip(x, dtype)
    hx64 = None if hx is None else tuple(_round_trip(list(hx), dtype))

    def cast(t: torch.Tensor) -> torch.Tensor:
        return t.to(dtype)

    rec = record_lstm(dump, lstm64, x64, hx64, device_inputs=cast, device_outputs=cast, **kwargs)
    rec.update(lstm64=lstm64, x64=x64, hx64=hx64)
    return rec
