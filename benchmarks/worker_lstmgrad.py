"""Benchmark worker: lstmgrad. Never imports torch (NumPy's OpenBLAS and PyTorch's BLAS in one
process were measured 35x slower), and imports lstmgrad only on its first request so that a
fresh worker can time the import and the first calls. With LSTMGRAD_BENCH_INPUT=tensors in its
environment it gives the fast engine torch tensors instead (torch.from_numpy of the same
arrays: lstmgrad then runs its GEMMs on torch's oneDNN / BLAS), imports torch and never runs a
NumPy GEMM (no GEMM-only items; tracemalloc cannot see torch's memory: no memory figures).

Started by benchmarks/run.py; speaks the JSON-lines protocol of _protocol.py. Timed items of
the current shape (the run's dtype, float32 by default; the fused engine):

- ``bwd``: lstm_backward with dy, dh, dc all given, from one forward (train=True) done in setup.
- ``bwd_nodx``: the same with output_mask=(False, True, True, True).
- ``fwdbwd``: lstm_forward + lstm_backward.
- ``gemm_bwd`` / ``gemm_bwd_nodx`` / ``gemm_fwd``: the GEMMs of the backward (without / with
  layer 0's dx) and of the forward alone, numpy.matmul on float32 arrays into preallocated
  outputs; varlen shapes use the effective rows (batch_sizes[t] per step, sum of lengths).
"""

from __future__ import annotations

import os
import sys
import time
import tracemalloc
from typing import Any

import numpy as np
from _machine import rel_err
from _protocol import decode, encode, serve, time_reps
from shapes import Shape, make_case

STATE: dict[str, Any] = {}
NODX = (False, True, True, True)
INPUT = os.environ.get("LSTMGRAD_BENCH_INPUT", "arrays")
if INPUT not in ("arrays", "tensors"):
    raise SystemExit(f"LSTMGRAD_BENCH_INPUT must be 'arrays' or 'tensors', got {INPUT!r}")


def _fast_in(value: Any, impl: str) -> Any:
    """The fast engine's argument in this worker's input mode: NumPy arrays (lists of them)
    as torch tensors over the same memory where INPUT == "tensors"; anything else unchanged."""
    if INPUT != "tensors" or impl != "fused":
        return value
    if isinstance(value, np.ndarray):
        import torch

        return torch.from_numpy(value)
    if isinstance(value, (list, tuple)):
        return [_fast_in(v, impl) for v in value]
    return value


def _lg():
    import lstmgrad

    return lstmgrad


def info() -> dict:
    lg = _lg()
    out: dict[str, Any] = {
        "lstmgrad": getattr(lg, "__version__", "?"),
        "lstmgrad_file": lg.__file__,
        "numpy": np.__version__,
        "input": INPUT,
        "torch_imported": "torch" in sys.modules,
    }
    if INPUT == "tensors":
        import torch

        out["torch"] = torch.__version__
        out["torch_threads"] = torch.get_num_threads()
    import numba

    out.update(numba=numba.__version__, numba_threads=numba.get_num_threads())
    out["numba_threading_layer"] = numba.config.THREADING_LAYER
    return out


def _flags(sh: Shape) -> dict:
    return {"num_layers": sh.L, "bidirectional": sh.bidirectional}


def _forward(sh: Shape, c: dict, impl: str):
    a = [_fast_in(c[k], impl) for k in ("x", "params", "h0", "c0", "batch_sizes")]
    return _lg().lstm_forward(a[0], a[1], a[2:4], a[4], **_flags(sh), train=True, impl=impl)


def _backward(sh: Shape, c: dict, saved, impl: str, output_mask=None):
    a = {k: _fast_in(c[k], impl) for k in ("x", "params", "h0", "c0", "dy", "dh", "dc")}
    return _lg().lstm_backward(
        a["x"],
        [a["h0"], a["c0"]],
        a["params"],
        a["dy"],
        a["dh"],
        a["dc"],
        *(_fast_in(s, impl) for s in saved[:7]),
        _fast_in(c["batch_sizes"], impl),
        **_flags(sh),
        output_mask=output_mask,
        impl=impl,
    )


def _grad_errors(got, want) -> dict:
    errs = {
        "dx": rel_err(got.dx, want.dx),
        "dh_prev": rel_err(got.dh_prev, want.dh_prev),
        "dc_prev": rel_err(got.dc_prev, want.dc_prev),
    }
    errs["dparams"] = max(map(rel_err, got.dparams, want.dparams))
    return errs


