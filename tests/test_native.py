"""Plain trades classified inside the JVM (issue 44, item 3): the native path
(``settlement.spark.native``) gives every message the Python classifier's verdict and values.

Each test runs ``classify_kafka_values`` with the native path on and off on the same frame and
requires the same row, every column, for every message; and counts the Kafka partitions the
native path took, so that a corpus that never reached it cannot pass for parity. A looser
pattern (a zero price let through) must make the parity check fail.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Sequence
from typing import Any

import pytest
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import BinaryType, BooleanType, DateType, LongType

from consumers.parse import Malformed, _is_date, decode, fast_trade, trade_values
from settlement import contract as C
from settlement.spark import jvmclassify, native
from settlement.spark.canonical import (
    CALENDAR_DATE,
    CANONICAL_PRICE,
    CLOSE_PATTERN,
    TRADE_CAPTURE,
    TRADE_PATTERN,
    anchored,
)
from settlement.spark.deferred import resolve_deferred
from settlement.spark.parse import (
    CLASSIFIED_SCHEMA,
    classify_kafka_values,
    first_copies,
    split_classified,
    stage,
)
from settlement.spark.readfacts import count_rows, decided_rows, facts_of, pass_facts
from settlement.spark.schemas import AMENDMENT_SCHEMA
from settlement.spark.session import local_frame
from settlement.spark.settle import amended_trades
from tests.spark_fixtures import spark  # noqa: F401
from tests.test_parity import CORPUS, close, corpus_messages, trade

RAW_SCHEMA = ("key binary, value binary, partition int, offset long, "
              "headers array<struct<key:string,value:binary>>")
MAX_BYTES = 16_384
TRADE_H, CLOSE_H = C.TRADE.encode(), C.CLOSE.encode()
# (partition, value, type header or None for no header); offsets are given per partition.
Message = tuple[int, bytes | None, bytes | None]


def _rows(msgs: Sequence[Message]) -> list[tuple[Any, ...]]:
    next_offset: dict[int, int] = {}
    out = []
    for p, value, kind in msgs:
        o = next_offset.get(p, 0)
        next_offset[p] = o + 1
        out.append((b"k", value, p, o, None if kind is None else [(C.TYPE_HEADER, kind)]))
    return out


def native_partitions(session: SparkSession, msgs: Sequence[Message],
                      max_bytes: int = MAX_BYTES) -> set[int]:
    frame = stage(session.createDataFrame(_rows(msgs), RAW_SCHEMA))
    return {r[0] for r in frame.groupBy("kafka_partition").agg(
        F.min(native.native_message(max_bytes).cast("int")).alias("n")).where("n = 1")
        .select("kafka_partition").collect()}


def jvm_partitions(session: SparkSession, msgs: Sequence[Message],
                   max_bytes: int = MAX_BYTES) -> set[int]:
    """The Kafka partitions the JVM classifier kept: read once, their deferred messages
    decided in the driver (not given back to the Python worker whole)."""
    frame = stage(session.createDataFrame(_rows(msgs), RAW_SCHEMA).coalesce(1))
    verdicts = jvmclassify.classify_jvm(frame, max_bytes).persist()
    try:
        given = resolve_deferred(verdicts, max_bytes, lambda parts: session
                                             .createDataFrame([], CLASSIFIED_SCHEMA)).workers
        return {p for p, _, _ in msgs} - set(given)
    finally:
        verdicts.unpersist()


def differences(session: SparkSession, msgs: Sequence[Message],
                max_bytes: int = MAX_BYTES, mode: str = "native") -> list[str]:
    """Every message whose row differs between the native path (``mode``: Spark's
    expressions, or "jvm", the compiled classifier) and the Python classifier."""
    # One task, each partition's messages in offset order, as a Kafka partition is read.
    frame = session.createDataFrame(_rows(msgs), RAW_SCHEMA).coalesce(1)

    def rows(on: str) -> dict[tuple[int, int], Row]:
        cached: list[DataFrame] = []  # the native path's staged read, cached as a close does

        def keep(df: DataFrame) -> DataFrame:
            cached.append(df.persist())
            return cached[-1]

        got = classify_kafka_values(frame, max_bytes, native=on == "native",
                                    jvm=on == "jvm", cache=keep).collect()
        for df in cached:
            df.unpersist()
        return {(r["kafka_partition"], r["kafka_offset"]): r for r in got}

    fast, slow = rows(mode), rows("python")
    assert len(fast) == len(slow) == len(msgs)
    return [f"{k}: {mode} {fast[k]!r}\n    python {slow[k]!r}"
            for k in sorted(slow) if fast[k].asDict() != slow[k].asDict()]


def assert_parity(session: SparkSession, msgs: Sequence[Message], min_native: int,
                  max_bytes: int = MAX_BYTES) -> None:
    for mode in ("native", "jvm"):
        diffs = differences(session, msgs, max_bytes, mode)
        assert not diffs, f"{len(diffs)} of {len(msgs)} differ:\n" + "\n".join(diffs[:10])
    took = native_partitions(session, msgs, max_bytes)
    assert len(took) >= min_native, f"only partitions {sorted(took)} were native"
    # The compiled classifier keeps every partition Spark's expressions take whole, and more:
    # those whose unusual messages it defers without their changing its state.
    assert jvm_partitions(session, msgs, max_bytes) >= took


# -- hostile near-canonical values ------------------------------------------------------------
def _swap(raw: bytes, old: str, new: str) -> bytes:
    assert old.encode() in raw, (old, raw)
    return raw.replace(old.encode(), new.encode(), 1)


BASE = trade()
NEAR: list[tuple[bytes | None, bool, str]] = [  # (value, native, what it probes)
    (BASE, True, "the gateway's compact trade"),
    (trade(price="187.25"), True, "a shorter price"),
    (trade(price="0.0001"), True, "the smallest price"),
    (trade(price="99999999999999.9999"), True, "the largest price"),
    (trade(seq=C.MAX_SEQ), True, "the largest seq"),
    (trade(seq=C.MAX_SEQ + 1), False, "seq past the contract"),
    (trade(quantity=C.MAX_QUANTITY), True, "the largest quantity"),
    (trade(quantity=C.MAX_QUANTITY + 1), False, "quantity past the contract"),
    (trade(quantity=0), False, "quantity zero"),
    (trade(quantity=-1), False, "negative quantity"),
    (_swap(BASE, '"seq":1,', '"seq":01,'), False, "seq with a leading zero"),
    (_swap(BASE, '"seq":1,', '"seq":1.0,'), False, "seq as a float"),
    (_swap(BASE, '"seq":1,', '"seq":1e0,'), False, "seq with an exponent"),
    (_swap(BASE, '"quantity":100,', '"quantity":1E2,'), False, "quantity with an exponent"),
    (trade(price="187.25000"), False, "five decimals"),
    (trade(price="01.5"), False, "a price with a leading zero"),
    (trade(price="1.5e2"), False, "a price with an exponent"),
    (trade(price=".5"), False, "no integer digit"),
    (trade(price="5."), False, "no decimal digit"),
    (trade(price="-1"), False, "a negative price"),
    (trade(price="0"), False, "zero"),
    (trade(price="0.0000"), False, "zero with decimals"),
    (_swap(BASE, '"price":"187.2500"', '"price":187.25'), False, "a price as a number"),
    (trade(buyer="ACC0002"), False, "buyer equals seller"),
    (trade(trade_date="2026-02-30"), False, "30 February"),
    (trade(trade_date="2026-02-29"), False, "29 February of a common year"),
    (trade(trade_date="2028-02-29"), True, "29 February of a leap year"),
    (trade(trade_date="2000-02-29"), True, "29 February 2000"),
    (trade(trade_date="2026-04-31"), False, "31 April"),
    (trade(trade_date="2026-12-31"), True, "31 December"),
    (trade(trade_date="2100-01-01"), False, "past the window"),
    (trade(trade_date="1999-12-31"), False, "before the window"),
    (trade(executed_at="2026-02-30T14:30:00Z"), False, "executed on 30 February"),
    (trade(executed_at="2028-02-29T14:30:00Z"), True, "executed on a leap day"),
    (trade(executed_at="2026-11-23T15:30:00+01:00"), True, "a zone offset"),
    (trade(executed_at="2026-11-23T00:30:00-14:59"), True, "the largest negative offset"),
    (trade(executed_at="2026-11-23T14:30:00+15:00"), False, "an offset of 15 h"),
    (trade(executed_at="2026-11-23T24:00:00Z"), False, "hour 24"),
    (trade(executed_at="2026-11-23T23:59:60Z"), False, "a leap second"),
    (trade(executed_at="2026-11-23T14:30:00.1234567Z"), False, "seven decimals"),
    (trade(executed_at="2026-11-23T14:30:00z"), False, "a lower-case zone"),
    (trade(executed_at="2026-11-23 14:30:00Z"), False, "a space for the T"),
    (trade(executed_at="2026-11-23T14:30Z"), False, "no seconds"),
    (trade(executed_at="2026-11-23T14:30:00"), False, "no zone"),
    (trade(trade_id=""), False, "an empty id"),
    (trade(trade_id="x" * 64), True, "the longest id"),
    (trade(trade_id="x" * 65), False, "an id too long"),
    (trade(symbol="S" * 33), False, "a symbol too long"),
    (trade(trade_id="it's"), True, "an id with a quote (its repr has double quotes)"),
    (trade(symbol="A B~!#$%&()*+,-./:;<=>?@[]^_`{|}"), True, "printable ASCII punctuation"),
    (trade(symbol="Ä"), False, "non-ASCII text: Python's"),
    (trade(symbol="A\u00a0B"), False, "a no-break space"),
    (trade(symbol="A\x85B"), False, "a C1 control character, escaped"),
    (_swap(BASE, '"AAPL"', '"AA\x01PL"'), False, "a raw control character"),
    (_swap(BASE, '"AAPL"', '"AA\tPL"'), False, "a raw tab"),
    (_swap(BASE, '"AAPL"', '"AA\x7fPL"'), False, "a raw DEL"),
    (_swap(BASE, '"AAPL"', '"\\u0041APL"'), False, "a unicode escape of a letter"),
    (_swap(BASE, '"AAPL"', '"AA\\"PL"'), False, "an escaped quote"),
    (_swap(BASE, '"AAPL"', '"AA\\\\PL"'), False, "an escaped backslash"),
    (_swap(BASE, '"AAPL"', '"\\ud800"'), False, "a lone surrogate escape"),
    (_swap(BASE, '"AAPL"', '"AA\xffPL"'), False, "invalid UTF-8"),
    (b"\xef\xbb\xbf" + BASE, False, "a byte order mark"),
    (BASE + b"\n", False, "a final newline (Java's $ would match before it)"),
    (b" " + BASE, False, "leading whitespace"),
    (_swap(BASE, '","trade_date"', '", "trade_date"'), False, "a space after a comma"),
    (_swap(BASE, '"seq":1,', '"seq": 1,'), False, "a space after a colon"),
    (_swap(BASE, '"seq":1,', '"seq":1,"seq":1,'), False, "a repeated key, same value"),
    (_swap(BASE, '"seq":1,', '"seq":2,"seq":1,'), False, "a repeated key, another value"),
    (_swap(BASE, '"seq":1,"symbol":"AAPL",', '"symbol":"AAPL","seq":1,'), False,
     "fields reordered"),
    (_swap(BASE, '"executed_at"', '"x":1,"executed_at"'), False, "an extra field"),
    (_swap(BASE, ',"seller":"ACC0002"', ""), False, "a missing field"),
    (_swap(BASE, '"trade_id"', '"Trade_id"'), False, "a key's case"),
    (BASE + BASE, False, "two objects"),
    (BASE[:-1], False, "truncated"),
    (b"", False, "empty"),
    (None, False, "null"),
]
CLOSES: list[tuple[bytes, bool, str]] = [
    (close(), True, "a compact close marker"),
    (json.dumps({"trade_date": "2026-11-23", "partition": 0, "last_seq": 7}).encode(), True,
     "json.dumps' separators (the gateway's)"),
    (close(last_seq=0), True, "an empty partition's marker"),
    (close(last_seq=C.MAX_SEQ + 1), False, "last_seq past the contract"),
    (close(partition=3), False, "another partition's marker"),
    (close(trade_date="2026-02-30"), False, "30 February"),
    (_swap(close(), '"last_seq":120', '"last_seq":0120'), False, "a leading zero"),
    (_swap(close(), '}', ',"amended":1}'), False, "an amended close"),
    (_swap(close(), '"last_seq":120', '"last_seq":120,"last_seq":121'), False,
     "a repeated key"),
    (close() + b"\n", False, "a final newline"),
]


def test_the_calendar_date_pattern_is_the_parsers_calendar() -> None:
    """Every YYYY-MM-DD of the contract's pattern, 2000-2099: a calendar date exactly when
    the Python parser's check says so."""
    cal = re.compile(CALENDAR_DATE)
    for y in range(1999, 2101):
        for m in range(0, 14):
            for d in range(0, 33):
                text = f"{y:04d}-{m:02d}-{d:02d}"
                assert (cal.fullmatch(text) is not None) == _is_date(text), text


