"""Protocol registry: importing this package registers every built-in protocol."""

from asyncsync.protocols import asp, bsp
from asyncsync.protocols.base import PROTOCOLS, Protocol, ServerRule, WorkerLoop, get_protocol

__all__ = ["PROTOCOLS", "Protocol", "ServerRule", "WorkerLoop", "asp", "bsp", "get_protocol"]
