"""Evaluation's edge cases: a diverged model, a split smaller than a batch, the cap."""

from __future__ import annotations

import math

import pytest
import torch

from asyncsync.engine.evaluation import evaluated_rows, make_evaluator

INPUTS = torch.full((10, 2), 10.0)
TARGETS = torch.tensor([0, 1] * 5)


@pytest.mark.parametrize("first_row", [(1e38, -1e38), (1e38, 1e38)])
def test_a_model_whose_logits_are_not_finite_scores_zero(first_row: tuple[float, float]
                                                         ) -> None:
    """Weights that are finite but overflow: every logit is NaN (inf - inf) or inf."""
    evaluator = make_evaluator(torch.nn.Linear(2, 3), INPUTS, TARGETS, batch_size=4)
    accuracy, loss = evaluator(torch.tensor([*first_row] * 3 + [0.0] * 3))
    assert accuracy == 0.0 and math.isnan(loss)


def test_a_split_smaller_than_the_batch_and_a_cap() -> None:
    """A perfect classifier of class 0 vs 1 by the sign of the first input."""
    inputs = torch.tensor([[1.0], [-1.0], [2.0], [-2.0], [3.0]])
    targets = torch.tensor([0, 1, 0, 1, 1])  # the last sample is misclassified
    vector = torch.tensor([1.0, -1.0, 0.0, 0.0])  # logits (x, -x)
    whole = make_evaluator(torch.nn.Linear(1, 2), inputs, targets, batch_size=1000)
    assert whole(vector)[0] == pytest.approx(4 / 5)
    capped = make_evaluator(torch.nn.Linear(1, 2), inputs, targets, samples=4, batch_size=3)
    rows = evaluated_rows(5, 4)
    assert rows is not None and len(rows) == 4
    right = [True, True, True, True, False]  # by hand, as above
    assert capped(vector)[0] == pytest.approx(sum(right[i] for i in rows.tolist()) / 4)
