"""run.py's timing core (batches timed in worker processes while other processes' CPU use is
watched, a warm-up, rep counts calibrated per item, interleaved rounds whose noisy groups are
redone), its files and header, pair statistics, tables and chart.

An item is (side, name): ``side`` a key of the workers given, ``name`` what its worker's "time"
request runs. A group is a list of items timed back to back, in reverse order every other
round (--what backward: one group per torch/lstmgrad pair; --what step: one group of all).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _machine import CpuWatch, machine, med, probe_lines, probe_machine
from _protocol import Worker
from shapes import Shape

HERE = Path(__file__).resolve().parent
Item = tuple[str, str]


def key(item: Item) -> str:
    return f"{item[0]}:{item[1]}"


@dataclass
class Timing:
    """How batches are sized and when they are redone."""

    target_s: float  # aimed seconds of timed work per batch
    warmup_reps: int
    min_reps: int
    max_reps: int
    pause_s: float  # after every batch: the idle side's spinning threads go to sleep
    noise_cores: float  # a group is redone when other processes used more CPU than this
    max_retries: int


class Timer:
    """Times items in ``workers`` (side -> Worker) as ``timing`` says."""

    def __init__(self, workers: dict[str, Worker], timing: Timing) -> None:
        self.workers, self.t = workers, timing

    def batch(self, item: Item, n: int) -> dict[str, Any]:
        """n reps of an item: their seconds, the batch's wall time and other processes' cores."""
        w = self.workers[item[0]]
        with CpuWatch(w.proc.pid) as watch:
            times = w.call("time", item=item[1], n=n)
        time.sleep(self.t.pause_s)
        return {
            "s": times,
            "wall": round(watch.wall, 6),
            "other_cores": round(watch.foreign_cores, 3),
            "noisy": watch.noisy(self.t.noise_cores),
        }

    def calibrate(self, item: Item) -> tuple[int, list[dict[str, Any]]]:
        """Reps giving about target_s of timed work per batch and at most twice that of wall
        time (a torch backward rep also runs its untimed forward), from growing batches; the rep
        time is the median over every calibration rep, so one rep slowed by another process
        cannot shrink the batches to one rep."""
        t = self.t
        n, seen = t.min_reps, []
        while True:
            b = self.batch(item, n)
            seen.append(b)
            per_wall = max(b["wall"] / n, 1e-7)
            if b["wall"] >= t.target_s / 4 or n >= t.max_reps:
                break
            n = min(t.max_reps, 16 * n, max(n + 1, math.ceil(t.target_s / 4 / per_wall)))
        per_timed = max(med([s for b in seen for s in b["s"]]), 1e-7)
        want = min(t.target_s / per_timed, 2 * t.target_s / per_wall)
        return max(t.min_reps, min(t.max_reps, round(want))), seen

    def prepare(self, items: list[Item]) -> tuple[dict[str, list], dict[str, int]]:
        """Every item warmed up (JIT compiles, caches, oneDNN primitives), then calibrated:
        (warm-up and calibration batches, reps) per item key."""
        items = list(dict.fromkeys(items))
        warm = {key(i): [self.batch(i, self.t.warmup_reps)] for i in items}
        reps = {}
        for i in items:
            reps[key(i)], seen = self.calibrate(i)
            warm[key(i)] += seen
        return warm, reps

    def rounds(
        self, groups: list[list[Item]], reps: dict[str, int], n_rounds: int, deadline: float
    ) -> tuple[list[list[dict[str, dict]]], list[dict[str, Any]]]:
        """``n_rounds`` rounds of every group, each group's items back to back (reversed in odd
        rounds); a group in which another process used more than noise_cores is redone, at
        most max_retries times and only before ``deadline`` (time.perf_counter()).

        Returns:
            (per group, per round: item key -> batch), and the discarded attempts (with their
            group and round).
        """
        kept: list[list[dict[str, dict]]] = [[] for _ in groups]
        discarded: list[dict[str, Any]] = []
        for r in range(n_rounds):
            for g, group in enumerate(groups):
                seq = group[::-1] if r % 2 else group
                for attempt in range(self.t.max_retries + 1):
                    got = {key(i): self.batch(i, reps[key(i)]) for i in seq}
                    noisy = any(b["noisy"] for b in got.values())
                    last = attempt == self.t.max_retries or time.perf_counter() >= deadline
                    if not noisy or last:
                        break
                    discarded.append({"group": g, "round": r, **got})
                kept[g].append(got)
        return kept, discarded


def ms_rounds(rounds: list[dict[str, dict]], item_key: str) -> list[float]:
    """Per round, the median rep of an item's batch, in ms."""
    return [1e3 * med(rd[item_key]["s"]) for rd in rounds]


# --------------------------------------------------------------------------------------------
# around the timings: the run's files and header, the per-shape loop, statistics, tables, chart


