"""torch.library custom ops over the core: ``lstmgrad::lstm_forward`` and ``lstmgrad::lstm_backward``.

Both ops run the fused engine on the tensors' own memory (zero copy in, zero copy out, GEMMs on
torch's BLAS). Each has a fake (meta) implementation, so torch.compile traces them without a
graph break, and the forward has an autograd formula that calls the backward op. The backward
op's own gradient (double backward) and both ops' vmap rules are in :mod:`lstmgrad.pytorch.torch_grad`.
:func:`lstm` is the differentiable functional form that :class:`lstmgrad.nn.LSTM` uses.

Schemas (legend of :func:`lstmgrad.lstm_backward`; K = L*D)::

    lstmgrad::lstm_forward(Tensor input, Tensor[] params, Tensor h0, Tensor c0,
        Tensor? batch_sizes, Tensor? dropout_masks, bool has_bias, int num_layers,
        float dropout, bool train, bool bidirectional, bool batch_first,
        str products="float32")
        -> (Tensor output, Tensor hy, Tensor cy, Tensor saved)
    lstmgrad::lstm_backward(Tensor input, Tensor[] params, Tensor h0, Tensor c0, Tensor? dy,
        Tensor? dh, Tensor? dc, Tensor saved, Tensor? batch_sizes, Tensor? dropout_masks,
        bool has_bias, int num_layers, float dropout, bool train, bool bidirectional,
        bool batch_first, bool[] output_mask, str products="float32")
        -> (Tensor dx, Tensor dh_prev, Tensor dc_prev, Tensor[] dparams)

``saved`` is the seven saved lists stacked, [7, K, T, B, H] in the order i, g, f, o, h, c,
tanhc (shape [0] when train is False: nothing saved); ``dropout_masks`` the L-1 masks stacked,
[L-1, T, B, D*H]. An output switched off by ``output_mask`` is an empty tensor (shape [0], and
an empty list for dparams). ``products``: "float32", or "bfloat16" (operands of every GEMM
rounded to bfloat16, float32 accumulation; :func:`lstm`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..core.errors import LstmInvalidArgumentError, torch_missing

try:
    import torch
except ImportError as exc:  # PyTorch is the optional [torch] extra
    raise torch_missing("lstmgrad.torch_ops") from exc
from torch import Tensor

from ..core.contract import check_backward, check_forward
from ..ops import recompute as _recompute
from ..ops.api import run_backward, run_forward
from ..ops.tensors import bf16_gemm, to_numpy, torch_gemm
from . import torch_grad

__all__ = ["lstm", "lstm_forward", "lstm_backward"]

_GATHERED = 7  # i, g, f, o, h, c, tanhc


# Up to this many bytes per saved array, proving the engine's arrays lie back to back (pointer
# and layout checks) costs more than the arrays: the engine writes into the op's own tensor.
_SAVED_INTO_MAX_BYTES = 8192


def _stacked(arrays: Sequence[np.ndarray]) -> np.ndarray:
    """``np.stack(arrays)``, as a view when they lie back to back in one block (the fused
    engine allocates its results so); a copy otherwise."""
    first = arrays[0]
    step = first.nbytes
    adjacent = all(
        a.flags.c_contiguous and a.shape == first.shape and a.dtype == first.dtype for a in arrays
    ) and all(a.ctypes.data == first.ctypes.data + j * step for j, a in enumerate(arrays))
    if not adjacent or step == 0:
        return np.stack(arrays)
    return np.lib.stride_tricks.as_strided(
        first, (len(arrays), *first.shape), (step, *first.strides), writeable=True
    )


def _unstacked(a: np.ndarray | None) -> list[np.ndarray] | None:
    return None if a is None else list(a)


# ---------------------------------------------------------------------------------------------
# lstmgrad::lstm_forward


def _forward_impl(
    input: Tensor,
    params: list[Tensor],
    h0: Tensor,
    c0: Tensor,
    batch_sizes: Tensor | None,
    dropout_masks: Tensor | None,
    has_bias: bool,
    num_layers: int,
    dropout: float,
    train: bool,
    bidirectional: bool,
    batch_first: bool,
    products: str = "float32",
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The forward (aclnnLSTM) as a custom op (:data:`lstm_forward`); see the module docstring
    for the schema. The eager path runs this body directly."""
    fn = "lstmgrad::lstm_forward"
    masks = _unstacked(to_numpy(fn, "dropout_masks", dropout_masks))
    call = check_forward(
        fn, to_numpy(fn, "input", input), to_numpy(fn, "params", params),
        [to_numpy(fn, "h0", h0), to_numpy(fn, "c0", c0)], to_numpy(fn, "batch_sizes", batch_sizes),
        has_bias, num_layers, dropout, train, bidirectional, batch_first, None, masks,
    )  # fmt: skip
    d, into = call.dims, None
    if train and d.T * d.B * d.H * input.element_size() <= _SAVED_INTO_MAX_BYTES:
        into = torch.empty((_GATHERED, d.K, d.T, d.B, d.H), dtype=input.dtype)
    gemm = _products_gemm(fn, products, input.dtype)
    res = run_forward(call, None, "fused", gemm, None if into is None else into.numpy())
    if res.saved is None:
        saved = torch.empty(0, dtype=input.dtype)
    elif into is not None:
        saved = into
    else:
        s = res.saved
        lists = (s.i, s.g, s.f, s.o, s.h, s.c, s.tanhc)
        saved = torch.from_numpy(_stacked([a for lst in lists for a in lst]))
        saved = saved.view(_GATHERED, call.dims.K, *saved.shape[1:])
    return (
        torch.from_numpy(res.output),
        torch.from_numpy(res.hy),
        torch.from_numpy(res.cy),
        saved,
    )


