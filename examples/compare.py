"""Run examples/char_lm.py with torch.nn.LSTM and with lstmgrad.nn.LSTM, and compare them.

Each implementation is trained in a process of its own (so neither inherits the other's
thread pools, allocator state or JIT caches), with the same arguments; any argument this
script does not know is passed through to char_lm.py. The two take turns over ``--rounds``
rounds (the order swapped every round), and the speedup is the median of the rounds' ratios:
a machine whose speed drifts over minutes then reaches both sides alike. Then it draws both
loss curves on one PNG, prints a markdown table of speed and final losses, reports how far
apart the two loss curves are, and writes ``compare.json`` beside the two runs' own outputs.

At the defaults (3 rounds of 300 steps each way: 6 runs of char_lm.py) it takes about 2-6
minutes on 2 cores, longer on a busy machine; each run prints its own estimate and progress,
and this script the runs done and the time left.

Example:
    python examples/compare.py --steps 300 --threads 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
CHAR_LM = HERE / "char_lm.py"
IMPLS = ("torch", "lstmgrad")


def run_impl(impl: str, out: Path, extra: list[str]) -> dict[str, Any]:
    """Train ``impl`` in a subprocess and return its JSON result.

    Raises:
        RuntimeError: the subprocess failed.
    """
    cmd = [sys.executable, str(CHAR_LM), "--impl", impl, "--out", str(out), *extra]
    # stdout/stderr are inherited: the child's progress lines show as it trains.
    proc = subprocess.run(cmd, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited with status {proc.returncode}")
    return json.loads((out / f"char_lm-{impl}.json").read_text())


def curve_difference(a: list[float], b: list[float]) -> dict[str, float | int]:
    """Return the largest absolute and relative gaps between two loss curves, and where."""
    if len(a) != len(b):
        raise ValueError(f"loss curves differ in length: {len(a)} and {len(b)} steps")
    gaps = [abs(x - y) for x, y in zip(a, b, strict=True)]
    worst = max(range(len(gaps)), key=gaps.__getitem__)
    return {
        "max_abs": gaps[worst],
        "at_step": worst + 1,
        "max_rel": max(g / max(abs(x), 1e-12) for g, x in zip(gaps, a, strict=True)),
    }


def speedups(rounds: list[dict[str, dict[str, Any]]]) -> list[float]:
    """Each round's torch median ms/step over lstmgrad's."""
    return [r["torch"]["median_ms_per_step"] / r["lstmgrad"]["median_ms_per_step"] for r in rounds]


def median_ms(rounds: list[dict[str, dict[str, Any]]], impl: str) -> float:
    """The median over rounds of ``impl``'s median ms/step."""
    return statistics.median(r[impl]["median_ms_per_step"] for r in rounds)


def table(rounds: list[dict[str, dict[str, Any]]]) -> str:
    """Return the markdown comparison table: per impl the median over rounds of each run's
    median ms/step; the speedup is the median of the rounds' ratios, with their range."""
    ratios = speedups(rounds)
    rows = [
        "| impl | median ms/step | speedup vs torch | final train loss | final val loss |",
        "|---|---:|---:|---:|---:|",
    ]
    for impl in IMPLS:
        r = rounds[-1][impl]
        ms = median_ms(rounds, impl)
        speed = "1.00x" if impl == "torch" else f"{statistics.median(ratios):.2f}x"
        if impl != "torch" and len(rounds) > 1:
            speed += f" [{min(ratios):.2f}-{max(ratios):.2f}]"
        rows.append(
            f"| {impl} | {ms:.1f} | {speed} "
            f"| {r['train_losses'][-1]:.4f} | {r['eval'][-1]['loss']:.4f} |"
        )
    return "\n".join(rows)