def test_a_canonical_value_is_one_the_python_parser_accepts_with_the_same_fields() -> None:
    pattern = re.compile(TRADE_PATTERN)
    for value, is_native, note in NEAR:
        matches = value is not None and pattern.fullmatch(value.decode("utf-8", "replace"))
        if is_native:
            assert matches, note
            assert fast_trade(value, MAX_BYTES) == tuple(trade_values(decode(value, MAX_BYTES))
                                                         ), note
        elif matches:
            # The pattern leaves the numeric bounds and buyer <> seller to expressions.
            with pytest.raises(Malformed, match=r"^(seq|quantity) must be in|^buyer equals"):
                trade_values(decode(value, MAX_BYTES))
    closes = re.compile(CLOSE_PATTERN)
    assert all(closes.fullmatch(v.decode()) for v, ok, _ in CLOSES if ok)


def test_hostile_near_canonical_values_get_the_python_verdicts(spark: SparkSession  # noqa: F811
                                                               ) -> None:
    """Each value alone in a partition (native or not as listed), then all of them in one
    partition (which the Python classifier takes whole)."""
    alone: list[Message] = [(i, v, TRADE_H) for i, (v, _, _) in enumerate(NEAR)]
    n = len(alone)
    alone += [(n + i, _swap(v, '"partition":0', f'"partition":{n + i}')
               if b'"partition":0' in v else v.replace(b'"partition": 0',
                                                       f'"partition": {n + i}'.encode()), CLOSE_H)
              for i, (v, _, _) in enumerate(CLOSES)]
    took = native_partitions(spark, alone)
    want = {i for i, (_, ok, _) in enumerate(NEAR) if ok}
    want |= {n + i for i, (_, ok, _) in enumerate(CLOSES) if ok}
    assert took == want, (sorted(took - want), sorted(want - took))
    assert_parity(spark, alone, min_native=len(want))
    assert_parity(spark, [(0, v, TRADE_H) for v, _, _ in NEAR], min_native=0)


