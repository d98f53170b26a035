"""What the benchmark scripts share about the machine: other processes' CPU use during a batch,
the facts of the header (git, CPU, quota, thread pools, measured GEMM peaks) and statistics.

Imports NumPy only (the parents import neither torch nor lstmgrad). The library facts and GEMM
peaks come from ``python _machine.py probe numpy|torch`` (``lstmgrad.bench.probe``): one child
process per library, so that one BLAS runtime's threads cannot disturb the other's
measurement.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
# environment variables that change the libraries' speed, recorded with every run
ENV_KEYS = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS",
            "MKL_NUM_THREADS", "NUMBA_NUM_THREADS", "NUMBA_CACHE_DIR", "KMP_BLOCKTIME",
            "OMP_WAIT_POLICY", "LSTMGRAD_TUNE")  # fmt: skip
CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def busy_ticks(pid: int | None = None) -> int:
    """Busy ticks since boot of all CPUs (user nice system irq softirq steal) or, given ``pid``,
    of that process (utime + stime); 0 where /proc cannot be read."""
    try:
        if pid is None:
            with open("/proc/stat") as f:
                v = [int(x) for x in f.readline().split()[1:9]]
            return sum(v) - v[3] - v[4]  # all but idle and iowait
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    except (OSError, ValueError, IndexError):
        return 0


class CpuWatch:
    """CPU ticks that processes other than ``pid`` and this one spent during a block, as
    cores (foreign CPU seconds / wall seconds). 0 where /proc is unavailable."""

    def __init__(self, pid: int) -> None:
        self.pids = (pid, os.getpid())

    def _own(self) -> int:
        return sum(busy_ticks(p) for p in self.pids)

    def __enter__(self) -> CpuWatch:
        self.t0, self.b0, self.p0 = time.perf_counter(), busy_ticks(), self._own()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self.t0
        self.foreign_ticks = max(0, busy_ticks() - self.b0 - (self._own() - self.p0))
        self.foreign_cores = self.foreign_ticks / CLK_TCK / self.wall if self.wall > 0 else 0.0

    def noisy(self, cores: float) -> bool:
        """More than ``cores`` of other work on average, with two ticks of slack."""
        return self.foreign_ticks > cores * self.wall * CLK_TCK + 2


def git_state() -> dict:
    def git(*a: str) -> str:
        try:
            cmd = ["git", *a]
            return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    return {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain", "src"))}


def probe_machine(dtype: str = "float32") -> dict:
    """CPU counts of this process and, from one child process per library, each library's
    versions, threads, thread pools and measured GEMM peak (float32, plus torch.mm in float16
    when ``dtype`` is float16). A child that fails is recorded as ``{"error": ...}``."""
    out: dict[str, Any] = {
        "cpu_count": os.cpu_count(),
        "affinity": len(os.sched_getaffinity(0)),
        "env": {k: os.environ.get(k) for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")},
    }
    for lib in ("numpy", "torch"):
        dts = ["float32", "float16"] if lib == "torch" and dtype == "float16" else ["float32"]
        proc = None
        # other processes' CPU use meanwhile: all CPUs' busy ticks minus the child's own
        t0, busy0, own0 = time.perf_counter(), busy_ticks(), sum(os.times()[2:4])
        try:
            cmd = [sys.executable, __file__, "probe", lib, *dts]
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
            out[lib] = json.loads(proc.stdout.strip().splitlines()[-1])
        except (OSError, subprocess.SubprocessError, ValueError, IndexError) as exc:
            out[lib] = {"error": proc.stderr[-2000:] if proc is not None else repr(exc)}
        foreign = busy_ticks() - busy0 - (sum(os.times()[2:4]) - own0) * CLK_TCK
        out[lib]["other_cores"] = round(max(0, foreign) / CLK_TCK / (time.perf_counter() - t0), 2)
    out["cpu"] = out["numpy"].get("cpu", "?")
    out["cgroup_cpu_quota"] = out["numpy"].get("cgroup_cpu_quota")
    return out


def peak_gflops(probe: dict, lib: str, dtype: str = "float32") -> float:
    """The measured GEMM peak of ``lib`` ("numpy" or "torch") in ``dtype`` (nan if missing)."""
    try:
        return float(probe[lib]["peak"][dtype]["gflops"])
    except (KeyError, TypeError):
        return math.nan


def _pools(info: dict, skip: frozenset[str] = frozenset()) -> str:
    pools = info.get("threadpools")
    if not isinstance(pools, list):
        return str(pools)
    keys = ("internal_api", "version", "architecture")
    return ", ".join(" ".join(str(p[k]) for k in keys if p[k] is not None)
                     + f" {p['num_threads']} threads" for p in pools if p["filepath"] not in skip) or "none"  # fmt: skip


def probe_lines(p: dict) -> list[str]:
    """The header lines of :func:`probe_machine`'s record."""
    quota, np_i, t_i = p["cgroup_cpu_quota"], p["numpy"], p["torch"]
    np_pools = np_i.get("threadpools")
    np_files = frozenset(d["filepath"] for d in np_pools if isinstance(np_pools, list))
    env = ", ".join(f"{k}={v or 'unset'}" for k, v in p["env"].items())
    lines = [
        f"cpu      {p['cpu']}; logical CPUs: {p['affinity']} usable (affinity), "
        f"os.cpu_count {p['cpu_count']}; cgroup quota " + (f"{quota:g} CPUs" if quota else "none"),
        f"threads  torch {t_i.get('num_threads')}, Numba {np_i.get('numba_threads')}; {env}",
        f"NumPy    {np_i.get('version')}: {_pools(np_i)}",
        f"torch    {t_i.get('version')}: BLAS {t_i.get('blas')}, {t_i.get('onednn')}, "
        f"CPU capability {t_i.get('cpu_capability')}; threadpoolctl (besides NumPy's): "
        f"{_pools(t_i, np_files)}",
    ]
    for lib, name in (("torch", "torch.mm"), ("numpy", "numpy.matmul")):
        info = p[lib]
        if "error" in info:
            lines.append(f"peak     {name}: probe failed: {info['error'].strip()[-200:]}")
            continue
        for dt, pk in info["peak"].items():
            each = ", ".join(f"{k} {v['gflops']:.3g} ({v['runs']} runs)"
                             for k, v in pk["products"].items())  # fmt: skip
            # float16 is shown, not used: on a CPU without float16 arithmetic its speed varies
            # several-fold with the sizes, so one product's figure is no peak
            note = "" if dt == "float32" else "; not a peak: the fractions use float32's"
            lines.append(f"peak     {name} {dt}: {pk['gflops']:.3g} GFLOP/s measured (median per "
                         f"product: {each}; its own process, other processes used "
                         f"{info['other_cores']} cores meanwhile{note})")  # fmt: skip
    return lines


