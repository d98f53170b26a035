"""``lstmgrad.nn.LSTM``: a drop-in for ``torch.nn.LSTM`` whose forward and backward run lstmgrad.

Same constructor, parameter names, ``_flat_weights`` order and state_dict as torch.nn.LSTM (it
is a subclass: a state_dict loads both ways, ``isinstance(m, torch.nn.LSTM)`` holds), and the
same inputs and outputs: a Tensor (batched [T, B, I] / [B, T, I] with batch_first, or unbatched
[T, I]) or a PackedSequence (sorted, or built with enforce_sorted=False), an optional (h_0, c_0);
it returns ``(output, (h_n, c_n))`` exactly as torch.nn.LSTM does.
"""

from __future__ import annotations

import functools
from typing import Any

from .errors import torch_missing

try:
    import torch
except ImportError as exc:  # PyTorch is the optional [torch] extra
    raise torch_missing("lstmgrad.nn") from exc
from torch import Tensor
from torch.nn.utils.rnn import PackedSequence

from .torch_ops import lstm

__all__ = ["LSTM"]

_DTYPES = (torch.float16, torch.float32, torch.float64, torch.bfloat16)


def _packed_rows(batch_sizes: Tensor, batch: int) -> Tensor:
    """Row index, in the padded time-major [T*B] layout, of each row of packed data (time-major,
    batch_sizes[t] rows at step t)."""
    steps = batch_sizes.shape[0]
    active = torch.arange(batch).unsqueeze(0) < batch_sizes.unsqueeze(1)  # [T, B]
    return torch.arange(steps * batch).masked_select(active.reshape(-1))


def _let_dynamo_trace_this_class() -> None:
    """Let torch.compile trace :class:`LSTM` instances, and only them.

    Dynamo refuses every torch.nn.RNN/GRU/LSTM instance, subclasses included (an isinstance
    check when it wraps a module), unless the process-wide ``torch._dynamo.config.allow_rnn``
    is set; this forward is plain Python over custom ops with fake implementations, which
    Dynamo traces whole. So Dynamo's module wrapper is wrapped once per process to turn the
    switch on while it wraps an instance of this class, and back off: every other module,
    torch.nn.LSTM included, is wrapped exactly as before. Done at the first construction rather
    than at import (importing torch._dynamo takes ~1.5 s). Where Dynamo's internals differ
    (another torch), nothing is changed and torch.compile refuses the module with Dynamo's own
    message, which names the switch.
    """
    global _dynamo_scoped
    if _dynamo_scoped:
        return
    _dynamo_scoped = True
    try:
        import torch._dynamo.config as dynamo_config
        from torch._dynamo.variables.builder import VariableBuilder
    except ImportError:  # pragma: no cover - a torch without Dynamo
        return
    original = getattr(VariableBuilder, "wrap_module", None)
    if original is None or not hasattr(dynamo_config, "allow_rnn"):  # pragma: no cover
        return

    @functools.wraps(original)
    def wrap_module(self: Any, value: Any) -> Any:
        if isinstance(value, LSTM) and not dynamo_config.allow_rnn:
            with dynamo_config.patch(allow_rnn=True):
                return original(self, value)
        return original(self, value)

    VariableBuilder.wrap_module = wrap_module  # type: ignore[method-assign]


_dynamo_scoped = False


class LSTM(torch.nn.LSTM):
    r"""``torch.nn.LSTM`` computed by lstmgrad (the fused CPU engine, through its custom ops).

    Arguments, attributes, inputs and outputs are those of :class:`torch.nn.LSTM`; see its
    documentation. Differences:

    - ``proj_size > 0`` (LSTM with projections, outside the operator's contract) runs
      torch.nn.LSTM's own forward: the same results as torch, at torch's speed.
    - bfloat16 runs lstmgrad in float32: the bfloat16 input, state and weights are widened
      (exactly), output, h_n and c_n are rounded to bfloat16, and so are the gradients of the
      input, state and weights; the saved activations and the values passed from layer to
      layer stay in float32 (docs/contract.md, "PyTorch drop-in").
    - Under ``torch.autocast("cpu")`` a Tensor input (not a PackedSequence) is cast with its
      state and float32 weights to the autocast dtype and run in it, as torch does for its LSTM
      (float16 included, where torch's own CPU LSTM fails); a PackedSequence is not cast, as
      in torch.
    - In training mode with ``dropout > 0``, the inter-layer dropout masks are drawn with
      ``torch.bernoulli`` (reproducible with ``torch.manual_seed``, but not the same draws as
      torch.nn.LSTM's); the gradient is exact for the masks drawn.
    - Tensors that are not on the CPU, or not float16/bfloat16/float32/float64, run
      torch.nn.LSTM's own forward unchanged.
    - Double backward (``create_graph=True``) differentiates a torch-operations re-run of the
      LSTM (the first-order gradient stays on the fused engine); vmap and torch.func
      transforms work, unlike torch.nn.LSTM's vmap. See docs/contract.md, "Second
      derivatives and torch.func".
    - torch.compile traces it without ``torch._dynamo.config.allow_rnn`` (which Dynamo needs
      for torch's own RNN modules): the first construction lets Dynamo wrap instances of this
      class, and only them; see ``_let_dynamo_trace_this_class``.
    - Extra keywords ``recompute`` and ``max_saved_bytes``: training that keeps checkpoints
      instead of activations and recomputes them in the backward (see
      :func:`lstmgrad.torch_ops.lstm`).

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
        _let_dynamo_trace_this_class()

    def _runs_here(self, input: Tensor) -> bool:
        return self.proj_size == 0 and input.device.type == "cpu" and input.dtype in _DTYPES

    def _lstm(
        self,
        input: Tensor,
        hx: tuple[Tensor, Tensor],
        batch_sizes: Tensor | None,
        cast: torch.dtype | None = None,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """(output, h_n, c_n); ``cast``: the autocast dtype every float32 tensor is cast to."""
        weights: list[Tensor] = list(self._flat_weights)  # type: ignore[arg-type]
        if cast is not None:
            input, hx, weights = _autocast(cast, input, hx, weights)
        wide = input.dtype == torch.bfloat16
        if wide:  # computed in float32; the casts' own gradients round to bfloat16
            input, hx = input.float(), (hx[0].float(), hx[1].float())
            weights = [w.float() for w in weights]
        with torch.autocast("cpu", enabled=False):  # the engine's own GEMMs stay as they are
            y, h_n, c_n = lstm(
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
        if wide:
            return y.bfloat16(), h_n.bfloat16(), c_n.bfloat16()
        return y, h_n, c_n

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
        if input.size(1 if self.batch_first else 0) == 0:
            # torch's kernels refuse it; the core API's T = 0 (an empty output) stays for its users
            raise RuntimeError("Expected sequence length to be larger than 0 in RNN")
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
        cast = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None
        y, h_n, c_n = self._lstm(input, hx, None, cast)
        if not is_batched:
            return y.squeeze(batch_dim), (h_n.squeeze(1), c_n.squeeze(1))
        return y, (h_n, c_n)


def _autocast(
    dtype: torch.dtype, input: Tensor, hx: tuple[Tensor, Tensor], weights: list[Tensor]
) -> tuple[Tensor, tuple[Tensor, Tensor], list[Tensor]]:
    """The tensors as torch's CPU LSTM casts them under autocast: float32 ones to ``dtype``,
    others kept."""

    def to(t: Tensor) -> Tensor:
        return t.to(dtype) if t.dtype == torch.float32 else t

    return to(input), (to(hx[0]), to(hx[1])), [to(w) for w in weights]
