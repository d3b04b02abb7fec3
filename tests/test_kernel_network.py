"""Kernel-shaped links (``network.emulation = "kernel"``) and loss on the virtual clock.

The first tests run anywhere: the specs' refusals, TCP's loss-limited rate, and the CLI's
one ``error:`` line where root or a tool is missing. The last ones need root where
``ip netns`` works (skipped with the reason elsewhere): they measure a shaped link's round
trip and rate, and run a 2-worker bsp study in namespaces, after a run killed by SIGKILL,
checking that nothing is left and that the host's interfaces, routes and qdiscs did not
change. Delay needs the kernel's netem qdisc; where it lacks one those cases are skipped.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from asyncsync.hetero.network import Link, LinkSpec, loss_limited_mbps
from asyncsync.schema import ConfigError
from asyncsync.study import netns
from asyncsync.study.hetero_specs import NetworkSpec
from asyncsync.study.specs import RunSpec
from tests.test_cli import one_error, run_main

RATE_MBPS = 20.0
DELAY_MS = 50.0


def _why_not() -> str | None:
    """Why kernel shaping cannot be tested here (None: it can)."""
    problem = netns.missing()
    if problem:
        return problem
    probe = f"asyncsync-test-probe-{os.getpid()}"
    done = subprocess.run([netns.tool("ip") or "ip", "netns", "add", probe],
                          capture_output=True, text=True, check=False)
    if done.returncode:
        return f"ip netns add fails here: {done.stderr.strip()}"
    subprocess.run([netns.tool("ip") or "ip", "netns", "del", probe], check=False)
    return None


def _has_netem() -> bool:
    try:
        netns.check_host(netem=True)
    except ConfigError:
        return False
    return True


WHY_NOT = _why_not()
needs_netns = pytest.mark.skipif(WHY_NOT is not None, reason=WHY_NOT or "")
NETEM = WHY_NOT is None and _has_netem()
DELAYS = [0.0, pytest.param(DELAY_MS, marks=pytest.mark.skipif(
    not NETEM, reason="this kernel has no netem qdisc (CONFIG_NET_SCH_NETEM): no delay"))]


def test_loss_limited_rate_is_mathis_formula() -> None:
    # MSS 1448 B, RTT 100 ms, p = 1 %: 1448 * 8 / 0.1 * sqrt(1.5) / 0.1 = 1.41862 Mbit/s.
    assert loss_limited_mbps(0.1, 1.0) == pytest.approx(1.41862, rel=1e-4)
    assert loss_limited_mbps(0.1, 0.0) == float("inf")


def test_virtual_link_rate_capped_by_loss_only_below_its_rate() -> None:
    lossy = Link(LinkSpec(uplink_mbps=100, downlink_mbps=1, latency_ms=50, loss_pct=1))
    assert lossy.up.bytes_per_s * 8 / 1e6 == pytest.approx(1.41862, rel=1e-4)
    assert lossy.down.bytes_per_s * 8 / 1e6 == pytest.approx(1.0)
    assert Link(LinkSpec(latency_ms=50, loss_pct=1)).up.bytes_per_s > 0


@pytest.mark.parametrize(("clock", "network", "message"), [
    ("virtual", {"emulation": "kernel"}, "shapes a real run's sockets"),
    ("real", {"loss_pct": 1.0, "latency_ms": 10}, "app pacing cannot drop packets"),
    ("real", {"server_mbps": 100.0}, "shaped by the kernel"),
    ("virtual", {"loss_pct": [0, 1.0]}, "needs network.latency_ms > 0"),
])
def test_specs_refuse_what_a_clock_cannot_shape(clock: str, network: dict[str, object],
                                                message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RunSpec(name="r", workers=2, clock=clock, network=NetworkSpec(**network))  # type: ignore[arg-type]


def test_specs_accept_kernel_shaping_with_server_link_and_loss() -> None:
    spec = RunSpec(name="r", workers=2, network=NetworkSpec(
        emulation="kernel", server_mbps=100, loss_pct=[0, 1.0], latency_ms=5))
    assert spec.network.link(1).loss_pct == 1.0


def test_links_get_netem_above_tbf_with_uniform_jitter(monkeypatch: pytest.MonkeyPatch
                                                        ) -> None:
    commands: list[tuple[str, ...]] = []

    def record(*args: str) -> str:
        commands.append(args)
        return ""

    monkeypatch.setattr(netns, "_run", record)
    network = netns.RunNetwork(NetworkSpec(uplink_mbps=[10, 0], downlink_mbps=20,
                                           latency_ms=50, jitter_ms=[10, 0], loss_pct=[0, 2],
                                           server_mbps=100, emulation="kernel"), 2)
    network.create()
    w0, w1, server = (network.interface(role) for role in ("w0", "w1", "server"))
    # Worker 0: uplink 10 Mbit/s, one-way delay uniform in [50, 60] ms = 55 +- 5 ms.
    assert [c[2:] for c in commands if c[0] == "tc" and c[6] == w0 and "netem" in c] == [
        (network.namespace("w0"), "qdisc", "add", "dev", w0, "root", "handle", "1:", "netem",
         "limit", "100000", "delay", "55ms", "5ms")]
    assert [c[7:13] for c in commands if c[0] == "tc" and c[6] == w0] == [
        ("root", "handle", "1:", "netem", "limit", "100000"),
        ("parent", "1:1", "handle", "2:", "tbf", "rate")]
    rates = {(c[2], c[6]): c[c.index("rate") + 1] for c in commands if "tbf" in c}
    assert rates == {(network.namespace("w0"), w0): "10mbit",
                     (network.namespace("br"), f"{w0}b"): "20mbit",
                     (network.namespace("br"), f"{w1}b"): "20mbit",
                     (network.namespace("server"), server): "100mbit",
                     (network.namespace("br"), f"{server}b"): "100mbit"}
    netem_w1 = [c[11:] for c in commands if c[0] == "tc" and c[6] == w1 and "netem" in c]
    assert netem_w1 == [("limit", "100000", "delay", "50ms", "loss", "2%")]


def _recipe(tmp_path: Path, delay_ms: float = 0.0, time_s: float = 3.0) -> Path:
    path = tmp_path / "kernel.toml"
    path.write_text(f"""
