"""batch_sizes <-> lengths <-> mask."""

from __future__ import annotations

import numpy as np


def mask_from_batch_sizes(batch_sizes: np.ndarray, batch: int) -> np.ndarray:
    """Boolean mask [T, B]: m[t, b] = b < batch_sizes[t]."""
    return np.arange(batch)[None, :] < np.asarray(batch_sizes, dtype=np.int64)[:, None]


def batch_sizes_from_lengths(
    lengths: np.ndarray | list[int], steps: int | None = None
) -> np.ndarray:
    """batch_sizes int64 [T] of sequences of the given lengths (any order; T = max length)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    t = int(lengths.max(initial=0)) if steps is None else steps
    return (lengths[None, :] > np.arange(t)[:, None]).sum(axis=1).astype(np.int64)
