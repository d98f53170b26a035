"""Markdown summary of a benchmark JSON (the README's table): python benchmarks/summary.py PATH.

Per shape: PyTorch's path, its and lstmgrad's median ms and the speedup (median of per-round
ratios) for the backward alone, forward + backward and the backward without layer 0's dx;
lstmgrad's no-dx time over its full backward; the fraction of lstmgrad's backward time that
the same GEMMs alone take. Then the geometric means the issue's targets are stated in.
"""

from __future__ import annotations

import json
import math
import sys


def _fmt_ms(ms: float) -> str:
    return f"{ms:.3g}" if ms < 100 else f"{ms:.0f}"


def main(path: str) -> None:
    data = json.load(open(path))
    meta = data["meta"]
    print(f"Measured {meta['date'][:10]} on {meta['cpu']}, {meta['cpu_count']} cores; ", end="")
    tw = meta.get("torch_worker", {})
    tensors = meta.get("lstmgrad_worker", {}).get("input") == "tensors"
    lg_in = (
        "torch tensors (its GEMMs on torch's oneDNN)"
        if tensors
        else "NumPy arrays (NumPy's OpenBLAS)"
    )
    print(f"PyTorch {tw.get('torch')} ({tw.get('num_threads')} threads), lstmgrad given {lg_in}.\n")
    print(
        "| shape | PyTorch path | bwd: PyTorch ms | lstmgrad ms | speedup | fwd+bwd: PyTorch ms | lstmgrad ms | speedup | no-dx / full | no-dx speedup | GEMM-only |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    dense_bwd, dense_fb = [], []
    for r in data["results"]:
        sid, s = r["shape"]["id"], r["summary"]
        rows = [("bwd", "fwdbwd", "bwd_nodx")]
        if "bwd_dense" in s:
            rows.append(("bwd_dense", "fwdbwd_dense", None))
        for bwd, fb, nodx in rows:
            b, f = s[bwd], s[fb]
            path = b["torch_path"] + (
                " padded"
                if bwd.endswith("dense")
                else " packed"
                if r["shape"]["lengths_range"]
                else ""
            )
            n = s[nodx] if nodx else None
            nodx_cols = f"{r['derived']['nodx_over_full']:.2f} | {n['ratio']:.2f}x" if n else "| "
            frac = r["derived"]["gemm_frac_bwd"]
            gemm = "" if not nodx else "-" if math.isnan(frac) else f"{frac:.2f}"
            print(
                f"| {sid} | {path} | {_fmt_ms(b['torch_ms'])} | {_fmt_ms(b['lg_ms'])} | "
                f"{b['ratio']:.2f}x | {_fmt_ms(f['torch_ms'])} | {_fmt_ms(f['lg_ms'])} | "
                f"{f['ratio']:.2f}x | {nodx_cols} | {gemm} |"
            )
            if not r["shape"]["lengths_range"]:
                dense_bwd.append(b["ratio"])
                dense_fb.append(f["ratio"])
    geo = lambda xs: math.exp(sum(math.log(x) for x in xs) / len(xs))  # noqa: E731
    print(
        f"\nDense shapes: backward geometric mean {geo(dense_bwd):.2f}x (min {min(dense_bwd):.2f}x), "
        f"forward + backward {geo(dense_fb):.2f}x (min {min(dense_fb):.2f}x)."
    )


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results/final.json")
