"""The documents a user reads: every relative link and #anchor resolves, the performance guide
stays a guide, and nothing in the repository narrates how the work was done (history lives in
git)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SKIP_DIRS = {"build", "dist", "node_modules", "__pycache__", "results", "out"}


def tracked(pattern: str) -> list[Path]:
    """The repository's files matching ``pattern``, without hidden folders (.venv, .git),
    build outputs and results written by the benchmarks and examples."""
    return sorted(
        p
        for p in ROOT.rglob(pattern)
        if not any(
            part.startswith(".") or part in SKIP_DIRS or part.endswith(".egg-info")
            for part in p.relative_to(ROOT).parts[:-1]
        )
    )


PAGES = tracked("*.md")
SOURCES = [p for p in tracked("*.py") if p.name != Path(__file__).name]

# Phrases of a lab notebook: runs counted by number, targets set elsewhere, sessions and rounds
# of work. A page or docstring says what the project is and does; how it got there is git's.
NARRATION = re.compile(
    r"\b(?:(?:third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|thirteenth"
    r"|fourteenth|fifteenth|sixteenth|seventeenth|eighteenth|nineteenth|twentieth"
    r"|\d+(?:st|nd|rd|th))\s+run"
    r"|the\s+targets|aimed\s+at|(?:this|that|earlier|previous|last|next|later|other)\s+sessions?"
    r"|rounds?\s+of\s+work|(?:earlier|previous)\s+rounds?|(?:earlier|previous)\s+runs?"
    r"|the\s+(?:main|master)\s+branch's)\b",
    re.I,
)


def test_the_pages_and_sources_were_found():
    names = {p.relative_to(ROOT).as_posix() for p in PAGES}
    assert {"README.md", "docs/performance.md", "benchmarks/README.md"} <= names
    assert any(p.name == "cli.py" for p in SOURCES)


def test_nothing_narrates_how_the_work_was_done():
    found = [
        f"{path.relative_to(ROOT)}:{n}: {m.group(0)!r}"
        for path in [*PAGES, *SOURCES]
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        for m in NARRATION.finditer(line)
    ]
    assert not found, "history belongs in git, not in the repository:\n" + "\n".join(found)


def test_the_narration_pattern_catches_what_it_should():
    for text in ["the thirteenth run", "In the 12th run", "what the targets need", "this session",
                 "an earlier session", "a round of work", "earlier rounds", "aimed at"]:  # fmt: skip
        assert NARRATION.search(text), text
    for text in ["its first run", "a second run returns 161002", "Test session settings",
                 "rounds of those passes", "target dtype"]:  # fmt: skip
        assert not NARRATION.search(text), text


def test_the_performance_guide_is_a_guide():
    lines = (ROOT / "docs/performance.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 300, f"docs/performance.md has {len(lines)} lines"


# --------------------------------------------------------------------------------------------
# links


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: inline markup dropped, lower case, punctuation removed,
    spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link shows its text
    text = re.sub(r"[`*_]", "", text) if "`" in text or "*" in text else text
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """The anchors of a page's headings (outside code blocks); repeats get -1, -2, ..."""
    seen: dict[str, int] = {}
    out = set()
    for line in prose_lines(page.read_text(encoding="utf-8")):
        m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def prose_lines(text: str) -> list[str]:
    """A page's lines outside fenced code blocks (links and headings there are code)."""
    out, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            out.append(line)
    return out


def links(page: Path) -> list[str]:
    text = "\n".join(prose_lines(page.read_text(encoding="utf-8")))
    text = re.sub(r"`[^`\n]*`", "", text)  # inline code is not a link
    return re.findall(r"\]\(([^)\s]+)\)", text)


def test_slugs_follow_github():
    assert slug("Threads and processes") == "threads-and-processes"
    assert slug("AMD EPYC (Zen 4), 2 cores") == "amd-epyc-zen-4-2-cores"
    assert slug("bfloat16, autocast (`lstmgrad.nn.LSTM`)") == "bfloat16-autocast-lstmgradnnlstm"
    assert slug("Adopt, save, deploy") == "adopt-save-deploy"


@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(ROOT).as_posix() for p in PAGES])
def test_relative_links_and_anchors_resolve(page):
    broken = []
    for link in links(page):
        if "://" in link or link.startswith("mailto:"):
            continue  # the tests never reach the network
        path, _, anchor = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        if not target.exists():
            broken.append(f"{link}: no such file")
        elif anchor and target.suffix == ".md" and anchor not in anchors(target):
            broken.append(f"{link}: no heading with that anchor")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_pages_named_in_the_sources_resolve():
    # comments and docstrings send readers to "docs/<page>.md#<anchor>" for the figures
    broken = []
    for src in SOURCES:
        for n, line in enumerate(src.read_text(encoding="utf-8").splitlines(), 1):
            for path, anchor in re.findall(r"\b(docs/[\w./-]+\.md)(?:#([\w-]+))?", line):
                target = ROOT / path
                if not target.exists() or (anchor and anchor not in anchors(target)):
                    broken.append(f"{src.relative_to(ROOT)}:{n}: {path}#{anchor}")
    assert not broken, "\n".join(broken)


def test_every_image_in_docs_is_shown_somewhere():
    # an image nobody shows goes stale unseen
    shown = {(page.parent / link).resolve() for page in PAGES for link in links(page)}
    orphans = [p.name for p in sorted((ROOT / "docs").glob("*.png")) if p.resolve() not in shown]
    assert not orphans, f"docs/ images no page shows: {orphans}"
