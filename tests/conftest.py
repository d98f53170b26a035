"""Test session settings: the safe execution plan unless a test forces or measures one (each
plan field is exercised by tests/test_plan.py), and a private store of measurements."""

from __future__ import annotations

import os
import tempfile

# before lstmgrad is imported; a caller's own setting wins (e.g. LSTMGRAD_TUNE=on)
os.environ.setdefault("LSTMGRAD_TUNE", "off")
os.environ.setdefault("LSTMGRAD_CACHE_DIR", tempfile.mkdtemp(prefix="lstmgrad-tests-"))
