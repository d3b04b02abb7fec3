"""Batched worker math in virtual mode (cohorts): equal to the one-by-one path within a
bound, deterministic, and a fallback that is logged and recorded.

The bound: the batched call sums in another order than the one-by-one steps, so values
agree to float32 rounding (`TOLERANCE` on tensors after a few steps; logged losses and
accuracies within `LOG_TOLERANCE`), never more. Everything else a run logs (times,
versions, bytes, staleness) is equal to the bit: the timing never reads the math.
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import torch

from asyncsync.clock import VirtualTimeLoop, sleep
from asyncsync.engine.cohort import Cohort, CohortWorkerSeam
from asyncsync.engine.compute import VirtualWorkerSeam, WorkerSeam
from asyncsync.engine.work import LocalWork
from asyncsync.hetero.compute import FixedStepCost, StaticSlowdown
from asyncsync.schema import ConfigError
from asyncsync.study.recipe import load_recipe
from asyncsync.study.simulation import simulate
from asyncsync.study.worker_math import auto_refusal
from asyncsync.training.batched import BatchedModel
from asyncsync.training.data import BatchSampler, Dataset
from asyncsync.training.trainer import Trainer
from tests.helpers import tiny_bn_cnn

TOLERANCE = 1e-5
"""Largest difference of a parameter, buffer or momentum element after the steps below."""
LOG_TOLERANCE = 2e-3
"""Largest difference of a logged loss or accuracy between the paths over a short run."""
MATH_FIELDS = frozenset({"loss", "accuracy"})


def _source(seed: int, sizes: dict[int, int] | None = None):  # type: ignore[no-untyped-def]
    gen = torch.Generator().manual_seed(seed)

    def batches(size: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randn(size, 1, 8, 8, generator=gen), torch.randint(3, (size,),
                                                                       generator=gen)
    return batches


def _trainers(model: torch.nn.Module, count: int, momentum: float,
              device: str = "cpu") -> list[Trainer]:
    """`count` trainers of `model` at different points (and different BatchNorm stats)."""
    trainers = []
    for rank in range(count):
        trainer = Trainer(copy.deepcopy(model), _source(rank), lr=0.1, momentum=momentum,
                          weight_decay=1e-3, device=device)
        with torch.no_grad():
            trainer.flat.add_(0.01 * rank)
        trainers.append(trainer)
    return trainers


Observed = list[tuple[float, torch.Tensor | None]]
"""What each worker of a round got: its loss, and its gradient (None after a local step)."""


def _state(trainer: Trainer) -> list[torch.Tensor]:
    """A trainer's parameters and buffers, momentum and batch counters."""
    buffer = trainer.optimizer.momentum_buffer
    counters = [b.float() for b in trainer.params.module.buffers() if not b.is_floating_point()]
    return [t.detach().cpu() for t in (
        trainer.flat, torch.zeros(0) if buffer is None else buffer, *counters)]


def _round(trainers: list[Trainer], cohort: Cohort | None, works: list[dict[str, Any]]
           ) -> Observed:
    """One step of each trainer (`works[i]` its `LocalWork` fields): filed and computed
    together with a cohort, else one by one."""
    jobs = [LocalWork(t, **w) for t, w in zip(trainers, works, strict=True)]
    if cohort is None:
        finished = [job() for job in jobs]
    else:
        filed = [cohort.file(job) for job in jobs]
        cohort.compute()
        finished = [f.work.finish(f.result) for f in filed if f.result is not None]
    return [(computed.loss, vector) for computed, vector in finished]


def _agree(one: Observed, batched: Observed) -> None:
    """The same losses and gradients, within the bound."""
    assert len(one) == len(batched)
    for (loss, vector), (batched_loss, batched_vector) in zip(one, batched, strict=True):
        assert loss == pytest.approx(batched_loss, abs=TOLERANCE)
        assert (vector is None) == (batched_vector is None)
        if vector is not None and batched_vector is not None:
            assert torch.allclose(vector, batched_vector, rtol=0, atol=TOLERANCE)


def _compare(one: list[Trainer], batched: list[Trainer]) -> None:
    for a, b in zip(one, batched, strict=True):
        for x, y in zip(_state(a), _state(b), strict=True):
            assert x.shape == y.shape
            assert torch.allclose(x, y, rtol=0, atol=TOLERANCE), (x - y).abs().max()


