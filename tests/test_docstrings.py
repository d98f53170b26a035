"""The runnable examples in the public docstrings give the outputs they show."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = ["lstmgrad.ops.api", "lstmgrad.torch_ops", "lstmgrad.nn"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    if name != "lstmgrad.ops.api":
        pytest.importorskip("torch")
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
