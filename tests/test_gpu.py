"""The CUDA path on a real GPU: views, bit-exact transfers, BatchNorm buffers, stream order.

Skipped, with the reason shown, where CUDA is absent; on a GPU host run
``.venv/bin/python -m pytest -q -rs tests/test_gpu.py``.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from torch import nn

from asyncsync.engine.core import ServerCore, build_core
from asyncsync.engine.evaluation import make_evaluator
from asyncsync.engine.settings import ServerSettings
from asyncsync.engine.worker import Worker
from asyncsync.protocols.base import Protocol, Push, RunStopped, ServerRule, WorkerLoop
from asyncsync.protocols.ports import Context
from asyncsync.training.device_copies import StagedCopies
from asyncsync.training.trainer import Trainer
from asyncsync.transport.http_server import ParameterServer
from asyncsync.transport.local import LocalTransport
from tests.helpers import batches_of

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="needs a CUDA GPU: pinned buffers, the side stream and its events exist only there")

DEVICE = "cuda"
CHANNELS = 8


def bn_cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, CHANNELS, 3, padding=1), nn.BatchNorm2d(CHANNELS),
                         nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(CHANNELS, 10))


def images(n: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return torch.randn(n, 1, 8, 8, generator=gen), torch.randint(0, 10, (n,), generator=gen)


def wide_mlp() -> nn.Module:
    """33.6M parameters (134 MB): copies take milliseconds, long enough to race."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4096, 4096), nn.ReLU(), nn.Linear(4096, 4096), nn.ReLU(),
                         nn.Linear(4096, 10))


def wide_batches(seed: int) -> Any:
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(256, 4096, generator=gen), torch.randint(0, 10, (256,), generator=gen)
    return batches_of(x, y, seed)


def assert_views(trainer: Trainer) -> None:
    """Every parameter, gradient and float buffer is a view into the flat vectors."""
    flat, grad = trainer.params.flat, trainer.params.grad
    module = trainer.params.module
    assert flat.is_cuda and grad.is_cuda
    for p in module.parameters():
        assert p.untyped_storage().data_ptr() == flat.untyped_storage().data_ptr()
        assert p.grad is not None
        assert p.grad.untyped_storage().data_ptr() == grad.untyped_storage().data_ptr()
    for b in module.buffers():
        if b.is_floating_point():
            assert b.untyped_storage().data_ptr() == flat.untyped_storage().data_ptr()


def test_the_flat_views_stay_valid_through_steps_copies_and_adoption() -> None:
    x, y = images()
    trainer = Trainer(bn_cnn(), batches_of(x, y, 0), device=DEVICE)
    assert isinstance(trainer.copies, StagedCopies)
    assert_views(trainer)
    for _ in range(3):
        trainer.local_step(16)
    assert_views(trainer)
    vector = torch.randn(trainer.numel, generator=torch.Generator().manual_seed(1))
    trainer.load(vector)
    first = next(trainer.params.module.parameters())
    assert torch.equal(first.detach().flatten().cpu(), vector[: first.numel()])
    trainer.mix_toward(torch.zeros(trainer.numel), 0.5)
    trainer.gradient(16)  # moves the BatchNorm statistics, not the parameters
    assert_views(trainer)
    n = trainer.params.num_params
    assert torch.equal(trainer.vector_copy()[:n], vector[:n] * 0.5)  # 0.5 v + 0.5 * 0: exact


def test_no_device_wide_synchronization_and_pinned_copies(
        monkeypatch: pytest.MonkeyPatch) -> None:
    x, y = images()
    trainer = Trainer(bn_cnn(), batches_of(x, y, 0), device=DEVICE)
    anchor = torch.zeros(trainer.numel)
    with monkeypatch.context() as patch:
        patch.setattr(torch.cuda, "synchronize", lambda *args, **kwargs: pytest.fail(
            "torch.cuda.synchronize on the hot path"))
        trainer.load(anchor + 1)
        trainer.local_step(16, center=anchor, rho=0.1, correction=anchor)
        trainer.gradient(16)
        copies = [trainer.gradient_copy(), trainer.vector_copy()]
        trainer.delta_since(anchor)
        trainer.mix_toward(anchor, 0.5)
    assert all(copy.is_pinned() and not copy.is_cuda for copy in copies)


