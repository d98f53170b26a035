"""First-order backward and a double-backward step, lstmgrad.nn.LSTM vs torch.nn.LSTM, one process.

    python benchmarks/double_backward.py [--shape T,B,I,H,L] [--rounds N] [--dtype float32]

Both modules hold the same weights. "backward" times ``torch.autograd.grad`` of
sum(y^2) over (x, weights) after an untimed forward; "double-backward step" times a forward,
the gradient with ``create_graph=True`` and the gradient of its squared norm (a gradient
penalty) with respect to the weights. The two sides alternate within each round (order flipped
every round); the medians and the median of the per-round ratios are reported. It first checks
that both sides give the same penalty gradient (exit 2 otherwise).
See docs/performance.md, section "Second derivatives".
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from lstmgrad.nn import LSTM


def _grads(m: torch.nn.LSTM, x: torch.Tensor, create_graph: bool) -> tuple[torch.Tensor, ...]:
    y, _ = m(x)
    return torch.autograd.grad((y**2).sum(), [x, *m.parameters()], create_graph=create_graph)


def backward(m: torch.nn.LSTM, x: torch.Tensor) -> float:
    """Seconds of the first-order backward alone."""
    y, _ = m(x)
    loss = (y**2).sum()
    t = time.perf_counter()
    torch.autograd.grad(loss, [x, *m.parameters()])
    return time.perf_counter() - t


def penalty(m: torch.nn.LSTM, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    first = _grads(m, x, create_graph=True)
    return torch.autograd.grad(sum((g**2).sum() for g in first), list(m.parameters()))


def double_step(m: torch.nn.LSTM, x: torch.Tensor) -> float:
    """Seconds of forward + create_graph backward + the penalty's backward."""
    t = time.perf_counter()
    penalty(m, x)
    return time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", default="50,16,128,128,2", help="T,B,I,H,L")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    args = ap.parse_args()
    t, b, i, h, nl = (int(v) for v in args.shape.split(","))
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    ref = torch.nn.LSTM(i, h, nl).to(dtype)
    ours = LSTM(i, h, nl).to(dtype)
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(t, b, i, dtype=dtype, requires_grad=True)
    got, want = penalty(ours, x), penalty(ref, x)
    err = max(float((a - w).abs().max() / w.abs().max()) for a, w in zip(got, want, strict=True))
    print(f"shape T,B,I,H,L = {args.shape}, {args.dtype}; penalty gradient max rel. diff {err:.1e}")
    if err > (1e-3 if dtype == torch.float32 else 1e-10):
        return 2
    for name, fn in (("backward", backward), ("double-backward step", double_step)):
        times: dict[str, list[float]] = {"torch": [], "lstmgrad": []}
        for r in range(args.rounds + 1):
            order = [("torch", ref), ("lstmgrad", ours)]
            for side, m in order if r % 2 else order[::-1]:
                elapsed = fn(m, x)
                if r:  # round 0 warms up
                    times[side].append(elapsed)
        ratios = [a / w for a, w in zip(times["lstmgrad"], times["torch"], strict=True)]
        print(
            f"{name:22s} torch {statistics.median(times['torch']) * 1e3:8.1f} ms   "
            f"lstmgrad {statistics.median(times['lstmgrad']) * 1e3:8.1f} ms   "
            f"lstmgrad/torch {statistics.median(ratios):.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
