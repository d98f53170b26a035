"""`lstmgrad check` on hostile and malformed input (docs/check.md#what-a-dump-can-make-the-checker-do):
a dump never makes it read a file outside the dump, unpickle anything or allocate what its
files do not hold; a malformed dump ends in exit 2 with the entry and field named, never in a
traceback; output files are checked before any work. Every file the checker opens is seen by
an audit hook (``sys.addaudithook``, the "open" event of every Python-level open), and a
sentinel tensor file outside the dump must never be among them. A Hypothesis sweep mutates a
valid dump's dump.json (structure, types, depth, sizes, hostile file names) and holds the
checker to the same rules."""

from __future__ import annotations

import contextlib
import io
import json
import os
import pathlib
import shutil
import sys
import zipfile
from typing import Any

import numpy as np
import pytest
import torch
from torch.nn.utils.rnn import pack_padded_sequence

from lstmgrad.tools import report
from lstmgrad.tools.cli import main
from msprobe_writer import MsprobeDump, record_lstm

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, event, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

T, B, I, H = 3, 2, 3, 4  # T != B: a Module entry's batch_first is told from the shapes
VF_IN = "VF.lstm.0.forward"
MOD_FWD = "Module.lstm.LSTM.forward.0"


# --------------------------------------------------------------------------- the open spy

_opened: list[str] | None = None  # paths opened while a check runs under _spy()


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if _opened is not None and event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
        _opened.append(os.fsdecode(args[0]))


sys.addaudithook(_audit)  # cannot be removed; records only inside _spy()


@contextlib.contextmanager
def _spy() -> Any:
    global _opened
    _opened = seen = []
    try:
        yield seen
    finally:
        _opened = None


def _inside(paths: list[str], folder: pathlib.Path) -> list[str]:
    real = folder.resolve()
    return [p for p in paths if pathlib.Path(p).resolve().is_relative_to(real)]


# --------------------------------------------------------------------------- a valid dump


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """A valid dump at level mix (a VF.lstm entry and the Module entries of one call)."""
    root = tmp_path_factory.mktemp("base")
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(I, H)
    x = torch.randn(T, B, I, requires_grad=True)
    d = MsprobeDump(root / "dump", level="mix")
    record_lstm(d, lstm, x)
    d.write()
    return root / "dump"


@pytest.fixture
def world(tmp_path: pathlib.Path, base: pathlib.Path) -> dict[str, pathlib.Path]:
    """A copy of the valid dump, and beside it (outside it) a sentinel tensor file of the same
    shape as the VF.lstm input."""
    dump = tmp_path / "dump"
    shutil.copytree(base, dump)
    outside = tmp_path / "outside"
    outside.mkdir()
    torch.save(torch.full((T, B, I), 7.0), outside / "secret.pt")
    return {"dump": dump, "rank": dump / "step0" / "rank0", "outside": outside,
            "data": dump / "step0" / "rank0" / "dump_tensor_data"}  # fmt: skip


def _doc(rank: pathlib.Path) -> dict[str, Any]:
    return json.loads((rank / "dump.json").read_text())


def _save(rank: pathlib.Path, doc: dict[str, Any]) -> None:
    (rank / "dump.json").write_text(json.dumps(doc))


def _check(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["check", *argv])
    return rc, out.getvalue(), err.getvalue()


def test_the_valid_dump_passes_and_the_spy_sees_its_files(world):
    with _spy() as seen:
        rc, out, err = _check(str(world["dump"]))
    assert rc == 0 and "2 checked (2 passed, 0 failed)" in out, out + err
    assert _inside(seen, world["data"]), "the spy saw no tensor file opened"
    with _spy() as seen:  # the spy sees what torch.load and numpy.load open
        torch.load(world["outside"] / "secret.pt", weights_only=True)
        np.save(world["outside"] / "s.npy", np.zeros(2))
        np.load(world["outside"] / "s.npy")
    assert len(_inside(seen, world["outside"])) >= 2, seen


# --------------------------------------------------------------------------- files outside


def _set_data_name(world: dict[str, pathlib.Path], name: str) -> None:
    doc = _doc(world["rank"])
    doc["data"][VF_IN]["input_args"][0]["data_name"] = name
    _save(world["rank"], doc)


