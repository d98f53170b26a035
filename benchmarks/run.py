"""lstmgrad vs torch.nn.LSTM on CPU, each side in its own worker process (worker.py; this parent
imports neither): a correctness gate, interleaved rounds, tables, JSON and a speedup chart.
``--what backward``: lstm_backward, and lstm_forward + lstm_backward, against
torch.autograd.backward of nn.LSTM. ``--what step``: a training step, Linear -> LSTM -> Linear
with SGD, lstmgrad.nn.LSTM against torch.nn.LSTM, each shape in fresh worker pairs. The method:
benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import (  # noqa: E402
    Session,
    Timer,
    Timing,
    Worker,
    WorkerError,
    chart,
    decode,
    fmt_ms,
    fmt_pair,
    md_table,
    pair_stats,
    peak_gflops,
    rel_err,
    run_main,
    say,
)
from shapes import SHAPES, Shape, select  # noqa: E402

GATE_TOL = 1e-4  # backward: fused vs torch autograd, float32, max relative error
# step, float16: torch rounds every GEMM and gate to float16, lstmgrad computes in float32 (and a
# gradient's error is taken relative to the model's largest gradient, see gate_step)
STEP_TOLS = {"float32": 1e-4, "float16": 2e-2}
GATE_STEPS, SEED = 3, 0
TARGET_DENSE, TARGET_VARLEN = 1.0, 2.0  # the project's speedup targets for the step
HEAD = ["torch ms", "lstmgrad ms", "speedup [min-max]", "torch GFLOP/s", "lstmgrad GFLOP/s"]


def options(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = ap.add_argument
    add("--what", choices=("backward", "step"), default="backward", help="what is timed")
    add("--shapes", help="comma-separated shape ids (default: all 12)")
    add("--rounds", type=int, help="timed rounds (default 6; 2 with --quick)")
    add("--quick", action="store_true", help="smoke run: 2 rounds, short batches, no redos")
    add("--dtype", choices=("float32", "float16"), default="float32")
    add("--lstmgrad-input", choices=("arrays", "tensors"), default="arrays",
        help="backward: what lstmgrad is given, NumPy arrays (its GEMMs on NumPy's BLAS) or "
        "torch tensors over the same memory (its GEMMs on torch's)")  # fmt: skip
    add("--processes", type=int, help="fresh worker pairs per shape (default 3)")
    add("--json", type=Path, help="results (default benchmarks/results/...json)")
    add("--png", type=Path, help="speedup chart (default benchmarks/results/...png)")
    add("--report", type=Path, help="print the tables of a saved JSON and exit")
    args = ap.parse_args(argv)
    step, q = args.what == "step", args.quick
    args.rounds = args.rounds or (2 if q else 6)
    args.processes = max(1, args.processes or (1 if q else 3))
    target = (0.1 if step else 0.05) if q else 0.5
    args.timing = Timing(target, 1 if q else 3 if step else 2, 3 if step and not q else 1,
                         3 if q else 10_000, 0 if q else 2)  # fmt: skip
    return args


def workers(args: argparse.Namespace) -> dict[str, Worker]:
    """A torch and a lstmgrad worker.py for ``args.what``."""
    env = dict(os.environ, LSTMGRAD_BENCH_INPUT=args.lstmgrad_input)
    env.setdefault("LSTMGRAD_TUNE", "eager")  # plans measured in the warm-up, not budgeted
    pre = "step-" if args.what == "step" else ""
    logs = {s: args.logdir / f"{pre}{s}.log" for s in ("torch", "lstmgrad")}
    return {s: Worker(s, log, (pre + s,), env) for s, log in logs.items()}


def close(ws: dict[str, Worker]) -> None:
    for w in ws.values():
        w.close()


def worker_lines(args: argparse.Namespace, t: dict, lg: dict) -> list[str]:
    what = "lstmgrad.nn.LSTM" if args.what == "step" else f"engine fused, given {lg['input']}"
    gemms = f"torch ({lg['num_threads']} threads)" if "num_threads" in lg else "NumPy's BLAS"
    return [f"torch    worker: {t['num_threads']} threads, {args.dtype}",
            f"lstmgrad {lg['lstmgrad']} {what}: its GEMMs on {gemms}; Numba "
            f"{lg['numba_threads']} threads"]  # fmt: skip


# --------------------------------------------------------------------------------------------
# --what backward


def gate_errors(got: Any, want: Any, name: str = "") -> dict[str, float]:
    """rel_err of every array (list of numbers, list of arrays) in ``want`` against the same
    place in ``got``, by path."""
    if isinstance(want, dict):
        parts = [gate_errors(got.get(k), w, f"{name} {k}".strip()) for k, w in want.items()]
        return {k: e for p in parts for k, e in p.items()}
    if isinstance(want, list) and isinstance(want[0], np.ndarray):
        return {f"{name} {k}": rel_err(got[k], w) for k, w in enumerate(want)}
    return {name: rel_err(got, want)}


def check_errors(kind: str, per_shape: dict[str, dict], tol: float, failures: list) -> None:
    """Exit 2, listing them, if an error of ``per_shape`` (or of ``failures``) exceeds ``tol``."""
    for sid, errs in per_shape.items():
        if bad := {k: f"{v:.1e}" for k, v in errs.items() if not v <= tol}:
            failures.append(f"{sid}: rel err > {tol:g}: {bad}")
    worst = max(v for e in per_shape.values() for v in e.values())
    say(f"gate     {kind}, {len(SHAPES)} scaled shapes (T<=6, B<=5, I,H/16): max rel err "
        f"{worst:.1e} (tol {tol:g})")  # fmt: skip
    if failures:  # no timings are reported for a wrong result
        say("", "CORRECTNESS GATE FAILED:", *("  " + f for f in failures))
        raise SystemExit(2)


def gate_backward(ws: dict[str, Worker]) -> dict:
    """Exit 2 unless the fused engine's gradients (with and without dx) and h_n, c_n match
    torch's autograd in float32 on a scaled-down version of every shape."""
    errs = {}
    for sh in (s.scaled() for s in SHAPES):
        want, got = (decode(ws[s].call("gate", shape=sh.to_dict())) for s in ("torch", "lstmgrad"))
        errs[sh.id] = gate_errors(got, want)
    check_errors("fused vs torch autograd, float32, gradients with and without dx, h_n, c_n",
                 errs, GATE_TOL, [])  # fmt: skip
    return {"tol": GATE_TOL, "errors": errs}


