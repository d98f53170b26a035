"""Memory honesty: a call that needs more memory than available fails before it starts
(LstmMemoryError, code 561103, naming the need in bytes), the available-memory probe, and the
results of a forward not pinning each other's memory."""

from __future__ import annotations

import gc
import os
import re
import weakref

import numpy as np
import pytest

import lstmgrad
from lstmgrad import aclnn
from lstmgrad.core import machine
from lstmgrad.core.errors import ACLNN_ERR_INNER, LstmMemoryError
from lstmgrad.core.workspace import release_memory
from lstmgrad.ops import api

T, B, I, H, L = 6, 3, 4, 5, 2


def _args(seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((T, B, I))
    params = []
    for layer in range(L):
        for _ in range(2):  # bidirectional
            width = I if layer == 0 else 2 * H
            params += [rng.standard_normal((4 * H, width)) * 0.3,
                       rng.standard_normal((4 * H, H)) * 0.3,
                       rng.standard_normal(4 * H) * 0.1, rng.standard_normal(4 * H) * 0.1]  # fmt: skip
    return x, params


def _need_of(exc: BaseException) -> int:
    m = re.search(r"needs (?:at least )?(\d+) bytes", str(exc))
    assert m, str(exc)
    return int(m.group(1))


def _probe(monkeypatch, value):
    monkeypatch.setattr(machine, "available_memory", lambda: value)
    monkeypatch.setattr(api, "_last_reading", (-1e9, None))  # no reading kept from before


def test_forward_fails_before_starting_and_names_the_need(monkeypatch):
    x, params = _args()
    release_memory()  # no kept scratch: the need includes the whole workspace
    _probe(monkeypatch, 1000)
    with pytest.raises(LstmMemoryError) as exc:
        lstmgrad.lstm_forward(x, params, num_layers=L, bidirectional=True)
    assert exc.value.code == ACLNN_ERR_INNER == 561103
    assert isinstance(exc.value, MemoryError)
    need = _need_of(exc.value)
    # at least the results: output, hy, cy and the 7 saved lists of every (layer, direction)
    results = (T * B * 2 * H + 2 * 2 * L * B * H + 7 * 2 * L * T * B * H) * 8
    assert need >= results
    assert "only 1000 bytes are available" in str(exc.value)
    assert "(its results and copies alone)" in str(exc.value)  # checked before the plan is made
    _probe(monkeypatch, need)  # the results fit, the scratch does not: the whole need
    with pytest.raises(LstmMemoryError) as exc:
        lstmgrad.lstm_forward(x, params, num_layers=L, bidirectional=True)
    assert _need_of(exc.value) > need and "copies alone" not in str(exc.value)
    need = _need_of(exc.value)
    _probe(monkeypatch, need)  # exactly enough: runs, and matches the unchecked call
    got = lstmgrad.lstm_forward(x, params, num_layers=L, bidirectional=True)
    _probe(monkeypatch, None)  # unknown: no check
    want = lstmgrad.lstm_forward(x, params, num_layers=L, bidirectional=True)
    np.testing.assert_array_equal(got.output, want.output)


def test_backward_fails_before_starting(monkeypatch):
    x, params = _args()
    fwd = lstmgrad.lstm_forward(x, params, num_layers=L, bidirectional=True)
    hx = [np.zeros((2 * L, B, H))] * 2
    dy = np.ones_like(fwd.output)
    _probe(monkeypatch, 10)
    with pytest.raises(LstmMemoryError) as exc:
        lstmgrad.lstm_backward(x, hx, params, dy, None, None, *fwd.saved[:7], num_layers=L,
                               bidirectional=True)  # fmt: skip
    # at least dx, dh_prev, dc_prev and dparams
    assert _need_of(exc.value) >= (x.size + 2 * 2 * L * B * H + sum(p.size for p in params)) * 8


def test_mirror_returns_561103_with_the_need(monkeypatch):
    x, params = _args()
    out = np.empty((T, B, 2 * H))
    hy, cy = np.empty((2 * L, B, H)), np.empty((2 * L, B, H))
    status, size, ex = aclnn.aclnnLSTMGetWorkspaceSize(
        x, params, None, None, True, L, 0.0, False, True, False, out, hy, cy,
        None, None, None, None, None, None, None,
    )  # fmt: skip
    assert status == 0
    _probe(monkeypatch, 1)
    status = aclnn.aclnnLSTM(np.empty(size, np.uint8), size, ex, None)
    assert status == 561103
    assert re.search(r"needs (at least )?\d+ bytes", aclnn.aclGetRecentErrMsg())


def test_recompute_mode_checks_its_own_arrays(monkeypatch):
    torch = pytest.importorskip("torch")
    from lstmgrad.torch_ops import lstm

    x, params = _args()
    _probe(monkeypatch, 100)
    with pytest.raises(LstmMemoryError, match=r"lstmgrad.ops.recompute: needs \d+ bytes"):
        lstm(torch.from_numpy(x), [torch.from_numpy(p) for p in params], num_layers=L,
             bidirectional=True, recompute=2)  # fmt: skip


def test_probe_reads_this_machine():
    avail = machine.available_memory()
    assert avail is not None and avail > 0
    total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert avail <= total


def test_probe_lowers_to_the_cgroup_limit(monkeypatch):
    files = {"/sys/fs/cgroup/memory.max": 5 << 20, "/sys/fs/cgroup/memory.current": 2 << 20}
    monkeypatch.setattr(machine, "_read_int", lambda path: files.get(path))
    assert machine.available_memory() == 3 << 20
    files["/sys/fs/cgroup/memory.max"] = None  # "max": no limit, the machine's figure
    assert machine.available_memory() > 3 << 20


def test_output_alone_does_not_pin_the_saved_activations():
    x, params = _args()
    fwd = lstmgrad.lstm_forward(x, params, num_layers=L, bidirectional=True)
    saved_block = weakref.ref(fwd.saved.i[0].base)
    output = fwd.output
    del fwd
    gc.collect()
    assert saved_block() is None
    assert output.shape == (T, B, 2 * H)


def test_inference_keeps_one_set_of_activations():
    """Without train the forward allocates the activations of the (layer, direction) being
    walked only, not of every one."""
    from lstmgrad.core.contract import check_forward
    from lstmgrad.fused import forward_bytes
    from lstmgrad.fused.plan import SAFE

    x, params = _args()
    calls = [check_forward("t", x, params, None, None, True, L, 0.0, train, True, False, None)
             for train in (True, False)]  # fmt: skip
    act = T * B * H * 8
    saved_train, saved_infer = (forward_bytes(c, SAFE) for c in calls)
    assert saved_train - saved_infer >= 7 * (2 * L - 2) * act


def test_reading_kept_only_for_needs_well_within_it(monkeypatch):
    reads = []

    def probe():
        reads.append(1)
        return 1000

    monkeypatch.setattr(machine, "available_memory", probe)
    monkeypatch.setattr(api, "_last_reading", (-1e9, None))
    api.check_memory("f", 100)  # first reading
    api.check_memory("f", 400)  # within half of it: kept
    assert len(reads) == 1
    api.check_memory("f", 600)  # more than half: read again
    assert len(reads) == 2
    with pytest.raises(LstmMemoryError):
        api.check_memory("f", 1200)
    assert len(reads) == 3
    monkeypatch.setattr(api, "_last_reading", (-1e9, 1000))  # an old reading is not kept
    api.check_memory("f", 10)
    assert len(reads) == 4


_IMPOSSIBLE = """
import resource, sys, time
import numpy as np
import lstmgrad
small = [np.zeros((16, 1), np.float32), np.zeros((16, 4), np.float32)]
lstmgrad.lstm_forward(np.zeros((2, 2, 1), np.float32), small, has_bias=False)  # imports, warm-up
T, B, H = 100_000, 64, 1024  # train saves 7 * T * B * H float32: hundreds of GB
x = np.zeros((T, B, 1), np.float32)
params = [np.zeros((4 * H, 1), np.float32), np.zeros((4 * H, H), np.float32)]
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start = time.perf_counter()
try:
    lstmgrad.lstm_forward(x, params, has_bias=False)
except lstmgrad.LstmMemoryError:
    pass
else:
    sys.exit("no LstmMemoryError")
grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024
print(time.perf_counter() - start, grown)
"""


def test_an_impossible_call_fails_before_any_plan_is_measured(tmp_path):
    """With tuning on and nothing stored, the call's shape class would be measured first: the
    memory check on the results comes before it (no seconds of measuring, no memory taken)."""
    import subprocess
    import sys

    env = {**os.environ, "LSTMGRAD_TUNE": "on", "LSTMGRAD_CACHE_DIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", _IMPOSSIBLE], env=env, capture_output=True,
                         text=True, timeout=300, check=True).stdout  # fmt: skip
    seconds, grown = (float(v) for v in out.split())
    assert seconds < 1.0, seconds
    assert grown < 16 * 2**20, grown  # the peak did not move (16 MiB: the allocator's slack)
    for stored in tmp_path.glob("wisdom-*.json"):  # only the warm-up's small class measured
        assert '"H": 1024' not in stored.read_text()


