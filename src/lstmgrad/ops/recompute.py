"""Training with recomputation: a forward that keeps checkpoints instead of activations.

The normal forward saves seven [T, B, H] activations per (layer, direction). Here the forward
keeps only each layer's input (the input, and the output of every layer below the top) and
the state (h, c) at the start of every segment of ``k`` steps; the backward re-runs the fused
forward on one segment at a time from its checkpoint to regenerate that segment's activations,
then runs the segment's backward with the gradients of its final state carried from the
segment after it (docs/math.md#recompute). Each segment is one single-layer, unidirectional
call of the core API (:func:`lstmgrad.ops.api.run_forward` / :func:`lstmgrad.ops.api.run_backward`):
the reverse direction runs on the time-reversed segment, with its batch sizes reversed too.

Results against the normal mode: the output, h_n, c_n and every step's gate maths are the same
kernels on the same values; the weight and bias gradients are the sum over segments of each
segment's GEMM (the normal mode does one GEMM over all steps), so they differ by the rounding
of a different summation order. With float16 storage, the state carried between segments and
each segment's weight gradient are rounded to float16 as results of a call.
"""

from __future__ import annotations

import contextlib
import math
import numbers
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..core.contract import check_backward, check_forward
from ..core.errors import LstmInvalidArgumentError
from ..core.layout import B_HH, B_IH, W_IH, Dims, params_per_direction
from ..core.workspace import workspace_bytes
from ..fused.gemm import Gemm, reusing_prepared
from ..fused.lstm import backward_workspace_slots, forward_workspace_slots
from ..fused.plan import SAFE, compute_dtype
from .api import check_memory, run_backward, run_forward

__all__ = ["Checkpoints", "forward", "backward", "segment_length", "checkpoint_bytes"]

_FN = "lstmgrad.ops.recompute"


def _segment_bytes(dims: Dims, steps: int, dtype: np.dtype) -> int:
    """Memory one segment of ``steps`` steps takes while it is recomputed and differentiated:
    the larger engine scratch (forward or backward) plus the forward's results and the
    backward's results (one layer, one direction)."""
    width = max(dims.I, dims.D * dims.H)
    seg = Dims(steps, dims.B, width, dims.H, 1, 1, dims.has_bias)
    size = np.dtype(dtype).itemsize
    scratch = max(
        workspace_bytes(forward_workspace_slots(seg, dtype, SAFE)),
        workspace_bytes(backward_workspace_slots(seg, dtype, SAFE)),
    )
    rows, hidden = steps * dims.B, dims.H
    fwd_results = (rows * hidden * 8 + 2 * dims.B * hidden) * size  # y + 7 saved, hy, cy
    params = dims.G * (width + hidden) + (2 * dims.G if dims.has_bias else 0)
    bwd_results = (rows * width + 2 * dims.B * hidden + params) * size
    return scratch + fwd_results + bwd_results


def checkpoint_bytes(dims: Dims, k: int, dtype: np.dtype) -> int:
    """Bytes of the (h, c) checkpoints kept with segments of ``k`` steps."""
    segments = math.ceil(dims.T / k) if dims.T else 0
    return 2 * dims.K * segments * dims.B * dims.H * np.dtype(dtype).itemsize


