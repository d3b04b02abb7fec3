"""The batched paths that changed since the last GPU run, written once for any device.

Each ``*_on(device)`` function steps workers batched on `device` and the same workers one
by one on the CPU, and checks they agree within the cohort bound: padded unequal batches
(and the padding probe on the model's CPU copy), parameters without ``requires_grad``,
one-sample BatchNorm batches, calls chunked by `ROW_BUDGET`, and each worker's own
momentum vector. The tests here run them on the CPU; tests/test_gpu_cohort.py runs them
on CUDA. The other checks: an evaluation reads the host a fixed number of times however
many batches it has (on a GPU each read waits for the device), and padded batches are
built where the batches are, not on the CPU.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from asyncsync.engine.cohort import Cohort
from asyncsync.engine.work import LocalWork
from asyncsync.training import batched as batched_module
from asyncsync.training.batched import ROW_COPIES, BatchedModel
from asyncsync.training.trainer import Trainer, evaluate

BOUND = 1e-5
"""The cohort tests' bound on a value after a few steps (tests/test_cohort.py)."""


def _source(seed: int) -> Callable[[int], tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    return lambda n: (torch.randn(n, 1, 4, 4, generator=gen),
                      torch.randint(3, (n,), generator=gen))


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 3))


def _bn_mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(16, 8), nn.BatchNorm1d(8), nn.ReLU(),
                         nn.Linear(8, 3))


def _pair(model: nn.Module, count: int, device: str, momentum: float = 0.9,
          ) -> tuple[list[Trainer], list[Trainer], Cohort]:
    """`count` workers twice, at different points: one-by-one on the CPU, and batched on
    `device` with their cohort."""
    def team(where: str) -> list[Trainer]:
        out = []
        for rank in range(count):
            trainer = Trainer(copy.deepcopy(model), _source(rank), lr=0.1, momentum=momentum,
                              weight_decay=1e-3, device=where)
            with torch.no_grad():
                trainer.flat.add_(0.01 * rank)
            out.append(trainer)
        return out

    return team("cpu"), team(device), Cohort(BatchedModel(model, torch.device(device)))


def _step(one: list[Trainer], batched: list[Trainer], cohort: Cohort,
          works: list[dict[str, Any]]) -> None:
    """One step of each worker on both paths; their losses and gradients agree."""
    expected = [LocalWork(t, **w)() for t, w in zip(one, works, strict=True)]
    filed = [cohort.file(LocalWork(t, **w)) for t, w in zip(batched, works, strict=True)]
    cohort.compute()
    for (mine, grad), done in zip(expected, filed, strict=True):
        assert done.result is not None
        theirs, their_grad = done.work.finish(done.result)
        assert theirs.samples == mine.samples
        assert theirs.loss == pytest.approx(mine.loss, abs=BOUND)
        assert (grad is None) == (their_grad is None)
        if grad is not None and their_grad is not None:
            assert torch.allclose(grad, their_grad.cpu(), rtol=0, atol=BOUND)


def _same_state(one: list[Trainer], batched: list[Trainer]) -> None:
    for a, b in zip(one, batched, strict=True):
        assert torch.allclose(a.flat, b.flat.cpu(), rtol=0, atol=BOUND)
        mine, theirs = a.optimizer.momentum_buffer, b.optimizer.momentum_buffer
        assert (mine is None) == (theirs is None)
        if mine is not None and theirs is not None:
            assert theirs.device == b.flat.device
            assert torch.allclose(mine, theirs.cpu(), rtol=0, atol=BOUND)


def padded_unequal_batches_on(device: str) -> None:
    """LB-BSP's unequal batches of a model that mixes no samples share one padded call
    (the padding probe runs on a CPU copy of the device's template)."""
    one, batched, cohort = _pair(_mlp(), 3, device)
    for _ in range(3):
        _step(one, batched, cohort, [dict(batch_size=n, local=True) for n in (4, 9, 16)])
    _same_state(one, batched)
    assert cohort.model.pads and cohort.calls == 3


def frozen_parameters_on(device: str) -> None:
    """A parameter without ``requires_grad`` is left as it is, by a local step and a
    gradient alike."""
    model = _mlp()
    model[1].weight.requires_grad_(False)
    one, batched, cohort = _pair(model, 2, device)
    frozen = model[1].weight.numel()
    start = [t.flat[:frozen].cpu().clone() for t in batched]
    for _ in range(2):
        _step(one, batched, cohort, [dict(batch_size=4, local=True), dict(batch_size=4)])
    _same_state(one, batched)
    for trainer, before in zip(batched, start, strict=True):
        assert torch.equal(trainer.flat[:frozen].cpu(), before)


