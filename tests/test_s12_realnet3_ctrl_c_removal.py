"""A second Ctrl-C while a kernel-shaped run removes its namespaces does not leave some
of them behind.

A user pressing Ctrl-C again while an interrupted run was cleaning up (seen by hand: a
burst of SIGINTs to the supervisor's process group) found three of the run's four
namespaces still there, one with its server in it: the KeyboardInterrupt of the second
Ctrl-C stopped `RunNetwork.remove` after its first ``ip netns del``. Now the Ctrl-C takes
effect once the last namespace is gone. No root needed: ip and tc are recorded, not run.
"""

from __future__ import annotations

import signal

import pytest

from asyncsync.study import netns
from asyncsync.study.hetero_specs import NetworkSpec


def test_ctrl_c_during_removal_takes_effect_after_the_last_namespace(
        monkeypatch: pytest.MonkeyPatch) -> None:
    deleted: list[str] = []

    def record(*args: str) -> str:
        if args[:3] == ("ip", "netns", "del"):
            deleted.append(args[3])
            if len(deleted) == 1:
                signal.raise_signal(signal.SIGINT)  # Ctrl-C as the first one goes
        return ""

    monkeypatch.setattr(netns, "_run", record)
    monkeypatch.setattr(netns, "clean_stale", list)  # (not the host's leftovers)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        network = netns.RunNetwork(NetworkSpec(bandwidth_mbps=10, emulation="kernel"), 2)
        network.create()
        made = [network.namespace(role) for role in ("br", "server", "w0", "w1")]
        with pytest.raises(KeyboardInterrupt):
            network.remove()
        assert sorted(deleted) == sorted(made)  # all four, then the KeyboardInterrupt
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, previous)
