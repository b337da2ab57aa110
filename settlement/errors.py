"""Turning exceptions into one-line messages an operator can act on."""

from __future__ import annotations

from settlement.db import DatabaseError
from settlement.services.procs import ServiceError

_KNOWN = (ServiceError, DatabaseError)


def describe(exc: BaseException) -> str:
    if isinstance(exc, _KNOWN):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"
