"""Scratch memory: carve typed arrays out of one byte buffer (the C-style mirror's workspace).

An engine declares its scratch as a list of (shape, dtype) slots; ``workspace_bytes`` sizes it
and ``Arena.take`` hands out the slots in the same order, each 64-byte aligned. Without a buffer
the arena uses the calling thread's cached scratch, so the Pythonic API and the mirror run the
same code. ``block`` allocates a call's results in one recycled block.
"""

from __future__ import annotations

import functools
import math
import os
import threading
import weakref
from collections.abc import Sequence

import numpy as np

ALIGN = 64
Slot = tuple[tuple[int, ...], np.dtype]

# Each thread keeps its largest scratch buffer for the next call: a fresh buffer costs a page
# fault per 4 KiB on first touch (glibc maps large blocks anew and unmaps them on free), up to
# half of a forward's time. The buffer never escapes a call.
_local = threading.local()


def _scratch(nbytes: int) -> np.ndarray:
    """A uint8 scratch buffer of at least ``nbytes``, reused by the calling thread."""
    buf = getattr(_local, "buffer", None)
    if buf is None or buf.nbytes < nbytes:
        buf = np.empty(nbytes, dtype=np.uint8)
        _local.buffer = buf
    return buf


def kept(name: str, nbytes: int) -> np.ndarray:
    """A uint8 buffer of at least ``nbytes``, the calling thread's own under ``name``, reused
    by its later calls (for scratch a GEMM back end sizes itself: a packed weight)."""
    buffers = getattr(_local, "kept", None)
    if buffers is None:
        buffers = _local.kept = {}
    buf = buffers.get(name)
    if buf is None or buf.nbytes < nbytes:
        buf = buffers[name] = np.empty(nbytes, dtype=np.uint8)
    return buf


def kept_bytes(name: str) -> int:
    """Bytes of the calling thread's kept buffer ``name`` (:func:`kept`; 0 where none)."""
    buf = (getattr(_local, "kept", None) or {}).get(name)
    return 0 if buf is None else int(buf.nbytes)


def scratch_held() -> int:
    """Bytes of the calling thread's kept scratch buffer (a call that fits reuses it)."""
    buf = getattr(_local, "buffer", None)
    return 0 if buf is None else int(buf.nbytes)


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def workspace_bytes(slots: Sequence[Slot]) -> int:
    """Bytes needed for ``slots`` carved in order, each aligned to 64 bytes (plus alignment slack)."""
    return _bytes_of(tuple(slots))


@functools.lru_cache(maxsize=512)  # the same slots every call of a shape
def _bytes_of(slots: tuple[Slot, ...]) -> int:
    total = sum(_aligned(math.prod(shape) * np.dtype(dt).itemsize) for shape, dt in slots)
    return total + ALIGN if total else 0


# Result blocks are recycled too: a block goes back to a small pool when the last array the
# caller holds of it is collected (a weakref finalizer on the block's base array), so a
# training loop gets already-mapped memory instead of faulting in fresh pages every call.
_POOL_MAX_BYTES = 1 << 30
# Reentrant: the cyclic GC may run a result's finalizer (_recycle) in a thread that already
# holds the lock, inside _recycle or _result_memory; a plain Lock would deadlock that thread.
_pool_lock = threading.RLock()
_pool: dict[int, list[np.ndarray]] = {}
_pool_bytes = 0


def _after_fork_in_child() -> None:
    """A forked child starts with a new lock and an empty pool: another thread of the parent
    may have held the lock at the fork, and that thread does not exist in the child."""
    global _pool_lock, _pool, _pool_bytes
    _pool_lock = threading.RLock()
    _pool = {}
    _pool_bytes = 0


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _recycle(mem: np.ndarray) -> None:
    global _pool_bytes
    with _pool_lock:
        if _pool_bytes + mem.nbytes <= _POOL_MAX_BYTES and len(_pool.get(mem.nbytes, ())) < 2:
            _pool.setdefault(mem.nbytes, []).append(mem)
            _pool_bytes += mem.nbytes


def _result_memory(nbytes: int, dtype: np.dtype) -> np.ndarray:
    """A 1-D array of ``dtype`` over ``nbytes`` of recycled (or new) memory; its memory returns
    to the pool once it and every view of it are gone."""
    global _pool_bytes
    with _pool_lock:
        free = _pool.get(nbytes)
        mem = free.pop() if free else None
        if mem is not None:
            _pool_bytes -= nbytes
    if mem is None:
        mem = np.empty(nbytes, dtype=np.uint8)
    # frombuffer over a memoryview: views of ``raw`` keep ``raw`` itself as their base, so the
    # finalizer fires only when the caller has dropped every result array.
    raw = np.frombuffer(memoryview(mem.data), dtype=dtype)
    weakref.finalize(raw, _recycle, mem).atexit = False
    return raw


def release_memory() -> None:
    """Give back the memory kept for later calls: the calling thread's scratch buffers and the
    pool of recycled result blocks (all rebuilt on demand)."""
    global _pool_bytes
    _local.buffer = None
    _local.kept = None
    with _pool_lock:
        _pool.clear()
        _pool_bytes = 0


def block(shapes: Sequence[tuple[int, ...]], dtype: np.dtype) -> list[np.ndarray]:
    """New C-contiguous arrays of ``shapes`` that share one allocation (see Arena.take_all)."""
    dtype = np.dtype(dtype)
    if len(set(shapes)) == 1:  # one shape (e.g. the saved activations): views made in C
        count, size = len(shapes), math.prod(shapes[0])
        flat = _result_memory(max(count * size, 1) * dtype.itemsize, dtype)
        return list(flat[: count * size].reshape(count, *shapes[0]))
    sizes = [math.prod(s) for s in shapes]
    flat = _result_memory(max(sum(sizes), 1) * dtype.itemsize, dtype)
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
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes == 0:
            return np.empty(shape, dtype=dtype)
        assert self._buffer is not None  # take_all sets it
        end = self._offset + nbytes
        if end > self._buffer.nbytes:
            raise MemoryError(
                f"workspace exhausted: need {end} bytes, the buffer has {self._buffer.nbytes}"
            )
        view = self._buffer[self._offset : end].view(dtype).reshape(shape)
        self._offset = _aligned(end)
        return view

    def take_all(self, slots: Sequence[Slot]) -> list[np.ndarray]:
        """One array per slot, in order. Without a buffer, all of them are carved from the
        calling thread's reused scratch buffer (see ``_scratch``)."""
        if self._buffer is None:
            self._buffer = _scratch(workspace_bytes(slots))
            self._offset = (-self._buffer.ctypes.data) % ALIGN
        return [self.take(shape, dt) for shape, dt in slots]
