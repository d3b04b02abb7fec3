"""Ctrl-C while a kernel-shaped run creates its namespaces interrupts the run.

Ctrl-C goes to the terminal's whole process group, the ``ip`` and ``tc`` commands the
supervisor was running included: one of them died of it, and the run was recorded as
failed with that command's error (``ip link add ...: -2``), not as interrupted, so
``--resume`` would not run it again. The commands run in a process group of their own;
the supervisor alone decides what Ctrl-C stops. Needs root where ``ip netns`` works.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from asyncsync.study import netns
from tests.test_kernel_network import WHY_NOT

ROOT = Path(__file__).parents[1]
RECIPE = """
name = "many"
[defaults]
workers = 120
[defaults.stop]
time_s = 30
[defaults.model]
name = "mlp"
[defaults.network]
bandwidth_mbps = 20
emulation = "kernel"
[[runs]]
name = "bsp"
protocol = "bsp"
"""


def _of(pid: int) -> list[str]:
    return [name for name in netns.run_namespaces() if f"-{pid}-" in name]


@pytest.mark.skipif(WHY_NOT is not None, reason=WHY_NOT or "")
@pytest.mark.timeout(600)
@pytest.mark.usefixtures("ctrl_c")  # (pytest started in the background ignores SIGINT)
def test_ctrl_c_while_namespaces_are_created_interrupts_the_run(tmp_path: Path) -> None:
    recipe, logs = tmp_path / "many.toml", tmp_path / "logs"
    recipe.write_text(RECIPE)
    supervisor = subprocess.Popen(  # a terminal's foreground job: a process group
        [sys.executable, "-m", "asyncsync", "run", str(recipe), "--logs", str(logs),
         "--plain"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        deadline = time.monotonic() + 300
        while len(_of(supervisor.pid)) < 20 and supervisor.poll() is None:
            assert time.monotonic() < deadline, "no namespaces in time"
            time.sleep(0.05)
        assert len(_of(supervisor.pid)) < 122  # (123 when all are made: still creating)
        os.killpg(supervisor.pid, signal.SIGINT)  # what Ctrl-C in its terminal sends
        output, _ = supervisor.communicate(timeout=300)
    finally:
        if supervisor.poll() is None:
            os.killpg(supervisor.pid, signal.SIGKILL)
            supervisor.wait()
    summary = json.loads(next(logs.glob("many/*/bsp/summary.json")).read_text())
    assert summary.get("interrupted") is True, (summary.get("error"), output[-2000:])
    assert supervisor.returncode == 130, output[-2000:]
    assert _of(supervisor.pid) == []
