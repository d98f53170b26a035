"""The msProbe dump writer used as a fixture generator (tests/msprobe_writer.py): its JSON follows
the documented schema, its files load with weights_only=True and hold what the JSON describes, the
recorded LSTM entries equal torch's own results and gradients, and the broken fixtures are broken."""

from __future__ import annotations

import json
import os
import pathlib
import pickle
import sys
from typing import Any

import numpy as np
import pytest
import torch
from torch.nn.utils.rnn import pack_padded_sequence

from msprobe_writer import (
    API_PREFIXES,
    MsprobeDump,
    add_npu_lstm,
    crc32_hex,
    make_npu_tensor_file,
    record_lstm,
    record_lstm_rounded,
    tensor_stats,
)

T, B, I, H = 5, 3, 4, 6
VALUE_TYPES = {"bool", "int", "float", "str", "torch.dtype"}


def load_pt(path: pathlib.Path) -> torch.Tensor:
    return torch.load(path, map_location="cpu", weights_only=True)


def check_value(v: Any, folder: pathlib.Path, task: str, npy: bool = False) -> int:
    """Validate one dumped value against the schema; return how many tensors it holds."""
    if v is None or type(v) is int:  # null, or a slice's [start, stop, step] part
        return 0
    if isinstance(v, list):
        return sum(check_value(x, folder, task, npy) for x in v)
    assert isinstance(v, dict), v
    kind = v.get("type")
    if kind is None:  # a dict or namedtuple
        return sum(check_value(x, folder, task, npy) for x in v.values())
    if kind in VALUE_TYPES:
        assert set(v) == {"type", "value"}
        if kind == "torch.dtype":
            assert v["value"].startswith("torch.")
        else:
            assert type(v["value"]).__name__ == kind
        return 0
    assert kind == "torch.Tensor", v
    keys = {"type", "dtype", "shape", "Max", "Min", "Mean", "Norm", "requires_grad", "md5"}
    assert set(v) == keys | ({"data_name"} if task == "tensor" else set())
    assert v["dtype"].startswith("torch.") and isinstance(v["shape"], list)
    assert isinstance(v["requires_grad"], bool)
    assert len(v["md5"]) == 8 and int(v["md5"], 16) >= 0
    if task == "tensor":
        path = folder / "dump_tensor_data" / v["data_name"]
        if path.exists():
            if npy:
                t = torch.from_numpy(np.load(path))
            else:
                t = load_pt(path)
                assert str(t.dtype) == v["dtype"]
                assert v["md5"] == crc32_hex(t)
            assert list(t.shape) == v["shape"]
            stats = tensor_stats(t)
            for k in ("Max", "Min", "Mean", "Norm"):
                assert stats[k] == v[k], (v["data_name"], k)
    return 1


def check_dump(folder: pathlib.Path, npy: bool = False) -> dict[str, Any]:
    """Validate a written dump folder; return dump.json."""
    dump = json.loads((folder / "dump.json").read_text())
    assert set(dump) == {"task", "level", "framework", "dump_data_dir", "data"}
    assert dump["framework"] == "pytorch" and dump["level"] in ("L0", "L1", "mix")
    task = dump["task"]
    if task == "tensor":
        assert pathlib.Path(dump["dump_data_dir"]) == folder / "dump_tensor_data"
        assert os.path.isabs(dump["dump_data_dir"])
    else:
        assert task == "statistics" and dump["dump_data_dir"] is None
        assert not (folder / "dump_tensor_data").exists()
    for name, entry in dump["data"].items():
        head = name.split(".")[0]
        assert head in (*API_PREFIXES, "Module"), name
        if name.endswith(".parameters_grad"):
            check_value(entry, folder, task, npy)
        elif ".forward" in name:
            assert {"input_args", "input_kwargs", "output"} <= set(entry)
            assert set(entry) <= {"input_args", "input_kwargs", "output", "parameters"}
            check_value(entry, folder, task, npy)
        else:
            assert ".backward" in name and set(entry) == {"input", "output"}
            check_value(entry, folder, task, npy)
    stack = json.loads((folder / "stack.json").read_text())
    for i, (key, (lines, names)) in enumerate(stack.items()):
        assert key == str(i) and all(isinstance(s, str) for s in lines)
        assert all(n in dump["data"] for n in names)
    construct = json.loads((folder / "construct.json").read_text())
    if dump["level"] == "L1":
        assert construct == {}
    return dump