def segment_length(dims: Dims, dtype: np.dtype, recompute: Any, max_saved_bytes: Any = None) -> int:
    """The segment length k for ``recompute`` (True or "auto": about sqrt(T); an int: itself)
    and an optional budget ``max_saved_bytes`` on the memory k trades (checkpoints plus one
    segment's recomputation, :func:`budget_bytes`): then the longest k that fits.

    Raises:
        LstmInvalidArgumentError: (code 161002) recompute or max_saved_bytes is not valid, or
            no k fits the budget (the message names the smallest need in bytes).
    """
    if max_saved_bytes is not None and (
        isinstance(max_saved_bytes, (bool, np.bool_))
        or not isinstance(max_saved_bytes, numbers.Integral)
        or max_saved_bytes <= 0
    ):
        raise LstmInvalidArgumentError(
            f"{_FN}: max_saved_bytes must be None or an int > 0, got {max_saved_bytes!r}",
            "max_saved_bytes",
        )
    steps = max(dims.T, 1)
    if recompute is False and max_saved_bytes is not None:
        recompute = "auto"
    if isinstance(recompute, numbers.Integral) and not isinstance(recompute, (bool, np.bool_)):
        if recompute < 1:
            raise LstmInvalidArgumentError(
                f"{_FN}: recompute as a segment length must be an int >= 1, got {recompute}",
                "recompute",
            )
        if max_saved_bytes is not None:
            raise LstmInvalidArgumentError(
                f"{_FN}: max_saved_bytes chooses the segment length; it cannot be given with "
                f"recompute={recompute} (use recompute=True or 'auto')",
                "max_saved_bytes",
            )
        return int(recompute)
    if recompute is not True and recompute != "auto":
        raise LstmInvalidArgumentError(
            f"{_FN}: recompute must be False, True, 'auto' or a segment length (int >= 1), "
            f"got {recompute!r}",
            "recompute",
        )
    if max_saved_bytes is None:
        return math.isqrt(steps - 1) + 1  # ceil(sqrt(T))
    candidates = sorted({min(steps, max(1, round(1.1**e))) for e in range(200)} | {steps})
    fits = [k for k in candidates if budget_bytes(dims, k, dtype) <= max_saved_bytes]
    if not fits:
        need = min(budget_bytes(dims, k, dtype) for k in candidates)
        raise LstmInvalidArgumentError(
            f"{_FN}: max_saved_bytes={max_saved_bytes} is too small: the least any segment "
            f"length needs (checkpoints plus one segment's recomputation) is {need} bytes",
            "max_saved_bytes",
        )
    return fits[-1]


def budget_bytes(dims: Dims, k: int, dtype: np.dtype) -> int:
    """What ``max_saved_bytes`` bounds for segments of k steps: the checkpoints plus the memory
    of one segment's recomputation and backward (the layer inputs do not depend on k)."""
    return checkpoint_bytes(dims, k, dtype) + _segment_bytes(dims, min(k, max(dims.T, 1)), dtype)


@dataclass
class Checkpoints:
    """What the forward keeps for the backward.

    Attributes:
        dims, dtype: of the call.
        k: segment length; segment j holds steps [j*k, min((j+1)*k, T)).
        params: the parameters (``_flat_weights`` order).
        inputs: each layer's input, time-major: [T, B, I] for layer 0, then the output of
            every layer below the top [T, B, D*H] (before dropout).
        masks: the L-1 dropout masks [T, B, D*H] or None.
        h, c: per (layer, direction) the state entering each segment in that direction's
            order, [S, B, H] indexed by segment (S = ceil(T / k)).
        batch_sizes: int64 [T] or None.
    """

    dims: Dims
    dtype: np.dtype
    k: int
    params: list[np.ndarray]
    inputs: list[np.ndarray]
    masks: list[np.ndarray] | None
    h: list[np.ndarray]
    c: list[np.ndarray]
    batch_sizes: np.ndarray | None

    def nbytes(self) -> int:
        """Bytes this record holds besides the params and the caller's input."""
        arrays = self.inputs[1:] + (self.masks or []) + self.h + self.c
        return sum(a.nbytes for a in arrays)


def _segments(dims: Dims, k: int, direction: int) -> list[tuple[int, int, int]]:
    """(j, start, stop) of every segment in the order ``direction`` walks them."""
    segs = [(j, a, min(a + k, dims.T)) for j, a in enumerate(range(0, dims.T, k))]
    return segs if direction == 0 else segs[::-1]


@contextlib.contextmanager
def _segment_plans(ck: Checkpoints, layer: int) -> Iterator[Dims]:
    """The segments of one layer prepare each recurrent weight once (transposed, packed) and
    run the plan of the whole sequence (the sizes yielded, for the API's ``plan_dims``): its
    preparation is paid once, not once a segment."""
    dims = ck.dims
    with reusing_prepared(ck.params):
        yield Dims(dims.T, dims.B, dims.layer_input_size(layer), dims.H, 1, 1, dims.has_bias)


