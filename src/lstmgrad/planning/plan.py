"""Execution plans: which GEMM method, layout and thread count the fused engine uses for a call.

The one place for the engine's policy. :func:`plan_for` turns (dims, dtype, GEMM back end) into
a :class:`Plan` from measurements taken on the machine in use (:mod:`lstmgrad.planning.tune`), made
lazily the first time a class of shapes is seen and kept on disk per machine and library
versions (like FFTW's wisdom), so later processes start with them. The engine executes plans
and holds no thresholds; the back ends (:mod:`lstmgrad.fused.gemm`) only multiply.

Environment:

- ``LSTMGRAD_TUNE``: ``on`` (default) measures unseen shape classes within a budget (at most
  :data:`MEASURE_SHARE` of the time the process spends in its calls; :func:`default_plan`
  serves an unmeasured class meanwhile); ``eager`` measures a class the first time it is seen;
  ``cached`` uses stored measurements only (:func:`default_plan` for unseen classes); ``off``
  always runs the safe plan (:data:`SAFE`).
- ``LSTMGRAD_PLAN``: fields forced over every plan, e.g. ``threads=1,fwd_rec=blas``.
- ``LSTMGRAD_CACHE_DIR``: where measurements are stored (default ``~/.cache/lstmgrad``); what
  is read there is checked first, and what is not valid is ignored with a warning
  (:mod:`lstmgrad.planning.store`).
- ``LSTMGRAD_PRIVATE_OPS=0``: torch's public GEMM (torch.mm) only (:mod:`lstmgrad.ops.tensors`).

``lstmgrad tune`` measures ahead of time, ``lstmgrad tune --show`` prints what is stored.
"""

from __future__ import annotations

import atexit
import contextlib
import contextvars
import dataclasses
import functools
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ..core.layout import Dims
from ..core.machine import cpu_clock, fingerprint, fingerprint_key, others_cpus
from ..fused.plan import (  # noqa: F401  (lstmgrad.fused.plan.Plan, .SAFE: public names)
    BIG_METHODS,
    CONVERSIONS,
    RECURRENT_METHODS,
    SAFE,
    WALK_PRODUCTS,
    Plan,
    compute_dtype,
)
from . import model, tune
from . import store as disk
from .feasible import feasible
from .store import CacheWarning, checked  # noqa: F401  (CacheWarning: a public name)

_forced: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "lstmgrad_forced_plan", default=None
)


def _parse_overrides(text: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"LSTMGRAD_PLAN: expected comma-separated field=value, got {item!r}")
        out[name.strip()] = checked("LSTMGRAD_PLAN", name.strip(), value.strip())
    return out


def overrides() -> dict[str, Any]:
    """Fields forced over every plan: LSTMGRAD_PLAN, then :func:`forced` (innermost last)."""
    return {**_parse_overrides(os.environ.get("LSTMGRAD_PLAN", "")), **(_forced.get() or {})}


@contextlib.contextmanager
def forced(**fields: Any) -> Iterator[None]:
    """Force plan fields within a block (this thread / context), e.g. ``forced(threads=1)``;
    a field the back end cannot run falls back as in :func:`plan_for`."""
    given = {name: checked("forced", name, value) for name, value in fields.items()}
    token = _forced.set({**(_forced.get() or {}), **given})
    try:
        yield
    finally:
        _forced.reset(token)


def mode() -> str:
    """LSTMGRAD_TUNE: "on" (default), "eager", "cached" or "off" (:func:`eager` makes "on"
    eager for a block). ValueError naming the variable, its value and the choices for any
    other value (:func:`_tune_setting`)."""
    setting = _tune_setting()
    return "eager" if setting == "on" and _eager.get() else setting


def _tune_setting() -> str:
    """LSTMGRAD_TUNE's mode as set, checked by :func:`lstmgrad.core.env.choice`."""
    from ..core.env import TUNE, TUNE_VALUES, choice

    return choice(TUNE, "on", TUNE_VALUES)


_eager: contextvars.ContextVar[bool] = contextvars.ContextVar("lstmgrad_eager", default=False)


