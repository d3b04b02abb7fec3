"""Virtual-time runs: one run's server core and all its workers in this process, on a
`VirtualTimeLoop`, talking through the in-process transport (real frames, no sockets).

The protocol code, the engine, the compute profiles and the link model are the same as in real
mode; only the clock and the two compute seams differ. Each local step runs its real torch math
inline, on the run's device (``device``: workers' math and the evaluation of the global model), and
is charged its step time x slowdown in virtual seconds; each message pays latency and bytes /
bandwidth in virtual seconds. On a GPU (``compute.batched``, `asyncsync.study.worker_math`), the
steps' math runs batched over the workers instead (`asyncsync.engine.cohort`), charged the same.
Workers are built by `asyncsync.study.assembly.assemble_worker`, as in real mode. A step's time
comes from the recipe alone, never from this host: the FLOPs of one step of the run's model over
the worker's device rate (`asyncsync.hetero.cost_model`), or the recipe's explicit
``compute.base_step_s``. Only ``base_step_s = "calibrate"`` measures this host
(`calibrate_step_s`), and summary.json then says so.

**(choice)** Virtual workers send no heartbeats and the server drops none for silence
(``fault.heartbeat_s`` and ``fault.worker_timeout_s`` are for real runs): a worker in the server's
process cannot fall silent; it leaves when its availability takes it offline or its run ends.
Heartbeats were a third of the engine's time in a 1,000-client population, for 100 bytes every 2 s
on each link. (`asyncsync.study.assembly` builds both sides so.)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch

from asyncsync.clock import VirtualTimeLoop, wall
from asyncsync.engine.channel import Transport
from asyncsync.engine.cohort import CohortWorkerSeam
from asyncsync.engine.compute import Charged, InlineServerSeam, VirtualWorkerSeam, WorkerSeam
from asyncsync.engine.core import ServerCore, build_core
from asyncsync.engine.settings import ServerSettings
from asyncsync.engine.worker import Worker
from asyncsync.hetero.compute import ComputeProfile, FixedStepCost, StepCost, StepDelay
from asyncsync.hetero.network import Link, LinkSpec, ServerLink
from asyncsync.protocols.base import Protocol, get_protocol
from asyncsync.runlog.metrics import JsonlLog, RankLog
from asyncsync.runlog.schema import WORKERS_LOG
from asyncsync.study.assembly import (
    StepTimes,
    assemble_worker,
    batch_sources,
    run_data,
    run_flops,
    run_model,
    server_settings,
    step_times,
)
from asyncsync.study.specs import TIMING_MODEL, RunSpec
from asyncsync.study.worker_math import WorkerMath, choose_worker_math
from asyncsync.training.data import Dataset
from asyncsync.training.models import TimingModel
from asyncsync.training.trainer import BatchSource, ScratchGradients, Trainer, share_copies
from asyncsync.transport.gc_tuning import tune_gc, young_threshold
from asyncsync.transport.local import LocalTransport

StatusSink = Callable[[dict[str, Any]], None]
CALIBRATION_STEPS = 7
TIMING_CLASSES = 10
YOUNG_PER_WORKER = 100
"""Allocations per simulated worker between young collections (`young_threshold`): about
what a worker holds while it waits at a barrier. At 10,000 workers x 8 virtual s, the
collector took 2.3 s of bsp's 17 s at 20 (12 young collections of 120 ms each, as the
waiting workers' objects survived them) and 0.25 s at 100 (one, after the set-up)."""
WATCH_REAL_S = 0.5
"""A run's status goes to its sink at least this often in real seconds, as well as every
virtual second: at 0.014 virtual s per real one (4 mlp workers of the quickstart) a status
per virtual second came every 71 s, and so did the stop a Ctrl-C raises from the sink."""
SHARED_LOG_ABOVE = 64
"""Runs of more workers write every worker's records to one `WORKERS_LOG` (a rank field in
each) rather than a ``worker-<rank>.jsonl`` each: 100,000 workers would be 100,000 files."""
T = TypeVar("T")
REAL_TIME_FIELDS = frozenset({"real_s", "setup_real_s", "math_real_s", "eval_real_s",
                              "virtual_per_real"})
