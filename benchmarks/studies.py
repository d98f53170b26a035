"""Focused measurements quoted in docs/performance.md: memory, scaling, lowp (see --help).

The timings run in one process (memory: one child process per configuration and side), the
compared sides taking turns in an order rotated every round, after a warm-up round; a figure is
the median over rounds, a ratio the median of the per-round ratios. Each subcommand prints a
table and writes its JSON to benchmarks/results/<subcommand>.json (--json).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _harness import md_table, run_main, time_reps  # noqa: E402
from shapes import select  # noqa: E402

Item = tuple[Callable[[Any], Any], Callable[[], Any] | None]  # timed(state), untimed() -> state


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


def header() -> str:
    from lstmgrad.core.machine import cpu_model, visible_cpus

    libs = ", ".join(f"{m} {sys.modules[m].__version__}" for m in ("torch", "numba"))
    return f"cpu {cpu_model()}; {visible_cpus()} usable CPUs; {libs}"


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
    status = Path("/proc/self/status").read_text()
    base_kib = int(status.split("VmRSS:")[1].split()[0])
    x = torch.randn(t, b, i)
    start = time.perf_counter()
    _train_step(model, x)
    return {
        "config": config,
        "side": side,
        "seconds": time.perf_counter() - start,
        "peak_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "base_bytes": base_kib * 1024,
    }


def _memory_run(config: str, side: str, args: argparse.Namespace) -> dict[str, Any]:
    """A fresh process for (config, side) under RLIMIT_AS: its result or the failure."""
    limit = int(args.limit_gib * GIB)
    env = dict(os.environ, PYTHONPATH=str(HERE.parent / "src"))
    env.setdefault("LSTMGRAD_TUNE", "eager")  # plans measured in the warm-up, not budgeted
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
    h, rows = doc["header"], []
    for r in doc["results"]:
        ref = next((q for q in doc["results"] if q["config"] == r["config"]
                    and q["side"] == "torch" and "error" not in q), None)  # fmt: skip
        if "error" in r:
            rows.append([r["config"], r["side"], r["error"], *["-"] * 5])
            continue
        own, cells = r["peak_bytes"] - r["base_bytes"], ["-"] * 3
        if ref is not None:
            ref_own = ref["peak_bytes"] - ref["base_bytes"]
            cells = [f"{ref['peak_bytes'] / r['peak_bytes']:.2f}x less",
                     f"{ref_own / max(own, 1):.2f}x less",
                     f"{r['seconds'] / ref['seconds']:.2f}x"]  # fmt: skip
        rows.append([r["config"], r["side"], f"{r['peak_bytes'] / GIB:.2f}", f"{own / GIB:.2f}",
                     f"{r['seconds']:.1f}", *cells])  # fmt: skip
    head = ["config (B=8, I=H=512)", "side", "peak RSS GiB", "step's own GiB", "step s",
            "peak vs torch", "own vs torch", "time vs torch"]  # fmt: skip
    return [f"# {h['date']}, {h['cpu']}, {h['cores']} cores, float32, "
            f"{h['threads'] or 'default'} thread(s), RLIMIT_AS {h['limit_gib']:g} GiB per process",
            md_table(head, rows)]  # fmt: skip


def memory(args: argparse.Namespace) -> dict | None:
    if args.child:  # the child's JSON line is read by _memory_run
        print(json.dumps(memory_child(*args.child)), flush=True)
        return None
    from lstmgrad.core.machine import cpu_model

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


# one process per CPU: a one-thread float32 GEMM loop pinned there, started at a set time
_CEILING_CHILD = """
import os, sys, time, torch
cpu, start, reps, n = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), 512
os.sched_setaffinity(0, {cpu})
torch.set_num_threads(1)
a, b = torch.randn(n, n), torch.randn(n, n)
for _ in range(5):
    a @ b
while time.time() < start:
    time.sleep(0.001)
t0 = time.perf_counter()
for _ in range(reps):
    a @ b
print(2 * n**3 * reps / (time.perf_counter() - t0) / 1e9)
"""


def _gemm_rates(cpus: list[int], reps: int, delay: float = 5.0) -> list[float]:
    """GFLOP/s of :data:`_CEILING_CHILD` on each of ``cpus`` at once (one child per CPU),
    started ``delay`` seconds from now (after every child has imported torch); a lone child
    has no other to wait for and starts at once."""
    start = time.time() + (delay if len(cpus) > 1 else 0.0)
    procs = [subprocess.Popen([sys.executable, "-c", _CEILING_CHILD, str(cpu), str(start),
                               str(reps)], stdout=subprocess.PIPE, text=True)
             for cpu in cpus]  # fmt: skip
    return [float(p.communicate()[0]) for p in procs]


def ceiling(cpus: list[int], rounds: int) -> dict[str, Any]:
    """What the machine gives a second (third...) thread of compute-bound work: the summed
    GFLOP/s of one-thread GEMMs on all ``cpus`` at once over one alone (on the first), the
    median of ``rounds`` rounds. A CPU shared with another tenant (or two logical CPUs of one
    core) gives far less than its count: the engine's speedup from threads is bounded by it."""
    reps = max(50, int(_gemm_rates(cpus[:1], 50)[0] * 1e9 / (2 * 512**3)))  # about 1 s alone
    alone, together, ratios = [], [], []
    for _ in range(rounds):
        one = _gemm_rates(cpus[:1], reps)[0]
        many = _gemm_rates(cpus, reps)
        alone.append(one)
        together.append(sum(many))
        ratios.append(sum(many) / one)
    return {"cpus": cpus, "alone_gflops": statistics.median(alone),
            "together_gflops": statistics.median(together), "ratio": statistics.median(ratios),
            "ratios": ratios}  # fmt: skip


