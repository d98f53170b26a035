"""lstmgrad vs PyTorch nn.LSTM on CPU: correctness gate, interleaved timings, table, JSON, PNG.

    python benchmarks/run.py [--shapes id,id] [--rounds N] [--quick] [--dtype float16]
                             [--json PATH] [--png PATH]

Each side runs in its own persistent worker process (worker_torch.py imports torch and never
lstmgrad; worker_lstmgrad.py never imports torch): NumPy's OpenBLAS and PyTorch's BLAS in one
process were measured 35x slower. This parent imports neither; it asks the two workers in turn
(A B A B ..., the first side flipped every round) for one timed batch each, pausing between
requests so the idle side's spinning BLAS/OpenMP threads go to sleep, and reports medians over
rounds and the median of the per-round ratios torch ms / lstmgrad ms. See benchmarks/README.md.
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

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _harness import Timer, Timing, output_paths  # noqa: E402
from _machine import (  # noqa: E402
    CpuWatch,
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
from _protocol import Worker, WorkerError, decode, encode  # noqa: E402
from shapes import SHAPES, Shape, make_case, select  # noqa: E402

GATE_TOL_F32 = 1e-4  # fused vs reference, float32, max relative error
GATE_TOL_F64 = 1e-9  # torch float64 autograd vs lstmgrad float64 reference
ORACLE_SHAPES = [
    Shape("oracle-dense", 4, 3, 5, 6, 2, 2),
    Shape("oracle-varlen", 5, 4, 5, 6, 2, 2, (2, 5)),
]


@dataclass(frozen=True)
class Pair:
    """One paired measurement: a torch item against an lstmgrad item, timed alternately."""

    name: str
    torch_item: str
    lg_item: str


def pairs_of(sh: Shape) -> list[Pair]:
    out = [
        Pair("bwd", "bwd", "bwd"),
        Pair("fwdbwd", "fwdbwd", "fwdbwd"),
        Pair("bwd_nodx", "bwd_nodx", "bwd_nodx"),
    ]
    if sh.varlen:
        out += [
            Pair("bwd_dense", "bwd_dense", "bwd"),
            Pair("fwdbwd_dense", "fwdbwd_dense", "fwdbwd"),
        ]
    return out


GEMM_ITEMS = ("gemm_bwd", "gemm_bwd_nodx", "gemm_fwd")


@dataclass
class Config:
    rounds: int
    target_s: float  # aimed seconds of timed work per batch
    warmup_reps: int
    max_reps: int
    pause_s: float
    first_call: bool
    noise_cores: float  # a batch is redone when other processes used more CPU than this
    max_retries: int
    budget_s: float  # time for all shapes; redos stop when a shape has used its share
    lstmgrad_input: str = "arrays"  # or "tensors" (see worker_lstmgrad.py)
    dtype: str = "float32"  # of the timed items (the gate and the GEMM-only items: float32)

    def timing(self) -> Timing:
        return Timing(self.target_s, self.warmup_reps, 1, self.max_reps, self.pause_s,
                      self.noise_cores, self.max_retries)  # fmt: skip

    def lstmgrad_env(self) -> dict[str, str]:
        """The lstmgrad workers' environment (their input mode)."""
        return dict(os.environ, LSTMGRAD_BENCH_INPUT=self.lstmgrad_input)


# --------------------------------------------------------------------------------------------
# machine header


def engine_name(linfo: dict) -> str:
    imp = linfo["impl"]
    if imp["forward"] and imp["backward"]:
        return "fused (impl='fused')"
    return "reference (no `impl` keyword yet: the default engine)"


def peaks(m: dict, cfg: Config) -> dict[str, float]:
    """The measured float32 GEMM peak of the library each side's GEMMs run on: torch's for
    torch; NumPy's BLAS for lstmgrad given arrays, torch's given tensors. float32 also in float16
    runs: that is lstmgrad's compute dtype, and torch's float16 GEMM speed is no peak (it varies
    several-fold with the sizes on a CPU without float16 arithmetic)."""
    lib = "numpy" if cfg.lstmgrad_input == "arrays" else "torch"
    return {
        "torch": peak_gflops(m["probe"], "torch", "float32"),
        "lstmgrad": peak_gflops(m["probe"], lib, "float32"),
    }


