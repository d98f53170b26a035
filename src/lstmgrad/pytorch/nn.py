"""``lstmgrad.nn.LSTM``: a drop-in for ``torch.nn.LSTM`` whose forward and backward run lstmgrad.

Same constructor, parameter names, ``_flat_weights`` order and state_dict as torch.nn.LSTM (it
is a subclass: a state_dict loads both ways, ``isinstance(m, torch.nn.LSTM)`` holds), and the
same inputs and outputs: a Tensor (batched [T, B, I] / [B, T, I] with batch_first, or unbatched
[T, I]) or a PackedSequence (sorted, or built with enforce_sorted=False), an optional (h_0, c_0);
it returns ``(output, (h_n, c_n))`` exactly as torch.nn.LSTM does.

:func:`convert` puts it in place of every torch.nn.LSTM of an existing model and :func:`revert`
puts torch.nn.LSTM back, keeping the Parameters. Importing this module lets
``torch.load(weights_only=True)`` unpickle the class. torch.jit.trace, torch.jit.script,
torch.export and both ONNX exporters record torch's own LSTM in its place, so that what they
produce runs without lstmgrad (docs/contract.md, "Adopt, save, deploy").
"""

from __future__ import annotations

import copy
import functools
import time
import warnings
from collections.abc import Callable
from typing import Any

from ..core.errors import torch_missing
from ..core.layout import Dims
from ..ops.api import library_inference

try:
    import torch
except ImportError as exc:  # PyTorch is the optional [torch] extra
    raise torch_missing("lstmgrad.nn") from exc
from torch import Tensor
from torch.nn.utils.rnn import PackedSequence

from .torch_ops import lstm

__all__ = ["LSTM", "convert", "revert"]

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

# torch.export's flag; a torch without it exports lstmgrad's ops as before
_is_exporting: Callable[[], bool] = getattr(torch.compiler, "is_exporting", lambda: False)


def _recorded_for_elsewhere() -> bool:
    """Whether torch.jit.trace (and so ``torch.onnx.export(..., dynamo=False)``) or torch.export
    (and so ``torch.onnx.export``'s default) is recording the forward.

    What they record runs where lstmgrad may be absent, and is read by back ends (ONNX,
    AOTInductor, ExecuTorch, a TorchScript runtime) that know ``aten::lstm`` but not lstmgrad's
    Python ops: such a recording takes torch's own LSTM. torch.compile is not one of them (it
    keeps lstmgrad's ops: it runs in this process).
    """
    return torch.jit.is_tracing() or _is_exporting()


