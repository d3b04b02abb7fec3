"""Virtual mode, batched: the workers' pending local computations run as one call.

In virtual time a step's duration comes from the cost model, not from its math, and its
result is read only when the clock reaches the step's end. So a `CohortWorkerSeam` does
not compute a step when it starts: it draws the step's batch, files the step with the
run's `Cohort` and sleeps the step's virtual duration. When the first filed step falls
due (its worker wakes and finds no result), the cohort computes every filed step at once
(`asyncsync.training.batched`), grouped by what they compute, each worker on its own
parameters, buffers, momentum, batch and batch size. The event order is the one-by-one
seam's (`VirtualWorkerSeam`): the timing never reads the math.

A step must compute on the state its worker had when the step began. Nothing else of a
worker may touch its trainer while a step of it is filed: its seam's `math` and `defer`
(adopting a pulled model, mixing, copies) first have the cohort compute what is filed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import torch

from asyncsync.clock import sleep, wall
from asyncsync.engine.compute import Charged, VirtualWorkerSeam
from asyncsync.engine.work import LocalWork
from asyncsync.hetero.compute import ComputeProfile, StepCost, step_seconds
from asyncsync.training.batched import BatchedModel, sgd_rows
from asyncsync.training.data import BatchSampler, Dataset
from asyncsync.training.trainer import Computed, Trainer

T = TypeVar("T")
GroupKey = tuple[Any, ...]
RESIDENT_BYTES = 4 << 30
"""A training split up to this size is copied to a GPU once, where the cohort gathers each
call's batches (4 GiB: CIFAR-10 in float32 is 0.6 GB); a larger one stays in host memory."""


