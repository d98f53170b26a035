"""torch CPU tensors through the core API, without importing torch.

The core works on NumPy arrays. When a caller hands it torch tensors, torch is necessarily
loaded already, so this module takes it from ``sys.modules`` (the core never imports torch and
runs without it): every tensor argument becomes a NumPy view of the same memory (zero copy, any
strides), the engine's GEMMs run on torch's libraries (:class:`TorchGemm`: torch.mm or oneDNN; never
NumPy's BLAS in the same call: two BLAS runtimes' idle workers spin against each other), and
the results
come back as tensors over the engine's result memory (zero copy again).
"""

from __future__ import annotations

import ctypes
import functools
import glob
import os
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from ..core import env
from ..core.errors import LstmInvalidArgumentError
from ..core.machine import native_bfloat16, torch_threads
from ..fused.gemm import NUMPY_GEMM, FixedGemm, dense, loop_product, prepared, transposed_product
from ..fused.kernels import gemm_scratch, library_matmul, walk_product


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


def _view(t: Any) -> np.ndarray:
    """A CPU tensor's memory as a NumPy array, detached from autograd (raises where NumPy
    cannot view it: another device or layout, a lazy negation, an odd dtype)."""
    return (t.detach() if t.requires_grad else t).numpy()


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
            return _view(value)
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
        torch = _torch()
        if torch is not None and all(isinstance(v, torch.Tensor) for v in value):
            try:  # the common case (CPU tensors, parameters among them): views at once
                return [_view(v) for v in value]
            except (TypeError, RuntimeError):
                pass  # one of them needs the checks below
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


def private_ops_allowed() -> bool:
    """False where LSTMGRAD_PRIVATE_OPS=0 (or off, false, no): torch's public operations only
    (torch.mm); ValueError for a value that is no switch (:mod:`lstmgrad.core.env`)."""
    return env.choice(env.PRIVATE_OPS, "on", env.SWITCH_VALUES) == "on"


