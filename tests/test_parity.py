"""One contract, two runtimes: a consumer site (``consumers.parse``, a COPY line PostgreSQL
types) and the Spark Kafka reader (``settlement.spark.parse``, which runs the same parser in
its Python workers and hands back Arrow-typed columns) must give every message the same
verdict.

A verdict is the kind (trade, close marker, dead letter) and, for an accepted message, the
typed values: what can still differ is the typing (dates, decimal prices, zoned timestamps
through Arrow's casts versus PostgreSQL's), the headers' decoding and the batch plumbing.
Three tests:

- a hand-written corpus of edge cases, each with what it probes and the verdict the contract
  gives it;
- property-based adversarial batches (hypothesis draws the field values, a seeded builder
  assembles thousands of messages around them: wrong types, limits, unicode, control
  characters, surrogates, dates, timestamps, prices, missing/extra/repeated keys, headers,
  trailing bytes, broken UTF-8), one Spark job per batch;
- storability: every accepted message goes into a real ledger through the sites' own write
  path (COPY into the staging table, insert into ``trades``) and reads back equal.
"""

from __future__ import annotations

import datetime as dt
import json
import random
import re
from collections.abc import Iterable, Sequence
from decimal import Decimal
from typing import Any

import psycopg
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, Phase, given
from hypothesis import settings as settings_
from hypothesis import strategies as st
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from consumers.parse import (
    REPLAY,
    KeptMarker,
    Malformed,
    amended_marker_refusal,
    close_marker,
    conflict_reason,
    decode,
    fingerprint,
    late_reason,
    marker_conflict_reason,
    message_type,
    trade_copy_line,
    trade_values,
)
from settlement import contract as C
from settlement.db import q
from settlement.simulator.gateway import (
    MALFORMED_KINDS,
    DayGenerator,
    SimulationSpec,
    malformed_message,
)
from settlement.spark.figures import BUCKET_SEQS, figures, row_hash
from settlement.spark.parse import classify_kafka_values
from settlement.spark.rowhash import row_hashes
from settlement.spark.schemas import TRADE_SCHEMA
from tests.spark_fixtures import spark  # noqa: F401
from tests.strategies import (
    MAX_BYTES,
    TYPE_CLOSE,
    TYPE_TRADE,
    Builder,
    Msg,
    jstr,
    nest,
    pools,
)

RAW_SCHEMA = (
    "key binary, value binary, partition int, offset long, "
    "headers array<struct<key:string,value:binary>>"
)
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


# A verdict: ("trade", values) / ("close", values) / ("dead", reason). Values are typed.
Verdict = tuple[str, Any]


# -- the two parsers -------------------------------------------------------------------------


def _copy_unescape(field: str) -> str:
    # PostgreSQL COPY text format: backslash sequences.
    names = {"t": "\t", "n": "\n", "r": "\r", "b": "\b", "f": "\f", "v": "\v"}
    return re.sub(r"\\(.)", lambda m: names.get(m[1], m[1]), field, flags=re.S)


def _micros(ts: dt.datetime) -> int:
    return (ts - EPOCH) // dt.timedelta(microseconds=1)


def typed_copy_line(line: str) -> tuple[Any, ...]:
    """A COPY line of the sites' parser as typed values (what PostgreSQL makes of it)."""
    assert line.endswith("\n") and line.count("\n") == 1, line
    f = [_copy_unescape(x) for x in line[:-1].split("\t")]
    assert len(f) == len(C.STAGE_COLUMNS), line
    return (
        f[0], dt.date.fromisoformat(f[1]), int(f[2]), int(f[3]), int(f[4]), f[5], Decimal(f[6]),
        int(f[7]), f[8], f[9], _micros(dt.datetime.fromisoformat(f[10])),
    )  # fmt: skip


def python_verdict(m: Msg, offset: int) -> Verdict:
    """What a consumer site does with the message (consumers/site.py ``_parse``)."""
    try:
        obj = decode(m.value, MAX_BYTES)
        kind = message_type(list(m.headers) if m.headers is not None else None)  # type: ignore[arg-type]
        if kind == C.TRADE:
            return "trade", typed_copy_line(trade_copy_line(obj, m.partition, offset, "p"))
        if kind == C.CLOSE:
            cm = close_marker(obj, m.partition)
            return "close", (dt.date.fromisoformat(cm.trade_date), cm.partition, cm.last_seq)
        return "dead", f"unknown message type {kind!r}"
    except Malformed as e:
        return "dead", str(e)


