"""``lstmgrad.dump`` and ``lstmgrad check``: a clean dump passes, a perturbed element is found
where it was put, a bad dump is named; float16, variable lengths, batch_first, .pt."""

from __future__ import annotations

import numpy as np
import pytest

import lstmgrad
from lstmgrad.core.errors import LstmInvalidArgumentError
from lstmgrad.tools import check
from lstmgrad.tools.cli import main

T, B, I, H = 6, 4, 5, 3


def make_case(dtype=np.float32, layers=2, bidirectional=True, varlen=False, batch_first=False,
              seed=0):  # fmt: skip
    """One backward call's arguments (kwargs included) and the fused engine's results."""
    rng = np.random.default_rng(seed)
    d = 2 if bidirectional else 1
    k = layers * d
    params = []
    for layer in range(layers):
        width = I if layer == 0 else d * H
        for _ in range(d):
            shapes = [(4 * H, width), (4 * H, H), (4 * H,), (4 * H,)]
            params += [(0.4 * rng.standard_normal(s)).astype(dtype) for s in shapes]
    hx = [(0.5 * rng.standard_normal((k, B, H))).astype(dtype) for _ in range(2)]
    x = rng.standard_normal((T, B, I)).astype(dtype)
    bs = None
    if varlen:
        bs = np.array([4, 4, 3, 3, 2, 1], np.int64)  # lengths 6, 5, 4, 2
        x = x.reshape(T * B, I)
    elif batch_first:
        x = np.ascontiguousarray(x.transpose(1, 0, 2))
    kw = dict(num_layers=layers, bidirectional=bidirectional, batch_first=batch_first)
    fwd = lstmgrad.lstm_forward(x, params, hx, bs, **kw)
    dy = rng.standard_normal(fwd.output.shape).astype(dtype)
    dh = rng.standard_normal((k, B, H)).astype(dtype)
    args = (x, hx, params, dy, dh, None, *fwd.saved[:7], bs)
    grads = lstmgrad.lstm_backward(*args, **kw)
    return args, kw, grads


def write(path, args, kw, grads):
    return lstmgrad.dump(path, *args, **kw, outputs=grads)


def run_check(capsys, path, *extra):
    rc = main(["check", str(path), *extra])
    out = capsys.readouterr()
    return rc, out.out, out.err


def location_of_dx(t, b, col, d=2):
    dirs = "both directions summed" if d == 2 else "direction 0"
    return f"layer 0, {dirs}, step {t}, batch row {b}, input column {col}"


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
def test_a_clean_dump_passes(tmp_path, capsys, dtype):
    args, kw, grads = make_case(dtype)
    path = write(tmp_path / "ok.npz", args, kw, grads)
    rc, out, _ = run_check(capsys, path)
    assert rc == 0, out
    assert f"result   ok: {3 + len(grads.dparams)} outputs" in out


@pytest.mark.parametrize("dtype, rel", [(np.float32, 1e-3), (np.float16, 0.1)])
def test_a_perturbed_dx_element_is_found_where_it_was_put(tmp_path, capsys, dtype, rel):
    args, kw, grads = make_case(dtype)
    t, b, col = 4, 2, 1
    grads.dx[t, b, col] += rel * np.abs(grads.dx).max()  # float16 rounds to 1/1024 of it
    path = write(tmp_path / "bad.npz", args, kw, grads)
    rc, out, _ = run_check(capsys, path)
    assert rc == 1, out
    assert "MISMATCH in 1 of" in out and "dxOut" in out.split("result")[-1]
    worst = out.split("largest errors")[1].splitlines()[1]
    assert worst.startswith("  dxOut (dx):") and location_of_dx(t, b, col) in worst


def test_a_perturbed_state_and_weight_element_are_located(tmp_path, capsys):
    args, kw, grads = make_case()
    grads.dh_prev[3, 2, 1] += 0.5  # k = 3: layer 1, direction 1
    p = 5  # weight_hh_l0_reverse: layer 0, direction 1
    grads.dparams[p][2 * H + 1, 2] += 0.5  # gate g, unit 1, column 2
    path = write(tmp_path / "bad.npz", args, kw, grads)
    rc, out, _ = run_check(capsys, path)
    assert rc == 1
    lines = out.split("largest errors")[1].splitlines()
    (state,) = [ln for ln in lines if ln.startswith("  dhPrevOut")]
    assert "layer 1, direction 1, initial state, batch row 2, hidden unit 1" in state
    (weight,) = [ln for ln in lines if ln.startswith(f"  dparamsOut.{p}")]
    assert "layer 0, direction 1, weight_hh_l0_reverse gate g unit 1, column 2" in weight


