"""What a call and this process can run: a plan's fields the back end, the threads allowed now or
the call's shape cannot honour are replaced by the safe choice (:func:`feasible`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core.layout import Dims
from ..fused.plan import CONVERSIONS, Plan, compute_dtype
from . import openmp


def _recurrent(method: str, gemm: Any, cd: np.dtype) -> str:
    return method if method in gemm.fixed_methods(cd) else "blas"


def _walk_product(product: str, gemm: Any, cd: np.dtype) -> str:
    """The walks' product where the back end has it: "packed" falls back to "library"; a back
    end whose products the Numba loop does not compute alike (``loops`` False) always gets a
    library product; one without a GEMM to call, the Numba loop."""
    if not gemm.walk_gemm(cd):
        return "loop"
    if product == "packed":
        return "packed" if gemm.walk_gemm(cd, True) else "library"
    return "loop" if product == "loop" and getattr(gemm, "loops", True) else "library"


def feasible(plan: Plan, dims: Dims, dtype: np.dtype, gemm: Any) -> Plan:
    """``plan`` with whatever this call and process cannot run replaced by the safe choice:
    methods the back end lacks for the dtype, more threads than available now (the walks' parts
    included), pair walks of a one-direction layer or of float16 storage (its activations pass
    through one scratch), the library's LSTM where the back end has none for the dtype."""
    cd = compute_dtype(dtype)
    big = plan.big if plan.big in gemm.product_methods(cd) else "blas"

    def allowed(n: int) -> int:  # never more than the library itself is allowed
        return min(n, openmp.parallel_threads(), gemm.threads()) if n > 1 else 1

    threads = allowed(plan.threads)
    pairs = plan.pair_walks and dims.D == 2 and cd == np.dtype(dtype) and threads >= 2
    walk = plan.walk and not pairs
    walk_rows = 1
    if pairs or walk:  # a thread per part: per direction of a pair, per block of rows
        dirs = 2 if pairs else 1
        walk_rows = max(1, min(plan.walk_rows, allowed(plan.walk_rows * dirs) // dirs))
    return Plan(
        big=big,
        fwd_rec=_recurrent(plan.fwd_rec, gemm, cd),
        bwd_rec=_recurrent(plan.bwd_rec, gemm, cd),
        threads=threads,
        split_min=max(0, plan.split_min),
        pair_walks=pairs,
        walk=walk,
        walk_product=_walk_product(plan.walk_product, gemm, cd),
        walk_rows=walk_rows,
        fwd_walk=plan.fwd_walk,
        transpose_threads=allowed(plan.transpose_threads),
        convert=plan.convert if plan.convert in CONVERSIONS else "kernels",
        library_lstm=plan.library_lstm and gemm.library_lstm(np.dtype(dtype)),
    )
