"""One contract, two parsers: the consumer sites' Python parser (``consumers.parse``) and the
Spark Kafka reader (``settlement.spark.parse``) must give every message the same verdict.

A verdict is the kind (trade, close marker, dead letter) and, for an accepted message, the
typed values. The reasons may be worded differently. Three tests:

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
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from consumers.parse import Malformed, close_marker, decode, message_type, trade_copy_line
from settlement import contract as C
from settlement.spark.parse import classify_kafka_values
from tests.spark_fixtures import spark  # noqa: F401

# Large enough for the key-length limit (a 50,000-character key needs a value that long).
MAX_BYTES = 64 * 1024
RAW_SCHEMA = (
    "key binary, value binary, partition int, offset long, "
    "headers array<struct<key:string,value:binary>>"
)
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
Headers = tuple[tuple[str, bytes | None], ...] | None
TYPE_TRADE: Headers = ((C.TYPE_HEADER, C.TRADE.encode()),)
TYPE_CLOSE: Headers = ((C.TYPE_HEADER, C.CLOSE.encode()),)


@dataclass(frozen=True)
class Msg:
    """One Kafka record as both parsers receive it."""

    value: bytes | None
    headers: Headers = TYPE_TRADE
    partition: int = 0


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


def spark_verdicts(spark: SparkSession, msgs: Sequence[Msg]) -> list[Verdict]:
    """The Spark classifier's verdicts, in one job."""
    rows = [
        (b"k", m.value, m.partition, offset, list(m.headers) if m.headers is not None else None)
        for offset, m in enumerate(msgs)
    ]
    out = classify_kafka_values(spark.createDataFrame(rows, RAW_SCHEMA), MAX_BYTES).select(
        "kafka_offset", "reason", "_kind", "trade_id", "trade_date", "seq", "kafka_partition",
        "symbol", "price", "quantity", "buyer", "seller",
        F.unix_micros("executed_at").alias("executed_at"), "_close_date", "_last_seq",
    )  # fmt: skip
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


def assert_parity(spark: SparkSession, msgs: Sequence[Msg]) -> list[Verdict]:
    """Both parsers agree on every message; returns the (Python) verdicts."""
    sparks = spark_verdicts(spark, msgs)
    pythons = [python_verdict(m, offset) for offset, m in enumerate(msgs)]
    diffs = []
    for offset, (m, p, s) in enumerate(zip(msgs, pythons, sparks, strict=True)):
        same = p[0] == s[0] and (p[0] == "dead" or p[1] == s[1])
        if not same:
            diffs.append(f"#{offset} {_show(m)}\n    python: {p!r}\n    spark:  {s!r}")
    assert not diffs, f"{len(diffs)} of {len(msgs)} messages disagree:\n" + "\n".join(diffs[:12])
    return pythons


# -- building messages -----------------------------------------------------------------------


def jstr(s: str, escape: Callable[[str], bool] = lambda ch: False, upper: bool = False) -> str:
    """A JSON string literal; control characters and the chosen ones as \\u escapes."""
    out = ['"']
    for ch in s:
        o = ord(ch)
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif o < 0x20 or escape(ch):
            units = [o] if o <= 0xFFFF else [0xD800 + ((o - 0x10000) >> 10),
                                             0xDC00 + ((o - 0x10000) & 0x3FF)]
            out.extend(f"\\u{u:04X}" if upper else f"\\u{u:04x}" for u in units)
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


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
