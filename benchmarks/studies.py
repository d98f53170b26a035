"""Focused measurements quoted in docs/performance.md, one subcommand each:

    python benchmarks/studies.py memory [--configs id,id] [--sides torch,lstmgrad,recompute]
                                        [--limit-gib G] [--threads N] [--table PATH]
    python benchmarks/studies.py memory --interleaved T [--rounds N] [--threads N]
    python benchmarks/studies.py scaling [--shapes med-3,large-1] [--rounds N]
    python benchmarks/studies.py lowp [--shapes med-3,small] [--modes f32,bf16,...] [--rounds N]
    python benchmarks/studies.py double-backward [--shape T,B,I,H,L] [--rounds N] [--dtype D]
    python benchmarks/studies.py precision
    python benchmarks/studies.py breakdown [--shapes id,id]

The timings run in one process (memory: one child process per configuration and side), the
compared sides taking turns within each round in an order rotated every round after a warm-up
round; a figure is the median over rounds, a ratio the median of the per-round ratios. Each
subcommand prints a table and writes its JSON to benchmarks/results/<subcommand>.json (--json).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _machine import rel_err  # noqa: E402
from _protocol import time_reps  # noqa: E402
from shapes import BY_ID, select  # noqa: E402

Item = tuple[Callable[[Any], Any], Callable[[], Any] | None]  # timed(state), untimed() -> state


def median_ms(fn: Callable[[], Any], reps: int) -> float:
    """Median wall time of ``reps`` calls of ``fn()`` after an untimed one, in milliseconds."""
    fn()
    return 1e3 * statistics.median(time_reps(reps, lambda _: fn()))


def reps_for(item: Item, least: int, budget_s: float = 0.3) -> int:
    """Reps of ``item`` that take about ``budget_s`` seconds, at least ``least``."""
    return max(least, int(budget_s / max(1e-3, time_reps(1, *item)[0])))


def alternate(items: dict[str, Item], rounds: int, reps: int = 1) -> dict[str, list[float]]:
    """Per round, each item's median rep in ms; the items take turns, their order rotated every
    round, after a warm-up round that is not kept."""
    names, out = list(items), {k: list[float]() for k in items}
    for r in range(rounds + 1):
        for k in names[r % len(names) :] + names[: r % len(names)]:
            ms = 1e3 * statistics.median(time_reps(reps, *items[k]))
            if r:
                out[k].append(ms)
    return out


def ratio(a: list[float], b: list[float]) -> float:
    """The median of the per-round ratios a / b."""
    return statistics.median(x / y for x, y in zip(a, b, strict=True))


def header(*libs: str) -> str:
    from lstmgrad.machine import cpu_model, visible_cpus

    versions = ", ".join(f"{m} {sys.modules[m].__version__}" for m in libs if m in sys.modules)
    return f"cpu {cpu_model()}; {visible_cpus()} usable CPUs; {versions}"


# --------------------------------------------------------------------------------------------
# memory: peak RSS and time of one training step on long sequences, each in a fresh process

MEMORY_CONFIGS = {  # id: (T, B, I, H, num_layers, bidirectional)
    "T1k-L1-D1": (1_000, 8, 512, 512, 1, False),
    "T10k-L1-D1": (10_000, 8, 512, 512, 1, False),
    "T30k-L1-D1": (30_000, 8, 512, 512, 1, False),
    "T10k-L2-D2": (10_000, 8, 512, 512, 2, True),
    "T100k-L2-D2": (100_000, 8, 512, 512, 2, True),
}
MEMORY_SIDES = ("torch", "lstmgrad", "recompute")
GIB = 1 << 30


def _model(side: str, i: int, h: int, layers: int, bi: bool) -> Any:
    import torch

    torch.manual_seed(0)
    if side == "torch":
        return torch.nn.LSTM(i, h, num_layers=layers, bidirectional=bi)
    from lstmgrad.nn import LSTM

    return LSTM(i, h, num_layers=layers, bidirectional=bi, recompute=side == "recompute")


def _train_step(model: Any, x: Any) -> None:
    y, _ = model(x)
    y.sum().backward()
    model.zero_grad(set_to_none=True)


def _status_kib(key: str) -> int:
    """A /proc/self/status memory field (VmRSS, VmSize) in KiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def memory_child(config: str, side: str) -> dict[str, Any]:
    """One configuration on one side in this process: a warm-up step at T = 64 (Numba's compile
    and first-call costs out of the way), the resident memory, then one timed step and the
    process's peak resident memory (ru_maxrss, which sees every library's allocations)."""
    import torch

    if os.environ.get("OMP_NUM_THREADS"):
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    t, b, i, h, layers, bi = MEMORY_CONFIGS[config]
    model = _model(side, i, h, layers, bi)
    _train_step(model, torch.randn(64, b, i))
    base_kib, base_vm_kib = _status_kib("VmRSS"), _status_kib("VmSize")
    x = torch.randn(t, b, i)
    start = time.perf_counter()
    _train_step(model, x)
    return {"config": config, "side": side, "seconds": time.perf_counter() - start,
            "peak_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "base_bytes": base_kib * 1024, "base_address_space_bytes": base_vm_kib * 1024,
            "input_bytes": t * b * i * 4}  # fmt: skip


