"""The messages the JVM classifier deferred (``settlement.spark.jvmclassify``), decided in the
driver by the Python classifier itself (``settlement.spark.worker.classify_arrow``).

A Kafka partition on the days exchanges send holds a few messages the JVM does not vouch for:
busts and corrections, amended close markers, malformed values. The JVM emits each with its
value and type header and goes on; here the Python classifier runs over those messages and a
stand-in for every earlier message they can depend on, in offset order, and its rows for the
deferred messages replace the JVM's.

Why that gives each deferred message its verdict in the whole partition: the Python verdict
on a message depends on the messages before it only through the partition's state, which is
the trades kept per id (their offset, date and content), the close markers kept per date, and
the amendments and amended close markers kept (all deferred, so all here). So the stand-ins
are
- every close marker the JVM kept on the partition (few: one per day, and their replays);
- for an amendment, the trade it names as the JVM kept it: its offset and date come with the
  deferred row (the JVM looks the id up as it defers the message), which is all an amendment
  is checked against (``consumers.parse.amendment_refusal``), so the stand-in carries those
  and placeholder values;
- for a valid trade in another shape that repeats a kept id, the kept copy itself (its
  content decides replay or conflict): the JVM's row for that id, rebuilt as canonical text.
  So is any id the JVM's reading of the value (a pattern over its text) may have misread
  (an escape in the id, a repeated key): the Python parser's reading decides.
A message that fails the contract whatever came before it (malformed) needs none.

And the JVM's own verdicts stand only where no deferred message changed the state they were
decided with: a deferred valid trade kept as its id's first copy, or a deferred plain close
marker kept, gives its partition back to the Python worker, read again whole.
``tests/test_native.py`` holds the result to the Python classifier's on dirty partitions.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from consumers.parse import (
    Malformed,
    close_marker,
    decode,
    fast_trade_values,
    trade_values,
)
from settlement.contract import AMENDMENTS, CLOSE, CLOSE_FIELDS, TRADE, TRADE_FIELDS
from settlement.spark.session import local_frame
from settlement.spark.worker import classify_arrow
from settlement.threads import in_thread

# What the first pass over the JVM's verdicts collects: the deferred messages, the partitions
# given back, and the close markers the JVM kept (the stand-ins every deferred message may
# need).
_KEPT_CLOSES = "_kind = 'close' and reason is null and not _deferred"
_MARKED = f"_fallback or _deferred or ({_KEPT_CLOSES})"
# The classified columns an amendment's row is made of (AMENDMENT_SCHEMA's order).
_AMENDMENT_SOURCES = ("trade_id", "trade_date", "seq", "kafka_partition", "kafka_offset", "_kind",
                      "_version", "_note", "symbol", "price", "quantity", "buyer", "seller",
                      "executed_at")
# What the amendments' checks and effects need of an amended trade
# (``settlement.spark.settle.AMENDED_SCHEMA``' columns).
_AMENDED = ("trade_id", "kafka_partition", "kafka_offset", "trade_date", "price", "quantity")
# The JVM rows of kept trades (a first copy, valid), looked up by id when a stand-in must carry
# a trade's content.
_KEPT_TRADES = "_kind = 'trade' and reason is null and not _dup and not _deferred"


@dataclass(frozen=True)
class Message:
    """A deferred message, with what the JVM knew of the trade it seems to name."""

    partition: int
    offset: int
    value: bytes | None
    kind: bytes | None
    named: str | None  # the trade id the JVM read in the value
    kept_at: int | None  # where the partition kept that trade before it
    kept_date: str | None  # and of what date


@dataclass(frozen=True)
class Picked:
    """The day's kept trades (first copies, valid, of the date) whose id is in ``ids``:
    ``settlement.spark.settle.amended_trades``' rows for any set of ids within ``ids``."""

    ids: frozenset[str]
    # AMENDED_SCHEMA's columns, then the symbol: a Spark job's, still running while the read
    # goes on (its counting pass); the first to need them waits.
    rows: Future[list[tuple[Any, ...]]]

    def of(self, wanted: set[str]) -> list[tuple[Any, ...]] | None:
        """The rows of the trades ``wanted`` names, sorted; None when some id was not
        looked for (then only a pass over the day can say)."""
        if not wanted <= self.ids:
            return None
        return sorted(r for r in self.rows.result() if r[0] in wanted)


