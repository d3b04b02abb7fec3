"""The hardware cost model: a local step's virtual duration from the work it does.

A step of `batch` samples costs ``flops_per_sample * batch + optimizer_flops`` floating-point
operations in ``ops`` framework operations (kernels). A device performs
``peak_flops_per_s * efficiency`` FLOPs per second and pays a fixed `op_overhead_s` per
operation (dispatch and kernel launch, which bound small models), so

    seconds(batch) = ops * op_overhead_s + (flops_per_sample * batch + optimizer_flops)
                     / (peak * efficiency)

A rate a recipe gives itself (``compute.flops_per_s``) has no per-operation term: doubling
it halves every step.

The model's FLOPs are counted once per run with PyTorch's own per-operation formulas
(those of `torch.utils.flop_counter.FlopCounterMode`) over one forward and backward pass of
a copy of the real model at the run's input shape (`count_step_flops`, which says on which
device and at which batch); the same pass counts the operations. The formulas see the
matrix products and convolutions, which are where a training step's arithmetic is;
element-wise work (activations, pooling, the loss, BatchNorm) is not counted, as in the
usual "model FLOPs" convention. The flat SGD update adds a few operations per parameter
(`optimizer_flops`).

Peak figures are FP32 (a training step at full precision) from the vendors' data sheets or
derived from their published core counts and clocks; `efficiency` is the share of that peak a
real training step of a small model sustains, and `op_overhead_s` the fixed cost of one
operation (about 10 us of eager dispatch on a CPU, or of kernel launch on a GPU). Both are
assumptions, stated per device (efficiency overridable in a recipe with
``compute.efficiency``), never a measurement of this host. With them, the cnn's step at
batch 32 on ``cpu-core`` comes to about 12 ms, which is what this project's 2-core host
measured (11-14 ms).
"""

from __future__ import annotations

import copy
import sys
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry

from asyncsync.training.trainer import running_statistics_for_one_sample


@dataclass(frozen=True)
class Device:
    """A named compute device: FP32 peak, the share of it a step sustains, and the source."""

    name: str
    peak_flops_per_s: float
    efficiency: float
    source: str
    op_overhead_s: float = 10e-6

    def __post_init__(self) -> None:
        if self.peak_flops_per_s <= 0:
            raise ValueError(f"device {self.name!r}: peak_flops_per_s must be > 0")
        if not 0 < self.efficiency <= 1:
            raise ValueError(f"device {self.name!r}: efficiency must be in (0, 1]")

    @property
    def flops_per_s(self) -> float:
        """The sustained training throughput: peak x efficiency."""
        return self.peak_flops_per_s * self.efficiency


DEVICES: dict[str, Device] = {d.name: d for d in (
    Device("cpu-core", 96e9, 0.25,
           "one x86 core at 3.0 GHz with AVX2: two 256-bit FMA units = 32 FP32 FLOP/cycle "
           "(Intel 64 and IA-32 Architectures Optimization Reference Manual, Haswell and later)"),
    Device("laptop-cpu", 358e9, 0.25,
           "4 x86 cores at 2.8 GHz with AVX2 FMA, 32 FP32 FLOP/cycle each (as cpu-core)"),
    Device("phone", 161e9, 0.2, op_overhead_s=20e-6, source=
           "Snapdragon 865's four Cortex-A77 cores (one at 2.84 GHz, three at 2.42 GHz; "
           "Qualcomm product brief), two 128-bit NEON FMA pipes = 16 FP32 FLOP/cycle each "
           "(Arm Cortex-A77 Software Optimization Guide)"),
    Device("jetson-nano", 236e9, 0.4, op_overhead_s=20e-6, source=
           "NVIDIA Jetson Nano data sheet: 128 Maxwell CUDA cores at 921.6 MHz "
           "(472 GFLOP/s FP16, half that in FP32)"),
    Device("k80", 4.37e12, 0.4,
           "NVIDIA Tesla K80 data sheet: 8.73 TFLOP/s FP32 with GPU Boost per board of two "
           "GK210 GPUs; one GPU, as a framework sees it, is half"),
    Device("t4", 8.1e12, 0.4, "NVIDIA T4 data sheet: 8.1 TFLOP/s FP32"),
    Device("v100", 15.7e12, 0.4, "NVIDIA V100 SXM2 data sheet: 15.7 TFLOP/s FP32"),
    Device("a100", 19.5e12, 0.4,
           "NVIDIA A100 data sheet: 19.5 TFLOP/s FP32 (TF32 tensor cores not assumed)"),
    Device("h100", 67e12, 0.4,
           "NVIDIA H100 SXM data sheet: 67 TFLOP/s FP32 (TF32 tensor cores not assumed)"),
)}
"""Named devices; `asyncsync devices` lists them with their sources."""


def device(name: str) -> Device:
    """The named device, or a ValueError that lists the known names."""
    try:
        return DEVICES[name]
    except KeyError:
        raise ValueError(f"unknown device {name!r}; known: {', '.join(DEVICES)} "
                         "(or give flops_per_s)") from None


DEFAULT_DEVICE = "cpu-core"
"""The device a virtual run's workers are charged as when its recipe names none."""