def _memory_run(config: str, side: str, args: argparse.Namespace) -> dict[str, Any]:
    """A fresh process for (config, side) under RLIMIT_AS: its result or the failure."""
    limit = int(args.limit_gib * GIB)
    env = dict(os.environ, PYTHONPATH=str(HERE.parent / "src"))
    if args.threads:  # every library's pool, before the child loads it
        keys = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS")
        env |= dict.fromkeys(keys, str(args.threads))
    try:
        proc = subprocess.run(
            [sys.executable, __file__, "memory", "--child", config, side],
            capture_output=True, text=True, env=env, timeout=args.timeout or None,
            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit)),
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return {"config": config, "side": side, "error": f"timeout after {args.timeout:.0f} s"}
    if proc.returncode == 0:
        return json.loads(proc.stdout.strip().splitlines()[-1])
    err = proc.stderr or ""
    oom = ("MemoryError", "DefaultCPUAllocator", "out of memory", "Cannot allocate", "bad_alloc")
    tail = err.strip().splitlines()[-1:] or [f"exit {proc.returncode}"]
    return {"config": config, "side": side, "returncode": proc.returncode,
            "error": "out of memory" if any(w in err for w in oom) else tail[0][-200:],
            "stderr_tail": err[-600:]}  # fmt: skip