name = "kernel"
[defaults]
workers = 2
[defaults.stop]
time_s = {time_s}
[defaults.model]
name = "mlp"
[defaults.eval]
interval_s = 1.0
[defaults.network]
bandwidth_mbps = {RATE_MBPS}
latency_ms = {delay_ms}
emulation = "kernel"
[[runs]]
name = "bsp"
protocol = "bsp"
""")
    return path


@pytest.mark.parametrize(("lacking", "message"), [
    ("root", "needs root"), ("tc", "needs tc (package iproute2)")])
def test_kernel_run_lacking_root_or_tools_is_one_error_line(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        tmp_path: Path, lacking: str, message: str) -> None:
    if lacking == "root":
        monkeypatch.setattr(os, "geteuid", lambda: 1000)
    else:
        real_tool = netns.tool
        monkeypatch.setattr(netns, "tool", lambda name: None if name == "tc" else
                            real_tool(name) or f"/usr/sbin/{name}")
        monkeypatch.setattr(os, "geteuid", lambda: 0)
    logs = tmp_path / "logs"
    line = one_error(run_main(capsys, "run", str(_recipe(tmp_path)), "--logs", str(logs)))
    assert message in line
    assert not logs.exists()  # refused before any folder


def _host_network() -> str:
    """The host's interfaces, addresses, routes and qdiscs, as text to compare."""
    ip, tc = netns.tool("ip") or "ip", netns.tool("tc") or "tc"
    commands = [[ip, "-o", "link", "show"], [ip, "-o", "addr", "show"],
                [ip, "route", "show", "table", "all"], [ip, "-6", "route", "show", "table", "all"],
                [tc, "qdisc", "show"]]
    return "\n".join(subprocess.run(c, capture_output=True, text=True, check=True).stdout
                     for c in commands)


def _in(network: netns.RunNetwork, role: str, code: str) -> subprocess.Popen[str]:
    return subprocess.Popen([*network.command(role), sys.executable, "-c", code],
                            stdout=subprocess.PIPE, text=True)


SINK = """
import socket, sys
s = socket.socket(); s.bind((sys.argv[1], 5001)); s.listen(); print("up", flush=True)
c, _ = s.accept()
while (b := c.recv(1)) not in (b"x", b""):  # one byte at a time: the "x" that ends the
    c.sendall(b)  # round trips (each echoed) may arrive in one segment with the data
total = 0
while (b := c.recv(1 << 20)):
    total += len(b)
c.sendall(str(total).encode())
"""

PROBE = """
import json, socket, sys, time
s = socket.create_connection((sys.argv[1], 5001)); s.setsockopt(6, 1, 1)
rtts = []
for _ in range(10):
    t = time.perf_counter(); s.sendall(b"p"); s.recv(16); rtts.append(time.perf_counter() - t)
s.sendall(b"x"); data = bytes(int(sys.argv[2]))
t = time.perf_counter(); s.sendall(data); s.shutdown(socket.SHUT_WR)
total = int(s.recv(64)); elapsed = time.perf_counter() - t
print(json.dumps({"rtts": rtts, "bytes": total, "s": elapsed}))
"""