HUGE = 100_000  # H: W_hh [4H, H] is 160 GB of float32


def _broadcast_call(fn):
    """A call whose weights are zero-stride views of one float32 each, ``HUGE`` hidden units:
    the engine reads every weight as a C-contiguous copy (160 GB for W_hh)."""
    x = np.ones((1, 1, 1), np.float32)
    params = [np.broadcast_to(np.float32(0.01), (4 * HUGE, 1)),
              np.broadcast_to(np.float32(0.01), (4 * HUGE, HUGE))]  # fmt: skip
    state = np.zeros((1, 1, HUGE), np.float32)
    act = [[np.broadcast_to(np.float32(0.5), (1, 1, HUGE))] for _ in range(7)]
    outs = (np.empty_like(x), np.empty_like(state), np.empty_like(state))
    if fn == "lstm_forward":
        return lambda: lstmgrad.lstm_forward(x, params, has_bias=False, train=False)
    if fn == "lstm_backward":
        return lambda: lstmgrad.lstm_backward(x, [state, state], params, np.ones_like(state),
                                              None, None, *act, has_bias=False,
                                              output_mask=[True, False, False, False])  # fmt: skip
    if fn == "aclnnLSTMGetWorkspaceSize":
        return lambda: aclnn.aclnnLSTMGetWorkspaceSize(
            x, params, None, None, False, 1, 0.0, False, False, False, np.empty((1, 1, HUGE),
            np.float32), *outs[1:], None, None, None, None, None, None, None)  # fmt: skip
    return lambda: aclnn.aclnnLstmBackwardGetWorkspaceSize(
        x, [state, state], params, np.ones_like(state), None, None, *act, None, False, 1, 0.0,
        True, False, False, [True, False, False, False], outs[0], None, None, None,
    )  # fmt: skip


