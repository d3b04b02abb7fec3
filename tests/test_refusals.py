"""Refusals change nothing: rule state, buffers, edges of the update rules (issue 21)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from asyncsync.clock import VirtualTimeLoop
from asyncsync.engine.checkpoint import CheckpointError
from asyncsync.engine.compute import InlineServerSeam, VirtualWorkerSeam
from asyncsync.engine.core import ServerCore, build_core
from asyncsync.engine.settings import ServerSettings
from asyncsync.engine.worker import Worker
from asyncsync.hetero.compute import FixedStepCost, StepDelay
from asyncsync.protocols.base import Pull, Push, ServerRule, Unacceptable, discover
from asyncsync.protocols.dcasgd import DcasgdParams
from asyncsync.protocols.diloco import DilocoParams
from asyncsync.protocols.dssync import DsSyncParams
from asyncsync.protocols.fedavg import FedAvgParams
from asyncsync.protocols.fedbuff import FedBuffParams
from asyncsync.protocols.fednova import FedNovaParams
from asyncsync.protocols.local_sgd import LocalSgdParams
from asyncsync.protocols.scaffold import ScaffoldParams
from asyncsync.protocols.streaming_diloco import StreamingDilocoParams
from asyncsync.protocols.wbsp import WbspParams
from asyncsync.transport.local import LocalTransport
from asyncsync.wire.codecs import Compressor, decode
from tests.helpers import STEP_S, batches_of, tiny_data, tiny_model

HUGE = 1e20
"""A finite delta whose square overflows float32: Adam's second moment becomes Inf."""


def core_of(protocol: str, params: Any, workers: int = 2) -> ServerCore:
    """A core whose `workers` ranks are all in the run (rules are driven directly)."""
    core = build_core(tiny_model(), protocol, workers, ServerSettings(lr=0.1),
                      protocol_params=params, seam=InlineServerSeam())
    core.store.live.update(range(workers))
    return core


def filled(core: ServerCore, value: float) -> torch.Tensor:
    return torch.full_like(core.store.w, value)


async def push_round(core: ServerCore, value: float) -> None:
    """Every worker pushes one update of `value`s (with what its protocol needs first)."""
    rule, base = core.rule, core.store.version
    for worker in sorted(core.store.live):
        if core.protocol.name == "scaffold":
            control = filled(core, 7.0 + base)  # another value each round
            await rule.on_push(Push(worker, base, "control", control, 4, 64))
        await rule.on_push(Push(worker, base, "delta", filled(core, value), 4, 64))


def snapshot(rule: ServerRule) -> dict[str, torch.Tensor]:
    return {key: value.clone() for key, value in rule.state_dict().items()}