def measure_backward(sh: Shape, _: dict, args: argparse.Namespace, peak: dict) -> dict:
    """All timings of one shape in ``args.processes`` fresh pairs of workers (a process's speed
    on a shape is a draw), ceil(rounds / processes) rounds each, pooled; ``peak``: GFLOP/s of
    each side's GEMM library."""
    t_start = time.perf_counter()
    pairs = {p: (p, p) for p in ("bwd", "fwdbwd")}
    if sh.varlen:  # torch's padded run too
        pairs |= {"bwd_dense": ("bwd_dense", "bwd"), "fwdbwd_dense": ("fwdbwd_dense", "fwdbwd")}
    groups = [[f"torch:{t}", f"lstmgrad:{lg}"] for t, lg in pairs.values()]
    kept: list[list] = [[] for _ in groups]
    warm, reps, discarded = [], [], []
    for _ in range(args.processes):
        ws = workers(args)
        try:
            tset = ws["torch"].call("setup", shape=sh.to_dict(), dtype=args.dtype)
            ws["lstmgrad"].call("setup", shape=sh.to_dict(), dtype=args.dtype)
            timer = Timer(ws, args.timing)
            w, r = timer.prepare(list(dict.fromkeys(i for g in groups for i in g)))
            got, disc = timer.rounds(groups, r, math.ceil(args.rounds / args.processes))
        finally:
            close(ws)
        warm.append(w)
        reps.append(r)
        discarded += disc
        for g, rounds in enumerate(got):
            kept[g] += rounds
    # effective rows (sum of the lengths) also for torch's padded run: useful work per second
    flops = {"bwd": sh.flops_backward(), "fwdbwd": sh.flops_fwd_bwd()}
    s = {}
    for g, (name, (ti, li)) in enumerate(pairs.items()):
        s[name] = pair_stats(kept[g], f"torch:{ti}", f"lstmgrad:{li}",
                             flops[name.removesuffix("_dense")], peak)  # fmt: skip
        s[name]["torch_path"] = tset["paths"][ti]["path"]
    return {"shape": sh.to_dict(), "label": sh.label(),
            "lengths": sh.lengths().tolist() if sh.varlen else None,
            "torch_paths": tset["paths"], "warmup_s": warm, "reps": reps, "rounds": kept,
            "discarded": discarded, "redone": len(discarded), "summary": s,
            "elapsed_s": time.perf_counter() - t_start}  # fmt: skip


