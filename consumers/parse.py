"""Turning raw Kafka messages into ledger rows, or into a dead letter with a reason.

Every rule comes from ``settlement.contract``; ``settlement.spark.parse`` applies the same
rules in Spark and ``tests/test_parity.py`` proves the two agree. This runs once per message
on the ingest hot path, so checks are ordered cheapest first, the JSON checks that orjson
does not make are proven unnecessary for the common flat message by counting bytes, and the
output is a ready-made line of PostgreSQL COPY text.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from dataclasses import dataclass
from functools import partial
from typing import Annotated, NamedTuple

import msgspec
import orjson

from settlement.contract import (
    BUYER,
    CANCEL,
    CLOSE_AMENDED,
    CLOSE_LAST_SEQ,
    CLOSE_PARTITION,
    CORRECT,
    DATE_PATTERN,
    EXECUTED_AT_PATTERN,
    MAX_DEPTH,
    MAX_KEY_LENGTH,
    MAX_NUMBER_LENGTH,
    MISSING_TYPE_MEANS,
    NONZERO_PATTERN,
    ORIGINAL_VERSION,
    PRICE_PATTERN,
    PRINTABLE_PATTERN,
    QUANTITY,
    REASON,
    SELLER,
    SEQ,
    STRING_FIELDS,
    SYMBOL,
    TEXT_FIELDS,
    TRADE_FIELDS,
    TRADE_ID,
    TYPE_HEADER,
    VERSION,
)

_DATE = re.compile(DATE_PATTERN)
_EXECUTED_AT = re.compile(EXECUTED_AT_PATTERN)
_PRICE = re.compile(f"(?={NONZERO_PATTERN})(?:{PRICE_PATTERN})")
_PRINTABLE = re.compile(PRINTABLE_PATTERN)
_TEXT_FIELDS = (TRADE_ID, SYMBOL, BUYER, SELLER)
_ID_MAX, _SYMBOL_MAX = TRADE_ID.max_length, SYMBOL.max_length
_BUYER_MAX, _SELLER_MAX = BUYER.max_length, SELLER.max_length
_valid_dates: dict[str, bool] = {}


class Malformed(ValueError):
    """The message cannot be a trade; str(exc) is the dead-letter reason."""


@dataclass(frozen=True, slots=True)
class CloseMarker:
    trade_date: str
    partition: int
    last_seq: int
    amended: int = 0  # k of the k-th amended close; 0 for the day's close


def _is_date(value: str) -> bool:
    ok = _valid_dates.get(value)
    if ok is None:
        # Only strings of the date's shape (10 characters) reach the cache: hostile 4 KB
        # "dates" must neither hold memory nor fill the cache before the real days arrive.
        if _DATE.fullmatch(value) is None:
            return False
        try:
            ok = dt.date.fromisoformat(value) is not None
        except ValueError:  # the pattern passed, the calendar did not (30 February)
            ok = False
        if len(_valid_dates) < 10_000:  # a day has one date; bound the cache anyway
            _valid_dates[value] = ok
    return ok


def _date(value: object, field: str) -> str:
    if type(value) is not str:
        raise Malformed(f"{field} must be a YYYY-MM-DD string, got {type(value).__name__}")
    if not _is_date(value):
        raise Malformed(
            f"unknown {field} {value[:40]!r}: not a YYYY-MM-DD calendar date in 2000-2099")
    return value


def _int(value: object, field: str, minimum: int, maximum: int) -> int:
    # bool is an int subclass in Python, but `true` is not a sequence number.
    if type(value) is not int:
        raise Malformed(f"{field} must be an integer, got {type(value).__name__}")
    if not minimum <= value <= maximum:  # type: ignore[operator]
        raise Malformed(f"{field} must be in [{minimum}, {maximum}], got {value}")
    return value  # type: ignore[return-value]


def decode(raw: bytes | None, max_bytes: int) -> dict[str, object]:
    """The message's JSON object, if the value is one the contract accepts as JSON."""
    if raw is None:
        raise Malformed("empty message (null value)")
    if len(raw) > max_bytes:
        raise Malformed(f"oversized: {len(raw)} bytes > limit {max_bytes}")
    try:
        # Strict RFC 8259 and UTF-8: also refuses trailing content, lone surrogate escapes,
        # numbers that overflow a double, NaN and a byte order mark.
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as u:
            raise Malformed(f"invalid UTF-8 at byte {u.start}") from None
        raise Malformed(f"invalid JSON: {e}") from None
    if type(obj) is not dict:
        raise Malformed(f"expected a JSON object, got {type(obj).__name__}")
    # What orjson lets through: repeated keys (it keeps the last), deep nesting, long numbers
    # and keys. None of them can be in a short value without escapes whose values are all
    # scalars and whose quotes are exactly those of its keys and string values: there, every
    # '"' delimits a string, so a repeated key would add two.
    if len(raw) <= MAX_NUMBER_LENGTH and b"\\" not in raw:
        types = list(map(type, obj.values()))
        if (dict not in types and list not in types
                and raw.count(b'"') == 2 * (len(types) + types.count(str))):
            return obj
    _check_json_limits(raw, obj)
    return obj


