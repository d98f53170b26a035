"""The Python blocks of README.md and docs/check.md run as written, in order.

Each ```python block runs in a fresh interpreter, except that a block whose first line is
``# continues the previous block`` runs in the same program as the block before it.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ("README.md", "docs/check.md")  # the pages whose blocks are whole programs
CONTINUES = "# continues the previous block"
FENCE = re.compile(r"^```python\n(.*?)^```\s*$", re.S | re.M)


def readme_programs(text: str) -> list[str]:
    """A page's Python blocks joined into programs (a continuing block joins the one
    before); every ```python fence must be closed."""
    blocks = FENCE.findall(text)
    if text.count("```python") != len(blocks):
        raise ValueError("a ```python block is not closed by ```")
    programs: list[str] = []
    for block in blocks:
        if block.lstrip().startswith(CONTINUES):
            if not programs:
                raise ValueError(f"the first Python block says {CONTINUES!r}")
            programs[-1] += "\n" + block
        else:
            programs.append(block)
    return programs


PROGRAMS = [
    (doc, n, code)
    for doc in DOCS
    for n, code in enumerate(readme_programs((ROOT / doc).read_text(encoding="utf-8")))
]


def test_the_extraction_joins_continuing_blocks_and_rejects_bad_fences():
    text = "```python\na = 1\n```\n\n```python\n# continues the previous block\nb = a\n```\n"
    text += "```python\nc = 2\n```\n"
    joined = "a = 1\n\n# continues the previous block\nb = a\n"
    assert readme_programs(text) == [joined, "c = 2\n"]
    with pytest.raises(ValueError, match="not closed"):
        readme_programs("```python\na = 1\n")
    with pytest.raises(ValueError, match="first Python block"):
        readme_programs(f"```python\n{CONTINUES}\n```\n")
    assert sum(doc == "README.md" for doc, _, _ in PROGRAMS) >= 2  # core API, PyTorch


@pytest.mark.parametrize("doc, n, code", PROGRAMS, ids=[f"{d}:{n}" for d, n, _ in PROGRAMS])
def test_readme_block_runs(doc, n, code, tmp_path):
    if re.search(r"^\s*(import torch|from lstmgrad\.nn|from torch)", code, re.M):
        pytest.importorskip("torch")
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, f"{doc} program {n} failed:\n{code}\n{proc.stderr}"


# Every relative link and #anchor of every page resolves: tests/test_docs.py.


def test_readme_reads_well_without_the_repository():
    # a package index renders README.md without the repository's files: no image, and every
    # relative link shows its path as its text, so a reader still knows where to look
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "![" not in text
    links = re.findall(r"\[([^\]]*)\]\(([^)\s]+)\)", text)
    assert links and all(t == u.split("#")[0] for t, u in links if "://" not in u)
