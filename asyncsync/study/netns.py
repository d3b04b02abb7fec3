"""The network namespaces of a kernel-shaped real run (``network.emulation = "kernel"``).

The server and each worker get a namespace of their own, joined by veth pairs to a bridge
in one more namespace; addresses come from 198.18.0.0/15, the range set aside for
benchmarking (RFC 2544). Links are shaped by tc qdiscs on the egress of both ends of each
pair: a worker's uplink on its own end, its downlink on the bridge's end, and
``server_mbps`` on both ends of the server's pair (pushes in, replies out). Rate is a
``tbf``; delay, jitter and loss a ``netem`` above it (the kernel needs
CONFIG_NET_SCH_NETEM for those). The node namespaces use CUBIC, a loss-based congestion
control, whatever the host's default (the virtual clock's loss model assumes one); it is
set on their one route, as the host may allow only its default for ``sysctl``.

Every name is ``asyncsync-<tag>-<pid>-<start>-<role>`` (namespaces) or
``as<tag>-<role>`` (interfaces, inside those namespaces), with a random tag per run and
the supervisor's pid and start time (`owner`): nothing is created in the host's namespace,
`RunNetwork.remove` deletes it all, and `clean_stale` removes the set of a supervisor that
no longer runs (killed by SIGKILL). A pid alone would not tell: the kernel hands a killed
supervisor's pid to later processes, and one of them would keep its namespaces (and the
nodes still running there) alive; the pid with the start time names one process per boot
(and /run/netns, a tmpfs, starts empty at boot).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import ipaddress
import os
import re
import secrets
import shutil
import signal
import subprocess
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TypeVar

from asyncsync.hetero.network import Links, TracedLinks, kernel_rate_problem
from asyncsync.schema import ConfigError
from asyncsync.study.hetero_specs import NetworkSpec
from asyncsync.study.specs import RunSpec

SHAPED_ENV = "ASYNCSYNC_KERNEL_SHAPED"
"""Set (to 1) in the environment of the nodes a kernel-shaped run starts in its namespaces:
a node of a kernel-shaped recipe without it was started by hand, and nothing shapes it."""
NETNS_DIR = Path("/run/netns")
PREFIX = "asyncsync-"
STALE = re.compile(r"^asyncsync-[0-9a-f]{6}-(\d+)-(?:(\d+)-)?[a-z]")
"""A run's namespace: its supervisor's pid and start time (no start time: named by an
earlier asyncsync, judged by the pid alone)."""
ADDRESSES = ipaddress.IPv4Network("198.18.0.0/15")
CONGESTION_CONTROL = "cubic"
MAX_WORKERS = 9999
"""Interface names have at most 15 characters: ``as<tag>-w<rank>b``."""
CLONE_NEWNET = 0x40000000
QUEUE_S = 0.1
"""How much traffic a shaped link's queue holds, in seconds at its rate (64 KiB at least)."""
TC_MAX_BYTES = 2**32 - 1
"""tc takes a tbf's queue limit in a 32-bit count of bytes."""

T = TypeVar("T")


class NetnsError(RuntimeError):
    """An ``ip`` or ``tc`` command failed."""


def tool(name: str) -> str | None:
    """The path of `name` (``ip``, ``tc``), also where PATH lacks the sbin folders."""
    found = shutil.which(name)
    for folder in ("/usr/sbin", "/sbin"):
        if found is None and os.access(f"{folder}/{name}", os.X_OK):
            found = f"{folder}/{name}"
    return found


def _run(*args: str) -> str:
    """Run an ``ip`` or ``tc`` command; its stdout. It runs in a process group of its own:
    Ctrl-C goes to the terminal's whole group, and a command it killed halfway would fail
    the run instead of the supervisor interrupting it (and removing what was made).

    A Ctrl-C that lands while the command is being started, before it leaves the
    terminal's group, still kills it, before it runs (the child unblocks signals with their
    default handling before its `setpgid`; seen in a CI rehearsal). Such a
    command did nothing, so it is started again; the supervisor's own Ctrl-C stops the run
    once the namespaces are made."""
    command = [tool(args[0]) or args[0], *args[1:]]
    for _ in range(2):  # (a second start only after a Ctrl-C that killed the first)
        done = subprocess.run(command, capture_output=True, text=True, check=False,
                              process_group=0)
        if done.returncode != -signal.SIGINT:
            break
    if done.returncode != 0:
        raise NetnsError(f"{' '.join(args)}: {done.stderr.strip() or done.returncode}")
    return done.stdout