@pytest.mark.parametrize("fn", ["lstm_forward", "lstm_backward", "aclnnLSTMGetWorkspaceSize",
                                "aclnnLstmBackwardGetWorkspaceSize"])  # fmt: skip
def test_broadcast_weights_fail_before_their_copies_are_made(monkeypatch, fn):
    """Zero-stride weights of a huge logical size: the copies the engine would make count
    towards the need, so the call fails before it (and before a plan is measured for it) with
    LstmMemoryError (the mirror: status 561103 at phase 1), not with the copy's MemoryError."""
    import tracemalloc

    from lstmgrad.planning import tune

    def no_measuring(*args, **kwargs):
        raise AssertionError("measured a plan for a call that cannot fit")

    monkeypatch.setenv("LSTMGRAD_TUNE", "eager")  # a plan would be measured first
    monkeypatch.setattr(tune, "measure_big", no_measuring)
    monkeypatch.setattr(tune, "measure_steps", no_measuring)
    _probe(monkeypatch, 1 << 30)
    call = _broadcast_call(fn)
    tracemalloc.start()
    try:
        if fn.startswith("aclnn"):
            status, size, executor = call()
            message = aclnn.aclGetRecentErrMsg()
            assert (status, size, executor) == (ACLNN_ERR_INNER, 0, None)
        else:
            with pytest.raises(LstmMemoryError) as exc:
                call()
            assert exc.value.code == ACLNN_ERR_INNER == 561103 and exc.value.param is None
            message = str(exc.value)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert message.startswith(f"{fn}: needs at least ")
    assert "bytes (its results and copies alone) of memory, only 1073741824 bytes" in message
    assert _need_of(message) >= 4 * HUGE * HUGE * 4  # W_hh's copy
    assert peak < 4 << 20, peak  # nothing of the call's size was allocated