def make_lstm(layers: int = 2, bidirectional: bool = True, dtype=torch.float32, seed: int = 1):
    torch.manual_seed(seed)
    return torch.nn.LSTM(I, H, num_layers=layers, bidirectional=bidirectional).to(dtype)


def make_x(dtype=torch.float32, seed: int = 2):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(T, B, I, generator=g, dtype=torch.float64).to(dtype).requires_grad_()


def make_hx(k: int, dtype=torch.float32, seed: int = 3):
    g = torch.Generator().manual_seed(seed)
    return tuple(
        (0.5 * torch.randn(k, B, H, generator=g, dtype=torch.float64)).to(dtype).requires_grad_()
        for _ in range(2)
    )


def test_dense_l1_two_layer_bidirectional(tmp_path):
    lstm, x, hx = make_lstm(), make_x(), make_hx(4)
    dump = MsprobeDump(tmp_path)
    rec = record_lstm(dump, lstm, x, hx)
    folder = dump.write()
    assert folder == tmp_path / "step0" / "rank0"
    data = check_dump(folder)["data"]
    assert list(data) == ["VF.lstm.0.forward", "VF.lstm.0.backward"] == rec["names"]

    fwd = data["VF.lstm.0.forward"]
    args = fwd["input_args"]
    assert len(args) == 9 and len(args[1]) == 2 and len(args[2]) == 16
    assert args[3:] == [
        {"type": "bool", "value": True},
        {"type": "int", "value": 2},
        {"type": "float", "value": 0.0},
        {"type": "bool", "value": True},
        {"type": "bool", "value": True},
        {"type": "bool", "value": False},
    ]
    assert args[0]["data_name"] == "VF.lstm.0.forward.input.0.pt" and args[0]["requires_grad"]
    assert args[1][1]["data_name"] == "VF.lstm.0.forward.input.1.1.pt"
    assert args[2][15]["data_name"] == "VF.lstm.0.forward.input.2.15.pt"
    assert fwd["input_kwargs"] == {}
    assert [o["data_name"] for o in fwd["output"]] == [
        f"VF.lstm.0.forward.output.{i}.pt" for i in range(3)
    ]
    assert all(o["requires_grad"] for o in fwd["output"])

    # the files hold torch's own results and gradients
    y, (h_n, c_n) = lstm(x, hx)
    dy, dh, dc = rec["dy"], rec["dh"], rec["dc"]
    grads = torch.autograd.grad([y, h_n, c_n], [x, *hx], [dy, dh, dc])
    files = folder / "dump_tensor_data"
    for i, ref in enumerate((y, h_n, c_n)):
        assert torch.equal(load_pt(files / f"VF.lstm.0.forward.output.{i}.pt"), ref.detach())
    assert torch.equal(load_pt(files / "VF.lstm.0.forward.input.2.0.pt"), lstm.weight_ih_l0)
    bwd = data["VF.lstm.0.backward"]
    assert [e["data_name"] for e in bwd["input"]] == [
        f"VF.lstm.0.backward.input.{i}.pt" for i in range(3)
    ]
    for i, ref in enumerate((dy, dh, dc)):
        assert torch.equal(load_pt(files / f"VF.lstm.0.backward.input.{i}.pt"), ref)
    assert bwd["output"][1:] == [None] * 8
    assert bwd["output"][0]["data_name"] == "VF.lstm.0.backward.output.0.pt"
    torch.testing.assert_close(load_pt(files / "VF.lstm.0.backward.output.0.pt"), grads[0])
    torch.testing.assert_close(rec["dh0"], grads[1])

    stack = json.loads((folder / "stack.json").read_text())
    assert [names for _, names in stack.values()] == [["VF.lstm.0.forward"]]
    # the patch is gone afterwards
    assert "lstm" not in torch._VF.__dict__