def gate_fused(shapes: list[dict]) -> dict:
    """fused vs reference, float32, on each (already scaled-down) shape, NaN in padding.

    Per shape: the backward alone from the same saved activations (reference forward), with and
    without layer 0's dx, and forward+backward end to end (fused forward -> fused backward vs
    reference forward -> reference backward; the forward's output/hy/cy too)."""
    out = {}
    for d in shapes:
        sh = Shape.from_dict(d)
        c = make_case(sh, "float32", pad_value=np.nan)
        ref_f = _forward(sh, c, "reference")
        fus_f = _forward(sh, c, "fused")
        res: dict[str, Any] = {}
        for mask_name, mask in (("full", None), ("nodx", NODX)):
            want = _backward(sh, c, ref_f.saved, "reference", mask)
            got = _backward(sh, c, ref_f.saved, "fused", mask)
            res[f"bwd_{mask_name}"] = _grad_errors(got, want)
        want = _backward(sh, c, ref_f.saved, "reference")
        got = _backward(sh, c, fus_f.saved, "fused")
        e2e = _grad_errors(got, want)
        out_ref, out_fus = ref_f.output, fus_f.output
        if c["batch_sizes"] is not None:  # padded rows of the output are unspecified
            valid = (np.arange(sh.T)[:, None] < c["lengths"][None, :]).reshape(-1)
            out_ref, out_fus = out_ref[valid], out_fus[valid]
        e2e.update(
            output=rel_err(out_fus, out_ref),
            hy=rel_err(fus_f.hy, ref_f.hy),
            cy=rel_err(fus_f.cy, ref_f.cy),
        )
        res["fwd_bwd"] = e2e
        out[sh.id] = res
    return out


def reference64(shape: dict, case: dict) -> dict:
    """Gate oracle side: the float64 reference engine on the parent's arrays."""
    sh = Shape.from_dict(shape)
    c = decode(case)
    f = _forward(sh, c, "reference")
    g = _backward(sh, c, f.saved, "reference")
    return encode(
        {
            "dx": g.dx,
            "dh_prev": g.dh_prev,
            "dc_prev": g.dc_prev,
            "dparams": list(g.dparams),
            "hy": f.hy,
            "cy": f.cy,
        }
    )


def _gemm_items(sh: Shape) -> dict:
    """Closures running the GEMMs of the backward (with / without layer 0's dx) and of the
    forward of ``sh`` alone: numpy.matmul on float32 arrays into preallocated outputs."""
    rng = np.random.default_rng(1)
    bs = sh.batch_sizes()
    steps = [int(v) for v in bs] if bs is not None else [sh.B] * sh.T
    starts, rows, h, g = np.cumsum([0, *steps]).tolist(), sum(steps), sh.H, 4 * sh.H
    sizes = {"w_ih": (g, "i"), "w_hh": (g, h), "dG": (rows, g), "xh": (rows, "i+h"),
             "x": (rows, "i"), "h": (sh.B, h), "dh": (sh.B, h), "dx": (rows, "i"),
             "dw": (g, "i+h"), "gx": (rows, g), "gh": (sh.B, g)}  # fmt: skip
    per = []  # per (layer, direction); dG: gate gradients, xh: layer input | h_prev
    for layer in range(sh.L):
        dim = {"i": sh.input_size(layer), "i+h": sh.input_size(layer) + h}
        for _ in range(sh.D):
            a = {k: rng.standard_normal([dim.get(v, v) for v in s]).astype(np.float32)
                 for k, s in sizes.items()}  # fmt: skip
            per.append((layer, a))

    def bwd(dx_layer0: bool) -> None:
        for layer, a in per:
            for t, n in enumerate(steps):  # [n,4H]x[4H,H]
                np.matmul(a["dG"][starts[t] : starts[t] + n], a["w_hh"], out=a["dh"][:n])
            if layer > 0 or dx_layer0:
                np.matmul(a["dG"], a["w_ih"], out=a["dx"])  # [rows,4H]x[4H,I_l]
            np.matmul(a["dG"].T, a["xh"], out=a["dw"])  # [4H,rows]x[rows,I_l+H]

    def fwd() -> None:
        for _, a in per:
            np.matmul(a["x"], a["w_ih"].T, out=a["gx"])  # [rows,I_l]x[I_l,4H]
            for n in steps:  # [n,H]x[H,4H]
                np.matmul(a["h"][:n], a["w_hh"].T, out=a["gh"][:n])

    return {
        "gemm_bwd": (lambda _: bwd(True), None),
        "gemm_bwd_nodx": (lambda _: bwd(False), None),
        "gemm_fwd": (lambda _: fwd(), None),
    }


