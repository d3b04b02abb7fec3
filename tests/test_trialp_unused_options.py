"""An option the chosen variant does not use is refused, naming the key, instead of being
silently ignored (as `Cutoff` refuses `deadline_window` without an adaptive deadline):
the adaptive optimizers' moments with plain SGD, DiLoCo's outer momentum with an adaptive
outer optimizer, FedAdagrad's `beta2`, and the staleness function's `a` and `b` where the
chosen function has no such constant."""

from __future__ import annotations

from typing import Any

import pytest

from asyncsync.protocols.diloco import DilocoParams
from asyncsync.protocols.fedasync import FedAsyncParams
from asyncsync.protocols.fedavg import FedAvgParams
from asyncsync.protocols.fedbuff import FedBuffParams
from asyncsync.protocols.fednova import FedNovaParams
from asyncsync.protocols.local_sgd import LocalSgdParams
from asyncsync.protocols.scaffold import ScaffoldParams
from asyncsync.protocols.streaming_diloco import StreamingDilocoParams

SERVER_SIDE = [LocalSgdParams, FedAvgParams, FedBuffParams, FedNovaParams, ScaffoldParams]


@pytest.mark.parametrize("params", SERVER_SIDE)
@pytest.mark.parametrize(("key", "value"), [("beta1", 0.5), ("beta2", 0.5), ("tau", 0.1),
                                            ("bias_correction", False)])
def test_adaptive_keys_with_server_sgd_are_refused(params: Any, key: str, value: Any) -> None:
    with pytest.raises(ValueError, match=rf"^{key}: .*server_optimizer is 'sgd'"):
        params(**{key: value})
    params(**{key: value, "server_optimizer": "adam"})  # used there: accepted


@pytest.mark.parametrize("params", [DilocoParams, StreamingDilocoParams])
def test_diloco_keys_of_the_other_outer_optimizer_are_refused(params: Any) -> None:
    extra = {"inner_steps": 8, "fragments": 2, "overlap_steps": 1} \
        if params is StreamingDilocoParams else {}
    with pytest.raises(ValueError, match=r"^outer_momentum: .*outer_optimizer is 'adam'"):
        params(outer_optimizer="adam", outer_momentum=0.5, **extra)
    with pytest.raises(ValueError, match=r"^beta1: .*outer_optimizer is 'sgd'"):
        params(beta1=0.5, **extra)
    params(outer_optimizer="adam", beta1=0.5, **extra)
    params(outer_momentum=0.5, **extra)


def test_adagrad_takes_no_beta2() -> None:
    with pytest.raises(ValueError, match=r"^beta2: .*'adagrad'"):
        FedAvgParams(server_optimizer="adagrad", beta2=0.5)
    with pytest.raises(ValueError, match=r"^beta2: .*'adagrad'"):
        DilocoParams(outer_optimizer="adagrad", beta2=0.5)
    FedAvgParams(server_optimizer="adagrad", beta1=0.0)


@pytest.mark.parametrize("params", [FedAsyncParams, FedBuffParams])
def test_staleness_constants_of_another_function_are_refused(params: Any) -> None:
    with pytest.raises(ValueError, match=r"^a: .*'constant'"):
        params(staleness_fn="constant", a=2.0)
    with pytest.raises(ValueError, match=r"^b: .*'polynomial'"):
        params(b=10)
    with pytest.raises(ValueError, match=r"^b: .*'constant'"):
        params(staleness_fn="constant", b=10)
    params(staleness_fn="hinge", hinge_a=2.0, b=10)
    params(a=2.0)


def test_fednova_local_steps_with_a_budget_are_refused() -> None:
    """With a time budget the budget decides each round's steps; `local_steps` is unused."""
    with pytest.raises(ValueError, match=r"^local_steps: .*budget_s"):
        FedNovaParams(budget_s=0.5, local_steps=3)
    FedNovaParams(budget_s=0.5)
    FedNovaParams(local_steps=3)
