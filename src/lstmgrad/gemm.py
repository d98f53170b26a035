"""The GEMMs an engine runs, behind one small interface, so that one engine serves NumPy callers
(NumPy's BLAS) and torch callers (torch's BLAS / oneDNN, see :mod:`lstmgrad.tensors`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

# (a, out) -> a @ b for a fixed b: in out, or in the library's own new result, returned
FixedGemm = Callable[[np.ndarray, np.ndarray], np.ndarray]


class Gemm(Protocol):
    """``gemm(a, b, out=c)``: c = a @ b (2-D, written in place, like np.matmul);
    ``gemm.result(a, b, scratch)``: a @ b in scratch, or in new memory where the library returns
    its own result faster than it copies it (the caller uses the returned array);
    ``gemm.fixed(b, rows, calls)``: the same product as a function of (a, out) for one b reused
    over about ``calls`` calls with at most ``rows`` rows in a (the recurrent product of every
    step), which a library may prepare for (a packed copy of b, where the calls repay it); like
    ``result``, it returns the array holding the product: out, or the library's own result where
    that saves a copy.

    The weight gradient dW = dG^T @ [x | h_prev] ([4H, N] x [N, I + H], N rows of all steps) is
    computed in the layout ``gemm.weight_grad_layout(dtype, n, g)`` names (n = T*B, g = 4H):
    "rows", ``gemm(dG.T, xh, out=dw)``; "tn", ``gemm.tn(dG, xh^T)`` from [x | h_prev] stored
    transposed; "nt", ``gemm.nt(dG^T, x)`` and ``gemm.nt(dG^T, h_prev)`` from dG stored
    transposed, the results used as returned (some libraries run these layouts much faster).

    ``gemm.walk_pairs(dtype, rows, hidden)``: whether the two directions of a bidirectional layer
    (batch ``rows``, ``hidden`` H) should walk at once, each step loop in one Numba call with
    its recurrent product in Numba (lstmgrad.fused.walks), instead of through this library.
    ``gemm.split_steps(dtype)``: whether a step's gate maths may run its rows on two threads
    (fused.walks.forward_step_split) between this library's recurrent products.
    """

    #: whether the forward's recurrent product pays as (W_hh h^T)^T plus a transpose
    transposed_forward: bool

    def __call__(self, a: np.ndarray, b: np.ndarray, /, *, out: np.ndarray) -> Any: ...

    def result(self, a: np.ndarray, b: np.ndarray, scratch: np.ndarray, /) -> np.ndarray: ...

    def fixed(self, b: np.ndarray, rows: int, calls: int) -> FixedGemm: ...

    def weight_grad_layout(self, dtype: np.dtype, n: int, g: int) -> str: ...

    def walk_pairs(self, dtype: np.dtype, rows: int, hidden: int) -> bool: ...

    def split_steps(self, dtype: np.dtype) -> bool: ...

    def tn(self, a: np.ndarray, bt: np.ndarray, /) -> np.ndarray:
        """a.T @ bt.T, C-contiguous, for C-contiguous a [K, M] and bt [N, K]."""
        ...

    def nt(self, at: np.ndarray, b: np.ndarray, /) -> np.ndarray:
        """at @ b as a new C-contiguous array, for C-contiguous at [M, K] and b [K, N]."""
        ...


class NumpyGemm:
    """NumPy's BLAS (OpenBLAS in the PyPI wheels)."""

    # OpenBLAS runs up to 1.9x faster with 4H than with a small batch as M: see the engine
    transposed_forward = True

    def __call__(self, a: np.ndarray, b: np.ndarray, /, *, out: np.ndarray) -> None:
        np.matmul(a, b, out=out)

    def result(self, a: np.ndarray, b: np.ndarray, scratch: np.ndarray, /) -> np.ndarray:
        # into the caller's (recycled) scratch: a new array pays its page faults every call
        return np.matmul(a, b, out=scratch)

    def fixed(self, b: np.ndarray, rows: int, calls: int) -> FixedGemm:
        b = np.ascontiguousarray(b)  # one layout for BLAS: results never depend on b's strides

        def product(a: np.ndarray, out: np.ndarray) -> np.ndarray:
            return np.matmul(a, b, out=out)

        return product

    def weight_grad_layout(self, dtype: np.dtype, n: int, g: int) -> str:
        return "rows"  # OpenBLAS takes dG^T @ [x | h_prev] as it is

    def walk_pairs(self, dtype: np.dtype, rows: int, hidden: int) -> bool:
        return False  # OpenBLAS's own threads would hold the second core

    def split_steps(self, dtype: np.dtype) -> bool:
        # OpenBLAS's threads spin between its calls and fight the kernel's: measured 30-55x
        # slower (BENCH med-3 forward + backward 57 ms -> 1.7 s)
        return False

    def tn(self, a: np.ndarray, bt: np.ndarray, /) -> np.ndarray:
        return np.ascontiguousarray(np.matmul(a.T, bt.T))

    def nt(self, at: np.ndarray, b: np.ndarray, /) -> np.ndarray:
        return np.matmul(at, b)


NUMPY_GEMM = NumpyGemm()
