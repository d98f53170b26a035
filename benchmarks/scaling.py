"""Backward (and forward + backward) time with 1 thread and with all usable threads, one process.

lstmgrad is given torch tensors (its GEMMs on torch) and torch.nn.LSTM runs beside it; per
shape and thread count: a warm-up (compilation and, with LSTMGRAD_TUNE=on, the measurement of
the shape's classes for that thread count), then rounds alternating the thread counts; the
figure is the median over rounds, the speedup the median of per-round ratios t(1) / t(n).

    python benchmarks/scaling.py --shapes med-3,large-1 [--rounds 7] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import numba
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import median_ms  # noqa: E402
from shapes import BY_ID, make_case  # noqa: E402

import lstmgrad  # noqa: E402
from lstmgrad.machine import cpu_model, visible_cpus  # noqa: E402


def _set_threads(n: int) -> None:
    torch.set_num_threads(n)
    numba.set_num_threads(n)


def _items(shape_id: str):
    shape = BY_ID[shape_id]
    c = {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v
         for k, v in make_case(shape).items()}  # fmt: skip
    params = [torch.from_numpy(p) for p in c["params"]]
    x, hx, bs = c["x"], [c["h0"], c["c0"]], c["batch_sizes"]
    kw = dict(num_layers=shape.L, bidirectional=shape.D == 2)
    fw = lstmgrad.lstm_forward(x, params, hx, bs, **kw)

    def backward():
        lstmgrad.lstm_backward(x, hx, params, c["dy"], c["dh"], c["dc"], *fw.saved[:7], bs, **kw)

    def forward_backward():
        f = lstmgrad.lstm_forward(x, params, hx, bs, **kw)
        lstmgrad.lstm_backward(x, hx, params, c["dy"], c["dh"], c["dc"], *f.saved[:7], bs, **kw)

    return {"backward": backward, "forward+backward": forward_backward}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="med-3,large-1,med-1,med-5")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    most = visible_cpus()
    counts = sorted({1, most})
    print(f"cpu      {cpu_model()}; {most} usable CPUs; torch {torch.__version__}, "
          f"Numba {numba.__version__}; threads compared: {counts}")  # fmt: skip
    rows = []
    for shape_id in args.shapes.split(","):
        items = None
        for n in counts:  # warm-up per thread count: compile, measure, first touch
            _set_threads(n)
            items = _items(shape_id)
            for fn in items.values():
                fn(), fn()
        assert items is not None
        for name, fn in items.items():
            _set_threads(counts[0])
            reps = max(3, int(0.3 / max(1e-3, median_ms(fn, 1) / 1e3)))
            times: dict[int, list[float]] = {n: [] for n in counts}
            for r in range(args.rounds):
                for n in counts if r % 2 == 0 else counts[::-1]:
                    _set_threads(n)
                    times[n].append(median_ms(fn, reps))
            ratios = [a / b for a, b in zip(times[counts[0]], times[counts[-1]], strict=True)]
            row = {"shape": shape_id, "item": name,
                   **{f"ms_{n}": statistics.median(times[n]) for n in counts},
                   "speedup": statistics.median(ratios)}  # fmt: skip
            rows.append(row)
            print(
                f"{shape_id:8s} {name:17s} "
                + "  ".join(f"{n} thr {row[f'ms_{n}']:.1f} ms" for n in counts)
                + f"  speedup {row['speedup']:.2f}x"
            )
    if args.json:
        args.json.write_text(json.dumps({"cpu": cpu_model(), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
