"""Natural mistakes get errors that point at their cause: the forward's saved tuple handed to
the backward whole or spread (``saved=`` takes it as it is), and a batch-first input without
``batch_first=True`` (the error on hx says what input looks like)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import lstmgrad
from lstmgrad import LstmInvalidArgumentError, LstmNullArgumentError

T, B, I, H = 5, 3, 4, 6
NULL, INVALID = 161001, 161002
PASS_SAVED = "pass saved=fwd.saved (or *fwd.saved[:7] and dropout_masks=fwd.saved.dropout_masks)"


def make(num_layers: int = 2, dropout: float = 0.0, batch_sizes: Any = None) -> dict[str, Any]:
    """A trained forward of T5-B3-I4-H6 and the backward's other arguments."""
    rng = np.random.default_rng(0)
    params = []
    for layer in range(num_layers):
        width = I if layer == 0 else H
        params += [(rng.standard_normal(s) * 0.3).astype(np.float32)
                   for s in [(4 * H, width), (4 * H, H), (4 * H,), (4 * H,)]]  # fmt: skip
    shape = (T, B, I) if batch_sizes is None else (T * B, I)
    x = rng.standard_normal(shape).astype(np.float32)
    hx = [rng.standard_normal((num_layers, B, H)).astype(np.float32) for _ in range(2)]
    kw = {"num_layers": num_layers, "dropout": dropout}
    fwd = lstmgrad.lstm_forward(x, params, hx, batch_sizes, seed=0, **kw)
    dy = rng.standard_normal(fwd.output.shape).astype(np.float32)
    return {"x": x, "hx": hx, "params": params, "dy": dy, "fwd": fwd, "kw": kw}


def head(c: dict[str, Any]) -> tuple:
    """input, hx, params, dy, dh, dc: the arguments before the saved lists."""
    return c["x"], c["hx"], c["params"], c["dy"], None, None


def rejected(fn, cls, code: int, param: str, *needles: str) -> str:
    with pytest.raises(cls) as info:
        fn()
    err = info.value
    assert type(err) is cls and err.code == code and err.param == param, (type(err), str(err))
    msg = str(err)
    for needle in needles:
        assert needle in msg, f"{needle!r} not in {msg!r}"
    return msg


def same(a: lstmgrad.LstmBackwardResult, b: lstmgrad.LstmBackwardResult) -> bool:
    return (np.array_equal(a.dx, b.dx) and np.array_equal(a.dh_prev, b.dh_prev)
            and np.array_equal(a.dc_prev, b.dc_prev)
            and all(np.array_equal(p, q) for p, q in zip(a.dparams, b.dparams, strict=True)))  # fmt: skip


# --------------------------------------------------------------------------------------------
# saved= takes the forward's saved as it is


@pytest.mark.parametrize(
    "num_layers, dropout, varlen",
    [(2, 0.0, False), (2, 0.5, False), (1, 0.5, False), (2, 0.5, True)],
    ids=["L2", "L2-dropout", "L1-dropout", "L2-dropout-varlen"],
)
def test_saved_keyword_equals_the_aclnn_order(num_layers, dropout, varlen):
    bs = np.array([3, 3, 2, 2, 1], dtype=np.int64) if varlen else None
    c = make(num_layers, dropout, bs)
    saved = c["fwd"].saved
    a = lstmgrad.lstm_backward(*head(c), batch_sizes=bs, saved=saved, **c["kw"])
    b = lstmgrad.lstm_backward(*head(c), *saved[:7], bs, dropout_masks=saved.dropout_masks,
                               **c["kw"])  # fmt: skip
    assert same(a, b)
    # the seven lists alone with the masks beside them, and the masks given twice as one object
    c7 = lstmgrad.lstm_backward(*head(c), batch_sizes=bs, saved=tuple(saved[:7]),
                                dropout_masks=saved.dropout_masks, **c["kw"])  # fmt: skip
    assert same(a, c7)
    twice = lstmgrad.lstm_backward(*head(c), batch_sizes=bs, saved=saved,
                                   dropout_masks=saved.dropout_masks, **c["kw"])  # fmt: skip
    assert same(a, twice)


