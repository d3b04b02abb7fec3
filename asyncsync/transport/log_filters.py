"""Log filters of the server's connection layer: rate-limited lines, and one line instead
of a traceback for a peer's malformed request."""

from __future__ import annotations

import logging

from aiohttp.http_exceptions import HttpProcessingError

from asyncsync.clock import now


class RepeatFilter(logging.Filter):
    """Lets each kind of log line through at most once per `interval_s`, counting the rest.

    A kind is the line's format string and level (aiohttp's and ours are fixed strings),
    so the same refusal of many peers is one kind. The next line of a kind that passes
    says how many were held back since the last.
    """

    def __init__(self, interval_s: float = 1.0) -> None:
        super().__init__()
        self.interval_s = interval_s
        self._kinds: dict[tuple[str, int], tuple[float, int]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        kind = (str(record.msg)[:200], record.levelno)
        t = now()
        last, held = self._kinds.get(kind, (-self.interval_s, 0))
        if t - last < self.interval_s:
            self._kinds[kind] = (last, held + 1)
            return False
        self._kinds[kind] = (t, 0)
        if held:
            record.msg = f"{record.getMessage()} ({held} more like this held back)"
            record.args = None
        return True


class PeerErrorFilter(logging.Filter):
    """Logs a request that aiohttp could not parse (the peer's error, not the server's) as
    one line with the reason, instead of a traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, HttpProcessingError):
            record.msg = f"{record.getMessage()}: {' '.join(str(error).split())[:200]}"
            record.args = None
            record.exc_info = None
        return True



ACCEPT_FAILURE = "socket.accept() out of system resource"
"""How asyncio's log line for a failed accept (e.g. no descriptor left) begins."""


class AcceptFailureFilter(RepeatFilter):
    """Turns asyncio's failed-accept line (a socket's address and a traceback) into one
    line with the error, rate-limited as one kind (`RepeatFilter`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith(ACCEPT_FAILURE):
            return True
        error = record.exc_info[1] if record.exc_info else None
        record.msg = f"{ACCEPT_FAILURE}: %s (accepting pauses for 1 s)"
        record.args = (error,)
        record.exc_info = None
        return super().filter(record)
