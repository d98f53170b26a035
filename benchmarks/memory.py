"""Peak memory and time of one training step on long sequences: torch.nn.LSTM against
lstmgrad.nn.LSTM in its normal mode and in its recompute mode.

    python benchmarks/memory.py [--configs id,id] [--limit-gib G] [--json P]

Each (configuration, side) runs in a fresh child process (``--child``), so that its peak
resident memory (``ru_maxrss``, the kernel's high-water mark, which sees every allocation:
NumPy, torch, Numba, BLAS) is its own. The child builds the model and a float32 input
[T, B, I], runs one short warm-up step (T = 64: Numba's compile and the first-call costs out
of the way), records its resident memory, then times one step: forward, ``y.sum()``,
backward. Children run under ``RLIMIT_AS`` (``--limit-gib``, address space), so a side that
needs more than that fails with an out-of-memory error instead of pushing the machine into
the OOM killer; such a run is reported as "out of memory". Configurations are run in the order
given, one child at a time. Results (a table on stdout, JSON in benchmarks/results/) are
described in docs/performance.md, section "Memory".
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

# id: (T, B, I, H, num_layers, bidirectional)
CONFIGS: dict[str, tuple[int, int, int, int, int, bool]] = {
    "T1k-L1-D1": (1_000, 8, 512, 512, 1, False),
    "T10k-L1-D1": (10_000, 8, 512, 512, 1, False),
    "T30k-L1-D1": (30_000, 8, 512, 512, 1, False),
    "T10k-L2-D2": (10_000, 8, 512, 512, 2, True),
    "T100k-L2-D2": (100_000, 8, 512, 512, 2, True),
}
DEFAULT = "T1k-L1-D1,T10k-L1-D1,T30k-L1-D1,T10k-L2-D2"
SIDES = ("torch", "lstmgrad", "recompute")
GIB = 1 << 30


def _status_kib(key: str) -> int:
    """A /proc/self/status memory field (VmRSS, VmSize) in KiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def child(config: str, side: str) -> dict[str, Any]:
    """One configuration on one side in this process; returns its measurements."""
    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "0")) or torch.get_num_threads())
    t, b, i, h, nl, bi = CONFIGS[config]
    torch.manual_seed(0)
    if side == "torch":
        model = torch.nn.LSTM(i, h, num_layers=nl, bidirectional=bi)
    else:
        from lstmgrad.nn import LSTM

        model = LSTM(i, h, num_layers=nl, bidirectional=bi, recompute=side == "recompute")

    def step(steps: int) -> float:
        x = torch.randn(steps, b, i)
        start = time.perf_counter()
        y, _ = model(x)
        y.sum().backward()
        elapsed = time.perf_counter() - start
        model.zero_grad(set_to_none=True)
        return elapsed

    step(64)
    x_bytes = t * b * i * 4
    base_kib, base_vm_kib = _status_kib("VmRSS"), _status_kib("VmSize")
    seconds = step(t)
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return {
        "config": config,
        "side": side,
        "seconds": seconds,
        "peak_bytes": peak_kib * 1024,
        "base_bytes": base_kib * 1024,
        "base_address_space_bytes": base_vm_kib * 1024,
        "input_bytes": x_bytes,
    }


def interleaved(steps: int, layers: int, bidirectional: bool, rounds: int) -> dict[str, Any]:
    """Step times of the three sides in one process, alternating (the order rotated every
    round), so that a loaded machine disturbs them alike; medians and per-round ratios."""
    import statistics

    import torch

    from lstmgrad.nn import LSTM

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "0")) or torch.get_num_threads())
    b, i, h = 8, 512, 512
    torch.manual_seed(0)
    ref = torch.nn.LSTM(i, h, num_layers=layers, bidirectional=bidirectional)
    models = {"torch": ref}
    for side in ("lstmgrad", "recompute"):
        m = LSTM(
            i, h, num_layers=layers, bidirectional=bidirectional, recompute=side == "recompute"
        )
        m.load_state_dict(ref.state_dict())
        models[side] = m
    x = torch.randn(steps, b, i)
    times: dict[str, list[float]] = {side: [] for side in models}
    for r in range(rounds + 1):  # round 0 warms up
        order = list(models)[r % 3 :] + list(models)[: r % 3]
        for side in order:
            start = time.perf_counter()
            y, _ = models[side](x)
            y.sum().backward()
            if r:
                times[side].append(time.perf_counter() - start)
            models[side].zero_grad(set_to_none=True)
    ratios = {
        side: statistics.median(a / t for a, t in zip(times[side], times["torch"], strict=True))
        for side in ("lstmgrad", "recompute")
    }
    return {"T": steps, "layers": layers, "bidirectional": bidirectional, "times": times,
            "median_ratio_vs_torch": ratios}  # fmt: skip