class LSTM(torch.nn.LSTM):
    r"""``torch.nn.LSTM`` computed by lstmgrad (the fused CPU engine, through its custom ops).

    Arguments, attributes, inputs and outputs are those of :class:`torch.nn.LSTM`; see its
    documentation. Differences:

    - ``proj_size > 0`` (LSTM with projections, outside the operator's contract) runs
      torch.nn.LSTM's own forward: the same results as torch, at torch's speed.
    - bfloat16 runs lstmgrad in float32 with bfloat16 products: the bfloat16 input, state and
      weights are widened (exactly); every GEMM rounds its operands to bfloat16 and accumulates
      in float32 on the CPU's bfloat16 units (where it has them; float32 products elsewhere);
      output, h_n and c_n are rounded to bfloat16, and so are the gradients of the input, state
      and weights; the saved activations and the values passed from layer to layer stay in
      float32 (docs/contract.md, "PyTorch drop-in").
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
    - Recorded for another runtime, it is torch.nn.LSTM: torch.jit.trace, torch.export and both
      ``torch.onnx.export`` exporters record torch's LSTM (``aten::lstm``, an ONNX LSTM node),
      and torch.jit.script compiles a torch.nn.LSTM holding the same Parameters
      (``__prepare_scriptable__``), which PyTorch also puts in the scripted model's place of
      this module. The artifacts run without lstmgrad.

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

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        # torch.load and copy.deepcopy build an instance without __init__
        self.__dict__.setdefault("recompute", False)
        self.__dict__.setdefault("max_saved_bytes", None)
        _let_dynamo_trace_this_class()

    def __prepare_scriptable__(self) -> torch.nn.Module:
        """What torch.jit.script compiles in this module's place: a torch.nn.LSTM holding the
        same Parameters, settings and hooks.

        TorchScript cannot compile this forward (Python over custom ops), and a scripted model
        must run without lstmgrad. PyTorch writes the returned module into the parent module
        being scripted, so after ``torch.jit.script(model)`` the eager ``model`` holds that
        torch.nn.LSTM (same Parameters); :func:`convert` puts lstmgrad back. A subclass with its
        own forward is returned unchanged (its forward is what it asks to be scripted).
        """
        if type(self).forward is not LSTM.forward:
            return self
        return _rebuilt(self, torch.nn.LSTM)

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
        run = functools.partial(
            lstm,
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
            products="bfloat16" if wide else "float32",
        )
        if torch.is_autocast_enabled("cpu"):
            with torch.autocast("cpu", enabled=False):  # the engine's own GEMMs stay as they are
                y, h_n, c_n = run()
        else:
            y, h_n, c_n = run()
        if wide:
            return y.bfloat16(), h_n.bfloat16(), c_n.bfloat16()
        return y, h_n, c_n

    def _library_inference(self, input: Tensor, hx: Any) -> Callable[..., None] | None:
        """Where this call is a dense float32 inference forward (no gradient can be asked for,
        no dropout applies) whose plan in use runs torch's own fused LSTM (the plan field
        ``library_lstm``), what to call with its cost once torch's forward ran it; else None
        (lstmgrad's path, which plans as usual)."""
        if input.dtype != torch.float32 or input.dim() != 3 or torch.is_autocast_enabled("cpu"):
            return None
        if self.training and self.dropout > 0 and self.num_layers > 1:
            return None
        if torch.is_grad_enabled():
            tensors = [input, *(hx or ()), *self._flat_weights]
            if any(t is not None and t.requires_grad for t in tensors):
                return None
        steps, batch = input.shape[:2] if not self.batch_first else input.shape[1::-1]
        dims = Dims(steps, batch, self.input_size, self.hidden_size, self.num_layers,
                    2 if self.bidirectional else 1, self.bias)  # fmt: skip
        done = library_inference(dims)
        return None if done is None else functools.partial(done, work=max(steps * batch, 1))

    def forward(self, input: Any, hx: Any = None) -> Any:  # noqa: D102 (torch.nn.LSTM's)
        data = input.data if isinstance(input, PackedSequence) else input
        if not self._runs_here(data) or _recorded_for_elsewhere():
            return super().forward(input, hx)
        if not isinstance(input, PackedSequence):  # variable lengths: the engine's
            done = self._library_inference(input, hx)
            if done is not None:  # torch's forward, timed for the planner's in-use check
                start = time.perf_counter()
                result = super().forward(input, hx)
                done(time.perf_counter() - start)
                return result
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


LSTM.__module__ = "lstmgrad.nn"  # checkpoints and messages name the public path


def _autocast(
    dtype: torch.dtype, input: Tensor, hx: tuple[Tensor, Tensor], weights: list[Tensor]
) -> tuple[Tensor, tuple[Tensor, Tensor], list[Tensor]]:
    """The tensors as torch's CPU LSTM casts them under autocast: float32 ones to ``dtype``,
    others kept."""

    def to(t: Tensor) -> Tensor:
        return t.to(dtype) if t.dtype == torch.float32 else t

    return to(input), (to(hx[0]), to(hx[1])), [to(w) for w in weights]


# torch.load's default (weights_only=True) unpickles only the classes it is told of: a whole
# model holding this class loads in any process that has imported lstmgrad.nn
torch.serialization.add_safe_globals([LSTM])


def convert(module: torch.nn.Module) -> torch.nn.Module:
    """Put :class:`LSTM` in place of every ``torch.nn.LSTM`` in ``module``.

    In the convention of ``torch.nn.SyncBatchNorm.convert_sync_batchnorm``: containers are
    changed in place and ``module`` is returned, or, if ``module`` itself is a torch.nn.LSTM, its
    replacement. Each replacement holds the same Parameter objects (an optimizer built before
    keeps its parameters and state; a DistributedDataParallel wrapper keeps reducing them), has
    the same state_dict keys and training mode, and shares the hooks (a hook's handle from
    before still removes it). A module found at several paths is converted once.

    Left as they are, and named in one ``UserWarning``: subclasses of torch.nn.LSTM (a
    conversion would drop their own forward or methods; derive them from :class:`LSTM` instead)
    and LSTMs with ``proj_size > 0`` (:class:`LSTM` runs torch's forward for those anyway).

    Args:
        module: any torch.nn.Module (a model, a container, a DistributedDataParallel wrapper, or
            a torch.nn.LSTM).

    Returns:
        ``module`` with its torch.nn.LSTMs replaced, or the replacement if ``module`` is one.

    Raises:
        TypeError: ``module`` is not a torch.nn.Module.

    Example:
        >>> import torch
        >>> import lstmgrad.nn
        >>> model = torch.nn.ModuleDict({"rnn": torch.nn.LSTM(4, 6), "head": torch.nn.Linear(6, 2)})
        >>> weight = model.rnn.weight_ih_l0
        >>> model = lstmgrad.nn.convert(model)
        >>> type(model.rnn).__module__, model.rnn.weight_ih_l0 is weight
        ('lstmgrad.nn', True)
        >>> type(lstmgrad.nn.revert(model).rnn).__module__
        'torch.nn.modules.rnn'
    """
    return _swap("lstmgrad.nn.convert", module, torch.nn.LSTM, LSTM)


def revert(module: torch.nn.Module) -> torch.nn.Module:
    """Put ``torch.nn.LSTM`` in place of every :class:`LSTM` in ``module``: :func:`convert`'s
    inverse, with the same conventions (same Parameters, state_dict keys, training mode and
    hooks; ``recompute`` and ``max_saved_bytes`` are dropped).

    Before ``torch.save(model)`` it gives a pickle that a process without lstmgrad loads. Left as
    they are, and named in one ``UserWarning``: subclasses of :class:`LSTM`.

    Args:
        module: any torch.nn.Module, or an :class:`LSTM`.

    Returns:
        ``module`` with its :class:`LSTM` s replaced, or the replacement if ``module`` is one.

    Raises:
        TypeError: ``module`` is not a torch.nn.Module.

    Example:
        >>> import torch
        >>> import lstmgrad.nn
        >>> ours = lstmgrad.nn.LSTM(4, 6)
        >>> back = lstmgrad.nn.revert(ours)
        >>> type(back) is torch.nn.LSTM, back.weight_hh_l0 is ours.weight_hh_l0
        (True, True)
    """
    return _swap("lstmgrad.nn.revert", module, LSTM, torch.nn.LSTM)


# a module's structure: copied, so that the replaced module and its replacement can change apart;
# the rest of its __dict__ (settings, hook dicts, a user's attributes) is shared, so that a hook's
# RemovableHandle, which refers to its dict, still removes it from the replacement
_STRUCTURE = ("_parameters", "_buffers", "_non_persistent_buffers_set", "_modules",
              "_flat_weights", "_flat_weights_names", "_flat_weight_refs")  # fmt: skip
_LSTMGRAD_ONLY = {"recompute": False, "max_saved_bytes": None}  # LSTM's extra settings


def _rebuilt(module: torch.nn.LSTM, cls: type[torch.nn.LSTM]) -> torch.nn.LSTM:
    """An instance of ``cls`` (torch.nn.LSTM or :class:`LSTM`) with ``module``'s Parameters,
    settings and hooks, built without ``__init__`` (which would draw new weights)."""
    state = {k: copy.copy(v) if k in _STRUCTURE else v for k, v in module.__dict__.items()}
    state["_all_weights"] = [list(names) for names in module._all_weights]
    for key, default in _LSTMGRAD_ONLY.items():
        if cls is LSTM:
            state.setdefault(key, default)
        else:
            state.pop(key, None)
    new = cls.__new__(cls)
    new.__dict__.update(state)
    if cls is LSTM:
        _let_dynamo_trace_this_class()
    return new


def _swap(
    fn: str, module: torch.nn.Module, source: type[torch.nn.LSTM], target: type[torch.nn.LSTM]
) -> torch.nn.Module:
    """Replace every module of type exactly ``source`` in ``module`` by a ``target``; warn once,
    naming their paths, about the LSTMs left as they are."""
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"{fn}: module must be a torch.nn.Module, got {type(module).__qualname__}")
    done: dict[int, torch.nn.Module] = {}  # id -> replacement: a shared module stays shared
    left: list[str] = []

    def visit(m: torch.nn.Module, path: str) -> torch.nn.Module:
        if id(m) in done:
            return done[id(m)]
        where = repr(path) if path else "the module itself"
        new = m
        if type(m) is source and target is LSTM and m.proj_size > 0:
            left.append(f"{where} (proj_size={m.proj_size}: lstmgrad.nn.LSTM runs torch's forward)")
        elif type(m) is source:
            new = _rebuilt(m, target)  # type: ignore[arg-type]  # an LSTM: checked just above
        elif isinstance(m, source) and not (target is LSTM and isinstance(m, LSTM)):
            own = " with its own forward" if type(m).forward is not source.forward else ""
            left.append(f"{where} ({type(m).__qualname__}, a subclass of {_name(source)}{own})")
        done[id(m)] = new
        for name, child in list(new._modules.items()):
            if child is not None:
                new._modules[name] = visit(child, f"{path}.{name}" if path else name)
        return new

    result = visit(module, "")
    if left:
        warnings.warn(
            f"{fn}: left as they are: {', '.join(left)}; a subclass keeps its class (derive it "
            f"from {_name(target)} to change what runs)",
            UserWarning,
            stacklevel=3,
        )
    return result


def _name(cls: type) -> str:
    return "lstmgrad.nn.LSTM" if cls is LSTM else "torch.nn.LSTM"