@needs_netns
@pytest.mark.parametrize("delay_ms", DELAYS)
def test_shaped_link_measures_as_set(delay_ms: float) -> None:
    before = _host_network()
    network = netns.RunNetwork(NetworkSpec(bandwidth_mbps=RATE_MBPS, latency_ms=delay_ms), 1)
    network.create()
    try:
        server = network.address("server")
        sink = subprocess.Popen([*network.command("server"), sys.executable, "-c", SINK,
                                 server], stdout=subprocess.PIPE, text=True)
        assert sink.stdout is not None and sink.stdout.readline().strip() == "up"
        nbytes = 2_500_000  # 1 s at 20 Mbit/s
        probe = subprocess.run([*network.command("w0"), sys.executable, "-c", PROBE, server,
                                str(nbytes)], capture_output=True, text=True, timeout=120)
        sink.wait(timeout=30)
        measured = json.loads(probe.stdout)
    finally:
        network.remove()
    rtt = statistics.median(measured["rtts"])
    assert 2 * delay_ms / 1e3 * 0.95 <= rtt <= 2 * delay_ms / 1e3 + 0.25, measured["rtts"]
    assert measured["bytes"] == nbytes
    mbps = nbytes * 8 / 1e6 / (measured["s"] - 2 * delay_ms / 1e3)
    # Shaped: never faster than the rate (header bytes count against it too); loaded host:
    # at least a third of it.
    assert RATE_MBPS / 3 <= mbps <= RATE_MBPS * 1.02, mbps
    assert netns.run_namespaces() == [n for n in netns.run_namespaces()
                                      if f"-{os.getpid()}-" not in n]
    assert _host_network() == before


def _supervisor(recipe: Path, logs: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "asyncsync", "run", str(recipe), "--logs",
                             str(logs), "--plain"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH":
                                                            str(Path(__file__).parents[1])})


def _of(pid: int) -> list[str]:
    return [name for name in netns.run_namespaces() if f"-{pid}-" in name]


@needs_netns
@pytest.mark.timeout(900)  # two real runs: over 300 s at load 8 with one core kept busy
@pytest.mark.parametrize("delay_ms", DELAYS)
def test_bsp_run_in_namespaces_after_a_killed_one(tmp_path: Path, delay_ms: float) -> None:
    before = _host_network()
    recipe = _recipe(tmp_path, delay_ms)
    (tmp_path / "killed").mkdir()
    killed = _supervisor(_recipe(tmp_path / "killed", delay_ms, time_s=60),
                         tmp_path / "killed")
    deadline = time.monotonic() + 180
    while not list((tmp_path / "killed").glob("kernel/*/bsp/server.log")) and \
            killed.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    stale = _of(killed.pid)
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    assert len(stale) == 4, stale  # bridge, server, two workers: left behind by SIGKILL
    assert _of(killed.pid) == stale

    done = subprocess.run([sys.executable, "-m", "asyncsync", "run", str(recipe), "--logs",
                           str(tmp_path / "logs"), "--plain"], capture_output=True, text=True,
                          timeout=600, env={**os.environ, "PYTHONPATH":
                                            str(Path(__file__).parents[1])})
    assert done.returncode == 0, done.stdout + done.stderr
    assert _of(killed.pid) == []  # the next start cleaned the stale set
    assert [n for n in netns.run_namespaces() if (match := netns.STALE.match(n))
            and netns.started(int(match.group(1))) is None] == []
    assert _host_network() == before  # no veth, bridge, qdisc or route outside

    run_dir = next((tmp_path / "logs").glob("kernel/*/bsp"))
    server_log = (run_dir / "server.log").read_text()
    assert "at http://198.18.0.1:" in server_log  # its namespace's address only
    records = [json.loads(line) for line in (run_dir / "worker-0.jsonl").read_text().split()]
    join = next(r for r in records if r["event"] == "join")
    moving = join["dur"] - join["held_s"]
    nominal = join["down"] * 8 / (RATE_MBPS * 1e6) + 2 * delay_ms / 1e3
    assert nominal * 0.95 <= moving <= nominal * 3 + 1.0, (moving, nominal)
    # Each exchange: its bytes up and down at the rate, and a round trip.
    exchanges = [(r["dur"] - r["held_s"],
                  (r["up"] + r["down"]) * 8 / (RATE_MBPS * 1e6) + 2 * delay_ms / 1e3)
                 for r in records if r["event"] == "exchange"]
    assert exchanges and all(took >= nominal * 0.95 for took, nominal in exchanges), exchanges
    assert statistics.median(took / nominal for took, nominal in exchanges) <= 3, exchanges


@needs_netns
@pytest.mark.usefixtures("ctrl_c")  # SIGINT reaches the supervisor as from a terminal
@pytest.mark.parametrize("signal_number", [signal.SIGTERM, signal.SIGINT])
def test_interrupted_run_removes_its_namespaces(tmp_path: Path,
                                                signal_number: signal.Signals) -> None:
    before = _host_network()
    supervisor = _supervisor(_recipe(tmp_path, time_s=60), tmp_path / "logs")
    deadline = time.monotonic() + 180
    while not list((tmp_path / "logs").glob("kernel/*/bsp/worker-1.log")) and \
            supervisor.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(_of(supervisor.pid)) == 4
    supervisor.send_signal(signal_number)  # SIGINT: what Ctrl-C sends
    assert supervisor.wait(timeout=120) == 130
    assert _of(supervisor.pid) == []
    assert _host_network() == before
