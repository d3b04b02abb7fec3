"""Which namespaces a kernel-shaped start removes as left by a killed run (`clean_stale`).

A run's namespaces carry its supervisor's pid and that process's start time
(``/proc/<pid>/stat``, field 22). By pid alone, a pid the kernel handed to a new process
after the supervisor was killed made the dead run's namespaces (and the nodes still
running in them) look alive for as long as that process ran; so did a killed supervisor
its parent had not yet reaped (a zombie). Both are stale by pid and start time; a running
supervisor's are kept. The first tests list a folder of their own as ``/run/netns`` and
record what would be deleted (anywhere); the last one uses real namespaces (root).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from asyncsync.study import netns
from asyncsync.study.hetero_specs import NetworkSpec
from tests.test_kernel_network import WHY_NOT


def _stat(pid: int) -> list[str]:
    """/proc/<pid>/stat's fields after the command's name (state first), read here."""
    text = Path(f"/proc/{pid}/stat").read_text()
    return text[text.rindex(")") + 2:].split()


def _started(pid: int) -> int:
    return int(_stat(pid)[19])  # field 22: start time, clock ticks after boot


def _zombie() -> subprocess.Popen[bytes]:
    """A child that has exited and is not reaped yet (as a SIGKILLed supervisor whose
    parent has not waited for it)."""
    child = subprocess.Popen(["sleep", "0"])
    deadline = time.monotonic() + 30
    while _stat(child.pid)[0] != "Z":
        assert time.monotonic() < deadline, "the child did not exit"
        time.sleep(0.01)
    return child


@pytest.fixture
def fake_netns(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[str]:
    """/run/netns as an empty folder of this test's; returns the names deleted."""
    deleted: list[str] = []
    monkeypatch.setattr(netns, "NETNS_DIR", tmp_path)
    monkeypatch.setattr(netns, "_delete", deleted.append)
    return deleted


def _name(pid: int, started: int | None, role: str = "br") -> str:
    owner = f"{pid}" if started is None else f"{pid}-{started}"
    return f"{netns.PREFIX}abcdef-{owner}-{role}"


def test_a_runs_namespaces_name_its_supervisors_pid_and_start_time() -> None:
    network = netns.RunNetwork(NetworkSpec(emulation="kernel"), 1)
    assert network.namespace("w0") == \
        f"asyncsync-{network.tag}-{os.getpid()}-{_started(os.getpid())}-w0"


def test_a_killed_runs_namespaces_are_stale_though_its_pid_runs_another_process(
        fake_netns: list[str]) -> None:
    me = os.getpid()
    reused = _name(me, _started(me) - 1)  # the pid's earlier holder, started a tick sooner
    live = _name(me, _started(me), "server")
    for name in (reused, live):
        (netns.NETNS_DIR / name).touch()
    assert netns.clean_stale() == [reused]
    assert fake_netns == [reused]


def test_a_killed_supervisor_not_yet_reaped_is_stale(fake_netns: list[str]) -> None:
    zombie = _zombie()
    try:
        name = _name(zombie.pid, _started(zombie.pid))
        (netns.NETNS_DIR / name).touch()
        assert netns.clean_stale() == [name]
    finally:
        zombie.wait()
    assert fake_netns == [name]


def test_a_running_supervisors_namespaces_stay_until_it_ends(fake_netns: list[str]) -> None:
    supervisor = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        name = _name(supervisor.pid, _started(supervisor.pid), "w3")
        (netns.NETNS_DIR / name).touch()
        assert netns.clean_stale() == []
    finally:
        supervisor.kill()
        supervisor.wait()
    assert netns.clean_stale() == [name]
    assert fake_netns == [name]


def test_names_of_an_older_version_are_judged_by_pid(fake_netns: list[str]) -> None:
    ended = subprocess.Popen(["sleep", "0"])
    ended.wait()  # reaped: its pid runs nothing (until the kernel hands it out again)
    gone, live = _name(ended.pid, None), _name(os.getpid(), None)
    for name in (gone, live, f"{netns.PREFIX}not-a-run"):
        (netns.NETNS_DIR / name).touch()
    assert netns.clean_stale() == [gone]


@pytest.mark.skipif(WHY_NOT is not None, reason=WHY_NOT or "")
def test_a_real_stale_namespace_under_a_reused_pid_goes_with_its_processes() -> None:
    me = os.getpid()
    stale = _name(me, _started(me) - 1).replace("abcdef", os.urandom(3).hex())
    ip = netns.tool("ip") or "ip"
    subprocess.run([ip, "netns", "add", stale], check=True)
    try:
        inside = subprocess.Popen([ip, "netns", "exec", stale, "sleep", "60"])
        deadline = time.monotonic() + 30
        while not subprocess.run([ip, "netns", "pids", stale], capture_output=True,
                                 text=True, check=True).stdout.split():
            assert time.monotonic() < deadline, "sleep did not start in the namespace"
            time.sleep(0.05)
        assert stale in netns.clean_stale()
        assert inside.wait(timeout=30) == -9  # SIGKILLed: a node left by the killed run
    finally:
        subprocess.run([ip, "netns", "del", stale], capture_output=True, check=False)
    assert stale not in netns.run_namespaces()