def test_saved_keyword_with_tensors():
    torch = pytest.importorskip("torch")
    c = make(2, 0.5)
    t = {k: torch.from_numpy(c[k]) for k in ("x", "dy")}
    hx = [torch.from_numpy(a) for a in c["hx"]]
    params = [torch.from_numpy(p) for p in c["params"]]
    fwd = lstmgrad.lstm_forward(t["x"], params, hx, seed=0, **c["kw"])
    a = lstmgrad.lstm_backward(t["x"], hx, params, t["dy"], None, None, saved=fwd.saved,
                               **c["kw"])  # fmt: skip
    b = lstmgrad.lstm_backward(t["x"], hx, params, t["dy"], None, None, *fwd.saved[:7],
                               dropout_masks=fwd.saved.dropout_masks, **c["kw"])  # fmt: skip
    assert isinstance(a.dx, torch.Tensor) and torch.equal(a.dx, b.dx)
    assert all(torch.equal(p, q) for p, q in zip(a.dparams, b.dparams, strict=True))


def test_spread_saved_without_dropout_is_the_dense_call():
    """``*fwd.saved`` puts the eighth item, None without dropout, in batch_sizes: which is the
    dense call's batch_sizes, so the call is right."""
    c = make(2)
    saved = c["fwd"].saved
    assert saved.dropout_masks is None
    spread = lstmgrad.lstm_backward(*head(c), *saved, **c["kw"])
    assert same(spread, lstmgrad.lstm_backward(*head(c), *saved[:7], **c["kw"]))


# --------------------------------------------------------------------------------------------
# the saved tuple where a list or batch_sizes was expected


@pytest.mark.parametrize("num_layers", [2, 1])
def test_spread_saved_with_dropout_is_named(num_layers):
    """The masks (a list of L-1 arrays; empty for one layer) land in batch_sizes."""
    c = make(num_layers, 0.5)
    rejected(lambda: lstmgrad.lstm_backward(*head(c), *c["fwd"].saved, **c["kw"]),
             LstmInvalidArgumentError, INVALID, "batch_sizes",
             "lstm_backward: batch_sizes must be a 1-D int64 array [T], got a list of "
             f"{num_layers - 1} arrays", "it looks like saved.dropout_masks", PASS_SAVED)  # fmt: skip


def test_whole_saved_as_i_is_named():
    c = make(2, 0.5)
    rejected(lambda: lstmgrad.lstm_backward(*head(c), c["fwd"].saved, **c["kw"]),
             LstmInvalidArgumentError, INVALID, "i",
             "i must be a list of L*D arrays [T, B, H], got the forward's whole saved tuple "
             "(8 items)", PASS_SAVED)  # fmt: skip
    as_tuple = tuple(c["fwd"].saved[:7])  # a plain tuple of the seven lists too
    rejected(lambda: lstmgrad.lstm_backward(*head(c), as_tuple, **c["kw"]),
             LstmInvalidArgumentError, INVALID, "i", "whole saved tuple (7 items)")  # fmt: skip


def test_a_batch_sizes_list_of_ints_is_not_taken_for_masks():
    c = make(2, 0.0, np.array([3, 3, 2, 2, 1], dtype=np.int64))
    saved = c["fwd"].saved
    got = lstmgrad.lstm_backward(*head(c), *saved[:7], [3, 3, 2, 2, 1], **c["kw"])
    assert got.dx.shape == (T * B, I)


# --------------------------------------------------------------------------------------------
# saved= misused


def test_saved_given_the_forward_result():
    c = make(2)
    rejected(lambda: lstmgrad.lstm_backward(*head(c), saved=c["fwd"], **c["kw"]),
             LstmInvalidArgumentError, INVALID, "saved",
             "saved must be the forward's saved activations (an LstmSaved), got the whole "
             "LstmForwardResult: pass saved=fwd.saved")  # fmt: skip


@pytest.mark.parametrize(
    "value, got",
    [("five", "got a tuple of length 5"), ("array", "got numpy.ndarray of dtype float32"),
     ("number", "got int 3")],
)  # fmt: skip
def test_saved_of_the_wrong_kind(value, got):
    c = make(2)
    saved = {"five": tuple(c["fwd"].saved[:5]), "array": c["x"], "number": 3}[value]
    rejected(lambda: lstmgrad.lstm_backward(*head(c), saved=saved, **c["kw"]),
             LstmInvalidArgumentError, INVALID, "saved",
             "saved must be an LstmSaved (i, g, f, o, h, c, tanhc, dropout_masks) or its first 7 "
             "lists", got)  # fmt: skip


def test_saved_with_lists_too():
    c = make(2)
    saved = c["fwd"].saved
    rejected(lambda: lstmgrad.lstm_backward(*head(c), saved[0], saved=saved, **c["kw"]),
             LstmInvalidArgumentError, INVALID, "saved",
             "saved must come alone, not with i:", "not both")  # fmt: skip


