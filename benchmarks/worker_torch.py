"""Benchmark worker: PyTorch's nn.LSTM (the peer). Imports torch, never lstmgrad.

Started by benchmarks/run.py; speaks the JSON-lines protocol of _protocol.py. One shape is set
up at a time; its timed items are:

- ``bwd``: forward (untimed, leaves input/h0/c0/weights require grad), then
  ``torch.autograd.backward([y, h_n, c_n], [dy, dh, dc])`` timed: the vector-Jacobian product
  lstmgrad's backward computes, without building a scalar loss. Varlen shapes: PackedSequence.
- ``fwdbwd``: pack (varlen) + forward + the same backward, timed together.
- ``bwd_nodx``: as ``bwd`` with input.requires_grad False (no dx wanted).
- varlen shapes also ``bwd_dense`` / ``fwdbwd_dense``: the padded [T, B, I] tensor run densely
  (the oneDNN path; a different computation, the one users fall back to).
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
import torch
from _protocol import decode, encode, serve, time_reps
from shapes import Shape, make_case
from torch.nn.utils.rnn import pack_padded_sequence

STATE: dict[str, Any] = {}


def info() -> dict:
    return {
        "torch": torch.__version__,
        "numpy": np.__version__,
        "num_threads": torch.get_num_threads(),
        "num_interop_threads": torch.get_num_interop_threads(),
        "mkldnn_available": torch.backends.mkldnn.is_available(),
        "mkldnn_enabled": torch.backends.mkldnn.enabled,
        "parallel": torch.__config__.parallel_info().splitlines()[:6],
        "lstmgrad_imported": "lstmgrad" in sys.modules,
    }


def _lstm(shape: Shape, params: list[np.ndarray], dtype: torch.dtype) -> torch.nn.LSTM:
    lstm = torch.nn.LSTM(
        shape.I, shape.H, num_layers=shape.L, bidirectional=shape.bidirectional, dtype=dtype
    )
    assert len(lstm._flat_weights) == len(params)
    with torch.no_grad():
        for w, p in zip(lstm._flat_weights, params, strict=True):
            w.copy_(torch.from_numpy(np.ascontiguousarray(p)))
    return lstm


def autograd64(shape: dict, case: dict) -> dict:
    """Gate oracle: float64 autograd of nn.LSTM on the parent's arrays; results in lstmgrad's
    layout (varlen: padded time-major [T*B, *], zeros at padding)."""
    sh = Shape.from_dict(shape)
    c = decode(case)
    lstm = _lstm(sh, c["params"], torch.float64)
    t, b = sh.T, sh.B
    x = torch.tensor(c["x"]).reshape(t, b, sh.I).requires_grad_(True)
    h0 = torch.tensor(c["h0"], requires_grad=True)
    c0 = torch.tensor(c["c0"], requires_grad=True)
    dy = torch.tensor(c["dy"]).reshape(t, b, sh.D * sh.H)
    dh, dc = torch.tensor(c["dh"]), torch.tensor(c["dc"])
    if c["batch_sizes"] is None:
        y, (hn, cn) = lstm(x, (h0, c0))
        dy_used = dy
    else:
        lengths = torch.as_tensor(c["lengths"])
        packed = pack_padded_sequence(x, lengths, enforce_sorted=True)
        assert np.array_equal(packed.batch_sizes.numpy(), c["batch_sizes"])
        out, (hn, cn) = lstm(packed, (h0, c0))
        y = out.data
        dy_used = pack_padded_sequence(dy, lengths, enforce_sorted=True).data
    weights = list(lstm._flat_weights)
    torch.autograd.backward([y, hn, cn], [dy_used, dh, dc])
    dx = x.grad.reshape(t * b, sh.I) if c["batch_sizes"] is not None else x.grad
    return encode(
        {
            "dx": dx.numpy(),
            "dh_prev": h0.grad.numpy(),
            "dc_prev": c0.grad.numpy(),
            "dparams": [w.grad.numpy() for w in weights],
            "hy": hn.detach().numpy(),
            "cy": cn.detach().numpy(),
        }
    )


def _profile_path(fn) -> dict:
    """Run ``fn`` once under the autograd profiler; oneDNN iff an op name holds 'mkldnn_rnn'."""
    with torch.autograd.profiler.profile() as prof:
        fn()
    names = sorted({e.name for e in prof.function_events})
    onednn = [n for n in names if "mkldnn_rnn" in n]
    key = [n for n in names if any(k in n for k in ("rnn", "lstm", "addmm", "mm"))]
    return {"path": "oneDNN" if onednn else "native", "ops": key}


def setup(shape: dict, dtype: str = "float32") -> dict:
    """Build the module and tensors of one shape in ``dtype`` and its timed items."""
    STATE.clear()
    sh = Shape.from_dict(shape)
    c = make_case(sh, dtype)
    lstm = _lstm(sh, c["params"], getattr(torch, dtype))
    weights = list(lstm._flat_weights)
    t, b = sh.T, sh.B
    x = torch.from_numpy(c["x"]).reshape(t, b, sh.I).clone()
    h0 = torch.from_numpy(c["h0"]).clone().requires_grad_(True)
    c0 = torch.from_numpy(c["c0"]).clone().requires_grad_(True)
    dy = torch.from_numpy(c["dy"]).reshape(t, b, sh.D * sh.H).clone()
    dh, dc = torch.from_numpy(c["dh"]), torch.from_numpy(c["dc"])
    x_grad = x.clone().requires_grad_(True)
    lengths = torch.as_tensor(c["lengths"])
    dy_packed = pack_padded_sequence(dy, lengths).data if sh.varlen else None

    def clear() -> None:
        for p in (x_grad, h0, c0, *weights):
            p.grad = None

    def fwd(inp: torch.Tensor, packed: bool):
        def run():
            if packed:
                out, (hn, cn) = lstm(pack_padded_sequence(inp, lengths), (h0, c0))
                return out.data, hn, cn, dy_packed
            y, (hn, cn) = lstm(inp, (h0, c0))
            return y, hn, cn, dy

        return run

    def bwd(state) -> None:
        y, hn, cn, g = state
        torch.autograd.backward([y, hn, cn], [g, dh, dc])

    def bwd_item(inp: torch.Tensor, packed: bool) -> tuple:
        run = fwd(inp, packed)

        def untimed():
            clear()
            return run()

        return bwd, untimed

    def fwdbwd_item(inp: torch.Tensor, packed: bool) -> tuple:
        run = fwd(inp, packed)
        return (lambda _: bwd(run())), clear

    # item -> (timed(state), untimed() -> state)
    items: dict[str, tuple] = {
        "bwd": bwd_item(x_grad, sh.varlen),
        "fwdbwd": fwdbwd_item(x_grad, sh.varlen),
        "bwd_nodx": bwd_item(x, sh.varlen),
    }
    if sh.varlen:
        items["bwd_dense"] = bwd_item(x_grad, False)
        items["fwdbwd_dense"] = fwdbwd_item(x_grad, False)
    STATE["items"] = items
    paths = {}
    for name, (timed, untimed) in items.items():
        paths[name] = _profile_path(lambda timed=timed, untimed=untimed: timed(untimed()))
    return {"items": list(items), "paths": paths}


def time_item(item: str, n: int) -> list[float]:
    timed, untimed = STATE["items"][item]
    return time_reps(n, timed, untimed)


if __name__ == "__main__":
    serve({"info": info, "autograd64": autograd64, "setup": setup, "time": time_item})
