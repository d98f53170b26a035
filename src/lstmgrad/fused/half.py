"""float16 <-> float32 conversions of the fused engine, in Numba.

NumPy converts float16 in software, slowly, and far more slowly for results in float16's
subnormal range (gradients of a mean loss over thousands of elements live there; figures:
docs/design.md#kernel-measurements).
These kernels convert with integer operations at the same rounding (IEEE round to nearest,
ties to even; infinities and NaNs kept, a NaN's sign too), whatever the values.

:func:`assign` is the engine's ``dst[...] = src`` where one side is float16 and the other
float32: the GEMM library's own conversion where the plan chose it (torch's, as exact), else
the kernels where both arrays can be seen as 2-D without a copy, NumPy otherwise.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numba
import numpy as np
from numba import prange

from .kernels import jit, row_block

_parallel = jit(parallel=True)  # the split conversions (kernels' flags)
_F16 = np.dtype(np.float16)
_F32 = np.dtype(np.float32)


@numba.njit(cache=True, nogil=True, inline="always")
def _half_bits(f: np.uint32) -> np.uint16:  # pragma: no cover - compiled
    """The float16 bits nearest (ties to even) to the float32 with bits ``f``."""
    sign = (f >> np.uint32(16)) & np.uint32(0x8000)
    a = f & np.uint32(0x7FFFFFFF)
    e = a >> np.uint32(23)
    if a > np.uint32(0x7F800000):  # NaN: quiet, top payload bits kept
        r = np.uint32(0x7E00) | ((a >> np.uint32(13)) & np.uint32(0x3FF))
    elif e >= np.uint32(143):  # |x| >= 65536, or infinity
        r = np.uint32(0x7C00)
    elif e >= np.uint32(113):  # a normal float16 (or a carry into infinity)
        odd = (a >> np.uint32(13)) & np.uint32(1)
        r = (a - np.uint32(112 << 23) + np.uint32(0xFFF) + odd) >> np.uint32(13)
    else:  # float16 subnormals and zero: units of 2^-24
        m = (a & np.uint32(0x7FFFFF)) | (np.uint32(0x800000) if e > 0 else np.uint32(0))
        shift = min(np.uint32(126) - e, np.uint32(31))
        q = m >> shift
        rem = m & ((np.uint32(1) << shift) - np.uint32(1))
        half = np.uint32(1) << (shift - np.uint32(1))
        if rem > half or (rem == half and (q & np.uint32(1))):
            q += np.uint32(1)
        r = q
    return np.uint16(r | sign)


@numba.njit(cache=True, nogil=True, inline="always")
def _float_bits(h: np.uint16) -> np.uint32:  # pragma: no cover - compiled
    """The float32 bits of a float16 with bits ``h`` that is not subnormal (exact)."""
    x = np.uint32(h)
    sign = (x & np.uint32(0x8000)) << np.uint32(16)
    e = (x >> np.uint32(10)) & np.uint32(0x1F)
    m = x & np.uint32(0x3FF)
    if e == np.uint32(31):
        return sign | np.uint32(0x7F800000) | (m << np.uint32(13))
    if e == np.uint32(0):  # zero
        return sign
    return sign | ((e + np.uint32(112)) << np.uint32(23)) | (m << np.uint32(13))


_SUBNORMAL_UNIT = np.float32(2.0**-24)


@numba.njit(cache=True, nogil=True, inline="always")
def _is_subnormal(h: np.uint16) -> bool:  # pragma: no cover - compiled
    return (h & np.uint16(0x7C00)) == np.uint16(0) and (h & np.uint16(0x3FF)) != np.uint16(0)


@numba.njit(cache=True, nogil=True, inline="always")
def _subnormal(h: np.uint16) -> np.float32:  # pragma: no cover - compiled
    """The value of a subnormal float16 with bits ``h``: its significand x 2^-24 (exact)."""
    v = np.float32(h & np.uint16(0x3FF)) * _SUBNORMAL_UNIT
    return -v if h & np.uint16(0x8000) else v


@numba.njit(cache=True, nogil=True)
def to_half(src, dst):  # pragma: no cover - compiled
    """dst [R, C] uint16 (float16 bits) = src [R, C] uint32 (float32 bits), rounded."""
    for i in range(src.shape[0]):
        for j in range(src.shape[1]):
            dst[i, j] = _half_bits(src[i, j])


@numba.njit(cache=True, nogil=True)
def to_float(src, bits, values):  # pragma: no cover - compiled
    """float32 [R, C] = float16 [R, C] exactly: ``src`` the float16 bits (uint16), ``bits``
    and ``values`` two views of the result (uint32, float32)."""
    for i in range(src.shape[0]):
        for j in range(src.shape[1]):
            h = src[i, j]
            if _is_subnormal(h):
                values[i, j] = _subnormal(h)
            else:
                bits[i, j] = _float_bits(h)


@numba.njit(cache=True, nogil=True)
def to_float_table(src, table, dst):  # pragma: no cover - compiled
    """float32 [R, C] = float16 [R, C] (``src`` its bits, uint16) looked up in ``table``, the
    float32 value of each of the 65536 float16s: a load per element, which vectorises where
    :func:`to_float`'s branch does not."""
    for i in range(src.shape[0]):
        for j in range(src.shape[1]):
            dst[i, j] = table[src[i, j]]


