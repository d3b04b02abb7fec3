"""`ServerSettings` as a program fills it in: a str checkpoint path works, and a value of
the wrong type is refused with a ValueError naming the setting (docs/embedding.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from asyncsync import ServerSettings, build_core


async def test_a_str_checkpoint_path_is_written_to(tmp_path: Path) -> None:
    where = tmp_path / "run.ckpt"
    torch.manual_seed(0)
    settings = ServerSettings(checkpoint_path=str(where))  # type: ignore[arg-type]
    core = build_core(nn.Linear(4, 2), "asp", 1, settings)
    try:
        assert await core.run.checkpoint()  # before: AttributeError, the run ended "error"
    finally:
        await core.close()
    assert where.is_file()


@pytest.mark.parametrize(("setting", "value", "says"), [
    ("lr", "0.1", "lr must be a number, got '0.1'"),
    ("time_s", "60", "time_s must be a number (or None), got '60'"),
    ("lr", True, "lr must be a number, got True"),  # before: taken as lr = 1
    ("checkpoint_path", 3, "checkpoint_path must be a path"),
])
def test_a_value_of_the_wrong_type_is_refused_by_name(setting: str, value: object,
                                                      says: str) -> None:
    with pytest.raises(ValueError) as refused:
        ServerSettings(**{setting: value})  # type: ignore[arg-type]
    assert says in str(refused.value)
