"""``--executor slurm`` on a machine without Slurm (``srun`` not on the PATH, a module not
loaded on a login node): submitit runs every task here as a local process, which the
command said only as ``(local)`` at the end of its "submitted" line; it now warns."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("submitit")

RECIPE = """
name = "tiny"
[defaults]
workers = 2
clock = "virtual"
protocol = "asp"
[defaults.stop]
time_s = 0.5
[defaults.model]
name = "mlp"
[defaults.compute]
base_step_s = 0.05
[[runs]]
name = "asp"
"""


def test_tasks_run_here_without_slurm_and_it_says_so(tmp_path: Path) -> None:
    (tmp_path / "tiny.toml").write_text(RECIPE)
    done = subprocess.run(
        [sys.executable, "-m", "asyncsync", "run", str(tmp_path / "tiny.toml"), "--plain",
         "--logs", str(tmp_path / "logs"), "--executor", "slurm", "--repeats", "2"],
        capture_output=True, text=True, timeout=300, cwd=Path(__file__).parent.parent,
        env={"PATH": str(Path(sys.executable).parent)})  # no srun, no sbatch
    assert done.returncode == 0, done.stdout + done.stderr
    assert ("warning: no Slurm on this machine (srun is not on the PATH): submitit runs the "
            "2 tasks here, as local processes") in " ".join(done.stdout.split()), done.stdout
