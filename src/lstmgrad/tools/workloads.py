"""Workloads of what users run: ``lstmgrad.nn.LSTM`` against ``torch.nn.LSTM`` inside models.

The grid and the word LM run both sides in this process (lstmgrad's GEMMs run on torch there,
so no second BLAS runtime joins in), taking turns: torch first in even rounds, lstmgrad first in
odd ones, after untimed warm-ups. A figure is the median over rounds, a ratio the median of the
per-round ratios torch ms / lstmgrad ms (> 1: lstmgrad is faster). The workloads:

- :func:`run_grid`: a training step and an eval forward of Embedding -> LSTM -> Linear over a
  seeded sample of shapes (:func:`grid_sample`).
- :func:`run_word_lm`: the word-level language model of PyTorch's
  examples/word_language_model on a generated corpus (:func:`corpus`).
- :func:`run_tagger`: the packed sequence tagger (word and character BiLSTMs over
  PackedSequences), each side in fresh processes: a first run on empty plan and Numba caches,
  then a second run on the same caches.

Every workload takes ``busy_n``: that many busy processes (:func:`busy`) run beside both sides,
and the record says so (``meta["busy"]``, and the cores other processes used).
The module imports neither torch nor lstmgrad's engine at import time; the functions do.
``benchmarks/grid.py``, ``benchmarks/word_lm.py`` and ``benchmarks/packed_tagger.py`` are its
command lines.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import functools
import importlib
import json
import math
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

SIDES = ("torch", "lstmgrad")
PAUSE_S = 0.05  # after every timed batch: the idle side's spinning threads go to sleep
BATCH_S = 0.1  # aimed seconds of one timed batch of reps (a grid item's reps are set from it)
MAX_REPS = 50

# each workload's run sizes, in full and with --quick (a smoke run): the scripts in benchmarks/
# and ``lstmgrad bench --workload`` read them here
RUN_SIZES: dict[str, dict[bool, dict[str, int]]] = {
    "grid": {False: {"rounds": 5}, True: {"rounds": 2}},
    "word-lm": {False: {"rounds": 10, "chunk": 20, "warmup": 5},
                True: {"rounds": 2, "chunk": 3, "warmup": 2}},
    "tagger": {False: {"epochs": 2, "sentences": 640}, True: {"epochs": 1, "sentences": 96}},
}  # fmt: skip

# --------------------------------------------------------------------------------------------
# lstmgrad's modules (imported on use: this module imports without torch)


def _nn() -> Any:
    from ..pytorch import nn

    return nn


def _plan() -> Any:
    from ..planning import plan

    return plan


def _machine() -> Any:
    from ..core import machine

    return machine


def _bench() -> Any:
    from . import bench

    return bench


def _measured_s() -> float:
    """Seconds lstmgrad's planner has spent measuring in this process (0 if not readable)."""
    return float(getattr(getattr(_plan(), "budget", None), "measured", 0.0))


def _warmup_context(tune: str | None) -> Any:
    """Warm-ups measure every new class of shapes at once (``plan.eager``, as ``lstmgrad
    bench`` does), unless the caller chose an LSTMGRAD_TUNE mode (``tune``)."""
    eager = getattr(_plan(), "eager", None)
    return eager() if tune is None and eager is not None else contextlib.nullcontext()


def stored_classes() -> int:
    """Classes of shapes in lstmgrad's plan store (0 where none can be read)."""
    try:
        shown = _plan().show()
    except Exception:  # noqa: BLE001 - a count for the record, never a reason to fail
        return 0
    return sum(len(v.get("entries", {})) for v in shown.values() if isinstance(v, dict))


# --------------------------------------------------------------------------------------------
# contention


# A busy loop that also ends when its parent dies (checked every ~20 ms), so that a killed
# benchmark leaves nothing spinning.
BUSY_CODE = (
    "import os\np = os.getppid()\nwhile os.getppid() == p:\n    for _ in range(10**6): pass\n"
)


@contextlib.contextmanager
def busy(n: int) -> Iterator[list[subprocess.Popen]]:
    """``n`` busy processes (a Python loop each) for the block; killed and reaped on exit,
    also on an exception or KeyboardInterrupt."""
    procs: list[subprocess.Popen] = []
    try:
        for _ in range(n):
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-c", BUSY_CODE],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        yield procs
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


def _cpu_busy_s() -> float:
    """Busy seconds of all CPUs since boot (every /proc/stat field but idle and iowait)."""
    try:
        v = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    except (OSError, ValueError):
        return math.nan
    return (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")


class _OtherCores:
    """Cores other processes (the busy ones included) used between start and stop."""

    def __init__(self) -> None:
        self.t0, self.all0, self.own0 = time.perf_counter(), _cpu_busy_s(), sum(os.times()[:2])

    def stop(self) -> float:
        wall = time.perf_counter() - self.t0
        other = _cpu_busy_s() - self.all0 - (sum(os.times()[:2]) - self.own0)
        return round(max(0.0, other) / wall, 2) if wall > 0 and math.isfinite(other) else math.nan


# --------------------------------------------------------------------------------------------
# the record's meta


def _git_commit() -> dict[str, Any] | None:
    """The checkout's commit and whether it has changes (None outside a git checkout)."""
    here = Path(__file__).resolve().parent
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=here,
                              capture_output=True, text=True, timeout=10)  # fmt: skip
        if head.returncode != 0:
            return None
        status = subprocess.run(["git", "status", "--porcelain"], cwd=here,
                                capture_output=True, text=True, timeout=10)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": head.stdout.strip(), "dirty": bool(status.stdout.strip())}


