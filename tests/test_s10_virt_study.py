"""Virtual runs as a user sees them: reproducible, blind to the host, stopped on the instant.

Logs are compared byte for byte across ``--jobs`` and processes; a host made slower (a
real sleep inside every local step, or every evaluation) changes the real-cost fields and
nothing else; a run stops at exactly its budget, its target's or its patience's
evaluation; and an idle stretch costs the host nothing.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from asyncsync import cli
from asyncsync.results.report import summarize_run
from asyncsync.runlog.reading import read_jsonl
from asyncsync.runlog.schema import KEY, Kind
from asyncsync.study import simulation
from asyncsync.study.hetero_specs import NetworkSpec
from asyncsync.study.recipe import load_recipe
from asyncsync.study.simulation import REAL_TIME_FIELDS, simulate
from asyncsync.study.specs import RunSpec

RECIPE = """
name = "virt"
[defaults]
workers = 3
clock = "virtual"
[defaults.stop]
time_s = 2
[defaults.model]
name = "mlp"
[defaults.data]
batch_size = 16
[defaults.eval]
interval_s = 0.5
[defaults.compute]
slowdown = [1, 2, 3]
base_step_s = 0.05
[defaults.network]
bandwidth_mbps = 200
latency_ms = 5
jitter_ms = 2
[[runs]]
name = "bsp"
protocol = "bsp"
[[runs]]
name = "asp"
protocol = "asp"
"""
LOGS = ["events.jsonl", "worker-0.jsonl", "worker-1.jsonl", "worker-2.jsonl"]


def spec_of(tmp_path: Path, name: str, recipe: str = RECIPE) -> RunSpec:
    path = tmp_path / "virt.toml"
    path.write_text(recipe)
    return load_recipe(path).run(name)


def simulated(spec: RunSpec, run_dir: Path) -> dict[str, Any]:
    run_dir.mkdir(parents=True)
    (run_dir / "recipe.json").write_text(json.dumps(
        {"name": "virt", "baseline": spec.name, "runs": [spec.as_table()]}))
    facts = simulate(spec, run_dir, f"virt/{spec.name}")
    return {**summarize_run(run_dir), **facts}


def logs_of(run_dir: Path) -> dict[str, bytes]:
    return {name: (run_dir / name).read_bytes() for name in LOGS}


def virtual_facts(summary: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in summary.items() if k not in REAL_TIME_FIELDS}


def test_jobs_and_processes_give_byte_identical_logs_and_seeds_differ(tmp_path: Path) -> None:
    recipe = tmp_path / "virt.toml"
    recipe.write_text(RECIPE)
    runs: dict[str, dict[str, dict[str, bytes]]] = {}
    for label, extra in [("one", ["--jobs", "1"]), ("two", ["--jobs", "2"]),
                         ("seed", ["--jobs", "2", "--set", "seed=7"])]:
        assert cli.main(["run", str(recipe), "--plain", "--logs", str(tmp_path / label),
                         *extra]) == 0
        runs[label] = {p.parent.name: logs_of(p.parent)
                       for p in (tmp_path / label).rglob("summary.json")}
    assert sorted(runs["one"]) == ["asp", "bsp"]
    assert runs["one"] == runs["two"]  # in this process, and in one child per run
    for name in ["asp", "bsp"]:
        assert runs["seed"][name]["events.jsonl"] != runs["one"][name]["events.jsonl"]


def slowed(monkeypatch: pytest.MonkeyPatch, target: type, method: str, seconds: float) -> None:
    """Make every call of `target.method`'s inner function (the math it times) `seconds`
    slower in real time."""
    original = getattr(target, method)

    async def slower(self: Any, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        def sleepy(*inner: Any) -> Any:
            time.sleep(seconds)
            return fn(*inner)
        return await original(self, sleepy, *args, **kwargs)

    monkeypatch.setattr(target, method, slower)


def test_a_slower_host_changes_the_real_costs_and_nothing_else(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real sleep of 3 ms in each local step and of 50 ms in each evaluation: the logs
    are the same bytes, and the real costs count the sleeps."""
    spec = spec_of(tmp_path, "asp")
    fast = simulated(spec, tmp_path / "fast")
    slowed(monkeypatch, simulation._TimedWorkerSeam, "step", 0.003)
    slowed(monkeypatch, simulation._TimedServerSeam, "evaluate", 0.05)
    slow = simulated(spec, tmp_path / "slow")
    assert logs_of(tmp_path / "slow") == logs_of(tmp_path / "fast")
    assert virtual_facts(slow) == virtual_facts(fast)
    events = read_jsonl(tmp_path / "slow" / "events.jsonl")
    evals = sum(1 for e in events if e[KEY] == Kind.EVAL)
    steps = sum(r["steps"] for name in LOGS[1:]
                for r in read_jsonl(tmp_path / "slow" / name) if r[KEY] == Kind.FINAL)
    assert evals >= 4 and steps > 20
    # (the sleeps alone: the rest of a real cost varies with the host's load)
    assert slow["eval_real_s"] >= 0.05 * evals * 0.99
    assert slow["math_real_s"] >= 0.003 * steps * 0.99
    assert slow["wall_s"] == fast["wall_s"] == 2.0  # evaluation costs no virtual time


