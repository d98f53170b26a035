"""``lstmgrad bench``: lstmgrad against torch.nn.LSTM on this machine, without the repository.

Both sides run in this process (the repository's benchmarks/ give each its own). Per shape: a
warm-up (Numba compiles or loads its kernels on the first call), then ``rounds`` rounds timing
the backward alone (each after an untimed forward: lstmgrad's ``lstm_backward`` of a fresh
``lstm_forward``'s saved activations, torch's ``torch.autograd.backward`` of (y, h_n, c_n)) and
forward + backward, as batches interleaved torch, lstmgrad / lstmgrad, torch, each followed by
a pause so that the idle library's threads go to sleep. Reported: medians over rounds, the
median of the per-round ratios torch ms / lstmgrad ms, and GEMM GFLOP/s against a peak
measured here.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ..core.errors import torch_missing
from ..core.machine import _cgroup_cpus, cpu_model
from .shapes import lstm_flops

Dims = tuple[int, int, int, int, int, int]  # T, B, I, H, L, D
DEFAULT_SHAPES = ("med-3", "small-2", "large-1")  # names of lstmgrad.tools.shapes.SHAPES
PEAK_GEMMS = ((2048, 1024, 1024), (3200, 1024, 1024))  # [M, K] x [K, N], float32
# float16: smaller, because a CPU without float16 arithmetic runs it ~100x slower
PEAK_GEMMS_F16 = ((256, 1024, 1024),)
PEAK_BUDGET_S = 0.5  # per library
BATCH_S = 0.05  # aimed seconds of one batch: its reps are chosen from the warm-up
PAUSE_S = 0.1  # after each batch
ENV_KEYS = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS")


class TorchMissing(RuntimeError):
    """PyTorch is not installed: the benchmark has nothing to compare with."""


def flops(dims: Dims, part: str) -> int:
    """GEMM FLOPs of the "backward" (16*T*B*H*(H + I_l) per layer and direction) or the
    "forward" (8*T*B*H*(H + I_l)); I_l = I for layer 0, D*H above."""
    t, b, i, h, n_layers, d = dims
    return lstm_flops(t * b, i, h, n_layers, d, part)


def gemm_peak(
    lib: str, dtype: str = "float32", budget_s: float = PEAK_BUDGET_S, max_runs: int = 10
) -> dict[str, Any]:
    """GFLOP/s of ``lib``'s GEMM ("torch": torch.mm, "numpy": numpy.matmul) into a preallocated
    output, per product of PEAK_GEMMS (PEAK_GEMMS_F16 in float16): the median of at most
    ``max_runs`` runs after a warm-up, ``budget_s`` seconds for all products (at least one run
    each). ``gflops`` is the best product's."""
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
        t0 = time.perf_counter()
        mm(a, b, out=c)  # warm-up: thread pool start, packing buffers
        if time.perf_counter() - t0 < budget_s / 20:  # a second one where it is cheap
            mm(a, b, out=c)
        end, ts = time.perf_counter() + budget_s / len(gemms), list[float]()
        while not ts or (len(ts) < max_runs and time.perf_counter() < end):
            t0 = time.perf_counter()
            mm(a, b, out=c)
            ts.append(time.perf_counter() - t0)
        products[f"{m}x{k}x{n}"] = {"gflops": 2 * m * k * n / statistics.median(ts) / 1e9,
                                    "runs": len(ts)}  # fmt: skip
        time.sleep(PAUSE_S)  # the pool's threads go to sleep before the next measurement
    best = max(v["gflops"] for v in products.values())
    return {"lib": lib, "dtype": dtype, "gflops": best, "products": products}


