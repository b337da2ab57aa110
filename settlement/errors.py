"""Errors an operator acts on, and how the CLI words them. Bottom of the stack: imports
nothing of ours, so any layer may raise these."""

from __future__ import annotations

import re

# Secrets that can appear in a message: the password of a URL (postgresql://user:pw@host),
# a libpq keyword (password=pw) and librdkafka's sasl.password=pw.
_URL_PASSWORD = re.compile(r"(://[^:/@\s]+:)[^@\s]*@")
_KEY_PASSWORD = re.compile(r"((?:sasl\.)?password\s*[=:]\s*)('[^']*'|\"[^\"]*\"|[^\s,;'\"]+)",
                           re.IGNORECASE)

START_SERVICES = "run `make up` or `settle services up` (or point SETTLE_KAFKA_BOOTSTRAP and " \
                 "SETTLE_PG_DSN at running services)"


class SettlementError(RuntimeError):
    """An expected failure whose message already says what went wrong and what to do."""


class DatabaseError(SettlementError):
    """A database could not be reached or migrated; the message says which and why."""


class ServiceError(SettlementError):
    """A service could not be started or stopped; the message says what to do."""


def redact(text: str) -> str:
    """``text`` with every password it carries replaced by ``***``."""
    return _KEY_PASSWORD.sub(r"\1***", _URL_PASSWORD.sub(r"\1***@", text))


def describe(exc: BaseException) -> str:
    """How the CLI words an error: passwords redacted, and a service that is not running
    named with the command that starts it rather than a client library's raw message."""
    if isinstance(exc, SettlementError):
        return redact(str(exc))
    text = f"{type(exc).__name__}: {exc}"
    down = _service_down(text)
    if down:
        return redact(f"{down} is not reachable ({str(exc).strip()[:300]}): {START_SERVICES}")
    return redact(text)


def _service_down(text: str) -> str | None:
    """Which service an error says is unreachable, judged from its message (the client
    libraries are imported lazily, so their exception types are not checked here)."""
    kafka = ("Broker transport failure", "_TRANSPORT", "_ALL_BROKERS_DOWN",
             "Failed to get metadata", "_TIMED_OUT")
    if text.startswith("KafkaException") and any(k in text for k in kafka):
        return "Kafka"
    if text.startswith("OperationalError") and ("connection failed" in text
                                                 or "Connection refused" in text):
        return "PostgreSQL"
    return None
