"""Every relative link of README.md and docs/*.md leads somewhere: to a file of the repository and,
with a `#fragment`, to a heading of that page (as GitHub makes its anchors)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchors(page: Path) -> set[str]:
    """GitHub's anchor of each heading: lower case, punctuation but `-` and `_` dropped, spaces to `-`."""
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S)
    headings = re.findall(r"^#{1,6} (.+)$", text, flags=re.M)
    return {re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-") for heading in headings}


def links(page: Path) -> list[str]:
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S)
    return [target for target in LINK.findall(text) if not re.match(r"[a-z]+:", target)]


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.relative_to(ROOT).as_posix())
def test_every_relative_link_names_a_file_and_a_heading_that_exist(page: Path) -> None:
    for target in links(page):
        path, _, fragment = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        assert linked.exists(), f"{target}: no such file"
        if fragment:
            assert fragment in anchors(linked), f"{target}: no such heading"


def test_the_docs_index_lists_every_page() -> None:
    index = (ROOT / "docs" / "README.md").read_text()
    listed = {target for target in LINK.findall(index) if not target.startswith("..")}
    assert listed == {page.name for page in PAGES if page.parent.name == "docs" and page.name != "README.md"}