def run_child(
    config: str, side: str, limit_gib: float, timeout: float, threads: int
) -> dict[str, Any]:
    """A fresh process for (config, side) under RLIMIT_AS and ``threads`` threads (every
    library's pool); its result or the failure."""
    limit = int(limit_gib * GIB)

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    if threads:
        for key in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                    "NUMBA_NUM_THREADS"):  # fmt: skip
            env[key] = str(threads)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", config, side]
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, env=env, preexec_fn=cap, timeout=timeout or None
        )
    except subprocess.TimeoutExpired:
        return {"config": config, "side": side, "error": f"timeout after {timeout:.0f} s"}
    if proc.returncode == 0:
        return json.loads(proc.stdout.strip().splitlines()[-1])
    tail = (proc.stderr or "").strip().splitlines()[-1:] or [f"exit {proc.returncode}"]
    oom = any(w in proc.stderr for w in ("MemoryError", "DefaultCPUAllocator", "out of memory",
                                         "Cannot allocate memory", "bad_alloc"))  # fmt: skip
    return {
        "config": config,
        "side": side,
        "error": "out of memory" if oom else tail[0][-200:],
        "returncode": proc.returncode,
        "stderr_tail": (proc.stderr or "")[-600:],
    }


def _cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    except OSError:
        return "unknown"
    for line in out.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def _fmt(r: dict[str, Any]) -> tuple[str, str]:  # one line of progress
    if "error" in r:
        return r["error"], "-"
    return f"{r['peak_bytes'] / GIB:.2f}", f"{r['seconds']:.1f}"


def table(header: dict[str, Any], results: list[dict[str, Any]]) -> None:
    """Print the results as a Markdown table, ratios against torch's run of the same config."""
    print(f"# {header['date']}, {header['cpu']}, {header['cores']} cores, float32, "
          f"{header['threads'] or 'default'} thread(s), RLIMIT_AS {header['limit_gib']:g} GiB "
          f"per process")  # fmt: skip
    print("| config (B=8, I=H=512) | side | peak RSS GiB | step's own GiB | step s | "
          "peak vs torch | own vs torch | time vs torch |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for config in dict.fromkeys(r["config"] for r in results):
        rows = [r for r in results if r["config"] == config]
        ref = next((r for r in rows if r["side"] == "torch" and "error" not in r), None)
        for r in rows:
            if "error" in r:
                print(f"| {config} | {r['side']} | {r['error']} | - | - | - | - | - |")
                continue
            own = r["peak_bytes"] - r["base_bytes"]
            ratios = ["-", "-", "-"]
            if ref is not None:
                ref_own = ref["peak_bytes"] - ref["base_bytes"]
                ratios = [f"{ref['peak_bytes'] / r['peak_bytes']:.2f}x less",
                          f"{ref_own / max(own, 1):.2f}x less",
                          f"{r['seconds'] / ref['seconds']:.2f}x"]  # fmt: skip
            print(f"| {config} | {r['side']} | {r['peak_bytes'] / GIB:.2f} | {own / GIB:.2f} | "
                  f"{r['seconds']:.1f} | {' | '.join(ratios)} |")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--configs", default=DEFAULT, help=f"ids among {', '.join(CONFIGS)}")
    ap.add_argument("--sides", default=",".join(SIDES))
    ap.add_argument("--limit-gib", type=float, default=16.0, help="RLIMIT_AS of each child")
    ap.add_argument("--timeout", type=float, default=0.0, help="seconds per child (0: none)")
    ap.add_argument("--threads", type=int, default=1, help="threads per child (0: defaults)")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument(
        "--interleaved",
        type=int,
        default=0,
        metavar="T",
        help="time the three sides alternately in one process at this T (1 layer)",
    )
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--table", type=Path, default=None, help="print the table of a JSON file")
    ap.add_argument("--child", nargs=2, metavar=("CONFIG", "SIDE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(*args.child)), flush=True)
        return
    if args.interleaved:
        r = interleaved(args.interleaved, 1, False, args.rounds)
        print(json.dumps(r))
        return
    if args.table:
        saved = json.loads(args.table.read_text())
        table(saved["header"], saved["results"])
        return
    results = []
    configs = [c for c in args.configs.split(",") if c]
    for config in configs:
        row = {}
        for side in args.sides.split(","):
            r = run_child(config, side, args.limit_gib, args.timeout, args.threads)
            results.append(r)
            row[side] = r
            print(f"  {config} {side}: {_fmt(r)}", file=sys.stderr, flush=True)
    header = {
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "limit_gib": args.limit_gib,
        "threads": args.threads,
        "env": {k: os.environ[k] for k in ("LSTMGRAD_TUNE",) if k in os.environ},
        "dtype": "float32",
    }
    table(header, results)
    out = args.json or ROOT / "benchmarks" / "results" / "memory.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"header": header, "results": results}, indent=1))
    print(f"# JSON: {out}")


if __name__ == "__main__":
    main()
