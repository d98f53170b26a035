"""What a user gets from ``pip install lstmgrad``: the wheel's contents and metadata, and a clear
message when a PyTorch feature is used without PyTorch."""

from __future__ import annotations

import email.parser
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import lstmgrad
from lstmgrad.core.errors import TORCH_INSTALL

ROOT = Path(__file__).resolve().parent.parent
# run first in the child: every `import torch` then fails as if PyTorch were not installed
NO_TORCH = "import sys; sys.modules['torch'] = None\n"


def run_without_torch(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", NO_TORCH + code],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, **env},
    )


@pytest.mark.parametrize(
    "code, feature",
    [
        ("from lstmgrad.nn import LSTM", "lstmgrad.nn"),
        ("import lstmgrad.torch_ops", "lstmgrad.torch_ops"),
        ("from lstmgrad.tools.cli import main; sys.exit(main(['bench']))", "lstmgrad bench"),
        (
            "from lstmgrad.tools.cli import main; sys.exit(main(['tune', '--shape', '5,2,3,4']))",
            "lstmgrad tune --input tensors",
        ),
    ],  # fmt: skip
)
def test_a_torch_feature_without_torch_names_the_install_command(code, feature):
    proc = run_without_torch(code)
    assert proc.returncode != 0
    assert f"{feature} needs PyTorch" in proc.stderr and TORCH_INSTALL in proc.stderr, proc.stderr
    # right for an install from an index and for a clone of the repository
    assert 'pip install "lstmgrad[torch]"' in TORCH_INSTALL
    assert 'pip install -e ".[torch]"' in TORCH_INSTALL


def test_tune_show_and_reset_work_without_torch(tmp_path):
    """They touch no tensors: --show prints NumPy's store, --reset deletes whatever is stored
    (also a torch store written when PyTorch was installed) and says so truthfully."""
    main = "from lstmgrad.tools.cli import main; sys.exit(main({}))"
    cache = {"LSTMGRAD_CACHE_DIR": str(tmp_path), "LSTMGRAD_TUNE": "on"}
    for argv in (["tune", "--show", "--json"], ["tune", "--json"]):
        proc = run_without_torch(main.format(argv), **cache)
        assert proc.returncode == 0, proc.stderr
        shown = json.loads(proc.stdout)
        assert "numpy" in shown and "torch" not in shown
    proc = run_without_torch(main.format(["tune", "--reset"]), **cache)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"nothing stored at {tmp_path}"
    for name in ("wisdom-0123456789abcdef.json", "wisdom-fedcba9876543210.json"):
        (tmp_path / name).write_text("{}")
    proc = run_without_torch(main.format(["tune", "--reset"]), **cache)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("forgot ") == 2 and not list(tmp_path.glob("wisdom-*.json"))


def test_the_core_runs_without_torch():
    code = (
        "import numpy as np, lstmgrad\n"
        "x = np.ones((2, 1, 3), np.float32)\n"
        "p = [np.full(s, 0.1, np.float32) for s in [(8, 3), (8, 2), (8,), (8,)]]\n"
        "r = lstmgrad.lstm_forward(x, p)\n"
        "g = lstmgrad.lstm_backward(x, [np.zeros((1, 1, 2), np.float32)] * 2, p, r.output,"
        " None, None, *r.saved[:7])\n"
        "assert g.dx.shape == x.shape and 'torch' not in [k for k, v in sys.modules.items() if v]"
    )
    proc = run_without_torch(code)
    assert proc.returncode == 0, proc.stderr


def test_the_wheel_holds_the_package_the_license_and_the_version(tmp_path):
    setuptools = pytest.importorskip("setuptools")
    if int(setuptools.__version__.split(".")[0]) < 77:
        pytest.skip(
            f"building needs setuptools >= 77 (SPDX license), have {setuptools.__version__}"
        )
    src = tmp_path / "src"  # a copy: the build leaves build/ and egg-info behind
    skip = shutil.ignore_patterns("__pycache__", "*.egg-info")
    shutil.copytree(ROOT / "src", src / "src", ignore=skip)
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, src / name)
    cmd = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
    proc = subprocess.run(
        [*cmd, "-w", str(tmp_path / "whl"), str(src)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (wheel,) = (tmp_path / "whl").glob("lstmgrad-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        info = f"lstmgrad-{lstmgrad.__version__}.dist-info"
        meta = email.parser.Parser().parsestr(z.read(f"{info}/METADATA").decode())
        license_text = z.read(f"{info}/licenses/LICENSE").decode()
        entry_points = z.read(f"{info}/entry_points.txt").decode()
    sources = {p.relative_to(ROOT / "src").as_posix() for p in (ROOT / "src").rglob("*.py")}
    assert sources <= names, sorted(sources - names)
    assert "lstmgrad/py.typed" in names
    assert license_text == (ROOT / "LICENSE").read_text()
    assert "Apache License" in license_text and "Version 2.0, January 2004" in license_text
    assert meta["Version"] == lstmgrad.__version__
    assert meta["License-Expression"] == "Apache-2.0"
    assert "Typing :: Typed" in meta.get_all("Classifier")
    assert meta["Provides-Extra"] is not None and "torch" in meta.get_all("Provides-Extra")
    assert "lstmgrad = lstmgrad.tools.cli:main" in entry_points
    # project URLs: real https addresses, no placeholder left to fill in
    urls = dict(u.split(", ", 1) for u in meta.get_all("Project-URL") or [])
    assert {"Upstream aclnnLstmBackward", "Upstream aclnnLSTM"} <= set(urls), urls
    for label, url in urls.items():
        assert len(label) <= 32 and url.startswith("https://"), (label, url)
        assert not re.search(r"example\.(com|org)|OWNER|USER|<|>|TODO", url), url