def _dims(
    input: Tensor,
    params: Sequence[Tensor],
    h0: Tensor,
    batch_sizes: Tensor | None,
    num_layers: int,
    bidirectional: bool,
    batch_first: bool,
) -> tuple[int, int, int, int]:
    """T, B, H, K from the arguments' shapes (what the fake implementation needs)."""
    hidden = params[1].shape[1]  # weight_hh_l0 [4H, H]
    k = num_layers * (2 if bidirectional else 1)
    if batch_sizes is not None:
        return batch_sizes.shape[0], h0.shape[1], hidden, k
    if batch_first:
        return input.shape[1], input.shape[0], hidden, k
    return input.shape[0], input.shape[1], hidden, k


# the op over the body (which the eager path also calls as it is)
lstm_forward = torch.library.custom_op(
    "lstmgrad::lstm_forward", mutates_args=(), device_types="cpu"
)(_forward_impl)


@lstm_forward.register_fake
def _(
    input, params, h0, c0, batch_sizes, dropout_masks, has_bias, num_layers, dropout, train,
    bidirectional, batch_first,
):  # fmt: skip
    t, b, hid, k = _dims(input, params, h0, batch_sizes, num_layers, bidirectional, batch_first)
    width = (2 if bidirectional else 1) * hid
    if batch_sizes is not None:
        out_shape = (input.shape[0], width)
    elif batch_first:
        out_shape = (b, t, width)
    else:
        out_shape = (t, b, width)
    saved_shape = (_GATHERED, k, t, b, hid) if train else (0,)
    return (
        input.new_empty(out_shape),
        input.new_empty((k, b, hid)),
        input.new_empty((k, b, hid)),
        input.new_empty(saved_shape),
    )


# ---------------------------------------------------------------------------------------------
# lstmgrad::lstm_backward