def header_lines(m: dict) -> list[str]:
    t, lg = m["torch_worker"], m["lstmgrad_worker"]
    blas = lg.get("numpy_blas")
    if isinstance(blas, dict):
        blas_s = f"{blas.get('name')} {blas.get('version')}"
        conf = blas.get("openblas configuration")
        if conf:
            blas_s += f" [{conf}]"
    else:
        blas_s = str(blas)
    env = ", ".join(f"{k}={v}" for k, v in m["env"].items() if v is not None) or "none set"
    return [
        f"date     {m['date']}   git {m['git']['commit'][:10]}{' (src dirty)' if m['git']['dirty'] else ''}",
        f"machine  load {m['loadavg_start'][0]:.2f}, Python {m['python']}, {m['platform']}",
        *probe_lines(m["probe"]),
        f"torch    worker: {t['num_threads']} threads (interop {t['num_interop_threads']}), "
        f"mkldnn enabled {t['mkldnn_enabled']}",
        f"lstmgrad {lg['lstmgrad']} engine {engine_name(lg)}; NumPy {lg['numpy']} BLAS {blas_s}, "
        f"OpenBLAS threads {lg.get('openblas_threads')}; Numba {lg.get('numba')} "
        f"({lg.get('numba_threads')} threads)",
        f"input    {lg.get('input', 'arrays')}"
        + (
            f": torch {lg.get('torch')} tensors, lstmgrad's GEMMs on torch ({lg.get('torch_threads')}"
            " threads)"
            if lg.get("input") == "tensors"
            else ": NumPy arrays, lstmgrad's GEMMs on NumPy's BLAS"
        ),
        f"env      {env}   (OPENBLAS_CORETYPE {m['env'].get('OPENBLAS_CORETYPE') or 'unset'})",
    ]


# --------------------------------------------------------------------------------------------
# correctness gate


def gate(tw: Worker, lw: Worker, log: list[str]) -> dict:
    """Abort (SystemExit 2) unless both checks pass; returns what was measured."""
    result: dict[str, Any] = {"tol_f32": GATE_TOL_F32, "tol_f64": GATE_TOL_F64}
    failures: list[str] = []
    # 1. torch float64 autograd vs lstmgrad float64 reference, same arrays from here
    oracle = {}
    for sh in ORACLE_SHAPES:
        case = make_case(sh, "float64", seed=7)
        enc = encode(case)
        want = decode(tw.call("autograd64", shape=sh.to_dict(), case=enc))
        got = decode(lw.call("reference64", shape=sh.to_dict(), case=enc))
        errs = {k: rel_err(got[k], want[k]) for k in ("dx", "dh_prev", "dc_prev", "hy", "cy")}
        errs["dparams"] = max(
            rel_err(a, b) for a, b in zip(got["dparams"], want["dparams"], strict=True)
        )
        oracle[sh.id] = errs
        worst = max(errs.values())
        log.append(
            f"gate     torch f64 autograd vs lstmgrad f64 reference, {sh.label()}: max rel err {worst:.1e}"
        )
        if not worst <= GATE_TOL_F64:
            failures.append(f"{sh.id}: torch float64 vs lstmgrad reference: {errs}")
    result["torch_vs_reference_f64"] = oracle
    # 2. fused vs reference in float32 on a scaled-down version of every shape
    fused = lw.call("gate_fused", shapes=[s.scaled().to_dict() for s in SHAPES])
    result["fused_vs_reference_f32"] = fused
    if "skipped" in fused:
        log.append(f"gate     fused vs reference: SKIPPED ({fused['skipped']})")
    else:
        worst_all = 0.0
        for sid, res in fused.items():
            for case, errs in res.items():
                w = max(errs.values())
                worst_all = max(worst_all, w)
                if not w <= GATE_TOL_F32:
                    failures.append(f"{sid} {case}: fused vs reference float32: {errs}")
        log.append(
            f"gate     fused vs reference f32, {len(fused)} scaled shapes (T<=6), backward "
            f"(+no dx) and fwd+bwd: max rel err {worst_all:.1e} (tol {GATE_TOL_F32:g})"
        )
    if failures:
        for line in log:
            print(line)
        print("\nCORRECTNESS GATE FAILED: no timings are reported for a wrong result.")
        for f in failures:
            print("  " + f)
        raise SystemExit(2)
    return result


# --------------------------------------------------------------------------------------------
# measurement


