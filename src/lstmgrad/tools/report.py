"""What ``lstmgrad check`` prints and writes for msProbe and kernel-level dumps: the table,
the summary line, the CSV (one row per call and output, like msProbe compare's) and the JSON."""

from __future__ import annotations

import csv
import json
import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict
from typing import Any, TextIO

from . import metrics
from .golden import CallReport, Row

VERDICT = {metrics.PASS: "pass", metrics.WARNING: "warning", metrics.ERROR: "FAIL"}


def _g(v: float | None, fmt: str = ".2e") -> str:
    if v is None:
        return "N/A"
    if isinstance(v, float) and math.isinf(v):
        return "inf"
    return format(v, fmt)


def _ratio(row: Row, key: str) -> str:
    r = row.ratios.get(key)
    return "N/A" if r is None else f"{r:.3g}"


def table(reports: list[CallReport], rule: str) -> list[str]:
    """The report on screen: one block per call, one line per output."""
    lines: list[str] = []
    for rep in reports:
        head = f"{rep.name}  [{rep.source}]"
        if rep.skipped is not None:
            lines += [head, f"  skipped: {rep.skipped}", ""]
            continue
        if rep.unreadable is not None and not rep.rows:
            lines += [head, f"  could not be checked: {rep.unreadable}", ""]
            continue
        lines.append(f"{head}  {rep.kind}, {rep.dtype}, {rep.dims}: {rep.verdict.upper()}")
        cols = ["output", "", "Cosine", "MaxAbsErr", "MaxRelErr", "1/1000", "5/1000",
                "RMSE x", "MaxRE x", "MeanRE x", "small x", "msProbe", "bound off", "verdict"]  # fmt: skip
        rows = [cols]
        for r in rep.rows:
            if r.columns is None:
                verdict = VERDICT.get(r.status, r.status)
                rows.append([r.key, r.label, *["-"] * 11, verdict])
                continue
            c = r.columns
            rows.append([
                r.key, r.label, _g(c.cosine, ".6f"), _g(c.max_abs_err), _g(c.max_rel_err),
                f"{c.one_thousandth:.4f}", f"{c.five_thousandths:.4f}", _ratio(r, "rmse"),
                _ratio(r, "max_rel_err"), _ratio(r, "mean_rel_err"),
                _ratio(r, "small_value_err_ratio"), _msprobe(r), f"{r.bound_off:.2%}",
                VERDICT.get(r.status, r.status),
            ])  # fmt: skip
        w = [max(len(row[k]) for row in rows) for k in range(len(cols))]
        lines += ["  " + "  ".join(v.ljust(w[k]) for k, v in enumerate(row)).rstrip()
                  for row in rows]  # fmt: skip
        for r in rep.rows:
            if r.note:
                lines.append(f"  {r.key} ({r.label}): {r.note}")
            for s, got, ref, tol, ok in r.stats:
                lines.append(f"    {s}: recorded {got:.6g}, recomputed {ref:.6g} (tolerance "
                             f"{tol:.2g}) {'ok' if ok else 'FAIL'}")  # fmt: skip
            if r.failed and r.worst:
                for err, times, where in r.worst:
                    lines.append(f"    largest error {err:.3e} ({times:.3g} x bound) at {where}")
        lines += [f"  note: {n}" for n in rep.notes]
        if rep.unreadable:
            lines.append(f"  could not be checked: {rep.unreadable}")
        lines.append("")
    lines.append(f"rule     {RULE_TEXT[rule]}")
    return lines


def _msprobe(row: Row) -> str:
    """The msProbe column: the msprobe rule's status, or the benchmark standard's in
    parentheses where its ratios are information only (float16, bfloat16)."""
    if row.msprobe_status == metrics.INFO:
        return f"({row.benchmark_status})"
    return row.msprobe_status


