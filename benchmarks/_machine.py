"""What the benchmark parents (run.py, train_step.py) share: other processes' CPU use during a
batch, the machine and git facts of the header, and the error and summary statistics.

Imports NumPy only (the parents import neither torch nor lstmgrad). The header's library facts
and measured GEMM peak come from ``python _machine.py probe numpy|torch``: one child process per
library, so that one BLAS runtime's threads cannot disturb the other's measurement.
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
ENV_KEYS = (
    "OPENBLAS_CORETYPE",
    "OPENBLAS_L2_SIZE",
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


def git_state() -> dict:
    def git(*a: str) -> str:
        try:
            return subprocess.run(
                ["git", *a], cwd=ROOT, capture_output=True, text=True, timeout=10
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    return {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain", "src"))}


def _children_ticks() -> float:
    """CPU ticks of this process's waited-for children."""
    t = os.times()
    return (t.children_user + t.children_system) * CLK_TCK


def threadpools() -> list[dict] | str:
    """The BLAS and OpenMP libraries threadpoolctl sees in this process (optional import)."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return "threadpoolctl not installed"
    keys = ("user_api", "internal_api", "prefix", "version", "architecture", "num_threads")
    return [
        {k: d.get(k) for k in keys} | {"filepath": d.get("filepath")} for d in threadpool_info()
    ]


# float32 products of the measured GEMM peak, [M, K] x [K, N]
PEAK_GEMMS = ((2048, 1024, 1024), (3200, 1024, 1024))
# float16 products: smaller, because CPUs without float16 arithmetic run them ~100x slower
PEAK_GEMMS_F16 = ((256, 1024, 1024),)
PEAK_BUDGET_S = 1.0  # per library and dtype: timed runs stop past it (at least one per product)


def gemm_peak(lib: str, dtype: str = "float32", budget_s: float = PEAK_BUDGET_S) -> dict:
    """Median GFLOP/s of each product of PEAK_GEMMS (PEAK_GEMMS_F16 for float16) with ``lib``
    ("numpy": numpy.matmul, "torch": torch.mm) into a preallocated output, timed after a
    warm-up; ``gflops`` is the best product's median. Imports ``lib``: call it in a process of
    its own (see :func:`probe_machine`)."""
    rng = np.random.default_rng(0)
    mm: Any = np.matmul
    conv: Any = np.asarray
    if lib == "torch":
        import torch

        mm, conv = torch.mm, torch.from_numpy
    gemms = PEAK_GEMMS_F16 if dtype == "float16" else PEAK_GEMMS
    products = {}
    for m, k, n in gemms:
        a, b, c = (conv(rng.standard_normal(s).astype(dtype)) for s in ((m, k), (k, n), (m, n)))
        end = time.perf_counter() + budget_s / len(gemms)
        t0 = time.perf_counter()
        mm(a, b, out=c)  # warm-up: thread pool start, packing buffers
        if time.perf_counter() - t0 < budget_s / 20:
            mm(a, b, out=c)
        ts: list[float] = []
        while not ts or (len(ts) < 15 and time.perf_counter() < end):
            t0 = time.perf_counter()
            mm(a, b, out=c)
            ts.append(time.perf_counter() - t0)
        products[f"{m}x{k}x{n}"] = {
            "gflops": 2 * m * k * n / statistics.median(ts) / 1e9,
            "runs": len(ts),
        }
    best = max(v["gflops"] for v in products.values())
    return {"lib": lib, "dtype": dtype, "gflops": best, "products": products}


def _probe(lib: str, dtypes: list[str]) -> dict:
    """The probe child's answer: versions, threads, thread pools and GEMM peaks of ``lib``."""
    out: dict[str, Any] = {"lib": lib}
    if lib == "torch":
        import torch

        out["version"] = torch.__version__
        out["num_threads"] = torch.get_num_threads()
        cfg = torch.__config__.show()
        out["blas"] = next(
            (
                ln.split("BLAS_INFO=")[1].split(",")[0]
                for ln in cfg.splitlines()
                if "BLAS_INFO=" in ln
            ),
            "?",
        )
        out["onednn"] = next(
            (ln.strip("- ").split(" (Git")[0] for ln in cfg.splitlines() if "MKL-DNN" in ln), "?"
        )
        out["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    else:
        out["version"] = np.__version__
    out["peak"] = {dt: gemm_peak(lib, dt) for dt in dtypes}
    out["threadpools"] = threadpools()
    if lib == "numpy":  # after the GEMMs: asking Numba its thread count starts its pool
        import numba

        from lstmgrad.machine import _cgroup_cpus, cpu_model

        out.update(numba=numba.__version__, numba_threads=numba.get_num_threads())
        out.update(cpu=cpu_model(), cgroup_cpu_quota=_cgroup_cpus())
    return out


def probe_machine(dtype: str = "float32") -> dict:
    """CPU counts of this process and, from one child process per library (``python _machine.py
    probe LIB``), each library's versions, threads, thread pools and measured GEMM peak
    (float32, plus torch.mm in float16 when ``dtype`` is float16). A child that fails is
    recorded as ``{"error": ...}``."""
    out: dict[str, Any] = {
        "cpu_count": os.cpu_count(),
        "affinity": len(os.sched_getaffinity(0)),
        "env": {k: os.environ.get(k) for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")},
    }
    for lib in ("numpy", "torch"):
        dts = ["float32", "float16"] if lib == "torch" and dtype == "float16" else ["float32"]
        cmd = [sys.executable, str(Path(__file__).resolve()), "probe", lib, *dts]
        proc = None
        # other processes' CPU use meanwhile: all CPUs' busy ticks minus the child's own
        t0, busy0, own0 = time.perf_counter(), _system_busy_ticks(), _children_ticks()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
            out[lib] = json.loads(proc.stdout.strip().splitlines()[-1])
        except (OSError, subprocess.SubprocessError, ValueError, IndexError) as exc:
            out[lib] = {"error": proc.stderr[-2000:] if proc is not None else repr(exc)}
        foreign = _system_busy_ticks() - busy0 - (_children_ticks() - own0)
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
    seen = [
        " ".join(
            str(v) for v in (p["internal_api"], p["version"], p["architecture"]) if v is not None
        )
        + f" {p['num_threads']} threads"
        for p in pools
        if p["filepath"] not in skip
    ]
    return ", ".join(seen) or "none"


def probe_lines(p: dict) -> list[str]:
    """The header lines of :func:`probe_machine`'s record."""
    quota = p["cgroup_cpu_quota"]
    np_i, t_i = p["numpy"], p["torch"]
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
            each = ", ".join(
                f"{k} {v['gflops']:.3g} ({v['runs']} runs)" for k, v in pk["products"].items()
            )
            # float16 is shown, not used: on a CPU without float16 arithmetic its speed varies
            # several-fold with the sizes, so one product's figure is no peak
            note = "" if dt == "float32" else "; not a peak: the fractions use float32's"
            lines.append(
                f"peak     {name} {dt}: {pk['gflops']:.3g} GFLOP/s measured (median per product: "
                f"{each}; its own process, other processes used {info['other_cores']} cores "
                f"meanwhile{note})"
            )
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
        },
        "torch_worker": tinfo,
        "lstmgrad_worker": linfo,
    }


# --------------------------------------------------------------------------------------------
# statistics


def rel_err(got: Any, want: Any) -> float:
    """max|got - want| / max|want| (inf on a shape mismatch, a non-finite value or one side
    None; 0 when both are None)."""
    if got is None or want is None:
        return 0.0 if got is want else math.inf
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


def median_ms(fn: Any, reps: int) -> float:
    """Median wall time of ``reps`` calls of ``fn()``, in milliseconds."""
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


if __name__ == "__main__":  # probe child: python _machine.py probe numpy|torch [dtype ...]
    if len(sys.argv) < 3 or sys.argv[1] != "probe" or sys.argv[2] not in ("numpy", "torch"):
        raise SystemExit("usage: python _machine.py probe numpy|torch [float32] [float16]")
    print(json.dumps(_probe(sys.argv[2], sys.argv[3:] or ["float32"])))
