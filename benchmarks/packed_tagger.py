"""A packed sequence-labelling workload: a word BiLSTM over sentences and a character BiLSTM over
their words, both on PackedSequences whose batch sizes and lengths change from batch to batch
(the structure of a CoNLL-style NER tagger). Trains a few epochs on generated sentences and
prints ms per batch; run it twice with an empty plan cache to see what a first run costs.

    python benchmarks/packed_tagger.py --impl lstmgrad [--epochs 2] [--json PATH]

The first epoch includes what the process measures (plans for new classes of shapes); the
table gives every epoch's time and the lstmgrad plan classes stored before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence


def sentences(n: int, seed: int) -> list[tuple[list[list[int]], list[int]]]:
    """``n`` generated sentences: words as character ids (lengths 1-15) and a tag per word."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        length = int(torch.randint(3, 40, (1,), generator=g))
        words = [torch.randint(1, 60, (int(torch.randint(1, 16, (1,), generator=g)),),
                               generator=g).tolist() for _ in range(length)]  # fmt: skip
        out.append((words, [w[0] % 9 for w in words]))
    return out


class Tagger(torch.nn.Module):
    """Character BiLSTM per word, concatenated with a word embedding, then a word BiLSTM."""

    def __init__(self, lstm: type[torch.nn.LSTM]) -> None:
        super().__init__()
        self.chars = torch.nn.Embedding(64, 25, padding_idx=0)
        self.char_lstm = lstm(25, 25, bidirectional=True, batch_first=True)
        self.words = torch.nn.Embedding(5000, 100)
        self.word_lstm = lstm(150, 100, bidirectional=True, batch_first=True)
        self.out = torch.nn.Linear(200, 9)

    def forward(self, batch: list[tuple[list[list[int]], list[int]]]) -> torch.Tensor:
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
        packed = pack_padded_sequence(padded, sent_len, batch_first=True, enforce_sorted=False)
        y, _ = pad_packed_sequence(self.word_lstm(packed)[0], batch_first=True)
        tags = torch.full((len(batch), int(sent_len.max())), -100)
        for i, (_, t) in enumerate(batch):
            tags[i, : len(t)] = torch.tensor(t)
        return torch.nn.functional.cross_entropy(self.out(y).flatten(0, 1), tags.flatten())


def stored_classes() -> int:
    """Classes of shapes in lstmgrad's plan store (0 without lstmgrad or a store)."""
    try:
        from lstmgrad import plan
    except ImportError:
        return 0
    return sum(len(v.get("entries", {})) for v in plan.show().values() if isinstance(v, dict))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--impl", choices=("torch", "lstmgrad"), default="lstmgrad")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--sentences", type=int, default=640)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--json", metavar="PATH")
    args = p.parse_args(argv)
    lstm: type[torch.nn.LSTM] = torch.nn.LSTM
    if args.impl == "lstmgrad":
        import lstmgrad.nn

        lstm = lstmgrad.nn.LSTM
    torch.manual_seed(0)
    model = Tagger(lstm)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    data = sentences(args.sentences, seed=1)
    data.sort(key=lambda s: len(s[0]))  # batches of similar lengths, as taggers bucket them
    batches = [data[i : i + args.batch] for i in range(0, len(data), args.batch)]
    before = stored_classes()
    epochs = []
    for epoch in range(args.epochs):
        times = []
        start = time.perf_counter()
        for batch in batches:
            t0 = time.perf_counter()
            opt.zero_grad()
            loss = model(batch)
            loss.backward()
            opt.step()
            times.append(time.perf_counter() - t0)
        epochs.append({"seconds": time.perf_counter() - start,
                       "median_ms": 1e3 * statistics.median(times), "loss": loss.item()})  # fmt: skip
        print(f"[{args.impl}] epoch {epoch + 1}: {epochs[-1]['seconds']:.2f} s, median "
              f"{epochs[-1]['median_ms']:.1f} ms/batch, loss {epochs[-1]['loss']:.4f}",
              flush=True)  # fmt: skip
    doc: dict[str, Any] = {
        "impl": args.impl, "cpu": platform.processor() or platform.machine(),
        "load": os.getloadavg(), "batches": len(batches), "epochs": epochs,
        "stored_classes": {"before": before, "after": stored_classes()},
        "torch_threads": torch.get_num_threads(), "argv": sys.argv[1:],
    }  # fmt: skip
    print(f"[{args.impl}] plan classes stored: {before} before, {doc['stored_classes']['after']} "
          "after")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