RULE_TEXT = {
    "msprobe": "msprobe (the verdict): an output fails on NaN/Inf where the reference has none, "
    "Cosine <= 0.99, or, in float32 and float64, a benchmark-standard ratio (device / lstmgrad's "
    "fused engine, both against the float64 reference, divided by no less than 2^-14) above its "
    "error threshold (RMSE 2, MaxRE 10, MeanRE 2, small 2); ratios above 1 are warnings; in "
    "float16 and bfloat16 the ratios are information (in parentheses) and an output without "
    "NaN/Inf or low Cosine is unjudged",
    "bound": "bound (the verdict): an output fails when any element is beyond c * eps * "
    "sqrt(K) * (|ref| + rms(ref)) of the float64 reference, or holds NaN/Inf where the "
    "reference does not; the msProbe column is msProbe's benchmark standard and cosine, shown "
    "for reference (--rule msprobe makes it the verdict)",
    "both": "both: an output must pass the msprobe rule and the bound (in float16 and bfloat16: "
    "the bound, NaN/Inf and Cosine)",
}


def summary(reports: list[CallReport]) -> str:
    """ "LSTM calls: N found, ... checked (P passed, F failed), S skipped (why), U could not be
    checked" with the reasons counted."""
    count = Counter(r.verdict for r in reports if r.name != "(dump.json)")
    found = sum(count.values())
    checked = count["passed"] + count["failed"]
    parts = [f"LSTM calls: {found} found, {checked} checked ({count['passed']} passed, "
             f"{count['failed']} failed)"]  # fmt: skip
    skipped = Counter(_short(r.skipped) for r in reports if r.skipped is not None)
    if skipped:
        why = "; ".join(f"{n} {w}" for w, n in skipped.items())
        parts.append(f"{count['skipped']} skipped ({why})")
    bad = [r for r in reports if r.verdict in ("unreadable", "unjudged", "undecided")]
    if bad:
        why = "; ".join(f"{n} {w}" for w, n in Counter(_short(r.unreadable or _unjudged(r))
                                                        for r in bad).items())  # fmt: skip
        parts.append(f"{len(bad)} could not be checked ({why})")
    rows = [row for r in reports for row in r.rows]
    judged = sum(row.status in (metrics.PASS, metrics.WARNING, metrics.ERROR) for row in rows)
    if rows:
        parts.append(f"outputs: {judged} of {len(rows)} judged")
    return ", ".join(parts)


def _unjudged(rep: CallReport) -> str:
    if any(r.status == "undecided" for r in rep.rows):
        return "outputs above layer 0 differ and dropout is unknown: see --no-dropout"
    if any(r.status == "unjudged" and r.msprobe_status == metrics.INFO for r in rep.rows):
        return f"{rep.dtype}: --rule msprobe's ratios are information only; see --rule bound"
    problems = [r.note for r in rep.rows if r.status == "unreadable"]
    return problems[0] if problems else "nothing in it could be judged"


_REASONS = {  # a marker in a reason -> how the summary counts it
    "tensor file": "tensor file missing",
    "holds a tensor saved on an Ascend NPU": "NPU tensors need torch_npu",
    "statistics only": "statistics only: a golden needs task 'tensor'",
    "torch_npu's own LSTM op": "NPU.npu_lstm: argument layout unknown",
    "its forward entry": "backward without its forward",
    "not readable as JSON": "dump.json unreadable",
}


def _short(text: str | None) -> str:
    """A reason without the call's own names, so that equal reasons count together."""
    t = (text or "").split(" (")[0]
    for marker, reason in _REASONS.items():
        if marker in t:
            return reason
    return t if len(t) <= 80 else t[:80].rsplit(" ", 1)[0] + " ..."


def exit_status(reports: list[CallReport]) -> int:
    """1 when an LSTM call failed; else 2 when one could not be checked or none was checked;
    else 0."""
    verdicts = [r.verdict for r in reports]
    if "failed" in verdicts:
        return 1
    if {"unreadable", "unjudged", "undecided"} & set(verdicts) or "passed" not in verdicts:
        return 2
    return 0


