"""A node of a kernel-shaped recipe (``network.emulation = "kernel"``) started by hand
(`asyncsync server`, `worker`, `launch`) is refused with one ``error:`` line: only
`asyncsync run` shapes the links (its nodes run in tc-shaped namespaces, and get
`SHAPED_ENV`); by hand the run went ahead unshaped, its rates silently ignored."""

from __future__ import annotations

from pathlib import Path

import pytest

from asyncsync.study.netns import SHAPED_ENV
from asyncsync.study.nodes import node_env
from tests.test_cli import one_error, run_main

RECIPE = """
[defaults]
workers = 2
[defaults.stop]
time_s = 600
[defaults.model]
name = "mlp"
[defaults.network]
emulation = "kernel"
bandwidth_mbps = 5
[[runs]]
name = "shaped"
protocol = "asp"
"""


@pytest.mark.parametrize("command", [
    ["server", "--port", "0"],
    ["worker", "--server", "http://127.0.0.1:9", "--rank", "0"],
])
def test_a_hand_started_node_of_a_kernel_shaped_run_is_refused(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        command: list[str]) -> None:
    monkeypatch.delenv(SHAPED_ENV, raising=False)
    recipe = tmp_path / "shaped.toml"
    recipe.write_text(RECIPE)
    line = one_error(run_main(capsys, command[0], "--recipe", str(recipe), *command[1:]))
    assert "network.emulation = \"kernel\"" in line and "asyncsync run" in line
    assert f"a {command[0]} started by hand" in line


def test_the_nodes_of_a_kernel_shaped_run_are_marked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SHAPED_ENV, "1")  # inherited from elsewhere: not passed on unasked
    assert SHAPED_ENV not in node_env("secret", server=True)
    assert node_env("secret", server=False, shaped=True)[SHAPED_ENV] == "1"
