"""The compute seam: where local computation runs and how long it is charged.

A worker's seam runs its trainer's work and charges it time; a server's seam runs vector
math and evaluation. Real mode (here): a worker computes in one dedicated thread, so the
event loop keeps moving bytes meanwhile (a short step with nothing else on the loop runs
on the loop itself, `ThreadedWorkerSeam`), and its emulated slowness is padding slept on
the loop after each real step (counted as computation); the server runs small models'
vector math inline and large ones, and every evaluation, in threads. Virtual mode: the
same math runs inline (it costs no virtual time). A paced step (virtual mode always, real
mode with a `StepCost`) lasts `asyncsync.hetero.compute.step_seconds`, the one step-time
rule of both clocks; virtual mode charges it as an asyncio sleep on the virtual clock.
"""

from __future__ import annotations

import asyncio
import functools
import math
import weakref
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, NamedTuple, Protocol, TypeVar

from asyncsync.clock import Stopwatch, now, sleep
from asyncsync.hetero.compute import ComputeProfile, StepCost, step_seconds

T = TypeVar("T")
INLINE_NUMEL = 1 << 18
"""Models up to this many elements (1 MB) do their server vector math on the event loop:
it takes tens of microseconds, less than the hop to a thread and back."""
INLINE_STEP_S = 0.02
"""A worker's step whose last run took less than this may run on the event loop's own
thread (see `ThreadedWorkerSeam`): the two thread hand-offs it saves cost about 0.2 ms, and
the loop is held no longer than a loop-lag budget allows."""
OUT_OF_BATCHES = ("a local step raised StopIteration: its batch source ran out of batches (a "
                  "generator or iterator is spent after one pass: give the worker a list, a "
                  "DataLoader, or a callable batch_size -> (inputs, targets))")
_TENANTS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, int] = (
    weakref.WeakKeyDictionary())


def enter_loop() -> None:
    """Count a node (a worker's run, a listening server) on the running event loop until
    `leave_loop`: a worker's step holds the loop only while it is the loop's one node."""
    loop = asyncio.get_running_loop()
    _TENANTS[loop] = _TENANTS.get(loop, 0) + 1


def leave_loop() -> None:
    loop = asyncio.get_running_loop()
    _TENANTS[loop] -= 1


def sole_node() -> bool:
    """Whether at most one node runs on the running event loop."""
    return _TENANTS.get(asyncio.get_running_loop(), 0) <= 1


class Charged(NamedTuple):
    """A step's result, the seconds charged to it, and the slowdown factor in force."""

    result: Any
    seconds: float
    factor: float


class WorkerSeam(Protocol):
    """How a worker computes: `step` is charged as computation, `math` is not."""

    @property
    def overruns(self) -> int:
        """Steps whose real computation exceeded their paced duration."""
        ...

    def start(self) -> None:
        """The run started: profile time counts from now."""
        ...

    async def step(self, fn: Callable[..., Any], *args: Any, batch: int = 0) -> Charged:
        """Run one local step of `batch` samples and charge it."""
        ...

    async def math(self, fn: Callable[..., T], *args: Any) -> T:
        """Run vector math off the event loop, uncharged (copies, deltas)."""
        ...

    def defer(self, fn: Callable[..., object], *args: Any) -> None:
        """Have `fn(*args)` (e.g. adopting a pulled model) run before the next `step` or
        `math` computes anything, in the same order as other work: no later computation
        can tell it from running now."""
        ...

    def watch(self, busy: Callable[[], bool]) -> None:
        """`busy()` tells whether the worker has a message under way (its bytes must keep
        moving while a step computes)."""
        ...

    def close(self) -> None: ...


class ServerSeam(Protocol):
    """How the server computes: vector math of the rules, and evaluation."""

    async def math(self, fn: Callable[..., T], *args: Any) -> T: ...

    async def evaluate(self, fn: Callable[..., T], *args: Any) -> T: ...

    async def blocking(self, fn: Callable[..., T], *args: Any) -> T:
        """Blocking work that is not computation (file writes, fsync)."""
        ...

    def close(self) -> None: ...


