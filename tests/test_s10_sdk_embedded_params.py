"""An embedder's `protocol_params` are checked when the server and workers are made."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from asyncsync import LocalTransport, ServerSettings, Worker, build_core
from asyncsync.protocols.fedasync import FedAsyncParams
from asyncsync.protocols.fedbuff import FedBuffParams


def model() -> nn.Module:
    return nn.Linear(3, 2)


def batches(size: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.zeros(size, 3), torch.zeros(size, dtype=torch.long)


@pytest.mark.parametrize(("given", "match"), [
    (FedBuffParams(), "takes a FedAsyncParams.*got FedBuffParams"),
    ({"alpah": 0.3}, r"protocol_params\.alpah: unknown key"),
])
def test_the_wrong_parameters_are_refused_when_made(given: Any, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        build_core(model(), "fedasync", 1, ServerSettings(), protocol_params=given)
    core = build_core(model(), "fedasync", 1, ServerSettings())
    with pytest.raises(ValueError, match=match):
        Worker(0, LocalTransport(core), model(), batches, "fedasync", protocol_params=given)


def test_a_dict_of_options_is_the_protocols_parameters() -> None:
    core = build_core(model(), "fedasync", 1, ServerSettings(), protocol_params={"alpha": 0.3})
    assert core.rule.params == FedAsyncParams(alpha=0.3)
    worker = Worker(0, LocalTransport(core), model(), batches, "fedasync",
                    protocol_params={"alpha": 0.3})
    assert worker.protocol_params == FedAsyncParams(alpha=0.3)


def test_a_server_judges_the_parameters_against_its_size() -> None:
    """A protocol whose rule forgets `check_workers` is still judged (`make_params`)."""
    from tests.test_s10_sdk_params import RANKED

    with pytest.raises(ValueError, match=r"^rank: 3 is not a rank of 2 workers"):
        build_core(model(), RANKED, 2, ServerSettings(), protocol_params={"rank": 3})
