"""On a GPU, a virtual run's one-by-one local steps reuse one borrowed gradient.

`ScratchGradients` lends a vector by the trainer's device and takes it back by the
vector's own. A run's workers were given ``cuda``, while a tensor made there says
``cuda:0``: the two never matched, so every local step made a new gradient and the lender
kept them all (one model's size a step: 137 MB a round of the 1,000-client population's
cnn; an 80 GB GPU full after some 570 rounds, by arithmetic). CUDA is declared present
here, and a stand-in vector carries the device a CUDA tensor names.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest
import torch

from asyncsync.study.worker_math import choose_worker_math
from asyncsync.training.trainer import ScratchGradients, resolve_device
from tests.test_s10_virt_study import spec_of

RECIPE = """
name = "virt"
[defaults]
workers = 2
clock = "virtual"
device = "cuda"
model = {name = "mlp"}
stop = {time_s = 1}
compute = {base_step_s = 0.1, batched = "BATCHED"}
[[runs]]
name = "local_sgd"
protocol = "local_sgd"
"""


class CudaVector:
    """Stands for a gradient made on the GPU: its length and the device torch names."""

    def __init__(self, numel: int) -> None:
        self.length = numel
        self.device = torch.device("cuda", 0)

    def numel(self) -> int:
        return self.length


def _unused(*_: Any) -> Any:
    raise AssertionError("the one-by-one path builds no model and draws no batch here")


@pytest.mark.parametrize("batched", ["off", "auto"])
def test_a_gradient_given_back_on_a_gpu_is_lent_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, batched: str) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    spec = spec_of(tmp_path, "local_sgd", RECIPE.replace("BATCHED", batched))
    math = choose_worker_math(spec, _unused, _unused)
    assert math.cohort is None
    trainer_device = resolve_device(math.device)  # what each worker's Trainer holds
    scratch = ScratchGradients()
    lent = cast(torch.Tensor, CudaVector(1000))
    scratch.give_back(lent)  # a step's gradient, back
    monkeypatch.setattr(torch, "empty", lambda *_, **__: pytest.fail(
        "a new gradient for the next step: the one given back was not found"))
    assert scratch.take(1000, trainer_device) is lent
