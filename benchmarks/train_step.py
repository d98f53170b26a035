"""Full training step, lstmgrad.nn.LSTM vs torch.nn.LSTM on CPU, each side in its own process.

    python benchmarks/train_step.py [--shapes id,id] [--rounds N] [--processes P] [--quick]
                                    [--dtype float16] [--json P] [--png P]

One step = zero_grad, forward of Linear(I, I) -> LSTM -> Linear(D*H, 64), cross-entropy over the
valid time steps, backward, SGD(lr=1e-3, momentum=0.9).step(). Both workers run
benchmarks/worker_train.py (``--impl torch``, which never imports lstmgrad, and ``--impl
lstmgrad``); this parent imports neither torch nor lstmgrad. It first checks, on a scaled-down
version of every shape, that three steps give the same losses and LSTM weights on both sides
(exit 2 otherwise), then times each shape in several fresh pairs of workers (a process's speed
varies from process to process), interleaved batches in each (torch, lstmgrad, [torch padded],
the order flipped every round), and reports medians and the median of the per-round ratios over
all of them.
See benchmarks/README.md, section "Training step".
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _harness import Timer, Timing, ms_rounds, output_paths  # noqa: E402
from _machine import (  # noqa: E402
    add_noise_options,
    machine,
    med,
    peak_gflops,
    probe_lines,
    probe_machine,
    rel_err,
    save_figure,
    speedup_axis,
)
from _protocol import Worker, WorkerError, decode  # noqa: E402
from shapes import SHAPES, Shape, select  # noqa: E402

# relative error allowed on the losses, gradients and LSTM parameters after GATE_STEPS steps;
# float16: torch rounds every GEMM and gate to float16, lstmgrad computes in float32 (and a
# gradient's error is taken relative to the model's largest gradient, see gate)
GATE_TOLS = {"float32": 1e-4, "float16": 2e-2}
GATE_STEPS = 3
TARGET_DENSE, TARGET_VARLEN = 1.0, 2.0  # the project's speedup targets
SEED = 0
WORKER = HERE / "worker_train.py"


@dataclass
class Config:
    rounds: int  # timed rounds of a shape, over all its worker pairs
    processes: int  # fresh worker pairs per shape (each process's speed varies: see main)
    target_s: float  # aimed seconds of timed steps per batch
    warmup_steps: int
    min_reps: int  # steps per batch, at least
    max_reps: int
    pause_s: float
    noise_cores: float  # a pair is redone when other processes used more CPU than this
    max_retries: int
    budget_s: float  # time for the timings of all shapes; redos stop past a shape's share
    dtype: str = "float32"  # of the model, its input and its training, gate included

    def timing(self) -> Timing:
        return Timing(self.target_s, self.warmup_steps, self.min_reps, self.max_reps,
                      self.pause_s, self.noise_cores, self.max_retries)  # fmt: skip


def TrainWorker(
    impl: str, log_path: Path, threads: int | None = None, dtype: str = "float32"
) -> Worker:  # noqa: N802
    """A :class:`_protocol.Worker` running ``worker_train.py --impl IMPL``."""
    extra = ["--dtype", dtype] + (["--threads", str(threads)] if threads else [])
    return Worker(impl, WORKER, log_path, argv=("--impl", impl, *extra))


# --------------------------------------------------------------------------------------------
# machine line


def machine_lines(m: dict) -> list[str]:
    t, lg = m["torch_worker"], m["lstmgrad_worker"]
    env = ", ".join(f"{k}={v}" for k, v in m["env"].items() if v is not None) or "none set"
    dirty = " (src dirty)" if m["git"]["dirty"] else ""
    return [
        f"date     {m['date']}   git {m['git']['commit'][:10]}{dirty}",
        f"machine  load {m['loadavg_start'][0]:.2f}, Python {m['python']}, {m['platform']}",
        *probe_lines(m["probe"]),
        f"torch    worker: {t['num_threads']} threads (interop {t['num_interop_threads']}), "
        f"mkldnn enabled {t['mkldnn_enabled']}, {t['dtype']}",
        f"lstmgrad {lg['lstmgrad']} (lstmgrad.nn.LSTM, GEMMs on torch: oneDNN or torch.mm), "
        "torch threads "
        f"{lg['num_threads']} in its worker; Numba {lg['numba']} ({lg['numba_threads']} threads)",
        f"env      {env}",
    ]


# --------------------------------------------------------------------------------------------
# correctness gate


def gate_shape(sh: Shape) -> Shape:
    """The gate's small version of a shape: T <= 6, B <= 5, I and H / 16 (at least 4), same L,
    D and length rule."""
    return replace(sh.scaled(), I=max(4, sh.I // 16), H=max(4, sh.H // 16))


def gate(tw: Worker, lw: Worker, dtype: str) -> tuple[dict, list[str]]:
    """Both sides train every scaled shape GATE_STEPS steps from the same weights. Returns what
    was measured and the failures: weights not identical at the start, or losses, first-step
    gradients (every parameter of the model) or final LSTM parameters that differ."""
    tol = GATE_TOLS[dtype]
    out: dict[str, Any] = {"tol": tol, "dtype": dtype, "steps": GATE_STEPS, "shapes": {}}
    failures, worst_loss, worst_param, worst_grad = [], 0.0, 0.0, 0.0
    for full in SHAPES:
        sh = gate_shape(full)
        want = tw.call("gate", shape=sh.to_dict(), steps=GATE_STEPS, seed=SEED)
        got = lw.call("gate", shape=sh.to_dict(), steps=GATE_STEPS, seed=SEED)
        loss_errs = [
            abs(g - w) / max(abs(w), 1e-30)
            for g, w in zip(got["losses"], want["losses"], strict=True)
        ]
        p_got, p_want = decode(got["params"]), decode(want["params"])
        param_errs = [rel_err(g, w) for g, w in zip(p_got, p_want, strict=True)]
        if len(p_got) != len(p_want):
            param_errs.append(math.inf)
        g_got, g_want = decode(got["grads"]), decode(want["grads"])
        grad_errs = {n: rel_err(g_got.get(n), g) for n, g in g_want.items()}
        if dtype == "float16":
            # against the model's largest gradient: the tiny gradients deep in a stack round
            # differently when torch rounds every step to float16 and lstmgrad computes in float32
            scale = max(float(np.max(np.abs(g))) for g in g_want.values())
            grad_errs = {
                n: rel_err(g_got.get(n), g) * float(np.max(np.abs(g))) / scale
                for n, g in g_want.items()
            }
        res = {
            "label": sh.label(),
            "same_initial_weights": got["hash"] == want["hash"],
            "torch_losses": want["losses"],
            "lstmgrad_losses": got["losses"],
            "loss_rel_err": max(loss_errs),
            "param_rel_err": max(param_errs),
            "grad_rel_err": grad_errs,
        }
        out["shapes"][full.id] = res
        worst_loss = max(worst_loss, res["loss_rel_err"])
        worst_param = max(worst_param, res["param_rel_err"])
        worst_grad = max(worst_grad, *grad_errs.values())
        if not res["same_initial_weights"]:
            failures.append(f"{full.id} ({sh.label()}): initial weights differ between workers")
        if not res["loss_rel_err"] <= tol:
            failures.append(
                f"{full.id} ({sh.label()}): losses differ, rel err {res['loss_rel_err']:.2e} > "
                f"{tol:g}; torch {want['losses']}, lstmgrad {got['losses']}"
            )
        bad = {n: f"{e:.2e}" for n, e in grad_errs.items() if not e <= tol}
        if bad:
            failures.append(
                f"{full.id} ({sh.label()}): first-step gradients differ (rel err > {tol:g}): {bad}"
            )
        if not res["param_rel_err"] <= tol:
            failures.append(
                f"{full.id} ({sh.label()}): LSTM parameters after {GATE_STEPS} steps differ, max "
                f"rel err {res['param_rel_err']:.2e} > {tol:g}"
            )
    line = (
        f"gate     {GATE_STEPS} SGD steps from identical weights, {len(SHAPES)} scaled shapes "
        f"(T<=6, B<=5, I,H/16), {dtype}: max rel err losses {worst_loss:.1e}, first-step "
        f"gradients {worst_grad:.1e}, final LSTM params {worst_param:.1e} (tol {tol:g})"
    )
    out["failures"] = failures
    return out, [line]


# --------------------------------------------------------------------------------------------
# measurement


def measure_in(
    sh: Shape, tw: Worker, lw: Worker, cfg: Config, share_s: float, n_rounds: int
) -> dict:
    """Warm-up, calibration, ``n_rounds`` interleaved rounds and a profile of one shape in one
    pair of workers."""
    t_start = time.perf_counter()
    tset = tw.call("setup", shape=sh.to_dict(), seed=SEED)
    lset = lw.call("setup", shape=sh.to_dict(), seed=SEED)
    if tset["hash"] != lset["hash"]:
        print(f"\n{sh.id}: the two workers built different initial weights; aborting")
        raise SystemExit(2)
    if lset["paths"]["step"]["path"] != "lstmgrad ops":
        print(
            f"\n{sh.id}: lstmgrad.nn.LSTM did not run lstmgrad's ops (LSTM ops seen: "
            f"{lset['paths']['step']['ops']}); aborting"
        )
        raise SystemExit(2)
    workers = {"torch": tw, "lstmgrad": lw}
    plan = [("torch", "step"), ("lstmgrad", "step")]
    if sh.varlen:
        plan.append(("torch", "padded"))
    # warm-up first: Numba compile or cache load, oneDNN primitive creation, allocator growth
    timer = Timer(workers, cfg.timing())
    warm, reps = timer.prepare(plan)
    (rounds,), discarded = timer.rounds([plan], reps, n_rounds, t_start + share_s)
    prof = {f"{s}:{i}": workers[s].call("profile", item=i, steps=3) for s, i in plan}
    return {
        "paths": {"torch": tset["paths"], "lstmgrad": lset["paths"]},
        "weights_hash": tset["hash"],
        "warmup": warm,
        "reps": reps,
        "rounds": rounds,
        "discarded": discarded,
        "profile": prof,
        "elapsed_s": time.perf_counter() - t_start,
    }


def measure_shape(
    sh: Shape,
    cfg: Config,
    share_s: float,
    logdir: Path,
    threads: int | None,
    peak: dict[str, float],
) -> dict:
    """One shape timed in ``cfg.processes`` fresh pairs of workers, its rounds pooled; ``peak``:
    the GEMM GFLOP/s of each side (:func:`peaks`), the denominators of the peak fractions.

    A process's speed on a shape varies from process to process, for both sides (measured:
    torch.nn.LSTM forward + backward of med-1 17.7-24.7 ms in eight fresh processes, lstmgrad
    18.4-19.2 ms): with one pair the table would report one draw of each."""
    t_start = time.perf_counter()
    per = math.ceil(cfg.rounds / cfg.processes)
    parts = []
    for _ in range(cfg.processes):
        tw = TrainWorker("torch", logdir / "torch.log", threads, cfg.dtype)
        lw = TrainWorker("lstmgrad", logdir / "lstmgrad.log", threads, cfg.dtype)
        try:
            part = measure_in(sh, tw, lw, cfg, share_s / cfg.processes, per)
        finally:
            tw.close()
            lw.close()
        parts.append(part)
    rounds = [rd for part in parts for rd in part["rounds"]]
    discarded = [rd for part in parts for rd in part["discarded"]]
    tset_paths = parts[0]["paths"]["torch"]

    def ms(key: str) -> list[float]:
        return ms_rounds(rounds, key)

    t_ms, l_ms = ms("torch:step"), ms("lstmgrad:step")
    ratios = [a / b for a, b in zip(t_ms, l_ms, strict=True)]
    flops = sh.flops_fwd_bwd()  # the LSTM's alone, effective rows (also for torch padded)
    summary: dict[str, Any] = {
        "lstm_flops": flops,
        "torch_gflops": flops / med(t_ms) / 1e6,
        "lstmgrad_gflops": flops / med(l_ms) / 1e6,
        "torch_peak_frac": flops / med(t_ms) / 1e6 / peak["torch"],
        "lstmgrad_peak_frac": flops / med(l_ms) / 1e6 / peak["lstmgrad"],
        "torch_path": tset_paths["step"]["path"],
        "torch_ms": med(t_ms),
        "lstmgrad_ms": med(l_ms),
        "speedup": med(ratios),
        "speedup_min": min(ratios),
        "speedup_max": max(ratios),
        "torch_ms_round": t_ms,
        "lstmgrad_ms_round": l_ms,
        "ratio_round": ratios,
        "rounds": len(rounds),
        "noisy_rounds": sum(any(b["noisy"] for b in rd.values()) for rd in rounds),
        "redone_rounds": len(discarded),
        "processes": cfg.processes,
        "process_round": [p for p, part in enumerate(parts) for _ in part["rounds"]],
        # the shape's first step in each fresh worker (kernels cached on disk by the gate)
        "first_step_ms": {
            k: [1e3 * part["warmup"][k][0]["s"][0] for part in parts] for k in parts[0]["warmup"]
        },
    }
    if sh.varlen:
        p_ms = ms("torch:padded")
        pr = [a / b for a, b in zip(p_ms, l_ms, strict=True)]
        summary.update(
            padded_path=tset_paths["padded"]["path"],
            padded_ms=med(p_ms),
            padded_gflops=flops / med(p_ms) / 1e6,
            padded_peak_frac=flops / med(p_ms) / 1e6 / peak["torch"],
            padded_speedup=med(pr),
            padded_speedup_min=min(pr),
            padded_speedup_max=max(pr),
            padded_ms_round=p_ms,
            padded_ratio_round=pr,
        )
    target = TARGET_VARLEN if sh.varlen else TARGET_DENSE
    summary.update(target=target, meets_target=summary["speedup"] >= target)
    return {
        "shape": sh.to_dict(),
        "label": sh.label(),
        "lengths": sh.lengths().tolist() if sh.varlen else None,
        "paths": parts[0]["paths"],
        "weights_hash": parts[0]["weights_hash"],
        "warmup": [part["warmup"] for part in parts],
        "reps": [part["reps"] for part in parts],
        "rounds": rounds,
        "discarded": discarded,
        "profile": parts[0]["profile"],
        "summary": summary,
        "elapsed_s": time.perf_counter() - t_start,
    }


# --------------------------------------------------------------------------------------------
# reporting


def peaks(m: dict) -> dict[str, float]:
    """The measured float32 GEMM peak of torch.mm, the library of both sides' GEMMs (float32
    also in float16 runs: see run.peaks)."""
    return {
        "torch": peak_gflops(m["probe"], "torch", "float32"),
        "lstmgrad": peak_gflops(m["probe"], "torch", "float32"),
    }


def geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else math.nan


def _ms(v: float) -> str:
    return f"{v:.3f}" if v < 1 else f"{v:.2f}" if v < 100 else f"{v:.1f}"


def _x(v: float, lo: float, hi: float) -> str:
    return f"{v:.2f}x [{lo:.2f}-{hi:.2f}]"


def _gf(s: dict, side: str) -> str:
    """LSTM GFLOP/s of one side and its fraction of that side's measured GEMM peak."""
    frac = s[f"{side}_peak_frac"]
    return f"{s[f'{side}_gflops']:.3g}" + (f" ({100 * frac:.0f}%)" if math.isfinite(frac) else "")