def test_batched_steps_equal_one_by_one_with_batchnorm_momentum_and_terms() -> None:
    torch.manual_seed(0)
    model = tiny_bn_cnn((1, 8, 8), 3)
    one, batched = _trainers(model, 3, 0.9), _trainers(model, 3, 0.9)
    cohort = Cohort(BatchedModel(model, torch.device("cpu")))
    center = torch.randn(one[0].numel)
    correction = 0.01 * torch.randn(one[0].numel)
    rounds = [
        # gradients of rank 2 only: ranks 0 and 1 have momentum state, rank 2 not yet
        [dict(batch_size=8, local=True)] * 2 + [dict(batch_size=8)],
        [dict(batch_size=8, local=True)] * 2 + [dict(batch_size=8)],
        [dict(batch_size=8, local=True, center=center, rho=0.5)] * 3,
        [dict(batch_size=8, local=True, correction=correction)] * 3,
        [dict(batch_size=8, local=True)] * 3,
    ]
    for works in rounds:
        _agree(_round(one, None, works), _round(batched, cohort, works))
    _compare(one, batched)
    assert one[0].params.module[1].running_mean.abs().sum() > 0  # BatchNorm ran in training
    assert int(batched[0].params.module[1].num_batches_tracked) == 5
    assert cohort.steps == 15


def test_unequal_batches_share_a_call_when_the_model_mixes_no_samples() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 16), torch.nn.ReLU(),
                                torch.nn.Linear(16, 3))
    one, batched = _trainers(model, 3, 0.5), _trainers(model, 3, 0.5)
    cohort = Cohort(BatchedModel(model, torch.device("cpu")))
    for _ in range(3):  # LB-BSP's unequal batches
        works = [dict(batch_size=size, local=True) for size in (4, 9, 16)]
        _agree(_round(one, None, works), _round(batched, cohort, works))
    _compare(one, batched)
    assert cohort.calls == 3  # one padded call a round


def test_batches_drawn_as_rows_are_gathered_to_the_same_bits() -> None:
    gathered_rows_equal_stacked_batches("cpu")