def measure_shape(
    sh: Shape,
    tw: Worker,
    lw: Worker,
    cfg: Config,
    logdir: Path,
    share_s: float,
    peak: dict[str, float],
) -> dict:
    """All measurements of one shape; noisy pairs are redone only within ``share_s`` seconds
    (this shape's share of the run's time budget). ``peak``: GFLOP/s of each side's GEMMs
    (:func:`peaks`), the denominators of the peak fractions."""
    t_start = time.perf_counter()
    tset = tw.call("setup", shape=sh.to_dict(), dtype=cfg.dtype)
    lset = lw.call("setup", shape=sh.to_dict(), dtype=cfg.dtype)
    if lset["torch_imported"] and cfg.lstmgrad_input == "arrays":
        raise SystemExit("lstmgrad worker imported torch: the measurement would be invalid")
    pairs = pairs_of(sh)
    timer = Timer({"torch": tw, "lstmgrad": lw}, cfg.timing())
    groups = [[("torch", p.torch_item), ("lstmgrad", p.lg_item)] for p in pairs]
    gemm_items = [g for g in GEMM_ITEMS if g in lset["items"]]  # none with tensors
    gemm_groups = [[("lstmgrad", g)] for g in gemm_items]
    warm, reps = timer.prepare([i for grp in groups + gemm_groups for i in grp])
    deadline = t_start + share_s
    kept, discarded = timer.rounds(groups, reps, cfg.rounds, deadline)
    gemm_kept, gemm_discarded = timer.rounds(gemm_groups, reps, cfg.rounds, deadline)
    raw: dict[str, dict] = {}
    for g, p in enumerate(pairs):
        raw[p.name] = {
            "torch_item": p.torch_item,
            "lg_item": p.lg_item,
            "torch": [rd[f"torch:{p.torch_item}"] for rd in kept[g]],
            "lg": [rd[f"lstmgrad:{p.lg_item}"] for rd in kept[g]],
            "discarded": [d for d in discarded if d["group"] == g],
        }
    gemm_raw = {g: [rd[f"lstmgrad:{g}"] for rd in gemm_kept[n]] for n, g in enumerate(gemm_items)}
    redone = len(discarded) + len(gemm_discarded)

    mem = lw.call("memory")
    first = None
    if cfg.first_call:
        fresh = Worker(
            "lstmgrad-fresh",
            HERE / "worker_lstmgrad.py",
            logdir / "lstmgrad-fresh.log",
            cfg.lstmgrad_env(),
        )
        try:
            with CpuWatch(fresh.proc.pid) as watch:
                first = fresh.call("first_call", shape=sh.to_dict(), dtype=cfg.dtype)
            first["other_cores"] = round(watch.foreign_cores, 3)
        finally:
            fresh.close()
        time.sleep(cfg.pause_s)

    # per round: median of the batch's reps; pair ratio per round
    # effective rows (sum of the lengths) also for torch's padded run: useful work per second
    flops = {
        "bwd": sh.flops_backward(),
        "fwdbwd": sh.flops_fwd_bwd(),
        "bwd_nodx": sh.flops_backward(dx=False),
    }
    summary: dict[str, Any] = {}
    for name, d in raw.items():
        t_ms = [1e3 * med(b["s"]) for b in d["torch"]]
        l_ms = [1e3 * med(b["s"]) for b in d["lg"]]
        ratios = [a / b for a, b in zip(t_ms, l_ms, strict=True)]
        d.update(torch_ms_round=t_ms, lg_ms_round=l_ms, ratio_round=ratios)
        noisy = sum(
            bool(a["noisy"] or b["noisy"]) for a, b in zip(d["torch"], d["lg"], strict=True)
        )
        f = flops[name.removesuffix("_dense")]
        gf = {"torch": f / med(t_ms) / 1e6, "lg": f / med(l_ms) / 1e6}
        summary[name] = {
            "noisy_rounds": noisy,
            "rounds": len(ratios),
            "torch_ms": med(t_ms),
            "lg_ms": med(l_ms),
            "ratio": med(ratios),
            "ratio_min": min(ratios),
            "ratio_max": max(ratios),
            "torch_path": tset["paths"][d["torch_item"]]["path"],
            "flops": f,
            "torch_gflops": gf["torch"],
            "lg_gflops": gf["lg"],
            "torch_peak_frac": gf["torch"] / peak["torch"],
            "lg_peak_frac": gf["lg"] / peak["lstmgrad"],
        }
    gemm_ms = {g: med([1e3 * med(b["s"]) for b in v]) for g, v in gemm_raw.items()}
    if not gemm_ms:  # tensors: no GEMM-only reference
        gemm_ms = dict.fromkeys(GEMM_ITEMS, math.nan)
    lg_full_round = raw["bwd"]["lg_ms_round"]
    nodx_vs_full = [
        a / b for a, b in zip(raw["bwd_nodx"]["lg_ms_round"], lg_full_round, strict=True)
    ]
    bwd_ms, fb_ms, nodx_ms = (summary[k]["lg_ms"] for k in ("bwd", "fwdbwd", "bwd_nodx"))
    derived = {
        "flops_bwd_effective": sh.flops_backward(True),
        "flops_bwd_padded": sh.flops_backward(False),
        "flops_bwd_nodx_effective": sh.flops_backward(True, dx=False),
        "flops_fwd_bwd_effective": sh.flops_fwd_bwd(True),
        "flops_fwd_bwd_padded": sh.flops_fwd_bwd(False),
        "gflops_bwd": sh.flops_backward(True) / bwd_ms / 1e6,
        "gflops_bwd_nodx": sh.flops_backward(True, dx=False) / nodx_ms / 1e6,
        "gflops_fwd_bwd": sh.flops_fwd_bwd(True) / fb_ms / 1e6,
        "torch_gflops_bwd": sh.flops_backward(True) / summary["bwd"]["torch_ms"] / 1e6,
        "gemm_ms": gemm_ms,
        "gemm_frac_bwd": gemm_ms["gemm_bwd"] / bwd_ms,
        "gemm_bwd_over_torch_bwd": gemm_ms["gemm_bwd"] / summary["bwd"]["torch_ms"],
        "gemm_frac_bwd_nodx": gemm_ms["gemm_bwd_nodx"] / nodx_ms,
        "gemm_frac_fwd_bwd": (gemm_ms["gemm_fwd"] + gemm_ms["gemm_bwd"]) / fb_ms,
        "nodx_over_full": med(nodx_vs_full),
        "nodx_over_full_round": nodx_vs_full,
    }
    return {
        "shape": sh.to_dict(),
        "label": sh.label(),
        "lengths": sh.lengths().tolist() if sh.varlen else None,
        "batch_sizes": sh.batch_sizes().tolist() if sh.varlen else None,
        "torch_paths": tset["paths"],
        "warmup_s": warm,
        "reps": reps,
        "pairs": raw,
        "gemm_s": gemm_raw,
        "summary": summary,
        "derived": derived,
        "memory": mem,
        "first_call": first,
        "redone_batches": redone,
        "time_share_s": share_s,
        "elapsed_s": time.perf_counter() - t_start,
    }