def _check_json_limits(raw: bytes, obj: dict[str, object]) -> None:
    """The contract's JSON rules beyond RFC 8259 (see settlement.contract), the slow way."""
    depth, level = 1, [obj]
    while level:
        nested = [v for c in level for v in (c.values() if type(c) is dict else c)
                  if type(v) is dict or type(v) is list]
        if nested:
            depth += 1
            if depth > MAX_DEPTH:
                raise Malformed(f"invalid JSON: nested deeper than {MAX_DEPTH} levels")
        level = nested  # type: ignore[assignment]

    def pairs(items: list[tuple[str, object]]) -> None:
        seen: set[str] = set()
        for k, _ in items:
            if k in seen:
                raise Malformed(f"invalid JSON: duplicate key {k[:40]!r}")
            seen.add(k)
            # UTF-16 code units, as Jackson counts them; only long keys can exceed the limit.
            if len(k) > MAX_KEY_LENGTH // 2 and len(k.encode("utf-16-le")) // 2 > MAX_KEY_LENGTH:
                raise Malformed(f"invalid JSON: key longer than {MAX_KEY_LENGTH} characters")
        # The structure is orjson's; this pass only checks.

    def number(text: str) -> int:
        if len(text) > MAX_NUMBER_LENGTH:
            raise Malformed(f"invalid JSON: number longer than {MAX_NUMBER_LENGTH} characters")
        return 0

    # The standard library parser reports what orjson hides: every key of every object in
    # order and the text of every number. orjson has already accepted the value.
    json.loads(raw, object_pairs_hook=pairs, parse_int=number, parse_float=number)


class TradeValues(NamedTuple):
    """A trade's fields once the contract has accepted them, as they were on the wire
    (``price``, ``trade_date`` and ``executed_at`` keep their exact text)."""

    trade_id: str
    trade_date: str
    seq: int
    symbol: str
    price: str
    quantity: int
    buyer: str
    seller: str
    executed_at: str


def trade_values(obj: dict[str, object]) -> TradeValues:
    """Validate a trade against the contract; raises ``Malformed`` with the reason."""
    return _TRADE_VALUES(_checked(obj))  # type: ignore[call-arg]


