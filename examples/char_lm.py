"""Character-level language model on Python's own documentation, with either LSTM.

Trains Embedding -> LSTM -> Linear on next-character prediction over the text of
``pydoc_data.topics`` (shipped with CPython, so it runs offline), and records the per-step
training loss, the validation loss, the time of every training step and a sampled text.
``--impl`` selects ``torch.nn.LSTM`` or ``lstmgrad.nn.LSTM``; nothing else differs: both start
from the same weights and see the same batches, so their loss curves can be compared directly.

Example:
    python examples/char_lm.py --impl lstmgrad --steps 300
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import torch
from torch import Tensor, nn

IMPLS = ("torch", "lstmgrad")
WARMUP_STEPS = 5  # left out of the median: first-call allocations and Numba's JIT/cache load
VAL_FRACTION = 0.05
SAMPLE_CHARS = 200
SAMPLE_PROMPT = "The "
SAMPLE_TEMPERATURE = 0.8
DEFAULT_OUT = Path(__file__).resolve().parent / "out"  # examples/out, wherever it is run from
# A training step at the defaults (B 32, T 100, E 64, H 256, one layer) took a median 43-45 ms
# with either LSTM on 2 cores of an Intel Xeon: the base of the rough estimate printed at start.
REFERENCE_STEP_MS = 45.0
REFERENCE_MACS = 32 * 100 * 4 * 256 * (64 + 256)  # the LSTM's multiply-adds a step, forward


def load_text() -> str:
    """Return the pydoc topics text: the dict's values joined in sorted-key order."""
    from pydoc_data.topics import topics

    return "".join(topics[key] for key in sorted(topics))


