"""lstmgrad.nn.LSTM against torch.nn.LSTM in the word-level language model of PyTorch's
examples/word_language_model (2-layer LSTM 200/200, dropout 0.2, bptt 35, batch 20, clip 0.25,
SGD lr 20) on a generated Zipf corpus of 10,000 words: two models with the same initial
weights, trained alternately in chunks of batches (lstmgrad.tools.workloads.run_word_lm).

    python benchmarks/word_lm.py [--busy N] [--rounds 10] [--chunk 20] [--json PATH] [--quick]

About 1-2 minutes on 2 cores; --quick (2 rounds of 3 batches): about half a minute.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
from pathlib import Path

from _harness import run_main

from lstmgrad.tools import workloads as w

RESULTS = Path(__file__).resolve().parent / "results"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--busy", type=int, default=0, metavar="N",
                   help="busy processes beside both sides (default 0)")  # fmt: skip
    p.add_argument("--rounds", type=int, help="timed chunks per side (default 10; 2 with --quick)")
    p.add_argument("--chunk", type=int, help="batches per chunk (default 20; 3 with --quick)")
    p.add_argument("--warmup", type=int, help="untimed batches per side first (default 5; 2 "
                   "with --quick)")  # fmt: skip
    p.add_argument("--tied", action="store_true", help="decoder weights tied to the embedding")
    p.add_argument("--tune", choices=("on", "eager", "cached", "off"),
                   help="LSTMGRAD_TUNE for the run (default: unset; the warm-up measures "
                   "new classes at once)")  # fmt: skip
    p.add_argument("--quick", action="store_true", help="2 rounds of 3 batches: a smoke run")
    p.add_argument("--json", type=Path, metavar="PATH",
                   help="results (default benchmarks/results/word_lm-<date>-<time>.json)")  # fmt: skip
    args = p.parse_args(argv)
    sizes = w.RUN_SIZES["word-lm"][args.quick]
    rounds = args.rounds or sizes["rounds"]
    chunk = args.chunk or sizes["chunk"]
    warmup = args.warmup if args.warmup is not None else sizes["warmup"]
    cfg = dataclasses.replace(w.WordLMConfig(), tied=args.tied)
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    path = args.json or RESULTS / f"word_lm-{stamp}.json"
    doc = w.run_word_lm(rounds, chunk, warmup, args.busy, cfg, tune=args.tune,
                        progress=lambda line: print(line, flush=True))  # fmt: skip
    print(w.format_meta(doc["meta"]), w.format_word_lm(doc), f"json {w.write_json(doc, path)}",
          f"total {doc['meta']['total_s']:.0f} s", sep="\n")  # fmt: skip
    return 0


if __name__ == "__main__":
    run_main(main)
