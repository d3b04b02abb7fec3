"""Copies between a worker's device and the host: plain on a CPU, staged and event-ordered
on CUDA.

`Trainer` moves vectors only through a `DeviceCopies`: `gather` and `read` (device to
host) and `stage` (host to device). `PlainCopies` makes the copies the trainer always
made (on a CPU device, none where none is needed). `StagedCopies`, for CUDA, goes through
pinned host memory with non-blocking copies on a side stream, ordered by events and never
by ``torch.cuda.synchronize``. Its device calls go through a `Streams` backend
(`CudaStreams` on a GPU), so that its ordering and buffer rules can be tested with CPU
tensors and a fake backend.

Rules of `StagedCopies`. The compute stream is the calling thread's current stream; a
trainer is used by one thread at a time (the worker's compute thread, never the loop).

(a) Device to host: the side stream waits for an event recorded on the compute stream
    after the work that produced the source, copies it into a new pinned tensor and
    records ``done``. The call waits on ``done`` (a blocking event: the thread sleeps)
    before it returns the tensor, so the loop and the transport only ever read finished
    data, and no compute work, all of it enqueued after that wait, overwrites the source
    mid-copy. (The `Context` port hands the loop finished vectors, so this copy overlaps
    the network and other processes' kernels, not this worker's next step.)
(b) Host to device: the vector is copied into a pinned staging buffer (a host memcpy; the
    caller's vector is not read after the call). The side stream waits for an event on the
    compute stream (the destination, the flat vector or a fresh block of the compute
    stream's allocator, may still be in use by queued kernels), copies the buffer to the
    device and records ``done``; the compute stream waits on ``done`` before whatever is
    enqueued next, so the next step sees the whole vector. The host does not wait.
(c) Ownership: staging buffers never leave this module. One is lent again only once the
    copy that read it has completed (its ``done`` fired); with every buffer in flight,
    the oldest one's ``done`` is waited on. A tensor returned by (a) belongs to the
    caller (the loop, then the transport); torch's pinned-memory cache takes its block
    back when the last reference to it is dropped and reuses it only once the copies
    recorded on it are done, so steady-state copies allocate no new pinned memory.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, cast

import torch

from asyncsync.training.buffers import VectorPool

STAGING_BUFFERS = 2
"""Staging buffers per trainer: one is filled while the copy from the other runs."""

Pairs = Sequence[tuple[torch.Tensor, torch.Tensor]]
"""``(destination, source)`` tensors of one batch of copies."""


class Event(Protocol):
    """A point on a stream: it has fired or not, and a thread may wait for it."""

    def query(self) -> bool: ...

    def synchronize(self) -> None: ...


class Streams(Protocol):
    """The device calls of `StagedCopies`."""

    def pinned(self, count: int, dtype: torch.dtype) -> torch.Tensor:
        """A new page-locked host tensor of `count` elements."""
        ...

    def empty(self, count: int, dtype: torch.dtype) -> torch.Tensor:
        """A new uninitialised device tensor, from the compute stream's allocator."""
        ...

    def side_copy(self, pairs: Pairs) -> Event:
        """Copy each pair on the side stream once the compute stream's queued work is done;
        the event fires when the copies are."""
        ...

    def compute_waits(self, event: Event) -> None:
        """Work enqueued on the compute stream from now on waits for `event`."""
        ...


