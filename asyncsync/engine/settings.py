"""The typed settings of a parameter server."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from numbers import Real
from pathlib import Path


@dataclass(frozen=True)
class ServerSettings:
    """How a server runs: its optimizer, budget, evaluation, fault handling.

    Attributes:
        run_id: requests must name this run.
        lr, momentum, weight_decay: the server optimizer (applied to gradient pushes).
        eval_interval_s: seconds between evaluations of the global model.
        eval_device: where the global model is evaluated (the run's compute device).
        eval_samples: evaluate on this many held-out samples, a fixed seeded subset
            (`asyncsync.engine.evaluation.evaluated_rows`; None: all).
        eval_batch: samples per evaluation batch.
        time_s: the run's budget (None: until stopped).
        target_accuracy: the time-to-accuracy threshold; stop_at_target: end the run there.
        patience_s: end the run once its best accuracy has not risen by `PATIENCE_GAIN`
            for this long (None: never).
        worker_timeout_s: drop a worker not heard from for this long (None: never).
        checkpoint_path: where to checkpoint (None: no checkpoints), every checkpoint_s;
            a str is taken as a `Path`.
        max_batch: the most samples one step of a push may claim (a push weighs at most
            ``steps x max_batch`` samples where protocols weight by samples).
    """

    run_id: str = "run"
    lr: float = 0.05
    momentum: float = 0.0
    weight_decay: float = 0.0
    eval_interval_s: float = 2.0
    eval_device: str = "cpu"
    eval_samples: int | None = None
    eval_batch: int = 1000
    time_s: float | None = None
    target_accuracy: float | None = None
    stop_at_target: bool = False
    patience_s: float | None = None
    worker_timeout_s: float | None = 30.0
    checkpoint_path: Path | None = None
    checkpoint_s: float = 10.0
    max_batch: int = 65536

    def __post_init__(self) -> None:
        if not isinstance(self.run_id, str) or not self.run_id:
            raise ValueError(f"run_id must be a non-empty str, got {self.run_id!r}")
        for name in NUMBERS:
            value = getattr(self, name)
            if not (value is None and name in OPTIONAL) and (
                    not isinstance(value, Real) or isinstance(value, bool)):
                raise ValueError(f"{name} must be a number"
                                 f"{' (or None)' if name in OPTIONAL else ''}, got {value!r}")
        if self.checkpoint_path is not None:
            if not isinstance(self.checkpoint_path, str | os.PathLike):
                raise ValueError(f"checkpoint_path must be a path (a str or Path; None: no "
                                 f"checkpoints), got {self.checkpoint_path!r}")
            object.__setattr__(self, "checkpoint_path", Path(self.checkpoint_path))
        for name in ("lr", "eval_interval_s", "checkpoint_s"):
            if not 0 < getattr(self, name) < math.inf:
                raise ValueError(f"{name} must be a finite number > 0, got "
                                 f"{getattr(self, name)}")
        if not 0 <= self.momentum < 1:
            raise ValueError(f"momentum must be in [0, 1), got {self.momentum}")
        if not 0 <= self.weight_decay < math.inf:
            raise ValueError(f"weight_decay must be a finite number >= 0, got "
                             f"{self.weight_decay}")
        for name in ("max_batch", "eval_batch", "eval_samples"):
            if getattr(self, name) is not None or name != "eval_samples":
                require_int(name, getattr(self, name), 1)
        for name in ("time_s", "worker_timeout_s", "patience_s"):
            value = getattr(self, name)
            if value is not None and not value > 0:  # NaN too (inf: an open end, as None)
                raise ValueError(f"{name} must be > 0 (or None), got {value}")
        if not isinstance(self.eval_device, str) or not self.eval_device:
            raise ValueError(f"eval_device must be a device name such as 'cpu' or 'cuda', "
                             f"got {self.eval_device!r}")
        if not isinstance(self.stop_at_target, bool):
            raise ValueError(f"stop_at_target must be a bool, got {self.stop_at_target!r}")
        if self.target_accuracy is not None and not 0 < self.target_accuracy <= 1:
            raise ValueError(f"target_accuracy must be in (0, 1] (or None), got "
                             f"{self.target_accuracy}")


NUMBERS = ("lr", "momentum", "weight_decay", "eval_interval_s", "time_s", "target_accuracy",
           "patience_s", "worker_timeout_s", "checkpoint_s")
"""The settings that are numbers (a bool is not one)."""
OPTIONAL = frozenset({"time_s", "target_accuracy", "patience_s", "worker_timeout_s"})
"""Those of them that may be None."""


def require_int(name: str, value: object, least: int) -> None:
    """Refuse `value` (argument `name`) unless it is an int >= `least` (a bool is not)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
        raise ValueError(f"{name} must be an int >= {least}, got {value!r}")