def test_mix_packed_module_and_api(tmp_path):
    lstm = make_lstm(layers=1, bidirectional=False)
    lengths = torch.tensor([3, 5, 2])
    x = make_x()
    packed = pack_padded_sequence(x, lengths, enforce_sorted=False)
    dump = MsprobeDump(tmp_path, level="mix", step=3, rank=1)
    rec = record_lstm(dump, lstm, packed, module_path="encoder.lstm")
    folder = dump.write()
    assert folder == tmp_path / "step3" / "rank1"
    data = check_dump(folder)["data"]
    m = "Module.encoder.lstm.LSTM"
    assert rec["names"] == [
        "VF.lstm.0.forward",
        f"{m}.forward.0",
        "VF.lstm.0.backward",
        f"{m}.backward.0",
        f"{m}.parameters_grad",
    ]
    assert list(data) == rec["names"]

    vf_args = data["VF.lstm.0.forward"]["input_args"]
    assert len(vf_args) == 9 and vf_args[1]["dtype"] == "torch.int64"
    assert vf_args[1]["Mean"] is None and vf_args[1]["Max"] == 3
    assert vf_args[2][0]["data_name"] == "VF.lstm.0.forward.input.2.0.pt"
    assert vf_args[-1] == {"type": "bool", "value": False}  # bidirectional
    assert data["VF.lstm.0.backward"]["output"][1:] == [None] * 8

    fwd = data[f"{m}.forward.0"]
    assert set(fwd["input_args"][0]) == {
        "data",
        "batch_sizes",
        "sorted_indices",
        "unsorted_indices",
    }
    assert fwd["input_args"][0]["data"]["data_name"] == f"{m}.forward.0.input.0.data.pt"
    assert fwd["output"][0]["batch_sizes"]["data_name"] == f"{m}.forward.0.output.0.batch_sizes.pt"
    assert fwd["output"][1][0]["data_name"] == f"{m}.forward.0.output.1.0.pt"
    assert sorted(fwd["parameters"]) == sorted(n for n, _ in lstm.named_parameters())
    assert (
        fwd["parameters"]["weight_ih_l0"]["data_name"]
        == f"{m}.forward.0.parameters.weight_ih_l0.pt"
    )
    bwd = data[f"{m}.backward.0"]
    assert bwd["input"][0]["batch_sizes"] is None and len(bwd["input"][1]) == 2
    assert bwd["output"][0]["data"]["data_name"] == f"{m}.backward.0.output.0.data.pt"
    pg = data[f"{m}.parameters_grad"]
    assert pg["bias_hh_l0"]["data_name"] == f"{m}.parameters_grad.bias_hh_l0.pt"

    construct = json.loads((folder / "construct.json").read_text())
    assert construct["VF.lstm.0.forward"] == f"{m}.forward.0"
    assert construct["VF.lstm.0.backward"] == f"{m}.backward.0"
    assert construct[f"{m}.forward.0"] is None

    # parameter gradients and dx equal torch's
    y, (h_n, c_n) = lstm(packed)
    wanted = torch.autograd.grad(
        [y.data, h_n, c_n], [x, *lstm.parameters()], [rec["dy"], rec["dh"], rec["dc"]]
    )
    files = folder / "dump_tensor_data"
    for (name, _), ref in zip(lstm.named_parameters(), wanted[1:], strict=True):
        torch.testing.assert_close(load_pt(files / f"{m}.parameters_grad.{name}.pt"), ref)
    dx_packed = load_pt(files / f"{m}.backward.0.output.0.data.pt")
    assert torch.equal(dx_packed, load_pt(files / "VF.lstm.0.backward.output.0.pt"))
    torch.testing.assert_close(dx_packed, rec["dx"])


