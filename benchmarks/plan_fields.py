"""What each plan field's values won where they were measured: read the stores of measurements
in a plan cache (``LSTMGRAD_CACHE_DIR``, e.g. the one a grid run filled) and print, per field
value, its largest win over the safe choice it would replace and the classes where it won by at
least 5% (the bar a field must clear to stay in the plan).

    LSTMGRAD_CACHE_DIR=/path/to/cache python benchmarks/plan_fields.py [--json PATH]

Wins are ratios of the tuner's own timings (safe choice / this value, > 1: this value faster):
- big=onednn: the projection, dx and weight gradient products' seconds against blas's;
- transpose_threads=n: the transposing copy on n threads against one;
- fwd_rec / bwd_rec=m: one step's recurrent product by m against blas (per call; a packed
  weight also pays its preparation once a direction);
- walk_product=library: a walk's two products by the library's routine against the loop;
- walk_product=packed: the same by the library's packed GEMM against its plain routine;
- walk / walk_rows / pair_walks / threads+split_min: the short passes' forward + backward by
  that arrangement against one thread, library calls per step;
- fwd_walk=False: the best walking arrangement with its forward as the library-per-step one;
- gate: the measured plan against the default plan on the call's sizes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from lstmgrad.planning.plan import WISDOM_FORMAT

BAR = 1.05  # a value must win by this much somewhere to earn its place


def _cache() -> Path:
    env = os.environ.get("LSTMGRAD_CACHE_DIR")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "lstmgrad"


def wins_of(cls: dict[str, Any], entry: dict[str, Any]) -> dict[str, float]:
    """field=value -> win (safe / value) in one stored entry."""
    out: dict[str, float] = {}
    if cls["what"] == "big":
        s = entry.get("seconds", {})
        if isinstance(s, dict):
            if "onednn/products" in s and "blas/products" in s:
                out["big=onednn"] = s["blas/products"] / s["onednn/products"]
            one = s.get("transpose/1")
            for key, v in s.items():
                n = key.split("/")[1] if key.startswith("transpose/") else ""
                if n.isdigit() and n != "1" and one and v:
                    out[f"transpose_threads={n}"] = one / v
    elif cls["what"] == "steps":
        for part, field in (("fwd", "fwd_rec"), ("bwd", "bwd_rec")):
            rec = entry.get("recurrent", {}).get(part, {})
            base = rec.get("blas", {}).get("call")
            for m, t in rec.items():
                if m != "blas" and base and t.get("call") and t["call"] < float("inf"):
                    out[f"{field}={m}"] = base / t["call"]
        walk = entry.get("walk_products", {})
        if walk.get("loop") and walk.get("library"):
            out["walk_product=library"] = walk["loop"] / walk["library"]
        if walk.get("library") and walk.get("packed"):
            out["walk_product=packed"] = walk["library"] / walk["packed"]
        passes = entry.get("passes", {})
        one = passes.get("one")
        names = {"walk": "walk", "split": "threads+split_min", "rows": "walk_rows",
                 "pairs": "pair_walks"}  # fmt: skip
        for name, t in passes.items():
            field = names.get(name.split("-")[0])
            if field and one and t and t < float("inf"):
                out[field] = max(out.get(field, 0.0), one / t)
        phases = entry.get("arrangement", {}).get("phases", {})
        alt = phases.get("split") or phases.get("one")
        for name, (fwd, bwd) in phases.items():
            if name.split("-")[0] in ("walk", "rows", "pairs") and alt:
                out["fwd_walk=False"] = max(out.get("fwd_walk=False", 0.0),
                                            (fwd + bwd) / (alt[0] + bwd))  # fmt: skip
    elif cls["what"] == "gate" and entry.get("ratio"):
        out["gate (measured plan)"] = entry["ratio"]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", metavar="PATH")
    args = p.parse_args(argv)
    files = sorted(_cache().glob("wisdom-*.json"))
    if not files:
        print(f"no stores of measurements in {_cache()}", file=sys.stderr)
        return 1
    found: dict[str, list[tuple[float, str]]] = defaultdict(list)
    for path in files:
        doc = json.loads(path.read_text())
        if doc.get("facts", {}).get("format") != WISDOM_FORMAT:
            continue  # an older format's store: measured against another safe plan
        for key, entry in doc.get("entries", {}).items():
            cls = json.loads(key)
            label = " ".join(f"{k}{cls[k]}" for k in ("N", "B", "T", "I", "H", "D") if k in cls)
            for field, win in wins_of(cls, entry).items():
                found[field].append((win, f"{cls['what']} {label}"))
    print(f"{'field=value':24s} {'classes':>7s} {'max win':>8s} {'>= 5%':>6s}  where it won most")
    out = {}
    for field in sorted(found):
        rows = sorted(found[field], reverse=True)
        won = [where for w, where in rows if w >= BAR]
        out[field] = {"classes": len(rows), "max": rows[0][0], "won": won}
        print(f"{field:24s} {len(rows):7d} {rows[0][0]:7.2f}x {len(won):6d}  {rows[0][1]}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
