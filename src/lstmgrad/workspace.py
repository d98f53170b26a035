"""Scratch memory: carve typed arrays out of one byte buffer (the C-style mirror's workspace).

An engine declares its scratch as a list of (shape, dtype) slots; ``workspace_bytes`` sizes it
and ``Arena.take`` hands out the slots in the same order, each 64-byte aligned. Without a buffer
the arena allocates from the heap, so the Pythonic API and the mirror run the same code.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

ALIGN = 64
Slot = tuple[tuple[int, ...], np.dtype]


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def workspace_bytes(slots: Sequence[Slot]) -> int:
    """Bytes needed for ``slots`` carved in order, each aligned to 64 bytes (plus alignment slack)."""
    total = sum(
        _aligned(int(np.prod(shape, dtype=np.int64)) * np.dtype(dt).itemsize) for shape, dt in slots
    )
    return total + ALIGN if total else 0


def block(shapes: Sequence[tuple[int, ...]], dtype: np.dtype) -> list[np.ndarray]:
    """New C-contiguous arrays of ``shapes`` that share one allocation (see Arena.take_all)."""
    sizes = [int(np.prod(s, dtype=np.int64)) for s in shapes]
    flat = np.empty(sum(sizes), dtype=dtype)
    out, start = [], 0
    for shape, size in zip(shapes, sizes, strict=True):
        out.append(flat[start : start + size].reshape(shape))
        start += size
    return out


class Arena:
    """Hands out typed views of ``buffer`` (uint8, C-contiguous), or of one heap block if None."""

    def __init__(self, buffer: np.ndarray | None = None) -> None:
        self._buffer = buffer
        self._offset = 0
        if buffer is not None:
            misalign = (-buffer.ctypes.data) % ALIGN
            self._offset = misalign

    def take(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """An uninitialised array of ``shape`` and ``dtype``."""
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if self._buffer is None or nbytes == 0:
            return np.empty(shape, dtype=dtype)
        end = self._offset + nbytes
        if end > self._buffer.nbytes:
            raise MemoryError(
                f"workspace exhausted: need {end} bytes, the buffer has {self._buffer.nbytes}"
            )
        view = self._buffer[self._offset : end].view(dtype).reshape(shape)
        self._offset = _aligned(end)
        return view

    def take_all(self, slots: Sequence[Slot]) -> list[np.ndarray]:
        """One array per slot, in order. Without a buffer, all of them come from one fresh
        allocation: NumPy backs a large one with transparent huge pages, where one array per
        slot would pay a page fault per 4 KiB on first touch (measured: 26 MB in 8 arrays took
        10.6 ms to touch, in one block 0.8 ms)."""
        if self._buffer is None:
            self._buffer = np.empty(workspace_bytes(slots), dtype=np.uint8)
            self._offset = (-self._buffer.ctypes.data) % ALIGN
        return [self.take(shape, dt) for shape, dt in slots]
