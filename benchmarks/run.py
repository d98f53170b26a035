"""lstmgrad vs PyTorch nn.LSTM on CPU: correctness gate, interleaved timings, table, JSON, PNG.

    python benchmarks/run.py [--shapes id,id] [--rounds N] [--quick] [--dtype float16]
                             [--json PATH] [--png PATH]
    python benchmarks/run.py --report PATH      # the tables of a saved JSON again

Each side runs in its own persistent worker process (worker_torch.py imports torch and never
lstmgrad; worker_lstmgrad.py never imports torch): NumPy's OpenBLAS and PyTorch's BLAS in one
process were measured 35x slower. This parent imports neither; it asks the two workers in turn
for one timed batch each (the first side flipped every round) and reports medians over rounds
and the median of the per-round ratios torch ms / lstmgrad ms. See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
from _machine import CpuWatch, med, peak_gflops, rel_err  # noqa: E402
from _protocol import Worker, WorkerError, decode, encode  # noqa: E402
from shapes import SHAPES, Shape, make_case, select  # noqa: E402

GATE_TOL_F32 = 1e-4  # fused vs reference, float32, max relative error
GATE_TOL_F64 = 1e-9  # torch float64 autograd vs lstmgrad float64 reference
ORACLE_SHAPES = [
    Shape("oracle-dense", 4, 3, 5, 6, 2, 2),
    Shape("oracle-varlen", 5, 4, 5, 6, 2, 2, (2, 5)),
]
GEMM_ITEMS = ("gemm_bwd", "gemm_bwd_nodx", "gemm_fwd")


def pairs_of(sh: Shape) -> dict[str, tuple[str, str]]:
    """Pair name -> (torch item, lstmgrad item); varlen shapes also pair torch's padded run."""
    out = {p: (p, p) for p in ("bwd", "fwdbwd", "bwd_nodx")}
    if sh.varlen:
        out |= {"bwd_dense": ("bwd_dense", "bwd"), "fwdbwd_dense": ("fwdbwd_dense", "fwdbwd")}
    return out


@dataclass
class Config:
    rounds: int
    target_s: float  # aimed seconds of timed work per batch
    warmup_reps: int
    max_reps: int
    pause_s: float
    first_call: bool
    noise_cores: float  # a pair is redone when other processes used more CPU than this
    max_retries: int
    budget_s: float  # time for all shapes; redos stop when a shape has used its share
    lstmgrad_input: str = "arrays"  # or "tensors" (see worker_lstmgrad.py)
    dtype: str = "float32"  # of the timed items (the gate and the GEMM-only items: float32)

    def timing(self) -> Timing:
        return Timing(self.target_s, self.warmup_reps, 1, self.max_reps, self.pause_s,
                      self.noise_cores, self.max_retries)  # fmt: skip

    def lstmgrad_env(self, **extra: str) -> dict[str, str]:
        return dict(os.environ, LSTMGRAD_BENCH_INPUT=self.lstmgrad_input, **extra)


def worker_lines(t: dict, lg: dict) -> list[str]:
    if lg["input"] == "tensors":
        inp = f"torch {lg['torch']} tensors, lstmgrad's GEMMs on torch ({lg['torch_threads']} threads)"
    else:
        inp = "NumPy arrays, lstmgrad's GEMMs on NumPy's BLAS"
    return [
        f"torch    worker: {t['num_threads']} threads (interop {t['num_interop_threads']}), "
        f"mkldnn enabled {t['mkldnn_enabled']}",
        f"lstmgrad {lg['lstmgrad']} engine fused; NumPy {lg['numpy']} (its BLAS: the probe's "
        f"NumPy line); Numba {lg['numba']} ({lg['numba_threads']} threads)",
        f"input    {lg['input']}: {inp}",
    ]