def test_varlen_dump_clean_perturbed_and_garbage_in_padding(tmp_path, capsys):
    args, kw, grads = make_case(varlen=True)
    assert run_check(capsys, write(tmp_path / "ok.npz", args, kw, grads))[0] == 0
    dx = grads.dx.reshape(T, B, I)  # padded time-major rows
    dx[1, 3, 0] *= 1.001  # valid: lengths are 6, 5, 4, 2
    dx[5, 2, 4] = 7.0  # padding: batch row 2 ends after step 3; the contract's dx there is 0
    rc, out, _ = run_check(capsys, write(tmp_path / "bad.npz", args, kw, grads))
    assert rc == 1
    found = out.split("largest errors")[1]
    assert location_of_dx(1, 3, 0) in found and location_of_dx(5, 2, 4) in found


def test_batch_first_locations_are_time_major(tmp_path, capsys):
    args, kw, grads = make_case(batch_first=True, layers=1, bidirectional=False)
    b, t, col = 1, 3, 2
    grads.dx[b, t, col] += 0.25  # [B, T, I]
    rc, out, _ = run_check(capsys, write(tmp_path / "bad.npz", args, kw, grads))
    assert rc == 1 and location_of_dx(t, b, col, d=1) in out


def rewrite(src, dst, drop=(), **changes):
    with np.load(src) as z:
        keys = {k: z[k] for k in z.files if k not in drop}
    keys.update(changes)
    np.savez(dst, **keys)
    return dst


@pytest.mark.parametrize(
    "drop, changes, key",
    [
        (("i.1",), {}, "'i.1'"),
        (("numLayers",), {}, "'numLayers'"),
        (("input",), {}, "'input'"),
        (("dcPrevOut",), {}, "'dcPrevOut'"),
        ((), {"params.1": np.zeros((4 * H, H + 1), np.float32)}, "'params'"),
        ((), {"dxOut": np.zeros((T, B, I + 1), np.float32)}, "'dxOut'"),
        ((), {"dhPrevOut": np.zeros((4, B, H), np.float16)}, "'dhPrevOut'"),
        ((), {"numLayers": np.array([2, 2])}, "'numLayers'"),
        (
            tuple(f"{n}Out" for n in ("dx", "dhPrev", "dcPrev"))
            + tuple(f"dparamsOut.{p}" for p in range(16)),
            {},
            "no device outputs",
        ),
    ],  # fmt: skip
)
def test_a_bad_dump_exits_2_naming_the_key(tmp_path, capsys, drop, changes, key):
    args, kw, grads = make_case()
    path = write(tmp_path / "ok.npz", args, kw, grads)
    bad = rewrite(path, tmp_path / "bad.npz", drop, **changes)
    rc, out, err = run_check(capsys, bad)
    assert rc == 2 and "bad dump" in err and key in err, err


def test_a_missing_file_exits_2(tmp_path, capsys):
    rc, _, err = run_check(capsys, tmp_path / "nope.npz")
    assert rc == 2 and "no such dump file" in err


def test_stacked_lists_and_inputs_only_dumps(tmp_path, capsys):
    args, kw, grads = make_case()
    path = write(tmp_path / "ok.npz", args, kw, grads)
    with np.load(path) as z:
        keys = dict(z)
    for name in ("hx", "i", "g", "f", "o", "h", "c", "tanhc"):  # one [n, ...] array per list
        parts = sorted((k for k in keys if k.startswith(name + ".")), key=lambda k: int(k[len(name) + 1:]))  # fmt: skip
        keys[name] = np.stack([keys.pop(k) for k in parts])
    keys["device_note"] = np.array(1)
    np.savez(tmp_path / "stacked.npz", **keys)
    rc, out, _ = run_check(capsys, tmp_path / "stacked.npz")
    assert rc == 0 and "ignored  keys the format does not know: device_note" in out
    inputs_only = lstmgrad.dump(tmp_path / "in.npz", *args, **kw)
    rc, _, err = run_check(capsys, inputs_only)
    assert rc == 2 and "no device outputs" in err


