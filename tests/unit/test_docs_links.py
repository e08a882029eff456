"""Every relative link and #anchor in README.md, CONTRIBUTING.md, docs/*.md and
benchmarks/README.md points at something that exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *DOCS, ROOT / "benchmarks" / "README.md"]
FENCE = re.compile(r"^```.*?^```", re.M | re.S)
LINK = re.compile(r"\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6} +(.+?) *$", re.M)


def prose(path: Path) -> str:
    """The page without its fenced code blocks (a `# comment` there is no heading)."""
    return FENCE.sub("", path.read_text())


def anchors(path: Path) -> set[str]:
    """GitHub's heading ids: lowercase, punctuation dropped except - and _, spaces to -."""
    found: set[str] = set()
    for heading in HEADING.findall(prose(path)):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        n = 0
        while (unique := slug if n == 0 else f"{slug}-{n}") in found:
            n += 1  # a repeated heading gets -1, -2, ...
        found.add(unique)
    return found


def test_the_pages_are_found() -> None:
    assert ROOT / "docs" / "cli.md" in DOCS
    assert all(page.exists() for page in PAGES)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_anchor_resolves(page: Path) -> None:
    broken = []
    for target in LINK.findall(prose(page)):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...: not checked here
            continue
        file, _, anchor = target.partition("#")
        linked = (page.parent / file).resolve() if file else page
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target}: no heading with that anchor")
    assert broken == [], f"{page.name}: " + "; ".join(broken)


def test_the_readme_links_every_docs_page() -> None:
    readme = prose(ROOT / "README.md")
    assert [p.name for p in DOCS if f"](docs/{p.name})" not in readme] == []