def test_copies_never_ask_the_driver_for_its_device_count(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The device is named by index: torch's lookup of the current device (a stream call
    without one) asks the driver for its device count, several times a copy before."""
    trainer = Trainer(wide_mlp(), wide_batches(0), device=DEVICE)
    anchor = torch.zeros(trainer.numel)
    asked: list[int] = []
    count = torch._C._cuda_getDeviceCount
    monkeypatch.setattr(torch._C, "_cuda_getDeviceCount",
                        lambda: asked.append(1) or count())
    trainer.load(anchor + 1)
    copy = trainer.vector_copy()
    trainer.delta_since(anchor)
    assert asked == []
    assert torch.equal(copy, anchor + 1)


def test_a_copy_to_the_host_waits_for_the_compute_that_made_it() -> None:
    trainer = Trainer(wide_mlp(), wide_batches(0), device=DEVICE)
    trainer.local_step(32)  # its update is still running when the step returns
    flat = trainer.params.flat
    with torch.no_grad():
        for _ in range(50):  # milliseconds more of writes queued on the compute stream
            flat.mul_(1.0001)
    copy = trainer.vector_copy()
    assert torch.equal(copy, flat.cpu())  # a blocking copy: after everything queued


def test_a_pulled_model_is_whole_before_the_compute_that_uses_it() -> None:
    trainer = Trainer(wide_mlp(), wide_batches(0), device=DEVICE)
    vector = torch.randn(trainer.numel, generator=torch.Generator().manual_seed(2))
    trainer.load(vector)
    seen = trainer.params.flat.clone()  # a device copy enqueued right behind the load
    assert torch.equal(seen.cpu(), vector)


def test_a_step_right_after_adoption_matches_a_synchronous_adoption() -> None:
    ours = Trainer(wide_mlp(), wide_batches(3), device=DEVICE)
    reference = Trainer(wide_mlp(), wide_batches(3), device=DEVICE)
    vector = torch.randn(ours.numel, generator=torch.Generator().manual_seed(3)) * 0.01
    ours.load(vector)
    ours.local_step(32)
    reference.params.flat.copy_(vector.to(DEVICE))
    torch.cuda.synchronize()
    reference.local_step(32)
    assert torch.equal(ours.flat.cpu(), reference.flat.cpu())


@dataclass
class Probe:
    """What the echo protocol's two halves saw, for the test to compare."""

    trainer: Trainer | None = None
    received: list[torch.Tensor] = field(default_factory=list)
    seen: dict[str, torch.Tensor] = field(default_factory=dict)


class EchoServer(ServerRule):
    """Keeps every push; a pushed model, doubled (exactly), becomes the next version."""

    push_kinds = frozenset({"gradient", "model"})

    async def on_push(self, push: Push) -> dict[str, Any]:
        self.params.received.append(push.vector.clone())
        if push.kind == "model":
            async with self.store.lock:
                self.store.commit(push.vector * 2, [(push.worker, push.base_version)])
        return {}


class EchoLoop(WorkerLoop):
    """One gradient push, two steps, a model push, a pull and adoption, and a snapshot
    after it; each vector is recorded beside a blocking reference read of the device."""

    async def run(self, ctx: Context) -> None:
        probe: Probe = self.params
        assert probe.trainer is not None
        flat, grad = probe.trainer.params.flat, probe.trainer.params.grad
        n = probe.trainer.params.num_params
        seen = probe.seen
        seen["joined"] = await ctx.snapshot()
        result, seen["grad"] = await ctx.gradient()
        seen["grad_reference"] = torch.cat([grad[:n].cpu(), flat[n:].cpu()])
        await ctx.push("gradient", seen["grad"], 1, result.samples)
        stepped = await ctx.steps(2)
        seen["model"] = await ctx.snapshot()
        seen["model_reference"] = flat.to("cpu", copy=True)
        await ctx.push("model", seen["model"], 2, stepped.samples)
        vector, version, _ = await ctx.pull()
        await ctx.adopt(vector, version)
        seen["pulled"] = vector.clone()
        # The API's promise: the adoption is done before the context's next verb (it may
        # ride on that verb's hand-off), so read it through the context, then the device.
        seen["adopted"] = await ctx.snapshot()
        seen["adopted_on_device"] = flat.to("cpu", copy=True)
        seen["running_mean"] = probe.trainer.params.module[1].running_mean.cpu()
        raise RunStopped


ECHO = Protocol("gpu-echo", "test: keeps pushes, commits a pushed model doubled", Probe,
                EchoServer, EchoLoop)


async def round_trip(transport: str) -> tuple[Probe, torch.Tensor]:
    """Run the echo protocol with one CUDA worker against a CPU server."""
    x, y = images()
    probe = Probe()
    settings = ServerSettings(worker_timeout_s=None)
    http = ParameterServer(bn_cnn(), ECHO, 1, settings, protocol_params=probe) \
        if transport == "http" else None
    core: ServerCore = http.core if http is not None else build_core(
        bn_cnn(), ECHO, 1, settings, protocol_params=probe)
    initial = core.store.w.clone()
    server = await http.start() if http is not None else LocalTransport(core)
    try:
        options: dict[str, Any] = {"protocol_params": probe, "batch_size": 16,
                                   "device": DEVICE}
        worker = (Worker.connect(0, server, bn_cnn(), batches_of(x, y, 0), ECHO, **options)
                  if isinstance(server, str)
                  else Worker(0, server, bn_cnn(), batches_of(x, y, 0), ECHO, **options))
        probe.trainer = worker.trainer
        await worker.run()
    finally:
        if http is not None:
            await http.close()
        else:
            await core.stop()
            await core.close()
    return probe, initial


