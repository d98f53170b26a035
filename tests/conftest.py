"""Test session settings.

- The safe execution plan unless a test forces or measures one (each plan field is exercised
  by tests that force it), and a private store of measurements.
- Hypothesis profiles: "ci" (the default: bounded, derandomized, so CI runs the same examples
  every time) and "slow" (many more random examples, for ``python -m pytest -q -m slow``).
  ``HYPOTHESIS_PROFILE=slow`` selects the long one for every Hypothesis test.
"""

from __future__ import annotations

import os
import tempfile

# before lstmgrad is imported; a caller's own setting wins (e.g. LSTMGRAD_TUNE=on)
os.environ.setdefault("LSTMGRAD_TUNE", "off")
os.environ.setdefault("LSTMGRAD_CACHE_DIR", tempfile.mkdtemp(prefix="lstmgrad-tests-"))

try:
    from hypothesis import HealthCheck, settings
except ImportError:  # hypothesis is a dev dependency; without it the sweeps are skipped
    settings = None

if settings is not None:
    _common = dict(
        deadline=None,  # first calls compile or load Numba kernels
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        print_blob=True,
    )
    settings.register_profile("ci", max_examples=300, derandomize=True, database=None, **_common)
    settings.register_profile("slow", max_examples=3000, **_common)
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