def _backward_impl(
    input: Tensor,
    params: list[Tensor],
    h0: Tensor,
    c0: Tensor,
    dy: Tensor | None,
    dh: Tensor | None,
    dc: Tensor | None,
    saved: Tensor,
    batch_sizes: Tensor | None,
    dropout_masks: Tensor | None,
    has_bias: bool,
    num_layers: int,
    dropout: float,
    train: bool,
    bidirectional: bool,
    batch_first: bool,
    output_mask: list[bool],
    products: str = "float32",
) -> tuple[Tensor, Tensor, Tensor, list[Tensor]]:
    """The backward (aclnnLstmBackward) as a custom op (:data:`lstm_backward`); see the module
    docstring for the schema. The eager path runs this body directly."""
    fn = "lstmgrad::lstm_backward"
    if saved.dim() != 5 or saved.shape[0] != _GATHERED:
        raise LstmInvalidArgumentError(
            f"{fn}: saved must have shape [7, L*D, T, B, H] (the forward's saved activations; "
            f"the forward must run with train=True), got {list(saved.shape)}",
            "saved",
        )
    acts = to_numpy(fn, "saved", saved)  # one view; the lists index it
    lists = [list(acts[n]) for n in range(_GATHERED)]
    call = check_backward(
        fn, to_numpy(fn, "input", input), [to_numpy(fn, "h0", h0), to_numpy(fn, "c0", c0)],
        to_numpy(fn, "params", params), to_numpy(fn, "dy", dy), to_numpy(fn, "dh", dh),
        to_numpy(fn, "dc", dc), tuple(lists), to_numpy(fn, "batch_sizes", batch_sizes),
        has_bias, num_layers, dropout, train, bidirectional, batch_first, list(output_mask),
        _unstacked(to_numpy(fn, "dropout_masks", dropout_masks)),
    )  # fmt: skip
    dx, dh_prev, dc_prev, dparams = run_backward(
        call, None, "fused", _products_gemm(fn, products, input.dtype)
    )

    def out(a: np.ndarray | None) -> Tensor:
        return torch.empty(0, dtype=input.dtype) if a is None else torch.from_numpy(a)

    return out(dx), out(dh_prev), out(dc_prev), [out(p) for p in dparams or []]


lstm_backward = torch.library.custom_op(
    "lstmgrad::lstm_backward", mutates_args=(), device_types="cpu"
)(_backward_impl)


@lstm_backward.register_fake
def _(
    input, params, h0, c0, dy, dh, dc, saved, batch_sizes, dropout_masks, has_bias, num_layers,
    dropout, train, bidirectional, batch_first, output_mask,
):  # fmt: skip
    need_dx, need_dh, need_dc, need_dw = output_mask
    return (
        input.new_empty(input.shape if need_dx else (0,)),
        h0.new_empty(h0.shape if need_dh else (0,)),
        c0.new_empty(c0.shape if need_dc else (0,)),
        [p.new_empty(p.shape) for p in params] if need_dw else [],
    )


# ---------------------------------------------------------------------------------------------
# autograd of lstmgrad::lstm_forward

_FLAGS = ("has_bias", "num_layers", "dropout", "train", "bidirectional", "batch_first", "products")


def _products_gemm(fn: str, products: str, dtype: torch.dtype) -> Any:
    """The GEMM back end of ``products``: "float32" (torch's libraries in float32) or
    "bfloat16" (operands rounded to bfloat16, float32 accumulation, where the CPU has
    bfloat16 units; float32 elsewhere: :func:`lstmgrad.ops.tensors.bf16_gemm`), which takes
    float32 tensors only (what bfloat16 data is widened to)."""
    if products == "float32":
        return torch_gemm()
    if products == "bfloat16":
        if dtype != torch.float32:
            raise LstmInvalidArgumentError(
                f"{fn}: products='bfloat16' takes float32 tensors (bfloat16 data widened), "
                f"got input of dtype {dtype}",
                "products",
            )
        return bf16_gemm()
    raise LstmInvalidArgumentError(
        f"{fn}: products must be 'float32' or 'bfloat16', got {products!r}", "products"
    )


def _forward_setup(ctx: Any, inputs: Any, output: Any) -> None:
    input, params, h0, c0, batch_sizes, dropout_masks, *flags = inputs
    ctx.flags = dict(zip(_FLAGS, (*flags, "float32")[: len(_FLAGS)], strict=True))
    ctx.n_params = len(params)
    ctx.mark_non_differentiable(output[3])
    # unused outputs arrive as None instead of zero tensors (``saved`` alone is the size of
    # every activation); the backward op takes None as zero
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(input, h0, c0, output[3], batch_sizes, dropout_masks, *params)