def test_the_parity_corpus_gets_the_python_verdicts(spark: SparkSession) -> None:  # noqa: F811
    """tests/test_parity.py's corpus, each message in a partition of its own and in one."""
    msgs = corpus_messages()
    kinds = [dict(m.headers).get(C.TYPE_HEADER) if m.headers is not None else None
             for m, _, _ in msgs]
    assert_parity(spark, [(i, m.value, k) for i, ((m, _, _), k) in enumerate(zip(
        msgs, kinds, strict=True))], min_native=1)
    assert_parity(spark, [(0, m.value, k) for (m, _, _), k in zip(msgs, kinds, strict=True)],
                  min_native=0)
    assert len(CORPUS) > 5


def _t(n: int, day: str = "2026-11-23", **change: Any) -> bytes:
    return trade(**{"trade_id": f"T{n:06d}", "trade_date": day, "seq": n,
                    "executed_at": f"{day}T14:30:00.5Z", **change})


def _m(day: str, p: int, last_seq: int, spaced: bool = False) -> bytes:
    obj = {"trade_date": day, "partition": p, "last_seq": last_seq}
    return (json.dumps(obj) if spaced else json.dumps(obj, separators=(",", ":"))).encode()


D1, D2, D3 = "2026-11-23", "2026-11-24", "2026-11-25"


