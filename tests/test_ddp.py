"""lstmgrad.nn.LSTM under DistributedDataParallel (gloo, 2 processes on localhost): each step's
gradients and the trained weights equal single-process training on the whole batch."""

from __future__ import annotations

import socket

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from lstmgrad.nn import LSTM  # noqa: E402

WORLD, STEPS, BATCH = 2, 3, 6
pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed unavailable")


class Tagger(torch.nn.Module):
    """LSTM + linear head over variable-length sequences (unsorted PackedSequence)."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = LSTM(5, 7, num_layers=2, bidirectional=True, batch_first=True)
        self.head = torch.nn.Linear(14, 3)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        packed = torch.nn.utils.rnn.pack_padded_sequence(
            x, lengths, batch_first=True, enforce_sorted=False
        )
        y, _ = self.lstm(packed)
        return self.head(y.data)


def batch():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(BATCH, 6, 5, generator=g, dtype=torch.float64)
    lengths = torch.tensor([6, 2, 5, 3, 1, 4])
    return x, lengths


def train(model, x, lengths, loss_scale):
    """SGD steps; returns every step's gradients (flattened per parameter) and the weights."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    grads = []
    for _ in range(STEPS):
        opt.zero_grad()
        out = model(x, lengths)
        loss = (out**2).sum() * loss_scale
        loss.backward()
        grads.append([p.grad.detach().clone() for p in model.parameters()])
        opt.step()
    return grads, [p.detach().clone() for p in model.parameters()]


def _leave_together(store: dist.Store, rank: int) -> None:
    """Both ranks done before either tears its process group down, met in the store rather than
    in a last gloo collective: a gloo worker thread may destroy that collective's work item while
    the interpreter already finalises, which aborts the rank (a race in PyTorch's gloo)."""
    if store.add("done", 1) == WORLD:
        store.set("all done", "1")
    store.wait(["all done"])
    if rank:
        store.set(f"left {rank}", "1")
    else:  # rank 0 serves the store: it leaves last
        store.wait([f"left {r}" for r in range(1, WORLD)])


def _worker(rank: int, port: int, out_path: str) -> None:
    store = dist.TCPStore("127.0.0.1", port, WORLD, is_master=rank == 0)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=WORLD)
    try:
        torch.manual_seed(0)
        model = torch.nn.parallel.DistributedDataParallel(Tagger().double())
        x, lengths = batch()
        shard = slice(rank * BATCH // WORLD, (rank + 1) * BATCH // WORLD)
        # DDP averages gradients over ranks: scale so the sum over the whole batch is recovered
        grads, weights = train(model, x[shard], lengths[shard], 1.0 * WORLD / BATCH)
        if rank == 0:
            torch.save({"grads": grads, "weights": weights}, out_path)
        _leave_together(store, rank)
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ddp_matches_single_process(tmp_path):
    out_path = str(tmp_path / "ddp.pt")
    mp.spawn(_worker, args=(_free_port(), out_path), nprocs=WORLD, join=True)
    got = torch.load(out_path)

    torch.manual_seed(0)
    model = Tagger().double()
    x, lengths = batch()
    grads, weights = train(model, x, lengths, 1.0 / BATCH)
    for step in range(STEPS):
        for a, b in zip(got["grads"][step], grads[step], strict=True):
            assert torch.allclose(a, b, rtol=1e-10, atol=1e-12), step
    for a, b in zip(got["weights"], weights, strict=True):
        assert torch.allclose(a, b, rtol=1e-10, atol=1e-12)
    # the check has teeth: the gradients are not all zero and the weights moved
    assert any(g.abs().max() > 1e-3 for g in grads[0])
