"""An OSError from a library that names its file in bytes (TensorBoard's writer does) is
one readable ``error:`` line, not ``b'...'``."""

from __future__ import annotations

from pathlib import Path

import pytest

from asyncsync import cli
from tests.test_cli import one_error, run_main


def test_a_bytes_file_name_is_shown_as_text(capsys: pytest.CaptureFixture[str],
                                            monkeypatch: pytest.MonkeyPatch,
                                            tmp_path: Path) -> None:
    def refuse(*_args: object, **_kwargs: object) -> object:
        raise FileNotFoundError(2, "No such file or directory", b"/tb/run/events.out")

    monkeypatch.setattr(cli, "find_reports", refuse)
    assert one_error(run_main(capsys, "report", str(tmp_path))) == (
        "error: /tb/run/events.out: No such file or directory")