def setup(shape: dict, dtype: str = "float32") -> dict:
    """Inputs of one shape in ``dtype``, one forward (train=True) for the backward items. The
    GEMM-only items stay float32: the engine computes float16 in float32."""
    STATE.clear()
    sh = Shape.from_dict(shape)
    c = make_case(sh, dtype)
    if INPUT == "tensors":  # converted once, outside the timed calls
        c = {k: _fast_in(v, "fused") for k, v in c.items()}
    fwd = _forward(sh, c, "fused")
    STATE.update(shape=sh, case=c, fwd=fwd)
    items: dict[str, tuple] = {
        "bwd": (lambda _: _backward(sh, c, fwd.saved, "fused"), None),
        "bwd_nodx": (lambda _: _backward(sh, c, fwd.saved, "fused", NODX), None),
        "fwdbwd": (lambda _: _backward(sh, c, _forward(sh, c, "fused").saved, "fused"), None),
    }
    if INPUT == "arrays":  # (NumPy GEMMs beside torch's would distort both)
        items.update(_gemm_items(sh))
    STATE["items"] = items
    return {"items": list(items), "torch_imported": "torch" in sys.modules}


def time_item(item: str, n: int) -> list[float]:
    timed, untimed = STATE["items"][item]
    return time_reps(n, timed, untimed)


def _out_bytes(res) -> int:
    arrays = []
    for v in res:
        if isinstance(v, np.ndarray):
            arrays.append(v)
        elif isinstance(v, (list, tuple)):
            arrays += [a for a in v if isinstance(a, np.ndarray)]
    return sum(a.nbytes for a in arrays)


def _traced(fn) -> tuple[Any, int, int]:
    """(result, peak bytes allocated during fn above the start, bytes of the result).

    The memory lstmgrad keeps between calls (scratch, recycled result blocks) is given back
    first, so the call allocates, and the trace sees, everything it needs."""
    release = getattr(getattr(_lg(), "workspace", None), "release_memory", None)
    if release is not None:
        release()
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        res = fn()
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    return res, peak, _out_bytes(res)


def memory() -> dict | None:
    """tracemalloc peak of one call minus the bytes of its outputs (NumPy allocations only;
    memory a compiled kernel allocates outside NumPy/Python is not seen). None with tensors."""
    if INPUT == "tensors":
        return None
    sh, c, fwd = STATE["shape"], STATE["case"], STATE["fwd"]
    out = {}
    for name, fn in (
        ("bwd", lambda: _backward(sh, c, fwd.saved, "fused")),
        ("bwd_nodx", lambda: _backward(sh, c, fwd.saved, "fused", NODX)),
    ):
        _, peak, outb = _traced(fn)
        out[name] = {"peak": peak, "outputs": outb, "extra": peak - outb}
    res, peak, _ = _traced(lambda: _forward(sh, c, "fused"))
    outb = _out_bytes([*res[:3], *(a for lst in res.saved[:7] for a in lst)])
    out["fwd"] = {"peak": peak, "outputs": outb, "extra": peak - outb}
    return out


def first_call(shape: dict, dtype: str = "float32") -> dict:
    """In a fresh process: import time, then the first and second forward and backward."""
    t0 = time.perf_counter()
    already = "lstmgrad" in sys.modules
    _lg()
    if INPUT == "tensors":  # part of the import cost in this mode
        import torch  # noqa: F401
    t_import = time.perf_counter() - t0
    sh = Shape.from_dict(shape)
    c = make_case(sh, dtype)
    if INPUT == "tensors":
        c = {k: _fast_in(v, "fused") for k, v in c.items()}
    out: dict[str, Any] = {"import_s": t_import, "lstmgrad_was_imported": already}
    for k in (1, 2):
        t0 = time.perf_counter()
        f = _forward(sh, c, "fused")
        t1 = time.perf_counter()
        _backward(sh, c, f.saved, "fused")
        t2 = time.perf_counter()
        out[f"fwd{k}_s"], out[f"bwd{k}_s"] = t1 - t0, t2 - t1
    out["torch_imported"] = "torch" in sys.modules
    out["pid"] = os.getpid()
    return out


if __name__ == "__main__":
    serve(
        {
            "info": info,
            "gate_fused": gate_fused,
            "reference64": reference64,
            "setup": setup,
            "time": time_item,
            "memory": memory,
            "first_call": first_call,
        }
    )