def gate(tw: Worker, lw: Worker) -> dict:
    """Exit 2 unless both checks pass; returns what was measured."""
    result: dict[str, Any] = {"tol_f32": GATE_TOL_F32, "tol_f64": GATE_TOL_F64}
    failures: list[str] = []
    log: list[str] = []
    result["torch_vs_reference_f64"] = oracle = {}
    for sh in ORACLE_SHAPES:  # 1. torch float64 autograd vs lstmgrad float64 reference
        enc = encode(make_case(sh, "float64", seed=7))
        want = decode(tw.call("autograd64", shape=sh.to_dict(), case=enc))
        got = decode(lw.call("reference64", shape=sh.to_dict(), case=enc))
        errs = {k: rel_err(got[k], want[k]) for k in ("dx", "dh_prev", "dc_prev", "hy", "cy")}
        errs["dparams"] = max(map(rel_err, got["dparams"], want["dparams"]))
        oracle[sh.id] = errs
        worst = max(errs.values())
        log.append(f"gate     torch f64 autograd vs lstmgrad f64 reference, {sh.label()}: "
                   f"max rel err {worst:.1e}")  # fmt: skip
        if not worst <= GATE_TOL_F64:
            failures.append(f"{sh.id}: torch float64 vs lstmgrad reference: {errs}")
    # 2. fused vs reference in float32 on a scaled-down version of every shape
    fused = lw.call("gate_fused", shapes=[s.scaled().to_dict() for s in SHAPES])
    result["fused_vs_reference_f32"] = fused
    worst_all = 0.0
    for sid, res in fused.items():
        for case, errs in res.items():
            worst_all = max(worst_all, *errs.values())
            if not max(errs.values()) <= GATE_TOL_F32:
                failures.append(f"{sid} {case}: fused vs reference float32: {errs}")
    log.append(f"gate     fused vs reference f32, {len(fused)} scaled shapes (T<=6), backward "
               f"(+no dx) and fwd+bwd: max rel err {worst_all:.1e} (tol {GATE_TOL_F32:g})")  # fmt: skip
    if failures:
        gate_failed(log, failures)
    say(*log)
    return result


def first_call(sh: Shape, logdir: Path, cfg: Config, name: str, **env: str) -> dict:
    """Import and first calls in a fresh lstmgrad worker (``env``: e.g. an empty Numba cache)."""
    w = Worker(name, HERE / "worker_lstmgrad.py", logdir / f"{name}.log", cfg.lstmgrad_env(**env))
    try:
        with CpuWatch(w.proc.pid) as watch:
            out = w.call("first_call", shape=sh.to_dict(), dtype=cfg.dtype)
    finally:
        w.close()
    time.sleep(cfg.pause_s)
    return out | {"other_cores": round(watch.foreign_cores, 3), "shape": sh.id}


def cold_first_call(sh: Shape, logdir: Path, cfg: Config) -> dict:
    """First calls in a fresh process whose Numba cache is empty: the JIT compile itself."""
    with tempfile.TemporaryDirectory(prefix="lstmgrad-numba-cache-") as cache:
        out = first_call(sh, logdir, cfg, "lstmgrad-cold", NUMBA_CACHE_DIR=cache)
        out["cache_files_written"] = sum(len(f) for _, _, f in os.walk(cache))
    return out