def table(results: list[dict]) -> str:
    """The markdown table of the run."""
    head = [
        "shape",
        "T B I H L D",
        "torch path",
        "torch ms",
        "lstmgrad ms",
        "speedup [min-max]",
        "target",
        "torch GFLOP/s",
        "lstmgrad GFLOP/s",
        "torch padded ms",
        "torch padded GFLOP/s",
        "speedup vs padded",
        "noisy",
    ]
    rows = []
    for res in results:
        sh, s = res["shape"], res["summary"]
        met = "met" if s["meets_target"] else "MISSED"
        rows.append(
            [
                sh["id"],
                " ".join(str(sh[k]) for k in ("T", "B", "I", "H", "L", "D")),
                s["torch_path"],
                _ms(s["torch_ms"]),
                _ms(s["lstmgrad_ms"]),
                _x(s["speedup"], s["speedup_min"], s["speedup_max"]),
                f">= {s['target']:g}x {met}",
                _gf(s, "torch"),
                _gf(s, "lstmgrad"),
                _ms(s["padded_ms"]) if "padded_ms" in s else "-",
                _gf(s, "padded") if "padded_ms" in s else "-",
                _x(s["padded_speedup"], s["padded_speedup_min"], s["padded_speedup_max"])
                if "padded_speedup" in s
                else "-",
                f"{s['noisy_rounds']}/{s['rounds']}",
            ]
        )
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def geomeans(results: list[dict]) -> dict:
    dense = [r["summary"]["speedup"] for r in results if not r["shape"]["lengths_range"]]
    var = [r["summary"] for r in results if r["shape"]["lengths_range"]]
    return {
        "dense": geomean(dense),
        "dense_n": len(dense),
        "varlen_vs_packed": geomean([s["speedup"] for s in var]),
        "varlen_vs_padded": geomean([s["padded_speedup"] for s in var]),
        "varlen_n": len(var),
    }


