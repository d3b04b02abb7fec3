"""The quickstart's virtual-clock figures that the front pages quote are what the command
prints: the home page's table row for row, and the README's and Getting started's
times to 0.7 and speedup. A change that moves the virtual results (wire bytes, the cost
model, a protocol) fails here until the pages show the new figures."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.doc_pages import ROOT, named_block

RUNS = ("bsp", "asp")


def rows(text: str) -> dict[str, list[str]]:
    """The table rows of `text` whose first cell names a quickstart run, as their cells."""
    cells = (line.split() for line in text.splitlines())
    return {row[0]: row for row in cells if row and row[0] in RUNS}


def flat(page: str) -> str:
    """A page's text with its line breaks and runs of spaces as single spaces."""
    return " ".join((ROOT / page).read_text().split())


@pytest.mark.slow
@pytest.mark.timeout(600)  # two virtual runs: 20 s of CPU, minutes on a loaded host
def test_the_pages_quote_the_virtual_quickstart_as_it_runs(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "asyncsync", "run", str(ROOT / "recipes" / "quickstart.toml"),
         "--clock", "virtual", "--plain", "--jobs", "1", "--logs", str(tmp_path)],
        cwd=tmp_path, env={**os.environ, "COLUMNS": "200", "PYTHONPATH": str(ROOT)},
        capture_output=True, text=True, timeout=540)
    assert done.returncode == 0, done.stdout + done.stderr
    printed = rows(done.stdout)
    assert sorted(printed) == sorted(RUNS), done.stdout
    assert rows(named_block("quickstart-virtual-table")) == printed
    header = next(line.split() for line in done.stdout.splitlines() if "speedup" in line)
    bsp, asp = (dict(zip(header, printed[run], strict=True)) for run in RUNS)
    target, speedup = "t@0.70", asp["speedup"]
    readme = f"bsp {bsp[target]} s to 0.7, asp {asp[target]} s: {speedup}"
    assert readme in flat("README.md")
    getting_started = f"bsp {bsp[target]} s to 0.7, asp {asp[target]} s, {speedup}"
    assert getting_started in flat("docs/getting-started.md")