def assert_identical(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> None:
    assert sorted(before) == sorted(after)
    for key, value in before.items():
        assert after[key].dtype == value.dtype and torch.equal(after[key], value), key


STATEFUL: dict[str, Any] = {
    "local_sgd": LocalSgdParams(server_optimizer="adam"),
    "fedavg": FedAvgParams(server_optimizer="adam"),
    "fednova": FedNovaParams(server_optimizer="adam", local_steps=4),
    "scaffold": ScaffoldParams(server_optimizer="adam"),
    "fedbuff": FedBuffParams(server_optimizer="adam", buffer_size=2),
    "diloco": DilocoParams(outer_optimizer="adam"),
    "streaming_diloco": StreamingDilocoParams(outer_optimizer="adam", fragments=1,
                                              overlap_steps=0),
}
"""Every rule that keeps state, with a server optimizer that refuses a huge delta (wbsp's
refusal comes before any change and has its own test below)."""


def test_every_rule_that_keeps_state_is_covered() -> None:
    stateful = {name for name, protocol in discover().items()
                if protocol.server.state_dict is not ServerRule.state_dict}
    assert stateful == {*STATEFUL, "wbsp", "wbsp_opt"}


@pytest.mark.parametrize("protocol", sorted(STATEFUL))
async def test_a_refused_update_leaves_the_rules_state_bit_identical(protocol: str) -> None:
    core = core_of(protocol, STATEFUL[protocol])
    await push_round(core, 0.01)  # a good round: the state is not empty any more
    assert core.store.version == 1
    before, w = snapshot(core.rule), core.store.w
    await push_round(core, HUGE)
    assert torch.equal(core.store.w, w)
    assert_identical(before, core.rule.state_dict())
    await push_round(core, 0.01)  # and the run goes on from there
    assert not torch.equal(core.store.w, w) and bool(torch.isfinite(core.store.w).all())


async def test_scaffolds_control_variate_stays_when_its_round_is_refused() -> None:
    core = core_of("scaffold", ScaffoldParams(server_optimizer="adam"))
    await push_round(core, HUGE)
    assert torch.equal(core.rule.state_dict()["control"], torch.zeros_like(core.store.w))


async def test_wbsp_refuses_an_overflowing_delta_before_changing_its_working_model() -> None:
    core = core_of("wbsp", WbspParams())
    rule = core.rule
    for _ in range(2):
        await rule.on_push(Push(0, 0, "delta", filled(core, 3e38), 1, 1))
    before = snapshot(rule)
    with pytest.raises(Unacceptable):
        await rule.on_push(Push(0, 0, "delta", filled(core, 3e38), 1, 1))
    assert_identical(before, rule.state_dict())


async def test_the_engine_restores_state_a_rule_changed_before_refusing() -> None:
    """The SDK's guarantee, not each rule's care: a rule that writes its state and then
    refuses under the store's lock finds its state as it was."""
    core = core_of("local_sgd", LocalSgdParams(server_optimizer="adam"))
    await push_round(core, 0.01)
    rule = core.rule
    before = snapshot(rule)
    with pytest.raises(Unacceptable):
        async with core.store.lock:
            rule.optimizer.state = {**rule.optimizer.state,  # type: ignore[attr-defined]
                                    "m": filled(core, 5.0)[: core.store.num_params]}
            raise Unacceptable("refused after the change")
    assert_identical(before, rule.state_dict())


async def test_fedbuff_accumulates_share_by_share() -> None:
    """Two deltas of 2e38 and an honest one: the mean (1.3e38 + small) is finite."""
    core = core_of("fedbuff", FedBuffParams(buffer_size=3, staleness_fn="constant"))
    w = core.store.w.clone()
    replies = [await core.rule.on_push(Push(k, 0, "delta", filled(core, value), 4, 64))
               for k, value in enumerate([2e38, 2e38, 3.0])]
    assert replies[-1]["buffered"] == 0 and not replies[-1]["refused"]
    assert core.store.version == 1
    expected = w + torch.tensor(2e38 / 3 + 2e38 / 3 + 1.0)
    assert torch.allclose(core.store.w, expected, rtol=1e-5)


async def test_a_refused_fedbuff_flush_discards_the_buffer_and_answers_its_push() -> None:
    core = core_of("fedbuff", FedBuffParams(buffer_size=2, server_optimizer="adam"))
    w = core.store.w
    await core.rule.on_push(Push(0, 0, "delta", filled(core, HUGE), 4, 64))
    reply = await core.rule.on_push(Push(1, 0, "delta", filled(core, 0.01), 4, 64))
    assert reply["refused"] and reply["buffered"] == 0
    assert core.store.w is w and core.store.version == 0
    assert core.rule.state_dict() == {}  # adam never stepped
    assert core.rule.refused == 1  # type: ignore[attr-defined]


async def test_dssync_commits_a_finite_consensus_when_the_incremental_one_overflows() -> None:
    core = core_of("dssync", DsSyncParams(), workers=4)
    rule = core.rule
    for worker in range(4):  # iteration 0: groups (0, 1) and (2, 3)
        await rule.on_push(Push(worker, 0, "model", filled(core, -3e38 if worker < 2 else 3e38),
                                0, 0, {"iteration": 0}))
    assert core.store.version == 2
    for worker in range(4):  # iteration 1: groups (0, 3) and (1, 2), each with mean 0
        value = 3e38 if worker < 2 else -3e38
        await rule.on_push(Push(worker, 2, "model", filled(core, value), 1, 1,
                                {"iteration": 1}))
    assert core.store.version == 4
    assert torch.equal(core.store.w, torch.zeros_like(core.store.w))


async def test_dcasgd_applies_a_huge_gradient_of_staleness_0_unchanged() -> None:
    core = core_of("dcasgd", DcasgdParams(), workers=1)
    await core.rule.on_pull(Pull(0, 0, {}))  # the ring holds version 0
    w = core.store.w.clone()
    await core.rule.on_push(Push(0, 0, "gradient", filled(core, 1e20), 1, 1))
    n = core.store.num_params
    assert torch.equal(core.store.w[:n], w[:n] - torch.tensor(0.1) * 1e20)


@pytest.mark.parametrize("steps", [10_001, 2**62])
async def test_fednova_refuses_more_steps_than_its_bound(steps: int) -> None:
    core = core_of("fednova", FedNovaParams())
    with pytest.raises(Unacceptable, match="bound"):
        await core.rule.on_push(Push(0, 0, "delta", filled(core, 0.1), steps, steps))
    assert core.rule.pending == [{}]  # type: ignore[attr-defined]


def test_fednovas_step_bound_holds_its_local_steps() -> None:
    with pytest.raises(ValueError, match="max_steps: must be >= local_steps"):
        FedNovaParams(local_steps=20, max_steps=10)


def test_a_worker_whose_pushes_are_refused_logs_them_and_goes_on() -> None:
    """Every push claims more samples than `max_batch` allows: each is refused, and the
    worker re-syncs and trains on until its step limit instead of exiting."""
    x, y = tiny_data()

    async def run() -> dict[str, Any]:
        core = build_core(tiny_model(), "asp", 1, ServerSettings(lr=0.1, max_batch=8),
                          seam=InlineServerSeam())
        worker = Worker(0, LocalTransport(core), tiny_model(), batches_of(x, y, 0), "asp",
                        lr=0.1, batch_size=16, max_steps=4,
                        seam=VirtualWorkerSeam(StepDelay(0.0), FixedStepCost(STEP_S, 16)))
        final = await worker.run()
        await core.stop()
        await core.close()
        assert core.store.version == 0
        return final

    loop = VirtualTimeLoop()
    try:
        final = loop.run_until_complete(run())
    finally:
        loop.close()
    assert final["refused"] >= 3


def bn_model() -> torch.nn.Module:
    """BatchNorm first: its statistics depend on the data alone, not on the training."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 16), torch.nn.ReLU(),
                               torch.nn.Linear(16, 2))


def bn_statistics(codec: str) -> torch.Tensor:
    """The server's buffer slots after 12 asp steps of one worker pushing with `codec`."""
    x, y = tiny_data()

    async def run() -> torch.Tensor:
        core = build_core(bn_model(), "asp", 1, ServerSettings(lr=0.1),
                          seam=InlineServerSeam())
        worker = Worker(0, LocalTransport(core), bn_model(), batches_of(x, y, 0), "asp",
                        lr=0.1, batch_size=16, max_steps=12,
                        compressor=None if codec == "none" else Compressor(codec, 0.05),
                        seam=VirtualWorkerSeam(StepDelay(0.0), FixedStepCost(STEP_S, 16)))
        await worker.run()
        await core.stop()
        await core.close()
        assert core.store.version >= 11
        return core.store.w[core.store.num_params :].clone()

    loop = VirtualTimeLoop()
    try:
        return loop.run_until_complete(run())
    finally:
        loop.close()


@pytest.mark.parametrize("codec", ["float16", "bfloat16", "int8", "topk"])
def test_compressed_pushes_carry_batchnorm_statistics_exactly(codec: str) -> None:
    exact = bn_statistics("none")
    assert bool(exact[:8].abs().gt(0).all())  # running_mean moved from 0
    assert torch.equal(bn_statistics(codec), exact)


def test_buffer_slots_travel_raw_and_take_no_error_feedback() -> None:
    vector = torch.tensor([1e-3, -2e-3, 5e-4, 2.5, -3.0])
    compressor = Compressor("topk", 0.01)
    payload, codec = compressor.encode("gradient", vector, "s", buffers=2)
    assert codec["raw"] == 2 and codec["k"] == 1
    assert torch.equal(decode(codec, payload, 5), torch.tensor([0.0, -2e-3, 0.0, 2.5, -3.0]))
    assert torch.equal(compressor.residuals["gradient"], torch.tensor([1e-3, 0.0, 5e-4]))


def checkpointed_core(protocol: str, params: Any, path: Path) -> ServerCore:
    core = build_core(tiny_model(), protocol, 2, ServerSettings(lr=0.1, checkpoint_path=path),
                      protocol_params=params, seam=InlineServerSeam())
    core.store.live.update(range(2))
    return core


def tamper(path: Path, **arrays: np.ndarray) -> None:
    """Rewrite the checkpoint at `path` with some arrays replaced."""
    with np.load(path, allow_pickle=False) as data:
        saved = {key: data[key] for key in data.files}
    saved.update(arrays)
    with path.open("wb") as handle:
        np.savez(handle, **saved)


@pytest.mark.parametrize("protocol", sorted({*STATEFUL, "wbsp"}))
async def test_a_rule_state_that_does_not_fit_is_a_checkpoint_error(protocol: str,
                                                                    tmp_path: Path) -> None:
    params = STATEFUL.get(protocol, WbspParams())
    path = tmp_path / "checkpoint.npz"
    core = checkpointed_core(protocol, params, path)
    if protocol == "wbsp":
        await core.rule.on_push(Push(0, 0, "delta", filled(core, 0.01), 1, 1))
    else:
        await push_round(core, 0.01)
    assert await core.run.checkpoint()
    with np.load(path, allow_pickle=False) as data:
        keys = [key for key in data.files if key.startswith("rule.")]
    assert keys
    for key in keys:
        fresh = tmp_path / f"{key}.npz"
        fresh.write_bytes(path.read_bytes())
        tamper(fresh, **{key: np.zeros(3, dtype=np.float32)})
        with pytest.raises(CheckpointError, match=r"shape|holds|does not fit"):
            checkpointed_core(protocol, params, fresh).resume(fresh)


async def test_a_checkpoint_whose_model_holds_nan_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.npz"
    core = checkpointed_core("bsp", None, path)
    assert await core.run.checkpoint()
    w = core.store.w.numpy().copy()
    w[3] = np.nan
    tamper(path, w=w)
    with pytest.raises(CheckpointError, match="w holds NaN or Inf"):
        checkpointed_core("bsp", None, path).resume(path)


def fresh_interpreter(code: str) -> str:
    """Run `code` in a new Python process; its stdout."""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, timeout=120)
    return done.stdout.strip()


def test_the_public_registry_is_complete_in_a_fresh_interpreter() -> None:
    out = fresh_interpreter("import asyncsync; print(asyncsync.PROTOCOLS['bsp'].name, "
                            "len(asyncsync.PROTOCOLS))")
    assert out == "bsp 21"


def test_a_protocol_module_does_not_load_the_transports_or_the_runner() -> None:
    heavy = ("aiohttp", "rich", "asyncsync.study.runner", "asyncsync.transport.http_server")
    out = fresh_interpreter("import sys, asyncsync.protocols.base; "
                            f"print([m for m in {heavy!r} if m in sys.modules])")
    assert out == "[]"
