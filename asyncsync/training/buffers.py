"""Warm vectors: a pool of CPU buffers reused for receives, gradient copies and commits.

Memory the process has not touched yet costs a page fault per 4 KiB page on first write:
filling a fresh 48 MB tensor takes about three times as long as filling one already in
use. Every steady-state receive, gradient copy and commit takes its vector from a pool
instead, so it lands in memory that is already mapped.

**Ownership rule.** A vector taken from a pool belongs to whoever holds it, for as long as
they like: a rule may keep a pushed vector in a round, a buffer or as an anchor, a loop may
keep a pulled model, and nothing is ever written into it behind their back. The buffer
goes back to the pool by itself once no tensor shares its memory any more (the pool reads
the use count of the buffer's storage, which counts every tensor and view of it, and the
numpy arrays and memoryviews made from them through the tensor they keep alive). Keeping a
vector needs no call and releasing one needs none: dropping the last reference is the
release. Only a holder that copies raw bytes out of a vector without keeping any tensor
of it alive (there is none in asyncsync) could read memory that was reused.

Reclaim needs ``torch._C._storage_Use_Count`` (torch >= 2.1); without it the pool only
allocates (correct, just cold).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch

KEEP = 4
"""Free buffers kept per size and dtype (more are released to the allocator)."""
TRACK = 32
"""Lent buffers watched per size and dtype; older ones are left to the garbage collector."""
WARM_BYTES = 16 * 1024
"""Smaller buffers are made new at every take: four pages are no page faults worth saving,
and the pool's bookkeeping cost more than a timing-only run's whole stand-in step."""

_use_count: Callable[[int], int] | None = getattr(torch._C, "_storage_Use_Count", None)


def storage_users(tensor: torch.Tensor) -> int:
    """How many references the storage of `tensor` has (tensors, views, storages); 0 when
    this torch cannot tell."""
    if _use_count is None:
        return 0
    storage = tensor.untyped_storage()
    return _use_count(storage._cdata) - 1  # not counting `storage` itself


class VectorPool:
    """Buffers of a few sizes, lent out and taken back by the ownership rule above.

    Thread-safe (a worker's compute thread and its event loop both take vectors).

    Attributes:
        allocated: buffers made since the pool was created; reused: takes that found a
            free warm buffer.
    """

    def __init__(self, keep: int = KEEP, track: int = TRACK) -> None:
        if keep < 0 or track < 1:
            raise ValueError(f"keep must be >= 0 and track >= 1, got {keep} and {track}")
        self.keep = keep
        self.track = track
        self.allocated = 0
        self.reused = 0
        self._lock = threading.Lock()
        self._free: dict[tuple[int, torch.dtype], list[torch.Tensor]] = {}
        self._lent: dict[tuple[int, torch.dtype], list[torch.Tensor]] = {}

    def take(self, numel: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """A 1-D CPU tensor of `numel` elements of `dtype` with arbitrary contents, the
        caller's until it drops every reference to it."""
        if numel * dtype.itemsize < WARM_BYTES:
            with self._lock:
                self.allocated += 1
            return torch.empty(numel, dtype=dtype)
        key = (numel, dtype)
        with self._lock:
            self._reclaim(key)
            free = self._free.get(key)
            if free:
                owner = free.pop()
                self.reused += 1
            else:
                owner = torch.empty(numel, dtype=dtype)
                self.allocated += 1
            lent = self._lent.setdefault(key, [])
            lent.append(owner)
            if len(lent) > self.track:
                del lent[0]
            return owner.view(numel)  # a second tensor on the storage: the holder's

    def _reclaim(self, key: tuple[int, torch.dtype]) -> None:
        """Move lent buffers nobody holds any more to the free list (under the lock)."""
        if _use_count is None:
            self._lent.pop(key, None)
            return
        lent = self._lent.get(key, [])
        free = self._free.setdefault(key, [])
        still = []
        for owner in lent:
            if storage_users(owner) > 1:
                still.append(owner)
            elif len(free) < self.keep:
                free.append(owner)
        self._lent[key] = still