def spark_verdicts(session: SparkSession, msgs: Sequence[Msg]) -> list[Verdict]:
    """The Spark classifier's verdicts, in one job."""
    rows = [
        (b"k", m.value, m.partition, offset, list(m.headers) if m.headers is not None else None)
        for offset, m in enumerate(msgs)
    ]
    # One task, in offset order, as a Kafka partition is read: which copy of a trade comes
    # first (and so which later copy is a conflicting replay) is then the same as below.
    frame = session.createDataFrame(rows, RAW_SCHEMA).coalesce(1)
    classified = classify_kafka_values(frame, MAX_BYTES)
    valid = F.col("reason").isNull()  # a dead letter's typed columns may hold anything
    out = classified.select(
        "kafka_offset", "reason", "_kind", "kafka_partition",
        *(F.when(valid, F.col(c)).alias(c) for c in (
            "trade_id", "trade_date", "seq", "symbol", "price", "quantity", "buyer", "seller",
            "_close_date", "_last_seq")),
        F.when(valid, F.unix_micros("executed_at")).alias("executed_at"),
    )  # fmt: skip
    # The row hashes the classifier hands validation (in Python) are Spark's ``row_hash`` of
    # the same typed trade (which ``store_and_read_back`` holds to PostgreSQL's).
    hi, lo = row_hash()
    unequal = classified.where(valid & (F.col("_kind") == C.TRADE)).where(
        ~(F.col("_row_hi").eqNullSafe(hi) & F.col("_row_lo").eqNullSafe(lo))).select(
        "kafka_offset", "_row_hi", "_row_lo", hi.alias("hi"), lo.alias("lo")).collect()
    assert not unequal, f"{len(unequal)} row hashes differ from Spark's: {unequal[:5]}"
    verdicts: list[Verdict | None] = [None] * len(msgs)
    for r in out.collect():
        if r["reason"] is not None:
            v: Verdict = ("dead", r["reason"])
        elif r["_kind"] == C.TRADE:
            v = ("trade", (
                r["trade_id"], r["trade_date"], r["seq"], r["kafka_partition"], r["kafka_offset"],
                r["symbol"], r["price"], r["quantity"], r["buyer"], r["seller"], r["executed_at"],
            ))  # fmt: skip
        elif r["_kind"] == C.CLOSE:
            v = ("close", (r["_close_date"], r["kafka_partition"], r["_last_seq"]))
        else:
            raise AssertionError(f"valid row of kind {r['_kind']!r}")
        verdicts[r["kafka_offset"]] = v
    assert all(v is not None for v in verdicts)
    return verdicts  # type: ignore[return-value]


def _show(m: Msg) -> str:
    value = m.value if m.value is None or len(m.value) < 300 else m.value[:300] + b"..."
    return f"value={value!r} headers={m.headers!r} partition={m.partition}"


def with_replays(msgs: Sequence[Msg], verdicts: Sequence[Verdict]) -> list[Verdict]:
    """The sites' rules across a batch, per Kafka partition in offset order: a trade of a date
    whose close marker came before it is late; a later copy of a trade id whose content
    differs from the first copy's, or a later close marker of a date with another last_seq, is
    a dead letter (an identical copy stays a trade); an amended close marker is kept or
    refused by the amended close's rule (consumers.parse.amended_marker_refusal)."""
    out = list(verdicts)
    trades: dict[tuple[int, str], tuple[int, int]] = {}
    closes: dict[tuple[int, Any], tuple[int, int]] = {}
    amended: dict[tuple[int, Any], list[KeptMarker]] = {}
    for offset, (m, (kind, values)) in enumerate(zip(msgs, verdicts, strict=True)):
        if kind == "trade":
            t = trade_values(decode(m.value, MAX_BYTES))
            closed = closes.get((m.partition, dt.date.fromisoformat(t.trade_date)))
            if closed is not None:
                out[offset] = ("dead", late_reason(t.trade_date, m.partition, closed[1]))
                continue
            first = trades.setdefault((m.partition, t.trade_id), (fingerprint(t), offset))
            if first[0] != fingerprint(t):
                out[offset] = ("dead", conflict_reason(t.trade_id, m.partition, first[1]))
        elif kind == "close":
            day, part, last_seq = values
            cm = close_marker(decode(m.value, MAX_BYTES), part)
            if cm.amended:
                kept_a = amended.setdefault((part, day), [])
                why = amended_marker_refusal(cm, offset, closes.get((part, day)), kept_a)
                if why is None:
                    kept_a.append(KeptMarker(cm.amended, last_seq, offset))
                elif why != REPLAY:
                    out[offset] = ("dead", why)
                continue
            kept = closes.setdefault((part, day), (last_seq, offset))
            if kept[0] != last_seq:
                out[offset] = ("dead", marker_conflict_reason(
                    day.isoformat(), part, last_seq, kept[0], kept[1]))
    return out


def assert_parity(session: SparkSession, msgs: Sequence[Msg]) -> list[Verdict]:
    """Both parsers agree on every message, the replay rule applied; returns the (Python)
    verdicts of each message on its own (the contract's)."""
    sparks = spark_verdicts(session, msgs)
    contract = [python_verdict(m, offset) for offset, m in enumerate(msgs)]
    pythons = with_replays(msgs, contract)
    diffs = []
    for offset, (m, p, s) in enumerate(zip(msgs, pythons, sparks, strict=True)):
        same = p[0] == s[0] and (p[0] == "dead" or p[1] == s[1])
        if p[0] == "dead" and str(p[1]).startswith("conflicting"):
            same = same and p[1] == s[1]  # the same words from a site and the end of day
        if not same:
            diffs.append(f"#{offset} {_show(m)}\n    python: {p!r}\n    spark:  {s!r}")
    assert not diffs, f"{len(diffs)} of {len(msgs)} messages disagree:\n" + "\n".join(diffs[:12])
    return contract


# -- building messages -----------------------------------------------------------------------


def obj_text(pairs: Iterable[tuple[str, str]], sep: str = "", colon: str = ":") -> str:
    """``{"k":v,...}`` from (key, JSON token) pairs: repeated keys stay repeated."""
    body = ("," + sep).join(f"{jstr(k)}{colon}{v}" for k, v in pairs)
    return "{" + sep + body + sep + "}"


GOOD = {
    "trade_id": "T20261123-000000001", "trade_date": "2026-11-23", "seq": 1, "symbol": "AAPL",
    "price": "187.2500", "quantity": 100, "buyer": "ACC0001", "seller": "ACC0002",
    "executed_at": "2026-11-23T14:30:00.000001Z",
}  # fmt: skip
CLOSE_GOOD = {"trade_date": "2026-11-23", "partition": 0, "last_seq": 120}


def tokens(obj: dict[str, Any]) -> list[tuple[str, str]]:
    return [(k, json.dumps(v, ensure_ascii=False)) for k, v in obj.items()]


