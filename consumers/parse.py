"""Turning raw Kafka messages into ledger rows, or into a dead letter with a reason.

Runs once per message on the ingest hot path, so checks are ordered cheapest first and the
output is a ready-made line of PostgreSQL COPY text.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass

import orjson

# Columns of the COPY into the staging table, in this order.
TRADE_COLUMNS = (
    "trade_id", "trade_date", "seq", "kafka_partition", "kafka_offset", "symbol", "price",
    "quantity", "buyer", "seller", "executed_at", "site",
)
_TEXT_FIELDS = ("trade_id", "symbol", "buyer", "seller")
# The four text fields are joined with NUL (which PostgreSQL text cannot hold, so a NUL in
# the input is refused) and escaped for COPY in one pass, NUL becoming the column tab.
_COPY_ESCAPES = str.maketrans(
    {"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r", "\0": "\t"})
# numeric(18, 4): up to 14 integer digits, up to 4 decimals. Checking the text keeps binary
# floating point (and even Decimal construction) off the hot path.
_PRICE = re.compile(r"(?:0|[1-9][0-9]{0,13})(?:\.[0-9]{1,4})?")
_valid_dates: dict[str, bool] = {}


class Malformed(ValueError):
    """The message cannot be a trade; str(exc) is the dead-letter reason."""


@dataclass(frozen=True, slots=True)
class CloseMarker:
    trade_date: str
    partition: int
    last_seq: int


def _date(value: object, field: str) -> str:
    if type(value) is not str:
        raise Malformed(f"{field} must be a YYYY-MM-DD string, got {type(value).__name__}")
    ok = _valid_dates.get(value)
    if ok is None:
        try:
            ok = len(value) == 10 and dt.date.fromisoformat(value) is not None
        except ValueError:
            ok = False
        if len(_valid_dates) < 10_000:  # a day has one date; bound the cache anyway
            _valid_dates[value] = ok
    if not ok:
        raise Malformed(f"unknown {field} {value[:40]!r}: not a YYYY-MM-DD calendar date")
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
        obj = orjson.loads(raw)  # also rejects invalid UTF-8
    except orjson.JSONDecodeError as e:
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as u:
            raise Malformed(f"invalid UTF-8 at byte {u.start}") from None
        raise Malformed(f"invalid JSON: {e}") from None
    if type(obj) is not dict:
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
        if type(v) is not str or not v:
            raise Malformed(f"{name} must be a non-empty string")
    if buyer == seller:
        raise Malformed(f"buyer equals seller ({buyer!r})")
    _date(trade_date, "trade_date")
    if _int(seq, "seq") <= 0:
        raise Malformed(f"seq must be positive, got {seq}")
    if _int(quantity, "quantity") <= 0:
        raise Malformed(f"quantity must be positive, got {quantity}")
    if type(price) is not str:
        # A JSON number would have gone through binary floating point: refuse it.
        raise Malformed(f"price must be a decimal string, got {type(price).__name__}")
    if _PRICE.fullmatch(price) is None:
        raise Malformed(
            f"price must be a positive decimal with at most 14 integer digits and 4 decimal "
            f"places, got {price[:40]!r}")
    if not price.strip("0."):
        raise Malformed(f"price must be positive, got {price!r}")
    if type(executed_at) is not str:
        raise Malformed("executed_at must be an ISO-8601 string")
    try:
        ts = dt.datetime.fromisoformat(executed_at)
    except ValueError:
        raise Malformed(f"executed_at is not ISO-8601: {executed_at[:40]!r}") from None
    if ts.tzinfo is None:
        raise Malformed(f"executed_at has no time zone: {executed_at[:40]!r}")
    joined = f"{trade_id}\0{symbol}\0{buyer}\0{seller}"
    if joined.count("\0") != 3:
        raise Malformed("text fields must not contain NUL characters")
    t_id, sym, parties = joined.translate(_COPY_ESCAPES).split("\t", 2)
    return (
        f"{t_id}\t{trade_date}\t{seq}\t{partition}\t{offset}\t{sym}\t{price}\t{quantity}\t"
        f"{parties}\t{executed_at}\t{site}\n"
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