class _Segment:
    """The arguments of one segment's single-layer unidirectional calls, time-reversed for the
    reverse direction."""

    def __init__(self, ck: Checkpoints, layer: int, d: int, a: int, b: int) -> None:
        dims = ck.dims
        self.reverse = d == 1
        self.steps = b - a
        self.bs = None
        if ck.batch_sizes is not None:
            bs = ck.batch_sizes[a:b]
            self.bs = np.ascontiguousarray(bs[::-1] if self.reverse else bs)
        x = ck.inputs[layer][a:b]
        if layer > 0 and ck.masks is not None:
            x = x * ck.masks[layer - 1][a:b]
        self.x = self.flip(x)
        n = params_per_direction(dims.has_bias)
        first = dims.index(layer, d, W_IH)
        self.params = ck.params[first : first + n]

    def flip(self, a: np.ndarray) -> np.ndarray:
        """Time-major [steps, B, W] in this segment's walk order, as the call's layout wants it
        (2-D [steps*B, W] with batch sizes)."""
        a = a[::-1] if self.reverse else a
        return np.ascontiguousarray(a).reshape(-1, a.shape[-1]) if self.bs is not None else a

    def unflip(self, a: np.ndarray, batch: int) -> np.ndarray:
        """A result in the call's layout back to time-major [steps, B, W] in time order."""
        a = a.reshape(self.steps, batch, a.shape[-1])
        return a[::-1] if self.reverse else a

    def forward(self, h0: np.ndarray, c0: np.ndarray, train: bool, gemm: Gemm | None,
                plan_dims: Dims) -> Any:  # fmt: skip
        call = check_forward(
            _FN, self.x, self.params, [h0[None], c0[None]], self.bs, len(self.params) == 4, 1,
            0.0, train, False, False, None,
        )  # fmt: skip
        return run_forward(call, None, "fused", gemm, plan_dims=plan_dims)


def forward(
    x: np.ndarray,
    params: Sequence[np.ndarray],
    h0: np.ndarray,
    c0: np.ndarray,
    dims: Dims,
    k: int,
    batch_sizes: np.ndarray | None = None,
    masks: Sequence[np.ndarray] | None = None,
    gemm: Gemm | None = None,
    keep: bool = True,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, Checkpoints | None]:
    """Forward keeping checkpoints every k steps (validated arguments, time-major x [T, B, I]).

    Args:
        x: input [T, B, I], time-major (any strides).
        params: ``_flat_weights`` order.
        h0, c0: [L*D, B, H].
        dims: the call's dims.
        k: segment length >= 1.
        batch_sizes: int64 [T] or None.
        masks: L-1 dropout masks [T, B, D*H] (0 or 1/(1-p)) or None.
        gemm: GEMMs to use (None: NumPy's).
        keep: build the checkpoint record (False: inference, only the layer being computed
            and the one below are held).

    Returns:
        (y [T, B, D*H] time-major, hy, cy [L*D, B, H], checkpoints or None).
    """
    dtype = x.dtype
    t_steps, batch, hidden = dims.T, dims.B, dims.H
    layer_out = t_steps * batch * dims.D * hidden * dtype.itemsize
    check_memory(_FN, (dims.L if keep else 2) * layer_out + checkpoint_bytes(dims, k, dtype))
    hy = np.empty((dims.K, batch, hidden), dtype=dtype)
    cy = np.empty_like(hy)
    segs = math.ceil(t_steps / k) if t_steps else 0
    ck = Checkpoints(dims, dtype, k, list(params), [x], None if masks is None else list(masks),
                     [], [], batch_sizes)  # fmt: skip
    y = x
    for layer in range(dims.L):
        y = np.empty((t_steps, batch, dims.D * hidden), dtype=dtype)
        for d in range(dims.D):
            kk = layer * dims.D + d
            hs = np.empty((segs, batch, hidden), dtype=dtype)
            cs = np.empty_like(hs)
            h, c = h0[kk], c0[kk]
            with _segment_plans(ck, layer) as whole:
                for j, a, b in _segments(dims, k, d):
                    hs[j], cs[j] = h, c
                    seg = _Segment(ck, layer, d, a, b)
                    res = seg.forward(h, c, False, gemm, whole)
                    y[a:b, :, d * hidden : (d + 1) * hidden] = seg.unflip(res.output, batch)
                    h, c = res.hy[0], res.cy[0]
            hy[kk], cy[kk] = h, c
            ck.h.append(hs)
            ck.c.append(cs)
        if layer < dims.L - 1:
            ck.inputs.append(y)
            if not keep and layer > 0:  # inference: the input of the layer done is not needed
                ck.inputs[layer] = x
    return y, hy, cy, ck if keep else None


