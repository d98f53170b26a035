"""The C-style mirror: same results as the Pythonic API, written in place; statuses, not raises."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import lstmgrad
from lstmgrad import aclnn


def _case(
    dtype=np.float32, *, layers=2, bidirectional=True, batch_first=False, varlen=False, seed=0
):
    rng = np.random.default_rng(seed)
    t, b, i, h = 5, 3, 4, 6
    d = 2 if bidirectional else 1
    params = []
    for layer in range(layers):
        for _ in range(d):
            w_in = i if layer == 0 else d * h
            params += [
                rng.uniform(-0.5, 0.5, s).astype(dtype)
                for s in [(4 * h, w_in), (4 * h, h), (4 * h,), (4 * h,)]
            ]
    bs = np.array([3, 3, 2, 2, 1], dtype=np.int64) if varlen else None
    if varlen:
        x = rng.standard_normal((t * b, i)).astype(dtype)
    elif batch_first:
        x = rng.standard_normal((b, t, i)).astype(dtype)
    else:
        x = rng.standard_normal((t, b, i)).astype(dtype)
    hx = [rng.standard_normal((layers * d, b, h)).astype(dtype) for _ in range(2)]
    kw = dict(num_layers=layers, bidirectional=bidirectional, batch_first=batch_first)
    fwd = lstmgrad.lstm_forward(x, params, hx, bs, **kw)
    dy = rng.standard_normal(fwd.output.shape).astype(dtype)
    dh = rng.standard_normal(hx[0].shape).astype(dtype)
    dc = rng.standard_normal(hx[0].shape).astype(dtype)
    return dict(x=x, hx=hx, params=params, bs=bs, kw=kw, fwd=fwd, dy=dy, dh=dh, dc=dc)


def _outs(c, fill=np.nan):
    return (
        np.full_like(c["x"], fill),
        np.full_like(c["hx"][0], fill),
        np.full_like(c["hx"][0], fill),
        [np.full_like(p, fill) for p in c["params"]],
    )


def _bwd_phase1(c, outs, mask=(True, True, True, True)):
    kw = c["kw"]
    return aclnn.aclnnLstmBackwardGetWorkspaceSize(
        c["x"], c["hx"], c["params"], c["dy"], c["dh"], c["dc"], *c["fwd"].saved[:7], c["bs"],
        True, kw["num_layers"], 0.0, True, kw["bidirectional"], kw["batch_first"], list(mask), *outs,
    )  # fmt: skip


@pytest.mark.parametrize(
    "dtype,batch_first,varlen",
    [
        (np.float32, False, False),
        (np.float64, True, False),
        (np.float16, False, True),
        (np.float32, False, True),
    ],
    ids=["f32", "f64-bf", "f16-varlen", "f32-varlen"],
)
def test_backward_mirror_matches_pythonic_api_with_nan_filled_workspace(dtype, batch_first, varlen):
    c = _case(dtype, batch_first=batch_first, varlen=varlen)
    want = lstmgrad.lstm_backward(
        c["x"],
        c["hx"],
        c["params"],
        c["dy"],
        c["dh"],
        c["dc"],
        *c["fwd"].saved[:7],
        c["bs"],
        **c["kw"],
    )
    outs = _outs(c)
    status, size, executor = _bwd_phase1(c, outs)
    assert status == aclnn.ACLNN_SUCCESS, aclnn.aclGetRecentErrMsg()
    assert size > 0
    # All-ones bytes are NaN in every float dtype: a row the computation forgot to write would show.
    workspace = np.full(size, 0xFF, np.uint8)  # NaN in float16, float32 and float64
    assert aclnn.aclnnLstmBackward(workspace, size, executor, None) == aclnn.ACLNN_SUCCESS
    dx, dh, dc, dw = outs
    assert np.array_equal(dx, want.dx)
    assert np.array_equal(dh, want.dh_prev)
    assert np.array_equal(dc, want.dc_prev)
    for a, b in zip(dw, want.dparams, strict=True):
        assert np.array_equal(a, b)


def test_backward_mirror_output_mask_leaves_masked_outputs_untouched():
    c = _case()
    outs = _outs(c, fill=7.0)
    status, size, executor = _bwd_phase1(c, outs, mask=(False, True, False, False))
    assert status == aclnn.ACLNN_SUCCESS
    assert aclnn.aclnnLstmBackward(np.empty(size, np.uint8), size, executor, None) == 0
    dx, dh, dc, dw = outs
    assert (dx == 7).all() and (dc == 7).all() and all((p == 7).all() for p in dw)
    want = lstmgrad.lstm_backward(
        c["x"], c["hx"], c["params"], c["dy"], c["dh"], c["dc"], *c["fwd"].saved[:7], **c["kw"]
    )
    assert np.array_equal(dh, want.dh_prev)


def test_backward_mirror_masked_output_may_be_none_but_required_one_may_not():
    c = _case()
    dx, dh, dc, dw = _outs(c)
    status, _, executor = _bwd_phase1(c, (None, dh, dc, dw), mask=(False, True, True, True))
    assert status == aclnn.ACLNN_SUCCESS and executor is not None
    status, size, executor = _bwd_phase1(c, (None, dh, dc, dw))
    assert (status, size, executor) == (aclnn.ACLNN_ERR_PARAM_NULLPTR, 0, None)
    assert "dxOut" in aclnn.aclGetRecentErrMsg()


def test_backward_mirror_rejects_wrong_output_shape_dtype_and_readonly():
    c = _case()
    dx, dh, dc, dw = _outs(c)
    bad = np.zeros((9, 9, 9), np.float32)
    assert _bwd_phase1(c, (bad, dh, dc, dw))[0] == aclnn.ACLNN_ERR_PARAM_INVALID
    msg = aclnn.aclGetRecentErrMsg()
    assert "dxOut" in msg and "[5, 3, 4]" in msg and "[9, 9, 9]" in msg
    assert _bwd_phase1(c, (dx, dh.astype(np.float64), dc, dw))[0] == aclnn.ACLNN_ERR_PARAM_INVALID
    assert "dhPrevOut" in aclnn.aclGetRecentErrMsg()
    ro = dc.copy()
    ro.flags.writeable = False
    assert _bwd_phase1(c, (dx, dh, ro, dw))[0] == aclnn.ACLNN_ERR_PARAM_INVALID
    assert _bwd_phase1(c, (dx, dh, dc, dw[:-1]))[0] == aclnn.ACLNN_ERR_PARAM_INVALID
    assert _bwd_phase1(c, (dx, dh, dc, [None] + dw[1:]))[0] == aclnn.ACLNN_ERR_PARAM_NULLPTR


def test_mirror_returns_the_pythonic_codes_for_bad_inputs():
    """The same bad inputs give the Pythonic API's code as a status, never an exception."""
    c = _case()
    outs = _outs(c)
    kw = c["kw"]
    saved = list(c["fwd"].saved[:7])
    cases = {
        "input None": (dict(input=None), 161001),
        "hx None": (dict(hx=None), 161001),
        "params element None": (dict(params=[None] + c["params"][1:]), 161001),
        "tanhc None": (dict(tanhc=None), 161001),
        "dy wrong shape": (dict(dy=c["dy"][:, :, :5]), 161002),
        "dh wrong dtype": (dict(dh=c["dh"].astype(np.float64)), 161002),
        "int input": (dict(input=c["x"].astype(np.int32)), 161002),
        "num_layers 0": (dict(numLayers=0), 161002),
        "batch sizes out of range": (
            dict(
                batchSizesOptional=np.array([4, 3, 3, 3, 3], np.int64),
                input=c["x"].reshape(15, 4),
                dy=c["dy"].reshape(15, 12),
            ),
            161002,
        ),
        "output mask of 3": (dict(outputMask=[True, True, True]), 161002),
        "params wrong length": (dict(params=c["params"][:-1]), 161002),
    }
    for name, (change, code) in cases.items():
        args = dict(
            input=c["x"], hx=c["hx"], params=c["params"], dy=c["dy"], dh=c["dh"], dc=c["dc"],
            i=saved[0], g=saved[1], f=saved[2], o=saved[3], h=saved[4], c=saved[5], tanhc=saved[6],
            batchSizesOptional=None, hasBias=True, numLayers=kw["num_layers"], dropout=0.0, train=True,
            bidirectional=True, batchFirst=False, outputMask=[True] * 4,
            dxOut=outs[0], dhPrevOut=outs[1], dcPrevOut=outs[2], dparamsOut=outs[3],
        )  # fmt: skip
        args.update(change)
        status, size, executor = aclnn.aclnnLstmBackwardGetWorkspaceSize(**args)
        assert (status, size, executor) == (code, 0, None), name
        assert aclnn.aclGetRecentErrMsg(), name
        pythonic = {k: v for k, v in args.items()}
        with pytest.raises(lstmgrad.LstmArgumentError) as err:
            lstmgrad.lstm_backward(
                pythonic["input"], pythonic["hx"], pythonic["params"], pythonic["dy"], pythonic["dh"],
                pythonic["dc"], pythonic["i"], pythonic["g"], pythonic["f"], pythonic["o"], pythonic["h"],
                pythonic["c"], pythonic["tanhc"], pythonic["batchSizesOptional"], has_bias=True,
                num_layers=pythonic["numLayers"], bidirectional=True, output_mask=pythonic["outputMask"],
            )  # fmt: skip
        assert err.value.code == code, name


