"""Every page under docs/ is reference: what is true now, how to reproduce it and the goal. The
dated history of measurements lives in bench/HISTORY.md, which performance.md and operations.md
link."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted((ROOT / "docs").glob("*.md"))
MEASURED = [ROOT / "docs" / "performance.md", ROOT / "docs" / "operations.md"]  # figures with a history
HISTORY = ROOT / "bench" / "HISTORY.md"

# The section bench/run_all.py writes between these markers names the run it was generated from
# (its date and commit): provenance of generated output, not a diary entry.
GENERATED = re.compile(r"<!-- bench:begin -->.*?<!-- bench:end -->", re.S)

DIARY = [
    re.compile(r"\b20\d\d-\d\d-\d\d\b"),                                      # an ISO date
    re.compile(r"\b(this|last|yesterday's|today's) (morning|evening|night|afternoon)\b", re.I),
    re.compile(r"\b(yesterday|tonight|today)\b", re.I),
    re.compile(r"\b(this|first|second|third|fourth|last|previous) session\b", re.I),
    re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b"),   # a commit hash
]


def reference_text(page: Path) -> str:
    return GENERATED.sub("", page.read_text())


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_reference_pages_hold_no_dated_lines(page):
    hits = [(n, line) for n, line in enumerate(reference_text(page).splitlines(), 1)
            if any(p.search(line) for p in DIARY)]
    assert hits == [], f"{page.name}: dated or diary lines belong in bench/HISTORY.md: {hits}"


@pytest.mark.parametrize("page", MEASURED, ids=lambda p: p.name)
def test_reference_pages_link_the_history(page):
    assert "../bench/HISTORY.md" in page.read_text()
    assert HISTORY.is_file()


def slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_anchor_other_docs_link_to_is_a_heading():
    sources = [*(ROOT / "docs").glob("*.md"), ROOT / "README.md", ROOT / "CONTRIBUTING.md", HISTORY]
    anchors = {p.name: {slug(h) for h in re.findall(r"^#+ (.+)$", p.read_text(), re.M)} for p in PAGES}
    missing = []
    for src in sources:
        for page, anchor in re.findall(r"\b(performance\.md|operations\.md)#([\w-]+)", src.read_text()):
            if anchor not in anchors[page]:
                missing.append(f"{src.name}: {page}#{anchor}")
    assert missing == []
