"""Protocol registry: importing this package imports (and so registers) every module in it.

Adding a protocol means adding one module here that calls `register`.
"""

import importlib
import pkgutil

from asyncsync.protocols.base import PROTOCOLS, Protocol, ServerRule, WorkerLoop, get_protocol

for _module in pkgutil.iter_modules(__path__):
    if _module.name != "base":
        importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["PROTOCOLS", "Protocol", "ServerRule", "WorkerLoop", "get_protocol"]