def machine(tinfo: dict, linfo: dict, probe: dict) -> dict:
    """The run's machine record: this process's facts, each worker's ``info`` answer and the
    probe children's (``probe_machine``)."""
    return {
        "date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        **{k: probe[k] for k in ("cpu", "cpu_count", "affinity", "cgroup_cpu_quota")},
        "loadavg_start": os.getloadavg(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "env": {k: os.environ.get(k) for k in ENV_KEYS},
        "git": git_state(),
        "probe": probe,
        "peak_gflops": {
            f"{lib}_{dt}": pk["gflops"]
            for lib in ("numpy", "torch")
            for dt, pk in probe[lib].get("peak", {}).items()
        },  # fmt: skip
        "torch_worker": tinfo,
        "lstmgrad_worker": linfo,
    }


def rel_err(got: Any, want: Any) -> float:
    """max|got - want| / max|want| (inf on a shape mismatch, a non-finite value or one side
    None; 0 when both are None)."""
    if got is None or want is None:
        return 0.0 if got is want else math.inf
    a, b = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    if a.shape != b.shape or not np.all(np.isfinite(a)):
        return math.inf
    if a.size == 0:
        return 0.0
    return float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(b))), np.finfo(np.float64).tiny))


def med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else math.nan


if __name__ == "__main__":  # probe child: python _machine.py probe numpy|torch [dtype ...]
    if len(sys.argv) < 3 or sys.argv[1] != "probe" or sys.argv[2] not in ("numpy", "torch"):
        raise SystemExit("usage: python _machine.py probe numpy|torch [float32] [float16]")
    from lstmgrad.bench import probe

    print(json.dumps(probe(sys.argv[2], tuple(sys.argv[3:]) or ("float32",), 1.0, 15)))