@pytest.mark.parametrize("how", ["dotdot", "absolute", "link", "nul"])
def test_a_data_name_leading_out_of_the_tensor_folder_refuses_the_dump(world, how):
    secret = world["outside"] / "secret.pt"
    if how == "link":  # a link inside dump_tensor_data to the file outside
        (world["data"] / "evil.pt").symlink_to(secret)
    name = {
        "dotdot": os.path.relpath(secret, world["data"]),
        "absolute": str(secret),
        "link": "evil.pt",
        "nul": "x\x00.pt",
    }[how]
    _set_data_name(world, name)
    with _spy() as seen:
        rc, out, err = _check(str(world["dump"]))
    assert rc == 2 and out == "", out
    assert err.startswith("lstmgrad check: refused: ") and err.count("\n") == 1, err
    assert f"{VF_IN}.input.0: field 'data_name'" in err and "step0/rank0/dump.json" in err
    assert not _inside(seen, world["outside"]), seen


def test_a_link_that_stays_inside_the_tensor_folder_is_followed(world):
    src = world["data"] / f"{VF_IN}.input.0.pt"
    (world["data"] / "sub").mkdir()
    src.rename(world["data"] / "sub" / "x.pt")
    src.symlink_to(world["data"] / "sub" / "x.pt")
    assert _check(str(world["dump"]))[0] == 0


def test_a_recorded_dump_data_dir_outside_the_dump_needs_the_option(world):
    moved = world["outside"] / "tensors"
    world["data"].rename(moved)
    doc = _doc(world["rank"])
    doc["dump_data_dir"] = str(moved)
    _save(world["rank"], doc)
    with _spy() as seen:
        rc, out, err = _check(str(world["dump"]))
    assert rc == 2 and out == "" and not _inside(seen, moved)
    assert "refused" in err and "dump_data_dir" in err and "--allow-dump-data-dir" in err, err
    with _spy() as seen:
        rc, out, err = _check(str(world["dump"]), "--allow-dump-data-dir")
    assert rc == 0 and _inside(seen, moved), out + err
    doc["data"][VF_IN]["input_args"][0]["data_name"] = "../secret.pt"  # still confined
    _save(world["rank"], doc)
    with _spy() as seen:
        rc, out, err = _check(str(world["dump"]), "--allow-dump-data-dir")
    assert rc == 2 and "climbs out of the tensor folder" in err
    assert not [p for p in seen if p.endswith("secret.pt")]


def test_a_tensor_folder_linked_out_of_the_dump_needs_the_option(world):
    moved = world["outside"] / "tensors"
    world["data"].rename(moved)
    world["data"].symlink_to(moved)
    rc, out, err = _check(str(world["dump"]))
    assert rc == 2 and "dump_tensor_data is a link to" in err and "--allow-dump-data-dir" in err
    assert _check(str(world["dump"]), "--allow-dump-data-dir")[0] == 0


def test_a_dump_json_linked_out_of_the_dump_is_refused(world):
    other = world["outside"] / "step1" / "rank0"
    other.mkdir(parents=True)
    shutil.copy(world["rank"] / "dump.json", other / "dump.json")
    (world["dump"] / "step1" / "rank0").mkdir(parents=True)
    (world["dump"] / "step1" / "rank0" / "dump.json").symlink_to(other / "dump.json")
    rc, out, err = _check(str(world["dump"]))
    assert rc == 2 and "refused" in err and "outside the dump" in err, err


def test_the_option_is_refused_where_it_does_not_apply(world, tmp_path):
    kernel = tmp_path / "kernel"
    kernel.mkdir()
    rc, _, err = _check(str(kernel), "--aclnn-backward", "--allow-dump-data-dir")
    assert rc == 2 and "applies to msProbe dumps" in err
    rc, _, err = _check(str(tmp_path / "x.npz"), "--allow-dump-data-dir")
    assert rc == 2 and "not to a lstmgrad.dump file" in err and "applies to msProbe" in err


def test_a_kernel_file_linked_out_of_the_folder_is_refused(world, tmp_path):
    kernel = tmp_path / "kernel"
    kernel.mkdir()
    np.save(world["outside"] / "w.npy", np.zeros((4, 3), np.float32))
    (kernel / "LSTM.x.input.0.npy").symlink_to(world["outside"] / "w.npy")
    with _spy() as seen:
        rc, _, err = _check(str(kernel), "--aclnn-backward")
    assert rc == 2 and "refused" in err and "LSTM.x.input.0.npy" in err
    assert not _inside(seen, world["outside"])