def day_log() -> list[Message]:
    """Several days on one topic: replays equal in the ledger's terms (a price's trailing
    zeros, the same instant in another zone), conflicting replays, close markers (replayed,
    conflicting), late trades; a partition mixing native messages with an amendment and
    another with a hostile value (both the Python classifier's whole)."""
    log: list[Message] = []
    for p in range(3):
        log += [(p, _t(100 * p + n), TRADE_H) for n in range(1, 6)]
    log += [
        (0, _t(2), TRADE_H),  # an identical replay
        (0, _t(3, price="187.25"), TRADE_H),  # equal price: a replay
        (0, _t(4, executed_at="2026-11-23T15:30:00.500+01:00"), TRADE_H),  # the same instant
        (0, _t(5, quantity=101), TRADE_H),  # a conflicting replay
        (0, _t(1, D2), TRADE_H),  # the id again on another day: a conflicting replay
        (0, _m(D1, 0, 5), CLOSE_H),
        (0, _m(D1, 0, 5, spaced=True), CLOSE_H),  # a replayed marker
        (0, _m(D1, 0, 6), CLOSE_H),  # a conflicting marker
        (0, _t(6), TRADE_H),  # late
        (0, _t(2), TRADE_H),  # a replay, but late
        (0, _t(7, D2), TRADE_H),  # the next day goes on
        (0, trade(trade_id="it's", trade_date=D2, seq=8), TRADE_H),
        (0, trade(trade_id="it's", trade_date=D2, seq=9), TRADE_H),  # conflicting, repr "..."
        (0, _m(D2, 0, 9), CLOSE_H),
        (0, _t(10, D2), TRADE_H),  # late
        (0, _t(11, D3), TRADE_H),
        (0, _t(5, D3), TRADE_H),  # conflicting with the first day's T000005
        (1, _t(101), None),  # no type header: a trade
        (1, _m(D1, 1, 6), CLOSE_H),
        (1, _m(D2, 1, 0), CLOSE_H),  # an empty day closed
        (1, _t(102, D2), TRADE_H),  # late on its day
        (2, json.dumps({"trade_id": "T000201", "trade_date": D1, "seq": 6,
                        "reason": "bust"}).encode(), C.CANCEL.encode()),
        (2, _t(202), TRADE_H),
        (2, _t(203, quantity=7), TRADE_H),
        (2, _m(D1, 2, 6), CLOSE_H),
        (2, _t(204), TRADE_H),
        (3, _t(301), TRADE_H),
        (3, _t(302, symbol="Ä"), TRADE_H),  # valid, but not canonical
        (3, _t(301), TRADE_H),
        (3, _m(D1, 3, 2), CLOSE_H),
        (3, _t(303), TRADE_H),
        (4, _m(D1, 4, 0), CLOSE_H),  # markers only
        (4, _m(D2, 4, 0, spaced=True), CLOSE_H),
    ]
    return log


