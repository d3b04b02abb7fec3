"""bench/triangle.py on a host where kernel shaping cannot run says why it skips the
wire-time transfer and goes on with the other ways.

Run as root in a user namespace (``unshare -r``, an unprivileged container) it ended in a
traceback, ``NetnsError: ip netns add ...: mount --make-shared /run/netns failed``: it
tried the transfer whenever the user was root, without the host check the kernel way
itself gets.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from asyncsync.schema import ConfigError

TRIANGLE = Path(__file__).parents[1] / "bench" / "triangle.py"
USERNS = ("network.emulation = \"kernel\": this host cannot create network namespaces: it "
          "needs root with CAP_SYS_ADMIN")


def _triangle() -> ModuleType:
    spec = importlib.util.spec_from_file_location("triangle", TRIANGLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_root_without_namespaces_skips_the_transfer_saying_why(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    triangle = _triangle()
    tabled: list[list[str]] = []

    def cannot(netem: bool) -> None:
        raise ConfigError(USERNS)

    def create() -> None:
        raise triangle.netns.NetnsError("ip netns add x: mount --make-shared /run/netns "
                                        "failed: Operation not permitted")

    monkeypatch.setattr(triangle.netns, "missing", lambda: None)  # root, as in the namespace
    monkeypatch.setattr(triangle.netns, "check_host", cannot)
    monkeypatch.setattr(triangle.netns.RunNetwork, "create", lambda self: create())
    monkeypatch.setattr(triangle, "tables", lambda args, logs, run: tabled.append(args.only))
    monkeypatch.setattr(sys, "argv", ["triangle.py", "--only", "wan_loss"])
    triangle.main()
    assert f"no wire-time transfer: {USERNS}" in capsys.readouterr().out
    assert tabled == [["wan_loss"]]  # the ways still run
