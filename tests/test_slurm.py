"""A study submitted to a real single-node Slurm (Debian's slurm-wlm and munge, started
here on loopback) equals the same study run with --jobs 1."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.test_parallel import RUNS, outcome, recipe, run_cli, sequential, study

DAEMONS = ("slurmctld", "slurmd", "munged", "munge", "sinfo", "scontrol")
__all__ = ["sequential"]  # the --jobs 1 study, a fixture shared with test_parallel
pytestmark = pytest.mark.skipif(
    any(shutil.which(d) is None for d in DAEMONS) or os.geteuid() != 0,
    reason="a real Slurm needs Debian's slurm-wlm and munge and root (.ci/run installs "
           "them where it can)")

CONF = """ClusterName=asyncsync-test
SlurmctldHost={host}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory=2000 State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def ensure_munge() -> None:
    """munged running with a key (made here if the package left none)."""
    if subprocess.run("munge -n | unmunge", shell=True, capture_output=True).returncode == 0:
        return
    key = Path("/etc/munge/munge.key")
    if not key.exists():
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
    Path("/run/munge").mkdir(parents=True, exist_ok=True)
    subprocess.run(["munged", "--force"], check=True, capture_output=True)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    root = tmp_path_factory.mktemp("slurm")
    for sub in ("state", "spool"):
        (root / sub).mkdir()
    conf = root / "slurm.conf"
    conf.write_text(CONF.format(host=socket.gethostname(), root=root, cpus=os.cpu_count(),
                                ctld_port=free_port(), d_port=free_port()))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    ensure_munge()
    for daemon in ("slurmctld", "slurmd"):
        subprocess.run([daemon, "-f", str(conf)], check=True, env=env, capture_output=True)
    try:
        deadline = time.monotonic() + 60
        while "idle" not in subprocess.run(["sinfo", "-h", "-o", "%t"], env=env,
                                           capture_output=True, text=True).stdout:
            assert time.monotonic() < deadline, (root / "slurmctld.log").read_text()[-2000:]
            time.sleep(0.5)
        yield {"SLURM_CONF": str(conf)}
    finally:
        for pid_file in ("slurmd.pid", "slurmctld.pid"):
            pid = root / pid_file
            if pid.exists():
                subprocess.run(["kill", pid.read_text().strip()], check=False)


def test_a_study_runs_as_a_real_slurm_job_array(cluster: dict[str, str],
                                                sequential: dict[str, object],
                                                tmp_path: Path) -> None:
    done = run_cli(recipe(tmp_path), "--logs", str(tmp_path / "logs"), "--executor", "slurm",
                   "--slurm-time", "10", env=cluster)
    assert done.returncode == 0, done.stdout + done.stderr
    root = study(tmp_path / "logs")
    submitted = json.loads((root / "submitted.json").read_text())
    assert submitted["runs"] == RUNS and submitted["cluster"] == "slurm"
    array_id = submitted["job_array"]
    shown = subprocess.run(["scontrol", "show", "job", array_id], capture_output=True,
                           text=True, env={**os.environ, **cluster})
    assert "JobState=COMPLETED" in shown.stdout, shown.stdout + shown.stderr
    assert outcome(root) == sequential