def summary_lines(results: list[dict], gm: dict) -> list[str]:
    out = []
    if gm["dense_n"]:
        out.append(
            f"geomean speedup, dense shapes ({gm['dense_n']}): {gm['dense']:.2f}x "
            f"(target >= {TARGET_DENSE:g}x per shape)"
        )
    if gm["varlen_n"]:
        out.append(
            f"geomean speedup, variable-length shapes ({gm['varlen_n']}): "
            f"{gm['varlen_vs_packed']:.2f}x vs torch packed, {gm['varlen_vs_padded']:.2f}x vs "
            f"torch padded (target >= {TARGET_VARLEN:g}x per shape, vs packed)"
        )
    met = [r["shape"]["id"] for r in results if r["summary"]["meets_target"]]
    missed = [r["shape"]["id"] for r in results if not r["summary"]["meets_target"]]
    out.append(f"targets met ({len(met)}): {', '.join(met) or 'none'}")
    out.append(f"targets MISSED ({len(missed)}): {', '.join(missed) or 'none'}")
    noisy = [r["shape"]["id"] for r in results if r["summary"]["noisy_rounds"]]
    if noisy:
        out.append(
            "other processes used the CPU during some kept rounds of: "
            f"{', '.join(noisy)} (see the noisy column; rerun on a quiet machine to confirm)"
        )
    return out


