"""torch CPU tensors through the core API, without importing torch.

The core works on NumPy arrays. When a caller hands it torch tensors, torch is necessarily
loaded already, so this module takes it from ``sys.modules`` (the core never imports torch and
runs without it): every tensor argument becomes a NumPy view of the same memory (zero copy, any
strides), the engine's GEMMs run on torch's libraries (:class:`TorchGemm`: oneDNN or torch.mm;
mixing NumPy's OpenBLAS and torch's BLAS in one call measured 35x slower per call here: both
runtimes' idle workers spin), and the results
come back as tensors over the engine's result memory (zero copy again).
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from .errors import LstmInvalidArgumentError
from .fused.kernels import matmul_into
from .fused.walks import two_threads
from .gemm import FixedGemm


def _torch() -> Any:
    return sys.modules.get("torch")


def is_tensor(value: Any) -> bool:
    """True for a torch.Tensor (False whenever torch is not loaded)."""
    torch = _torch()
    return torch is not None and isinstance(value, torch.Tensor)


def any_tensor(*values: Any) -> bool:
    """True if any argument, or any element of a list/tuple argument, is a torch.Tensor."""
    torch = _torch()
    if torch is None:
        return False
    for v in values:
        if isinstance(v, torch.Tensor):
            return True
        if isinstance(v, (list, tuple)) and any(isinstance(e, torch.Tensor) for e in v):
            return True
    return False


def tensor_to_numpy(fn: str, name: str, value: Any, param: str | None = None) -> Any:
    """A NumPy view of a CPU tensor's memory (detached from autograd); anything else as is.

    Raises 161002 for a tensor the core cannot read: not on the CPU, or of a dtype NumPy has no
    equivalent for (bfloat16, ...); every other dtype is checked by the contract as usual.
    """
    torch = _torch()
    if torch is None or not isinstance(value, torch.Tensor):
        return value
    if value.is_cpu and value.layout == torch.strided:
        try:  # the common case first (lazy neg/conj views and odd dtypes raise here)
            return (value.detach() if value.requires_grad else value).numpy()
        except (TypeError, RuntimeError):
            pass  # sorted out below, with the error the contract names
    param = param or name
    if not value.is_cpu:
        raise LstmInvalidArgumentError(
            f"{fn}: {name} must be a CPU tensor, got a tensor on {value.device}", param
        )
    if value.layout != torch.strided:
        raise LstmInvalidArgumentError(
            f"{fn}: {name} must be a dense (strided) tensor, got layout {value.layout}", param
        )
    t = value.detach() if value.requires_grad else value
    if t.is_neg() or t.is_conj():  # lazy negation / conjugation views: materialise them
        t = t.resolve_neg().resolve_conj()
    try:
        return t.numpy()
    except (TypeError, RuntimeError) as exc:
        raise LstmInvalidArgumentError(
            f"{fn}: {name} must have dtype float16, float32 or float64, got {value.dtype}",
            param,
        ) from exc


def to_numpy(fn: str, name: str, value: Any) -> Any:
    """:func:`tensor_to_numpy` on an argument, or on each element of a list/tuple argument."""
    if isinstance(value, (list, tuple)):
        return [tensor_to_numpy(fn, f"{name}[{j}]", v, name) for j, v in enumerate(value)]
    return tensor_to_numpy(fn, name, value)


def from_torch(fn: str, args: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """The named arguments with every tensor (and tensor list element) as a NumPy view, in the
    same order, and whether any of them was a tensor (then the call is a torch call)."""
    if not any_tensor(*args.values()):
        return args, False
    return {name: to_numpy(fn, name, value) for name, value in args.items()}, True


def to_tensors(value: Any) -> Any:
    """NumPy arrays -> torch tensors over the same memory, through lists and NamedTuples."""
    if isinstance(value, np.ndarray):
        return _torch().from_numpy(value)
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(to_tensors(v) for v in value))
    if isinstance(value, list):
        return [to_tensors(v) for v in value]
    return value


def _is_dense(a: np.ndarray) -> bool:
    # oneDNN runs a reference kernel, orders of magnitude slower, on an operand whose rows are
    # not packed (a row stride wider than the row)
    return bool(a.flags.c_contiguous or a.flags.f_contiguous)


# Thresholds on m*n*k, measured here (2 threads): oneDNN's call costs ~11 us more than
# torch.mm's (its primitive lookup). Plain, it wins from about 2^21 (the [32, 128] x [128, 512]
# recurrent product) and is 1.6-2x faster from [32, 256] x [256, 1024] on; with b packed once
# for many calls (the recurrent product of every step) it wins from about 0.75 * 2^20 and is
# another 17-37% faster ([32, 256] x [256, 1024]: 61 -> 51 us; [16, 1024] x [1024, 4096]:
# 532 -> 336 us).
_ONEDNN_MIN_MNK = 1 << 21
_PACKED_MIN_MNK = 3 << 18
# Up to this m*n*k a recurrent product runs in a Numba loop (fused.kernels.matmul_into): torch.mm
# costs ~5 us a call whatever the size below ~2^17, the loop 0.9 us for [12, 16] x [16, 64] and
# 2.9 us for [12, 64] x [64, 16] (BENCH small-1's forward and backward products; 5.5 and 5.2 us
# with torch.mm), and it ties torch.mm from about 2^17 on.
_TINY_MAX_MNK = 1 << 16
# Up to this m*n*k of the recurrent product (B * H * 4H), bidirectional layers walk both
# directions at once in Numba (fused.walks), recurrent product included: the Numba loop takes
# about what torch.mm's call does there (16 us for small-2's [8, 128] x [128, 512]), and the two
# directions run on two threads (small-2's forward walks 8.0 -> 4.3 ms).
_PAIR_MAX_MNK = 1 << 19
# Packing a weight with more rows than columns (the backward's W_hh: dh = dG W_hh, K = 4H) is
# slow: measured 1-4 ms for H = 512 and 5-15 ms for H = 1024 (4-15x the forward's W_hh^T, and the
# new block's page faults slow the next forward too), against 55-400 us saved per product. Its
# cost grows with the weight, the time it saves with rows * calls * the weight: measured over
# whole forward + backward passes, it paid from rows * calls of about 2048 on (T * B = 2400-8000:
# 0.4-2.3 ms saved), was even at 1600 (BENCH large-2) and cost up to 20% below (med-1, 400:
# 23.1 -> 18.5 ms unpacked; large-1, 800: 127 -> 121 ms).
# Remeasured 2026-11-30 (forward + backward, the two rules alternated in one process, medians
# of 8-10): a weight past half the 32 MiB L3 (H = 1024, 16 MiB) pays packed at any rows * calls
# (T, B = 50, 16: 142 -> 130 ms; 25, 16: 77 -> 70 ms; 50, 8: 83 -> 79 ms; 25, 64: even), while
# H = 512 and 768 below 2048 still do not (50, 16, H = 768: 66.0 vs 67.7 ms; 25, 32, H = 512:
# 31.6 vs 32.6 ms).
_PACK_WIDE_MIN_ROW_CALLS = 2048
_PACK_WIDE_MIN_BYTES = 16 << 20


class TorchGemm:
    """GEMMs computed by torch on NumPy views of tensor memory (see :class:`lstmgrad.gemm.Gemm`).

    float32 products large enough go to oneDNN (``torch.ops.mkldnn._linear_pointwise``, the
    kernel torch's own fused ops use; the fixed recurrent weight packed once with
    ``torch.ops.mkldnn._reorder_linear_weight``) where this torch build has it: torch.mm's BLAS
    (MKL in the PyPI wheels) measured 1.7-2.3x slower here on the LSTM's shapes (AMD EPYC).
    Tiny recurrent products (m*n*k <= 2^16, very small models) run in a Numba loop on the same
    memory; everything else uses torch.mm.
    """

    transposed_forward = False  # measured: the packed recurrent weight beats W_hh h^T here

    def __init__(self) -> None:
        torch = _torch()
        self._torch = torch
        mkldnn = getattr(torch.ops, "mkldnn", None)
        self._onednn = bool(
            torch.backends.mkldnn.is_available()
            and hasattr(mkldnn, "_linear_pointwise")
            and hasattr(mkldnn, "_reorder_linear_weight")
        )

    def _use_onednn(self, a: np.ndarray, b: np.ndarray, rows: int, minimum: int) -> bool:
        return (
            self._onednn
            and a.dtype == np.float32
            and rows * b.shape[0] * b.shape[1] >= minimum
            and _is_dense(a)
            and _is_dense(b)
        )

    def _onednn_product(self, a: np.ndarray, b: np.ndarray) -> np.ndarray | None:
        """a @ b as oneDNN's own new result where _use_onednn says so, else None."""
        if not self._use_onednn(a, b, a.shape[0], _ONEDNN_MIN_MNK):
            return None
        ta, tb = self._torch.from_numpy(a), self._torch.from_numpy(b)
        # a @ b = linear(a, weight=b^T)
        return self._torch.ops.mkldnn._linear_pointwise(ta, tb.t(), None, "none", [], "").numpy()

    def __call__(self, a: np.ndarray, b: np.ndarray, /, *, out: np.ndarray) -> None:
        product = self._onednn_product(a, b)
        if product is not None:  # torch's copy: multithreaded
            self._torch.from_numpy(out).copy_(self._torch.from_numpy(product))
        else:
            self._torch.mm(self._torch.from_numpy(a), self._torch.from_numpy(b),
                           out=self._torch.from_numpy(out))  # fmt: skip

    def result(self, a: np.ndarray, b: np.ndarray, scratch: np.ndarray, /) -> np.ndarray:
        # oneDNN has no out= form: its own result, rather than a copy of it (a 13 MB copy is
        # ~1 ms here, 6% of the forward of BENCH med-3)
        product = self._onednn_product(a, b)
        if product is not None:
            return product
        self(a, b, out=scratch)
        return scratch

    def fixed(self, b: np.ndarray, rows: int, calls: int) -> FixedGemm:
        torch = self._torch
        if rows * b.shape[0] * b.shape[1] <= _TINY_MAX_MNK:
            bc = np.ascontiguousarray(b)  # the loop reads b by rows

            def tiny(a: np.ndarray, out: np.ndarray) -> np.ndarray:
                matmul_into(a, bc, out)
                return out

            return tiny
        tb = torch.from_numpy(b)
        # a is not known yet: b stands in for its dtype, a dense a is made so per call below
        if not self._use_onednn(b, b, rows, _PACKED_MIN_MNK):

            def plain(a: np.ndarray, out: np.ndarray) -> np.ndarray:
                torch.mm(torch.from_numpy(a), tb, out=torch.from_numpy(out))
                return out

            return plain
        linear = torch.ops.mkldnn._linear_pointwise
        if (
            b.shape[0] > b.shape[1]
            and rows * calls < _PACK_WIDE_MIN_ROW_CALLS
            and b.nbytes < _PACK_WIDE_MIN_BYTES
        ):
            packed = tb.t()  # oneDNN on the weight as it is (see _PACK_WIDE_MIN_ROW_CALLS)
        else:
            packed = torch.ops.mkldnn._reorder_linear_weight(tb.t(), rows)

        def onednn(a: np.ndarray, out: np.ndarray) -> np.ndarray:
            ta = torch.from_numpy(a)
            if not _is_dense(a):  # a reference kernel otherwise (see _is_dense)
                ta = ta.contiguous()
            # oneDNN's own result: copying it into out cost 1-8 us a step here ([8, 512] to
            # [32, 1024]), 3-10% of the step
            return linear(ta, packed, None, "none", [], "").numpy()

        return onednn

    def weight_grad_layout(self, dtype: np.dtype, n: int, g: int) -> str:
        # oneDNN wants its source operand dense with K contiguous (its weight operand it
        # reorders, fast, whatever the strides of a dense one). Measured here, dW = dG^T
        # [x | h_prev] ([4H, N] x [N, I + H]) including the transposes and copies each layout
        # needs: with N >= 4H, as dW^T = [x | h_prev]^T dG ("tn") 10.6 -> 8.4 ms (N = 3200,
        # 4H = 1024, I = H = 256; "nt" 11.6); with N < 4H, as dG^T x and dG^T h_prev ("nt",
        # results used as returned) 46.1 -> 31.5 ms (N = 800, 4H = 4096, I = H = 1024) and
        # 7.7 -> 4.0 ms (N = 400, 4H = 2048).
        if not (
            self._onednn and np.dtype(dtype) == np.float32 and n * g * g // 4 >= _ONEDNN_MIN_MNK
        ):
            return "rows"
        return "tn" if n >= g else "nt"

    def _two_threads(self) -> bool:
        # the second thread only where torch itself may use two (torch.set_num_threads(1) is
        # kept: e.g. one process per core)
        return two_threads() and self._torch.get_num_threads() >= 2

    def walk_pairs(self, dtype: np.dtype, rows: int, hidden: int) -> bool:
        return rows * hidden * 4 * hidden <= _PAIR_MAX_MNK and self._two_threads()

    def split_steps(self, dtype: np.dtype) -> bool:
        # GNU OpenMP as torch's (see fused.walks: the threads are free between torch's ops)
        return self._two_threads()

    def tn(self, a: np.ndarray, bt: np.ndarray, /) -> np.ndarray:
        # (a.T @ bt.T)^T = bt @ a, transposed back by torch's copy (a fast one)
        torch = self._torch
        res_t = self._onednn_product(bt, a)
        if res_t is None:
            res_t = torch.mm(torch.from_numpy(bt), torch.from_numpy(a)).numpy()
        return torch.from_numpy(res_t).t().contiguous().numpy()

    def nt(self, at: np.ndarray, b: np.ndarray, /) -> np.ndarray:
        product = self._onednn_product(at, b)
        if product is not None:
            return product
        return self._torch.mm(self._torch.from_numpy(at), self._torch.from_numpy(b)).numpy()


def torch_gemm() -> TorchGemm:
    """The GEMMs for a call with torch tensors (torch must be loaded)."""
    return TorchGemm()
