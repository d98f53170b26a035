"""Second derivatives and torch.func batching rules of the ``lstmgrad::`` custom ops.

- Double backward: the gradient of ``lstmgrad::lstm_backward`` (what ``create_graph=True``
  followed by another backward needs) re-runs the LSTM with plain torch operations
  (:func:`torch_lstm`) and differentiates its vector-Jacobian product with :func:`torch.func.vjp`.
  The first-order gradient stays on the fused engine; only the second-order pass pays the
  per-step torch operations. The ``saved`` activations are taken to be the forward's on the
  same inputs (which they are whenever they come from ``lstmgrad::lstm_forward``).
- vmap: a batched call of either op whose weights (and batch_sizes) are shared and whose
  results do not include the weight gradients folds the vmapped dimension into the LSTM batch
  (one call on B*N rows); any other batched call loops over the vmapped dimension.
- torch.func: its transforms refuse a custom op's own autograd formula, so under them the two
  ops run inside autograd.Functions with ``setup_context``, a jvp rule and generated vmap rules
  (:func:`lstm_function`).
- ``lstmgrad::lstm_backward_flat``: the backward op without tensor lists, for autograd's
  batched gradients (``is_grads_batched``), which use PyTorch's older vmap.

Registered on the ops by :mod:`lstmgrad.torch_ops`; nothing here is public API.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor
from torch.utils import _pytree as pytree

from ..core.layout import Dims, num_params

__all__ = ["torch_lstm", "second_order", "lstm_function", "register"]

_FORWARD_FLAGS = 6  # has_bias, num_layers, dropout, train, bidirectional, batch_first


# ---------------------------------------------------------------------------------------------
# the LSTM in torch operations (differentiable to any order)


def torch_lstm(
    input: Tensor,
    params: Sequence[Tensor],
    h0: Tensor,
    c0: Tensor,
    batch_sizes: Tensor | None,
    dropout_masks: Tensor | None,
    has_bias: bool,
    num_layers: int,
    bidirectional: bool,
    batch_first: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    """The forward of ``lstmgrad::lstm_forward`` (output, hy, cy) in torch operations.

    Same layouts and variable-length rules as the op (docs/contract.md): a step past a
    sequence's end carries its state, gives output 0 and lets nothing of its (padded) input or
    output gradient through. float16 is computed in float32; the results keep input's dtype.
    """
    dtype = input.dtype
    work = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    num_dirs = 2 if bidirectional else 1
    per = 4 if has_bias else 2
    hidden = params[1].shape[1]
    x = input.to(work)
    valid = None
    if batch_sizes is not None:
        steps, batch = batch_sizes.shape[0], h0.shape[1]
        valid = (torch.arange(batch) < batch_sizes.unsqueeze(1)).unsqueeze(-1)  # [T, B, 1]
        # select, not multiply: padding (even NaN) must not reach any result
        x = torch.where(valid, x.reshape(steps, batch, -1), x.new_zeros(()))
    elif batch_first:
        x = x.transpose(0, 1)
    steps = x.shape[0]
    hy, cy = [], []
    for layer in range(num_layers):
        if layer > 0 and dropout_masks is not None:
            x = x * dropout_masks[layer - 1].to(work)
        outs = []
        for d in range(num_dirs):
            k = layer * num_dirs + d
            w_ih, w_hh, *biases = (p.to(work) for p in params[k * per : (k + 1) * per])
            pre = x @ w_ih.T  # the input half of every step in one product
            if biases:
                pre = pre + (biases[0] + biases[1])
            h, c = h0[k].to(work), c0[k].to(work)
            w_hh_t = w_hh.t()  # once, not a transpose node per step
            ys: list[Tensor] = [x.new_zeros(())] * steps
            for t in range(steps - 1, -1, -1) if d else range(steps):
                i, f, g, o = torch.addmm(pre[t], h, w_hh_t).unsafe_chunk(4, dim=-1)
                c_t = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
                h_t = torch.sigmoid(o) * torch.tanh(c_t)
                if valid is None:
                    h, c, ys[t] = h_t, c_t, h_t
                else:
                    c = torch.where(valid[t], c_t, c)
                    h = torch.where(valid[t], h_t, h)
                    ys[t] = torch.where(valid[t], h_t, h_t.new_zeros(()))
            outs.append(torch.stack(ys))
            hy.append(h)
            cy.append(c)
        x = torch.cat(outs, dim=-1) if num_dirs == 2 else outs[0]
    if batch_sizes is not None:
        out = x.reshape(-1, num_dirs * hidden)
    else:
        out = x.transpose(0, 1) if batch_first else x
    return out.to(dtype), torch.stack(hy).to(dtype), torch.stack(cy).to(dtype)


# ---------------------------------------------------------------------------------------------
# the double backward


def second_order(
    saved: Sequence[Tensor | None],
    params: Sequence[Tensor],
    flags: Sequence[Any],
    output_mask: Sequence[bool],
    grads: Sequence[Tensor | None],
    needs: Sequence[bool],
) -> tuple[Any, ...]:
    """Gradient of the backward op's results with respect to its differentiable inputs.

    Args:
        saved: the backward op's ``input, h0, c0, dy, dh, dc, batch_sizes, dropout_masks``
            (dy, dh, dc None for zero).
        params: its weights, ``_flat_weights`` order.
        flags: ``has_bias, num_layers, dropout, train, bidirectional, batch_first``.
        output_mask: which of ``dx, dh_prev, dc_prev, dparams`` it computed.
        grads: the gradients of ``dx, dh_prev, dc_prev`` then one per weight (None for zero).
        needs: which of ``input, params, h0, c0, dy, dh, dc`` want a gradient.

    Returns:
        ``(d_input, d_params, d_h0, d_c0, d_dy, d_dh, d_dc)``, None where not needed (d_params
        a list).
    """
    input, h0, c0, dy, dh, dc, batch_sizes, masks = saved
    has_bias, num_layers, _dropout, _train, bidirectional, batch_first = flags
    need_dx, need_dh, need_dc, need_dw = output_mask
    gx, gh, gc, *gparams = grads

    def used(g: Tensor | None, on: bool) -> Tensor | None:
        return g if on and g is not None and g.numel() > 0 else None

    gx, gh, gc = used(gx, need_dx), used(gh, need_dh), used(gc, need_dc)
    gw = None
    if need_dw and any(g is not None for g in gparams):
        gw = [torch.zeros_like(p) if g is None else g for g, p in zip(gparams, params, strict=True)]
    cotangents = (gx, gw, gh, gc)
    if all(g is None for g in cotangents) or not any(needs):
        return (None,) * 7

    def forward(x: Tensor, ps: list[Tensor], h: Tensor, c: Tensor) -> tuple[Tensor, ...]:
        return torch_lstm(
            x, ps, h, c, batch_sizes, masks, has_bias, num_layers, bidirectional, batch_first
        )

    present = [g is not None for g in (dy, dh, dc)]

    def first_order(
        x: Tensor, ps: list[Tensor], h: Tensor, c: Tensor, given: list[Tensor]
    ) -> tuple[Any, ...]:
        outs, vjp = torch.func.vjp(forward, x, ps, h, c)[:2]
        it = iter(given)
        cot = tuple(
            next(it) if p else torch.zeros_like(o) for o, p in zip(outs, present, strict=True)
        )
        dx, dps, dh0, dc0 = vjp(cot)
        return tuple(
            r for r, g in zip((dx, dps, dh0, dc0), cotangents, strict=True) if g is not None
        )

    given = [g for g in (dy, dh, dc) if g is not None]
    vjp2 = torch.func.vjp(first_order, input, list(params), h0, c0, given)[1]
    d_x, d_ps, d_h0, d_c0, d_given = vjp2(tuple(g for g in cotangents if g is not None))
    it = iter(d_given)
    d_dy, d_dh, d_dc = (next(it) if p else None for p in present)
    results = (d_x, list(d_ps), d_h0, d_c0, d_dy, d_dh, d_dc)
    return tuple(r if n else None for r, n in zip(results, needs, strict=True))


def _backward_setup(ctx: Any, inputs: Any, output: Any) -> None:
    input, params, h0, c0, dy, dh, dc, _saved, batch_sizes, masks, *rest = inputs
    flags, output_mask = rest[:_FORWARD_FLAGS], rest[_FORWARD_FLAGS]  # then products, if given
    ctx.flags = flags
    ctx.output_mask = list(output_mask)
    ctx.save_for_backward(input, h0, c0, dy, dh, dc, batch_sizes, masks, *params)


def _double_backward(
    ctx: Any, gx: Tensor | None, gh: Tensor | None, gc: Tensor | None, gparams: Any
) -> Any:
    """Autograd formula of ``lstmgrad::lstm_backward`` (see :func:`second_order`)."""
    input, h0, c0, dy, dh, dc, batch_sizes, masks, *params = ctx.saved_tensors
    need = ctx.needs_input_grad
    needs = (need[0], need[1], need[2], need[3], need[4], need[5], need[6])
    grads = (gx, gh, gc, *(gparams or [None] * len(params)))
    saved = (input, h0, c0, dy, dh, dc, batch_sizes, masks)
    result = second_order(saved, params, ctx.flags, ctx.output_mask, grads, needs)
    # no gradient for saved, batch_sizes, masks and the flags; one per input as torch's wrapper
    # counts them (it leaves out an argument passed at its default, products)
    return (*result, *(None,) * (len(need) - len(result)))


# ---------------------------------------------------------------------------------------------
# torch.func: the same two ops as autograd.Functions


def _zeros_if_none(t: Tensor | None, like: Tensor) -> Tensor:
    return torch.zeros_like(like) if t is None else t


class _Static:
    """Non-tensor arguments as one opaque pytree leaf: functorch's generated rules for an
    autograd.Function line tangents up with the flattened arguments, so a tuple would be
    miscounted."""

    __slots__ = ("value",)

    def __init__(self, value: Sequence[Any]) -> None:
        self.value = tuple(value)


class _Forward(torch.autograd.Function):
    """``lstmgrad::lstm_forward`` for torch.func transforms (grad, vjp, jacrev, jvp, jacfwd,
    vmap), which accept an autograd.Function with ``setup_context`` but not a custom op's own
    autograd formula. Tensors are positional (params last) so that each is differentiated."""

    generate_vmap_rule = True

    @staticmethod
    def forward(
        input: Tensor, h0: Tensor, c0: Tensor, batch_sizes: Tensor | None,
        masks: Tensor | None, flags: _Static, *params: Tensor,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
        return torch.ops.lstmgrad.lstm_forward(  # type: ignore[no-any-return]
            input, list(params), h0, c0, batch_sizes, masks, *flags.value
        )

    @staticmethod
    def setup_context(ctx: Any, inputs: Any, output: Any) -> None:
        input, h0, c0, batch_sizes, masks, flags, *params = inputs
        ctx.flags = flags.value
        ctx.mark_non_differentiable(output[3])
        ctx.save_for_backward(input, h0, c0, output[3], batch_sizes, masks, *params)
        ctx.save_for_forward(input, h0, c0, batch_sizes, masks, *params)

    @staticmethod
    def backward(ctx: Any, dy: Tensor, dh: Tensor, dc: Tensor, _ds: Any) -> Any:
        input, h0, c0, saved, batch_sizes, masks, *params = ctx.saved_tensors
        if not ctx.flags[3]:
            raise RuntimeError(
                "lstmgrad::lstm_forward: no gradient without saved activations: run the "
                "forward with train=True to differentiate it"
            )
        need = ctx.needs_input_grad
        mask = (need[0], need[1], need[2], any(need[6:]))
        grads = _Backward.apply(
            input, h0, c0, dy, dh, dc, saved, batch_sizes, masks, _Static(ctx.flags),
            _Static(mask), *params,
        )  # fmt: skip
        dx, dh0, dc0, *dps = grads
        return (
            dx if mask[0] else None, dh0 if mask[1] else None, dc0 if mask[2] else None,
            None, None, None, *(dps if mask[3] else [None] * len(params)),
        )  # fmt: skip

    @staticmethod
    def jvp(
        ctx: Any, t_input: Any, t_h0: Any, t_c0: Any, _b: Any, _m: Any, _f: Any, *t_ps: Any
    ) -> Any:
        input, h0, c0, batch_sizes, masks, *params = ctx.saved_tensors
        has_bias, num_layers, _dropout, _train, bidirectional, batch_first = ctx.flags

        def forward(x: Tensor, ps: list[Tensor], h: Tensor, c: Tensor) -> tuple[Tensor, ...]:
            return torch_lstm(
                x, ps, h, c, batch_sizes, masks, has_bias, num_layers, bidirectional, batch_first
            )

        tangents = (
            _zeros_if_none(t_input, input),
            [_zeros_if_none(t, p) for t, p in zip(t_ps, params, strict=True)],
            _zeros_if_none(t_h0, h0),
            _zeros_if_none(t_c0, c0),
        )
        primals = (input, list(params), h0, c0)
        t_out, t_hy, t_cy = torch.func.jvp(forward, primals, tangents)[1]
        return t_out, t_hy, t_cy, None


class _Backward(torch.autograd.Function):
    """``lstmgrad::lstm_backward`` for torch.func transforms, its own gradient being
    :func:`second_order` (so transforms nest: hessian, grad of grad)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(
        input: Tensor, h0: Tensor, c0: Tensor, dy: Tensor, dh: Tensor, dc: Tensor,
        saved: Tensor, batch_sizes: Tensor | None, masks: Tensor | None,
        flags: _Static, output_mask: _Static, *params: Tensor,
    ) -> tuple[Tensor, ...]:  # fmt: skip
        dx, dh0, dc0, dps = torch.ops.lstmgrad.lstm_backward(
            input, list(params), h0, c0, dy, dh, dc, saved, batch_sizes, masks, *flags.value,
            list(output_mask.value),
        )  # fmt: skip
        if not output_mask.value[3]:
            dps = [torch.zeros_like(p) for p in params]
        return (dx, dh0, dc0, *dps)

    @staticmethod
    def setup_context(ctx: Any, inputs: Any, output: Any) -> None:
        input, h0, c0, dy, dh, dc, _s, batch_sizes, masks, flags, output_mask, *params = inputs
        ctx.flags = flags.value
        ctx.output_mask = output_mask.value
        ctx.save_for_backward(input, h0, c0, dy, dh, dc, batch_sizes, masks, *params)
        ctx.save_for_forward(input, h0, c0, dy, dh, dc, batch_sizes, masks, *params)

    @staticmethod
    def backward(ctx: Any, gx: Tensor, gh: Tensor, gc: Tensor, *gparams: Tensor) -> Any:
        input, h0, c0, dy, dh, dc, batch_sizes, masks, *params = ctx.saved_tensors
        need = ctx.needs_input_grad
        needs = (need[0], any(need[11:]), need[1], need[2], need[3], need[4], need[5])
        saved = (input, h0, c0, dy, dh, dc, batch_sizes, masks)
        grads = (gx, gh, gc, *gparams)
        d_x, d_ps, d_h0, d_c0, d_dy, d_dh, d_dc = second_order(
            saved, params, ctx.flags, ctx.output_mask, grads, needs
        )
        return (
            d_x, d_h0, d_c0, d_dy, d_dh, d_dc, None, None, None, None, None,
            *(d_ps if d_ps is not None else [None] * len(params)),
        )  # fmt: skip

    @staticmethod
    def jvp(
        ctx: Any, t_input: Any, t_h0: Any, t_c0: Any, t_dy: Any, t_dh: Any, t_dc: Any,
        _ts: Any, _tb: Any, _tm: Any, _tf: Any, _to: Any, *t_ps: Any,
    ) -> Any:  # fmt: skip
        input, h0, c0, dy, dh, dc, batch_sizes, masks, *params = ctx.saved_tensors
        has_bias, num_layers, _dropout, _train, bidirectional, batch_first = ctx.flags

        def backward(
            x: Tensor, ps: list[Tensor], h: Tensor, c: Tensor, gy: Tensor, gh: Tensor, gc: Tensor
        ) -> tuple[Any, ...]:
            def forward(x: Tensor, ps: list[Tensor], h: Tensor, c: Tensor) -> tuple[Tensor, ...]:
                return torch_lstm(
                    x, ps, h, c, batch_sizes, masks, has_bias, num_layers, bidirectional,
                    batch_first,
                )  # fmt: skip

            outs, vjp = torch.func.vjp(forward, x, ps, h, c)[:2]
            dx, dps, dh0, dc0 = vjp((gy, gh, gc))
            return dx, dh0, dc0, dps

        outs = torch_lstm(
            input, params, h0, c0, batch_sizes, masks, has_bias, num_layers, bidirectional,
            batch_first,
        )  # fmt: skip
        cots = [_zeros_if_none(g, o) for g, o in zip((dy, dh, dc), outs, strict=True)]
        primals = (input, list(params), h0, c0, *cots)
        tangents = (
            _zeros_if_none(t_input, input),
            [_zeros_if_none(t, p) for t, p in zip(t_ps, params, strict=True)],
            _zeros_if_none(t_h0, h0),
            _zeros_if_none(t_c0, c0),
            *(_zeros_if_none(t, g) for t, g in zip((t_dy, t_dh, t_dc), cots, strict=True)),
        )
        t_dx, t_dh0, t_dc0, t_dps = torch.func.jvp(backward, primals, tangents)[1]
        mask = ctx.output_mask
        return (
            t_dx if mask[0] else input.new_zeros(0),
            t_dh0 if mask[1] else h0.new_zeros(0),
            t_dc0 if mask[2] else c0.new_zeros(0),
            *(t_dps if mask[3] else [torch.zeros_like(p) for p in params]),
        )