def test_several_days_with_replays_late_trades_and_markers(spark: SparkSession  # noqa: F811
                                                           ) -> None:
    log = day_log()
    assert native_partitions(spark, log) == {0, 1, 4}
    # The cancel on partition 2 is deferred and decided with its trade; partition 3's valid
    # non-canonical trade is one the JVM did not keep, so that partition goes back whole.
    assert jvm_partitions(spark, log) == {0, 1, 2, 4}
    assert_parity(spark, log, min_native=3)
    rows = classify_kafka_values(spark.createDataFrame(_rows(log), RAW_SCHEMA).coalesce(1),
                                 MAX_BYTES, native=True).where("kafka_partition = 0").collect()
    reasons = sorted(r["reason"].split(":")[0] for r in rows if r["reason"] is not None)
    assert reasons == sorted(["conflicting close marker of 2026-11-23 on partition 0",
                              "conflicting replay of trade 'T000001'",
                              "conflicting replay of trade 'T000005'",
                              "conflicting replay of trade 'T000005'",
                              'conflicting replay of trade "it\'s"', "late", "late", "late"])
    assert sum(r["_dup"] for r in rows) == 3


def _cancel(n: int, seq: int, day: str = D1) -> bytes:
    return json.dumps({"trade_id": f"T{n:06d}", "trade_date": day, "seq": seq,
                       "reason": "bust"}, separators=(",", ":")).encode()


def _correct(n: int, seq: int, version: int, day: str = D1, **change: Any) -> bytes:
    obj = json.loads(_t(n, day, seq=seq, **change))
    return json.dumps({**obj, "version": version}, separators=(",", ":")).encode()


def _amended(day: str, p: int, last_seq: int, k: int) -> bytes:
    return json.dumps({"trade_date": day, "partition": p, "last_seq": last_seq, "amended": k},
                      separators=(",", ":")).encode()


CANCEL_H, CORRECT_H = C.CANCEL.encode(), C.CORRECT.encode()