def trade(**change: Any) -> bytes:
    """GOOD with fields changed (a value of ... deletes the field), compact like the gateway."""
    obj = {k: v for k, v in {**GOOD, **change}.items() if v is not ...}
    return obj_text(tokens(obj)).encode()


def trade_tok(**change: str) -> bytes:
    """GOOD with fields replaced by raw JSON tokens."""
    return obj_text([(k, change.get(k, v)) for k, v in tokens(GOOD)]).encode()


def close(**change: Any) -> bytes:
    obj = {k: v for k, v in {**CLOSE_GOOD, **change}.items() if v is not ...}
    return obj_text(tokens(obj)).encode()


# -- (a) the hand-written corpus -------------------------------------------------------------

T, X, D = "trade", "close", "dead"
BIG = 1 << 70


def with_extra(*pairs: tuple[str, str]) -> bytes:
    return obj_text([*tokens(GOOD), *pairs]).encode()


def padded(total: int) -> bytes:
    """A valid trade of exactly ``total`` bytes (an extra field takes up the room)."""
    base = with_extra(("pad", '""'))
    return with_extra(("pad", jstr("x" * (total - len(base)))))


CORPUS: list[tuple[Msg | bytes | None, str, str]] = [
    # The message as the gateway writes it, and ways of writing the same JSON.
    (trade(), T, "the gateway's compact format"),
    (json.dumps(GOOD, indent=2).encode(), T, "whitespace and newlines between tokens"),
    (obj_text(sorted(tokens(GOOD)), sep=" ", colon=" : ").encode(), T, "other key order, spaces"),
    (b" \t\r\n" + trade() + b"\n\t ", T, "JSON whitespace around the object"),
    (obj_text([(k, jstr(v, lambda ch: True) if isinstance(v, str) else json.dumps(v))
               for k, v in GOOD.items()]).encode(), T, "every string character as \\u escape"),
    (obj_text([(k, jstr(v, lambda ch: True, upper=True) if isinstance(v, str)
                else json.dumps(v)) for k, v in GOOD.items()]).encode(), T, "upper-case escapes"),
    (trade_tok(trade_id='"T\\/1"'), T, "an escaped solidus"),
    (with_extra(("venue", '"XNAS"'), ("flags", "[1,2.5e-3,true,null]"), ("meta", '{"a":{}}')), T,
     "extra fields of every JSON type"),
    (with_extra(("x", nest(C.MAX_DEPTH - 1))), T, "nesting exactly MAX_DEPTH deep"),
    (with_extra(("x", nest(C.MAX_DEPTH))), D, "nesting one level deeper than MAX_DEPTH"),
    (with_extra(("x", '{"y":' * (C.MAX_DEPTH - 1) + "1" + "}" * (C.MAX_DEPTH - 1))), T,
     "nested objects exactly MAX_DEPTH deep"),
    (with_extra(("x", nest(900))), D, "nesting orjson and Jackson would still read"),
    (with_extra(("x", nest(1100))), D, "nesting past both JSON libraries' own limits"),
    # Headers.
    (Msg(trade(), None), T, "no headers at all: a trade"),
    (Msg(trade(), ()), T, "an empty header list: a trade"),
    (Msg(trade(), (("source", b"x"), ("type", b"trade"))), T, "the type header after another"),
    (Msg(trade(), (("Type", b"close"),)), T, "header keys are case-sensitive: no type header"),
    (Msg(trade(), (("type", None),)), D, "a type header with a null value"),
    (Msg(trade(), (("type", b""),)), D, "an empty type"),
    (Msg(trade(), (("type", b"TRADE"),)), D, "type values are case-sensitive"),
    (Msg(trade(), (("type", b"trade "),)), D, "a type with trailing space"),
    (Msg(trade(), (("type", b"trade\xff"),)), D, "a type that is not UTF-8"),
    (Msg(trade(), (("type", b"heartbeat"),)), D, "an unknown type"),
    (Msg(trade(), (("type", b"trade"), ("type", b"close"))), T, "the first type header wins"),
    (Msg(trade(), (("type", b"close"), ("type", b"trade"))), D, "...a trade read as a close"),
    (Msg(close(), TYPE_TRADE), D, "a close marker's body typed as a trade"),
    # Close markers.
    (Msg(close(), TYPE_CLOSE), X, "a close marker"),
    (Msg(close(last_seq=0), TYPE_CLOSE), X, "a partition that saw no trade"),
    (Msg(close(partition=3), TYPE_CLOSE, 3), X, "on its own partition"),
    (Msg(close(partition=3), TYPE_CLOSE, 4), D, "on another partition"),
    (Msg(close(partition=C.MAX_PARTITION), TYPE_CLOSE, C.MAX_PARTITION), X, "the last partition"),
    (Msg(close(partition=-1), TYPE_CLOSE), D, "a negative partition"),
    (Msg(close(partition="0"), TYPE_CLOSE), D, "a partition as a string"),
    (Msg(close(partition=0.0), TYPE_CLOSE), D, "a partition as a float"),
    (Msg(close(partition=False), TYPE_CLOSE), D, "a partition as a boolean"),
    (Msg(close(last_seq=-1), TYPE_CLOSE), D, "a negative last_seq"),
    (Msg(close(last_seq=C.MAX_SEQ), TYPE_CLOSE), X, "last_seq at its maximum"),
    (Msg(close(last_seq=C.MAX_SEQ + 1), TYPE_CLOSE), D, "last_seq past its maximum"),
    (Msg(close(last_seq=BIG), TYPE_CLOSE), D, "last_seq past bigint"),
    (Msg(close(last_seq=None), TYPE_CLOSE), D, "a null last_seq"),
    (Msg(close(trade_date=...), TYPE_CLOSE), D, "a missing trade_date"),
    (Msg(close(trade_date="2026-02-30"), TYPE_CLOSE), D, "a close of no calendar day"),
    (Msg(close(trade_date=20261123), TYPE_CLOSE), D, "a date as a number"),
    (Msg(close(note="x"), TYPE_CLOSE), X, "a close marker with an extra field"),
    # The amended close (design.md): "amended": k >= 1, an integer.
    (Msg(close(amended=1, last_seq=127), TYPE_CLOSE), X, "an amended close marker"),
    (Msg(close(amended=1, last_seq=127), TYPE_CLOSE), X, "an amended close marker's replay"),
    (Msg(close(amended=1, last_seq=128), TYPE_CLOSE), X, "a conflicting amended close marker"),
    (Msg(close(amended=3, last_seq=129), TYPE_CLOSE), X, "an amended close out of order"),
    (Msg(close(amended=2, last_seq=1), TYPE_CLOSE), X, "an amended close going back"),
    (Msg(close(amended=2, last_seq=130), TYPE_CLOSE), X, "the second amended close"),
    (Msg(close(amended=0), TYPE_CLOSE), D, "amended 0"),
    (Msg(close(amended=-1), TYPE_CLOSE), D, "a negative amended"),
    (Msg(close(amended="1"), TYPE_CLOSE), D, "amended as a string"),
    (Msg(close(amended=True), TYPE_CLOSE), D, "amended as a boolean"),
    (Msg(close(amended=1.0), TYPE_CLOSE), D, "amended as a float"),
    (Msg(close(amended=None), TYPE_CLOSE), D, "a null amended"),
    (Msg(close(amended=2**31), TYPE_CLOSE), D, "amended past its maximum"),
    (Msg(close() + b"{}", TYPE_CLOSE), D, "a close marker with trailing bytes"),
    (Msg(obj_text([*tokens(CLOSE_GOOD), ("last_seq", "5")]).encode(), TYPE_CLOSE), D,
     "a close marker repeating a key"),
    (Msg(trade(), TYPE_CLOSE), D, "a trade typed as a close marker"),
    # Not a JSON object, or more than one.
    (None, D, "a null value"),
    (b"", D, "an empty value"),
    (b"   ", D, "only whitespace"),
    (b"null", D, "JSON null"),
    (b"[" + trade() + b"]", D, "an array holding a trade"),
    (b'"' + trade().replace(b'"', b'\\"') + b'"', D, "a string holding a trade"),
    (trade()[:-1], D, "truncated"),
    (trade() + trade(), D, "two objects back to back"),
    (trade() + b" x}", D, "garbage after the object, ending in a brace"),
    (trade() + b"}", D, "one closing brace too many"),
    (trade() + b"]", D, "a stray bracket after the object"),
    (trade() + b",", D, "a comma after the object"),
    (trade() + b"\x0c", D, "form feed is not JSON whitespace"),
    (trade() + b"\x00", D, "a NUL after the object"),
    (trade() + b"\xc2\xa0", D, "a no-break space after the object"),
    (b"\xef\xbb\xbf" + trade(), D, "a UTF-8 byte order mark"),
    (trade().replace(b'"seq":1', b"'seq':1"), D, "single quotes"),
    (trade().replace(b'"seq"', b"seq"), D, "an unquoted key"),
    (trade().replace(b"}", b",}"), D, "a trailing comma"),
    (trade().replace(b'"seq":1', b'"seq":1/*c*/'), D, "a comment"),
    (trade().replace(b'"seq":1,', b'"seq":1'), D, "a missing comma"),
    (with_extra(("x", "NaN")), D, "NaN"),
    (with_extra(("x", "Infinity")), D, "Infinity"),
    (with_extra(("x", "01")), D, "a leading zero"),
    (with_extra(("x", "+1")), D, "a plus sign"),
    (with_extra(("x", ".5")), D, "no integer digits"),
    (with_extra(("x", "1.")), D, "no fraction digits"),
    (with_extra(("x", "tru")), D, "a broken literal"),
    (with_extra(("x", '"a\\qb"')), D, "an unknown escape"),
    (with_extra(("x", '"\\u00e"')), D, "a short \\u escape"),
    (trade().replace(b'"AAPL"', b'"AA\tPL"'), D, "a raw tab inside a string"),
    (trade().replace(b'"AAPL"', b'"AA\x7fPL"'), D, "a raw DEL inside a text field"),
    # Repeated keys, anywhere.
    (obj_text([*tokens(GOOD), ("price", '"187.2500"')]).encode(), D, "a key repeated, same value"),
    (obj_text([("price", "1"), *tokens(GOOD)]).encode(), D, "a number, then the string price"),
    (obj_text([*tokens(GOOD), ("price", "1")]).encode(), D, "the string price, then a number"),
    (obj_text([*tokens(GOOD), ("x", "1"), ("x", "2")]).encode(), D, "an extra key repeated"),
    (with_extra(("x", '{"a":1,"a":2}')), D, "a key repeated in a nested object"),
    (with_extra(("x", '[{"a":1},{"a":2}]')), T, "the same key in two objects is no repetition"),
    # As many quotes as a valid trade has, with a key too many and a string too few.
    (obj_text([(k, "187.25" if k == "price" else v) for k, v in tokens(GOOD)] + [("x", "1")]
              ).encode(), D, "a number price and an extra key"),
    (obj_text([(k, "true" if k == "symbol" else v) for k, v in tokens(GOOD)] + [("x", "1")]
              ).encode(), D, "a boolean symbol and an extra key"),
    (obj_text([(k, "5" if k == "symbol" else v) for k, v in tokens(GOOD)] + [("price", "2")]
              ).encode(), D, "a number symbol, and the price repeated as a number"),
    (obj_text([("price", "2")] + [(k, "5" if k == "symbol" else v) for k, v in tokens(GOOD)]
              ).encode(), D, "a number symbol, and a number price before the string one"),
    (obj_text([(k, '"1"' if k == "trade_id" else v) for k, v in tokens(GOOD)]).encode(), T,
     "a trade_id that reads like a number but is a string"),
    # Surrogates and Unicode.
    (trade_tok(trade_id='"T\\ud800"'), D, "a lone high surrogate"),
    (trade_tok(trade_id='"T\\udc00"'), D, "a lone low surrogate"),
    (trade_tok(trade_id='"T\\ude00\\ud83d"'), D, "a surrogate pair in the wrong order"),
    (trade_tok(trade_id='"T\\ud83d\\u0041"'), D, "a high surrogate before a non-surrogate"),
    (with_extra(("x", '"\\ud800"')), D, "a lone surrogate in an extra field"),
    (trade_tok(trade_id='"T\\ud83d\\ude00"'), T, "an escaped surrogate pair"),
    (trade(trade_id="T😀"), T, "a character outside the BMP"),
    (trade(trade_id="😀" * 64), T, "64 characters are 64 code points, not UTF-16 units"),
    (trade(trade_id="😀" * 65), D, "...and 65 are too many"),
    (trade(buyer="A\\B"), T, "a backslash, which COPY must escape"),
    (trade(buyer="\\N"), T, "what COPY would read as NULL unescaped"),
    (trade(symbol="Ünïcødé"), T, "non-ASCII letters"),
    (trade(symbol="A\u00a0B"), T, "a no-break space is printable here"),
    (trade(symbol="A\u2028B"), T, "a line separator is not a control character"),
    (trade(symbol="A\ufeffB"), T, "a zero-width no-break space"),
    (trade(symbol="A\uffffB"), T, "a noncharacter"),
    (trade(symbol="\U0010ffff"), T, "the last code point"),
    (trade(symbol="A\u0000B"), D, "NUL, which PostgreSQL text cannot hold"),
    (trade(symbol="A\tB"), D, "a tab, the COPY delimiter"),
    (trade(symbol="A\nB"), D, "a newline, the COPY row end"),
    (trade(symbol="A\rB"), D, "a carriage return"),
    (trade(symbol="A\x1fB"), D, "the last C0 control"),
    (trade(symbol="A\x7fB"), D, "DEL"),
    (trade(symbol="A\x85B"), D, "a C1 control (NEL)"),
    (trade(symbol="A\x9fB"), D, "the last C1 control"),
    (trade(symbol="A\xa0"), T, "the first character after C1"),
    (trade(symbol=" "), T, "a space is printable"),
    # Broken UTF-8.
    (trade().replace(b"AAPL", b"AA\xffPL"), D, "an invalid byte"),
    (trade().replace(b"AAPL", b"AA\xc3PL"), D, "a truncated sequence"),
    (trade().replace(b"AAPL", b"AA\xc0\x80PL"), D, "an overlong NUL"),
    (trade().replace(b"AAPL", b"AA\xed\xa0\x80PL"), D, "an encoded surrogate"),
    (trade().replace(b"AAPL", b"AA\xf4\x90\x80\x80PL"), D, "past U+10FFFF"),
    (with_extra(("x", '"\xff"')).replace(b"\xc3\xbf", b"\xff"), D, "bad UTF-8 in an extra field"),
    # Text fields: type, length.
    (trade(trade_id=...), D, "missing trade_id"),
    (trade(trade_id=""), D, "empty trade_id"),
    (trade(trade_id=17), D, "trade_id as a number"),
    (trade(trade_id=True), D, "trade_id as a boolean"),
    (trade(trade_id=None), D, "trade_id null"),
    (trade(trade_id=["T1"]), D, "trade_id as an array"),
    (trade(trade_id={"id": "T1"}), D, "trade_id as an object"),
    (trade(symbol="S" * C.SYMBOL.max_length), T, "symbol at its maximum length"),
    (trade(symbol="S" * (C.SYMBOL.max_length + 1)), D, "symbol one character too long"),
    (trade(trade_id="I" * C.TRADE_ID.max_length), T, "trade_id at its maximum length"),
    (trade(trade_id="I" * (C.TRADE_ID.max_length + 1)), D, "trade_id one too long"),
    (trade(buyer="B" * (C.BUYER.max_length + 1)), D, "buyer one too long"),
    (trade(seller="S" * (C.SELLER.max_length + 1)), D, "seller one too long"),
    (trade(seller=12), D, "seller as a number"),
    (trade(seller="ACC0001"), D, "buyer equals seller"),
    (trade(seller="acc0001"), T, "accounts are case-sensitive"),
    (trade_tok(seller='"ACC\\u0030001"'), D, "buyer equals seller once unescaped"),
    # trade_date.
    (trade(trade_date="2000-01-01"), T, "the first day of the window"),
    (trade(trade_date="2099-12-31"), T, "the last day of the window"),
    (trade(trade_date="1999-12-31"), D, "before the window"),
    (trade(trade_date="2100-01-01"), D, "after the window"),
    (trade(trade_date="2024-02-29"), T, "a leap day"),
    (trade(trade_date="2026-02-29"), D, "no leap day that year"),
    (trade(trade_date="2026-04-31"), D, "April has 30 days"),
    (trade(trade_date="2026-13-01"), D, "month 13"),
    (trade(trade_date="2026-00-10"), D, "month 0"),
    (trade(trade_date="2026-11-00"), D, "day 0"),
    (trade(trade_date="2026-1-5"), D, "no zero padding"),
    (trade(trade_date="20261123"), D, "ISO basic format"),
    (trade(trade_date="2026-W48-1"), D, "an ISO week date"),
    (trade(trade_date="2026-11-23T00:00:00"), D, "a timestamp"),
    (trade(trade_date="2026-11-23\n"), D, "a trailing newline ($ in Java would allow it)"),
    (trade(trade_date=" 2026-11-23"), D, "a leading space (Spark's cast would trim it)"),
    (trade(trade_date="２０２６-11-23"), D, "full-width digits (\\d in Python would allow them)"),
    (trade(trade_date=20261123), D, "a number"),
    # executed_at.
    (trade(executed_at="2026-11-23T14:30:00Z"), T, "no fraction"),
    (trade(executed_at="2026-11-23T14:30:00.5Z"), T, "one fraction digit"),
    (trade(executed_at="2026-11-23T14:30:00+05:30"), T, "an offset, converted to UTC"),
    (trade(executed_at="2026-11-23T14:30:00-00:00"), T, "minus zero"),
    (trade(executed_at="2026-11-23T14:30:00+14:59"), T, "the largest offset"),
    (trade(executed_at="2000-01-01T00:00:00+14:00"), T, "an instant before the date window"),
    (trade(executed_at="2099-12-31T23:59:59.999999-14:59"), T, "and after it"),
    (trade(executed_at="2026-11-23T14:30:00+15:00"), D, "an offset PostgreSQL refuses"),
    (trade(executed_at="2026-11-23T14:30:00"), D, "no zone (Spark would read it as UTC)"),
    (trade(executed_at="2026-11-23T14:30:00z"), D, "a lower-case z"),
    (trade(executed_at="2026-11-23 14:30:00Z"), D, "a space for the T"),
    (trade(executed_at="2026-11-23T14:30Z"), D, "no seconds"),
    (trade(executed_at="2026-11-23T14:30:00.1234567Z"), D, "seven fraction digits"),
    (trade(executed_at="2026-11-23T14:30:00,5Z"), D, "a decimal comma"),
    (trade(executed_at="2026-11-23T23:59:60Z"), D, "a leap second"),
    (trade(executed_at="2026-11-23T24:00:00Z"), D, "hour 24"),
    (trade(executed_at="2026-11-23T14:30:00+0530"), D, "an offset without a colon"),
    (trade(executed_at="2026-11-23T14:30:00+05"), D, "an offset without minutes"),
    (trade(executed_at="2026-02-30T14:30:00Z"), D, "no calendar day"),
    (trade(executed_at="1999-12-31T14:30:00Z"), D, "a year before the window"),
    (trade(executed_at="2026-11-23T14:30:00Z\n"), D, "a trailing newline"),
    (trade(executed_at=1795428000), D, "epoch seconds"),
    # price.
    (trade(price="0.0001"), T, "the smallest price"),
    (trade(price="99999999999999.9999"), T, "the largest price"),
    (trade(price="1"), T, "no decimals"),
    (trade(price="0.5"), T, "a zero integer part"),
    (trade(price="10.10"), T, "trailing zeros are fine"),
    (trade(price="007.5"), D, "leading zeros"),
    (trade(price="00.5"), D, "two zeros before the point"),
    (trade(price="123456789012345"), D, "15 integer digits"),
    (trade(price="1.23456"), D, "five decimals"),
    (trade(price="0"), D, "zero"),
    (trade(price="0.0000"), D, "zero with decimals"),
    (trade(price="-1.5"), D, "negative"),
    (trade(price="+1.5"), D, "a plus sign"),
    (trade(price=" 1.5"), D, "a leading space"),
    (trade(price="1.5\n"), D, "a trailing newline"),
    (trade(price="1."), D, "a point without decimals"),
    (trade(price=".5"), D, "no integer part"),
    (trade(price="1e3"), D, "an exponent"),
    (trade(price="1,234.5"), D, "a thousands separator"),
    (trade(price="NaN"), D, "NaN"),
    (trade(price="１"), D, "a full-width digit"),
    (trade(price=187.25), D, "a JSON number: it went through binary floating point"),
    (trade(price=187), D, "a JSON integer"),
    (trade(price=None), D, "null"),
    # Integers.
    (trade(seq=C.MAX_SEQ), T, "seq at its maximum"),
    (trade(seq=C.MAX_SEQ + 1), D, "seq past its maximum"),
    (trade(quantity=C.MAX_QUANTITY), T, "quantity at its maximum"),
    (trade(quantity=C.MAX_QUANTITY + 1), D, "quantity past its maximum"),
    (trade(seq=0), D, "seq zero"),
    (trade(quantity=-5), D, "a negative quantity"),
    (trade_tok(seq="-0"), D, "minus zero"),
    (trade(seq=True), D, "true is not 1"),
    (trade_tok(seq="1.0"), D, "a float with an integral value"),
    (trade_tok(quantity="10.0"), D, "a float quantity"),
    (trade_tok(seq="1e2"), D, "an exponent"),
    (trade(seq="1"), D, "a string"),
    (trade(seq=2**63 - 1), D, "bigint's maximum, past the contract's"),
    (trade(seq=2**63), D, "past bigint"),
    (trade(seq=2**64), D, "past unsigned 64 bits (orjson reads it as a float)"),
    (trade_tok(seq="1" + "0" * 400), D, "400 digits"),
    # Numbers anywhere must be finite and not too long.
    (with_extra(("x", "1e308")), T, "a large finite double"),
    (with_extra(("x", "1.7976931348623157e308")), T, "the largest double"),
    (with_extra(("x", "1.7976931348623158e308")), T, "rounds down to the largest double"),
    (with_extra(("x", "1.7976931348623159e308")), D, "rounds up to infinity"),
    (with_extra(("x", "1e400")), D, "infinite as a double"),
    (with_extra(("x", "-1e400")), D, "minus infinity"),
    (with_extra(("x", "1e-400")), T, "underflows to zero, which is finite"),
    (with_extra(("x", "9" * 309)), D, "309 digits of nines overflow"),
    (with_extra(("x", str(2**1023))), T, "a 308-digit integer"),
    (with_extra(("x", "0." + "0" * (C.MAX_NUMBER_LENGTH - 3) + "1")), T,
     "a number of MAX_NUMBER_LENGTH characters"),
    (with_extra(("x", "0." + "0" * (C.MAX_NUMBER_LENGTH - 2) + "1")), D, "one character more"),
    (with_extra(("x", "-0." + "0" * (C.MAX_NUMBER_LENGTH - 3) + "1")), D,
     "the sign counts as a character"),
    (with_extra(("x", "0." + "0" * 1500 + "1")), D, "a number Jackson itself refuses"),
    # Long keys (Jackson's limit, in UTF-16 units).
    (with_extra(("k" * C.MAX_KEY_LENGTH, "1")), T, "a key at the limit"),
    (with_extra(("k" * (C.MAX_KEY_LENGTH + 1), "1")), D, "a key one character longer"),
    (with_extra(("😀" * (C.MAX_KEY_LENGTH // 2), "1")), T, "UTF-16 units: pairs at the limit"),
    (with_extra(("😀" * (C.MAX_KEY_LENGTH // 2 + 1), "1")), D, "pairs just past it"),
    # Size.
    (padded(MAX_BYTES), T, "exactly the size limit"),
    (padded(MAX_BYTES + 1), D, "one byte over it"),
]


def gateway_malformed() -> list[tuple[Msg | bytes | None, str, str]]:
    """Every kind of bad message the simulated exchange gateway injects ('oversized' is about
    the configured size limit, which ``padded`` probes at this test's limit)."""
    rng = random.Random(7)
    trade_ = next(iter(DayGenerator(SimulationSpec("2026-11-23", 10), 6).trades()))
    return [(Msg(malformed_message(kind, trade_, rng), TYPE_TRADE, trade_.partition), D,
             f"the gateway's {kind} message") for kind in MALFORMED_KINDS if kind != "oversized"]


def corpus_messages() -> list[tuple[Msg, str, str]]:
    return [(m if isinstance(m, Msg) else Msg(m), want, note)
            for m, want, note in [*CORPUS, *gateway_malformed()]]


def test_corpus_verdicts_agree(spark: SparkSession) -> None:  # noqa: F811
    cases = corpus_messages()
    verdicts = assert_parity(spark, [m for m, _, _ in cases])
    wrong = [f"{note}: expected {want}, got {v!r} for {_show(m)}"
             for (m, want, note), v in zip(cases, verdicts, strict=True) if v[0] != want]
    assert not wrong, "\n".join(wrong)


def test_the_python_row_hash_is_sparks_with_missing_fields_left_out(spark: SparkSession  # noqa: F811
                                                                      ) -> None:
    """``row_hashes`` (the Kafka classifier's) against Spark's ``row_hash`` on rows the
    corpus has none of: a cancel's row (id, date and seq only), a date before 1970, a price
    below one unit, non-ASCII text, the largest values."""
    at = dt.datetime(2026, 11, 23, 14, 30, 0, 1, tzinfo=dt.UTC)
    rows = [
        ("T1", dt.date(2026, 11, 23), 1, 0, 0, "AAPL", Decimal("187.2500"), 100, "B", "S", at),
        ("T2", dt.date(2026, 11, 23), 2, 5, 9, None, None, None, None, None, None),
        ("T3", dt.date(1969, 12, 31), C.MAX_SEQ, 11, 1, "Ä€", Decimal("0.0001"),
         C.MAX_QUANTITY, "买方", "S", EPOCH - dt.timedelta(microseconds=1)),
        ("T4", dt.date(2026, 1, 2), 3, 1, 2, "X", Decimal("99999999999999.9999"), 1, "B",
         "S", at),
    ]
    hi, lo = row_hash()
    want = [(r["hi"], r["lo"]) for r in spark.createDataFrame(rows, TRADE_SCHEMA).select(
        hi.alias("hi"), lo.alias("lo")).collect()]
    units = [None if r[6] is None else int(r[6] * 10_000) for r in rows]
    micros = [None if r[10] is None else (r[10] - EPOCH) // dt.timedelta(microseconds=1)
              for r in rows]
    got = row_hashes([r[0] for r in rows], [(r[1] - dt.date(1970, 1, 1)).days for r in rows],
                     [r[2] for r in rows], [r[3] for r in rows], [r[5] for r in rows], units,
                     [r[7] for r in rows], [r[8] for r in rows], [r[9] for r in rows], micros)
    assert list(zip(*(h.to_pylist() for h in got), strict=True)) == want
    none = row_hashes(pa.array([None], pa.string()), [1], [1], [0], ["A"], [1], [1], ["B"],
                      ["S"], [1])
    assert [h.to_pylist() for h in none] == [[None], [None]]


# -- (b) property-based adversarial batches --------------------------------------------------
# Hypothesis draws pools of field values (valid ones and adversarial ones, per field); a
# builder seeded by hypothesis assembles a batch of thousands of messages from them, each a
# valid trade or close marker, mutated or not. Drawing every message through hypothesis would
# exceed its per-example data budget long before a batch is big enough to be worth a Spark
# job. The strategies and the builder live in tests/strategies.py (the end-to-end ingest test,
# tests/test_ingest_property.py, publishes the same messages to a real broker).

BATCH = 2_000
EXAMPLES = 5


def test_adversarial_batches_agree(spark: SparkSession) -> None:  # noqa: F811
    seen: list[int] = []
    outcomes: dict[str, int] = {}

    @settings_(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        # A counterexample is a list of disagreeing messages, printed by assert_parity;
        # shrinking a batch of thousands would cost a Spark job per attempt.
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                               HealthCheck.large_base_example],
    )
    @given(pool=pools(), seed=st.integers(0, 2**32 - 1))
    def check(pool: dict[str, Any], seed: int) -> None:
        builder = Builder(pool, seed)
        msgs = [builder.message() for _ in range(BATCH)]
        for verdict in assert_parity(spark, msgs):
            outcomes[verdict[0]] = outcomes.get(verdict[0], 0) + 1
        seen.append(len(msgs))

    check()
    assert sum(seen) >= 10_000
    # The batches exercise every outcome, valid trades in quantity.
    assert outcomes.get(T, 0) > sum(seen) // 5 and outcomes.get(X, 0) > 0, outcomes
    assert outcomes.get(D, 0) > sum(seen) // 5, outcomes


# -- (c) what the contract accepts, the ledger stores ----------------------------------------


def store_and_read_back(spark: SparkSession, dsn: str, msgs: Sequence[Msg],  # noqa: F811
                        verdicts: Sequence[Verdict]) -> None:
    """Write the accepted trades the way a site does (its COPY into the per-session staging
    table, its ``insert_staged`` into ``trades``; sql/queries/ingest.sql) and the accepted
    close markers into ``close_markers``, and check the ledger holds exactly the values both
    parsers read. One COPY for all: a value PostgreSQL refused would fail the test.

    Then validation's checksums: the figures PostgreSQL takes of the stored day
    (``day_figures``) are the figures Spark takes of the same trades as its parser typed
    them, on every date, so a reconciliation by checksums never differs on a good day."""
    lines, trades, markers = [], {}, {}
    for offset, (m, (kind, values)) in enumerate(zip(msgs, verdicts, strict=True)):
        if kind == T:
            lines.append(trade_copy_line(decode(m.value, MAX_BYTES), m.partition, offset, "a"))
            trades.setdefault(values[0], values)  # a repeated trade_id: the first one stays
        elif kind == X:
            markers.setdefault(values[:2], (*values, offset))
    assert trades and markers
    columns = ", ".join(C.LEDGER_COLUMNS)
    with psycopg.connect(dsn) as conn, conn.cursor() as cur:
        cur.execute(q("ingest", "create_stage"))
        with cur.copy(f"copy trades_stage ({', '.join(C.STAGE_COLUMNS)}) from stdin") as copy:
            copy.write("".join(lines))
        assert cur.rowcount == len(lines)
        # Each date's partition of `trades`, as a site makes it (consumers.ledger._partitions):
        # the corpus's dates run to the contract's bounds.
        days = [r[0] for r in cur.execute("select distinct trade_date from trades_stage")]
        cur.execute(q("ingest", "ensure_partitions"), {"days": days})
        cur.execute(q("ingest", "insert_staged"))
        assert cur.rowcount == len(trades)
        cur.executemany(
            "insert into close_markers (trade_date, kafka_partition, last_seq, kafka_offset,"
            " site) values (%s, %s, %s, %s, 'a')", list(markers.values()))
        stored = {r[0]: (*r[:-1], _micros(r[-1]))
                  for r in cur.execute(f"select {columns} from trades")}  # type: ignore[call-overload]
        assert stored == trades
        rows = cur.execute("select trade_date, kafka_partition, last_seq from close_markers")
        assert {(d, p): (d, p, s) for d, p, s in rows} == {
            k: v[:3] for k, v in markers.items()}
        typed = [(*v[:-1], EPOCH + dt.timedelta(microseconds=v[-1])) for v in trades.values()]
        by_spark = {(int(r[0]), int(r[1])): (int(r[2]), int(r[3]), int(r[4]))
                    for r in figures(spark.createDataFrame(typed, TRADE_SCHEMA)).select(
                        "kafka_partition", "bucket", "trades", "row_hi", "row_lo").collect()}
        dates = {v[1] for v in trades.values()}
        by_pg: dict[tuple[int, int], tuple[int, int, int]] = {}
        for d in sorted(dates):
            for r in cur.execute(q("ledger", "day_figures"),
                                 {"trade_date": d, "bucket_seqs": BUCKET_SEQS}):
                key = (int(r[0]), int(r[1]))
                n, hi, lo = by_pg.get(key, (0, 0, 0))
                by_pg[key] = (n + int(r[2]), hi + int(r[3]), lo + int(r[4]))
        assert by_spark == by_pg
        # Without the row sums (a copy nothing is compared with): the same counts, seq
        # ranges and seq sums, and NULL row sums, which equal no copy's figures.
        full, bare = (figures(spark.createDataFrame(typed, TRADE_SCHEMA), rows=r).orderBy(
            "kafka_partition", "bucket").collect() for r in (True, False))
        assert [tuple(r)[:7] for r in bare] == [tuple(r)[:7] for r in full]
        assert {(r["row_hi"], r["row_lo"]) for r in bare} == {(None, None)}
        conn.rollback()


@pytest.mark.services
def test_the_ledger_stores_what_the_contract_accepts(spark: SparkSession, isolated: Any) -> None:  # noqa: F811
    settings = isolated.settings
    # The corpus, and one generated batch.
    corpus = [m for m, _, _ in corpus_messages()]
    store_and_read_back(spark, settings.ledger_dsn("a"), corpus, assert_parity(spark, corpus))

    @settings_(max_examples=1, deadline=None, database=None, phases=[Phase.generate],
               suppress_health_check=list(HealthCheck))
    @given(pool=pools(), seed=st.integers(0, 2**32 - 1))
    def generated(pool: dict[str, Any], seed: int) -> None:
        builder = Builder(pool, seed)
        msgs = [builder.message() for _ in range(BATCH)]
        store_and_read_back(spark, settings.ledger_dsn("a"), msgs, assert_parity(spark, msgs))

    generated()
