"""Two supervisors never run one study folder at once: a second ``--resume`` of a study
whose supervisor still runs is refused, and the runs in progress are left alone (it
cleared their folders and ran them a second time beside the first)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from pathlib import Path

import pytest

from asyncsync.schema import ConfigError
from asyncsync.study.recipe import load_recipe
from asyncsync.study.runner import run_recipe
from tests.test_s9_study_interruptions import RECIPE


def test_a_study_whose_supervisor_runs_cannot_be_resumed_beside_it(tmp_path: Path) -> None:
    path = tmp_path / "long.toml"
    path.write_text(RECIPE)
    recipe = load_recipe(path)
    logs = tmp_path / "logs"

    async def both() -> Path:
        first = asyncio.ensure_future(run_recipe(recipe, logs, live=False))
        try:
            while not any(p.stat().st_size for p in logs.glob("long/*/asp/events.jsonl")):
                assert not first.done()
                await asyncio.sleep(0.05)
            (events,) = logs.glob("long/*/asp/events.jsonl")
            study = events.parent.parent
            with pytest.raises(ConfigError) as refused:
                await run_recipe(recipe, logs, live=False, resume=study)
            assert str(refused.value).startswith(
                f"--resume {study}: another asyncsync run (pid {os.getpid()}) is running "
                "this study"), refused.value
            assert events.exists() and not first.done()  # its run left alone
            return events.parent
        finally:
            first.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await first

    run_dir = asyncio.run(both())
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["interrupted"] is True  # by the first supervisor's cancellation