class ThreadedWorkerSeam:
    """Real mode: one compute thread; slowness padding is an asyncio sleep after the step.

    Without a `cost`, a step is its real computation padded by the profile; with one
    (paced mode), it lasts `step_seconds` whatever the computation took, unless the
    computation alone is longer (an overrun: counted, not padded).

    A step runs on the event loop's own thread instead when holding the loop costs
    nothing: the worker is watched (`watch`) and has no message under way, it is the only
    node on the loop (`enter_loop`: no other worker and no server shares it), the compute
    thread has no job, and the last step took under `inline_below_s` (checked after the
    tasks made ready before the step have started, so a background exchange started just
    before it counts). Then nothing on the loop has bytes to move, and the step saves the
    two hand-offs to the thread and back (wake-ups of idle threads, about 0.2 ms a step
    with `bench/overhead.py`'s cnn, a step of ~5 ms). A heartbeat's reply, or a task
    sleeping on a timer, waits at most that one short step. Vector math (`math`) always
    runs on the thread.
    """

    def __init__(self, profile: ComputeProfile, name: str = "asyncsync-compute",
                 cost: StepCost | None = None, inline_below_s: float = INLINE_STEP_S) -> None:
        if inline_below_s < 0:
            raise ValueError(f"inline_below_s must be >= 0, got {inline_below_s}")
        self.profile = profile
        self.cost = cost
        self.inline_below_s = inline_below_s
        self.overruns = 0
        self.run_time = Stopwatch()
        self._pool = ThreadPoolExecutor(1, thread_name_prefix=name)
        self._deferred: list[Callable[[], object]] = []
        self._busy: Callable[[], bool] | None = None
        self._last_job: Future[Any] | None = None  # the thread runs jobs in order
        self._last_step_s = math.inf

    def start(self) -> None:
        self.run_time.start()

    def watch(self, busy: Callable[[], bool]) -> None:
        self._busy = busy

    async def math(self, fn: Callable[..., T], *args: Any) -> T:
        job = self._pool.submit(self._after_deferred(fn), *args)
        self._last_job = job
        return await asyncio.wrap_future(job)

    async def _may_hold_loop(self) -> bool:
        """Whether the next step may run on the event loop's thread (see the class)."""
        if self._busy is None or self._last_step_s >= self.inline_below_s:
            return False
        await asyncio.sleep(0)  # a task made ready before this step starts its request
        thread_idle = self._last_job is None or self._last_job.done()
        return not self._busy() and sole_node() and thread_idle

    def defer(self, fn: Callable[..., object], *args: Any) -> None:
        """Deferred work rides on the next job's hand-off to the compute thread: adopting
        the model a step's exchange pulled no longer costs a hand-off of its own (two
        thread hops, about a tenth of the exchange on a small model). A step's real time
        then includes the adoption that ran first on the thread."""
        self._deferred.append(functools.partial(fn, *args))

    def _after_deferred(self, fn: Callable[..., T]) -> Callable[..., T]:
        """`fn`, preceded by the deferred work, taken now (on the event loop); a
        StopIteration it raises becomes a RuntimeError saying the batches ran out (asyncio
        cannot pass one on: a step in the thread would never end)."""
        first, self._deferred = self._deferred, []

        def job(*args: Any) -> T:
            try:
                for work in first:
                    work()
                return fn(*args)
            except StopIteration:
                raise RuntimeError(OUT_OF_BATCHES) from None

        return job

    async def step(self, fn: Callable[..., Any], *args: Any, batch: int = 0) -> Charged:
        began = now()
        if await self._may_hold_loop():
            result = self._after_deferred(fn)(*args)
        else:
            result = await self.math(fn, *args)
        real = now() - began
        self._last_step_s = real
        t = self.run_time.elapsed()
        if self.cost is None:
            pad = self.profile.padding(t, real)
        else:
            pad = step_seconds(self.profile, t, self.cost, batch) - real
            if pad < 0:
                self.overruns += 1
                pad = 0.0
        if pad > 0:
            await asyncio.sleep(pad)
        factor = (real + pad) / real if real > 0 else self.profile.factor_at(t)
        return Charged(result, real + pad, factor)

    def close(self) -> None:
        """Run what is still deferred, then stop the compute thread."""
        if self._deferred:
            self._pool.submit(self._after_deferred(lambda: None))
        self._pool.shutdown(wait=True)


class ThreadedServerSeam:
    """Real mode: small models' math inline, large ones' in a thread; evaluation in its own
    thread."""

    def __init__(self, numel: int) -> None:
        self.inline = numel <= INLINE_NUMEL
        self._eval_pool = ThreadPoolExecutor(1, thread_name_prefix="asyncsync-eval")

    async def math(self, fn: Callable[..., T], *args: Any) -> T:
        if self.inline:
            return fn(*args)
        return await asyncio.to_thread(fn, *args)

    async def evaluate(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._eval_pool, fn, *args)

    async def blocking(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.to_thread(fn, *args)

    def close(self) -> None:
        self._eval_pool.shutdown(wait=True)


class VirtualWorkerSeam:
    """Virtual mode: real math inline; a step of `batch` samples is charged
    `step_seconds` (its `StepCost` padded by the profile), in virtual seconds."""

    def __init__(self, profile: ComputeProfile, cost: StepCost) -> None:
        self.profile = profile
        self.cost = cost
        self.run_time = Stopwatch()
        self.overruns = 0

    def start(self) -> None:
        self.run_time.start()

    async def math(self, fn: Callable[..., T], *args: Any) -> T:
        return fn(*args)

    def defer(self, fn: Callable[..., object], *args: Any) -> None:
        """Inline math costs no hand-off: done at once."""
        fn(*args)

    def watch(self, busy: Callable[[], bool]) -> None:
        """Steps take no real time on the loop: nothing to watch."""

    async def step(self, fn: Callable[..., Any], *args: Any, batch: int = 0) -> Charged:
        result = fn(*args)
        seconds = step_seconds(self.profile, self.run_time.elapsed(), self.cost, batch)
        await sleep(seconds)
        return Charged(result, seconds, seconds / self.cost.base_s(batch))

    def close(self) -> None:
        """Nothing to release."""


class InlineServerSeam:
    """Virtual mode: the server's vector math and evaluation run inline, in no virtual time
    (the server's aggregation time is not modelled)."""

    async def math(self, fn: Callable[..., T], *args: Any) -> T:
        return fn(*args)

    async def evaluate(self, fn: Callable[..., T], *args: Any) -> T:
        return fn(*args)

    async def blocking(self, fn: Callable[..., T], *args: Any) -> T:
        return fn(*args)

    def close(self) -> None:
        """Nothing to release."""