# --------------------------------------------------------------------------- output files


@pytest.mark.parametrize("option", ["--csv", "--json"])
def test_an_output_file_that_cannot_be_written_stops_before_any_work(world, tmp_path, option,
                                                                    monkeypatch):  # fmt: skip
    from lstmgrad.tools import msprobe

    def no_work(*a: Any, **k: Any) -> None:
        raise AssertionError("the dump was read before the output files were checked")

    monkeypatch.setattr(msprobe, "check_dump", no_work)
    for target, message in ((tmp_path / "no" / "such" / "x.out", "no folder"),
                            (tmp_path, "is a folder")):  # fmt: skip
        rc, out, err = _check(str(world["dump"]), option, str(target))
        assert rc == 2 and out == "" and err.count("\n") == 1, err
        assert err.startswith(f"lstmgrad check: {option} {target}: {message}"), err
    same = str(tmp_path / "r.out")
    rc, _, err = _check(str(world["dump"]), "--csv", same, "--json", same)
    assert rc == 2 and "name the same file" in err


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_an_output_folder_without_write_permission_is_named(world, tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    rc, _, err = _check(str(world["dump"]), "--json", str(locked / "r.json"))
    assert rc == 2 and "is not writable" in err


def test_a_write_that_fails_after_the_check_is_exit_2_not_a_pass(world, tmp_path, monkeypatch):
    def full(*a: Any, **k: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(report, "write_csv", full)
    rc, out, err = _check(str(world["dump"]), "--csv", str(tmp_path / "r.csv"))
    assert rc == 2 and "exit 2" in out
    assert err == "lstmgrad check: --csv: could not write it (No space left on device)\n"


# --------------------------------------------------------------------------- not a dump


@pytest.mark.parametrize("content", [
    b"[" * 200_000,
    b"\xff\xfe\x00garbage",
    b"# a README\n",
    b'{"data": {"x": 1' + b"0" * 5000 + b"}}",  # an integer beyond Python's digit limit
    b"[1, 2]",
    b'{"task": "tensor"}',
], ids=["deep", "not-utf8", "not-json", "huge-int", "a-list", "no-data"])  # fmt: skip
def test_a_file_that_is_not_a_dump_is_said_in_one_line(tmp_path, content):
    f = tmp_path / "dump.json"
    f.write_bytes(content)
    rc, out, err = _check(str(f))
    assert rc == 2 and out == "" and err.count("\n") == 1, err
    assert "not an msProbe dump.json" in err and "Traceback" not in err


def test_an_unreadable_dump_json_among_others_is_reported_not_fatal(world):
    (world["dump"] / "step1" / "rank0").mkdir(parents=True)
    (world["dump"] / "step1" / "rank0" / "dump.json").write_text("[" * 200_000)
    rc, out, _ = _check(str(world["dump"]))
    assert rc == 2 and "2 checked (2 passed" in out and "nested too deeply" in out


def test_a_torch_saved_model_is_not_unpickled_and_said_in_one_line(tmp_path):
    marker = tmp_path / "executed"

    class Payload:
        def __reduce__(self) -> tuple[Any, ...]:
            return (pathlib.Path.touch, (marker,))

    torch.save({"model": torch.nn.Linear(2, 2), "payload": Payload()}, tmp_path / "model.pt")
    rc, out, err = _check(str(tmp_path / "model.pt"))
    assert rc == 2 and out == "" and err.count("\n") == 1, err
    assert "holds Python objects besides tensors" in err and "never unpickles" in err
    assert "weights_only=False" not in err and not marker.exists()


def test_a_pickle_as_a_tensor_file_is_never_executed(world, tmp_path):
    marker = tmp_path / "executed"

    class Payload:
        def __reduce__(self) -> tuple[Any, ...]:
            return (pathlib.Path.touch, (marker,))

    torch.save(Payload(), world["data"] / f"{VF_IN}.input.0.pt")
    rc, out, _ = _check(str(world["dump"]))
    assert rc == 2 and "holds Python objects besides tensors" in out and not marker.exists()


def test_tensor_files_are_not_allocated_beyond_what_they_hold(world):
    f = world["data"] / f"{VF_IN}.input.0.pt"
    raw = f.read_bytes()  # the same archive, its records compressed
    with zipfile.ZipFile(io.BytesIO(raw)) as src, \
            zipfile.ZipFile(f, "w", zipfile.ZIP_DEFLATED) as dst:  # fmt: skip
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info))
    rc, out, _ = _check(str(world["dump"]))
    assert rc == 2 and "compressed records" in out
    torch.save(torch.zeros(T, B, I), f, _use_new_zipfile_serialization=False)
    assert "not a zip archive" in _check(str(world["dump"]))[1]


