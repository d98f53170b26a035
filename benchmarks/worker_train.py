"""Training-step benchmark worker: one side of benchmarks/train_step.py.

    python benchmarks/worker_train.py --impl torch      # torch.nn.LSTM, never imports lstmgrad
    python benchmarks/worker_train.py --impl lstmgrad   # lstmgrad.nn.LSTM
    (either with --threads N: torch.set_num_threads(N) at start, --dtype float16: the model,
    its input and its training in float16)

Started twice by benchmarks/train_step.py; speaks the JSON-lines protocol of _protocol.py. The
model and training step are described in benchmarks/README.md, "Training step"; both workers
build it under ``torch.manual_seed`` and return a hash of its state_dict, so the parent can
check they hold the same weights.

Timed items of the current shape:

- ``step``: dense shapes feed the LSTM a [T, B, I] Tensor; variable-length shapes feed it
  ``pack_padded_sequence(x, lengths, enforce_sorted=True)`` and take the loss on the packed
  output's data.
- ``padded`` (torch worker, variable-length shapes only): the LSTM on the full padded
  [T, B, I] tensor (the dense oneDNN path), loss masked to the valid positions.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from _protocol import encode, serve, time_reps
from shapes import Shape
from torch.nn.utils.rnn import pack_padded_sequence
from worker_torch import info as torch_info

CLASSES = 64  # width of the head: the number of target classes
LR, MOMENTUM = 1e-3, 0.9
IGNORE = -100  # cross_entropy's default ignore_index: masks the padding of the padded item

IMPL = ""  # "torch" or "lstmgrad", set from the command line
DTYPE = torch.float32  # of the model, its input and its training (--dtype)
STATE: dict[str, Any] = {}


def _check_isolation() -> None:
    """The torch side must never have lstmgrad loaded (it would not be the peer any more)."""
    if IMPL == "torch":
        assert "lstmgrad" not in sys.modules, "torch worker imported lstmgrad"


def _lstm_class() -> type[torch.nn.LSTM]:
    if IMPL == "torch":
        return torch.nn.LSTM
    import lstmgrad.nn

    return lstmgrad.nn.LSTM


class Model(torch.nn.Module):
    """Linear(I, I) ("embedding-like" input layer) -> LSTM -> Linear(D*H, CLASSES)."""

    def __init__(self, sh: Shape, lstm_cls: type[torch.nn.LSTM]) -> None:
        super().__init__()
        self.inp = torch.nn.Linear(sh.I, sh.I)
        self.lstm = lstm_cls(sh.I, sh.H, num_layers=sh.L, bidirectional=sh.bidirectional)
        self.head = torch.nn.Linear(sh.D * sh.H, CLASSES)


def _state_hash(model: torch.nn.Module) -> str:
    """sha256 over the state_dict's names, shapes and bytes."""
    h = hashlib.sha256()
    for name, t in model.state_dict().items():
        h.update(name.encode())
        h.update(str(tuple(t.shape)).encode())
        h.update(t.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def _build(sh: Shape, seed: int) -> dict:
    """Model, optimizer, input and targets of one shape; the same for both workers."""
    torch.manual_seed(seed)
    model = Model(sh, _lstm_class()).to(DTYPE)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(sh.T, sh.B, sh.I, generator=g)
    targets = torch.randint(0, CLASSES, (sh.T, sh.B), generator=g)
    lengths = torch.from_numpy(sh.lengths())
    pad = torch.arange(sh.T)[:, None] >= lengths[None, :]  # [T, B], True at padding
    x[pad] = 0.0
    x = x.to(DTYPE)
    return {
        "model": model,
        "opt": opt,
        "x": x,
        "targets": targets,
        "lengths": lengths,
        "targets_packed": pack_padded_sequence(targets, lengths).data if sh.varlen else None,
        "targets_masked": targets.masked_fill(pad, IGNORE),
        "hash": _state_hash(model),
    }


def _step_fn(sh: Shape, b: dict, item: str):
    """One training step of ``item`` ("step" or "padded") as a closure returning the loss."""
    model, opt, x, lengths = b["model"], b["opt"], b["x"], b["lengths"]
    packed = sh.varlen and item == "step"
    if item == "padded" and not sh.varlen:
        raise ValueError("item 'padded' exists for variable-length shapes only")
    if item == "padded" and IMPL != "torch":
        raise ValueError("item 'padded' is a torch reference: torch worker only")
    targets = b["targets_packed"] if packed else b["targets_masked"].reshape(-1)

    def step() -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        z = model.inp(x)
        if packed:
            out, _ = model.lstm(pack_padded_sequence(z, lengths, enforce_sorted=True))
            logits = model.head(out.data)
        else:
            y, _ = model.lstm(z)
            logits = model.head(y).reshape(-1, CLASSES)
        # mean over the valid positions: packed rows, or targets not equal to IGNORE
        loss = F.cross_entropy(logits, targets, ignore_index=IGNORE)
        loss.backward()
        opt.step()
        return loss

    return step


def _lstm_params(model: Model) -> list[np.ndarray]:
    return [w.detach().numpy().copy() for w in model.lstm._flat_weights]


# --------------------------------------------------------------------------------------------
# requests


def info() -> dict:
    _check_isolation()
    out = {
        "impl": IMPL,
        "dtype": str(DTYPE).removeprefix("torch."),
        **torch_info(),
    }  # the torch build, as the backward benchmark reports it
    if IMPL == "lstmgrad":
        import numba

        import lstmgrad

        out.update(
            lstmgrad=getattr(lstmgrad, "__version__", "?"),
            numba=numba.__version__,
            numba_threads=numba.config.NUMBA_NUM_THREADS,
        )
    out["lstmgrad_imported"] = "lstmgrad" in sys.modules
    return out


def gate(shape: dict, steps: int = 3, seed: int = 0) -> dict:
    """``steps`` training steps of the packed/dense item from the seeded weights: the loss of
    each step, every parameter's gradient in the first step and the LSTM's parameters after the
    last one (the parent compares the sides)."""
    _check_isolation()
    sh = Shape.from_dict(shape)
    b = _build(sh, seed)
    step = _step_fn(sh, b, "step")
    model = b["model"]
    losses = [float(step().detach())]
    # with lr 1e-3 three steps move the weights and the loss too little to expose a wrong
    # gradient, so the first step's gradients are compared too (the input layer's need dx)
    grads = {n: p.grad.numpy().copy() for n, p in model.named_parameters()}
    losses += [float(step().detach()) for _ in range(steps - 1)]
    _check_isolation()
    return {
        "hash": b["hash"],
        "losses": losses,
        "grads": encode(grads),
        "params": encode(_lstm_params(model)),
    }


def _profile_ops(fn, steps: int) -> dict:
    """``steps`` calls of ``fn`` under the autograd profiler: per-step self time of the top
    ops and the inclusive time of the LSTM's own forward and backward ops."""
    with torch.autograd.profiler.profile() as prof:
        for _ in range(steps):
            fn()
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    top = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:8]

    def incl(*names: str) -> float:
        return sum(e.cpu_time_total for e in events if e.key in names) / steps / 1e3

    return {
        "self_ms_total": total / steps / 1e3,
        "top": [
            {
                "op": e.key,
                "self_ms": e.self_cpu_time_total / steps / 1e3,
                "calls": e.count / steps,
            }
            for e in top
        ],
        # inclusive: nested ops (e.g. the GEMMs lstmgrad runs on torch's BLAS) are inside
        "lstm_fwd_ms": incl("lstmgrad::lstm_forward", "aten::mkldnn_rnn_layer"),
        "lstm_bwd_ms": incl("lstmgrad::lstm_backward", "aten::mkldnn_rnn_layer_backward"),
        "ops": sorted({e.key for e in events if any(k in e.key for k in ("rnn", "lstm"))}),
    }