def scaling(args: argparse.Namespace) -> dict:
    """lstmgrad given torch tensors (its GEMMs on torch), torch's and Numba's threads set
    before each rep; the speedup is the median of per-round ratios t(1) / t(n). First the
    machine's own ceiling for that speedup (:func:`ceiling`)."""
    import numba
    import torch
    import worker

    from lstmgrad.core.machine import visible_cpus

    def set_threads(n: int) -> None:
        torch.set_num_threads(n)
        numba.set_num_threads(n)

    counts = sorted({1, visible_cpus()})
    print(f"{header()}; threads compared: {counts}")
    cpus = sorted(os.sched_getaffinity(0))[: counts[-1]]
    top = ceiling(cpus, args.ceiling_rounds) if len(cpus) > 1 and args.ceiling_rounds else None
    if top is not None:
        each = " ".join(f"{r:.2f}" for r in top["ratios"])
        print(f"ceiling: one-thread GEMMs on CPUs {cpus} at once {top['together_gflops']:.0f} "
              f"GFLOP/s against {top['alone_gflops']:.0f} alone: {top['ratio']:.2f}x "
              f"(rounds: {each})")  # fmt: skip
    rows = []
    for shape in select(args.shapes, varlen=False):
        shape_id = shape.id
        worker.ROLE, worker.INPUT = "lstmgrad", "tensors"  # worker.py's items, in this process
        worker.setup(shape.to_dict())
        items = dict(worker.ITEMS)
        for name, label in (("bwd", "backward"), ("fwdbwd", "forward+backward")):
            timed, untimed = items[name]

            def prepare(n: int, untimed: Any = untimed) -> Any:  # threads, then the item's own
                set_threads(n)
                return untimed() if untimed is not None else None

            set_threads(1)
            reps = reps_for(items[name], 3)
            times = alternate({str(n): (timed, lambda n=n: prepare(n)) for n in counts},
                              args.rounds, reps)  # fmt: skip
            ms = {n: statistics.median(times[str(n)]) for n in counts}
            speedup = ratio(times["1"], times[str(counts[-1])])
            rows.append({"shape": shape_id, "item": label, "speedup": speedup,
                         **{f"ms_{n}": v for n, v in ms.items()}})  # fmt: skip
            each = "  ".join(f"{n} thr {v:.1f} ms" for n, v in ms.items())
            print(f"{shape_id:8s} {label:17s} {each}  speedup {speedup:.2f}x")
    return {"rows": rows, "ceiling": top}


# --------------------------------------------------------------------------------------------
# lowp: lstmgrad.nn.LSTM vs torch.nn.LSTM in bfloat16, float16, autocast, proj_size > 0

LOWP_SHAPES = {  # T, B, I, H, layers, bidirectional
    "med-3": (100, 32, 256, 256, 1, False),
    "small": (20, 8, 32, 32, 2, True),
    "med-1": (25, 16, 512, 512, 1, False),
    "large-1": (50, 16, 1024, 1024, 1, False),
    "small-2": (200, 8, 128, 128, 1, True),
    "word-lm": (35, 20, 200, 200, 2, False),
}


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
    import numba  # noqa: F401 (versions in the header)
    import torch  # noqa: F401

    print(header())
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    parsers = {name: sub.add_parser(name, help=text) for name, text in (
        ("memory", "peak memory and time of a step on long sequences"),
        ("scaling", "1 thread against all usable ones"),
        ("lowp", "bfloat16, float16, autocast and proj_size steps"))}  # fmt: skip
    for p in parsers.values():
        p.add_argument("--json", type=Path, help="results (default benchmarks/results/NAME.json)")
    p = parsers["memory"]
    p.add_argument("--configs", default="T1k-L1-D1,T10k-L1-D1,T30k-L1-D1,T10k-L2-D2",
                   help=f"ids among {', '.join(MEMORY_CONFIGS)}")  # fmt: skip
    p.add_argument("--sides", default=",".join(MEMORY_SIDES))
    p.add_argument("--limit-gib", type=float, default=16.0, help="RLIMIT_AS of each child")
    p.add_argument("--timeout", type=float, default=0.0, help="seconds per child (0: none)")
    p.add_argument("--threads", type=int, default=1, help="threads per side (0: defaults)")
    p.add_argument("--child", nargs=2, metavar=("CONFIG", "SIDE"), help=argparse.SUPPRESS)
    parsers["scaling"].add_argument("--shapes", default="med-3,large-1,med-1,med-5")
    parsers["scaling"].add_argument("--rounds", type=int, default=7)
    parsers["scaling"].add_argument("--ceiling-rounds", type=int, default=3,
                                    help="rounds of the machine's own ceiling (0: skip)")  # fmt: skip
    parsers["lowp"].add_argument("--shapes", default="med-3,small")
    parsers["lowp"].add_argument("--modes", default="f32,bf16,autocast-bf16,f16,autocast-f16,proj")
    parsers["lowp"].add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    doc = globals()[args.cmd](args)
    if doc is not None:
        path = args.json or HERE / "results" / f"{args.cmd}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(doc, indent=1))
        print(f"# JSON: {path}")
    return 0


if __name__ == "__main__":
    run_main(main)