def test_a_npy_header_declaring_more_than_the_file_holds_is_not_read(tmp_path):
    d = MsprobeDump(tmp_path / "dump", level="L1", npy=True)
    record_lstm(d, torch.nn.LSTM(I, H), torch.randn(T, B, I, requires_grad=True))
    d.write()
    f = d.data_dir / _doc(d.folder)["data"][VF_IN]["input_args"][0]["data_name"]
    assert f.is_file() and f.suffix == ".npy"
    with open(f, "wb") as fh:  # 4 TB declared, 16 bytes held
        np.lib.format.write_array_header_1_0(
            fh, {"descr": "<f4", "fortran_order": False, "shape": (10**12,)})  # fmt: skip
        fh.write(b"\0" * 16)
    rc, out, _ = _check(str(tmp_path / "dump"))
    assert rc == 2 and "its header declares [1000000000000] float32" in out, out


# --------------------------------------------------------------------------- malformed entries


def _tensor_at(doc: dict[str, Any], path: tuple[Any, ...]) -> Any:
    node: Any = doc["data"]
    for k in path:
        node = node[k]
    return node


MALFORMED = {  # id: (path to a node, field, value, what the message says)
    "shape-str": ((VF_IN, "input_args", 0), "shape", ["a", 3, 5], "field 'shape' must be"),
    "shape-negative": ((VF_IN, "input_args", 0), "shape", [-3, 2, 3], "field 'shape' must be"),
    "shape-bool": ((VF_IN, "input_args", 0), "shape", [True, 2, 3], "field 'shape' must be"),
    "shape-float": ((VF_IN, "input_args", 0), "shape", [3.0, 2, 3], "field 'shape' must be"),
    "shape-huge": (
        (VF_IN, "input_args", 0),
        "shape",
        [10**9, 10**9, 3],
        "declares more than 2^34 elements",
    ),
    "shape-missing": ((VF_IN, "input_args", 0), "shape", None, "field 'shape' must be"),
    "dtype-list": ((VF_IN, "input_args", 0), "dtype", ["x"], "field 'dtype' must be"),
    "data_name-int": ((VF_IN, "input_args", 0), "data_name", 5, "field 'data_name' must be"),
    "input_args-dict": ((VF_IN,), "input_args", {"a": 1}, "field 'input_args' must be a list"),
    "input_kwargs-list": ((MOD_FWD,), "input_kwargs", [1, "a"], "field 'input_kwargs' must be"),
    "num_layers-huge": ((VF_IN, "input_args"), 4, 10**12, "num_layers must be 1 to 1024"),
    "num_layers-float": ((VF_IN, "input_args"), 4, 1.5, "expected a int"),
    "dropout-huge-int": ((VF_IN, "input_args"), 5, 10**400, "expected a float"),
    "dropout-above-1": ((VF_IN, "input_args"), 5, 7.0, "dropout must be 0 to 1"),
    "nested": (
        (VF_IN, "input_args"),
        1,
        [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]],
        "nested deeper than 32 levels",
    ),
    "value-nested": (
        (VF_IN, "input_args"),
        1,
        {"type": "int", "value": "@DEEP500@"},
        "field 'value' nested deeper than 32 levels",
    ),
    "layer-index-huge": (
        (MOD_FWD, "parameters"),
        "weight_ih_l9999",
        {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [16, 3]},
        "an LSTM of more than 1024 layers is not read",
    ),
}


