"""Every relative link in the README, the changelog and the docs leads somewhere.

A link's file must exist (relative to the page that holds it), and a `#anchor` must name a
heading of its target page as GitHub renders it. Links inside fenced code blocks and links to
other sites are not checked.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted(
    [
        ROOT / "README.md",
        ROOT / "CHANGELOG.md",
        ROOT / "charts" / "specdeploy" / "README.md",
        *(ROOT / "docs").glob("*.md"),
        *(ROOT / "bench" / "results").glob("*.md"),
    ]
)

#: `[text](target)` and `![alt](target)`, with an optional "title" after the target.
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"(`+)[^`].*?\1")


def prose_lines(text: str) -> list[str]:
    """The page's lines outside fenced code blocks (code blocks become empty lines)."""
    lines: list[str] = []
    fenced = False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            lines.append("")
            continue
        lines.append("" if fenced else line)
    return lines


def heading_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: its text, lowercased, punctuation dropped, spaces to -."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every anchor of a page, duplicates numbered as GitHub numbers them (-1, -2, ...)."""
    seen: dict[str, int] = {}
    found: set[str] = set()
    for line in prose_lines(page.read_text(encoding="utf-8")):
        match = HEADING.match(line)
        if not match:
            continue
        slug = heading_slug(match.group(2))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def relative_links(page: Path) -> list[tuple[int, str]]:
    """(line number, target) of every relative link on a page."""
    links: list[tuple[int, str]] = []
    for number, line in enumerate(prose_lines(page.read_text(encoding="utf-8")), start=1):
        for match in LINK.finditer(CODE_SPAN.sub("", line)):
            target = match.group(1)
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            links.append((number, target))
    return links


def broken_links(page: Path, root: Path = ROOT) -> list[str]:
    """A sentence per link of the page whose file or heading does not exist."""
    broken: list[str] = []
    for number, target in relative_links(page):
        path_part, _, anchor = target.partition("#")
        destination = (page.parent / path_part).resolve() if path_part else page
        where = f"{page.relative_to(root)}:{number}: {target}"
        if not destination.exists():
            broken.append(f"{where}: no file {path_part}")
        elif anchor and destination.suffix == ".md" and anchor not in anchors(destination):
            broken.append(f"{where}: no heading #{anchor} in {path_part or page.name}")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    assert broken_links(page) == []


def test_the_pages_have_links_to_check() -> None:
    """The check reads the pages it should: the README links into docs/, docs/ into each other."""
    readme_targets = {target for _, target in relative_links(ROOT / "README.md")}
    assert "docs/README.md" in readme_targets
    assert len(PAGES) > 10


def test_a_missing_file_and_a_missing_heading_are_found(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Title\n\n## A `code` heading (with: punctuation)\n")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](other.md#a-code-heading-with-punctuation) [ok](#here)\n"
        "[gone](missing.md) [wrong](other.md#nowhere) [site](https://example.com/x)\n"
        "`[in a code span](nothing.md)`\n"
        "```\n[in code](nothing.md)\n```\n"
        "## Here\n"
    )
    assert broken_links(page, root=tmp_path) == [
        "page.md:2: missing.md: no file missing.md",
        "page.md:2: other.md#nowhere: no heading #nowhere in other.md",
    ]


@pytest.mark.parametrize(
    ("heading", "slug"),
    [
        (
            "The e2e suite and its fixtures (`e2e/conftest.py`)",
            "the-e2e-suite-and-its-fixtures-e2econftestpy",
        ),
        ("Benchmark (`make bench-engine`)", "benchmark-make-bench-engine"),
        ("Where observe reads from: watch-fed caches", "where-observe-reads-from-watch-fed-caches"),
        ("2026-11-26 — `64885f4`..`24c30d9`", "2026-11-26--64885f424c30d9"),
    ],
)
def test_heading_slugs_follow_github(heading: str, slug: str) -> None:
    assert heading_slug(heading) == slug
