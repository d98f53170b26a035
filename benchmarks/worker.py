"""Benchmark worker: one side of run.py in a process of its own, speaking _protocol.py's JSON
lines. NumPy's OpenBLAS and PyTorch's BLAS in one process were measured 35x slower, so each
library is imported only by the role that needs it, and only on its first request:

    python worker.py torch              torch.nn.LSTM's backward items; never imports lstmgrad
    python worker.py lstmgrad           lstmgrad's functions; never imports torch, unless
                                        LSTMGRAD_BENCH_INPUT=tensors gives the fast engine torch
                                        tensors over the same arrays (its GEMMs on torch's)
    python worker.py step-torch | step-lstmgrad [--threads N]
                                        a training step with torch.nn.LSTM / lstmgrad.nn.LSTM

Timed items of the current shape (``setup``), each (timed(state), untimed() -> state or None):

- torch: ``bwd`` (forward untimed with input, h0, c0 and weights requiring grad, then
  ``torch.autograd.backward([y, h_n, c_n], [dy, dh, dc])``; varlen shapes: PackedSequence),
  ``fwdbwd`` (pack, forward and the same backward), ``bwd_nodx`` (input without grad); varlen
  shapes also ``bwd_dense`` / ``fwdbwd_dense`` (the padded [T, B, I] tensor, run densely).
- lstmgrad (the fused engine): ``bwd`` (lstm_backward from one forward done in setup),
  ``bwd_nodx`` (output_mask=(False, True, True, True)), ``fwdbwd``; with arrays also
  ``gemm_bwd`` / ``gemm_bwd_nodx`` / ``gemm_fwd``: the same GEMMs alone (:func:`gemm_parts`).
- step-*: ``step`` (dense: a [T, B, I] Tensor; varlen: a PackedSequence, loss on its data);
  step-torch on varlen shapes also ``padded`` (the LSTM on the padded tensor, loss masked).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

import numpy as np
from _machine import rel_err
from _protocol import decode, encode, serve, time_reps
from shapes import Shape, make_case

ROLE = ""  # torch | lstmgrad | step-torch | step-lstmgrad, from the command line
INPUT = os.environ.get("LSTMGRAD_BENCH_INPUT", "arrays")  # what the lstmgrad role's engine gets
ITEMS: dict[str, tuple[Callable[[Any], Any], Callable[[], Any] | None]] = {}
STATE: dict[str, Any] = {}
NODX = (False, True, True, True)
CLASSES, LR, MOMENTUM = 64, 1e-3, 0.9  # the training step's head width and SGD
IGNORE = -100  # cross_entropy's default ignore_index: masks the padding of the padded item


def _flags(sh: Shape) -> dict:
    return {"num_layers": sh.L, "bidirectional": sh.bidirectional}


def info() -> dict:
    """Versions and threads of the libraries this role uses, and which ones are imported."""
    out: dict[str, Any] = {"role": ROLE, "numpy": np.__version__, "input": INPUT}
    if ROLE != "lstmgrad" or INPUT == "tensors":
        import torch

        out.update(torch=torch.__version__, num_threads=torch.get_num_threads(),
                   num_interop_threads=torch.get_num_interop_threads(),
                   mkldnn_enabled=torch.backends.mkldnn.enabled,
                   parallel=torch.__config__.parallel_info().splitlines()[:6])  # fmt: skip
    if ROLE in ("lstmgrad", "step-lstmgrad"):
        import numba

        import lstmgrad

        out.update(lstmgrad=lstmgrad.__version__, lstmgrad_file=lstmgrad.__file__,
                   numba=numba.__version__, numba_threads=numba.get_num_threads(),
                   numba_threading_layer=numba.config.THREADING_LAYER)  # fmt: skip
    return out | imported()


def imported() -> dict:
    return {f"{m}_imported": m in sys.modules for m in ("torch", "lstmgrad")}


def time_item(item: str, n: int) -> list[float]:
    return time_reps(n, *ITEMS[item])


def setup(shape: dict, dtype: str = "float32", seed: int = 0) -> dict:
    """Build the items of one shape (``dtype``: of the timed items; the step's seed)."""
    ITEMS.clear()
    STATE.clear()
    sh = Shape.from_dict(shape)
    if ROLE == "torch":
        out = _setup_torch(sh, dtype)
    elif ROLE == "lstmgrad":
        out = _setup_lstmgrad(sh, dtype)
    else:
        out = _setup_step(sh, dtype, seed)
    return {"items": list(ITEMS), **out, **imported()}


def profile(item: str, steps: int = 3) -> dict:
    """``steps`` runs of ``item`` under the autograd profiler: per-step self time of the top ops,
    inclusive time of the LSTM's own forward and backward ops, the RNN / LSTM / GEMM op names,
    and the path: "oneDNN" iff one of them holds mkldnn_rnn, else "native"."""
    import torch

    timed, untimed = ITEMS[item]
    with torch.autograd.profiler.profile() as prof:
        for _ in range(steps):
            timed(untimed() if untimed else None)
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    top = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:8]

    def incl(*names: str) -> float:  # nested ops (the GEMMs lstmgrad runs on torch's) inside
        return sum(e.cpu_time_total for e in events if e.key in names) / steps / 1e3

    ops = sorted({e.key for e in events if any(k in e.key for k in ("rnn", "lstm", "mm"))})
    return {
        "path": "oneDNN" if any("mkldnn_rnn" in op for op in ops) else "native",
        "ops": ops,
        "self_ms_total": total / steps / 1e3,
        "top": [
            {"op": e.key, "self_ms": e.self_cpu_time_total / steps / 1e3, "calls": e.count / steps}
            for e in top
        ],
        "lstm_fwd_ms": incl("lstmgrad::lstm_forward", "aten::mkldnn_rnn_layer"),
        "lstm_bwd_ms": incl("lstmgrad::lstm_backward", "aten::mkldnn_rnn_layer_backward"),
    }