def measure_shape(
    sh: Shape, tw: Worker, lw: Worker, cfg: Config, logdir: Path, share_s: float, peak: dict
) -> dict:
    """All measurements of one shape; noisy pairs are redone only within ``share_s`` seconds.
    ``peak``: GFLOP/s of each side's GEMM library, the denominators of the peak fractions."""
    t_start = time.perf_counter()
    tset = tw.call("setup", shape=sh.to_dict(), dtype=cfg.dtype)
    lset = lw.call("setup", shape=sh.to_dict(), dtype=cfg.dtype)
    if lset["torch_imported"] and cfg.lstmgrad_input == "arrays":
        raise SystemExit("lstmgrad worker imported torch: the measurement would be invalid")
    pairs = pairs_of(sh)
    timer = Timer({"torch": tw, "lstmgrad": lw}, cfg.timing())
    groups = [[("torch", t), ("lstmgrad", lg)] for t, lg in pairs.values()]
    gemm_items = [g for g in GEMM_ITEMS if g in lset["items"]]  # none with tensors
    gemm_groups = [[("lstmgrad", g)] for g in gemm_items]
    warm, reps = timer.prepare([i for grp in groups + gemm_groups for i in grp])
    deadline = t_start + share_s
    kept, discarded = timer.rounds(groups, reps, cfg.rounds, deadline)
    gemm_kept, gemm_discarded = timer.rounds(gemm_groups, reps, cfg.rounds, deadline)
    mem = lw.call("memory")
    first = first_call(sh, logdir, cfg, "lstmgrad-fresh") if cfg.first_call else None
    # effective rows (sum of the lengths) also for torch's padded run: useful work per second
    flops = {"bwd": sh.flops_backward(), "fwdbwd": sh.flops_fwd_bwd(),
             "bwd_nodx": sh.flops_backward(dx=False)}  # fmt: skip
    raw: dict[str, Any] = {}
    summary: dict[str, Any] = {}
    for g, (name, (ti, li)) in enumerate(pairs.items()):
        rounds = kept[g]
        raw[name] = {"rounds": rounds, "discarded": [d for d in discarded if d["group"] == g]}
        t_ms, l_ms = ms_rounds(rounds, f"torch:{ti}"), ms_rounds(rounds, f"lstmgrad:{li}")
        summary[name] = pair_stats(t_ms, l_ms, flops[name.removesuffix("_dense")], peak)
        summary[name]["torch_path"] = tset["paths"][ti]["path"]
        summary[name]["noisy_rounds"] = sum(any(b["noisy"] for b in r.values()) for r in rounds)
    gemm_s = {g: [r[f"lstmgrad:{g}"] for r in gemm_kept[k]] for k, g in enumerate(gemm_items)}
    gemm_ms = {g: med([1e3 * med(b["s"]) for b in gemm_s.get(g, [])]) for g in GEMM_ITEMS}
    lg_ms = {k: summary[k]["lg_ms"] for k in ("bwd", "fwdbwd", "bwd_nodx")}
    nodx = [a / b for a, b in zip(summary["bwd_nodx"]["lg_ms_round"],
                                  summary["bwd"]["lg_ms_round"], strict=True)]  # fmt: skip
    derived = {
        "flops_bwd_padded": sh.flops_backward(False),
        "flops_fwd_bwd_padded": sh.flops_fwd_bwd(False),
        "gemm_ms": gemm_ms,
        "gemm_frac_bwd": gemm_ms["gemm_bwd"] / lg_ms["bwd"],
        "gemm_frac_bwd_nodx": gemm_ms["gemm_bwd_nodx"] / lg_ms["bwd_nodx"],
        "gemm_frac_fwdbwd": (gemm_ms["gemm_fwd"] + gemm_ms["gemm_bwd"]) / lg_ms["fwdbwd"],
        "gemm_bwd_over_torch_bwd": gemm_ms["gemm_bwd"] / summary["bwd"]["torch_ms"],
        "nodx_over_full": med(nodx),
        "nodx_over_full_round": nodx,
    }
    return {
        "shape": sh.to_dict(),
        "label": sh.label(),
        "lengths": sh.lengths().tolist() if sh.varlen else None,
        "batch_sizes": None if (bs := sh.batch_sizes()) is None else bs.tolist(),
        "torch_paths": tset["paths"],
        "warmup_s": warm,
        "reps": reps,
        "pairs": raw,
        "gemm_s": gemm_s,
        "summary": summary,
        "derived": derived,
        "memory": mem,
        "first_call": first,
        "redone_batches": len(discarded) + len(gemm_discarded),
        "time_share_s": share_s,
        "elapsed_s": time.perf_counter() - t_start,
    }


def variant(res: dict, pair: str) -> str:
    """What torch ran: dense, or for a varlen shape packed or padded."""
    if res["shape"]["lengths_range"] is None:
        return "dense"
    return "padded" if pair.endswith("_dense") else "packed"


def report(doc: dict) -> str:
    """The run's tables: backward, forward + backward, backward without dx, first calls."""
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
    return "\n".join(out)


