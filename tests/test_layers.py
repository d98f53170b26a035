"""The package's layers as docs/design.md draws them: every import inside src/lstmgrad (at module
level or inside a function) goes to the same layer or one below, but for the arrows listed in
KNOWN_UP with their reason; reference/ and fused/ never import each other; nothing below
torch_ops.py imports torch at module level (the core runs without it)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "lstmgrad"

# upward arrows that exist today, each with its reason; a new one fails the test, and one that
# disappears must be taken off this list
KNOWN_UP = {
    ("plan", "tune"): "a plan asks for a measurement of a class not seen yet",
    ("tune", "api"): "the tuner times candidates through the public entry points",
    ("tune", "tensors"): "the tuner times torch's GEMM back end",
    ("tune", "fused.lstm"): "the tuner runs the engine's passes",
    ("tune", "fused.walks"): "the tuner times the walks and asks for their threads",
    ("tune", "fused.kernels"): "the tuner times the kernels' products",
    ("tune", "fused.half"): "the tuner times the float16 conversions",
    ("gemm", "fused.kernels"): "the NumPy back end's loop product and transposes are kernels",
    ("gemm", "fused.walks"): "the NumPy back end's transposes run on the walks' threads",
    ("fused.half", "fused.walks"): "the conversions run on the walks' threads",
    ("plan", "fused.walks"): "a plan's thread counts are capped by the walks' threads",
}


def _layers() -> dict[str, int]:
    """Module -> layer index (0 = top) from the block under "## Layers" in docs/design.md: one
    layer per line that starts with module names, in order."""
    text = (ROOT / "docs" / "design.md").read_text()
    block = text.split("## Layers", 1)[1]
    layers: dict[str, int] = {}
    index = 0
    started = False
    for line in block.splitlines():
        if not line.startswith("    "):
            if started:
                break
            continue
        started = True
        lead = []
        for word in line.split():
            if not word.endswith(".py"):
                break
            lead.append(word[:-3].replace("/", "."))
        if lead:
            layers.update(dict.fromkeys(lead, index))
            index += 1
    return layers


def _module(path: Path) -> str:
    rel = path.relative_to(SRC).with_suffix("")
    parts = [p for p in rel.parts if p != "__init__"]
    return ".".join(parts)


def _imports(path: Path) -> list[tuple[str, int, bool]]:
    """(imported lstmgrad module, line, at module level) of one file, resolved to modules."""
    tree = ast.parse(path.read_text())
    here = _module(path).split(".")
    package = here[:-1] if path.name != "__init__.py" else here
    top = {id(n) for n in tree.body}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package[: len(package) - (node.level - 1)]
            target = ".".join(base + ([node.module] if node.module else []))
            for alias in node.names:
                sub = f"{target}.{alias.name}" if target else alias.name
                name = sub if (SRC / Path(*sub.split("."))).with_suffix(".py").exists() or (
                    SRC / Path(*sub.split("."))).is_dir() else target  # fmt: skip
                found.append((name, node.lineno, id(node) in top))
    return found


def _is_torch_import(node: ast.AST) -> bool:
    if isinstance(node, ast.Import):
        return any(a.name.split(".")[0] == "torch" for a in node.names)
    return isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "torch"


LAYERS = _layers()
FILES = sorted(p for p in SRC.rglob("*.py") if p.name not in ("__init__.py", "__main__.py"))


def _layer(module: str) -> int | None:
    return LAYERS.get(module, LAYERS.get(module.split(".")[0] if "." in module else module))


def test_every_module_has_its_layer_in_design_md():
    missing = [_module(p) for p in FILES if _layer(_module(p)) is None]
    assert not missing, f"modules missing from docs/design.md's layers: {missing}"


@pytest.mark.parametrize("path", FILES, ids=lambda p: _module(p))
def test_imports_go_down(path: Path) -> None:
    me = _module(path)
    up = []
    for target, line, _ in _imports(path):
        if target in ("", "lstmgrad") or _layer(target) is None or target == me:
            continue
        if _layer(target) < _layer(me) and (me, target) not in KNOWN_UP:
            up.append(f"{path.relative_to(ROOT)}:{line} imports {target} (a layer above)")
    assert not up, "\n".join(up)


def test_known_upward_arrows_still_exist():
    seen = {(_module(p), t) for p in FILES for t, _, _ in _imports(p)}
    gone = [k for k in KNOWN_UP if k not in seen]
    assert not gone, f"take these off KNOWN_UP, they no longer exist: {gone}"


def test_reference_and_fused_never_import_each_other():
    for path in FILES:
        me = _module(path)
        for target, line, _ in _imports(path):
            for a, b in (("reference", "fused"), ("fused", "reference")):
                assert not (me.startswith(a) and target.startswith(b)), f"{me}:{line} -> {target}"


def test_nothing_below_torch_ops_imports_torch_at_module_level():
    floor = LAYERS["torch_grad"]
    for path in FILES:
        me = _module(path)
        if _layer(me) is None or _layer(me) <= floor:
            continue
        tree = ast.parse(path.read_text())
        bad = [n.lineno for n in tree.body if _is_torch_import(n)]
        assert not bad, f"{me} imports torch at module level (lines {bad})"
