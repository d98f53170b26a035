"""The fused CPU engine: GEMMs (NumPy's BLAS, or torch's for tensors: fused.gemm) around
Numba kernels, run as the call's execution plan (fused.plan) says.

Per (layer, direction), the forward projects the input of all steps with one GEMM and then runs,
per step, the recurrent GEMM and one kernel for the gate maths; the backward runs, per step, one
kernel for the gate gradients (stored for all steps in one packed [N, 4H] buffer) and the
recurrent GEMM, then after the loop one GEMM for dx, dW_ih and dW_hh (dG^T @ [x | h_prev],
K = N) in the plan's layout (from the rows of [x | h_prev], or from the
transpose of dG) and a reduction for the bias. Where the plan says so, a step's gate kernel
splits its rows over several threads, or the two directions of a bidirectional layer walk at
once, each step loop in one Numba call with its recurrent product (fused.walks).

Variable lengths: step t works on its active rows b < n_t only, "packed" at rows
offsets[t] .. offsets[t] + n_t - 1 (N = sum n_t; without batch sizes packed == padded), so
padding costs no FLOPs and is never read. The previous state of each row is read from its
previous active step (h0/c0 before the first), which makes any batch_sizes (not only
non-increasing ones) exact.

Compute dtype: float32 for float16 and float32 storage, float64 for float64. Results are
rounded to the storage dtype at the rounding points of docs/math.md, as in the reference; the
values passed between layers are kept in the compute dtype but hold storage-rounded values.
"""

from __future__ import annotations

import functools

import numpy as np

from ..core.contract import BackwardCall, ForwardCall, LstmSaved
from ..core.layout import B_HH, B_IH, W_HH, W_IH, Dims
from ..core.workspace import Arena, Slot, block, kept, kept_bytes
from . import half, kernels, walks
from .gemm import Gemm, product_into
from .plan import Plan, compute_dtype

__all__ = ["compute_dtype"]


class _Steps:
    """Active rows per step (n_t) and their packed offsets."""

    def __init__(self, t_steps: int, batch: int, mask: np.ndarray | None) -> None:
        if mask is None:
            self.ns = np.full(t_steps, batch, dtype=np.int64)
        else:  # m[t, b] = b < batch_sizes[t]: the active rows of a step are a prefix
            self.ns = mask.sum(axis=1).astype(np.int64)
        self.offsets = np.zeros(t_steps, dtype=np.int64)
        np.cumsum(self.ns[:-1], out=self.offsets[1:])
        self.total = int(self.ns.sum())
        # every step has all B rows: packed rows are the [T, B] rows themselves
        self.dense = self.total == t_steps * batch
        self.orders = [
            np.arange(t_steps, dtype=np.int64),
            np.arange(t_steps - 1, -1, -1, dtype=np.int64),
        ]
        # (t, n_t, offset_t) in each walk order, as Python ints, for the step loops (no NumPy
        # scalar lookups per step)
        self.walks = [
            list(zip(o.tolist(), self.ns[o].tolist(), self.offsets[o].tolist(), strict=True))
            for o in self.orders
        ]
        self.parts: dict[tuple[int, int], np.ndarray] = {}  # the walks' parts, by (walks, blocks)


_dense_steps = functools.lru_cache(maxsize=32)(_Steps)  # (T, B, None): made once, shared


def _steps(dims: Dims, mask: np.ndarray | None) -> _Steps:
    """The call's steps; those of dense batches made once per (T, B) and shared (read only)."""
    return _Steps(dims.T, dims.B, mask) if mask is not None else _dense_steps(dims.T, dims.B, None)


def _rows(a: np.ndarray, st: _Steps) -> np.ndarray | None:
    """a [T, B, W] as its packed rows [N, W] without a copy, where the steps are dense and a is
    C-contiguous; else None (the caller packs)."""
    if st.dense and a.flags.c_contiguous:
        return a.reshape(st.total, a.shape[-1])
    return None


def _c(a: np.ndarray, cd: np.dtype, how: half.Conversion = half.ONE_THREAD) -> np.ndarray:
    """C-contiguous in the compute dtype (no copy when already so): BLAS sees one layout, so
    results do not depend on the caller's strides. float16 converts as ``how`` says."""
    if a.dtype == np.float16 and cd == np.float32:
        return half.converted(a, cd, how)
    return np.ascontiguousarray(a, dtype=cd)


def _in(a: np.ndarray, cd: np.dtype, how: half.Conversion = half.ONE_THREAD) -> np.ndarray:
    """An input in the compute dtype: itself (any strides) where it already is."""
    return a if a.dtype == cd else _c(a, cd, how)


def _conversion(plan: Plan, gemm: Gemm) -> half.Conversion:
    """float16 conversions as the plan says: the back end's own, or the kernels on its
    transpose_threads."""
    return half.Conversion(
        plan.transpose_threads, gemm.convert if plan.convert == "library" else None
    )