@dataclass(frozen=True)
class Resolved:
    """The JVM's verdicts with their deferred messages decided."""

    rows: DataFrame  # CLASSIFIED_SCHEMA, every message once
    workers: list[int]  # the Kafka partitions read again by the Python worker
    deferred: int  # the messages the Python classifier decided in the driver
    # The accepted cancels and corrections of every date (``split_classified``'s
    # amendments, as rows), when all of them were decided here: the JVM defers every
    # amendment, so with no partition given back they are among the decided rows and no
    # pass over the verdicts need pick them out. None: a partition was given back.
    amendments: list[tuple[Any, ...]] | None = None
    # The kept trades of the day that the deferred amendments name, picked out of the
    # verdicts while the driver decided them; None: a partition was given back, or no date
    # was asked for.
    picked: Picked | None = None
    # The decided messages' rows as they replaced the JVM's (Arrow, ``CLASSIFIED_SCHEMA``),
    # when no partition was given back (None: none was deferred, or one was given back).
    decided: pa.Table | None = None

    @property
    def read_by(self) -> str:
        """What the close's JSON says read the day (``read_by``)."""
        if self.workers:
            return f"jvm, workers for partitions {self.workers}"
        return "jvm" if not self.deferred else f"jvm, {self.deferred} messages by python"


def resolve_deferred(verdicts: DataFrame, max_bytes: int,
                     python: Callable[[list[int]], DataFrame],
                     trade_date: str | None = None,
                     beside: Callable[[DataFrame], None] | None = None) -> Resolved:
    """``classify_jvm``'s verdicts (persisted: read more than once) as ``CLASSIFIED_SCHEMA``
    rows: the deferred messages decided by the Python classifier, and the partitions that
    must go back to the worker classified by ``python`` (their rows) instead. The first pass
    over ``verdicts`` is where the JVM reads Kafka. ``trade_date``: the kept trades of that
    date the deferred amendments name are picked out meanwhile (``Resolved.picked``).
    ``beside``: called with the JVM's standing rows (every message but the deferred ones)
    when some are deferred and no partition is given back yet, before the driver decides
    them, so a pass over those rows can run meanwhile; a partition given back after that
    (``Resolved.workers``) makes what it learnt of no use."""
    marked = verdicts.where(_MARKED).select(
        "kafka_partition", "kafka_offset", "raw", "_type", "_fallback", "_deferred",
        "trade_id", "_ref_offset", F.col("_ref_date").cast("string"),
        F.col("_close_date").cast("string"), "_last_seq").collect()
    workers = {r[0] for r in marked if r[4]}
    deferred = [Message(r[0], r[1], r[2], r[3], r[6], r[7], r[8]) for r in marked
                if r[5] and r[0] not in workers]
    parts = {m.partition for m in deferred}
    closes = [(r[0], r[1], _close_text(r[9], r[0], r[10])) for r in marked
              if not r[4] and not r[5] and r[0] in parts]
    # The JVM's rows as they stand: CLASSIFIED_SCHEMA (tests/test_native.py holds the Java
    # columns to it), the schema the decided rows are given.
    rows = verdicts.where("not _deferred").drop(
        "_fallback", "_deferred", "_type", "_ref_offset", "_ref_date")
    decided: DataFrame | None = None
    table: pa.Table | None = None
    if beside is not None and deferred and not workers:
        beside(rows)  # before the pick: the first job submitted takes the task slots first
    picking = _pick_named(verdicts, deferred, trade_date) if not workers else None
    if deferred:
        table = _decide(verdicts, deferred, closes, max_bytes)
        workers |= _state_changers(table, deferred, max_bytes)
        if workers:
            table = table.filter(pc.invert(pc.is_in(table["kafka_partition"],
                                                    pa.array(sorted(workers), pa.int32()))))
        if table.num_rows:
            decided = verdicts.sparkSession.createDataFrame(table, rows.schema)
    out = rows.where(~F.col("kafka_partition").isin(sorted(workers))) if workers else rows
    if decided is not None:
        out = out.unionByName(decided)
    if workers:
        out = out.unionByName(python(sorted(workers)))
    return Resolved(out, sorted(workers), sum(1 for m in deferred if m.partition not in workers),
                    None if workers else _amendments(table), None if workers else picking,
                    None if workers else table)


