"""Many workers' gradients of one model as one batched call (`torch.func` ``vmap``).

Each row of a ``(workers, numel)`` tensor is one worker's flat vector, laid out as its
`asyncsync.training.trainer.FlatModule` holds it: parameters, then floating buffers
(BatchNorm statistics). `BatchedModel.gradients` runs every row's forward at once, through
``torch.func.functional_call`` on one template module under ``vmap``, then one backward of
the summed losses (`torch.autograd.grad`): each row's loss depends on its own parameters
alone, so the gradient of the sum, row by row, is each row's gradient. Each parameter is a
leaf of its own (a view of its columns of the rows), and the gradients are concatenated
once: one leaf for all the columns made autograd fill and add a whole gradient per
parameter tensor (resnet18: 62 of them, 4.4x the call's time on a CPU). Each row keeps its
own parameters, buffers and batch. The running statistics a row's forward updates are
written back into that row, as the module would.

**(choice)** The backward is plain autograd, not ``torch.func.grad_and_value``: functorch's
gradient imports ``torch._dynamo`` on its first call, 2.5-4 s of every run process's start
(3.9 s measured on an H200 host), and the plain backward measured faster too (the cnn, 8
rows of 32 samples, one CPU thread: 159 against 203 ms).

Rows whose batches differ in size share one call when the model mixes no samples
(no BatchNorm, cross-entropy loss, and a zero sample padded into a batch leaves its loss
unchanged, `BatchedModel.can_pad`): short batches are padded and the padding is masked
out of the loss. Otherwise each batch size gets its own call.

`sgd_rows` is `FlatSGD`'s step over rows, element for element the same arithmetic.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, vmap

from asyncsync.training.trainer import LossFn, running_statistics_for_one_sample

ACTIVATION_BUDGET = 1 << 29
"""Activation elements (layer outputs of a forward) one batched call may hold, about 2 GB
in float32 (the backward keeps a few times that): a cohort larger than this is run in
chunks. Fixed, not measured, so the chunks and hence the results do not depend on the
host."""
ROW_BUDGET = 1 << 29
"""Elements of the vectors of a row's length (`ROW_COPIES` a row) one call may hold,
about 2 GB in float32: a model of many parameters and few activations is chunked by
these. Fixed, as `ACTIVATION_BUDGET`."""
ROW_COPIES = 6
"""Vectors of a row's length a call holds per row: the stacked rows, their parameters
as split, the gradients, the momentum, its update and the step (a CPU call over 500 mlp
rows of 0.45 MiB grew the peak memory by 5.1 times their 0.22 GiB)."""
PAD_TOLERANCE = 1e-5
"""How far a padded batch's loss may differ from the unpadded one (float32 rounding of
the sum in another order) for the model to count as mixing no samples."""
PROBE_SAMPLES = 2
"""Samples of the forward that counts a model's activations per sample."""
Tensors = dict[str, torch.Tensor]


def not_batchable(module: nn.Module) -> str | None:
    """Why `module`'s gradients cannot be batched (None: they can)."""
    if not any(True for _ in module.parameters()):
        return "the model has no parameters"
    if any(not p.is_floating_point() for p in module.parameters()):
        return "the model has non-floating-point parameters"
    return None


def flat_vector(module: nn.Module) -> torch.Tensor:
    """`module`'s parameters then floating buffers in one new vector, as `FlatModule` lays
    them out."""
    parts = [p.detach().flatten() for p in module.parameters()]
    parts += [buf.detach().flatten() for owner in module.modules()
              for buf in owner.buffers(recurse=False)
              if buf is not None and buf.is_floating_point()]
    return torch.cat(parts)


