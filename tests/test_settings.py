"""Constructor arguments of the embedding API (`ServerSettings`, `ParameterServer`,
`Worker`) are checked when made, with a message naming the argument and what it got."""

from __future__ import annotations

import math
from typing import Any

import pytest
from torch import nn

from asyncsync.engine.core import build_core
from asyncsync.engine.settings import ServerSettings
from asyncsync.engine.worker import Worker
from asyncsync.transport.http_server import ParameterServer
from asyncsync.transport.local import LocalTransport
from tests.helpers import batches_of, tiny_data, tiny_model


@pytest.mark.parametrize(("field", "value", "message"), [
    ("run_id", "", "run_id must be a non-empty str"),
    ("run_id", 5, "run_id must be a non-empty str"),
    ("lr", math.nan, "lr must be a finite number > 0"),
    ("lr", 0.0, "lr must be a finite number > 0"),
    ("momentum", 1.0, r"momentum must be in \[0, 1\)"),
    ("momentum", math.nan, r"momentum must be in \[0, 1\)"),
    ("weight_decay", math.nan, "weight_decay must be a finite number >= 0"),
    ("eval_interval_s", math.nan, "eval_interval_s must be a finite number > 0"),
    ("eval_samples", 2.5, "eval_samples must be an int >= 1"),
    ("eval_batch", 1.5, "eval_batch must be an int >= 1"),
    ("time_s", math.nan, "time_s must be > 0"),
    ("target_accuracy", 2.0, r"target_accuracy must be in \(0, 1\]"),
    ("target_accuracy", 0.0, r"target_accuracy must be in \(0, 1\]"),
    ("patience_s", -1.0, "patience_s must be > 0"),
    ("patience_s", math.nan, "patience_s must be > 0"),
    ("worker_timeout_s", math.nan, "worker_timeout_s must be > 0"),
    ("checkpoint_s", math.nan, "checkpoint_s must be a finite number > 0"),
    ("max_batch", 1.5, "max_batch must be an int >= 1"),
    ("max_batch", True, "max_batch must be an int >= 1"),
])
def test_bad_server_settings_are_refused_by_name(field: str, value: Any,
                                                 message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ServerSettings(**{field: value})


def test_the_default_settings_and_open_ends_are_accepted() -> None:
    ServerSettings()
    ServerSettings(time_s=math.inf, worker_timeout_s=None, patience_s=None,
                   target_accuracy=1.0, eval_samples=None)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"port": -1}, "port must be an int in 0-65535"),
    ({"port": 70000}, "port must be an int in 0-65535"),
    ({"workers": 2.5}, "workers must be an int >= 1"),
    ({"workers": "2"}, "workers must be an int >= 1"),
    # an empty token used to serve with no authentication, and without the warning that a
    # server beyond loopback without a token logs
    ({"token": "", "host": "0.0.0.0"}, "token must be a non-empty str"),
])
def test_bad_server_arguments_are_refused_by_name(kwargs: dict[str, Any],
                                                  message: str) -> None:
    args: dict[str, Any] = {"model": tiny_model(), "protocol": "asp", "workers": 1, **kwargs}
    with pytest.raises(ValueError, match=message):
        ParameterServer(**args)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"rank": -1}, "rank must be an int >= 0"),
    ({"rank": 1.5}, "rank must be an int >= 0"),
    ({"max_steps": 0}, "max_steps must be an int >= 1"),
    ({"max_steps": -3}, "max_steps must be an int >= 1"),
    ({"max_rejoins": -1}, "max_rejoins must be an int >= 0"),
])
async def test_bad_worker_arguments_are_refused_by_name(kwargs: dict[str, Any],
                                                        message: str) -> None:
    x, y = tiny_data()
    core = build_core(tiny_model(), "asp", 1, ServerSettings())
    args: dict[str, Any] = {"rank": 0, "transport": LocalTransport(core),
                            "model": tiny_model(), "batches": batches_of(x, y, 0), **kwargs}
    try:
        with pytest.raises(ValueError, match=message):
            Worker(**args)
    finally:
        await core.close()


def test_a_model_without_parameters_is_refused_by_the_server() -> None:
    """It used to be served, and each worker then failed in torch's backward ("element 0
    of tensors does not require grad")."""
    with pytest.raises(ValueError, match="the model has no parameters"):
        ParameterServer(nn.Sequential(nn.ReLU()), "asp", 1)