# --------------------------------------------------------------------------------------------
# torch: nn.LSTM's backward, and the gate's float64 oracle


def _torch_lstm(sh: Shape, params: list[np.ndarray], dtype: Any) -> Any:
    import torch

    lstm = torch.nn.LSTM(sh.I, sh.H, **_flags(sh), dtype=dtype)
    with torch.no_grad():
        for w, p in zip(lstm._flat_weights, params, strict=True):
            w.copy_(torch.from_numpy(np.ascontiguousarray(p)))
    return lstm


def autograd64(shape: dict, case: dict) -> dict:
    """Gate oracle: float64 autograd of nn.LSTM on the parent's arrays; results in lstmgrad's
    layout (varlen: padded time-major [T*B, *], zeros at padding)."""
    import torch
    from torch.nn.utils.rnn import pack_padded_sequence as pack

    sh, c = Shape.from_dict(shape), decode(case)
    lstm = _torch_lstm(sh, c["params"], torch.float64)
    x = torch.tensor(c["x"]).reshape(sh.T, sh.B, sh.I).requires_grad_(True)
    h0, c0 = (torch.tensor(c[k], requires_grad=True) for k in ("h0", "c0"))
    dy = torch.tensor(c["dy"]).reshape(sh.T, sh.B, sh.D * sh.H)
    if sh.varlen:
        lengths = torch.as_tensor(c["lengths"])
        out, (hn, cn) = lstm(pack(x, lengths), (h0, c0))
        y, dy = out.data, pack(dy, lengths).data
    else:
        y, (hn, cn) = lstm(x, (h0, c0))
    torch.autograd.backward([y, hn, cn], [dy, torch.tensor(c["dh"]), torch.tensor(c["dc"])])
    dx = x.grad.reshape(sh.T * sh.B, sh.I) if sh.varlen else x.grad
    return encode({"dx": dx.numpy(), "dh_prev": h0.grad.numpy(), "dc_prev": c0.grad.numpy(),
                   "dparams": [w.grad.numpy() for w in lstm._flat_weights],
                   "hy": hn.detach().numpy(), "cy": cn.detach().numpy()})  # fmt: skip


