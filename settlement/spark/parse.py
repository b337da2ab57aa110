"""Classifying a raw Kafka batch: valid trades, close markers, and dead letters with a reason.

There is one parser of a message, ``consumers.parse``, and this module runs it inside Spark:
each task streams its Kafka partition to a Python worker as Arrow batches (``mapInArrow``),
the worker applies exactly the checks a consumer site applies (orjson, then the contract's
rules), and hands the verdicts back as typed Arrow columns (dates, ``decimal(18,4)`` prices
and UTC timestamps converted by Arrow's C casts, never through a float). So a site and the
end of day cannot disagree about a message, and ``tests/test_parity.py`` checks what is left
to disagree about: the typed values against what PostgreSQL makes of a site's COPY line.
The worker also hashes each trade's canonical row for validation's checksums
(``settlement.spark.figures.row_hashes``): the fields are at hand there, and Spark's own
expression of the hash cost the 2M day's counting pass 3.8-5.8 s.

This replaced a classifier of Spark column expressions (``from_json``, a regex per rule and
``try_parse_json`` for the JSON rules Spark's reader does not check): fetching and
classifying a 1M day took 28.4 s that way and takes 11.0 s this way, of which about 5 s is
the fetch itself (docs/benchmarks.md).

The worker also marks repeated copies of a trade (``_dup``): copies of one trade share its
key (the symbol) and so its Kafka partition, and a Spark task reads one Kafka partition in
offset order, so the first copy in the task is the earliest in the log and dedupe needs no
shuffle. A trade id in two partitions breaks the premise: validation's ``read_copies`` check
names it (the partition is part of a trade's identity) and the day is not published.

A later copy whose content differs from the first (``consumers.parse.fingerprint``) is not a
duplicate but a conflicting replay, and a second close marker of a day with another
``last_seq`` a conflicting marker: both are malformed with the reason the sites give them
when they dead-letter them, so the two sources reach the same verdict on such a day.

The native path (issue 44; ``SETTLE_NATIVE_TRADES=true`` turns it on for a close): most
of a day is plain trades written canonically by the gateway, which need none of the worker's
generality. A Kafka partition whose every message is a canonical plain trade or day's close
marker (one pattern over the raw text each, generated from the contract:
``settlement.spark.canonical``) is classified by Spark expressions instead
(``settlement.spark.native``: the fields read off the text and cast, replays, conflicts, late
trades and markers by a window and a small join over the partition, the row hashes by
``row_hash``), and never crosses to Python; a partition holding anything else (an amendment,
an amended close, a value the patterns do not vouch for) goes whole to the worker, unchanged,
since its state spans the partition. One aggregate over the staged read decides which is
which. ``tests/test_native.py`` holds the two paths to the same row for every message of the
parity corpora and of hostile near-canonical values, and shows a looser pattern caught.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial
from typing import NamedTuple

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    DateType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from settlement.contract import (
    AMENDMENTS,
    CANCEL,
    CLOSE,
    CORRECT,
    MISSING_TYPE_MEANS,
    TRADE,
    TYPE_HEADER,
)
from settlement.spark.figures import row_hashes
from settlement.spark.native import classify_native, native_columns
from settlement.spark.schemas import PRICE, TRADE_SCHEMA

# What the classifier returns per message (``classify_kafka_values``).
CLASSIFIED_SCHEMA = StructType([
    StructField("kafka_partition", IntegerType()),
    StructField("kafka_offset", LongType()),
    StructField("reason", StringType()),
    StructField("_kind", StringType()),
    StructField("raw", BinaryType()),  # malformed messages only
    StructField("trade_id", StringType()),
    StructField("trade_date", DateType()),
    StructField("seq", LongType()),
    StructField("symbol", StringType()),
    StructField("price", PRICE),
    StructField("quantity", LongType()),
    StructField("buyer", StringType()),
    StructField("seller", StringType()),
    StructField("executed_at", TimestampType()),
    StructField("_close_date", DateType()),
    StructField("_last_seq", LongType()),
    StructField("_dup", BooleanType()),  # a later copy of a trade (or amendment) in this task
    # Cancels and corrections (``_kind``): the trade fields above are the correction's (a
    # cancel fills trade_id, trade_date and seq only).
    StructField("_version", IntegerType()),  # a correction's
    StructField("_note", StringType()),  # a cancel's reason
    # The canonical row's hash halves (``settlement.spark.figures.row_hashes``) of a row with
    # a trade id: validation's checksums, taken where the fields are at hand already.
    StructField("_row_hi", LongType()),
    StructField("_row_lo", LongType()),
])
# Arrow types of the output, built once per worker (the session time zone is UTC).
_A_DATE = pa.date32()
_A_PRICE = pa.decimal128(PRICE.precision, PRICE.scale)
_A_TS = pa.timestamp("us", tz="UTC")
_UNITS = pa.scalar(10_000, pa.decimal128(5, 0))  # a price times this: its 1/10,000ths
_NO_TRADE = (None,) * 9
_TRADE_B, _CLOSE_B = TRADE.encode(), CLOSE.encode()
_CANCEL_B, _CORRECT_B = CANCEL.encode(), CORRECT.encode()


class ParsedBatch(NamedTuple):
    """The three kinds of row in a raw Kafka batch. All are lazy views of the same input:
    persist the input first if more than one of them is evaluated."""

    trades: DataFrame  # TRADE_SCHEMA, every copy (``_dup`` is dropped)
    malformed: DataFrame  # MALFORMED_SCHEMA; count() it for the run record
    closes: DataFrame  # CLOSE_MARKERS_SCHEMA
    amendments: DataFrame  # AMENDMENT_SCHEMA, each accepted cancel and correction once


def parse_kafka_values(raw: DataFrame, max_value_bytes: int | None = None) -> ParsedBatch:
    """Split a Kafka batch (``key, value, partition, offset[, headers]``) into valid trades,
    malformed messages with a reason, and market-close markers: ``split_classified`` of
    ``classify_kafka_values``. Persist the classified frame in between when more than one of
    the three is evaluated, so that each message is parsed and checked once."""
    return split_classified(classify_kafka_values(raw, max_value_bytes))


def classify_kafka_values(raw: DataFrame, max_value_bytes: int | None = None, *,
                          native: bool = False,
                          cache: Callable[[DataFrame], DataFrame] | None = None
                          ) -> DataFrame:
    """One row per message (``CLASSIFIED_SCHEMA``): its partition and offset, ``reason``
    (NULL when valid, else the consumer sites' dead-letter reason), the message type, the
    typed trade and close-marker fields, the raw bytes of a malformed message only (valid
    rows carry NULL there, which keeps a cached batch small), and ``_dup``.

    The message type is the first ``type`` header (``''`` when its value is null; no header:
    ``MISSING_TYPE_MEANS``), found by a column expression: only its bytes cross to Python,
    which decodes them as the sites do (``consumers.parse.message_type``).
    ``max_value_bytes`` None means no size limit.

    With ``native`` (a close's ``SETTLE_NATIVE_TRADES``, off by default: see
    docs/benchmarks.md), a Kafka partition whose messages are all canonical plain trades and
    day's close markers is classified in the JVM (``settlement.spark.native``) and only the
    other partitions cross to the Python worker. Which partitions those are is one aggregate
    over the staged read; ``cache``, when given, persists the staged read (and returns it) so
    that Kafka is fetched once: the caller unpersists it after the classified frame, not
    before (Spark would drop that one's cache with it).
    """
    staged = stage(raw)
    limit = max_value_bytes if max_value_bytes is not None else 2**62

    def python(rows: DataFrame) -> DataFrame:
        return rows.mapInArrow(partial(classify_arrow, max_bytes=limit), CLASSIFIED_SCHEMA)

    if not native:
        return python(staged)
    if cache is not None:
        staged = cache(staged)
    # The typed fields are not cached with the read: a cache of them cost more to build
    # (3.4-3.8 s for 200,000 messages) than computing them twice (0.5 s a pass).
    marked = staged.select("*", *native_columns(limit))
    # Per Kafka partition, whether every message is native: a handful of rows.
    verdicts = marked.groupBy("kafka_partition").agg(
        F.min(F.col("_native").cast(IntegerType())).alias("n")).collect()
    native_parts = sorted(r["kafka_partition"] for r in verdicts if r["n"] == 1)
    if not native_parts:
        return python(staged)
    in_native = F.col("kafka_partition").isin(native_parts)
    fast = classify_native(marked.where(in_native))
    if len(native_parts) == len(verdicts):
        return fast  # no Python worker starts
    return fast.unionByName(python(staged.where(~in_native)))


def stage(raw: DataFrame) -> DataFrame:
    """A Kafka batch as the classifiers read it: kafka_partition, kafka_offset, value and
    the type header's bytes (``_kind``)."""
    return raw.select(
        F.col("partition").cast(IntegerType()).alias("kafka_partition"),
        F.col("offset").cast(LongType()).alias("kafka_offset"),
        F.col("value"),
        _message_type(raw).alias("_kind"),
    )


def split_classified(classified: DataFrame) -> ParsedBatch:
    """The three views of ``classify_kafka_values``' output."""
    valid = F.col("reason").isNull()
    kind = F.col("_kind")
    trades = classified.where(valid & (kind == TRADE)).select(
        [f.name for f in TRADE_SCHEMA])
    closes = classified.where(valid & (kind == CLOSE)).select(
        F.col("_close_date").alias("trade_date"),
        "kafka_partition",
        "kafka_offset",
        F.col("_last_seq").alias("last_seq"),
    )
    malformed = classified.where(~valid).select("kafka_partition", "kafka_offset", "raw", "reason")
    amendments = classified.where(valid & kind.isin(*AMENDMENTS) & ~F.col("_dup")).select(
        *(F.col(c) for c in ("trade_id", "trade_date", "seq", "kafka_partition",
                             "kafka_offset")),
        F.col("_kind").alias("kind"), F.col("_version").alias("version"),
        F.col("_note").alias("reason"),
        *(F.col(c) for c in ("symbol", "price", "quantity", "buyer", "seller", "executed_at")))
    return ParsedBatch(trades, malformed, closes, amendments)


def first_copies(classified: DataFrame) -> DataFrame:
    """The valid trades, each (trade date, trade id) once per Kafka partition: its earliest
    copy there (TRADE_SCHEMA)."""
    return split_classified(classified.where(~F.col("_dup"))).trades


def _message_type(raw: DataFrame) -> Column:
    """The first type header's value as bytes (empty when null); no header means
    MISSING_TYPE_MEANS."""
    missing = F.lit(MISSING_TYPE_MEANS).cast(BinaryType())
    if "headers" not in raw.columns:
        return missing
    # Field extraction and array_position rather than a filter() lambda: higher-order
    # functions have no generated code.
    headers = F.col("headers")
    at = F.array_position(headers["key"], TYPE_HEADER).cast(IntegerType())
    typ = F.try_element_at(headers["value"], at)
    return F.when(at > 0, F.coalesce(typ, F.lit("").cast(BinaryType()))).otherwise(missing)


def classify_arrow(batches: Iterator[pa.RecordBatch], max_bytes: int
                   ) -> Iterator[pa.RecordBatch]:
    """The Python worker's side: (kafka_partition, kafka_offset, value, _kind) batches of one
    task in, ``CLASSIFIED_SCHEMA`` batches out. Runs on executors, so it imports the parser
    here (the ``--py-files`` zip carries ``consumers``)."""
    from consumers.parse import (
        REPLAY,
        AmendedTrade,
        Amendment,
        KeptMarker,
        Malformed,
        amended_marker_refusal,
        amendment,
        amendment_conflict_reason,
        amendment_fingerprint,
        amendment_refusal,
        apply_amendment,
        close_marker,
        conflict_reason,
        covered,
        decode,
        fast_trade_values,
        fast_trades,
        fingerprint,
        late_reason,
        marker_conflict_reason,
        trade_values,
    )
    from consumers.runtime import hot_loop

    # Per Kafka partition (a task reads one, but a test's frame may hold several): trade id
    # -> the kept copy packed in one int (offset << 64 | 64-bit fingerprint), since a task
    # holds a partition's day, millions of ids; and trade date -> the kept close marker's
    # (last_seq, offset).
    # An amendment must name its trade's date: per partition, the first trade's date, and
    # the trades of any other date (none on a normal day, so the hot path adds one compare).
    seen_in: dict[int, dict[str, int]] = {}
    first_date: dict[int, str] = {}
    other_dates: dict[int, dict[str, str]] = {}
    closes_in: dict[int, dict[str, tuple[int, int]]] = {}
    # Amendments, as the sites hold them (consumers.parse.amendment_refusal): per partition,
    # trade id -> its state once amended, and each amendment identity -> its kept copy.
    amended_in: dict[int, dict[str, AmendedTrade]] = {}
    amends_in: dict[int, dict[tuple[str, str, int], int]] = {}
    # The amended close (consumers.parse, as the sites keep it): per partition and date, the
    # amended close markers kept; per partition, the amendments held since their day's close
    # (the amendment, its offset, and where its verdict is written), in offset order. A
    # batch holding one is yielded only at the end of the task, when its verdicts are final.
    amended_closes: dict[int, dict[str, list[KeptMarker]]] = {}
    held_in: dict[int, list[tuple[Amendment, int, list[str | None], list[bytes | None],
                                  list[bool], int]]] = {}
    held_batches: list[tuple[object, ...]] = []
    mask = (1 << 64) - 1

    def late(partition: int, trade_date: str) -> str | None:
        """The late reason of a message of ``trade_date`` when its day closed earlier on the
        partition (in this task: the day's range, or a test's frame)."""
        closed = closes_in.get(partition)
        at = closed.get(trade_date) if closed else None
        return None if at is None else late_reason(trade_date, partition, at[1])

    def check_amendment(a: Amendment, p: int, offset: int) -> tuple[str | None, bool]:
        """An amendment's verdict as the sites give it (the reason, or None, and whether it
        is a replay); an accepted one updates its trade's state."""
        ident = (a.trade_id, a.kind, a.version or 0)
        fp = amendment_fingerprint(a) & mask
        held_a = amends_in.setdefault(p, {}).get(ident)
        if held_a is not None:
            if held_a & mask != fp:
                return amendment_conflict_reason(a, p, held_a >> 64), False
            return None, True
        state = amended_in.setdefault(p, {}).get(a.trade_id)
        if state is None and a.trade_id in seen_in.get(p, {}):
            state = AmendedTrade(other_dates.get(p, {}).get(a.trade_id, first_date[p]))
        why = amendment_refusal(a, state)
        if why is not None:
            return why, False
        apply_amendment(a, state)  # type: ignore[arg-type]
        amended_in[p][a.trade_id] = state  # type: ignore[assignment]
        amends_in[p][ident] = offset << 64 | fp
        return None, False

    def decide_held(p: int, trade_date: str, last_seq: int, marker_offset: int) -> None:
        """An amended close marker kept: the held amendments of its day it covers are
        decided, in offset order (the sites' consumers.ledger._decide_held)."""
        rest = []
        for h in held_in.get(p, []):
            a, off, h_reasons, h_raws, h_dups, j = h
            if a.trade_date != trade_date or not covered(a.seq, off, last_seq, marker_offset):
                rest.append(h)
                continue
            why, dup = check_amendment(a, p, off)
            h_reasons[j], h_dups[j] = why, dup
            if why is None:
                h_raws[j] = None
        held_in[p] = rest

    def is_copy(t: tuple[str, str, int, str, str, int, str, str, str], partition: int,
                offset: int) -> bool:
        """Whether a trade (``trade_values``' order) is a later copy of one kept in its
        partition; its first copy is kept. Raises Malformed for a conflicting replay."""
        trade_id, trade_date = t[0], t[1]
        fp = fingerprint(t) & mask
        seen = seen_in.get(partition)
        if seen is None:
            seen = seen_in[partition] = {}
        kept = seen.get(trade_id)
        if kept is None:
            seen[trade_id] = offset << 64 | fp
            if trade_date != first_date.setdefault(partition, trade_date):
                other_dates.setdefault(partition, {})[trade_id] = trade_date
            return False
        if kept & mask == fp:
            return True
        raise Malformed(conflict_reason(trade_id, partition, kept >> 64))

    with hot_loop():  # a worker classifies millions of messages (consumers.runtime)
        for batch in batches:
            partitions = batch.column(0).to_pylist()
            offsets = batch.column(1).to_pylist()
            values = batch.column(2).to_pylist()
            kind_bytes = batch.column(3).to_pylist()
            n = len(values)
            kinds: list[str] = [TRADE] * n
            reasons: list[str | None] = [None] * n
            raws: list[bytes | None] = [None] * n
            dups: list[bool] = [False] * n
            trades: list[tuple[object, ...]] = [_NO_TRADE] * n
            close_dates: list[str | None] = [None] * n
            last_seqs: list[int | None] = [None] * n
            versions: list[int | None] = [None] * n
            notes: list[str | None] = [None] * n
            # A batch of plain trades only (most of a day): checked whole, as a site checks
            # a poll (consumers.parse.fast_trades, each value's verdict that of fast_trade);
            # what is left per message is keeping each trade's first copy.
            plain = fast_trades(values, max_bytes) if kind_bytes.count(_TRADE_B) == n else None
            holds = False  # the batch holds an amendment an amended close may yet decide
            for i in range(n if plain is None else 0):
                kb = kind_bytes[i]
                kind = (TRADE if kb == _TRADE_B else CLOSE if kb == _CLOSE_B else CANCEL
                        if kb == _CANCEL_B else CORRECT if kb == _CORRECT_B
                        else kb.decode("utf-8", "replace"))
                kinds[i] = kind
                try:
                    t = fast_trade_values(values[i], max_bytes) if kind == TRADE else None
                    if t is None:  # not a plain trade: the slow path decides (and says why)
                        obj = decode(values[i], max_bytes)
                    if kind == TRADE:
                        t = t or trade_values(obj)
                        why_late = late(partitions[i], t[1])  # type: ignore[arg-type]
                        if why_late is not None:
                            raise Malformed(why_late)
                        dups[i] = is_copy(t, partitions[i], offsets[i])
                        trades[i] = t
                    elif kind == CLOSE:
                        p = partitions[i]
                        cm = close_marker(obj, p)
                        if cm.amended:
                            kept = amended_closes.setdefault(p, {}).setdefault(cm.trade_date, [])
                            why = amended_marker_refusal(
                                cm, offsets[i], closes_in.get(p, {}).get(cm.trade_date), kept)
                            if why is None:
                                kept.append(KeptMarker(cm.amended, cm.last_seq, offsets[i]))
                                decide_held(p, cm.trade_date, cm.last_seq, offsets[i])
                            elif why != REPLAY:
                                raise Malformed(why)
                        else:
                            held = closes_in.setdefault(p, {}).setdefault(
                                cm.trade_date, (cm.last_seq, offsets[i]))
                            if held[0] != cm.last_seq:
                                raise Malformed(marker_conflict_reason(
                                    cm.trade_date, cm.partition, cm.last_seq, held[0],
                                    held[1]))
                        close_dates[i], last_seqs[i] = cm.trade_date, cm.last_seq
                    elif kind in AMENDMENTS:
                        a = amendment(obj, kind)
                        p = partitions[i]
                        trades[i] = (a.values if a.values is not None
                                     else (a.trade_id, a.trade_date, a.seq, *_NO_TRADE[3:]))
                        versions[i], notes[i] = a.version, a.reason
                        why_late = late(p, a.trade_date)
                        if why_late is not None:
                            # Held: a late dead letter unless an amended close marker
                            # behind it covers it (decide_held).
                            reasons[i], raws[i] = why_late, values[i]
                            held_in.setdefault(p, []).append(
                                (a, offsets[i], reasons, raws, dups, i))
                            holds = True
                            continue
                        why, dups[i] = check_amendment(a, p, offsets[i])
                        if why is not None:
                            raise Malformed(why)
                    else:
                        raise Malformed(f"unknown message type {kind!r}")
                except Malformed as e:
                    reasons[i], raws[i] = str(e), values[i]
            for i, t in enumerate(plain or ()):
                try:
                    if closes_in and (why_late := late(partitions[i], t[1])) is not None:
                        raise Malformed(why_late)
                    dups[i] = is_copy(t, partitions[i], offsets[i])
                except Malformed as e:
                    reasons[i], raws[i] = str(e), values[i]
                    continue
                trades[i] = t
            out = (batch, partitions, kinds, reasons, raws, trades, close_dates, last_seqs,
                   dups, versions, notes)
            if holds:
                held_batches.append(out)
            else:
                yield _output(*out)  # type: ignore[arg-type]
        for out in held_batches:  # every verdict is final once the task's input is read
            yield _output(*out)  # type: ignore[arg-type]


def _output(batch: pa.RecordBatch, partitions: list[int], kinds: list[str],
            reasons: list[str | None], raws: list[bytes | None],
            trades: list[tuple[object, ...]], close_dates: list[str | None],
            last_seqs: list[int | None], dups: list[bool], versions: list[int | None],
            notes: list[str | None]) -> pa.RecordBatch:
    """The verdicts as typed Arrow columns; the casts from the wire text are Arrow's (C),
    exact, and cannot fail on text the contract accepted. The row hashes are taken of the
    typed values (days, 1/10,000ths of the price, microseconds), as Spark's ``row_hash``
    takes them of the typed columns."""
    tid, tdate, seq, sym, price, qty, buyer, seller, at = (
        zip(*trades, strict=True) if trades else ((),) * 9)
    text = pa.string()
    dates = pa.array(tdate, text).cast(_A_DATE)
    prices = pa.array(price, text).cast(_A_PRICE)
    times = pa.array(at, text).cast(_A_TS)
    # A price times 10,000 is integral: the safe cast to int64 is exact or raises.
    row_hi, row_lo = row_hashes(
        tid, dates.cast(pa.int32()).to_pylist(), seq, partitions, sym,
        pc.multiply(prices, _UNITS).cast(pa.int64()).to_pylist(), qty, buyer, seller,
        times.cast(pa.int64()).to_pylist())
    return pa.RecordBatch.from_arrays([
        batch.column(0),
        batch.column(1),
        pa.array(reasons, text),
        pa.array(kinds, text),
        pa.array(raws, pa.binary()),
        pa.array(tid, text),
        dates,
        pa.array(seq, pa.int64()),
        pa.array(sym, text),
        prices,
        pa.array(qty, pa.int64()),
        pa.array(buyer, text),
        pa.array(seller, text),
        times,
        pa.array(close_dates, text).cast(_A_DATE),
        pa.array(last_seqs, pa.int64()),
        pa.array(dups, pa.bool_()),
        pa.array(versions, pa.int32()),
        pa.array(notes, text),
        pa.array(row_hi, pa.int64()),
        pa.array(row_lo, pa.int64()),
    ], names=CLASSIFIED_SCHEMA.fieldNames())