def gathered_rows_equal_stacked_batches(device: str) -> None:
    """Workers whose batches come from a `BatchSampler` have the cohort gather their rows
    in one call (on `device`, where it copies the training split); the steps are those of
    the same batches drawn and stacked, to the bit, for equal and for unequal sizes."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 16), torch.nn.ReLU(),
                                torch.nn.Linear(16, 3))
    data = Dataset(torch.randn(60, 1, 8, 8), torch.randint(3, (60,)), torch.zeros(0),
                   torch.zeros(0), 3)
    runs = []
    for gathered in (True, False):
        trainers = _trainers(model, 3, 0.5, device)
        for rank, trainer in enumerate(trainers):
            sampler = BatchSampler(data, torch.arange(20 * rank, 20 * rank + 20), seed=rank)
            # its bound method is a plain source: drawn and stacked
            trainer.batches = sampler if gathered else sampler.__call__
        cohort = Cohort(BatchedModel(model, torch.device(device)))
        with mock.patch.object(cohort.model, "stack", wraps=cohort.model.stack) as stack:
            losses = [loss for size in (8, 8, 12) for loss, _ in _round(
                trainers, cohort, [dict(batch_size=size, local=True)] * 3)]
            losses += [loss for loss, _ in _round(
                trainers, cohort, [dict(batch_size=size, local=True) for size in (4, 9, 16)])]
        runs.append((losses, [_state(t) for t in trainers]))
        assert stack.call_count == (1 if gathered else 4)  # gathered: all but the unequal
    (gathered_losses, gathered_states), (stacked_losses, stacked_states) = runs
    assert gathered_losses == stacked_losses
    for a, b in zip(gathered_states, stacked_states, strict=True):
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_unequal_batches_of_a_batchnorm_model_are_called_apart() -> None:
    torch.manual_seed(0)
    model = tiny_bn_cnn((1, 8, 8), 3)
    one, batched = _trainers(model, 3, 0.0), _trainers(model, 3, 0.0)
    cohort = Cohort(BatchedModel(model, torch.device("cpu")))
    works = [dict(batch_size=size) for size in (4, 4, 16)]
    _agree(_round(one, None, works), _round(batched, cohort, works))
    _compare(one, batched)
    assert cohort.calls == 2  # padding would change the batch statistics


RECIPE = """
name = "cohort"
[defaults]
workers = 3
clock = "virtual"
[defaults.stop]
time_s = 1.2
[defaults.model]
name = "tests.helpers:tiny_bn_cnn"
[defaults.data]
batch_size = 8
[defaults.optim]
lr = 0.05
momentum = 0.9
weight_decay = 0.001
[defaults.eval]
interval_s = 0.4
[defaults.network]
bandwidth_mbps = 100
latency_ms = 5
jitter_ms = 2
[[runs]]
name = "bsp"
protocol = "bsp"
[[runs]]
name = "asp"
protocol = "asp"
[[runs]]
name = "local_sgd"
protocol = { name = "local_sgd", local_steps = 3 }
[[runs]]
name = "fedavg"
protocol = { name = "fedavg", local_steps = 3, fraction = 0.67 }
[[runs]]
name = "esync"
protocol = "esync"
[[runs]]
name = "lbbsp"
protocol = "lbbsp"
[[runs]]
name = "lbbsp_mlp"
protocol = "lbbsp"
model = { name = "mlp", options = { hidden = 16 } }
[[runs]]
name = "nbsync"
protocol = "nbsync"
[[runs]]
name = "fednova"
protocol = "fednova"
"""
FAMILIES = ["bsp", "asp", "local_sgd", "fedavg", "esync", "lbbsp", "lbbsp_mlp", "nbsync",
            "fednova"]


def _run(tmp_path: Path, name: str, batched: str, folder: str, recipe: str = RECIPE,
         slowdown: str = "[1, 2, 3]") -> tuple[Path, dict[str, Any]]:
    path = tmp_path / "cohort.toml"
    path.write_text(recipe.replace("[defaults.eval]",
                                   f'[defaults.compute]\nbase_step_s = 0.05\n'
                                   f'slowdown = {slowdown}\nbatched = "{batched}"\n'
                                   "[defaults.eval]"))
    run_dir = tmp_path / folder
    run_dir.mkdir()
    facts = simulate(load_recipe(path).run(name), run_dir, f"cohort/{name}")
    return run_dir, facts


def _records(run_dir: Path) -> dict[str, list[dict[str, Any]]]:
    return {path.name: [json.loads(line) for line in path.read_text().splitlines()]
            for path in sorted(run_dir.glob("*.jsonl"))}


def assert_logs_agree(run_dir: Path, reference_dir: Path) -> list[dict[str, Any]]:
    """Assert that every log record of `run_dir` equals `reference_dir`'s: the math fields
    within `LOG_TOLERANCE` (more than 10 of them compared), all else to the bit. Returns
    the records of `run_dir`."""
    logs, reference = _records(run_dir), _records(reference_dir)
    assert logs.keys() == reference.keys()
    compared = 0
    for file, records in logs.items():
        assert len(records) == len(reference[file]), file
        for mine, theirs in zip(records, reference[file], strict=True):
            assert mine.keys() == theirs.keys(), (file, mine, theirs)
            for key, value in mine.items():
                if key in MATH_FIELDS and isinstance(value, float):
                    assert value == pytest.approx(theirs[key], abs=LOG_TOLERANCE), (file, key)
                    compared += 1
                else:
                    assert value == theirs[key], (file, key, mine, theirs)
    assert compared > 10
    return [record for records in logs.values() for record in records]


@pytest.mark.parametrize("name", FAMILIES)
def test_a_batched_run_equals_the_one_by_one_run_within_the_bound(tmp_path: Path,
                                                                   name: str) -> None:
    batched_dir, batched = _run(tmp_path, name, "on", "on")
    one_dir, one = _run(tmp_path, name, "off", "off")
    assert batched["worker_math"] == "batched" and one["worker_math"] == "one-by-one"
    assert batched["batched_steps"] > batched["batched_calls"] > 0  # steps shared calls
    assert_logs_agree(batched_dir, one_dir)


def test_two_batched_runs_give_identical_logs(tmp_path: Path) -> None:
    first, _ = _run(tmp_path, "esync", "on", "a")
    second, _ = _run(tmp_path, "esync", "on", "b")
    for path in sorted(first.glob("*.jsonl")):
        assert path.read_bytes() == (second / path.name).read_bytes(), path.name


def test_a_model_that_cannot_be_batched_falls_back_logged_and_recorded(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    recipe = RECIPE.replace("tests.helpers:tiny_bn_cnn", "tests.helpers:dropout_mlp")
    with caplog.at_level(logging.INFO, logger="asyncsync.simulation"):
        _, facts = _run(tmp_path, "bsp", "on", "fallback", recipe)
    assert facts["worker_math"] == "one-by-one"
    assert "batched gradient failed" in facts["worker_math_reason"]
    assert facts["worker_math_fallback"] is True
    assert facts["worker_math_device"] == "cpu"  # where the one-by-one steps ran
    said = [r for r in caplog.records if "one by one" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.WARNING


def test_a_batched_run_never_imports_torch_dynamo(tmp_path: Path) -> None:
    """functorch's gradient imported ``torch._dynamo`` on its first call: 2.5-4 s of every
    batched run's start. The batched path takes its gradient with plain autograd."""
    script = (
        "import sys\n"
        "from pathlib import Path\n"
        "from tests.test_cohort import _run\n"
        "_, facts = _run(Path(sys.argv[1]), 'esync', 'on', 'run')\n"
        "assert facts['worker_math'] == 'batched', facts\n"
        "print(sorted(m for m in sys.modules if m.startswith('torch._dynamo')))\n")
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True,
                          text=True, cwd=Path(__file__).resolve().parents[1], check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_auto_computes_one_by_one_on_a_cpu(tmp_path: Path) -> None:
    _, facts = _run(tmp_path, "bsp", "auto", "auto")
    assert facts["worker_math"] == "one-by-one"
    assert facts["worker_math_reason"].startswith("auto")
    assert "worker_math_fallback" not in facts  # auto's own choice: nothing to warn of


