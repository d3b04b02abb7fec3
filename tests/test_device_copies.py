"""Device copies: the staged (CUDA) logic against a fake side stream, and the plain CPU path."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from asyncsync.engine.core import build_core
from asyncsync.engine.worker import Worker
from asyncsync.training.device_copies import STAGING_BUFFERS, Pairs, PlainCopies, StagedCopies
from asyncsync.training.trainer import Trainer
from asyncsync.transport.local import LocalTransport
from tests.helpers import batches_of, tiny_data


class FakeEvent:
    """An event of `FakeStreams`: it fires when the side stream has run up to it."""

    def __init__(self, streams: FakeStreams) -> None:
        self.streams = streams
        self.fired = False

    def query(self) -> bool:
        return self.fired

    def synchronize(self) -> None:
        self.streams.log.append("synchronize")
        self.streams.run_until(self)


class FakeStreams:
    """A side stream on CPU tensors whose copies run late, in order: when the host waits
    for one of their events, when the test drains it, or (unless `hold`) when the
    compute stream waits for one (later compute then sees the copy). A copy reads its
    source when it runs, as a DMA does, so a source overwritten early shows."""

    def __init__(self, hold: bool = False) -> None:
        self.hold = hold
        self.log: list[str] = []
        self.pinned_buffers: list[torch.Tensor] = []
        self.waited: list[FakeEvent] = []
        self._queue: list[tuple[FakeEvent, Pairs]] = []

    def pinned(self, count: int, dtype: torch.dtype) -> torch.Tensor:
        self.log.append("pinned")
        buffer = torch.full((count,), float("nan"), dtype=dtype)
        self.pinned_buffers.append(buffer)
        return buffer

    def empty(self, count: int, dtype: torch.dtype) -> torch.Tensor:
        return torch.full((count,), float("nan"), dtype=dtype)

    def side_copy(self, pairs: Pairs) -> FakeEvent:
        self.log.append("side_copy")
        event = FakeEvent(self)
        self._queue.append((event, list(pairs)))
        return event

    def compute_waits(self, event: Any) -> None:
        self.log.append("compute_waits")
        self.waited.append(event)
        if not self.hold:
            self.run_until(event)

    def run_until(self, event: FakeEvent) -> None:
        while not event.fired:
            done, pairs = self._queue.pop(0)
            for target, source in pairs:
                target.copy_(source)
            done.fired = True

    def drain(self) -> None:
        if self._queue:
            self.run_until(self._queue[-1][0])


def staged(numel: int = 8, hold: bool = True) -> tuple[StagedCopies, FakeStreams]:
    streams = FakeStreams(hold)
    return StagedCopies(streams, numel), streams


def test_a_gathered_vector_is_complete_when_handed_over() -> None:
    copies, streams = staged()
    a, b = torch.arange(5.0), torch.arange(3.0) + 10
    out = copies.gather([a, b])
    assert torch.equal(out, torch.cat([a, b]))
    assert streams.log == ["pinned", "side_copy", "synchronize"]
    assert torch.equal(copies.read(b), b)


def test_a_staged_vector_is_ordered_before_compute_without_the_host_waiting() -> None:
    copies, streams = staged()
    vector, dest = torch.arange(8.0), torch.zeros(8)
    assert copies.stage(vector, out=dest) is dest
    assert streams.log == ["pinned", "side_copy", "compute_waits"]  # no host wait
    assert not streams.waited[0].query()  # still in flight when stage returned
    vector.fill_(-1.0)  # the caller's vector is free as soon as stage returns
    streams.drain()
    assert torch.equal(dest, torch.arange(8.0))


def test_a_staging_buffer_is_not_lent_while_a_copy_reads_it() -> None:
    copies, streams = staged()
    first, second = torch.zeros(8), torch.zeros(8)
    copies.stage(torch.full((8,), 1.0), out=first)
    copies.stage(torch.full((8,), 2.0), out=second)  # the first copy has not run yet
    assert len(streams.pinned_buffers) == 2
    streams.drain()
    assert torch.equal(first, torch.full((8,), 1.0))
    assert torch.equal(second, torch.full((8,), 2.0))


def test_steady_state_staging_reuses_one_buffer() -> None:
    copies, streams = staged()
    for value in range(5):
        dest = copies.stage(torch.full((8,), float(value)))
        streams.drain()
        assert torch.equal(dest, torch.full((8,), float(value)))
    assert len(streams.pinned_buffers) == 1
    assert "synchronize" not in streams.log


def test_with_every_buffer_in_flight_the_oldest_copy_is_waited_for() -> None:
    copies, streams = staged()
    dests = [torch.zeros(8) for _ in range(STAGING_BUFFERS + 1)]
    for value, dest in enumerate(dests):
        copies.stage(torch.full((8,), float(value)), out=dest)
    assert len(streams.pinned_buffers) == STAGING_BUFFERS
    assert streams.log.count("synchronize") == 1
    assert torch.equal(dests[0], torch.zeros(8))  # it ran before its buffer was refilled
    streams.drain()
    for value, dest in enumerate(dests):
        assert torch.equal(dest, torch.full((8,), float(value)))


def test_a_buffer_is_lent_only_for_vectors_it_fits() -> None:
    copies, streams = staged(numel=4)
    copies.stage(torch.ones(4))
    streams.drain()
    wide = copies.stage(torch.arange(6, dtype=torch.float64))
    streams.drain()
    assert [b.dtype for b in streams.pinned_buffers] == [torch.float32, torch.float64]
    assert streams.pinned_buffers[1].numel() == 6
    assert torch.equal(wide, torch.arange(6, dtype=torch.float64))


def bn_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16),
                               torch.nn.ReLU(), torch.nn.Linear(16, 2))


def exercise(trainer: Trainer) -> list[torch.Tensor]:
    """Every copy the trainer makes, in a worker-like order; returns what came out."""
    gen = torch.Generator().manual_seed(1)
    target = torch.randn(trainer.numel, generator=gen)
    trainer.local_step(16)
    trainer.gradient(16)
    out = [trainer.gradient_copy(), trainer.vector_copy()]
    anchor = out[1].clone()
    trainer.local_step(16, center=target, rho=0.5, correction=target * 0.01)
    out += [trainer.delta_since(anchor), trainer.delta_since(anchor, 3, 20)]
    trainer.mix_toward(target, 0.25)
    trainer.mix_toward(target[3:20], 0.5, 3, 20)
    out.append(trainer.vector_copy())
    trainer.load(target)
    trainer.local_step(16)
    out.append(trainer.flat.clone())
    return out


def test_staged_copies_give_the_plain_results_bit_for_bit() -> None:
    x, y = tiny_data()
    plain = Trainer(bn_model(), batches_of(x, y, 0), device="cpu")
    ours = Trainer(bn_model(), batches_of(x, y, 0), device="cpu")
    ours.copies, streams = staged(ours.numel, hold=False)
    expected, got = exercise(plain), exercise(ours)
    assert all(torch.equal(a, b) for a, b in zip(expected, got, strict=True))
    n = plain.params.num_params
    assert n < plain.numel  # the BatchNorm statistics travel in the buffer slots
    assert not torch.equal(got[0][n:], torch.zeros(plain.numel - n))
    assert streams.log.count("pinned") > 1  # gathers are the caller's: each is new


def test_the_cpu_path_is_plain_and_asks_for_no_pinned_memory_or_streams(
        monkeypatch: pytest.MonkeyPatch) -> None:
    empty = torch.empty

    def no_pinned(*args: Any, **kwargs: Any) -> torch.Tensor:
        assert not kwargs.get("pin_memory"), "pinned memory requested on the CPU path"
        return empty(*args, **kwargs)

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a CUDA stream, event or pinned copy on the CPU path")

    monkeypatch.setattr(torch, "empty", no_pinned)
    for name in ("Stream", "Event", "synchronize"):
        monkeypatch.setattr(torch.cuda, name, refuse)
    monkeypatch.setattr(torch.Tensor, "pin_memory", refuse)
    x, y = tiny_data()
    trainer = Trainer(bn_model(), batches_of(x, y, 0), device="cpu")
    assert isinstance(trainer.copies, PlainCopies)
    exercise(trainer)
    flat, vector = trainer.flat, torch.ones(trainer.numel)
    assert trainer.copies.read(flat) is flat  # no copy where today's code made none
    assert trainer.copies.stage(vector) is vector
    assert trainer.copies.gather([flat]).data_ptr() != flat.data_ptr()


async def test_a_gradient_without_copy_is_the_trainers_own_vector_laid_out_as_the_copy(
        ) -> None:
    """`ctx.gradient(copy=False)` (bsp, asp, lbbsp) hands out the trainer's gradient vector
    itself on a CPU device, its buffer slots holding the BatchNorm statistics exactly as the
    copy does; the default is a vector of its own."""
    x, y = tiny_data()
    worker = Worker(0, LocalTransport(build_core(bn_model(), "bsp", 1)), bn_model(),
                    batches_of(x, y, 0), "bsp", device="cpu")
    trainer = worker.trainer
    try:
        _, copied = await worker.ctx.gradient(16)
        assert copied.untyped_storage().data_ptr() != trainer.params.grad.data_ptr()
        assert torch.equal(copied, trainer.gradient_copy())
        _, shared = await worker.ctx.gradient(16, copy=False)
        expected = trainer.gradient_copy()
        assert shared.data_ptr() == trainer.params.grad.data_ptr()
        n = trainer.params.num_params
        assert n < trainer.numel  # the BatchNorm statistics follow the parameters
        assert torch.equal(shared, expected)
        assert torch.equal(shared[n:], trainer.flat[n:])
    finally:
        worker.seam.close()