def _checked(obj: dict[str, object]) -> tuple[str, str, int, str, str, int, str, str, str]:
    """``trade_values`` as a plain tuple, in TradeValues' order: the ingest hot path builds
    a COPY line from it and skips the named tuple."""
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
    if not (type(trade_id) is str and type(symbol) is str and type(buyer) is str
            and type(seller) is str and 0 < len(trade_id) <= _ID_MAX
            and 0 < len(symbol) <= _SYMBOL_MAX and 0 < len(buyer) <= _BUYER_MAX
            and 0 < len(seller) <= _SELLER_MAX):
        for field, v in zip(_TEXT_FIELDS, (trade_id, symbol, buyer, seller), strict=True):
            if type(v) is not str or not 0 < len(v) <= field.max_length:
                raise Malformed(
                    f"{field.name} must be a string of 1 to {field.max_length} characters")
    texts = trade_id + symbol + buyer + seller  # type: ignore[operator]
    # isprintable() is a fast and stricter test; the contract's class decides when it fails.
    if not texts.isprintable() and _PRINTABLE.fullmatch(texts) is None:
        raise Malformed("text fields must not contain control characters")
    if buyer == seller:
        raise Malformed(f"buyer equals seller ({buyer!r})")
    _date(trade_date, "trade_date")
    _int(seq, SEQ.name, SEQ.minimum, SEQ.maximum)
    _int(quantity, QUANTITY.name, QUANTITY.minimum, QUANTITY.maximum)
    if type(price) is not str:
        # A JSON number would have gone through binary floating point: refuse it.
        raise Malformed(f"price must be a decimal string, got {type(price).__name__}")
    if _PRICE.fullmatch(price) is None:
        raise Malformed(
            f"price must be a positive decimal with at most 14 integer digits, no leading "
            f"zeros and at most 4 decimal places, got {price[:40]!r}")
    if type(executed_at) is not str:
        raise Malformed("executed_at must be an ISO-8601 string")
    if _EXECUTED_AT.fullmatch(executed_at) is None or not _is_date(executed_at[:10]):
        raise Malformed(
            f"executed_at is not ISO-8601 with seconds and a zone: {executed_at[:40]!r}")
    return (trade_id, trade_date, seq, symbol, price, quantity, buyer,  # type: ignore[return-value]
            seller, executed_at)


# tuple.__new__ without the keyword handling of the generated __new__: this runs per message.
_TRADE_VALUES = partial(tuple.__new__, TradeValues)


# -- the fast path: a plain trade decoded and typed in C -----------------------------------------
# The common message is a flat trade object written by a well-behaved producer. msgspec decodes
# it straight into typed fields and checks types, lengths and integer ranges in C (about half
# the cost of orjson plus the checks above); the patterns, the calendar and buyer <> seller are
# then checked as above. It only ever *accepts*: anything it does not take (a JSON rule in
# doubt, a wrong field, an escape, a repeated key) goes the slow way, which gives the reason.
# tests/test_parse.py holds it to the slow path's verdict and values on the parity corpus and
# on generated batches.
def _wire_type(name: str) -> object:
    for f in TEXT_FIELDS:
        if f.name == name:
            return Annotated[str, msgspec.Meta(min_length=1, max_length=f.max_length)]
    for i in (SEQ, QUANTITY):
        if i.name == name:
            return Annotated[int, msgspec.Meta(ge=i.minimum, le=i.maximum)]
    return str


_WireTrade = msgspec.defstruct(
    "_WireTrade", [(f, _wire_type(f)) for f in TRADE_FIELDS], forbid_unknown_fields=True,
    gc=False)  # str and int fields only: no cycle to find, so not tracked (fewer collections)
_FAST = msgspec.json.Decoder(_WireTrade)
# A plain trade has every field once, quoted keys and quoted strings and nothing else quoted:
# without a backslash no string holds a quote, so a repeated key shows in this count.
_PLAIN_QUOTES = 2 * (len(TRADE_FIELDS) + len(STRING_FIELDS))
_BOM = b"\xef\xbb\xbf"


def fast_trade(raw: bytes | None, max_bytes: int
               ) -> tuple[str, str, int, str, str, int, str, str, str] | None:
    """A plain trade's checked fields (``trade_values``' order), or None when the message is
    not one the fast path can vouch for: then ``decode`` and ``trade_values`` decide."""
    if (raw is None or len(raw) > max_bytes or b"\\" in raw
            or raw.count(b'"') != _PLAIN_QUOTES or raw.startswith(_BOM)):
        return None
    try:
        t = _FAST.decode(raw)
    except (msgspec.MsgspecError, ValueError):  # invalid UTF-8 raises UnicodeDecodeError
        return None
    trade_id, symbol, buyer, seller = t.trade_id, t.symbol, t.buyer, t.seller
    texts = trade_id + symbol + buyer + seller
    if not texts.isprintable() and _PRINTABLE.fullmatch(texts) is None:
        return None
    price, executed_at, trade_date = t.price, t.executed_at, t.trade_date
    if (buyer == seller or not _is_date(trade_date) or _PRICE.fullmatch(price) is None
            or _EXECUTED_AT.fullmatch(executed_at) is None
            or not _is_date(executed_at[:10])):
        return None
    return (trade_id, trade_date, t.seq, symbol, price, t.quantity, buyer, seller,
            executed_at)


