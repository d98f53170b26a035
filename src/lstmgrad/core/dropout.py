"""Inter-layer dropout masks of the training forward (the dropout rule of docs/contract.md)."""

from __future__ import annotations

import numpy as np

from .layout import Dims


def make_dropout_masks(dims: Dims, p: float, seed: int | None, dtype: np.dtype) -> list[np.ndarray]:
    """L-1 inverted-dropout masks [T, B, D*H], one per layer above the first.

    Each element is 0 with probability p, else 1/(1-p) (all 0 when p = 1), drawn from
    ``numpy.random.default_rng(seed)`` layer by layer, so a seed gives the same masks with every
    engine.
    """
    if p <= 0.0 or dims.L < 2:
        return []
    rng = np.random.default_rng(seed)
    scale = 1.0 / (1.0 - p) if p < 1.0 else 0.0
    shape = (dims.T, dims.B, dims.D * dims.H)
    return [np.where(rng.random(shape) >= p, scale, 0.0).astype(dtype) for _ in range(dims.L - 1)]
