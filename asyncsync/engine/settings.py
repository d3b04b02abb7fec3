"""The typed settings of a parameter server."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ServerSettings:
    """How a server runs: its optimizer, budget, evaluation, fault handling.

    Attributes:
        run_id: requests must name this run.
        lr, momentum, weight_decay: the server optimizer (applied to gradient pushes).
        eval_interval_s: seconds between evaluations of the global model.
        eval_device: where the global model is evaluated (the run's compute device).
        eval_samples: evaluate on the first this many held-out samples (None: all).
        eval_batch: samples per evaluation batch.
        time_s: the run's budget (None: until stopped).
        target_accuracy: the time-to-accuracy threshold; stop_at_target: end the run there.
        patience_s: end the run once its best accuracy has not risen by `PATIENCE_GAIN`
            for this long (None: never).
        worker_timeout_s: drop a worker not heard from for this long (None: never).
        checkpoint_path: where to checkpoint (None: no checkpoints), every checkpoint_s.
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
        if self.max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {self.max_batch}")
        if self.eval_interval_s <= 0:
            raise ValueError(f"eval_interval_s must be > 0, got {self.eval_interval_s}")
        if self.eval_samples is not None and self.eval_samples < 1:
            raise ValueError(f"eval_samples must be >= 1 (or None), got {self.eval_samples}")
        if self.eval_batch < 1:
            raise ValueError(f"eval_batch must be >= 1, got {self.eval_batch}")
        if self.time_s is not None and self.time_s <= 0:
            raise ValueError(f"time_s must be > 0, got {self.time_s}")
        if self.worker_timeout_s is not None and self.worker_timeout_s <= 0:
            raise ValueError(f"worker_timeout_s must be > 0, got {self.worker_timeout_s}")
        if self.checkpoint_s <= 0:
            raise ValueError(f"checkpoint_s must be > 0, got {self.checkpoint_s}")