"""The facts of a virtual run's summary that measure the host, not the simulation: the only
ones two runs of the same recipe and seed may differ in."""


@dataclass
class RealCost:
    """Real seconds a virtual-time run spent building its server and workers, in its
    workers' local steps and in evaluations (the last two run inline, so they are what
    bounds a run's speed), and the path its workers' math took."""

    setup_s: float = 0.0
    math_s: float = 0.0
    eval_s: float = 0.0
    math: WorkerMath | None = None  # the worker math's path, once chosen


class _TimedWorkerSeam(VirtualWorkerSeam):
    """`VirtualWorkerSeam` that adds the real time of each step's math to a `RealCost`."""

    def __init__(self, profile: ComputeProfile, cost: StepCost, real: RealCost) -> None:
        super().__init__(profile, cost)
        self.real = real

    async def step(self, fn: Callable[..., Any], *args: Any, batch: int = 0) -> Charged:
        def timed(*inner: Any) -> Any:
            began = wall()
            try:
                return fn(*inner)
            finally:
                self.real.math_s += wall() - began

        return await super().step(timed, *args, batch=batch)


class _TimedServerSeam(InlineServerSeam):
    """`InlineServerSeam` that adds the real time of each evaluation to a `RealCost`."""

    def __init__(self, cost: RealCost) -> None:
        super().__init__()
        self.cost = cost

    async def evaluate(self, fn: Callable[..., T], *args: Any) -> T:
        began = wall()
        try:
            return fn(*args)
        finally:
            self.cost.eval_s += wall() - began


def calibrate_step_s(spec: RunSpec) -> float:
    """The median wall time of a few real local steps of the run's model and batch size on
    this host (after one warm-up step)."""
    data = run_data(spec)
    trainer = Trainer(run_model(spec, data), batch_sources(spec, data)(0), spec.optim.lr,
                      device="cpu")
    trainer.local_step(spec.data.batch_size)
    seconds = []
    for _ in range(CALIBRATION_STEPS):
        began = wall()
        trainer.local_step(spec.data.batch_size)
        seconds.append(wall() - began)
    return statistics.median(seconds)


