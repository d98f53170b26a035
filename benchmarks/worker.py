"""One side of run.py in its own process: ``python worker.py torch`` (never imports lstmgrad),
``lstmgrad`` (imports torch only with LSTMGRAD_BENCH_INPUT=tensors: the fused engine then gets
torch tensors over the same arrays), ``step-torch`` or ``step-lstmgrad`` (a training step).
Items of the current shape (``setup``): name -> (timed(state), untimed() -> state or None)."""

from __future__ import annotations

import hashlib
import os
import sys
import time
from collections.abc import Callable
from importlib import import_module
from typing import Any

import numpy as np
from _harness import encode, serve, time_reps
from shapes import Shape, make_case

ROLE = ""  # torch | lstmgrad | step-torch | step-lstmgrad, from the command line
INPUT = os.environ.get("LSTMGRAD_BENCH_INPUT", "arrays")  # what the lstmgrad role's engine gets
ITEMS: dict[str, tuple[Callable[[Any], Any], Callable[[], Any] | None]] = {}
LEAVES: list = []  # the torch role's input, h0, c0 and module
NODX = (False, True, True, True)
CLASSES, LR, MOMENTUM = 64, 1e-3, 0.9  # the training step's head width and SGD
IGNORE = -100  # cross_entropy's default ignore_index: masks the padding of the padded item


def _flags(sh: Shape) -> dict:
    return {"num_layers": sh.L, "bidirectional": sh.bidirectional}


def imported() -> dict:
    return {f"{m}_imported": m in sys.modules for m in ("torch", "lstmgrad")}


def info() -> dict:
    """Versions and threads of the libraries this role uses, and which ones are imported."""
    out: dict[str, Any] = {"role": ROLE, "numpy": np.__version__, "input": INPUT}
    torch_blas = os.environ.get("LSTMGRAD_BLAS", "").strip().lower() == "torch"
    if ROLE != "lstmgrad" or INPUT == "tensors" or torch_blas:
        import torch

        out.update(torch=torch.__version__, num_threads=torch.get_num_threads())
    if ROLE in ("lstmgrad", "step-lstmgrad"):
        import numba

        import lstmgrad

        out.update(lstmgrad=lstmgrad.__version__, numba_threads=numba.get_num_threads())
    return out | imported()


def time_item(item: str, n: int) -> dict:
    """n reps of an item: their seconds, and this process's CPU seconds meanwhile."""
    cpu0 = time.process_time()
    return {"s": time_reps(n, *ITEMS[item]), "cpu_s": time.process_time() - cpu0}


def setup(shape: dict, dtype: str = "float32", seed: int = 0) -> dict:
    """Build the items of one shape (``dtype``: of the timed items; ``seed``: the step's)."""
    ITEMS.clear()
    build = {"torch": _setup_torch, "lstmgrad": _setup_lstmgrad}.get(ROLE, _setup_step)
    out = build(Shape.from_dict(shape), dtype, seed)
    return {"items": list(ITEMS), **out, **imported()}


def _paths() -> dict:
    """Per item the RNN / LSTM / GEMM op names of one run under the autograd profiler, and the
    path: "oneDNN" iff one of them holds mkldnn_rnn, else "native"."""
    import torch

    out = {}
    for name, (timed, untimed) in ITEMS.items():
        with torch.autograd.profiler.profile() as prof:
            timed(untimed() if untimed else None)
        keys = {e.key for e in prof.key_averages()}
        ops = sorted(k for k in keys if "rnn" in k or "lstm" in k or "mm" in k)
        out[name] = {"path": "oneDNN" if "mkldnn_rnn" in str(ops) else "native", "ops": ops}
    return out


# --------------------------------------------------------------------------------------------
# torch: nn.LSTM's backward


def _torch_lstm(sh: Shape, params: list[np.ndarray], dtype: str) -> Any:
    import torch

    lstm = torch.nn.LSTM(sh.I, sh.H, **_flags(sh), dtype=getattr(torch, dtype))
    with torch.no_grad():
        for w, p in zip(lstm._flat_weights, params, strict=True):
            w.copy_(torch.from_numpy(p))
    return lstm


def _setup_torch(sh: Shape, dtype: str, seed: int) -> dict:
    """``bwd`` (forward untimed with input, h0, c0 and weights requiring grad, then
    ``torch.autograd.backward([y, h_n, c_n], [dy, dh, dc])``; varlen shapes: PackedSequence),
    ``fwdbwd`` (forward and the same backward); varlen shapes also ``bwd_dense`` and
    ``fwdbwd_dense`` (the padded [T, B, I] tensor, run densely)."""
    import torch
    from torch.nn.utils.rnn import pack_padded_sequence as pack

    c = make_case(sh, dtype)
    lstm = _torch_lstm(sh, c["params"], dtype)
    x_grad = torch.from_numpy(c["x"]).reshape(sh.T, sh.B, sh.I).clone().requires_grad_(True)
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
        return lambda: (clear(), fwd(inp, packed))[1]

    def fwdbwd(inp: Any, packed: bool) -> Callable[[Any], None]:
        return lambda _: bwd(fwd(inp, packed))

    LEAVES[:] = [x_grad, h0, c0, lstm]  # for the gate
    ITEMS.update(bwd=(bwd, fresh(x_grad, sh.varlen)), fwdbwd=(fwdbwd(x_grad, sh.varlen), clear))
    if sh.varlen:
        ITEMS.update(bwd_dense=(bwd, fresh(x_grad, False)),
                     fwdbwd_dense=(fwdbwd(x_grad, False), clear))  # fmt: skip
    return {"paths": _paths()}