def test_l0_counters_and_statistics_task(tmp_path):
    lstm, x = make_lstm(layers=1), make_x()
    dump = MsprobeDump(tmp_path, task="statistics", level="L0", rank=None)
    first = record_lstm(dump, lstm, x, backward=False)
    second = record_lstm(dump, lstm, x, make_hx(2))
    folder = dump.write()
    assert folder == tmp_path / "step0" / f"proc{os.getpid()}"
    data = check_dump(folder)["data"]
    assert first["names"] == ["Module.lstm.LSTM.forward.0"]
    assert second["names"] == [
        "Module.lstm.LSTM.forward.1",
        "Module.lstm.LSTM.backward.1",
        "Module.lstm.LSTM.parameters_grad",
    ]
    assert "data_name" not in json.dumps(data)
    out = data["Module.lstm.LSTM.forward.1"]["output"][0]
    assert out["Max"] == float(second["output"].max()) and out["md5"] == crc32_hex(second["output"])
    assert len(data["Module.lstm.LSTM.backward.1"]["output"]) == 2  # [dx, [dh0, dc0]]


def test_value_encodings_and_low_precision_stats(tmp_path):
    g = torch.Generator().manual_seed(4)
    base = torch.randn(3, 4, generator=g) * 3
    values = {
        "f16": base.half(),
        "bf16": base.bfloat16(),
        "f64": base.double(),
        "i64": torch.tensor([5, -2, 9]),
        "b": torch.tensor([True, False]),
    }
    dump = MsprobeDump(tmp_path)
    kw = {
        "dtype": torch.float16,
        "dim": 1,
        "s": "x",
        "sl": slice(1, None, 2),
        "nest": {"a": [values["i64"]]},
    }
    dump.api_forward("Torch.cat.0.forward", [list(values.values())], kw, values["f16"])
    folder = dump.write()
    entry = check_dump(folder)["data"]["Torch.cat.0.forward"]
    f16, bf16, f64, i64, b = entry["input_args"][0]
    assert f16["Max"] == float(base.half().float().max()) and f16["dtype"] == "torch.float16"
    assert bf16["Norm"] == float(torch.linalg.vector_norm(base.bfloat16().float()))
    assert f64["Mean"] == float(base.double().mean())
    assert (i64["Max"], i64["Min"], i64["Mean"], i64["Norm"]) == (9, -2, None, None)
    assert (b["Max"], b["Min"], b["Mean"], b["Norm"]) == (True, False, None, None)
    assert isinstance(b["Max"], bool) and isinstance(i64["Max"], int)
    assert entry["input_kwargs"]["dtype"] == {"type": "torch.dtype", "value": "torch.float16"}
    assert entry["input_kwargs"]["sl"] == [1, None, 2]
    assert (
        entry["input_kwargs"]["nest"]["a"][0]["data_name"]
        == "Torch.cat.0.forward.kwargs.nest.a.0.pt"
    )
    assert entry["input_args"][0][1]["data_name"] == "Torch.cat.0.forward.input.0.1.pt"
    assert torch.equal(load_pt(folder / "dump_tensor_data" / bf16["data_name"]), base.bfloat16())
    assert entry["output"][0]["data_name"] == "Torch.cat.0.forward.output.0.pt"


def test_npy_option(tmp_path):
    dump = MsprobeDump(tmp_path, npy=True)
    rec = record_lstm(dump, make_lstm(layers=1, bidirectional=False), make_x())
    folder = dump.write()
    data = check_dump(folder, npy=True)["data"]
    assert (
        data["VF.lstm.0.forward"]["input_args"][1][0]["data_name"]
        == "VF_lstm_0_forward_input.1.0.npy"
    )
    names = {p.name for p in (folder / "dump_tensor_data").iterdir()}
    assert "VF_lstm_0_backward_output.0.npy" in names and not any(n.endswith(".pt") for n in names)
    y = np.load(folder / "dump_tensor_data" / "VF_lstm_0_forward_output.0.npy")
    np.testing.assert_array_equal(y, rec["output"].numpy())


