"""An evaluation that fails ends the run with its error.

A model whose evaluation raised (a BatchNorm without running statistics given a last test
batch of one sample, say) used to leave the run going without a word: the periodic
evaluation task died, the budget's stop died on the final evaluation, and the run ended
with exit 0, no evaluation, no stop record and an empty accuracy.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from asyncsync.engine.settings import ServerSettings
from asyncsync.study.simulation import run_virtual
from tests.helpers import batches_of, tiny_data


class FailsInEval(nn.Module):
    """A linear model that passes the test data's check at build (its first forward in
    eval mode), then raises in eval mode."""

    def __init__(self, features: int = 8, num_classes: int = 2) -> None:
        super().__init__()
        self.linear = nn.Linear(features, num_classes)
        self.scored = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            self.scored += 1
            if self.scored > 1:
                raise RuntimeError("this model cannot be scored")
        return self.linear(x.flatten(1))


@pytest.mark.parametrize("protocol", ["asp", "bsp"])
def test_a_failing_evaluation_fails_the_run_with_its_error(protocol: str) -> None:
    x, y = tiny_data()
    settings = ServerSettings(time_s=5.0, eval_interval_s=1.0)
    logged: list[object] = []

    def watch(core: object) -> None:
        logged.append(core)

    with pytest.raises(RuntimeError, match="this model cannot be scored"):
        run_virtual(protocol, FailsInEval, lambda rank: batches_of(x, y, rank), [0.0, 0.0],
                    settings=settings, test_data=(x, y), prepare=watch)
    (core,) = logged
    assert core.run.stopped  # type: ignore[attr-defined]
    assert core.run.evals == []  # type: ignore[attr-defined]
