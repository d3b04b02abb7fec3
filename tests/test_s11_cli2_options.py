"""Options that do not apply are refused, naming the option, before anything runs: a
``--slurm-*`` option (or ``--no-wait``) with the local executor."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_cli import one_error, run_main
from tests.test_parallel import recipe


@pytest.mark.parametrize("option", [
    ["--slurm-partition", "cpu"], ["--slurm-time", "30"], ["--slurm-cpus", "2"],
    ["--slurm-gpus", "1"], ["--slurm-gpus", "0"], ["--slurm-array-parallelism", "4"],
    ["--no-wait"]])
def test_a_slurm_option_with_the_local_executor_is_refused_by_name(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, option: list[str]) -> None:
    logs = tmp_path / "logs"
    message = one_error(run_main(capsys, "run", recipe(tmp_path), "--plain", "--logs",
                                 str(logs), *option))
    assert message.startswith(f"error: {option[0]}: "), message
    assert "--executor slurm" in message
    assert not logs.exists()


def test_slurm_options_are_refused_together_and_by_name(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    message = one_error(run_main(capsys, "run", recipe(tmp_path), "--plain", "--executor",
                                 "local", "--slurm-cpus", "2", "--slurm-time", "5"))
    assert message.startswith("error: --slurm-time, --slurm-cpus: "), message
