"""results/README.md cannot go stale: it indexes every file in results/, names no file that is
gone, and each of its rows points at a page that cites those files."""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "results"
INDEX = RESULTS / "README.md"
# What results/ holds besides the files the rows name: the index, and what git leaves out
# (the GPU scripts' runs, plots drawn beside their JSON).
UNINDEXED = ("README.md", "runs", "*.png")
# `results/NAME` in a page, up to the first character a file name here never has.
CITED = re.compile(r"(?<!--out )(?<!--json )results/([\w.*?{},\[\]-]+)")
_WILDCARDS = "*?[{"


@dataclass(frozen=True)
class Row:
    page: Path
    anchor: str
    patterns: tuple[str, ...]
    line: str


def rows() -> list[Row]:
    found = []
    for line in INDEX.read_text().splitlines():
        link = re.match(r"\| \[[^]]+\]\(\.\./docs/([\w.-]+\.md)(?:#([\w-]+))?\)", line)
        if link is None:
            continue
        files = line.split(" | ")[1]
        names = [n for n in re.findall(r"`([^`]+)`", files) if n.endswith((".gz", ".md"))]
        found.append(Row(ROOT / "docs" / link[1], link[2] or "", tuple(names), line))
    return found


def expand(pattern: str) -> list[str]:
    """`{a,b}` expanded, as a shell does; what is left is an fnmatch pattern."""
    brace = re.search(r"\{([^{}]*)\}", pattern)
    if brace is None:
        return [pattern]
    head, tail = pattern[: brace.start()], pattern[brace.end() :]
    return [name for part in brace[1].split(",") for name in expand(head + part + tail)]


def matches(pattern: str, name: str) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in expand(pattern))


def results_files() -> list[str]:
    return sorted(
        p.name
        for p in RESULTS.iterdir()
        if not any(fnmatch.fnmatchcase(p.name, skip) for skip in UNINDEXED)
    )


def slug(heading: str) -> str:
    """A heading's anchor, as GitHub makes it."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_the_index_has_rows() -> None:
    assert len(rows()) >= 10


def test_every_results_file_is_named_by_a_row() -> None:
    patterns = [p for row in rows() for p in row.patterns]
    unindexed = [f for f in results_files() if not any(matches(p, f) for p in patterns)]
    assert unindexed == [], f"add a row to results/README.md, or remove: {unindexed}"


def test_every_name_in_a_row_is_a_file() -> None:
    files = results_files()
    for row in rows():
        for pattern in row.patterns:
            for name in expand(pattern):
                assert any(fnmatch.fnmatchcase(f, name) for f in files), (name, row.line)


def test_each_row_points_at_a_page_that_cites_its_files() -> None:
    for row in rows():
        assert row.page.is_file(), row.line
        text = row.page.read_text()
        if row.anchor:
            headings = re.findall(r"^#+ (.+)$", text, re.M)
            assert row.anchor in {slug(h) for h in headings}, (row.anchor, row.line)
        for pattern in row.patterns:
            # What the page must say of the name: all of it before the first wildcard (pages
            # shorten a run of files, "`...-run12.json.gz` to `-run17.json.gz`").
            literal = re.split(r"[*?\[{]", pattern)[0]
            assert literal in text, (literal, row.page.name)


def test_every_results_file_a_page_cites_is_there_and_indexed_for_that_page() -> None:
    files = results_files()
    by_page: dict[Path, list[str]] = {}
    for row in rows():
        by_page.setdefault(row.page, []).extend(row.patterns)
    pages = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]
    for page in pages:
        for cited in CITED.findall(page.read_text()):
            if "]" in cited and "[" not in cited:
                cited = cited.split("]")[0]  # the end of a link's text
            cited = cited.rstrip(".,")
            if cited.startswith("runs") or cited in ("", "README.md"):
                continue
            named = [f for f in files if matches(cited, f)]
            assert named, f"{page.name} cites results/{cited}, which is not there"
            if page.parent.name != "docs":
                continue
            patterns = by_page.get(page, [])
            for name in named:
                assert any(matches(p, name) for p in patterns), (
                    f"{page.name} cites results/{name}: give it a row for that page"
                )
