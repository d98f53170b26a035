"""lstmgrad vs torch.nn.LSTM on CPU, each side in its own worker process: a correctness gate,
interleaved timings, tables, JSON and a speedup chart.

    python benchmarks/run.py [--what backward|step] [--shapes id,id] [--rounds N] [--quick]
                             [--dtype float16] [--json PATH] [--png PATH]
    python benchmarks/run.py --report PATH      # the tables of a saved JSON again

``--what backward`` (default): lstm_backward, and lstm_forward + lstm_backward, against
torch.autograd.backward of nn.LSTM (worker.py torch | lstmgrad). ``--what step``: a whole
training step, Linear -> LSTM -> Linear with SGD, with lstmgrad.nn.LSTM against torch.nn.LSTM
(worker.py step-torch | step-lstmgrad), each shape in fresh worker pairs. NumPy's OpenBLAS and
PyTorch's BLAS in one process were measured 35x slower, so this parent imports neither; it asks
the workers in turn for timed batches (the first side flipped every round) and reports medians
over rounds and the median of the per-round ratios torch ms / lstmgrad ms. See README.md here.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _harness import (  # noqa: E402
    Session,
    Timer,
    Timing,
    chart,
    fmt_gflops,
    fmt_ms,
    fmt_ratio,
    gate_failed,
    md_table,
    ms_rounds,
    pair_stats,
    say,
)
from _machine import CpuWatch, med, peak_gflops, rel_err  # noqa: E402
from _protocol import Worker, WorkerError, decode, encode  # noqa: E402
from shapes import SHAPES, Shape, make_case, select  # noqa: E402

WORKER = HERE / "worker.py"
GATE_TOL_F32 = 1e-4  # backward: fused vs reference, float32, max relative error
GATE_TOL_F64 = 1e-9  # backward: torch float64 autograd vs lstmgrad float64 reference
ORACLE_SHAPES = [Shape("oracle-dense", 4, 3, 5, 6, 2, 2),
                 Shape("oracle-varlen", 5, 4, 5, 6, 2, 2, (2, 5))]  # fmt: skip
GEMM_ITEMS = ("gemm_bwd", "gemm_bwd_nodx", "gemm_fwd")
# step, float16: torch rounds every GEMM and gate to float16, lstmgrad computes in float32 (and a
# gradient's error is taken relative to the model's largest gradient, see gate_step)
STEP_TOLS = {"float32": 1e-4, "float16": 2e-2}
GATE_STEPS, SEED = 3, 0
TARGET_DENSE, TARGET_VARLEN = 1.0, 2.0  # the project's speedup targets for the step


def options(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = ap.add_argument
    add("--what", choices=("backward", "step"), default="backward", help="what is timed")
    add("--shapes", help="comma-separated shape ids (default: all 12)")
    add("--rounds", type=int, help="timed rounds (default 5, step 6; 2 with --quick)")
    add("--quick", action="store_true", help="smoke run: 2 rounds, short batches")
    add("--json", type=Path, help="results (default benchmarks/results/...json)")
    add("--png", type=Path, help="speedup chart (default benchmarks/results/...png)")
    add("--target-s", type=float, help="seconds of timed work per batch (default 0.5)")
    add("--dtype", choices=("float32", "float16"), default="float32")
    add("--pause-s", type=float, default=0.2, help="pause after each batch (default 0.2)")
    add("--noise-cores", type=float, default=0.25,
        help="redo a pair (step: a round) when other processes used more cores (default 0.25)")  # fmt: skip
    add("--max-retries", type=int, default=2, help="redos per pair or round (default 2)")
    add("--budget-s", type=float, help="seconds for all shapes' timings (default 780, step 600)")
    add("--no-first-call", action="store_true", help="backward: skip the first-call latency")
    add("--lstmgrad-input", choices=("arrays", "tensors"), default="arrays",
        help="backward: what lstmgrad is given, NumPy arrays (its GEMMs on NumPy's BLAS) or "
        "torch tensors over the same memory (its GEMMs on torch's)")  # fmt: skip
    add("--processes", type=int, help="step: fresh worker pairs per shape (default 3)")
    add("--threads", type=int, help="step: torch.set_num_threads in both workers")
    add("--report", type=Path, help="print the tables of a saved JSON and exit")
    args = ap.parse_args(argv)
    step, q = args.what == "step", args.quick
    args.rounds = args.rounds or (2 if q else 6 if step else 5)
    args.budget_s = args.budget_s or (600.0 if step else 780.0)
    args.processes = max(1, args.processes or (1 if q or not step else 3))
    target = args.target_s or ((0.1 if step else 0.05) if q else 0.5)
    args.timing = Timing(target, 1 if q else 3 if step else 2, 3 if step and not q else 1,
                         3 if q else 10_000, args.pause_s, args.noise_cores,
                         0 if q and step else args.max_retries)  # fmt: skip
    return args


def workers(args: argparse.Namespace, logdir: Path) -> dict[str, Worker]:
    """A torch and a lstmgrad worker.py for ``args.what``."""
    if args.what == "step":
        extra = ("--threads", str(args.threads)) if args.threads else ()
        return {s: Worker(s, WORKER, logdir / f"{s}.log", argv=(f"step-{s}", *extra))
                for s in ("torch", "lstmgrad")}  # fmt: skip
    env = dict(os.environ, LSTMGRAD_BENCH_INPUT=args.lstmgrad_input)
    return {"torch": Worker("torch", WORKER, logdir / "torch.log", argv=("torch",)),
            "lstmgrad": Worker("lstmgrad", WORKER, logdir / "lstmgrad.log", env, ("lstmgrad",))}  # fmt: skip


def close(ws: dict[str, Worker]) -> None:
    for w in ws.values():
        w.close()


def worker_lines(args: argparse.Namespace, t: dict, lg: dict) -> list[str]:
    out = [f"torch    worker: {t['num_threads']} threads (interop {t['num_interop_threads']}), "
           f"mkldnn enabled {t['mkldnn_enabled']}, {args.dtype}"]  # fmt: skip
    if args.what == "step":
        return out + [f"lstmgrad {lg['lstmgrad']} (lstmgrad.nn.LSTM, GEMMs on torch: oneDNN or "
                      f"torch.mm), torch threads {lg['num_threads']} in its worker; Numba "
                      f"{lg['numba']} ({lg['numba_threads']} threads)"]  # fmt: skip
    inp = "NumPy arrays, lstmgrad's GEMMs on NumPy's BLAS"
    if lg["input"] == "tensors":
        inp = (
            f"torch {lg['torch']} tensors, lstmgrad's GEMMs on torch ({lg['num_threads']} threads)"
        )
    return out + [f"lstmgrad {lg['lstmgrad']} engine fused; NumPy {lg['numpy']} (its BLAS: the "
                  f"probe's NumPy line); Numba {lg['numba']} ({lg['numba_threads']} threads)",
                  f"input    {lg['input']}: {inp}"]  # fmt: skip


def check(failures: list[str], log: list[str]) -> None:
    if failures:
        gate_failed(log, failures)
    say(*log)


# --------------------------------------------------------------------------------------------
# --what backward


def pairs_of(sh: Shape) -> dict[str, tuple[str, str]]:
    """Pair name -> (torch item, lstmgrad item); varlen shapes also pair torch's padded run."""
    out = {p: (p, p) for p in ("bwd", "fwdbwd", "bwd_nodx")}
    if sh.varlen:
        out |= {"bwd_dense": ("bwd_dense", "bwd"), "fwdbwd_dense": ("fwdbwd_dense", "fwdbwd")}
    return out


