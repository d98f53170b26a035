"""The package's layers as docs/design.md draws them: every import inside src/lstmgrad (at module
level or inside a function) goes to the same layer or one below, but for the arrows listed in
KNOWN_UP with their reason; no import cycle; reference/ and fused/ never import each other; the
engines import nothing from planning/; nothing below pytorch/ imports torch at module level
(the core runs without it)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "lstmgrad"

# upward arrows allowed, each with its reason: none today (a new one fails the test)
KNOWN_UP: dict[tuple[str, str], str] = {}


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
    floor = LAYERS["pytorch.torch_grad"]
    for path in FILES:
        me = _module(path)
        if _layer(me) is None or _layer(me) <= floor:
            continue
        tree = ast.parse(path.read_text())
        bad = [n.lineno for n in tree.body if _is_torch_import(n)]
        assert not bad, f"{me} imports torch at module level (lines {bad})"


def test_no_import_cycles():
    graph = {_module(p): {t for t, _, _ in _imports(p) if t != _module(p)} for p in FILES}
    cycles = []

    def visit(node: str, path: list[str], on_path: set[str], done: set[str]) -> None:
        if node in on_path:
            cycles.append(path[path.index(node) :] + [node])
            return
        if node in done:
            return
        on_path.add(node)
        for nxt in sorted(graph.get(node, ())):
            visit(nxt, path + [nxt], on_path, done)
        on_path.discard(node)
        done.add(node)

    done: set[str] = set()
    for start in sorted(graph):
        visit(start, [start], set(), done)
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_engines_import_nothing_from_planning_or_above():
    for path in FILES:
        me = _module(path)
        if not me.startswith(("fused", "reference")):
            continue
        for target, line, _ in _imports(path):
            assert not target.startswith(("planning", "ops", "pytorch", "tools")), (
                f"{me}:{line} imports {target}"
            )


def test_only_the_api_asks_for_a_plan():
    callers = []
    for path in FILES:
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                f = node.func
                name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
                if name in ("plan_for", "plan_call"):
                    callers.append(_module(path))
    assert set(callers) == {"ops.api"}, callers


def test_old_module_names_import_as_the_same_modules():
    import importlib

    import lstmgrad

    for old, package in lstmgrad.MOVED.items():
        if not (SRC / package / f"{old}.py").exists():
            continue
        legacy = importlib.import_module(f"lstmgrad.{old}")
        assert legacy is importlib.import_module(f"lstmgrad.{package}.{old}"), old
