"""Local computation: a model whose parameters live in one flat vector, and its steps.

All parameters and floating-point buffers (e.g. BatchNorm statistics) are views into one
contiguous 1-D tensor ``flat``; gradients are views into ``grad``. Deltas, averages and
wire transfers are single vector operations. The methods here are synchronous and take no
time of their own: the worker's compute seam runs and times them, never on the event loop.
The vectors stay on the trainer's device; every copy to or from the host goes through
`asyncsync.training.device_copies` (on CUDA: pinned buffers, a side stream and events, no
device-wide synchronization; a step returns once its loss is on the host).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import NamedTuple, Protocol, runtime_checkable

import torch
import torch.nn.functional as F
from torch import nn

from asyncsync.training.device_copies import DeviceCopies, copies_for
from asyncsync.training.optim import FlatSGD

BatchSource = Callable[[int], tuple[torch.Tensor, torch.Tensor]]
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@runtime_checkable
class ShardBatchSource(Protocol):
    """A `BatchSource` that draws from a shard of known size (e.g.
    `asyncsync.training.data.BatchSampler`), in reshuffled epochs."""

    @property
    def shard_size(self) -> int:
        """The samples in the shard."""
        ...

    def __call__(self, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The next `batch_size` samples."""
        ...


def resolve_device(name: str) -> torch.device:
    """``auto`` is CUDA when present, else CPU; other names are passed to torch."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} requested but CUDA is not available")
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        raise ValueError(f"device {name!r} requested but this host has "
                         f"{torch.cuda.device_count()} CUDA device(s)")
    return device


def model_numel(model: nn.Module) -> int:
    """The length of `model`'s flat vector (parameters, then floating buffers), as
    `FlatModule` lays it out: the most elements a reply vector may have."""
    params = sum(p.numel() for p in model.parameters())
    return params + sum(buf.numel() for owner in model.modules()
                        for buf in owner.buffers(recurse=False)
                        if buf is not None and buf.is_floating_point())


class FlatModule:
    """Re-homes a module's parameters and floating buffers into one flat vector."""

    def __init__(self, module: nn.Module, device: torch.device) -> None:
        module.to(device)
        params = list(module.parameters())
        buffers = [
            (owner, name, buf)
            for owner in module.modules()
            for name, buf in owner.named_buffers(recurse=False)
            if buf is not None and buf.is_floating_point()
        ]
        self.num_params = sum(p.numel() for p in params)
        self.frozen: list[slice] = []
        """The slices of parameters without ``requires_grad``: a local step leaves them as
        they are (as torch's optimizers skip a parameter without a gradient), weight decay,
        momentum, proximal and correction terms included."""
        total = self.num_params + sum(buf.numel() for _, _, buf in buffers)
        self.module = module
        self.flat = torch.empty(total, device=device)
        self._grad: torch.Tensor | None = None
        self._viewed: torch.Tensor | None = None  # the vector the ``.grad`` views are of
        self._slots: list[tuple[nn.Parameter, slice]] = []
        offset = 0
        with torch.no_grad():
            for p in params:
                n = p.numel()
                if not p.requires_grad:
                    self.frozen.append(slice(offset, offset + n))
                self.flat[offset : offset + n].copy_(p.flatten())
                p.data = self.flat[offset : offset + n].view_as(p)
                self._slots.append((p, slice(offset, offset + n)))
                offset += n
            for owner, name, buf in buffers:
                n = buf.numel()
                self.flat[offset : offset + n].copy_(buf.flatten())
                owner._buffers[name] = self.flat[offset : offset + n].view_as(buf)
                offset += n

    @property
    def grad(self) -> torch.Tensor:
        """The flat gradient, each parameter's ``.grad`` a view into it. Made (zeros) at
        its first use: a holder that never computes (the server's model, an evaluator)
        has none, and a trainer's own is made by its first gradient."""
        if self._grad is None:
            self.attach_grad(torch.zeros_like(self.flat))
        assert self._grad is not None
        return self._grad

    @property
    def holds_grad(self) -> bool:
        """Whether a flat gradient is attached (its own or a borrowed one)."""
        return self._grad is not None

    def attach_grad(self, grad: torch.Tensor | None) -> None:
        """Make `grad` (the flat vector's length) the flat gradient, every parameter's
        ``.grad`` a view of it; or hold none (None). The views of the last vector attached
        stay in place until another is attached: a vector lent again and again to the same
        module (`ScratchGradients`) is attached once, and a module that holds none is never
        computed on (the trainer attaches a vector first)."""
        self._grad = grad
        if grad is not None and grad is not self._viewed:
            for p, columns in self._slots:
                p.grad = grad[columns].view_as(p)
            self._viewed = grad


