"""A run folder simulated again (a Slurm task requeued after preemption, `asyncsync
simulate` run twice) starts from its recipe.json alone: the earlier attempt's logs are not
appended to, so the summary and plots count one run."""

from __future__ import annotations

import json
from pathlib import Path

from asyncsync.runlog.reading import read_jsonl
from asyncsync.runlog.schema import KEY, Kind
from asyncsync.study.executors import run_folder
from asyncsync.study.recipe import load_recipe
from asyncsync.study.run_one import prepare_folder
from tests.test_parallel import recipe


def logs(run_dir: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(run_dir.glob("*.jsonl"))}


def test_a_folder_simulated_again_holds_one_run(tmp_path: Path) -> None:
    study = load_recipe(recipe(tmp_path, time_s=2), only=["asp"])
    run_dir = tmp_path / "asp"
    prepare_folder(study.runs[0], study, run_dir, 0)
    assert run_folder(str(run_dir))
    first, summary = logs(run_dir), json.loads((run_dir / "summary.json").read_text())
    # the earlier attempt was cut: its workers' logs have no final record
    for name in ("worker-0.jsonl", "worker-1.jsonl", "worker-2.jsonl"):
        kept = [r for r in read_jsonl(run_dir / name) if r.get(KEY) != Kind.FINAL]
        (run_dir / name).write_text("".join(json.dumps(r) + "\n" for r in kept))
    (run_dir / "summary.json").unlink()
    assert run_folder(str(run_dir))
    again = json.loads((run_dir / "summary.json").read_text())
    assert again["samples_per_s"] == summary["samples_per_s"]
    assert again["versions"] == summary["versions"]
    assert logs(run_dir) == first