def backward(
    ck: Checkpoints,
    dy: np.ndarray | None,
    dh: np.ndarray | None,
    dc: np.ndarray | None,
    need: Sequence[bool] = (True, True, True, True),
    gemm: Gemm | None = None,
) -> tuple[np.ndarray | None, np.ndarray | None, np.ndarray | None, list[np.ndarray] | None]:
    """Gradients from the checkpoints: top layer first, each direction, each segment from the
    last its direction walks, recomputing the segment then differentiating it.

    Args:
        ck: the forward's checkpoints.
        dy: gradient of the output [T, B, D*H] time-major, or None (0).
        dh, dc: gradients of h_n, c_n [L*D, B, H], or None (0).
        need: (dx, dh_prev, dc_prev, dparams) as the contract's output_mask.
        gemm: GEMMs to use (None: NumPy's).

    Returns:
        (dx [T, B, I] time-major, dh_prev, dc_prev, dparams): None where not needed.
    """
    dims, dtype = ck.dims, ck.dtype
    need_dx, need_dh, need_dc, need_dw = (bool(v) for v in need)
    t_steps, batch, hidden = dims.T, dims.B, dims.H
    cd = compute_dtype(dtype)
    widest = t_steps * batch * max(dims.I, dims.D * hidden) * np.dtype(dtype).itemsize
    params = sum(p.size for p in ck.params) * cd.itemsize if need_dw else 0
    check_memory(_FN, 2 * widest + params)  # dx of a layer and of the one below, dW sums
    dh_prev = np.empty((dims.K, batch, hidden), dtype=dtype)
    dc_prev = np.empty_like(dh_prev)
    sums = [np.zeros(p.shape, dtype=cd) for p in ck.params] if need_dw else []
    dx = None
    for layer in reversed(range(dims.L)):
        width = dims.layer_input_size(layer)
        want_dx = layer > 0 or need_dx
        dx = np.zeros((t_steps, batch, width), dtype=dtype) if want_dx else None
        for d in range(dims.D):
            kk = layer * dims.D + d
            g_h = np.zeros((batch, hidden), dtype=dtype) if dh is None else dh[kk]
            g_c = np.zeros((batch, hidden), dtype=dtype) if dc is None else dc[kk]
            with _segment_plans(ck, layer) as whole:
                for j, a, b in _segments(dims, ck.k, d)[::-1]:
                    seg = _Segment(ck, layer, d, a, b)
                    h0, c0 = ck.h[kk][j], ck.c[kk][j]
                    fwd = seg.forward(h0, c0, True, gemm, whole)
                    dy_seg = None
                    if dy is not None:
                        dy_seg = seg.flip(dy[a:b, :, d * hidden : (d + 1) * hidden])
                    call = check_backward(
                        _FN, seg.x, [h0[None], c0[None]], seg.params, dy_seg, g_h[None], g_c[None],
                        tuple(fwd.saved[:7]), seg.bs, dims.has_bias, 1, 0.0, True, False, False,
                        [want_dx, True, True, need_dw], None,
                    )  # fmt: skip
                    del fwd
                    res = run_backward(call, None, "fused", gemm, whole)
                    assert res.dh_prev is not None and res.dc_prev is not None
                    g_h, g_c = res.dh_prev[0], res.dc_prev[0]
                    if want_dx:
                        assert dx is not None and res.dx is not None
                        part = seg.unflip(res.dx, batch)
                        if d == 0:
                            dx[a:b] = part
                        else:  # each direction's dx in the storage dtype, summed (docs/math.md)
                            np.add(dx[a:b], part, out=dx[a:b])
                    if need_dw:
                        assert res.dparams is not None
                        first = dims.index(layer, d, W_IH)
                        for n, p in enumerate(res.dparams):
                            np.add(sums[first + n], p, out=sums[first + n])
            dh_prev[kk], dc_prev[kk] = g_h, g_c
        if layer > 0:
            assert dx is not None
            if ck.masks is not None:
                np.multiply(dx, ck.masks[layer - 1], out=dx)
            dy = dx
    dparams = None
    if need_dw:
        dparams = [s.astype(dtype, copy=False) for s in sums]
        if dims.has_bias:  # both bias gradients are the same sum; the second a copy of it
            for layer, d in np.ndindex(dims.L, dims.D):
                dparams[dims.index(layer, d, B_HH)] = dparams[dims.index(layer, d, B_IH)].copy()
    return (
        dx if need_dx else None,
        dh_prev if need_dh else None,
        dc_prev if need_dc else None,
        dparams,
    )
