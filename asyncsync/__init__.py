"""asyncsync: synchronization protocols for data-parallel training under heterogeneity.

A parameter server and N workers, each an asyncio event loop, exchange msgpack-framed
tensors over HTTP (aiohttp) and train PyTorch models; computation runs in a thread so
transfers overlap it. See README.md for the quick start and the embedding example.
"""

from asyncsync.engine.core import ServerCore, build_core
from asyncsync.engine.settings import ServerSettings
from asyncsync.engine.worker import Worker, WorkerContext
from asyncsync.protocols import PROTOCOLS, Protocol, ServerRule, WorkerLoop, get_protocol
from asyncsync.protocols.base import RunStopped
from asyncsync.recipe import Recipe, RunSpec, load_recipe
from asyncsync.runner import run_recipe
from asyncsync.transport.http_server import ParameterServer
from asyncsync.transport.local import LocalTransport

__all__ = [
    "PROTOCOLS",
    "LocalTransport",
    "ParameterServer",
    "Protocol",
    "Recipe",
    "RunSpec",
    "RunStopped",
    "ServerCore",
    "ServerRule",
    "ServerSettings",
    "Worker",
    "WorkerContext",
    "WorkerLoop",
    "build_core",
    "get_protocol",
    "load_recipe",
    "run_recipe",
]