def _forward_backward(
    ctx: Any, dy: Tensor | None, dh: Tensor | None, dc: Tensor | None, _saved: Any
) -> Any:
    input, h0, c0, saved, batch_sizes, dropout_masks, *params = ctx.saved_tensors
    # one gradient per input as torch's wrapper counts them (it leaves out an argument passed
    # at its default, products)
    n_inputs = len(ctx.needs_input_grad)
    need_x, need_w, need_h0, need_c0 = ctx.needs_input_grad[:4]
    mask = [bool(need_x), bool(need_h0), bool(need_c0), bool(need_w)]
    if not any(mask):
        return (None,) * n_inputs
    dx, dh_prev, dc_prev, dparams = _gradients(
        input, params, h0, c0, dy, dh, dc, saved, batch_sizes, dropout_masks,
        tuple(ctx.flags.values()), mask, eager=False,
    )  # fmt: skip
    return (
        dx if need_x else None,
        list(dparams) if need_w else None,
        dh_prev if need_h0 else None,
        dc_prev if need_c0 else None,
        *(None,) * (n_inputs - 4),
    )


def _require_train(flags: tuple[Any, ...]) -> None:
    if not flags[3]:  # train
        raise RuntimeError(
            "lstmgrad::lstm_forward: no gradient without saved activations: run the forward "
            "with train=True to differentiate it"
        )


def _gradients(
    input: Tensor, params: Sequence[Tensor], h0: Tensor, c0: Tensor, dy: Tensor | None,
    dh: Tensor | None, dc: Tensor | None, saved: Tensor, batch_sizes: Tensor | None,
    dropout_masks: Tensor | None, flags: tuple[Any, ...], mask: list[bool], eager: bool,
) -> tuple[Tensor, Tensor, Tensor, Sequence[Tensor]]:  # fmt: skip
    """The backward op's results for the forward's autograd formula: through the op, which is
    differentiable (create_graph) and batched (is_grads_batched), or, for ``eager`` calls
    needing neither, its body directly."""
    _require_train(flags)
    args = (input, params, h0, c0, dy, dh, dc, saved, batch_sizes, dropout_masks, *flags[:6], mask,
            *flags[6:])  # fmt: skip
    if torch_grad.is_legacy_batched(dy, dh, dc):
        flat_args = (args[0], torch_grad.flatten_params(params), *args[2:17])  # float32 products
        dx, dh_prev, dc_prev, flat = torch.ops.lstmgrad.lstm_backward_flat(*flat_args)
        shapes = [p.shape for p in params]
        dparams = torch_grad.unflatten_params(flat, shapes) if mask[3] else []
        return dx, dh_prev, dc_prev, dparams
    if eager and not torch.is_grad_enabled():
        return _backward_impl(*args)
    return torch.ops.lstmgrad.lstm_backward(*args)  # type: ignore[no-any-return]