def missing() -> str | None:
    """What this host lacks to run kernel-shaped runs (None: nothing)."""
    if os.geteuid() != 0:
        return "network.emulation = \"kernel\" needs root (network namespaces and tc)"
    lacking = [name for name in ("ip", "tc") if tool(name) is None]
    if lacking:
        return (f"network.emulation = \"kernel\" needs {' and '.join(lacking)} "
                "(package iproute2)")
    return None


def needs_netem(network: NetworkSpec, workers: int) -> bool:
    """Whether any link has delay, jitter or loss (a netem qdisc)."""
    return any(link.latency_ms or link.jitter_ms or link.loss_pct
               for link in map(network.link, range(workers)))


CAPABLE_ROOT = "root with CAP_SYS_ADMIN (root in a user namespace, as in an unprivileged " \
    "container, has not)"
PROBES = (
    ("create network namespaces", CAPABLE_ROOT, ("ip", "netns", "add", "{ns}")),
    ("create veth pairs", "a kernel with veth (CONFIG_VETH) and CAP_NET_ADMIN",
     ("ip", "-n", "{ns}", "link", "add", "p0", "type", "veth", "peer", "name", "p1")),
    ("create bridges", "a kernel with bridges (CONFIG_BRIDGE)",
     ("ip", "-n", "{ns}", "link", "add", "p2", "type", "bridge")),
    ("shape rates", "the tbf qdisc (CONFIG_NET_SCH_TBF)",
     ("tc", "-n", "{ns}", "qdisc", "add", "dev", "p0", "root", "tbf", "rate", "1mbit",
      "burst", "16384", "limit", "65536")),
)
"""What every kernel-shaped run needs of the host: what fails without it, what that
takes, and a command that tries it in a probe namespace."""
NETEM_PROBE = ("shape delay, jitter or loss", "the netem qdisc (CONFIG_NET_SCH_NETEM)",
               ("tc", "-n", "{ns}", "qdisc", "add", "dev", "p1", "root", "netem", "delay",
                "1ms"))


def check_host(netem: bool) -> None:
    """Raise ConfigError naming what kernel shaping lacks here (root, ip, tc, namespaces,
    veth, bridge, tbf; netem if `netem`), each tried in a probe namespace that is removed;
    removes stale namespaces of killed runs on the way."""
    problem = missing()
    if problem:
        raise ConfigError(problem)
    probe = f"{PREFIX}{secrets.token_hex(3)}-{owner()}-probe"
    try:
        _try("remove the namespaces of killed runs", CAPABLE_ROOT, clean_stale)
        for step, needs, command in (*PROBES, *([NETEM_PROBE] if netem else [])):
            _try(step, needs,
                 functools.partial(_run, *(part.format(ns=probe) for part in command)))
    finally:
        with contextlib.suppress(NetnsError):
            _delete(probe)


def _try(step: str, needs: str, action: Callable[[], object]) -> None:
    """`action()`; its NetnsError as a ConfigError: the host cannot `step`, it `needs`."""
    try:
        action()
    except NetnsError as exc:
        raise ConfigError(f"network.emulation = \"kernel\": this host cannot {step}: it "
                          f"needs {needs} ({exc})") from None


def preflight(runs: Iterable[RunSpec]) -> None:
    """For the kernel-shaped runs among `runs` (nothing if there are none): refuse a rate
    a tbf cannot shape, then `check_host`.

    Raises:
        ConfigError: naming the run and key, or what the host lacks.
    """
    kernel = [run for run in runs if run.network.emulation == "kernel"]
    for run in kernel:
        problem = kernel_rate_problem(run_links(run), run.workers)
        if problem:
            raise ConfigError(f"run {run.name}: {problem}")
    if kernel:
        check_host(any(needs_netem(run.network, run.workers) for run in kernel))


def run_links(run: RunSpec) -> Links:
    """The links kernel shaping gives run `run`: its network keys, with its capacity
    trace's bandwidths in place of the rates where it has one (as app pacing takes them,
    `asyncsync.study.assembly.worker_link`)."""
    rows = run.population().capacity
    return run.network if rows is None else TracedLinks(run.network, run.capacity.trace, rows)


def run_namespaces() -> list[str]:
    """The names of every asyncsync namespace on this host."""
    if not NETNS_DIR.is_dir():
        return []
    return sorted(p.name for p in NETNS_DIR.iterdir() if p.name.startswith(PREFIX))