def _setup_torch(sh: Shape, dtype: str) -> dict:
    import torch
    from torch.nn.utils.rnn import pack_padded_sequence as pack

    c = make_case(sh, dtype)
    lstm = _torch_lstm(sh, c["params"], getattr(torch, dtype))
    x = torch.from_numpy(c["x"]).reshape(sh.T, sh.B, sh.I).clone()
    x_grad = x.clone().requires_grad_(True)
    h0, c0 = (torch.from_numpy(c[k]).clone().requires_grad_(True) for k in ("h0", "c0"))
    dy = torch.from_numpy(c["dy"]).reshape(sh.T, sh.B, sh.D * sh.H).clone()
    dh, dc = torch.from_numpy(c["dh"]), torch.from_numpy(c["dc"])
    lengths = torch.as_tensor(c["lengths"])
    dy_packed = pack(dy, lengths).data if sh.varlen else None

    def clear() -> None:
        for p in (x_grad, h0, c0, *lstm._flat_weights):
            p.grad = None

    def fwd(inp: Any, packed: bool) -> tuple:
        if packed:
            out, (hn, cn) = lstm(pack(inp, lengths), (h0, c0))
            return out.data, hn, cn, dy_packed
        y, (hn, cn) = lstm(inp, (h0, c0))
        return y, hn, cn, dy

    def bwd(state: tuple) -> None:
        y, hn, cn, g = state
        torch.autograd.backward([y, hn, cn], [g, dh, dc])

    def fresh(inp: Any, packed: bool) -> Callable[[], tuple]:
        def untimed() -> tuple:
            clear()
            return fwd(inp, packed)

        return untimed

    def fwdbwd(inp: Any, packed: bool) -> Callable[[Any], None]:
        return lambda _: bwd(fwd(inp, packed))

    ITEMS.update(bwd=(bwd, fresh(x_grad, sh.varlen)), fwdbwd=(fwdbwd(x_grad, sh.varlen), clear),
                 bwd_nodx=(bwd, fresh(x, sh.varlen)))  # fmt: skip
    if sh.varlen:
        ITEMS.update(bwd_dense=(bwd, fresh(x_grad, False)),
                     fwdbwd_dense=(fwdbwd(x_grad, False), clear))  # fmt: skip
    return {"paths": {name: profile(name, 1) for name in ITEMS}}


# --------------------------------------------------------------------------------------------
# lstmgrad: the fused engine's items, its gate against the reference, memory, first calls


def _lg() -> Any:
    import lstmgrad

    return lstmgrad


def _fast(value: Any, on: bool = True) -> Any:
    """The fast engine's argument: NumPy arrays (lists of them) as torch tensors over the same
    memory where INPUT is "tensors" (and ``on``); anything else unchanged."""
    if not on or INPUT != "tensors":
        return value
    if isinstance(value, (list, tuple)):
        return [_fast(v) for v in value]
    if isinstance(value, np.ndarray):
        import torch

        return torch.from_numpy(value)
    return value


def _forward(sh: Shape, c: dict, impl: str) -> Any:
    a = [_fast(c[k], impl == "fused") for k in ("x", "params", "h0", "c0", "batch_sizes")]
    return _lg().lstm_forward(a[0], a[1], a[2:4], a[4], **_flags(sh), train=True, impl=impl)


def _backward(sh: Shape, c: dict, saved: Any, impl: str, mask: Any = None) -> Any:
    on = impl == "fused"
    a = [_fast(c[k], on) for k in ("x", "h0", "c0", "params", "dy", "dh", "dc", "batch_sizes")]
    return _lg().lstm_backward(a[0], a[1:3], *a[3:7], *(_fast(s, on) for s in saved[:7]), a[7],
                               **_flags(sh), output_mask=mask, impl=impl)  # fmt: skip


def _grad_errors(got: Any, want: Any) -> dict:
    errs = {k: rel_err(getattr(got, k), getattr(want, k)) for k in ("dx", "dh_prev", "dc_prev")}
    return errs | {"dparams": max(map(rel_err, got.dparams, want.dparams))}


def gate_fused(shapes: list[dict]) -> dict:
    """Fused vs reference, float32, on each (scaled-down) shape with NaN in the padding: the
    backward alone from the reference forward's saved activations, with and without layer 0's
    dx, and forward + backward end to end (the forward's output, hy, cy too)."""
    out = {}
    for d in shapes:
        sh = Shape.from_dict(d)
        c = make_case(sh, "float32", pad_value=np.nan)
        ref, fus = _forward(sh, c, "reference"), _forward(sh, c, "fused")
        res: dict[str, Any] = {}
        for name, mask in (("full", None), ("nodx", NODX)):
            want = _backward(sh, c, ref.saved, "reference", mask)
            res[f"bwd_{name}"] = _grad_errors(_backward(sh, c, ref.saved, "fused", mask), want)
        want = _backward(sh, c, ref.saved, "reference")
        e2e = _grad_errors(_backward(sh, c, fus.saved, "fused"), want)
        y_ref, y_fus = np.asarray(ref.output), np.asarray(fus.output)
        if sh.varlen:  # padded rows of the output are unspecified
            valid = (np.arange(sh.T)[:, None] < c["lengths"][None, :]).reshape(-1)
            y_ref, y_fus = y_ref[valid], y_fus[valid]
        e2e.update(output=rel_err(y_fus, y_ref), hy=rel_err(fus.hy, ref.hy),
                   cy=rel_err(fus.cy, ref.cy))  # fmt: skip
        out[sh.id] = res | {"fwd_bwd": e2e}
    return out