@contextlib.contextmanager
def eager() -> Iterator[None]:
    """Measure unseen classes at once in this block, whatever the budget (``lstmgrad tune``, a
    benchmark's warm-up); LSTMGRAD_TUNE=off or cached still win."""
    token = _eager.set(True)
    try:
        yield
    finally:
        _eager.reset(token)


MEASURE_SHARE = 0.1
"""The share of the time a process spends in lstmgrad's calls that measuring may take under
LSTMGRAD_TUNE=on: a short program runs on the default plan and measures little or nothing (later
processes go on where it stopped), a long one measures its classes early in its run."""

MEASURE_GUESS = 2.0
"""Seconds one class's measurement is expected to take until this machine has measured one
(then the mean of its stored measurements' durations, then this process's): 1.5-6 s on 2
cores."""


BUSY_RETRY = 30.0
"""Seconds without measuring after the machine was found busy (checking the load is cheap, but
a plan made again on every call is not)."""


class _Budget:
    """Seconds spent in calls and in measuring by this process (floats added under the GIL)."""

    def __init__(self) -> None:
        self.calls = 0.0
        self.measured = 0.0
        self.runs: list[float] = []
        self.busy = 0  # measurements skipped or dropped: other processes held the CPUs
        self.retry_at = 0.0  # time.monotonic() before which nothing is measured
        self._stored: float | None = None  # the stored measurements' mean duration, read once
        self._carried: float | None = None  # call seconds earlier processes left unspent

    def carried(self) -> float:
        """Call seconds earlier processes left unspent (read once): repeated short runs add
        up to a measurement."""
        if self._carried is None:
            calls = disk.read(_carry_path(), disk.budget_calls,
                               "the budget starts afresh and is rewritten at exit")  # fmt: skip
            self._carried = calls if calls is not None else 0.0
            self.calls += self._carried
        return self._carried

    def expected(self, kind: str) -> float:
        if self.runs:
            return sum(self.runs) / len(self.runs)
        if self._stored is None:
            done = [
                e["took"] for e in wisdom(kind).entries.values() if isinstance(e.get("took"), float)
            ]
            self._stored = sum(done) / len(done) if done else MEASURE_GUESS
        return self._stored

    def wait(self) -> None:
        """Other processes hold the CPUs: no measuring for :data:`BUSY_RETRY` seconds."""
        self.busy += 1
        self.retry_at = time.monotonic() + BUSY_RETRY

    def allows(self, kind: str) -> bool:
        """Measuring one more class keeps within :data:`MEASURE_SHARE` of the calls' time, and
        the machine was not found busy in the last :data:`BUSY_RETRY` seconds."""
        if time.monotonic() < self.retry_at:
            return False
        self.carried()
        spare = MEASURE_SHARE * self.calls - self.measured
        return spare > 0 and spare >= self.expected(kind)


budget = _Budget()


def _carry_path() -> Path:
    return cache_dir() / "budget.json"


def _carry_over() -> None:
    """At exit: leave the unspent call seconds to the next process (under LSTMGRAD_TUNE=on), at
    most :data:`lstmgrad.planning.store.CARRY_MAX`."""
    if budget.calls <= 0 or mode() != "on":  # no call ran: LSTMGRAD_TUNE is not read at exit
        return
    budget.carried()
    unspent = min(disk.CARRY_MAX, max(0.0, budget.calls - budget.measured / MEASURE_SHARE))
    try:
        cache_dir().mkdir(parents=True, exist_ok=True)
        disk.write(_carry_path(), {"calls": unspent})
    except OSError:
        pass  # a read-only cache: each process starts afresh


atexit.register(_carry_over)