def started(pid: int) -> int | None:
    """When process `pid` started, in clock ticks after boot (``/proc/<pid>/stat``, field
    22); None if no process has that pid, or it has exited (a zombie not yet reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()  # after the command's name, from field 3
    return None if fields[0] in ("Z", "X") else int(fields[19])


def owner() -> str:
    """``<pid>-<start>`` of this process: whose namespaces a run's are (see `clean_stale`)."""
    return f"{os.getpid()}-{started(os.getpid())}"


def _running(pid: str, start: str | None) -> bool:
    """Whether the supervisor `pid` that started at `start` (None: any) still runs."""
    now_started = started(int(pid))
    return now_started is not None and (start is None or now_started == int(start))


def clean_stale() -> list[str]:
    """Remove the namespaces (and the processes, veths, bridge and qdiscs in them) of
    supervisors that no longer run, by pid and start time; returns their names."""
    stale = [name for name in run_namespaces()
             if (match := STALE.match(name)) and not _running(*match.groups())]
    for name in stale:
        _delete(name)
    return stale


def _delete(namespace: str) -> None:
    """End the processes left in `namespace`, then delete it (and what lives in it)."""
    try:
        pids = [int(pid) for pid in _run("ip", "netns", "pids", namespace).split()]
    except NetnsError:
        pids = []
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    try:
        _run("ip", "netns", "del", namespace)
    except NetnsError:
        if (NETNS_DIR / namespace).exists():
            raise


def _enter(namespace: str) -> None:
    """Move the calling thread into `namespace` (only this thread: setns(2))."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(NETNS_DIR / namespace, os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            error = ctypes.get_errno()
            raise OSError(error, f"setns {namespace}: {os.strerror(error)}")
    finally:
        os.close(fd)


def call_in(namespace: str, function: Callable[[], T]) -> T:
    """`function()` in a thread of its own inside `namespace` (its sockets live there)."""
    result: list[T] = []
    failure: list[BaseException] = []

    def target() -> None:
        try:
            _enter(namespace)
            result.append(function())
        except BaseException as exc:  # handed to the caller's thread
            failure.append(exc)

    thread = threading.Thread(target=target, name=f"netns-{namespace}")
    thread.start()
    thread.join()
    if failure:
        raise failure[0]
    return result[0]


class RunNetwork:
    """The namespaces of one run: ``server``, ``w0`` ... and the bridge's ``br``.

    Args:
        network: the run's links (its network keys, per-worker lists as in app pacing;
            `of` adds a capacity trace's rates).
        workers: how many workers.
    """

    def __init__(self, network: Links, workers: int) -> None:
        if not 0 < workers <= MAX_WORKERS:
            raise ValueError(f"kernel shaping takes 1 to {MAX_WORKERS} workers, got {workers}")
        problem = kernel_rate_problem(network, workers)
        if problem:
            raise ValueError(problem)
        self.network = network
        self.workers = workers
        self.tag = secrets.token_hex(3)
        self.owner = owner()
        self.created: list[str] = []

    @classmethod
    def of(cls, run: RunSpec) -> RunNetwork:
        """The namespaces of run `run`, shaped as `run_links` gives its links."""
        return cls(run_links(run), run.workers)

    def namespace(self, role: str) -> str:
        """The namespace of `role` (``server``, ``w<rank>`` or ``br``)."""
        return f"{PREFIX}{self.tag}-{self.owner}-{role}"

    def address(self, role: str) -> str:
        """The address of node `role` (``server`` or ``w<rank>``)."""
        index = 1 if role == "server" else int(role.removeprefix("w")) + 2
        return str(ADDRESSES[index])

    def command(self, role: str) -> list[str]:
        """The prefix that runs a command in `role`'s namespace."""
        return [tool("ip") or "ip", "netns", "exec", self.namespace(role)]

    def create(self) -> None:
        """Namespaces, bridge, veth pairs, addresses and qdiscs; all removed on failure."""
        clean_stale()
        try:
            bridge_ns, bridge = self._add("br"), f"as{self.tag}-br"
            _run("ip", "-n", bridge_ns, "link", "add", bridge, "type", "bridge")
            _run("ip", "-n", bridge_ns, "link", "set", bridge, "up")
            roles = ["server", *(f"w{rank}" for rank in range(self.workers))]
            for role in roles:
                self._join(role, bridge_ns, bridge)
            self._shape()
        except BaseException:
            self.remove()
            raise

    def _add(self, role: str) -> str:
        name = self.namespace(role)
        self.created.append(name)  # (first: a Ctrl-C just after `add` would leave it)
        _run("ip", "netns", "add", name)
        return name

    def _join(self, role: str, bridge_ns: str, bridge: str) -> None:
        """`role`'s namespace, its veth pair to the bridge and its address."""
        node_ns, end = self._add(role), self.interface(role)
        _run("ip", "link", "add", "name", end, "netns", node_ns, "type", "veth",
             "peer", "name", f"{end}b", "netns", bridge_ns)
        _run("ip", "-n", bridge_ns, "link", "set", f"{end}b", "master", bridge, "up")
        _run("ip", "-n", node_ns, "addr", "add", f"{self.address(role)}/{ADDRESSES.prefixlen}",
             "dev", end)
        _run("ip", "-n", node_ns, "link", "set", end, "up")
        _run("ip", "-n", node_ns, "link", "set", "lo", "up")
        _run("ip", "-n", node_ns, "route", "replace", str(ADDRESSES), "dev", end, "scope",
             "link", "src", self.address(role), "congctl", CONGESTION_CONTROL)

    def interface(self, role: str) -> str:
        """The node end of `role`'s veth pair (the bridge's end adds ``b``)."""
        return f"as{self.tag}-{'s' if role == 'server' else role}"

    def _shape(self) -> None:
        bridge_ns = self.namespace("br")
        server = self.network.server_mbps
        if server:
            _shape(self.namespace("server"), self.interface("server"), server)
            _shape(bridge_ns, f"{self.interface('server')}b", server)
        for rank in range(self.workers):
            link, role = self.network.link(rank), f"w{rank}"
            delays = (link.latency_ms, link.jitter_ms, link.loss_pct)
            _shape(self.namespace(role), self.interface(role), link.uplink_mbps, *delays)
            _shape(bridge_ns, f"{self.interface(role)}b", link.downlink_mbps, *delays)

    def remove(self) -> None:
        """Delete the run's namespaces with everything in them (processes are killed);
        one that will not go does not keep the others (its error is raised after). A
        Ctrl-C meanwhile (a user pressing it again) takes effect once all are gone."""
        failures: list[NetnsError] = []
        with _ctrl_c_held():
            for namespace in reversed(self.created):
                try:
                    _delete(namespace)
                except NetnsError as exc:
                    failures.append(exc)
            self.created.clear()
        if failures:
            raise failures[0]