CSV_HEAD = [
    "NPU Name", "Bench Name", "Output", "NPU Dtype", "Bench Dtype", "NPU Tensor Shape",
    "Cosine", "EucDist", "MaxAbsErr", "MaxRelativeErr", "One Thousandth Err Ratio",
    "Five Thousandths Err Ratio", "Small Value Err Ratio", "lstmgrad Small Value Err Ratio",
    "Small Value Ratio", "RMSE", "lstmgrad RMSE", "RMSE Ratio", "Max Rel Err",
    "lstmgrad Max Rel Err", "Max Rel Err Ratio", "Mean Rel Err", "lstmgrad Mean Rel Err",
    "Mean Rel Err Ratio", "EB", "lstmgrad EB", "EB Ratio", "Benchmark Status", "msProbe Status",
    "Bound Off",
    "lstmgrad Max Error / Bound", "Accuracy Reached or Not", "Err_message", "Largest Error At",
    "Call", "Source",
]  # fmt: skip
_REACHED = {metrics.PASS: "Yes", metrics.WARNING: "Warning", metrics.ERROR: "No"}


def _bench_cells(row: Row) -> list[Any]:
    cells: list[Any] = []
    for k, name in (("small_value_err_ratio", "small_value_err_ratio"), ("rmse", "rmse"),
                    ("max_rel_err", "max_rel_err"), ("mean_rel_err", "mean_rel_err"),
                    ("eb", "eb")):  # fmt: skip
        dev = getattr(row.device, name) if row.device else None
        fus = getattr(row.fused, name) if row.fused else None
        cells += [dev, fus, row.ratios.get(k)]
    return cells


def write_csv(reports: Iterable[CallReport], fh: TextIO) -> None:
    """One row per (call, output); calls not checked get one row saying why."""
    w = csv.writer(fh)
    w.writerow(CSV_HEAD)
    for rep in reports:
        if not rep.rows:
            why = rep.skipped or rep.unreadable or ""
            w.writerow([rep.name, "", "", "", "", "", *[""] * 25,
                        "skipped" if rep.skipped else "N/A", why, "", rep.name, rep.source])  # fmt: skip
            continue
        for r in rep.rows:
            c = r.columns
            cols = [c.cosine, c.euc_dist, c.max_abs_err, c.max_rel_err, c.one_thousandth,
                    c.five_thousandths] if c else [None] * 6  # fmt: skip
            note = r.note or "; ".join(f"{s} recorded {g:.6g} recomputed {e:.6g}"
                                       for s, g, e, _, _ in r.stats)  # fmt: skip
            w.writerow([
                r.key, f"lstmgrad reference (float64) of {r.label}", r.label, r.dtype, "float64",
                list(r.shape), *cols, *_bench_cells(r), r.benchmark_status, r.msprobe_status,
                r.bound_off if c else None, r.fused_bound_max if c else None,
                _REACHED.get(r.status, "N/A"), note, r.worst[0][2] if r.worst else "",
                rep.name, rep.source,
            ])  # fmt: skip


def to_json(reports: list[CallReport], rule: str, factor: float) -> str:
    """Everything in the report, with the summary and the exit status."""

    def clean(v: Any) -> Any:
        if isinstance(v, float) and not math.isfinite(v):
            return str(v)
        if isinstance(v, dict):
            return {k: clean(e) for k, e in v.items()}
        if isinstance(v, (list, tuple)):
            return [clean(e) for e in v]
        return v

    calls = []
    for rep in reports:
        d = asdict(rep)
        for row in d["rows"]:
            row.pop("profile", None)  # the data behind --plot: arrays, not a report
        d["verdict"] = rep.verdict
        calls.append(d)
    doc = {"rule": rule, "factor": factor, "summary": summary(reports),
           "exit_status": exit_status(reports), "calls": calls}  # fmt: skip
    return json.dumps(clean(doc), indent=1)