def gate_backward(ws: dict[str, Worker]) -> dict:
    """Exit 2 unless torch's float64 autograd matches lstmgrad's float64 reference on tiny cases
    and the fused engine matches the reference on a scaled-down version of every shape."""
    result: dict[str, Any] = {"tol_f32": GATE_TOL_F32, "tol_f64": GATE_TOL_F64}
    failures, log = [], []
    oracle = result["torch_vs_reference_f64"] = {}
    for sh in ORACLE_SHAPES:
        enc = encode(make_case(sh, "float64", seed=7))
        want = decode(ws["torch"].call("autograd64", shape=sh.to_dict(), case=enc))
        got = decode(ws["lstmgrad"].call("reference64", shape=sh.to_dict(), case=enc))
        errs = {k: rel_err(got[k], want[k]) for k in ("dx", "dh_prev", "dc_prev", "hy", "cy")}
        errs["dparams"] = max(map(rel_err, got["dparams"], want["dparams"]))
        worst = max(oracle.setdefault(sh.id, errs).values())
        log.append(f"gate     torch f64 autograd vs lstmgrad f64 reference, {sh.label()}: "
                   f"max rel err {worst:.1e}")  # fmt: skip
        if not worst <= GATE_TOL_F64:
            failures.append(f"{sh.id}: torch float64 vs lstmgrad reference: {errs}")
    fused = ws["lstmgrad"].call("gate_fused", shapes=[s.scaled().to_dict() for s in SHAPES])
    result["fused_vs_reference_f32"], worst_all = fused, 0.0
    for sid, res in fused.items():
        for case, errs in res.items():
            worst_all = max(worst_all, *errs.values())
            if not max(errs.values()) <= GATE_TOL_F32:
                failures.append(f"{sid} {case}: fused vs reference float32: {errs}")
    log.append(f"gate     fused vs reference f32, {len(fused)} scaled shapes (T<=6), backward "
               f"(+no dx) and fwd+bwd: max rel err {worst_all:.1e} (tol {GATE_TOL_F32:g})")  # fmt: skip
    check(failures, log)
    return result


