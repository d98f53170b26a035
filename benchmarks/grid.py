"""lstmgrad.nn.LSTM against torch.nn.LSTM in a small model over a seeded sample of 40 shapes: per
shape a training step (Embedding -> LSTM -> Linear -> cross-entropy -> backward -> SGD) and an
eval forward, both sides in this process with the same weights, in alternating rounds
(lstmgrad.tools.workloads.run_grid; the sample and its cost cap: lstmgrad.tools.workloads.grid_sample).

    python benchmarks/grid.py [--busy N] [--rounds 5] [--json PATH] [--quick]

About 5-10 minutes on 2 cores (more on a first run with an empty plan cache, which measures new
classes of shapes in the warm-ups); --quick: 3 small shapes, 2 rounds, under a minute.
"""

from __future__ import annotations

import argparse
import datetime as _dt
from pathlib import Path

from _harness import run_main

from lstmgrad.tools import workloads as w

RESULTS = Path(__file__).resolve().parent / "results"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--busy", type=int, default=0, metavar="N",
                   help="busy processes beside both sides (default 0)")  # fmt: skip
    p.add_argument("--rounds", type=int, help="timed rounds per shape (default 5; 2 with --quick)")
    p.add_argument("--warmup", type=int, default=2,
                   help="untimed rounds at least (more while lstmgrad still measures)")  # fmt: skip
    p.add_argument("--n", type=int, default=40, help="shapes in the sample (default 40)")
    p.add_argument("--seed", type=int, default=0, help="the sample's seed (default 0)")
    p.add_argument("--shapes", metavar="ID,ID", help="these shapes instead of the sample, e.g. "
                   "H1500-B20-T1-L1-D2,H64-B4-T35-L2-D2-p0.5-hx")  # fmt: skip
    p.add_argument("--tune", choices=("on", "eager", "cached", "off"),
                   help="LSTMGRAD_TUNE for the run (default: unset; the warm-ups measure "
                   "new classes at once)")  # fmt: skip
    p.add_argument("--quick", action="store_true", help="3 small shapes, 2 rounds: a smoke run")
    p.add_argument("--json", type=Path, metavar="PATH",
                   help="results (default benchmarks/results/grid-<date>-<time>.json)")  # fmt: skip
    args = p.parse_args(argv)
    try:
        if args.shapes:
            shapes = [w.parse_shape(x) for x in args.shapes.split(",")]
        elif args.quick:
            shapes = w.quick_shapes(seed=args.seed)
        else:
            shapes = w.grid_sample(args.n, args.seed)
    except ValueError as exc:
        p.error(str(exc))
    rounds = args.rounds or w.RUN_SIZES["grid"][args.quick]["rounds"]
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    path = args.json or RESULTS / f"grid-{stamp}.json"
    print(f"{len(shapes)} shapes, {rounds} rounds, {args.busy} busy processes", flush=True)

    def progress(doc: dict) -> None:
        if len(doc["results"]) == 1:
            print(w.format_meta(doc["meta"]), flush=True)
        print("  ".join(w.format_grid_row(doc["results"][-1])), flush=True)
        w.write_json(doc, path)  # an interrupted run keeps what it measured

    doc = w.run_grid(shapes, rounds, args.warmup, args.busy, seed=args.seed, tune=args.tune,
                     progress=progress)  # fmt: skip
    print(w.format_meta(doc["meta"]), w.format_grid(doc), f"json {w.write_json(doc, path)}",
          f"total {doc['meta']['total_s']:.0f} s", sep="\n")  # fmt: skip
    return 1 if doc["summary"]["errors"] else 0


if __name__ == "__main__":
    run_main(main)