# -- the fast path for a whole poll ---------------------------------------------------------------
# A poll of plain trades is checked as one buffer: the values joined by newlines, decoded by the
# same decoder in one call (msgspec's decode_lines) and the byte-level checks above made once
# over the buffer, the price and execution time patterns each once over their values joined by
# newlines. About a fifth less CPU than fast_trade per message (300,000 consumed messages:
# 0.71-0.86 s against 0.93-1.09 s, docs/benchmarks.md), on the site's one Python thread. All or
# nothing: any value it cannot vouch for (the checks are those of fast_trade or stricter) and
# the caller parses the poll per message.
_PRICE_LINES = re.compile(rf"^(?!(?=[^\n]*[1-9])(?:{PRICE_PATTERN})$)", re.MULTILINE)
_EXECUTED_AT_LINES = re.compile(rf"^(?!(?:{EXECUTED_AT_PATTERN})$)", re.MULTILINE)


def fast_trades(raws: list[bytes], max_bytes: int) -> list[tuple[str, str, int, str, str, int,
                                                                 str, str, str]] | None:
    """The checked fields of a poll's plain trades -- for each value exactly
    ``fast_trade(raw, max_bytes)`` -- or None when any value is not one this path vouches for.
    The sites' poll path (``fast_trade_lines``) and the end of day's classifier both use it."""
    n = len(raws)
    if not n or None in raws or max(map(len, raws)) > max_bytes:
        return None
    buf = b"\n".join(raws)
    # ASCII without DEL: no control character in any string (raw C0 ones are not JSON) and no
    # byte order mark; the rare poll with other text goes per message, where the contract's
    # class decides. Every value starts with '{', ends with '}' and holds no newline or
    # backslash. A string cannot hold a raw newline, so none spans two values, and each value
    # holds whole objects. Each object decoded has at least _PLAIN_QUOTES quotes (every field
    # once, no unknown one), so n objects and n * _PLAIN_QUOTES quotes in all means one object
    # per value and no repeated key in any (the count fast_trade makes per value).
    if (not buf.isascii() or b"\x7f" in buf or buf[:1] != b"{" or buf[-1:] != b"}"
            or buf.count(b"\n") != n - 1 or buf.count(b"}\n{") != n - 1 or b"\\" in buf
            or buf.count(b'"') != n * _PLAIN_QUOTES):
        return None
    try:
        trades = _FAST.decode_lines(buf)
    except (msgspec.MsgspecError, ValueError):
        return None
    if (len(trades) != n
            or _PRICE_LINES.search("\n".join([t.price for t in trades])) is not None
            or _EXECUTED_AT_LINES.search("\n".join([t.executed_at for t in trades]))
            is not None):
        return None
    dates = {t.trade_date for t in trades}
    dates.update([t.executed_at[:10] for t in trades])
    if not all(map(_is_date, dates)):
        return None
    fields = list(map(msgspec.structs.astuple, trades))
    if any([t[6] == t[7] for t in fields]):  # buyer, seller
        return None
    return fields


def fast_trade_lines(raws: list[bytes], partitions: list[int], offsets: list[int], site: str,
                     max_bytes: int) -> list[str] | None:
    """The COPY lines of a poll of plain trades -- for each value exactly
    ``copy_line(fast_trade(raw, max_bytes), partition, offset, site)`` -- or None when any
    value is not one this path vouches for."""
    trades = fast_trades(raws, max_bytes)
    if trades is None:
        return None
    return [f"{t}\t{d}\t{s}\t{p}\t{o}\t{sym}\t{pr}\t{q}\t{b}\t{sel}\t{at}\t{site}\n"
            for (t, d, s, sym, pr, q, b, sel, at), p, o
            in zip(trades, partitions, offsets, strict=True)]


