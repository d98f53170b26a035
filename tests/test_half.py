"""The fused engine's float16 <-> float32 conversions (lstmgrad.fused.half) against NumPy's:
every float16 value, every rounding boundary of float32 -> float16, random bit patterns,
specials, strided views; and the engine in float16 with gradients in float16's subnormal
range (where NumPy's conversion is slowest) against the float64 reference."""

from __future__ import annotations

import numpy as np
import pytest

import lstmgrad
from lstmgrad.fused import half

ALL_HALVES = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)


def _same(got: np.ndarray, want: np.ndarray) -> None:
    """Bit for bit, but any NaN for a NaN (with its sign)."""
    assert got.dtype == want.dtype and got.shape == want.shape
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    assert np.array_equal(np.signbit(got[nan]), np.signbit(want[nan]))
    ints = {2: np.uint16, 4: np.uint32}[got.itemsize]
    assert np.array_equal(got[~nan].view(ints), want[~nan].view(ints))


def _boundaries() -> np.ndarray:
    """float32 values at and around every float16 rounding boundary, the float16 values
    themselves, overflow, underflow and specials."""
    finite = ALL_HALVES[np.isfinite(ALL_HALVES)].astype(np.float32)
    ladder = np.unique(finite.astype(np.float64))
    mids = ((ladder[1:] + ladder[:-1]) / 2).astype(np.float32)  # exact in float32
    specials = np.array(
        [65504, 65519, 65520, 65535, 65536, 1e30, np.inf, 2.0**-24, 2.0**-25, 3 * 2.0**-26,
         2.0**-26, 2.0**-14, 1e-45, 1e-40, 0.0, np.nan], np.float32,
    )  # fmt: skip
    return np.concatenate(
        [finite, mids, np.nextafter(mids, np.float32(np.inf)),
         np.nextafter(mids, np.float32(-np.inf)), specials, -specials]
    )  # fmt: skip


def test_float16_to_float32_every_value():
    got = np.empty(ALL_HALVES.shape, np.float32)
    half.assign(got, ALL_HALVES)
    _same(got, ALL_HALVES.astype(np.float32))


@pytest.mark.parametrize("which", ["boundaries", "random bits"])
def test_float32_to_float16_rounds_like_numpy(which):
    if which == "boundaries":
        values = _boundaries()
    else:
        rng = np.random.default_rng(7)
        values = rng.integers(0, 1 << 32, 2_000_000, dtype=np.uint64).astype(np.uint32)
        values = values.view(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        want = values.astype(np.float16)
    got = np.empty(values.shape, np.float16)
    half.assign(got, values)
    _same(got, want)
    in_place = values.copy()
    half.round_in_place(in_place)
    with np.errstate(over="ignore", invalid="ignore"):
        _same(in_place, want.astype(np.float32))


def test_strided_views_and_the_numpy_fallback():
    rng = np.random.default_rng(3)
    src = (rng.standard_normal((5, 4, 12)) * 1e-6).astype(np.float32)
    dst = np.full((5, 4, 24), np.float16(7))
    half.assign(dst[..., 6:18], src)  # rows of a wider array: a 2-D view without a copy
    _same(dst[..., 6:18], src.astype(np.float16))
    assert (dst[..., :6] == 7).all() and (dst[..., 18:] == 7).all()
    back = np.empty((12, 5, 4), np.float32)
    half.assign(back.transpose(1, 2, 0), dst[..., 6:18])  # not 2-D without a copy: NumPy
    _same(back.transpose(1, 2, 0), dst[..., 6:18].astype(np.float32))
    empty = np.empty((0, 3), np.float16)
    half.assign(empty, np.empty((0, 3), np.float32))


def test_float16_gradients_in_the_subnormal_range():
    """A mean loss over many elements gives float16 gradients near 1e-7, many of them
    subnormal: the engine's results stay within float16 rounding of the reference."""
    rng = np.random.default_rng(5)
    t, b, i, h = 6, 4, 5, 8
    params = [rng.uniform(-0.4, 0.4, s).astype(np.float16) for s in
              [(4 * h, i), (4 * h, h), (4 * h,), (4 * h,)]]  # fmt: skip
    x = rng.standard_normal((t, b, i)).astype(np.float16)
    hx = [rng.standard_normal((1, b, h)).astype(np.float16) for _ in range(2)]
    dy = (rng.standard_normal((t, b, h)) * 2e-7).astype(np.float16)
    assert (np.abs(dy[dy != 0]) < np.float16(2.0**-14)).mean() > 0.9  # mostly subnormal
    fw = lstmgrad.lstm_forward(x, params, hx)
    args = (x, hx, params, dy, None, None, *fw.saved[:7])
    got = lstmgrad.lstm_backward(*args)
    ref = lstmgrad.lstm_backward(*args, impl="reference")
    for g, w in zip([got.dx, got.dh_prev, got.dc_prev, *got.dparams],
                    [ref.dx, ref.dh_prev, ref.dc_prev, *ref.dparams], strict=True):  # fmt: skip
        assert g.dtype == np.float16
        g64, w64 = g.astype(np.float64), w.astype(np.float64)
        scale = np.abs(w64).max()
        assert scale > 0
        # float16 keeps ~11 bits; subnormals fewer: compare against the largest magnitude
        assert np.abs(g64 - w64).max() <= 4e-3 * scale + 2.0**-24


@pytest.mark.parametrize("parts", [2, 3, 7])
@pytest.mark.parametrize("rows", [1, 5, 64])
def test_split_conversions_equal_the_one_thread_kernels(rows, parts):
    """The conversions with their rows split over threads (fused.walks; more parts than rows
    too) give the one-thread kernels' bits, on every float16 value, every float32 -> float16
    rounding boundary and random float32 bit patterns. Numba runs the parts on as many threads
    as its pool has (one included)."""
    rng = np.random.default_rng(rows * 10 + parts)
    bits = rng.integers(0, 1 << 32, rows * 4096, dtype=np.uint64).astype(np.uint32)
    values = np.concatenate([_boundaries(), bits.view(np.float32)])
    values = values[: values.size // rows * rows].reshape(rows, -1)
    halves = np.resize(ALL_HALVES, values.shape)
    one, split = np.empty(values.shape, np.float16), np.empty(values.shape, np.float16)
    how = half.Conversion(threads=parts)
    half.assign(one, values)
    half.assign(split, values, how)
    _same(split, one)
    one32, split32 = np.empty(values.shape, np.float32), np.empty(values.shape, np.float32)
    half.assign(one32, halves)
    half.assign(split32, halves, how)
    _same(split32, one32)
    _same(half.converted(halves, np.dtype(np.float32), how), one32)
    in_one, in_split = values.copy(), values.copy()
    half.round_in_place(in_one)
    half.round_in_place(in_split, threads=parts)
    _same(in_split, in_one)
