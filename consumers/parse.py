"""Turning raw Kafka messages into ledger rows, or into a dead letter with a reason.

Runs once per message on the ingest hot path, so checks are ordered cheapest first and the
output is a ready-made line of PostgreSQL COPY text.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

# Columns of the COPY into the staging table, in this order.
TRADE_COLUMNS = (
    "trade_id", "trade_date", "seq", "kafka_partition", "kafka_offset", "symbol", "price",
    "quantity", "buyer", "seller", "executed_at", "site",
)
_TEXT_FIELDS = ("trade_id", "symbol", "buyer", "seller")
_COPY_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})
_MAX_PRICE = Decimal("100000000000000")  # numeric(18, 4)


class Malformed(ValueError):
    """The message cannot be a trade; str(exc) is the dead-letter reason."""


@dataclass(frozen=True, slots=True)
class CloseMarker:
    trade_date: str
    partition: int
    last_seq: int


def _date(value: object, field: str) -> str:
    if not isinstance(value, str):
        raise Malformed(f"{field} must be a YYYY-MM-DD string, got {type(value).__name__}")
    try:
        dt.date.fromisoformat(value)
    except ValueError:
        raise Malformed(f"unknown {field} {value[:40]!r}: not a calendar date") from None
    if len(value) != 10:
        raise Malformed(f"{field} must be YYYY-MM-DD, got {value[:40]!r}")
    return value


def _int(value: object, field: str) -> int:
    # bool is an int subclass in Python, but `true` is not a sequence number.
    if type(value) is not int:
        raise Malformed(f"{field} must be an integer, got {type(value).__name__}")
    return value


def decode(raw: bytes | None, max_bytes: int) -> dict[str, object]:
    if raw is None:
        raise Malformed("empty message (null value)")
    if len(raw) > max_bytes:
        raise Malformed(f"oversized: {len(raw)} bytes > limit {max_bytes}")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise Malformed(f"invalid UTF-8 at byte {e.start}") from None
    try:
        obj = json.loads(text)
    except ValueError as e:
        raise Malformed(f"invalid JSON: {e}") from None
    if not isinstance(obj, dict):
        raise Malformed(f"expected a JSON object, got {type(obj).__name__}")
    return obj


def trade_copy_line(obj: dict[str, object], partition: int, offset: int, site: str) -> str:
    """Validate a trade and return its COPY text line (tab-separated, newline-terminated)."""
    try:
        trade_id = obj["trade_id"]
        trade_date = obj["trade_date"]
        seq = obj["seq"]
        symbol = obj["symbol"]
        price = obj["price"]
        quantity = obj["quantity"]
        buyer = obj["buyer"]
        seller = obj["seller"]
        executed_at = obj["executed_at"]
    except KeyError as e:
        raise Malformed(f"missing field {e.args[0]!r}") from None
    texts = (trade_id, symbol, buyer, seller)
    for name, v in zip(_TEXT_FIELDS, texts, strict=True):
        if not isinstance(v, str) or not v:
            raise Malformed(f"{name} must be a non-empty string")
    if buyer == seller:
        raise Malformed(f"buyer equals seller ({buyer!r})")
    _date(trade_date, "trade_date")
    if _int(seq, "seq") <= 0:
        raise Malformed(f"seq must be positive, got {seq}")
    if _int(quantity, "quantity") <= 0:
        raise Malformed(f"quantity must be positive, got {quantity}")
    if not isinstance(price, str):
        # A JSON number would have gone through binary floating point: refuse it.
        raise Malformed(f"price must be a decimal string, got {type(price).__name__}")
    try:
        p = Decimal(price)
    except InvalidOperation:
        raise Malformed(f"price is not a decimal: {price[:40]!r}") from None
    if not p.is_finite() or p <= 0 or p >= _MAX_PRICE:
        raise Malformed(f"price out of range: {price[:40]!r}")
    if p.as_tuple().exponent < -4:  # type: ignore[operator]
        raise Malformed(f"price has more than 4 decimal places: {price[:40]!r}")
    if not isinstance(executed_at, str):
        raise Malformed("executed_at must be an ISO-8601 string")
    try:
        ts = dt.datetime.fromisoformat(executed_at)
    except ValueError:
        raise Malformed(f"executed_at is not ISO-8601: {executed_at[:40]!r}") from None
    if ts.tzinfo is None:
        raise Malformed(f"executed_at has no time zone: {executed_at[:40]!r}")
    t_id, sym, b, s = (v.translate(_COPY_ESCAPES) for v in texts)  # type: ignore[union-attr]
    return (
        f"{t_id}\t{trade_date}\t{seq}\t{partition}\t{offset}\t{sym}\t{price}\t{quantity}\t"
        f"{b}\t{s}\t{executed_at}\t{site}\n"
    )


def close_marker(obj: dict[str, object], partition: int) -> CloseMarker:
    try:
        trade_date, part, last_seq = obj["trade_date"], obj["partition"], obj["last_seq"]
    except KeyError as e:
        raise Malformed(f"close marker: missing field {e.args[0]!r}") from None
    _date(trade_date, "trade_date")
    if _int(part, "partition") != partition:
        raise Malformed(f"close marker for partition {part} arrived on partition {partition}")
    if _int(last_seq, "last_seq") < 0:
        raise Malformed(f"close marker: negative last_seq {last_seq}")
    return CloseMarker(str(trade_date), partition, last_seq)


def message_type(headers: list[tuple[str, bytes]] | None) -> str:
    if headers:
        for k, v in headers:
            if k == "type":
                return v.decode("utf-8", "replace") if v is not None else ""
    return "trade"  # the contract says trades carry type=trade; a missing header is lenient