def test_npu_file_does_not_load(tmp_path):
    path = tmp_path / "npu.pt"
    make_npu_tensor_file(path, torch.arange(6.0).reshape(2, 3))
    with pytest.raises(pickle.UnpicklingError) as err:
        torch.load(path, map_location="cpu", weights_only=True)
    message = str(err.value)
    print(next(line.strip() for line in message.splitlines() if "WeightsUnpickler" in line))
    assert "Unsupported global: GLOBAL torch_npu._rebuild_npu_tensor" in message
    with pytest.raises(ModuleNotFoundError, match="torch_npu"):
        torch.load(path, map_location="cpu", weights_only=False)
    assert "torch_npu" not in sys.modules

    # the same inside a dump: only the chosen files are NPU files
    dump = MsprobeDump(tmp_path / "d", npu_files=lambda name, kind, key: kind == "output")
    record_lstm(dump, make_lstm(layers=1), make_x(), backward=False)
    files = dump.write() / "dump_tensor_data"
    load_pt(files / "VF.lstm.0.forward.input.0.pt")
    with pytest.raises(pickle.UnpicklingError):
        load_pt(files / "VF.lstm.0.forward.output.0.pt")


def test_missing_output_files(tmp_path):
    dump = MsprobeDump(tmp_path, skip_files=lambda name, kind, key: kind == "output")
    record_lstm(dump, make_lstm(layers=1), make_x())
    folder = dump.write()
    data = check_dump(folder)["data"]
    names = {p.name for p in (folder / "dump_tensor_data").iterdir()}
    assert data["VF.lstm.0.forward"]["output"][0]["data_name"] == "VF.lstm.0.forward.output.0.pt"
    assert not any(".output." in n for n in names)
    assert "VF.lstm.0.forward.input.0.pt" in names and "VF.lstm.0.backward.input.0.pt" in names


def test_perturb_one_element(tmp_path):
    def perturb(name, key, t):
        if name == "VF.lstm.0.forward" and key == (0,):
            t[3, 1, 5] += 0.25
        return t

    lstm, x = make_lstm(), make_x()
    dump = MsprobeDump(tmp_path)
    rec = record_lstm(dump, lstm, x, perturb=perturb)
    files = dump.write() / "dump_tensor_data"
    y = load_pt(files / "VF.lstm.0.forward.output.0.pt")
    diff = (y - rec["output"]).nonzero().tolist()
    assert diff == [[3, 1, 5]]
    assert torch.equal(load_pt(files / "VF.lstm.0.forward.output.1.pt"), rec["h_n"])
    ref = lstm(x)[0]
    assert torch.equal(rec["output"], ref.detach())  # the run itself is untouched


def test_rounded_device(tmp_path):
    lstm, x, hx = make_lstm(), make_x(), make_hx(4)
    dump = MsprobeDump(tmp_path, level="mix")
    rec = record_lstm_rounded(dump, lstm, x, hx, dtype=torch.float16)
    folder = dump.write()
    data = check_dump(folder)["data"]
    files = folder / "dump_tensor_data"
    fwd = data["VF.lstm.0.forward"]
    assert fwd["input_args"][0]["dtype"] == "torch.float16"
    assert all(o["dtype"] == "torch.float16" for o in fwd["output"])
    x16 = load_pt(files / "VF.lstm.0.forward.input.0.pt")
    assert torch.equal(x16, x.detach().half())
    y64, _ = rec["lstm64"](x16.double(), tuple(h.detach().half().double() for h in hx))
    assert torch.equal(load_pt(files / "VF.lstm.0.forward.output.0.pt"), y64.detach().half())
    assert torch.equal(load_pt(files / "VF.lstm.0.backward.input.0.pt").double(), rec["dy"])
    assert torch.equal(load_pt(files / "VF.lstm.0.backward.output.0.pt"), rec["dx"].half())
    w = load_pt(files / "Module.lstm.LSTM.parameters_grad.weight_hh_l1_reverse.pt")
    assert w.dtype == torch.float16
    assert torch.equal(w, rec["param_grads"]["weight_hh_l1_reverse"].half())


def test_npu_lstm_entry(tmp_path):
    dump = MsprobeDump(tmp_path)
    assert add_npu_lstm(dump) == "NPU.npu_lstm.0.forward"
    assert add_npu_lstm(dump) == "NPU.npu_lstm.1.forward"
    data = check_dump(dump.write())["data"]
    assert len(data["NPU.npu_lstm.0.forward"]["output"]) == 8