def threadpools() -> list[dict[str, Any]] | str:
    """The BLAS and OpenMP libraries threadpoolctl sees in this process (optional import)."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return "threadpoolctl not installed"
    keys = ("user_api", "internal_api", "prefix", "version", "architecture", "num_threads")
    return [{k: p.get(k) for k in (*keys, "filepath")} for p in threadpool_info()]


def probe(
    lib: str, dtypes: tuple[str, ...] = ("float32",), budget_s: float = PEAK_BUDGET_S,
    max_runs: int = 10,
) -> dict[str, Any]:  # fmt: skip
    """Version, threads, thread pools and GEMM peaks (:func:`gemm_peak`, per dtype) of ``lib``
    ("numpy" or "torch") in this process; with "numpy" also Numba's version and threads, the CPU
    model and the cgroup quota. Imports ``lib``."""
    out: dict[str, Any] = {"lib": lib, "version": np.__version__}
    if lib == "torch":
        import torch

        cfg = torch.__config__.show().splitlines()
        blas = next(
            (ln.split("BLAS_INFO=")[1].split(",")[0] for ln in cfg if "BLAS_INFO=" in ln), "?"
        )
        onednn = next((ln.strip("- ").split(" (Git")[0] for ln in cfg if "MKL-DNN" in ln), "?")
        out.update(version=torch.__version__, num_threads=torch.get_num_threads(), blas=blas,
                   onednn=onednn, cpu_capability=torch.backends.cpu.get_cpu_capability())  # fmt: skip
    out["peak"] = {dt: gemm_peak(lib, dt, budget_s, max_runs) for dt in dtypes}
    out["threadpools"] = threadpools()
    if lib == "numpy":  # after the GEMMs: asking Numba its thread count starts its pool
        import numba

        out.update(numba=numba.__version__, numba_threads=numba.get_num_threads())
        out.update(cpu=cpu_model(), cgroup_cpu_quota=_cgroup_cpus())
    return out


def machine() -> dict[str, Any]:
    """CPU, cores, threads, BLAS / OpenMP libraries and the GEMM peaks measured in-process."""
    t, n = probe("torch"), probe("numpy")
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    return {
        "cpu": n["cpu"], "cpu_count": os.cpu_count(), "affinity": affinity,
        "cgroup_cpu_quota": n["cgroup_cpu_quota"], "python": platform.python_version(),
        "torch": t["version"], "torch_threads": t["num_threads"], "numpy": n["version"],
        "numba": n["numba"], "numba_threads": n["numba_threads"], "threadpools": n["threadpools"],
        "env": {k: os.environ.get(k) for k in ENV_KEYS},
        "peak_gflops": {f"{p['lib']}_float32": p["peak"]["float32"]["gflops"] for p in (t, n)},
        "peak_note": "median of each product, measured in this process",
    }  # fmt: skip


def _time(timed: Callable[[Any], Any], untimed: Callable[[], Any], n: int) -> float:
    """Median seconds of ``n`` reps of ``timed(untimed())``, the untimed part outside."""
    ts = []
    for _ in range(n):
        state = untimed()
        t0 = time.perf_counter()
        timed(state)
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def _items(torch: Any, lstmgrad: Any, dims: Dims, dtype: str, inp: str) -> tuple[dict, str]:
    """{(side, item): (timed, untimed)} of one shape, and torch's path ("oneDNN"/"native")."""
    t, b, i, h, n_layers, d = dims
    kw = {"num_layers": n_layers, "bidirectional": d == 2}
    tdt = getattr(torch, dtype)
    lstm = torch.nn.LSTM(i, h, **kw, dtype=tdt)
    rng, state = np.random.default_rng(0), (n_layers * d, b, h)
    sizes = {"x": (t, b, i), "dy": (t, b, d * h), "h0": state, "c0": state, "dh": state}
    arr = {k: rng.standard_normal(v).astype(dtype) for k, v in (sizes | {"dc": state}).items()}
    params = [w.detach().numpy().copy() for w in lstm._flat_weights]
    tt = {k: torch.from_numpy(v.copy()) for k, v in arr.items()}
    for k in ("x", "h0", "c0"):
        tt[k].requires_grad_(True)
    leaves = [tt["x"], tt["h0"], tt["c0"], *lstm._flat_weights]

    def clear() -> None:
        for p in leaves:
            p.grad = None

    def t_fwd() -> tuple:
        y, (hn, cn) = lstm(tt["x"], (tt["h0"], tt["c0"]))
        return y, hn, cn

    def t_fresh() -> tuple:
        clear()
        return t_fwd()

    def t_bwd(out: tuple) -> None:
        torch.autograd.backward(list(out), [tt["dy"], tt["dh"], tt["dc"]])

    if inp == "tensors":  # over the same memory: lstmgrad's GEMMs then run on torch's
        lg = {k: torch.from_numpy(v) for k, v in arr.items()}
        lp = [torch.from_numpy(p) for p in params]
    else:
        lg, lp = arr, params

    def l_fwd() -> Any:
        return lstmgrad.lstm_forward(lg["x"], lp, [lg["h0"], lg["c0"]], train=True, **kw)

    def l_bwd(saved: Any) -> None:
        hx = [lg["h0"], lg["c0"]]
        lstmgrad.lstm_backward(lg["x"], hx, lp, lg["dy"], lg["dh"], lg["dc"], *saved[:7], **kw)

    return {
        ("torch", "bwd"): (t_bwd, t_fresh),
        ("lstmgrad", "bwd"): (l_bwd, lambda: l_fwd().saved),
        ("torch", "fwdbwd"): (lambda _: t_bwd(t_fwd()), clear),
        ("lstmgrad", "fwdbwd"): (lambda _: l_bwd(l_fwd().saved), lambda: None),
    }, _torch_path(t_fwd()[0])


def _torch_path(y: Any) -> str:
    """Torch's path: "oneDNN" iff the autograd graph of ``y`` holds oneDNN's RNN node."""
    seen, todo = set(), [y.grad_fn]
    while todo:
        fn = todo.pop()
        if fn is not None and fn not in seen:
            if "Mkldnn" in fn.name():
                return "oneDNN"
            seen.add(fn)
            todo += [f for f, _ in fn.next_functions]
    return "native"


