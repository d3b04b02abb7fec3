"""asyncsync: synchronization protocols for data-parallel training under heterogeneity.

A parameter server and N workers, each an asyncio event loop, exchange msgpack-framed
tensors over HTTP (aiohttp) and train PyTorch models; computation runs in a thread so
transfers overlap it. See docs/getting-started.md and docs/embedding.md.

The names below are imported when first used, so ``import asyncsync.protocols.base`` (a
protocol module) does not load the transports, the runner or the dashboard.
`PROTOCOLS` is the registry with every protocol module of the package imported.
``asyncsync.Worker`` comes with the HTTP transport registered, so `Worker.connect` dials an
``http(s)://`` URL in a program that serves nothing itself.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from asyncsync import _moved

if TYPE_CHECKING:
    from asyncsync.engine.core import ServerCore, build_core
    from asyncsync.engine.settings import ServerSettings
    from asyncsync.engine.worker import Worker, WorkerContext
    from asyncsync.protocols.base import (
        PROTOCOLS,
        Protocol,
        RunStopped,
        ServerRule,
        WorkerLoop,
        get_protocol,
    )
    from asyncsync.study.recipe import Recipe, load_recipe
    from asyncsync.study.runner import run_recipe
    from asyncsync.study.specs import RunSpec
    from asyncsync.transport.connection_gate import ConnectionLimits
    from asyncsync.transport.http_server import ParameterServer
    from asyncsync.transport.local import LocalTransport

_EXPORTS = {
    "ConnectionLimits": "asyncsync.transport.connection_gate",
    "LocalTransport": "asyncsync.transport.local",
    "ParameterServer": "asyncsync.transport.http_server",
    "Protocol": "asyncsync.protocols.base",
    "Recipe": "asyncsync.study.recipe",
    "RunSpec": "asyncsync.study.specs",
    "RunStopped": "asyncsync.protocols.base",
    "ServerCore": "asyncsync.engine.core",
    "ServerRule": "asyncsync.protocols.base",
    "ServerSettings": "asyncsync.engine.settings",
    "Worker": "asyncsync.engine.worker",
    "WorkerContext": "asyncsync.engine.worker",
    "WorkerLoop": "asyncsync.protocols.base",
    "build_core": "asyncsync.engine.core",
    "get_protocol": "asyncsync.protocols.base",
    "load_recipe": "asyncsync.study.recipe",
    "run_recipe": "asyncsync.study.runner",
}

__all__ = [
    "PROTOCOLS",
    "ConnectionLimits",
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

_moved.install()


def __getattr__(name: str) -> Any:
    """Import an exported name on first use; `PROTOCOLS` with every protocol registered."""
    if name == "PROTOCOLS":
        return importlib.import_module("asyncsync.protocols.base").discover()
    if name == "Worker":  # (registers the http and https schemes for Worker.connect)
        importlib.import_module("asyncsync.transport")
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'asyncsync' has no attribute {name!r}")