def dirty_log() -> list[Message]:
    """Days as exchanges send them: plain trades with, among them, amendments in every
    state (accepted, replayed, conflicting, of an unknown trade, of another date, after a
    cancel, a version not above the current one, held after the close and decided by an
    amended close marker or left late), malformed values, and non-canonical copies of trades
    the JVM kept (an equal one, a conflicting one, a late one). Partitions 0-2 keep their
    state whatever the deferred messages say, so the JVM keeps them; partition 3's deferred
    trade is a first copy and partition 4's deferred close a plain marker: back whole."""
    spaced = {"separators": (", ", ": ")}
    log: list[Message] = []
    for p in range(5):
        log += [(p, _t(100 * p + n), TRADE_H) for n in range(1, 9)]
    log += [
        (0, _cancel(1, 9), CANCEL_H),  # accepted
        (0, _cancel(1, 9), CANCEL_H),  # its replay
        (0, _correct(1, 10, 2), CORRECT_H),  # the trade is cancelled
        (0, _correct(2, 10, 2, quantity=7), CORRECT_H),  # accepted
        (0, _correct(2, 10, 2, quantity=8), CORRECT_H),  # conflicting replay
        (0, _correct(2, 11, 2, quantity=7), CORRECT_H),  # version not above
        (0, _correct(3, 12, 3, price="1.5"), CORRECT_H),  # version 3 straight away
        (0, _cancel(999, 13), CANCEL_H),  # unknown trade
        (0, _cancel(4, 14, D2), CANCEL_H),  # another date than its trade's
        (0, b"{not json", TRADE_H),
        (0, None, TRADE_H),
        (0, _t(5)[:-1] + b',"extra":1}', TRADE_H),
        (0, b'{"trade_date":"2026-11-23"}', C.CLOSE.encode()),  # a marker without fields
        (0, _t(9), TRADE_H),
        (0, _cancel(9, 15), CANCEL_H),  # the trade after the malformed ones
        (0, json.dumps(json.loads(_t(6)), **spaced).encode(), TRADE_H),  # an equal copy
        (0, json.dumps(json.loads(_t(7, quantity=5)), **spaced).encode(), TRADE_H),  # conflict
        (0, _t(8), b"fix"),  # an unknown type
        # A cancel naming its trade with an escape: the JVM misreads the id, the parser's counts.
        (0, _cancel(8, 16).replace(b'"T000008"', b'"T00000\\u0038"'), CANCEL_H),
        # Amendments the parser refuses though their JSON names a kept trade (the driver reads
        # that name unchecked): no reason field; a repeated key, the JVM reading the first
        # id and the parser the last. The amendments after them see the state unchanged.
        (0, _cancel(5, 17).replace(b',"reason":"bust"', b""), CANCEL_H),
        (0, _correct(5, 18, 2), CORRECT_H),
        (0, _cancel(3, 19).replace(b'"trade_id":"T000003"',
                                   b'"trade_id":"T000006","trade_id":"T000003"'), CANCEL_H),
        (0, _cancel(3, 20), CANCEL_H),
        (1, _m(D1, 1, 8), CLOSE_H),
        (1, _cancel(101, 9), CANCEL_H),  # after the close: held, then covered
        (1, _correct(102, 10, 2), CORRECT_H),  # held, then covered
        (1, _cancel(103, 11), CANCEL_H),  # held, not covered: late
        (1, _amended(D1, 1, 10, 1), CLOSE_H),
        (1, _amended(D1, 1, 10, 1), CLOSE_H),  # its replay
        (1, _amended(D1, 1, 9, 3), CLOSE_H),  # out of order
        (1, json.dumps(json.loads(_t(104)), **spaced).encode(), TRADE_H),  # late copy
        (1, _t(105, D2), TRADE_H),
        (2, _cancel(201, 9, D1), CANCEL_H),
        (2, _cancel(201, 9, D1)[:-1] + b" ", CANCEL_H),  # truncated
        (2, _amended(D1, 2, 9, 1), CLOSE_H),  # the day is not closed here
        (2, _m(D1, 2, 9), CLOSE_H),
        (2, _t(209), TRADE_H),  # late
        (3, json.dumps(json.loads(_t(309)), **spaced).encode(), TRADE_H),  # kept first here
        (3, _t(309), TRADE_H),  # so the JVM's verdict on this one would be wrong
        # A plain marker with its fields in another order: the JVM did not see it close the day.
        (4, json.dumps({"partition": 4, "trade_date": D1, "last_seq": 8}).encode(), CLOSE_H),
        (4, _t(409), TRADE_H),  # late, which the JVM cannot know
    ]
    return log


def test_dirty_partitions_are_kept_by_the_jvm_with_the_python_verdicts(
        spark: SparkSession) -> None:  # noqa: F811
    """Issue 61: a partition with amendments and malformed values is read once by the JVM,
    its unusual messages decided by the Python classifier with the state they need; only a
    deferred message that changes that state gives its partition back."""
    log = dirty_log()
    diffs = differences(spark, log, mode="jvm")
    assert not diffs, f"{len(diffs)} of {len(log)} differ:\n" + "\n".join(diffs[:10])
    assert jvm_partitions(spark, log) == {0, 1, 2}
    assert not native_partitions(spark, log) & {0, 1, 2, 3}
    rows = classify_kafka_values(spark.createDataFrame(_rows(log), RAW_SCHEMA).coalesce(1),
                                 MAX_BYTES, jvm=True, cache=lambda df: df.persist()).collect()
    by = {(r["kafka_partition"], r["kafka_offset"]): r for r in rows}
    # The verdicts the deferral must get right, spelled out (not only equal to Python's).
    assert by[0, 8]["reason"] is None and by[0, 9]["_dup"]  # a cancel and its replay
    assert "cancelled" in by[0, 10]["reason"]
    assert "unknown trade" in by[0, 15]["reason"]
    assert by[0, 23]["_dup"] and by[0, 23]["reason"] is None  # the equal spaced copy
    assert by[0, 24]["reason"].startswith("conflicting replay of trade 'T000007'")
    assert by[1, 9]["reason"] is None and by[1, 10]["reason"] is None  # covered
    assert by[1, 11]["reason"].startswith("late")
    assert by[1, 15]["reason"].startswith("late")
    assert by[4, 9]["reason"].startswith("late")
    assert by[0, 26]["reason"] is None and by[0, 26]["_kind"] == C.CANCEL  # the escaped id
    assert "missing field 'reason'" in by[0, 27]["reason"] and by[0, 28]["reason"] is None
    assert "duplicate key" in by[0, 29]["reason"] and by[0, 30]["reason"] is None