def cold_first_call(sh: Shape, logdir: Path, cfg: Config) -> dict:
    """First calls in a fresh lstmgrad process whose Numba cache is empty (NUMBA_CACHE_DIR
    pointed at a new temporary folder): the JIT compile time itself."""
    with tempfile.TemporaryDirectory(prefix="lstmgrad-numba-cache-") as cache:
        env = dict(cfg.lstmgrad_env(), NUMBA_CACHE_DIR=cache)
        w = Worker("lstmgrad-cold", HERE / "worker_lstmgrad.py", logdir / "lstmgrad-cold.log", env)
        try:
            with CpuWatch(w.proc.pid) as watch:
                out = w.call("first_call", shape=sh.to_dict())
        finally:
            w.close()
        out["cache_files_written"] = sum(len(f) for _, _, f in os.walk(cache))
    out["other_cores"] = round(watch.foreign_cores, 3)
    out["shape"] = sh.id
    return out


# --------------------------------------------------------------------------------------------
# reporting


def _fmt_ms(v: float) -> str:
    return f"{v:.3f}" if v < 1 else f"{v:.2f}" if v < 100 else f"{v:.1f}"


def _ratio(s: dict) -> str:
    return f"{s['ratio']:.2f}x [{s['ratio_min']:.2f}-{s['ratio_max']:.2f}]"


