"""The study's child processes start before the supervisor imports torch, so that the two
imports overlap; the command line itself imports no torch until a command runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from asyncsync.study.children import Child, Spares, children_needed
from tests.test_parallel import ROOT, recipe

SPY = """
import subprocess, sys
from asyncsync.cli import main
seen = []
popen_init = subprocess.Popen.__init__
def spy(self, args, *rest, **kwargs):
    if "--serve" in list(args):
        seen.append("torch" in sys.modules)
    popen_init(self, args, *rest, **kwargs)
subprocess.Popen.__init__ = spy
code = main(sys.argv[1:])
print("CHILDREN", seen)
sys.exit(code)
"""


def test_run_starts_its_children_before_it_imports_torch(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", SPY, "run", recipe(tmp_path, time_s=6), "--jobs", "2",
         "--plain", "--logs", str(tmp_path / "logs")],
        cwd=ROOT, env={**os.environ, "COLUMNS": "160"}, capture_output=True, text=True,
        timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    started = next(line for line in done.stdout.splitlines() if line.startswith("CHILDREN"))
    # two children for four virtual runs at --jobs 2, both before torch, none later
    assert started == "CHILDREN [False, False]"
    (root,) = (tmp_path / "logs" / "small").iterdir()
    summaries = [json.loads((root / run / "summary.json").read_text())
                 for run in ("bsp-r0", "bsp-r1", "asp-r0", "asp-r1")]
    assert all(s["versions"] > 0 and "error" not in s for s in summaries)


def test_the_command_line_module_imports_no_torch() -> None:
    probe = "import sys, asyncsync.cli; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.stdout.strip() == "False", done.stderr


def test_the_children_needed_are_the_virtual_runs_times_repeats_at_most_jobs(
        tmp_path: Path) -> None:
    path = Path(recipe(tmp_path))  # 2 virtual runs, 2 repeats
    assert children_needed(path, [], [], None, jobs=8) == 4
    assert children_needed(path, [], [], None, jobs=3) == 3
    assert children_needed(path, [], ["asp"], None, jobs=8) == 2
    assert children_needed(path, [], [], 1, jobs=8) == 2
    assert children_needed(path, ['clock="real"'], [], None, jobs=8) == 0
    assert children_needed(path, [], [], None, jobs=1) == 0  # the runs go in the supervisor
    real = tmp_path / "real.toml"
    real.write_text(path.read_text().replace('clock = "virtual"', 'clock = "real"'))
    assert children_needed(real, [], [], None, jobs=8) == 0
    assert children_needed(real, ['clock="virtual"'], [], None, jobs=8) == 4
    assert children_needed(real, ["clock=virtual"], [], None, jobs=8) == 4  # a bare word
    swept = tmp_path / "swept.toml"
    swept.write_text(path.read_text().replace("[defaults]\n",
                                              '[sweep]\n"optim.lr" = [0.1, 0.3, 1.0]\n\n'
                                              "[defaults]\n"))
    assert children_needed(swept, [], ["bsp"], 1, jobs=8) == 3
    broken = tmp_path / "broken.toml"
    broken.write_text("[defaults\nclock = 'virtual'")
    assert children_needed(broken, [], [], None, jobs=8) == 0
    assert children_needed(tmp_path / "absent.toml", [], [], None, jobs=8) == 0


async def test_a_spare_that_died_waiting_is_not_handed_a_run() -> None:
    pipe = subprocess.PIPE
    dead = subprocess.Popen([sys.executable, "-c", "pass"], stdin=pipe, stdout=pipe,
                            stderr=pipe)
    dead.wait()
    spares = Spares([dead])
    child = await Child.start(spares)
    try:
        assert child.process is not dead and child.alive
    finally:
        await child.close()
        spares.close()
