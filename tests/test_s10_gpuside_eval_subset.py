"""`eval.samples` scores a fixed, seeded subset of the held-out split, not its first rows:
the same samples in every run of a study, near the split's class balance when the file
is sorted by class."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from asyncsync.engine.evaluation import evaluated_rows, make_evaluator

CLASSES = 10
PER_CLASS = 100


def sorted_split() -> tuple[torch.Tensor, torch.Tensor]:
    """1,000 samples sorted by class (100 of each of 10); the input is the class."""
    y = torch.arange(CLASSES).repeat_interleave(PER_CLASS)
    return y.float().unsqueeze(1), y


def always_zero() -> nn.Module:
    """A classifier that says class 0 for every sample: its accuracy is class 0's share."""
    model = nn.Linear(1, CLASSES)
    with torch.no_grad():
        model.weight.zero_()
        model.bias.zero_()
        model.bias[0] = 1.0
    return model


def test_a_class_sorted_split_is_scored_on_a_subset_near_its_class_balance() -> None:
    x, y = sorted_split()
    samples = 200
    rows = evaluated_rows(len(y), samples)
    assert rows is not None
    picked = rows.tolist()
    assert len(set(picked)) == samples and picked == sorted(picked)
    assert picked[0] >= 0 and picked[-1] < len(y)
    counts = [0] * CLASSES
    for row in picked:
        counts[row // PER_CLASS] += 1  # the split's layout, independent of its targets
    # 20 expected a class; a hypergeometric standard deviation of 4: within 4 of them
    assert all(4 <= count <= 36 for count in counts), counts
    evaluate = make_evaluator(always_zero(), x, y, samples=samples)
    vector = torch.cat([p.detach().flatten() for p in always_zero().parameters()])
    accuracy, _ = evaluate(vector)
    assert accuracy == counts[0] / samples  # the first 200 rows would have scored 0.5
    assert accuracy < 0.2


def test_the_subset_is_the_same_in_every_run_whatever_the_seed_and_leaves_it_alone() -> None:
    torch.manual_seed(1)
    first = evaluated_rows(1000, 300)
    torch.manual_seed(2)
    state = torch.get_rng_state()
    second = evaluated_rows(1000, 300)
    assert torch.equal(torch.get_rng_state(), state)  # the run's own draws are untouched
    assert first is not None and second is not None and torch.equal(first, second)


@pytest.mark.parametrize("samples", [None, 1000, 5000])
def test_no_cap_or_a_cap_past_the_split_scores_all_of_it_in_order(samples: int | None
                                                                   ) -> None:
    assert evaluated_rows(1000, samples) is None
    x, y = sorted_split()
    evaluate = make_evaluator(always_zero(), x, y, samples=samples)
    vector = torch.cat([p.detach().flatten() for p in always_zero().parameters()])
    assert evaluate(vector)[0] == PER_CLASS / len(y)