def first_call(sh: Shape, logdir: Path, args: argparse.Namespace, name: str, **env: str) -> dict:
    """Import and first calls in a fresh lstmgrad worker (``env``: e.g. an empty Numba cache)."""
    env = dict(os.environ, LSTMGRAD_BENCH_INPUT=args.lstmgrad_input, **env)
    w = Worker(name, WORKER, logdir / f"{name}.log", env, ("lstmgrad",))
    try:
        with CpuWatch(w.proc.pid) as watch:
            out = w.call("first_call", shape=sh.to_dict(), dtype=args.dtype)
    finally:
        w.close()
    time.sleep(args.pause_s)
    return out | {"other_cores": round(watch.foreign_cores, 3), "shape": sh.id}


def cold_first_call(sh: Shape, logdir: Path, args: argparse.Namespace) -> dict:
    """First calls in a fresh process whose Numba cache is empty: the JIT compile itself."""
    with tempfile.TemporaryDirectory(prefix="lstmgrad-numba-cache-") as cache:
        out = first_call(sh, logdir, args, "lstmgrad-cold", NUMBA_CACHE_DIR=cache)
        out["cache_files_written"] = sum(len(f) for _, _, f in os.walk(cache))
    return out


def measure_backward(
    sh: Shape, ws: dict[str, Worker], args: argparse.Namespace, logdir: Path, share_s: float,
    peak: dict,
) -> dict:  # fmt: skip
    """All measurements of one shape; noisy pairs are redone only within ``share_s`` seconds.
    ``peak``: GFLOP/s of each side's GEMM library, the denominators of the peak fractions."""
    t_start = time.perf_counter()
    tset, lset = (ws[s].call("setup", shape=sh.to_dict(), dtype=args.dtype)
                  for s in ("torch", "lstmgrad"))  # fmt: skip
    if lset["torch_imported"] and args.lstmgrad_input == "arrays":
        raise SystemExit("lstmgrad worker imported torch: the measurement would be invalid")
    pairs, timer = pairs_of(sh), Timer(ws, args.timing)
    groups = [[("torch", t), ("lstmgrad", lg)] for t, lg in pairs.values()]
    gemm_items = [g for g in GEMM_ITEMS if g in lset["items"]]  # none with tensors
    gemm_groups = [[("lstmgrad", g)] for g in gemm_items]
    warm, reps = timer.prepare([i for grp in groups + gemm_groups for i in grp])
    kept, discarded = timer.rounds(groups, reps, args.rounds, t_start + share_s)
    gemm_kept, gemm_discarded = timer.rounds(gemm_groups, reps, args.rounds, t_start + share_s)
    mem = ws["lstmgrad"].call("memory")
    first = None if args.no_first_call else first_call(sh, logdir, args, "lstmgrad-fresh")
    # effective rows (sum of the lengths) also for torch's padded run: useful work per second
    flops = {"bwd": sh.flops_backward(), "fwdbwd": sh.flops_fwd_bwd(),
             "bwd_nodx": sh.flops_backward(dx=False)}  # fmt: skip
    raw, s = {}, {}
    for g, (name, (ti, li)) in enumerate(pairs.items()):
        rounds = kept[g]
        raw[name] = {"rounds": rounds, "discarded": [d for d in discarded if d["group"] == g]}
        t_ms, l_ms = ms_rounds(rounds, f"torch:{ti}"), ms_rounds(rounds, f"lstmgrad:{li}")
        s[name] = pair_stats(t_ms, l_ms, flops[name.removesuffix("_dense")], peak)
        s[name]["torch_path"] = tset["paths"][ti]["path"]
        s[name]["noisy_rounds"] = sum(any(b["noisy"] for b in r.values()) for r in rounds)
    gemm_s = {g: [r[f"lstmgrad:{g}"] for r in gemm_kept[k]] for k, g in enumerate(gemm_items)}
    gemm = {g: med([1e3 * med(b["s"]) for b in gemm_s.get(g, [])]) for g in GEMM_ITEMS}
    nodx = [a / b for a, b in zip(s["bwd_nodx"]["lg_ms_round"], s["bwd"]["lg_ms_round"],
                                  strict=True)]  # fmt: skip
    derived = {
        "flops_bwd_padded": sh.flops_backward(False),
        "flops_fwd_bwd_padded": sh.flops_fwd_bwd(False),
        "gemm_ms": gemm,
        "gemm_frac_bwd": gemm["gemm_bwd"] / s["bwd"]["lg_ms"],
        "gemm_frac_bwd_nodx": gemm["gemm_bwd_nodx"] / s["bwd_nodx"]["lg_ms"],
        "gemm_frac_fwdbwd": (gemm["gemm_fwd"] + gemm["gemm_bwd"]) / s["fwdbwd"]["lg_ms"],
        "gemm_bwd_over_torch_bwd": gemm["gemm_bwd"] / s["bwd"]["torch_ms"],
        "nodx_over_full": med(nodx),
        "nodx_over_full_round": nodx,
    }
    return {"shape": sh.to_dict(), "label": sh.label(),
            "lengths": sh.lengths().tolist() if sh.varlen else None,
            "batch_sizes": None if (bs := sh.batch_sizes()) is None else bs.tolist(),
            "torch_paths": tset["paths"], "warmup_s": warm, "reps": reps, "pairs": raw,
            "gemm_s": gemm_s, "summary": s, "derived": derived, "memory": mem,
            "first_call": first, "redone_batches": len(discarded) + len(gemm_discarded),
            "time_share_s": share_s, "elapsed_s": time.perf_counter() - t_start}  # fmt: skip


