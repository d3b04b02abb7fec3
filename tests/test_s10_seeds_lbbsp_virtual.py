"""LB-BSP in virtual time: under static slowdowns 1 : 2 : 4 the batches settle at
X * (4, 2, 1) / 7 and every worker's step then takes the same time, exactly.

A step of x samples at slowdown f costs ``base_step_s * x / batch_size * f`` on the virtual
clock, so the balanced sizes x_i = X v_i / sum v_j (v_i = 1 / f_i) all finish in
``base_step_s * X / (batch_size * sum_j 1 / f_j)``: the expected values below are that
closed form, independent of the protocol's code.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from asyncsync.protocols.lbbsp import LbbspParams
from asyncsync.runlog.reading import read_jsonl
from asyncsync.runlog.schema import KEY, Kind
from asyncsync.study.recipe import load_recipe
from asyncsync.study.simulation import simulate

RECIPE = """
name = "lbbsp-balance"
[defaults]
workers = 3
clock = "virtual"
[defaults.model]
name = "timing"
size_mb = 0.01
[defaults.data]
batch_size = {batch_size}
[defaults.compute]
base_step_s = {base_step_s}
slowdown = [1, 2, 4]
[defaults.stop]
time_s = 3
[[runs]]
name = "lbbsp"
protocol = {{ name = "lbbsp", global_batch = 112 }}
"""


def lbbsp_steps(tmp_path: Path, batch_size: int) -> tuple[list[list[tuple[int, float]]], int]:
    """Each worker's steps as (samples, seconds), and how many requests were refused."""
    path = tmp_path / "recipe.toml"
    # a step of `batch_size` samples costs batch_size ms at slowdown 1: a sample, 1 ms
    path.write_text(RECIPE.format(batch_size=batch_size, base_step_s=batch_size / 1000))
    spec = load_recipe(path).run("lbbsp")
    run_dir = tmp_path / "lbbsp"
    run_dir.mkdir()
    (run_dir / "recipe.json").write_text(json.dumps(
        {"name": "lbbsp-balance", "baseline": "lbbsp", "runs": [spec.as_table()]}))
    simulate(spec, run_dir, "lbbsp-balance/lbbsp")
    steps, refused = [], 0
    for rank in range(3):
        log = read_jsonl(run_dir / f"worker-{rank}.jsonl")
        steps.append([(r["samples"], r["dur"]) for r in log if r[KEY] == Kind.COMPUTE])
        refused += sum(1 for r in log if r[KEY] == Kind.REFUSED)
    return steps, refused


def check_balanced(steps: list[list[tuple[int, float]]]) -> None:
    """Equal shares of X = 112 first (38, 37, 37: the slowest takes about 4x as long),
    then 64 : 32 : 16, every step 64 ms: 112 samples / (1 + 1/2 + 1/4) per sample-ms."""
    assert [worker[0][0] for worker in steps] == [38, 37, 37]
    for worker, factor in enumerate([1, 2, 4]):  # a sample costs `factor` ms
        assert all(seconds == pytest.approx(samples * factor / 1000)
                   for samples, seconds in steps[worker])
    settled = [worker[2:] for worker in steps]
    assert min(len(s) for s in settled) >= 30
    for worker, size in enumerate([64, 32, 16]):
        assert all(samples == size for samples, _ in settled[worker]), settled[worker][:5]
        assert all(seconds == pytest.approx(0.064) for _, seconds in settled[worker])


def test_static_slowdowns_settle_at_equal_finish_times(tmp_path: Path) -> None:
    steps, refused = lbbsp_steps(tmp_path, batch_size=48)  # X = 112 <= 3 x 48
    assert refused == 0
    check_balanced(steps)


def test_a_global_batch_above_workers_times_batch_size_is_accepted(tmp_path: Path) -> None:
    """global_batch = 112 with batch_size 16: the engine's max_batch was 3 x 16 = 48, so
    the balanced 64-sample step was refused and the worker re-synced, again and again."""
    steps, refused = lbbsp_steps(tmp_path, batch_size=16)
    assert refused == 0
    check_balanced(steps)


def test_largest_batch_is_the_global_batch_within_the_bounds() -> None:
    assert LbbspParams(global_batch=112).largest_batch(3, 16) == 112
    assert LbbspParams(global_batch=112, max_batch=50).largest_batch(3, 16) == 50
    assert LbbspParams().largest_batch(3, 16) == 48  # X = the first batches, 3 x 16
    assert LbbspParams(min_batch=20).largest_batch(3, 16) == 60  # first batches of 20
