"""``lstmgrad bench``: a quick side-by-side benchmark of lstmgrad and torch.nn.LSTM on this
machine, without the repository (whose benchmarks/ run each side in its own process).

Per shape, both sides in this process: a warm-up (Numba compiles or loads its kernels on the
first call, oneDNN creates its primitives), then ``rounds`` rounds in which the backward alone
and the forward + backward of each side are timed as batches, interleaved torch, lstmgrad in
even rounds and lstmgrad, torch in odd ones, with a short pause after each batch so that the
idle library's spinning threads go to sleep. lstmgrad's backward is ``lstm_backward`` from the
saved activations of one ``lstm_forward``; torch's is ``torch.autograd.backward`` of the
outputs (y, h_n, c_n) with the same gradients after an untimed forward. A batch's value is the
median of its reps; reported: medians over rounds and the median of the per-round ratios torch
ms / lstmgrad ms (> 1: lstmgrad faster), GEMM GFLOP/s and their fraction of the GEMM peak
measured here, in this process, before the shapes.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

Dims = tuple[int, int, int, int, int, int]  # T, B, I, H, L, D
SHAPES: dict[str, Dims] = {
    "med-3": (100, 32, 256, 256, 1, 1),
    "small-2": (200, 8, 128, 128, 1, 2),
    "large-1": (50, 16, 1024, 1024, 1, 1),
}
DEFAULT_SHAPES = ("med-3", "small-2", "large-1")
PEAK_GEMMS = ((2048, 1024, 1024), (3200, 1024, 1024))  # [M, K] x [K, N], float32
PEAK_GEMM_F16 = (256, 1024, 1024)  # smaller: CPUs without float16 arithmetic run it ~100x slower
PEAK_BUDGET_S = 0.5  # per library and dtype
BATCH_S = 0.05  # aimed seconds of one batch: its reps are chosen from the warm-up
PAUSE_S = 0.1  # after each batch
ENV_KEYS = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS")
TORCH_MISSING = "lstmgrad bench needs PyTorch: pip install torch"


class TorchMissing(RuntimeError):
    """PyTorch is not installed: the benchmark has nothing to compare with."""


def parse_shape(text: str) -> Dims:
    """``"T,B,I,H,L,D"`` as six positive integers, D 1 or 2 (ValueError otherwise)."""
    v = tuple(int(s) for s in text.split(","))
    if len(v) != 6 or min(v) < 1 or v[5] not in (1, 2):
        raise ValueError(f"expected T,B,I,H,L,D (positive integers, D 1 or 2), got {text!r}")
    return v  # type: ignore[return-value]


def flops(dims: Dims, part: str) -> int:
    """GEMM FLOPs of the "backward" (16*T*B*H*(H + I_l) per layer and direction) or the
    "forward" (8*T*B*H*(H + I_l)); I_l = I for layer 0, D*H above."""
    t, b, i, h, n_layers, d = dims
    per = 16 if part == "backward" else 8
    return sum(d * per * t * b * h * (h + (i if k == 0 else d * h)) for k in range(n_layers))


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or "?"


def _cpu_quota() -> float | None:
    """CPUs granted by the cgroup's CFS quota (v2 or v1), None when unlimited or unreadable."""
    for quota, period in (("cpu.max", None), ("cpu/cpu.cfs_quota_us", "cpu/cpu.cfs_period_us")):
        try:
            fields = Path(f"/sys/fs/cgroup/{quota}").read_text().split()
            fields += Path(f"/sys/fs/cgroup/{period}").read_text().split() if period else []
            return None if fields[0] in ("max", "-1") else int(fields[0]) / int(fields[1])
        except (OSError, ValueError, IndexError):
            continue
    return None


def gemm_peak(torch: Any, lib: str, dtype: str = "float32") -> float:
    """Median GFLOP/s of the best PEAK_GEMMS product (PEAK_GEMM_F16 in float16) with ``lib``
    ("torch": torch.mm, "numpy": numpy.matmul) into a preallocated output, after a warm-up."""
    best = 0.0
    gemms = (PEAK_GEMM_F16,) if dtype == "float16" else PEAK_GEMMS
    for m, k, n in gemms:
        a, b, c = (np.ones(s, dtype) for s in ((m, k), (k, n), (m, n)))
        if lib == "torch":
            a, b, c = (torch.from_numpy(v) for v in (a, b, c))

        def mm(a: Any = a, b: Any = b, c: Any = c) -> None:
            (torch.mm if lib == "torch" else np.matmul)(a, b, out=c)

        mm()
        end, ts = time.perf_counter() + PEAK_BUDGET_S / len(gemms), list[float]()
        while not ts or (len(ts) < 10 and time.perf_counter() < end):
            t0 = time.perf_counter()
            mm()
            ts.append(time.perf_counter() - t0)
        best = max(best, 2 * m * k * n / statistics.median(ts) / 1e9)
        time.sleep(PAUSE_S)
    return best