def plot(results: dict[str, dict[str, Any]], path: Path) -> None:
    """Draw both training curves and their validation points on one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=120)
    styles = {"torch": ("C0", "-"), "lstmgrad": ("C1", "--")}
    for impl, r in results.items():
        color, line = styles[impl]
        ms = r["median_ms_per_step"]
        steps = range(1, len(r["train_losses"]) + 1)
        ax.plot(
            steps,
            r["train_losses"],
            line,
            color=color,
            lw=1,
            label=f"{impl} train ({ms:.1f} ms/step)",
        )
        ax.plot(
            [e["step"] for e in r["eval"]],
            [e["loss"] for e in r["eval"]],
            "o" if impl == "torch" else "x",
            color=color,
            ms=6,
            label=f"{impl} validation",
        )
    cfg = results["torch"]["config"]
    ax.set_title(
        f"char LM on pydoc topics: H={cfg['hidden']} L={cfg['layers']} B={cfg['batch']} "
        f"T={cfg['seq_len']}, {results['torch']['threads']} threads"
    )
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats/char)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def note(text: str) -> None:
    """A progress line on stderr (stdout carries the table)."""
    print(f"compare.py: {text}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    """Run both impls, then plot, print and save the comparison; return an exit code."""
    p = argparse.ArgumentParser(
        description="Train the char LM with both LSTMs (one process each) and compare them. "
        "Unknown arguments (--steps, --hidden, --threads, ...) go to char_lm.py. At the "
        "defaults: 6 runs of 300 steps, about 2-6 minutes on 2 cores.",
    )
    p.add_argument(
        "--out", type=Path, default=HERE / "out", help="output directory (default: examples/out)"
    )
    p.add_argument("--png", type=Path, help="plot (default: OUT/char_lm.png)")
    p.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="runs of each impl, taking turns (1 or more; default: 3)",
    )
    args, extra = p.parse_known_args(argv)
    if args.rounds < 1:
        p.error(f"--rounds must be at least 1, got {args.rounds}")
    args.png = args.png or args.out / "char_lm.png"  # never over a tracked file
    if "--impl" in extra or any(a.startswith("--impl=") for a in extra):
        p.error("--impl is chosen by compare.py (both are run); leave it out")

    runs = len(IMPLS) * args.rounds
    settings = " ".join(extra) or "char_lm.py's defaults"
    note(f"{args.rounds} round(s) x {len(IMPLS)} LSTMs = {runs} runs of char_lm.py ({settings})")
    rounds: list[dict[str, dict[str, Any]]] = []
    start = time.perf_counter()
    try:
        for n in range(args.rounds):
            order = IMPLS if n % 2 == 0 else IMPLS[::-1]
            rounds.append({})
            for impl in order:
                rounds[-1][impl] = run_impl(impl, args.out, extra)
                done = n * len(IMPLS) + len(rounds[-1])
                spent = time.perf_counter() - start
                note(f"run {done}/{runs} done ({impl}, round {n + 1}): {spent:.0f} s so far, "
                     f"about {spent / done * (runs - done):.0f} s left")  # fmt: skip
    except RuntimeError as exc:
        print(f"compare.py: {exc}", file=sys.stderr)
        return 1
    results = {impl: rounds[-1][impl] for impl in IMPLS}  # the last round's curves
    ratios = speedups(rounds)

    diff = curve_difference(results["torch"]["train_losses"], results["lstmgrad"]["train_losses"])
    val_diff = max(
        abs(a["loss"] - b["loss"])
        for a, b in zip(results["torch"]["eval"], results["lstmgrad"]["eval"], strict=True)
    )
    plot(results, args.png)
    md = table(rounds)
    print(md)
    print()
    print(
        f"train-loss curves: max |torch - lstmgrad| = {diff['max_abs']:.3g} at step "
        f"{diff['at_step']} (max relative {diff['max_rel']:.3g}); validation losses: max "
        f"|diff| = {val_diff:.3g}"
    )
    summary = {
        "args": extra,
        "table": md,
        "train_loss_difference": diff,
        "val_loss_max_abs_difference": val_diff,
        "png": str(args.png),
        "rounds": args.rounds,
        "speedup_vs_torch": statistics.median(ratios),
        "round_speedups": ratios,
        "runs": {
            impl: {
                "json": str(args.out / f"char_lm-{impl}.json"),
                "median_ms_per_step": median_ms(rounds, impl),
                "round_median_ms_per_step": [x[impl]["median_ms_per_step"] for x in rounds],
                "final_train_loss": r["train_losses"][-1],
                "final_val_loss": r["eval"][-1]["loss"],
                "threads": r["threads"],
            }
            for impl, r in results.items()
        },
    }
    (args.out / "compare.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(f"wrote {args.png} and {args.out / 'compare.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
