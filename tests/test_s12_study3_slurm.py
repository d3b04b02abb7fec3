"""The supervisor of a Slurm job array meets failures that are not its tasks': a tracker
that fails stops the tracking, not the watch (it stopped the supervisor, while the tasks ran
on and their results went uncollected), and a task that ended without a summary.json (out of
memory, a node failure) is written down as such in its folder, for ``report`` and
``--resume`` (it was said in the table only)."""

from __future__ import annotations

import json
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from asyncsync.study import runner
from tests.test_cli import run_main
from tests.test_s12_study3_jobs_tracker import RECIPE, FailsOnRepeat

FAILED = "tracking to flaky: could not log run small/{stamp}/bsp-r0: ConnectionError: the " \
         "tracking server went away"


def errors(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("error: ")]



def fake_slurm(monkeypatch: pytest.MonkeyPatch, submitted: Callable[..., list[Any]]) -> None:
    """The runner's Slurm executor without Slurm: `submitted` stands for the array's jobs,
    the log root counts as shared, and the supervisor's grace for late files is none."""
    monkeypatch.setattr(runner, "slurm_executor",
                        lambda *given: SimpleNamespace(cluster="slurm"))
    monkeypatch.setattr(runner, "submit_array", submitted)
    monkeypatch.setattr(runner, "shared_problem", lambda root: None)
    monkeypatch.setattr(runner, "SLURM_GRACE_S", 0.0)

def test_a_tracker_failure_leaves_the_supervisor_watching_the_array(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    """submitit's local executor (no srun on the PATH) runs the two tasks as processes."""
    pytest.importorskip("submitit")
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent))
    monkeypatch.setattr(runner, "refuse_missing", lambda *given: None)
    monkeypatch.setattr(runner, "parse_track", lambda spec: FailsOnRepeat(0))
    monkeypatch.setattr(runner, "SLURM_POLL_S", 0.05)
    (tmp_path / "small.toml").write_text(RECIPE)
    code, out = run_main(capsys, "run", str(tmp_path / "small.toml"), "--plain", "--logs",
                         str(tmp_path / "logs"), "--executor", "slurm", "--track", "flaky")
    (study,) = (tmp_path / "logs" / "small").iterdir()
    told = (f"{FAILED.format(stamp=study.name)}; the job array's runs go on, untracked from "
            f"here: once they are done, asyncsync report {study} --track SPEC sends them")
    flat = " ".join(out.split())
    assert code == 2 and "Traceback" not in out, out
    assert f"warning: {told}" in flat, out  # when it happened
    assert errors(out) == [f"error: {told}"], out  # and at the end, for the exit status
    for run in ("bsp-r0", "bsp-r1"):  # both ran to their end, and were collected
        summary = json.loads((study / run / "summary.json").read_text())
        assert "error" not in summary and summary["versions"] > 0, summary
    assert f"wrote {study / 'table.csv'}" in flat, out


class EndedJob:
    """A submitit job whose Slurm task ended (`state`) without writing anything."""

    def __init__(self, index: int, state: str, stderr: Path) -> None:
        self.job_id = f"77_{index}"
        self.state = state
        self.paths = SimpleNamespace(stderr=stderr)

    def done(self) -> bool:
        return True

    def cancel(self, check: bool = True) -> None:
        pass


@pytest.mark.parametrize("state", ["OUT_OF_MEMORY", "NODE_FAIL"])
def test_a_task_that_ended_without_a_summary_is_recorded_in_its_folder(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path, state: str) -> None:
    stderr = tmp_path / "task.err"

    def submitted(executor: Any, dirs: list[str], *rest: Any) -> list[EndedJob]:
        return [EndedJob(index, state, stderr) for index in range(len(dirs))]

    fake_slurm(monkeypatch, submitted)
    (tmp_path / "small.toml").write_text(RECIPE)
    code, out = run_main(capsys, "run", str(tmp_path / "small.toml"), "--plain", "--logs",
                         str(tmp_path / "logs"), "--executor", "slurm")
    assert code == 1, out  # the runs failed
    (study,) = (tmp_path / "logs" / "small").iterdir()
    why = (f"interrupted: its Slurm task ended ({state}) without a summary.json; see "
           f"{stderr}")
    for run in ("bsp-r0", "bsp-r1"):
        summary = json.loads((study / run / "summary.json").read_text())
        assert (summary["error"], summary["interrupted"]) == (why, True)
    code, out = run_main(capsys, "report", str(study))
    flat = " ".join(out.split())
    assert code == 2, out
    assert f"{study / 'bsp-r0'}: left out, it was {why}" in flat, out
    assert "no summary.json yet" not in flat, out


def test_a_device_the_node_lacks_is_named_by_its_key(tmp_path: Path) -> None:
    """A Slurm task on a node without the run's device: its error said "device 'cuda:99'
    requested but ..." (ValueError), not the recipe key to change, nor where."""
    from asyncsync.study.executors import slurm_task
    from asyncsync.study.recipe import load_recipe
    from asyncsync.study.run_one import prepare_folder

    (tmp_path / "small.toml").write_text(RECIPE)
    recipe = load_recipe(tmp_path / "small.toml", ['device="cuda:99"'])
    run_dir = tmp_path / "bsp-r0"
    prepare_folder(recipe.runs[0], recipe, run_dir, 0)
    slurm_task(str(run_dir), "")
    error = json.loads((run_dir / "summary.json").read_text())["error"]
    assert error.startswith("device: device 'cuda:99' requested but "), error
    assert error.endswith(f" on node {socket.gethostname()}; ask Slurm for GPUs "
                          '(--slurm-gpus N), or use device = "cpu"'), error
