"""What a user of a research toolkit expects beside the code: the license pyproject
declares, a citation file that says the same, and a quickstart whose stated run time is
the measured one."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent


def project() -> dict[str, object]:
    table: dict[str, object] = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return table


def test_the_license_file_is_the_one_pyproject_declares() -> None:
    assert project()["license"] == "Apache-2.0"
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text


def test_the_citation_file_names_this_version_and_license() -> None:
    yaml = pytest.importorskip("yaml", reason="PyYAML reads CITATION.cff")
    citation = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    assert citation["cff-version"] == "1.2.0"
    assert {"message", "title", "authors"} <= citation.keys() and citation["authors"]
    assert citation["version"] == project()["version"]
    assert citation["license"] == project()["license"]


def test_the_quickstart_states_one_run_time() -> None:
    """The recipe's comment gives its time once, as a measured figure with its command."""
    comment = "\n".join(line for line in (ROOT / "recipes" / "quickstart.toml").read_text()
                        .splitlines() if line.startswith("#"))
    assert not re.search(r"about a minute|\d+ min", comment)
    assert len(re.findall(r"`asyncsync run recipes/quickstart.toml` took \d+ s", comment)) == 1
