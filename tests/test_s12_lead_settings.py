"""`ServerSettings` refuses, by name, values an embedder may pass that the run cannot use:
an infinite budget or timeout (None says "never"), an evaluation device that is not a
device name, and a `stop_at_target` that is not a bool. They were accepted before: an
infinite `time_s` left a virtual run a timer at infinity, `eval_device=5` failed at the
first evaluation, and `stop_at_target=1` passed as true."""

from __future__ import annotations

import math
from typing import Any

import pytest

from asyncsync.engine.settings import ServerSettings


@pytest.mark.parametrize(("field", "value", "refused"), [
    ("time_s", math.inf, r"time_s must be a finite number > 0 \(None: never\), got inf"),
    ("patience_s", math.inf, r"patience_s must be a finite number > 0"),
    ("worker_timeout_s", math.inf, r"worker_timeout_s must be a finite number > 0"),
    ("time_s", math.nan, r"time_s must be a finite number > 0"),
    ("eval_device", 5, r"eval_device must be a device name .*, got 5"),
    ("eval_device", "", r"eval_device must be a device name .*, got ''"),
    ("stop_at_target", 1, r"stop_at_target must be a bool, got 1"),
])
def test_an_unusable_setting_is_refused_by_name(field: str, value: Any, refused: str) -> None:
    with pytest.raises(ValueError, match=refused):
        ServerSettings(**{field: value})


def test_the_usable_forms_are_kept() -> None:
    settings = ServerSettings(time_s=3.5, patience_s=None, worker_timeout_s=None,
                              eval_device="cuda:1", stop_at_target=True)
    assert (settings.time_s, settings.eval_device, settings.stop_at_target) == (
        3.5, "cuda:1", True)
