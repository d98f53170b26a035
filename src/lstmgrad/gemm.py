"""The GEMMs an engine runs, behind one small interface, so that one engine serves NumPy callers
(NumPy's BLAS) and torch callers (torch's BLAS / oneDNN, see :mod:`lstmgrad.tensors`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

FixedGemm = Callable[[np.ndarray, np.ndarray], Any]  # (a, out): out = a @ b for a fixed b


class Gemm(Protocol):
    """``gemm(a, b, out=c)``: c = a @ b (2-D, written in place, like np.matmul);
    ``gemm.fixed(b, rows)``: the same product as a function of (a, out) for one b reused over many
    calls with at most ``rows`` rows in a (the recurrent product of every step), which a library
    may prepare for (a packed copy of b)."""

    #: whether the forward's recurrent product pays as (W_hh h^T)^T plus a transpose
    transposed_forward: bool

    def __call__(self, a: np.ndarray, b: np.ndarray, /, *, out: np.ndarray) -> Any: ...

    def fixed(self, b: np.ndarray, rows: int) -> FixedGemm: ...


class NumpyGemm:
    """NumPy's BLAS (OpenBLAS in the PyPI wheels)."""

    # OpenBLAS runs up to 1.9x faster with 4H than with a small batch as M: see the engine
    transposed_forward = True

    def __call__(self, a: np.ndarray, b: np.ndarray, /, *, out: np.ndarray) -> None:
        np.matmul(a, b, out=out)

    def fixed(self, b: np.ndarray, rows: int) -> FixedGemm:
        b = np.ascontiguousarray(b)  # one layout for BLAS: results never depend on b's strides

        def product(a: np.ndarray, out: np.ndarray) -> None:
            np.matmul(a, b, out=out)

        return product


NUMPY_GEMM = NumpyGemm()