class Vocab:
    """Maps characters to contiguous ids (sorted, so the mapping is the same in every run)."""

    def __init__(self, text: str) -> None:
        self.chars = sorted(set(text))
        self.index = {ch: i for i, ch in enumerate(self.chars)}

    def __len__(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> Tensor:
        return torch.tensor([self.index[ch] for ch in text], dtype=torch.long)

    def decode(self, ids: list[int]) -> str:
        return "".join(self.chars[i] for i in ids)


class _Help(argparse.ArgumentDefaultsHelpFormatter):
    """Appends "(default: X)" to an option's help unless the help states its default itself."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        return text if "default" in text else super()._get_help_string(action)


class CharLM(nn.Module):
    """Embedding -> LSTM (batch_first) -> Linear over the vocabulary."""

    def __init__(
        self, lstm_cls: type[nn.LSTM], vocab: int, embed: int, hidden: int, layers: int
    ) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, embed)
        self.lstm = lstm_cls(embed, hidden, num_layers=layers, batch_first=True)
        self.head = nn.Linear(hidden, vocab)

    def forward(
        self, ids: Tensor, state: tuple[Tensor, Tensor] | None = None
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """Return logits [B, T, vocab] and the final (h, c) for ids [B, T]."""
        out, state = self.lstm(self.embed(ids), state)
        return self.head(out), state


def lstm_class(impl: str) -> type[nn.LSTM]:
    """Return the LSTM module class for ``impl``."""
    if impl == "torch":
        return nn.LSTM
    if impl == "lstmgrad":
        # Imported only here so that the torch run never loads lstmgrad (or Numba).
        from lstmgrad.nn import LSTM

        return LSTM
    raise ValueError(f"unknown --impl {impl!r}; expected one of {', '.join(IMPLS)}")


class BatchSampler:
    """Random windows of the training text, from a seeded generator of their own.

    The model's initialisation uses torch's global RNG; the windows come from a separate
    NumPy generator, so both impls see exactly the same batches whatever torch draws.
    """

    def __init__(self, data: Tensor, batch: int, seq_len: int, seed: int) -> None:
        if data.numel() < seq_len + 2:
            raise ValueError(
                f"training text has {data.numel()} characters, too few for --seq-len {seq_len}"
            )
        self.data = data
        self.batch = batch
        self.seq_len = seq_len
        self.rng = np.random.default_rng(seed)
        self.offsets = torch.arange(seq_len + 1)

    def next(self) -> tuple[Tensor, Tensor]:
        """Return (inputs, targets), both [batch, seq_len]; targets are inputs shifted by one."""
        starts = self.rng.integers(0, self.data.numel() - self.seq_len - 1, size=self.batch)
        windows = self.data[torch.from_numpy(starts).unsqueeze(1) + self.offsets]
        return windows[:, :-1], windows[:, 1:]


def val_windows(data: Tensor, seq_len: int) -> tuple[Tensor, Tensor]:
    """Split the validation text into non-overlapping windows: (inputs, targets), [N, seq_len]."""
    n = (data.numel() - 1) // seq_len
    if n == 0:
        raise ValueError(
            f"validation text has {data.numel()} characters, too few for --seq-len {seq_len}"
        )
    used = data[: n * seq_len + 1]
    return used[:-1].view(n, seq_len), used[1:].view(n, seq_len)


@torch.no_grad()
def evaluate(model: CharLM, inputs: Tensor, targets: Tensor, batch: int) -> float:
    """Return the mean per-character cross-entropy over all validation windows."""
    model.eval()
    total = 0.0
    for i in range(0, inputs.shape[0], batch):
        logits, _ = model(inputs[i : i + batch])
        total += nn.functional.cross_entropy(
            logits.flatten(0, 1), targets[i : i + batch].flatten(), reduction="sum"
        ).item()
    model.train()
    return total / targets.numel()


@torch.no_grad()
def sample(model: CharLM, vocab: Vocab, n: int, temperature: float, seed: int) -> str:
    """Return ``SAMPLE_PROMPT`` followed by ``n`` characters drawn from the model.

    The prompt is run once, then one character at a time with the (h, c) state carried over,
    which also exercises the LSTM's explicit-state path.
    """
    model.eval()
    gen = torch.Generator().manual_seed(seed)
    ids = vocab.encode(SAMPLE_PROMPT).unsqueeze(0)
    logits, state = model(ids)
    out: list[int] = []
    for _ in range(n):
        probs = torch.softmax(logits[0, -1] / temperature, dim=-1)
        nxt = int(torch.multinomial(probs, 1, generator=gen))
        out.append(nxt)
        logits, state = model(torch.tensor([[nxt]]), state)
    model.train()
    return SAMPLE_PROMPT + vocab.decode(out)


_CLEAR_LINE = "\r\033[K"  # back to column 0, erase to the end of the line


class Progress:
    """A progress line on a stream: in place with ``\\r`` on a terminal, plain lines otherwise.

    On a terminal it is redrawn at most every 0.1 s; elsewhere (a log file, a pipe from
    compare.py) one line is written about every 10% so the log stays short.
    """

    def __init__(self, total: int, label: str, stream: TextIO = sys.stderr) -> None:
        self.total = total
        self.label = label
        self.stream = stream
        self.tty = stream.isatty()
        self.every = max(1, total // 10)
        self.start = time.perf_counter()
        self.last_draw = 0.0

    def update(self, step: int, loss: float, ms_per_step: float) -> None:
        """Report that ``step`` (1-based) of ``total`` is done."""
        now = time.perf_counter()
        final = step == self.total
        if self.tty:
            if not final and now - self.last_draw < 0.1:
                return
        elif not final and step % self.every:
            return
        self.last_draw = now
        eta = (now - self.start) / step * (self.total - step)
        width = len(str(self.total))
        line = (
            f"{self.label} step {step:>{width}}/{self.total}  loss {loss:.4f}  "
            f"{ms_per_step:7.1f} ms/step  ETA {_clock(eta)}"
        )
        if self.tty:
            self.stream.write(_CLEAR_LINE + line + ("\n" if final else ""))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def message(self, text: str) -> None:
        """Write a line of its own (after the progress line on a terminal)."""
        self.stream.write((_CLEAR_LINE if self.tty else "") + text + "\n")
        self.stream.flush()


def rough_seconds(args: argparse.Namespace) -> float:
    """A rough training time for ``args`` on 2 idle cores: the reference step scaled by the
    LSTM's multiply-adds, which dominate the step (a busy machine takes several times longer)."""
    macs = sum(
        args.batch * args.seq_len * 4 * args.hidden * ((args.embed if k == 0 else args.hidden) + args.hidden)
        for k in range(args.layers)
    )  # fmt: skip
    return args.steps * REFERENCE_STEP_MS * max(macs / REFERENCE_MACS, 0.05) / 1e3


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(round(seconds)), 60)
    return f"{minutes:d}:{secs:02d}"


