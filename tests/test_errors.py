"""Rejection tests for the Pythonic API (docs/contract.md#error-codes): one test per contract rule.

Every test starts from a valid call (T5-B3-I4-H6-L2-D2, bias, float32), breaks exactly one
argument and checks the error's class, ``.code``, ``.param`` and that the message names the
argument, the expected and the actual value. The last tests check that errors come before any
computation and that valid edge values are not rejected.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

import lstmgrad
from lstmgrad import LstmArgumentError, LstmInvalidArgumentError, LstmNullArgumentError

T, B, I, H, L, D = 5, 3, 4, 6, 2, 2
K = L * D
G = 4 * H
F32 = np.float32
SAVED = ("i", "g", "f", "o", "h", "c", "tanhc")
FLAGS = ("has_bias", "train", "bidirectional", "batch_first")

NULL = 161001
INVALID = 161002


# ---------------------------------------------------------------------------------------------
# Valid calls


def make_params(
    rng: np.random.Generator,
    num_layers: int = L,
    num_dirs: int = D,
    has_bias: bool = True,
    dtype: Any = F32,
) -> list[np.ndarray]:
    """params in PyTorch _flat_weights order for I, H of this module."""
    out = []
    for layer in range(num_layers):
        isz = I if layer == 0 else num_dirs * H
        shapes = [(G, isz), (G, H)] + ([(G,), (G,)] if has_bias else [])
        for _ in range(num_dirs):
            out += [(rng.standard_normal(s) * 0.3).astype(dtype) for s in shapes]
    return out


@dataclass
class BackwardCase:
    """All arguments of a valid lstm_backward call, by keyword."""

    args: dict[str, Any]
    flags: dict[str, Any] = field(default_factory=dict)

    def kwargs(self, **over: Any) -> dict[str, Any]:
        kw = {**self.args, **self.flags}
        kw.update(over)
        return kw

    def call(self, **over: Any) -> lstmgrad.LstmBackwardResult:
        return lstmgrad.lstm_backward(**self.kwargs(**over))


@dataclass
class ForwardCase:
    """All arguments of a valid lstm_forward call, by keyword."""

    args: dict[str, Any]

    def call(self, **over: Any) -> lstmgrad.LstmForwardResult:
        return lstmgrad.lstm_forward(**{**self.args, **over})


def _backward_case(
    x: np.ndarray,
    hx: list[np.ndarray],
    params: list[np.ndarray],
    fwd: lstmgrad.LstmForwardResult,
    flags: dict[str, Any],
    batch_sizes: Any = None,
) -> BackwardCase:
    rng = np.random.default_rng(1)
    assert fwd.saved is not None
    args: dict[str, Any] = {
        "input": x,
        "hx": hx,
        "params": params,
        "dy": rng.standard_normal(fwd.output.shape).astype(x.dtype),
        "dh": rng.standard_normal((K, B, H)).astype(x.dtype),
        "dc": rng.standard_normal((K, B, H)).astype(x.dtype),
        **{n: list(v) for n, v in zip(SAVED, fwd.saved[:7], strict=True)},
        "batch_sizes": batch_sizes,
    }
    if fwd.saved.dropout_masks is not None:
        args["dropout_masks"] = list(fwd.saved.dropout_masks)
    return BackwardCase(args, flags)


@pytest.fixture(scope="module")
def dense() -> BackwardCase:
    """T5-B3-I4-H6-L2-D2, bias, float32, time-major, no dropout."""
    rng = np.random.default_rng(0)
    params = make_params(rng)
    x = rng.standard_normal((T, B, I)).astype(F32)
    hx = [rng.standard_normal((K, B, H)).astype(F32) for _ in range(2)]
    flags = {"num_layers": L, "bidirectional": True, "has_bias": True}
    fwd = lstmgrad.lstm_forward(x, params, hx, **flags)
    return _backward_case(x, hx, params, fwd, flags)


@pytest.fixture(scope="module")
def varlen() -> BackwardCase:
    """The same sizes with batch_sizes [3, 3, 2, 2, 1]: input [T*B, I], dy [T*B, D*H]."""
    rng = np.random.default_rng(0)
    params = make_params(rng)
    x = rng.standard_normal((T * B, I)).astype(F32)
    hx = [rng.standard_normal((K, B, H)).astype(F32) for _ in range(2)]
    bs = np.array([3, 3, 2, 2, 1], dtype=np.int64)
    flags = {"num_layers": L, "bidirectional": True, "has_bias": True}
    fwd = lstmgrad.lstm_forward(x, params, hx, bs, **flags)
    return _backward_case(x, hx, params, fwd, flags, batch_sizes=bs)


@pytest.fixture(scope="module")
def with_dropout() -> BackwardCase:
    """The dense case trained with dropout 0.5 (seeded): one mask [T, B, D*H]."""
    rng = np.random.default_rng(0)
    params = make_params(rng)
    x = rng.standard_normal((T, B, I)).astype(F32)
    hx = [rng.standard_normal((K, B, H)).astype(F32) for _ in range(2)]
    flags = {"num_layers": L, "bidirectional": True, "dropout": 0.5, "train": True}
    fwd = lstmgrad.lstm_forward(x, params, hx, seed=0, **flags)
    case = _backward_case(x, hx, params, fwd, flags)
    assert len(case.args["dropout_masks"]) == L - 1
    return case


@pytest.fixture(scope="module")
def forward() -> ForwardCase:
    rng = np.random.default_rng(0)
    return ForwardCase(
        {
            "input": rng.standard_normal((T, B, I)).astype(F32),
            "params": make_params(rng),
            "hx": [rng.standard_normal((K, B, H)).astype(F32) for _ in range(2)],
            "num_layers": L,
            "bidirectional": True,
        }
    )


@pytest.fixture(scope="module")
def forward_varlen(forward: ForwardCase) -> ForwardCase:
    args = dict(forward.args)
    args["input"] = args["input"].reshape(T * B, I)
    args["batch_sizes"] = [3, 3, 2, 2, 1]
    return ForwardCase(args)


def test_fixtures_are_valid(
    dense: BackwardCase,
    varlen: BackwardCase,
    with_dropout: BackwardCase,
    forward: ForwardCase,
    forward_varlen: ForwardCase,
) -> None:
    for case in (dense, varlen, with_dropout):
        r = case.call()
        assert r.dx.shape == case.args["input"].shape
        assert r.dh_prev.shape == (K, B, H)
        assert [p.shape for p in r.dparams] == [p.shape for p in case.args["params"]]
    assert forward.call().output.shape == (T, B, D * H)
    assert forward_varlen.call().output.shape == (T * B, D * H)


# ---------------------------------------------------------------------------------------------
# Helpers


def replaced(seq: Any, j: int, value: Any) -> list[Any]:
    """A new list equal to ``seq`` with element ``j`` replaced."""
    out = list(seq)
    out[j] = value
    return out


def expect_error(
    fn: Callable[[], Any],
    cls: type[LstmArgumentError],
    param: str,
    *needles: str,
    func: str = "lstm_backward",
) -> LstmArgumentError:
    """Run ``fn``; it must raise exactly ``cls`` with the contract's code, ``param`` and a
    message starting with the function name and containing every needle."""
    with pytest.raises(LstmArgumentError) as info:
        fn()
    err = info.value
    assert type(err) is cls, f"{type(err).__name__}: {err}"
    assert isinstance(err, lstmgrad.LstmError)
    if cls is LstmNullArgumentError:
        assert err.code == NULL == lstmgrad.ACLNN_ERR_PARAM_NULLPTR
        assert isinstance(err, TypeError)
    else:
        assert err.code == INVALID == lstmgrad.ACLNN_ERR_PARAM_INVALID
        assert isinstance(err, ValueError)
    assert err.param == param, str(err)
    msg = str(err)
    assert msg.startswith(f"{func}: "), msg
    for needle in needles:
        assert needle in msg, f"{needle!r} not in {msg!r}"
    return err


def shape_str(shape: tuple[int, ...]) -> str:
    return "[" + ", ".join(str(s) for s in shape) + "]"


# ---------------------------------------------------------------------------------------------
# lstm_backward: 161001


@pytest.mark.parametrize("name", ["input", "hx", "params", "i", "g", "f", "o", "h", "c", "tanhc"])
def test_backward_required_argument_none(dense: BackwardCase, name: str) -> None:
    expect_error(
        lambda: dense.call(**{name: None}), LstmNullArgumentError, name, name, "required", "None"
    )


@pytest.mark.parametrize(
    "name, j",
    [("hx", 0), ("hx", 1), ("params", 0), ("params", 5), ("params", 15)]
    + [(n, j) for n, j in zip(SAVED, [0, 1, 2, 3, 0, 2, 3], strict=True)],
)
def test_backward_none_inside_list(dense: BackwardCase, name: str, j: int) -> None:
    bad = replaced(dense.args[name], j, None)
    expect_error(
        lambda: dense.call(**{name: bad}), LstmNullArgumentError, name, f"{name}[{j}]", "None"
    )


def test_backward_none_inside_dropout_masks(with_dropout: BackwardCase) -> None:
    expect_error(
        lambda: with_dropout.call(dropout_masks=[None]),
        LstmNullArgumentError,
        "dropout_masks",
        "dropout_masks[0]",
        "None",
    )


# ---------------------------------------------------------------------------------------------
# lstm_backward: dtypes


@pytest.mark.parametrize(
    "dtype", [np.int32, np.int64, np.complex64, np.bool_, np.object_, np.uint8]
)
def test_backward_unsupported_input_dtype(dense: BackwardCase, dtype: Any) -> None:
    x = dense.args["input"].astype(dtype)
    expect_error(
        lambda: dense.call(input=x),
        LstmInvalidArgumentError,
        "input",
        "input",
        "float32",
        str(np.dtype(dtype)),
    )


def _set_dtype(case: BackwardCase, name: str, j: int | None, dtype: Any) -> dict[str, Any]:
    v = case.args[name]
    if j is None:
        return {name: v.astype(dtype)}
    return {name: replaced(v, j, v[j].astype(dtype))}


@pytest.mark.parametrize("other", [np.float64, np.float16])
@pytest.mark.parametrize(
    "name, j",
    [("hx", 0), ("hx", 1), ("params", 0), ("params", 2), ("params", 9), ("params", 15)]
    + [("dy", None), ("dh", None), ("dc", None)]
    + [(n, j) for n, j in zip(SAVED, [0, 1, 2, 3, 1, 2, 3], strict=True)],
)
def test_backward_dtype_differs_from_input(
    dense: BackwardCase, name: str, j: int | None, other: Any
) -> None:
    label = name if j is None else f"{name}[{j}]"
    expect_error(
        lambda: dense.call(**_set_dtype(dense, name, j, other)),
        LstmInvalidArgumentError,
        name,
        label,
        "float32",
        str(np.dtype(other)),
    )


def test_backward_dropout_mask_dtype_differs(with_dropout: BackwardCase) -> None:
    masks = [m.astype(np.float64) for m in with_dropout.args["dropout_masks"]]
    expect_error(
        lambda: with_dropout.call(dropout_masks=masks),
        LstmInvalidArgumentError,
        "dropout_masks",
        "dropout_masks[0]",
        "float32",
        "float64",
    )


def test_backward_float16_input_with_float32_rest(dense: BackwardCase) -> None:
    """Mixed precision: float16 input, everything else float32 -> the first other tensor."""
    x = dense.args["input"].astype(np.float16)
    expect_error(
        lambda: dense.call(input=x),
        LstmInvalidArgumentError,
        "params",
        "params[0]",
        "float16",
        "float32",
    )


# ---------------------------------------------------------------------------------------------
# lstm_backward: shapes


def _zeros(shape: tuple[int, ...]) -> np.ndarray:
    return np.zeros(shape, dtype=F32)


# (id, argument, index or None, bad shape, expected shape, extra flags)
SHAPE_CASES = [
    ("dy-last-dim-H", "dy", None, (T, B, H), (T, B, D * H), {}),
    ("dy-T", "dy", None, (T + 1, B, D * H), (T, B, D * H), {}),
    ("dy-B", "dy", None, (T, B - 1, D * H), (T, B, D * H), {}),
    ("dy-2d", "dy", None, (T * B, D * H), (T, B, D * H), {}),
    ("dh-first-dim", "dh", None, (K - 1, B, H), (K, B, H), {}),
    ("dh-H", "dh", None, (K, B, H + 1), (K, B, H), {}),
    ("dc-B", "dc", None, (K, B + 1, H), (K, B, H), {}),
    ("dc-2d", "dc", None, (B, H), (K, B, H), {}),
    ("hx0-first-dim", "hx", 0, (L, B, H), (K, B, H), {}),
    ("hx1-B", "hx", 1, (K, B + 2, H), (K, B, H), {}),
    ("i0-T", "i", 0, (T - 1, B, H), (T, B, H), {}),
    ("g1-B", "g", 1, (T, B + 1, H), (T, B, H), {}),
    ("f2-H", "f", 2, (T, B, H - 1), (T, B, H), {}),
    ("o3-batch-first", "o", 3, (B, T, H), (T, B, H), {}),
    ("h0-T", "h", 0, (T + 1, B, H), (T, B, H), {}),
    ("c1-2d", "c", 1, (T, B * H), (T, B, H), {}),
    ("tanhc3-T", "tanhc", 3, (T - 1, B, H), (T, B, H), {}),
    ("w_ih_l0-columns", "params", 0, (G, I + 1), (G, I), {}),
    ("w_ih_l1-I-columns", "params", 8, (G, I), (G, D * H), {}),
    ("w_ih_l1_reverse-H-columns", "params", 12, (G, H), (G, D * H), {}),
    ("w_hh_l0_reverse", "params", 5, (G, H + 1), (G, H), {}),
    ("w_hh_l1-transposed", "params", 9, (H, G), (G, H), {}),
    ("b_ih_l0-length", "params", 2, (G - 1,), (G,), {}),
    ("b_hh_l0-2d", "params", 3, (G, 1), (G,), {}),
    ("b_hh_l1_reverse-length", "params", 15, (H,), (G,), {}),
    # params[1] (weight_hh_l0) is where H is read from: a bad one must still be blamed
    ("w_hh_l0-columns", "params", 1, (G, H + 1), (G, H), {}),
    ("w_hh_l0-rows", "params", 1, (G + 4, H), (G, H), {}),
]


@pytest.mark.parametrize(
    "name, j, bad, expected, flags", [c[1:] for c in SHAPE_CASES], ids=[c[0] for c in SHAPE_CASES]
)
def test_backward_wrong_shape(
    dense: BackwardCase,
    name: str,
    j: int | None,
    bad: tuple[int, ...],
    expected: tuple[int, ...],
    flags: dict[str, Any],
) -> None:
    if j is None:
        over: dict[str, Any] = {name: _zeros(bad)}
        label = name
    else:
        over = {name: replaced(dense.args[name], j, _zeros(bad))}
        label = f"{name}[{j}]"
    expect_error(
        lambda: dense.call(**over, **flags),
        LstmInvalidArgumentError,
        name,
        label,
        shape_str(expected),
        shape_str(bad),
    )


def test_backward_wrong_shape_batch_first_dy(dense: BackwardCase) -> None:
    """batch_first: input [B, T, I] wants dy [B, T, D*H]; a time-major dy is rejected."""
    x = np.ascontiguousarray(dense.args["input"].transpose(1, 0, 2))
    expect_error(
        lambda: dense.call(input=x, batch_first=True),
        LstmInvalidArgumentError,
        "dy",
        "dy",
        shape_str((B, T, D * H)),
        shape_str((T, B, D * H)),
    )


def test_backward_wrong_shape_varlen(varlen: BackwardCase) -> None:
    """With batch_sizes dy is [T*B, D*H]; a 3-D dy is rejected."""
    expect_error(
        lambda: varlen.call(dy=_zeros((T, B, D * H))),
        LstmInvalidArgumentError,
        "dy",
        "dy",
        shape_str((T * B, D * H)),
        shape_str((T, B, D * H)),
    )


def test_backward_wrong_input_size(dense: BackwardCase) -> None:
    """I is read from input: an input with I+1 features no longer matches weight_ih_l0."""
    x = _zeros((T, B, I + 1))
    expect_error(
        lambda: dense.call(input=x),
        LstmInvalidArgumentError,
        "params",
        "params[0]",
        shape_str((G, I + 1)),
        shape_str((G, I)),
    )


# ---------------------------------------------------------------------------------------------
# lstm_backward: list lengths and list types


def test_backward_hx_wrong_length(dense: BackwardCase) -> None:
    hx = dense.args["hx"]
    for bad in ([hx[0], hx[1], hx[1]], [hx[0]], []):
        expect_error(
            lambda bad=bad: dense.call(hx=bad),
            LstmInvalidArgumentError,
            "hx",
            "hx",
            "length 2",
            f"length {len(bad)}",
        )


@pytest.mark.parametrize(
    "layers, dirs, bias, flags",
    [
        (1, 2, True, {}),  # params of a 1-layer LSTM for num_layers = 2
        (3, 2, True, {}),  # params of a 3-layer LSTM
        (2, 2, False, {}),  # params without bias, has_bias = True
        (2, 1, True, {}),  # params of a unidirectional LSTM, bidirectional = True
        (2, 2, True, {"has_bias": False}),  # params with bias, has_bias = False
        (2, 2, True, {"num_layers": 3}),
        (2, 2, True, {"num_layers": 1}),
    ],
    ids=[
        "L1-params",
        "L3-params",
        "nobias-params",
        "D1-params",
        "has_bias-False",
        "num_layers-3",
        "num_layers-1",
    ],
)
def test_backward_params_wrong_length(
    dense: BackwardCase, layers: int, dirs: int, bias: bool, flags: dict[str, Any]
) -> None:
    params = make_params(np.random.default_rng(3), layers, dirs, bias)
    fl = {**dense.flags, **flags}
    want = fl["num_layers"] * 2 * (4 if fl["has_bias"] else 2)
    expect_error(
        lambda: dense.call(params=params, **flags),
        LstmInvalidArgumentError,
        "params",
        "params",
        f"length {want}",
        f"length {len(params)}",
    )


def test_backward_bidirectional_false_with_bidirectional_params(dense: BackwardCase) -> None:
    expect_error(
        lambda: dense.call(bidirectional=False),
        LstmInvalidArgumentError,
        "params",
        "params",
        "length 8",
        "length 16",
    )


@pytest.mark.parametrize("name", SAVED)
@pytest.mark.parametrize("delta", [-1, +1])
def test_backward_saved_list_wrong_length(dense: BackwardCase, name: str, delta: int) -> None:
    lst = list(dense.args[name])
    bad = lst[:-1] if delta < 0 else lst + [lst[0]]
    expect_error(
        lambda: dense.call(**{name: bad}),
        LstmInvalidArgumentError,
        name,
        name,
        f"length {K}",
        f"length {K + delta}",
    )


@pytest.mark.parametrize(
    "name, make_bad, got",
    [
        ("hx", lambda c: np.stack(c.args["hx"]), "ndarray"),
        ("hx", lambda c: c.args["hx"][0], "ndarray"),
        ("params", lambda c: (p for p in c.args["params"]), "generator"),
        ("params", lambda c: {j: p for j, p in enumerate(c.args["params"])}, "dict"),
        ("i", lambda c: np.stack(c.args["i"]), "ndarray"),
        ("tanhc", lambda c: "tanhc", "str"),
    ],
    ids=["hx-stacked", "hx-one-array", "params-generator", "params-dict", "i-stacked", "tanhc-str"],
)
def test_backward_list_argument_not_a_list(
    dense: BackwardCase, name: str, make_bad: Callable[[BackwardCase], Any], got: str
) -> None:
    expect_error(
        lambda: dense.call(**{name: make_bad(dense)}),
        LstmInvalidArgumentError,
        name,
        name,
        "list",
        got,
    )


# ---------------------------------------------------------------------------------------------
# lstm_backward: non-ndarray where an array is expected


@pytest.mark.parametrize(
    "name, j",
    [
        ("input", None),
        ("dy", None),
        ("dh", None),
        ("dc", None),
        ("hx", 0),
        ("params", 3),
        ("params", 8),
        ("i", 0),
        ("tanhc", 2),
    ],
)
def test_backward_not_an_ndarray(dense: BackwardCase, name: str, j: int | None) -> None:
    if j is None:
        over = {name: dense.args[name].tolist()}
        label = name
    else:
        lst = dense.args[name]
        over = {name: replaced(lst, j, lst[j].tolist())}
        label = f"{name}[{j}]"
    expect_error(
        lambda: dense.call(**over),
        LstmInvalidArgumentError,
        name,
        label,
        "numpy.ndarray",
        "list",
    )


def test_backward_scalar_instead_of_array(dense: BackwardCase) -> None:
    expect_error(
        lambda: dense.call(dc=0.0), LstmInvalidArgumentError, "dc", "dc", "numpy.ndarray", "float"
    )


def test_backward_params1_not_an_ndarray(dense: BackwardCase) -> None:
    """params[1] (weight_hh_l0) gives H: a list there is rejected with its own message."""
    bad = replaced(dense.args["params"], 1, dense.args["params"][1].tolist())
    expect_error(
        lambda: dense.call(params=bad),
        LstmInvalidArgumentError,
        "params",
        "params[1]",
        "[4H, H]",
        "list",
    )


# ---------------------------------------------------------------------------------------------
# lstm_backward: scalar flags


@pytest.mark.parametrize(
    "value, got",
    [
        (0, "0"),
        (-1, "-1"),
        (1.5, "float"),
        (True, "bool"),
        (np.bool_(True), "bool"),
        ("2", "str"),
        (None, "NoneType"),
        (2.0, "float"),
    ],
    ids=["zero", "negative", "float", "True", "np-True", "str", "None", "float-2.0"],
)
def test_backward_num_layers_invalid(dense: BackwardCase, value: Any, got: str) -> None:
    expect_error(
        lambda: dense.call(num_layers=value),
        LstmInvalidArgumentError,
        "num_layers",
        "num_layers",
        ">= 1",
        got,
    )


@pytest.mark.parametrize("name", FLAGS)
@pytest.mark.parametrize(
    "value, got",
    [
        (1, "int"),
        (0, "int"),
        ("yes", "str"),
        (None, "NoneType"),
        (1.0, "float"),
        (np.int64(1), "int64"),
        (np.array([True]), "ndarray"),
    ],
    ids=["int-1", "int-0", "str", "None", "float", "np-int64", "np-array"],
)
def test_backward_flag_not_bool(dense: BackwardCase, name: str, value: Any, got: str) -> None:
    expect_error(
        lambda: dense.call(**{name: value}),
        LstmInvalidArgumentError,
        name,
        name,
        "bool",
        got,
    )


@pytest.mark.parametrize(
    "value, got",
    [
        (-0.1, "-0.1"),
        (1.5, "1.5"),
        (float("nan"), "nan"),
        (float("inf"), "inf"),
        (-math.inf, "-inf"),
        ("0.1", "str"),
        (True, "bool"),
        (None, "NoneType"),
        (np.float32(2.0), "2.0"),
        (1.0 + 0j, "complex"),
    ],
    ids=["negative", "above-1", "nan", "inf", "-inf", "str", "True", "None", "np-2.0", "complex"],
)
def test_backward_dropout_invalid(dense: BackwardCase, value: Any, got: str) -> None:
    expect_error(
        lambda: dense.call(dropout=value),
        LstmInvalidArgumentError,
        "dropout",
        "dropout",
        "[0, 1]",
        got,
    )


# ---------------------------------------------------------------------------------------------
# lstm_backward: batch_sizes


@pytest.mark.parametrize(
    "value, got",
    [
        (np.array([3.0, 3, 2, 2, 1]), "float64"),
        (np.array([3, 3, 2, 2, 1], dtype=np.int32), "int32"),
        (np.array([[3, 3, 2, 2, 1]], dtype=np.int64), "[1, 5]"),
        (np.array(3, dtype=np.int64), "[]"),
        ([3.0, 3.0, 2.0, 2.0, 1.0], "list"),
        ([True, True, True, True, True], "list"),
        ([[3, 3], [2, 2, 1]], "list"),
        ("33221", "str"),
        (5, "int"),
    ],
    ids=[
        "float-array",
        "int32-array",
        "2d-array",
        "0d-array",
        "float-list",
        "bool-list",
        "nested-list",
        "str",
        "int",
    ],
)
def test_backward_batch_sizes_wrong_type(varlen: BackwardCase, value: Any, got: str) -> None:
    expect_error(
        lambda: varlen.call(batch_sizes=value),
        LstmInvalidArgumentError,
        "batch_sizes",
        "batch_sizes",
        "1-D int64",
        got,
    )


@pytest.mark.parametrize(
    "value, t",
    [
        ([3, 3, B + 1, 2, 1], 2),
        ([3, 3, 2, 2, -1], 4),
        (np.array([-5, 3, 2, 2, 1]), 0),
        ([3, 3, 2, 2, 100], 4),
    ],
    ids=["above-B", "negative", "negative-array", "far-above-B"],
)
def test_backward_batch_sizes_out_of_range(varlen: BackwardCase, value: Any, t: int) -> None:
    expect_error(
        lambda: varlen.call(batch_sizes=value),
        LstmInvalidArgumentError,
        "batch_sizes",
        "batch_sizes",
        f"[0, B] with B = {B}",
        f"batch_sizes[{t}] = {int(value[t])}",
    )


def test_backward_batch_sizes_beyond_int64(varlen: BackwardCase) -> None:
    """A Python int that does not fit int64 is out of range, not an OverflowError."""
    value = [3, 3, 2, 2, 2**70]
    expect_error(
        lambda: varlen.call(batch_sizes=value),
        LstmInvalidArgumentError,
        "batch_sizes",
        "batch_sizes",
        str(2**70),
    )


def test_backward_batch_sizes_i0_not_3d(varlen: BackwardCase) -> None:
    """With batch_sizes B is read from i[0]: a 2-D i[0] is rejected as i."""
    bad = replaced(varlen.args["i"], 0, varlen.args["i"][0][0])
    expect_error(
        lambda: varlen.call(i=bad),
        LstmInvalidArgumentError,
        "i",
        "i[0]",
        "[T, B, H]",
        shape_str((B, H)),
    )


# ---------------------------------------------------------------------------------------------
# lstm_backward: input rank and rows


@pytest.mark.parametrize(
    "shape, with_bs, expected",
    [
        ((T * B, I), False, "3-D"),
        ((T, B, I, 1), False, "3-D"),
        ((T * B * I,), False, "3-D"),
        ((T, B, I), True, "2-D"),
        ((T * B * I,), True, "2-D"),
        ((T, B, I, 1), True, "2-D"),
    ],
    ids=["2d-no-bs", "4d-no-bs", "1d-no-bs", "3d-bs", "1d-bs", "4d-bs"],
)
def test_backward_input_rank(
    dense: BackwardCase,
    varlen: BackwardCase,
    shape: tuple[int, ...],
    with_bs: bool,
    expected: str,
) -> None:
    case = varlen if with_bs else dense
    expect_error(
        lambda: case.call(input=_zeros(shape)),
        LstmInvalidArgumentError,
        "input",
        "input",
        expected,
        shape_str(shape),
    )


@pytest.mark.parametrize(
    "rows, bs, expected_rows",
    [
        (T * B - 1, [3, 3, 2, 2, 1], T * B),
        (T * B + B, [3, 3, 2, 2, 1], T * B),
        (T * B, [3, 3, 2, 2], (T - 1) * B),
    ],
    ids=["one-row-short", "one-step-too-many", "batch_sizes-shorter-than-T"],
)
def test_backward_input_rows_with_batch_sizes(
    varlen: BackwardCase, rows: int, bs: list[int], expected_rows: int
) -> None:
    expect_error(
        lambda: varlen.call(input=_zeros((rows, I)), batch_sizes=bs),
        LstmInvalidArgumentError,
        "input",
        "input",
        shape_str((expected_rows, I)),
        shape_str((rows, I)),
    )


# ---------------------------------------------------------------------------------------------
# lstm_backward: output_mask


@pytest.mark.parametrize(
    "value, got",
    [
        ((True, True, True), "length 3"),
        ([True] * 5, "length 5"),
        ((1, 0, 1, 1), "1, 0, 1, 1"),
        ([True, True, True, None], "None"),
        ([True, True, "yes", True], "'yes'"),
        ("1111", "str"),
        (True, "bool"),
        (np.array([1, 0, 1, 1]), "int64"),
        (np.ones((2, 2), dtype=bool), "[2, 2]"),
        ({True, False}, "set"),
    ],
    ids=[
        "length-3",
        "length-5",
        "ints",
        "None-entry",
        "str-entry",
        "str",
        "bool",
        "int-array",
        "2d-bool-array",
        "set",
    ],
)
def test_backward_output_mask_invalid(dense: BackwardCase, value: Any, got: str) -> None:
    expect_error(
        lambda: dense.call(output_mask=value),
        LstmInvalidArgumentError,
        "output_mask",
        "output_mask",
        "4 booleans",
        got,
    )


# ---------------------------------------------------------------------------------------------
# lstm_backward: dropout_masks


def test_backward_dropout_masks_required(with_dropout: BackwardCase) -> None:
    """dropout > 0, train and num_layers > 1 without the masks: the gradient is not exact."""
    expect_error(
        lambda: with_dropout.call(dropout_masks=None),
        LstmInvalidArgumentError,
        "dropout_masks",
        "dropout_masks",
        "required",
        "None",
    )


@pytest.mark.parametrize(
    "flags, make_masks, got",
    [
        ({"dropout": 0.0}, lambda m: list(m), "list of 1"),
        ({"dropout": 0.0}, lambda m: tuple(m), "of 1"),
        ({"dropout": 0}, lambda m: [m[0], m[0]], "list of 2"),
        ({"dropout": 0.5, "train": False}, lambda m: list(m), "list of 1"),
        ({"dropout": 0.0}, lambda m: np.stack(m), "ndarray"),
        ({"dropout": 0.0}, lambda m: m[0][0, 0, 0], "float32"),  # a NumPy scalar
        ({"dropout": 0.0}, lambda m: 5, "int"),
    ],
    ids=[
        "list-dropout-0",
        "tuple-dropout-0",
        "two-dropout-int-0",
        "train-False",
        "ndarray-dropout-0",
        "np-scalar-dropout-0",
        "int-dropout-0",
    ],
)
def test_backward_dropout_masks_without_dropout(
    with_dropout: BackwardCase,
    flags: dict[str, Any],
    make_masks: Callable[[Any], Any],
    got: str,
) -> None:
    """Masks that would be ignored (dropout == 0 or train False) are rejected."""
    masks = make_masks(with_dropout.args["dropout_masks"])
    expect_error(
        lambda: with_dropout.call(dropout_masks=masks, **flags),
        LstmInvalidArgumentError,
        "dropout_masks",
        "dropout_masks",
        "must be None",
        got,
    )


@pytest.mark.parametrize(
    "make_masks, label, expected, got",
    [
        (lambda m: [], "dropout_masks", "length 1", "length 0"),
        (lambda m: [m[0], m[0]], "dropout_masks", "length 1", "length 2"),
        (lambda m: [_zeros((T, B, H))], "dropout_masks[0]", "[5, 3, 12]", "[5, 3, 6]"),
        (lambda m: [_zeros((B, T, D * H))], "dropout_masks[0]", "[5, 3, 12]", "[3, 5, 12]"),
        (lambda m: [_zeros((T * B, D * H))], "dropout_masks[0]", "[5, 3, 12]", "[15, 12]"),
        (lambda m: [m[0].tolist()], "dropout_masks[0]", "numpy.ndarray", "list"),
        (lambda m: np.stack(m), "dropout_masks", "list", "ndarray"),
    ],
    ids=["empty", "two", "width-H", "batch-first", "flat", "list-element", "ndarray"],
)
def test_backward_dropout_masks_wrong_length_or_shape(
    with_dropout: BackwardCase,
    make_masks: Callable[[Any], Any],
    label: str,
    expected: str,
    got: str,
) -> None:
    masks = make_masks(with_dropout.args["dropout_masks"])
    expect_error(
        lambda: with_dropout.call(dropout_masks=masks),
        LstmInvalidArgumentError,
        "dropout_masks",
        label,
        expected,
        got,
    )


def test_backward_dropout_masks_for_one_layer(dense: BackwardCase) -> None:
    """num_layers = 1 has no mask: a non-empty list is the wrong length."""
    rng = np.random.default_rng(4)
    params = make_params(rng, 1, D, True)
    x = dense.args["input"]
    hx = [a[:D] for a in dense.args["hx"]]
    fwd = lstmgrad.lstm_forward(x, params, hx, num_layers=1, bidirectional=True)
    kw = {n: list(v) for n, v in zip(SAVED, fwd.saved[:7], strict=True)}
    expect_error(
        lambda: lstmgrad.lstm_backward(
            x,
            hx,
            params,
            None,
            None,
            None,
            **kw,
            num_layers=1,
            bidirectional=True,
            dropout=0.5,
            dropout_masks=[_zeros((T, B, D * H))],
        ),
        LstmInvalidArgumentError,
        "dropout_masks",
        "dropout_masks",
        "length 0",
        "length 1",
    )


# ---------------------------------------------------------------------------------------------
# lstm_forward


@pytest.mark.parametrize("name", ["input", "params"])
def test_forward_required_argument_none(forward: ForwardCase, name: str) -> None:
    expect_error(
        lambda: forward.call(**{name: None}),
        LstmNullArgumentError,
        name,
        name,
        "None",
        func="lstm_forward",
    )


@pytest.mark.parametrize("name, j", [("hx", 0), ("hx", 1), ("params", 0), ("params", 9)])
def test_forward_none_inside_list(forward: ForwardCase, name: str, j: int) -> None:
    bad = replaced(forward.args[name], j, None)
    expect_error(
        lambda: forward.call(**{name: bad}),
        LstmNullArgumentError,
        name,
        f"{name}[{j}]",
        "None",
        func="lstm_forward",
    )


def test_forward_none_inside_hx_with_batch_sizes(forward_varlen: ForwardCase) -> None:
    bad = replaced(forward_varlen.args["hx"], 0, None)
    expect_error(
        lambda: forward_varlen.call(hx=bad),
        LstmNullArgumentError,
        "hx",
        "hx[0]",
        "None",
        func="lstm_forward",
    )


@pytest.mark.parametrize(
    "name, j, bad, expected",
    [
        ("hx", 0, (K - 1, B, H), (K, B, H)),
        ("hx", 1, (K, B, H + 1), (K, B, H)),
        ("hx", 0, (B, H), (K, B, H)),
        ("params", 8, (G, I), (G, D * H)),
        ("params", 2, (G + 1,), (G,)),
        ("params", 1, (G, H + 2), (G, H)),
    ],
    ids=[
        "hx0-first-dim",
        "hx1-H",
        "hx0-2d",
        "w_ih_l1-I-columns",
        "b_ih_l0-length",
        "w_hh_l0-columns",
    ],
)
def test_forward_wrong_shape(
    forward: ForwardCase, name: str, j: int, bad: tuple[int, ...], expected: tuple[int, ...]
) -> None:
    over = {name: replaced(forward.args[name], j, _zeros(bad))}
    expect_error(
        lambda: forward.call(**over),
        LstmInvalidArgumentError,
        name,
        f"{name}[{j}]",
        shape_str(expected),
        shape_str(bad),
        func="lstm_forward",
    )


def test_forward_hx_wrong_length(forward: ForwardCase) -> None:
    hx = forward.args["hx"]
    expect_error(
        lambda: forward.call(hx=[hx[0], hx[1], hx[0]]),
        LstmInvalidArgumentError,
        "hx",
        "hx",
        "length 2",
        "length 3",
        func="lstm_forward",
    )


def test_forward_params_wrong_length(forward: ForwardCase) -> None:
    params = forward.args["params"]
    expect_error(
        lambda: forward.call(params=params[:8]),
        LstmInvalidArgumentError,
        "params",
        "params",
        "length 16",
        "length 8",
        func="lstm_forward",
    )


@pytest.mark.parametrize("name, j", [("hx", 0), ("hx", 1), ("params", 0), ("params", 12)])
def test_forward_dtype_differs_from_input(forward: ForwardCase, name: str, j: int) -> None:
    lst = forward.args[name]
    bad = replaced(lst, j, lst[j].astype(np.float64))
    expect_error(
        lambda: forward.call(**{name: bad}),
        LstmInvalidArgumentError,
        name,
        f"{name}[{j}]",
        "float32",
        "float64",
        func="lstm_forward",
    )


@pytest.mark.parametrize(
    "make_input, expected, got",
    [
        (lambda x: x.astype(np.int32), "float32", "int32"),
        (lambda x: x.astype(np.complex64), "float32", "complex64"),
        (lambda x: x.tolist(), "numpy.ndarray", "list"),
        (lambda x: x.reshape(T * B, I), "3-D", "[15, 4]"),
        (lambda x: x[..., None], "3-D", "[5, 3, 4, 1]"),
    ],
    ids=["int32", "complex64", "list", "2d-no-bs", "4d"],
)
def test_forward_input_invalid(
    forward: ForwardCase, make_input: Callable[[np.ndarray], Any], expected: str, got: str
) -> None:
    x = make_input(forward.args["input"])
    expect_error(
        lambda: forward.call(input=x),
        LstmInvalidArgumentError,
        "input",
        "input",
        expected,
        got,
        func="lstm_forward",
    )


@pytest.mark.parametrize(
    "value, got",
    [(-1, "-1"), ("x", "'x'"), (1.5, "1.5"), (True, "True"), (np.int64(-3), "-3")],
    ids=["negative", "str", "float", "bool", "np-negative"],
)
def test_forward_seed_invalid(forward: ForwardCase, value: Any, got: str) -> None:
    expect_error(
        lambda: forward.call(seed=value, dropout=0.5),
        LstmInvalidArgumentError,
        "seed",
        "seed",
        ">= 0",
        got,
        func="lstm_forward",
    )


@pytest.mark.parametrize(
    "name, value, expected, got",
    [
        ("num_layers", 0, ">= 1", "0"),
        ("num_layers", 1.5, ">= 1", "float"),
        ("num_layers", True, ">= 1", "bool"),
        ("dropout", 1.5, "[0, 1]", "1.5"),
        ("dropout", float("nan"), "[0, 1]", "nan"),
        ("dropout", "0.1", "[0, 1]", "str"),
        ("has_bias", 1, "bool", "int"),
        ("train", "yes", "bool", "str"),
        ("bidirectional", None, "bool", "NoneType"),
        ("batch_first", 0, "bool", "int"),
    ],
)
def test_forward_scalar_invalid(
    forward: ForwardCase, name: str, value: Any, expected: str, got: str
) -> None:
    expect_error(
        lambda: forward.call(**{name: value}),
        LstmInvalidArgumentError,
        name,
        name,
        expected,
        got,
        func="lstm_forward",
    )


@pytest.mark.parametrize("with_hx", [True, False], ids=["hx", "no-hx"])
@pytest.mark.parametrize(
    "value, t", [([3, 3, B + 1, 2, 1], 2), ([3, -1, 2, 2, 1], 1)], ids=["above-B", "negative"]
)
def test_forward_batch_sizes_out_of_range(
    forward_varlen: ForwardCase, with_hx: bool, value: list[int], t: int
) -> None:
    hx = forward_varlen.args["hx"] if with_hx else None
    expect_error(
        lambda: forward_varlen.call(batch_sizes=value, hx=hx),
        LstmInvalidArgumentError,
        "batch_sizes",
        "batch_sizes",
        f"B = {B}",
        f"batch_sizes[{t}] = {value[t]}",
        func="lstm_forward",
    )


@pytest.mark.parametrize(
    "value, got",
    [
        (np.array([3.0, 3, 2, 2, 1]), "float64"),
        (np.array([3, 3, 2, 2, 1], np.int32), "int32"),
        (np.array([[3, 3, 2, 2, 1]]), "[1, 5]"),
    ],
    ids=["float-array", "int32-array", "2d-array"],
)
def test_forward_batch_sizes_wrong_type(forward_varlen: ForwardCase, value: Any, got: str) -> None:
    expect_error(
        lambda: forward_varlen.call(batch_sizes=value),
        LstmInvalidArgumentError,
        "batch_sizes",
        "batch_sizes",
        "1-D int64",
        got,
        func="lstm_forward",
    )


def test_forward_batch_sizes_beyond_int64(forward_varlen: ForwardCase) -> None:
    expect_error(
        lambda: forward_varlen.call(batch_sizes=[3, 3, 2, 2, 2**64]),
        LstmInvalidArgumentError,
        "batch_sizes",
        "batch_sizes",
        str(2**64),
        func="lstm_forward",
    )


def test_forward_input_rank_with_batch_sizes(forward: ForwardCase) -> None:
    expect_error(
        lambda: forward.call(batch_sizes=[3, 3, 2, 2, 1]),
        LstmInvalidArgumentError,
        "input",
        "input",
        "2-D",
        shape_str((T, B, I)),
        func="lstm_forward",
    )


@pytest.mark.parametrize("with_hx", [True, False], ids=["hx", "no-hx"])
def test_forward_input_rows_with_batch_sizes(forward_varlen: ForwardCase, with_hx: bool) -> None:
    hx = forward_varlen.args["hx"] if with_hx else None
    x = _zeros((T * B - 1, I))
    expect_error(
        lambda: forward_varlen.call(input=x, hx=hx),
        LstmInvalidArgumentError,
        "input",
        "input",
        str(T),
        str(T * B - 1),
        func="lstm_forward",
    )


def test_forward_hx0_not_3d_with_batch_sizes(forward_varlen: ForwardCase) -> None:
    """With batch_sizes B is read from hx[0]: a 2-D hx[0] is rejected as hx."""
    hx = forward_varlen.args["hx"]
    expect_error(
        lambda: forward_varlen.call(hx=[hx[0][0], hx[1]]),
        LstmInvalidArgumentError,
        "hx",
        "hx[0]",
        "[L*D, B, H]",
        shape_str((B, H)),
        func="lstm_forward",
    )


# ---------------------------------------------------------------------------------------------
# Class hierarchy


def test_error_classes() -> None:
    assert issubclass(LstmNullArgumentError, TypeError)
    assert issubclass(LstmNullArgumentError, LstmArgumentError)
    assert issubclass(LstmInvalidArgumentError, ValueError)
    assert issubclass(LstmInvalidArgumentError, LstmArgumentError)
    assert issubclass(LstmArgumentError, lstmgrad.LstmError)
    assert issubclass(lstmgrad.LstmInternalError, RuntimeError)
    assert LstmNullArgumentError.code == 161001
    assert LstmInvalidArgumentError.code == 161002
    assert lstmgrad.LstmInternalError.code == 561103


# ---------------------------------------------------------------------------------------------
# Errors come before any computation


class _Reached(Exception):
    pass


def _boom(*args: Any, **kwargs: Any) -> Any:
    raise _Reached("the engine was called")


def _assert_reaches_engine(call: Callable[[], Any]) -> None:
    """The valid call does reach the (stubbed) engine; the API wraps its failure as 561103."""
    with pytest.raises(lstmgrad.LstmInternalError) as info:
        call()
    assert isinstance(info.value.__cause__, _Reached)


BAD_BACKWARD: list[tuple[str, Callable[[BackwardCase], dict[str, Any]]]] = [
    ("tanhc-None", lambda c: {"tanhc": None}),
    ("hx1-None", lambda c: {"hx": [c.args["hx"][0], None]}),
    ("dy-shape", lambda c: {"dy": _zeros((T, B, H))}),
    (
        "tanhc3-dtype",
        lambda c: {"tanhc": replaced(c.args["tanhc"], 3, c.args["tanhc"][3].astype(np.float64))},
    ),
    ("c-length", lambda c: {"c": c.args["c"][:-1]}),
    ("output_mask", lambda c: {"output_mask": (1, 0, 1, 1)}),
    ("dropout_masks-missing", lambda c: {"dropout": 0.3}),
    ("dropout_masks-not-wanted", lambda c: {"dropout_masks": [_zeros((T, B, D * H))]}),
    ("num_layers", lambda c: {"num_layers": 0}),
]


@pytest.mark.parametrize("make_bad", [b for _, b in BAD_BACKWARD], ids=[n for n, _ in BAD_BACKWARD])
def test_backward_errors_before_computation(
    dense: BackwardCase,
    monkeypatch: pytest.MonkeyPatch,
    make_bad: Callable[[BackwardCase], dict[str, Any]],
) -> None:
    snapshot = {n: [a.copy() for a in v] for n, v in dense.args.items() if isinstance(v, list)}
    for engine in lstmgrad.ops.api.ENGINES.values():
        monkeypatch.setattr(engine, "lstm_backward", _boom)
    _assert_reaches_engine(dense.call)
    with pytest.raises(LstmArgumentError):
        dense.call(**make_bad(dense))
    for n, v in snapshot.items():  # nothing was written into the caller's arrays
        for a, b in zip(v, dense.args[n], strict=True):
            np.testing.assert_array_equal(a, b)


BAD_FORWARD: list[tuple[str, dict[str, Any]]] = [
    ("input-None", {"input": None}),
    ("seed", {"seed": -1}),
    ("hx-length", {"hx": []}),
    ("dropout", {"dropout": 2.0}),
    ("batch_sizes", {"batch_sizes": [3, 3, 2, 2, 1]}),
]


@pytest.mark.parametrize("bad", [b for _, b in BAD_FORWARD], ids=[n for n, _ in BAD_FORWARD])
def test_forward_errors_before_computation(
    forward: ForwardCase, monkeypatch: pytest.MonkeyPatch, bad: dict[str, Any]
) -> None:
    for engine in lstmgrad.ops.api.ENGINES.values():
        monkeypatch.setattr(engine, "lstm_forward", _boom)
    _assert_reaches_engine(forward.call)
    with pytest.raises(LstmArgumentError):
        forward.call(**bad)


# ---------------------------------------------------------------------------------------------
# Valid edge values are not rejected


def test_valid_dropout_one(with_dropout: BackwardCase) -> None:
    """dropout = 1.0 is a valid probability: every unit above the first layer is dropped."""
    a = with_dropout.args
    fwd = lstmgrad.lstm_forward(
        a["input"], a["params"], a["hx"], num_layers=L, bidirectional=True, dropout=1.0, seed=1
    )
    assert fwd.saved is not None and fwd.saved.dropout_masks is not None
    r = with_dropout.call(
        **{n: list(v) for n, v in zip(SAVED, fwd.saved[:7], strict=True)},
        dropout=1.0,
        dropout_masks=list(fwd.saved.dropout_masks),
    )
    assert r.dx.shape == (T, B, I)


@pytest.mark.parametrize(
    "over",
    [
        {"output_mask": (np.True_, np.False_, np.True_, np.False_)},
        {"output_mask": np.array([True, False, True, False])},
        {"output_mask": [True, False, True, False]},
    ],
    ids=["tuple-np-bools", "bool-array", "list"],
)
def test_valid_output_mask_forms(dense: BackwardCase, over: dict[str, Any]) -> None:
    r = dense.call(**over)
    assert r.dx is not None and r.dc_prev is not None
    assert r.dh_prev is None and r.dparams is None


@pytest.mark.parametrize(
    "bs",
    [
        [3, 3, 2, 2, 1],
        (3, 3, 2, 2, 1),
        [np.int64(3), np.int32(3), 2, 2, 1],
        [2, 3, 1, 3, 0],  # not non-increasing: not enforced (docs/contract.md, variable lengths)
        [0, 0, 0, 0, 0],
        [B] * T,
    ],
    ids=["list", "tuple", "numpy-ints", "not-monotonic", "zeros", "full"],
)
def test_valid_batch_sizes_forms(varlen: BackwardCase, bs: Any) -> None:
    r = varlen.call(batch_sizes=bs)
    assert r.dx.shape == (T * B, I)
    f = lstmgrad.lstm_forward(
        varlen.args["input"],
        varlen.args["params"],
        varlen.args["hx"],
        bs,
        num_layers=L,
        bidirectional=True,
    )
    assert f.output.shape == (T * B, D * H)


@pytest.mark.parametrize(
    "over",
    [
        {
            "has_bias": np.True_,
            "train": np.True_,
            "bidirectional": np.True_,
            "batch_first": np.False_,
        },
        {"num_layers": np.int64(L)},
        {"dropout": 0},
        {"dropout": np.float32(0.0)},
        {"dropout": 0.5, "train": False},  # dropout does not apply: no masks needed
        {"dy": None, "dh": None, "dc": None},
        {"dropout_masks": []},  # an empty list is "no masks"
        {"batch_first": True, "batch_sizes": None},
    ],
    ids=[
        "numpy-bools",
        "numpy-int",
        "int-dropout",
        "np-float-dropout",
        "dropout-not-training",
        "no-dy-dh-dc",
        "empty-masks",
        "batch-first",
    ],
)
def test_valid_scalar_forms(dense: BackwardCase, over: dict[str, Any]) -> None:
    kw = dict(over)
    if kw.get("batch_first"):
        kw["input"] = np.ascontiguousarray(dense.args["input"].transpose(1, 0, 2))
        kw["dy"] = np.ascontiguousarray(dense.args["dy"].transpose(1, 0, 2))
    r = dense.call(**kw)
    assert r.dh_prev.shape == (K, B, H)


def test_valid_tuples_for_lists(dense: BackwardCase) -> None:
    over = {n: tuple(dense.args[n]) for n in ("hx", "params", *SAVED)}
    r = dense.call(**over)
    assert len(r.dparams) == len(dense.args["params"])


def test_valid_dropout_one_layer_without_masks(dense: BackwardCase) -> None:
    """dropout > 0 with num_layers = 1 needs no masks (there is no layer above the first)."""
    params = make_params(np.random.default_rng(5), 1, D, True)
    x = dense.args["input"]
    hx = [a[:D] for a in dense.args["hx"]]
    fwd = lstmgrad.lstm_forward(x, params, hx, num_layers=1, bidirectional=True, dropout=0.5)
    assert fwd.saved is not None
    r = lstmgrad.lstm_backward(
        x,
        hx,
        params,
        None,
        None,
        None,
        *fwd.saved[:7],
        num_layers=1,
        bidirectional=True,
        dropout=0.5,
        dropout_masks=fwd.saved.dropout_masks,
    )
    assert r.dx.shape == x.shape
    r = lstmgrad.lstm_backward(
        x,
        hx,
        params,
        None,
        None,
        None,
        *fwd.saved[:7],
        num_layers=1,
        bidirectional=True,
        dropout=0.5,
    )
    assert r.dx.shape == x.shape


def test_valid_forward_edges(forward: ForwardCase, forward_varlen: ForwardCase) -> None:
    assert forward.call(hx=None).hy.shape == (K, B, H)
    assert forward.call(seed=np.int64(7), dropout=1.0).output.shape == (T, B, D * H)
    assert forward.call(seed=0, dropout=0.5, train=False).saved is None
    assert forward_varlen.call(hx=None, batch_sizes=[2, 3, 1, 0, 3]).output.shape == (
        T * B,
        D * H,
    )