def reference64(shape: dict, case: dict) -> dict:
    """Gate oracle side: the float64 reference engine on the parent's arrays."""
    sh, c = Shape.from_dict(shape), decode(case)
    f = _forward(sh, c, "reference")
    g = _backward(sh, c, f.saved, "reference")
    return encode({"dx": g.dx, "dh_prev": g.dh_prev, "dc_prev": g.dc_prev,
                   "dparams": list(g.dparams), "hy": f.hy, "cy": f.cy})  # fmt: skip


def gemm_parts(sh: Shape, fwd_transposed: bool = False) -> dict[str, Callable[[], None]]:
    """The GEMMs of one shape's backward and forward alone, numpy.matmul on float32 arrays
    (into preallocated outputs), over every (layer, direction), by kind: ``rec_bwd`` T recurrent
    [n,4H]x[4H,H] (n = batch_sizes[t]), ``dx0`` / ``dx`` [rows,4H]x[4H,I_l] of layer 0 / the
    layers above, ``dw`` [4H,rows]x[rows,I_l+H], ``in_fwd`` [rows,I_l]x[I_l,4H], ``rec_fwd`` T
    [n,H]x[H,4H] (``fwd_transposed``: [4H,H]x[H,n]); rows = the sum of the lengths."""
    rng = np.random.default_rng(1)
    bs = sh.batch_sizes()
    steps = [int(v) for v in bs] if bs is not None else [sh.B] * sh.T
    starts, rows, h, g = np.cumsum([0, *steps]).tolist(), sum(steps), sh.H, 4 * sh.H
    per = []  # (layer, arrays) per (layer, direction); dG: gate gradients, xh: input | h_prev
    for layer in range(sh.L):
        il = sh.input_size(layer)
        sizes = {"w_ih": (g, il), "w_hh": (g, h), "dG": (rows, g), "xh": (rows, il + h),
                 "x": (rows, il), "h": (sh.B, h), "dh": (sh.B, h), "dx": (rows, il),
                 "dw": (g, il + h), "gx": (rows, g), "gh": (sh.B, g)}  # fmt: skip
        for _ in range(sh.D):
            per.append((layer, {k: rng.standard_normal(s).astype(np.float32)
                                for k, s in sizes.items()}))  # fmt: skip

    def rec_bwd(a: dict) -> None:
        for t, n in enumerate(steps):
            np.matmul(a["dG"][starts[t] : starts[t] + n], a["w_hh"], out=a["dh"][:n])

    def rec_fwd(a: dict) -> None:
        for n in steps:
            if fwd_transposed:
                np.matmul(a["w_hh"], a["h"][:n].T)
            else:
                np.matmul(a["h"][:n], a["w_hh"].T, out=a["gh"][:n])

    def dx(a: dict) -> None:
        np.matmul(a["dG"], a["w_ih"], out=a["dx"])

    def each(fn: Callable[[dict], Any], keep: Callable[[int], bool] = lambda _: True) -> Callable:
        return lambda: [fn(a) for layer, a in per if keep(layer)]

    return {
        "rec_bwd": each(rec_bwd),
        "dx0": each(dx, lambda layer: layer == 0),
        "dx": each(dx, lambda layer: layer > 0),
        "dw": each(lambda a: np.matmul(a["dG"].T, a["xh"], out=a["dw"])),
        "in_fwd": each(lambda a: np.matmul(a["x"], a["w_ih"].T, out=a["gx"])),
        "rec_fwd": each(rec_fwd),
    }


def _case(sh: Shape, dtype: str) -> dict:
    """The shape's inputs, as torch tensors in tensors mode (converted once, outside timings)."""
    return {k: _fast(v) for k, v in make_case(sh, dtype).items()}


