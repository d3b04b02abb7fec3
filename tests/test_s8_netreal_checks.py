"""What a kernel-shaped run (``network.emulation = "kernel"``) checks before it starts.

A rate that tc's ``tbf`` cannot shape (below 1 kbit/s tc shrinks its burst below one
packet; far above 100 Gbit/s its sizes outgrow 32 bits, or tc cannot read the rate's
``1e-07mbit`` at all) is refused before any folder, naming the run and the key; so is a
host where root cannot create namespaces (root in a user namespace, as in an
unprivileged container), instead of a traceback or a run that fails after it started.
The tests that need root and ``ip netns`` skip with the reason elsewhere.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from asyncsync.hetero.network import KERNEL_MBPS
from asyncsync.study import netns
from asyncsync.study.hetero_specs import NetworkSpec
from tests.test_cli import one_error, run_main
from tests.test_kernel_network import WHY_NOT

ROOT = Path(__file__).parents[1]


def _recipe(tmp_path: Path, network: str) -> Path:
    path = tmp_path / "shaped.toml"
    path.write_text(f"""
name = "shaped"
[defaults]
workers = 2
[defaults.stop]
time_s = 3
[defaults.model]
name = "mlp"
[defaults.network]
emulation = "kernel"
{network}
[[runs]]
name = "bsp"
protocol = "bsp"
""")
    return path


@pytest.mark.parametrize(("network", "named"), [
    ("bandwidth_mbps = 1e-7", "network.bandwidth_mbps: 1e-07 Mbit/s (worker 0's uplink)"),
    ("uplink_mbps = [10, 1e9]", "network.uplink_mbps: 1e+09 Mbit/s (worker 1's uplink)"),
    ("downlink_mbps = 0.0005", "network.downlink_mbps: 0.0005 Mbit/s (worker 0's downlink)"),
    ("server_mbps = 1e6", "network.server_mbps: 1e+06 Mbit/s (the server's link)"),
])
def test_a_rate_tc_cannot_shape_is_one_error_line_naming_run_and_key(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, network: str, named: str) -> None:
    logs = tmp_path / "logs"
    line = one_error(run_main(capsys, "run", str(_recipe(tmp_path, network)), "--logs",
                              str(logs)))
    assert named in line and "bsp" in line  # the run (by name, or as runs[0] (bsp))
    assert f"{KERNEL_MBPS[0]:g} to {KERNEL_MBPS[1]:g} Mbit/s" in line
    assert not logs.exists()  # refused before any folder


def test_run_network_refuses_a_rate_tc_cannot_shape() -> None:
    with pytest.raises(ValueError, match="bandwidth_mbps: 1e-07 Mbit/s"):
        netns.RunNetwork(NetworkSpec(bandwidth_mbps=1e-7, emulation="kernel"), 1)


def test_the_fastest_link_with_delay_gets_a_queue_tc_can_count(
        monkeypatch: pytest.MonkeyPatch) -> None:
    commands: list[tuple[str, ...]] = []

    def record(*args: str) -> str:
        commands.append(args)
        return ""

    monkeypatch.setattr(netns, "_run", record)
    network = netns.RunNetwork(NetworkSpec(bandwidth_mbps=KERNEL_MBPS[1], latency_ms=200,
                                           emulation="kernel"), 1)
    network.create()
    limits = [int(c[c.index("limit") + 1]) for c in commands if "tbf" in c]
    assert len(limits) == 2  # the worker's two ends
    assert all(65536 <= limit < 2**32 for limit in limits), limits


def test_a_host_that_cannot_create_namespaces_is_one_error_line(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        tmp_path: Path) -> None:
    real_run = netns._run

    def no_namespaces(*args: str) -> str:
        if args[:3] == ("ip", "netns", "add"):
            raise netns.NetnsError(f"{' '.join(args)}: mount --make-shared /run/netns "
                                   "failed: Operation not permitted")
        return real_run(*args)

    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(netns, "tool", lambda name: f"/usr/sbin/{name}")
    monkeypatch.setattr(netns, "_run", no_namespaces)
    monkeypatch.setattr(netns, "clean_stale", list)
    logs = tmp_path / "logs"
    line = one_error(run_main(capsys, "run", str(_recipe(tmp_path, "bandwidth_mbps = 20")),
                              "--logs", str(logs)))
    assert "this host cannot create network namespaces" in line
    assert "Operation not permitted" in line
    assert not logs.exists()


def _user_namespace_root() -> str | None:
    """Why a root without capabilities (``unshare -r``) cannot be tried here (None: it can)."""
    if WHY_NOT is not None:
        return WHY_NOT
    unshare = shutil.which("unshare")
    if unshare is None:
        return "no unshare (util-linux)"
    done = subprocess.run([unshare, "-r", "true"], capture_output=True, text=True,
                          check=False)
    return f"unshare -r fails here: {done.stderr.strip()}" if done.returncode else None


USERNS = _user_namespace_root()


@pytest.mark.skipif(USERNS is not None, reason=USERNS or "")
@pytest.mark.parametrize("network", ["bandwidth_mbps = 20", "latency_ms = 5"])
def test_root_in_a_user_namespace_gets_one_error_line(tmp_path: Path, network: str) -> None:
    logs = tmp_path / "logs"
    done = subprocess.run(
        ["unshare", "-r", sys.executable, "-m", "asyncsync", "run",
         str(_recipe(tmp_path, network)), "--logs", str(logs), "--plain"],
        capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    line = one_error(done)
    assert "this host cannot create network namespaces" in line, line
    assert not logs.exists()


@pytest.mark.skipif(WHY_NOT is not None, reason=WHY_NOT or "")
def test_the_slowest_rate_keeps_a_burst_of_a_full_packet() -> None:
    network = netns.RunNetwork(NetworkSpec(bandwidth_mbps=KERNEL_MBPS[0],
                                           emulation="kernel"), 1)
    network.create()
    try:
        shown = subprocess.run([netns.tool("tc") or "tc", "-n", network.namespace("w0"),
                                "qdisc", "show", "dev", network.interface("w0")],
                               capture_output=True, text=True, check=True).stdout
    finally:
        network.remove()
    burst = re.search(r"burst (\d+)(K?)b", shown)
    assert burst is not None, shown
    assert int(burst.group(1)) * (1024 if burst.group(2) else 1) >= 1514, shown


def test_one_namespace_that_will_not_go_leaves_the_others_removed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    deleted: list[str] = []

    def delete(namespace: str) -> None:
        if namespace.endswith("-w0"):
            raise netns.NetnsError(f"ip netns del {namespace}: Device or resource busy")
        deleted.append(namespace)

    monkeypatch.setattr(netns, "_delete", delete)
    network = netns.RunNetwork(NetworkSpec(emulation="kernel"), 2)
    network.created = [network.namespace(role) for role in ("br", "server", "w0", "w1")]
    with pytest.raises(netns.NetnsError, match="-w0: Device or resource busy"):
        network.remove()
    assert sorted(deleted) == sorted(network.namespace(r) for r in ("br", "server", "w1"))


def test_check_refuses_a_rate_tc_cannot_shape_naming_the_file(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    recipe = _recipe(tmp_path, "bandwidth_mbps = 1e-7")
    line = one_error(run_main(capsys, "check", str(recipe)))
    assert line.startswith(f"error: {recipe}: ") and "network.bandwidth_mbps: 1e-07" in line