def fast_trade_values(raw: bytes | None, max_bytes: int) -> TradeValues | None:
    t = fast_trade(raw, max_bytes)
    return None if t is None else _TRADE_VALUES(t)  # type: ignore[call-arg]


def trade_copy_line(obj: dict[str, object], partition: int, offset: int, site: str) -> str:
    """Validate a trade and return its COPY text line (tab-separated, newline-terminated)."""
    return copy_line(_checked(obj), partition, offset, site)


def copy_line(t: tuple[str, str, int, str, str, int, str, str, str], partition: int,
              offset: int, site: str) -> str:
    """A checked trade's COPY text line (tab-separated, newline-terminated)."""
    trade_id, trade_date, seq, symbol, price, quantity, buyer, seller, executed_at = t
    if "\\" in trade_id or "\\" in symbol or "\\" in buyer or "\\" in seller:
        # Control characters are refused, so a backslash is all COPY needs escaped.
        trade_id, symbol, buyer, seller = (
            s.replace("\\", "\\\\") for s in (trade_id, symbol, buyer, seller))
    return (
        f"{trade_id}\t{trade_date}\t{seq}\t{partition}\t{offset}\t{symbol}\t{price}\t"
        f"{quantity}\t{buyer}\t{seller}\t{executed_at}\t{site}\n"
    )


def close_marker(obj: dict[str, object], partition: int) -> CloseMarker:
    try:
        trade_date, part, last_seq = obj["trade_date"], obj["partition"], obj["last_seq"]
    except KeyError as e:
        raise Malformed(f"close marker: missing field {e.args[0]!r}") from None
    _date(trade_date, "trade_date")
    _int(part, CLOSE_PARTITION.name, CLOSE_PARTITION.minimum, CLOSE_PARTITION.maximum)
    if part != partition:
        raise Malformed(f"close marker for partition {part} arrived on partition {partition}")
    _int(last_seq, CLOSE_LAST_SEQ.name, CLOSE_LAST_SEQ.minimum, CLOSE_LAST_SEQ.maximum)
    amended = obj.get(CLOSE_AMENDED.name, 0)
    if CLOSE_AMENDED.name in obj:
        _int(amended, CLOSE_AMENDED.name, CLOSE_AMENDED.minimum, CLOSE_AMENDED.maximum)
    return CloseMarker(str(trade_date), partition, last_seq, amended)  # type: ignore[arg-type]


# -- the amended close: one rule for the sites and the Kafka read -------------------------------
# A cancel or correction of day D on a partition where D's close marker came before it is held
# as a `late` dead letter; an amended close marker of D behind it on that partition whose
# last_seq covers its seq makes it a post-close amendment of D (checked then, in offset order,
# against its trade's state, by amendment_refusal). The sites hold such messages in the ledger
# (late_amendments) and decide when the marker arrives; the Kafka read holds them in its worker
# and decides at the same point of the log, so both reach the same verdict.
REPLAY = "replay"


class KeptMarker(NamedTuple):
    """An amended close marker already kept for a day's partition."""

    amended: int
    last_seq: int
    offset: int


def late_reason(trade_date: str, partition: int, close_offset: int) -> str:
    """The dead-letter reason of a message of a day after that day's close on its partition
    (a trade, or an amendment no amended close covers)."""
    return f"late: trade_date {trade_date} closed on partition {partition} at offset {close_offset}"