def variant(res: dict, pair: str) -> str:
    """What torch ran: dense, or for a varlen shape packed or padded."""
    if res["shape"]["lengths_range"] is None:
        return "dense"
    return "padded" if pair.endswith("_dense") else "packed"


def report_backward(doc: dict) -> list[str]:
    """The tables: backward, forward + backward, backward without dx, first calls."""
    res_all, peak = doc["results"], doc["peak"]
    tables = [  # title, pairs, GEMM-only fraction, memory items, last column
        ("Backward alone", ("bwd", "bwd_dense"), "bwd", ("bwd",), "first call s",
         lambda r, fc: f"{fc['bwd1_s']:.2f}" if fc else "-"),
        ("Forward + backward (training step of the LSTM alone)", ("fwdbwd", "fwdbwd_dense"),
         "fwdbwd", ("fwd", "bwd"), "first call s",
         lambda r, fc: f"{fc['fwd1_s'] + fc['bwd1_s']:.2f}" if fc else "-"),
        ("Backward without layer-0 dx (lstmgrad output_mask=(False, True, True, True); torch "
         "input.requires_grad=False)", ("bwd_nodx",), "bwd_nodx", ("bwd_nodx",), "no-dx/full",
         lambda r, fc: f"{r['derived']['nodx_over_full']:.2f}"),
    ]  # fmt: skip
    out = [f"{doc['config']['dtype']}; speedup = median of per-round torch ms / lstmgrad ms; "
           "GFLOP/s: GEMM FLOPs (effective rows) per second; (%): of the measured float32 GEMM "
           f"peak of the side's library, torch {peak['torch']:.3g}, lstmgrad "
           f"{peak['lstmgrad']:.3g} GFLOP/s"]  # fmt: skip
    for title, names, gemm, mem_items, last, last_fn in tables:
        head = ["shape", "torch path", "torch ms", "lstmgrad ms", "speedup [min-max]",
                "torch GFLOP/s", "lstmgrad GFLOP/s", "GEMM-only", "extra MB", last, "noisy"]  # fmt: skip
        rows = []
        for r in res_all:
            for name in (n for n in names if n in r["summary"]):
                s, mem = r["summary"][name], r["memory"]
                frac = r["derived"][f"gemm_frac_{gemm}"]
                extra = max(mem[i]["extra"] for i in mem_items) / 1e6 if mem else math.nan
                rows.append([
                    r["shape"]["id"], f"{s['torch_path']} ({variant(r, name)})",
                    fmt_ms(s["torch_ms"]), fmt_ms(s["lg_ms"]), fmt_ratio(s),
                    fmt_gflops(s, "torch"), fmt_gflops(s, "lg"),
                    "-" if math.isnan(frac) else f"{frac:.2f}",
                    "-" if math.isnan(extra) else f"{extra:.1f}",
                    last_fn(r, r["first_call"]), f"{s['noisy_rounds']}/{s['rounds']}",
                ])  # fmt: skip
        out += ["", title, md_table(head, rows)]
    fc_rows = [[r["shape"]["id"], f"{fc['import_s']:.2f}",
                *(f"{fc[k]:.3f}" for k in ("fwd1_s", "bwd1_s", "fwd2_s", "bwd2_s"))]
               for r in res_all if (fc := r["first_call"])]  # fmt: skip
    if fc_rows:
        out += ["", "First calls in a fresh lstmgrad process (s; JIT compile or cache load), vs "
                "the second call", md_table(["shape", "import", "1st fwd", "1st bwd", "2nd fwd",
                                             "2nd bwd"], fc_rows)]  # fmt: skip
    return out