def test_the_decided_amendments_are_the_days_when_no_partition_is_given_back(
        spark: SparkSession) -> None:  # noqa: F811
    """The JVM defers every amendment, so with no partition given back the driver holds them
    all: the read takes them from there (``Resolved.amendments``), not from a pass over the
    verdicts. They must be exactly the amendments that pass would pick out; with a partition
    given back, the driver does not hold them all and says so (None)."""
    log = dirty_log()
    for msgs, given_back in (([m for m in log if m[0] in (0, 1, 2)], False), (log, True)):
        frame = stage(spark.createDataFrame(_rows(msgs), RAW_SCHEMA).coalesce(1))
        verdicts = jvmclassify.classify_jvm(frame, MAX_BYTES).persist()
        try:
            got = resolve_deferred(verdicts, MAX_BYTES, lambda parts: spark.createDataFrame(
                [], CLASSIFIED_SCHEMA))
            if given_back:
                assert got.workers and got.amendments is None
                continue
            assert not got.workers
            picked = sorted(tuple(r) for r in split_classified(got.rows).amendments.collect())
            assert got.amendments is not None and len(picked) >= 3
            assert {r[5] for r in picked} == {C.CANCEL, C.CORRECT}
            held = local_frame(spark, got.amendments, AMENDMENT_SCHEMA).collect()
            assert sorted(tuple(r) for r in held) == picked  # as the read hands them on
        finally:
            verdicts.unpersist()


def test_the_trades_the_amendments_name_are_picked_as_a_pass_over_the_day_would(
        spark: SparkSession) -> None:  # noqa: F811
    """While the driver decides the deferred messages, the kept trades of the day that they
    name (as the JVM read the id) are picked out of the verdicts (``Resolved.picked``): for
    any set of those ids they must be exactly what ``amended_trades`` finds by a pass over
    the settled day; an id the JVM did not read as the parser did (an escape) was not looked
    for, so the settlement scans the day for it (``of`` says None)."""
    log = [m for m in dirty_log() if m[0] in (0, 1, 2)]
    frame = stage(spark.createDataFrame(_rows(log), RAW_SCHEMA).coalesce(1))
    verdicts = jvmclassify.classify_jvm(frame, MAX_BYTES).persist()
    try:
        got = resolve_deferred(verdicts, MAX_BYTES, lambda parts: spark.createDataFrame(
            [], CLASSIFIED_SCHEMA), D1)
        assert not got.workers and got.picked is not None and got.amendments is not None
        accepted = {r[0] for r in got.amendments if str(r[1]) == D1}
        day = first_copies(got.rows).where(F.col("trade_date") == F.lit(D1).cast("date"))
        assert "T000008" in accepted and "T000008" not in got.picked.ids  # the escaped id
        assert got.picked.of(accepted) is None
        readable = accepted & got.picked.ids
        assert len(readable) >= 3
        scanned = amended_trades(day, [(i,) for i in sorted(readable)])
        assert got.picked.of(readable) == scanned and len(scanned) == len(readable)
    finally:
        verdicts.unpersist()


def test_the_reads_facts_counted_beside_the_decision_are_one_pass_over_its_rows(
        spark: SparkSession) -> None:  # noqa: F811
    """While the driver decides the deferred messages, the JVM's standing rows are counted
    (``resolve_deferred``'s ``beside``), and the decided rows are counted in Python
    (``readfacts.decided_rows``): merged, the facts must be those of one pass over the
    resolved rows, every field (dead letters, duplicates, close markers, late trades, other
    dates, the day's figures and sums, the amendments' figures). Every kind of row but the
    day's trades is also counted by ``decided_rows`` alone, against the pass; a decided
    trade of the day cannot be counted there (None)."""
    day = dt.date.fromisoformat(D1)
    log = [m for m in dirty_log() if m[0] in (0, 1, 2)]
    log += [(p, _t(100 * p + n, D2), TRADE_H) for p in (0, 1) for n in range(20, 23)]  # D2's
    log += [(2, _t(250, "2026-11-22"), TRADE_H)]  # a trade of the day before
    frame = stage(spark.createDataFrame(_rows(log), RAW_SCHEMA).coalesce(1))
    verdicts = jvmclassify.classify_jvm(frame, MAX_BYTES).persist()
    standing: list[DataFrame] = []
    try:
        got = resolve_deferred(verdicts, MAX_BYTES, lambda parts: spark.createDataFrame(
            [], CLASSIFIED_SCHEMA), D1, standing.append)
        assert not got.workers and len(standing) == 1 and got.decided is not None
        whole = pass_facts(got.rows, day)
        decided = decided_rows(got.decided, day)
        assert decided is not None
        assert facts_of([*count_rows(standing[0], day), *decided], day) == whole
        assert whole.malformed >= 4 and whole.duplicates >= 2 and whole.closes
        assert whole.amendment_figures and whole.figures and whole.symbol_sums
        assert whole.other_dates >= 7 and whole.late == {"2026-11-22": {2: 1}}
        kind = (F.col("reason").isNull() & (F.col("_kind") == C.TRADE)
                & (F.col("trade_date") == F.lit(D1).cast("date")) & ~F.col("_dup"))
        rest = decided_rows(got.rows.where(~kind).toArrow(), day)
        assert rest is not None
        assert facts_of([*count_rows(got.rows.where(kind), day), *rest], day) == whole
        assert decided_rows(got.rows.where(kind).toArrow(), day) is None
    finally:
        verdicts.unpersist()


