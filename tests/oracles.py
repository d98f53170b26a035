"""Oracles shared by the tests: PyTorch autograd of ``torch.nn.LSTM`` in float64.

Conventions of ``lstmgrad`` reproduced here (docs/contract.md):

- params: PyTorch ``_flat_weights`` order.
- dense: input/dy/dx/output [T, B, *] ([B, T, *] with batch_first); hx/dh/dc [L*D, B, H].
- variable lengths: input padded, time-major, flattened [T*B, I] (row t*B + b), dy/output
  [T*B, D*H], dx [T*B, I], batch_sizes int64 [T] (PyTorch's ``PackedSequence.batch_sizes``;
  the padded batch is sorted by decreasing length).
- loss = sum(output * dy) + sum(h_n * dh) + sum(c_n * dc).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

TINY = np.finfo(np.float64).tiny


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    """max|a - b| / max(max|b|, tiny), in float64 (0 for empty arrays)."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    if a.size == 0:
        return 0.0
    return float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(b))), TINY))


def make_lstm(
    input_size: int,
    hidden_size: int,
    num_layers: int = 1,
    *,
    bias: bool = True,
    bidirectional: bool = False,
    batch_first: bool = False,
    seed: int = 0,
    scale: float = 0.5,
) -> tuple[torch.nn.LSTM, list[np.ndarray]]:
    """A float64 ``torch.nn.LSTM`` with weights uniform in [-scale, scale] (NumPy seed) and its
    params, ``[p.detach().numpy().copy() for p in lstm._flat_weights]``."""
    lstm = torch.nn.LSTM(
        input_size,
        hidden_size,
        num_layers=num_layers,
        bias=bias,
        batch_first=batch_first,
        bidirectional=bidirectional,
        dtype=torch.float64,
    )
    rng = np.random.default_rng(seed)
    with torch.no_grad():
        for w in lstm._flat_weights:
            w.copy_(torch.from_numpy(rng.uniform(-scale, scale, tuple(w.shape))))
    params = [p.detach().numpy().copy() for p in lstm._flat_weights]
    return lstm, params


def load_params(lstm: torch.nn.LSTM, params: list[np.ndarray]) -> None:
    """Copy ``params`` (flat order) into ``lstm``."""
    assert len(params) == len(lstm._flat_weights)
    with torch.no_grad():
        for w, p in zip(lstm._flat_weights, params, strict=True):
            w.copy_(torch.from_numpy(np.asarray(p, dtype=np.float64)))


def sorted_lengths(steps: int, batch: int, rng: np.random.Generator) -> np.ndarray:
    """Lengths in [1, T], non-increasing; the first is T and, when B >= 2, the last is 1."""
    if batch == 0:
        return np.zeros(0, dtype=np.int64)
    lengths = rng.integers(1, steps + 1, size=batch)
    lengths[0] = steps
    if batch >= 2:
        lengths[-1] = 1
    return np.sort(lengths)[::-1].astype(np.int64).copy()


def batch_sizes_of(lengths: np.ndarray) -> np.ndarray:
    """batch_sizes int64 [T] of sorted lengths, as PyTorch's PackedSequence computes them."""
    x = torch.zeros(int(max(lengths)), len(lengths), 1, dtype=torch.float64)
    packed = pack_padded_sequence(x, torch.as_tensor(lengths), enforce_sorted=True)
    return packed.batch_sizes.numpy().astype(np.int64)


@dataclass
class TorchResult:
    output: np.ndarray
    h_n: np.ndarray
    c_n: np.ndarray
    dx: np.ndarray
    dh0: np.ndarray
    dc0: np.ndarray
    dparams: list[np.ndarray]
    batch_sizes: np.ndarray | None = None


def _t(a: np.ndarray | None, grad: bool = False) -> torch.Tensor | None:
    if a is None:
        return None
    return torch.tensor(np.asarray(a, dtype=np.float64), requires_grad=grad)


def _zeros_if_none(g: torch.Tensor | None, like: torch.Tensor) -> np.ndarray:
    return np.zeros(tuple(like.shape)) if g is None else g.detach().numpy().copy()


def _loss(out, h_n, c_n, dy, dh, dc):
    loss = out.new_zeros(())
    if dy is not None:
        loss = loss + (out * dy).sum()
    if dh is not None:
        loss = loss + (h_n * dh).sum()
    if dc is not None:
        loss = loss + (c_n * dc).sum()
    return loss