def profile_lines(results: list[dict]) -> list[str]:
    """Per shape and side: the share of the LSTM's own forward and backward ops in one step and
    the two ops with the most self time (autograd profiler, 3 steps after the timings)."""
    out = [
        "Profile (autograd profiler, 3 steps after the timings; its overhead inflates the "
        "times, so read the shares): LSTM fwd/bwd = the LSTM's ops, inclusive; top = self time"
    ]
    for res in results:
        for key, p in res["profile"].items():
            tot = max(p["self_ms_total"], 1e-9)
            lstm = "LSTM fwd/bwd not separable (packed path: per-step ops)"
            if p["lstm_fwd_ms"] or p["lstm_bwd_ms"]:
                lstm = (
                    f"LSTM fwd {100 * p['lstm_fwd_ms'] / tot:3.0f}% bwd "
                    f"{100 * p['lstm_bwd_ms'] / tot:3.0f}%"
                )
            top = ", ".join(
                f"{t['op']} {100 * t['self_ms'] / tot:.0f}% ({t['calls']:g} calls)"
                for t in p["top"][:2]
            )
            out.append(
                f"  {res['shape']['id']:9s} {key:15s} {tot:8.1f} ms/step profiled; {lstm}; "
                f"top {top}"
            )
    return out


def plot(results: list[dict], path: Path, title: str) -> None:
    """Bar chart of the speedups (min-max over rounds as error bars, log scale), a line at 1.0."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    labels = [r["shape"]["id"] for r in results]
    x = np.arange(len(labels), dtype=float)
    main = [r["summary"] for r in results]
    fig, ax = plt.subplots(figsize=(max(6.0, 0.8 * len(labels) + 2), 4.8))
    w = 0.38
    has_pad = [i for i, s in enumerate(main) if "padded_speedup" in s]
    # varlen shapes get two bars side by side: vs torch packed, vs torch padded
    bars = [(x[i] - (w / 2 if i in has_pad else 0.0), s, "") for i, s in enumerate(main)]
    bars += [(x[i] + w / 2, main[i], "padded_") for i in has_pad]
    for xi, s, pre in bars:
        v = s[f"{pre}speedup"]
        lo, hi = s[f"{pre}speedup_min"], s[f"{pre}speedup_max"]
        color = "tab:gray" if pre else ("tab:orange" if "padded_speedup" in s else "tab:blue")
        ax.bar(xi, v - 1.0, w, bottom=1.0, color=color)  # up: lstmgrad faster; down: slower
        ax.errorbar(xi, v, yerr=[[v - lo], [hi - v]], fmt="none", ecolor="k", capsize=2, lw=0.8)
        ax.annotate(f"{v:.2f}", (xi, v), xytext=(0, 3 if v >= 1 else -9),
                    textcoords="offset points", ha="center", fontsize=7)  # fmt: skip
    # log scale, limits from the medians: one wild round (a busy machine) must not flatten
    # the chart; its error bar is clipped at the edge instead
    meds = [s[f"{pre}speedup"] for _, s, pre in bars]
    speedup_axis(ax, min([*meds, 1.0]) / 2, max([*meds, TARGET_VARLEN]) * 2)
    handles = [Patch(color="tab:blue", label="dense: vs torch (oneDNN)")]
    if has_pad:
        ax.axhline(TARGET_VARLEN, color="tab:orange", lw=0.8, ls=":")
        handles += [
            Patch(color="tab:orange", label="varlen: vs torch packed (target 2x, dotted)"),
            Patch(color="tab:gray", label="varlen: vs torch on the padded tensor"),
        ]
    ax.legend(handles=handles, fontsize=7)
    ax.set_xticks(x, labels, fontsize=8, rotation=30)
    ax.set_ylabel("speedup (torch ms / lstmgrad ms per step)")
    ax.set_title(title, fontsize=9)
    save_figure(fig, path)


# --------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", help="comma-separated shape ids (default: all 12)")
    ap.add_argument("--rounds", type=int, help="timed rounds per shape (default 6; 2 with --quick)")
    ap.add_argument(
        "--processes",
        type=int,
        help="fresh worker pairs per shape, the rounds split among them (default 3; 1 with "
        "--quick)",
    )
    ap.add_argument("--quick", action="store_true", help="smoke run: 2 rounds, short batches")
    ap.add_argument(
        "--json", type=Path, help="results (default benchmarks/results/train-<date>-<time>.json)"
    )
    ap.add_argument("--png", type=Path, help="chart (default benchmarks/results/train_speedup.png)")
    ap.add_argument(
        "--target-s", type=float, help="seconds of steps per batch (default 0.5; 0.1 quick)"
    )
    add_noise_options(ap, "round", 600.0)
    ap.add_argument(
        "--threads", type=int, help="torch.set_num_threads in both workers (default: torch's)"
    )
    ap.add_argument(
        "--dtype",
        choices=("float32", "float16"),
        default="float32",
        help="dtype of the model, its input and its training, gate included (default float32)",
    )
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
    )
    json_path, png_path, logdir = output_paths(args.json, args.png, "train", "train_speedup.png")

    t0 = time.perf_counter()
    probe = probe_machine(cfg.dtype)  # before the workers start: nothing else running
    tw = TrainWorker("torch", logdir / "torch.log", args.threads, cfg.dtype)
    lw = TrainWorker("lstmgrad", logdir / "lstmgrad.log", args.threads, cfg.dtype)
    results: list[dict] = []
    try:
        tinfo, linfo = tw.call("info"), lw.call("info")
        if tinfo["lstmgrad_imported"]:
            raise SystemExit("the torch worker imported lstmgrad; aborting")
        meta = machine(tinfo, linfo, probe)
        peak = peaks(meta)
        for line in machine_lines(meta):
            print(line, flush=True)
        gate_res, lines = gate(tw, lw, cfg.dtype)
        for line in lines:
            print(line, flush=True)
        if gate_res["failures"]:
            print("\nCORRECTNESS GATE FAILED: no timings are reported for a wrong result.")
            for f in gate_res["failures"]:
                print("  " + f)
            return 2
        doc: dict[str, Any] = {
            "meta": meta,
            "config": vars(cfg)
            | {
                "shapes": [s.id for s in shapes],
                "quick": args.quick,
                "seed": SEED,
                "threads": args.threads,
            },
            "gate": gate_res,
            "results": results,
        }
        tw.close()  # each shape gets fresh workers (measure_shape)
        lw.close()
        print(
            f"timing   {len(shapes)} shapes, {cfg.rounds} rounds in {cfg.processes} fresh worker "
            f"pairs each, ~{cfg.target_s:g} s per batch, pause {cfg.pause_s:g} s",
            flush=True,
        )
        t_timing = time.perf_counter()
        for k, sh in enumerate(shapes):
            left = max(0.0, cfg.budget_s - (time.perf_counter() - t_timing))
            res = measure_shape(sh, cfg, left / (len(shapes) - k), logdir, args.threads, peak)
            results.append(res)
            s = res["summary"]
            extra = f", vs padded {s['padded_speedup']:.2f}x" if sh.varlen else ""
            print(
                f"  {sh.id:9s} {sh.label():36s} torch {_ms(s['torch_ms'])} ms, lstmgrad "
                f"{_ms(s['lstmgrad_ms'])} ms: {s['speedup']:.2f}x{extra} ({res['elapsed_s']:.0f} "
                f"s, {s['redone_rounds']} rounds redone, {s['noisy_rounds']} kept noisy)",
                flush=True,
            )
            json_path.write_text(json.dumps(doc, indent=1))
        meta["loadavg_end"] = os.getloadavg()
        meta["total_s"] = time.perf_counter() - t0
        gm = geomeans(results)
        doc["geomeans"] = gm
        json_path.write_text(json.dumps(doc, indent=1))
    except WorkerError as exc:
        print(f"\nworker failure: {exc}", file=sys.stderr)
        return 1
    finally:
        tw.close()
        lw.close()

    print()
    print(
        f"Training step ({cfg.dtype}; ms per step = median over rounds of each batch's median "
        "step; speedup = median of per-round torch ms / lstmgrad ms)"
    )
    print(
        "GFLOP/s: the LSTM's forward + backward GEMM FLOPs (effective rows) per step second, the "
        "rest of the step uncounted; (%): of the measured float32 GEMM peak of torch.mm, "
        f"{peak['torch']:.3g} GFLOP/s (both sides' GEMMs run on torch's)"
    )
    print(table(results))
    print()
    for line in summary_lines(results, gm):
        print(line)
    print()
    for line in profile_lines(results):
        print(line)
    print()
    title = (
        f"training step: lstmgrad.nn.LSTM {linfo['lstmgrad']} vs torch.nn.LSTM {tinfo['torch']}\n"
        f"{meta['cpu']}, {meta['affinity']} cores, {meta['date'][:10]}"
    )
    plot(results, png_path, title)
    print(f"json {json_path}\npng  {png_path}\nlogs {logdir}\ntotal {meta['total_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
