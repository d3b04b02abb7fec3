"""HTTP statuses of the SDK's refusals, both ways (the only place they are numbered)."""

from __future__ import annotations

from asyncsync.engine.channel import RequestRejected
from asyncsync.engine.core import UnknownOperation
from asyncsync.protocols.base import (
    BadRequest,
    Forbidden,
    NotInRun,
    OutOfStep,
    Refused,
    Unacceptable,
)

STATUSES: list[tuple[type[Refused], int]] = [
    (UnknownOperation, 404), (BadRequest, 400), (Forbidden, 403), (OutOfStep, 409),
    (NotInRun, 410), (Unacceptable, 422),
]
"""Most specific class first."""


def status_of(refusal: Refused) -> int:
    """The status a refusal is answered with."""
    if isinstance(refusal, RequestRejected):
        return refusal.status
    return next((status for kind, status in STATUSES if isinstance(refusal, kind)), 400)


def refusal_from(status: int, reason: str) -> Refused:
    """The refusal a client raises for a 4xx answer: the SDK's class where one fits."""
    for kind, code in STATUSES:
        if code == status and kind is not UnknownOperation:
            return kind(reason)
    return RequestRejected(status, reason)