def test_the_size_limit_sends_a_value_to_the_python_classifier(spark: SparkSession  # noqa: F811
                                                              ) -> None:
    msgs: list[Message] = [(0, BASE, TRADE_H), (1, BASE, TRADE_H)]
    assert native_partitions(spark, msgs, max_bytes=len(BASE) - 1) == set()
    assert_parity(spark, msgs, min_native=0, max_bytes=len(BASE) - 1)
    assert_parity(spark, msgs, min_native=2, max_bytes=len(BASE))


def test_a_looser_pattern_fails_the_parity_check(spark: SparkSession,  # noqa: F811
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A pattern that lets a zero price through (the contract refuses it) is caught."""
    loose = anchored(TRADE_PATTERN.replace(CANONICAL_PRICE, f"(?:{C.PRICE_PATTERN})"))
    assert loose != native._TRADE_RE
    monkeypatch.setattr(native, "_TRADE_RE", loose)
    msgs: list[Message] = [(0, BASE, TRADE_H), (1, trade(price="0.0"), TRADE_H)]
    diffs = differences(spark, msgs)
    assert len(diffs) == 1 and diffs[0].startswith("(1, 0)"), diffs
    # The compiled classifier's pattern (the same, with a group per field) likewise.
    monkeypatch.setattr(jvmclassify, "TRADE_CAPTURE", jvmclassify.TRADE_CAPTURE.replace(
        CANONICAL_PRICE, f"(?:{C.PRICE_PATTERN})"))
    diffs = differences(spark, msgs, mode="jvm")
    assert len(diffs) == 1 and diffs[0].startswith("(1, 0)"), diffs


def test_the_compiled_classifier_gives_the_classified_schema(spark: SparkSession  # noqa: F811
                                                              ) -> None:
    """The Java rows are built in Spark's internal form: their schema is the Python
    classifier's, column for column, then ``_fallback``, ``_deferred``, ``_type``,
    ``_ref_offset`` and ``_ref_date``."""
    frame = stage(spark.createDataFrame(_rows([(0, BASE, TRADE_H)]), RAW_SCHEMA))
    got = jvmclassify.classify_jvm(frame, MAX_BYTES)
    assert [(f.name, f.dataType) for f in got.schema.fields] == [
        *((f.name, f.dataType) for f in CLASSIFIED_SCHEMA.fields), ("_fallback", BooleanType()),
        ("_deferred", BooleanType()), ("_type", BinaryType()), ("_ref_offset", LongType()),
        ("_ref_date", DateType())]
    assert got.where("not _fallback and not _deferred").count() == 1


def test_the_capture_pattern_is_the_trade_pattern_with_groups() -> None:
    """The compiled classifier matches TRADE_CAPTURE: TRADE_PATTERN with a group around each
    field's value, nothing else changed."""
    assert re.compile(TRADE_CAPTURE).groups == len(C.TRADE_FIELDS)
    plain = TRADE_CAPTURE
    for f in C.TRADE_FIELDS:  # each group opens right after its key (and quote)
        plain = re.sub(rf'("{f}":"?)\(', r"\1", plain, count=1)
    # ...and closes right before the next key's comma or the closing brace.
    plain = re.sub(r'\)("?(?:,"|\\\}$))', r"\1", plain)
    assert plain == TRADE_PATTERN


def test_the_switch_turns_the_native_path_off() -> None:
    from settlement.config import load_settings

    assert not load_settings().native_trades  # off until it is faster (docs/benchmarks.md)
    assert load_settings(native_trades=True).native_trades