# --------------------------------------------------------------------------------------------
# --what step


def gate_shape(sh: Shape) -> Shape:
    """The step gate's small version of a shape: T <= 6, B <= 5, I and H / 16 (at least 4)."""
    return replace(sh.scaled(), I=max(4, sh.I // 16), H=max(4, sh.H // 16))


def gate_step(ws: dict[str, Worker], dtype: str) -> dict:
    """Both sides train every scaled shape GATE_STEPS steps from the same weights; exit 2 if
    the initial weights differ or the losses, first-step gradients (every parameter) or final
    LSTM parameters do."""
    tol = STEP_TOLS[dtype]
    out: dict[str, Any] = {"tol": tol, "dtype": dtype, "steps": GATE_STEPS, "shapes": {}}
    failures, worst = [], {"losses": 0.0, "gradients": 0.0, "params": 0.0}
    for full in SHAPES:
        sh = gate_shape(full)
        want, got = (ws[s].call("gate_step", shape=sh.to_dict(), dtype=dtype, steps=GATE_STEPS,
                                seed=SEED) for s in ("torch", "lstmgrad"))  # fmt: skip
        if want["lstmgrad_imported"]:
            raise SystemExit("the torch worker imported lstmgrad; aborting")
        g_got, g_want = decode(got["grads"]), decode(want["grads"])
        # float16: against the model's largest gradient, since the tiny gradients deep in a
        # stack round differently when torch rounds every step to float16 and lstmgrad does not
        scale = max(float(np.max(np.abs(g))) for g in g_want.values())
        p_got, p_want = decode(got["params"]), decode(want["params"])
        errs: dict[str, Any] = {
            "losses": max(map(rel_err, got["losses"], want["losses"])),
            "gradients": {n: rel_err(g_got.get(n), g) * (float(np.max(np.abs(g))) / scale
                          if dtype == "float16" else 1.0) for n, g in g_want.items()},
            "params": max(map(rel_err, p_got, p_want)) if len(p_got) == len(p_want) else math.inf,
        }  # fmt: skip
        same = got["hash"] == want["hash"]
        out["shapes"][full.id] = {"label": sh.label(), "same_initial_weights": same,
                                  "torch_losses": want["losses"],
                                  "lstmgrad_losses": got["losses"], **errs}  # fmt: skip
        if not same:
            failures.append(f"{full.id} ({sh.label()}): initial weights differ between workers")
        for what, e in errs.items():
            vals = e if isinstance(e, dict) else {"": e}
            worst[what] = max(worst[what], *vals.values())
            if bad := {n: f"{v:.2e}" for n, v in vals.items() if not v <= tol}:
                failures.append(f"{full.id} ({sh.label()}): {what} differ (rel err > {tol:g}): "
                                f"{bad}; losses torch {want['losses']}, lstmgrad {got['losses']}")  # fmt: skip
    check(failures, [f"gate     {GATE_STEPS} SGD steps from identical weights, {len(SHAPES)} "
                     f"scaled shapes (T<=6, B<=5, I,H/16), {dtype}: max rel err losses "
                     f"{worst['losses']:.1e}, first-step gradients {worst['gradients']:.1e}, "
                     f"final LSTM params {worst['params']:.1e} (tol {tol:g})"])  # fmt: skip
    return out


def measure_in(sh: Shape, args: argparse.Namespace, logdir: Path, share_s: float) -> dict:
    """Warm-up, calibration, ceil(rounds / processes) interleaved rounds and a profile of one
    shape in one fresh pair of workers."""
    t_start = time.perf_counter()
    ws = workers(args, logdir)
    try:
        tset, lset = (ws[s].call("setup", shape=sh.to_dict(), dtype=args.dtype, seed=SEED)
                      for s in ("torch", "lstmgrad"))  # fmt: skip
        if tset["hash"] != lset["hash"] or tset["lstmgrad_imported"]:
            raise SystemExit(f"{sh.id}: different initial weights, or lstmgrad in the torch worker")
        if lset["paths"]["step"]["path"] != "lstmgrad ops":
            raise SystemExit(f"{sh.id}: lstmgrad.nn.LSTM did not run lstmgrad's ops (LSTM ops "
                             f"seen: {lset['paths']['step']['ops']})")  # fmt: skip
        plan = [("torch", "step"), ("lstmgrad", "step")] + [("torch", "padded")] * sh.varlen
        timer = Timer(ws, args.timing)
        warm, reps = timer.prepare(plan)  # Numba cache load, oneDNN primitives, allocator
        n = math.ceil(args.rounds / args.processes)
        (rounds,), discarded = timer.rounds([plan], reps, n, t_start + share_s)
        prof = {f"{s}:{i}": ws[s].call("profile", item=i, steps=3) for s, i in plan}
    finally:
        close(ws)
    return {"paths": {"torch": tset["paths"], "lstmgrad": lset["paths"]},
            "weights_hash": tset["hash"], "warmup": warm, "reps": reps, "rounds": rounds,
            "discarded": discarded, "profile": prof}  # fmt: skip


def measure_step(
    sh: Shape, args: argparse.Namespace, logdir: Path, share_s: float, peak: dict
) -> dict:
    """One shape timed in ``args.processes`` fresh pairs of workers, its rounds pooled (a
    process's speed on a shape is a draw: with one pair the table would report one draw)."""
    t_start = time.perf_counter()
    parts = [measure_in(sh, args, logdir, share_s / args.processes) for _ in range(args.processes)]
    rounds = [rd for part in parts for rd in part["rounds"]]
    flops = sh.flops_fwd_bwd()  # the LSTM's alone, effective rows (also for torch padded)
    l_ms = ms_rounds(rounds, "lstmgrad:step")
    s = pair_stats(ms_rounds(rounds, "torch:step"), l_ms, flops, peak)
    s["torch_path"] = parts[0]["paths"]["torch"]["step"]["path"]
    if sh.varlen:
        s["padded"] = pair_stats(ms_rounds(rounds, "torch:padded"), l_ms, flops, peak)
    s["target"] = TARGET_VARLEN if sh.varlen else TARGET_DENSE
    s["meets_target"] = s["ratio"] >= s["target"]
    s["noisy_rounds"] = sum(any(b["noisy"] for b in rd.values()) for rd in rounds)
    s["redone_rounds"] = sum(len(p["discarded"]) for p in parts)
    s["process_round"] = [p for p, part in enumerate(parts) for _ in part["rounds"]]
    # the shape's first step in each fresh worker (kernels cached on disk by the gate)
    s["first_step_ms"] = {k: [1e3 * p["warmup"][k][0]["s"][0] for p in parts]
                          for k in parts[0]["warmup"]}  # fmt: skip
    return {"shape": sh.to_dict(), "label": sh.label(),
            "lengths": sh.lengths().tolist() if sh.varlen else None,
            "warmup": [p["warmup"] for p in parts], "reps": [p["reps"] for p in parts],
            "rounds": rounds, "discarded": [rd for p in parts for rd in p["discarded"]],
            **{k: parts[0][k] for k in ("paths", "weights_hash", "profile")},
            "summary": s, "elapsed_s": time.perf_counter() - t_start}  # fmt: skip


def geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else math.nan


def report_step(doc: dict) -> list[str]:
    """Table, geometric means and targets, profile lines."""
    results, cfg = doc["results"], doc["config"]
    head = ["shape", "T B I H L D", "torch path", "torch ms", "lstmgrad ms", "speedup [min-max]",
            "target", "torch GFLOP/s", "lstmgrad GFLOP/s", "torch padded ms",
            "torch padded GFLOP/s", "speedup vs padded", "noisy"]  # fmt: skip
    rows = []
    for r in results:
        sh, s, p = r["shape"], r["summary"], r["summary"].get("padded")
        rows.append([
            sh["id"], " ".join(str(sh[k]) for k in "TBIHLD"), s["torch_path"],
            fmt_ms(s["torch_ms"]), fmt_ms(s["lg_ms"]), fmt_ratio(s),
            f">= {s['target']:g}x {'met' if s['meets_target'] else 'MISSED'}",
            fmt_gflops(s, "torch"), fmt_gflops(s, "lg"),
            *((fmt_ms(p["torch_ms"]), fmt_gflops(p, "torch"), fmt_ratio(p)) if p else ("-",) * 3),
            f"{s['noisy_rounds']}/{s['rounds']}",
        ])  # fmt: skip
    gm = doc["geomeans"]
    out = [f"Training step ({cfg['dtype']}; ms per step = median over rounds of each batch's "
           "median step; speedup = median of per-round torch ms / lstmgrad ms)",
           "GFLOP/s: the LSTM's forward + backward GEMM FLOPs (effective rows) per step second, "
           "the rest of the step uncounted; (%): of the measured float32 GEMM peak of torch.mm, "
           f"{doc['peak']['torch']:.3g} GFLOP/s (both sides' GEMMs run on torch's)",
           md_table(head, rows), ""]  # fmt: skip
    if gm["dense_n"]:
        out.append(f"geomean speedup, dense shapes ({gm['dense_n']}): {gm['dense']:.2f}x "
                   f"(target >= {TARGET_DENSE:g}x per shape)")  # fmt: skip
    if gm["varlen_n"]:
        out.append(f"geomean speedup, variable-length shapes ({gm['varlen_n']}): "
                   f"{gm['varlen_vs_packed']:.2f}x vs torch packed, {gm['varlen_vs_padded']:.2f}x "
                   f"vs torch padded (target >= {TARGET_VARLEN:g}x per shape, vs packed)")  # fmt: skip
    for label, ok in (("met", True), ("MISSED", False)):
        ids = [r["shape"]["id"] for r in results if r["summary"]["meets_target"] == ok]
        out.append(f"targets {label} ({len(ids)}): {', '.join(ids) or 'none'}")
    if noisy := [r["shape"]["id"] for r in results if r["summary"]["noisy_rounds"]]:
        out.append(f"other processes used the CPU during some kept rounds of: {', '.join(noisy)} "
                   "(see the noisy column; rerun on a quiet machine to confirm)")  # fmt: skip
    out += ["", "Profile (autograd profiler, 3 steps after the timings; its overhead inflates the "
            "times, so read the shares): LSTM fwd/bwd = the LSTM's ops, inclusive; top = self time"]  # fmt: skip
    for r in results:
        for key, p in r["profile"].items():
            tot = max(p["self_ms_total"], 1e-9)
            lstm = "LSTM fwd/bwd not separable (packed path: per-step ops)"
            if p["lstm_fwd_ms"] or p["lstm_bwd_ms"]:
                lstm = (f"LSTM fwd {100 * p['lstm_fwd_ms'] / tot:3.0f}% bwd "
                        f"{100 * p['lstm_bwd_ms'] / tot:3.0f}%")  # fmt: skip
            top = ", ".join(f"{t['op']} {100 * t['self_ms'] / tot:.0f}% ({t['calls']:g} calls)"
                            for t in p["top"][:2])  # fmt: skip
            out.append(f"  {r['shape']['id']:9s} {key:15s} {tot:8.1f} ms/step profiled; {lstm}; "
                       f"top {top}")  # fmt: skip
    return out


# --------------------------------------------------------------------------------------------
# both


def report(doc: dict) -> list[str]:
    step = doc["config"].get("what") == "step" or "geomeans" in doc
    return report_step(doc) if step else report_backward(doc)


def plot(doc: dict, path: Path) -> None:
    """The speedup chart: per shape, backward and forward + backward (--what backward) or the
    step (--what step; varlen shapes against torch's packed and padded runs)."""
    m, bars, step = doc["meta"], [], doc["config"]["what"] == "step"
    for r in doc["results"]:
        sid, s = r["shape"]["id"], r["summary"]
        if step and r["shape"]["lengths_range"]:
            bars += [(sid, "varlen: vs torch packed (target 2x)", s),
                     (sid, "varlen: vs torch padded", s["padded"])]  # fmt: skip
        elif step:
            bars.append((sid, "dense: vs torch (oneDNN)", s))
        else:
            for name in (n for n in ("bwd", "fwdbwd", "bwd_dense", "fwdbwd_dense") if n in s):
                v = variant(r, name)
                item = "backward" if name.startswith("bwd") else "forward+backward"
                bars.append((sid + ("" if v == "dense" else f"\n({v})"), item, s[name]))
    lg, torch = m["lstmgrad_worker"]["lstmgrad"], m["torch_worker"]["torch"]
    when = f"{m['cpu']}, {m['affinity']} cores, {m['date'][:10]}"
    if step:
        title = f"training step: lstmgrad.nn.LSTM {lg} vs torch.nn.LSTM {torch}\n{when}"
        chart(bars, path, title, "speedup (torch ms / lstmgrad ms per step)")
    else:
        chart(bars, path, f"lstmgrad {lg} vs torch {torch}, {when}",
              "speedup over PyTorch (torch ms / lstmgrad ms)")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = options(argv)
    if args.report:
        print("\n".join(report(json.loads(args.report.read_text()))))
        return 0
    shapes, step = select(args.shapes), args.what == "step"
    run = Session(args, "train" if step else "bench", f"{'train_' if step else ''}speedup.png")
    ws = workers(args, run.logdir)
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
        config = {k: v for k, v in vars(args).items() if k not in ("timing", "json", "png")}
        config |= {"shapes": [s.id for s in shapes], "timing": asdict(args.timing), "seed": SEED}
        run.start(tinfo, linfo, worker_lines(args, tinfo, linfo), config=config, peak=peak)
        if step:
            run.doc["gate"] = gate_step(ws, args.dtype)
            close(ws)  # each shape gets fresh workers
        else:
            run.doc["gate"] = gate_backward(ws)
            if not args.no_first_call:
                c = run.doc["cold_first_call"] = cold_first_call(shapes[0], run.logdir, args)
                say(f"jit      fresh process, empty Numba cache, {c['shape']}: import "
                    f"{c['import_s']:.2f} s, 1st forward {c['fwd1_s']:.2f} s, 1st backward "
                    f"{c['bwd1_s']:.2f} s (2nd: {c['fwd2_s']:.3f} s, {c['bwd2_s']:.3f} s; "
                    f"{c['cache_files_written']} cache files written)")  # fmt: skip
        say(f"timing   {len(shapes)} shapes, {args.dtype}, {args.rounds} rounds"
            + (f" in {args.processes} fresh worker pairs each" if step else "")
            + f", ~{args.timing.target_s:g} s per batch, pause {args.pause_s:g} s")  # fmt: skip
        results = run.doc["results"] = []
        for sh, share in run.shapes(shapes, args.budget_s):
            if step:
                r = measure_step(sh, args, run.logdir, share, peak)
                s, pad = r["summary"], r["summary"].get("padded")
                say(f"  {sh.id:9s} {sh.label():36s} torch {fmt_ms(s['torch_ms'])} ms, lstmgrad "
                    f"{fmt_ms(s['lg_ms'])} ms: {s['ratio']:.2f}x"
                    + (f", vs padded {pad['ratio']:.2f}x" if pad else "")
                    + f" ({r['elapsed_s']:.0f} s, {s['redone_rounds']} rounds redone, "
                    f"{s['noisy_rounds']} kept noisy)")  # fmt: skip
            else:
                r = measure_backward(sh, ws, args, run.logdir, share, peak)
                s = r["summary"]
                say(f"  {sh.id:9s} {sh.label():36s} bwd {s['bwd']['ratio']:.2f}x  fwd+bwd "
                    f"{s['fwdbwd']['ratio']:.2f}x  ({r['elapsed_s']:.0f} s, "
                    f"{r['redone_batches']} batches redone for other CPU load)")  # fmt: skip
            results.append(r)
        if step:
            dense = [r["summary"] for r in results if not r["shape"]["lengths_range"]]
            var = [r["summary"] for r in results if r["shape"]["lengths_range"]]
            run.doc["geomeans"] = {
                "dense": geomean([s["ratio"] for s in dense]), "dense_n": len(dense),
                "varlen_vs_packed": geomean([s["ratio"] for s in var]),
                "varlen_vs_padded": geomean([s["padded"]["ratio"] for s in var]),
                "varlen_n": len(var),
            }  # fmt: skip
        run.finish()
    except WorkerError as exc:
        print(f"\nworker failure: {exc}", file=sys.stderr)
        return 1
    finally:
        close(ws)
    say("", *report(run.doc), "")
    plot(run.doc, run.png_path)
    run.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