def meta(busy_n: int, probe: bool = True) -> dict[str, Any]:
    """The machine facts of a record: date, CPU model, load before, Python, torch, NumPy, Numba
    and their threads, LSTMGRAD_* settings, the busy processes, the commit; with ``probe`` also
    ``lstmgrad.bench.machine()`` (thread pools and GEMM peaks, about 2 s). :func:`finish`
    adds the load after and the total time."""
    import numba
    import torch

    m: dict[str, Any] = {
        "date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "cpu": _machine().cpu_model(),
        "cpu_count": os.cpu_count(),
        "loadavg_before": os.getloadavg(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "numba": numba.__version__,
        "torch_threads": torch.get_num_threads(),
        "numba_threads": numba.get_num_threads(),
        "env": {k: v for k, v in os.environ.items() if k.startswith("LSTMGRAD_")},
        "tune_mode": _plan().mode(),
        "busy": busy_n,
        "git": _git_commit(),
        "t0": time.perf_counter(),
    }
    if probe:
        m["machine"] = _bench().machine()
    return m


def finish(doc: dict[str, Any]) -> dict[str, Any]:
    """Adds the load after and the total seconds to ``doc["meta"]``; returns ``doc``."""
    m = doc["meta"]
    m["loadavg_after"] = os.getloadavg()
    m["total_s"] = round(time.perf_counter() - m.pop("t0", time.perf_counter()), 1)
    return doc


def write_json(doc: dict[str, Any], path: str | Path) -> Path:
    """``doc`` as JSON at ``path`` (folders made); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**doc, "meta": {k: v for k, v in doc["meta"].items()
                                                if k != "t0"}}, indent=1))  # fmt: skip
    return path


def format_meta(m: dict[str, Any]) -> str:
    """The header lines of a record's meta."""
    git = m.get("git") or {}
    commit = f"{git.get('commit')}{' (changed)' if git.get('dirty') else ''}" if git else "?"
    after = m.get("loadavg_after")
    lines = [
        f"cpu      {m['cpu']}, {m['cpu_count']} CPUs; load before "
        f"{m['loadavg_before'][0]:.2f}" + (f", after {after[0]:.2f}" if after else ""),
        f"libs     torch {m['torch']} ({m['torch_threads']} threads), NumPy {m['numpy']}, "
        f"Numba {m['numba']} ({m['numba_threads']} threads), Python {m['python']}",
        f"run      {m['date']}, commit {commit}, busy processes {m['busy']}, LSTMGRAD_TUNE "
        f"{m['tune_mode']}" + "".join(f", {k}={v}" for k, v in m["env"].items()),
    ]
    peaks = (m.get("machine") or {}).get("peak_gflops")
    if peaks:
        lines.append("peak     " + ", ".join(f"{k} {v:.3g} GFLOP/s" for k, v in peaks.items()))
    return "\n".join(lines)


def _pair(t_ms: list[float], l_ms: list[float]) -> dict[str, Any]:
    """Both sides' per-round ms, their medians and the per-round ratios torch / lstmgrad."""
    ratios = [a / b for a, b in zip(t_ms, l_ms, strict=True)]
    return {
        "torch_ms": statistics.median(t_ms),
        "lstmgrad_ms": statistics.median(l_ms),
        "ratio": statistics.median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "torch_ms_round": t_ms,
        "lstmgrad_ms_round": l_ms,
        "ratio_round": ratios,
    }


def _ms(v: float) -> str:
    return f"{v:.3f}" if v < 1 else f"{v:.2f}" if v < 100 else f"{v:.1f}"


def _table(head: list[str], rows: list[list[str]]) -> str:
    """Columns right-aligned but the first."""
    w = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    fmt = [(lambda s, n=n: s.ljust(n)) if i == 0 else (lambda s, n=n: s.rjust(n))
           for i, n in enumerate(w)]  # fmt: skip
    return "\n".join("  ".join(f(c) for f, c in zip(fmt, r, strict=True)) for r in [head, *rows])


# --------------------------------------------------------------------------------------------
# the grid


GRID_H = (64, 100, 200, 256, 300, 512, 650, 1024, 1500)
GRID_B = (1, 4, 20, 64)
GRID_T = (1, 10, 35, 100)
GRID_L = (1, 2)
GRID_D = (1, 2)
GRID_DROPOUT = (0.0, 0.5)
GRID_HX = (False, True)
GRID_VOCAB = 1000
STEP_MACS_CAP = 20 * 10**9
"""The most multiply-adds a grid shape's training step may take (:func:`step_macs`): about
0.2-0.4 s of torch's step on 2 cores."""
WEIGHTS_CAP = 40 * 10**6
"""The most LSTM weights a grid shape may have: a step also reads and updates every weight,
so H = 1500 with 2 layers and 2 directions (90 M) costs ~1 s whatever B and T are."""


@dataclasses.dataclass(frozen=True, order=True)
class GridShape:
    """One grid shape: hidden size, batch, steps, layers, directions, dropout between layers
    (only used with L = 2), and whether (h_0, c_0) is given. The input size I is H."""

    H: int
    B: int
    T: int
    L: int
    D: int
    dropout: float = 0.0
    hx: bool = False

    @property
    def I(self) -> int:  # noqa: E743 (the LSTM's input size, named as in the docs)
        return self.H

    @property
    def id(self) -> str:
        extra = ("-p" + f"{self.dropout:g}" if self.dropout else "") + ("-hx" if self.hx else "")
        return f"H{self.H}-B{self.B}-T{self.T}-L{self.L}-D{self.D}{extra}"

    def record(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "I": self.I}


def parse_shape(text: str) -> GridShape:
    """The shape of an id such as "H256-B20-T35-L2-D1-p0.5-hx" (:attr:`GridShape.id`)."""
    fields: dict[str, Any] = {}
    for part in text.strip().split("-"):
        key, value = part[:1], part[1:]
        if key in "HBTLD" and value.isdigit():
            fields[key] = int(value)
        elif key == "p":
            fields["dropout"] = float(value)
        elif part == "hx":
            fields["hx"] = True
        else:
            raise ValueError(f"bad grid shape id {text!r} (want e.g. H256-B20-T35-L2-D1-p0.5-hx)")
    if set("HBTLD") - set(fields):
        raise ValueError(f"bad grid shape id {text!r}: H, B, T, L and D are needed")
    return GridShape(**fields)


def lstm_weights(s: GridShape) -> int:
    """The LSTM's parameters (weights and both biases, every layer and direction)."""
    return sum(s.D * 4 * s.H * ((s.I if k == 0 else s.D * s.H) + s.H + 2) for k in range(s.L))


def step_macs(s: GridShape, vocab: int = GRID_VOCAB) -> int:
    """Multiply-adds of one training step: 3x the forward's (the backward's dx and dW are two
    products per forward product) of the LSTM, 4H x (I_l + H) per row, step, layer and
    direction, and the Linear to the vocabulary."""
    rows = s.T * s.B
    lstm = sum(s.D * 4 * s.H * ((s.I if k == 0 else s.D * s.H) + s.H) for k in range(s.L))
    return 3 * rows * (lstm + s.D * s.H * vocab)


def fits(s: GridShape, cap: int = STEP_MACS_CAP, weights_cap: int = WEIGHTS_CAP) -> bool:
    return step_macs(s) <= cap and lstm_weights(s) <= weights_cap


def grid_sample(
    n: int = 40, seed: int = 0, cap: int = STEP_MACS_CAP, weights_cap: int = WEIGHTS_CAP
) -> list[GridShape]:
    """A fixed, seeded sample of ``n`` distinct shapes of the grid GRID_H x GRID_B x GRID_T x
    GRID_L x GRID_D x GRID_DROPOUT x GRID_HX (I = H: an embedding as wide as the LSTM, as in
    most language models and taggers), sorted.

    Each draw picks every field uniformly (``random.Random(seed)``) and is drawn again while it
    repeats a shape or exceeds a cap: ``cap`` multiply-adds of a training step
    (:func:`step_macs`, vocabulary GRID_VOCAB; default STEP_MACS_CAP = 2e10) or
    ``weights_cap`` LSTM weights (WEIGHTS_CAP = 4e7). The first draws fix one value each: every
    H, then every B (13 draws; ``n`` must be at least that), so every H and every B appears
    (the largest H with small B and T, as the cap leaves). The caps keep a full grid run at
    default settings (5 rounds, both sides, training step and eval forward) near 10 minutes on
    2 cores; a first run on an empty plan cache adds lstmgrad's measurements of new classes of
    shapes (seconds each)."""
    need = len(GRID_H) + len(GRID_B)
    if n < need:
        raise ValueError(f"grid_sample needs n >= {need} to cover every H and B, got {n}")
    rng = random.Random(seed)
    picked: set[GridShape] = set()

    def draw(**fixed: int) -> None:
        for _ in range(100_000):
            s = GridShape(
                H=fixed.get("H", rng.choice(GRID_H)),
                B=fixed.get("B", rng.choice(GRID_B)),
                T=rng.choice(GRID_T),
                L=rng.choice(GRID_L),
                D=rng.choice(GRID_D),
                dropout=rng.choice(GRID_DROPOUT),
                hx=rng.choice(GRID_HX),
            )
            if s not in picked and step_macs(s) <= cap and lstm_weights(s) <= weights_cap:
                picked.add(s)
                return
        raise ValueError(f"no new grid shape with {fixed} within the caps")

    for h in GRID_H:
        draw(H=h)
    for b in GRID_B:
        draw(B=b)
    while len(picked) < n:
        draw()
    return sorted(picked)


def quick_shapes(n: int = 3, seed: int = 0) -> list[GridShape]:
    """The ``n`` cheapest shapes of the default sample: a smoke run of the grid."""
    return sorted(grid_sample(seed=seed), key=step_macs)[:n]


@functools.cache
def _models() -> Any:
    """The model classes (defined on first use: this module imports without torch)."""
    import torch
    import torch.nn.functional as F
    from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

    class GridModel(torch.nn.Module):
        """Embedding(V, I) -> LSTM (time-major) -> Linear(D*H, V)."""

        def __init__(self, lstm: type, s: GridShape, vocab: int) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(vocab, s.I)
            # torch warns about dropout on one layer: the record keeps it, the model does not
            drop = s.dropout if s.L > 1 else 0.0
            self.lstm = lstm(s.I, s.H, s.L, dropout=drop, bidirectional=s.D == 2)
            self.out = torch.nn.Linear(s.D * s.H, vocab)

        def forward(self, x: Any, hx: Any) -> Any:
            return self.out(self.lstm(self.embed(x), hx)[0])

    class WordLM(torch.nn.Module):
        """examples/word_language_model's RNNModel (LSTM): Embedding, dropout, LSTM, dropout,
        Linear decoder (optionally tied to the embedding), log-softmax."""

        def __init__(self, lstm: type, ntoken: int, ninp: int, nhid: int, nlayers: int,
                     dropout: float, tie: bool) -> None:  # fmt: skip
            super().__init__()
            self.ntoken = ntoken
            self.drop = torch.nn.Dropout(dropout)
            self.encoder = torch.nn.Embedding(ntoken, ninp)
            self.rnn = lstm(ninp, nhid, nlayers, dropout=dropout)
            self.decoder = torch.nn.Linear(nhid, ntoken)
            if tie:
                if nhid != ninp:
                    raise ValueError("tied weights need nhid == emsize")
                self.decoder.weight = self.encoder.weight
            # the example's init_weights
            torch.nn.init.uniform_(self.encoder.weight, -0.1, 0.1)
            torch.nn.init.zeros_(self.decoder.bias)
            torch.nn.init.uniform_(self.decoder.weight, -0.1, 0.1)

        def forward(self, x: Any, hidden: Any) -> tuple[Any, Any]:
            output, hidden = self.rnn(self.drop(self.encoder(x)), hidden)
            decoded = self.decoder(self.drop(output)).view(-1, self.ntoken)
            return F.log_softmax(decoded, dim=1), hidden

    class Tagger(torch.nn.Module):
        """Character BiLSTM per word, concatenated with a word embedding, then a word BiLSTM
        (a CoNLL-style NER tagger), both over PackedSequences."""

        def __init__(self, lstm: type) -> None:
            super().__init__()
            self.chars = torch.nn.Embedding(64, 25, padding_idx=0)
            self.char_lstm = lstm(25, 25, bidirectional=True, batch_first=True)
            self.words = torch.nn.Embedding(5000, 100)
            self.word_lstm = lstm(150, 100, bidirectional=True, batch_first=True)
            self.out = torch.nn.Linear(200, 9)

        def forward(self, batch: list[tuple[list[list[int]], list[int]]]) -> Any:
            words = [w for sent, _ in batch for w in sent]
            lengths = torch.tensor([len(w) for w in words])
            chars = torch.zeros(len(words), int(lengths.max()), dtype=torch.long)
            for i, w in enumerate(words):
                chars[i, : len(w)] = torch.tensor(w)
            packed = pack_padded_sequence(self.chars(chars), lengths, batch_first=True,
                                          enforce_sorted=False)  # fmt: skip
            _, (h, _) = self.char_lstm(packed)
            char_repr = torch.cat([h[0], h[1]], dim=1)  # [words, 50]
            sent_len = torch.tensor([len(s) for s, _ in batch])
            ids = torch.tensor([sum(w) % 5000 for w in words])
            feats = torch.cat([self.words(ids), char_repr], dim=1)
            padded = torch.zeros(len(batch), int(sent_len.max()), 150)
            start = 0
            for i, n in enumerate(sent_len.tolist()):
                padded[i, :n] = feats[start : start + n]
                start += n
            packed = pack_padded_sequence(padded, sent_len, batch_first=True,
                                          enforce_sorted=False)  # fmt: skip
            y, _ = pad_packed_sequence(self.word_lstm(packed)[0], batch_first=True)
            tags = torch.full((len(batch), int(sent_len.max())), -100)
            for i, (_, t) in enumerate(batch):
                tags[i, : len(t)] = torch.tensor(t)
            return F.cross_entropy(self.out(y).flatten(0, 1), tags.flatten())

    return GridModel, WordLM, Tagger


def _lstm_classes() -> dict[str, type]:
    import torch

    return {"torch": torch.nn.LSTM, "lstmgrad": _nn().LSTM}


def _median_s(fn: Callable[[], Any], reps: int) -> float:
    """Median seconds of ``reps`` calls of ``fn``."""
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def _grid_items(s: GridShape, vocab: int, seed: int) -> dict[tuple[str, str], Callable[[], Any]]:
    """{(side, "train" | "eval"): a call} of one shape, both models with the same weights."""
    import torch
    import torch.nn.functional as F

    GridModel = _models()[0]
    torch.manual_seed(seed)
    models = {side: GridModel(cls, s, vocab) for side, cls in _lstm_classes().items()}
    models["lstmgrad"].load_state_dict(models["torch"].state_dict())  # identical weights
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(vocab, (s.T, s.B), generator=g)
    y = torch.randint(vocab, (s.T * s.B,), generator=g)  # random targets
    state = (s.L * s.D, s.B, s.H)
    hx = (0.5 * torch.randn(state, generator=g), 0.5 * torch.randn(state, generator=g))
    items: dict[tuple[str, str], Callable[[], Any]] = {}
    for side, model in models.items():
        opt = torch.optim.SGD(model.parameters(), lr=0.01)  # small: weights stay in range

        def train(model: Any = model, opt: Any = opt) -> None:
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(x, hx if s.hx else None).view(-1, vocab), y).backward()
            opt.step()

        def evaluate(model: Any = model) -> None:
            model.eval()
            with torch.no_grad():
                model(x, hx if s.hx else None)
            model.train()

        items[side, "train"], items[side, "eval"] = train, evaluate
    return items


