"""`ServerSettings` refuses, by name, values an embedder may pass that the run cannot use:
an evaluation device that is not a device name, and a `stop_at_target` that is not a bool.
Both were accepted before: `eval_device=5` failed only at the first evaluation, and
`stop_at_target=1` passed as true. (An infinite budget or timeout is an open end, as None
is: tests/test_settings.py.)"""

from __future__ import annotations

from typing import Any

import pytest

from asyncsync.engine.settings import ServerSettings


@pytest.mark.parametrize(("field", "value", "refused"), [
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