@pytest.mark.parametrize("where, field, value, message", MALFORMED.values(), ids=MALFORMED)
def test_a_malformed_entry_is_exit_2_naming_the_entry_and_field(world, where, field, value,
                                                                message):  # fmt: skip
    doc = _doc(world["rank"])
    node = _tensor_at(doc, where)
    if value is None:
        del node[field]
    else:
        node[field] = value
    (world["rank"] / "dump.json").write_text(
        json.dumps(doc).replace('"@DEEP500@"', "[" * 500 + "]" * 500))  # fmt: skip
    rc, out, err = _check(str(world["dump"]))
    assert rc == 2 and err == "" and message in out, out
    assert where[0] in out.split(message)[0].rsplit("\n", 1)[-1], out  # the entry, on its line


def test_a_parameter_name_with_a_5000_digit_layer_is_skipped_by_name(world):
    doc = _doc(world["rank"])
    doc["data"][MOD_FWD]["parameters"]["weight_ih_l" + "9" * 5000] = {}
    _save(world["rank"], doc)
    rc, out, _ = _check(str(world["dump"]))
    assert rc == 0 and "not a torch.nn.LSTM parameter name" in out  # the VF.lstm entry passes
    assert max(len(line) for line in out.splitlines()) < 400


def test_statistics_of_the_wrong_kind_are_not_compared(world):
    doc = _doc(world["rank"])
    out0 = doc["data"][VF_IN]["output"][0]  # its file gone: its statistics are compared
    (world["data"] / out0["data_name"]).unlink()
    out0.update({"Max": "big", "Min": [1], "Mean": 10**400})
    _save(world["rank"], doc)
    rc, out, _ = _check(str(world["dump"]))
    assert rc == 1 and "Mean: recorded inf" in out and "Norm: recorded" in out
    assert "Max: recorded" not in out and "Min: recorded" not in out


@pytest.fixture
def packed(tmp_path: pathlib.Path) -> pathlib.Path:
    torch.manual_seed(0)
    x = pack_padded_sequence(torch.randn(4, 3, I, requires_grad=True), torch.tensor([2, 4, 1]),
                             enforce_sorted=False)  # fmt: skip
    d = MsprobeDump(tmp_path / "dump", level="L0")
    record_lstm(d, torch.nn.LSTM(I, H), x)
    d.write()
    return d.data_dir


@pytest.mark.parametrize("file, value, message", [
    ("batch_sizes", [10**12, 1, 1, 1], "batch_sizes must be counts from 1 to 7"),
    ("batch_sizes", [3, 2, 0, 1], "batch_sizes must be counts from 1 to 7"),
    ("batch_sizes", [3, 3, 1, 1], "batch_sizes add up to 8"),
    ("batch_sizes", [1, 2, 2, 2], "must not increase"),
    ("sorted_indices", [0, 0, 7], "expected a permutation of 0..2"),
])  # fmt: skip
def test_packed_sequence_fields_that_do_not_fit_the_data(packed, file, value, message):
    torch.save(torch.tensor(value), packed / f"{MOD_FWD}.input.0.{file}.pt")
    rc, out, err = _check(str(packed.parent.parent.parent))
    assert rc == 2 and f"{MOD_FWD}.input.0.{file}: " in out and message in out, out + err


# --------------------------------------------------------------------------- the sweep

HOSTILE_NAMES = ["@UP@/outside/secret.pt", "@ABS@", "evil.pt", "sub/../../x.pt", "x\x00y", ".",
                 "/", "..", "", "dump.json", "../dump.json"]  # fmt: skip
FIELDS = ["type", "dtype", "shape", "data_name", "Max", "Norm", "value", "requires_grad",
          "input_args", "input_kwargs", "output", "parameters", "data", "batch_sizes"]  # fmt: skip
LEAVES = (
    st.none() | st.booleans() | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=8)
    | st.sampled_from(HOSTILE_NAMES)
    | st.sampled_from(["torch.Tensor", "torch.float32", "int", "torch.int64", "float"])
)  # fmt: skip
VALUES = st.recursive(
    LEAVES,
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(
        st.sampled_from(FIELDS) | st.text(max_size=4), kids, max_size=4),
    max_leaves=10,
)  # fmt: skip
SHAPES = st.lists(st.integers(-2, 6) | st.sampled_from([0, 2**40, 10**30, 1.0, "3", True, None]),
                  max_size=5)  # fmt: skip
