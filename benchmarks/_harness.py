"""The timing core shared by run.py and train_step.py: batches timed in worker processes while
other processes' CPU use is watched, a warm-up, rep counts calibrated per item, and interleaved
rounds whose noisy groups are redone; plus where a run writes its files.

An item is (side, name): ``side`` a key of the workers given, ``name`` what its worker's "time"
request runs. A group is a list of items timed back to back, in reverse order every other
round (run.py: one group per torch/lstmgrad pair; train_step.py: one group of every item).
"""

from __future__ import annotations

import datetime as _dt
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _machine import CpuWatch, med
from _protocol import Worker

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


def output_paths(
    json_arg: Path | None, png_arg: Path | None, prefix: str, png_name: str
) -> tuple[Path, Path, Path]:
    """The run's JSON, PNG and log folder (created) under benchmarks/results unless given."""
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    resdir = HERE / "results"
    logdir = resdir / "logs" / (f"{prefix}-{stamp}" if prefix != "bench" else stamp)
    logdir.mkdir(parents=True, exist_ok=True)
    json_path = json_arg or resdir / f"{prefix}-{stamp}.json"
    json_path.parent.mkdir(parents=True, exist_ok=True)
    return json_path, png_arg or resdir / png_name, logdir
