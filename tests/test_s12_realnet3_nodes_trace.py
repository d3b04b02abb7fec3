"""A kernel-shaped run's nodes get their capacity trace's rates (nodes.run_nodes builds
its namespaces with `RunNetwork.of`; it passed the network keys alone, so a traced run had
no qdisc). Applied with realnet3's nodes.py change; seen failing before it."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from asyncsync.study import netns, nodes
from asyncsync.study.recipe import load_recipe
from tests.test_s12_realnet3_capacity_trace import TRACE, _recipe


def test_a_kernel_shaped_run_shapes_its_trace(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    commands: list[tuple[str, ...]] = []

    def record(*args: str) -> str:
        commands.append(args)
        return ""

    async def no_nodes(*args: Any) -> None:
        return None

    monkeypatch.setattr(netns, "_run", record)
    monkeypatch.setattr(netns, "clean_stale", list)
    monkeypatch.setattr(nodes, "_run_nodes", no_nodes)
    spec = load_recipe(_recipe(tmp_path, TRACE)).runs[0]
    asyncio.run(nodes.run_nodes(spec, "traced", tmp_path, lambda status: None))
    rates = sorted(c[c.index("rate") + 1] for c in commands if "tbf" in c)
    assert rates == sorted(["50mbit", "50mbit", *(f"{r:g}mbit" for _, up, down in TRACE
                                                  for r in (up, down))])