def one_sample_batchnorm_on(device: str) -> None:
    """A batch of one sample runs BatchNorm on its running statistics, called apart from
    the larger batches (a BatchNorm model is never padded)."""
    one, batched, cohort = _pair(_bn_mlp(), 3, device)
    for size in (4, 1, 4, 1):
        _step(one, batched, cohort, [dict(batch_size=size, local=True)] * 3)
    _same_state(one, batched)
    assert not cohort.model.pads and cohort.calls == 4


def chunked_calls_on(device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """`ROW_BUDGET` cuts a group into calls of 2 rows: 5 workers take 3 calls."""
    model = _mlp()
    one, batched, cohort = _pair(model, 5, device)
    monkeypatch.setattr(batched_module, "ROW_BUDGET", ROW_COPIES * cohort.model.numel * 2)
    assert cohort.model.rows_per_call(8, (1, 4, 4)) == 2
    for _ in range(2):
        _step(one, batched, cohort, [dict(batch_size=8, local=True)] * 5)
    _same_state(one, batched)
    assert cohort.calls == 6


def momentum_of_its_own_on(device: str) -> None:
    """Each worker's momentum is its own vector on the device, not a view of a call's
    stacked momentum (which would keep the whole stack alive)."""
    one, batched, cohort = _pair(_mlp(), 4, device)
    for _ in range(2):
        _step(one, batched, cohort, [dict(batch_size=4, local=True)] * 4)
    _same_state(one, batched)
    for trainer in batched:
        buffer = trainer.optimizer.momentum_buffer
        assert buffer is not None
        assert buffer.untyped_storage().nbytes() == buffer.numel() * buffer.element_size()


def test_padded_unequal_batches() -> None:
    padded_unequal_batches_on("cpu")


def test_frozen_parameters() -> None:
    frozen_parameters_on("cpu")


def test_one_sample_batchnorm() -> None:
    one_sample_batchnorm_on("cpu")


def test_chunked_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    chunked_calls_on("cpu", monkeypatch)


def test_momentum_of_its_own() -> None:
    momentum_of_its_own_on("cpu")


READS = ("__float__", "__int__", "__index__", "__bool__", "item", "tolist")
"""The ways a tensor's values reach the host as Python numbers (each a wait on a GPU)."""


def _counting_host_reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    """Count every tensor-to-Python read from now on; yields the count so far."""
    count = 0
    for name in READS:
        original = getattr(torch.Tensor, name)

        def counted(self: torch.Tensor, *args: Any, _original: Any = original) -> Any:
            nonlocal count
            count += 1
            return _original(self, *args)

        monkeypatch.setattr(torch.Tensor, name, counted)
    while True:
        yield count


def test_an_evaluation_reads_the_host_as_often_with_ten_batches_as_with_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """It read two figures a batch (a loss and a count), each a wait for the device on a
    GPU; the figures are those of a batch at a time, to the bit."""
    torch.manual_seed(0)
    model = _mlp().eval()
    gen = torch.Generator().manual_seed(4)
    x, y = torch.randn(100, 1, 4, 4, generator=gen), torch.randint(3, (100,), generator=gen)
    with torch.no_grad():
        logits = model(x)
    loss_sum = 0.0
    for start in range(0, 100, 10):  # float32 batch sums, added in double, in order
        loss_sum += float(F.cross_entropy(logits[start : start + 10], y[start : start + 10],
                                          reduction="sum"))
    correct = int((logits.argmax(dim=1) == y).sum())
    reads = _counting_host_reads(monkeypatch)
    before = next(reads)
    whole = evaluate(model, x, y, batch_size=100)
    one_batch = next(reads) - before
    batched = evaluate(model, x, y, batch_size=10)
    ten_batches = next(reads) - before - one_batch
    monkeypatch.undo()
    assert ten_batches == one_batch <= 2
    assert batched == (correct / 100, loss_sum / 100)
    assert whole[0] == correct / 100


def test_padded_batches_are_built_where_the_batches_are() -> None:
    """Batches that live on the device (a source may hand them so) are padded there: the
    targets and weights were made on the CPU, every row copied across and back. The meta
    device stands in for a GPU: it refuses a copy to the CPU."""
    model = BatchedModel(_mlp(), torch.device("meta"))
    batches = [(torch.zeros(n, 1, 4, 4, device="meta"),
                torch.zeros(n, dtype=torch.long, device="meta")) for n in (2, 3)]
    x, y, weight = model.stack(batches)
    assert weight is not None
    assert (x.shape, y.shape, weight.shape) == ((2, 3, 1, 4, 4), (2, 3), (2, 3))
    assert {x.device.type, y.device.type, weight.device.type} == {"meta"}
