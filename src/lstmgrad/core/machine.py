"""What the machine in use offers: the CPUs this process may run on, the threads each library
will use, and a fingerprint of the machine and library versions (the key of the tuning cache).

Everything here is read at run time; nothing about a particular CPU is written in the code.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import sys
import time
from typing import Any


@functools.lru_cache(maxsize=1)
def _cgroup_cpus() -> float | None:
    """The cgroup (v2, else v1) CPU quota in CPUs, or None where there is none."""
    try:
        with open("/sys/fs/cgroup/cpu.max") as f:
            quota, period = f.read().split()[:2]
        if quota != "max":
            return int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        with open("/sys/fs/cgroup/cpu/cpu.cfs_quota_us") as f:
            quota_us = int(f.read())
        with open("/sys/fs/cgroup/cpu/cpu.cfs_period_us") as f:
            period_us = int(f.read())
        if quota_us > 0 and period_us > 0:
            return quota_us / period_us
    except (OSError, ValueError):
        pass
    return None


def _read_int(path: str) -> int | None:
    """An integer file (cgroup or /proc), None where absent, unreadable or "max"."""
    try:
        with open(path) as f:
            text = f.read().strip()
        return None if text == "max" else int(text)
    except (OSError, ValueError):
        return None


def available_memory() -> int | None:
    """Bytes of memory this process can still get, read now: the kernel's MemAvailable
    (/proc/meminfo, else free pages from sysconf), lowered to what the cgroup's limit leaves
    (v2 memory.max - memory.current, else v1 limit_in_bytes - usage_in_bytes). None where
    nothing can be read."""
    avail = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError):
        pass
    if avail is None:
        try:
            avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, AttributeError):
            avail = None
    for limit_file, usage_file in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        (
            "/sys/fs/cgroup/memory/memory.limit_in_bytes",
            "/sys/fs/cgroup/memory/memory.usage_in_bytes",
        ),
    ):
        limit, usage = _read_int(limit_file), _read_int(usage_file)
        if limit is not None and usage is not None and limit < 1 << 60:  # v1 "no limit" is huge
            left = max(limit - usage, 0)
            avail = left if avail is None else min(avail, left)
            break
    return avail


def visible_cpus() -> int:
    """CPUs this process may use: its affinity mask (taskset, cpusets), capped by a cgroup CPU
    quota (containers), at least 1."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    quota = _cgroup_cpus()
    if quota is not None:
        n = min(n, max(1, int(quota)))
    return max(1, n)


@functools.lru_cache(maxsize=1)
def core_cache_bytes() -> int | None:
    """Bytes of the largest cache one core has to itself (its L2, where the L3 is shared; the
    core's hyperthreads may share it), from sysfs; None where it cannot be read."""
    root = "/sys/devices/system/cpu/cpu0/cache"
    best = None
    own = {"0"}
    try:
        with open("/sys/devices/system/cpu/cpu0/topology/thread_siblings_list") as f:
            own.add(f.read().strip())
    except OSError:
        pass
    try:
        for name in sorted(n for n in os.listdir(root) if n.startswith("index")):
            d = os.path.join(root, name)
            with open(os.path.join(d, "type")) as f:
                kind = f.read().strip()
            with open(os.path.join(d, "shared_cpu_list")) as f:
                shared = f.read().strip()
            with open(os.path.join(d, "size")) as f:
                size = f.read().strip()
            if kind == "Instruction" or shared not in own:  # shared with other cores
                continue
            units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
            n = int(size[:-1]) * units[size[-1]] if size[-1] in units else int(size)
            best = max(best or 0, n)
    except (OSError, ValueError):
        return None
    return best