def _gflops(s: dict, side: str) -> str:
    """GFLOP/s of one side and its fraction of that side's measured GEMM peak."""
    frac = s[f"{side}_peak_frac"]
    pct = f" ({100 * frac:.0f}%)" if math.isfinite(frac) else ""
    return f"{s[f'{side}_gflops']:.3g}{pct}"


def _noisy(s: dict) -> str:
    return f"{s['noisy_rounds']}/{s['rounds']}"


def table(rows: list[list[str]], head: list[str]) -> str:
    w = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
    lines = [
        "  ".join(str(c).rjust(w[i]) if i > 1 else str(c).ljust(w[i]) for i, c in enumerate(r))
        for r in [head, *rows]
    ]
    lines.insert(1, "  ".join("-" * x for x in w))
    return "\n".join(lines)


def _extra_mb(res: dict, *items: str) -> str:
    """The largest extra memory of ``items`` in MB ("-" where not measured: tensor input)."""
    if res["memory"] is None:
        return "-"
    return f"{max(res['memory'][i]['extra'] for i in items) / 1e6:.1f}"


def torch_path_label(res: dict, pair: str) -> str:
    s = res["summary"][pair]
    if res["shape"]["lengths_range"] is None:
        return f"{s['torch_path']} (dense)"
    return f"{s['torch_path']} ({'padded' if pair.endswith('_dense') else 'packed'})"


def report(results: list[dict], dtype: str, peak: dict[str, float]) -> str:
    out = [
        f"GFLOP/s: GEMM FLOPs (effective rows) per second; (%): of the measured float32 GEMM peak "
        f"of the side's library, torch {peak['torch']:.3g} GFLOP/s, lstmgrad "
        f"{peak['lstmgrad']:.3g} GFLOP/s",
        "",
    ]
    head = [
        "shape",
        "torch path",
        "torch ms",
        "lstmgrad ms",
        "speedup [min-max]",
        "torch GFLOP/s",
        "lstmgrad GFLOP/s",
        "GEMM-only",
        "extra MB",
        "first call s",
        "noisy",
    ]
    rows = []
    for res in results:
        for pair in ("bwd", "bwd_dense"):
            if pair not in res["summary"]:
                continue
            s, d, fc = res["summary"][pair], res["derived"], res["first_call"]
            rows.append(
                [
                    res["shape"]["id"],
                    torch_path_label(res, pair),
                    _fmt_ms(s["torch_ms"]),
                    _fmt_ms(s["lg_ms"]),
                    _ratio(s),
                    _gflops(s, "torch"),
                    _gflops(s, "lg"),
                    f"{d['gemm_frac_bwd']:.2f}",
                    _extra_mb(res, "bwd"),
                    f"{fc['bwd1_s']:.2f}" if fc else "-",
                    _noisy(s),
                ]
            )
    out.append(f"Backward alone ({dtype}; speedup = median of per-round torch ms / lstmgrad ms)")
    out.append(table(rows, head))
    rows = []
    for res in results:
        for pair in ("fwdbwd", "fwdbwd_dense"):
            if pair not in res["summary"]:
                continue
            s, d, fc = res["summary"][pair], res["derived"], res["first_call"]
            rows.append(
                [
                    res["shape"]["id"],
                    torch_path_label(res, pair),
                    _fmt_ms(s["torch_ms"]),
                    _fmt_ms(s["lg_ms"]),
                    _ratio(s),
                    _gflops(s, "torch"),
                    _gflops(s, "lg"),
                    f"{d['gemm_frac_fwd_bwd']:.2f}",
                    _extra_mb(res, "fwd", "bwd"),
                    f"{fc['fwd1_s'] + fc['bwd1_s']:.2f}" if fc else "-",
                    _noisy(s),
                ]
            )
    out.append("")
    out.append("Forward + backward (training step of the LSTM alone)")
    out.append(table(rows, head))
    head2 = [
        "shape",
        "torch path",
        "torch ms",
        "lstmgrad ms",
        "speedup [min-max]",
        "torch GFLOP/s",
        "lstmgrad GFLOP/s",
        "GEMM-only",
        "extra MB",
        "no-dx/full",
        "noisy",
    ]
    rows = []
    for res in results:
        s, d = res["summary"]["bwd_nodx"], res["derived"]
        rows.append(
            [
                res["shape"]["id"],
                torch_path_label(res, "bwd_nodx"),
                _fmt_ms(s["torch_ms"]),
                _fmt_ms(s["lg_ms"]),
                _ratio(s),
                _gflops(s, "torch"),
                _gflops(s, "lg"),
                f"{d['gemm_frac_bwd_nodx']:.2f}",
                _extra_mb(res, "bwd_nodx"),
                f"{d['nodx_over_full']:.2f}",
                _noisy(s),
            ]
        )
    out.append("")
    out.append(
        "Backward without layer-0 dx (lstmgrad output_mask=(False, True, True, True); "
        "torch input.requires_grad=False)"
    )
    out.append(table(rows, head2))
    fc_rows = []
    for res in results:
        fc = res["first_call"]
        if not fc:
            continue
        fc_rows.append(
            [
                res["shape"]["id"],
                "",
                f"{fc['import_s']:.2f}",
                f"{fc['fwd1_s']:.3f}",
                f"{fc['bwd1_s']:.3f}",
                f"{fc['fwd2_s']:.3f}",
                f"{fc['bwd2_s']:.3f}",
            ]
        )
    if fc_rows:
        out.append("")
        out.append(
            "First calls in a fresh lstmgrad process (s; JIT compile or cache load), vs the second call"
        )
        out.append(
            table(fc_rows, ["shape", "", "import", "1st fwd", "1st bwd", "2nd fwd", "2nd bwd"])
        )
    return "\n".join(out)


