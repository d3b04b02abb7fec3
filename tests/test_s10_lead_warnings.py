"""The server's warning about a worker that keeps sending NaN/Inf is not held back by the
rate limit meant for takeover lines: two diverged workers within a second are each named."""

from __future__ import annotations

import logging

import pytest

import asyncsync.transport.http_server  # noqa: F401  (installs the takeover lines' limit)
from asyncsync.engine.membership import WorkerRecord


def test_every_diverged_worker_is_named_within_a_second(caplog: pytest.LogCaptureFixture) -> None:
    records = [WorkerRecord(), WorkerRecord()]
    with caplog.at_level(logging.WARNING, logger="asyncsync.server"):
        for worker, record in enumerate(records):
            for _ in range(3):
                record.count_nonfinite(worker)
    assert "worker 0 has sent 3 non-finite updates" in caplog.text
    assert "worker 1 has sent 3 non-finite updates" in caplog.text