def _setup_lstmgrad(sh: Shape, dtype: str) -> dict:
    c = _case(sh, dtype)
    fwd = _forward(sh, c, "fused")
    STATE.update(shape=sh, case=c, fwd=fwd)
    ITEMS.update(bwd=(lambda _: _backward(sh, c, fwd.saved, "fused"), None),
                 bwd_nodx=(lambda _: _backward(sh, c, fwd.saved, "fused", NODX), None),
                 fwdbwd=(lambda _: _backward(sh, c, _forward(sh, c, "fused").saved, "fused"),
                         None))  # fmt: skip
    if INPUT == "arrays":  # (NumPy GEMMs beside torch's would distort both); float32 always
        p = gemm_parts(sh)
        for name, kinds in (("gemm_bwd", ("rec_bwd", "dx0", "dx", "dw")),
                            ("gemm_bwd_nodx", ("rec_bwd", "dx", "dw")),
                            ("gemm_fwd", ("in_fwd", "rec_fwd"))):  # fmt: skip
            ITEMS[name] = (lambda _, fns=[p[k] for k in kinds]: [f() for f in fns], None)
    return {}


def _traced(fn: Callable[[], Any]) -> tuple[Any, int]:
    """(result, tracemalloc peak above the start during ``fn``), after the memory lstmgrad keeps
    between calls is given back, so that the call allocates, and the trace sees, all it needs."""
    _lg().workspace.release_memory()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        res = fn()
        return res, tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


def _nbytes(values: Any) -> int:
    """Bytes of the NumPy arrays among ``values`` and in the lists among them."""
    flat = [a for v in values for a in (v if isinstance(v, (list, tuple)) else [v])]
    return sum(a.nbytes for a in flat if isinstance(a, np.ndarray))


def memory() -> dict | None:
    """tracemalloc peak of one call minus the bytes of its outputs (NumPy allocations only;
    memory a compiled kernel allocates outside NumPy/Python is not seen). None with tensors."""
    if INPUT == "tensors":
        return None
    sh, c, fwd = STATE["shape"], STATE["case"], STATE["fwd"]
    out = {}
    for name, mask in (("bwd", None), ("bwd_nodx", NODX)):
        res, peak = _traced(lambda mask=mask: _backward(sh, c, fwd.saved, "fused", mask))
        out[name] = {"peak": peak, "outputs": _nbytes(res)}
    res, peak = _traced(lambda: _forward(sh, c, "fused"))
    out["fwd"] = {"peak": peak, "outputs": _nbytes([*res[:3], *res.saved[:7]])}
    return {k: v | {"extra": v["peak"] - v["outputs"]} for k, v in out.items()}


def first_call(shape: dict, dtype: str = "float32") -> dict:
    """In a fresh process: import time, then the first and second forward and backward."""
    t0 = time.perf_counter()
    already = "lstmgrad" in sys.modules
    _lg()
    if INPUT == "tensors":  # part of the import cost in this mode
        import torch  # noqa: F401
    out: dict[str, Any] = {"import_s": time.perf_counter() - t0, "lstmgrad_was_imported": already}
    sh = Shape.from_dict(shape)
    c = _case(sh, dtype)
    for k in (1, 2):
        t0 = time.perf_counter()
        f = _forward(sh, c, "fused")
        t1 = time.perf_counter()
        _backward(sh, c, f.saved, "fused")
        out[f"fwd{k}_s"], out[f"bwd{k}_s"] = t1 - t0, time.perf_counter() - t1
    return out | {"torch_imported": "torch" in sys.modules, "pid": os.getpid()}


# --------------------------------------------------------------------------------------------
# step-*: a training step, Linear(I, I) -> LSTM -> Linear(D*H, CLASSES), cross_entropy, SGD


def _build(sh: Shape, dtype: str, seed: int) -> dict:
    """Model, optimizer, input and targets of one shape, the same in both step workers (the
    model built in float32 under the seed, then converted to ``dtype``)."""
    import torch
    from torch.nn.utils.rnn import pack_padded_sequence as pack

    if ROLE == "step-torch":
        lstm_cls = torch.nn.LSTM
    else:
        import lstmgrad.nn

        lstm_cls = lstmgrad.nn.LSTM
    torch.manual_seed(seed)
    model = torch.nn.ModuleDict({"inp": torch.nn.Linear(sh.I, sh.I),
                                 "lstm": lstm_cls(sh.I, sh.H, **_flags(sh)),
                                 "head": torch.nn.Linear(sh.D * sh.H, CLASSES)})  # fmt: skip
    model = model.to(getattr(torch, dtype))
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(sh.T, sh.B, sh.I, generator=g)
    targets = torch.randint(0, CLASSES, (sh.T, sh.B), generator=g)
    lengths = torch.from_numpy(sh.lengths())
    pad = torch.arange(sh.T)[:, None] >= lengths[None, :]  # [T, B], True at padding
    x[pad] = 0.0
    h = hashlib.sha256()  # over the state_dict's names, shapes and bytes
    for name, t in model.state_dict().items():
        h.update(name.encode() + str(tuple(t.shape)).encode())
        h.update(t.detach().contiguous().numpy().tobytes())
    return {"model": model, "lengths": lengths, "x": x.to(getattr(torch, dtype)),
            "targets_packed": pack(targets, lengths).data if sh.varlen else None,
            "targets_masked": targets.masked_fill(pad, IGNORE).reshape(-1),
            "opt": torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM),
            "hash": h.hexdigest()}  # fmt: skip


