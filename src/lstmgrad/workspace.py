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


class Arena:
    """Hands out typed views of ``buffer`` (uint8, C-contiguous), or heap arrays if None."""

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
        """One array per slot, in order."""
        return [self.take(shape, dt) for shape, dt in slots]
