"""FedAvg's local epochs in recipes: the recipe on the fedavg page runs end to end in
virtual time, and batched worker math gives the one-by-one result within the cohort tests'
bound, though clients run unequal step counts and short last batches."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import pytest

from asyncsync.protocols import fedavg
from asyncsync.schema import ConfigError
from asyncsync.study.assembly import run_data, run_shards
from asyncsync.study.recipe import load_recipe
from asyncsync.study.simulation import simulate
from tests.test_cohort import assert_logs_agree


def page_recipe() -> str:
    """The recipe shown on the fedavg page (the module docstring the page is made from)."""
    assert fedavg.__doc__ is not None
    found = re.search(r"```toml\n(.*?)```", fedavg.__doc__, re.S)
    assert found, "the fedavg page shows no recipe"
    return found.group(1)


def _records(path: Path, event: str) -> list[dict[str, Any]]:
    return [r for r in map(json.loads, path.read_text().splitlines()) if r["event"] == event]


def test_the_page_recipe_runs_each_client_through_its_shard_once_a_round(
        tmp_path: Path) -> None:
    recipe = tmp_path / "fedavg_epochs.toml"
    recipe.write_text(page_recipe())
    spec = load_recipe(recipe).run("fedavg_e1")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    simulate(spec, run_dir, "fedavg_epochs/fedavg_e1")
    data = run_data(spec)
    sizes = [len(shard) for shard in run_shards(spec, data)]
    assert sum(sizes) == len(data.train_y) and len(set(sizes)) == len(sizes)  # unequal
    batch = spec.data.batch_size
    rounds = []
    for rank, n in enumerate(sizes):
        computed = [(r["steps"], r["samples"])
                    for r in _records(run_dir / f"worker-{rank}.jsonl", "compute")]
        one_round = [(count, count * size) for count, size in ((n // batch, batch),
                                                                (1, n % batch)) if size]
        whole = len(computed) // len(one_round)
        assert whole >= 1, (rank, computed)
        # round after round: one epoch over the shard, ceil(n / B) steps, the last short
        assert computed == (one_round * (whole + 1))[: len(computed)], rank
        assert sum(steps for steps, _ in one_round) == math.ceil(n / batch)
        rounds.append(whole)
    assert min(rounds) >= 2
    evals = _records(run_dir / "events.jsonl", "eval")
    assert evals and max(e["accuracy"] for e in evals) > 0.3, evals  # it learns (chance 0.1)


def test_a_recipe_with_both_step_keys_or_a_bad_epoch_count_names_the_key(
        tmp_path: Path) -> None:
    text = page_recipe()
    cases = {"local_epochs = 1,": ("local_epochs = -1,", r"local_epochs: must be >= 0"),
             "fraction = 0.5": ("fraction = 0.5, local_steps = 3",
                                r"local_steps: not used with local_epochs")}
    for old, (new, message) in cases.items():
        recipe = tmp_path / "bad.toml"
        recipe.write_text(text.replace(old, new))
        with pytest.raises(ConfigError, match=rf"protocol.*{message}"):
            load_recipe(recipe).run("fedavg_e1")


RECIPE = """
name = "epochs_cohort"
[defaults]
workers = 3
clock = "virtual"
[defaults.stop]
time_s = 1.5
[defaults.data]
partition = "quantity_skew"
batch_size = 150
[defaults.optim]
lr = 0.05
momentum = 0.9
[defaults.compute]
base_step_s = 0.01
slowdown = [1, 2, 3]
batched = "BATCHED"
[defaults.eval]
interval_s = 0.5
[defaults.network]
bandwidth_mbps = 100
latency_ms = 5
jitter_ms = 2
[[runs]]
name = "mlp"
protocol = { name = "fedavg", local_epochs = 1 }
model = { name = "mlp", options = { hidden = 16 } }
[[runs]]
name = "bn_cnn"
protocol = { name = "fedavg", local_epochs = 1, fraction = 0.67 }
model = { name = "tests.helpers:tiny_bn_cnn" }
"""


def _batched_run(tmp_path: Path, name: str, batched: str) -> tuple[Path, dict[str, Any]]:
    recipe = tmp_path / f"{batched}.toml"
    recipe.write_text(RECIPE.replace("BATCHED", batched))
    run_dir = tmp_path / batched
    run_dir.mkdir()
    return run_dir, simulate(load_recipe(recipe).run(name), run_dir, f"epochs/{name}")


@pytest.mark.parametrize("name", ["mlp", "bn_cnn"])
def test_batched_worker_math_equals_one_by_one_within_the_cohort_bound(
        tmp_path: Path, name: str) -> None:
    """Unequal shards: unequal step counts and a short last batch per round, padded into a
    shared call (the mlp) or called apart (BatchNorm); every logged value agrees, the math
    within the bound of tests/test_cohort.py, all else to the bit."""
    on_dir, on = _batched_run(tmp_path, name, "on")
    off_dir, off = _batched_run(tmp_path, name, "off")
    assert on["worker_math"] == "batched" and off["worker_math"] == "one-by-one"
    assert on["batched_steps"] > on["batched_calls"] > 0  # steps shared calls
    records = assert_logs_agree(on_dir, off_dir)
    short_batches = sum(r["event"] == "compute" and r["samples"] < 150 for r in records)
    assert short_batches > 3
