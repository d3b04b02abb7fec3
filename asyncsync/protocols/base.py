"""The protocol SDK: messages, refusals, the two halves of a protocol, and the registry.

A protocol is two halves in one module, written against this file and `ports.py` alone:

- `ServerRule` decides what the server does with each push and when a pull may be
  answered (barriers, staleness bounds, groups). It changes the global model only through
  its `Store` port, which replaces the vector on each commit (never in place), so a refused
  or half-read request can never change it. Membership changes during a run (a worker is
  lost and dropped, or rejoins): barriers count ``store.live``, and `on_leave` / `on_join`
  adjust rounds in flight. A push based on a version older than the one its worker last
  (re)joined at is refused by the engine before any rule sees it.
- `WorkerLoop` is one coroutine deciding how local computation and communication
  interleave, through its `Context` port; a request raises `RunStopped` once the run ends.

Refusals are exceptions (`BadRequest`, `OutOfStep`, ...), never status numbers: the
transport maps them to its own codes. A worker whose request was refused as `OutOfStep` or
`NotInRun` rejoins and restarts its loop; as `Unacceptable`, re-syncs the same way without
limit; as `BadRequest`, ends with it.

Ownership of vectors: a `Push.vector` belongs to the rule once `on_push` has it, and
vectors a worker gets from `pull` belong to the loop; either may keep them as long as it
likes (in a round, a buffer, as an anchor) and write into them. The engine receives into
a pool of warm memory (`asyncsync.training.buffers`) and reuses a vector's memory only once no
tensor refers to it any more, so keeping a reference is all it takes to keep a vector, and
dropping the last one gives it back. A rule must not write into ``store.w`` (it may still
be streaming to a reader); it makes new tensors.

Rule state (`ServerRule.state_dict`) follows the same rule: its tensors are replaced,
never written in place, so a snapshot of the mapping is a copy of the state. A refused
update changes none of it, whatever the rule does before the refusal: the engine takes a
snapshot whenever a rule takes ``store.lock`` and puts it back (`load_state_dict`) when a
`Refused` leaves the lock, and a round whose result is refused is undone the same way
(`unchanged_if_refused`).

Beside this file and `ports.py`, the SDK offers `rounds.py` (the round barrier),
`overlap.py` (background exchanges), `server_optim.py` (server optimizers for aggregated
deltas: FedOpt's seam) and `staleness.py` (staleness functions of asynchronous
aggregation). Adding a protocol means adding one module under `asyncsync/protocols/` that
calls `register`; `get_protocol` discovers the modules on first use.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import pkgutil
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, ClassVar, Generic

import torch
from typing_extensions import TypeVar

from asyncsync.errors import InputError
from asyncsync.protocols.deadlines import CUTOFF_OPTIONS
from asyncsync.protocols.messages import (
    BadRequest,
    Forbidden,
    NoParams,
    NotInRun,
    OutOfStep,
    Params,
    Pull,
    Push,
    Refused,
    Reply,
    RunStopped,
    Unacceptable,
    brief,
    require,
    require_count,
)
from asyncsync.protocols.ports import Context, StepResult, Store
from asyncsync.schema import check_fields, from_mapping, option
from asyncsync.training.optim import FlatSGD

__all__ = [
    "HISTORY", "BadRequest", "CheckpointError", "Context", "FlatSGD",
    "Forbidden", "NoParams", "NotInRun", "OutOfStep", "P", "Params", "Protocol", "Pull",
    "Push", "Refused", "Reply", "RunStopped", "ServerRule", "StepResult", "Store",
    "Unacceptable", "WorkerLoop", "all_finite", "brief", "check_fields", "get_protocol",
    "no_round_policies", "option", "register", "require", "require_count",
    "unchanged_if_refused", "wide_history",
]

HISTORY = 256
"""How many recent records (commits, rounds, pushes) a store or rule keeps for inspection;
older ones are only counted, so memory does not grow with the length of a run."""
HISTORY_ENTRIES = 1 << 20
"""How many per-worker entries the records that name every worker (a barrier round's
commit and steps) may hold in all: 256 rounds of 100,000 workers would be 2.5 GB."""


def wide_history(workers: int) -> int:
    """How many records naming every one of `workers` to keep: `HISTORY`, or fewer (at
    least 8) when they would hold more than `HISTORY_ENTRIES` entries."""
    return max(8, min(HISTORY, HISTORY_ENTRIES // max(workers, 1)))


class CheckpointError(InputError, ValueError):
    """A checkpoint is missing, unreadable, belongs to another run or model, or holds
    state that does not fit (what `ServerRule.load_state_dict` raises)."""


def all_finite(vector: torch.Tensor, chunk: int = 1 << 20) -> bool:
    """No NaN or Inf in `vector`, a slice at a time.

    A slice whose sum is finite holds no NaN or Inf (either would make the sum NaN or
    infinite), so one reduction per slice decides almost always, without a mask; only a
    slice whose sum is not finite (a NaN or Inf, or finite values whose sum overflows) is
    checked element by element. About 15 times faster than ``isfinite().all()``.
    """
    flat = vector.reshape(-1)
    for i in range(0, flat.numel(), chunk):
        part = flat[i : i + chunk]
        if not math.isfinite(float(part.sum())) and not bool(torch.isfinite(part).all()):
            return False
    return True


P = TypeVar("P", default=Any)
"""A protocol's parameter class: ``class MyServer(ServerRule[MyParams])`` types
``self.params``, so a misspelt parameter fails the type check."""


class ServerRule(ABC, Generic[P]):
    """The server half of a protocol, generic in its parameter class.

    Attributes:
        push_kinds: the push kinds this rule accepts (others are a `BadRequest`).
        params: the protocol's validated parameters; store: the `Store` port.
    """

    push_kinds: ClassVar[frozenset[str]]

    def __init__(self, params: P, store: Store) -> None:
        self.params = params
        self.store = store

    @abstractmethod
    async def on_push(self, push: Push) -> dict[str, Any]:
        """Take a push (already validated); return the reply's meta."""

    async def on_pull(self, pull: Pull) -> Reply:
        """Answer a pull; the default answers at once with the current model."""
        return self.store.current()

    def tensor_numel(self, op: str, meta: dict[str, Any]) -> int | None:
        """How many elements the tensor of a request must have (None: no tensor allowed).

        The default: a push carries one model-sized vector. Rules exchanging fragments
        (e.g. streaming DiLoCo) override this using the request's `meta`.
        """
        return self.store.numel if op == "push" else None

    def eval_vector(self) -> torch.Tensor:
        """The model the server evaluates; the global vector by default."""
        return self.store.w

    async def on_query(self, worker: int, meta: dict[str, Any]) -> dict[str, Any]:
        """Protocol-specific control messages; none by default."""
        raise BadRequest("this protocol takes no queries")

    async def on_leave(self, worker: int) -> None:
        """A worker left the run or was lost (``store.live`` no longer holds it).

        Rules with barriers stop counting it here and complete a round that now has every
        live member's contribution. Not called once the run is stopping; never cancelled
        half-way.
        """

    async def on_join(self, worker: int) -> None:
        """A worker (re)joined a running run (``store.live`` holds it again); it starts
        from the current global model and version."""

    def dropped(self) -> int:
        """Reports taken and dropped so far (e.g. late for a round that closed without
        them); none by default."""
        return 0

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Rule state worth a checkpoint (e.g. an outer optimizer's momentum): the rule's
        own tensors, which it replaces and never writes in place."""
        return {}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Restore what `state_dict` returned, after the store holds the resumed model;
        raises `CheckpointError` naming the entry when `state` does not fit this rule."""


@contextmanager
def unchanged_if_refused(rule: ServerRule) -> Iterator[None]:
    """Run a block that may change `rule`'s state; when it raises a `Refused`, put back
    the state (`ServerRule.state_dict`) it started from, so the refusal changes nothing."""
    saved = rule.state_dict()
    try:
        yield
    except Refused:
        now = rule.state_dict()
        if now.keys() != saved.keys() or any(now[k] is not v for k, v in saved.items()):
            rule.load_state_dict(saved)
        raise


class WorkerLoop(ABC, Generic[P]):
    """The worker half of a protocol, generic in its parameter class: one coroutine that
    runs until `RunStopped`."""

    def __init__(self, params: P) -> None:
        self.params = params

    @abstractmethod
    async def run(self, ctx: Context) -> None:
        """Interleave local computation and communication through `ctx`."""


def no_round_policies(protocol: str, why: str) -> Mapping[str, str]:
    """A parameter class's ``NOT_OFFERED`` for a protocol that takes no round policies.

    A parameter dataclass may map keys it does not take to the reason in a class attribute
    ``NOT_OFFERED``; a recipe or ``protocol_params`` setting one is refused with that reason
    (``deadline_s: not offered by asp (it has no rounds: ...)``) instead of as an unknown
    key. This one maps every round policy (`deadlines.CUTOFF_OPTIONS`, the fields of
    `deadlines.Cutoff`) to `why`, e.g. ``NOT_OFFERED = no_round_policies("asp", "it has
    no rounds: each gradient is applied on arrival")``.
    """
    reason = (f"not offered by {protocol} ({why}); the round policies are taken by the "
              "protocols whose rounds close at the SDK's round barrier")
    return MappingProxyType(dict.fromkeys(sorted(CUTOFF_OPTIONS), reason))


def options(params: type[Any]) -> list[str]:
    """The option names of parameter dataclass `params` (its fields set when it is made)."""
    return [item.name for item in dataclasses.fields(params) if item.init]


def carries_options(given: Any, params: type[Any]) -> bool:
    """Whether `given` is a dataclass instance with every option of `params`."""
    return (dataclasses.is_dataclass(given) and not isinstance(given, type)
            and dataclasses.is_dataclass(params)
            and all(hasattr(given, name) for name in options(params)))


@dataclass(frozen=True)
class Protocol:
    """A named protocol: its parameter dataclass and its two halves.

    Attributes:
        resizes_batches: the server assigns batch sizes (the worker then needs a callable
            batch source, not a fixed-size iterable).
    """

    name: str
    summary: str
    params: type[Any]
    server: type[ServerRule[Any]]
    worker: type[WorkerLoop[Any]]
    resizes_batches: bool = False

    def __post_init__(self) -> None:
        """Refuse misplaced parts by name (else they fail at the first request)."""
        if not isinstance(self.name, str) or not self.name:
            raise TypeError(f"Protocol: name must be a non-empty str, got {self.name!r}")
        if not isinstance(self.params, type):
            raise TypeError(f"Protocol {self.name!r}: params must be a class (the parameter "
                            f"dataclass), got {self.params!r}")
        for part, base in (("server", ServerRule), ("worker", WorkerLoop)):
            given = getattr(self, part)
            if not (isinstance(given, type) and issubclass(given, base)):
                raise TypeError(f"Protocol {self.name!r}: {part} must be a {base.__name__} "
                                f"subclass, got {given!r}")
        kinds = getattr(self.server, "push_kinds", None)
        if not (isinstance(kinds, frozenset) and all(isinstance(k, str) for k in kinds)):
            raise TypeError(f"Protocol {self.name!r}: {self.server.__name__}.push_kinds must "
                            f"be a frozenset of the push kinds it accepts, got {kinds!r}")

    def make_params(self, given: Any = None, workers: int | None = None) -> Any:
        """The parameters a run of this protocol uses: its defaults for None, `given` when
        it is an instance of `params`, or `params` built from a mapping of option names or
        from another dataclass that has every option (a base class of `params`, say);
        with `workers`, judged against the run's size (the parameters' `check_workers`,
        if they have one). A `ValueError` names a bad key, or both classes when `given` is
        another protocol's parameters."""
        if given is None:
            params = self.params()
        elif isinstance(given, self.params):
            params = given
        elif isinstance(given, Mapping):
            params = from_mapping(self.params, given, "protocol_params")
        elif carries_options(given, self.params):  # e.g. a base class's instance
            params = self.params(**{name: getattr(given, name) for name in options(self.params)})
        else:
            raise ValueError(f"protocol_params: protocol {self.name!r} takes a "
                             f"{self.params.__name__} (or a dict of its options), got "
                             f"{type(given).__name__}")
        check = getattr(params, "check_workers", None)
        if workers is not None and callable(check):
            check(workers)
        return params


PROTOCOLS: dict[str, Protocol] = {}
SDK_MODULES = frozenset({"base", "messages", "ports", "rounds", "overlap", "server_optim",
                         "staleness"})


def register(protocol: Protocol) -> Protocol:
    """Add a protocol to the registry (names are unique)."""
    if protocol.name in PROTOCOLS:
        raise ValueError(f"protocol {protocol.name!r} is already registered")
    PROTOCOLS[protocol.name] = protocol
    return protocol


def discover() -> dict[str, Protocol]:
    """Import every protocol module of this package (each registers itself); the registry."""
    package = importlib.import_module("asyncsync.protocols")
    for module in pkgutil.iter_modules(package.__path__):
        if module.name not in SDK_MODULES:
            importlib.import_module(f"asyncsync.protocols.{module.name}")
    return PROTOCOLS


def get_protocol(name: str) -> Protocol:
    """Look a protocol up by name, with the known names in the error (the package's
    modules are scanned only for a name not yet registered: a run asks once per worker).

    A name ``module:attribute`` (say ``k_of_n:KOFN``) imports `module` (from the working
    directory, then the installed packages, as ``module:callable`` models are) and returns
    its `Protocol` `attribute`: a protocol outside this package, usable in a recipe.
    """
    if ":" in name:
        return _imported(name)
    try:
        return PROTOCOLS[name] if name in PROTOCOLS else discover()[name]
    except KeyError:
        known = ", ".join(sorted(PROTOCOLS))
        raise ValueError(f"unknown protocol {name!r}; known: {known}, or "
                         "'module:PROTOCOL' for a Protocol defined in your own module") from None


def _imported(name: str) -> Protocol:
    """The `Protocol` that ``module:attribute`` names (a module is imported once)."""
    module_name, _, attr = name.partition(":")
    try:
        found = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"protocol {name!r} cannot be imported ({exc}); a module is looked "
                         "up in the working directory, then in the installed packages") from None
    if not isinstance(found, Protocol):
        raise ValueError(f"protocol {name!r} is a {type(found).__name__}, not a Protocol")
    return found
