"""The default plan of an unmeasured class against the plan of LSTMGRAD_TUNE=off and the measured
plan: forward + backward with torch tensors on the dense benchmark shapes, the three plans in
alternating rounds in one process; medians in ms and the ratios to the measured plan.

    python benchmarks/default_plan.py [--shapes med-3,large-1] [--rounds 5] [--json PATH]

Run it alone and beside a busy process (``python -c 'while True: pass' &``) to see both cases.
Measures the shapes' classes into a temporary plan store (nothing of yours is touched).
``--tune-busy N``: the measured plan's first use (where the planner may measure) runs beside
N busy processes, the timed rounds on the quiet machine: the plan a first use on a loaded
machine leaves in use, against the other two.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from shapes import SHAPES, select  # noqa: E402

import lstmgrad  # noqa: E402
from lstmgrad.planning import plan  # noqa: E402
from lstmgrad.tools import workloads  # noqa: E402

# (LSTMGRAD_TUNE, store): off = the safe plan; cached with an empty store = the default plan
PLANS = {"off": ("off", "safe"), "default": ("cached", "empty"), "measured": ("eager", "store")}


def run(which: str, root: Path, x: torch.Tensor, params: list, kw: dict) -> float:
    """Seconds of one forward + backward under plan ``which``."""
    mode, store = PLANS[which]
    os.environ["LSTMGRAD_TUNE"] = mode
    os.environ["LSTMGRAD_CACHE_DIR"] = str(root / store)
    t0 = time.perf_counter()
    f = lstmgrad.lstm_forward(x, params, **kw)
    h0 = torch.zeros_like(f.hy)
    lstmgrad.lstm_backward(x, [h0, h0], params, torch.ones_like(f.output), None, None,
                           *f.saved[:7], **kw)  # fmt: skip
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    dense = [s.id for s in SHAPES if s.lengths_range is None]
    p.add_argument("--shapes", default=",".join(dense), metavar="NAME[,NAME...]",
                   help="shape names of shapes.py (dense ones; default all of them)")  # fmt: skip
    p.add_argument("--grid", action="store_true",
                   help="the grid's shapes (lstmgrad.tools.workloads.grid_sample) instead")  # fmt: skip
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--json", metavar="PATH")
    p.add_argument("--tune-busy", type=int, default=0, metavar="N",
                   help="the measured plan's first use beside N busy processes (default 0)")  # fmt: skip
    args = p.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="lstmgrad-default-plan-"))
    if args.grid:  # the realistic grid: I = H, the LSTM alone
        by_name = {s.id: s for s in workloads.grid_sample()}
        names = args.shapes.split(",") if "H" in args.shapes else list(by_name)
        shapes = [(n, by_name[n]) for n in names]
    else:
        shapes = [(s.id, s) for s in select(args.shapes, varlen=False)]
    out = {"load": os.getloadavg(), "cpu": lstmgrad.core.machine.cpu_model(),
           "tune_busy": args.tune_busy, "shapes": {}}  # fmt: skip
    print(f"{'shape':22s} {'off ms':>9s} {'default ms':>11s} {'measured ms':>12s}  off/measured"
          "  default/measured")  # fmt: skip
    for name, s in shapes:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(s.T, s.B, s.I, generator=g)
        params = []
        for layer in range(s.L):
            for _ in range(s.D):
                width = s.I if layer == 0 else s.D * s.H
                params += [0.1 * torch.randn(shape, generator=g)
                           for shape in [(4 * s.H, width), (4 * s.H, s.H), (4 * s.H,), (4 * s.H,)]]  # fmt: skip
        kw = {"num_layers": s.L, "bidirectional": s.D == 2}
        for which in PLANS:  # warm-up; the measured plan is measured here
            if which == "measured" and args.tune_busy:
                with workloads.busy(args.tune_busy):
                    time.sleep(3)  # the load average rises
                    run(which, root, x, params, kw)
            run(which, root, x, params, kw)
        times: dict[str, list[float]] = {w: [] for w in PLANS}
        for r in range(args.rounds):
            for which in list(PLANS)[:: 1 if r % 2 == 0 else -1]:
                times[which].append(run(which, root, x, params, kw))
        ms = {w: 1e3 * statistics.median(t) for w, t in times.items()}
        out["shapes"][name] = ms
        print(f"{name:22s} {ms['off']:9.1f} {ms['default']:11.1f} {ms['measured']:12.1f}  "
              f"{ms['off'] / ms['measured']:12.2f}  {ms['default'] / ms['measured']:16.2f}",
              flush=True)  # fmt: skip
    plan.forget()
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
