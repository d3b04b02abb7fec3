"""What a worker needs of a client transport, and how a server address becomes one.

A transport carries one request and its reply; the SDK's refusals come back as the same
exception classes (`OutOfStep`, `NotInRun`, ...), so the worker's rejoin rule does not
depend on the transport. Transports for URL schemes register a factory here (the HTTP
transport registers ``http``), so the engine never imports a transport.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, cast
from urllib.parse import urlsplit

import torch

from asyncsync.hetero.network import Link
from asyncsync.protocols.base import Refused


class RequestRejected(Refused):
    """A refusal the SDK has no class for (e.g. authentication), with the peer's status."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(f"{status}: {reason}")
        self.status = status


class Transport(Protocol):
    """Carries one request and its reply; counts the bytes it moved."""

    bytes_up: int
    bytes_down: int

    async def request(
        self, op: str, header: dict[str, Any], vector: torch.Tensor | None = None
    ) -> tuple[dict[str, Any], torch.Tensor | None]:
        """Send `header` (and `vector`) as operation `op`; return the reply."""
        ...

    def wire_bytes(self, vector: torch.Tensor | None) -> int:
        """The bytes this transport puts on the wire for `vector` (0 for none)."""
        ...

    async def close(self) -> None:
        """Release connections."""
        ...


TRANSPORT_MEMBERS = ("request", "wire_bytes", "close", "bytes_up", "bytes_down")
"""What a `Transport` has (`checked_transport` looks for each)."""


def checked_transport(transport: object) -> Transport:
    """`transport`, refused if it is not a `Transport`: a URL (the old way to give a
    server) is answered with the call to use instead, ``Worker.connect``.

    Raises:
        TypeError: `transport` is a string or lacks a transport's members.
    """
    if isinstance(transport, str | bytes):
        raise TypeError(f"Worker(rank, transport, ...) takes a transport, got the string "
                        f"{transport!r}: to reach a server by its URL use "
                        "Worker.connect(rank, url, model, batches, protocol, ...)")
    missing = [name for name in TRANSPORT_MEMBERS if not hasattr(transport, name)]
    if missing:
        raise TypeError(f"Worker(rank, transport, ...) takes a transport (a LocalTransport, "
                        f"or Worker.connect(rank, url, ...) for a server's URL); got a "
                        f"{type(transport).__name__}, which lacks {', '.join(missing)}")
    return cast(Transport, transport)


CHANNELS = ("stream", "http")
"""How a worker's requests travel to a server over HTTP: as frames on an upgraded
connection (``stream``, the default: measured faster than a POST each from 4 kB to 47 MB,
docs/benchmarks.md), or as one POST each (``http``)."""


@dataclass(frozen=True)
class Dial:
    """How a worker connects: the model's length (bounds replies), its emulated link, the
    local address to connect from, the bearer token, the TLS context that verifies an
    https server (None: the system's trust store), and the channel (`CHANNELS`)."""

    numel: int
    link: Link | None = None
    local_addr: str | None = None
    token: str | None = None
    tls: ssl.SSLContext | None = None
    channel: str = "stream"


TransportFactory = Callable[[str, Dial], Transport]
SCHEMES: dict[str, TransportFactory] = {}


def register_scheme(scheme: str, factory: TransportFactory) -> None:
    """Make URLs of `scheme` connect through `factory`."""
    SCHEMES[scheme] = factory


def connect(url: str, dial: Dial) -> Transport:
    """A transport to the server at `url`."""
    scheme = urlsplit(url).scheme
    if scheme not in SCHEMES:
        known = ", ".join(sorted(SCHEMES)) or "none (import asyncsync.transport)"
        raise ValueError(f"no transport for {url!r}: known schemes are {known}")
    return SCHEMES[scheme](url, dial)