class _Eager(torch.autograd.Function):
    """``lstmgrad::lstm_forward`` and its autograd formula without torch's op dispatcher, for
    plain eager calls (:func:`_eager`): the dispatcher and its autograd wrapper cost more than a
    small LSTM's arithmetic. The same bodies run, so the results are the op's, bit for bit; a
    double backward still goes through the backward op and its registered gradient."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, input: Tensor, h0: Tensor, c0: Tensor, batch_sizes: Tensor | None,
        masks: Tensor | None, flags: tuple[Any, ...], *params: Tensor,
    ) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
        out, hy, cy, saved = _forward_impl(input, list(params), h0, c0, batch_sizes, masks, *flags)
        ctx.flags = flags
        ctx.set_materialize_grads(False)
        if flags[3]:  # train: what the backward needs
            ctx.save_for_backward(input, h0, c0, saved, batch_sizes, masks, *params)
        return out, hy, cy

    @staticmethod
    def backward(ctx: Any, dy: Tensor | None, dh: Tensor | None, dc: Tensor | None) -> Any:  # type: ignore[override]
        need = ctx.needs_input_grad
        mask = [bool(need[0]), bool(need[1]), bool(need[2]), any(need[6:])]
        _require_train(ctx.flags)
        if not any(mask):
            return (None,) * len(need)
        input, h0, c0, saved, batch_sizes, masks, *params = ctx.saved_tensors
        dx, dh_prev, dc_prev, dparams = _gradients(
            input, params, h0, c0, dy, dh, dc, saved, batch_sizes, masks, ctx.flags, mask,
            eager=True,
        )  # fmt: skip
        grads_w = list(dparams) if mask[3] else [None] * len(params)
        return (
            dx if mask[0] else None, dh_prev if mask[1] else None, dc_prev if mask[2] else None,
            None, None, None, *grads_w,
        )  # fmt: skip


def _eager(tensors: Sequence[Tensor]) -> bool:
    """Whether a call may run :class:`_Eager`: plain CPU tensors (no subclass, whose own
    dispatch the op keeps) and no TorchFunctionMode or TorchDispatchMode active (a profiler, a
    fake-tensor or device mode: they see the op as such)."""
    if torch._C._len_torch_function_stack() or torch._C._len_torch_dispatch_stack():
        return False
    return all(type(t) is Tensor or type(t) is torch.nn.Parameter for t in tensors)


lstm_forward.register_autograd(_forward_backward, setup_context=_forward_setup)
# double backward (the backward op's own autograd) and the vmap rules of both ops
torch_grad.register(lstm_forward, lstm_backward)


# ---------------------------------------------------------------------------------------------
# the differentiable functional form


def _route(input: Tensor, params: Sequence[Tensor], h0: Tensor, c0: Tensor) -> str:
    """Which path runs: "op" under torch.compile, for tensor subclasses and under dispatch
    modes; "function" under a torch.func transform (which takes an autograd.Function with
    setup_context, not a custom op's own autograd formula); "torch" with forward-mode AD
    tangents outside torch.func (a jvp rule cannot open the nested dual level it would need);
    else "eager" (:class:`_Eager`)."""
    if torch.compiler.is_compiling():
        return "op"
    if torch._C._are_functorch_transforms_active():
        return "function"
    if getattr(torch.autograd.forward_ad, "_current_level", 0) >= 0 and any(  # no level, no tangent
        torch.autograd.forward_ad.unpack_dual(t).tangent is not None
        for t in (input, h0, c0, *params)
    ):
        return "torch"
    return "eager" if _eager((input, h0, c0, *params)) else "op"


def lstm(
    input: Tensor,
    params: Sequence[Tensor],
    hx: tuple[Tensor, Tensor] | None = None,
    batch_sizes: Tensor | None = None,
    *,
    has_bias: bool = True,
    num_layers: int = 1,
    dropout: float = 0.0,
    train: bool = True,
    bidirectional: bool = False,
    batch_first: bool = False,
    recompute: bool | int | str = False,
    max_saved_bytes: int | None = None,
    products: str = "float32",
) -> tuple[Tensor, Tensor, Tensor]:
    """Differentiable LSTM over the custom ops: ``(output, h_n, c_n)``.

    Layouts, shapes and flags as :func:`lstmgrad.lstm_forward` (input [T, B, I], [B, T, I] with
    batch_first, or padded [T*B, I] with batch_sizes; params in ``_flat_weights`` order; hx
    (h0, c0) each [L*D, B, H], zeros if None). With train and dropout > 0, inverted dropout
    masks for the layers above the first are drawn from torch's generator (so
    ``torch.manual_seed`` reproduces them) and the gradient uses exactly those masks. The
    activations are saved only when a gradient may be asked for (grad mode on and some input
    requiring grad).

    Under a torch.func transform the same ops run through autograd.Functions, and with
    forward-mode AD tangents (outside torch.func) the torch-operations LSTM runs instead (see
    :mod:`lstmgrad.pytorch.torch_grad`).

    ``recompute`` trades time for memory (docs/math.md#recompute): instead of the activations,
    the forward keeps each layer's input and the state every k steps, and the backward
    recomputes one segment of k steps at a time. ``True`` or ``"auto"``: k = ceil(sqrt(T)), or
    with ``max_saved_bytes`` the longest k whose checkpoints plus one segment's recomputation
    fit in that many bytes; an int: k itself. Not traced by torch.compile (a plain
    autograd.Function).

    ``products="bfloat16"`` (float32 tensors holding bfloat16 data; what :class:`lstmgrad.nn.LSTM`
    passes for bfloat16): every GEMM rounds its operands to bfloat16 and accumulates in float32
    on the CPU's bfloat16 units, as torch's bfloat16 products do; the rest computes in float32
    (docs/contract.md, "bfloat16"). Where the CPU has no bfloat16 units, and in the recompute
    mode, under torch.func transforms and forward-mode AD, the products stay float32.

    Example:
        >>> import torch
        >>> from lstmgrad.torch_ops import lstm
        >>> m = torch.nn.LSTM(4, 6)
        >>> x = torch.randn(5, 3, 4, requires_grad=True)
        >>> y, h_n, c_n = lstm(x, m._flat_weights)
        >>> y.sum().backward()
        >>> x.grad.shape, m.weight_hh_l0.grad.shape
        (torch.Size([5, 3, 4]), torch.Size([24, 6]))
    """
    num_dirs = 2 if bidirectional else 1
    hidden = params[1].shape[1]
    k = num_layers * num_dirs
    if hx is None:
        if batch_sizes is not None:
            batch = input.shape[0] // max(batch_sizes.shape[0], 1)
        else:
            batch = input.shape[0] if batch_first else input.shape[1]
        zeros = input.new_zeros((k, batch, hidden))
        hx = (zeros, zeros)
    h0, c0 = hx
    steps = (
        batch_sizes.shape[0] if batch_sizes is not None else input.shape[1 if batch_first else 0]
    )
    masks = None
    applies = train and dropout > 0 and num_layers > 1
    if applies:
        shape = (num_layers - 1, steps, h0.shape[1], num_dirs * hidden)
        keep = 1.0 - dropout
        masks = input.new_empty(shape).bernoulli_(keep)
        masks = masks.mul_(1.0 / keep) if keep > 0 else masks.zero_()
    needs_grad = torch.is_grad_enabled() and (
        input.requires_grad or h0.requires_grad or c0.requires_grad
        or any(p.requires_grad for p in params)
    )  # fmt: skip
    if recompute is not False or max_saved_bytes is not None:
        rflags = (has_bias, num_layers, dropout if applies else 0.0, save_mode(needs_grad, applies),
                  bidirectional, batch_first, recompute, max_saved_bytes, needs_grad)  # fmt: skip
        out: tuple[Tensor, Tensor, Tensor] = _RecomputeLstm.apply(
            input, h0, c0, batch_sizes, masks, rflags, *params
        )
        return out
    save = save_mode(needs_grad, applies)
    route = _route(input, params, h0, c0)
    if route == "function":
        p = dropout if applies else 0.0
        return torch_grad.lstm_function(
            input, params, h0, c0, batch_sizes, masks,
            (has_bias, num_layers, p, save, bidirectional, batch_first),
        )  # fmt: skip
    if route == "torch":
        return torch_grad.torch_lstm(
            input, params, h0, c0, batch_sizes, masks, has_bias, num_layers, bidirectional,
            batch_first,
        )  # fmt: skip
    flags = (has_bias, num_layers, dropout if applies else 0.0, save, bidirectional, batch_first,
             products)  # fmt: skip
    if route == "eager" and not needs_grad:  # no graph to record: the body alone
        output, h_n, c_n, _ = _forward_impl(input, list(params), h0, c0, batch_sizes, masks, *flags)
        return output, h_n, c_n
    if route == "eager":
        result: tuple[Tensor, Tensor, Tensor] = _Eager.apply(
            input, h0, c0, batch_sizes, masks, flags, *params
        )
        return result
    output, h_n, c_n, _ = torch.ops.lstmgrad.lstm_forward(
        input, list(params), h0, c0, batch_sizes, masks, *flags
    )
    return output, h_n, c_n


def save_mode(needs_grad: bool, applies: bool) -> bool:
    """Run in training mode (saving what the backward needs): a gradient may be asked for, or
    dropout applies."""
    return bool(needs_grad or applies)


class _RecomputeLstm(torch.autograd.Function):
    """The recompute mode (lstmgrad.ops.recompute) as an autograd Function: the forward keeps the
    checkpoints on ctx, the backward recomputes segment by segment."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        input: Tensor,
        h0: Tensor,
        c0: Tensor,
        batch_sizes: Tensor | None,
        masks: Tensor | None,
        flags: tuple,
        *params: Tensor,
    ) -> tuple[Tensor, Tensor, Tensor]:
        fn = "lstmgrad.torch_ops.lstm"
        has_bias, num_layers, dropout, train, bidirectional, batch_first, rec, budget, keep = flags
        np_masks = _unstacked(to_numpy(fn, "dropout_masks", masks))
        call = check_forward(
            fn, to_numpy(fn, "input", input), [to_numpy(fn, "params", p) for p in params],
            [to_numpy(fn, "h0", h0), to_numpy(fn, "c0", c0)],
            to_numpy(fn, "batch_sizes", batch_sizes), has_bias, num_layers, dropout, train,
            bidirectional, batch_first, None, np_masks,
        )  # fmt: skip
        k = _recompute.segment_length(call.dims, call.dtype, rec, budget)
        bs = None if batch_sizes is None else to_numpy(fn, "batch_sizes", batch_sizes)
        assert call.h0 is not None and call.c0 is not None  # lstm() always passes them
        y, hy, cy, ck = _recompute.forward(
            call.x, call.params, call.h0, call.c0, call.dims, k, bs, call.dropout_masks,
            torch_gemm(), keep=bool(keep),
        )  # fmt: skip
        ctx.checkpoints = ck
        ctx.layout = call.layout
        # the checkpoints read input and params through views: saved here too, so that autograd's
        # version check catches an in-place change of them before the backward
        ctx.save_for_backward(input, *params)
        ctx.set_materialize_grads(False)
        return (
            torch.from_numpy(call.layout.from_time_major(y)),
            torch.from_numpy(hy),
            torch.from_numpy(cy),
        )

    @staticmethod
    def backward(ctx: Any, dy: Tensor | None, dh: Tensor | None, dc: Tensor | None) -> Any:  # type: ignore[override]
        ck = ctx.checkpoints
        if ck is None:
            raise RuntimeError(
                "lstmgrad.torch_ops.lstm (recompute): no checkpoints: the forward ran without "
                "a gradient in view, or this graph was already differentiated (retain_graph "
                "is not supported in recompute mode)"
            )
        ctx.checkpoints = None  # the checkpoints are freed as soon as the backward is done
        _ = ctx.saved_tensors  # raises if input or a parameter was modified in place since
        fn = "lstmgrad.torch_ops.lstm"
        need_x, need_h0, need_c0 = ctx.needs_input_grad[:3]
        need_w = any(ctx.needs_input_grad[6:])
        dims = ck.dims
        dy_np = None
        if dy is not None:
            # any strides (y.sum()'s gradient is one value broadcast): no copy of a [T, B, D*H]
            dy_np = ctx.layout.to_time_major(to_numpy(fn, "dy", dy), dims.T, dims.B)
        dx, dh_prev, dc_prev, dparams = _recompute.backward(
            ck, dy_np,
            None if dh is None else to_numpy(fn, "dh", dh),
            None if dc is None else to_numpy(fn, "dc", dc),
            (need_x, need_h0, need_c0, need_w), torch_gemm(),
        )  # fmt: skip

        def out(a: np.ndarray | None) -> Tensor | None:
            return None if a is None else torch.from_numpy(np.ascontiguousarray(a))

        grads_w = [out(p) for p in dparams] if dparams is not None else [None] * len(ck.params)
        dx_t = None if dx is None else out(ctx.layout.from_time_major(dx))
        return (dx_t, out(dh_prev), out(dc_prev), None, None, None, *grads_w)