def torch_lstm_grads(
    lstm: torch.nn.LSTM,
    x: np.ndarray,
    h0: np.ndarray,
    c0: np.ndarray,
    dy: np.ndarray | None,
    dh: np.ndarray | None,
    dc: np.ndarray | None,
    lengths: np.ndarray | None = None,
) -> TorchResult:
    """Autograd of ``lstm`` for the loss sum(y*dy) + sum(h_n*dh) + sum(c_n*dc).

    Dense (lengths None): x/dy in the module's layout ([B, T, *] if lstm.batch_first).
    Variable lengths: x [T*B, I] padded time-major (row t*B + b), dy [T*B, D*H], lengths
    sorted non-increasing (PackedSequence with enforce_sorted=True); the output/dx are
    returned in the same flat layout (zeros at padded rows) with packed.batch_sizes.
    """
    xt = _t(x, grad=True)
    h0t = _t(h0, grad=True)
    c0t = _t(c0, grad=True)
    batch_sizes = None
    if lengths is None:
        out, (h_n, c_n) = lstm(xt, (h0t, c0t))
        out_cmp = out
    else:
        batch = int(h0.shape[1])
        steps = int(x.shape[0]) // batch if batch else 0
        x3 = xt.reshape(steps, batch, x.shape[1])
        if lstm.batch_first:
            x3 = x3.transpose(0, 1)
        packed = pack_padded_sequence(
            x3, torch.as_tensor(lengths), batch_first=lstm.batch_first, enforce_sorted=True
        )
        batch_sizes = packed.batch_sizes.numpy().astype(np.int64)
        out_p, (h_n, c_n) = lstm(packed, (h0t, c0t))
        out, _ = pad_packed_sequence(out_p, batch_first=lstm.batch_first, total_length=steps)
        if lstm.batch_first:
            out = out.transpose(0, 1)
        out_cmp = out.reshape(steps * batch, out.shape[-1])
    loss = _loss(out_cmp, h_n, c_n, _t(dy), _t(dh), _t(dc))
    weights = list(lstm._flat_weights)
    grads = torch.autograd.grad(loss, [xt, h0t, c0t, *weights], allow_unused=True)
    return TorchResult(
        output=out_cmp.detach().numpy().copy(),
        h_n=h_n.detach().numpy().copy(),
        c_n=c_n.detach().numpy().copy(),
        dx=_zeros_if_none(grads[0], xt),
        dh0=_zeros_if_none(grads[1], h0t),
        dc0=_zeros_if_none(grads[2], c0t),
        dparams=[_zeros_if_none(g, w) for g, w in zip(grads[3:], weights, strict=True)],
        batch_sizes=batch_sizes,
    )


def torch_dropout_lstm_grads(
    params: list[np.ndarray],
    x: np.ndarray,
    h0: np.ndarray,
    c0: np.ndarray,
    dy: np.ndarray | None,
    dh: np.ndarray | None,
    dc: np.ndarray | None,
    masks: list[np.ndarray],
    *,
    num_layers: int,
    bidirectional: bool,
    has_bias: bool,
    batch_first: bool = False,
) -> TorchResult:
    """A multi-layer LSTM run layer by layer (one-layer torch modules sharing ``params``), the
    input of layer l > 0 multiplied by masks[l-1] (time-major [T, B, D*H]). Dense only."""
    num_dirs = 2 if bidirectional else 1
    hidden = int(h0.shape[2])
    per_layer = num_dirs * (4 if has_bias else 2)
    xt = _t(x, grad=True)
    h0t = _t(h0, grad=True)
    c0t = _t(c0, grad=True)
    inp = xt.transpose(0, 1) if batch_first else xt  # time-major from here on
    h_ns, c_ns, weights = [], [], []
    for layer in range(num_layers):
        isz = int(inp.shape[-1])
        mod = torch.nn.LSTM(
            isz, hidden, bias=has_bias, bidirectional=bidirectional, dtype=torch.float64
        )
        load_params(mod, params[layer * per_layer : (layer + 1) * per_layer])
        weights += list(mod._flat_weights)
        if layer > 0:
            inp = inp * torch.from_numpy(np.asarray(masks[layer - 1], dtype=np.float64))
        sl = slice(layer * num_dirs, (layer + 1) * num_dirs)
        inp, (h_n, c_n) = mod(inp, (h0t[sl], c0t[sl]))
        h_ns.append(h_n)
        c_ns.append(c_n)
    out = inp.transpose(0, 1) if batch_first else inp
    h_n, c_n = torch.cat(h_ns), torch.cat(c_ns)
    loss = _loss(out, h_n, c_n, _t(dy), _t(dh), _t(dc))
    grads = torch.autograd.grad(loss, [xt, h0t, c0t, *weights], allow_unused=True)
    return TorchResult(
        output=out.detach().numpy().copy(),
        h_n=h_n.detach().numpy().copy(),
        c_n=c_n.detach().numpy().copy(),
        dx=_zeros_if_none(grads[0], xt),
        dh0=_zeros_if_none(grads[1], h0t),
        dc0=_zeros_if_none(grads[2], c0t),
        dparams=[_zeros_if_none(g, w) for g, w in zip(grads[3:], weights, strict=True)],
    )