def plot(doc: dict, path: Path) -> None:
    m, bars = doc["meta"], []
    for r in doc["results"]:
        for name in ("bwd", "fwdbwd", "bwd_dense", "fwdbwd_dense"):
            if name in r["summary"]:
                v = variant(r, name)
                label = r["shape"]["id"] + ("" if v == "dense" else f"\n({v})")
                item = "backward" if name.startswith("bwd") else "forward+backward"
                bars.append((label, item, r["summary"][name]))
    title = (f"lstmgrad {m['lstmgrad_worker']['lstmgrad']} vs torch {m['torch_worker']['torch']}, "
             f"{m['cpu']}, {m['affinity']} cores, {m['date'][:10]}")  # fmt: skip
    chart(bars, path, title, "speedup over PyTorch (torch ms / lstmgrad ms)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_options(ap, rounds=5, unit="pair", budget_s=780.0)
    ap.add_argument("--no-first-call", action="store_true", help="skip the first-call latency")
    ap.add_argument(
        "--lstmgrad-input",
        choices=("arrays", "tensors"),
        default="arrays",
        help="what lstmgrad is given: NumPy arrays (its GEMMs on NumPy's BLAS) or torch tensors "
        "over the same memory (its GEMMs on torch's)",
    )
    ap.add_argument("--report", type=Path, help="print the tables of a saved JSON and exit")
    args = ap.parse_args(argv)
    if args.report:
        print(report(json.loads(args.report.read_text())))
        return 0

    shapes = select(args.shapes)
    cfg = Config(
        rounds=args.rounds or (2 if args.quick else 5),
        target_s=args.target_s or (0.05 if args.quick else 0.5),
        warmup_reps=1 if args.quick else 2,
        max_reps=3 if args.quick else 10_000,
        pause_s=args.pause_s,
        first_call=not args.no_first_call,
        noise_cores=args.noise_cores,
        max_retries=args.max_retries,
        budget_s=args.budget_s,
        lstmgrad_input=args.lstmgrad_input,
        dtype=args.dtype,
    )
    run = Session(args, "bench", "speedup.png")
    tw = Worker("torch", HERE / "worker_torch.py", run.logdir / "torch.log")
    lw = Worker(
        "lstmgrad", HERE / "worker_lstmgrad.py", run.logdir / "lstmgrad.log", cfg.lstmgrad_env()
    )
    try:
        tinfo, linfo = tw.call("info"), lw.call("info")
        if tinfo["lstmgrad_imported"] or (
            linfo["torch_imported"] and cfg.lstmgrad_input == "arrays"
        ):
            raise SystemExit("a worker imported the other side's library; aborting")
        # float32 peaks also in float16 runs: lstmgrad's compute dtype, and torch's float16 GEMM
        # speed varies several-fold with the sizes (no peak); lstmgrad's GEMMs on its input's
        lib = "numpy" if cfg.lstmgrad_input == "arrays" else "torch"
        peak = {"torch": peak_gflops(run.probe, "torch"), "lstmgrad": peak_gflops(run.probe, lib)}
        config = vars(cfg) | {"shapes": [s.id for s in shapes], "quick": args.quick}
        run.start(tinfo, linfo, worker_lines(tinfo, linfo), config=config, peak=peak)
        run.doc["gate"] = gate(tw, lw)
        if cfg.first_call:
            c = run.doc["cold_first_call"] = cold_first_call(shapes[0], run.logdir, cfg)
            say(f"jit      fresh process, empty Numba cache, {c['shape']}: import "
                f"{c['import_s']:.2f} s, 1st forward {c['fwd1_s']:.2f} s, 1st backward "
                f"{c['bwd1_s']:.2f} s (2nd: {c['fwd2_s']:.3f} s, {c['bwd2_s']:.3f} s; "
                f"{c['cache_files_written']} cache files written)")  # fmt: skip
        say(f"timing   {len(shapes)} shapes, {cfg.dtype}, {cfg.rounds} rounds, "
            f"~{cfg.target_s:g} s per batch, pause {cfg.pause_s:g} s")  # fmt: skip
        results = run.doc["results"] = []
        for sh, share in run.shapes(shapes, cfg.budget_s):
            res = measure_shape(sh, tw, lw, cfg, run.logdir, share, peak)
            results.append(res)
            s = res["summary"]
            say(f"  {sh.id:9s} {sh.label():36s} bwd {s['bwd']['ratio']:.2f}x  fwd+bwd "
                f"{s['fwdbwd']['ratio']:.2f}x  ({res['elapsed_s']:.0f} s, "
                f"{res['redone_batches']} batches redone for other CPU load)")  # fmt: skip
        run.finish()
    except WorkerError as exc:
        print(f"\nworker failure: {exc}", file=sys.stderr)
        return 1
    finally:
        tw.close()
        lw.close()
    say("", report(run.doc), "")
    plot(run.doc, run.png_path)
    run.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