def grid_shape(
    s: GridShape, rounds: int = 5, warmup: int = 2, batch_s: float = BATCH_S,
    vocab: int = GRID_VOCAB, seed: int = 0, tune: str | None = None, max_warmup: int = 6,
) -> dict[str, Any]:  # fmt: skip
    """One shape: warm-up rounds (at least ``warmup``, more while lstmgrad's planner still
    measured something in the last one, at most ``max_warmup``), each item's reps from the
    last warm-up (about ``batch_s`` s per batch), then ``rounds`` rounds of the four batches
    (train then eval, torch first in even rounds); per item both sides' median ms and the
    ratio. An exception (either side) is recorded as ``error``."""
    out: dict[str, Any] = {"shape": s.id, "dims": s.record(), "step_macs": step_macs(s, vocab),
                           "lstm_weights": lstm_weights(s)}  # fmt: skip
    try:
        items = _grid_items(s, vocab, seed)
        t0, m0 = time.perf_counter(), _measured_s()
        last: dict[tuple[str, str], float] = {}
        for k in range(max(warmup, max_warmup, 1)):
            before = _measured_s()
            with _warmup_context(tune):
                for key, fn in items.items():
                    last[key] = _median_s(fn, 1)
            if k + 1 >= warmup and _measured_s() == before:
                break
        out.update(warmup_rounds=k + 1, warmup_s=round(time.perf_counter() - t0, 2),
                   measured_s=round(_measured_s() - m0, 2))  # fmt: skip
        reps = {k: max(1, min(MAX_REPS, round(batch_s / max(v, 1e-6)))) for k, v in last.items()}
        ms: dict[tuple[str, str], list[float]] = {k: [] for k in items}
        m1, other = _measured_s(), _OtherCores()
        for r in range(rounds):
            for item in ("train", "eval"):
                for side in SIDES if r % 2 == 0 else SIDES[::-1]:
                    ms[side, item].append(1e3 * _median_s(items[side, item], reps[side, item]))
                    time.sleep(PAUSE_S)
        out["other_cores"] = other.stop()
        out["measured_s_timed"] = round(_measured_s() - m1, 2)  # should be 0
        out["reps"] = {f"{side}_{item}": n for (side, item), n in reps.items()}
        for item in ("train", "eval"):
            out[item] = _pair(ms["torch", item], ms["lstmgrad", item])
    except Exception as exc:  # noqa: BLE001 - one shape's failure is a result of the run
        out["error"] = f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
    return out