def lstm_function(
    input: Tensor,
    params: Sequence[Tensor],
    h0: Tensor,
    c0: Tensor,
    batch_sizes: Tensor | None,
    masks: Tensor | None,
    flags: tuple[Any, ...],
) -> tuple[Tensor, Tensor, Tensor]:
    """``lstmgrad::lstm_forward``'s output, hy, cy through :class:`_Forward` (the path taken
    under torch.func transforms and forward-mode AD)."""
    out, hy, cy, _ = _Forward.apply(input, h0, c0, batch_sizes, masks, _Static(flags), *params)
    return out, hy, cy


# ---------------------------------------------------------------------------------------------
# vmap


def _fold(t: Tensor, bdim: int | None, n: int, axis: int) -> Tensor:
    """A tensor whose unbatched layout has the LSTM batch B at ``axis``, with the vmapped
    dimension (size n, at ``bdim``; broadcast when None) folded in as B*N (b outer, n inner)."""
    if bdim is None:
        t = t.unsqueeze(axis + 1).expand(*t.shape[: axis + 1], n, *t.shape[axis + 1 :])
    else:
        t = t.movedim(bdim, axis + 1)
    return t.flatten(axis, axis + 1)


def _unfold(t: Tensor, n: int, axis: int) -> Tensor:
    """Inverse of :func:`_fold`: the vmapped dimension back at 0."""
    return t.unflatten(axis, (-1, n)).movedim(axis + 1, 0)


