"""The sbatch script of ``--executor slurm`` (a fake sbatch keeps it): the array, the
options given, and no GPU request unless ``--slurm-gpus`` asks for GPUs (it asked for
``--gpus-per-node=0``, a GPU request some clusters refuse: "Invalid generic resource
(gres) specification" where no GPU is configured, or a submit filter on GPU requests)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from asyncsync.cli import main
from tests.test_s10_study_slurm_local import RECIPE

pytest.importorskip("submitit")

SBATCH = """#!/bin/sh
/bin/cp "$1" "{keep}"
echo "Submitted batch job 4242"
"""


@pytest.mark.parametrize(("gpus", "requested"), [([], None), (["--slurm-gpus", "2"], 2)])
def test_the_script_asks_for_gpus_only_when_given(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path, gpus: list[str], requested: int | None) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    kept = tmp_path / "script.sh"
    for name, text in (("sbatch", SBATCH.format(keep=kept)), ("srun", "#!/bin/sh\n")):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{Path(sys.executable).parent}")
    (tmp_path / "tiny.toml").write_text(RECIPE)
    code = main(["run", str(tmp_path / "tiny.toml"), "--logs", str(tmp_path / "logs"),
                 "--plain", "--executor", "slurm", "--repeats", "3", "--slurm-partition",
                 "cpu", "--slurm-time", "7", "--slurm-cpus", "2",
                 "--slurm-array-parallelism", "2", "--no-wait", *gpus])
    out = capsys.readouterr().out
    assert code == 0 and "submitted 3 runs as job array 4242 (slurm)" in out, out
    options = [line.removeprefix("#SBATCH ") for line in kept.read_text().splitlines()
               if line.startswith("#SBATCH ")]
    assert {"--array=0-2%2", "--partition=cpu", "--time=7", "--cpus-per-task=2",
            "--job-name=tiny"} <= set(options), options
    gpu_lines = [o for o in options if o.startswith(("--gpu", "--gres"))]
    assert gpu_lines == ([] if requested is None else [f"--gpus-per-node={requested}"])