def amended_marker_refusal(cm: CloseMarker, offset: int, closed: tuple[int, int] | None,
                           kept: list[KeptMarker]) -> str | None:
    """Why an amended close marker (``cm.amended`` > 0) at ``offset`` may not be kept
    (``REPLAY`` for an equal copy of a kept one), or None. ``closed``: the day's close marker
    on the partition (last_seq, offset), if one came before; ``kept``: the amended ones kept
    so far, in order."""
    what = f"amended close marker {cm.amended} of {cm.trade_date} on partition {cm.partition}"
    if closed is None or closed[1] > offset:
        return f"{what}: the day is not closed on this partition"
    for k in kept:
        if k.amended == cm.amended:
            if k.last_seq == cm.last_seq:
                return REPLAY
            return (f"conflicting {what}: last_seq {cm.last_seq}, the marker kept at offset "
                    f"{k.offset} says {k.last_seq}")
    if cm.amended != len(kept) + 1:
        return f"{what}: expected amended {len(kept) + 1} next"
    before = max([closed[0], *(k.last_seq for k in kept)])
    if cm.last_seq < before:
        return f"{what}: last_seq {cm.last_seq} is below the day's last close ({before})"
    return None


def covered(a_seq: int, a_offset: int, marker_last_seq: int, marker_offset: int) -> bool:
    """Whether an amended close marker covers a held post-close amendment: the amendment
    came before the marker and the marker's last_seq counts its seq."""
    return a_offset < marker_offset and a_seq <= marker_last_seq


@dataclass(frozen=True, slots=True)
class Amendment:
    """A cancel or a correction the contract accepts. ``seq`` is the amendment's own (its
    partition's next); a correction carries the whole corrected trade in ``values``
    (``trade_values``' order, whose seq is the amendment's) and its ``version``."""

    kind: str  # CANCEL | CORRECT
    trade_id: str
    trade_date: str
    seq: int
    version: int | None  # corrections only
    reason: str | None  # cancels only
    values: TradeValues | None  # corrections only


def amendment(obj: dict[str, object], kind: str) -> Amendment:
    """Validate a cancel or a correction (``kind``) against the contract; raises
    ``Malformed`` with the reason."""
    if kind == CANCEL:
        try:
            trade_id, trade_date, seq, reason = (
                obj["trade_id"], obj["trade_date"], obj["seq"], obj["reason"])
        except KeyError as e:
            raise Malformed(f"cancel: missing field {e.args[0]!r}") from None
        for field, v in ((TRADE_ID, trade_id), (REASON, reason)):
            if type(v) is not str or not 0 < len(v) <= field.max_length:
                raise Malformed(f"cancel: {field.name} must be a string of 1 to "
                                f"{field.max_length} characters")
            if not v.isprintable() and _PRINTABLE.fullmatch(v) is None:
                raise Malformed(f"cancel: {field.name} must not contain control characters")
        _date(trade_date, "trade_date")
        _int(seq, SEQ.name, SEQ.minimum, SEQ.maximum)
        return Amendment(CANCEL, trade_id, trade_date, seq, None, reason,  # type: ignore[arg-type]
                         None)
    try:
        version = obj["version"]
    except KeyError:
        raise Malformed("correction: missing field 'version'") from None
    try:
        t = trade_values(obj)
    except Malformed as e:
        raise Malformed(f"correction: {e}") from None
    _int(version, VERSION.name, VERSION.minimum, VERSION.maximum)
    return Amendment(kind, t.trade_id, t.trade_date, t.seq, version, None, t)  # type: ignore[arg-type]


def message_type(headers: list[tuple[str, bytes]] | None) -> str:
    """The first ``type`` header's value ('' when it is null); a message without one is a
    trade. Any value but 'trade', 'close', 'cancel' or 'correct' makes the caller
    dead-letter the message."""
    if headers:
        for k, v in headers:
            if k == TYPE_HEADER:
                return v.decode("utf-8", "replace") if v is not None else ""
    return MISSING_TYPE_MEANS


# -- replays: identical copies are duplicates, conflicting ones dead letters ---------------------
def utc_instant(executed_at: str) -> str:
    """``executed_at`` as one canonical UTC text: equal instants give equal text, as equal
    ``timestamptz`` values do in the ledger (``...T15:00:00+01:00`` is ``...T14:00:00Z``,
    ``.500000`` is ``.5``). The common form (``Z``) costs a few string operations."""
    if executed_at.endswith("Z"):
        head = executed_at[:-1]
    else:
        head = (dt.datetime.fromisoformat(executed_at).astimezone(dt.UTC)
                .replace(tzinfo=None).isoformat())
    return head.rstrip("0").rstrip(".") if "." in head else head