_table: np.ndarray | None = None


def float_table() -> np.ndarray:
    """The float32 value of every float16 (by its bits), made once by :func:`to_float`."""
    global _table
    if _table is None:
        bits = np.empty((1, 1 << 16), np.uint32)
        to_float(np.arange(1 << 16, dtype=np.uint16)[None], bits, bits.view(np.float32))
        _table = bits.view(np.float32)[0]
    return _table


@numba.njit(cache=True, nogil=True)
def round_to_half(bits, values):  # pragma: no cover - compiled
    """float32 [R, C] in place (``bits`` uint32 and ``values`` float32 views of it): each value
    rounded to float16's."""
    for i in range(bits.shape[0]):
        for j in range(bits.shape[1]):
            h = _half_bits(bits[i, j])
            if _is_subnormal(h):
                values[i, j] = _subnormal(h)
            else:
                bits[i, j] = _float_bits(h)


# the conversions with the rows split over ``parts`` threads: element by
# element, so the same bits whatever the number of parts.


@_parallel
def to_half_split(src, dst, parts):  # pragma: no cover
    """:func:`to_half` on ``parts`` blocks of rows at once."""
    for q in prange(parts):
        lo, hi = row_block(src.shape[0], parts, q)
        to_half(src[lo:hi], dst[lo:hi])


@_parallel
def to_float_table_split(src, table, dst, parts):  # pragma: no cover
    """:func:`to_float_table` on ``parts`` blocks of rows at once."""
    for q in prange(parts):
        lo, hi = row_block(src.shape[0], parts, q)
        to_float_table(src[lo:hi], table, dst[lo:hi])


@_parallel
def round_to_half_split(bits, values, parts):  # pragma: no cover
    """:func:`round_to_half` on ``parts`` blocks of rows at once."""
    for q in prange(parts):
        lo, hi = row_block(bits.shape[0], parts, q)
        round_to_half(bits[lo:hi], values[lo:hi])


def _matrix(a: np.ndarray) -> np.ndarray | None:
    """``a`` seen as [rows, last axis] without a copy, or None where that needs one."""
    if a.ndim == 0:
        return None
    view = a.view()
    try:
        view.shape = (-1, a.shape[-1]) if a.shape[-1] else (a.size, 0)
    except (AttributeError, ValueError):
        return None
    return view


_SPLIT: dict[str, Any] = {"to_half": to_half_split, "to_float_table": to_float_table_split,
          "round_to_half": round_to_half_split}  # fmt: skip
_ONE_THREAD: dict[str, Any] = {"to_half": to_half, "to_float_table": to_float_table,
               "round_to_half": round_to_half}  # fmt: skip


def _run(kernel: str, rows: int, threads: int, *args: np.ndarray) -> None:
    """One of the conversion kernels above on ``rows`` rows: split over ``threads`` threads
    (the ``_split`` kernels, where the plan gives more than one) or on this one."""
    parts = min(threads, rows)
    if parts > 1:
        _SPLIT[kernel](*args, parts)
    else:
        _ONE_THREAD[kernel](*args)


class Conversion(NamedTuple):
    """How the engine converts between float16 and float32: the kernels on ``threads`` threads,
    or ``library`` (the GEMM back end's own conversion, :meth:`lstmgrad.fused.gemm.Gemm.convert`)
    where given and able to."""

    threads: int = 1
    library: Callable[[np.ndarray, np.ndarray], bool] | None = None


ONE_THREAD = Conversion()


def assign(dst: np.ndarray, src: np.ndarray, how: Conversion = ONE_THREAD) -> None:
    """``dst[...] = src`` for equal shapes; float32 -> float16 rounds to nearest even. The
    kernels' rows split over ``how.threads`` threads where more than one: the same bits."""
    if dst.shape == src.shape and dst.size:
        pair = (src.dtype, dst.dtype)
        if pair in ((_F32, _F16), (_F16, _F32)):
            if how.library is not None and how.library(dst, src):
                return
            d, s = _matrix(dst), _matrix(src)
            if d is not None and s is not None:
                if pair == (_F32, _F16):
                    _run("to_half", d.shape[0], how.threads, s.view(np.uint32),
                         d.view(np.uint16))  # fmt: skip
                else:
                    _run("to_float_table", d.shape[0], how.threads, s.view(np.uint16),
                         float_table(), d)  # fmt: skip
                return
    dst[...] = src


def converted(a: np.ndarray, dtype: np.dtype, how: Conversion = ONE_THREAD) -> np.ndarray:
    """``a`` itself where it has ``dtype``, else a contiguous copy in it (as :func:`assign`)."""
    if a.dtype == dtype:
        return a
    out = np.empty(a.shape, dtype)
    assign(out, a, how)
    return out


def round_in_place(a: np.ndarray, threads: int = 1) -> None:
    """float32 ``a``'s values rounded to float16's, kept in float32 (the kernel's rows split
    over ``threads`` threads as in :func:`assign`)."""
    m = _matrix(a)
    if m is None or not a.size:
        a[...] = a.astype(_F16)
        return
    _run("round_to_half", m.shape[0], threads, m.view(np.uint32), m)
