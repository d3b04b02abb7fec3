"""The API reference's index names every module its pages document."""

from __future__ import annotations

import re

from tests.doc_pages import ROOT

API = ROOT / "docs" / "api"


def documented(page: str) -> list[str]:
    """The modules an API page renders (its ``::: module`` lines)."""
    return re.findall(r"^::: ([\w.]+)", (API / page).read_text(), flags=re.MULTILINE)


def index_rows() -> dict[str, str]:
    """Each page the index's table links to, and what its row says the page covers."""
    rows = re.findall(r"^\| \[[^]]+\]\(([\w-]+\.md)\) \| (.+) \|$",
                      (API / "index.md").read_text(), flags=re.MULTILINE)
    return dict(rows)


def missing(modules: list[str], row: str) -> list[str]:
    """The `modules` an index row does not name (by their last part)."""
    named = set(re.findall(r"\w+", row))
    return [module for module in modules if module.split(".")[-1] not in named]


def test_every_api_page_is_in_the_index_with_every_module() -> None:
    rows = index_rows()
    pages = sorted(p.name for p in API.glob("*.md") if p.name != "index.md")
    assert sorted(rows) == pages
    assert {page: missing(documented(page), row) for page, row in rows.items()} == {
        page: [] for page in pages}


def test_a_module_left_out_of_a_row_is_found() -> None:
    """The check is not vacuous: a row without one of its page's modules fails it."""
    modules = ["asyncsync.engine.worker", "asyncsync.engine.cohort", "asyncsync.clock"]
    assert missing(modules, "`asyncsync.engine`: worker, core; `asyncsync.clock`") == [
        "asyncsync.engine.cohort"]
