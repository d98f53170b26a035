"""benchmarks/studies.py's machine ceiling: its child runs, and the ratio it reports."""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import studies  # noqa: E402

pytest.importorskip("torch")


def test_gemm_child_reports_a_rate_on_its_cpu():
    cpu = min(os.sched_getaffinity(0))
    (rate,) = studies._gemm_rates([cpu], 5, delay=0.0)
    assert math.isfinite(rate) and rate > 0


def test_ceiling_is_the_median_of_summed_over_alone(monkeypatch):
    # scripted rates: the calibration call, then per round one alone and two at once
    script = iter([[10.0], [10.0], [9.0, 8.0], [12.0], [6.0, 6.0], [8.0], [8.0, 8.0]])
    monkeypatch.setattr(studies, "_gemm_rates", lambda cpus, reps, delay=5.0: next(script))
    top = studies.ceiling([0, 1], rounds=3)
    assert top["ratios"] == [1.7, 1.0, 2.0]
    assert top["ratio"] == 1.7
    assert top["alone_gflops"] == 10.0 and top["together_gflops"] == 16.0