def fingerprint(t: tuple[str, str, int, str, str, int, str, str, str]) -> int:
    """A hash of a trade's content (every field but its id) that is equal exactly when the
    ledger's typed columns are equal: the price as a number (``10.5`` = ``10.50``), the
    execution time as an instant. Two copies of one trade id with equal fingerprints are a
    replay; with different ones, a conflicting replay (``conflict_reason``)."""
    _, trade_date, seq, symbol, price, quantity, buyer, seller, executed_at = t
    if "." in price:
        price = price.rstrip("0").rstrip(".")
    return hash((trade_date, seq, symbol, price, quantity, buyer, seller,
                 utc_instant(executed_at)))


def conflict_reason(trade_id: str, kept_partition: int, kept_offset: int) -> str:
    """The dead-letter reason of a copy of a trade id whose content differs from the copy
    kept; the same words from the sites and from the end of day's Kafka read."""
    return (f"conflicting replay of trade {trade_id[:80]!r}: its fields differ from the copy "
            f"kept at partition {kept_partition} offset {kept_offset}")


def marker_conflict_reason(trade_date: str, partition: int, last_seq: int, kept_seq: int,
                           kept_offset: int) -> str:
    """The dead-letter reason of a second close marker of a day and partition whose last
    sequence number differs from the one kept."""
    return (f"conflicting close marker of {trade_date} on partition {partition}: last_seq "
            f"{last_seq}, the marker kept at offset {kept_offset} says {kept_seq}")


# -- amendments: what makes a cancel or a correction refer to a trade it may amend -------------
# The sites (in the ledger, consumers.ledger) and the end of day's Kafka read (in its worker,
# settlement.spark.parse) hold the same state per trade and call the same function, in offset
# order along the trade's partition, so both dead-letter the same amendments for the same
# reasons. A cancel or correction is never held back waiting for its trade: both go to the
# trade's partition after it, so one whose trade is not there before it can never become
# valid (an upstream bug): a dead letter at once, with the reason.
@dataclass(slots=True)
class AmendedTrade:
    """What the amendments of a trade are checked against."""

    trade_date: str
    version: int = ORIGINAL_VERSION
    cancelled: bool = False


def _what(a: Amendment) -> str:
    return (f"cancel of trade {a.trade_id[:80]!r}" if a.kind == CANCEL
            else f"correction (version {a.version}) of trade {a.trade_id[:80]!r}")


def amendment_refusal(a: Amendment, trade: AmendedTrade | None) -> str | None:
    """The dead-letter reason of an amendment that may not apply to ``trade`` (None: the
    trade id is unknown on the amendment's partition before it), or None when it applies."""
    if trade is None:
        return f"{_what(a)}: unknown trade (no such trade before it on its partition)"
    if trade.trade_date != a.trade_date:
        return f"{_what(a)}: the trade is dated {trade.trade_date}, the amendment {a.trade_date}"
    if trade.cancelled:
        return f"{_what(a)}: the trade is cancelled"
    if a.kind == CORRECT and a.version <= trade.version:  # type: ignore[operator]
        return (f"{_what(a)}: version {a.version} is not above the trade's current version "
                f"{trade.version}")
    return None


def apply_amendment(a: Amendment, trade: AmendedTrade) -> None:
    """``trade`` once the accepted ``a`` applies."""
    if a.kind == CANCEL:
        trade.cancelled = True
    else:
        trade.version = a.version  # type: ignore[assignment]


def amendment_fingerprint(a: Amendment) -> int:
    """Equal exactly when two copies of an amendment (one identity: trade id, kind, version)
    are the same message in the ledger's typed terms: a replay. Else a conflicting replay."""
    return hash((a.seq, a.reason, fingerprint(a.values) if a.values is not None else None))


def amendment_conflict_reason(a: Amendment, kept_partition: int, kept_offset: int) -> str:
    return (f"conflicting replay of the {_what(a)}: its fields differ from the copy kept at "
            f"partition {kept_partition} offset {kept_offset}")
