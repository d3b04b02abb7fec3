"""`count_step_flops` against torch's `FlopCounterMode` on the meta device, the way the
step was counted before: the same FLOPs and operations on either of its paths, and a
count that does not load ``torch._dynamo`` where nothing else has."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from asyncsync.hetero.cost_model import count_step_flops
from asyncsync.training.models import build_model
from asyncsync.training.trainer import running_statistics_for_one_sample
from tests.helpers import dropout_mlp, tiny_bn_cnn

ROOT = Path(__file__).resolve().parents[1]
SHAPE = (3, 32, 32)
SGD_OPS = 1
"""The plain SGD update's one operation, which the count adds to the pass's."""


class _Dispatched(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Counts the operations that reach it."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.count = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        self.count += 1
        return func(*args, **(kwargs or {}))


def reference(model: nn.Module, batch: int) -> tuple[float, int]:
    """FLOPs per sample and operations of one step, by `FlopCounterMode` on ``meta``."""
    shadow = copy.deepcopy(model).to("meta")
    shadow.train()
    inputs = torch.zeros((batch, *SHAPE), device="meta")
    labels = torch.zeros(batch, dtype=torch.long, device="meta")
    with (FlopCounterMode(display=False) as flops, _Dispatched() as ops,
          running_statistics_for_one_sample(shadow, batch)):
        torch.autograd.backward(nn.functional.cross_entropy(shadow(inputs), labels))
    return flops.get_total_flops() / batch, ops.count + SGD_OPS


def model(name: str) -> nn.Module:
    torch.manual_seed(0)
    helpers = {"bn_cnn": tiny_bn_cnn, "dropout_mlp": dropout_mlp}
    if name in helpers:
        return helpers[name](SHAPE, 10)
    return build_model(name, SHAPE, 10, {})


@pytest.mark.parametrize(("name", "batch"), [
    ("mlp", 8), ("cnn", 8), ("resnet18", 2), ("bn_cnn", 8), ("bn_cnn", 1),
    ("dropout_mlp", 8)])
def test_the_meta_count_equals_flop_counter_modes(name: str, batch: int) -> None:
    import torch._dynamo  # noqa: F401  (loaded: the count runs on meta, at `batch`)
    counted = count_step_flops(model(name), SHAPE, batch)
    assert (counted.flops_per_sample, counted.ops) == reference(model(name), batch)


COUNT_IN_A_FRESH_PROCESS = """
import json, sys, torch
from asyncsync.hetero.cost_model import count_step_flops
from tests.test_s13_flopcount_counts import CASES, model, SHAPE
models = {case: model(case[0]) for case in CASES}
torch.manual_seed(1)
expected = torch.rand(4)
torch.manual_seed(1)
counts = {f"{name}@{batch}": [c.flops_per_sample, c.ops] for (name, batch), m in models.items()
          for c in [count_step_flops(m, SHAPE, batch)]}
print(json.dumps({"counts": counts, "dynamo": "torch._dynamo" in sys.modules,
                  "rng_untouched": bool(torch.equal(torch.rand(4), expected))}))
"""
CASES = [("mlp", 8), ("cnn", 32), ("bn_cnn", 8), ("bn_cnn", 1), ("dropout_mlp", 8)]
"""Models whose building loads no ``torch._dynamo`` (torchvision's resnet18 does)."""


def test_a_fresh_process_counts_the_same_without_loading_dynamo() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]), "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, "-c", COUNT_IN_A_FRESH_PROCESS], cwd=ROOT,
                            env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.splitlines()[-1])
    assert report["dynamo"] is False
    assert report["rng_untouched"] is True  # dropout ran on the CPU, on a forked generator
    for name, batch in CASES:
        assert tuple(report["counts"][f"{name}@{batch}"]) == reference(model(name), batch)