@dataclass(frozen=True)
class ModelFlops:
    """The work of one local step: FLOPs per sample (forward and backward) and per step
    (the optimizer's update, independent of the batch), and its operations."""

    flops_per_sample: float
    optimizer_flops: float
    ops: int = 0

    def flops(self, batch: int) -> float:
        """The FLOPs of one step of `batch` samples."""
        return self.flops_per_sample * batch + self.optimizer_flops


@dataclass(frozen=True)
class DeviceStepCost:
    """A step's cost on a device that sustains `flops_per_s` (a `StepCost` of
    `asyncsync.hetero.compute`); batch 0 means `reference_batch`."""

    flops: ModelFlops
    flops_per_s: float
    reference_batch: int
    op_overhead_s: float = 0.0

    def __post_init__(self) -> None:
        if not self.flops_per_s > 0:
            raise ValueError(f"flops_per_s must be > 0, got {self.flops_per_s}")
        if self.flops.flops(self.reference_batch) <= 0:
            raise ValueError("a step must cost more than 0 FLOPs")

    def base_s(self, batch: int) -> float:
        """Seconds a step of `batch` samples costs on this device."""
        return (self.flops.ops * self.op_overhead_s
                + self.flops.flops(batch or self.reference_batch) / self.flops_per_s)


def optimizer_flops_per_param(momentum: float, weight_decay: float, nesterov: bool) -> int:
    """The FLOPs per parameter of one `FlatSGD` update: a multiply-add for the step, and one
    more for weight decay, for momentum and for Nesterov's look-ahead (one operation each
    over the flat vector)."""
    return 2 + 2 * (weight_decay > 0) + 2 * (momentum > 0) + 2 * nesterov


class _StepCounter(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Counts the operations dispatched inside it and their FLOPs.

    An operation's FLOPs come from torch's formula for it
    (`torch.utils.flop_counter.flop_registry`, the one `FlopCounterMode` applies); one
    without a formula counts none. An operation that decomposes into others is counted
    through its parts, as `FlopCounterMode` counts it; the parts are not operations of
    their own.

    **(choice)** Not `FlopCounterMode`, whose per-module tables are not needed here, and
    Dynamo is not skipped in `__torch_dispatch__`: torch wraps every dispatch mode's handler
    in a Dynamo guard whose first call imports ``torch._dynamo`` (see `count_step_flops`).
    Nothing is compiled while a step is counted, so the guard has nothing to guard.
    """

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.ops = 0
        self.flops = 0
        self._decomposing = 0

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        """Leave `__torch_dispatch__` unwrapped (torch asks this when the class is made)."""
        return False

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if not self._decomposing:
            self.ops += 1
        self._decomposing += 1
        try:
            with self:  # the parts come back here
                parts = func.decompose(*args, **kwargs)
        finally:
            self._decomposing -= 1
        if parts is not NotImplemented:
            return parts
        out = func(*args, **kwargs)
        formula = flop_registry.get(func.overloadpacket)
        if formula is not None:
            self.flops += formula(*args, **kwargs, out_val=out)
        return out


def count_step_flops(model: nn.Module, input_shape: tuple[int, ...], batch: int,
                     optimizer_flops_per_parameter: int = 2) -> ModelFlops:
    """Count one training step of `model` at `batch` samples of `input_shape` (C, H, W).

    The count runs on a copy of the model with a cross-entropy loss over integer labels;
    the model itself and the random number generators are not touched.

    **(choice)** Where ``torch._dynamo`` is loaded already (torchvision loads it), the copy
    runs on the ``meta`` device at `batch` samples: shapes only, no math, milliseconds.
    Otherwise it runs for real on the CPU, at ``min(batch, 2)`` samples of zeros: torch's
    meta kernels of element-wise operations load ``torch._dynamo`` on their first call,
    2.5-3.2 s of a small virtual run's 3.3-4.1 s set-up on this project's loaded 2-core
    host (quickstart's cnn) and 8 s on an H200 host, where the cnn's two real samples take
    15-40 ms. A large model built without torchvision pays its two samples' step on the
    CPU instead. The two ways agree wherever a step's FLOPs grow in proportion to its batch
    and its operations do not depend on it, as the cost model assumes (`ModelFlops.flops`);
    two samples, not one, keep BatchNorm training (`running_statistics_for_one_sample`).
    """
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    on_meta = "torch._dynamo" in sys.modules
    samples, where = (batch, "meta") if on_meta else (min(batch, 2), "cpu")
    shadow = copy.deepcopy(model).to(where)
    shadow.train()
    inputs = torch.zeros((samples, *input_shape), device=where)
    labels = torch.zeros(samples, dtype=torch.long, device=where)
    with (torch.random.fork_rng(devices=[]), _StepCounter() as counter,
          running_statistics_for_one_sample(shadow, samples)):  # as the step itself runs
        loss = nn.functional.cross_entropy(shadow(inputs), labels)
        torch.autograd.backward(loss)
    params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return ModelFlops(flops_per_sample=counter.flops / samples,
                      optimizer_flops=float(optimizer_flops_per_parameter * params),
                      ops=counter.ops + optimizer_flops_per_parameter // 2)
