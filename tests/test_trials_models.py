"""A recipe's own model (``model.name = "module:callable"``): found in the working directory
by the installed ``asyncsync`` command as by ``python -m asyncsync`` and the study's child
processes; a model that cannot be imported or built is one ``error:`` line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_cli import one_error, run_main
from tests.test_parallel import recipe

ROOT = Path(__file__).parent.parent

MODEL = """import torch.nn as nn


def build(input_shape, num_classes, hidden=8):
    size = 1
    for dim in input_shape:
        size *= dim
    return nn.Sequential(nn.Flatten(), nn.Linear(size, hidden), nn.ReLU(),
                         nn.Linear(hidden, num_classes))
"""

SCRIPT = "import sys\nfrom asyncsync.cli import main\nsys.exit(main())\n"
"""What pip's console script `asyncsync` runs: its folder, not the working directory, is
sys.path[0]."""


def test_the_installed_command_finds_a_model_in_the_working_directory(tmp_path: Path) -> None:
    work, bin_dir = tmp_path / "work", tmp_path / "bin"
    work.mkdir()
    bin_dir.mkdir()
    (work / "mymodel.py").write_text(MODEL)
    (bin_dir / "asyncsync").write_text(SCRIPT)
    done = subprocess.run(
        [sys.executable, str(bin_dir / "asyncsync"), "check", recipe(tmp_path), "--set",
         "model.name=mymodel:build", "--set", "model.options.hidden=4", "--set",
         "compute.base_step_s=0.0"],  # the step's time from the model's FLOPs: built
        cwd=work, env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "160"},
        capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "small.toml: ok (2 runs" in done.stdout
    assert "3 x cpu-core" in done.stdout  # its FLOPs were counted


@pytest.mark.parametrize("command", ["check", "run"])
def test_a_model_that_cannot_be_imported_is_one_error(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, command: str) -> None:
    """Before any run starts: `run` makes no study folder."""
    args = [command, recipe(tmp_path), "--set", "model.name=nosuchmodule:build"]
    if command == "run":
        args += ["--logs", str(tmp_path / "logs"), "--plain", "--jobs", "1"]
    assert one_error(run_main(capsys, *args)) == (
        f"error: {args[1]}: bsp: model.name: 'nosuchmodule:build' cannot be imported (No "
        "module named 'nosuchmodule'); a module is looked up in the working directory, then in the "
        "installed packages")
    assert not (tmp_path / "logs").exists()


def test_a_model_option_it_does_not_take_is_one_error(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """(`check` prints its table of runs first, as for a missing dataset.)"""
    code, out = run_main(capsys, "check", recipe(tmp_path), "--set",
                         "model.options.hiddenn=3", "--set", "compute.base_step_s=0.0")
    assert code == 2 and "Traceback" not in out, out
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(
        "error: bsp: model: model 'mlp' rejected its options {'hiddenn': 3}: "), out