class Session:
    """One parent run: its files (JSON rewritten after every shape, PNG, worker logs), the
    machine probe (before any worker starts: nothing else running), header and closing lines."""

    def __init__(self, args: argparse.Namespace, prefix: str, png_name: str) -> None:
        stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        res = HERE / "results"
        self.logdir = res / "logs" / (f"{prefix}-{stamp}" if prefix != "bench" else stamp)
        self.logdir.mkdir(parents=True, exist_ok=True)
        self.json_path = args.json or res / f"{prefix}-{stamp}.json"
        self.json_path.parent.mkdir(parents=True, exist_ok=True)
        self.png_path = args.png or res / png_name
        self.t0 = time.perf_counter()
        self.probe = probe_machine(args.dtype)
        self.doc: dict[str, Any] = {}

    def start(self, tinfo: dict, linfo: dict, worker_lines: list[str], **doc: Any) -> dict:
        """The machine record (printed as the header) and the JSON document's first keys."""
        m = machine(tinfo, linfo, self.probe)
        dirty = " (src dirty)" if m["git"]["dirty"] else ""
        env = ", ".join(f"{k}={v}" for k, v in m["env"].items() if v is not None) or "none set"
        say(f"date     {m['date']}   git {m['git']['commit'][:10]}{dirty}",
            f"machine  load {m['loadavg_start'][0]:.2f}, Python {m['python']}, {m['platform']}",
            *probe_lines(m["probe"]), *worker_lines, f"env      {env}")  # fmt: skip
        self.doc = {"meta": m, **doc}
        return m

    def shapes(self, shapes: list[Shape], budget_s: float) -> Iterator[tuple[Shape, float]]:
        """Each shape with its share of what is left of ``budget_s``; the JSON is written
        after each, so an interrupted run keeps what it measured."""
        t0 = time.perf_counter()
        for k, sh in enumerate(shapes):
            yield sh, max(0.0, budget_s - (time.perf_counter() - t0)) / (len(shapes) - k)
            self.save()

    def save(self) -> None:
        self.json_path.write_text(json.dumps(self.doc, indent=1))

    def finish(self) -> None:
        m = self.doc["meta"]
        m["loadavg_end"], m["total_s"] = os.getloadavg(), time.perf_counter() - self.t0
        self.save()

    def close(self) -> None:
        say(f"json {self.json_path}", f"png  {self.png_path}", f"logs {self.logdir}",
            f"total {self.doc['meta']['total_s']:.0f} s")  # fmt: skip


def say(*lines: str) -> None:
    for line in lines:
        print(line, flush=True)


def gate_failed(log: list[str], failures: list[str]) -> None:
    """Print the gate's failures and exit 2: no timings are reported for a wrong result."""
    say(*log, "", "CORRECTNESS GATE FAILED: no timings are reported for a wrong result.")
    say(*("  " + f for f in failures))
    raise SystemExit(2)


def pair_stats(t_ms: list[float], l_ms: list[float], flops: float, peak: dict) -> dict:
    """Medians of both sides' per-round ms, the median (min, max) of the per-round ratios
    torch / lstmgrad, and each side's GFLOP/s and fraction of its library's GEMM peak."""
    ratios = [a / b for a, b in zip(t_ms, l_ms, strict=True)]
    out: dict[str, Any] = {"ratio": med(ratios), "ratio_min": min(ratios)}
    out.update(ratio_max=max(ratios), ratio_round=ratios, rounds=len(ratios), flops=flops)
    for side, ms in (("torch", t_ms), ("lg", l_ms)):
        gf = flops / med(ms) / 1e6
        out |= {f"{side}_ms": med(ms), f"{side}_ms_round": ms, f"{side}_gflops": gf}
        out[f"{side}_peak_frac"] = gf / peak["torch" if side == "torch" else "lstmgrad"]
    return out


def fmt_ms(v: float) -> str:
    return f"{v:.3f}" if v < 1 else f"{v:.2f}" if v < 100 else f"{v:.1f}"


def fmt_ratio(s: dict) -> str:
    return f"{s['ratio']:.2f}x [{s['ratio_min']:.2f}-{s['ratio_max']:.2f}]"


def fmt_gflops(s: dict, side: str) -> str:
    """GFLOP/s of one side and, in brackets, its fraction of that side's GEMM peak."""
    frac = s[f"{side}_peak_frac"]
    return f"{s[f'{side}_gflops']:.3g}" + (f" ({100 * frac:.0f}%)" if math.isfinite(frac) else "")


def md_table(head: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def chart(bars: list[tuple[str, str, dict]], path: Path, title: str, ylabel: str) -> None:
    """Speedup bars (label, series, stats with ratio / ratio_min / ratio_max) grouped by label,
    growing from 1x on a log scale with min-max error bars; limits from the medians, so one wild
    round does not flatten the chart (its error bar is clipped instead)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = list(dict.fromkeys(b[0] for b in bars))
    series = list(dict.fromkeys(b[1] for b in bars))
    per_label = {lab: [b for b in bars if b[0] == lab] for lab in labels}
    w = 0.8 / max(len(v) for v in per_label.values())
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(labels) + 2), 4.8))
    for lab, group in per_label.items():
        for k, (_, name, s) in enumerate(group):
            x, v = labels.index(lab) + (k - (len(group) - 1) / 2) * w, s["ratio"]
            # up: lstmgrad faster; down: slower; the first bar of a series names it
            ax.bar(x, v - 1.0, w, bottom=1.0, color=f"C{series.index(name)}",
                   label=name if s is next(b[2] for b in bars if b[1] == name) else None)  # fmt: skip
            err = [[v - s["ratio_min"]], [s["ratio_max"] - v]]
            ax.errorbar(x, v, yerr=err, fmt="none", ecolor="k", capsize=2, lw=0.8)
            ax.annotate(f"{v:.2f}", (x, v), xytext=(0, 3 if v >= 1 else -9),
                        textcoords="offset points", ha="center", fontsize=7)  # fmt: skip
    meds = [s["ratio"] for _, _, s in bars] + [1.0]
    lo, hi = min(meds) / 2, max(meds) * 2
    ax.set_yscale("log")
    ax.set_ylim(lo, hi)
    ticks = [t for t in (0.125, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64, 128) if lo <= t <= hi]
    ax.set_yticks(ticks, [f"{t:g}x" for t in ticks])
    ax.minorticks_off()
    ax.axhline(1.0, color="k", lw=1, ls="--")
    ax.set_xticks(range(len(labels)), labels, fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