def test_saved_with_other_masks():
    c = make(2, 0.5)
    saved = c["fwd"].saved
    other = [m.copy() for m in saved.dropout_masks]
    rejected(lambda: lstmgrad.lstm_backward(*head(c), saved=saved, dropout_masks=other,
                                            **c["kw"]),
             LstmInvalidArgumentError, INVALID, "dropout_masks",
             "dropout_masks must be None when saved holds masks")  # fmt: skip


def test_saved_masks_without_the_forward_dropout():
    """saved from a forward with dropout, backward told dropout 0: the masks would be ignored
    (a wrong gradient), and the message names where they came from."""
    c = make(2, 0.5)
    rejected(lambda: lstmgrad.lstm_backward(*head(c), saved=c["fwd"].saved, num_layers=2),
             LstmInvalidArgumentError, INVALID, "dropout_masks",
             "lstm_backward: saved.dropout_masks must be None when dropout is 0 or train is "
             "False (they would be ignored: pass the forward's dropout and train), got a list "
             "of 1")  # fmt: skip


def test_neither_saved_nor_lists():
    c = make(2)
    rejected(lambda: lstmgrad.lstm_backward(*head(c), **c["kw"]),
             LstmNullArgumentError, NULL, "saved",
             "lstm_backward: saved is required (the forward's LstmForwardResult.saved; or the "
             "lists i, g, f, o, h, c, tanhc in aclnn order), got None")  # fmt: skip


# --------------------------------------------------------------------------------------------
# batch_first


BATCH_FIRST_HINT = "(input looks batch-first, [B, T, I]: pass batch_first=True)"
TIME_MAJOR_HINT = "(input looks time-major, [T, B, I]: pass batch_first=False)"


def test_forward_hints_batch_first():
    c = make(2)
    xb = np.ascontiguousarray(c["x"].transpose(1, 0, 2))  # [B, T, I]
    msg = rejected(lambda: lstmgrad.lstm_forward(xb, c["params"], c["hx"], num_layers=2),
                   LstmInvalidArgumentError, INVALID, "hx",
                   f"lstm_forward: hx[0] must have shape [2, {T}, {H}] (L*D, B, H), got "
                   f"[2, {B}, {H}] {BATCH_FIRST_HINT}")  # fmt: skip
    assert msg.endswith(BATCH_FIRST_HINT)
    assert lstmgrad.lstm_forward(xb, c["params"], c["hx"], num_layers=2, batch_first=True)


def test_backward_hints_batch_first():
    c = make(2)
    xb = np.ascontiguousarray(c["x"].transpose(1, 0, 2))
    dyb = np.ascontiguousarray(c["dy"].transpose(1, 0, 2))
    saved = c["fwd"].saved
    rejected(lambda: lstmgrad.lstm_backward(xb, c["hx"], c["params"], dyb, None, None,
                                            saved=saved, num_layers=2),
             LstmInvalidArgumentError, INVALID, "hx", BATCH_FIRST_HINT)  # fmt: skip
    fixed = lstmgrad.lstm_backward(xb, c["hx"], c["params"], dyb, None, None, saved=saved,
                                   num_layers=2, batch_first=True)  # fmt: skip
    plain = lstmgrad.lstm_backward(*head(c), saved=saved, num_layers=2)
    np.testing.assert_array_equal(fixed.dx, plain.dx.transpose(1, 0, 2))


def test_batch_first_given_a_time_major_input():
    c = make(2)
    rejected(lambda: lstmgrad.lstm_forward(c["x"], c["params"], c["hx"], num_layers=2,
                                           batch_first=True),
             LstmInvalidArgumentError, INVALID, "hx", TIME_MAJOR_HINT)  # fmt: skip


@pytest.mark.parametrize("case", ["other batch", "other layers", "square input"])
def test_no_hint_where_the_state_is_simply_wrong(case):
    c = make(2)
    x, hx = c["x"], c["hx"]
    if case == "other batch":  # B' matches neither axis of input
        hx = [np.zeros((2, B + 4, H), np.float32)] * 2
    elif case == "other layers":  # input batch-first, but the state's L*D is wrong as well
        x = np.ascontiguousarray(x.transpose(1, 0, 2))
        hx = [np.zeros((1, B, H), np.float32)] * 2
    else:  # T == B: nothing tells the layouts apart
        x = x[:B]
        hx = [np.zeros((2, B + 1, H), np.float32)] * 2
    msg = rejected(lambda: lstmgrad.lstm_forward(x, c["params"], hx, num_layers=2),
                   LstmInvalidArgumentError, INVALID, "hx", "hx[0] must have shape")  # fmt: skip
    assert "looks" not in msg and "batch_first" not in msg