@contextlib.contextmanager
def running_statistics_for_one_sample(module: nn.Module, samples: int) -> Iterator[None]:
    """For a batch of one sample, put `module`'s training BatchNorm layers in eval mode
    inside the block (and back in training mode after it); for larger batches, do nothing.

    **(choice)** A batch of one has no batch statistics: PyTorch refuses a training
    BatchNorm a single value per channel (BatchNorm1d, or a map pooled to 1x1), and where
    it does not, one sample's statistics are noise. Such a batch reaches a worker at FedAvg's
    last step of E epochs when E n_k mod B is 1, or from LB-BSP's smallest batches. PyTorch's
    DataLoader would drop it (``drop_last``), but protocols weight updates by samples and
    refuse a push of none, so the sample is trained on instead, its BatchNorm layers
    normalizing with their running statistics, which it leaves as they are.
    """
    layers = [layer for layer in module.modules()
              if isinstance(layer, nn.modules.batchnorm._BatchNorm) and layer.training
              ] if samples == 1 else []
    for layer in layers:
        layer.eval()
    try:
        yield
    finally:
        for layer in layers:
            layer.train()


@runtime_checkable
class ClosedFormGradient(Protocol):
    """A module that computes its cross-entropy gradient itself, without autograd (the
    timing-only stand-in: its thousands of steps would each pay a backward pass)."""

    def cross_entropy_gradient(self, inputs: torch.Tensor, targets: torch.Tensor,
                               grad: torch.Tensor) -> torch.Tensor:
        """Write the gradient of the mean cross-entropy into `grad` (the flat gradient,
        zeroed) and return the loss, as autograd would (the module's training mode is not
        set: such a module has no layer that reads it)."""
        ...


