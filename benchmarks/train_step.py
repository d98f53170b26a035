"""Full training step, lstmgrad.nn.LSTM vs torch.nn.LSTM on CPU, each side in its own process.

    python benchmarks/train_step.py [--shapes id,id] [--rounds N] [--processes P] [--quick]
                                    [--dtype float16] [--json P] [--png P]

One step = zero_grad, forward of Linear(I, I) -> LSTM -> Linear(D*H, 64), cross-entropy over the
valid time steps, backward, SGD(lr=1e-3, momentum=0.9).step(). Both workers run
benchmarks/worker_train.py (``--impl torch``, which never imports lstmgrad, and ``--impl
lstmgrad``); this parent imports neither. It first checks, on a scaled-down version of every
shape, that three steps give the same losses, gradients and LSTM weights on both sides (exit 2
otherwise), then times each shape in several fresh pairs of workers, interleaved batches in each,
and reports medians and the median of the per-round ratios over all of them.
See benchmarks/README.md, section "Training step".
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _harness import (  # noqa: E402
    Session,
    Timer,
    Timing,
    add_options,
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
from _machine import peak_gflops, rel_err  # noqa: E402
from _protocol import Worker, WorkerError, decode  # noqa: E402
from shapes import SHAPES, Shape, select  # noqa: E402

# float16: torch rounds every GEMM and gate to float16, lstmgrad computes in float32 (and a
# gradient's error is taken relative to the model's largest gradient, see gate)
GATE_TOLS = {"float32": 1e-4, "float16": 2e-2}
GATE_STEPS = 3
TARGET_DENSE, TARGET_VARLEN = 1.0, 2.0  # the project's speedup targets
SEED = 0


@dataclass
class Config:
    rounds: int  # timed rounds of a shape, over all its worker pairs
    processes: int  # fresh worker pairs per shape (a process's speed on a shape is a draw)
    target_s: float  # aimed seconds of timed steps per batch
    warmup_steps: int
    min_reps: int  # steps per batch, at least
    max_reps: int
    pause_s: float
    noise_cores: float  # a round is redone when other processes used more CPU than this
    max_retries: int
    budget_s: float  # time for the timings of all shapes; redos stop past a shape's share
    dtype: str = "float32"  # of the model, its input and its training, gate included
    threads: int | None = None  # torch.set_num_threads in both workers

    def timing(self) -> Timing:
        return Timing(self.target_s, self.warmup_steps, self.min_reps, self.max_reps,
                      self.pause_s, self.noise_cores, self.max_retries)  # fmt: skip

    def workers(self, logdir: Path) -> tuple[Worker, Worker]:
        """A torch and a lstmgrad ``worker_train.py``."""
        extra = ["--dtype", self.dtype] + (["--threads", str(self.threads)] if self.threads else [])
        return tuple(  # type: ignore[return-value]
            Worker(i, HERE / "worker_train.py", logdir / f"{i}.log", argv=("--impl", i, *extra))
            for i in ("torch", "lstmgrad")
        )


def gate_shape(sh: Shape) -> Shape:
    """The gate's small version of a shape: T <= 6, B <= 5, I and H / 16 (at least 4)."""
    return replace(sh.scaled(), I=max(4, sh.I // 16), H=max(4, sh.H // 16))


def gate(tw: Worker, lw: Worker, dtype: str) -> dict:
    """Both sides train every scaled shape GATE_STEPS steps from the same weights; exit 2 if
    the initial weights differ or the losses, first-step gradients (every parameter) or final
    LSTM parameters do."""
    tol = GATE_TOLS[dtype]
    out: dict[str, Any] = {"tol": tol, "dtype": dtype, "steps": GATE_STEPS, "shapes": {}}
    failures, worst = [], {"losses": 0.0, "gradients": 0.0, "params": 0.0}
    for full in SHAPES:
        sh = gate_shape(full)
        want = tw.call("gate", shape=sh.to_dict(), steps=GATE_STEPS, seed=SEED)
        got = lw.call("gate", shape=sh.to_dict(), steps=GATE_STEPS, seed=SEED)
        g_got, g_want = decode(got["grads"]), decode(want["grads"])
        # float16: against the model's largest gradient, since the tiny gradients deep in a
        # stack round differently when torch rounds every step to float16 and lstmgrad does not
        scale = max(float(np.max(np.abs(g))) for g in g_want.values())
        errs: dict[str, Any] = {
            "losses": max(map(rel_err, got["losses"], want["losses"])),
            "gradients": {n: rel_err(g_got.get(n), g) * (float(np.max(np.abs(g))) / scale
                          if dtype == "float16" else 1.0) for n, g in g_want.items()},
            "params": max(map(rel_err, decode(got["params"]), decode(want["params"])))
            if len(got["params"]) == len(want["params"]) else math.inf,
        }  # fmt: skip
        same = got["hash"] == want["hash"]
        out["shapes"][full.id] = {"label": sh.label(), "same_initial_weights": same,
                                  "torch_losses": want["losses"],
                                  "lstmgrad_losses": got["losses"], **errs}  # fmt: skip
        if not same:
            failures.append(f"{full.id} ({sh.label()}): initial weights differ between workers")
        for what, e in errs.items():
            bad = {n: f"{v:.2e}" for n, v in (e.items() if isinstance(e, dict) else [("", e)])
                   if not v <= tol}  # fmt: skip
            worst[what] = max(worst[what], *(e.values() if isinstance(e, dict) else [e]))
            if bad:
                failures.append(f"{full.id} ({sh.label()}): {what} differ (rel err > {tol:g}): "
                                f"{bad}; losses torch {want['losses']}, lstmgrad {got['losses']}")  # fmt: skip
    log = [f"gate     {GATE_STEPS} SGD steps from identical weights, {len(SHAPES)} scaled shapes "
           f"(T<=6, B<=5, I,H/16), {dtype}: max rel err losses {worst['losses']:.1e}, first-step "
           f"gradients {worst['gradients']:.1e}, final LSTM params {worst['params']:.1e} "
           f"(tol {tol:g})"]  # fmt: skip
    if failures:
        gate_failed(log, failures)
    say(*log)
    return out


def measure_in(sh: Shape, cfg: Config, logdir: Path, share_s: float, n_rounds: int) -> dict:
    """Warm-up, calibration, ``n_rounds`` interleaved rounds and a profile of one shape in one
    fresh pair of workers."""
    t_start = time.perf_counter()
    tw, lw = cfg.workers(logdir)
    try:
        tset = tw.call("setup", shape=sh.to_dict(), seed=SEED)
        lset = lw.call("setup", shape=sh.to_dict(), seed=SEED)
        if tset["hash"] != lset["hash"]:
            raise SystemExit(f"{sh.id}: the two workers built different initial weights")
        if lset["paths"]["step"]["path"] != "lstmgrad ops":
            raise SystemExit(f"{sh.id}: lstmgrad.nn.LSTM did not run lstmgrad's ops (LSTM ops "
                             f"seen: {lset['paths']['step']['ops']})")  # fmt: skip
        workers = {"torch": tw, "lstmgrad": lw}
        plan = [("torch", "step"), ("lstmgrad", "step")] + [("torch", "padded")] * sh.varlen
        timer = Timer(workers, cfg.timing())
        warm, reps = timer.prepare(plan)  # Numba cache load, oneDNN primitives, allocator
        (rounds,), discarded = timer.rounds([plan], reps, n_rounds, t_start + share_s)
        prof = {f"{s}:{i}": workers[s].call("profile", item=i, steps=3) for s, i in plan}
    finally:
        tw.close()
        lw.close()
    return {"paths": {"torch": tset["paths"], "lstmgrad": lset["paths"]},
            "weights_hash": tset["hash"], "warmup": warm, "reps": reps, "rounds": rounds,
            "discarded": discarded, "profile": prof}  # fmt: skip


def measure_shape(sh: Shape, cfg: Config, logdir: Path, share_s: float, peak: dict) -> dict:
    """One shape timed in ``cfg.processes`` fresh pairs of workers, its rounds pooled (a
    process's speed on a shape is a draw: with one pair the table would report one draw)."""
    t_start = time.perf_counter()
    per = math.ceil(cfg.rounds / cfg.processes)
    parts = [measure_in(sh, cfg, logdir, share_s / cfg.processes, per)
             for _ in range(cfg.processes)]  # fmt: skip
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
    return {
        "shape": sh.to_dict(),
        "label": sh.label(),
        "lengths": sh.lengths().tolist() if sh.varlen else None,
        "paths": parts[0]["paths"],
        "weights_hash": parts[0]["weights_hash"],
        "warmup": [p["warmup"] for p in parts],
        "reps": [p["reps"] for p in parts],
        "rounds": rounds,
        "discarded": [rd for p in parts for rd in p["discarded"]],
        "profile": parts[0]["profile"],
        "summary": s,
        "elapsed_s": time.perf_counter() - t_start,
    }


def geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else math.nan


def report(doc: dict) -> list[str]:
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
    noisy = [r["shape"]["id"] for r in results if r["summary"]["noisy_rounds"]]
    if noisy:
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_options(ap, rounds=6, unit="round", budget_s=600.0)
    ap.add_argument("--processes", type=int, help="fresh worker pairs per shape (default 3)")
    ap.add_argument("--threads", type=int, help="torch.set_num_threads in both workers")
    args = ap.parse_args(argv)

    shapes = select(args.shapes)
    cfg = Config(
        rounds=args.rounds or (2 if args.quick else 6),
        processes=max(1, args.processes or (1 if args.quick else 3)),
        target_s=args.target_s or (0.1 if args.quick else 0.5),
        warmup_steps=1 if args.quick else 3,
        min_reps=1 if args.quick else 3,
        max_reps=3 if args.quick else 10_000,
        pause_s=args.pause_s,
        noise_cores=args.noise_cores,
        max_retries=0 if args.quick else args.max_retries,
        budget_s=args.budget_s,
        dtype=args.dtype,
        threads=args.threads,
    )
    run = Session(args, "train", "train_speedup.png")
    tw, lw = cfg.workers(run.logdir)
    try:
        tinfo, linfo = tw.call("info"), lw.call("info")
        if tinfo["lstmgrad_imported"]:
            raise SystemExit("the torch worker imported lstmgrad; aborting")
        # both sides' GEMMs run on torch's; float32 also in float16 runs (see run.py)
        peak = dict.fromkeys(("torch", "lstmgrad"), peak_gflops(run.probe, "torch"))
        config = vars(cfg) | {"shapes": [s.id for s in shapes], "quick": args.quick, "seed": SEED}
        run.start(tinfo, linfo, [
            f"torch    worker: {tinfo['num_threads']} threads (interop "
            f"{tinfo['num_interop_threads']}), mkldnn enabled {tinfo['mkldnn_enabled']}, "
            f"{tinfo['dtype']}",
            f"lstmgrad {linfo['lstmgrad']} (lstmgrad.nn.LSTM, GEMMs on torch: oneDNN or torch.mm)"
            f", torch threads {linfo['num_threads']} in its worker; Numba {linfo['numba']} "
            f"({linfo['numba_threads']} threads)",
        ], config=config, peak=peak)  # fmt: skip
        run.doc["gate"] = gate(tw, lw, cfg.dtype)
    except WorkerError as exc:
        print(f"\nworker failure: {exc}", file=sys.stderr)
        return 1
    finally:
        tw.close()  # each shape gets fresh workers
        lw.close()
    say(f"timing   {len(shapes)} shapes, {cfg.rounds} rounds in {cfg.processes} fresh worker "
        f"pairs each, ~{cfg.target_s:g} s per batch, pause {cfg.pause_s:g} s")  # fmt: skip
    results = run.doc["results"] = []
    try:
        for sh, share in run.shapes(shapes, cfg.budget_s):
            res = measure_shape(sh, cfg, run.logdir, share, peak)
            results.append(res)
            s = res["summary"]
            extra = f", vs padded {s['padded']['ratio']:.2f}x" if sh.varlen else ""
            say(f"  {sh.id:9s} {sh.label():36s} torch {fmt_ms(s['torch_ms'])} ms, lstmgrad "
                f"{fmt_ms(s['lg_ms'])} ms: {s['ratio']:.2f}x{extra} ({res['elapsed_s']:.0f} s, "
                f"{s['redone_rounds']} rounds redone, {s['noisy_rounds']} kept noisy)")  # fmt: skip
    except WorkerError as exc:
        print(f"\nworker failure: {exc}", file=sys.stderr)
        return 1
    dense = [r["summary"] for r in results if not r["shape"]["lengths_range"]]
    var = [r["summary"] for r in results if r["shape"]["lengths_range"]]
    run.doc["geomeans"] = {
        "dense": geomean([s["ratio"] for s in dense]), "dense_n": len(dense),
        "varlen_vs_packed": geomean([s["ratio"] for s in var]),
        "varlen_vs_padded": geomean([s["padded"]["ratio"] for s in var]), "varlen_n": len(var),
    }  # fmt: skip
    run.finish()
    say("", *report(run.doc), "")
    bars = []
    for r in results:
        if r["shape"]["lengths_range"]:
            bars += [(r["shape"]["id"], "varlen: vs torch packed (target 2x)", r["summary"]),
                     (r["shape"]["id"], "varlen: vs torch padded", r["summary"]["padded"])]  # fmt: skip
        else:
            bars.append((r["shape"]["id"], "dense: vs torch (oneDNN)", r["summary"]))
    m = run.doc["meta"]
    title = (f"training step: lstmgrad.nn.LSTM {linfo['lstmgrad']} vs torch.nn.LSTM "
             f"{tinfo['torch']}\n{m['cpu']}, {m['affinity']} cores, {m['date'][:10]}")  # fmt: skip
    chart(bars, run.png_path, title, "speedup (torch ms / lstmgrad ms per step)")
    run.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