def _dense(buf: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """A C-contiguous [rows, cols] view at the start of ``buf`` (a scratch slot sized for the
    widest layer): GEMM libraries take a dense operand on their fast path."""
    return buf.reshape(-1)[: rows * cols].reshape(rows, cols)


def _rounded(a: np.ndarray, dtype: np.dtype, threads: int = 1) -> np.ndarray:
    """``a`` rounded to the storage dtype, kept in a's dtype (in place)."""
    if a.dtype != dtype:  # float16 storage is the only one narrower than its compute
        half.round_in_place(a, threads)
    return a


def _walk_gemm(plan: Plan, gemm: Gemm, cd: np.dtype) -> int:
    """The one-call step loops' product (fused.walks): the library GEMM's address where the
    plan says "library", its packed GEMM's where "packed", 0 (the Numba loop) otherwise."""
    if plan.walk_product == "loop":
        return 0
    return gemm.walk_gemm(cd, plan.walk_product == "packed")


def walk_operand(product: str, gemm: Gemm, fn: int, b: np.ndarray, rows: int,
                 slot: int) -> np.ndarray:  # fmt: skip
    """The fixed operand b [K, N] of a walk's recurrent product as the walk product
    ``product`` (a plan's walk_product, its GEMM at ``fn``) reads it: packed once for all
    steps of at most ``rows`` rows for "packed" (into the calling thread's kept buffer
    ``slot``: one per operand in use at once), else :meth:`Gemm.walk_operand`'s (b itself for
    the Numba loop)."""
    if not fn:
        return b
    if product == "packed":
        buf = kept(f"walk_pack{slot}", gemm.walk_pack_bytes(b.shape, rows))
        return gemm.walk_pack(b, rows, buf)
    return gemm.walk_operand(b)


def walk_pack_bytes(dims: Dims, dtype: np.dtype, plan: Plan, gemm: Gemm) -> int:
    """Memory the plan's packed recurrent weights take beyond the buffers the calling thread
    keeps (0 without packed walk products)."""
    if plan.walk_product != "packed" or not gemm.walk_gemm(compute_dtype(dtype), True):
        return 0
    h = dims.H
    size = max(gemm.walk_pack_bytes((h, 4 * h), dims.B), gemm.walk_pack_bytes((4 * h, h), dims.B))
    slots = 2 if plan.pair_walks else 1
    return sum(max(size - kept_bytes(f"walk_pack{s}"), 0) for s in range(slots))


def _parts(plan: Plan, st: _Steps, batch: int) -> np.ndarray:
    """The parts of the plan's parallel walks (fused.walks.walk_parts): per direction of a
    pair, its batch rows in plan.walk_rows blocks; made once a call."""
    key = (2 if plan.pair_walks else 1, plan.walk_rows)
    parts = st.parts.get(key)
    if parts is None:
        parts = st.parts[key] = walks.walk_parts(st.ns, batch, *key)
    return parts


def _forward_step(plan: Plan, hidden: int, gx, gh, bias, h, c, n, acts, y) -> None:  # type: ignore[no-untyped-def]
    """One step's gate maths (kernels.forward_step), its rows split over the plan's threads
    where the step is large enough."""
    if plan.threads > 1 and n * hidden >= plan.split_min:
        walks.forward_step_split(gx, gh, bias, h, c, n, plan.threads, *acts, y)
    else:
        kernels.forward_step(gx, gh, bias, h, c, n, *acts, y)


def _backward_step(plan: Plan, hidden: int, dy, has_dy, dh, dc, acts, cp, dg, n, db, with_db) -> None:  # type: ignore[no-untyped-def]  # fmt: skip
    """One step's gate gradients (kernels.backward_step), split as in :func:`_forward_step`."""
    if plan.threads > 1 and n * hidden >= plan.split_min:
        walks.backward_step_split(dy, has_dy, dh, dc, *acts, cp, dg, n, db, with_db, plan.threads)
    else:
        kernels.backward_step(dy, has_dy, dh, dc, *acts, cp, dg, n, db, with_db)


@functools.lru_cache(maxsize=256)  # a pure function of hashable sizes, asked twice a call
def forward_workspace_slots(dims: Dims, dtype: np.dtype, plan: Plan) -> tuple[Slot, ...]:
    """Scratch of the forward (compute dtype cd) under ``plan``.

    x [N, max(I, D*H)] packed layer input; gx [P, N, 4H] its projection; gh [P, B, 4H] the
    recurrent part; h, c [P, B, H] the running state; acts [7, T, B, H] the saved activations
    before rounding (float16 storage only); the layer input [T, B, D*H] (cd). P = 2 where the
    two directions walk at once (``plan.pair_walks``), else 1.
    """
    cd = compute_dtype(dtype)
    t, b, h = dims.T, dims.B, dims.H
    n, width = t * b, max(dims.I, dims.D * h)
    acts = (7, t, b, h) if cd != dtype else (0,)
    p = 2 if plan.pair_walks else 1
    return (
        ((n, width), cd),
        ((p, n, 4 * h), cd),
        ((p, b, 4 * h), cd),
        ((p, b, h), cd),
        ((p, b, h), cd),
        (acts, cd),
        ((t, b, dims.D * h), cd),
    )


@functools.lru_cache(maxsize=256)  # a pure function of hashable sizes, asked twice a call
def backward_workspace_slots(dims: Dims, dtype: np.dtype, plan: Plan) -> tuple[Slot, ...]:
    """Scratch of the backward (compute dtype cd) under ``plan``.

    xh [N, max(I, D*H) + H] the packed layer input [N, I_l] then h_prev [N, H], each dense
    (the weight gradient's two products read them); dg [P, N, 4H] gate gradients; cp [P, N, H]
    packed c_prev; dw [4H, max(I, D*H) + H] the weight gradient before rounding (float16 storage
    only: otherwise its products write the results themselves); dh, dc [P, B, H]; dx [D, N,
    max(I, D*H)] each direction's dx; dy [T, B, D*H] the gradient of the layer's output; acts
    [7, T, B, H] the saved activations in cd (float16 storage only); db [P, B, 4H] each row's
    bias gradient (with bias). P = 2 where the two directions walk at once, else 1.
    """
    cd = compute_dtype(dtype)
    t, b, h = dims.T, dims.B, dims.H
    n, width = t * b, max(dims.I, dims.D * h)
    acts = (7, t, b, h) if cd != dtype else (0,)
    p = 2 if plan.pair_walks else 1
    return (
        ((n, width + h), cd),
        ((p, n, 4 * h), cd),
        ((p, n, h), cd),
        ((4 * h, width + h) if cd != dtype else (0,), cd),
        ((p, b, h), cd),
        ((p, b, h), cd),
        ((dims.D, n, width), cd),
        ((t, b, dims.D * h), cd),
        (acts, cd),
        ((p, b, 4 * h) if dims.has_bias else (p, 1, 1), cd),
    )


def forward_bytes(call: ForwardCall, plan: Plan) -> int:
    """Memory the forward allocates besides its scratch (:func:`forward_workspace_slots`): the
    results (output, hy, cy, and the saved activations: every (layer, direction)'s with train,
    else one step's set for the one being walked) and, for float16 storage, the input and
    masks converted to float32."""
    dims, dtype = call.dims, call.dtype
    cd = compute_dtype(dtype)
    kept = dims.K if call.train else (0 if cd != dtype else (2 if plan.pair_walks else 1))
    act = dims.T * dims.B * dims.H
    kept_act = act if call.train else dims.B * dims.H  # without train: one step's slot
    out = dims.T * dims.B * dims.D * dims.H
    total = (out + 2 * dims.K * dims.B * dims.H + 7 * kept * kept_act) * np.dtype(dtype).itemsize
    if cd != dtype:
        masks = len(call.dropout_masks or []) * out
        total += (dims.T * dims.B * dims.I + masks) * cd.itemsize
    return total


def backward_bytes(call: BackwardCall) -> int:
    """Memory the backward allocates besides its scratch (:func:`backward_workspace_slots`): the
    results (dx, dh_prev, dc_prev, dparams) and, for float16 storage, the input, dy, masks and
    dx in float32."""
    dims, dtype = call.dims, call.dtype
    cd = compute_dtype(dtype)
    need_dx, _, _, need_dw = call.need
    x = dims.T * dims.B * dims.I
    params = sum(p.size for p in call.params) if need_dw else 0
    total = ((x if need_dx else 0) + 2 * dims.K * dims.B * dims.H + params) * dtype.itemsize
    if cd != dtype:
        out = dims.T * dims.B * dims.D * dims.H
        masks = len(call.dropout_masks or []) * out
        total += (2 * x + out + masks) * cd.itemsize
    return total


def _copied(arrays: list[np.ndarray], cd: np.dtype) -> list[int]:
    """Bytes of :func:`_c`'s copy of each array: 0 where it is C-contiguous in ``cd`` already."""
    size = cd.itemsize
    return [0 if a.dtype == cd and a.flags.c_contiguous else a.size * size for a in arrays]


def _recurrent_copy(call: ForwardCall | BackwardCall, plan: Plan, gemm: Gemm, cd: np.dtype,
                    forward: bool) -> int:  # fmt: skip
    """Bytes of the engine's own copies of one direction's W_hh for its recurrent product, in
    the layout the plan's method reads (fused.gemm: W_hh^T dense, "blas_t"'s W_hh and its
    [4H, B] scratch); a library's packed form is the library's (not counted)."""
    dims = call.dims
    weight, rows = dims.G * dims.H * cd.itemsize, dims.G * dims.B * cd.itemsize
    if forward and plan.fwd_walk and (plan.pair_walks or plan.walk):
        # the Numba loop reads a copy of W_hh^T, a library's product W_hh.T in place
        library = plan.walk_product != "loop" and gemm.walk_gemm(cd, plan.walk_product == "packed")
        return 0 if library else weight
    if plan.pair_walks or plan.walk:  # the backward's walks read W_hh itself
        return 0
    method = plan.fwd_rec if forward else plan.bwd_rec
    if method == "blas_t":
        return (0 if forward else weight) + rows
    if forward:  # b = W_hh^T, a view: "blas", "loop" and "onednn" make it dense
        if method in ("packed", "mkl"):
            return weight if method == "mkl" and call.mask is not None else 0
        return weight
    return weight if method in ("packed", "mkl") else 0  # b = W_hh: dense already


def copy_bytes(call: ForwardCall | BackwardCall, plan: Plan | None, gemm: Gemm) -> int:
    """Memory the engine's copies of the call's arrays take at most at once, besides the
    results, the float16 conversions of :func:`forward_bytes` / :func:`backward_bytes` and the
    scratch: every parameter, dropout mask, initial state and (backward) saved activation that
    is not C-contiguous in the compute dtype is copied where it is read (all of them for
    float16 storage); per (layer, direction) the summed bias and W_hh in its recurrent
    product's layout; where ``plan.big`` is "onednn", that library's own product results. A
    zero-stride (broadcast) weight counts its whole logical size. ``plan`` None: the copies
    whatever the plan (a lower bound of every plan's, for the check before a plan is made)."""
    dims, dtype = call.dims, call.dtype
    cd = compute_dtype(dtype)
    item, n, per = cd.itemsize, dims.T * dims.B, 4 if dims.has_bias else 2
    forward = isinstance(call, ForwardCall)
    if isinstance(call, BackwardCall) and not any(call.need):
        return 0
    total = 0
    if call.dropout_masks and cd == dtype:  # float16's: in forward_bytes / backward_bytes
        total += sum(_copied(call.dropout_masks, cd))
    pairs = 2 if plan is not None and plan.pair_walks else 1
    onednn = plan is not None and plan.big == "onednn"
    # per direction, whatever its layer: the summed bias (forward), W_hh's layout, the
    # projection's own result
    fixed = dims.G * item * (1 + (n if onednn else 0)) if forward else 0
    fixed += 0 if plan is None else _recurrent_copy(call, plan, gemm, cd, forward)
    weights = _copied(call.params, cd)
    if isinstance(call, BackwardCall):  # a direction's h0 and c0, where not dense in cd
        fixed += sum(_copied([call.h0, call.c0], cd)) // dims.K
        saved = None
        if cd == dtype:  # per (layer, direction): its seven saved activations
            flat = _copied([a for s in call.saved for a in s], cd)
            saved = [sum(flat[k :: dims.K]) for k in range(dims.K)]
    peak = 0
    for layer in range(dims.L):
        ks = range(layer * dims.D, (layer + 1) * dims.D)
        # W_ih is read for the forward's projection, and for the backward's dx of its layer
        w_ih = isinstance(call, ForwardCall) or layer > 0 or call.need[0]
        each = max(weights[k * per] * w_ih + weights[k * per + 1] for k in ks)
        layer_total = pairs * (each + fixed)
        if isinstance(call, BackwardCall):
            if saved is not None:  # the saved activations of the layer's directions
                layer_total += sum(saved[ks.start : ks.stop])
            if layer > 0 and call.need[3]:  # the layer input, from the saved h below
                h_below = _copied(call.saved[4][(layer - 1) * dims.D : layer * dims.D], cd)
                layer_total += max(h_below)
            if onednn:  # each direction's dx part, a weight gradient's products
                width = dims.layer_input_size(layer)
                layer_total += (dims.D * n * width + dims.G * (width + dims.H)) * item
        peak = max(peak, layer_total)
    return total + peak


def _bias(call: ForwardCall, layer: int, d: int, cd: np.dtype) -> np.ndarray:
    dims = call.dims
    if not dims.has_bias:
        return np.zeros(dims.G, dtype=cd)
    # both cast to cd, then added (one new array)
    return np.add(call.params[dims.index(layer, d, B_IH)], call.params[dims.index(layer, d, B_HH)],
                  dtype=cd)  # fmt: skip


def lstm_forward(
    call: ForwardCall,
    arena: Arena | None = None,
    *,
    gemm: Gemm,
    plan: Plan,
    saved_into: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, LstmSaved | None]:
    """Forward of every (layer, direction); returns time-major output [T, B, D*H], hy, cy, saved.

    ``gemm`` runs every GEMM (NumPy's, or torch's for torch callers), as ``plan`` says (the
    caller's choice: :func:`lstmgrad.planning.plan.plan_for` through the API). ``saved_into``: where the saved
    activations go with train (C-contiguous [7, L*D, T, B, H] of the storage dtype; the lists
    are its views), else a new block. A dense inference forward whose plan says
    ``library_lstm`` runs the back end's own fused LSTM instead (:meth:`Gemm.lstm_inference`).
    """
    dims = call.dims
    if plan.library_lstm and not call.train and call.mask is None and dims.T and dims.B:
        y, hy, cy = gemm.lstm_inference(call)  # the library's fused LSTM: nothing to save
        return y, hy, cy, None
    run = _ForwardRun(call, arena or Arena(), gemm, plan, saved_into)
    for layer in range(call.dims.L):
        xp = run.layer_input(layer)
        pair = [w for d in range(call.dims.D) if (w := run.direction(layer, d, xp)) is not None]
        if pair:  # float32/float64 storage: the walks write saved and y themselves
            run.walk_pair(layer, pair)
    result_saved = None
    if call.train:
        s = run.saved
        masks = call.dropout_masks if call.dropout > 0 else None
        result_saved = LstmSaved(s[0], s[1], s[2], s[3], s[4], s[5], s[6], masks)
    return run.y, run.hy, run.cy, result_saved


class _ForwardRun:
    """One :func:`lstm_forward` call: its scratch (from the arena), its results and the steps
    of each layer."""

    def __init__(self, call: ForwardCall, arena: Arena, gemm: Gemm, plan: Plan,
                 saved_into: np.ndarray | None) -> None:  # fmt: skip
        self.call, self.gemm, self.plan = call, gemm, plan
        dims, dtype = call.dims, call.dtype
        self.cd = cd = compute_dtype(dtype)
        self.st = _steps(dims, call.mask)
        slots = forward_workspace_slots(dims, dtype, plan)
        (self.xp_buf, self.gx_buf, self.gh_buf, self.h_buf, self.c_buf, self.acts_buf,
         self.layer_in) = arena.take_all(slots)  # fmt: skip
        # the results in recycled allocations (workspace.block): output and states in one, the
        # saved activations in another, so that keeping the output alone does not pin them.
        # Without train only the (layer, direction) being walked needs activations, and of one
        # step, a slot every step overwrites (fused.walks.forward_walk): one set (two for a
        # pair; none for float16 storage, whose walks write the scratch acts_buf)
        act = (dims.T, dims.B, dims.H)
        state = (dims.K, dims.B, dims.H)
        self.y, self.hy, self.cy = block([(dims.T, dims.B, dims.D * dims.H), state, state], dtype)
        kept = dims.K if call.train else (0 if cd != dtype else (2 if plan.pair_walks else 1))
        kept_act = act if call.train else (1, dims.B, dims.H)
        if saved_into is not None and call.train:  # the caller's [7, K, T, B, H] block
            want = (7, dims.K, *act)
            if (
                saved_into.shape != want
                or saved_into.dtype != dtype
                or not saved_into.flags.c_contiguous
            ):
                raise ValueError(f"saved_into must be a C-contiguous {dtype} array of shape "
                                 f"{want}, got {saved_into.dtype} {saved_into.shape}")  # fmt: skip
            flat = list(saved_into.reshape(7 * kept, *act))
        else:
            flat = block([kept_act] * (7 * kept), dtype)
        self.kept = kept
        self.saved = [flat[n * kept : (n + 1) * kept] for n in range(7)]
        self.cv = cv = _conversion(plan, gemm)
        self.masks = [_c(m, cd, cv) for m in call.dropout_masks] if call.dropout_masks else None

    def layer_input(self, layer: int) -> np.ndarray:
        """The layer's input as packed rows [N, I_l]: x, or the layer below's output (times its
        dropout mask); dense steps take the input's own [T, B] rows where it allows."""
        call, st, cd, cv = self.call, self.st, self.cd, self.cv
        xp = _dense(self.xp_buf, st.total, call.dims.layer_input_size(layer))
        if layer == 0:
            src = _in(call.x, cd, cv)
        elif st.dense and self.masks is None and cd == call.dtype and call.dims.D == 1:
            src = self.y  # projected before the walk overwrites it
        else:
            np.copyto(self.layer_in, self.y)  # the layer below's rounded output
            src = self.layer_in
        scale = self.masks[layer - 1] if self.masks is not None and layer > 0 else None
        # float16 storage's walks write layer_in: its rows are copied out, not aliased
        aliased = scale is not None or (src is self.layer_in and cd != call.dtype)
        rows = None if aliased else _rows(src, st)
        if rows is not None:  # dense steps: the input's [T, B] rows are its packed rows
            return rows
        if scale is not None:
            kernels.pack_rows_scaled(src, scale, st.ns, st.offsets, xp, 0)
        else:
            kernels.pack_rows(src, st.ns, st.offsets, xp, 0)
        return xp

    def direction(self, layer: int, d: int, xp: np.ndarray) -> walks.ForwardWalk | None:
        """Direction d of the layer: its input projection, then its step loop; or, where the
        plan walks both directions as a pair, the walk's record (returned) for
        :meth:`walk_pair`."""
        call, st, plan, cd, cv = self.call, self.st, self.plan, self.cd, self.cv
        dims, dtype, hidden, batch = call.dims, call.dtype, call.dims.H, call.dims.B
        k = layer * dims.D + d
        p = d if plan.pair_walks else 0  # the direction's scratch
        h, c, gh = self.h_buf[p], self.c_buf[p], self.gh_buf[p]
        w_ih = _c(call.params[dims.index(layer, d, W_IH)], cd, cv)  # [4H, I_l]
        w_hh = _c(call.params[dims.index(layer, d, W_HH)], cd, cv)  # [4H, H]
        bias = _bias(call, layer, d, cd)
        # [N, 4H]: every step's input projection at once
        gx = self.gemm.product(xp, w_ih.T, self.gx_buf[p, : st.total], plan.big)
        h[...] = 0.0 if call.h0 is None else call.h0[k]
        c[...] = 0.0 if call.c0 is None else call.c0[k]
        if cd == dtype:  # the walks write the results themselves
            acts = tuple(self.saved[n][k % self.kept] for n in range(7))
            y_d = self.y[..., d * hidden : (d + 1) * hidden]
        else:  # the scratch: every step's with train, else one step's slot
            acts = tuple(a if call.train else a[:1] for a in self.acts_buf)
            y_d = self.layer_in[..., d * hidden : (d + 1) * hidden]  # free once xp is packed
        if plan.fwd_walk and (plan.pair_walks or plan.walk):  # the loop in one call
            fn = _walk_gemm(plan, self.gemm, cd)
            # [H, 4H]: the library reads W_hh transposed in place; the Numba loop needs a copy
            w_t = w_hh.T if fn and w_hh.flags.c_contiguous else kernels.transposed(w_hh)
            w_t = walk_operand(plan.walk_product, self.gemm, fn, w_t, batch, p)
            walk = walks.ForwardWalk._make((gx, w_t, bias, h, c, gh, st.orders[d], *acts,
                                            y_d))  # fmt: skip
            if plan.pair_walks:
                return walk
            if plan.walk_rows > 1:  # blocks of rows on threads of their own
                walks.forward_walk_parts(walk, walk, _parts(plan, st, batch), st.ns,
                                         st.offsets, fn)  # fmt: skip
            else:
                walks.forward_walk_of(walk, st.ns, st.offsets, fn, 0, batch)
        else:
            rec = self.gemm.fixed(w_hh.T, plan.fwd_rec, batch, plan.transpose_threads)
            for t, n, off in st.walks[d]:
                g_rec = rec(h[:n], gh[:n]) if n else gh  # in gh or the library's result
                step_acts = tuple(a[min(t, len(a) - 1)] for a in acts)  # (one slot: no train)
                _forward_step(plan, hidden, gx[off : off + n], g_rec, bias, h, c, n,
                              step_acts, y_d[t])  # fmt: skip
        self.hy[k], self.cy[k] = h, c  # a rounding point (docs/math.md)
        if cd != dtype:
            if call.train:
                for n_, a in enumerate(acts):
                    half.assign(self.saved[n_][k], a, cv)
            half.assign(self.y[..., d * hidden : (d + 1) * hidden], y_d, cv)
        return None

    def walk_pair(self, layer: int, pair: list[walks.ForwardWalk]) -> None:
        """Both directions' step loops at once, each on a thread of its own (fused.walks)."""
        walks.forward_walk_parts(pair[0], pair[1], _parts(self.plan, self.st, self.call.dims.B),
                                 self.st.ns, self.st.offsets,
                                 _walk_gemm(self.plan, self.gemm, self.cd))  # fmt: skip
        for d in range(2):
            self.hy[layer * 2 + d], self.cy[layer * 2 + d] = self.h_buf[d], self.c_buf[d]


def _gather(call: BackwardCall, st: _Steps, k: int, acts: tuple, hp: np.ndarray,
            cp: np.ndarray, with_h: bool = True, with_c: bool = True) -> None:  # fmt: skip
    """The packed previous states of (layer, direction) k (docs/math.md B1): h_prev into hp
    (where ``with_h``), c_prev into cp (where ``with_c``; kernels.gather_prev)."""
    cd = cp.dtype
    kernels.gather_prev(
        acts[4], acts[5], _c(call.h0[k], cd), _c(call.c0[k], cd), st.ns, st.offsets,
        st.orders[k % call.dims.D], hp, cp, with_h, with_c,
    )  # fmt: skip


def _initial_grads(call: BackwardCall, dr: _Direction) -> None:
    dr.dh[...] = 0.0 if call.dh is None else call.dh[dr.k]
    dr.dc[...] = 0.0 if call.dc is None else call.dc[dr.k]
    dr.db[...] = 0.0


class _Direction:
    """One (layer, direction) of the backward: its index k, saved activations (in cd), output
    gradient and scratch (db: each row's bias gradient, summed by the step kernels where
    ``with_db``)."""

    def __init__(self, k, acts, dy, dg, cp, dh, dc, db, with_db) -> None:  # type: ignore[no-untyped-def]
        self.k, self.acts, self.dy, self.dg, self.cp, self.dh, self.dc = k, acts, dy, dg, cp, dh, dc
        self.db, self.with_db = db, with_db

    @property
    def gate_acts(self) -> tuple:
        """s_i, s_g, s_f, s_o, s_tc: what the step kernels read."""
        s_i, s_g, s_f, s_o, _, _, s_tc = self.acts
        return s_i, s_g, s_f, s_o, s_tc


def _previous_cells(call: BackwardCall, st: _Steps, dr: _Direction) -> list[np.ndarray]:
    """Dense steps: step t's c_prev [B, H], the saved c of the step before it in the forward's
    order (c0 for the first), as views indexed by t."""
    s_c, prev = dr.acts[5], _c(call.c0[dr.k], dr.cp.dtype)
    out = [prev] * call.dims.T
    for t in st.orders[dr.k % call.dims.D].tolist():
        out[t], prev = prev, s_c[t]
    return out


def _backward_walk(
    call: BackwardCall, dr: _Direction, w_hh: np.ndarray, st: _Steps
) -> walks.BackwardWalk:
    """dr's step loop as a record for fused.walks, walked in the reverse of the forward's order."""
    c0 = np.ascontiguousarray(_c(call.c0[dr.k], dr.cp.dtype))
    return walks.BackwardWalk._make((dr.dy, dr.dh, dr.dc, w_hh, *dr.gate_acts, dr.acts[5], c0,
                                     dr.cp, dr.dg, dr.db,
                                     st.orders[1 - dr.k % call.dims.D]))  # fmt: skip


def _walk_back(call: BackwardCall, plan: Plan, gemm: Gemm, st: _Steps, w_hh: np.ndarray,
               dr: _Direction, has_dy: bool) -> None:  # fmt: skip
    """The backward's step loop of one direction: per step the gate gradients into dr.dg, then
    dh = dG W_hh (skipped after the last step unless dh_prev is wanted)."""
    t_steps, hidden = call.dims.T, call.dims.H
    gate_acts = dr.gate_acts
    if plan.walk:  # the whole step loop in one Numba call
        fn = _walk_gemm(plan, gemm, dr.dg.dtype)
        w = walk_operand(plan.walk_product, gemm, fn, w_hh, call.dims.B, 0)
        walk = _backward_walk(call, dr, w, st)
        flags = (call.need[1], st.dense, dr.with_db)
        if plan.walk_rows > 1:  # blocks of rows on threads of their own
            walks.backward_walk_parts(walk, walk, _parts(plan, st, call.dims.B), has_dy, st.ns,
                                      st.offsets, flags, fn)  # fmt: skip
        else:
            walks.backward_walk_of(walk, has_dy, st.ns, st.offsets, flags, fn, 0, call.dims.B)
        return
    rec = gemm.fixed(w_hh, plan.bwd_rec, call.dims.B, plan.transpose_threads)  # dG -> dh
    # dense steps read c_prev where it is saved; otherwise from dr.cp, gathered packed
    c_prev = _previous_cells(call, st, dr) if st.dense else None
    for step, (t, n, off) in enumerate(st.walks[1 - dr.k % call.dims.D]):
        if not n:
            continue
        cp = dr.cp[off : off + n] if c_prev is None else c_prev[t]
        _backward_step(plan, hidden, dr.dy[t if has_dy else 0], has_dy, dr.dh, dr.dc,
                       tuple(a[t] for a in gate_acts), cp, dr.dg[off : off + n], n, dr.db,
                       dr.with_db)  # fmt: skip
        if step < t_steps - 1 or call.need[1]:  # the last step's dh only feeds dh_prev
            dh_n = dr.dh[:n]
            product = rec(dr.dg[off : off + n], dh_n)
            if product is not dh_n:  # the library's own result
                np.copyto(dh_n, product)


def _weight_grads(call: BackwardCall, plan: Plan, gemm: Gemm, layer: int, dr: _Direction,
                  x_rows: np.ndarray, h_rows: np.ndarray, dw_buf: np.ndarray,
                  dparams: list) -> None:  # fmt: skip
    """dW_ih and dW_hh of one direction, two products from the layer input's rows x_rows and
    h_prev's h_rows, each written into its result (float16 results: into dw_buf, then
    rounded), and its biases."""
    dims, dtype = call.dims, call.dtype
    width = dims.layer_input_size(layer)
    i_ih, i_hh = dims.index(layer, dr.k % dims.D, W_IH), dims.index(layer, dr.k % dims.D, W_HH)
    if dtype == x_rows.dtype:  # results in the compute dtype: written in
        product_into(gemm, dr.dg.T, x_rows, dparams[i_ih], plan.big)
        product_into(gemm, dr.dg.T, h_rows, dparams[i_hh], plan.big)
    else:  # float16 results: each product into scratch, then rounded
        cv = _conversion(plan, gemm)
        size = dims.G * width
        flat = dw_buf.reshape(-1)
        dw_ih = flat[:size].reshape(dims.G, width)
        dw_hh = flat[size : size + dims.G * dims.H].reshape(dims.G, dims.H)
        product_into(gemm, dr.dg.T, x_rows, dw_ih, plan.big)
        product_into(gemm, dr.dg.T, h_rows, dw_hh, plan.big)
        half.assign(dparams[i_ih], dw_ih, cv)
        half.assign(dparams[i_hh], dw_hh, cv)
    if dr.with_db:  # the rows' sums from the step kernels, added up in row order
        db = dr.db.sum(axis=0)
        dparams[dims.index(layer, dr.k % dims.D, B_IH)][...] = db
        dparams[dims.index(layer, dr.k % dims.D, B_HH)][...] = db


def _layer_input_rows(call: BackwardCall, st: _Steps, layer: int, masks: list | None,
                      cd: np.dtype, how: half.Conversion) -> np.ndarray | None:  # fmt: skip
    """The layer's input as dense [T*B, I_l] rows with no packing, where the steps are dense and
    it is one C-contiguous array already (x, or the one direction below without dropout);
    else None."""
    if not st.dense:
        return None
    if layer == 0:
        return _rows(_in(call.x, cd, how), st)
    if call.dims.D == 1 and masks is None:
        return _rows(_c(call.saved[4][layer - 1], cd, how), st)
    return None


def _pack_layer_input(call: BackwardCall, st: _Steps, layer: int, masks: list | None,
                      xh: np.ndarray, how: half.Conversion) -> None:  # fmt: skip
    """The layer's input (x, or the dropped-out output of the layer below), packed, into
    xh [N, I_l] (float16 converted as ``how`` says)."""
    dims, cd, hidden = call.dims, xh.dtype, call.dims.H
    if layer == 0:
        kernels.pack_rows(_in(call.x, cd, how), st.ns, st.offsets, xh, 0)
        return
    for d in range(dims.D):
        h_below = _c(call.saved[4][(layer - 1) * dims.D + d], cd, how)
        if masks is not None:
            m = masks[layer - 1][..., d * hidden : (d + 1) * hidden]
            kernels.pack_rows_scaled(h_below, m, st.ns, st.offsets, xh, d * hidden)
        else:
            kernels.pack_rows(h_below, st.ns, st.offsets, xh, d * hidden)


def lstm_backward(
    call: BackwardCall,
    arena: Arena | None = None,
    *,
    gemm: Gemm,
    plan: Plan,
) -> tuple[np.ndarray | None, np.ndarray | None, np.ndarray | None, list[np.ndarray] | None]:
    """Backward of every (layer, direction), top layer first; time-major dx [T, B, I].

    ``gemm`` and ``plan`` as in :func:`lstm_forward`.
    """
    if not any(call.need):
        return None, None, None, None
    run = _BackwardRun(call, arena or Arena(), gemm, plan)
    for layer in reversed(range(call.dims.L)):
        rows = run.layer_rows(layer)
        dirs = run.directions(layer)
        if run.plan.pair_walks:  # both directions' walks at once (fused.walks)
            run.walk_pair(layer, dirs, rows)
        dx_rows = run.dx_rows(layer)
        dx_parts = [run.direction(layer, dr, rows, dx_rows) for dr in dirs]
        if run.wants_dx(layer):
            run.layer_dx(layer, dx_parts, dx_rows)
    return run.dx_out, run.dh_prev, run.dc_prev, run.dparams


class _Rows:
    """A layer's rows for the weight gradient: ``x_rows`` the layer input (packed into scratch,
    or its own rows where they need no packing) and ``hp`` h_prev (gathered into scratch)."""

    def __init__(self, x_rows: np.ndarray, hp: np.ndarray) -> None:
        self.x_rows, self.hp = x_rows, hp


class _BackwardRun:
    """One :func:`lstm_backward` call: its scratch (from the arena), its results (one recycled
    allocation, dx in one of its own) and the steps of each layer."""

    def __init__(self, call: BackwardCall, arena: Arena, gemm: Gemm, plan: Plan) -> None:
        self.call, self.gemm, self.plan = call, gemm, plan
        dims, dtype = call.dims, call.dtype
        need_dx, need_dh, need_dc, need_dw = call.need
        self.cd = cd = compute_dtype(dtype)
        self.st = _steps(dims, call.mask)
        slots = backward_workspace_slots(dims, dtype, plan)
        (self.xh_buf, self.dg_buf, self.cp_buf, self.dw_buf, self.dh_buf, self.dc_buf,
         self.dx_buf, self.dy_buf, self.acts_buf, self.db_buf) = arena.take_all(slots)  # fmt: skip
        self.with_db = need_dw and dims.has_bias
        self.xh_flat = self.xh_buf.reshape(-1)
        # every result in one (recycled) allocation: see workspace.block
        state = (dims.K, dims.B, dims.H)
        dx_shape = (dims.T, dims.B, dims.I) if need_dx else (0,)
        dw_shapes = [p.shape for p in call.params] if need_dw else []
        # dx in an allocation of its own, so that keeping the small results does not pin it
        self.outs = block([dx_shape], dtype) + block([state, state] + dw_shapes, dtype)
        self.dh_prev = self.outs[1] if need_dh else None
        self.dc_prev = self.outs[2] if need_dc else None
        self.dparams = self.outs[3:] if need_dw else None
        self.dx_out: np.ndarray | None = None
        self.cv = cv = _conversion(plan, gemm)
        self.masks = [_c(m, cd, cv) for m in call.dropout_masks] if call.dropout_masks else None
        self.dy = None if call.dy is None else _in(call.dy, cd, cv)  # the layer's output gradient
        self.dummy = np.zeros((1, 1, 1), dtype=cd)

    def layer_rows(self, layer: int) -> _Rows:
        """The layer's rows for the weight gradient; where it is wanted, the layer input packed
        into them (or its own rows, where they need no packing)."""
        call, st = self.call, self.st
        width, hidden, n_rows = call.dims.layer_input_size(layer), call.dims.H, st.total
        x = _dense(self.xh_buf, n_rows, width)  # x [N, I_l] then h_prev [N, H], each dense
        hp = self.xh_flat[n_rows * width : n_rows * (width + hidden)].reshape(n_rows, hidden)
        rows = _Rows(x, hp)
        if not call.need[3]:
            return rows
        direct = _layer_input_rows(call, st, layer, self.masks, self.cd, self.cv)
        if direct is not None:
            rows.x_rows = direct
        else:
            _pack_layer_input(call, st, layer, self.masks, x, self.cv)
        return rows

    def directions(self, layer: int) -> list[_Direction]:
        """The layer's directions, each with its saved activations in the compute dtype (for
        float16 storage: converted just before its walk, into scratch shared by the
        directions, which then never walk as a pair) and its scratch."""
        dims, hidden, n_rows, cd = self.call.dims, self.call.dims.H, self.st.total, self.cd
        out = []
        for d in range(dims.D):
            k, p = layer * dims.D + d, (d if self.plan.pair_walks else 0)
            if cd == self.call.dtype:
                acts = tuple(_c(s[k], cd) for s in self.call.saved)
            else:
                acts = tuple(self.acts_buf)
            dy_d = self.dummy if self.dy is None else self.dy[..., d * hidden : (d + 1) * hidden]
            out.append(_Direction(k, acts, dy_d, self.dg_buf[p, :n_rows], self.cp_buf[p, :n_rows],
                                  self.dh_buf[p], self.dc_buf[p], self.db_buf[p],
                                  self.with_db))  # fmt: skip
        return out

    def walk_pair(self, layer: int, dirs: list[_Direction], rows: _Rows) -> None:
        """Both directions' step loops at once, each on a thread of its own (fused.walks);
        each direction's h_prev is gathered after them, in :meth:`direction`."""
        call, st, cd = self.call, self.st, self.cd
        fn = _walk_gemm(self.plan, self.gemm, cd)
        pair: list[walks.BackwardWalk] = []
        for dr in dirs:  # c_prev for the walks
            if not st.dense:  # else the walks read c_prev where it is saved
                _gather(call, st, dr.k, dr.acts, rows.hp, dr.cp, with_h=False)
            _initial_grads(call, dr)
            w_hh = _c(call.params[call.dims.index(layer, dr.k % 2, W_HH)], cd, self.cv)
            w = walk_operand(self.plan.walk_product, self.gemm, fn, w_hh, call.dims.B, len(pair))
            pair.append(_backward_walk(call, dr, w, st))
        flags = (call.need[1], st.dense, self.with_db)
        parts = _parts(self.plan, st, call.dims.B)
        walks.backward_walk_parts(pair[0], pair[1], parts, self.dy is not None, st.ns,
                                  st.offsets, flags, fn)  # fmt: skip

    def wants_dx(self, layer: int) -> bool:
        """Whether the layer's dx is computed: the layer below's dy, or the wanted result."""
        return layer > 0 or self.call.need[0]

    def dx_rows(self, layer: int) -> np.ndarray | None:
        """Dense steps: the [T*B] rows that dx of this layer is written into where no copy is
        needed (the layer below's dy, or the result); else None."""
        if self.wants_dx(layer) and (layer > 0 or self.cd == self.call.dtype):
            return _rows(self.dy_buf if layer > 0 else self.outs[0], self.st)
        return None

    def direction(self, layer: int, dr: _Direction, rows: _Rows,
                  dx_rows: np.ndarray | None) -> np.ndarray | None:  # fmt: skip
        """One direction's step loop (unless walked as a pair), its dh_prev and dc_prev, its
        part of dx ([N, I_l], returned; None where dx is not wanted) and its weight gradient."""
        call, st, plan, cd, cv = self.call, self.st, self.plan, self.cd, self.cv
        dims, need_dw = call.dims, call.need[3]
        d, width = dr.k % dims.D, dims.layer_input_size(layer)
        if not plan.pair_walks:
            if cd != call.dtype:
                for n_, s in enumerate(call.saved):
                    half.assign(self.acts_buf[n_], s[dr.k], cv)
            c_packed = not st.dense  # else the steps read c_prev where it is saved
            if need_dw or c_packed:
                _gather(call, st, dr.k, dr.acts, rows.hp, dr.cp, need_dw, c_packed)
            _initial_grads(call, dr)
            w_hh = _c(call.params[dims.index(layer, d, W_HH)], cd, cv)  # [4H, H]
            _walk_back(call, plan, self.gemm, st, w_hh, dr, self.dy is not None)
        elif need_dw:  # this direction's h_prev (the directions share hp)
            _gather(call, st, dr.k, dr.acts, rows.hp, dr.cp, with_c=False)
        if self.dh_prev is not None:
            self.dh_prev[dr.k] = dr.dh
        if self.dc_prev is not None:
            self.dc_prev[dr.k] = dr.dc
        dx_part = None
        if self.wants_dx(layer):
            w_ih = _c(call.params[dims.index(layer, d, W_IH)], cd, cv)  # [4H, I_l]
            dx_dense = _dense(self.dx_buf[d], st.total, width)
            if dx_rows is not None and dims.D == 1:  # the result's own rows
                dx_dense = dx_rows
            dx_part = self.gemm.product(dr.dg, w_ih, dx_dense, plan.big)  # [N, I_l]
        if self.dparams is not None:
            _weight_grads(call, plan, self.gemm, layer, dr, rows.x_rows, rows.hp, self.dw_buf,
                          self.dparams)  # fmt: skip
        return dx_part

    def layer_dx(self, layer: int, dx_parts: list, dx_rows: np.ndarray | None) -> None:
        """The layer's dx from its directions' parts: each rounded to the storage dtype and
        summed in it (docs/math.md); above layer 0 it becomes the next layer's dy (times the
        dropout mask), at layer 0 the result dx."""
        call, st, dtype, tt = self.call, self.st, self.call.dtype, self.plan.transpose_threads
        total = _rounded(dx_parts[0], dtype, tt)
        if call.dims.D == 2:
            into = total if dx_rows is None else dx_rows
            np.add(total, _rounded(dx_parts[1], dtype, tt), out=into)
            total = _rounded(into, dtype, tt)
        elif dx_rows is not None and total is not dx_rows:  # the library's own result
            np.copyto(dx_rows, total)
            total = dx_rows
        if layer > 0:
            self.dy = self.dy_buf
            if total is not dx_rows:
                kernels.unpack_rows(total, st.ns, st.offsets, self.dy)
            if self.masks is not None:
                np.multiply(self.dy, self.masks[layer - 1], out=self.dy)
                _rounded(self.dy, dtype, tt)
            return
        self.dx_out = self.outs[0]
        if self.cd == dtype:
            if total is not dx_rows:
                kernels.unpack_rows(total, st.ns, st.offsets, self.dx_out)
            return
        if st.dense:
            dx_cd = total.reshape(call.dims.T, call.dims.B, call.dims.I)
        else:
            dx_cd = np.empty((call.dims.T, call.dims.B, call.dims.I), dtype=self.cd)
            kernels.unpack_rows(total, st.ns, st.offsets, dx_cd)
        half.assign(self.dx_out, dx_cd, self.cv)  # exact: the values are already float16-rounded
