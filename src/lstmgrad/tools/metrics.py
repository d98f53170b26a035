"""How far a device's tensor is from the float64 reference, in msProbe's terms and in ours
(docs/check.md#what-the-columns-mean).

Three families, each a pure function of NumPy arrays:

- msProbe compare's columns: Cosine, EucDist, MaxAbsErr, MaxRelativeErr and the One / Five
  Thousandths Err Ratios (:func:`compare_columns`);
- msProbe acc_check's "benchmark" standard: the device's small-value error ratio, RMSE, max and
  mean relative error and error balance against a reference platform's, both measured against
  a higher-precision run (:func:`benchmark_metrics`, :func:`benchmark_verdict`);
- lstmgrad's accumulation-length bound c * eps * sqrt(K) * (|ref| + rms(ref)) (:func:`bound`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

PASS, WARNING, ERROR = "pass", "warning", "error"
INFO = "info"  # the msprobe rule's status where the benchmark ratios do not decide
_RANK = {PASS: 0, WARNING: 1, ERROR: 2}

# acc_check's benchmark standard, with the values msProbe documents per dtype (float64, which
# the standard does not cover, takes float32's): small values are |bench| <= SMALL_VALUE[dtype],
# and among them an absolute error above SMALL_VALUE_ATOL[dtype] is a small-value error
SMALL_VALUE = {"float16": 2.0**-11, "bfloat16": 2.0**-8, "float32": 2.0**-14, "float64": 2.0**-14}
SMALL_VALUE_ATOL = {"float16": 2.0**-16, "bfloat16": 2.0**-16, "float32": 2.0**-30,
                    "float64": 2.0**-30}  # fmt: skip
# the relative error's denominator |bench| + REL_EPS[dtype]: the epsilon of the higher-precision
# run's dtype (float32 for float16, float64 for float32), bfloat16's own for bfloat16
REL_EPS = {"float16": 2.0**-23, "bfloat16": 2.0**-8, "float32": 2.0**-52, "float64": 2.0**-52}
# a ratio divides by the reference platform's metric, but by no less than RATIO_FLOOR[dtype]: a
# platform that is nearly exact on a metric (a few elements, each rounded once) does not make
# the device's ordinary rounding look like a fault
RATIO_FLOOR = {"float16": 2.0**-11, "bfloat16": 2.0**-8, "float32": 2.0**-14, "float64": 2.0**-14}
# (error, warning) thresholds on the ratio device metric / reference platform's metric
BENCHMARK_THRESHOLDS = {
    "small_value_err_ratio": (2.0, 1.0), "rmse": (2.0, 1.0), "max_rel_err": (10.0, 1.0),
    "mean_rel_err": (2.0, 1.0),
}  # fmt: skip
# dtypes whose ratios decide: lstmgrad's fused engine computes them in the dtype itself, a
# platform like the device. float16 and bfloat16 it computes in float32 and rounds the results
# once, where a device rounds inside the call too: their ratios are information only
# (docs/check.md#when-the-benchmark-ratios-decide)
BENCHMARK_DECISIVE = ("float32", "float64")
COSINE_MIN = 0.99  # msProbe: cosine <= 0.99 is an error
EPS = {"float16": 2.0**-10, "bfloat16": 2.0**-7, "float32": 2.0**-23, "float64": 2.0**-52}
BOUND_FACTOR = 4.0  # c of the bound; docs/check.md#the-accumulation-length-bound


def worst(*statuses: str) -> str:
    """The most severe of pass / warning / error."""
    return max(statuses, key=_RANK.__getitem__, default=PASS)


def finite_mismatch(actual: np.ndarray, ref: np.ndarray) -> int:
    """How many elements are NaN or infinite in one of the two but not identically in both."""
    a, r = actual.astype(np.float64), ref.astype(np.float64)
    same = (np.isnan(a) & np.isnan(r)) | (np.isinf(a) & (a == r))
    bad = ~(np.isfinite(a) & np.isfinite(r)) & ~same
    return int(np.count_nonzero(bad))


def _rel_err(err: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """|N - B| / |B|, with the smallest positive float64 only where B is 0 (msProbe compare)."""
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        return err / np.where(ref == 0, np.finfo(np.float64).tiny, np.abs(ref))


@dataclass
class Columns:
    """msProbe compare's columns for one tensor (cosine None for a single element)."""

    cosine: float | None
    euc_dist: float
    max_abs_err: float
    max_rel_err: float
    one_thousandth: float  # share of elements with relative error < 0.001
    five_thousandths: float  # share with relative error < 0.005


