"""A worker's local computation, described rather than closed over.

`WorkerContext` hands its seam a `LocalWork`: called, it computes at once, as any step
function (every seam can run it); a seam that batches workers' math
(`asyncsync.engine.cohort`) reads what it computes instead (a gradient or a local SGD step,
of which trainer, on how many samples, with which proximal or correction term) and
computes it later, together with other workers', then calls `finish`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from asyncsync.training.trainer import Computed, Trainer


@dataclass(slots=True, eq=False)
class LocalWork:
    """One gradient (``local=False``) or one local SGD step of `trainer` on `batch_size`
    samples.

    Attributes:
        trainer: whose parameters, buffers, optimizer and batches it uses.
        batch_size: samples of its batch.
        local: a local SGD step (`Trainer.local_step`); else a gradient (`Trainer.gradient`).
        center: the center of a local step's proximal term (``rho/2 ||x - center||^2``).
        rho: the weight of that proximal term.
        correction: a local step's gradient correction (added to the gradient).
        copy: a gradient is handed back as a copy (else the trainer's own vector, see
            `Trainer.gradient_vector`).
    """

    trainer: Trainer
    batch_size: int
    local: bool = False
    center: torch.Tensor | None = None
    rho: float = 0.0
    correction: torch.Tensor | None = None
    copy: bool = True

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if not self.local and (self.center is not None or self.correction is not None):
            raise ValueError("a gradient takes no proximal or correction term")

    def __call__(self) -> tuple[Computed, torch.Tensor | None]:
        """Compute now and finish."""
        return self.finish(self.compute())

    def compute(self) -> Computed:
        """The computation itself, one by one."""
        if self.local:
            return self.trainer.local_step(self.batch_size, self.center, self.rho,
                                           self.correction)
        return self.trainer.gradient(self.batch_size)

    def finish(self, computed: Computed) -> tuple[Computed, torch.Tensor | None]:
        """What the worker gets once computed: a gradient's vector beside its result (None
        after a local step)."""
        if self.local:
            return computed, None
        trainer = self.trainer
        return computed, trainer.gradient_copy() if self.copy else trainer.gradient_vector()
