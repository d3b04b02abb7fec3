"""Heterogeneity keys a run would ignore are refused when the recipe is loaded, naming the
key: each case below was accepted and had no effect (the step times, bytes or links were
those of a recipe without it)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from asyncsync.schema import ConfigError
from asyncsync.study.recipe import load_recipe


def recipe(tmp_path: Path, body: str, protocol: str = "bsp") -> Path:
    path = tmp_path / "r.toml"
    path.write_text(f"[defaults]\nworkers = 4\nclock = \"virtual\"\n{body}\n"
                    f"[[runs]]\nname = \"a\"\nprotocol = \"{protocol}\"\n")
    return path


@pytest.mark.parametrize(("body", "protocol", "message"), [
    ("[defaults.network]\nlatency_ms = 20\nloss_pct = [1, 1, 1, 1, 5]", "bsp",
     "network.loss_pct: 5 entries for 4 workers: entries past worker 3 would be ignored"),
    ("[defaults.compute]\nflops_per_s = 1e9\nefficiency = 0.5", "bsp",
     "compute.efficiency: it scales a named device's peak"),
    ("[defaults.compute]\nbase_step_s = 0.01\nefficiency = 0.5", "bsp",
     "compute.efficiency: it scales a named device's peak"),
    ("[defaults.compute]\nflops_per_sample = 1e9", "bsp",
     "compute.flops_per_sample: only the timing model declares its FLOPs"),
    ("[defaults.network]\ncompression = \"int8\"", "fedasync",
     "network.compression: fedasync pushes only model, which travel as float32"),
    ("[defaults.compute]\nprofile = { name = \"periodic\", worker = 4 }", "bsp",
     "compute.profile.worker: 4 is not a rank of this run's 4 workers (0..3)"),
    ("[defaults.network]\nerror_feedback = false", "bsp",
     "error_feedback is only used with a lossy compression (compression is 'none')"),
])
def test_an_ignored_key_is_refused(tmp_path: Path, body: str, protocol: str,
                                   message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_recipe(recipe(tmp_path, body, protocol))


@pytest.mark.parametrize(("body", "protocol"), [
    ("[defaults.network]\nlatency_ms = 20\nloss_pct = [1, 1, 1, 5]", "bsp"),
    ("[defaults.compute]\nflops_per_s = [1e9, 0, 1e9, 1e9]\nefficiency = 0.5", "bsp"),
    ("[defaults.compute]\ndevice = \"t4\"\nefficiency = 0.5", "bsp"),
    ("[defaults.network]\ncompression = \"int8\"", "nbsync"),
    ("[defaults.compute]\nprofile = { name = \"periodic\", worker = 3 }", "bsp"),
    ("[defaults.network]\ncompression = \"float16\"\nerror_feedback = false", "bsp"),
])
def test_the_same_keys_where_they_apply_are_accepted(tmp_path: Path, body: str,
                                                     protocol: str) -> None:
    assert len(load_recipe(recipe(tmp_path, body, protocol)).runs) == 1
