"""An ``ip`` command killed by Ctrl-C while it was being started (before it left the
terminal's process group, so before it ran) is started again, instead of failing the run
with ``ip ...: -2`` (seen in a CI rehearsal of tests/test_s10_net_interrupt_create.py)."""

from __future__ import annotations

import signal
import subprocess
from typing import Any

import pytest

from asyncsync.study import netns


def test_a_command_killed_by_sigint_as_it_started_is_run_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[list[str]] = []
    codes = iter([-signal.SIGINT, 0])

    def run(command: list[str], **options: Any) -> subprocess.CompletedProcess[str]:
        calls.append(command)
        assert options["process_group"] == 0
        return subprocess.CompletedProcess(command, next(codes), "made\n", "")

    monkeypatch.setattr(netns.subprocess, "run", run)
    assert netns._run("ip", "netns", "add", "x") == "made\n"
    assert len(calls) == 2 and calls[0] == calls[1]


def test_a_command_that_fails_otherwise_is_an_error_naming_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def run(command: list[str], **options: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(command, 1, "", "File exists")

    monkeypatch.setattr(netns.subprocess, "run", run)
    with pytest.raises(netns.NetnsError, match="ip netns add x: File exists"):
        netns._run("ip", "netns", "add", "x")
