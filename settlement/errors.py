"""Errors an operator acts on, and how the CLI words them. Bottom of the stack: imports
nothing of ours, so any layer may raise these."""

from __future__ import annotations


class SettlementError(RuntimeError):
    """An expected failure whose message already says what went wrong and what to do."""


class DatabaseError(SettlementError):
    """A database could not be reached or migrated; the message says which and why."""


class ServiceError(SettlementError):
    """A service could not be started or stopped; the message says what to do."""


def describe(exc: BaseException) -> str:
    if isinstance(exc, SettlementError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"
