"""The plan cache on disk (:func:`lstmgrad.planning.plan.cache_dir`): what its files may hold,
reading them whatever they hold, writing them whole, and the lock of a store's writers.

Two kinds of file: a store of measurements per machine fingerprint (``wisdom-<key>.json``:
``{"facts": ..., "entries": {class: entry}}``, :class:`lstmgrad.planning.plan.Wisdom`) and the
call seconds earlier processes left unspent (``budget.json``: ``{"calls": seconds}``). Anything
may be found there: a file cut short, another version's, a hand edit, another program's. Every
read goes through :func:`read` and the schema below, and nothing read is used unchecked:

- a file that is not JSON, nests deeper than any store does (:data:`MAX_DEPTH`), is larger
  than :data:`MAX_BYTES` or is not an object of the expected keys, a store written for other
  facts (another format version, machine or library), a budget that is not a finite number of
  seconds within [0, :data:`CARRY_MAX`]: the whole file is ignored;
- in a store of the right structure, an entry whose class is not one the planner makes
  (:func:`entry_problem`) or whose entry does not hold exactly what a measurement of its kind
  holds (plan fields by :func:`checked`'s rules, the rules of ``LSTMGRAD_PLAN``; timings >= 0
  and finite, or infinite for a candidate the tuner dropped; durations and ratios finite) is
  dropped, the other entries kept: a measurement takes seconds, and one bad entry says nothing
  about the others.

Either way the process warns once per file (:class:`CacheWarning`, naming the file and what was
wrong), goes on as without what was ignored (measuring again where the mode allows), and the
next write replaces the file by one that holds only valid entries. Writes go to a temporary
file renamed over the store (a reader sees the old file or the new one, never part of one), and
a store's read-merge-replace runs under an exclusive lock (:func:`locked`), so that processes
storing at once lose none of each other's entries.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ..fused.plan import BIG_METHODS, CONVERSIONS, RECURRENT_METHODS, WALK_PRODUCTS, Plan

FIELDS = {f.name: f.type for f in dataclasses.fields(Plan)}

CHOICES = {"big": BIG_METHODS, "fwd_rec": RECURRENT_METHODS, "bwd_rec": RECURRENT_METHODS,
           "convert": CONVERSIONS, "walk_product": WALK_PRODUCTS}  # fmt: skip


def checked(where: str, name: str, value: Any) -> Any:
    """A forced field's value, converted from text where given as text; ValueError naming the
    field, what it takes and what was given otherwise."""
    if name not in FIELDS:
        raise ValueError(f"{where}: unknown plan field {name!r}, expected one of {sorted(FIELDS)}")
    if name in CHOICES:
        if value not in CHOICES[name]:
            raise ValueError(f"{where}: {name} must be one of {CHOICES[name]}, got {value!r}")
        return value
    if name in ("pair_walks", "walk", "fwd_walk", "library_lstm"):
        if isinstance(value, str):
            if value.lower() not in ("1", "true", "yes", "on", "0", "false", "no", "off"):
                raise ValueError(f"{where}: {name} must be true or false, got {value!r}")
            return value.lower() in ("1", "true", "yes", "on")
        return bool(value)
    least = 1 if name in ("threads", "walk_rows") else 0
    try:
        number = int(value)
    except (TypeError, ValueError, OverflowError):  # OverflowError: an infinite float
        number = None
    if number is None or number < least or isinstance(value, (bool, float)):
        raise ValueError(f"{where}: {name} must be an integer >= {least}, got {value!r}")
    return number


class CacheWarning(UserWarning):
    """A file of the plan cache was ignored, whole or in part: what it held is measured again
    where the mode allows, and the file is rewritten at the next store."""


MAX_BYTES = 1 << 24
"""The largest file read (16 MiB; a store of hundreds of classes takes well under one)."""

MAX_DEPTH = 8
"""The deepest nesting of objects and lists read (a store's is 7: store, entries, entry,
recurrent, direction, method, preparation times)."""

CARRY_MAX = 3600.0
"""The most call seconds carried from one process to the next (``budget.json``): an hour of
calls, six minutes of measuring at :data:`lstmgrad.planning.plan.MEASURE_SHARE`; more is never
written, and read it is ignored (it would lift the measuring share of the processes after)."""

TOOK_MAX = 3600.0
"""The longest a stored measurement may say it took (seconds; one takes a few): a longer one
would hold off measuring under LSTMGRAD_TUNE=on for good (the budget waits for its expected
cost)."""

INT_MAX = (1 << 62) - 1
"""The largest integer a stored entry may hold (the engine's kernels take them as int64)."""

_warned: set[str] = set()  # files this process warned about: one warning per file
_warned_lock = threading.Lock()


def _warn(path: Path, problem: str, after: str) -> None:
    with _warned_lock:
        if str(path) in _warned:
            return
        _warned.add(str(path))
    warnings.warn(f"lstmgrad plan cache: {path}: {problem}; {after}", CacheWarning, stacklevel=2)


def _too_deep(data: Any) -> bool:
    """Whether objects and lists nest deeper than :data:`MAX_DEPTH` (walked without
    recursion)."""
    stack = [(data, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, (dict, list)):
            if depth > MAX_DEPTH:
                return True
            stack.extend(
                (child, depth + 1) for child in (node.values() if isinstance(node, dict) else node)
            )
    return False


def read(path: Path, check: Callable[[Any], tuple[Any, str | None]], after: str) -> Any:
    """What ``check`` keeps of the file's JSON (None where there is no file or nothing is
    kept). ``check`` returns (what is kept, what was wrong or None); a file that cannot be
    parsed, is too large or too deep is ignored whole. Whatever was wrong is said once per
    process and file (:class:`CacheWarning`: the file, the problem, then ``after``, what
    follows). A file that cannot be read (none yet, no permission) is no problem: as absent."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_BYTES + 1)
    except OSError:
        return None
    if len(raw) > MAX_BYTES:
        _warn(path, f"ignored: larger than {MAX_BYTES} bytes", after)
        return None
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # RecursionError: brackets nested thousands deep
        _warn(path, f"ignored: not JSON ({type(exc).__name__}: {str(exc)[:80]})", after)
        return None
    if _too_deep(data):
        _warn(path, f"ignored: nested deeper than {MAX_DEPTH} levels", after)
        return None
    kept, problem = check(data)
    if problem is not None:
        _warn(path, problem, after)
    return kept


def _short(value: Any) -> str:
    text = (
        json.dumps(value) if not isinstance(value, float) or math.isfinite(value) else repr(value)
    )
    return text if len(text) <= 40 else text[:37] + "..."


# --------------------------------------------------------------------------------------------
# the schema: each check returns what is wrong with a value, or None


Check = Callable[[Any], "str | None"]


def _number(least: float, most: float, infinite: bool = False) -> Check:
    """A JSON number (not a boolean) within [least, most]; also +inf where ``infinite``."""

    def check(value: Any) -> str | None:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"must be a number, got {_short(value)}"
        if infinite and value == math.inf:
            return None
        if not least <= value <= most:  # NaN fails too
            return f"must be within [{least:g}, {most:g}], got {_short(value)}"
        return None

    return check


def _integer(least: int, most: int = INT_MAX) -> Check:
    def check(value: Any) -> str | None:
        if isinstance(value, bool) or not isinstance(value, int):
            return f"must be an integer, got {_short(value)}"
        if not least <= value <= most:
            return f"must be within [{least}, {most}], got {_short(value)}"
        return None

    return check


def _text(choices: tuple[str, ...] | None = None) -> Check:
    def check(value: Any) -> str | None:
        if not isinstance(value, str) or (choices is not None and value not in choices):
            return f"must be {'one of ' + str(choices) if choices else 'text'}, got {_short(value)}"
        return None

    return check


def _table(key: Check, value: Check, least: int = 0, needs: tuple[str, ...] = ()) -> Check:
    """An object of at least ``least`` items (``needs`` among its keys) whose keys and values
    pass ``key`` and ``value``."""

    def check(table: Any) -> str | None:
        if not isinstance(table, dict):
            return f"must be an object, got {_short(table)}"
        if len(table) < least:
            return f"must have at least {least} item(s), got {_short(table)}"
        for name in needs:
            if name not in table:
                return f"must have {name!r}, got keys {sorted(table)}"
        for k, v in table.items():
            problem = key(k)
            if problem is not None:
                return f"key {problem}"
            problem = value(v)
            if problem is not None:
                return f"{k!r} {problem}"
        return None

    return check


def _record(required: dict[str, Check], optional: dict[str, Check]) -> Check:
    """An object with each key of ``required``, others only of ``optional``, each value passing
    its check."""

    def check(record: Any) -> str | None:
        if not isinstance(record, dict):
            return f"must be an object, got {_short(record)}"
        missing = [k for k in required if k not in record]
        if missing:
            return f"lacks {missing}"
        unknown = [k for k in record if k not in required and k not in optional]
        if unknown:
            return f"has unknown keys {unknown}"
        for k, v in record.items():
            problem = (required.get(k) or optional[k])(v)
            if problem is not None:
                return f"{k} {problem}"
        return None

    return check


def _pair(item: Check) -> Check:
    def check(value: Any) -> str | None:
        if not isinstance(value, list) or len(value) != 2:
            return f"must be a list of two, got {_short(value)}"
        return item(value[0]) or item(value[1])

    return check


def _list(item: Check, most: int) -> Check:
    def check(value: Any) -> str | None:
        if not isinstance(value, list) or len(value) > most:
            return f"must be a list of at most {most} items, got {_short(value)}"
        for v in value:
            problem = item(v)
            if problem is not None:
                return problem
        return None

    return check


def _plan(fields: tuple[str, ...], needs: tuple[str, ...] = ()) -> Check:
    """Plan fields among ``fields`` (``needs`` among them), each value one :func:`checked`
    takes, of its field's type as given (true, not "true" or 1) and at most :data:`INT_MAX`."""

    def check(plan: Any) -> str | None:
        if not isinstance(plan, dict):
            return f"must be an object, got {_short(plan)}"
        for name in needs:
            if name not in plan:
                return f"lacks the plan field {name!r}"
        for name, value in plan.items():
            try:
                got = checked("plan", name, value)
            except ValueError as exc:
                return str(exc)
            if type(got) is not type(value) or got != value:
                return f"plan: {name} must be a {type(got).__name__}, got {_short(value)}"
            if isinstance(got, int) and got > INT_MAX:
                return f"plan: {name} must be at most {INT_MAX}, got {_short(value)}"
            if name not in fields:
                return f"plan: {name} is not a field this kind of measurement sets"
        return None

    return check


_FINITE = sys.float_info.max
_SECONDS = _number(0.0, _FINITE, infinite=True)  # a timing: inf, a candidate dropped
_TOOK = _number(0.0, TOOK_MAX)
_RATIO = _number(0.0, _FINITE)
_THREADS_KEY = _integer(1, 1 << 20)


def _threads_key(key: Any) -> str | None:
    """A thread count as text ("1", "2", ...), as the tuner keys preparation times."""
    if not isinstance(key, str) or not (key.isascii() and key.isdigit()) or key != str(int(key)):
        return f"must be a thread count as text, got {_short(key)}"
    return _THREADS_KEY(int(key))


_STEP_FIELDS = ("threads", "split_min", "pair_walks", "walk", "walk_product", "walk_rows",
                "fwd_walk")  # fmt: skip
_RECURRENT = _table(
    _text(RECURRENT_METHODS),
    _record({"prep": _table(_threads_key, _SECONDS, needs=("1",)), "call": _SECONDS}, {}),
    least=1,
)

_BIG = _record(
    {"plan": _plan(("big", "transpose_threads", "convert"))},
    {"seconds": _table(_text(), _SECONDS), "measured_at": _text(), "took": _TOOK},
)
_STEPS = _record(
    {"plan": _plan(_STEP_FIELDS)},
    {
        "recurrent": _record({"fwd": _RECURRENT, "bwd": _RECURRENT}, {}),
        "arrangement": _record(
            {
                "candidates": _table(
                    _text(),
                    _plan(
                        (*_STEP_FIELDS, "fwd_rec", "bwd_rec"),
                        needs=("threads", "fwd_rec", "bwd_rec"),
                    ),
                    needs=("one",),
                ),
                "phases": _table(_text(), _pair(_SECONDS)),
                "steps": _integer(0),
                "D": _integer(1, 2),
            },
            {},
        ),
        "walk_products": _table(_text(WALK_PRODUCTS), _SECONDS),
        "passes": _table(_text(), _SECONDS),
        "measured_at": _text(),
        "took": _TOOK,
    },
)
_GATE = _record(
    {"ratio": _RATIO},
    {
        "steps": _integer(1),
        "default": _SECONDS,
        "measured": _SECONDS,
        "took": _TOOK,
        "lost_in_use": _list(_RATIO, 64),
    },
)


def _steps(entry: Any) -> str | None:
    """:data:`_STEPS`, and what an arrangement names is there: its phases are candidates', the
    candidates' recurrent methods were measured (:func:`lstmgrad.planning.tune.step_fields`
    looks them up)."""
    problem = _STEPS(entry)
    if problem is not None or "arrangement" not in entry:
        return problem
    if "recurrent" not in entry:
        return "has an arrangement but no recurrent times"
    candidates, rec = entry["arrangement"]["candidates"], entry["recurrent"]
    for name in entry["arrangement"]["phases"]:
        if name not in candidates:
            return f"arrangement: phases of {name!r}, not a candidate"
    for name, fields in candidates.items():
        for direction in ("fwd", "bwd"):
            method = fields[f"{direction}_rec"]
            if method not in rec[direction]:
                return (
                    f"arrangement: candidate {name!r} has {direction}_rec {method!r}, not measured"
                )
    return None


_WALK_TIMES = _table(_text(WALK_PRODUCTS), _SECONDS, least=1)
_PROBE = _record(
    {
        "recurrent": _record({"fwd": _RECURRENT, "bwd": _RECURRENT}, {}),
        "walk": _WALK_TIMES,
        "walk_prep": _table(_text(WALK_PRODUCTS), _SECONDS),
        "gate": _SECONDS,
        "measured_at": _text(),
    },
    {
        "gate_split": _SECONDS,
        "split_parts": _integer(2, 1 << 20),
        "rows": _WALK_TIMES,
        "rows_parts": _integer(2, 1 << 20),
        "pairs": _WALK_TIMES,
        "big": _table(_text(BIG_METHODS), _SECONDS, least=1),
        "probed_in": _TOOK,
    },
)


def _probe(entry: Any) -> str | None:
    """:data:`_PROBE`, with the thread counts of what ran side by side
    (:func:`lstmgrad.planning.model.arrangements` reads them)."""
    problem = _PROBE(entry)
    if problem is None:
        for times, parts in (("rows", "rows_parts"), ("gate_split", "split_parts")):
            if (times in entry) != (parts in entry):
                return f"{times} and {parts} go together"
    return problem


_ENTRIES: dict[str, Check] = {"big": _BIG, "steps": _steps, "gate": _GATE, "probe": _probe}
_CLASSES = {
    "big": ("what", "kind", "dtype", "N", "I", "H"),
    "steps": ("what", "kind", "dtype", "B", "H", "D"),
    "gate": ("what", "kind", "dtype", "B", "H", "D", "I", "T"),
    "probe": ("what", "kind", "dtype", "B", "H", "D", "I", "N"),
}  # the classes of lstmgrad.planning.plan: big_class, step_class, gate_class, probe_class
_CLASS_VALUES: dict[str, Check] = {"what": _text(), "kind": _text(),
                                   "dtype": _text(("float32", "float64")), "D": _integer(1, 2)}  # fmt: skip


def entry_problem(key: Any, entry: Any) -> str | None:
    """What is wrong with one stored entry (None: nothing): its key must be a class the planner
    makes (:func:`lstmgrad.planning.plan.big_class`, ``step_class``, ``gate_class``,
    ``probe_class``) as it writes it, its entry hold exactly what a measurement of that kind
    holds (:func:`lstmgrad.planning.tune.measure_big`, ``measure_steps``, ``gate``, ``probe``;
    "took", and an in-use check's "lost_in_use")."""
    try:
        cls = json.loads(key)
    except (TypeError, ValueError, RecursionError):
        return "its class is not JSON"
    what = cls.get("what") if isinstance(cls, dict) else None
    if what not in _CLASSES:
        return "its class is not one of big, steps, gate or probe"
    if sorted(cls) != sorted(_CLASSES[what]):
        return f"its class must have the keys {sorted(_CLASSES[what])}, got {sorted(cls)}"
    for name, value in cls.items():
        problem = _CLASS_VALUES.get(name, _integer(1))(value)
        if problem is not None:
            return f"its class's {name} {problem}"
    if json.dumps(cls, sort_keys=True) != key:
        return "its class is not written as the planner writes it"
    problem = _ENTRIES[what](entry)
    return None if problem is None else f"its entry: {problem}"


def store_entries(data: Any, facts: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """The valid entries of a store's content for these ``facts``, and what was wrong (None:
    nothing): the whole store where it is not an object of "facts" and "entries" or its facts
    are others; else each entry that fails :func:`entry_problem` (the others kept)."""
    if not isinstance(data, dict) or sorted(data) != ["entries", "facts"]:
        keys = sorted(data) if isinstance(data, dict) else _short(data)
        return {}, f"ignored: not an object of facts and entries, got {keys}"
    if data["facts"] != facts:
        return {}, "ignored: written for other facts (another format version, machine or library)"
    entries = data["entries"]
    if not isinstance(entries, dict):
        return {}, f"ignored: entries must be an object, got {_short(entries)}"
    kept, dropped = {}, []
    for key, entry in entries.items():
        problem = entry_problem(key, entry)
        if problem is None:
            kept[key] = entry
        else:
            dropped.append(f"{_short(key)}: {problem}")
    if dropped:
        return kept, f"ignored {len(dropped)} of {len(entries)} entries (first: {dropped[0]})"
    return kept, None


def budget_calls(data: Any) -> tuple[float | None, str | None]:
    """The call seconds of a budget's content, and what was wrong (None: nothing):
    ``{"calls": seconds}``, finite, within [0, :data:`CARRY_MAX`]."""
    problem = _record({"calls": _number(0.0, CARRY_MAX)}, {})(data)
    if problem is not None:
        return None, f"ignored: the budget {problem}"
    return float(data["calls"]), None


# --------------------------------------------------------------------------------------------
# writing


LOCK_WAIT = 10.0
"""Seconds a writer waits for another process's lock on a store (held for the milliseconds of
a read-merge-replace) before it writes without it."""


@contextlib.contextmanager
def locked(path: Path) -> Iterator[bool]:
    """An exclusive lock between processes (``fcntl.flock`` on ``path``, created where
    missing) for the block; yields whether it is held. Where there is none to take (no fcntl,
    a directory that cannot hold the lock file, a file system without locks) or another
    process held it for :data:`LOCK_WAIT` seconds, the block runs without it: as a last writer,
    it may then lose entries stored at the same moment, never a call."""
    try:
        import fcntl
    except ImportError:
        fcntl = None  # type: ignore[assignment]
    fd = None
    if fcntl is not None:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError:
            fd = None
    held = False
    try:
        if fd is not None:
            deadline = time.monotonic() + LOCK_WAIT
            while not held:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    held = True
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        break
                    time.sleep(0.002)
                except OSError:  # no locks on this file system
                    break
        yield held
    finally:
        if fd is not None:
            os.close(fd)  # releases the lock


def write(path: Path, data: Any) -> None:
    """``data`` as JSON into ``path`` whole: written to a temporary file beside it, then
    renamed over it (OSError where the directory takes neither)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