def simulate(spec: RunSpec, run_dir: Path, run_id: str, status: StatusSink | None = None,
             calibrated_s: float | None = None,
             known: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run `spec` in virtual time, writing the same records as a real run (every worker's in
    one `WORKERS_LOG` above `SHARED_LOG_ABOVE` workers); returns the facts
    a summary adds (each worker's step time and its source, real seconds taken, of which in
    the model's math and in evaluations, virtual seconds per real one). `calibrated_s` is a
    step time measured on this host, for a recipe whose ``base_step_s`` is "calibrate".
    `known` receives the worker math's facts even when the run raises, so that a failed
    run's summary says which path ran."""
    torch.set_num_threads(1)
    # the same logs every run: no cuDNN kernel that sums with atomics or is picked by timing
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    tune_gc()  # collections were a quarter of a 2,000-worker run's host time
    began = wall()
    data = None if spec.model.name == TIMING_MODEL else run_data(spec)  # loaded once
    times = run_step_times(spec, calibrated_s, data)
    loop = VirtualTimeLoop()
    cost = RealCost(setup_s=wall() - began)
    try:
        with young_threshold(YOUNG_PER_WORKER * spec.workers):
            virtual_s = loop.run_until_complete(
                _run(spec, run_dir, run_id, times, status, cost, data))
    finally:
        _close_settled(loop)
        if known is not None and cost.math is not None:
            known.update(cost.math.facts())
    real_s = wall() - began
    fixed = spec.compute.explicit_step_s or calibrated_s
    return {"clock": "virtual", "base_step_s": fixed or None, **times.facts(),
            **spec.population().facts(),
            "real_s": round(real_s, 3), "setup_real_s": round(cost.setup_s, 3),
            "math_real_s": round(cost.math_s, 3), "eval_real_s": round(cost.eval_s, 3),
            "virtual_per_real": round(virtual_s / real_s, 3) if real_s > 0 else None,
            **(cost.math.facts() if cost.math else {})}


def run_step_times(spec: RunSpec, calibrated_s: float | None = None,
                   data: Dataset | None = None) -> StepTimes:
    """How the run's steps are charged (the model's FLOPs are counted once, here, on the
    run's `data`, loaded if not given)."""
    if spec.compute.explicit_step_s or calibrated_s:
        return step_times(spec, None, calibrated_s)
    if spec.compute.calibrate:
        raise ValueError('compute.base_step_s = "calibrate" needs the calibrated step time')
    if spec.model.name == TIMING_MODEL:
        return step_times(spec, run_flops(spec, TimingModel((1,), TIMING_CLASSES), (1,)))
    data = data if data is not None else run_data(spec)
    return step_times(spec, run_flops(spec, run_model(spec, data), data.input_shape))


async def _run(spec: RunSpec, run_dir: Path, run_id: str, times: StepTimes,
               status: StatusSink | None, cost: RealCost, data: Dataset | None) -> float:
    building = wall()
    protocol = get_protocol(spec.protocol.name)
    parts = _timing_parts(spec) if data is None else _training_parts(spec, data)
    math = cost.math = choose_worker_math(spec, parts.model, parts.batches)
    core = build_core(parts.model(), protocol, spec.workers,
                      server_settings(spec, run_id, None), protocol_params=spec.protocol.params,
                      test_data=parts.test_data, events=JsonlLog(run_dir / "events.jsonl"),
                      seam=_TimedServerSeam(cost))
    server_link = ServerLink(spec.network.server_mbps) if spec.network.server_mbps else None

    def local(link: Link | None) -> Transport:
        return LocalTransport(core, link, server_link, parts.payload_scale,
                              spec.network.message_overhead_ms / 1000)

    def timed(rank: int) -> Callable[[ComputeProfile], WorkerSeam]:
        if math.cohort is not None:
            cohort = math.cohort
            return lambda profile: CohortWorkerSeam(profile, times.costs[rank], cohort)
        return lambda profile: _TimedWorkerSeam(profile, times.costs[rank], cost)

    shared = JsonlLog(run_dir / WORKERS_LOG) if spec.workers > SHARED_LOG_ABOVE else None
    workers = [assemble_worker(spec, rank, run_id, parts.model(), parts.batches(rank), local,
                               timed(rank), None if shared else run_dir, math.device)
               for rank in range(spec.workers)]
    scratch = ScratchGradients()  # steps run one at a time: one serves all, as one copier does
    share_copies(worker.trainer for worker in workers)
    for worker in workers:
        worker.trainer.scratch = scratch
        if shared is not None:
            worker.metrics.log = RankLog(shared, worker.rank)
    began = wall()
    cost.setup_s += began - building

    def progress() -> dict[str, Any]:
        real_s = wall() - began
        return {**core.status(),
                "virtual_per_real": core.elapsed() / real_s if real_s > 0 else None}

    if status is not None:
        loop = asyncio.get_running_loop()
        assert isinstance(loop, VirtualTimeLoop)
        # every virtual second and every WATCH_REAL_S real seconds, without a timer
        loop.watch(1.0, lambda: status(progress()), WATCH_REAL_S)
    try:
        await together(worker.run() for worker in workers)
        await core.stop()
        if math.cohort is not None:
            cost.math_s += math.cohort.real_s
        return core.elapsed()
    finally:
        await core.close()
        if shared is not None:
            shared.close()


@dataclass(frozen=True)
class _Parts:
    """What a simulated run trains: its model (one per node), each rank's batches, the
    test set (None: not evaluated) and the wire bytes charged per byte of vector."""

    model: Callable[[], torch.nn.Module]
    batches: Callable[[int], BatchSource]
    test_data: tuple[torch.Tensor, torch.Tensor] | None
    payload_scale: float = 1.0


def _training_parts(spec: RunSpec, data: Dataset) -> _Parts:
    return _Parts(lambda: run_model(spec, data), batch_sources(spec, data),
                  (data.test_x, data.test_y))


_KeyedBatch = tuple[torch.Tensor, torch.Tensor, bytes]


class StandIn(TimingModel):
    """The timing-only stand-in with its gradient in closed form: the same aten kernels
    autograd runs for it (log-softmax, NLL, their backward, the linear layer's), so a step
    gives autograd's loss and gradient to the bit, without building or walking a graph.

    `memo`, shared by a run's stand-ins, keeps recent results by their inputs' bytes
    (parameters, batch): the workers of a barrier round start from the same model and
    constant batches, so one of them computes and the others look it up. A result is the
    loss and the gradient laid out as the flat gradient holds it (weight, then bias), so
    one addition writes it. `batch_bytes`, shared too, keeps each batch's bytes with its
    tensors (a timing run's batches are the same two tensors every step).
    """

    MEMO_SIZE, BATCHES_KEPT = 4096, 64

    def __init__(self, input_shape: tuple[int, ...], num_classes: int,
                 memo: dict[bytes, tuple[torch.Tensor, torch.Tensor]] | None = None,
                 batch_bytes: dict[tuple[int, int], _KeyedBatch] | None = None) -> None:
        super().__init__(input_shape, num_classes)
        self.memo = {} if memo is None else memo
        self.batch_bytes = {} if batch_bytes is None else batch_bytes

    def cross_entropy_gradient(self, inputs: torch.Tensor, targets: torch.Tensor,
                               grad: torch.Tensor) -> torch.Tensor:
        weight, bias = self.weight, self.bias
        key = (weight.detach().numpy().tobytes() + bias.detach().numpy().tobytes()
               + self._bytes_of(inputs, targets))
        known = self.memo.get(key)
        if known is None:
            known = self._compute(inputs, targets)
            if len(self.memo) >= self.MEMO_SIZE:
                self.memo.clear()
            self.memo[key] = known
        loss, gradient = known
        grad[: gradient.numel()].add_(gradient)
        return loss

    def _bytes_of(self, inputs: torch.Tensor, targets: torch.Tensor) -> bytes:
        """The batch's bytes (kept with its tensors, so an id is never reused meanwhile)."""
        known = self.batch_bytes.get((id(inputs), id(targets)))
        if known is None or known[0] is not inputs or known[1] is not targets:
            if len(self.batch_bytes) >= self.BATCHES_KEPT:
                self.batch_bytes.clear()
            known = (inputs, targets, inputs.numpy().tobytes() + targets.numpy().tobytes())
            self.batch_bytes[id(inputs), id(targets)] = known
        return known[2]

    def _compute(self, inputs: torch.Tensor, targets: torch.Tensor,
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        """The loss, and the weight's then the bias's gradient in one vector, by autograd's
        kernels."""
        weight, bias = self.weight, self.bias
        x = inputs.flatten(1).mean(1, keepdim=True)
        logp = torch.log_softmax(torch.nn.functional.linear(x, weight, bias), 1)
        aten = torch.ops.aten
        loss, total = aten.nll_loss_forward(logp, targets, None, 1, -100)
        dlogp = aten.nll_loss_backward(torch.ones_like(loss), logp, targets, None, 1, -100,
                                       total)
        dlogits = aten._log_softmax_backward_data(dlogp, logp, 1, logp.dtype)
        return loss, torch.cat([x.t().mm(dlogits).t().reshape(-1), dlogits.sum(0)])


def _timing_parts(spec: RunSpec) -> _Parts:
    """Timing-only: a stand-in model of a few parameters fed constant batches, its vectors
    charged as the declared ``model.size_mb``; nothing model-sized exists per worker."""

    memo: dict[bytes, tuple[torch.Tensor, torch.Tensor]] = {}
    batch_bytes: dict[tuple[int, int], _KeyedBatch] = {}
    constants: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def model() -> torch.nn.Module:
        torch.default_generator.manual_seed(spec.seed)  # the CPU's only, as `run_model`
        return StandIn((1,), TIMING_CLASSES, memo, batch_bytes)

    def batches(rank: int) -> BatchSource:
        del rank  # every rank is fed alike: the stand-in's loss means nothing

        def constant(size: int) -> tuple[torch.Tensor, torch.Tensor]:
            known = constants.get(size)
            if known is None:  # made once per size: nothing writes into a batch
                known = constants[size] = (torch.zeros(size, 1),
                                           torch.zeros(size, dtype=torch.long))
            return known

        return constant

    numel = sum(t.numel() for t in model().state_dict().values())
    return _Parts(model, batches, None, spec.model.size_mb * 1e6 / (4 * numel))


async def together(coroutines: Iterable[Coroutine[Any, Any, T]]) -> list[T]:
    """Await `coroutines` together. The first error cancels the others and is raised once
    they have ended, so that no worker is left pending when the loop closes (its tasks
    were destroyed then, with a page of warnings after the error)."""
    tasks = [asyncio.ensure_future(coroutine) for coroutine in coroutines]
    try:
        return await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


def write_summary(run_dir: Path, summary: dict[str, Any]) -> None:
    """summary.json of a run."""
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))


def run_virtual(protocol: str | Protocol, model: Callable[[], torch.nn.Module],
                batches: Callable[[int], BatchSource], delays: list[float], *,
                settings: ServerSettings, params: Any = None, step_s: float = 0.001,
                batch_size: int = 16, link: LinkSpec | None = None,
                max_steps: int | None = None,
                test_data: tuple[torch.Tensor, torch.Tensor] | None = None,
                prepare: Callable[[ServerCore], object] | None = None,
                ) -> tuple[ServerCore, list[dict[str, Any]]]:
    """Run a protocol in virtual time, in this thread: one in-process worker per entry of
    `delays` (test kit for protocol authors, beside `asyncsync.protocols.testing`).

    Each local step of `batch_size` samples is charged `step_s` plus its worker's delay on
    the virtual clock (the real math runs inline), and `link` shapes every worker's
    messages, so the outcome does not depend on the host's speed or load. The run ends
    after ``settings.time_s`` virtual seconds, or as soon as the first worker reaches
    `max_steps` (the server then stops, so no worker waits at a barrier a finished peer
    will never reach). Returns the server core (store, commits, staleness, blocked time)
    and each worker's final totals. `prepare` sees the core before the run starts. A task
    still pending once the run is over (a leak) raises `RuntimeError`.
    """
    async def run() -> tuple[ServerCore, list[dict[str, Any]]]:
        core = build_core(model(), protocol, len(delays), settings, protocol_params=params,
                          test_data=test_data, seam=InlineServerSeam())
        if prepare is not None:
            prepare(core)
        cost = FixedStepCost(step_s, batch_size)
        workers = [
            Worker(rank, LocalTransport(core, Link(link, seed=rank) if link else None),
                   model(), batches(rank), protocol, protocol_params=params, lr=settings.lr,
                   batch_size=batch_size, max_steps=max_steps,
                   seam=VirtualWorkerSeam(StepDelay(delay), cost))
            for rank, delay in enumerate(delays)]

        async def one(worker: Worker) -> dict[str, Any]:
            final = await worker.run()
            await core.stop()
            return final

        try:
            finals = await together(one(w) for w in workers)
        finally:
            await core.close()
        leaked = sorted(t.get_name() for t in asyncio.all_tasks()
                        if t is not asyncio.current_task())
        if leaked:
            raise RuntimeError(f"{len(leaked)} task(s) outlived the run: {', '.join(leaked)}")
        return core, list(finals)

    loop = VirtualTimeLoop()
    try:
        return loop.run_until_complete(run())
    finally:
        _close_settled(loop)


def _close_settled(loop: VirtualTimeLoop) -> None:
    """Close `loop`, first cancelling and awaiting the tasks a run stopped midway left
    pending (its status sink raised: Ctrl-C, SIGTERM), so that none is destroyed pending."""
    loop.unwatch()
    pending = asyncio.all_tasks(loop)
    for task in pending:
        task.cancel()
    if pending:
        with contextlib.suppress(Exception):  # the run's own error is the one raised
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
    loop.close()