def _once(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    """``check(torch)`` run once a process, its answer kept; False where it raises (a missing
    or changed private op or conversion: torch.mm and the engine's kernels serve)."""
    answer: list[bool] = []

    @functools.wraps(check)
    def probe(torch: Any) -> bool:
        if not answer:
            try:
                ok = bool(check(torch))
            except Exception:
                ok = False
            answer.append(ok)
        return answer[0]

    return probe


@_once
def _onednn_rnn(torch: Any) -> bool:
    """Whether torch's CPU LSTM runs on oneDNN's RNN primitive here (built with it, enabled)."""
    return bool(torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled)


def _probe_onednn(torch: Any) -> bool:
    """Whether oneDNN's linear (a private op: ``torch.ops.mkldnn._linear_pointwise``, with its
    weight reorder) exists and computes a small product right, checked once a process."""
    mkldnn = getattr(torch.ops, "mkldnn", None)
    if not torch.backends.mkldnn.is_available() or mkldnn is None:
        return False
    a = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    w = torch.arange(12, dtype=torch.float32).reshape(4, 3)
    packed = mkldnn._reorder_linear_weight(w, 2)
    return all(
        torch.equal(mkldnn._linear_pointwise(a, weight, None, "none", [], ""), a @ w.t())
        for weight in (w, packed)
    )


@_once
def _probe_mkl(torch: Any) -> bool:
    """Whether MKL's packed GEMM (private ops: ``torch.ops.mkl._mkl_reorder_linear_weight``
    and ``_mkl_linear``) exists and computes small products right, at the packed row count
    and at others, checked once a process."""
    mkl = getattr(torch.ops, "mkl", None)
    if not torch.backends.mkl.is_available() or mkl is None:
        return False
    w = torch.arange(12, dtype=torch.float32).reshape(4, 3)
    packed = mkl._mkl_reorder_linear_weight(w, 2)
    rows_a = (torch.arange(3 * rows, dtype=torch.float32).reshape(rows, 3) for rows in (2, 1, 3))
    return all(torch.equal(mkl._mkl_linear(a, packed, w, None, 2), a @ w.t()) for a in rows_a)


def _torch_library(torch: Any) -> ctypes.CDLL:
    """torch's own library (libtorch_cpu, where torch links MKL), loaded already."""
    path = sorted(glob.glob(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.*")))
    return ctypes.CDLL(path[0])


_WALK_GEMMS: dict[np.dtype, int] = {}  # compute dtype -> its GEMM's address (the probe's)


@_once
def _probe_walk_gemm(torch: Any) -> bool:
    """Whether this torch build's own library (libtorch_cpu, where torch links MKL) exports the
    Fortran GEMMs ``sgemm_`` and ``dgemm_`` and they compute small products right when the
    engine's kernels call them (rows of a wider array included), checked once a process; their
    addresses kept for :meth:`TorchGemm.walk_gemm`. Only torch's own library is searched: a
    GEMM of another BLAS in the process would start a runtime of its own."""
    if not torch.backends.mkl.is_available():
        return False
    lib = _torch_library(torch)
    found = {}
    for dtype, name in ((np.float32, "sgemm_"), (np.float64, "dgemm_")):
        fn = ctypes.cast(getattr(lib, name), ctypes.c_void_p).value
        if not fn:
            return False
        wide = np.arange(-9, 15, dtype=dtype).reshape(6, 4)  # small integers: exact products
        a, b = wide[1:4, :3], np.arange(-6, 9, dtype=dtype).reshape(3, 5)
        out = np.full((3, 5), np.nan, dtype)
        library_matmul(fn, a, b, out, *gemm_scratch(out))
        if not np.array_equal(out, a @ b):
            return False
        found[np.dtype(dtype)] = fn
    _WALK_GEMMS.update(found)
    return True


_PACKED_GEMM: dict[str, Any] = {}  # MKL's packed sgemm (the probe's): "size", "pack", "compute"


def _column_major(rows: int, cols: int, s0: int, s1: int) -> tuple[bytes, int] | None:
    """A [rows, cols] matrix with element strides (s0, s1) as the column-major BLAS operand of
    its transpose: (b"N", its row stride) where its rows are contiguous, (b"T", its column
    stride) where its columns are (a transposed view); None where neither (the caller copies it
    to C order). A single row's or column's stride is never read: the smallest valid one."""
    if (s1 == 1 or cols == 1) and (rows == 1 or s0 >= max(cols, 1)):
        return b"N", s0 if rows > 1 else max(cols, 1)
    if (s0 == 1 or rows == 1) and (cols == 1 or s1 >= max(rows, 1)):
        return b"T", s1 if cols > 1 else max(rows, 1)
    return None


def _pack_args(b: np.ndarray) -> tuple[np.ndarray, bytes, int]:
    """b [K, N] as the packed GEMM's first operand (column-major b^T, :func:`_column_major`),
    or a C-contiguous copy of it."""
    k, n = b.shape
    found = _column_major(k, n, b.strides[0] // b.itemsize, b.strides[1] // b.itemsize)
    if found is None:
        return np.ascontiguousarray(b), b"N", max(n, 1)
    return b, *found


def _pack_rows(rows: int) -> int:
    # MKL packs for one row by another, ten times slower path; products of one row read a
    # matrix packed for two
    return max(rows, 2)


@functools.lru_cache(maxsize=256)  # asked per (layer, direction) and by the memory check
def packed_bytes(shape: tuple[int, int], rows: int) -> int:
    """Bytes of a [K, N] float32 operand packed by MKL for products of at most ``rows`` rows,
    with room to align it to 64 bytes."""
    k, n = shape
    i64 = ctypes.c_int64  # the integers as 64 bits: read alike by a 32- or 64-bit interface
    size = _PACKED_GEMM["size"](b"A", ctypes.byref(i64(n)), ctypes.byref(i64(_pack_rows(rows))),
                                ctypes.byref(i64(k)))  # fmt: skip
    return int(size) + 64


def pack_operand(b: np.ndarray, rows: int, buf: np.ndarray) -> np.ndarray:
    """b [K, N] (float32) packed by MKL into ``buf`` (uint8, at least :func:`packed_bytes`),
    returned as the operand of :func:`lstmgrad.fused.kernels.packed_matmul`: a [K, N] uint8
    view with zero strides over the packed matrix (64-byte aligned)."""
    k, n = b.shape
    src, trans, ld = _pack_args(b)
    start = (-buf.ctypes.data) % 64
    dest = buf[start:]
    i64 = ctypes.c_int64
    _PACKED_GEMM["pack"](b"A", trans, ctypes.byref(i64(n)), ctypes.byref(i64(_pack_rows(rows))),
                         ctypes.byref(i64(k)), ctypes.byref(ctypes.c_float(1.0)),
                         ctypes.c_void_p(src.ctypes.data), ctypes.byref(i64(ld)),
                         ctypes.c_void_p(dest.ctypes.data))  # fmt: skip
    return np.lib.stride_tricks.as_strided(dest, shape=(k, n), strides=(0, 0))


@_once
def _probe_packed_gemm(torch: Any) -> bool:
    """Whether torch's own library exports MKL's packed float32 GEMM (sgemm_pack_get_size,
    sgemm_pack, sgemm_compute) and the step loops' products through it are right: small
    integer products, exact, with the fixed operand dense or a transposed view, a's rows a
    block of a wider array's, and fewer rows than packed for (variable lengths); checked
    once a process."""
    if not torch.backends.mkl.is_available():
        return False
    lib = _torch_library(torch)
    names = ("sgemm_pack_get_size", "sgemm_pack", "sgemm_compute")
    if not all(hasattr(lib, name) for name in names):
        return False
    size, pack, compute = (getattr(lib, name) for name in names)
    size.restype, pack.restype = ctypes.c_size_t, None
    _PACKED_GEMM.update(size=size, pack=pack, compute=ctypes.cast(compute, ctypes.c_void_p).value)
    wide = np.arange(-9, 15, dtype=np.float32).reshape(6, 4)
    w = np.arange(-6, 9, dtype=np.float32).reshape(3, 5)
    for b in (w, w.T.copy().T):
        packed = pack_operand(b, 3, np.empty(packed_bytes(b.shape, 3), np.uint8))
        for a in (wide[1:4, :3], wide[2:3, :3]):
            out = np.full((a.shape[0], 5), np.nan, np.float32)
            walk_product(_PACKED_GEMM["compute"], a, packed, out, *gemm_scratch(out))
            if not np.array_equal(out, a @ b):
                _PACKED_GEMM.clear()
                return False
    return True


def _same_values(got: np.ndarray, want: np.ndarray) -> bool:
    """The same bits, a NaN for a NaN of the same sign (payloads may differ: NumPy's and the
    kernels' conversions keep a signalling NaN signalling, F16C quiets it)."""
    nan = np.isnan(want)
    ints = {2: np.uint16, 4: np.uint32}[got.itemsize]
    return bool(
        np.array_equal(np.isnan(got), nan)
        and np.array_equal(np.signbit(got[nan]), np.signbit(want[nan]))
        and np.array_equal(got[~nan].view(ints), want[~nan].view(ints))
    )


@_once
def _probe_conversion(torch: Any) -> bool:
    """Whether torch's float32 <-> float16 copy (``Tensor.copy_``) gives the engine's kernels'
    bits (lstmgrad.fused.half) on every float16 value and on float32 values at and around
    every float16 rounding boundary, specials and random bit patterns (a NaN's payload may
    differ, as between NumPy's conversions and F16C's); checked once a process."""
    from ..fused import half

    values = half.float_table()  # every float16, as float32
    finite = np.unique(values[np.isfinite(values)].astype(np.float64))
    mids = ((finite[1:] + finite[:-1]) / 2).astype(np.float32)  # exact in float32
    rng = np.random.default_rng(0)
    bits = rng.integers(0, 1 << 32, 1 << 16, dtype=np.uint64).astype(np.uint32)
    wide = np.concatenate([values, mids, np.nextafter(mids, np.float32(np.inf)),
                           np.nextafter(mids, np.float32(-np.inf)),
                           bits.view(np.float32)])[None]  # fmt: skip
    want16, got16 = np.empty(wide.shape, np.float16), np.empty(wide.shape, np.float16)
    half.assign(want16, wide)
    torch.from_numpy(got16).copy_(torch.from_numpy(wide))
    halves = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    got32 = np.empty((1, halves.size), np.float32)
    torch.from_numpy(got32).copy_(torch.from_numpy(halves[None]))
    return _same_values(got16, want16) and _same_values(got32, values[None])


class TorchGemm:
    """GEMMs computed by torch on NumPy views of tensor memory (see :class:`lstmgrad.fused.gemm.Gemm`).

    Methods: "blas" (torch.mm, public), "loop" and "blas_t" (as for NumPy), and, for float32
    where this torch build has them and LSTMGRAD_PRIVATE_OPS is not 0, "onednn" (oneDNN's
    linear, the kernel torch's own fused ops use) and "packed" (the same with the fixed weight
    reordered once for many calls); "mkl" (MKL's packed GEMM, the fixed weight packed once for
    many calls) where this build has MKL and the same variable allows private ops, which also
    lets the step loops call MKL's GEMM on their own thread (:meth:`walk_gemm`).
    """

    kind = "torch"

    def __init__(self) -> None:
        torch = _torch()
        self._torch = torch
        self._onednn = private_ops_allowed() and _probe_onednn(torch)
        self._mkl = private_ops_allowed() and _probe_mkl(torch)
        self._walk_gemm = private_ops_allowed() and _probe_walk_gemm(torch)
        self._packed_gemm = self._walk_gemm and _probe_packed_gemm(torch)

    def product_methods(self, dtype: np.dtype) -> tuple[str, ...]:
        if self._onednn and np.dtype(dtype) == np.float32:
            return ("blas", "onednn")
        return ("blas",)

    def fixed_methods(self, dtype: np.dtype) -> tuple[str, ...]:
        methods: tuple[str, ...] = ("blas", "blas_t", "loop")
        if np.dtype(dtype) == np.float32:
            methods += ("onednn", "packed") if self._onednn else ()
            methods += ("mkl",) if self._mkl else ()
        return methods

    def _mm(self, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
        torch = self._torch
        torch.mm(torch.from_numpy(a), torch.from_numpy(b), out=torch.from_numpy(out))

    def _linear(self, a: np.ndarray, b: np.ndarray) -> np.ndarray | None:
        """a @ b as oneDNN's own new result, or None where b is not dense or a not C-contiguous
        (oneDNN copies a transposed a first; torch.mm reads it in place)."""
        if not (a.flags.c_contiguous and _is_dense(b)):
            return None
        ta, tb = self._torch.from_numpy(a), self._torch.from_numpy(b)
        # a @ b = linear(a, weight=b^T)
        return self._torch.ops.mkldnn._linear_pointwise(ta, tb.t(), None, "none", [], "").numpy()

    def product(self, a: np.ndarray, b: np.ndarray, scratch: np.ndarray, method: str, /) -> Any:
        # oneDNN has no out= form: its own result, rather than a copy of it
        if method == "onednn":
            product = self._linear(a, b)
            if product is not None:
                return product
        self._mm(a, b, scratch)
        return scratch

    def fixed(self, b: np.ndarray, method: str, rows: int, threads: int = 1) -> FixedGemm:
        return prepared(self.kind, b, method, rows, lambda: self._fixed(b, method, rows, threads))

    def _fixed(self, b: np.ndarray, method: str, rows: int, threads: int) -> FixedGemm:
        torch = self._torch
        if method == "loop":
            return loop_product(b)
        if method == "blas_t":
            return transposed_product(b, rows, self._mm, threads)
        if method == "mkl":  # packed from a dense [N, K] copy, as "packed"'s
            batch = max(rows, 1)
            weight = torch.from_numpy(dense(b.T, threads))
            mkl_packed = torch.ops.mkl._mkl_reorder_linear_weight(weight, batch)
            mkl_linear = torch.ops.mkl._mkl_linear
            # steps of other row counts (variable lengths): "blas", made on first use, rather
            # than the torch linear on the transposed weight that MKL's op falls back to
            other_rows: list[FixedGemm] = []

            def mkl(a: np.ndarray, out: np.ndarray) -> np.ndarray:
                if a.shape[0] != batch:
                    if not other_rows:
                        other_rows.append(self._fixed(b, "blas", rows, threads))
                    return other_rows[0](a, out)
                # MKL's own result
                return mkl_linear(torch.from_numpy(a), mkl_packed, weight, None, batch).numpy()

            return mkl
        if method not in ("onednn", "packed"):
            # a dense b, as NumPy's: MKL multiplies a transposed view up to twice as slowly
            tb = torch.from_numpy(dense(b, threads))

            def plain(a: np.ndarray, out: np.ndarray) -> np.ndarray:
                torch.mm(torch.from_numpy(a), tb, out=torch.from_numpy(out))
                return out

            return plain
        linear = torch.ops.mkldnn._linear_pointwise
        if method == "packed":  # reordered from a dense [N, K] copy: from a strided view it
            # takes several times longer
            weight = torch.from_numpy(dense(b.T, threads))
            weight = torch.ops.mkldnn._reorder_linear_weight(weight, max(rows, 1))
        else:
            weight = torch.from_numpy(dense(b, threads)).t()

        def onednn(a: np.ndarray, out: np.ndarray) -> np.ndarray:
            ta = torch.from_numpy(a)
            if not _is_dense(a):  # a reference kernel otherwise (see _is_dense)
                ta = ta.contiguous()
            # oneDNN's own result: a copy into out would cost more than it saves
            return linear(ta, weight, None, "none", [], "").numpy()

        return onednn

    def nt(self, at: np.ndarray, b: np.ndarray, method: str, /) -> np.ndarray:
        product = self._linear(at, b) if method == "onednn" else None
        if product is not None:
            return product
        return self._torch.mm(self._torch.from_numpy(at), self._torch.from_numpy(b)).numpy()

    def threads(self) -> int:
        return torch_threads()

    def walk_gemm(self, dtype: np.dtype, packed: bool = False) -> int:
        if packed:  # MKL packs float32 only
            ok = self._packed_gemm and np.dtype(dtype) == np.float32
            return int(_PACKED_GEMM["compute"]) if ok else 0
        return _WALK_GEMMS.get(np.dtype(dtype), 0) if self._walk_gemm else 0

    def walk_operand(self, b: np.ndarray, /) -> np.ndarray:
        return b

    def walk_pack_bytes(self, shape: tuple[int, int], rows: int) -> int:
        return packed_bytes(shape, rows) if self._packed_gemm else 0

    def walk_pack(self, b: np.ndarray, rows: int, buf: np.ndarray) -> np.ndarray:
        return pack_operand(b, rows, buf)

    def library_lstm(self, dtype: np.dtype) -> bool:
        # float32 storage on oneDNN's RNN primitive: torch's other CPU LSTM runs cell by cell
        return np.dtype(dtype) == np.float32 and _onednn_rnn(self._torch)

    def lstm_inference(self, call: Any, /) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """torch's own LSTM forward (``torch._VF.lstm``, what torch.nn.LSTM calls: oneDNN's
        fused RNN primitive on the CPU) of a dense inference call, on views of its arrays."""
        torch, d = self._torch, call.dims
        x = torch.from_numpy(call.x)
        zeros = None if call.h0 is not None and call.c0 is not None else x.new_zeros(d.K, d.B, d.H)
        h0 = zeros if call.h0 is None else torch.from_numpy(call.h0)
        c0 = zeros if call.c0 is None else torch.from_numpy(call.c0)
        params = [torch.from_numpy(p) for p in call.params]
        with torch.no_grad():
            y, hy, cy = torch._VF.lstm(x, (h0, c0), params, d.has_bias, d.L, 0.0, False,
                                       d.D == 2, False)  # fmt: skip
        return y.numpy(), hy.numpy(), cy.numpy()

    def convert(self, dst: np.ndarray, src: np.ndarray, /) -> bool:
        # torch's copy (vectorised, on its threads), where it rounds as the kernels do; NumPy
        # views torch cannot wrap (read-only, negative strides) go to the kernels
        if not (src.flags.writeable and min(src.strides, default=0) >= 0
                and min(dst.strides, default=0) >= 0 and _probe_conversion(self._torch)):  # fmt: skip
            return False
        self._torch.from_numpy(dst).copy_(self._torch.from_numpy(src))
        return True


_BF16_GEMM: list[Any] = []  # MKL's gemm_bf16bf16f32 (the probe's)


@_once
def _probe_bf16_gemm(torch: Any) -> bool:
    """Whether the CPU has bfloat16 units and torch's own library exports MKL's
    ``GEMM_BF16BF16F32`` (bfloat16 operands, float32 accumulation and result), computing small
    products exactly where they are exact (small integers), with either operand transposed;
    checked once a process."""
    if not (native_bfloat16() and torch.backends.mkl.is_available()):
        return False
    fn = getattr(_torch_library(torch), "GEMM_BF16BF16F32", None)
    if fn is None:
        return False
    fn.restype = None
    _BF16_GEMM.append(fn)
    a = np.arange(-9, 15, dtype=np.float32).reshape(6, 4)
    b = np.arange(-6, 9, dtype=np.float32).reshape(3, 5)
    for x, y in ((a[1:4, :3], b), (a[:3, :3].T, b), (a[1:4, :3], b.T.copy().T)):
        out = np.full((3, 5), np.nan, np.float32)
        _bf16_mm(torch, x, y, out)
        if not np.array_equal(out, x @ y):
            _BF16_GEMM.clear()
            return False
    return True


def _blas_layout(t: Any) -> tuple[Any, bytes, int]:
    """A 2-D tensor as the column-major BLAS operand of its transpose (:func:`_column_major`),
    or a row-major copy of it."""
    rows, cols = t.shape
    found = _column_major(rows, cols, t.stride(0), t.stride(1))
    if found is None:
        return t.contiguous(), b"N", max(cols, 1)
    return t, *found


def _bf16_mm(torch: Any, a: Any, b: Any, out: np.ndarray) -> None:
    """out (float32, [m, n], rows dense) = a @ b with a and b rounded to bfloat16 (NumPy float32
    arrays or bfloat16 tensors), accumulated in float32 by MKL's gemm_bf16bf16f32."""
    ta = a if isinstance(a, torch.Tensor) else torch.from_numpy(a).bfloat16()
    tb = b if isinstance(b, torch.Tensor) else torch.from_numpy(b).bfloat16()
    m, k = ta.shape
    n = tb.shape[1]
    if m == 0 or n == 0:
        return
    if k == 0:
        out[...] = 0.0
        return
    ta, op_a, lda = _blas_layout(ta)
    tb, op_b, ldb = _blas_layout(tb)
    i32, f32 = ctypes.c_int, ctypes.c_float
    # row-major out = a @ b is column-major out^T = b^T a^T
    _BF16_GEMM[0](op_b, op_a, ctypes.byref(i32(n)), ctypes.byref(i32(m)), ctypes.byref(i32(k)),
                  ctypes.byref(f32(1.0)), ctypes.c_void_p(tb.data_ptr()), ctypes.byref(i32(ldb)),
                  ctypes.c_void_p(ta.data_ptr()), ctypes.byref(i32(lda)), ctypes.byref(f32(0.0)),
                  ctypes.c_void_p(out.ctypes.data), ctypes.byref(i32(out.strides[0] // 4)))  # fmt: skip


class TorchBf16Gemm(TorchGemm):
    """torch's back end with bfloat16 products, for float32 computation of bfloat16 data:
    every GEMM rounds its operands to bfloat16 (to nearest even) and accumulates in float32
    (MKL's gemm_bf16bf16f32 on the CPU's bfloat16 units), as torch's own bfloat16 products do;
    everything else stays float32. One method per product ("blas"); the one-call step loops
    call the same GEMM (never their Numba loop, which would multiply in float32), so every plan
    multiplies alike."""

    kind = "torch-bf16"

    def product_methods(self, dtype: np.dtype) -> tuple[str, ...]:
        return ("blas",)

    def fixed_methods(self, dtype: np.dtype) -> tuple[str, ...]:
        return ("blas",)

    def product(self, a: np.ndarray, b: np.ndarray, scratch: np.ndarray, method: str, /) -> Any:
        out = (
            scratch
            if scratch.strides[-1] == scratch.itemsize
            else np.empty(scratch.shape, np.float32)
        )
        _bf16_mm(self._torch, a, b, out)
        return out

    def fixed(self, b: np.ndarray, method: str, rows: int, threads: int = 1) -> FixedGemm:
        tb = self._torch.from_numpy(b).bfloat16()  # rounded once for every step

        def product(a: np.ndarray, out: np.ndarray) -> np.ndarray:
            _bf16_mm(self._torch, a, tb, out)
            return out

        return product

    def nt(self, at: np.ndarray, b: np.ndarray, method: str, /) -> np.ndarray:
        out = np.empty((at.shape[0], b.shape[1]), np.float32)
        _bf16_mm(self._torch, at, b, out)
        return out

    def walk_gemm(self, dtype: np.dtype, packed: bool = False) -> int:
        # the one-call step loops call MKL's bfloat16 GEMM, rounding their row operand
        # (fused.kernels.walk_product), never the Numba loop (float32 products) nor the
        # packed float32 GEMM
        if packed or np.dtype(dtype) != np.float32:
            return 0
        return ctypes.cast(_BF16_GEMM[0], ctypes.c_void_p).value or 0

    def walk_operand(self, b: np.ndarray, /) -> np.ndarray:
        # the fixed operand as bfloat16 bits, in b's layout (a transposed view stays one)
        t = self._torch.from_numpy(b).bfloat16()
        return t.view(self._torch.int16).numpy().view(np.uint16)

    loops = False  # feasible(): no Numba-loop products (they multiply in float32)

    def library_lstm(self, dtype: np.dtype) -> bool:
        return False  # torch's LSTM would multiply in float32, not in bfloat16


def bf16_gemm() -> TorchGemm:
    """The back end of bfloat16 products (:class:`TorchBf16Gemm`) where the CPU has bfloat16
    units and torch's MKL the GEMM; else torch's float32 back end (:func:`torch_gemm`): without
    the units, bfloat16 products are emulated, slower than float32's."""
    torch = _torch()
    if torch is None or not _probe_bf16_gemm(torch):
        return torch_gemm()
    if not _bf16_gemms:
        _bf16_gemms.append(TorchBf16Gemm())
    return _bf16_gemms[0]


_bf16_gemms: list[TorchBf16Gemm] = []


def array_gemm() -> Any:
    """The GEMMs of a call with NumPy arrays: NumPy's BLAS, or torch's where
    ``LSTMGRAD_BLAS=torch`` (torch imported at the first such call; the arrays are viewed, not
    copied). torch's MKL and oneDNN run the small per-step products 1.4-1.8x faster than the
    OpenBLAS of NumPy's wheels (docs/performance.md); results agree to rounding, not bits."""
    if env.choice(env.BLAS, "numpy", env.BLAS_VALUES) == "numpy":
        return NUMPY_GEMM
    if _torch() is None:
        try:
            import torch  # noqa: F401  (loaded once; the back end takes it from sys.modules)
        except ImportError as exc:
            raise ImportError(
                "LSTMGRAD_BLAS=torch: PyTorch is not installed (pip install torch, or unset "
                "LSTMGRAD_BLAS to use NumPy's BLAS)"
            ) from exc
    return torch_gemm()


_torch_gemms: dict[bool, TorchGemm] = {}  # by private_ops_allowed(): a back end holds no state


def torch_gemm() -> TorchGemm:
    """The GEMMs for a call with torch tensors (torch must be loaded)."""
    allowed = private_ops_allowed()
    gemm = _torch_gemms.get(allowed)
    if gemm is None:
        gemm = _torch_gemms[allowed] = TorchGemm()
    return gemm
