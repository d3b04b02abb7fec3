"""The protocol SDK (base.py, messages.py, ports.py, rounds.py, overlap.py, server_optim.py,
staleness.py) and one module per protocol.

Protocol modules are imported, and so registered, on the first `get_protocol` or
`discover()`; `PROTOCOLS` is the registry they fill.
"""

from asyncsync.protocols.base import (
    PROTOCOLS,
    Protocol,
    ServerRule,
    WorkerLoop,
    discover,
    get_protocol,
)

__all__ = ["PROTOCOLS", "Protocol", "ServerRule", "WorkerLoop", "discover", "get_protocol"]
