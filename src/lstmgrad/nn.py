"""``lstmgrad.nn.LSTM``: a drop-in for ``torch.nn.LSTM`` whose forward and backward run lstmgrad.

Same constructor, parameter names, ``_flat_weights`` order and state_dict as torch.nn.LSTM (it
is a subclass: a state_dict loads both ways, ``isinstance(m, torch.nn.LSTM)`` holds), and the
same inputs and outputs: a Tensor (batched [T, B, I] / [B, T, I] with batch_first, or unbatched
[T, I]) or a PackedSequence (sorted, or built with enforce_sorted=False), an optional (h_0, c_0);
it returns ``(output, (h_n, c_n))`` exactly as torch.nn.LSTM does.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.nn.utils.rnn import PackedSequence

from .errors import LstmInvalidArgumentError
from .torch_ops import lstm

__all__ = ["LSTM"]

_DTYPES = (torch.float16, torch.float32, torch.float64)


def _packed_rows(batch_sizes: Tensor, batch: int) -> Tensor:
    """Row index, in the padded time-major [T*B] layout, of each row of packed data (time-major,
    batch_sizes[t] rows at step t)."""
    steps = batch_sizes.shape[0]
    active = torch.arange(batch).unsqueeze(0) < batch_sizes.unsqueeze(1)  # [T, B]
    return torch.arange(steps * batch).masked_select(active.reshape(-1))


def _let_dynamo_trace_lstm_modules() -> None:
    """torch.compile refuses every torch.nn.LSTM instance, subclasses included, unless
    ``torch._dynamo.config.allow_rnn`` is set; this forward is plain Python over custom ops with
    fake implementations, which Dynamo traces whole (fullgraph=True, PackedSequence included).
    The switch is process-wide: it also lets Dynamo trace plain torch.nn.RNN/GRU/LSTM modules
    (experimental in PyTorch) instead of breaking the graph at them. Set here, at the first
    construction, rather than at import: importing torch._dynamo takes ~1.5 s."""
    import torch._dynamo.config

    torch._dynamo.config.allow_rnn = True


class LSTM(torch.nn.LSTM):
    r"""``torch.nn.LSTM`` computed by lstmgrad (the fused CPU engine, through its custom ops).

    Arguments, attributes, inputs and outputs are those of :class:`torch.nn.LSTM`; see its
    documentation. Differences:

    - ``proj_size > 0`` is outside the operator's contract: the constructor raises
      :class:`lstmgrad.LstmInvalidArgumentError` (code 161002).
    - In training mode with ``dropout > 0``, the inter-layer dropout masks are drawn with
      ``torch.bernoulli`` (reproducible with ``torch.manual_seed``, but not the same draws as
      torch.nn.LSTM's); the gradient is exact for the masks drawn.
    - Tensors that are not on the CPU, or not float16/float32/float64, run torch.nn.LSTM's own
      forward unchanged.
    - Double backward raises a RuntimeError.
    - Extra keywords ``recompute`` and ``max_saved_bytes``: training that keeps checkpoints
      instead of activations and recomputes them in the backward (see
      :func:`lstmgrad.torch_ops.lstm`).
    - Constructing one sets ``torch._dynamo.config.allow_rnn = True`` (process-wide), without
      which torch.compile refuses any torch.nn.LSTM subclass; see
      ``_let_dynamo_trace_lstm_modules``.

    Example:
        >>> import torch
        >>> from lstmgrad.nn import LSTM
        >>> m = LSTM(10, 20, num_layers=2, batch_first=True)
        >>> x = torch.randn(3, 5, 10)                      # B, T, I
        >>> y, (h_n, c_n) = m(x)
        >>> y.sum().backward()
        >>> y.shape, h_n.shape, m.weight_ih_l0.grad.shape
        (torch.Size([3, 5, 20]), torch.Size([2, 3, 20]), torch.Size([80, 10]))
    """

    def __init__(
        self,
        *args: Any,
        recompute: bool | int | str = False,
        max_saved_bytes: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.recompute = recompute
        self.max_saved_bytes = max_saved_bytes
        if self.proj_size > 0:
            raise LstmInvalidArgumentError(
                f"lstmgrad.nn.LSTM: proj_size must be 0 (LSTM with projections is outside the "
                f"aclnnLstmBackward contract), got {self.proj_size}",
                "proj_size",
            )
        _let_dynamo_trace_lstm_modules()

    def _runs_here(self, input: Tensor) -> bool:
        return input.device.type == "cpu" and input.dtype in _DTYPES

    def _lstm(
        self, input: Tensor, hx: tuple[Tensor, Tensor], batch_sizes: Tensor | None
    ) -> tuple[Tensor, Tensor, Tensor]:
        weights: list[Tensor] = list(self._flat_weights)  # type: ignore[arg-type]
        return lstm(
            input,
            weights,
            hx,
            batch_sizes,
            has_bias=self.bias,
            num_layers=self.num_layers,
            dropout=float(self.dropout),
            train=self.training,
            bidirectional=self.bidirectional,
            batch_first=self.batch_first and batch_sizes is None,
            recompute=self.recompute,
            max_saved_bytes=self.max_saved_bytes,
        )

    def forward(self, input: Any, hx: Any = None) -> Any:  # noqa: D102 (torch.nn.LSTM's)
        data = input.data if isinstance(input, PackedSequence) else input
        if not self._runs_here(data):
            return super().forward(input, hx)
        self._update_flat_weights()
        k = self.num_layers * (2 if self.bidirectional else 1)
        if isinstance(input, PackedSequence):
            packed, batch_sizes, sorted_indices, unsorted_indices = input
            batch = int(batch_sizes[0]) if batch_sizes.numel() else 0
            if hx is None:
                zeros = packed.new_zeros(k, batch, self.hidden_size)
                hx = (zeros, zeros)
            else:
                self.check_forward_args(packed, hx, batch_sizes)
                hx = self.permute_hidden(hx, sorted_indices)
            rows = _packed_rows(batch_sizes, batch)
            steps = batch_sizes.shape[0]
            padded = packed.new_zeros(steps * batch, packed.shape[1]).index_copy(0, rows, packed)
            y, h_n, c_n = self._lstm(padded, hx, batch_sizes)
            output = PackedSequence(
                y.index_select(0, rows), batch_sizes, sorted_indices, unsorted_indices
            )
            return output, self.permute_hidden((h_n, c_n), unsorted_indices)

        if input.dim() not in (2, 3):
            raise ValueError(f"LSTM: Expected input to be 2D or 3D, got {input.dim()}D instead")
        is_batched = input.dim() == 3
        batch_dim = 0 if self.batch_first else 1
        if not is_batched:
            input = input.unsqueeze(batch_dim)
        if hx is None:
            batch = input.size(0) if self.batch_first else input.size(1)
            zeros = input.new_zeros(k, batch, self.hidden_size)
            hx = (zeros, zeros)
        else:
            want = 3 if is_batched else 2
            if hx[0].dim() != want or hx[1].dim() != want:
                kind = "batched 3-D" if is_batched else "unbatched 2-D"
                raise RuntimeError(
                    f"For {kind} input, hx and cx should also be {want}-D but got "
                    f"({hx[0].dim()}-D, {hx[1].dim()}-D) tensors"
                )
            if not is_batched:
                hx = (hx[0].unsqueeze(1), hx[1].unsqueeze(1))
        self.check_forward_args(input, hx, None)
        y, h_n, c_n = self._lstm(input, hx, None)
        if not is_batched:
            return y.squeeze(batch_dim), (h_n.squeeze(1), c_n.squeeze(1))
        return y, (h_n, c_n)