def _cpus_busy_seconds() -> float | None:
    """Busy seconds of all CPUs since boot (/proc/stat: every field but idle and iowait, steal
    included); None where it cannot be read."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:9]]
        return (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def cpu_clock() -> tuple[float, float | None, float]:
    """A reading for :func:`others_cpus`: (wall seconds, all CPUs' busy seconds, this process's
    CPU seconds)."""
    own = os.times()
    return time.perf_counter(), _cpus_busy_seconds(), own.user + own.system


def others_cpus(start: tuple[float, float | None, float]) -> float:
    """CPUs other processes kept busy on average since ``start`` (:func:`cpu_clock`): all CPUs'
    busy time less this process's, over the wall time; an instant measure where the load
    average lags a minute behind. 0.0 where /proc/stat cannot be read."""
    wall, busy, own = cpu_clock()
    if busy is None or start[1] is None or wall <= start[0]:
        return 0.0
    return max(0.0, (busy - start[1]) - (own - start[2])) / (wall - start[0])


def _env_threads(*names: str) -> int | None:
    for name in names:
        value = os.environ.get(name, "").strip()
        if value:
            try:
                return max(1, int(value.split(",")[0]))
            except ValueError:
                continue
    return None


@functools.lru_cache(maxsize=1)
def blas_threads() -> int:
    """Threads NumPy's BLAS uses: what threadpoolctl reports where it is installed, else the
    environment's limit, else the visible CPUs (read once a process)."""
    try:
        from threadpoolctl import threadpool_info

        counts = [i["num_threads"] for i in threadpool_info() if i.get("user_api") == "blas"]
        if counts:
            return max(1, min(min(counts), visible_cpus()))
    except Exception:  # threadpoolctl missing or unable to read a library
        pass
    env = _env_threads("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS")
    return min(env or visible_cpus(), visible_cpus())


def torch_threads() -> int:
    """torch.get_num_threads() (torch.set_num_threads, OMP_NUM_THREADS), capped by the visible
    CPUs; 1 where torch is not loaded."""
    torch = sys.modules.get("torch")
    if torch is None:
        return 1
    return max(1, min(torch.get_num_threads(), visible_cpus()))


def numba_threads() -> int:
    """Threads Numba may use in the calling thread (NUMBA_NUM_THREADS, numba.set_num_threads),
    capped by the visible CPUs (Numba's default counts every CPU of the machine)."""
    import numba

    return max(1, min(numba.get_num_threads(), visible_cpus()))


@functools.lru_cache(maxsize=1)
def cpu_model() -> str:
    """The CPU's model name as the OS reports it."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


@functools.lru_cache(maxsize=1)
def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def native_bfloat16() -> bool:
    """Whether the CPU multiplies bfloat16 in hardware (AVX512-BF16 or AMX-BF16; Linux's
    /proc/cpuinfo, False where it cannot be read)."""
    return bool({"avx512_bf16", "amx_bf16"} & set(_cpu_flags().split()))


def _version(name: str) -> str | None:
    module = sys.modules.get(name)
    return getattr(module, "__version__", None) if module is not None else None


def fingerprint(kind: str) -> dict[str, Any]:
    """The machine and library facts a measurement depends on, for the back end ``kind``
    ("numpy" or "torch")."""
    import numba
    import numpy as np

    from .. import __version__

    facts: dict[str, Any] = {
        "cpu": cpu_model(),
        "flags": hashlib.sha1(_cpu_flags().encode()).hexdigest()[:12],
        "visible_cpus": visible_cpus(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "lstmgrad": __version__,
        "numpy": np.__version__,
        "numba": numba.__version__,
        "numba_threads": numba_threads(),
        "kind": kind,
    }
    if kind == "torch":
        facts["torch"] = _version("torch")
        facts["torch_threads"] = torch_threads()
    else:
        facts["blas_threads"] = blas_threads()
    for var in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):
        if os.environ.get(var):
            facts[var] = os.environ[var]
    return facts


def fingerprint_key(facts: dict[str, Any]) -> str:
    """A short stable key of :func:`fingerprint`'s facts."""
    return hashlib.sha1(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:16]
