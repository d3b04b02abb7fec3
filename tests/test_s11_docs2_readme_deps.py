"""The README's Dependencies section names every package pyproject.toml installs, each
extra's under that extra (typing_extensions, a runtime dependency, was missing)."""

from __future__ import annotations

import re
import tomllib

from tests.doc_pages import ROOT


def name(requirement: str) -> str:
    """A requirement's package name, without extras or version: ``mkdocstrings[python]>=1``
    is ``mkdocstrings``."""
    match = re.match(r"[A-Za-z0-9_.-]+", requirement)
    assert match, requirement
    return match.group(0)


def section() -> str:
    text = (ROOT / "README.md").read_text()
    return text.split("## Dependencies", 1)[1].split("\n## ", 1)[0]


def test_every_runtime_dependency_is_named() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    runtime = section().split("| extra |", 1)[0]
    assert [name(r) for r in project["dependencies"] if name(r) not in runtime] == []


def test_every_extras_libraries_are_in_a_row_that_names_it() -> None:
    """A library in two extras may sit in one row that names both (`plot` (in `dev`))."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    rows = [line for line in section().splitlines() if line.startswith("| `")]
    assert rows
    missing = {extra: [name(r) for r in requirements
                       if not any(f"`{extra}`" in row and name(r) in row for row in rows)]
               for extra, requirements in extras.items()}
    assert {extra: names for extra, names in missing.items() if names} == {}
