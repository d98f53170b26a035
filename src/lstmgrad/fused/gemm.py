"""The GEMMs an engine runs, behind one small interface, so that one engine serves NumPy callers
(NumPy's BLAS) and torch callers (torch's BLAS / oneDNN, see :mod:`lstmgrad.ops.tensors`).

A back end only multiplies: which of its methods runs a product is the execution plan's choice
(:mod:`lstmgrad.planning.plan`), made from measurements on the machine in use.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

import numpy as np

try:
    from numpy.lib.array_utils import byte_bounds
except ImportError:  # NumPy < 2
    byte_bounds = np.byte_bounds  # type: ignore[attr-defined]

from .kernels import contiguous, matmul_into, transpose_into
from .walks import transpose_cols

# (a, out) -> a @ b for a fixed b: in out, or in the library's own new result, returned
FixedGemm = Callable[[np.ndarray, np.ndarray], np.ndarray]


class Gemm(Protocol):
    """A GEMM back end.

    ``kind``: "numpy" or "torch" (part of the plan's key). ``product_methods(dtype)``: the
    methods :meth:`product` and :meth:`nt` take for that compute dtype, the public
    one ("blas") first. ``fixed_methods(dtype)``: those :meth:`fixed` takes.

    ``product(a, b, scratch, method)``: a @ b in scratch, or in new memory where the method
    returns its own result (the caller uses the returned array). ``fixed(b, method, rows)``: the
    same product as a function of (a, out) for one b reused over many calls with at most
    ``rows`` rows in a (the recurrent product of every step); it returns the array holding the
    product: out, or the library's own result; a transposing copy the preparation makes runs on
    ``threads`` threads (the plan's ``transpose_threads``). ``nt(at, b, method)``: at @ b as a
    new array.
    ``threads()``: the threads the library's GEMMs use. ``convert(dst, src)``: ``dst[...] =
    src`` between float32 and float16 by the library itself, rounding as the engine's kernels
    (IEEE round to nearest even; :mod:`lstmgrad.fused.half`); False where it has no such
    conversion for these arrays (the kernels then convert). ``walk_gemm(dtype)``: the address
    of the library's own Fortran-convention GEMM for that compute dtype (sgemm_, dgemm_), which
    the engine's one-call step loops (fused.walks) call on their own thread for the recurrent
    product; 0 where there is none to call (the loops then multiply in Numba).
    ``walk_operand(b)``: the fixed operand b as that GEMM reads it (b itself; bfloat16 bits for
    a back end whose GEMM takes bfloat16). ``walk_gemm(dtype, packed=True)``: the address of
    the library's packed GEMM (MKL's sgemm_compute: the fixed operand packed once for every
    step), 0 where there is none; ``walk_pack_bytes(shape, rows)`` the bytes of a [K, N]
    operand packed for products of at most ``rows`` rows, ``walk_pack(b, rows, buf)`` b
    packed into the uint8 ``buf`` (at least that long), as the operand the step loops pass
    to that GEMM (:func:`lstmgrad.fused.kernels.packed_matmul`).
    ``library_lstm(dtype)``: whether the library has a fused LSTM of its own for storage of
    that dtype, and ``lstm_inference(call)`` runs an inference forward (a validated
    ``ForwardCall``: dense, nothing saved) through it: the time-major output [T, B, D*H], hy
    and cy [L*D, B, H] (the plan's ``library_lstm``).
    """

    kind: str

    def product_methods(self, dtype: np.dtype) -> tuple[str, ...]: ...

    def fixed_methods(self, dtype: np.dtype) -> tuple[str, ...]: ...

    def product(self, a: np.ndarray, b: np.ndarray, scratch: np.ndarray, method: str, /) -> Any: ...

    def fixed(self, b: np.ndarray, method: str, rows: int, threads: int = 1) -> FixedGemm: ...

    def nt(self, at: np.ndarray, b: np.ndarray, method: str, /) -> np.ndarray: ...

    def threads(self) -> int: ...

    def convert(self, dst: np.ndarray, src: np.ndarray, /) -> bool: ...

    def walk_gemm(self, dtype: np.dtype, packed: bool = False) -> int: ...

    def walk_operand(self, b: np.ndarray, /) -> np.ndarray: ...

    def walk_pack_bytes(self, shape: tuple[int, int], rows: int) -> int: ...

    def walk_pack(self, b: np.ndarray, rows: int, buf: np.ndarray) -> np.ndarray: ...

    def library_lstm(self, dtype: np.dtype) -> bool: ...

    def lstm_inference(self, call: Any, /) -> tuple[np.ndarray, np.ndarray, np.ndarray]: ...


_prepared: contextvars.ContextVar[tuple[list[np.ndarray], dict] | None] = contextvars.ContextVar(
    "lstmgrad_prepared_products", default=None
)


@contextlib.contextmanager
def reusing_prepared(arrays: Sequence[np.ndarray]) -> Iterator[None]:
    """Within the block, a fixed product (:meth:`Gemm.fixed`) of a matrix lying in one of
    ``arrays`` is prepared (transposed, packed) once and reused: for callers that run many
    calls over the same weights, which must not change while the block runs."""
    token = _prepared.set(([a for a in arrays if isinstance(a, np.ndarray)], {}))
    try:
        yield
    finally:
        _prepared.reset(token)


def _within(b: np.ndarray, arrays: list[np.ndarray]) -> bool:
    """b's memory lies inside one of ``arrays`` of its dtype."""
    if not b.size:
        return False
    lo, hi = byte_bounds(b)
    for a in arrays:
        if a.dtype == b.dtype and a.size:
            a_lo, a_hi = byte_bounds(a)
            if a_lo <= lo and hi <= a_hi:
                return True
    return False


def prepared(kind: str, b: np.ndarray, method: str, rows: int,
             make: Callable[[], FixedGemm]) -> FixedGemm:  # fmt: skip
    """``make()``, or the product made for the same matrix and method earlier in a
    :func:`reusing_prepared` block."""
    scope = _prepared.get()
    if scope is None or not _within(b, scope[0]):
        return make()
    key = (kind, b.__array_interface__["data"][0], b.shape, b.strides, b.dtype.str, method, rows)
    product = scope[1].get(key)
    if product is None:
        product = scope[1][key] = make()
    return product


def product_into(gemm: Gemm, a: np.ndarray, b: np.ndarray, out: np.ndarray, method: str) -> None:
    """out = a @ b by ``gemm.product``, copied in where the method returns its own result."""
    result = gemm.product(a, b, out, method)
    if result is not out:
        np.copyto(out, result)


def dense(a: np.ndarray, threads: int = 1) -> np.ndarray:
    """``a`` (2-D) C-contiguous: itself where it is; a transposing copy on ``threads`` threads
    (fused.walks) where it is the transposed view of a C-contiguous float array; else
    :func:`kernels.contiguous`. The same values whatever the thread count."""
    if a.flags.c_contiguous:
        return a
    src = a.T
    floats = a.dtype in (np.float32, np.float64)
    if threads > 1 and a.ndim == 2 and src.flags.c_contiguous and a.size and floats:
        n, width = src.shape
        out = np.empty(a.shape, dtype=a.dtype)
        transpose_cols(src.reshape(-1), width, n, 0, width, out.reshape(-1), threads)
        return out
    return contiguous(a)


def loop_product(b: np.ndarray) -> FixedGemm:
    """The "loop" method of :meth:`Gemm.fixed`: a Numba loop on one thread, no library call
    (its per-call overhead dominates tiny products)."""
    bc = contiguous(b)  # the loop reads b by rows

    def loop(a: np.ndarray, out: np.ndarray) -> np.ndarray:
        matmul_into(a, bc, out)
        return out

    return loop


def transposed_product(
    b: np.ndarray, rows: int, mm: Callable[..., Any], threads: int = 1
) -> FixedGemm:
    """The "blas_t" method of :meth:`Gemm.fixed`: a @ b as (b^T a^T)^T, the library's product
    into a [N, rows] scratch and a tiled transpose (some BLAS run faster with the wide
    dimension as M than with a small batch); ``mm(x, y, out)`` is the library's product."""
    bt = dense(b.T, threads)  # [N, K]
    tmp = np.empty(bt.shape[0] * max(rows, 1), dtype=b.dtype)

    def transposed(a: np.ndarray, out: np.ndarray) -> np.ndarray:
        n = a.shape[0]
        t = tmp[: bt.shape[0] * n].reshape(bt.shape[0], n)
        mm(bt, a.T, t)  # [N, n]
        transpose_into(out, t, n)
        return out

    return transposed


class NumpyGemm:
    """NumPy's BLAS (OpenBLAS in the PyPI wheels)."""

    kind = "numpy"

    def product_methods(self, dtype: np.dtype) -> tuple[str, ...]:
        return ("blas",)

    def fixed_methods(self, dtype: np.dtype) -> tuple[str, ...]:
        return ("blas", "blas_t", "loop")

    def product(self, a: np.ndarray, b: np.ndarray, scratch: np.ndarray, method: str, /) -> Any:
        # into the caller's (recycled) scratch: a new array pays its page faults every call
        return np.matmul(a, b, out=scratch)

    def fixed(self, b: np.ndarray, method: str, rows: int, threads: int = 1) -> FixedGemm:
        return prepared(self.kind, b, method, rows, lambda: self._fixed(b, method, rows, threads))

    def _fixed(self, b: np.ndarray, method: str, rows: int, threads: int) -> FixedGemm:
        if method == "loop":
            return loop_product(b)
        if method == "blas_t":
            mm = lambda x, y, out: np.matmul(x, y, out=out)  # noqa: E731
            return transposed_product(b, rows, mm, threads)
        b = dense(b, threads)  # one layout for BLAS: results never depend on b's strides

        def product(a: np.ndarray, out: np.ndarray) -> np.ndarray:
            return np.matmul(a, b, out=out)

        return product

    def nt(self, at: np.ndarray, b: np.ndarray, method: str, /) -> np.ndarray:
        return np.matmul(at, b)

    def threads(self) -> int:
        from ..core.machine import blas_threads

        return blas_threads()

    def convert(self, dst: np.ndarray, src: np.ndarray, /) -> bool:
        return False  # NumPy's own float16 conversion is slower than the engine's kernels

    def walk_gemm(self, dtype: np.dtype, packed: bool = False) -> int:
        return 0  # NumPy's BLAS starts threads of its own, which a walk's thread must not

    def walk_operand(self, b: np.ndarray, /) -> np.ndarray:
        return b

    def walk_pack_bytes(self, shape: tuple[int, int], rows: int) -> int:
        return 0

    def walk_pack(self, b: np.ndarray, rows: int, buf: np.ndarray) -> np.ndarray:
        raise ValueError("NumPy's back end has no packed GEMM (its walk_gemm(dtype, True) is 0)")

    def library_lstm(self, dtype: np.dtype) -> bool:
        return False  # NumPy has no LSTM

    def lstm_inference(self, call: Any, /) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        raise ValueError("NumPy's back end has no LSTM of its own (its library_lstm() is False)")


NUMPY_GEMM = NumpyGemm()