def plot(result: dict[str, Any], path: Path) -> None:
    """Draw the training-loss curve and the validation points to ``path`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    steps = range(1, len(result["train_losses"]) + 1)
    ax.plot(steps, result["train_losses"], lw=1, label="train")
    ax.plot(
        [e["step"] for e in result["eval"]],
        [e["loss"] for e in result["eval"]],
        "o-",
        ms=4,
        label="validation",
    )
    cfg = result["config"]
    ax.set_title(
        f"char LM, {result['lstm_class']}: H={cfg['hidden']} L={cfg['layers']} "
        f"B={cfg['batch']} T={cfg['seq_len']}, {result['median_ms_per_step']:.1f} ms/step"
    )
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats/char)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Train a character-level LSTM language model on pydoc_data.topics. At the "
        "defaults a run takes under a minute on 2 idle cores (a step about 45 ms); it prints a "
        "rough estimate at start and progress with an ETA as it trains.",
        formatter_class=_Help,
    )
    p.add_argument("--impl", choices=IMPLS, default="torch", help="LSTM implementation")
    p.add_argument("--steps", type=int, default=300, help="training steps")
    p.add_argument("--batch", type=int, default=32, help="windows per batch")
    p.add_argument("--seq-len", type=int, default=100, help="characters per window")
    p.add_argument("--hidden", type=int, default=256, help="LSTM hidden size")
    p.add_argument("--layers", type=int, default=1, help="LSTM layers")
    p.add_argument("--embed", type=int, default=64, help="embedding size")
    p.add_argument("--lr", type=float, default=3e-3, help="Adam learning rate")
    p.add_argument("--seed", type=int, default=0, help="seed of the weights, batches and sample")
    p.add_argument("--eval-every", type=int, default=50, help="validate every N steps")
    p.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help="output directory (default: examples/out)"
    )
    p.add_argument(
        "--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)"
    )
    args = p.parse_args(argv)
    for name in ("steps", "batch", "seq_len", "hidden", "layers", "embed", "eval_every"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.threads is not None and args.threads < 1:
        p.error(f"--threads must be >= 1, got {args.threads}")
    return args


def main(argv: list[str] | None = None) -> int:
    """Train, evaluate, sample and write ``char_lm-<impl>.json`` and ``.png``; return 0."""
    args = parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    lstm_cls = lstm_class(args.impl)

    text = load_text()
    vocab = Vocab(text)
    data = vocab.encode(text)
    split = int(len(data) * (1 - VAL_FRACTION))
    sampler = BatchSampler(data[:split], args.batch, args.seq_len, args.seed)
    val_x, val_y = val_windows(data[split:], args.seq_len)

    torch.manual_seed(args.seed)
    model = CharLM(lstm_cls, len(vocab), args.embed, args.hidden, args.layers)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    model.train()

    label = f"[{args.impl}]"
    progress = Progress(args.steps, label)
    progress.message(
        f"{label} {len(text):,} chars (vocab {len(vocab)}), train {split:,} / val "
        f"{len(data) - split:,}; {sum(p.numel() for p in model.parameters()):,} parameters, "
        f"threads: {torch.get_num_threads()}"
    )
    progress.message(
        f"{label} {args.steps} steps of {args.batch} x {args.seq_len} characters, validation "
        f"every {args.eval_every}: roughly {_clock(rough_seconds(args))} of training on 2 idle "
        "cores, longer on a busy machine; progress lines give this run's own estimate (ETA)"
    )

    train_losses: list[float] = []
    step_ms: list[float] = []
    evals: list[dict[str, float]] = []
    wall = time.perf_counter()
    for step in range(1, args.steps + 1):
        inputs, targets = sampler.next()
        t0 = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        logits, _ = model(inputs)
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        step_ms.append((time.perf_counter() - t0) * 1e3)
        train_losses.append(loss.item())
        if not math.isfinite(train_losses[-1]):
            progress.message(f"{label} loss is {train_losses[-1]} at step {step}; stopping")
            return 1
        progress.update(step, train_losses[-1], statistics.fmean(step_ms[-10:]))
        if step % args.eval_every == 0 or step == args.steps:
            val = evaluate(model, val_x, val_y, args.batch)
            evals.append({"step": step, "loss": val})
            progress.message(f"{label} step {step}: val loss {val:.4f}")
    wall = time.perf_counter() - wall

    # A run this short has no steady state to time apart; then every step counts.
    warmup = WARMUP_STEPS if len(step_ms) > WARMUP_STEPS else 0
    timed = step_ms[warmup:]
    text_sample = sample(model, vocab, SAMPLE_CHARS, SAMPLE_TEMPERATURE, args.seed)
    result: dict[str, Any] = {
        "impl": args.impl,
        "lstm_class": f"{lstm_cls.__module__}.{lstm_cls.__qualname__}",
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "data": {
            "source": "pydoc_data.topics",
            "chars": len(text),
            "vocab": len(vocab),
            "train_chars": split,
            "val_chars": len(data) - split,
            "val_windows": val_x.shape[0],
        },
        "parameters": sum(p.numel() for p in model.parameters()),
        "train_losses": train_losses,
        "eval": evals,
        "step_ms": step_ms,
        "warmup_steps": warmup,
        "median_ms_per_step": statistics.median(timed),
        "mean_ms_per_step": statistics.fmean(timed),
        "wall_s": wall,
        "torch_version": torch.__version__,
        "threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "sample": {"temperature": SAMPLE_TEMPERATURE, "prompt": SAMPLE_PROMPT, "text": text_sample},
    }

    args.out.mkdir(parents=True, exist_ok=True)
    json_path = args.out / f"char_lm-{args.impl}.json"
    json_path.write_text(json.dumps(result, indent=1) + "\n")
    plot(result, args.out / f"char_lm-{args.impl}.png")
    progress.message(
        f"{label} median {result['median_ms_per_step']:.1f} ms/step, mean "
        f"{result['mean_ms_per_step']:.1f} (steps {warmup + 1}..{len(step_ms)}); "
        f"final train {train_losses[-1]:.4f}, val {evals[-1]['loss']:.4f}; wrote {json_path}"
    )
    progress.message(f"{label} sample: {text_sample!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