def _fold_rows(t: Tensor, bdim: int | None, n: int, steps: int) -> Tensor:
    """:func:`_fold` for padded variable-length data [T*B, X]: rows (t*B + b)*N + n."""
    if bdim is None:
        return _fold(t.unflatten(0, (steps, -1)), None, n, 1).flatten(0, 1)
    t = t.movedim(bdim, 0).unflatten(1, (steps, -1))
    return _fold(t, 0, n, 1).flatten(0, 1)


def _unfold_rows(t: Tensor, n: int, steps: int) -> Tensor:
    return _unfold(t.unflatten(0, (steps, -1)), n, 1).flatten(1, 2)


def _data_axis(batch_first: bool) -> int:
    return 0 if batch_first else 1


def _empty_or(t: Tensor, dim: int) -> int | None:
    return None if t.dim() == 1 and t.shape[0] == 0 else dim


def _loop(op: Callable[..., Any], n: int, in_dims: Any, args: tuple[Any, ...]) -> Any:
    """The op once per index of the vmapped dimension, results stacked at 0 (an empty result,
    an output switched off, is returned once with out_dim None)."""

    def pick(a: Any, d: Any, j: int) -> Any:
        if isinstance(a, (list, tuple)) and isinstance(d, (list, tuple)):
            return [pick(e, de, j) for e, de in zip(a, d, strict=True)]
        return a if d is None or not isinstance(a, Tensor) else a.select(d, j)

    results = [op(*(pick(a, d, j) for a, d in zip(args, in_dims, strict=True))) for j in range(n)]
    flat = [pytree.tree_flatten(r)[0] for r in results]
    spec = pytree.tree_flatten(results[0])[1]
    stacked: list[Tensor] = []
    dims: list[int | None] = []
    for parts in zip(*flat, strict=True):
        if _empty_or(parts[0], 0) is None:
            stacked.append(parts[0])
            dims.append(None)
        else:
            stacked.append(torch.stack(parts))
            dims.append(0)
    return pytree.tree_unflatten(stacked, spec), pytree.tree_unflatten(dims, spec)