def _pick_named(verdicts: DataFrame, deferred: list[Message], trade_date: str | None
                ) -> Picked | None:
    """The kept trades of ``trade_date`` whose id a deferred amendment names as the JVM read
    it, picked out of the cached verdicts by a Spark job of their own, started while the
    driver decides the deferred messages (its Python leaves the JVM idle) and left running
    beside the read's counting pass. The amendments' checks, effects and the settled day's
    sums need those trades; picked after the read, they were a scan of the day beside the
    netting (1.9-4.2 s of validation's thread on a realistic 2M-trade day from Kafka, 0.6-1.3 s
    alone)."""
    if trade_date is None:
        return None
    named = sorted({m.named for m in deferred
                    if m.named is not None and _kind(m.kind) in AMENDMENTS})
    if not named:
        return None
    ids = local_frame(verdicts.sparkSession, [(i,) for i in named], "trade_id string")

    def pick() -> list[tuple[Any, ...]]:
        got = verdicts.where(_KEPT_TRADES).where(
            F.col("trade_date") == F.lit(trade_date).cast("date")).join(
            F.broadcast(ids), "trade_id", "left_semi").select(*_AMENDED, "symbol").collect()
        return [tuple(r) for r in got]

    return Picked(frozenset(named), in_thread("pick-amended", pick))


def _amendments(decided: pa.Table | None) -> list[tuple[Any, ...]]:
    """The accepted amendments among the decided rows, as ``split_classified`` selects them
    (AMENDMENT_SCHEMA's columns)."""
    if decided is None:
        return []
    kept = decided.filter(pc.and_(
        pc.and_(pc.is_null(decided["reason"]), pc.invert(decided["_dup"])),
        pc.is_in(decided["_kind"], pa.array(AMENDMENTS, pa.string()))))
    columns = [kept[c].to_pylist() for c in _AMENDMENT_SOURCES]
    return list(zip(*columns, strict=True))


def _kind(kind: bytes | None) -> str | None:
    """A type header's bytes as the worker reads them (None: not a type it knows)."""
    text = kind.decode("utf-8", "replace") if kind is not None else None
    return text if text in (TRADE, CLOSE, *AMENDMENTS) else None


def _named(m: Message, max_bytes: int) -> tuple[str, bool] | None:
    """The trade id the message names as the Python parser reads it, and whether it is an
    amendment; None when the message fails the contract whatever came before it (or is a
    close marker, whose stand-ins are the kept markers).

    An amendment's id is its JSON's ``trade_id`` as orjson reads it, unchecked: a value the
    parser accepts is orjson's object and names that id (``consumers.parse.decode`` and
    ``amendment``); one it refuses is a dead letter whatever the state, and the stand-in its
    reading adds is the partition's true state (a kept trade's offset and date, or its kept
    copy), so no verdict changes. The whole check ran again in the classifier: 0.5 s of the
    driver's Python on a realistic 2M-trade day's 11,577 amendments, warm."""
    kind = _kind(m.kind)
    if kind in AMENDMENTS:
        try:
            obj = orjson.loads(m.value) if m.value is not None else None
        except orjson.JSONDecodeError:
            return None
        tid = obj.get("trade_id") if type(obj) is dict else None
        return (tid, True) if type(tid) is str else None
    if kind == TRADE:
        try:
            t = fast_trade_values(m.value, max_bytes) or trade_values(decode(m.value, max_bytes))
        except Malformed:
            return None
        return t[0], False
    return None


