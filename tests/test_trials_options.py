"""Command-line options a newcomer gets wrong are refused with one ``error:`` line."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_cli import one_error, run_main
from tests.test_parallel import recipe


def test_a_negative_gpu_count_is_refused(capsys: pytest.CaptureFixture[str],
                                         tmp_path: Path) -> None:
    """Before anything is prepared or submitted (it went to sbatch as --gpus-per-node=-1)."""
    assert one_error(run_main(capsys, "run", recipe(tmp_path), "--executor", "slurm",
                              "--slurm-gpus", "-1", "--logs", str(tmp_path / "logs"))) == (
        "error: asyncsync run: argument --slurm-gpus: expected an integer >= 0, got -1 (see "
        "asyncsync run --help)")
    assert not (tmp_path / "logs").exists()