# --------------------------------------------------------------------------------------------
# lstmgrad: the fused engine's items; the backward's gate (both roles)


def _case(sh: Shape, dtype: str, pad_value: float = 0.0) -> dict:
    """make_case's inputs, as torch tensors over the same memory where INPUT is "tensors"
    (converted once, outside the timings)."""
    c = make_case(sh, dtype, pad_value=pad_value)
    if INPUT == "tensors":
        import torch

        conv = {k: torch.from_numpy(v) for k, v in c.items() if isinstance(v, np.ndarray)}
        c |= conv | {"params": [torch.from_numpy(p) for p in c["params"]]}
    return c


def _forward(sh: Shape, c: dict) -> Any:
    import lstmgrad

    hx = [c["h0"], c["c0"]]
    return lstmgrad.lstm_forward(c["x"], c["params"], hx, c["batch_sizes"], **_flags(sh),
                                 train=True, impl="fused")  # fmt: skip


def _backward(sh: Shape, c: dict, saved: Any, mask: Any = None) -> Any:
    import lstmgrad

    return lstmgrad.lstm_backward(c["x"], [c["h0"], c["c0"]], c["params"], c["dy"], c["dh"],
                                  c["dc"], *saved[:7], c["batch_sizes"], **_flags(sh),
                                  output_mask=mask, impl="fused")  # fmt: skip


def gate(shape: dict) -> dict:
    """One (small) shape's gradients in float32 from make_case's inputs, the same in both
    workers: torch's autograd (varlen: PackedSequence; dx zero in the padding), or the fused
    engine's (NaN in the padding), with and without layer 0's dx; also h_n and c_n."""
    sh = Shape.from_dict(shape)
    if ROLE == "lstmgrad":
        c = _case(sh, "float32", pad_value=np.nan)
        f = _forward(sh, c)
        out = {"hy": f.hy, "cy": f.cy}
        for case, mask in (("full", None), ("nodx", NODX)):
            g = _backward(sh, c, f.saved, mask)
            out[case] = {"dx": g.dx, "dh_prev": g.dh_prev, "dc_prev": g.dc_prev,
                         "dparams": list(g.dparams)}  # fmt: skip
        return encode(out)
    _setup_torch(sh, "float32", 0)
    timed, untimed = ITEMS["bwd"]
    _, hn, cn, _ = state = untimed()
    timed(state)
    x, h0, c0, lstm = LEAVES
    grads = {"dx": x.grad.reshape(-1, sh.I) if sh.varlen else x.grad, "dh_prev": h0.grad,
             "dc_prev": c0.grad, "dparams": [w.grad for w in lstm._flat_weights]}  # fmt: skip
    nodx = {k: v for k, v in grads.items() if k != "dx"}
    return encode({"hy": hn, "cy": cn, "full": grads, "nodx": nodx})


def _setup_lstmgrad(sh: Shape, dtype: str, seed: int) -> dict:
    """``bwd`` (lstm_backward after an untimed forward, as torch's) and ``fwdbwd``."""
    c = _case(sh, dtype)
    ITEMS.update(bwd=(lambda saved: _backward(sh, c, saved), lambda: _forward(sh, c).saved),
                 fwdbwd=(lambda _: _backward(sh, c, _forward(sh, c).saved), None))  # fmt: skip
    return {}


# --------------------------------------------------------------------------------------------
# step-*: a training step, Linear(I, I) -> LSTM -> Linear(D*H, CLASSES), cross_entropy, SGD


def _build(sh: Shape, dtype: str, seed: int) -> dict:
    """Model, optimizer, input and targets of one shape, the same in both step workers (the
    model built in float32 under the seed, then converted to ``dtype``)."""
    import torch
    from torch.nn.utils.rnn import pack_padded_sequence as pack

    lstm_cls = torch.nn.LSTM if ROLE == "step-torch" else import_module("lstmgrad.nn").LSTM
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
        h.update(f"{name}{tuple(t.shape)}".encode() + t.contiguous().numpy().tobytes())
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
    """``step`` (dense: a [T, B, I] Tensor; varlen: a PackedSequence, loss on its data);
    step-torch on varlen shapes also ``padded`` (the LSTM on the padded tensor, loss masked)."""
    b = _build(sh, dtype, seed)
    for item in ["step", "padded"] if sh.varlen and ROLE == "step-torch" else ["step"]:
        fn = _step_fn(sh, b, item)
        ITEMS[item] = (lambda _, fn=fn: fn(), None)
    paths = _paths()
    if ROLE == "step-lstmgrad":  # not "native" if lstmgrad.nn.LSTM fell back to torch's forward
        ran = {"lstmgrad::lstm_forward", "lstmgrad::lstm_backward"} <= set(paths["step"]["ops"])
        paths["step"]["path"] = "lstmgrad ops" if ran else "NOT lstmgrad (fallback)"
    return {"hash": b["hash"], "paths": paths}


if __name__ == "__main__":
    ROLE = sys.argv[1]
    if ROLE not in ("torch", "lstmgrad", "step-torch", "step-lstmgrad"):
        raise SystemExit("usage: python worker.py torch|lstmgrad|step-torch|step-lstmgrad")
    if INPUT not in ("arrays", "tensors"):
        raise SystemExit(f"LSTMGRAD_BENCH_INPUT must be 'arrays' or 'tensors', got {INPUT!r}")
    serve({"info": info, "setup": setup, "gate": gate, "gate_step": gate_step, "time": time_item})
