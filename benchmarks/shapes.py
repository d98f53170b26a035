"""The benchmark shapes as data, their FLOP counts and their deterministic inputs (NumPy only:
both workers build bit-identical inputs from the same seed).

Legend: T steps, B batch, I input size, H hidden size, L layers, D directions (2 if
bidirectional), I_l = I for layer 0 and D*H above. FLOPs count the GEMMs only (2 per
multiply-add): the backward of one (layer, direction) is 16*T*B*H*(H + I_l) (recurrent dh,
dx, dW_ih, dW_hh), its forward 8*T*B*H*(H + I_l). For variable lengths the *effective* count
replaces T*B by the sum of the lengths; the *padded* count keeps T*B.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import numpy as np

LENGTHS_SEED = 1234  # seed of the varlen lengths draw
DATA_SEED = 0  # seed of the input / weight / gradient values


def lstm_flops(
    rows: int, I: int, H: int, L: int, D: int, part: str = "backward", dx: bool = True
) -> int:
    """GEMM FLOPs of an LSTM's ``part`` ("backward", "forward" or "fwd_bwd") over ``rows``
    active (time, batch) rows, as the module docstring counts them; ``dx=False`` drops layer
    0's dx GEMM, 8*rows*H*I, from the backward (output_mask)."""
    per_mac = {"backward": 16, "forward": 8, "fwd_bwd": 24}.get(part)
    if per_mac is None:
        raise ValueError(f"part must be 'backward', 'forward' or 'fwd_bwd', got {part!r}")
    total = 0
    for layer in range(L):
        il = I if layer == 0 else D * H
        no_dx = part != "forward" and layer == 0 and not dx
        total += D * rows * H * (per_mac * (H + il) - 8 * il * no_dx)
    return total


@dataclass(frozen=True)
class Shape:
    """One benchmark case. ``lengths_range`` (lo, hi) marks a variable-length case: lengths are
    drawn uniform in [lo, hi] with a fixed seed, sorted decreasing, and the longest set to T."""

    id: str
    T: int
    B: int
    I: int  # noqa: E741
    H: int
    L: int = 1
    D: int = 1
    lengths_range: tuple[int, int] | None = None
    note: str = ""

    @property
    def varlen(self) -> bool:
        return self.lengths_range is not None

    @property
    def bidirectional(self) -> bool:
        return self.D == 2

    def input_size(self, layer: int) -> int:
        """I_l: I for layer 0, D*H above."""
        return self.I if layer == 0 else self.D * self.H

    def lengths(self) -> np.ndarray:
        """int64 [B], non-increasing, lengths[0] == T (all T for a dense shape)."""
        if self.lengths_range is None:
            return np.full(self.B, self.T, dtype=np.int64)
        lo, hi = self.lengths_range
        rng = np.random.default_rng(LENGTHS_SEED)
        lengths = np.sort(rng.integers(lo, hi + 1, size=self.B))[::-1].astype(np.int64)
        lengths[0] = self.T
        return lengths

    def batch_sizes(self) -> np.ndarray | None:
        """int64 [T] (PackedSequence convention) for a varlen shape, None for a dense one."""
        if self.lengths_range is None:
            return None
        lengths = self.lengths()
        return (lengths[None, :] > np.arange(self.T)[:, None]).sum(axis=1).astype(np.int64)

    def rows(self, effective: bool = True) -> int:
        """T*B, or the sum of the lengths (effective, varlen)."""
        return int(self.lengths().sum()) if effective else self.T * self.B

    def flops_backward(self, effective: bool = True, dx: bool = True) -> int:
        """GEMM FLOPs of the backward; ``dx=False`` drops layer 0's dx GEMM (output_mask)."""
        return lstm_flops(self.rows(effective), self.I, self.H, self.L, self.D, "backward", dx)

    def flops_forward(self, effective: bool = True) -> int:
        return lstm_flops(self.rows(effective), self.I, self.H, self.L, self.D, "forward")

    def flops_fwd_bwd(self, effective: bool = True) -> int:
        return self.flops_forward(effective) + self.flops_backward(effective)

    def scaled(self, max_t: int = 6) -> Shape:
        """A small version for the correctness gate: T <= max_t, B <= 5, sizes / 16 (>= 5),
        same L, D and length rule (range scaled to the new T)."""
        t = min(self.T, max_t)
        lr = None
        if self.lengths_range is not None:
            lo = max(1, round(self.lengths_range[0] * t / self.T))
            lr = (min(lo, t), t)
        return replace(self, id=f"{self.id}-gate", T=t, B=min(self.B, 5), I=max(5, self.I // 16),
                       H=max(5, self.H // 16), lengths_range=lr)  # fmt: skip

    def label(self) -> str:
        s = f"T{self.T}-B{self.B}-I{self.I}-H{self.H}-L{self.L}-D{self.D}"
        if self.lengths_range is not None:
            s += f"-len{self.lengths_range[0]}..{self.lengths_range[1]}"
        return s

    def to_dict(self) -> dict:
        return asdict(self)

    @staticmethod
    def from_dict(d: dict) -> Shape:
        d = dict(d)
        if d.get("lengths_range") is not None:
            d["lengths_range"] = tuple(d["lengths_range"])
        return Shape(**d)


SHAPES: list[Shape] = [
    Shape("small-1", 3, 12, 16, 16, 8, 2, note="oneDNN small, deep stack"),
    Shape("small-2", 200, 8, 128, 128, 1, 2, note="small hidden, long sequence"),
    Shape("med-1", 25, 16, 512, 512, 1, 1, note="DeepBench"),
    Shape("med-2", 150, 16, 256, 256, 1, 1, note="DeepBench"),
    Shape("med-3", 100, 32, 256, 256, 1, 1),
    Shape("med-4", 250, 32, 128, 256, 1, 1, note="haste"),
    Shape("med-5", 50, 128, 256, 256, 1, 2, note="GNMT encoder style"),
    Shape("med-6", 100, 64, 512, 512, 2, 1, note="two layers"),
    Shape("large-1", 50, 16, 1024, 1024, 1, 1),
    Shape("large-2", 25, 64, 1024, 1024, 1, 1, note="DeepBench"),
    Shape("varlen-1", 100, 32, 256, 256, 1, 1, (50, 100), "lengths uniform in [50, 100]"),
    Shape("varlen-2", 50, 32, 256, 256, 2, 2, (5, 50), "lengths uniform in [5, 50]"),
]

BY_ID: dict[str, Shape] = {s.id: s for s in SHAPES}


def select(ids: str | None) -> list[Shape]:
    """Shapes named in a comma-separated list (all when None or empty), in the given order."""
    names = [n.strip() for n in ids.split(",")] if ids else list(BY_ID)
    if unknown := [n for n in names if n not in BY_ID]:
        raise SystemExit(f"unknown shape(s) {unknown}; known: {', '.join(BY_ID)}")
    return [BY_ID[n] for n in names]


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