class ScratchGradients:
    """Flat gradient vectors lent to trainers for one local step each.

    A local step reads its gradient only inside the step (the next computation zeroes it
    first), so a trainer given a `ScratchGradients` (`Trainer.scratch`) holds no gradient
    between its local steps: it borrows one for the step and gives it back. Workers that
    are not computing then hold their parameters alone. In a virtual run, whose steps run
    one at a time, one vector serves every worker: 1,000 clients of the cnn keep 0.55 GB
    of parameters and no longer 0.55 GB of gradients beside them. A plain gradient
    (`Trainer.gradient`) still goes to the trainer's own vector, which a gradient push may
    send as it is (`Trainer.gradient_vector`). Thread-safe: each borrower gets a vector of
    its own.

    A module's ``.grad`` views stay on the last vector it borrowed (`FlatModule.attach_grad`):
    in a virtual run the one vector comes back every step, and making and setting a view
    per parameter at every step cost 0.28 ms of a cnn step of 15 ms (profiled on 2 busy
    cores). They keep alive only vectors this lender made, never a worker's own memory.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._free: dict[tuple[int, torch.device], list[torch.Tensor]] = {}

    def take(self, numel: int, device: torch.device) -> torch.Tensor:
        """A vector of `numel` elements on `device`, contents arbitrary, the caller's until
        it gives it back. A new one is made only when every one made is lent: there are
        never more than the steps that ran at once (one, in a virtual run)."""
        with self._lock:
            free = self._free.get((numel, device))
            if free:
                return free.pop()
        return torch.empty(numel, device=device)

    def give_back(self, vector: torch.Tensor) -> None:
        """Take back a vector of `take` (its borrower no longer writes to it)."""
        with self._lock:
            self._free.setdefault((vector.numel(), vector.device), []).append(vector)


class Computed(NamedTuple):
    """What one local computation produced: its loss and the samples it used."""

    loss: float
    samples: int


class Trainer:
    """A model, its batch source and local optimizer, driven one step at a time.

    Args:
        model: the module to train; its parameters are moved into a flat vector.
        batches: returns ``(inputs, targets)`` for a requested batch size.
        lr, momentum, weight_decay: the local SGD settings (used by local-step protocols).
        loss_fn: defaults to cross-entropy.
        device: ``auto``, ``cpu``, ``cuda`` or ``cuda:i``.
    """

    def __init__(
        self,
        model: nn.Module,
        batches: BatchSource,
        lr: float = 0.05,
        momentum: float = 0.0,
        weight_decay: float = 0.0,
        loss_fn: LossFn = F.cross_entropy,
        device: str = "auto",
    ) -> None:
        self.params = FlatModule(model, resolve_device(device))
        self.device = self.params.flat.device
        """Where the vectors live, with its index as their tensors name it (``cuda:0``, not
        ``cuda``): `ScratchGradients` lends by it and takes back by the vector's device."""
        self.copies = copies_for(self.device, self.numel)
        self.batches = batches
        self.loss_fn = loss_fn
        self.optimizer = FlatSGD(lr, momentum, weight_decay)
        self._closed_form = (model if isinstance(model, ClosedFormGradient)
                             and loss_fn is F.cross_entropy else None)
        self.scratch: ScratchGradients | None = None
        """Where a local step borrows its gradient when the trainer holds none (None: the
        trainer's own gradient, kept between steps as ``params.grad``)."""

    @property
    def flat(self) -> torch.Tensor:
        return self.params.flat

    @property
    def numel(self) -> int:
        return self.params.flat.numel()

    @property
    def shard_size(self) -> int | None:
        """The samples in the shard the batches come from (None: the source does not tell,
        e.g. a cycled iterable)."""
        source = self.batches
        return source.shard_size if isinstance(source, ShardBatchSource) else None

    def gradient(self, batch_size: int) -> Computed:
        """Compute the gradient of one batch into ``self.params.grad``."""
        inputs, targets = self.batches(batch_size)
        # non-blocking: a pageable batch is still staged before the call returns, but unlike
        # a blocking copy it does not wait for the work queued on the compute stream
        inputs = inputs.to(self.device, non_blocking=True)
        targets = targets.to(self.device, non_blocking=True)
        self.params.grad.zero_()
        if self._closed_form is not None:  # no layer whose training mode matters
            with torch.no_grad():
                loss = self._closed_form.cross_entropy_gradient(inputs, targets,
                                                                self.params.grad)
            return Computed(float(loss), len(targets))
        self.params.module.train()
        with running_statistics_for_one_sample(self.params.module, len(targets)):
            loss = self.loss_fn(self.params.module(inputs), targets)
        torch.autograd.backward(loss)
        return Computed(float(loss.detach()), len(targets))

    def local_step(self, batch_size: int, center: torch.Tensor | None = None,
                   rho: float = 0.0, correction: torch.Tensor | None = None) -> Computed:
        """One local SGD step on the flat vector; with a `center`, on the proximal objective
        ``f(x) + rho/2 ||x - center||^2``; with a `correction`, on the gradient
        ``g + correction`` (both on the parameters only)."""
        with self._step_gradient():
            result = self.gradient(batch_size)
            with torch.no_grad():
                n = self.params.num_params
                params, grad = self.params.flat[:n], self.params.grad[:n]
                if center is not None:
                    grad = grad + rho * (params - self.copies.stage(center[:n]))
                if correction is not None:
                    grad = grad + self.copies.stage(correction[:n])
                step = self.optimizer.update(params, grad)
                for columns in self.params.frozen:
                    step[columns] = 0.0
                params.sub_(step)
        return result

    @contextlib.contextmanager
    def _step_gradient(self) -> Iterator[None]:
        """Inside the block, a local step's gradient: the trainer's own, or, when it holds
        none and has a `scratch`, one borrowed for the block."""
        scratch = self.scratch
        if scratch is None or self.params.holds_grad:
            yield
            return
        grad = scratch.take(self.numel, self.device)
        self.params.attach_grad(grad)
        try:
            yield
        finally:
            self.params.attach_grad(None)
            scratch.give_back(grad)

    def gradient_copy(self) -> torch.Tensor:
        """A CPU copy of the last gradient, safe to send while the next step runs.

        Buffer slots (BatchNorm statistics) carry the current buffer values instead of a
        gradient, which has none: the server adopts (averages) them as they are.
        """
        n = self.params.num_params
        return self.copies.gather([self.params.grad[:n].detach(),
                                   self.params.flat[n:].detach()])

    def gradient_vector(self) -> torch.Tensor:
        """The last gradient as `gradient_copy` lays it out, without a copy on a CPU device
        (the trainer's own gradient vector, its buffer slots filled with the buffers'
        values): valid until the next computation. A copy on other devices."""
        if self.device.type != "cpu":
            return self.gradient_copy()
        n = self.params.num_params
        with torch.no_grad():
            self.params.grad[n:].copy_(self.params.flat[n:])
        return self.params.grad.detach()

    def vector_copy(self) -> torch.Tensor:
        """A CPU copy of the current flat vector."""
        return self.copies.gather([self.params.flat.detach()])

    def delta_since(self, anchor: torch.Tensor, start: int = 0,
                    stop: int | None = None) -> torch.Tensor:
        """``w[start:stop] - anchor[start:stop]`` as a new CPU tensor."""
        return self.copies.read(self.params.flat[start:stop].detach()) - anchor[start:stop]

    def mix_toward(self, target: torch.Tensor, weight: float, start: int = 0,
                   stop: int | None = None) -> None:
        """``w[start:stop] <- (1 - weight) w[start:stop] + weight target``."""
        part = self.params.flat[start:stop]
        with torch.no_grad():
            part.mul_(1 - weight).add_(self.copies.stage(target), alpha=weight)

    def load(self, vector: torch.Tensor) -> None:
        """Adopt a (global) vector as the local parameters (the next step sees all of it)."""
        with torch.no_grad():
            self.copies.stage(vector, out=self.params.flat)