def test_the_rtol_rule_tolerates_a_fraction_of_prec():
    # the rule's definition: fail when more than size * prec elements are off both ways
    y = np.ones(20000, np.float32)
    for n_off, ok in ((2, True), (3, False)):  # limit 20000 * 1e-4 = 2 elements
        x = y.copy()
        x[:n_off] = 2.0
        frac, passed, prec = check.rtol_rule(x, y, "float32")
        assert (frac, passed, prec) == (n_off / y.size, ok, 1e-4)
    x = y.copy()
    x[:100] += 5e-5  # relative 5e-5 < prec: not off
    assert check.rtol_rule(x, y, "float32")[1]
    x[0] = np.nan
    assert check.rtol_rule(x, y, "float32") == (1.0, False, 1e-4)


def test_the_rule_option_picks_the_verdict(tmp_path, capsys):
    args, kw, grads = make_case(layers=1, bidirectional=False)
    # 1e-5 relative on every element: beyond the bound (~1e-6 here), within the rtol rule's 1e-4
    grads.dx[...] *= np.float32(1 + 1e-5)
    path = write(tmp_path / "bad.npz", args, kw, grads)
    assert run_check(capsys, path)[0] == 1
    assert run_check(capsys, path, "--rule", "rtol")[0] == 0
    assert run_check(capsys, path, "--rule", "both")[0] == 1
    assert run_check(capsys, path, "--factor", "1e6")[0] == 0


def test_dump_validates_its_arguments(tmp_path):
    args, kw, grads = make_case()
    with pytest.raises(LstmInvalidArgumentError) as info:
        lstmgrad.dump(tmp_path / "x.npz", *args, **{**kw, "num_layers": 3})
    assert info.value.param == "params"
    with pytest.raises(ValueError, match="must end in .npz or .pt"):
        lstmgrad.dump(tmp_path / "x.txt", *args, **kw)
    with pytest.raises(ValueError, match="outputs must be"):
        lstmgrad.dump(tmp_path / "x.npz", *args, **kw, outputs=grads[:3])


def test_pt_dumps(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    args, kw, grads = make_case()
    targs = [
        [torch.from_numpy(e) for e in a] if isinstance(a, list) else
        torch.from_numpy(a) if isinstance(a, np.ndarray) else a
        for a in args
    ]  # fmt: skip
    path = write(tmp_path / "ok.pt", targs, kw, grads)
    assert isinstance(torch.load(path, weights_only=True)["input"], torch.Tensor)
    assert run_check(capsys, path)[0] == 0
    grads.dc_prev[0, 1, 2] += 0.5
    rc, out, _ = run_check(capsys, write(tmp_path / "bad.pt", targs, kw, grads))
    assert rc == 1 and "layer 0, direction 0, initial state, batch row 1, hidden unit 2" in out


def test_the_worked_example_of_docs_check_md_prints_what_the_page_shows(tmp_path):
    import re
    import subprocess
    import sys
    from pathlib import Path

    page = (Path(__file__).resolve().parent.parent / "docs" / "check.md").read_text()
    example = page.split("## Worked example")[1]
    (code,) = re.findall(r"```python\n(.*?)```", example, re.S)
    shown = [ln[4:] for ln in example.split("```")[2].splitlines() if ln.startswith("    ")]
    subprocess.run([sys.executable, "-c", code], cwd=tmp_path, check=True, timeout=300)
    proc = subprocess.run(
        [sys.executable, "-m", "lstmgrad", "check", "perturbed.npz"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 1

    def fixed(line):  # what does not depend on the machine's BLAS: all but the error values
        return re.sub(r"\d\.\d\de[-+]\d\d|\(\d+(\.\d+)? x bound\)", "#", line).split()

    shown = [fixed(ln) for ln in shown if ln != "..."]
    printed = [fixed(ln) for ln in proc.stdout.splitlines()]
    assert len(shown) > 8 and shown == [ln for ln in printed if ln in shown], proc.stdout
