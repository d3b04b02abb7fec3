"""`auto`'s own choice of one-by-one worker math is said once in the run's log, with why."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from asyncsync.study import worker_math
from asyncsync.study.specs import RunSpec
from tests.test_cohort import _run

SAID = "compute.batched = 'auto': the workers' steps run one by one"


def _said(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records
            if r.name == "asyncsync.simulation" and "one by one" in r.getMessage()]


def test_a_cpu_run_under_auto_says_once_that_its_steps_run_one_by_one_and_why(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="asyncsync.simulation"):
        _, facts = _run(tmp_path, "esync", "auto", "auto")
    assert facts["worker_math"] == "one-by-one"
    said = _said(caplog)
    assert len(said) == 1, [r.getMessage() for r in said]
    assert said[0].levelno == logging.INFO  # the expected path: not a warning
    assert said[0].getMessage() == f"{SAID}: a batched call does not pay on cpu"


def test_a_gpu_run_of_few_workers_under_auto_says_so_with_its_worker_count(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """auto refuses before it builds or probes anything, so no GPU is touched."""
    monkeypatch.setattr(worker_math, "resolve_device", lambda _: torch.device("cuda"))

    def never(*_: object) -> object:
        raise AssertionError("auto under 8 workers builds nothing")

    with caplog.at_level(logging.INFO, logger="asyncsync.simulation"):
        chosen = worker_math.choose_worker_math(RunSpec(workers=3), never, never)
    assert (chosen.path, chosen.fell_back) == ("one-by-one", False)
    said = _said(caplog)
    assert len(said) == 1 and said[0].levelno == logging.INFO
    assert said[0].getMessage() == (f"{SAID}: 3 worker(s): a batched call pays from 8 "
                                    "workers on a GPU")

