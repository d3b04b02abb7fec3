"""docs/index.md's "Where to go" table leads to every page of the site's navigation.

A family's pages (protocols/, api/) are reached through their own index page.
"""

from __future__ import annotations

import re

from tests.doc_pages import ROOT


def nav_pages() -> set[str]:
    """The pages mkdocs.yml's nav names, a section's pages counted as its index page."""
    text = (ROOT / "mkdocs.yml").read_text(encoding="utf-8").split("\nnav:\n", 1)[1]
    pages = set(re.findall(r"^\s*-\s(?:[^:\n]+:\s)?([\w/-]+\.md)\s*$", text, flags=re.MULTILINE))
    return {page.split("/", 1)[0] + "/index.md" if "/" in page else page for page in pages}


def where_to_go_links() -> set[str]:
    text = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
    table = text.split("## Where to go", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"\]\(([\w/-]+\.md)(?:#[\w-]+)?\)", table))


def test_the_nav_is_read() -> None:
    pages = nav_pages()
    assert {"getting-started.md", "protocols/index.md", "api/index.md", "development.md"} <= pages
    assert "api/sdk.md" not in pages


def test_every_page_is_in_the_where_to_go_table() -> None:
    missing = sorted(nav_pages() - {"index.md"} - where_to_go_links())
    assert missing == [], f"docs/index.md's 'Where to go' table lacks {missing}"