def memory_table(doc: dict) -> list[str]:
    """The results as a Markdown table, ratios against torch's run of the same configuration."""
    h = doc["header"]
    out = [f"# {h['date']}, {h['cpu']}, {h['cores']} cores, float32, {h['threads'] or 'default'} thread(s), "
           f"RLIMIT_AS {h['limit_gib']:g} GiB per process",
           "| config (B=8, I=H=512) | side | peak RSS GiB | step's own GiB | step s | "
           "peak vs torch | own vs torch | time vs torch |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in doc["results"]:
        ref = next((q for q in doc["results"] if q["config"] == r["config"]
                    and q["side"] == "torch" and "error" not in q), None)  # fmt: skip
        if "error" in r:
            out.append(f"| {r['config']} | {r['side']} | {r['error']} | - | - | - | - | - |")
            continue
        own = r["peak_bytes"] - r["base_bytes"]
        ratios = ["-"] * 3
        if ref is not None:
            ref_own = ref["peak_bytes"] - ref["base_bytes"]
            ratios = [f"{ref['peak_bytes'] / r['peak_bytes']:.2f}x less",
                      f"{ref_own / max(own, 1):.2f}x less", f"{r['seconds'] / ref['seconds']:.2f}x"]  # fmt: skip
        out.append(f"| {r['config']} | {r['side']} | {r['peak_bytes'] / GIB:.2f} | "
                   f"{own / GIB:.2f} | {r['seconds']:.1f} | {' | '.join(ratios)} |")  # fmt: skip
    return out


def memory(args: argparse.Namespace) -> dict | None:
    if args.child:  # the child's JSON line is read by _memory_run
        print(json.dumps(memory_child(*args.child)), flush=True)
        return None
    if args.table:
        print("\n".join(memory_table(json.loads(args.table.read_text()))))
        return None
    if args.interleaved:  # the three sides alternating in this process, one layer
        import torch

        if args.threads:
            import numba

            torch.set_num_threads(args.threads)
            numba.set_num_threads(args.threads)
        models = {s: _model(s, 512, 512, 1, False) for s in MEMORY_SIDES}
        for s in MEMORY_SIDES[1:]:
            models[s].load_state_dict(models["torch"].state_dict())
        x = torch.randn(args.interleaved, 8, 512)
        items: dict[str, Item] = {
            s: (lambda _, m=m: _train_step(m, x), None) for s, m in models.items()
        }
        times = alternate(items, args.rounds)
        ratios = {s: ratio(times[s], times["torch"]) for s in MEMORY_SIDES[1:]}
        out = {"T": args.interleaved, "layers": 1, "bidirectional": False, "times_ms": times,
               "median_ratio_vs_torch": ratios}  # fmt: skip
        print(json.dumps(out))
        return out
    from lstmgrad.machine import cpu_model

    results = []
    for config in args.configs.split(","):
        for side in args.sides.split(","):
            r = _memory_run(config, side, args)
            results.append(r)
            done = r.get("error") or f"{r['peak_bytes'] / GIB:.2f} GiB, {r['seconds']:.1f} s"
            print(f"  {config} {side}: {done}", file=sys.stderr, flush=True)
    doc = {"header": {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                      "cpu": cpu_model(), "cores": os.cpu_count(), "limit_gib": args.limit_gib,
                      "threads": args.threads, "dtype": "float32",
                      "env": {k: os.environ[k] for k in ("LSTMGRAD_TUNE",) if k in os.environ}},
           "results": results}  # fmt: skip
    print("\n".join(memory_table(doc)))
    return doc


# --------------------------------------------------------------------------------------------
# scaling: lstmgrad's backward and forward + backward with 1 thread and with all usable ones


def _engine_items(shape_id: str, inp: str) -> dict[str, Item]:
    """worker.py's lstmgrad items of a shape (bwd, fwdbwd, ...), in this process."""
    import worker

    worker.ROLE, worker.INPUT = "lstmgrad", inp
    worker.setup(BY_ID[shape_id].to_dict())
    return dict(worker.ITEMS)


def scaling(args: argparse.Namespace) -> dict:
    """lstmgrad given torch tensors (its GEMMs on torch), torch's and Numba's threads set
    before each rep; the speedup is the median of per-round ratios t(1) / t(n)."""
    import numba
    import torch

    from lstmgrad.machine import visible_cpus

    def set_threads(n: int) -> None:
        torch.set_num_threads(n)
        numba.set_num_threads(n)

    counts = sorted({1, visible_cpus()})
    print(f"{header('torch', 'numba')}; threads compared: {counts}")
    rows = []
    for shape_id in args.shapes.split(","):
        items = _engine_items(shape_id, "tensors")
        for name, label in (("bwd", "backward"), ("fwdbwd", "forward+backward")):
            timed = items[name][0]
            set_threads(1)
            reps = reps_for(items[name], 3)
            times = alternate({str(n): (timed, lambda n=n: set_threads(n)) for n in counts},
                              args.rounds, reps)  # fmt: skip
            ms = {n: statistics.median(times[str(n)]) for n in counts}
            speedup = ratio(times["1"], times[str(counts[-1])])
            rows.append({"shape": shape_id, "item": label, "speedup": speedup,
                         **{f"ms_{n}": v for n, v in ms.items()}})  # fmt: skip
            each = "  ".join(f"{n} thr {v:.1f} ms" for n, v in ms.items())
            print(f"{shape_id:8s} {label:17s} {each}  speedup {speedup:.2f}x")
    return {"rows": rows}


# --------------------------------------------------------------------------------------------
# lowp: lstmgrad.nn.LSTM vs torch.nn.LSTM in bfloat16, float16, autocast, proj_size > 0

LOWP_SHAPES = {"med-3": (100, 32, 256, 256, 1, False), "small": (20, 8, 32, 32, 2, True)}


def _lowp_pair(shape: str, mode: str) -> dict[str, Item]:
    """Both modules with the same weights (``proj``: torch's with proj_size = H / 2, lstmgrad's
    without) and one step each: zero_grad, forward, a float32 sum of the outputs, backward."""
    import torch

    from lstmgrad.nn import LSTM

    t, b, i, h, layers, bi = LOWP_SHAPES[shape]
    dtypes = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
    autocast = dtypes[mode.split("-")[1]] if mode.startswith("autocast") else None
    dtype = dtypes.get(mode, torch.float32)
    torch.manual_seed(0)
    kw = {"num_layers": layers, "bidirectional": bi}
    ref = torch.nn.LSTM(i, h, proj_size=h // 2 if mode == "proj" else 0, **kw)
    ours = LSTM(i, h, **kw)
    if mode != "proj":
        ours.load_state_dict(ref.state_dict())
    x = torch.randn(t, b, i).to(dtype).requires_grad_()

    def step(model: Any) -> None:
        model.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=autocast or torch.bfloat16, enabled=autocast is not None):
            y, (hn, cn) = model(x)
        (y.float().sum() + hn.float().sum() + cn.float().sum()).backward()

    ref, ours = ref.to(dtype), ours.to(dtype)
    return {"torch": (lambda _: step(ref), None), "lstmgrad": (lambda _: step(ours), None)}


def lowp(args: argparse.Namespace) -> dict:
    """Modes: bf16, f16 (module and input in that dtype), autocast-bf16, autocast-f16 (float32
    module and input under torch.autocast("cpu")), f32, proj. A side that raises (torch's CPU
    LSTM under float16 autocast) is reported as such."""
    import torch  # noqa: F401 (its version in the header)

    print(header("torch"))
    print(f"{'shape':7s} {'mode':14s} {'torch ms':>10s} {'lstmgrad ms':>12s} {'ratio':>7s}")
    rows = []
    for shape in args.shapes.split(","):
        for mode in args.modes.split(","):
            items, failed = _lowp_pair(shape, mode), []
            for name, (timed, _) in items.items():
                try:  # warm-up: Numba compilation, oneDNN primitives
                    timed(None), timed(None)
                except RuntimeError as exc:
                    failed.append(f"{name} raises: {str(exc).splitlines()[0][:60]}")
            if failed:
                rows.append({"shape": shape, "mode": mode, "failed": failed})
                print(f"{shape:7s} {mode:14s} {'; '.join(failed)}")
                continue
            reps = reps_for(items["lstmgrad"], 2)
            times = alternate(items, args.rounds, reps)
            t_ms, l_ms = (statistics.median(times[k]) for k in ("torch", "lstmgrad"))
            rows.append({"shape": shape, "mode": mode, "torch_ms": t_ms, "lstmgrad_ms": l_ms,
                         "ratio": ratio(times["torch"], times["lstmgrad"])})  # fmt: skip
            print(f"{shape:7s} {mode:14s} {t_ms:10.2f} {l_ms:12.2f} {rows[-1]['ratio']:6.2f}x")
    return {"rows": rows}


# --------------------------------------------------------------------------------------------
# double-backward: a gradient-penalty step, lstmgrad.nn.LSTM vs torch.nn.LSTM


def double_backward(args: argparse.Namespace) -> dict:
    """ "backward": torch.autograd.grad of sum(y^2) over (x, weights) after an untimed forward;
    "double-backward step": forward, the gradient with create_graph=True and the gradient of its
    squared norm over the weights. Exit 2 unless both sides give the same penalty gradient."""
    import torch

    from lstmgrad.nn import LSTM

    t, b, i, h, layers = (int(v) for v in args.shape.split(","))
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    models = {
        "torch": torch.nn.LSTM(i, h, layers).to(dtype),
        "lstmgrad": LSTM(i, h, layers).to(dtype),
    }
    models["lstmgrad"].load_state_dict(models["torch"].state_dict())
    x = torch.randn(t, b, i, dtype=dtype, requires_grad=True)

    def loss(m: Any) -> Any:
        return (m(x)[0] ** 2).sum()

    def penalty(m: Any) -> Any:
        first = torch.autograd.grad(loss(m), [x, *m.parameters()], create_graph=True)
        return torch.autograd.grad(sum((g**2).sum() for g in first), list(m.parameters()))

    got, want = penalty(models["lstmgrad"]), penalty(models["torch"])
    err = max(
        rel_err(a.detach().numpy(), w.detach().numpy()) for a, w in zip(got, want, strict=True)
    )
    print(f"shape T,B,I,H,L = {args.shape}, {args.dtype}; penalty gradient max rel. diff {err:.1e}")
    if err > (1e-3 if args.dtype == "float32" else 1e-10):
        raise SystemExit(2)
    out: dict[str, Any] = {"shape": args.shape, "dtype": args.dtype, "penalty_rel_diff": err}

    def first_order(m: Any) -> Item:  # the forward and the loss untimed
        return lambda s: torch.autograd.grad(s, [x, *m.parameters()]), lambda: loss(m)

    def double_step(m: Any) -> Item:
        return lambda _: penalty(m), None

    for name, item in (("backward", first_order), ("double-backward step", double_step)):
        times = alternate({k: item(m) for k, m in models.items()}, args.rounds)
        out[name] = times | {"ratio": ratio(times["lstmgrad"], times["torch"])}
        t_ms, l_ms = (statistics.median(times[k]) for k in ("torch", "lstmgrad"))
        print(f"{name:22s} torch {t_ms:8.1f} ms   lstmgrad {l_ms:8.1f} ms   lstmgrad/torch "
              f"{out[name]['ratio']:.2f}")  # fmt: skip
    return out


# --------------------------------------------------------------------------------------------
# precision: each engine in float32 and float16 against the float64 reference

PRECISION_CASES = [(1, 1, False), (2, 2, False), (2, 2, True)]  # L, D, variable lengths


def _precision_case(seed: int, layers: int, dirs: int, varlen: bool) -> tuple:
    """params, x, [h0, c0], dy, dh (dc = dh), batch_sizes of T6-B3-I5-H8, drawn in float64."""
    t, b, i, h = 6, 3, 5, 8
    rng = np.random.default_rng(seed)
    params = [rng.uniform(-0.5, 0.5, s) for layer in range(layers) for _ in range(dirs)
              for s in ((4 * h, i if layer == 0 else dirs * h), (4 * h, h), (4 * h,), (4 * h,))]  # fmt: skip
    bs = np.array([3, 3, 2, 2, 1, 1], np.int64) if varlen else None
    x = rng.standard_normal((t * b, i) if varlen else (t, b, i))
    hx = [rng.standard_normal((layers * dirs, b, h)) for _ in range(2)]
    dy = rng.standard_normal((t * b, dirs * h) if varlen else (t, b, dirs * h))
    return params, x, hx, dy, rng.standard_normal((layers * dirs, b, h)), bs


def _cast(v: Any, dt: Any) -> Any:
    return [_cast(a, dt) for a in v] if isinstance(v, (list, tuple)) else v.astype(dt)


def _precision_errors(impl: str, dtype: Any, case: list, bs: Any, kw: dict) -> tuple[float, float]:
    """The largest errors of ``impl`` in ``dtype`` on one case: the backward alone (from the
    float64 forward's saved activations cast down) and forward + backward."""
    import lstmgrad

    def bwd(c: list, saved: list, impl: str) -> list:
        p, x, hx, dy, dh = c
        res = lstmgrad.lstm_backward(x, hx, p, dy, dh, dh, *saved, bs, impl=impl, **kw)
        return [res.dx, res.dh_prev, res.dc_prev, *res.dparams]

    def saved(c: list, impl: str) -> list:
        return lstmgrad.lstm_forward(c[1], c[0], c[2], bs, impl=impl, **kw).saved[:7]

    low = _cast(case, dtype)
    ref = _cast(low, np.float64)  # the reference on the low-precision values
    saved_ref = saved(ref, "reference")
    saved_low = _cast(saved_ref, dtype)
    alone = map(
        rel_err, bwd(low, saved_low, impl), bwd(ref, _cast(saved_low, np.float64), "reference")
    )
    both = map(rel_err, bwd(low, saved(low, impl), impl), bwd(ref, saved_ref, "reference"))
    return max(alone), max(both)


def precision(args: argparse.Namespace) -> dict:
    """Inputs drawn in float64 and cast to the low dtype; the float64 reference runs on the cast
    values cast back, so the error is the engine's own: max|got - want| / max|want| over dx,
    dh_prev, dc_prev and dparams, the largest over every case and seed."""
    print("| engine | dtype | backward alone (same saved activations) | forward + backward |")
    print("|---|---|---|---|")
    rows = []
    for impl in ("fused", "reference"):
        for dtype in ("float32", "float16"):
            errs = []
            for layers, dirs, varlen in PRECISION_CASES:
                kw = {"num_layers": layers, "bidirectional": dirs == 2}
                for seed in range(6):
                    *case, bs = _precision_case(seed, layers, dirs, varlen)
                    errs.append(_precision_errors(impl, np.dtype(dtype), case, bs, kw))
            e_bwd, e_fb = (max(e) for e in zip(*errs, strict=True))
            rows.append({"engine": impl, "dtype": dtype, "backward": e_bwd, "fwd_bwd": e_fb})
            print(f"| {impl} | {dtype} | {e_bwd:.1e} | {e_fb:.1e} |")
    return {"rows": rows}


# --------------------------------------------------------------------------------------------
# breakdown: where the fused engine's time goes (NumPy arrays, no torch in the process)


def breakdown(args: argparse.Namespace) -> dict:
    """For the backward and the forward of each shape: the call's median time, the same GEMMs
    alone (worker.gemm_parts, per-step recurrent and big ones), and the time cProfile gives the
    Numba kernels; the rest is NumPy glue and Python. The parts are measured separately, so they
    add up only roughly on a noisy machine (the rest can come out negative)."""
    import worker

    print(
        "| shape | pass | total ms | recurrent GEMMs alone | big GEMMs alone | Numba kernels | rest |"
    )
    print("|---|---|---|---|---|---|---|")
    rows = []
    for sh in select(args.shapes):
        items = _engine_items(sh.id, "arrays")
        bwd = items["bwd"][0]
        c = worker.STATE["case"]
        p = worker.gemm_parts(sh, fwd_transposed=sh.B <= 64 and sh.H >= 256)  # as the engine
        passes = {"backward": (partial(bwd, None), ("rec_bwd",), ("dx0", "dx", "dw")),
                  "forward": (partial(worker._forward, sh, c, "fused"), ("rec_fwd",), ("in_fwd",))}  # fmt: skip
        for name, (fn, rec, big) in passes.items():
            total = median_ms(fn, 7)
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(3):
                fn()
            prof.disable()
            stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
            kern = sum(v[2] for k, v in stats.items() if k[0].endswith("kernels.py")) / 3 * 1e3
            rec_ms, big_ms = (sum(median_ms(p[k], 3) for k in ks) for ks in (rec, big))
            rows.append({"shape": sh.id, "pass": name, "total_ms": total, "recurrent_ms": rec_ms,
                         "big_ms": big_ms, "kernels_ms": kern, "rest_ms": total - rec_ms - big_ms - kern})  # fmt: skip
            print(f"| {sh.id} | {name} | {total:.1f} | {rec_ms:.1f} | {big_ms:.1f} | {kern:.1f} | "
                  f"{rows[-1]['rest_ms']:.1f} |")  # fmt: skip
    return {"rows": rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", type=Path, help="results (default benchmarks/results/NAME.json)")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser(
        "memory", parents=[common], help="peak memory and time of a step on long sequences"
    )
    p.add_argument("--configs", default="T1k-L1-D1,T10k-L1-D1,T30k-L1-D1,T10k-L2-D2",
                   help=f"ids among {', '.join(MEMORY_CONFIGS)}")  # fmt: skip
    p.add_argument("--sides", default=",".join(MEMORY_SIDES))
    p.add_argument("--limit-gib", type=float, default=16.0, help="RLIMIT_AS of each child")
    p.add_argument("--timeout", type=float, default=0.0, help="seconds per child (0: none)")
    p.add_argument("--threads", type=int, default=1, help="threads per side (0: defaults)")
    p.add_argument("--interleaved", type=int, default=0, metavar="T",
                   help="time the three sides alternately in this process at this T (1 layer)")  # fmt: skip
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--table", type=Path, help="print the table of a saved JSON")
    p.add_argument("--child", nargs=2, metavar=("CONFIG", "SIDE"), help=argparse.SUPPRESS)
    p = sub.add_parser("scaling", parents=[common], help="1 thread against all usable ones")
    p.add_argument("--shapes", default="med-3,large-1,med-1,med-5")
    p.add_argument("--rounds", type=int, default=7)
    p = sub.add_parser(
        "lowp", parents=[common], help="bfloat16, float16, autocast and proj_size steps"
    )
    p.add_argument("--shapes", default="med-3,small")
    p.add_argument("--modes", default="f32,bf16,autocast-bf16,f16,autocast-f16,proj")
    p.add_argument("--rounds", type=int, default=5)
    p = sub.add_parser("double-backward", parents=[common], help="a gradient-penalty step")
    p.add_argument("--shape", default="50,16,128,128,2", help="T,B,I,H,L")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    sub.add_parser("precision", parents=[common], help="each engine's error in float32 and float16")
    p = sub.add_parser(
        "breakdown", parents=[common], help="the fused engine's time: GEMMs, kernels, the rest"
    )
    p.add_argument("--shapes", help="shape ids (default: all 12)")
    args = ap.parse_args(argv)
    doc = globals()[args.cmd.replace("-", "_")](args)
    if doc is not None:
        path = args.json or HERE / "results" / f"{args.cmd}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(doc, indent=1))
        print(f"# JSON: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