def _shared(dims: Any) -> bool:
    return all(d is None for d in pytree.tree_leaves(dims, is_leaf=lambda a: a is None))


def _forward_vmap(info: Any, in_dims: Any, *args: Any) -> Any:
    op = torch.ops.lstmgrad.lstm_forward.default
    input, params, h0, c0, batch_sizes, masks, *flags = args
    xd, pd, hd, cd, bd, md, *_ = in_dims
    n = info.batch_size
    if not (_shared(pd) and bd is None):
        return _loop(op, n, in_dims, args)
    batch_first = flags[5]
    if batch_sizes is not None:
        steps = batch_sizes.shape[0]
        x = _fold_rows(input, xd, n, steps)
        bs = batch_sizes * n
    else:
        x, bs = _fold(input, xd, n, _data_axis(batch_first)), None
    m = None if masks is None else _fold(masks, md, n, 2)
    out, hy, cy, saved = op(x, params, _fold(h0, hd, n, 1), _fold(c0, cd, n, 1), bs, m, *flags)
    if batch_sizes is not None:
        out = _unfold_rows(out, n, batch_sizes.shape[0])
    else:
        out = _unfold(out, n, _data_axis(batch_first))
    saved_dim = _empty_or(saved, 0)
    if saved_dim is not None:
        saved = _unfold(saved, n, 3)
    return (out, _unfold(hy, n, 1), _unfold(cy, n, 1), saved), (0, 0, 0, saved_dim)