class DeviceCopies(Protocol):
    """How a trainer moves 1-D vectors between its device and the host."""

    def gather(self, parts: Sequence[torch.Tensor]) -> torch.Tensor:
        """A new host tensor holding the device tensors `parts` end to end (the caller's)."""
        ...

    def read(self, tensor: torch.Tensor) -> torch.Tensor:
        """The values of the device tensor `tensor` on the host, for immediate use (may
        be `tensor` itself)."""
        ...

    def stage(self, vector: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """The host tensor `vector` on the device, copied into `out` if given, ready for
        compute enqueued after this call."""
        ...


class PlainCopies:
    """Blocking copies through torch's defaults, as the trainer always made them (on a CPU
    device: one copy for `gather`, none for `read`, none for `stage` without `out`)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.buffers = VectorPool()

    def gather(self, parts: Sequence[torch.Tensor]) -> torch.Tensor:
        """On a CPU device the result is a warm vector of `buffers`
        (`asyncsync.training.buffers`)."""
        host = [part.to("cpu") for part in parts]
        out = self.buffers.take(sum(part.numel() for part in host), host[0].dtype)
        return torch.cat(host, out=out)

    def read(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.to("cpu")

    def stage(self, vector: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        return vector.to(self.device) if out is None else out.copy_(vector)


class StagingPool:
    """Pinned buffers lent to host-to-device copies (rule (c) of the module).

    Buffers are allocated on first need, each of at least `numel` elements (the trainer's
    vector length, so that one fits every vector), and at most `size` are kept.
    """

    def __init__(self, allocate: Callable[[int, torch.dtype], torch.Tensor], numel: int,
                 size: int = STAGING_BUFFERS) -> None:
        self._allocate = allocate
        self._numel = numel
        self._size = size
        self._idle: list[tuple[torch.Tensor, Event]] = []  # oldest first

    def take(self, count: int, dtype: torch.dtype) -> torch.Tensor:
        """A buffer of at least `count` elements of `dtype` that no copy reads any more."""
        for index, (buffer, done) in enumerate(self._idle):
            if _fits(buffer, count, dtype) and done.query():
                del self._idle[index]
                return buffer
        if len(self._idle) >= self._size:
            buffer, done = self._idle.pop(0)
            done.synchronize()
            if _fits(buffer, count, dtype):
                return buffer
        return self._allocate(max(count, self._numel), dtype)

    def give_back(self, buffer: torch.Tensor, done: Event) -> None:
        """`buffer` may be lent again once `done`, the copy reading it, has fired."""
        self._idle.append((buffer, done))


def _fits(buffer: torch.Tensor, count: int, dtype: torch.dtype) -> bool:
    return buffer.dtype == dtype and buffer.numel() >= count


class StagedCopies:
    """Pinned, non-blocking, event-ordered copies (rules (a) to (c) of the module).

    Args:
        streams: the device calls (`CudaStreams` on a GPU).
        numel: the length of the trainer's vector (the staging buffers' size).
    """

    def __init__(self, streams: Streams, numel: int) -> None:
        self.streams = streams
        self.pool = StagingPool(streams.pinned, numel)

    def gather(self, parts: Sequence[torch.Tensor]) -> torch.Tensor:
        out = self.streams.pinned(sum(part.numel() for part in parts), parts[0].dtype)
        pairs, offset = [], 0
        for part in parts:
            pairs.append((out[offset : offset + part.numel()], part))
            offset += part.numel()
        self.streams.side_copy(pairs).synchronize()
        return out

    def read(self, tensor: torch.Tensor) -> torch.Tensor:
        return self.gather([tensor])

    def stage(self, vector: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        count = vector.numel()
        buffer = self.pool.take(count, vector.dtype)
        staged = buffer[:count].view(vector.shape).copy_(vector)
        target = self.streams.empty(count, vector.dtype).view(vector.shape) if out is None \
            else out
        done = self.streams.side_copy([(target, staged)])
        self.pool.give_back(buffer, done)
        self.streams.compute_waits(done)
        return target


class CudaStreams:
    """`Streams` on a CUDA device: one side stream for copies, blocking events.

    Every stream call names the device by its index. Given none (``current_stream()``,
    the ``torch.cuda.stream`` context), torch looks up the current device through
    ``torch.cuda.is_available``, which asks the driver for its device count each time:
    about 0.13 ms on an H200 host, three or four times a copy, two copies a worker's
    exchange.
    """

    def __init__(self, device: torch.device) -> None:
        self.index = torch.cuda.current_device() if device.index is None else device.index
        self.device = torch.device("cuda", self.index)
        self.side = torch.cuda.Stream(self.device)  # type: ignore[no-untyped-call]

    def pinned(self, count: int, dtype: torch.dtype) -> torch.Tensor:
        return torch.empty(count, dtype=dtype, pin_memory=True)

    def empty(self, count: int, dtype: torch.dtype) -> torch.Tensor:
        return torch.empty(count, dtype=dtype, device=self.device)

    def side_copy(self, pairs: Pairs) -> Event:
        compute = torch.cuda.current_stream(self.index)
        # wait_stream records an event on the compute stream and makes the side stream wait
        self.side.wait_stream(compute)
        done = torch.cuda.Event(blocking=True)  # type: ignore[no-untyped-call]
        with torch.cuda.device(self.index):  # set_stream also makes its device current
            torch.cuda.set_stream(self.side)
            try:
                for target, source in pairs:
                    target.copy_(source, non_blocking=True)
            finally:
                torch.cuda.set_stream(compute)
        done.record(self.side)
        return done

    def compute_waits(self, event: Event) -> None:
        torch.cuda.current_stream(self.index).wait_event(cast(torch.cuda.Event, event))


def copies_for(device: torch.device, numel: int) -> DeviceCopies:
    """`StagedCopies` on a CUDA device, else `PlainCopies`."""
    if device.type == "cuda":
        return StagedCopies(CudaStreams(device), numel)
    return PlainCopies(device)
