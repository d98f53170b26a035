"""What the benchmark parents (run.py, train_step.py) share: other processes' CPU use during a
batch, the machine and git facts of the header, and the error and summary statistics.

Imports NumPy only (the parents import neither torch nor lstmgrad).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import math
import os
import platform
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
# environment variables that change the libraries' speed, recorded with every run
ENV_KEYS = (
    "OPENBLAS_CORETYPE",
    "OPENBLAS_NUM_THREADS",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "NUMBA_NUM_THREADS",
    "NUMBA_CACHE_DIR",
    "KMP_BLOCKTIME",
    "OMP_WAIT_POLICY",
)

# --------------------------------------------------------------------------------------------
# other processes' CPU use during a batch (the machine is shared and small)

CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _system_busy_ticks() -> int:
    """Busy ticks of all CPUs since boot (user nice system irq softirq steal), or 0."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return 0
    user, nice, system, _idle, _iowait, irq, softirq, steal = v
    return user + nice + system + irq + softirq + steal


def _process_ticks(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0
    return int(fields[11]) + int(fields[12])  # utime, stime


class CpuWatch:
    """CPU ticks that processes other than ``pid`` and this one spent during a block, as
    cores (foreign CPU seconds / wall seconds). 0 where /proc is unavailable."""

    def __init__(self, pid: int) -> None:
        self.pid, self.me = pid, os.getpid()

    def __enter__(self) -> CpuWatch:
        self.t0 = time.perf_counter()
        self.b0 = _system_busy_ticks()
        self.p0 = _process_ticks(self.pid) + _process_ticks(self.me)
        return self

    def __exit__(self, *exc: object) -> None:
        wall = time.perf_counter() - self.t0
        busy = _system_busy_ticks() - self.b0
        own = _process_ticks(self.pid) + _process_ticks(self.me) - self.p0
        self.foreign_ticks = max(0, busy - own)
        self.wall = wall
        self.foreign_cores = self.foreign_ticks / CLK_TCK / wall if wall > 0 else 0.0

    def noisy(self, cores: float) -> bool:
        """More than ``cores`` of other work on average, with two ticks of slack."""
        return self.foreign_ticks > cores * self.wall * CLK_TCK + 2


# --------------------------------------------------------------------------------------------
# machine header


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def git_state() -> dict:
    def git(*a: str) -> str:
        try:
            return subprocess.run(
                ["git", *a], cwd=ROOT, capture_output=True, text=True, timeout=10
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    return {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain", "src"))}


def machine(tinfo: dict, linfo: dict) -> dict:
    """The run's machine record: this process's facts and each worker's ``info`` answer."""
    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:
        affinity = None
    return {
        "date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "affinity": affinity,
        "loadavg_start": os.getloadavg(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "env": {k: os.environ.get(k) for k in ENV_KEYS},
        "git": git_state(),
        "torch_worker": tinfo,
        "lstmgrad_worker": linfo,
    }


# --------------------------------------------------------------------------------------------
# statistics


def rel_err(got: Any, want: Any) -> float:
    """max|got - want| / max|want| (inf on a shape mismatch or a non-finite value)."""
    a = np.asarray(got, dtype=np.float64)
    b = np.asarray(want, dtype=np.float64)
    if a.shape != b.shape:
        return math.inf
    if a.size == 0:
        return 0.0
    if not np.all(np.isfinite(a)):
        return math.inf
    return float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(b))), np.finfo(np.float64).tiny))


def med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else math.nan


# --------------------------------------------------------------------------------------------
# command line and charts: the parts both parents share


def add_noise_options(ap: argparse.ArgumentParser, unit: str, budget_s: float) -> None:
    """--pause-s, --noise-cores, --max-retries and --budget-s; ``unit`` names what a redo
    repeats ("pair", "round")."""
    ap.add_argument(
        "--pause-s", type=float, default=0.2, help="pause after each batch (default 0.2)"
    )
    ap.add_argument(
        "--noise-cores",
        type=float,
        default=0.25,
        help=f"redo a {unit} when other processes used more than this many cores (default 0.25)",
    )
    ap.add_argument("--max-retries", type=int, default=2, help=f"redos per {unit} (default 2)")
    ap.add_argument(
        "--budget-s",
        type=float,
        default=budget_s,
        help="seconds for the timings of all shapes: redos stop once a shape has used its "
        f"share (default {budget_s:g})",
    )


def speedup_axis(ax: Any, lo: float, hi: float) -> None:
    """A log-scale speedup axis from lo to hi, ticks at powers of two ("0.5x", "2x"), and a
    dashed line at 1x."""
    ax.set_yscale("log")
    ax.set_ylim(lo, hi)
    ticks = [t for t in (0.125, 0.25, 0.5, 1, 2, 4, 8, 16, 32) if lo <= t <= hi]
    ax.set_yticks(ticks, [f"{t:g}x" for t in ticks])
    ax.minorticks_off()
    ax.axhline(1.0, color="k", lw=1, ls="--")


def save_figure(fig: Any, path: Path) -> None:
    """Lay out, write (120 dpi, the folder made if needed) and close a matplotlib figure."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
