"""The plan record: how the fused engine runs one call (GEMM methods, layouts, threads, walks).

The engine executes the plan it is given and holds no thresholds; which plan a call gets is the
planner's choice (:mod:`lstmgrad.planning.plan`). Here: the fields, their values, and
:data:`SAFE`, the plan that needs no measurement.
"""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class Plan:
    """How the fused engine runs one call.

    big: GEMM method of the input projection, dx and the weight gradient ("blas" or "onednn";
    the weight gradient is two products, dG^T x and dG^T h_prev, written into dW_ih and
    dW_hh); fwd_rec / bwd_rec: method
    of the forward's / backward's recurrent product per step (a :meth:`Gemm.fixed` method:
    "blas", "blas_t", "loop", "onednn", "packed", "mkl"); threads: threads of the step kernels (1: one
    thread); split_min: the smallest step (active rows * H) whose kernel splits over them;
    pair_walks: both directions of a bidirectional layer walk at once on two threads, each step
    loop in one Numba call (the recurrent methods are then unused); walk: each direction's step
    loop in one Numba call (on one thread, or one per block of rows: walk_rows), recurrent
    product included (for layers so small that a library call per step costs more than its
    arithmetic; pair_walks take precedence);
    walk_product: the recurrent product in those one-call step loops ("loop": the engine's
    Numba loop; "library": the GEMM library's own routine called on the loop's thread, where
    the back end has one to call, :meth:`Gemm.walk_gemm`; "packed": its packed GEMM, W_hh
    packed once a call for every step, where it has one); walk_rows: the blocks of batch rows
    each direction's one-call step loop splits into, each block walking on a thread of its own
    (with walk or pair_walks; a row's steps do not depend on the other rows); fwd_walk: the
    forward walks too (False: only the backward does, the forward calls the library per step
    as fwd_rec, threads and split_min say);
    transpose_threads: threads of the recurrent weight's transposing copy where its product's
    preparation makes one (:meth:`Gemm.fixed`), and of the float16 <-> float32 conversions of
    float16 storage (element-wise copies like it);
    convert: what runs those conversions ("kernels": the engine's, on transpose_threads;
    "library": the GEMM back end's own, :meth:`Gemm.convert`, where it has one);
    library_lstm: an inference forward (nothing saved) of dense, float32 storage runs the GEMM
    back end's own fused LSTM (:meth:`Gemm.library_lstm`: torch's, oneDNN's RNN primitive on
    the CPU) instead of the engine's step loops, where the back end has one; training
    forwards, variable lengths and every backward run the engine whatever this says.
    """

    big: str = "blas"
    fwd_rec: str = "blas"
    bwd_rec: str = "blas"
    threads: int = 1
    split_min: int = 0
    pair_walks: bool = False
    walk: bool = False
    walk_product: str = "loop"
    walk_rows: int = 1
    fwd_walk: bool = True
    transpose_threads: int = 1
    convert: str = "kernels"
    library_lstm: bool = False

    def describe(self) -> str:
        return ", ".join(f"{f.name}={getattr(self, f.name)}" for f in dataclasses.fields(self))


SAFE = Plan()
"""The plan without measurements: public library calls, one thread for the engine's own
kernels (the libraries thread their GEMMs as they are told), nothing that could keep two thread
pools spinning against each other. Correct and safe on any machine."""


BIG_METHODS = ("blas", "onednn")
RECURRENT_METHODS = ("blas", "blas_t", "loop", "onednn", "packed", "mkl")
CONVERSIONS = ("kernels", "library")
WALK_PRODUCTS = ("loop", "library", "packed")


def compute_dtype(dtype: np.dtype) -> np.dtype:
    """float64 for float64 storage, float32 otherwise (float16 computes in float32)."""
    return np.dtype(np.float64) if np.dtype(dtype) == np.float64 else np.dtype(np.float32)