def plot(results: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels, bwd, fb, bwd_err, fb_err = [], [], [], [], []
    for res in results:
        for pb, pf in (("bwd", "fwdbwd"), ("bwd_dense", "fwdbwd_dense")):
            if pb not in res["summary"]:
                continue
            sid = res["shape"]["id"]
            if res["shape"]["lengths_range"] is not None:
                sid += "\n(padded)" if pb.endswith("_dense") else "\n(packed)"
            labels.append(sid)
            for lst, err, key in ((bwd, bwd_err, pb), (fb, fb_err, pf)):
                s = res["summary"][key]
                lst.append(s["ratio"])
                err.append((s["ratio"] - s["ratio_min"], s["ratio_max"] - s["ratio"]))
    x = np.arange(len(labels))
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(labels) + 2), 4.5))
    w = 0.38
    for off, vals, err, lab in (
        (-w / 2, bwd, bwd_err, "backward"),
        (w / 2, fb, fb_err, "forward+backward"),
    ):
        # bars grow from 1x: up where lstmgrad is faster, down where it is slower
        v = np.array(vals)
        ax.bar(x + off, v - 1.0, w, bottom=1.0, label=lab)
        ax.errorbar(x + off, v, yerr=np.array(err).T, fmt="none", ecolor="k", capsize=2, lw=0.8)
        for xi, vi, (e_lo, e_hi) in zip(x + off, v, err, strict=True):
            ax.annotate(
                f"{vi:.2f}",
                (xi, vi + e_hi if vi >= 1 else vi - e_lo),  # beyond the min-max bar
                xytext=(0, 3 if vi >= 1 else -9),
                textcoords="offset points",
                ha="center",
                fontsize=7,
            )
    ends = [v - e[0] for v, e in zip(bwd + fb, bwd_err + fb_err, strict=True)]
    ends += [v + e[1] for v, e in zip(bwd + fb, bwd_err + fb_err, strict=True)]
    speedup_axis(ax, min([*ends, 1.0]) / 1.3, max([*ends, 1.0]) * 1.3)
    ax.set_xticks(x, labels, fontsize=8)
    ax.set_ylabel("speedup over PyTorch (torch ms / lstmgrad ms)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    save_figure(fig, path)


# --------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", help="comma-separated shape ids (default: all 12)")
    ap.add_argument(
        "--rounds", type=int, help="timed rounds after the warm-up (default 5; 2 with --quick)"
    )
    ap.add_argument("--quick", action="store_true", help="smoke run: 2 rounds, few reps")
    ap.add_argument(
        "--json", type=Path, help="raw results (default benchmarks/results/bench-<date>.json)"
    )
    ap.add_argument(
        "--png", type=Path, help="speedup chart (default benchmarks/results/speedup.png)"
    )
    ap.add_argument(
        "--target-s",
        type=float,
        help="seconds of timed work per batch (default 0.5; 0.05 with --quick)",
    )
    ap.add_argument(
        "--no-first-call", action="store_true", help="skip the fresh-process first-call latency"
    )
    add_noise_options(ap, "pair", 780.0)
    ap.add_argument(
        "--lstmgrad-input",
        choices=("arrays", "tensors"),
        default="arrays",
        help="what lstmgrad is given: NumPy arrays (its GEMMs on NumPy's BLAS; default) or "
        "torch tensors over the same memory (its GEMMs on torch's oneDNN / BLAS)",
    )
    ap.add_argument(
        "--dtype",
        choices=("float32", "float16"),
        default="float32",
        help="dtype of the timed items on both sides (default float32; the gate and the "
        "GEMM-only items stay float32)",
    )
    args = ap.parse_args(argv)

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
    json_path, png_path, logdir = output_paths(args.json, args.png, "bench", "speedup.png")

    t0 = time.perf_counter()
    probe = probe_machine(cfg.dtype)  # before the workers start: nothing else running
    tw = Worker("torch", HERE / "worker_torch.py", logdir / "torch.log")
    lw = Worker(
        "lstmgrad", HERE / "worker_lstmgrad.py", logdir / "lstmgrad.log", cfg.lstmgrad_env()
    )
    results: list[dict] = []
    try:
        tinfo, linfo = tw.call("info"), lw.call("info")
        if tinfo["lstmgrad_imported"] or (
            linfo["torch_imported"] and args.lstmgrad_input == "arrays"
        ):
            raise SystemExit("a worker imported the other side's library; aborting")
        meta = machine(tinfo, linfo, probe)
        peak = peaks(meta, cfg)
        lines = header_lines(meta)
        for line in lines:
            print(line, flush=True)
        log: list[str] = []
        gate_res = gate(tw, lw, log)
        for line in log:
            print(line, flush=True)
        doc: dict[str, Any] = {
            "meta": meta,
            "config": vars(cfg) | {"shapes": [s.id for s in shapes], "quick": args.quick},
            "gate": gate_res,
            "results": results,
        }
        if cfg.first_call:
            cold = cold_first_call(shapes[0], logdir, cfg)
            doc["cold_first_call"] = cold
            print(
                f"jit      fresh process, empty Numba cache, {cold['shape']}: import "
                f"{cold['import_s']:.2f} s, 1st forward {cold['fwd1_s']:.2f} s, 1st backward "
                f"{cold['bwd1_s']:.2f} s (2nd: {cold['fwd2_s']:.3f} s, {cold['bwd2_s']:.3f} s; "
                f"{cold['cache_files_written']} cache files written)",
                flush=True,
            )
        print(
            f"timing   {len(shapes)} shapes, {cfg.dtype}, {cfg.rounds} rounds, "
            f"~{cfg.target_s:g} s per batch, pause {cfg.pause_s:g} s",
            flush=True,
        )
        t_timing = time.perf_counter()
        for k, sh in enumerate(shapes):
            left = cfg.budget_s - (time.perf_counter() - t_timing)
            share = max(0.0, left) / (len(shapes) - k)
            res = measure_shape(sh, tw, lw, cfg, logdir, share, peak)
            results.append(res)
            s = res["summary"]
            print(
                f"  {sh.id:9s} {sh.label():36s} bwd {s['bwd']['ratio']:.2f}x  fwd+bwd "
                f"{s['fwdbwd']['ratio']:.2f}x  ({res['elapsed_s']:.0f} s, "
                f"{res['redone_batches']} batches redone for other CPU load)",
                flush=True,
            )
            json_path.write_text(json.dumps(doc, indent=1))
        meta["loadavg_end"] = os.getloadavg()
        meta["total_s"] = time.perf_counter() - t0
        json_path.write_text(json.dumps(doc, indent=1))
    except WorkerError as exc:
        print(f"\nworker failure: {exc}", file=sys.stderr)
        return 1
    finally:
        tw.close()
        lw.close()

    print()
    print(report(results, cfg.dtype, peak))
    print()
    title = f"lstmgrad {linfo['lstmgrad']} [{engine_name(linfo).split(' ')[0]}] vs torch {tinfo['torch']}, {meta['cpu']}, {meta['affinity']} cores, {meta['date'][:10]}"
    plot(results, png_path, title)
    print(f"json {json_path}\npng  {png_path}\nlogs {logdir}\ntotal {meta['total_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
