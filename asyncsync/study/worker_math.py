"""Which path computes a virtual run's local steps: batched over the workers (a `Cohort`)
or one by one, as ``compute.batched`` asks and the model and device allow.

``auto`` batches on a CUDA device and computes one by one on a CPU, where a batched call
measured slower than the steps one after another (see docs/gpu.md and
``bench/gpu_virtual.py``). ``on`` batches wherever the model can be batched; ``off`` never
does. A run that would batch (``on``, or ``auto`` on CUDA from `AUTO_MIN_WORKERS` workers)
but whose model fails the batched probe says so once in the log (a warning, unless the
model is the timing stand-in, which never batches). ``auto``'s own choice of one by one
(on a CPU, or under `AUTO_MIN_WORKERS` workers on a GPU) is said once too, with its
reason, at INFO: it is the expected path, not a failure. summary.json records the path
and why (`WorkerMath.facts`), and ``worker_math_fallback`` where the log warned, so a
study's line for the run says it too (a child process's log is not shown).

**(choice)** The timing model's workers compute on the CPU whatever the run's ``device``:
its closed-form gradient keys its memo by the parameters' and batch's bytes, read on the
host (a stand-in on a GPU failed at its first step), and its few parameters would gain
nothing there.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from asyncsync.engine.cohort import Cohort
from asyncsync.study.specs import TIMING_MODEL, RunSpec
from asyncsync.training.batched import BatchedModel, flat_vector, not_batchable
from asyncsync.training.trainer import BatchSource, resolve_device

LOG = logging.getLogger("asyncsync.simulation")
BATCHED = "batched"
ONE_BY_ONE = "one-by-one"
PROBE_ROWS = 2
AUTO_MIN_WORKERS = 8
"""The fewest workers for which ``auto`` batches on a GPU (see `auto_refusal`)."""
PROBE_BATCH = 2


@dataclass
class WorkerMath:
    """The chosen path: the workers' device (the run's with its index, on either path; the
    CPU for the timing model), the cohort (None: one by one), why, and whether it fell back from
    batching that was asked for."""

    path: str
    reason: str
    device: str
    cohort: Cohort | None = None
    fell_back: bool = False

    def facts(self) -> dict[str, Any]:
        """What summary.json records of it."""
        facts: dict[str, Any] = {"worker_math": self.path, "worker_math_reason": self.reason,
                                 "worker_math_device": self.device}
        if self.fell_back:
            facts["worker_math_fallback"] = True
        if self.cohort is not None:
            facts.update(batched_calls=self.cohort.calls, batched_steps=self.cohort.steps)
        return facts


def choose_worker_math(spec: RunSpec, model: Callable[[], torch.nn.Module],
                       batches: Callable[[int], BatchSource]) -> WorkerMath:
    """The path of `spec`'s virtual run (`model` and `batches` as the run builds them)."""
    asked = spec.compute.batched
    device = resolve_device(spec.device)
    timing = spec.model.name == TIMING_MODEL
    workers_device = "cpu" if timing else str(with_index(device))
    if asked == "off":
        return WorkerMath(ONE_BY_ONE, 'compute.batched = "off"', workers_device)
    if asked == "auto":
        refusal = auto_refusal(device.type, spec.workers)
        if refusal is not None:
            LOG.info("compute.batched = 'auto': the workers' steps run one by one: %s",
                     refusal)
            return WorkerMath(ONE_BY_ONE, f"auto: {refusal}", workers_device)
    reason: str | None = "the timing model computes its gradient in closed form"
    if not timing:
        reason = _probe(model(), batches, device)
    if reason is not None:  # the timing model is meant to: no warning
        level = logging.INFO if timing else logging.WARNING
        LOG.log(level, "compute.batched = %r: the workers' steps run one by one: %s", asked,
                reason)
        return WorkerMath(ONE_BY_ONE, reason, workers_device,
                          fell_back=level == logging.WARNING)
    why = ("asked (compute.batched = \"on\")" if asked == "on"
           else f"auto: {device.type} device")
    LOG.info("the workers' steps run batched on %s (%s)", device, why)
    return WorkerMath(BATCHED, why, workers_device,
                      Cohort(BatchedModel(model(), device)))


def with_index(device: torch.device) -> torch.device:
    """`device` naming its index (``cuda`` is ``cuda:0`` where that is the current device),
    as the tensors made there name it.

    A trainer's device keys its borrowed gradients (`ScratchGradients`: taken by the
    trainer's device, given back by the vector's): with ``cuda`` against ``cuda:0`` no
    vector given back was ever found again, and each local step of a virtual run on a GPU
    made a new one and kept it (one model's size a step, 137 MB a round of the 1,000-client
    population's cnn: its memory full after some 570 rounds on an 80 GB GPU, by
    arithmetic; not seen, no GPU was lent). Where CUDA is absent (a test declaring it, a
    host without a driver) `device` is returned as it is: asking for the current device
    there raised instead of the run saying what it computes on.
    """
    if device.type == "cuda" and device.index is None and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return device


def auto_refusal(device_type: str, workers: int) -> str | None:
    """Why ``auto`` computes one by one (None: it batches).

    Measured with ``bench/gpu_virtual.py`` (docs/gpu.md): on a CPU a batched call was
    slower at every size; on an H200 one worker's batched step cost 2.0-3.5x its plain
    step (the mlp, the cnn, resnet18), and from 8 workers on it cost less (1.4-10x).
    """
    if device_type != "cuda":
        return f"a batched call does not pay on {device_type}"
    if workers < AUTO_MIN_WORKERS:
        return (f"{workers} worker(s): a batched call pays from {AUTO_MIN_WORKERS} workers "
                "on a GPU")
    return None


def _probe(module: torch.nn.Module, batches: Callable[[int], BatchSource],
           device: torch.device) -> str | None:
    """Why `module` cannot be batched (None: a batched gradient of a few rows ran)."""
    reason = not_batchable(module)
    if reason is not None:
        return reason
    try:
        batched = BatchedModel(module, device)
        rows = flat_vector(batched.template).to(device).repeat(PROBE_ROWS, 1)
        counters = {name: batched.template.get_buffer(name).unsqueeze(0)
                    .repeat(PROBE_ROWS, *[1] * batched.template.get_buffer(name).dim())
                    for name in batched.counters}
        batch = batches(0)(PROBE_BATCH)  # a fresh sampler: the run's own draws are untouched
        batched.gradients(rows, counters, [batch] * PROBE_ROWS)
    except Exception as exc:  # any failure of vmap or functional_call means: one by one
        return f"a batched gradient failed ({type(exc).__name__}: {str(exc)[:200]})"
    return None
