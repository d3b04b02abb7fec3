"""``--jobs`` is how many local child processes run a study's virtual runs; with
``--executor slurm`` Slurm runs them, and an explicit ``--jobs`` was silently ignored."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from asyncsync.cli import main
from tests.test_cli import run_main

RECIPE = str(Path(__file__).parent.parent / "recipes" / "quickstart.toml")


def test_jobs_with_the_slurm_executor_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run_main(capsys, "run", RECIPE, "--executor", "slurm", "--jobs", "4")
    assert code == 2, out
    flat = " ".join(out.split())
    assert "--jobs is for --executor local; with slurm" in flat
    assert "--slurm-array-parallelism" in flat


@pytest.mark.parametrize(("extra", "slurm", "jobs"), [
    ((), False, len(os.sched_getaffinity(0))),  # the default: the usable cores
    (("--jobs", "3"), False, 3),
    (("--executor", "slurm"), True, len(os.sched_getaffinity(0))),  # no --jobs: accepted
])
def test_jobs_reaches_the_runner(monkeypatch: pytest.MonkeyPatch, extra: tuple[str, ...],
                                 slurm: bool, jobs: int) -> None:
    import asyncsync.study.runner as runner

    seen: dict[str, Any] = {}

    def fake_run(*args: Any, **options: Any) -> list[dict[str, Any]]:
        seen.update(options)
        return []

    monkeypatch.setattr(runner, "run_recipe_file", fake_run)
    monkeypatch.setattr("asyncsync.study.children.children_needed", lambda *a: 0)
    assert main(["run", RECIPE, *extra]) == 0
    assert seen["jobs"] == jobs
    assert (seen["slurm"] is not None) == slurm
