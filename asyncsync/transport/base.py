"""The client-side transport interface and its error type."""

from __future__ import annotations

from typing import Any, Protocol

import torch


class RequestRejected(Exception):
    """The server answered 4xx: the message was refused and changed nothing."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(f"{status}: {reason}")
        self.status = status
        self.reason = reason


class Transport(Protocol):
    """Carries one request and its reply; counts the bytes it moved."""

    bytes_up: int
    bytes_down: int

    async def request(
        self, op: str, header: dict[str, Any], vector: torch.Tensor | None = None
    ) -> tuple[dict[str, Any], torch.Tensor | None]:
        """Send `header` (and `vector`) as operation `op`; return the reply."""
        ...

    async def close(self) -> None:
        """Release connections."""
        ...