DEEP = "\u0001DEEP\u0001"


def _nodes(v: Any, at: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path into a JSON value, depth first."""
    out = [at]
    items = v.items() if isinstance(v, dict) else enumerate(v) if isinstance(v, list) else ()
    for k, e in items:
        out += _nodes(e, (*at, k))
    return out


def _get(doc: Any, path: tuple[Any, ...]) -> Any:
    for k in path:
        doc = doc[k]
    return doc


def _mutate(data: st.DataObject, doc: dict[str, Any]) -> tuple[dict[str, Any], list[int]]:
    """One to three mutations of a dump.json document; the depths of nested placeholders."""
    depths = []
    for _ in range(data.draw(st.integers(1, 3), label="mutations")):
        paths = _nodes(doc)[1:]
        path = data.draw(st.sampled_from(paths), label="at")
        parent, key = _get(doc, path[:-1]), path[-1]
        tensors = [p for p in paths if isinstance(_get(doc, p), dict)
                   and _get(doc, p).get("type") == "torch.Tensor"]  # fmt: skip
        op = data.draw(st.sampled_from(["replace", "delete", "tensor", "tensor", "deep"]),
                       label="op")  # fmt: skip
        if op == "replace":
            parent[key] = data.draw(VALUES, label="value")
        elif op == "delete":
            del parent[key]
        elif op == "tensor" and tensors:
            node = _get(doc, data.draw(st.sampled_from(tensors), label="tensor"))
            field = data.draw(st.sampled_from(["shape", "data_name", "data_name", "dtype", "type"]),
                              label="field")  # fmt: skip
            node[field] = data.draw({"shape": SHAPES, "data_name": st.sampled_from(HOSTILE_NAMES)}
                                    .get(field, VALUES), label="field value")  # fmt: skip
        elif op == "deep":
            depths.append(data.draw(st.sampled_from([33, 500, 5000, 200_000]), label="depth"))
            parent[key] = f"{DEEP}{len(depths) - 1}"
    return doc, depths


def _sweep(data: st.DataObject, base: pathlib.Path, work: pathlib.Path) -> None:
    n = len(list(work.iterdir()))
    root = work / f"ex{n}"
    dump = root / "dump"
    shutil.copytree(base, dump)
    rank = dump / "step0" / "rank0"
    secret = work / "outside" / "secret.pt"
    (rank / "dump_tensor_data" / "evil.pt").symlink_to(secret)
    doc, depths = _mutate(data, _doc(rank))
    text = json.dumps(doc)
    for i, d in enumerate(depths):
        text = text.replace(json.dumps(f"{DEEP}{i}"), "[" * d + "]" * d)
    text = text.replace("@UP@", os.path.relpath(work, rank / "dump_tensor_data"))
    text = text.replace("@ABS@", str(secret))
    raw = text.encode()
    cut = data.draw(st.sampled_from([None] * 8 + ["truncate", "bytes"]), label="raw")
    if cut == "truncate":
        raw = raw[: data.draw(st.integers(0, len(raw)), label="length")]
    elif cut == "bytes":
        at = data.draw(st.integers(0, len(raw)), label="offset")
        raw = raw[:at] + data.draw(st.binary(min_size=1, max_size=4), label="bytes") + raw[at:]
    (rank / "dump.json").write_bytes(raw)
    with _spy() as seen:
        rc, out, err = _check(str(dump))
    assert rc in (0, 1, 2), (rc, out, err)
    event(f"exit {rc}" + (": refused" if "refused" in err else ""))  # --hypothesis-show-statistics
    assert "Traceback" not in out + err
    assert not _inside(seen, work / "outside"), seen
    shutil.rmtree(root)


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    w = tmp_path_factory.mktemp("sweep")
    (w / "outside").mkdir()
    torch.save(torch.full((T, B, I), 7.0), w / "outside" / "secret.pt")
    return w


@settings(max_examples=100, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])  # fmt: skip
@given(data=st.data())
def test_a_mutated_dump_json_exits_0_1_or_2_reading_nothing_outside(data, base, work):
    _sweep(data, base, work)


@pytest.mark.slow
@settings(max_examples=1500, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])  # fmt: skip
@given(data=st.data())
def test_a_mutated_dump_json_sweep_long(data, base, work):
    _sweep(data, base, work)
