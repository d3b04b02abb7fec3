"""`asyncsync run --executor slurm` when Slurm refuses the job array (a bad partition, a
cluster with no configuration): one ``error:`` line with sbatch's own reason, exit 2."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from asyncsync.cli import main
from tests.test_parallel import recipe

SBATCH = """#!/bin/sh
echo "sbatch: error: invalid partition specified: nosuch" >&2
echo "sbatch: error: Batch job submission failed: Invalid partition name specified" >&2
exit 1
"""


def test_a_refused_submission_is_one_error_line_with_sbatchs_reason(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    """A fake sbatch (and srun, which makes submitit choose Slurm) that refuses the job."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("sbatch", SBATCH), ("srun", "#!/bin/sh\nexit 0\n")):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{Path(sys.executable).parent}")
    code = main(["run", recipe(tmp_path), "--logs", str(tmp_path / "logs"), "--plain",
                 "--executor", "slurm", "--slurm-partition", "nosuch"])
    out = capsys.readouterr()
    text = out.out + out.err
    assert "Traceback" not in text, text
    errors = [line for line in text.splitlines() if line.startswith("error:")]
    assert [line for line in text.splitlines() if "sbatch" in line] == errors, text
    assert code == 2, text
    (study,) = (tmp_path / "logs" / "small").iterdir()
    assert errors == [
        "error: --executor slurm: sbatch refused the job array (sbatch: error: invalid "
        "partition specified: nosuch; sbatch: error: Batch job submission failed: Invalid "
        f"partition name specified); once that is fixed, asyncsync run RECIPE --executor "
        f"slurm --resume {study} submits its runs"], text
