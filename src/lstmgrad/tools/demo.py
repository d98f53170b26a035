"""The checks behind ``lstmgrad demo``: the documented sample and a random checked case."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, TextIO

import numpy as np

from ..core.varlen import batch_sizes_from_lengths
from ..ops.api import lstm_backward, lstm_forward

# The operator documentation's samples, and the values they document.
SAMPLE_DC_PREV = 1.8399487
SAMPLE_Y, SAMPLE_CY = 0.3696064, 0.5567699


def _sample_backward(dtype: type) -> tuple[dict[str, float], dict[str, float]]:
    """T = B = 1, I = H = 8, every input 1 except tanhc = tanh(1)."""
    one: np.ndarray = np.ones((1, 1, 8), dtype)
    params: list[np.ndarray] = [np.ones((32, 8), dtype), np.ones((32, 8), dtype)]
    params += [np.ones(32, dtype), np.ones(32, dtype)]
    tanhc: list[np.ndarray] = [np.full((1, 1, 8), math.tanh(1.0), dtype)]
    s = [one]
    r = lstm_backward(one, [one, one], params, one, one, one, s, s, s, s, s, s, tanhc)
    assert r.dx is not None and r.dh_prev is not None and r.dc_prev is not None and r.dparams
    got = {
        "dx": float(np.abs(r.dx).max()),
        "dh_prev": float(np.abs(r.dh_prev).max()),
        "dc_prev (min)": float(r.dc_prev.min()),
        "dc_prev (max)": float(r.dc_prev.max()),
        "dW_ih, dW_hh, db": float(max(np.abs(p).max() for p in r.dparams)),
    }
    want = {
        "dx": 0.0,
        "dh_prev": 0.0,
        "dc_prev (min)": SAMPLE_DC_PREV,
        "dc_prev (max)": SAMPLE_DC_PREV,
        "dW_ih, dW_hh, db": 0.0,
    }
    return got, want


def _sample_forward(dtype: type) -> tuple[dict[str, float], dict[str, float]]:
    """T = B = I = H = 1, no bias, params 1, x = 1, no hx."""
    x: np.ndarray = np.ones((1, 1, 1), dtype)
    out = lstm_forward(x, [np.ones((4, 1), dtype), np.ones((4, 1), dtype)], has_bias=False)
    got = {
        "y": float(out.output[0, 0, 0]),
        "hy": float(out.hy[0, 0, 0]),
        "cy": float(out.cy[0, 0, 0]),
    }
    return got, {"y": SAMPLE_Y, "hy": SAMPLE_Y, "cy": SAMPLE_CY}


@dataclass
class DemoCase:
    """A 2-layer bidirectional float64 case with variable lengths in the padded layout."""

    dims: tuple[int, int, int, int, int]  # T, B, I, H, L
    lengths: list[int]
    batch_sizes: np.ndarray  # int64 [T]
    x: np.ndarray  # [T*B, I]
    hx: list[np.ndarray]  # h0, c0 [L*D, B, H]
    params: list[np.ndarray]
    dy: np.ndarray  # [T*B, D*H]
    dh: np.ndarray  # [L*D, B, H]
    dc: np.ndarray  # [L*D, B, H]


def random_case(seed: int) -> DemoCase:
    """T = 6, B = 4, I = 5, H = 7, L = 2, bidirectional, lengths [6, 5, 3, 1]."""
    rng = np.random.default_rng(seed)
    t_steps, batch, isz, hidden, layers = 6, 4, 5, 7, 2
    lengths = [6, 5, 3, 1]
    params = []
    for layer in range(layers):
        for _ in range(2):
            w_in = isz if layer == 0 else 2 * hidden
            for shape in [(4 * hidden, w_in), (4 * hidden, hidden), (4 * hidden,), (4 * hidden,)]:
                params.append(rng.uniform(-0.4, 0.4, shape))
    return DemoCase(
        dims=(t_steps, batch, isz, hidden, layers),
        lengths=lengths,
        batch_sizes=batch_sizes_from_lengths(lengths),
        x=rng.standard_normal((t_steps * batch, isz)),
        hx=[rng.standard_normal((2 * layers, batch, hidden)) for _ in range(2)],
        params=params,
        dy=rng.standard_normal((t_steps * batch, 2 * hidden)),
        dh=rng.standard_normal((2 * layers, batch, hidden)),
        dc=rng.standard_normal((2 * layers, batch, hidden)),
    )


def _grads(case: DemoCase, dtype: type, impl: str = "fused") -> dict[str, np.ndarray]:
    """Forward then backward through the public API in ``dtype`` with the engine ``impl``."""

    def cast(a: np.ndarray) -> np.ndarray:
        return np.asarray(a, dtype)

    x, hx, params = cast(case.x), [cast(a) for a in case.hx], [cast(p) for p in case.params]
    layers = case.dims[4]
    fwd = lstm_forward(
        x, params, hx, case.batch_sizes, num_layers=layers, bidirectional=True, impl=impl
    )
    assert fwd.saved is not None
    s = fwd.saved
    r = lstm_backward(
        x, hx, params, cast(case.dy), cast(case.dh), cast(case.dc),
        s.i, s.g, s.f, s.o, s.h, s.c, s.tanhc, case.batch_sizes,
        num_layers=layers, bidirectional=True, impl=impl,
    )  # fmt: skip
    return _named(fwd.output, r.dx, r.dh_prev, r.dc_prev, r.dparams)


def _named(y: Any, dx: Any, dh_prev: Any, dc_prev: Any, dparams: Any) -> dict[str, np.ndarray]:
    """The compared outputs, float64; weights and biases each flattened into one vector."""
    weights = [p for j, p in enumerate(dparams) if j % 4 < 2]
    biases = [p for j, p in enumerate(dparams) if j % 4 >= 2]
    return {
        "output": np.asarray(y, np.float64),
        "dx": np.asarray(dx, np.float64),
        "dh_prev": np.asarray(dh_prev, np.float64),
        "dc_prev": np.asarray(dc_prev, np.float64),
        "dW (all)": np.concatenate([np.asarray(w, np.float64).ravel() for w in weights]),
        "db (all)": np.concatenate([np.asarray(b, np.float64).ravel() for b in biases]),
    }


def _torch_grads(case: DemoCase) -> dict[str, np.ndarray] | None:
    """The same case through torch.nn.LSTM with a PackedSequence, float64 autograd."""
    try:
        import torch
        from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence
    except ImportError:
        return None
    t_steps, batch, isz, hidden, layers = case.dims
    lstm = torch.nn.LSTM(isz, hidden, layers, bidirectional=True).double()
    weights = list(lstm.parameters())  # the _flat_weights order
    with torch.no_grad():
        for p, v in zip(weights, case.params, strict=True):
            p.copy_(torch.from_numpy(v))
    x = torch.from_numpy(case.x.reshape(t_steps, batch, isz)).requires_grad_()
    h0, c0 = (torch.from_numpy(a).requires_grad_() for a in case.hx)
    packed = pack_padded_sequence(x, torch.tensor(case.lengths))
    out, (hn, cn) = lstm(packed, (h0, c0))
    y, _ = pad_packed_sequence(out, total_length=t_steps)
    dy = torch.from_numpy(case.dy.reshape(t_steps, batch, 2 * hidden))
    dh, dc = torch.from_numpy(case.dh), torch.from_numpy(case.dc)
    ((y * dy).sum() + (hn * dh).sum() + (cn * dc).sum()).backward()
    grads = [np.asarray(t.grad) for t in [x, h0, c0, *weights]]
    return _named(
        y.detach().numpy().reshape(t_steps * batch, 2 * hidden),
        grads[0].reshape(t_steps * batch, isz),
        grads[1],
        grads[2],
        grads[3:],
    )


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    scale = max(float(np.abs(b).max(initial=0.0)), 1e-300)
    return float(np.abs(a - b).max(initial=0.0)) / scale


def run_demo(seed: int = 0, use_torch: bool = True, out: TextIO | None = None) -> bool:
    """Print the sample and the random case's error table; True if every check passes."""
    import sys

    out = out or sys.stdout
    ok = True

    def say(line: str = "") -> None:
        print(line, file=out, flush=True)  # lines as they come: a first run compiles for a while

    say("1. The documented sample, computed vs expected")
    say(f"   {'dtype':<8} {'output':<18} {'computed':>12} {'expected':>12}  check")
    for dtype, tol in ((np.float64, 5e-8), (np.float32, 5e-7), (np.float16, 2e-3)):
        for got, want in (_sample_backward(dtype), _sample_forward(dtype)):
            for name in got:
                good = abs(got[name] - want[name]) <= tol
                ok &= good
                say(
                    f"   {np.dtype(dtype).name:<8} {name:<18} {got[name]:>12.7f} {want[name]:>12.7f}  {'ok' if good else 'FAIL'}"
                )
    say()
    case = random_case(seed)
    t_steps, batch, isz, hidden, layers = case.dims
    say(
        f"2. Random case (seed {seed}): T={t_steps} B={batch} I={isz} H={hidden} L={layers} "
        f"bidirectional, lengths {case.lengths} (batch_sizes {case.batch_sizes.tolist()})"
    )
    ref = _grads(case, np.float64, impl="reference")
    checks = [
        ("float32 fused vs float64 ref", _grads(case, np.float32), ref, 1e-5),
        ("float64 fused vs float64 ref", _grads(case, np.float64), ref, 1e-12),
    ]
    torch_g = _torch_grads(case) if use_torch else None
    if torch_g is not None:
        checks.append(("float64 ref vs PyTorch autograd", ref, torch_g, 1e-10))
    limits = ", ".join(f"{lim:g}" for _, _, _, lim in checks)
    say(f"   max relative error per output (limit of each column: {limits})")
    say(f"   {'output':<10}" + "".join(f" {label:>32}" for label, _, _, _ in checks))
    for name in ref:
        errs = [(_rel(got[name], want[name]), lim) for _, got, want, lim in checks]
        good = all(e <= lim for e, lim in errs)
        ok &= good
        say(
            f"   {name:<10}" + "".join(f" {e:>32.2e}" for e, _ in errs) + ("" if good else "  FAIL")
        )
    if torch_g is None:
        say("   (PyTorch not installed or --no-torch: autograd column skipped)")
    say()
    say("all checks passed" if ok else "SOME CHECKS FAILED")
    return bool(ok)