def _step_fn(sh: Shape, b: dict, item: str) -> Callable[[], Any]:
    """One training step of ``item`` ("step", or "padded": torch's dense run of a varlen
    shape) as a closure returning the loss."""
    import torch.nn.functional as F
    from torch.nn.utils.rnn import pack_padded_sequence as pack

    model, opt, x, lengths = b["model"], b["opt"], b["x"], b["lengths"]
    packed = sh.varlen and item == "step"
    targets = b["targets_packed"] if packed else b["targets_masked"]

    def step() -> Any:
        opt.zero_grad(set_to_none=True)
        z = model.inp(x)
        if packed:
            out, _ = model.lstm(pack(z, lengths, enforce_sorted=True))
            logits = model.head(out.data)
        else:
            logits = model.head(model.lstm(z)[0]).reshape(-1, CLASSES)
        # mean over the valid positions: packed rows, or targets not equal to IGNORE
        loss = F.cross_entropy(logits, targets, ignore_index=IGNORE)
        loss.backward()
        opt.step()
        return loss

    return step


def gate_step(shape: dict, dtype: str = "float32", steps: int = 3, seed: int = 0) -> dict:
    """``steps`` training steps from the seeded weights: each step's loss, every parameter's
    gradient in the first step and the LSTM's parameters after the last one."""
    sh = Shape.from_dict(shape)
    b = _build(sh, dtype, seed)
    step = _step_fn(sh, b, "step")
    losses = [float(step().detach())]
    # with lr 1e-3 three steps move the weights and the loss too little to expose a wrong
    # gradient, so the first step's gradients are compared too (the input layer's need dx)
    grads = {n: p.grad.numpy().copy() for n, p in b["model"].named_parameters()}
    losses += [float(step().detach()) for _ in range(steps - 1)]
    params = [w.detach().numpy().copy() for w in b["model"].lstm._flat_weights]
    return {"hash": b["hash"], "losses": losses, "grads": encode(grads), "params": encode(params),
            **imported()}  # fmt: skip


def _setup_step(sh: Shape, dtype: str, seed: int) -> dict:
    b = _build(sh, dtype, seed)
    for item in ["step", "padded"] if sh.varlen and ROLE == "step-torch" else ["step"]:
        fn = _step_fn(sh, b, item)
        ITEMS[item] = (lambda _, fn=fn: fn(), None)
    paths = {}
    for item in ITEMS:
        p = profile(item, 1)
        if ROLE == "step-lstmgrad":
            ran = {"lstmgrad::lstm_forward", "lstmgrad::lstm_backward"} <= set(p["ops"])
            path = "lstmgrad ops" if ran else "NOT lstmgrad (fallback)"
        elif p["path"] == "oneDNN":
            path = "oneDNN dense"
        else:
            path = "packed native" if sh.varlen and item == "step" else "native dense"
        paths[item] = {"path": path, "ops": p["ops"]}
    return {"hash": b["hash"], "paths": paths}


def main() -> None:
    global ROLE
    ap = argparse.ArgumentParser(description="benchmark worker (see run.py)")
    ap.add_argument("role", choices=("torch", "lstmgrad", "step-torch", "step-lstmgrad"))
    ap.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's)")
    args = ap.parse_args()
    ROLE = args.role
    if INPUT not in ("arrays", "tensors"):
        raise SystemExit(f"LSTMGRAD_BENCH_INPUT must be 'arrays' or 'tensors', got {INPUT!r}")
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    handlers = (info, setup, profile, gate_fused, reference64, autograd64, memory, first_call,
                gate_step)  # fmt: skip
    serve({f.__name__: f for f in handlers} | {"time": time_item})


if __name__ == "__main__":
    main()
