"""The protocol SDK (base.py, messages.py, ports.py, rounds.py, overlap.py, server_optim.py,
staleness.py) and one module per protocol.

Protocol modules are imported, and so registered, on the first `get_protocol`, `discover()`
or read of `PROTOCOLS`, which is the registry with all of them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from asyncsync.protocols.base import Protocol, ServerRule, WorkerLoop, discover, get_protocol

if TYPE_CHECKING:
    from asyncsync.protocols.base import PROTOCOLS

__all__ = ["PROTOCOLS", "Protocol", "ServerRule", "WorkerLoop", "discover", "get_protocol"]


def __getattr__(name: str) -> Any:
    """`PROTOCOLS`, with every protocol module of the package imported."""
    if name == "PROTOCOLS":
        return discover()
    raise AttributeError(f"module 'asyncsync.protocols' has no attribute {name!r}")
