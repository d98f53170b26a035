"""The benchmark shapes as data, their FLOP counts and their deterministic inputs (NumPy only:
both workers build bit-identical inputs from the same seed).

The shapes, :class:`Shape` and the FLOP formula live in the package, in
src/lstmgrad/tools/shapes.py, where ``lstmgrad bench`` and ``lstmgrad tune`` read them too. This
module loads that file by its path rather than as ``lstmgrad.tools.shapes``: the worker that
times torch must not import lstmgrad (run.py checks it).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import numpy as np


def _load_table() -> ModuleType:
    path = Path(__file__).resolve().parent.parent / "src" / "lstmgrad" / "tools" / "shapes.py"
    spec = importlib.util.spec_from_file_location("_lstmgrad_shapes", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load the shape table {path}")
    module = sys.modules.get(spec.name)
    if module is None:
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up here
        spec.loader.exec_module(module)
    return module


_table = _load_table()
BY_ID = _table.BY_ID
LENGTHS_SEED = _table.LENGTHS_SEED
SHAPES = _table.SHAPES
Shape = _table.Shape
lstm_flops = _table.lstm_flops
parse_names = _table.parse_names

DATA_SEED = 0  # seed of the input / weight / gradient values


def select(ids: str | None, varlen: bool = True) -> list[Shape]:
    """Shapes named in a comma-separated list (all when None or empty), in the given order;
    exits with the parser's message on a bad name."""
    if not ids:
        return [s for s in SHAPES if varlen or not s.varlen]
    try:
        return parse_names(ids, varlen=varlen)
    except ValueError as exc:
        raise SystemExit(f"--shapes: {exc}") from None


def make_case(
    shape: Shape, dtype: str = "float32", seed: int = DATA_SEED, pad_value: float = 0.0
) -> dict:
    """Deterministic inputs of one shape, as lstmgrad lays them out.

    Returns a dict: ``x`` [T, B, I] (dense) or [T*B, I] (varlen, padded time-major), ``params``
    (PyTorch ``_flat_weights`` order, uniform in +-1/sqrt(H) like nn.LSTM's init), ``h0``,
    ``c0``, ``dh``, ``dc`` [L*D, B, H], ``dy`` like x with width D*H, ``lengths`` int64 [B] and
    ``batch_sizes`` (int64 [T] or None). Padded rows of x and dy hold ``pad_value``.
    """
    dt = np.dtype(dtype)
    t, b, h, k = shape.T, shape.B, shape.H, shape.L * shape.D
    rng = np.random.default_rng(seed)
    bound = 1.0 / np.sqrt(h)
    params = []
    for layer in range(shape.L):
        il = shape.input_size(layer)
        for _ in range(shape.D):
            for s in [(4 * h, il), (4 * h, h), (4 * h,), (4 * h,)]:
                params.append(rng.uniform(-bound, bound, s).astype(dt))
    x = rng.standard_normal((t, b, shape.I)).astype(dt)
    dy = rng.standard_normal((t, b, shape.D * h)).astype(dt)
    h0, c0, dh, dc = (rng.standard_normal((k, b, h)).astype(dt) for _ in range(4))
    lengths = shape.lengths()
    batch_sizes = shape.batch_sizes()
    if batch_sizes is not None:
        pad = np.arange(t)[:, None] >= lengths[None, :]  # [T, B]
        x[pad] = pad_value
        dy[pad] = pad_value
        x = x.reshape(t * b, shape.I)
        dy = dy.reshape(t * b, shape.D * h)
    return {"x": x, "params": params, "h0": h0, "c0": c0, "dy": dy, "dh": dh, "dc": dc,
            "lengths": lengths, "batch_sizes": batch_sizes}  # fmt: skip