def test_steps_between_messages_of_no_cost_fit_the_budget_exactly(tmp_path: Path) -> None:
    """asp without link costs: a worker of step s does T / s steps in T exactly. The last
    ends on the budget's instant and counts (before, the rounded sum of the charges ended
    it just before or just after the budget: 120 x 0.05 s came to 6.0000000000000036)."""
    spec = dataclasses.replace(spec_of(tmp_path, "asp"), network=NetworkSpec())
    spec = dataclasses.replace(spec, stop=dataclasses.replace(spec.stop, time_s=6.0))
    simulated(spec, tmp_path / "asp")
    for rank, factor in enumerate((1, 2, 3)):
        step_s = 0.05 * factor
        finals = [r for r in read_jsonl(tmp_path / "asp" / f"worker-{rank}.jsonl")
                  if r[KEY] == Kind.FINAL]
        whole = round(6.0 / step_s)  # 120, 60, 40: each ends on the budget's instant
        assert finals[0]["steps"] == whole, (rank, finals[0]["steps"])
        assert finals[0]["wall_s"] == 6.0


@pytest.mark.parametrize("name", ["bsp", "asp"])
def test_a_run_stops_on_its_budgets_instant(tmp_path: Path, name: str) -> None:
    summary = simulated(spec_of(tmp_path, name), tmp_path / name)
    events = read_jsonl(tmp_path / name / "events.jsonl")
    stop = next(e for e in events if e[KEY] == Kind.STOP)
    assert stop["t"] == 2.0 and summary["wall_s"] == 2.0
    assert [e["t"] for e in events if e[KEY] == Kind.EVAL][:4] == [0.0, 0.5, 1.0, 1.5]


def test_a_run_stops_at_the_first_evaluation_that_reaches_its_target(tmp_path: Path) -> None:
    spec = spec_of(tmp_path, "asp", RECIPE.replace("time_s = 2", "time_s = 20\n"
                                                   "target_accuracy = 0.3\n"
                                                   "stop_at_target = true"))
    simulated(spec, tmp_path / "asp")
    events = read_jsonl(tmp_path / "asp" / "events.jsonl")
    evals = [e for e in events if e[KEY] == Kind.EVAL]
    first = next(e for e in evals if e["accuracy"] >= 0.3)
    stop = next(e for e in events if e[KEY] == Kind.STOP)
    assert evals[-1] is first and stop["t"] == first["t"] < 20


def test_a_run_gives_up_at_the_evaluation_its_patience_runs_out(tmp_path: Path) -> None:
    """Patience 1 s with a learning rate of 1e-12: nothing improves after the first
    evaluation (t = 0), so the run gives up at t = 1 exactly (evaluations every 0.5 s)."""
    spec = spec_of(tmp_path, "bsp", RECIPE.replace("time_s = 2", "time_s = 20\n"
                                                   "patience_s = 1.0"))
    spec = dataclasses.replace(spec, optim=dataclasses.replace(spec.optim, lr=1e-12))
    simulated(spec, tmp_path / "bsp")
    events = read_jsonl(tmp_path / "bsp" / "events.jsonl")
    stop = next(e for e in events if e[KEY] == Kind.STOP)
    assert stop["t"] == 1.0 and stop.get("reason") == "patience"


def test_a_long_idle_run_costs_the_host_per_event_not_per_virtual_second(
        tmp_path: Path) -> None:
    """One step of 1e5 virtual s per worker, for 1e6 virtual s: ten steps each, a few
    real seconds at most (a loop that stepped through time would never end); the tenth
    ends on the budget's instant and counts."""
    recipe = RECIPE.replace("time_s = 2", "time_s = 1e6").replace(
        'name = "mlp"', 'name = "timing"\nsize_mb = 0.1').replace(
        "base_step_s = 0.05", "base_step_s = 1e5").replace("interval_s = 0.5",
                                                           "interval_s = 1e5")
    spec = dataclasses.replace(spec_of(tmp_path, "asp", recipe), network=NetworkSpec())
    spec = dataclasses.replace(spec, compute=dataclasses.replace(spec.compute,
                                                                 slowdown=(1.0, 1.0, 1.0)))
    began = time.perf_counter()
    summary = simulated(spec, tmp_path / "asp")
    assert time.perf_counter() - began < 30
    assert summary["wall_s"] == 1e6
    finals = [r for name in LOGS[1:] for r in read_jsonl(tmp_path / "asp" / name)
              if r[KEY] == Kind.FINAL]
    assert [f["steps"] for f in finals] == [10, 10, 10]


def test_a_slow_runs_status_comes_every_half_real_second(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each local step takes 100 real ms, so a virtual second takes about 3.5 real s: the
    status (and a stop raised from it, as Ctrl-C does) came once per virtual second; now
    also every `WATCH_REAL_S` real seconds, one step late at most. The logs are those of
    an unwatched run."""
    spec = spec_of(tmp_path, "asp")
    step_real_s = 0.1
    slowed(monkeypatch, simulation._TimedWorkerSeam, "step", step_real_s)
    seen: list[float] = []
    (tmp_path / "watched").mkdir()
    simulate(spec, tmp_path / "watched", "virt/asp", lambda _: seen.append(time.perf_counter()))
    gaps = [b - a for a, b in itertools.pairwise(seen)]
    assert len(seen) >= 4, gaps
    assert max(gaps) <= simulation.WATCH_REAL_S + step_real_s + 0.3, gaps
    simulated(spec, tmp_path / "plain")
    for name in LOGS:
        assert (tmp_path / "watched" / name).read_bytes() == (tmp_path / "plain" / name
                                                              ).read_bytes()
