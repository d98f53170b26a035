"""The LSTMGRAD_* environment variables that select a mode, read and checked in one place.

Each is read where it takes effect, at a call (never at import: ``import lstmgrad`` works
whatever the environment holds), and a value outside its choices raises ValueError naming the
variable, the value and the choices, as ``LSTMGRAD_PLAN`` does with a bad field. A typo read as
the default instead would change what runs without a word: ``LSTMGRAD_TUNE=offf`` taken as
``on`` measures plans in a process that asked for none. Case and surrounding blanks do not
matter; an empty value is the default.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

TUNE = "LSTMGRAD_TUNE"
BLAS = "LSTMGRAD_BLAS"
PRIVATE_OPS = "LSTMGRAD_PRIVATE_OPS"

TUNE_VALUES = {"on": "on", "eager": "eager", "cached": "cached", "off": "off",
               "1": "on", "true": "on", "yes": "on", "cache": "cached",
               "0": "off", "false": "off", "no": "off", "safe": "off"}  # fmt: skip
"""LSTMGRAD_TUNE: each accepted spelling and the mode it names."""

BLAS_VALUES = {"numpy": "numpy", "torch": "torch"}
"""LSTMGRAD_BLAS: the GEMM library of calls with NumPy arrays."""

SWITCH_VALUES = {"1": "on", "on": "on", "true": "on", "yes": "on",
                 "0": "off", "off": "off", "false": "off", "no": "off"}  # fmt: skip
"""A switch such as LSTMGRAD_PRIVATE_OPS."""


def _choices(values: Mapping[str, str]) -> str:
    """ "'a', 'b' or 'c'" for the values named, then the other spellings of each."""
    names = list(dict.fromkeys(values.values()))
    quoted = [repr(n) for n in names]
    text = quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"
    others = [
        f"{', '.join(k for k, v in values.items() if v == n and k != n)} for {n}"
        for n in names
        if any(v == n and k != n for k, v in values.items())
    ]
    return f"{text} ({'; '.join(others)})" if others else text


def choice(name: str, default: str, values: Mapping[str, str]) -> str:
    """What the variable ``name`` selects: ``values[spelling]`` for its value (lower-cased,
    stripped), ``default`` where it is unset or empty. ValueError naming the variable, its value
    and the choices otherwise."""
    raw = os.environ.get(name, "")
    text = raw.strip().lower()
    if not text:
        return default
    selected = values.get(text)
    if selected is None:
        raise ValueError(f"{name}: expected {_choices(values)}, got {raw!r}")
    return selected


def check() -> None:
    """Read every variable of this module: ValueError for the first one set to a value outside
    its choices (a command checks them before it starts its work)."""
    choice(TUNE, "on", TUNE_VALUES)
    choice(BLAS, "numpy", BLAS_VALUES)
    choice(PRIVATE_OPS, "on", SWITCH_VALUES)