@pytest.mark.parametrize("transport", ["local", "http"])
async def test_a_push_pull_round_trip_is_bit_exact_and_carries_batchnorm(
        transport: str) -> None:
    probe, initial = await round_trip(transport)
    seen, received = probe.seen, probe.received
    assert probe.trainer is not None
    n = probe.trainer.params.num_params
    assert torch.equal(seen["joined"], initial)
    assert torch.equal(seen["grad"], seen["grad_reference"])
    assert torch.equal(received[0], seen["grad"])
    assert torch.equal(seen["model"], seen["model_reference"])
    assert torch.equal(received[1], seen["model"])
    assert not torch.equal(seen["model"][n:], initial[n:])  # the steps moved the statistics
    assert torch.equal(seen["pulled"], seen["model"] * 2)
    assert torch.equal(seen["adopted"], seen["pulled"])
    assert torch.equal(seen["adopted_on_device"], seen["pulled"])
    assert torch.equal(seen["running_mean"], seen["pulled"][n : n + CHANNELS])


def test_the_global_model_is_evaluated_on_the_gpu_with_the_cpus_figures() -> None:
    """A cuda run's evaluator computes on the GPU (its memory is used) and scores the model
    as the CPU does (same accuracy; loss to float tolerance)."""
    x, y = images(512)
    model = bn_cnn()
    vector = torch.nn.utils.parameters_to_vector(
        [*model.parameters(), *(b for b in model.buffers() if b.is_floating_point())])
    on_cpu = make_evaluator(bn_cnn(), x, y, "cpu", batch_size=100)(vector)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.max_memory_allocated()
    gpu = make_evaluator(bn_cnn(), x, y, DEVICE, batch_size=100)
    on_gpu = gpu(vector)
    assert torch.cuda.max_memory_allocated() > before
    assert on_gpu[0] == on_cpu[0]
    assert on_gpu[1] == pytest.approx(on_cpu[1], rel=1e-4)


def test_a_cuda_recipe_evaluates_on_its_device() -> None:
    from asyncsync.study.assembly import server_settings
    from asyncsync.study.specs import RunSpec

    assert server_settings(RunSpec(device="cuda"), "run", None).eval_device == "cuda"
    assert server_settings(RunSpec(device="auto"), "run", None).eval_device == "cuda"


def _syncs(fn: Any) -> int:
    """How many times `fn()` made the host wait for the device (torch's sync debug mode)."""
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    # "called a synchronizing CUDA operation" each time; not the "Synchronization debug mode
    # is a prototype feature" notice torch gives at the first switch to "warn" in a process
    return sum("called a synchronizing" in str(w.message) for w in said)


def test_an_evaluation_waits_for_the_gpu_as_often_with_ten_batches_as_with_one() -> None:
    """It waited twice a batch (a loss and a count read back one at a time)."""
    x, y = images(500)
    model = bn_cnn()
    vector = torch.nn.utils.parameters_to_vector(
        [*model.parameters(), *(b for b in model.buffers() if b.is_floating_point())])
    one_batch = make_evaluator(bn_cnn(), x, y, DEVICE, batch_size=500)
    ten_batches = make_evaluator(bn_cnn(), x, y, DEVICE, batch_size=50)
    one_batch(vector)  # warm-up: cuDNN's first calls at each batch shape
    ten_batches(vector)
    waits = _syncs(lambda: ten_batches(vector)), _syncs(lambda: one_batch(vector))
    assert waits[0] == waits[1] >= 1  # >= 1: the figures' read-back is seen, so is a wait
    assert ten_batches(vector)[0] == one_batch(vector)[0]


@pytest.mark.parametrize("split_on", ["cpu", DEVICE])
def test_a_capped_evaluation_on_the_gpu_scores_the_cpus_subset(split_on: str) -> None:
    """eval.samples' seeded subset is the same rows whatever device the split is on."""
    x, y = images(512)
    model = bn_cnn()
    vector = torch.nn.utils.parameters_to_vector(
        [*model.parameters(), *(b for b in model.buffers() if b.is_floating_point())])
    on_cpu = make_evaluator(bn_cnn(), x, y, "cpu", samples=100)(vector)
    on_gpu = make_evaluator(bn_cnn(), x.to(split_on), y.to(split_on), DEVICE,
                            samples=100)(vector)
    assert on_gpu[0] == on_cpu[0]
    assert on_gpu[1] == pytest.approx(on_cpu[1], rel=1e-4)
