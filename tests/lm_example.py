"""A small word-level language model in the shape of PyTorch's word_language_model example
(github.com/pytorch/examples, word_language_model/), written anew for tests/test_adopt.py: its
model (embedding, LSTM, linear decoder, ``init_hidden``), its training step, its whole-model
``torch.save(model, f)``, its load under ``torch.serialization.safe_globals`` (weights_only, the
default) followed by ``flatten_parameters``, and its sampling loop from generate.py.

torch only, so that a process without lstmgrad imports it; lm_example_adopted.py is this
model module as a user adopts lstmgrad in the example's model.py.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

# the classes the example's loaders name (generate.py adds the Transformer's), lstmgrad's not
TORCH_CLASSES = [
    torch.nn.modules.dropout.Dropout,
    torch.nn.modules.linear.Linear,
    torch.nn.modules.rnn.GRU,
    torch.nn.modules.rnn.LSTM,
    torch.nn.modules.rnn.RNN,
    torch.nn.modules.sparse.Embedding,
]


class RNNModel(torch.nn.Module):
    """Embedding -> dropout -> LSTM -> dropout -> Linear -> log_softmax, over [T, B] tokens."""

    def __init__(self, ntoken: int, ninp: int, nhid: int, nlayers: int, dropout: float) -> None:
        super().__init__()
        self.ntoken, self.nhid, self.nlayers = ntoken, nhid, nlayers
        self.drop = torch.nn.Dropout(dropout)
        self.encoder = torch.nn.Embedding(ntoken, ninp)
        self.rnn = torch.nn.LSTM(ninp, nhid, nlayers, dropout=dropout)
        self.decoder = torch.nn.Linear(nhid, ntoken)

    def forward(
        self, input: Tensor, hidden: tuple[Tensor, Tensor]
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        emb = self.drop(self.encoder(input))
        output, hidden = self.rnn(emb, hidden)
        decoded = self.decoder(self.drop(output)).view(-1, self.ntoken)
        return F.log_softmax(decoded, dim=1), hidden

    def init_hidden(self, bsz: int) -> tuple[Tensor, Tensor]:
        weight = next(self.parameters())
        shape = (self.nlayers, bsz, self.nhid)
        return weight.new_zeros(shape), weight.new_zeros(shape)


def train(model: RNNModel, steps: int, lr: float = 0.5) -> None:
    """The example's training steps: truncated BPTT over a fixed token stream, gradient
    clipping, a plain SGD update of ``p.data``."""
    g = torch.Generator().manual_seed(5)
    data = torch.randint(model.ntoken, (steps * 6 + 1, 3), generator=g)  # [T, B]
    model.train()
    hidden = model.init_hidden(3)
    for i in range(0, steps * 6, 6):
        x, target = data[i : i + 6], data[i + 1 : i + 7].reshape(-1)
        hidden = (hidden[0].detach(), hidden[1].detach())
        model.zero_grad()
        output, hidden = model(x, hidden)
        F.nll_loss(output, target).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-lr)


def save(model: torch.nn.Module, path: str) -> None:
    """The example's checkpoint: the whole model pickled."""
    with open(path, "wb") as f:
        torch.save(model, f)


def load(path: str, model_class: type) -> torch.nn.Module:
    """The example's load: weights_only (torch.load's default) with its list of classes."""
    with open(path, "rb") as f, torch.serialization.safe_globals([model_class, *TORCH_CLASSES]):
        model = torch.load(f, map_location="cpu")
    model.rnn.flatten_parameters()
    return model


def generate(model: RNNModel, words: int, seed: int) -> tuple[list[int], Tensor]:
    """generate.py's loop: the sampled token ids and each step's log-probabilities [words, V]."""
    torch.manual_seed(seed)
    model.eval()
    hidden = model.init_hidden(1)
    input = torch.randint(model.ntoken, (1, 1), dtype=torch.long)
    tokens, outputs = [], []
    with torch.no_grad():
        for _ in range(words):
            output, hidden = model(input, hidden)
            word_weights = output.squeeze().div(1.0).exp()
            word_idx = torch.multinomial(word_weights, 1)[0]
            input.fill_(word_idx)
            tokens.append(int(word_idx))
            outputs.append(output.squeeze())
    return tokens, torch.stack(outputs)
