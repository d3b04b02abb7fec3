"""A recipe's numbers and a link's delays are finite: TOML's ``inf`` and ``nan`` are refused.

``network.latency_ms = inf`` used to pass `check`, and its virtual run of a 5 s budget
never ended: a request waited forever on a one-way delay.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from asyncsync.hetero.network import LinkSpec, ServerLink
from asyncsync.schema import ConfigError
from asyncsync.study.recipe import load_recipe

RECIPE = """
[defaults]
workers = 2
clock = "virtual"
[[runs]]
name = "a"
protocol = "bsp"
"""


@pytest.mark.parametrize("assignment", [
    "network.latency_ms=inf", "network.jitter_ms=inf", "network.bandwidth_mbps=inf",
    "network.server_mbps=inf", "compute.slowdown=[1, inf]", "compute.base_step_s=inf",
    "stop.time_s=inf", "optim.lr=inf", "stop.patience_s=inf", "model.size_mb=inf",
])
def test_a_recipe_number_that_is_not_finite_is_refused_by_key(tmp_path: Path,
                                                               assignment: str) -> None:
    path = tmp_path / "r.toml"
    path.write_text(RECIPE)
    key = assignment.split("=")[0].split(".")[-1]
    with pytest.raises(ConfigError, match=rf"r\.toml: .*{key}\S*: must be a finite number"):
        load_recipe(path, [assignment])


@pytest.mark.parametrize("field", ["uplink_mbps", "downlink_mbps", "latency_ms", "jitter_ms"])
@pytest.mark.parametrize("value", [math.inf, math.nan])
def test_a_link_with_a_value_that_is_not_finite_is_refused(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=f"{field} must be a finite number >= 0"):
        LinkSpec(**{field: value})


@pytest.mark.parametrize("value", [math.inf, math.nan])
def test_a_server_link_or_loss_that_is_not_finite_is_refused(value: float) -> None:
    with pytest.raises(ValueError, match="server_mbps must be a finite number >= 0"):
        ServerLink(value)
    with pytest.raises(ValueError, match=r"loss_pct must be in \[0, 100\)"):
        LinkSpec(loss_pct=value)
