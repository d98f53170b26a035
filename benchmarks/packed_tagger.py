"""A packed sequence-labelling workload: a word BiLSTM over sentences and a character BiLSTM over
their words, both on PackedSequences whose batch sizes and lengths change from batch to batch
(the structure of a CoNLL-style NER tagger). Trains a few epochs on generated sentences and
prints ms per batch (model and data: lstmgrad.tools.workloads).

    python benchmarks/packed_tagger.py --impl lstmgrad [--epochs 2] [--json PATH]
    python benchmarks/packed_tagger.py --compare [--busy N] [--runs 2] [--json PATH] [--quick]

With --impl, one side trains in this process; the first epoch includes what the process
measures (plans for new classes of shapes), and the lstmgrad plan classes stored before and
after are printed. With --compare, both sides train in fresh processes, alternating: run 1
with an empty plan cache and an empty Numba cache (a first run, as after an install), run 2
and on with the same caches again; per run and epoch both sides' seconds and the ratio
(lstmgrad.tools.workloads.run_tagger). About 1 minute on 2 cores; --quick: about half a minute.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import itertools
import json
import os
import platform
import sys
from pathlib import Path
from typing import Any

from _harness import run_main

from lstmgrad.tools import workloads as w

RESULTS = Path(__file__).resolve().parent / "results"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--impl", choices=("torch", "lstmgrad"), default="lstmgrad")
    p.add_argument("--compare", action="store_true",
                   help="both sides, each run in fresh processes (first run, then cached)")  # fmt: skip
    p.add_argument("--epochs", type=int, help="epochs per process (default 2; 1 with --quick)")
    p.add_argument("--sentences", type=int, help="sentences (default 640; 96 with --quick)")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--runs", type=int, default=2, help="--compare: runs per side (default 2)")
    p.add_argument("--busy", type=int, default=0, metavar="N",
                   help="--compare: busy processes beside both sides (default 0)")  # fmt: skip
    p.add_argument("--keep-numba-cache", action="store_true",
                   help="--compare: run 1 uses Numba's compiled kernels already cached")  # fmt: skip
    p.add_argument("--quick", action="store_true", help="96 sentences, 1 epoch: a smoke run")
    p.add_argument("--json", type=Path, metavar="PATH", help="results (with --compare default "
                   "benchmarks/results/packed_tagger-<date>-<time>.json)")  # fmt: skip
    args = p.parse_args(argv)
    sizes = w.RUN_SIZES["tagger"][args.quick]
    epochs = args.epochs or sizes["epochs"]
    n_sent = args.sentences or sizes["sentences"]
    if args.compare:
        stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        doc = w.run_tagger(epochs, args.runs, args.busy, n_sent, args.batch,
                           fresh_numba=not args.keep_numba_cache,
                           progress=lambda line: print(line, flush=True))  # fmt: skip
        path = w.write_json(doc, args.json or RESULTS / f"packed_tagger-{stamp}.json")
        print(w.format_meta(doc["meta"]), w.format_tagger(doc), f"json {path}", sep="\n")
        return 0

    epoch = itertools.count(1)

    def progress(e: dict[str, Any]) -> None:
        print(f"[{args.impl}] epoch {next(epoch)}: {e['seconds']:.2f} s, median "
              f"{e['median_ms']:.1f} ms/batch, loss {e['loss']:.4f}", flush=True)  # fmt: skip

    rec = w.tagger_train(args.impl, epochs, n_sent, args.batch, progress)
    doc = {"cpu": platform.processor() or platform.machine(), "load": os.getloadavg(),
           **rec, "argv": sys.argv[1:]}  # fmt: skip
    print(f"[{args.impl}] plan classes stored: {rec['stored_classes']['before']} before, "
          f"{rec['stored_classes']['after']} after")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    run_main(main)