def run_grid(
    shapes: list[GridShape] | None = None, rounds: int = 5, warmup: int = 2, busy_n: int = 0,
    batch_s: float = BATCH_S, vocab: int = GRID_VOCAB, seed: int = 0, tune: str | None = None,
    probe: bool = True, progress: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """The grid's record: ``meta``, ``config``, ``results`` (:func:`grid_shape` per shape, in
    order) and ``summary`` (:func:`grid_summary`). ``shapes``: default :func:`grid_sample`.
    ``tune``: LSTMGRAD_TUNE for the run (default: unset, warm-ups measure new classes at once).
    ``progress`` gets the record after every shape."""
    shapes = grid_sample() if shapes is None else shapes
    with _tune_env(tune):
        doc: dict[str, Any] = {"workload": "grid", "meta": meta(busy_n, probe)}
        doc["config"] = {"rounds": rounds, "warmup": warmup, "batch_s": batch_s, "vocab": vocab,
                         "seed": seed, "shapes": len(shapes), "cap_macs": STEP_MACS_CAP,
                         "cap_weights": WEIGHTS_CAP, "pause_s": PAUSE_S}  # fmt: skip
        doc["results"] = []
        with busy(busy_n):
            for s in shapes:
                doc["results"].append(grid_shape(s, rounds, warmup, batch_s, vocab, seed, tune))
                doc["summary"] = grid_summary(doc["results"])
                if progress:
                    progress(doc)
    doc["summary"] = grid_summary(doc["results"])
    return finish(doc)


@contextlib.contextmanager
def _tune_env(tune: str | None) -> Iterator[None]:
    """LSTMGRAD_TUNE set to ``tune`` for the block (nothing changed for None)."""
    if tune is None:
        yield
        return
    old = os.environ.get("LSTMGRAD_TUNE")
    os.environ["LSTMGRAD_TUNE"] = tune
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("LSTMGRAD_TUNE", None)
        else:
            os.environ["LSTMGRAD_TUNE"] = old


def grid_summary(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Per item: shapes measured, the geometric mean of the ratios, the lowest ratio and its
    shape, the shapes where lstmgrad was slower; and the shapes that failed."""
    ok = [r for r in results if "error" not in r]
    out: dict[str, Any] = {"errors": [r["shape"] for r in results if "error" in r]}
    for item in ("train", "eval"):
        ratios = [r[item]["ratio"] for r in ok]
        if not ratios:
            continue
        low = min(ok, key=lambda r: r[item]["ratio"])
        out[item] = {
            "shapes": len(ratios),
            "geomean": math.exp(statistics.fmean(math.log(v) for v in ratios)),
            "min": low[item]["ratio"],
            "min_shape": low["shape"],
            "max": max(ratios),
            "slower": [r["shape"] for r in ok if r[item]["ratio"] < 1],
        }
    return out


def format_grid_row(r: dict[str, Any]) -> list[str]:
    """One result's cells: shape, GMAC, per item lstmgrad ms, torch ms, ratio, and the cores
    other processes used during the rounds (the busy ones included)."""
    cells = [r["shape"], f"{r['step_macs'] / 1e9:.3g}"]
    if "error" in r:
        return cells + ["error: " + r["error"][:60]] + [""] * 6
    for item in ("train", "eval"):
        p = r[item]
        cells += [_ms(p["lstmgrad_ms"]), _ms(p["torch_ms"]), f"{p['ratio']:.2f}x"]
    return cells + [f"{r['other_cores']:.2f}"]


GRID_HEAD = ["shape", "step GMAC", "train lstmgrad ms", "torch ms", "ratio",
             "eval lstmgrad ms", "torch ms", "ratio", "other cores"]  # fmt: skip


def format_grid(doc: dict[str, Any]) -> str:
    """The grid's table (ratio = torch ms / lstmgrad ms, > 1: lstmgrad faster) and, per item,
    the geometric mean and the lowest ratio."""
    lines = [_table(GRID_HEAD, [format_grid_row(r) for r in doc["results"]])]
    sm = doc["summary"]
    for item in ("train", "eval"):
        if item in sm:
            g = sm[item]
            lines.append(f"{item:5s}: geometric mean {g['geomean']:.2f}x over {g['shapes']} "
                         f"shapes, min {g['min']:.2f}x ({g['min_shape']}), max {g['max']:.2f}x, "
                         f"lstmgrad slower on {len(g['slower'])}")  # fmt: skip
    if sm["errors"]:
        lines.append(f"errors on {len(sm['errors'])} shapes: {', '.join(sm['errors'])}")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# the word-level language model


def corpus(n_tokens: int, vocab: int = 10_000, seed: int = 0) -> np.ndarray:
    """``n_tokens`` word ids of a seeded synthetic text: with probability 0.6 a word is one of
    its predecessor's 4 likely successors (probabilities 0.5, 0.25, 0.15, 0.1; the successor
    table is itself drawn Zipf), otherwise a Zipf draw (p ~ 1 / rank, id = rank) over
    ``vocab`` words. So the loss falls from ln(vocab) towards the unigram entropy and below."""
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, vocab + 1)
    p /= p.sum()
    succ = rng.choice(vocab, size=(vocab, 4), p=p).tolist()
    free = rng.choice(vocab, size=n_tokens, p=p).tolist()
    follow = (rng.random(n_tokens) < 0.6).tolist()
    which = rng.choice(4, size=n_tokens, p=[0.5, 0.25, 0.15, 0.1]).tolist()
    out = free[:1]
    for i in range(1, n_tokens):  # sequential: each word depends on the one before
        out.append(succ[out[-1]][which[i]] if follow[i] else free[i])
    return np.asarray(out, dtype=np.int64)


@dataclasses.dataclass(frozen=True)
class WordLMConfig:
    """examples/word_language_model's defaults (LSTM): emsize 200, nhid 200, 2 layers, dropout
    0.2, bptt 35, batch 20, clip 0.25, lr 20; a 10,000-word vocabulary."""

    vocab: int = 10_000
    emsize: int = 200
    nhid: int = 200
    nlayers: int = 2
    dropout: float = 0.2
    tied: bool = False
    bptt: int = 35
    batch_size: int = 20
    eval_batch_size: int = 10
    clip: float = 0.25
    lr: float = 20.0
    valid_batches: int = 20  # bptt-long batches of the validation text


def _batchify(data: Any, bsz: int) -> Any:
    """The example's batchify: [steps, bsz], each column a contiguous stretch of the text."""
    n = data.size(0) // bsz
    return data[: n * bsz].view(bsz, -1).t().contiguous()


def run_word_lm(
    rounds: int = 10, chunk: int = 20, warmup: int = 5, busy_n: int = 0,
    cfg: WordLMConfig | None = None, seed: int = 0, tune: str | None = None, probe: bool = True,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Two word-level LMs with the same initial weights, one per side, trained on the same
    batches: first ``warmup`` untimed batches each (Numba compiles, lstmgrad measures), then
    ``rounds`` rounds of ``chunk`` timed batches per side (torch first in even rounds). A
    batch is the example's: detach the hidden state (repackage_hidden), zero_grad, forward,
    NLL loss, backward, clip_grad_norm_, p -= lr * grad. Reported: per side the median ms per
    batch, the per-round medians and mean losses, the first and last loss and the validation
    loss after training; the ratio is the median of the per-round ratios."""
    import torch

    cfg = cfg or WordLMConfig()
    say = progress or (lambda _: None)
    n_batches = warmup + rounds * chunk
    n_train = cfg.batch_size * (n_batches * cfg.bptt + 1)
    n_valid = cfg.eval_batch_size * (cfg.valid_batches * cfg.bptt + 1)
    text = torch.from_numpy(corpus(n_train + n_valid, cfg.vocab, seed))
    train = _batchify(text[:n_train], cfg.batch_size)
    valid = _batchify(text[n_train:], cfg.eval_batch_size)
    WordLM = _models()[1]
    torch.manual_seed(seed)
    args = (cfg.vocab, cfg.emsize, cfg.nhid, cfg.nlayers, cfg.dropout, cfg.tied)
    models = {side: WordLM(cls, *args) for side, cls in _lstm_classes().items()}
    models["lstmgrad"].load_state_dict(models["torch"].state_dict())  # identical weights
    hidden: dict[str, Any] = {side: None for side in SIDES}
    criterion = torch.nn.NLLLoss()

    def step(side: str, i: int) -> float:
        """Batch ``i`` (rows i*bptt ...) of one side, as the example's train() does it."""
        model = models[side]
        data = train[i * cfg.bptt : (i + 1) * cfg.bptt]
        target = train[i * cfg.bptt + 1 : (i + 1) * cfg.bptt + 1].reshape(-1)
        h = hidden[side]
        h = None if h is None else tuple(t.detach() for t in h)  # repackage_hidden
        model.zero_grad()
        output, hidden[side] = model(data, h)
        loss = criterion(output, target)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(p.grad, alpha=-cfg.lr)
        return loss.item()

    with _tune_env(tune):
        doc: dict[str, Any] = {"workload": "word_lm", "meta": meta(busy_n, probe)}
        doc["config"] = {**dataclasses.asdict(cfg), "rounds": rounds, "chunk": chunk,
                         "warmup": warmup, "seed": seed, "train_tokens": n_train,
                         "valid_tokens": n_valid}  # fmt: skip
        sides: dict[str, dict[str, Any]] = {
            side: {"loss_first": None, "ms_round": [], "loss_round": [], "ms_batch": []}
            for side in SIDES
        }
        with busy(busy_n):
            t0, m0 = time.perf_counter(), _measured_s()
            for side in SIDES:
                with _warmup_context(tune):
                    for i in range(warmup):
                        loss = step(side, i)
                        sides[side]["loss_first"] = sides[side]["loss_first"] or loss
            doc["warmup_s"] = round(time.perf_counter() - t0, 2)
            doc["measured_s"] = round(_measured_s() - m0, 2)
            other = _OtherCores()
            for r in range(rounds):
                for side in SIDES if r % 2 == 0 else SIDES[::-1]:
                    times, losses = [], []
                    for i in range(warmup + r * chunk, warmup + (r + 1) * chunk):
                        t1 = time.perf_counter()
                        losses.append(step(side, i))
                        times.append(1e3 * (time.perf_counter() - t1))
                        sides[side]["loss_first"] = sides[side]["loss_first"] or losses[0]
                    sides[side]["ms_batch"] += times
                    sides[side]["ms_round"].append(statistics.median(times))
                    sides[side]["loss_round"].append(statistics.fmean(losses))
                    time.sleep(PAUSE_S)
                say(f"round {r + 1}/{rounds}: ms/batch torch {sides['torch']['ms_round'][-1]:.1f}"
                    f", lstmgrad {sides['lstmgrad']['ms_round'][-1]:.1f}; loss torch "
                    f"{sides['torch']['loss_round'][-1]:.3f}, lstmgrad "
                    f"{sides['lstmgrad']['loss_round'][-1]:.3f}")  # fmt: skip
            doc["other_cores"] = other.stop()
        for side in SIDES:
            sd = sides[side]
            sd["ms"] = statistics.median(sd["ms_batch"])
            sd["loss_last"] = sd["loss_round"][-1]
            sd["valid_loss"] = _valid_loss(models[side], valid, cfg, criterion)
        doc["sides"] = sides
        doc["summary"] = _pair(sides["torch"]["ms_round"], sides["lstmgrad"]["ms_round"])
    return finish(doc)


def _valid_loss(model: Any, valid: Any, cfg: WordLMConfig, criterion: Any) -> float:
    """The example's evaluate(): mean NLL over the validation text, eval mode, no_grad."""
    import torch

    model.eval()
    total, count, hidden = 0.0, 0, None
    with torch.no_grad():
        for i in range(0, valid.size(0) - 1, cfg.bptt):
            n = min(cfg.bptt, valid.size(0) - 1 - i)
            output, hidden = model(valid[i : i + n], hidden)
            total += n * criterion(output, valid[i + 1 : i + 1 + n].reshape(-1)).item()
            count += n
    model.train()
    return total / max(count, 1)


def format_word_lm(doc: dict[str, Any]) -> str:
    """ms per batch and losses of both sides, the ratio."""
    sm, sd = doc["summary"], doc["sides"]
    rows = [
        [side, _ms(sd[side]["ms"]), f"{sd[side]['loss_first']:.3f}",
         f"{sd[side]['loss_last']:.3f}", f"{sd[side]['valid_loss']:.3f}"]
        for side in ("lstmgrad", "torch")
    ]  # fmt: skip
    head = ["side", "ms/batch", "loss first", "loss last round", "valid loss"]
    return (
        _table(head, rows) + f"\nratio torch / lstmgrad {sm['ratio']:.2f}x (rounds "
        f"{sm['ratio_min']:.2f}-{sm['ratio_max']:.2f}x, {len(sm['ratio_round'])} rounds of "
        f"{doc['config']['chunk']} batches)"
    )


# --------------------------------------------------------------------------------------------
# the packed sequence tagger


def sentences(n: int, seed: int) -> list[tuple[list[list[int]], list[int]]]:
    """``n`` generated sentences: words as character ids (lengths 1-15) and a tag per word."""
    import torch

    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        length = int(torch.randint(3, 40, (1,), generator=g))
        words = [torch.randint(1, 60, (int(torch.randint(1, 16, (1,), generator=g)),),
                               generator=g).tolist() for _ in range(length)]  # fmt: skip
        out.append((words, [w[0] % 9 for w in words]))
    return out


def tagger_train(
    impl: str, epochs: int = 2, n_sentences: int = 640, batch: int = 32,
    progress: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Trains the tagger with ``impl``'s LSTM ("torch" or "lstmgrad") in this process for
    ``epochs`` epochs of sentence batches sorted by length (as taggers bucket them); per
    epoch its seconds, median ms per batch and last loss (``progress`` gets each), and the
    lstmgrad plan classes stored before and after."""
    import torch

    lstm = _lstm_classes()[impl] if impl == "lstmgrad" else torch.nn.LSTM
    Tagger = _models()[2]
    torch.manual_seed(0)
    model = Tagger(lstm)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    data = sentences(n_sentences, seed=1)
    data.sort(key=lambda s: len(s[0]))
    batches = [data[i : i + batch] for i in range(0, len(data), batch)]
    before = stored_classes() if impl == "lstmgrad" else 0
    epochs_out = []
    for _ in range(epochs):
        times = []
        start = time.perf_counter()
        for b in batches:
            t0 = time.perf_counter()
            opt.zero_grad()
            loss = model(b)
            loss.backward()
            opt.step()
            times.append(time.perf_counter() - t0)
        epochs_out.append({"seconds": time.perf_counter() - start,
                           "median_ms": 1e3 * statistics.median(times), "loss": loss.item()})  # fmt: skip
        if progress:
            progress(epochs_out[-1])
    after = stored_classes() if impl == "lstmgrad" else 0
    return {"impl": impl, "batches": len(batches), "epochs": epochs_out,
            "stored_classes": {"before": before, "after": after},
            "torch_threads": torch.get_num_threads()}  # fmt: skip


# the child of tagger_subprocess: times its imports, trains, prints its record as the last line
_TAGGER_CHILD = """\
import importlib, json, sys, time
t0 = time.perf_counter()
a = json.loads(sys.argv[1])
w = importlib.import_module(a["module"])
if a["impl"] == "lstmgrad":
    w._lstm_classes()
else:
    import torch
import_s = time.perf_counter() - t0
rec = w.tagger_train(a["impl"], a["epochs"], a["sentences"], a["batch"])
print(json.dumps({**rec, "import_s": import_s}))
"""


def tagger_subprocess(
    impl: str, cache_dir: str | Path, epochs: int = 2, n_sentences: int = 640, batch: int = 32,
    numba_cache_dir: str | Path | None = None, timeout: float | None = None,
) -> dict[str, Any]:  # fmt: skip
    """:func:`tagger_train` of one side in a fresh Python process whose LSTMGRAD_CACHE_DIR is
    ``cache_dir`` (and NUMBA_CACHE_DIR ``numba_cache_dir`` if given: Numba's compiled kernels,
    which otherwise stay in the package's __pycache__); its record plus ``wall_s`` (the
    process's whole life, imports included) and ``import_s`` (torch and the side's LSTM).
    Raises RuntimeError if the process fails."""
    env = {**os.environ, "LSTMGRAD_CACHE_DIR": str(cache_dir)}
    if numba_cache_dir is not None:
        env["NUMBA_CACHE_DIR"] = str(numba_cache_dir)
    # the child imports this lstmgrad and this module
    src = str(Path(str(importlib.import_module("lstmgrad").__file__)).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    args = {"impl": impl, "epochs": epochs, "sentences": n_sentences, "batch": batch,
            "module": __name__}  # fmt: skip
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", _TAGGER_CHILD, json.dumps(args)], env=env,
                          capture_output=True, text=True, timeout=timeout)  # fmt: skip
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{impl} tagger process failed ({proc.returncode}):\n"
                           f"{proc.stderr[-2000:]}")  # fmt: skip
    return {**json.loads(proc.stdout.strip().splitlines()[-1]), "wall_s": wall}


def run_tagger(
    epochs: int = 2, runs: int = 2, busy_n: int = 0, n_sentences: int = 640, batch: int = 32,
    cache_dir: str | Path | None = None, fresh_numba: bool = True, probe: bool = True,
    timeout: float | None = None, progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """The tagger on both sides, each run a fresh process per side (:func:`tagger_subprocess`):
    run 1 is a first run, with an empty LSTMGRAD_CACHE_DIR (``cache_dir``, default a new
    temporary folder) and, with ``fresh_numba``, an empty NUMBA_CACHE_DIR beside it (as after
    an install: Numba compiles the kernels); runs 2 and on reuse both (what the earlier
    processes stored). Sides alternate: torch first in odd-numbered runs; the torch processes
    get the same environment. Per run and epoch both sides' seconds and the ratio."""
    say = progress or (lambda _: None)
    doc: dict[str, Any] = {"workload": "packed_tagger", "meta": meta(busy_n, probe)}
    root = Path(tempfile.mkdtemp(prefix="lstmgrad-tagger-"))
    cache = root / "lstmgrad" if cache_dir is None else Path(cache_dir)
    numba_cache = root / "numba" if fresh_numba else None
    was_empty = not cache.exists() or not any(cache.iterdir())
    doc["config"] = {"epochs": epochs, "runs": runs, "sentences": n_sentences, "batch": batch,
                     "cache_dir": str(cache), "cache_was_empty": was_empty,
                     "numba_cache_dir": str(numba_cache) if numba_cache else None}  # fmt: skip
    doc["runs"] = []
    try:
        with busy(busy_n):
            other = _OtherCores()
            for r in range(runs):
                rec: dict[str, Any] = {"run": r + 1}
                for side in SIDES if r % 2 == 0 else SIDES[::-1]:
                    rec[side] = tagger_subprocess(side, cache, epochs, n_sentences, batch,
                                                  numba_cache, timeout)  # fmt: skip
                    e = rec[side]["epochs"]
                    say(f"run {r + 1} {side}: epochs " + ", ".join(f"{x['seconds']:.2f}" for x in e)
                        + f" s, process {rec[side]['wall_s']:.1f} s")  # fmt: skip
                rec["ratio_epoch"] = [
                    a["seconds"] / b["seconds"]
                    for a, b in zip(rec["torch"]["epochs"], rec["lstmgrad"]["epochs"], strict=True)
                ]
                rec["ratio_wall"] = rec["torch"]["wall_s"] / rec["lstmgrad"]["wall_s"]
                doc["runs"].append(rec)
            doc["other_cores"] = other.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)  # the caller's cache_dir stays
    return finish(doc)


def format_tagger(doc: dict[str, Any]) -> str:
    """Per run and epoch: lstmgrad s, torch s, ratio; then each process's wall time."""
    rows = []
    for rec in doc["runs"]:
        for k, ratio in enumerate(rec["ratio_epoch"]):
            rows.append([f"run {rec['run']} epoch {k + 1}",
                         f"{rec['lstmgrad']['epochs'][k]['seconds']:.2f}",
                         f"{rec['torch']['epochs'][k]['seconds']:.2f}", f"{ratio:.2f}x"])  # fmt: skip
        rows.append([f"run {rec['run']} process", f"{rec['lstmgrad']['wall_s']:.2f}",
                     f"{rec['torch']['wall_s']:.2f}", f"{rec['ratio_wall']:.2f}x"])  # fmt: skip
    return _table(["", "lstmgrad s", "torch s", "ratio"], rows)