def _busy_s() -> float:
    """Busy CPU seconds of all CPUs since boot (every /proc/stat field but idle and iowait)."""
    try:
        v = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    except (OSError, ValueError):
        return 0.0
    return (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")


def gemm_library(inp: str) -> str:
    """The library of lstmgrad's GEMMs: NumPy's BLAS for arrays, torch's for tensors."""
    return "numpy" if inp == "numpy" else "torch"


def bench_shape(
    torch: Any, name: str, dims: Dims, dtype: str, inp: str, rounds: int, peak: dict
) -> dict[str, Any]:
    """One shape: warm-up, ``rounds`` interleaved rounds, medians, ratios and GFLOP/s."""
    import lstmgrad

    items, path = _items(torch, lstmgrad, dims, dtype, inp)
    reps = {}
    for key, (timed, untimed) in items.items():  # the first call compiles: never timed
        _time(timed, untimed, 1)
        reps[key] = max(1, min(50, round(BATCH_S / max(_time(timed, untimed, 1), 1e-6))))
        time.sleep(PAUSE_S)
    ms: dict[tuple[str, str], list[float]] = {k: [] for k in items}
    t0, busy0, own0 = time.perf_counter(), _busy_s(), sum(os.times()[:2])
    for r in range(rounds):
        for item in ("bwd", "fwdbwd"):
            for side in ("torch", "lstmgrad")[:: 1 if r % 2 == 0 else -1]:
                timed, untimed = items[side, item]
                ms[side, item].append(1e3 * _time(timed, untimed, reps[side, item]))
                time.sleep(PAUSE_S)
    # other processes' CPU use during the rounds: a busy machine makes the figures a draw
    other = _busy_s() - busy0 - (sum(os.times()[:2]) - own0)
    # float32 also for float16: lstmgrad's compute dtype; torch's float16 GEMMs have no peak
    # worth the name on CPUs without float16 arithmetic (their speed varies with the sizes)
    peaks = {"torch": peak["torch_float32"], "lstmgrad": peak[f"{gemm_library(inp)}_float32"]}
    out: dict[str, Any] = {"shape": name, "dims": dict(zip("TBIHLD", dims, strict=True))}
    out.update(torch_path=path, peak_gflops=peaks)
    out["other_cores"] = round(max(0.0, other) / (time.perf_counter() - t0), 2)
    f_bwd, f_fwd = flops(dims, "backward"), flops(dims, "forward")
    for item, f in (("bwd", f_bwd), ("fwdbwd", f_bwd + f_fwd)):
        ratios = [a / b for a, b in zip(ms["torch", item], ms["lstmgrad", item], strict=True)]
        res: dict[str, Any] = {"flops": f, "ratio": statistics.median(ratios)}
        res.update(ratio_min=min(ratios), ratio_max=max(ratios), ratio_round=ratios)
        for side in ("torch", "lstmgrad"):
            med, gf = statistics.median(ms[side, item]), f / statistics.median(ms[side, item]) / 1e6
            res |= {f"{side}_ms": med, f"{side}_ms_round": ms[side, item], f"{side}_gflops": gf}
            res |= {f"{side}_peak_frac": gf / peaks[side], f"{side}_reps": reps[side, item]}
        out[item] = res
    return out


def run(
    shapes: dict[str, Dims], dtype: str = "float32", rounds: int = 5, inp: str = "tensors",
    progress: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """The benchmark's record: ``machine``, ``config`` and ``results`` (one per shape).
    ``progress`` gets the record once the machine is measured and after each shape. Raises
    TorchMissing without PyTorch."""
    try:
        import torch
    except ImportError as exc:
        raise TorchMissing(str(torch_missing("lstmgrad bench"))) from exc
    say = progress or (lambda _: None)
    config = {"dtype": dtype, "rounds": rounds, "input": inp, "batch_s": BATCH_S}
    doc: dict[str, Any] = {"machine": machine(), "config": config, "results": []}
    say(doc)
    from ..planning.plan import eager

    for name, dims in shapes.items():
        with eager():  # the plans measured in the warm-up, as `lstmgrad tune` would
            res = bench_shape(torch, name, dims, dtype, inp, rounds,
                              doc["machine"]["peak_gflops"])  # fmt: skip
        doc["results"].append(res)
        say(doc)
    return doc


def plot(doc: dict[str, Any], path: str) -> None:
    """A bar chart of the speedups of ``doc`` (what :func:`run` returns) written to ``path``.
    Raises ImportError without matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r["shape"] for r in doc["results"]]
    fig, ax = plt.subplots(figsize=(max(4.0, 1.2 * len(names) + 2), 3.5))
    width = 0.38
    for k, (item, label) in enumerate((("bwd", "backward"), ("fwdbwd", "forward + backward"))):
        xs = [j + (k - 0.5) * width for j in range(len(names))]
        ax.bar(xs, [r[item]["ratio"] for r in doc["results"]], width, label=label)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel("speedup over torch.nn.LSTM")
    m = doc["machine"]
    ax.set_title(f"lstmgrad bench, {doc['config']['dtype']}: {m.get('cpu', '')}", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
