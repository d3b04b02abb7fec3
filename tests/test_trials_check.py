"""`asyncsync check` says what `run` would start: its repeats, and whether the baseline is
among the runs it would run."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_cli import run_main
from tests.test_parallel import recipe


def last_line(out: str) -> str:
    return " ".join(out.strip().splitlines()[-1].split())


def test_check_counts_the_repeats(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """The recipe repeats every run twice; --repeats 3 makes it three times."""
    path = recipe(tmp_path)
    code, out = run_main(capsys, "check", path)
    assert code == 0, out
    assert last_line(out) == f"{path}: ok (2 runs x 2 repeats = 4, baseline bsp; data found)"
    code, out = run_main(capsys, "check", path, "--repeats", "3", "--only", "bsp")
    assert code == 0, out
    assert last_line(out) == f"{path}: ok (1 run x 3 repeats = 3, baseline bsp; data found)"


def test_check_says_when_only_leaves_the_baseline_out(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """As `run --only asp` prints "no baseline: bsp did not run", and no speedups."""
    path = recipe(tmp_path)
    code, out = run_main(capsys, "check", path, "--only", "asp", "--repeats", "1")
    assert code == 0, out
    assert last_line(out) == (f"{path}: ok (1 run, no baseline: bsp is not among the runs, "
                              "so no speedups; data found)")