def setup(shape: dict, seed: int = 0) -> dict:
    """Build one shape's model and items; return the weights hash and which path each item
    takes (detected from the op names of one profiled step)."""
    _check_isolation()
    STATE.clear()
    sh = Shape.from_dict(shape)
    b = _build(sh, seed)
    items = ["step", "padded"] if sh.varlen and IMPL == "torch" else ["step"]
    STATE["items"] = {it: _step_fn(sh, b, it) for it in items}
    paths = {}
    for it, fn in STATE["items"].items():
        prof = _profile_ops(fn, 1)
        ops = prof["ops"]
        if IMPL == "lstmgrad":
            ran = {"lstmgrad::lstm_forward", "lstmgrad::lstm_backward"} <= set(ops)
            path = "lstmgrad ops" if ran else "NOT lstmgrad (fallback)"
        elif any("mkldnn_rnn" in op for op in ops):
            path = "oneDNN dense"
        else:
            path = "packed native" if sh.varlen and it == "step" else "native dense"
        paths[it] = {"path": path, "ops": ops}
    _check_isolation()
    return {"hash": b["hash"], "items": items, "paths": paths}


def time_item(item: str, n: int) -> list[float]:
    """Seconds of each of ``n`` training steps of ``item``."""
    step = STATE["items"][item]
    return time_reps(n, lambda _: step())


def profile(item: str, steps: int = 3) -> dict:
    """Where one step of ``item`` spends its time (autograd profiler, after the timings)."""
    return _profile_ops(STATE["items"][item], steps)


def main() -> None:
    global IMPL, DTYPE
    ap = argparse.ArgumentParser(description="training-step benchmark worker")
    ap.add_argument("--impl", choices=("torch", "lstmgrad"), required=True)
    ap.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's)")
    ap.add_argument("--dtype", choices=("float32", "float16"), default="float32")
    args = ap.parse_args()
    IMPL = args.impl
    DTYPE = getattr(torch, args.dtype)
    if args.threads:
        torch.set_num_threads(args.threads)
    _check_isolation()
    serve({"info": info, "gate": gate, "setup": setup, "time": time_item, "profile": profile})


if __name__ == "__main__":
    main()
