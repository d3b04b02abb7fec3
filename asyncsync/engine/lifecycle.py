"""The run's lifecycle: its clock, budget, periodic evaluation and checkpoints, stop."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from asyncsync.engine.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from asyncsync.engine.evaluation import EvalPoint, Evaluator
from asyncsync.engine.settings import ServerSettings
from asyncsync.engine.store import ParameterStore
from asyncsync.runlog.metrics import JsonlLog
from asyncsync.runlog.schema import Kind, record

if TYPE_CHECKING:
    from asyncsync.protocols.base import ServerRule

LOG = logging.getLogger("asyncsync.server")

PATIENCE_GAIN = 0.01
"""With `patience_s`, a rise of the best accuracy by less than this does not count: a run
hovering at chance level sets tiny new bests by noise alone."""


class RunLifecycle:
    """Starts the run's clock and its periodic tasks, and ends the run.

    A periodic task that fails (an evaluation the model or test data cannot do, say) ends
    the run: it is logged, the run stops with reason ``error`` (no final evaluation), and
    `ServerCore.close` raises the error, so the run fails with it instead of going on
    without its evaluations.

    Attributes:
        evals: every evaluation so far.
        started: whether the run's clock runs; stopped: whether `stop` completed.
        failure: the error of a periodic task that failed (None: none did).
    """

    def __init__(self, settings: ServerSettings, store: ParameterStore, rule: ServerRule,
                 events: JsonlLog, evaluator: Evaluator | None,
                 on_stopped: Callable[[], None] = lambda: None, fingerprint: str = "") -> None:
        self.settings = settings
        self.fingerprint = fingerprint
        self.store = store
        self.rule = rule
        self.events = events
        self.evaluator = evaluator
        self.on_stopped = on_stopped
        self.evals: list[EvalPoint] = []
        self.checkpoint_failures = 0
        self.started = False
        self.stopped = False
        self.failure: BaseException | None = None
        self._tasks: list[asyncio.Task[Any]] = []

    def elapsed(self) -> float:
        """Seconds of the run so far (0 before it starts)."""
        return self.store.now() if self.started else 0.0

    def log(self, event: str, flush: bool = False, **fields: object) -> None:
        """Write an event (a `Kind`) stamped with the run's time."""
        self.events.write(record(event, t=round(self.elapsed(), 3), **fields), flush)

    def start(self, elapsed: float = 0.0, *extra: Callable[[], Coroutine[Any, Any, None]]
              ) -> None:
        """Start the clock (at `elapsed` seconds when resuming) and the periodic tasks,
        with `extra` ones (e.g. the membership monitor)."""
        self.store.run_time.start(elapsed)
        self.started = True
        jobs: list[Callable[[], Coroutine[Any, Any, None]]] = [self._budget, *extra]
        if self.evaluator is not None:
            jobs.append(self._evaluations)
        if self.settings.checkpoint_path is not None:
            jobs.append(self._checkpoints)
        for job in jobs:
            task = asyncio.create_task(job(), name=job.__name__.strip("_"))
            task.add_done_callback(self._task_done)
            self._tasks.append(task)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        """End the run with the error of a periodic task that failed."""
        if task.cancelled() or task.exception() is None or self.failure is not None:
            return
        self.failure = task.exception()
        LOG.error("the run's %s task failed; the run stops", task.get_name(),
                  exc_info=self.failure)
        self._tasks.append(asyncio.ensure_future(self.stop(reason="error")))

    async def _budget(self) -> None:
        if self.settings.time_s is not None:
            await asyncio.sleep(max(0.0, self.settings.time_s - self.elapsed()))
            await self.stop()

    async def _evaluations(self) -> None:
        """Evaluate every `eval_interval_s`; stop at the target when asked to, and give up
        when the accuracy has not risen for `patience_s`."""
        target, patience = self.settings.target_accuracy, self.settings.patience_s
        first = self.elapsed()
        best, best_t, done = -1.0, first, 0
        while not self.store.stopping:
            point = await self.evaluate()
            if self.settings.stop_at_target and target is not None and point.accuracy >= target:
                await self.stop()
                return
            if point.accuracy >= best + PATIENCE_GAIN:
                best, best_t = point.accuracy, point.t
            elif patience is not None and point.t - best_t >= patience:
                await self.stop(reason="patience")
                return
            done += 1  # (the instants multiply the interval: a sum would drift off ties)
            await asyncio.sleep(max(0.0, first + done * self.settings.eval_interval_s
                                    - self.elapsed()))

    async def evaluate(self) -> EvalPoint:
        """Evaluate the rule's evaluation vector through the server's seam, and log it."""
        assert self.evaluator is not None
        vector, version, t = self.rule.eval_vector(), self.store.version, self.elapsed()
        accuracy, loss = await self.store.seam.evaluate(self.evaluator, vector)
        point = EvalPoint(round(t, 3), version, accuracy, loss)
        self.evals.append(point)
        self.events.write(record(Kind.EVAL, t=point.t, version=version, accuracy=accuracy,
                                 loss=loss))
        return point

    async def _checkpoints(self) -> None:
        while not self.store.stopping:
            await asyncio.sleep(self.settings.checkpoint_s)
            if not self.store.stopping:
                await self.checkpoint()

    async def checkpoint(self) -> bool:
        """Write model, version, optimizer and rule state atomically; returns whether it was
        written. A failed write (disk full, a path that became a directory) is logged and
        counted, and leaves the last good checkpoint in place; it never ends the run."""
        path = self.settings.checkpoint_path
        assert path is not None
        async with self.store.lock:
            arrays = {"w": self.store.w, "version": torch.tensor(self.store.version),
                      "elapsed": torch.tensor(self.elapsed(), dtype=torch.float64)}
            if self.store.optimizer.momentum_buffer is not None:
                arrays["momentum"] = self.store.optimizer.momentum_buffer.clone()
            arrays.update({f"rule.{k}": v.clone() for k, v in self.rule.state_dict().items()})
        try:
            await self.store.seam.blocking(save_checkpoint, path, self.settings.run_id,
                                           self.fingerprint, arrays)
        except OSError as exc:
            self.checkpoint_failures += 1
            LOG.warning("checkpoint %d to %s failed (%s); the last good one stays, retrying "
                        "at the next period", self.checkpoint_failures, path, exc)
            self.log(Kind.CHECKPOINT_FAILED, flush=True, version=int(arrays["version"]),
                     error=str(exc)[:200], failures=self.checkpoint_failures)
            return False
        self.log(Kind.CHECKPOINT, flush=True, version=int(arrays["version"]))
        return True

    def restore(self, path: Path) -> float:
        """Load the checkpoint at `path` into the store and rule; returns the run time it
        was taken at."""
        arrays = load_checkpoint(path, self.settings.run_id, self.fingerprint)
        w, momentum = arrays["w"], arrays.get("momentum")
        if w.shape != self.store.w.shape or w.dtype != self.store.w.dtype:
            raise CheckpointError(f"checkpoint {path} holds {w.numel()} values of {w.dtype}, "
                                  f"the model {self.store.w.numel()} of {self.store.w.dtype}")
        if momentum is not None and (momentum.shape != (self.store.num_params,)
                                     or momentum.dtype != w.dtype):
            raise CheckpointError(f"checkpoint {path}: momentum holds {list(momentum.shape)} "
                                  f"of {momentum.dtype}, the model's parameters "
                                  f"[{self.store.num_params}] of {w.dtype}")
        version = int(scalar(path, arrays, "version"))
        elapsed = scalar(path, arrays, "elapsed")
        # the rule's state first: when it is refused, the store is as it was
        self.rule.load_state_dict({k.removeprefix("rule."): v for k, v in arrays.items()
                                   if k.startswith("rule.")})
        self.store.w, self.store.version = w, version
        self.store.optimizer.momentum_buffer = momentum
        return elapsed

    async def stop(self, reason: str | None = None) -> bool:
        """End the run: release every waiter, evaluate the final model (unless its version
        was just evaluated, as when the run stops at its target), checkpoint, log the totals,
        then call `on_stopped`, whoever stopped it (a request, the budget, the target).

        Args:
            reason: why, when the run gave up (``patience``); logged in the stop record.

        Returns False when the run was already stopping.
        """
        if self.store.stopping:
            return False
        self.store.stop()
        stopped_at = round(self.elapsed(), 3)
        if self.evaluator is not None and self.started and self.failure is None and (
                not self.evals or self.evals[-1].version != self.store.version):
            await self.evaluate()  # (a model already evaluated is not scored twice)
        if self.settings.checkpoint_path is not None and self.started:
            await self.checkpoint()
        stale = self.store.staleness
        dropped = self.rule.dropped()
        self.events.write(record(Kind.STOP, t=stopped_at, versions=self.store.version,
                                 updates=stale.count, mean_staleness=stale.mean,
                                 max_staleness=stale.maximum,
                                 **({"dropped": dropped} if dropped else {}),
                                 **({"reason": reason} if reason else {})), flush=True)
        self.stopped = True
        self.on_stopped()
        return True

    async def close(self) -> None:
        """Cancel the periodic tasks (their errors are `failure`'s business)."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


def scalar(path: Path, arrays: dict[str, torch.Tensor], key: str) -> float:
    """A checkpoint's single non-negative number `key` (the version, the elapsed time)."""
    value = arrays[key]
    if value.numel() != 1 or value.is_complex() or not float(value) >= 0:
        raise CheckpointError(f"checkpoint {path}: {key} must be one number >= 0, got "
                              f"{value.numel()} values {value.flatten()[:3].tolist()}")
    return float(value)