def share_copies(trainers: Iterable[Trainer]) -> None:
    """Make trainers that compute one at a time on one thread (a virtual run's) move their
    vectors through one `DeviceCopies` a device, the first one's, rather than each its own.

    On a CPU they then share one pool of warm host vectors: a pool keeps a few free
    vectors, and 100 waiting DiLoCo workers' own pools kept a third of the run's vectors.
    On CUDA they share one side stream and one pair of pinned staging buffers: 1,000
    FedAvg clients' own staging took a pinned allocation at each client's first exchange
    (two 0.55 MB buffers each: 1.1 GB of pinned memory for the cnn), and staging took
    1.1 s of 13 s in 20 rounds profiled on an H200 host.
    """
    first: dict[torch.device, DeviceCopies] = {}
    for trainer in trainers:
        trainer.copies = first.setdefault(trainer.device, trainer.copies)


def evaluate(
    module: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, batch_size: int = 1000
) -> tuple[float, float]:
    """Accuracy and mean cross-entropy of `module` on a held-out split.

    A sample whose logits are not all finite (a diverged model's) counts as wrong, whatever
    its argmax: torch's argmax picks a NaN's index, so a NaN model would score the share of
    one class's samples. Its loss is then NaN.

    The batches' figures stay on the module's device until the last batch is queued, then
    come to the host together (on a GPU: the host waits for the device once an evaluation,
    not twice a batch). Their float32 loss sums are added one after another in double
    precision, as they always were, so the figures are the same to the bit.
    """
    module.eval()
    device = next(module.parameters()).device
    sums, hits = [], []
    with torch.no_grad():
        for start in range(0, len(targets), batch_size):
            x = inputs[start : start + batch_size].to(device)
            y = targets[start : start + batch_size].to(device)
            logits = module(x)
            sums.append(F.cross_entropy(logits, y, reduction="sum"))
            finite = torch.isfinite(logits).all(dim=1)
            hits.append(((logits.argmax(dim=1) == y) & finite).sum())
        batch_sums = torch.stack(sums).tolist()  # waits for the last batch
        correct = int(torch.stack(hits).sum())  # already computed: no wait
    loss_sum = 0.0
    for batch_sum in batch_sums:  # in order, as a float() per batch added them
        loss_sum += batch_sum
    return correct / len(targets), loss_sum / len(targets)


def cycle_batches(batches: Iterable[tuple[torch.Tensor, torch.Tensor]]) -> BatchSource:
    """Adapt an iterable of ``(inputs, targets)`` (e.g. a DataLoader) to a batch source.

    The iterable's own batch size wins; protocols that resize batches need a callable.
    """
    iterator = iter(batches)

    def next_batch(_: int) -> tuple[torch.Tensor, torch.Tensor]:
        nonlocal iterator
        try:
            return next(iterator)
        except StopIteration:
            iterator = iter(batches)
            return next(iterator)

    return next_batch