def test_a_bad_batched_value_is_refused_with_its_key(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(RECIPE.replace("[defaults.eval]",
                                   '[defaults.compute]\nbatched = "sometimes"\n[defaults.eval]'))
    with pytest.raises(ConfigError, match="batched"):
        load_recipe(path).run("bsp")


def test_a_step_computes_on_the_state_its_worker_had_when_it_began() -> None:
    """What touches a worker mid-step (a snapshot, an adopted model) comes after the step,
    as on the one-by-one seam, which computes at the step's start."""
    torch.manual_seed(0)
    model = tiny_bn_cnn((1, 8, 8), 3)
    cost = FixedStepCost(0.05, 8)

    async def mid_step(seam: WorkerSeam, trainer: Trainer) -> list[torch.Tensor]:
        seam.start()
        step = asyncio.create_task(seam.step(LocalWork(trainer, 8, local=True), batch=8))
        await sleep(0.01)
        during = await seam.math(trainer.vector_copy)
        seam.defer(trainer.load, torch.zeros(trainer.numel))
        await step
        return [during, trainer.flat.clone()]

    seen = []
    for batched in (False, True):
        trainer = _trainers(model, 1, 0.9)[0]
        seam: WorkerSeam = (CohortWorkerSeam(StaticSlowdown(1.0), cost,
                                             Cohort(BatchedModel(model, torch.device("cpu"))))
                            if batched else VirtualWorkerSeam(StaticSlowdown(1.0), cost))
        start = trainer.flat.clone()
        loop = VirtualTimeLoop()
        try:
            seen.append(loop.run_until_complete(mid_step(seam, trainer)))
        finally:
            loop.close()
        assert not torch.equal(seen[-1][0], start)  # the snapshot saw the step done
        assert torch.equal(seen[-1][1], torch.zeros_like(start))  # the adoption came last
    assert torch.allclose(seen[0][0], seen[1][0], rtol=0, atol=TOLERANCE)


def test_batching_is_refused_on_the_real_clock(tmp_path: Path) -> None:
    path = tmp_path / "real.toml"
    path.write_text(RECIPE.replace('clock = "virtual"', 'clock = "real"').replace(
        "[defaults.eval]", '[defaults.compute]\nbatched = "on"\n[defaults.eval]'))
    with pytest.raises(ConfigError, match=r"compute\.batched: .*virtual"):
        load_recipe(path).run("bsp")


@pytest.mark.parametrize(("device", "workers", "batches"),
                         [("cpu", 512, False), ("cuda", 1, False), ("cuda", 7, False),
                          ("cuda", 8, True), ("cuda", 1000, True)])
def test_auto_batches_only_where_the_gpu_measurements_say_it_pays(
        device: str, workers: int, batches: bool) -> None:
    assert (auto_refusal(device, workers) is None) is batches