def _strided_case(dtype, batch_first):
    """A 2-layer bidirectional case whose every weight and saved activation is Fortran-ordered
    (each read as a C-contiguous copy), each such copy larger than the slack of the test
    below (W_hh 64 KiB in float32, a direction's saved activations 84 KiB; float64's
    batch-first output 48 KiB)."""
    rng = np.random.default_rng(3)
    t, b, i, h = 8, 6, 48, 64
    params = []
    for layer in range(2):
        for _ in range(2):
            width = i if layer == 0 else 2 * h
            params += [np.asfortranarray(rng.standard_normal((4 * h, width)) * 0.1),
                       np.asfortranarray(rng.standard_normal((4 * h, h)) * 0.1),
                       rng.standard_normal(4 * h) * 0.1, rng.standard_normal(4 * h) * 0.1]  # fmt: skip
    params = [p.astype(dtype, order="K") for p in params]
    x = rng.standard_normal((b, t, i) if batch_first else (t, b, i)).astype(dtype)
    kw = dict(num_layers=2, bidirectional=True, batch_first=batch_first)
    fwd = lstmgrad.lstm_forward(x, params, **kw)
    saved = [[np.asfortranarray(a) for a in lst] for lst in fwd.saved[:7]]
    hx = [np.asfortranarray(np.zeros((4, b, h), dtype))] * 2
    return x, params, fwd.output, saved, hx, kw


@pytest.mark.parametrize("plan_fields", ["", "walk=true", "fwd_rec=loop,bwd_rec=blas_t"])
@pytest.mark.parametrize("dtype, batch_first", [(np.float32, False), (np.float64, True),
                                                (np.float16, False)])  # fmt: skip
@pytest.mark.parametrize("part", ["forward", "backward"])
def test_the_need_covers_what_the_call_allocates(monkeypatch, plan_fields, dtype, batch_first,
                                                 part):  # fmt: skip
    """What the check counts (results, scratch, conversions, copies of strided weights and
    saved activations, the batch-first result) against what the call allocates at its peak
    (tracemalloc; a warm call: loaded kernels and cached step records are not the call's)."""
    import tracemalloc

    monkeypatch.setenv("LSTMGRAD_PLAN", plan_fields)
    x, params, y, saved, hx, kw = _strided_case(dtype, batch_first)
    needs = []
    check = api.check_memory

    def recording(fn, need, results_only=False):
        needs.append(need)
        check(fn, need, results_only)

    monkeypatch.setattr(api, "check_memory", recording)

    def call():
        if part == "forward":
            return lstmgrad.lstm_forward(x, params, **kw)
        return lstmgrad.lstm_backward(x, hx, params, y, None, None, *saved, **kw)

    call()  # warm
    release_memory()  # no kept scratch: the need counts all of it
    needs.clear()
    tracemalloc.start()
    try:
        call()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(needs) == 2 and needs[0] <= needs[1]  # before the plan, then with it
    # Python's own objects (lists, records, array headers) beyond the counted arrays
    assert peak <= needs[1] + (32 << 10), (peak, needs)