class BatchedModel:
    """The batched gradient of `module`'s loss, rows laid out as its flat vector.

    Args:
        module: the model (copied; the copy is the template ``functional_call`` runs).
        device: where the rows live and the math runs.
        loss_fn: the loss of one batch (cross-entropy allows padded batches).
    """

    def __init__(self, module: nn.Module, device: torch.device,
                 loss_fn: LossFn = F.cross_entropy) -> None:
        reason = not_batchable(module)
        if reason is not None:
            raise ValueError(f"cannot batch this model: {reason}")
        self.template = copy.deepcopy(module).to(device)
        self.template.train()
        self.device = device
        self.loss_fn = loss_fn
        self.params = [(name, p.shape, p.numel()) for name, p in
                       self.template.named_parameters()]
        self.num_params = sum(n for _, _, n in self.params)
        self.frozen: list[slice] = []
        """The columns of parameters without ``requires_grad``: autograd gives them no
        gradient one by one, so their batched gradient is zero too."""
        offset = 0
        for p in self.template.parameters():
            if not p.requires_grad:
                self.frozen.append(slice(offset, offset + p.numel()))
            offset += p.numel()
        self.buffers: list[tuple[str, torch.Size, int]] = []
        self.counters: list[str] = []  # non-floating buffers (BatchNorm's batch counts)
        for prefix, owner in self.template.named_modules():
            for name, buf in owner.named_buffers(recurse=False):
                if buf is None:
                    continue
                full = f"{prefix}.{name}" if prefix else name
                if buf.is_floating_point():
                    self.buffers.append((full, buf.shape, buf.numel()))
                else:
                    self.counters.append(full)
        self.numel = self.num_params + sum(n for _, _, n in self.buffers)
        self.mixes_samples = any(isinstance(m, nn.modules.batchnorm._BatchNorm)
                                 for m in self.template.modules())
        self.pads = not self.mixes_samples and loss_fn is F.cross_entropy
        """Rows of unequal batches may share a padded call (see `can_pad`)."""
        self._pads_checked = False
        self._per_sample: int | None = None
        self._plain = vmap(self._loss)
        self._masked = vmap(self._masked_loss)

    def _loss(self, params: Tensors, buffers: Tensors, x: torch.Tensor,
              y: torch.Tensor) -> torch.Tensor:
        return self.loss_fn(functional_call(self.template, (params, buffers), (x,)), y)

    def _masked_loss(self, params: Tensors, buffers: Tensors, x: torch.Tensor,
                     y: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        out = functional_call(self.template, (params, buffers), (x,))
        return (F.cross_entropy(out, y, reduction="none") * weight).sum()

    def can_pad(self, batch: Callable[[], tuple[torch.Tensor, torch.Tensor]]) -> bool:
        """Whether rows of unequal batches may share a padded call: the model has no
        BatchNorm, the loss is cross-entropy, and (checked once, on `batch()`, drawn only
        then) a zero sample padded into a batch leaves its loss unchanged. A custom layer
        may mix a batch's samples (e.g. centre them) without being a BatchNorm."""
        if self.pads and not self._pads_checked:
            self._pads_checked = True
            self.pads = self._padding_is_masked(*batch())
        return self.pads

    def _padding_is_masked(self, x: torch.Tensor, y: torch.Tensor) -> bool:
        """Whether the model's loss of `x`, `y` is the same with a zero sample padded in
        and masked out, to float32 rounding (on a CPU copy: the same answer on any
        device, and no TF32 rounding that differs between batch sizes)."""
        probe = copy.deepcopy(self.template).to("cpu").train()
        x, y = x.cpu(), y.cpu()
        padded_x = torch.cat([x, x.new_zeros((1, *x.shape[1:]))])
        padded_y = torch.cat([y, y.new_zeros(1)])
        weight = torch.full((len(y) + 1,), 1.0 / len(y))
        weight[-1] = 0.0
        with torch.no_grad():
            plain = F.cross_entropy(probe(x), y)
            masked = (F.cross_entropy(probe(padded_x), padded_y, reduction="none")
                      * weight).sum()
        return bool(torch.allclose(plain, masked, rtol=PAD_TOLERANCE, atol=PAD_TOLERANCE))

    def rows_per_call(self, batch: int, sample_shape: Sequence[int]) -> int:
        """How many rows of `batch` samples one call takes: their activations within
        `ACTIVATION_BUDGET`, their vectors within `ROW_BUDGET`."""
        if self._per_sample is None:
            self._per_sample = _activations_per_sample(self.template, tuple(sample_shape))
        return max(1, min(ACTIVATION_BUDGET // (self._per_sample * batch),
                          ROW_BUDGET // (ROW_COPIES * self.numel)))

    def gradients(self, rows: torch.Tensor, counters: Tensors,
                  batches: Sequence[tuple[torch.Tensor, torch.Tensor]],
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        """The gradient of each row's loss on its batch (`stacked_gradients` of the
        batches, `stack`ed)."""
        return self.stacked_gradients(rows, counters, *self.stack(batches))

    def stacked_gradients(self, rows: torch.Tensor, counters: Tensors, x: torch.Tensor,
                          y: torch.Tensor, weight: torch.Tensor | None = None,
                          ) -> tuple[torch.Tensor, torch.Tensor]:
        """The gradient of each row's loss on its batch, and the losses.

        `rows` (``(n, numel)``, on the device) get their buffer columns updated in place as
        each row's forward updates them; `counters` (name to ``(n, ...)``) likewise: they
        are the very tensors the forward is given, and it counts into them in place. Row
        ``i``'s batch is ``x[i]``, ``y[i]`` (on the device), its samples weighted by
        ``weight[i]`` when the batches were padded (`stack`).
        Returns the gradients ``(n, num_params)`` and the losses ``(n,)``.
        """
        n = len(rows)
        # a leaf per parameter (a view of its columns), not one leaf of all the columns
        # split into views: each view's backward would fill and add a whole (n, num_params)
        # gradient (the mlp, 8 rows on a CPU: 35 of 87 ms a call)
        params = {name: leaf.detach().requires_grad_(True) for name, leaf in
                  self._split(rows, self.params, 0).items()}
        buffers = {name: t.clone() for name, t in
                   self._split(rows, self.buffers, self.num_params).items()}
        buffers.update(counters)
        with torch.enable_grad(), running_statistics_for_one_sample(self.template,
                                                                    y.shape[1]):
            losses = (self._plain(params, buffers, x, y) if weight is None
                      else self._masked(params, buffers, x, y, weight))
            grads = torch.autograd.grad(losses.sum(), list(params.values()),
                                        allow_unused=True, materialize_grads=True)
        flat = torch.cat([g.reshape(n, -1) for g in grads], dim=1)
        with torch.no_grad():
            for columns in self.frozen:
                flat[:, columns] = 0.0
            offset = self.num_params
            for name, _, size in self.buffers:
                rows[:, offset : offset + size].copy_(buffers[name].reshape(n, size))
                offset += size
        return flat, losses.detach()

    def stack(self, batches: Sequence[tuple[torch.Tensor, torch.Tensor]],
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """`batches` as one ``x``, ``y`` on the device, and when their sizes differ (padded
        to the longest) the weights that mask the padding out of each row's mean loss."""
        sizes = [len(y) for _, y in batches]
        width = max(sizes)
        n = len(batches)
        if all(size == width for size in sizes):
            x = torch.stack([b[0] for b in batches]).to(self.device, non_blocking=True)
            y = torch.stack([b[1] for b in batches]).to(self.device, non_blocking=True)
            return x, y, None
        if not self.pads:
            raise ValueError("rows of unequal batches need a model that mixes no samples")
        first, first_y = batches[0]
        # built where the batches are (a source may hand them on the device), moved once
        x = first.new_zeros((n, width, *first.shape[1:]))
        y = first_y.new_zeros((n, width))
        weight = torch.zeros((n, width), device=first.device)
        for i, (bx, by) in enumerate(batches):
            x[i, : len(by)] = bx
            y[i, : len(by)] = by
            weight[i, : len(by)] = 1.0 / len(by)
        return x.to(self.device), y.to(self.device), weight.to(self.device)

    @staticmethod
    def _split(rows: torch.Tensor, layout: list[tuple[str, torch.Size, int]],
               start: int) -> Tensors:
        out: Tensors = {}
        offset = start
        for name, shape, size in layout:
            out[name] = rows[:, offset : offset + size].reshape(len(rows), *shape)
            offset += size
        return out


def sgd_rows(params: torch.Tensor, grads: torch.Tensor, momentum_rows: torch.Tensor | None,
             lr: float, momentum: float, weight_decay: float,
             ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`FlatSGD.propose` over rows (no Nesterov): the steps and the new momentum rows.

    A row without momentum state yet is a row of zeros in `momentum_rows`: ``0 * m + g``
    is ``g`` to the bit, as the first step's ``g.clone()``.
    """
    g = grads + weight_decay * params if weight_decay else grads
    buffer = None
    if momentum:
        buffer = g.clone() if momentum_rows is None else momentum_rows * momentum + g
        g = buffer
    return lr * g, buffer


def _activations_per_sample(module: nn.Module, sample_shape: tuple[int, ...]) -> int:
    """The elements of every leaf module's output in one sample's forward (a proxy of the
    memory a batched call holds per sample); counted once, in eval mode, on a CPU copy,
    over `PROBE_SAMPLES` samples (a BatchNorm without running statistics refuses one)."""
    probe = copy.deepcopy(module).to("cpu").eval()
    total = 0

    def count(_: nn.Module, __: Any, out: Any) -> None:
        nonlocal total
        if isinstance(out, torch.Tensor):
            total += out.numel()

    hooks: list[Callable[[], None]] = []
    for sub in probe.modules():
        if not list(sub.children()):
            hooks.append(sub.register_forward_hook(count).remove)
    with torch.no_grad():
        probe(torch.zeros((PROBE_SAMPLES, *sample_shape)))
    for remove in hooks:
        remove()
    return max(1, -(-total // PROBE_SAMPLES))
