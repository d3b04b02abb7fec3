"""The protocol interface: a `ServerRule` and a `WorkerLoop`, registered under a name.

A protocol is two halves in one module:

- `ServerRule` decides what the server does with each push and when a pull may be
  answered (barriers, staleness bounds, groups). It mutates the global model only
  through the `ParameterStore` it is given, which replaces the vector on each commit
  (never in place), so a rejected or half-read request can never change it. Membership
  can change during a run (a worker crashes and is dropped after a timeout, or rejoins):
  barriers count ``store.live``, and `on_leave` / `on_join` adjust rounds in flight.
- `WorkerLoop` is one coroutine deciding how local computation and communication
  interleave. It talks to the server only through its `WorkerContext`, which raises
  `RunStopped` when the run ends.

Adding a protocol means adding one module that calls `register` with a `Protocol`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from asyncsync.wire import WireError

if TYPE_CHECKING:
    from asyncsync.server import ParameterStore
    from asyncsync.worker import WorkerContext


@dataclass
class Push:
    """A validated push: `vector` is a gradient, a delta or a model, per `kind`."""

    worker: int
    base_version: int
    kind: str
    vector: torch.Tensor
    steps: int
    samples: int
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class Pull:
    """A validated pull request."""

    worker: int
    base_version: int
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class Reply:
    """What the server answers: protocol `meta`, and a vector with its version for pulls."""

    meta: dict[str, Any] = field(default_factory=dict)
    vector: torch.Tensor | None = None
    version: int | None = None


@dataclass(frozen=True)
class NoParams:
    """For protocols without parameters."""


class ServerRule(ABC):
    """The server half of a protocol.

    Attributes:
        push_kinds: the push kinds this rule accepts (others get a 400).
    """

    push_kinds: ClassVar[frozenset[str]]

    def __init__(self, params: Any, store: ParameterStore) -> None:
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
        (e.g. streaming DiLoCo) override this using the request's `meta`; the HTTP layer
        still bounds every body by the model size.
        """
        return self.store.w.numel() if op == "push" else None

    def eval_vector(self) -> torch.Tensor:
        """The model the server evaluates; the global vector by default."""
        return self.store.w

    async def on_query(self, worker: int, meta: dict[str, Any]) -> dict[str, Any]:
        """Protocol-specific control messages; none by default."""
        raise WireError(400, "this protocol takes no queries")

    async def on_leave(self, worker: int) -> None:  # noqa: B027 (optional hook)
        """A worker left the run or was lost (``store.live`` no longer holds it).

        Rules with barriers stop counting it here and complete a round that now has
        every live member's contribution. Not called once the run is stopping, and shielded
        from cancellation by the core.
        """

    async def on_join(self, worker: int) -> None:  # noqa: B027 (optional hook)
        """A worker (re)joined a running run (``store.live`` holds it again); it starts
        from the current global model and version."""

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Rule state worth a checkpoint (e.g. an outer optimizer's momentum)."""
        return {}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:  # noqa: B027
        """Restore what `state_dict` returned."""


class WorkerLoop(ABC):
    """The worker half of a protocol: one coroutine that runs until `RunStopped`."""

    def __init__(self, params: Any) -> None:
        self.params = params

    @abstractmethod
    async def run(self, ctx: WorkerContext) -> None:
        """Interleave local computation and communication through `ctx`."""


@dataclass(frozen=True)
class Protocol:
    """A named protocol: its parameter dataclass and its two halves."""

    name: str
    summary: str
    params: type[Any]
    server: type[ServerRule]
    worker: type[WorkerLoop]


PROTOCOLS: dict[str, Protocol] = {}


def register(protocol: Protocol) -> Protocol:
    """Add a protocol to the registry (names are unique)."""
    if protocol.name in PROTOCOLS:
        raise ValueError(f"protocol {protocol.name!r} is already registered")
    PROTOCOLS[protocol.name] = protocol
    return protocol


def get_protocol(name: str) -> Protocol:
    """Look a protocol up by name, with the known names in the error."""
    try:
        return PROTOCOLS[name]
    except KeyError:
        known = ", ".join(sorted(PROTOCOLS))
        raise ValueError(f"unknown protocol {name!r}; known: {known}") from None