def machine(torch: Any, dtype: str) -> dict[str, Any]:
    """CPU, cores, threads, BLAS / OpenMP libraries and the GEMM peaks measured in-process."""
    import numba

    try:
        from threadpoolctl import threadpool_info

        keys = ("internal_api", "version", "architecture", "num_threads", "filepath")
        pools: Any = [{k: p.get(k) for k in keys} for p in threadpool_info()]
    except ImportError:
        pools = "threadpoolctl not installed"
    peak = {f"{lib}_float32": gemm_peak(torch, lib) for lib in ("torch", "numpy")}
    if dtype == "float16":
        peak["torch_float16"] = gemm_peak(torch, "torch", "float16")
    return {
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "cgroup_cpu_quota": _cpu_quota(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "numpy": np.__version__,
        "numba": numba.__version__,
        "numba_threads": numba.get_num_threads(),
        "threadpools": pools,
        "env": {k: os.environ.get(k) for k in ENV_KEYS},
        "peak_gflops": peak,
        "peak_note": "measured in this process (torch and NumPy thread pools side by side)",
    }


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
    rng = np.random.default_rng(0)
    arr = {
        k: rng.standard_normal(s).astype(dtype)
        for k, s in (("x", (t, b, i)), ("dy", (t, b, d * h)))
        + tuple((k, (n_layers * d, b, h)) for k in ("h0", "c0", "dh", "dc"))
    }
    params = [w.detach().numpy().copy() for w in lstm._flat_weights]
    tt = {k: torch.from_numpy(v.copy()) for k, v in arr.items()}
    for k in ("x", "h0", "c0"):
        tt[k].requires_grad_(True)
    leaves = [tt["x"], tt["h0"], tt["c0"], *lstm._flat_weights]

    def t_fwd() -> tuple:
        for p in leaves:
            p.grad = None
        y, (hn, cn) = lstm(tt["x"], (tt["h0"], tt["c0"]))
        return y, hn, cn

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

    saved = l_fwd().saved
    return {
        ("torch", "bwd"): (t_bwd, t_fwd),
        ("lstmgrad", "bwd"): (l_bwd, lambda: saved),
        ("torch", "fwdbwd"): (lambda _: t_bwd(t_fwd()), lambda: None),
        ("lstmgrad", "fwdbwd"): (lambda _: l_bwd(l_fwd().saved), lambda: None),
    }, _torch_path(t_fwd()[0])


def _torch_path(y: Any) -> str:
    """ "oneDNN" iff torch's autograd graph of ``y`` holds a node of oneDNN's RNN, else "native"."""
    seen, todo = set(), [y.grad_fn]
    while todo:
        fn = todo.pop()
        if fn is not None and fn not in seen:
            if "Mkldnn" in fn.name():
                return "oneDNN"
            seen.add(fn)
            todo += [f for f, _ in fn.next_functions]
    return "native"


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
    for r in range(rounds):
        for item in ("bwd", "fwdbwd"):
            for side in ("torch", "lstmgrad")[:: 1 if r % 2 == 0 else -1]:
                timed, untimed = items[side, item]
                ms[side, item].append(1e3 * _time(timed, untimed, reps[side, item]))
                time.sleep(PAUSE_S)
    peaks = {
        "torch": peak[f"torch_{dtype}"],
        "lstmgrad": peak["numpy_float32" if inp == "numpy" else "torch_float32"],
    }  # lstmgrad computes float16 in float32
    out: dict[str, Any] = {"shape": name, "dims": dict(zip("TBIHLD", dims, strict=True))}
    out.update(torch_path=path, peak_gflops=peaks)
    f_bwd, f_fwd = flops(dims, "backward"), flops(dims, "forward")
    for item, f in (("bwd", f_bwd), ("fwdbwd", f_bwd + f_fwd)):
        ratios = [a / b for a, b in zip(ms["torch", item], ms["lstmgrad", item], strict=True)]
        res: dict[str, Any] = {"flops": f, "ratio": statistics.median(ratios)}
        res.update(ratio_min=min(ratios), ratio_max=max(ratios), ratio_round=ratios)
        for side in ("torch", "lstmgrad"):
            med = statistics.median(ms[side, item])
            res[f"{side}_ms"], res[f"{side}_ms_round"] = med, ms[side, item]
            res[f"{side}_gflops"] = f / med / 1e6
            res[f"{side}_peak_frac"] = f / med / 1e6 / peaks[side]
            res[f"{side}_reps"] = reps[side, item]
        out[item] = res
    return out


def run(
    shapes: dict[str, Dims],
    dtype: str = "float32",
    rounds: int = 5,
    inp: str = "tensors",
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """The benchmark: machine header, then each shape; ``progress`` gets the header lines and
    a line per shape as they come. Raises TorchMissing without PyTorch."""
    try:
        import torch
    except ImportError as exc:
        raise TorchMissing(TORCH_MISSING) from exc
    say = progress or (lambda _: None)
    config = {"dtype": dtype, "rounds": rounds, "input": inp, "batch_s": BATCH_S}
    doc: dict[str, Any] = {"machine": machine(torch, dtype), "config": config, "results": []}
    for line in header_lines(doc):
        say(line)
    for name, dims in shapes.items():
        res = bench_shape(torch, name, dims, dtype, inp, rounds, doc["machine"]["peak_gflops"])
        doc["results"].append(res)
        say(f"  {name}: backward {res['bwd']['ratio']:.2f}x, fwd+bwd {res['fwdbwd']['ratio']:.2f}x")
    return doc


def header_lines(doc: dict[str, Any]) -> list[str]:
    m, c = doc["machine"], doc["config"]
    pools = m["threadpools"]
    if isinstance(pools, list):
        pools = ", ".join(
            " ".join(str(p[k]) for k in ("internal_api", "version", "architecture") if p[k])
            + f" {p['num_threads']} threads"
            for p in pools
        )
    quota = m["cgroup_cpu_quota"]
    env = ", ".join(f"{k}={v}" for k, v in m["env"].items() if v is not None) or "none set"
    peak = ", ".join(f"{k.replace('_', ' ')} {v:.3g}" for k, v in m["peak_gflops"].items())
    return [
        f"cpu      {m['cpu']}; {m['affinity']} logical CPUs usable (os.cpu_count {m['cpu_count']})"
        f", cgroup quota {f'{quota:g} CPUs' if quota else 'none'}",
        f"threads  torch {m['torch']} {m['torch_threads']}, Numba {m['numba']} "
        f"{m['numba_threads']}; BLAS/OpenMP: {pools}; env: {env}",
        f"peak     GEMM GFLOP/s {peak} ({m['peak_note']})",
        f"run      {c['dtype']}, lstmgrad given {c['input']}, {c['rounds']} rounds",
    ]


def report(doc: dict[str, Any]) -> str:
    """The tables: per item, both sides' ms, the speedup and GFLOP/s (% of peak)."""
    c, pk = doc["config"], doc["machine"]["peak_gflops"]
    lg_lib = "numpy" if c["input"] == "numpy" else "torch"
    t_peak, lg_peak = pk[f"torch_{c['dtype']}"], pk[f"{lg_lib}_float32"]
    out = [
        "",
        "GFLOP/s: GEMM FLOPs per second; (%): of the measured GEMM peak of the side's library, "
        f"torch.mm {t_peak:.3g} ({c['dtype']}) for torch, {lg_lib} {lg_peak:.3g} (float32, its "
        "compute dtype) for lstmgrad",
    ]
    for item, title in (("bwd", "Backward alone"), ("fwdbwd", "Forward + backward")):
        head = ["shape", "T B I H L D", "torch path", "torch ms", "lstmgrad ms", "speedup"]
        head += ["torch GFLOP/s", "lstmgrad GFLOP/s"]
        rows = [head]
        for res in doc["results"]:
            r = res[item]
            rows.append([
                res["shape"], " ".join(str(v) for v in res["dims"].values()), res["torch_path"],
                f"{r['torch_ms']:.3g}", f"{r['lstmgrad_ms']:.3g}",
                f"{r['ratio']:.2f}x [{r['ratio_min']:.2f}-{r['ratio_max']:.2f}]",
                *(f"{r[f'{s}_gflops']:.3g} ({100 * r[f'{s}_peak_frac']:.0f}%)"
                  for s in ("torch", "lstmgrad")),
            ])  # fmt: skip
        w = [max(len(row[k]) for row in rows) for k in range(len(head))]
        out += ["", f"{title} (speedup = median of per-round torch ms / lstmgrad ms)"]
        out += ["  ".join(v.ljust(w[k]) for k, v in enumerate(row)).rstrip() for row in rows]
    return "\n".join(out[1:])


def save_json(doc: dict[str, Any], path: str | Path) -> None:
    Path(path).write_text(json.dumps(doc, indent=1))