class Filed:
    """A step filed with a cohort: its work, its batch (drawn when it began: as rows of
    the training split when the worker's batches come from a `BatchSampler`, gathered
    with the other steps' at the call) and, once computed, its result."""

    __slots__ = ("batch", "result", "rows", "sampler", "size", "work")

    def __init__(self, work: LocalWork) -> None:
        self.work = work
        source = work.trainer.batches
        self.sampler = source if isinstance(source, BatchSampler) else None
        self.batch: tuple[torch.Tensor, torch.Tensor] | None = None
        if self.sampler is not None:
            self.rows = self.sampler.rows(work.batch_size)
            self.size = work.batch_size
        else:
            self.batch = source(work.batch_size)
            self.size = len(self.batch[1])  # a source may keep a size of its own
        self.result: Computed | None = None

    def sample_shape(self) -> tuple[int, ...]:
        """The shape of one input sample."""
        if self.sampler is not None:
            return self.sampler.data.input_shape
        return tuple(self.drawn()[0].shape[1:])

    def drawn(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch itself."""
        if self.sampler is not None:
            return self.sampler.gather(self.rows)
        assert self.batch is not None  # drawn from its source when filed
        return self.batch


class Cohort:
    """A run's filed steps, computed together when one of them falls due.

    Args:
        model: the batched math of the run's model (every worker trains this model).
    """

    def __init__(self, model: BatchedModel) -> None:
        self.model = model
        self.real_s = 0.0
        """Real seconds spent computing (a virtual run's math time)."""
        self.calls = 0
        """Batched calls made (a group of filed steps, or a chunk of one)."""
        self.steps = 0
        """Steps computed."""
        self._filed: list[Filed] = []
        self._resident: tuple[Dataset, torch.Tensor, torch.Tensor] | None = None

    def file(self, work: LocalWork) -> Filed:
        """File `work` (its batch is drawn now); computed at the latest by `compute`."""
        filed = Filed(work)
        self._filed.append(filed)
        return filed

    def compute(self) -> None:
        """Compute every filed step."""
        filed, self._filed = self._filed, []
        if not filed:
            return
        began = wall()
        groups: dict[GroupKey, list[Filed]] = {}
        pads = self.model.can_pad(filed[0].drawn)
        for one in filed:
            groups.setdefault(self._key(one, pads), []).append(one)
        for members in groups.values():
            widest = max(f.size for f in members)
            rows = self.model.rows_per_call(widest, members[0].sample_shape())
            for at in range(0, len(members), rows):
                self._run(members[at : at + rows])
        self.steps += len(filed)
        self.real_s += wall() - began

    @staticmethod
    def _key(filed: Filed, pads: bool) -> GroupKey:
        """Steps of one key share a call: same kind, terms and optimizer settings, and the
        same batch size unless the model `pads`."""
        work, optimizer = filed.work, filed.work.trainer.optimizer
        size = None if pads else filed.size
        return (work.local, size, work.center is not None, work.correction is not None,
                work.rho, optimizer.lr, optimizer.momentum, optimizer.weight_decay)

    def _run(self, members: list[Filed]) -> None:
        """One batched call over `members` (one group), written back to their trainers."""
        self.calls += 1
        model, device = self.model, self.model.device
        trainers = [f.work.trainer for f in members]
        n = model.num_params
        rows = torch.stack([t.flat.detach() for t in trainers]).to(device)
        counters = {name: torch.stack([_counter(t, name) for t in trainers]).to(device)
                    for name in model.counters}
        grads, losses = model.stacked_gradients(rows, counters, *self._inputs(members))
        work = members[0].work
        with torch.no_grad():
            if work.local:
                _local_steps(rows, grads, members, trainers, device, model.frozen)
            for i, trainer in enumerate(trainers):
                if not work.local:  # a local step's gradient is never read again
                    trainer.params.grad[:n].copy_(grads[i])
                trainer.flat.copy_(rows[i])
                for name, values in counters.items():
                    _counter(trainer, name).copy_(values[i])
        for filed, loss in zip(members, losses.tolist(), strict=True):
            filed.result = Computed(float(loss), filed.size)

    def _inputs(self, members: list[Filed],
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """The group's batches stacked on the device (`BatchedModel.stack`): gathered in
        one call when they are equal rows of one training split, as they are in a run."""
        first = members[0]
        data = None if first.sampler is None else first.sampler.data
        if data is None or any(f.sampler is None or f.sampler.data is not data
                               or f.size != first.size for f in members):
            return self.model.stack([f.drawn() for f in members])
        inputs, targets = self._split_on_device(data)
        rows = torch.tensor([row for f in members for row in f.rows], device=inputs.device)
        shape = (len(members), first.size)
        x = inputs.index_select(0, rows).view(*shape, *inputs.shape[1:])
        y = targets.index_select(0, rows).view(shape)
        return x.to(self.model.device), y.to(self.model.device), None

    def _split_on_device(self, data: Dataset) -> tuple[torch.Tensor, torch.Tensor]:
        """`data`'s training split, copied to the device once (a run's workers share one
        dataset) if it fits in `RESIDENT_BYTES`; else the rows are gathered where it is,
        then copied."""
        if self._resident is None or self._resident[0] is not data:
            inputs, targets = data.train_x, data.train_y
            if inputs.nbytes + targets.nbytes <= RESIDENT_BYTES:
                inputs, targets = inputs.to(self.model.device), targets.to(self.model.device)
            self._resident = (data, inputs, targets)
        return self._resident[1], self._resident[2]


def _local_steps(rows: torch.Tensor, grads: torch.Tensor, members: list[Filed],
                 trainers: list[Trainer], device: torch.device, frozen: list[slice]) -> None:
    """`Trainer.local_step`'s update over the rows of one group, in place (none to the
    `frozen` columns)."""
    work, optimizer = members[0].work, trainers[0].optimizer
    n = grads.shape[1]
    params = rows[:, :n]
    g = grads
    if work.center is not None:
        g = g + work.rho * (params - _stacked([f.work.center for f in members], n, device))
    if work.correction is not None:
        g = g + _stacked([f.work.correction for f in members], n, device)
    momentum = None
    if optimizer.momentum:
        held = [t.optimizer.momentum_buffer for t in trainers]
        if any(b is not None for b in held):
            momentum = torch.stack([torch.zeros_like(g[0]) if b is None else b
                                    for b in held])
    step, buffer = sgd_rows(params, g, momentum, optimizer.lr, optimizer.momentum,
                            optimizer.weight_decay)
    for columns in frozen:
        step[:, columns] = 0.0
    params.sub_(step)
    if buffer is not None:  # each its own copy: a row view would keep the stack alive
        for i, trainer in enumerate(trainers):
            trainer.optimizer.momentum_buffer = buffer[i].clone()


def _stacked(vectors: list[torch.Tensor | None], n: int, device: torch.device
             ) -> torch.Tensor:
    """The first `n` elements of each of a group's vectors (all given: the group's key
    says so), as rows on `device`."""
    return torch.stack([v[:n] for v in vectors if v is not None]).to(device)


def _counter(trainer: Trainer, name: str) -> torch.Tensor:
    """A trainer's non-floating buffer (e.g. a BatchNorm's ``num_batches_tracked``)."""
    return trainer.params.module.get_buffer(name)


class CohortWorkerSeam(VirtualWorkerSeam):
    """Virtual mode: a step's math is filed with the run's `Cohort` and computed with the
    other workers' when the first filed step falls due; the step is charged as by
    `VirtualWorkerSeam`."""

    def __init__(self, profile: ComputeProfile, cost: StepCost, cohort: Cohort) -> None:
        super().__init__(profile, cost)
        self.cohort = cohort
        self._filed: Filed | None = None

    def _settle(self) -> None:
        """Have this worker's filed step computed (before anything else touches it)."""
        if self._filed is not None and self._filed.result is None:
            self.cohort.compute()
        self._filed = None

    async def math(self, fn: Callable[..., T], *args: Any) -> T:
        self._settle()
        return fn(*args)

    def defer(self, fn: Callable[..., object], *args: Any) -> None:
        self._settle()
        fn(*args)

    async def step(self, fn: Callable[..., Any], *args: Any, batch: int = 0) -> Charged:
        self._settle()
        if not isinstance(fn, LocalWork) or args:
            return await super().step(fn, *args, batch=batch)
        filed = self._filed = self.cohort.file(fn)
        seconds = step_seconds(self.profile, self.run_time.elapsed(), self.cost, batch)
        await sleep(seconds)
        self._settle()
        assert filed.result is not None
        return Charged(fn.finish(filed.result), seconds, seconds / self.cost.base_s(batch))