def _backward_vmap(info: Any, in_dims: Any, *args: Any) -> Any:
    op = torch.ops.lstmgrad.lstm_backward.default
    input, params, h0, c0, dy, dh, dc, saved, batch_sizes, masks, *rest = args
    xd, pd, hd, cd, dyd, dhd, dcd, sd, bd, md, *_ = in_dims
    flags, output_mask = rest[:_FORWARD_FLAGS], rest[_FORWARD_FLAGS]
    products = rest[_FORWARD_FLAGS + 1] if len(rest) > _FORWARD_FLAGS + 1 else "float32"
    n = info.batch_size
    # the weight gradient sums over the batch: folding would mix the vmapped samples
    if output_mask[3] or not (_shared(pd) and bd is None):
        return _loop(op, n, in_dims, args)
    batch_first = flags[5]
    steps = 0 if batch_sizes is None else batch_sizes.shape[0]

    def rows(t: Tensor | None, d: int | None) -> Tensor | None:
        if t is None:
            return None
        if batch_sizes is not None:
            return _fold_rows(t, d, n, steps)
        return _fold(t, d, n, _data_axis(batch_first))

    def state(t: Tensor | None, d: int | None) -> Tensor | None:
        return None if t is None else _fold(t, d, n, 1)

    bs = None if batch_sizes is None else batch_sizes * n
    m = None if masks is None else _fold(masks, md, n, 2)
    dx, dh0, dc0, dps = op(
        rows(input, xd), params, state(h0, hd), state(c0, cd), rows(dy, dyd), state(dh, dhd),
        state(dc, dcd), _fold(saved, sd, n, 3), bs, m, *flags, output_mask, products,
    )  # fmt: skip
    dx_dim, dh_dim, dc_dim = _empty_or(dx, 0), _empty_or(dh0, 0), _empty_or(dc0, 0)
    if dx_dim is not None:
        if batch_sizes is not None:
            dx = _unfold_rows(dx, n, steps)
        else:
            dx = _unfold(dx, n, _data_axis(batch_first))
    if dh_dim is not None:
        dh0 = _unfold(dh0, n, 1)
    if dc_dim is not None:
        dc0 = _unfold(dc0, n, 1)
    return (dx, dh0, dc0, dps), (dx_dim, dh_dim, dc_dim, [None] * len(dps))