def report_backward(doc: dict) -> list[str]:
    """The tables: backward, forward + backward."""
    peak = doc["peak"]
    out = [f"{doc['config']['dtype']}; speedup = median of per-round torch ms / lstmgrad ms; "
           "GFLOP/s: GEMM FLOPs (effective rows) per second; (%): of the measured float32 GEMM "
           f"peak of the side's library, torch {peak['torch']:.3g}, lstmgrad "
           f"{peak['lstmgrad']:.3g} GFLOP/s"]  # fmt: skip
    for title, item in (("Backward alone", "bwd"), ("Forward + backward", "fwdbwd")):
        rows = []
        for r in doc["results"]:
            for name in (n for n in (item, f"{item}_dense") if n in r["summary"]):
                s = r["summary"][name]
                kind = "packed" if r["lengths"] else "dense"
                kind = "padded" if name.endswith("_dense") else kind
                rows.append([r["shape"]["id"], f"{s['torch_path']} ({kind})", *fmt_pair(s),
                             f"{s['noisy_rounds']}/{s['rounds']}"])  # fmt: skip
        out += ["", title, md_table(["shape", "torch path", *HEAD, "noisy"], rows)]
    return out


# --------------------------------------------------------------------------------------------
# --what step


def gate_step(ws: dict[str, Worker], dtype: str) -> dict:
    """Both sides train every scaled shape GATE_STEPS steps from the same weights; exit 2 if
    the initial weights differ or the losses, first-step gradients or final LSTM weights do."""
    tol, out, errs, failures = STEP_TOLS[dtype], {}, {}, []
    for full in SHAPES:  # I and H / 16 but at least 4
        sh = replace(full.scaled(), I=max(4, full.I // 16), H=max(4, full.H // 16))
        kw = {"shape": sh.to_dict(), "dtype": dtype, "steps": GATE_STEPS, "seed": SEED}
        want, got = (decode(ws[s].call("gate_step", **kw)) for s in ("torch", "lstmgrad"))
        if dtype == "float16":  # against the model's largest gradient: the tiny gradients deep
            for d in (want, got):  # in a stack round differently when torch rounds every step
                d["grads"] = np.concatenate([g.ravel() for g in d["grads"].values()])
        errs[sh.id] = gate_errors({k: got[k] for k in ("losses", "grads", "params")},
                                  {k: want[k] for k in ("losses", "grads", "params")})  # fmt: skip
        out[sh.id] = {"torch_losses": want["losses"], "lstmgrad_losses": got["losses"]}
        if got["hash"] != want["hash"]:
            failures.append(f"{sh.id}: initial weights differ between workers")
    check_errors(f"{GATE_STEPS} SGD steps from identical weights, {dtype}: losses, first-step "
                 "gradients, final LSTM weights", errs, tol, failures)  # fmt: skip
    return {"tol": tol, "dtype": dtype, "steps": GATE_STEPS, "errors": errs, "losses": out}


def measure_step(sh: Shape, _: dict, args: argparse.Namespace, peak: dict) -> dict:
    """One shape in ``args.processes`` fresh pairs of workers (a process's speed on a shape is a
    draw), each a warm-up, calibration and ceil(rounds / processes) rounds; rounds pooled."""
    t_start, parts, plan = time.perf_counter(), [], ["torch:step", "lstmgrad:step"]
    plan += ["torch:padded"] * sh.varlen
    for _ in range(args.processes):
        ws = workers(args)
        try:
            tset, lset = (ws[s].call("setup", shape=sh.to_dict(), dtype=args.dtype, seed=SEED)
                          for s in ("torch", "lstmgrad"))  # fmt: skip
            if tset["hash"] != lset["hash"] or lset["paths"]["step"]["path"] != "lstmgrad ops":
                raise SystemExit(f"{sh.id}: different initial weights, or lstmgrad.nn.LSTM did "
                                 f"not run lstmgrad's ops: {lset['paths']}")  # fmt: skip
            timer = Timer(ws, args.timing)
            warm, reps = timer.prepare(plan)  # Numba cache load, oneDNN primitives, allocator
            (kept,), disc = timer.rounds([plan], reps, math.ceil(args.rounds / args.processes))
            parts.append({"warmup": warm, "reps": reps, "rounds": kept, "discarded": disc})
        finally:
            close(ws)
    rounds = [rd for p in parts for rd in p["rounds"]]
    flops = sh.flops_fwd_bwd()  # the LSTM's alone, effective rows (also for torch padded)
    s = pair_stats(rounds, "torch:step", "lstmgrad:step", flops, peak)
    s["torch_path"] = tset["paths"]["step"]["path"]
    if sh.varlen:
        s["padded"] = pair_stats(rounds, "torch:padded", "lstmgrad:step", flops, peak)
    s["target"] = TARGET_VARLEN if sh.varlen else TARGET_DENSE
    s["meets_target"] = s["ratio"] >= s["target"]
    s["process_round"] = [k for k, p in enumerate(parts) for _ in p["rounds"]]
    return {"shape": sh.to_dict(), "label": sh.label(),
            "lengths": sh.lengths().tolist() if sh.varlen else None,
            "paths": {"torch": tset["paths"], "lstmgrad": lset["paths"]},
            **{k: [p[k] for p in parts] for k in ("warmup", "reps", "discarded")},
            "redone": sum(len(p["discarded"]) for p in parts), "rounds": rounds, "summary": s,
            "elapsed_s": time.perf_counter() - t_start}  # fmt: skip


def geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else math.nan


def report_step(doc: dict) -> list[str]:
    """Table, geometric means and targets."""
    rows, res = [], doc["results"]
    for r in res:
        sh, s, p = r["shape"], r["summary"], r["summary"].get("padded")
        met = f">= {s['target']:g}x {'met' if s['meets_target'] else 'MISSED'}"
        padded = [fmt_ms(p["torch_ms"]), *fmt_pair(p)[3:1:-1]] if p else ["-"] * 3
        path = f"{s['torch_path']} ({'packed' if r['lengths'] else 'dense'})"
        rows.append([sh["id"], " ".join(str(sh[k]) for k in "TBIHLD"), path,
                     *fmt_pair(s), met, *padded, f"{s['noisy_rounds']}/{s['rounds']}"])  # fmt: skip
    head = ["shape", "T B I H L D", "torch path", *HEAD, "target", "torch padded ms",
            "torch padded GFLOP/s", "speedup vs padded", "noisy"]  # fmt: skip
    dense = [r["summary"]["ratio"] for r in res if not r["lengths"]]
    var = [r["summary"] for r in res if r["lengths"]]
    out = [f"Training step ({doc['config']['dtype']}; ms per step = median over rounds of each "
           "batch's median step; speedup = median of per-round torch ms / lstmgrad ms)",
           "GFLOP/s: the LSTM's forward + backward GEMM FLOPs (effective rows) per step second, "
           "the rest of the step uncounted; (%): of the measured float32 GEMM peak of torch.mm, "
           f"{doc['peak']['torch']:.3g} GFLOP/s (both sides' GEMMs run on torch's)",
           md_table(head, rows), ""]  # fmt: skip
    if dense:
        out.append(f"geomean speedup, dense shapes ({len(dense)}): {geomean(dense):.2f}x "
                   f"(target >= {TARGET_DENSE:g}x per shape)")  # fmt: skip
    if var:
        out.append(f"geomean speedup, variable-length shapes ({len(var)}): "
                   f"{geomean([s['ratio'] for s in var]):.2f}x vs torch packed (target >= "
                   f"{TARGET_VARLEN:g}x per shape), "
                   f"{geomean([s['padded']['ratio'] for s in var]):.2f}x vs torch padded")  # fmt: skip
    return out


# --------------------------------------------------------------------------------------------
# both


def plot(doc: dict, path: Path) -> None:
    """The speedup chart: per shape, backward and forward + backward (--what backward) or the
    step (--what step); varlen shapes against torch's packed and padded runs."""
    m, bars, step = doc["meta"], [], doc["config"]["what"] == "step"
    for r in doc["results"]:
        sid, s = r["shape"]["id"], r["summary"]
        if step and r["lengths"]:
            bars += [(sid, "varlen: vs torch packed (target 2x)", s),
                     (sid, "varlen: vs torch padded", s["padded"])]  # fmt: skip
        elif step:
            bars.append((sid, "dense: vs torch (oneDNN)", s))
        for name in (n for n in ("bwd", "fwdbwd", "bwd_dense", "fwdbwd_dense") if n in s):
            kind = "\n(padded)" if name.endswith("_dense") else "\n(packed)" if r["lengths"] else ""
            item = "backward" if name.startswith("bwd") else "forward+backward"
            bars.append((sid + kind, item, s[name]))
    lg, torch = m["lstmgrad_worker"]["lstmgrad"], m["torch_worker"]["torch"]
    what = "training step, lstmgrad.nn.LSTM" if step else "lstmgrad"
    chart(bars, path, f"{what} {lg} vs torch {torch}\n{m['cpu']}, {m['affinity']} cores, "
          f"{m['date'][:10]}", "speedup (torch ms / lstmgrad ms)")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = options(argv)
    if args.report:
        doc = json.loads(args.report.read_text())
        step = doc["config"]["what"] == "step"
        print("\n".join(report_step(doc) if step else report_backward(doc)))
        return 0
    shapes, step = select(args.shapes), args.what == "step"
    run = Session(args, "train" if step else "bench", f"{'train_' if step else ''}speedup.png")
    args.logdir = run.logdir
    ws = workers(args)
    try:
        tinfo, linfo = ws["torch"].call("info"), ws["lstmgrad"].call("info")
        if tinfo["lstmgrad_imported"] or (
            linfo["torch_imported"] and not step and args.lstmgrad_input == "arrays"
        ):
            raise SystemExit("a worker imported the other side's library; aborting")
        # float32 peaks also in float16 runs: lstmgrad's compute dtype, and torch's float16 GEMM
        # speed varies several-fold with the sizes (no peak); lstmgrad's GEMMs on its input's
        lib = "numpy" if not step and args.lstmgrad_input == "arrays" else "torch"
        peak = {"torch": peak_gflops(run.probe, "torch"), "lstmgrad": peak_gflops(run.probe, lib)}
        drop = ("timing", "json", "png", "logdir")
        config = {k: v for k, v in vars(args).items() if k not in drop}
        config |= {"shapes": [s.id for s in shapes], "timing": asdict(args.timing), "seed": SEED}
        run.start(tinfo, linfo, worker_lines(args, tinfo, linfo), config=config, peak=peak)
        run.doc["gate"] = gate_step(ws, args.dtype) if step else gate_backward(ws)
        close(ws)  # each shape gets fresh workers
        say(f"timing   {len(shapes)} shapes, {args.dtype}, {args.rounds} rounds in "
            f"{args.processes} fresh worker pairs each, ~{args.timing.target_s:g} s per batch")  # fmt: skip
        results = run.doc["results"] = []
        for sh in shapes:
            r = (measure_step if step else measure_backward)(sh, ws, args, peak)
            s = r["summary"]
            pairs = {"step": s, "vs padded": s.get("padded")} if step else s
            ratios = ", ".join(f"{k} {v['ratio']:.2f}x" for k, v in pairs.items() if v)
            say(f"  {sh.id:9s} {sh.label():36s} {ratios} ({r['elapsed_s']:.0f} s, {r['redone']} "
                "redone for other processes' CPU use)")  # fmt: skip
            results.append(r)
            run.save()
    except WorkerError as exc:
        print(f"\nworker failure: {exc}", file=sys.stderr)
        return 1
    finally:
        close(ws)
    say("", *(report_step(run.doc) if step else report_backward(run.doc)), "")
    plot(run.doc, run.png_path)
    run.finish()
    return 0


if __name__ == "__main__":
    run_main(main)
