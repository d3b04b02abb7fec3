"""A batched call reads values back to the host a fixed number of times, whatever its rows.

On a GPU each read of a device value (``.item()``, ``.tolist()``, ``float(t)``,
``int(t)``, ``bool(t)``, ``.numpy()``) makes the host wait for every kernel queued before
it: one per row would serialize a 512-row call. That cost shows on a GPU only, but the
reads themselves can be counted on the CPU: the counts of a call of 2 rows and of 8 rows
are equal (here, one: the rows' losses, read together).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch

from asyncsync.engine.cohort import Cohort
from asyncsync.engine.work import LocalWork
from asyncsync.training.batched import BatchedModel
from asyncsync.training.trainer import Trainer
from tests.helpers import tiny_bn_cnn

READS = ("item", "tolist", "numpy", "__float__", "__int__", "__bool__", "__index__")


@contextmanager
def counted_host_reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Inside the block, every host read of a tensor's values is appended to the list."""
    reads: list[str] = []

    def counting(name: str, read: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            reads.append(name)
            return read(self, *args, **kwargs)
        return wrapper

    with monkeypatch.context() as patch:
        for name in READS:
            patch.setattr(torch.Tensor, name, counting(name, getattr(torch.Tensor, name)))
        yield reads


def _team(count: int) -> tuple[list[Trainer], Cohort]:
    torch.manual_seed(0)
    model = tiny_bn_cnn((1, 8, 8), 3)
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(8, 1, 8, 8, generator=gen), torch.randint(3, (8,), generator=gen)
    team = [Trainer(copy.deepcopy(model), lambda size: (x[:size], y[:size]), lr=0.1,
                    momentum=0.9, device="cpu") for _ in range(count)]
    return team, Cohort(BatchedModel(model, torch.device("cpu")))


def _reads_of_a_call(team: list[Trainer], cohort: Cohort, monkeypatch: pytest.MonkeyPatch,
                     center: torch.Tensor | None) -> list[str]:
    for trainer in team:  # the call under test is not a group's first
        cohort.file(LocalWork(trainer, 8, local=True, center=center, rho=0.1))
    cohort.compute()
    filed = [cohort.file(LocalWork(t, 8, local=True, center=center, rho=0.1)) for t in team]
    with counted_host_reads(monkeypatch) as reads:
        cohort.compute()
    assert all(f.result is not None for f in filed)
    return reads


@pytest.mark.parametrize("proximal", [False, True])
def test_a_batched_call_reads_the_host_as_often_for_8_rows_as_for_2(
        monkeypatch: pytest.MonkeyPatch, proximal: bool) -> None:
    counts = {}
    for rows in (2, 8):
        team, cohort = _team(rows)
        center = torch.zeros(team[0].numel) if proximal else None
        counts[rows] = _reads_of_a_call(team, cohort, monkeypatch, center)
    assert counts[2] == counts[8]
    assert counts[8] == ["tolist"]  # the losses, together


def test_the_counter_sees_a_read() -> None:
    """The counting itself works (else the test above would pass on nothing)."""
    with pytest.MonkeyPatch.context() as patch, counted_host_reads(patch) as reads:
        float(torch.ones(()))
        torch.ones(2).tolist()
    assert reads == ["__float__", "tolist"]