def register(forward_op: Any, backward_op: Any) -> None:
    """Register the double backward and both vmap rules on the two custom ops."""
    backward_op.register_autograd(_double_backward, setup_context=_backward_setup)
    torch.library.register_vmap(forward_op, _forward_vmap)
    torch.library.register_vmap(backward_op, _backward_vmap)


# ---------------------------------------------------------------------------------------------
# the backward with plain tensor results, for the legacy vmap of autograd's batched gradients


def param_shapes(
    input_size: int, hidden: int, has_bias: bool, num_layers: int, bidirectional: bool
) -> list[tuple[int, ...]]:
    """The weights' shapes, ``_flat_weights`` order."""
    dims = Dims(0, 0, input_size, hidden, num_layers, 2 if bidirectional else 1, has_bias)
    return [dims.param_shape(j) for j in range(num_params(num_layers, bidirectional, has_bias))]


@torch.library.custom_op("lstmgrad::lstm_backward_flat", mutates_args=(), device_types="cpu")
def lstm_backward_flat(
    input: Tensor,
    params_flat: Tensor,
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
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``lstmgrad::lstm_backward`` with the weights, and their gradients, each flattened and
    concatenated into one 1-D tensor (the gradient empty when not asked for).

    ``torch.autograd.grad(..., is_grads_batched=True)`` (and gradcheck's batched-gradient
    check) run the backward under PyTorch's legacy vmap, which has no custom batching rules; its
    generic per-sample fallback takes plain tensors but no tensor list, in or out.
    """
    hidden = h0.shape[-1]
    shapes = param_shapes(input.shape[-1], hidden, has_bias, num_layers, bidirectional)
    params = unflatten_params(params_flat, shapes)
    with torch.no_grad():
        dx, dh0, dc0, dps = torch.ops.lstmgrad.lstm_backward(
            input, params, h0, c0, dy, dh, dc, saved, batch_sizes, dropout_masks, has_bias,
            num_layers, dropout, train, bidirectional, batch_first, output_mask,
        )  # fmt: skip
    flat = flatten_params(dps) if dps else input.new_empty(0)
    return dx.clone(), dh0.clone(), dc0.clone(), flat


@lstm_backward_flat.register_fake
def _(
    input, params_flat, h0, c0, dy, dh, dc, saved, batch_sizes, dropout_masks, has_bias,
    num_layers, dropout, train, bidirectional, batch_first, output_mask,
):  # fmt: skip
    need_dx, need_dh, need_dc, need_dw = output_mask
    return (
        input.new_empty(input.shape if need_dx else (0,)),
        h0.new_empty(h0.shape if need_dh else (0,)),
        c0.new_empty(c0.shape if need_dc else (0,)),
        input.new_empty(params_flat.shape if need_dw else (0,)),
    )


def is_legacy_batched(*tensors: Tensor | None) -> bool:
    """True if any tensor is batched by the legacy vmap (autograd's ``is_grads_batched``)."""
    return any(t is not None and torch._C._functorch.is_legacy_batchedtensor(t) for t in tensors)


def flatten_params(params: Sequence[Tensor]) -> Tensor:
    """The weights flattened and concatenated (:func:`lstm_backward_flat`'s layout)."""
    return torch.cat([p.reshape(-1) for p in params])


def unflatten_params(flat: Tensor, shapes: Sequence[Sequence[int]]) -> list[Tensor]:
    """Split a flattened concatenation back into tensors of the given shapes."""
    sizes = [math.prod(s) for s in shapes]
    return [g.view(*s) for g, s in zip(flat.split(sizes, dim=-1), shapes, strict=True)]
