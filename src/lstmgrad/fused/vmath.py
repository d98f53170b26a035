"""Vectorisable exp, sigmoid and tanh for the Numba kernels.

libm's expf/tanhf are opaque calls that stop LLVM from vectorising a loop (over ten times
slower: docs/design.md#kernel-measurements). For float32 these are written from arithmetic
and one bit cast, so a loop over them compiles to SIMD code: exp is a Cody-Waite range
reduction and a degree-6 polynomial (at most 1.01 ulp on [-87, 88] with the kernels' fused
multiply-adds, 0.98 without); tanh an odd polynomial below 0.625 and 1 - 2 / (exp(2|x|) + 1)
above (at most 1.26 ulp on [-20, 20]); sigmoid 1 / (1 + exp(-x)) (2.5 ulp), 0 below -88.72 where
exp(-x) overflows float32 (as with libm's exp: sigmoid(-inf) = 0). Bounds tested in
tests/test_fused.py. float64 uses libm (the accurate path).
"""

from __future__ import annotations

import math

import numpy as np
from llvmlite import ir as llvmlite_ir
from numba import types
from numba.core.extending import intrinsic, overload


@intrinsic
def _pow2_float32(typingctx, n):  # pragma: no cover - compiled
    """2**n as float32 for a float32 n holding an integer in [-126, 127], in 32-bit integer
    operations (Numba's own integer arithmetic widens to int64, which AVX2 cannot convert
    to or from packed floats: the loop would not vectorise)."""
    if n != types.float32:
        return None

    def codegen(context, builder, sig, args):
        i32 = llvmlite_ir.IntType(32)
        k = builder.fptosi(args[0], i32)
        bits = builder.shl(builder.add(k, i32(127)), i32(23))
        return builder.bitcast(bits, context.get_value_type(types.float32))

    return types.float32(types.float32), codegen


def vexp(x):  # pragma: no cover - replaced by the overload inside Numba
    """exp(x) inside Numba kernels."""
    raise NotImplementedError("vexp is only callable from Numba-compiled code")


def vsigmoid(x):  # pragma: no cover
    """1 / (1 + exp(-x)) inside Numba kernels."""
    raise NotImplementedError("vsigmoid is only callable from Numba-compiled code")


def vtanh(x):  # pragma: no cover
    """tanh(x) inside Numba kernels."""
    raise NotImplementedError("vtanh is only callable from Numba-compiled code")


def one(x):  # pragma: no cover
    """1 in the type of x, so that float32 arithmetic is not promoted to float64."""
    raise NotImplementedError("one is only callable from Numba-compiled code")


@overload(one)
def _one(x):  # pragma: no cover - compiled
    if x == types.float32:
        return lambda x: np.float32(1.0)
    return lambda x: 1.0


@overload(vexp)
def _vexp(x):  # pragma: no cover - compiled
    if x == types.float32:

        def impl(x):
            x = min(max(x, np.float32(-87.33654)), np.float32(88.3762626647949))
            # floor by truncation and a correction, in float32 (math.floor's int64 result,
            # like np.floor on a scalar, keeps the loop from vectorising without AVX-512)
            t = x * np.float32(1.44269504088896341) + np.float32(0.5)
            n = np.float32(np.int32(t))
            n = n - np.float32(1.0) if n > t else n
            r = x - n * np.float32(0.693359375) + n * np.float32(2.12194440e-4)
            p = np.float32(1.9875691500e-4)
            p = p * r + np.float32(1.3981999507e-3)
            p = p * r + np.float32(8.3334519073e-3)
            p = p * r + np.float32(4.1665795894e-2)
            p = p * r + np.float32(1.6666665459e-1)
            p = p * r + np.float32(5.0000001201e-1)
            y = p * r * r + r + np.float32(1.0)
            return y * _pow2_float32(n)

        return impl
    return lambda x: math.exp(x)


@overload(vsigmoid)
def _vsigmoid(x):  # pragma: no cover - compiled
    if x == types.float32:

        def impl(x):
            s = np.float32(1.0) / (np.float32(1.0) + vexp(-x))
            # 0 where exp(-x) overflows float32, as libm's exp gives (vexp stops at its largest
            # finite power): sigmoid(-inf) is 0 and its derivative s(1 - s) too, so a product
            # with an infinite input gives NaN where torch's does
            return np.float32(0.0) if x < np.float32(-88.72284) else s

        return impl
    return lambda x: 1.0 / (1.0 + math.exp(-x))


@overload(vtanh)
def _vtanh(x):  # pragma: no cover - compiled
    if x == types.float32:

        def impl(x):
            ax = abs(x)
            z = x * x
            p = np.float32(-5.70498872745e-3)
            p = p * z + np.float32(2.06390887954e-2)
            p = p * z - np.float32(5.37397155531e-2)
            p = p * z + np.float32(1.33314422036e-1)
            p = p * z - np.float32(3.33332819422e-1)
            small = p * z * x + x
            e = vexp(np.float32(2.0) * min(ax, np.float32(44.0)))
            big = np.float32(1.0) - np.float32(2.0) / (e + np.float32(1.0))
            big = big if x >= np.float32(0.0) else -big
            return small if ax < np.float32(0.625) else big

        return impl
    return lambda x: math.tanh(x)
