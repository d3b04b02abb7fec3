"""Warm vectors: the pool reuses what nobody holds, and never what somebody keeps."""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from asyncsync.engine.settings import ServerSettings
from asyncsync.protocols.base import NoParams, Protocol, Push, ServerRule, WorkerLoop
from asyncsync.training.buffers import VectorPool
from asyncsync.transport.http_client import HttpTransport
from asyncsync.transport.http_server import ParameterServer

NUMEL = 5000  # 20 kB of float32: above `WARM_BYTES`, so pooled


def scribble(pool: VectorPool, times: int) -> None:
    """Take `times` vectors and overwrite them, as later receives would."""
    for _ in range(times):
        pool.take(NUMEL).fill_(-7.0)


def test_a_dropped_vector_comes_back_warm() -> None:
    pool = VectorPool()
    first = pool.take(NUMEL)
    address = first.data_ptr()
    del first
    again = pool.take(NUMEL)
    assert again.data_ptr() == address
    assert (pool.allocated, pool.reused) == (1, 1)


def test_a_vector_kept_in_any_form_is_never_lent_again() -> None:
    """Whole, as a view, as a numpy array or as a memoryview of one: while any of them is
    held, later takes (and whatever is written into them) leave the kept bytes alone."""
    pool = VectorPool()
    kept: list[Any] = []
    originals = []
    for form in range(4):
        vector = pool.take(NUMEL)
        vector.copy_(torch.arange(NUMEL, dtype=torch.float32) + form)
        originals.append(vector.clone())
        kept.append([vector, vector[10:20], vector.numpy(),
                     memoryview(vector.numpy()).cast("B")][form])
        del vector
        scribble(pool, 5)
    assert torch.equal(kept[0], originals[0])
    assert torch.equal(kept[1], originals[1][10:20])
    assert torch.equal(torch.from_numpy(kept[2]), originals[2])
    assert torch.equal(torch.frombuffer(kept[3], dtype=torch.float32), originals[3])
    kept.clear()
    before = pool.allocated
    scribble(pool, 3)
    assert pool.allocated == before  # released, they are reused


def test_sizes_and_dtypes_do_not_mix_and_few_free_buffers_are_kept() -> None:
    pool = VectorPool(keep=2)
    held = [pool.take(NUMEL) for _ in range(5)]
    assert pool.take(NUMEL, torch.uint8).dtype == torch.uint8
    assert pool.take(NUMEL + 1).numel() == NUMEL + 1
    assert pool.allocated == 7
    held.clear()
    again = [pool.take(NUMEL) for _ in range(3)]  # two of the five were kept
    assert (pool.reused, pool.allocated) == (2, 8)
    assert len({v.data_ptr() for v in again}) == 3


class KeepingRule(ServerRule):
    """Keeps every third pushed vector (as a protocol keeps anchors); drops the others."""

    push_kinds: ClassVar[frozenset[str]] = frozenset({"gradient"})

    def __init__(self, params: Any, store: Any) -> None:
        super().__init__(params, store)
        self.kept: list[torch.Tensor] = []
        self.pushes = 0

    async def on_push(self, push: Push) -> dict[str, Any]:
        if self.pushes % 3 == 0:
            self.kept.append(push.vector)
        self.pushes += 1
        return {}


class NoLoop(WorkerLoop):
    async def run(self, ctx: Any) -> None:
        raise NotImplementedError


KEEPING = Protocol("keeping", "keeps some pushes", NoParams, KeepingRule, NoLoop)


async def test_pushes_and_pulls_over_http_reuse_warm_memory_except_what_is_kept() -> None:
    model = torch.nn.Linear(NUMEL, 1, bias=False)
    settings = ServerSettings(run_id="r", worker_timeout_s=None)
    async with ParameterServer(model, KEEPING, 1, settings) as server:
        client = HttpTransport(server.url, NUMEL)
        try:
            reply, _ = await client.request("join", {"worker": 0, "run_id": "r"})
            ident = {"worker": 0, "run_id": "r", "session": reply["meta"]["session"]}
            for k in range(12):
                await client.request("push", {**ident, "kind": "gradient", "base_version": 0,
                                              "steps": 1, "samples": 1},
                                     torch.full((NUMEL,), float(k)))
            pulled = None
            for _ in range(6):
                _, pulled = await client.request("pull", {**ident, "base_version": 0})
                assert pulled is not None and torch.equal(pulled, model.weight.detach()[0])
        finally:
            await client.close()
        rule = server.core.rule
        assert isinstance(rule, KeepingRule)
        assert [float(v[0]) for v in rule.kept] == [0.0, 3.0, 6.0, 9.0]
        assert all(torch.equal(v, torch.full((NUMEL,), v[0].item())) for v in rule.kept)
        buffers = server.core.buffers
        assert buffers.allocated <= len(rule.kept) + 2, "the dropped pushes reuse memory"
        # the worker keeps its latest pull while the next one arrives: two buffers
        assert pulled is not None and client.buffers.allocated <= 2