@contextlib.contextmanager
def _ctrl_c_held() -> Iterator[None]:
    """Hold back SIGINT while the body runs (in the main thread, where its handler runs)
    and raise it again after, for the handler it had."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is None:  # (None: set outside Python)
        yield
        return
    came: list[int] = []
    handler = signal.signal(signal.SIGINT, lambda number, _: came.append(number))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, handler)
        if came:
            signal.raise_signal(signal.SIGINT)


def _shape(namespace: str, device: str, mbps: float, delay_ms: float = 0.0,
           jitter_ms: float = 0.0, loss_pct: float = 0.0) -> None:
    """Shape `device`'s egress: netem for delay (uniform in [delay, delay + jitter]) and
    loss, a tbf below it for the rate (nothing for what is 0)."""
    qdisc = ["tc", "-n", namespace, "qdisc", "add", "dev", device]
    parent = ["root"]
    if delay_ms or jitter_ms or loss_pct:
        netem = ["netem", "limit", "100000"]
        if delay_ms or jitter_ms:
            netem += ["delay", f"{delay_ms + jitter_ms / 2:g}ms"]
            netem += [f"{jitter_ms / 2:g}ms"] if jitter_ms else []
        if loss_pct:
            netem += ["loss", f"{loss_pct:g}%"]
        _run(*qdisc, "root", "handle", "1:", *netem)
        parent = ["parent", "1:1"]
    if mbps:
        rate_bytes = mbps * 1e6 / 8
        queue = min(TC_MAX_BYTES,
                    max(65536, round(rate_bytes * (QUEUE_S + 2 * delay_ms / 1000))))
        burst = max(16384, round(rate_bytes * 0.002))
        _run(*qdisc, *parent, "handle", "2:", "tbf", "rate", f"{mbps:g}mbit",
             "burst", str(burst), "limit", str(queue))
