"""LSTM forward + backward in bfloat16, float16, under CPU autocast, and with proj_size > 0:
torch.nn.LSTM against lstmgrad.nn.LSTM, side by side in one process.

Per shape and mode: both modules hold the same weights; one step is zero_grad, forward, a sum
of the outputs in float32, backward. After a warm-up (Numba compilation, oneDNN primitives), the
rounds alternate the two sides (the order flipped every round); each figure is the median over
rounds, the ratio the median of per-round ratios torch / lstmgrad. A side that raises (torch's
CPU LSTM under float16 autocast) is reported as such.

Modes: ``bf16`` (module and input in bfloat16), ``f16`` (float16), ``autocast-bf16`` and
``autocast-f16`` (float32 module and input under ``torch.autocast("cpu", dtype)``), ``f32``
(the baseline), and ``proj`` (torch.nn.LSTM with proj_size = H / 2, which the drop-in hands to
torch, timed against lstmgrad without projection at the same H).

    python benchmarks/lowp_step.py [--shapes med-3,small] [--modes bf16,...] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import torch

from lstmgrad.machine import cpu_model, visible_cpus
from lstmgrad.nn import LSTM

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import median_ms  # noqa: E402

# id: T, B, I, H, num_layers, bidirectional
SHAPES = {
    "med-3": (100, 32, 256, 256, 1, False),
    "small": (20, 8, 32, 32, 2, True),
}
DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}


def _step(model: torch.nn.Module, x: torch.Tensor, autocast: torch.dtype | None) -> Callable:
    def step() -> None:
        model.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=autocast or torch.bfloat16, enabled=autocast is not None):
            y, (h, c) = model(x)
        (y.float().sum() + h.float().sum() + c.float().sum()).backward()

    return step


def _pair(shape: str, mode: str) -> tuple[Callable, Callable]:
    t, b, i, h, layers, bi = SHAPES[shape]
    torch.manual_seed(0)
    kw = dict(num_layers=layers, bidirectional=bi)
    proj = mode == "proj"
    ref = torch.nn.LSTM(i, h, proj_size=h // 2 if proj else 0, **kw)
    ours = LSTM(i, h, **kw)
    if not proj:
        ours.load_state_dict(ref.state_dict())
    autocast = DTYPES[mode.split("-")[1]] if mode.startswith("autocast") else None
    dtype = DTYPES.get(mode, torch.float32)
    ref, ours = ref.to(dtype), ours.to(dtype)
    x = torch.randn(t, b, i).to(dtype).requires_grad_()
    return _step(ref, x, autocast), _step(ours, x, autocast)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="med-3,small")
    ap.add_argument("--modes", default="f32,bf16,autocast-bf16,f16,autocast-f16,proj")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    print(f"cpu {cpu_model()}; {visible_cpus()} usable CPUs; torch {torch.__version__}")
    print(f"{'shape':7s} {'mode':14s} {'torch ms':>10s} {'lstmgrad ms':>12s} {'ratio':>7s}")
    for shape in args.shapes.split(","):
        for mode in args.modes.split(","):
            sides = _pair(shape, mode)
            failed = []
            for name, side in zip(("torch", "lstmgrad"), sides, strict=True):
                try:  # warm-up; a side that raises is reported instead
                    side(), side()
                except RuntimeError as exc:
                    failed.append(f"{name} raises: {str(exc).splitlines()[0][:60]}")
            if failed:
                print(f"{shape:7s} {mode:14s} {'; '.join(failed)}")
                continue
            reps = max(2, int(0.3 / max(1e-3, median_ms(sides[1], 1) / 1e3)))
            times: list[list[float]] = [[], []]
            for r in range(args.rounds):
                for s in (0, 1) if r % 2 == 0 else (1, 0):
                    times[s].append(median_ms(sides[s], reps))
            ratio = statistics.median(a / b for a, b in zip(*times, strict=True))
            t_ms, o_ms = (statistics.median(ts) for ts in times)
            print(f"{shape:7s} {mode:14s} {t_ms:10.2f} {o_ms:12.2f} {ratio:6.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