def compare_columns(actual: np.ndarray, ref: np.ndarray) -> Columns:
    """msProbe compare's columns of ``actual`` against ``ref`` (both cast to float64)."""
    a, r = actual.astype(np.float64).ravel(), ref.astype(np.float64).ravel()
    err = np.abs(a - r)
    err = np.where(np.isnan(err), np.inf, err)  # a NaN is as far off as it gets
    rel = _rel_err(err, r)
    rel = np.where(np.isnan(rel), np.inf, rel)
    n = max(a.size, 1)
    return Columns(
        cosine=cosine(a, r),
        euc_dist=float(np.sqrt(np.sum(np.square(err)))) if a.size else 0.0,
        max_abs_err=float(err.max(initial=0.0)),
        max_rel_err=float(rel.max(initial=0.0)),
        one_thousandth=float(np.count_nonzero(rel < 0.001)) / n if a.size else 1.0,
        five_thousandths=float(np.count_nonzero(rel < 0.005)) / n if a.size else 1.0,
    )


def cosine(a: np.ndarray, r: np.ndarray) -> float | None:
    """Cosine similarity; 1 when both are all zero, 0 when one is; None for one element (msProbe
    leaves it out there) or none."""
    if a.size <= 1:
        return None
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(r))):
        return float("nan")
    na, nr = float(np.linalg.norm(a)), float(np.linalg.norm(r))
    if na == 0.0 or nr == 0.0:
        return 1.0 if na == nr else 0.0
    # scaled first, as msProbe does, so that huge values do not overflow the dot product
    sa, sr = a / np.abs(a).max(), r / np.abs(r).max()
    c = float(np.dot(sa, sr) / (np.linalg.norm(sa) * np.linalg.norm(sr)))
    return min(max(c, -1.0), 1.0)


@dataclass
class Benchmark:
    """acc_check's benchmark-standard metrics of one tensor against the higher-precision run."""

    small_value_err_ratio: float
    rmse: float
    max_rel_err: float
    mean_rel_err: float
    eb: float  # error balance: |#(above) - #(below)| / n; reported, not decisive


def benchmark_metrics(actual: np.ndarray, ref: np.ndarray, dtype: str) -> Benchmark:
    """The benchmark standard's metrics of ``actual`` (a tensor of ``dtype``) against ``ref``.

    Small values (|ref| <= SMALL_VALUE[dtype]) are judged by the share whose absolute error
    exceeds SMALL_VALUE_ATOL[dtype]; RMSE, max and mean relative error |N - B| / (|B| +
    REL_EPS[dtype]) are taken over the other elements where both are finite.
    """
    a, r = actual.astype(np.float64).ravel(), ref.astype(np.float64).ravel()
    finite = np.isfinite(a) & np.isfinite(r)
    err = np.abs(a - r)
    small = finite & (np.abs(r) <= SMALL_VALUE[dtype])
    n_small = int(np.count_nonzero(small))
    small_bad = int(np.count_nonzero(small & (err > SMALL_VALUE_ATOL[dtype])))
    big = finite & ~small
    e, b = err[big], np.abs(r[big])
    rel = e / (b + REL_EPS[dtype])
    n = max(a.size, 1)
    return Benchmark(
        small_value_err_ratio=small_bad / n_small if n_small else 0.0,
        rmse=float(np.sqrt(np.mean(np.square(e)))) if e.size else 0.0,
        max_rel_err=float(rel.max(initial=0.0)),
        mean_rel_err=float(rel.mean()) if rel.size else 0.0,
        eb=abs(int(np.count_nonzero(a[finite] > r[finite])) -
               int(np.count_nonzero(a[finite] < r[finite]))) / n,
    )  # fmt: skip