def test_mirror_ignores_dropout_like_the_original():
    c = _case()
    outs = _outs(c)
    kw = c["kw"]
    status, size, executor = aclnn.aclnnLstmBackwardGetWorkspaceSize(
        c["x"], c["hx"], c["params"], c["dy"], c["dh"], c["dc"], *c["fwd"].saved[:7], None,
        True, kw["num_layers"], 0.5, True, True, False, [True] * 4, *outs,
    )  # fmt: skip
    assert status == 0, aclnn.aclGetRecentErrMsg()
    assert aclnn.aclnnLstmBackward(np.empty(size, np.uint8), size, executor, None) == 0
    want = lstmgrad.lstm_backward(
        c["x"], c["hx"], c["params"], c["dy"], c["dh"], c["dc"], *c["fwd"].saved[:7], **kw
    )
    assert np.array_equal(outs[0], want.dx)


def test_phase_two_statuses_for_workspace_and_executor_misuse():
    c = _case()
    status, size, executor = _bwd_phase1(c, _outs(c))
    assert status == 0
    ws = np.empty(size, np.uint8)
    assert aclnn.aclnnLstmBackward(None, size, executor, None) == aclnn.ACLNN_ERR_PARAM_NULLPTR
    assert (
        aclnn.aclnnLstmBackward(ws[: size // 2], size, executor, None)
        == aclnn.ACLNN_ERR_PARAM_INVALID
    )
    assert aclnn.aclnnLstmBackward(ws, size - 1, executor, None) == aclnn.ACLNN_ERR_PARAM_INVALID
    assert (
        aclnn.aclnnLstmBackward(ws.view(np.int8), size, executor, None)
        == aclnn.ACLNN_ERR_PARAM_INVALID
    )
    assert aclnn.aclnnLstmBackward(ws, size, None, None) == aclnn.ACLNN_ERR_PARAM_NULLPTR
    assert aclnn.aclnnLstmBackward(ws, size, "executor", None) == aclnn.ACLNN_ERR_PARAM_INVALID
    assert aclnn.aclnnLSTM(ws, size, executor, None) == aclnn.ACLNN_ERR_PARAM_INVALID  # wrong op
    # the failures above did not consume it
    assert aclnn.aclnnLstmBackward(ws, size, executor, None) == aclnn.ACLNN_SUCCESS
    assert aclnn.aclnnLstmBackward(ws, size, executor, None) == aclnn.ACLNN_ERR_PARAM_INVALID
    assert "already run" in aclnn.aclGetRecentErrMsg()


def test_phase_two_internal_failure_is_status_561103():
    c = _case()
    status, size, executor = _bwd_phase1(c, _outs(c))

    def boom(arena):
        raise FloatingPointError("simulated")

    executor.run = boom
    assert (
        aclnn.aclnnLstmBackward(np.empty(size, np.uint8), size, executor, None)
        == aclnn.ACLNN_ERR_INNER
    )
    assert "simulated" in aclnn.aclGetRecentErrMsg()


@pytest.mark.parametrize("varlen", [False, True], ids=["dense", "varlen"])
@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
def test_forward_mirror_matches_pythonic_api(varlen, train):
    c = _case(np.float64, varlen=varlen)
    fwd = c["fwd"]
    y, hy, cy = (
        np.full_like(fwd.output, np.nan),
        np.full_like(fwd.hy, np.nan),
        np.full_like(fwd.cy, np.nan),
    )
    lists = (
        [[np.full_like(a, np.nan) for a in lst] for lst in fwd.saved[:7]] if train else [None] * 7
    )
    kw = c["kw"]
    status, size, executor = aclnn.aclnnLSTMGetWorkspaceSize(
        c["x"],
        c["params"],
        c["hx"],
        c["bs"],
        True,
        kw["num_layers"],
        0.0,
        train,
        True,
        False,
        y,
        hy,
        cy,
        *lists,
    )
    assert status == 0, aclnn.aclGetRecentErrMsg()
    workspace = np.full(size, 0xFF, np.uint8)  # NaN in float16, float32 and float64
    assert aclnn.aclnnLSTM(workspace, size, executor, None) == 0
    assert (
        np.array_equal(y, fwd.output) and np.array_equal(hy, fwd.hy) and np.array_equal(cy, fwd.cy)
    )
    if train:
        for got, want in zip(lists, fwd.saved[:7], strict=True):
            for a, b in zip(got, want, strict=True):
                assert np.array_equal(a, b)


def test_forward_mirror_statuses():
    c = _case()
    fwd = c["fwd"]
    y, hy, cy = np.empty_like(fwd.output), np.empty_like(fwd.hy), np.empty_like(fwd.cy)
    lists = [[np.empty_like(a) for a in lst] for lst in fwd.saved[:7]]
    args = [c["x"], c["params"], c["hx"], None, True, 2, 0.0, True, True, False, y, hy, cy, *lists]
    bad_y = list(args)
    bad_y[10] = np.empty((5, 3, 5), np.float32)
    assert aclnn.aclnnLSTMGetWorkspaceSize(*bad_y)[0] == aclnn.ACLNN_ERR_PARAM_INVALID
    assert "output" in aclnn.aclGetRecentErrMsg()
    no_j = list(args)
    no_j[14] = None  # jOut is required with train
    assert aclnn.aclnnLSTMGetWorkspaceSize(*no_j)[0] == aclnn.ACLNN_ERR_PARAM_NULLPTR
    no_input = list(args)
    no_input[0] = None
    assert aclnn.aclnnLSTMGetWorkspaceSize(*no_input)[0] == aclnn.ACLNN_ERR_PARAM_NULLPTR
    status, size, executor = aclnn.aclnnLSTMGetWorkspaceSize(*args)
    assert status == 0
    assert (
        aclnn.aclnnLSTM(np.empty(max(size - 64, 0), np.uint8), size, executor, None)
        == aclnn.ACLNN_ERR_PARAM_INVALID
    )


def test_status_constants():
    assert (aclnn.ACLNN_SUCCESS, aclnn.ACLNN_ERR_PARAM_NULLPTR, aclnn.ACLNN_ERR_PARAM_INVALID, aclnn.ACLNN_ERR_INNER) == (
        0, 161001, 161002, 561103,
    )  # fmt: skip
    assert lstmgrad.LstmNullArgumentError.code == 161001
    assert lstmgrad.LstmInvalidArgumentError.code == 161002


def test_recent_error_message_is_per_thread():
    """Threads interleave failing and succeeding mirror calls (a barrier between each call and
    the read-back): each reads exactly its own last failure, and a success leaves it as it was."""
    n_threads, iterations = 4, 60
    c = _case(layers=1, bidirectional=False)
    barrier = threading.Barrier(n_threads, timeout=60)
    errors: list[str] = []

    def work(tid: int) -> None:
        mine = ""  # this thread's last failure message, as it must read it back
        try:
            for it in range(iterations):
                barrier.wait()
                kind = (it + tid) % 3
                if kind == 0:  # success: phase 1 and 2, results into fresh outputs
                    status, size, executor = _bwd_phase1(c, _outs(c))
                    assert status == aclnn.ACLNN_SUCCESS
                    ws = np.empty(size, np.uint8)
                    assert aclnn.aclnnLstmBackward(ws, size, executor, None) == 0
                elif kind == 1:  # phase 1 fails on an output shape unique to (thread, step)
                    dx, dh, dc, dw = _outs(c)
                    bad = np.zeros((tid + 1, it + 1, 7), np.float32)
                    status = _bwd_phase1(c, (bad, dh, dc, dw))[0]
                    assert status == aclnn.ACLNN_ERR_PARAM_INVALID
                    mine = f"got [{tid + 1}, {it + 1}, 7]"  # the message's end
                else:  # phase 2 fails on a workspace size unique to (thread, step)
                    status, size, executor = _bwd_phase1(c, _outs(c))
                    assert status == aclnn.ACLNN_SUCCESS
                    bad_size = size - 1 - 1000 * tid - it
                    ws = np.empty(size, np.uint8)
                    status = aclnn.aclnnLstmBackward(ws, bad_size, executor, None)
                    assert status == aclnn.ACLNN_ERR_PARAM_INVALID
                    mine = f"got {bad_size}"  # the message's end
                barrier.wait()  # every thread has made its call: now read back
                got = aclnn.aclGetRecentErrMsg()
                if mine == "":
                    assert got == "", (tid, it, got)
                else:
                    assert got.endswith(mine), (tid, it, mine, got)
        except Exception as exc:  # reported by the main thread
            errors.append(f"thread {tid}: {exc!r}")
            barrier.abort()

    threads = [threading.Thread(target=work, args=(j,)) for j in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    assert not errors, errors[:3]
