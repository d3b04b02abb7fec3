"""The one schema of a run's JSONL logs, shared by every writer and reader.

A record is a flat JSON object whose `KEY` names its kind (`Kind`). The server writes
``events.jsonl`` and each worker ``worker-<rank>.jsonl`` (in a virtual run of many
workers, all of them write one `WORKERS_LOG`, with a `RANK` field); all use the same key.
A time a request was held at the server is ``held_s`` everywhere: in a request's record, in a
worker's totals (``final``) and in the reply that reports it.

Logs written before this schema name the kind ``ev`` in workers' logs and the held time
``wait`` (a request's record) or ``wait_s`` (the totals); `upgrade` renames them, so
readers handle old and new logs alike.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

KEY = "event"
"""The field that names a record's kind."""

WORKERS_LOG = "workers.jsonl"
"""The one file of every worker's records in a run of many workers (instead of one
``worker-<rank>.jsonl`` each); each record there carries its worker's `RANK` first."""

RANK = "rank"
"""The field naming a record's worker in `WORKERS_LOG`."""

HELD = "held_s"
"""Seconds a request was held at the server (a barrier, a staleness bound)."""


class Kind(StrEnum):
    """The kinds of records (their `KEY`'s values)."""

    # the server's events.jsonl
    START = "start"
    RESUME = "resume"
    JOIN = "join"
    REJOIN = "rejoin"
    WORKER_LOST = "worker_lost"
    NONFINITE_PUSH = "nonfinite_push"
    EVAL = "eval"
    CHECKPOINT = "checkpoint"
    CHECKPOINT_FAILED = "checkpoint_failed"
    STOP = "stop"
    LEAVE_TIMEOUT = "leave_timeout"
    # a worker's worker-<rank>.jsonl: spans of computing and requests (named by their
    # operation: JOIN, PUSH, PULL, QUERY, EXCHANGE, LEAVE), re-syncs, availability, totals
    COMPUTE = "compute"
    PUSH = "push"
    PULL = "pull"
    QUERY = "query"
    EXCHANGE = "exchange"
    LEAVE = "leave"
    REFUSED = "refused"
    OFFLINE = "offline"  # the availability trace took the worker offline (until: when back)
    ONLINE = "online"
    FINAL = "final"


TRANSFERS = frozenset({Kind.PUSH, Kind.PULL, Kind.QUERY, Kind.EXCHANGE})
"""The kinds of a worker's records that move a model or a message during the run."""

RENAMED = {"ev": KEY, "wait": HELD, "wait_s": HELD}
"""Old field names and the names they have now."""


def record(kind: Kind | str, **fields: Any) -> dict[str, Any]:
    """A record of `kind` with `fields` (the kind first)."""
    return {KEY: str(kind), **fields}


def upgrade(old: Any) -> dict[str, Any]:
    """`old` (a parsed line) with its old field names (`RENAMED`) replaced; a current record
    is returned as it is.

    Raises:
        ValueError: `old` is not a JSON object, so no record.
    """
    if not isinstance(old, dict):
        raise ValueError(f"a JSON {type(old).__name__}, not an object (a record)")
    current: dict[str, Any] = old  # a JSON object's keys are strings
    if not RENAMED.keys() & current.keys():
        return current
    return {RENAMED.get(name, name): value for name, value in current.items()}