def machine_busy() -> bool:
    """Whether other work holds the CPUs: the machine's 1-minute load average exceeds its CPUs
    by more than one runnable thread (the measuring process's own threads fill them)."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        return False
    return load > (os.cpu_count() or 1) + 1


def cpus_contended() -> bool:
    """Whether as many threads are runnable right now as there are CPUs (the kernel's count of
    running tasks in /proc/loadavg, the caller's own thread included): an instant reading,
    where the load average lags by a minute. False where it cannot be read."""
    try:
        with open("/proc/loadavg") as f:
            running = int(f.read().split()[3].split("/")[0])
    except (OSError, ValueError, IndexError):
        return False
    return running >= (os.cpu_count() or 1)


def note_call(seconds: float) -> None:
    """Count a fused engine call's seconds towards the measuring budget (:mod:`lstmgrad.ops.api`;
    the tuner's own runs call the engine directly and are not counted)."""
    budget.calls += seconds


def step_class(dims: Dims, dtype: np.dtype, kind: str) -> dict[str, Any]:
    """The shape class of the step loops' measurements: batch (rounded up to a power of two, so
    that the many batch sizes of packed or bucketed data share a few classes), hidden size,
    directions."""
    return {"what": "steps", "kind": kind, "dtype": str(compute_dtype(dtype)),
            "B": bucket(dims.B), "H": dims.H, "D": dims.D}  # fmt: skip


def bucket(n: int) -> int:
    """n rounded up to a power of two (the row count of a class of big products)."""
    return 1 << max(0, int(n - 1).bit_length())


BIG_ROWS = 1024
"""The most rows the big products are measured with: their time per row barely changes past a
few hundred, and this bounds a measurement's time by the layer's width, not its length."""


def big_class(dims: Dims, dtype: np.dtype, kind: str) -> dict[str, Any]:
    """The shape class of the big products' measurements: rows of all steps (bucketed, at
    most :data:`BIG_ROWS`), the input size, hidden size."""
    n = min(bucket(dims.T * dims.B), BIG_ROWS)
    return {"what": "big", "kind": kind, "dtype": str(compute_dtype(dtype)), "N": n,
            "I": dims.I, "H": dims.H}  # fmt: skip


# --------------------------------------------------------------------------------------------
# the store of measurements ("wisdom"): one JSON file per machine fingerprint


class Wisdom:
    """Measured decisions of one machine fingerprint, in memory and on disk.

    The file is read through :mod:`lstmgrad.planning.store`'s schema, whatever it holds: a
    file of the wrong structure or facts is ignored whole, an entry that is not exactly what a
    measurement holds is dropped and the valid ones kept, with one :class:`CacheWarning` per
    file and process; the next store rewrites the file from the valid entries. A store merges
    with the entries other processes stored meanwhile, under a lock
    (:func:`lstmgrad.planning.store.locked`)."""

    def __init__(self, facts: dict[str, Any]) -> None:
        self.facts = facts
        self.key = fingerprint_key(facts)
        self.entries: dict[str, dict[str, Any]] = {}
        self.unsaved: set[str] = set()  # entries kept for this process only
        self.lock = threading.Lock()
        self.error: str | None = None  # why the last store did not reach the disk
        self._load()

    @property
    def path(self) -> Path:
        return cache_dir() / f"wisdom-{self.key}.json"

    def _on_disk(self) -> dict[str, dict[str, Any]]:
        """The file's valid entries (none where there is no file or nothing valid)."""
        after = "what it held is measured again and the file rewritten at the next store"
        check = functools.partial(disk.store_entries, facts=self.facts)
        return disk.read(self.path, check, after) or {}

    def _load(self) -> None:
        self.entries = self._on_disk()

    def get(self, cls: dict[str, Any]) -> dict[str, Any] | None:
        return self.entries.get(json.dumps(cls, sort_keys=True))

    def put(self, cls: dict[str, Any], entry: dict[str, Any], keep: bool = True) -> None:
        """Store an entry, on disk too unless ``keep`` is False (this process only)."""
        key = json.dumps(cls, sort_keys=True)
        self.entries[key] = entry
        if keep:
            self.unsaved.discard(key)
            self._save()
        else:
            self.unsaved.add(key)

    def stored(self, cls: dict[str, Any]) -> bool:
        """Whether later processes will read an entry for ``cls``: the file read back holds a
        valid one."""
        return json.dumps(cls, sort_keys=True) in self._on_disk()

    def clear(self) -> None:
        """Forget every entry, on disk too."""
        self.entries = {}
        self.unsaved = set()
        try:
            self.path.unlink()
        except OSError:
            pass

    def _save(self) -> None:
        """Merge this process's entries into the file's valid ones and replace it, under the
        store's lock: entries other processes stored meanwhile are kept."""
        try:
            directory = cache_dir()
            directory.mkdir(parents=True, exist_ok=True)
            with disk.locked(directory / f".wisdom-{self.key}.lock"):
                mine = {k: v for k, v in self.entries.items() if k not in self.unsaved}
                entries = {**self._on_disk(), **mine}
                disk.write(self.path, {"facts": self.facts, "entries": entries})
            self.error = None
        except OSError as exc:  # a read-only home: the measurements live for this process only
            self.error = str(exc)


def _cache_env() -> tuple[str | None, ...]:
    return tuple(os.environ.get(v) for v in ("LSTMGRAD_CACHE_DIR", "XDG_CACHE_HOME", "HOME"))


@functools.lru_cache(maxsize=8)
def _cache_dir(env: tuple[str | None, ...]) -> Path:
    explicit, xdg, _ = env
    if explicit:
        return Path(explicit)
    return Path(xdg or os.path.join(os.path.expanduser("~"), ".cache")) / "lstmgrad"


def cache_dir() -> Path:
    """LSTMGRAD_CACHE_DIR, else $XDG_CACHE_HOME/lstmgrad, else ~/.cache/lstmgrad."""
    return _cache_dir(_cache_env())


WISDOM_FORMAT = 23
"""The version of what a measurement holds: a store written with other candidates (an older
lstmgrad) is measured again rather than read."""

_wisdoms: dict[tuple[str, int], Wisdom] = {}
_wisdoms_lock = threading.Lock()


def wisdom(kind: str) -> Wisdom:
    """The store for back end ``kind`` in this machine's current configuration (a new thread
    count or library version is a new fingerprint)."""
    facts = {**fingerprint(kind), "format": WISDOM_FORMAT}
    key = (fingerprint_key(facts), os.getpid())
    with _wisdoms_lock:
        w = _wisdoms.get(key)
        if w is None or w.facts != facts or w.path.parent != cache_dir():
            w = _wisdoms[key] = Wisdom(facts)
    return w


# --------------------------------------------------------------------------------------------
# plans


GATE_MARGIN = 1.05
"""A measured plan replaces the default plan only where it ran at least this much faster in the
gate's interleaved rounds (:func:`lstmgrad.planning.tune.gate`): within 5% the default's
robustness (no library call and no thread hand-off per step) is worth more than the gain, and
5% is above the rounds' noise on a quiet machine."""


OTHERS_MAX = 0.25
"""A measurement during which other processes kept more than a quarter of a CPU busy on average
(:func:`lstmgrad.core.machine.others_cpus`; a busy process takes a whole one, a quiet machine
well under a hundredth) is dropped: their threads took time from the candidates', and a plan
that wins beside them (one thread, no library calls) can lose by 2x on the quiet machine."""


def _measure(store: Wisdom, cls: dict[str, Any], run: Any, m: str, kind: str) -> Any:
    """The stored entry of ``cls``, else ``run()`` measured now where the mode and budget allow
    and no other process holds the CPUs; stored only where they stayed free while it ran (a
    measurement of a loaded machine is dropped: it never replaces or becomes a decision). None
    where nothing is known yet."""
    entry = store.get(cls)
    if entry is not None or not (m == "eager" or (m == "on" and budget.allows(kind))):
        return entry
    with store.lock:
        entry = store.get(cls)
        if entry is not None:
            return entry
        if machine_busy():
            budget.wait()
            return None
        t0 = time.perf_counter()
        clock = cpu_clock()
        entry = run()
        took = time.perf_counter() - t0
        budget.measured += took
        budget.runs.append(took)
        if machine_busy() or others_cpus(clock) > OTHERS_MAX:
            budget.wait()
            return None
        entry = {**entry, "took": min(took, disk.TOOK_MAX)}  # the budget's expected cost
        store.put(cls, entry)
        return entry


def gate_class(dims: Dims, dtype: np.dtype, kind: str) -> dict[str, Any]:
    """The class of the gate's decision: the step loops' and the big products' classes, and the
    steps rounded up to a power of two (a plan's arrangement depends on the sequence length)."""
    return {**step_class(dims, dtype, kind), "what": "gate", "I": dims.I, "T": bucket(dims.T)}


def _measured(dims: Dims, dtype: np.dtype, gemm: Any, m: str) -> tuple[Plan, bool]:
    """The plan of the call's classes: the default plan, or the plan from this machine's
    measurements where it beat the default in the gate by :data:`GATE_MARGIN` (measured now
    where missing: always in mode "eager", within the budget in mode "on", never while other
    processes load the machine); and whether nothing is left to measure."""
    store = wisdom(gemm.kind)
    default = default_plan(dims, dtype, gemm)
    fields: dict[str, Any] = {}
    complete = True
    for cls, run in (
        (big_class(dims, dtype, gemm.kind), tune.measure_big),
        (step_class(dims, dtype, gemm.kind), tune.measure_steps),
    ):
        entry = _measure(store, cls, functools.partial(run, cls, gemm), m, gemm.kind)
        complete = complete and entry is not None
        if entry is not None:  # the big products' entry first: its transpose_threads
            # price the recurrent weight's preparation
            if cls["what"] == "steps":
                tt = fields.get("transpose_threads", SAFE.transpose_threads)
                fields.update(tune.step_fields(entry, dims.T, tt))
            else:
                fields.update(entry["plan"])
    if not complete:
        return default, False
    measured = feasible(dataclasses.replace(default, **fields), dims, dtype, gemm)
    if measured == feasible(default, dims, dtype, gemm):
        return default, True
    cls = gate_class(dims, dtype, gemm.kind)
    one = dataclasses.replace(dims, L=1)  # the gate times one layer of the call's sizes
    entry = _measure(store, cls, lambda: tune.gate(one, dtype, gemm, default, measured), m,
                     gemm.kind)  # fmt: skip
    if entry is None:
        return default, False
    return (measured if entry["ratio"] >= GATE_MARGIN else default), True


def probe_class(dims: Dims, dtype: np.dtype, kind: str) -> dict[str, Any]:
    """The class of the default plan's probe (:func:`lstmgrad.planning.tune.probe`): the step
    loops' class, the input size and the big products' rows (at most
    :data:`lstmgrad.planning.tune.PROBE_BIG_ROWS`)."""
    n = min(bucket(dims.T * dims.B), tune.PROBE_BIG_ROWS)
    return {**step_class(dims, dtype, kind), "what": "probe", "I": dims.I, "N": n}


def _probe(dims: Dims, dtype: np.dtype, gemm: Any) -> dict[str, Any]:
    """The class's probe: stored, else measured now (a fraction of a second, in every mode but
    off) and stored where no other process kept the CPUs busy meanwhile (else kept for this
    process only: a reading of a loaded machine is not a fact of the machine)."""
    store = wisdom(gemm.kind)
    cls = probe_class(dims, dtype, gemm.kind)
    entry = store.get(cls)
    if entry is not None:
        return entry
    with store.lock:
        entry = store.get(cls)
        if entry is None:
            clock = cpu_clock()
            t0 = time.perf_counter()
            entry = tune.probe(cls, gemm, (dims.I, cls["N"]))
            entry["probed_in"] = time.perf_counter() - t0  # (not a measurement's "took")
            store.put(cls, entry, keep=not (machine_busy() or others_cpus(clock) > OTHERS_MAX))
    return entry


def default_plan(dims: Dims, dtype: np.dtype, gemm: Any) -> Plan:
    """The plan of a class not measured yet (LSTMGRAD_TUNE=on or cached): the cost model of
    :mod:`lstmgrad.planning.model` on the class's probe (product speeds measured at its sizes
    on this machine, once, :func:`_probe`) picks the step loops' arrangement (a library call
    per step, or each direction's loop walking in one compiled call: alone, in blocks of rows
    side by side, or both directions at once) and the products' methods. A back end without
    a walk product (NumPy's: its BLAS has a thread pool of its own, which the engine's threads
    would fight) gets :data:`SAFE` until measured. An
    inference forward runs the back end's own fused LSTM where it has one (``library_lstm``:
    torch's oneDNN primitive led the engine's inference on most shapes of both CPUs measured),
    with the engine as its alternative in the in-use check (:func:`plan_call`), which moves to
    the engine where that runs faster.
    """
    cd = compute_dtype(dtype)
    if not gemm.walk_gemm(cd):  # NumPy's: its BLAS and the engine's threads are two pools
        return SAFE
    fields = model.engine_fields(_probe(dims, dtype, gemm), dims, gemm.product_methods(cd)[0])
    plan = dataclasses.replace(SAFE, **fields, library_lstm=gemm.library_lstm(np.dtype(dtype)))
    return feasible(plan, dims, dtype, gemm)


WATCH_EVERY = 16
"""A plan in use runs its alternative instead on every 16th call of its sizes and kind (and on
calls 4, 8 and 12; a few per cent of the time where the alternative is slower): the in-use
check."""

WATCH_SAMPLES = 3
"""Samples of an alternative the in-use check needs before it may switch."""


def one_thread(p: Plan) -> Plan:
    """``p`` with the engine's own kernels on one thread: what a multi-threaded plan falls back
    to where a busy core makes each parallel region wait for a thread the scheduler parked."""
    return dataclasses.replace(p, threads=1, walk_rows=1, pair_walks=False, split_min=0,
                               transpose_threads=1)  # fmt: skip


def _parallel(p: Plan) -> bool:
    return p.threads > 1 or p.walk_rows > 1 or p.pair_walks or p.transpose_threads > 1


class _Watch:
    """The in-use check of one call's sizes and kind, over a chain of plans: the plan chosen,
    then its fallbacks (the default plan where a measured plan was chosen; the plan in use on
    one thread where it has several). Calls 4, 8, 12 and every :data:`WATCH_EVERY`-th after run
    an alternative (the next fallback, the one-thread one on every 4th such call or while
    :func:`cpus_contended`; else the plan before the one in use, to come back once the machine
    is quiet again) and its seconds are set
    against the median of the calls just before it. Once the median of
    :data:`WATCH_SAMPLES` such ratios says the alternative is faster by :data:`GATE_MARGIN`,
    it serves. A measured plan that loses to the default turns the gate's stored decision
    (later processes start with the default)."""

    def __init__(self, plans: list[Plan], measured: bool, store: Wisdom, cls: dict[str, Any],
                 key: tuple) -> None:  # fmt: skip
        self.plans, self.measured = plans, measured
        self.store, self.cls, self.key = store, cls, key
        self.using = 0
        self.calls = 0
        self.recent: list[float] = []  # the plan in use: its last calls' cost
        self.ratios: list[float] = []  # per sample: in use median / alternative's sample
        self.against: int | None = None  # the alternative those ratios are of

    def _alternative(self) -> int | None:
        nxt = self.using + 1
        if nxt < len(self.plans):
            # one thread: every 4th sample on a quiet machine (a few per cent where threads
            # pay), every sample while other threads are runnable on every CPU
            if not self._is_one_thread(nxt) or self.calls % (4 * WATCH_EVERY) == 0:
                return nxt
            if cpus_contended():
                return nxt
        return self.using - 1 if self.using > 0 else None

    def _is_one_thread(self, index: int) -> bool:
        return not _parallel(self.plans[index]) and _parallel(self.plans[index - 1])

    def sampling_next(self) -> bool:
        """Whether the next call samples an alternative (what :meth:`pick` will decide)."""
        calls = self.calls + 1
        due = calls % WATCH_EVERY == 0 or calls in (4, 8, 12)
        return due and len(self.recent) >= 3

    def pick(self, sample: bool) -> tuple[Plan, int | None]:
        """The plan of the next call, and the index of the alternative it samples (None: the
        plan in use)."""
        self.calls += 1
        # the first samples early (calls 4, 8, 12): a plan that collapses is left within a few
        # calls, not a few dozen
        due = self.calls % WATCH_EVERY == 0 or self.calls in (4, 8, 12)
        if sample and due and len(self.recent) >= 3:
            alt = self._alternative()
            if alt is not None:
                return self.plans[alt], alt
        return self.plans[self.using], None

    def note(self, cost: float, sampled: int | None) -> None:
        if cost <= 0:
            return
        if sampled is None:
            self.recent = [*self.recent[-4:], cost]
            return
        if sampled != self.against:  # ratios against one alternative at a time
            self.ratios, self.against = [], sampled
        self.ratios = [*self.ratios[-4:], float(np.median(self.recent)) / cost]
        if len(self.ratios) >= WATCH_SAMPLES and float(np.median(self.ratios)) >= GATE_MARGIN:
            if self.using == 0 and sampled == 1 and self.measured:
                _lost_keys.add(self.key)
                entry = self.store.get(self.cls)
                if entry is not None:  # later processes start with the default
                    self.store.put(self.cls, {**entry, "ratio": 0.0, "lost_in_use": self.ratios})
            self.using, self.recent, self.ratios, self.against = sampled, [], [], None


# key -> (plan, final: no class waits to be measured, the default plan where the plan differs)
_memo: dict[tuple, tuple[Plan, bool, Plan | None]] = {}
# (key, part) -> its in-use check (None: nothing to watch)
_watches: dict[tuple, _Watch | None] = {}
_lost_keys: set[tuple] = set()  # keys whose measured plan lost in use: the default serves


def _thread_state(kind: str) -> tuple[int, ...]:
    """What a plan's thread count depends on, cheap to read on every call."""
    import numba

    state: tuple[int, ...] = (
        numba.get_num_threads(),
        len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 0,
    )
    if kind == "torch":
        import sys

        torch = sys.modules.get("torch")
        state += (torch.get_num_threads() if torch is not None else 1,)
    return state


def _planned(dims: Dims, dtype: np.dtype, gemm: Any) -> tuple[Plan, Plan | None, tuple]:
    """(the plan, the default plan where the plan is another, the memo's key)."""
    m = mode()
    forced_fields = overrides()
    if m == "off":
        return feasible(dataclasses.replace(SAFE, **forced_fields), dims, dtype, gemm), None, ()
    key = (gemm.kind, np.dtype(dtype), dims.T, dims.B, dims.I, dims.H, dims.D, m,
           tuple(sorted(forced_fields.items())), _thread_state(gemm.kind), os.getpid(),
           _cache_env())  # fmt: skip
    memo = _memo.get(key)
    # a plan made while a class waited for the budget is made again once the budget allows
    if memo is None or (not memo[1] and budget.allows(gemm.kind)):
        base, complete = _measured(dims, dtype, gemm, m)
        chosen = feasible(dataclasses.replace(base, **forced_fields), dims, dtype, gemm)
        default = feasible(dataclasses.replace(default_plan(dims, dtype, gemm), **forced_fields),
                           dims, dtype, gemm)  # fmt: skip
        memo = _memo[key] = (chosen, complete or m != "on", None if chosen == default else default)
    return memo[0], memo[2], key


def plan_for(dims: Dims, dtype: np.dtype, gemm: Any) -> Plan:
    """The plan of calls of these sizes: measured where it beat the default in the gate (else
    the default plan; the safe plan with LSTMGRAD_TUNE=off), then forced fields (LSTMGRAD_PLAN,
    :func:`forced`), then :func:`feasible`. Remembered for the process per shape, settings and
    thread counts (a call pays a dictionary lookup); the default once the in-use check found it
    faster."""
    chosen, default, key = _planned(dims, dtype, gemm)
    return default if default is not None and key in _lost_keys else chosen


def _budget_only(seconds: float, work: float = 1.0) -> None:
    note_call(seconds)


def _first(chosen: Plan, default: Plan | None, key: tuple) -> tuple[bool, Plan]:
    """Whether a measured plan is in use (it differs from the default and has not lost to it),
    and the plan a call of these sizes starts with."""
    measured = default is not None and key not in _lost_keys
    return measured, chosen if default is None or measured else default


def plan_call(dims: Dims, dtype: np.dtype, gemm: Any, part: Any, sample: bool = True,
              inference: bool = False) -> tuple[Plan, Callable[..., None]]:  # fmt: skip
    """:func:`plan_for` for one call of ``part`` (what makes calls of these sizes comparable:
    forward or backward, and their flags), and what to call with its cost once it ran (the
    measuring budget, the in-use check; seconds, or seconds per unit of work where the same
    sizes do varying work). With ``sample`` the in-use check now and then runs a fallback
    instead (:class:`_Watch`); without it (a call whose scratch was sized for
    :func:`plan_for`'s plan) never, and the plan is :func:`plan_for`'s. ``inference``: the
    call is a dense inference forward, which a plan's ``library_lstm`` runs on the library's
    own LSTM: the engine's plans are its fallbacks."""
    chosen, default, key = _planned(dims, dtype, gemm)
    measured, first = _first(chosen, default, key)
    if not sample or not key:  # LSTMGRAD_TUNE=off: the safe plan always
        return first, _budget_only
    if (key, part) not in _watches:
        chain = [first]
        if measured and default is not None:
            chain.append(default)
        forced_threads = {"threads", "walk_rows", "pair_walks"} & set(overrides())
        if _parallel(chain[-1]) and not forced_threads:  # threads the caller forced stay
            single = feasible(one_thread(chain[-1]), dims, dtype, gemm)
            if single != chain[-1]:
                chain.append(single)
        library = inference and first.library_lstm and "library_lstm" not in overrides()
        if library:  # the library's LSTM first, then the engine's chain
            chain = [first] + list(dict.fromkeys(
                dataclasses.replace(p, library_lstm=False) for p in chain))  # fmt: skip
        # a measured plan's verdict against the default comes from the engine's calls only
        _watches[(key, part)] = None if len(chain) == 1 else _Watch(
            chain, measured and not library, wisdom(gemm.kind),
            gate_class(dims, dtype, gemm.kind), key,
        )  # fmt: skip
    watch = _watches[(key, part)]
    if watch is None:  # nothing to fall back to
        return first, _budget_only
    plan, sampled = watch.pick(sample)

    def done(seconds: float, work: float = 1.0) -> None:
        note_call(seconds)
        watch.note(seconds / work, sampled)

    return plan, done


def library_inference(dims: Dims, dtype: np.dtype, gemm: Any,
                      part: Any) -> Callable[..., None] | None:  # fmt: skip
    """For a dense inference forward of ``part``: what to call with its cost where the plan in
    use runs the library's own LSTM (``library_lstm``) and the in-use check does not sample an
    alternative with this call, so that the caller may run the library's LSTM directly (the
    drop-in: torch's own forward); None where the call goes through :func:`plan_call` (the
    engine, or a sample)."""
    chosen, default, key = _planned(dims, dtype, gemm)
    if not key or (key, part) not in _watches:  # LSTMGRAD_TUNE=off, or not seen yet
        return None
    watch = _watches[(key, part)]
    if watch is None:  # nothing to fall back to: plan_call's first plan always
        return _budget_only if _first(chosen, default, key)[1].library_lstm else None
    if not watch.plans[watch.using].library_lstm or watch.sampling_next():
        return None
    plan, sampled = watch.pick(True)

    def done(seconds: float, work: float = 1.0) -> None:
        note_call(seconds)
        watch.note(seconds / work, sampled)

    return done


def forget() -> None:
    """Drop this process's remembered plans and stores (after :meth:`Wisdom.clear`, or to
    re-read the disk)."""
    global budget
    with _wisdoms_lock:
        _memo.clear()
        _watches.clear()
        _lost_keys.clear()
        _wisdoms.clear()
        budget = _Budget()


def reset() -> list[Path]:
    """Delete every store of measurements in :func:`cache_dir` (every fingerprint: other thread
    counts and library versions too) and drop this process's plans; return the files deleted.
    Needs neither torch nor the fingerprints, so it works wherever lstmgrad imports."""
    removed = []
    for path in sorted(cache_dir().glob("wisdom-*.json")):
        try:
            path.unlink()
        except FileNotFoundError:
            continue  # another process deleted it first
        removed.append(path)
    forget()
    return removed


def show() -> dict[str, Any]:
    """What is stored for this machine: per back end kind, its facts, file and entries."""
    out: dict[str, Any] = {"mode": mode(), "cache_dir": str(cache_dir()), "overrides": overrides()}
    import sys

    kinds = ["numpy"] + (["torch"] if sys.modules.get("torch") is not None else [])
    for kind in kinds:
        store = wisdom(kind)
        out[kind] = {
            "facts": store.facts,
            "file": str(store.path),
            "entries": {k: v for k, v in sorted(store.entries.items())},
        }
    return out