def _decide(verdicts: DataFrame, deferred: list[Message], closes: list[tuple[int, int, bytes]],
            max_bytes: int) -> pa.Table:
    """The deferred messages' rows (``CLASSIFIED_SCHEMA``), as the Python classifier gives
    them over the deferred messages and their stand-ins, in offset order."""
    stand_ins: dict[tuple[int, int], tuple[bytes, bytes]] = {
        (p, o): (text, CLOSE.encode()) for p, o, text in closes}
    contents: set[tuple[int, str]] = set()  # (partition, trade id): the kept copy's content
    for m in deferred:
        named = _named(m, max_bytes)
        if named is None:
            continue
        tid, is_amendment = named
        if tid != m.named:  # the JVM misread the id: look the trade up by the parser's
            contents.add((m.partition, tid))
        elif m.kept_at is not None and is_amendment:
            stand_ins.setdefault((m.partition, m.kept_at),
                                 (_placeholder(tid, m.kept_date), TRADE.encode()))
        elif m.kept_at is not None:
            contents.add((m.partition, tid))
    if contents:  # rare: a valid trade in another shape repeating a kept one, a misread id
        keys = verdicts.sparkSession.createDataFrame(
            sorted(contents), "kafka_partition int, trade_id string")
        kept = verdicts.where(_KEPT_TRADES).join(
            F.broadcast(keys), ["kafka_partition", "trade_id"], "left_semi").select(
            "kafka_partition", "kafka_offset", "trade_id", F.col("trade_date").cast("string"),
            "seq", "symbol", F.col("price").cast("string"), "quantity", "buyer", "seller",
            F.unix_micros("executed_at"))
        for r in kept.collect():  # the real copy replaces a placeholder at its offset
            stand_ins[r[0], r[1]] = (_trade_text(r[2:]), TRADE.encode())
    log = sorted([*((m.partition, m.offset, m.value, m.kind) for m in deferred),
                  *((p, o, text, kind) for (p, o), (text, kind) in stand_ins.items())],
                 key=lambda m: (m[0], m[1]))
    batch = pa.RecordBatch.from_arrays(
        [pa.array([m[0] for m in log], pa.int32()), pa.array([m[1] for m in log], pa.int64()),
         pa.array([m[2] for m in log], pa.binary()), pa.array([m[3] for m in log], pa.binary())],
        names=["kafka_partition", "kafka_offset", "value", "_kind"])
    got = pa.Table.from_batches(list(classify_arrow(iter([batch]), max_bytes)))
    keys = pc.binary_join_element_wise(
        pc.cast(got["kafka_partition"], pa.string()), pc.cast(got["kafka_offset"], pa.string()),
        ":")
    wanted = pa.array([f"{m.partition}:{m.offset}" for m in deferred], pa.string())
    return got.filter(pc.is_in(keys, wanted))


def _placeholder(trade_id: str, trade_date: str | None) -> bytes:
    """A stand-in for a trade kept by the JVM, carrying what an amendment is checked against
    (its id, its date, that it was kept there); its other values are any the contract takes."""
    # orjson: one per deferred amendment, 0.25 s of json.dumps on the 2M day's, warm.
    return orjson.dumps({"trade_id": trade_id, "trade_date": trade_date, "seq": 1,
                         "symbol": "S", "price": "1", "quantity": 1, "buyer": "B",
                         "seller": "S", "executed_at": f"{trade_date}T00:00:00Z"})


def _trade_text(values: tuple[Any, ...]) -> bytes:
    """A JVM-kept trade's canonical text again (``TRADE_FIELDS``' order): what the Python
    classifier reads as the same trade (its fingerprint normalises the price's trailing zeros
    and the execution time's form)."""
    *fields, micros = values
    at = (dt.datetime(1970, 1, 1) + dt.timedelta(microseconds=micros)).isoformat(
        timespec="microseconds") + "Z"
    return json.dumps(dict(zip(TRADE_FIELDS, [*fields, at], strict=True)),
                      separators=(",", ":")).encode()


def _close_text(trade_date: str, partition: int, last_seq: int) -> bytes:
    """A JVM-kept close marker's canonical text again (``CLOSE_FIELDS``' order)."""
    return json.dumps(dict(zip(CLOSE_FIELDS, (trade_date, partition, last_seq), strict=True)),
                      separators=(",", ":")).encode()


def _state_changers(decided: pa.Table, deferred: list[Message], max_bytes: int) -> set[int]:
    """The partitions where a deferred message (``decided``: their rows) changes the state
    the JVM classified the messages after it with: a valid trade kept as its id's first copy,
    or a valid plain close marker (an amended one only decides amendments, all deferred)."""
    value_of = {(m.partition, m.offset): m.value for m in deferred}
    out: set[int] = set()
    valid = decided.filter(pc.is_null(decided["reason"])).select(
        ["kafka_partition", "kafka_offset", "_kind", "_dup"]).to_pylist()
    for r in valid:
        p, o = r["kafka_partition"], r["kafka_offset"]
        if r["_kind"] == TRADE and not r["_dup"]:
            out.add(p)
        elif r["_kind"] == CLOSE and not close_marker(decode(value_of[p, o], max_bytes),
                                                      p).amended:
            out.add(p)
    return out
