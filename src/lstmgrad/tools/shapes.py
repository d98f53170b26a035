"""The named LSTM shapes of the benchmarks and the one parser of a shape given on a command line.

Legend: T steps, B batch, I input size, H hidden size, L layers, D directions (2 if
bidirectional), I_l = I for layer 0 and D*H above. FLOPs count the GEMMs only (2 per
multiply-add): the backward of one (layer, direction) is 16*T*B*H*(H + I_l) (recurrent dh,
dx, dW_ih, dW_hh), its forward 8*T*B*H*(H + I_l). For variable lengths the *effective* count
replaces T*B by the sum of the lengths; the *padded* count keeps T*B.

A shape on a command line is written ``T,B,I,H[,L[,D]]`` (L and D are 1 unless given) or by
its name in :data:`SHAPES` (:func:`parse_shape`); a list of shapes is comma-separated names
(:func:`parse_names`). ``lstmgrad bench``, ``lstmgrad tune`` and the repository's benchmarks/
all read shapes through these two functions.

This module imports NumPy and the standard library only, nothing of lstmgrad: benchmarks/
loads it by its path in the worker process that times torch and must not import lstmgrad.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import numpy as np

LENGTHS_SEED = 1234  # seed of the varlen lengths draw
SIZES_FORM = "T,B,I,H[,L[,D]]"


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

    def sizes(self) -> dict[str, int]:
        """{"T": T, "B": B, "I": I, "H": H, "L": L, "D": D}."""
        return {"T": self.T, "B": self.B, "I": self.I, "H": self.H, "L": self.L, "D": self.D}

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


def _known(varlen: bool) -> str:
    return ", ".join(s.id for s in SHAPES if varlen or not s.varlen)


def _named(name: str, varlen: bool) -> Shape:
    """The shape called ``name``; ValueError for an unknown name, or a variable-length one
    where ``varlen`` is False."""
    shape = BY_ID.get(name)
    if shape is None:
        raise ValueError(f"unknown shape name {name!r}; known: {_known(varlen)}")
    if shape.varlen and not varlen:
        raise ValueError(
            f"{name} has variable lengths ({shape.note}): lstmgrad bench and tune take dense "
            f"shapes only (the repository's benchmarks/run.py times variable lengths); dense "
            f"shapes: {_known(False)}"
        )
    return shape


def parse_shape(text: str, varlen: bool = False) -> Shape:
    """A shape written ``T,B,I,H[,L[,D]]`` (positive integers, L = D = 1 unless given, D 1 or
    2; its id is its :meth:`Shape.label`) or a name of :data:`SHAPES` (one with variable
    lengths only where ``varlen``). ValueError saying what is wrong and the expected form."""
    text = text.strip()
    form = f"expected {SIZES_FORM} (positive integers, D 1 or 2) or a shape name, got {text!r}"
    if text in BY_ID:
        return _named(text, varlen)
    if "," not in text and not text.isdigit():
        raise ValueError(f"{form}: no shape has that name (known: {_known(varlen)})")
    parts = [p.strip() for p in text.split(",")]
    if not 4 <= len(parts) <= 6:
        raise ValueError(f"{form}: {len(parts)} value{'s' * (len(parts) > 1)}, not 4 to 6")
    values = []
    for name, part in zip("TBIHLD", parts, strict=False):
        try:
            value = int(part)
        except ValueError:
            raise ValueError(f"{form}: {name} = {part!r} is not an integer") from None
        if value < 1:
            raise ValueError(f"{form}: {name} = {value} is not positive")
        values.append(value)
    values += [1] * (6 - len(values))
    if values[5] > 2:
        raise ValueError(f"{form}: D = {values[5]} (directions) must be 1 or 2")
    t, b, i, h, layers, d = values
    shape = Shape("", t, b, i, h, layers, d)
    return replace(shape, id=shape.label())


def parse_names(text: str, varlen: bool = False) -> list[Shape]:
    """The shapes of a comma-separated list of names of :data:`SHAPES`, in the given order
    (one with variable lengths only where ``varlen``). ValueError naming the first bad name."""
    names = [n.strip() for n in text.split(",")]
    if not all(names):
        raise ValueError(
            f"expected comma-separated shape names (e.g. med-3,large-1), got {text!r}: an "
            "empty name"
        )
    return [_named(n, varlen) for n in names]


def help_lines(varlen: bool = False) -> list[str]:
    """One line per named shape (dense ones only unless ``varlen``): name, sizes and note,
    for a command's ``--help``."""
    rows = [s for s in SHAPES if varlen or not s.varlen]
    width = max(len(s.id) for s in rows)
    out = []
    for s in rows:
        sizes = ",".join(str(v) for v in s.sizes().values())
        note = f"  {s.note}" if s.note else ""
        out.append(f"  {s.id.ljust(width)}  {sizes.ljust(20)}{note}".rstrip())
    return out