def expected_small_share(ref: np.ndarray, dtype: str, accumulation: int) -> float:
    """The share of small values (|ref| <= SMALL_VALUE[dtype]) that a correct platform cannot
    be expected to get within SMALL_VALUE_ATOL[dtype]: those whose rounding error scale, the
    bound with c = 1 (eps * sqrt(K) * (|ref| + rms(ref))), exceeds it. A small value that is
    the difference of larger terms is off by about that much in any summation order."""
    r = ref.astype(np.float64).ravel()
    small = np.isfinite(r) & (np.abs(r) <= SMALL_VALUE[dtype])
    n_small = int(np.count_nonzero(small))
    if not n_small:
        return 0.0
    scale = bound(r, dtype, accumulation, 1.0)
    return int(np.count_nonzero(small & (scale > SMALL_VALUE_ATOL[dtype]))) / n_small


def at_least(a: Benchmark, b: Benchmark) -> Benchmark:
    """Each metric the larger of the two (EB: a's)."""
    return Benchmark(
        max(a.small_value_err_ratio, b.small_value_err_ratio), max(a.rmse, b.rmse),
        max(a.max_rel_err, b.max_rel_err), max(a.mean_rel_err, b.mean_rel_err), a.eb,
    )  # fmt: skip


def ratio(device: float, bench: float, dtype: str) -> float:
    """device / bench as msProbe takes it: |device| / max(|bench|, RATIO_FLOOR[dtype])."""
    return abs(device) / max(abs(bench), RATIO_FLOOR[dtype])


def benchmark_verdict(
    device: Benchmark, bench: Benchmark, dtype: str
) -> tuple[str, dict[str, float]]:
    """The benchmark standard's verdict: error when a ratio exceeds its error threshold (small
    values 2, RMSE 2, max relative error 10, mean relative error 2), warning above 1.

    Returns:
        (status, ratios by metric name, EB's included but never decisive).
    """
    ratios = {k: ratio(getattr(device, k), getattr(bench, k), dtype)
              for k in BENCHMARK_THRESHOLDS}  # fmt: skip
    status = PASS
    for k, (err_at, warn_at) in BENCHMARK_THRESHOLDS.items():
        status = worst(status, ERROR if ratios[k] > err_at else WARNING if ratios[k] > warn_at
                       else PASS)  # fmt: skip
    ratios["eb"] = ratio(device.eb, bench.eb, dtype)
    return status, ratios


def bound(ref: np.ndarray, dtype: str, accumulation: int, factor: float) -> np.ndarray:
    """Per-element tolerance c * eps(dtype) * sqrt(K) * (|ref| + rms(ref))."""
    rms = float(np.sqrt(np.mean(np.square(ref)))) if ref.size else 0.0
    return factor * EPS[dtype] * math.sqrt(max(accumulation, 1)) * (np.abs(ref) + rms)


def stat_tolerance(
    stat: str, ref_value: float, rms: float, dtype: str, accumulation: int, factor: float
) -> float:
    """How far a recorded statistic may be from the reference's: the bound of one element for
    Max, Min and Mean (a mean is no further off than its elements), twice the relative bound
    of the norm for Norm."""
    scale = factor * EPS[dtype] * math.sqrt(max(accumulation, 1))
    if stat == "Norm":
        return 2 * scale * abs(ref_value)
    return scale * (abs(ref_value) + rms)
