"""The console a report prints to (mutation testing of `asyncsync.results.layout`)."""

from __future__ import annotations

import io

import pytest

from asyncsync.results.layout import make_console


def test_a_pipe_gets_150_columns_unless_columns_is_set(monkeypatch: pytest.MonkeyPatch
                                                       ) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.setattr("sys.stdout", io.StringIO())  # not a terminal
    assert make_console().width == 150
    monkeypatch.setenv("COLUMNS", "60")
    assert make_console().width == 60

