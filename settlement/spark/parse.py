"""Classifying a raw Kafka batch: valid trades, close markers, and dead letters with a reason.

There is one parser of a message, ``consumers.parse``, and this module runs it inside Spark:
each task streams its Kafka partition to a Python worker as Arrow batches (``mapInArrow``),
the worker applies exactly the checks a consumer site applies (orjson, then the contract's
rules), and hands the verdicts back as typed Arrow columns (dates, ``decimal(18,4)`` prices
and UTC timestamps converted by Arrow's C casts, never through a float). So a site and the
end of day cannot disagree about a message, and ``tests/test_parity.py`` checks what is left
to disagree about: the typed values against what PostgreSQL makes of a site's COPY line.
The worker also hashes each trade's canonical row for validation's checksums
(``settlement.spark.rowhash.row_hashes``): the fields are at hand there, and Spark's own
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

from collections.abc import Callable, Mapping
from functools import partial
from typing import Any, NamedTuple

from pyspark.sql import Column, DataFrame, SparkSession
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
    CLOSE,
    MISSING_TYPE_MEANS,
    TRADE,
    TYPE_HEADER,
)
from settlement.spark import kafkaread
from settlement.spark.deferred import resolve_deferred
from settlement.spark.jvmclassify import classify_jvm
from settlement.spark.kafkaread import classify_ranges, consumer_config
from settlement.spark.native import classify_native, native_columns
from settlement.spark.schemas import PRICE, TRADE_SCHEMA
from settlement.spark.worker import classify_arrow

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
    # The canonical row's hash halves (``settlement.spark.rowhash.row_hashes``) of a row with
    # a trade id: validation's checksums, taken where the fields are at hand already.
    StructField("_row_hi", LongType()),
    StructField("_row_lo", LongType()),
])


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
                          cache: Callable[[DataFrame], DataFrame] | None = None,
                          jvm: bool = False) -> DataFrame:
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

    With ``jvm``, every Kafka partition is classified by compiled Java in the JVM
    (``settlement.spark.jvmclassify``), the messages it defers (anything but plain trades and
    close markers) by the Python classifier in the driver, and a partition it gives back by
    the Python worker; ``cache`` then persists the JVM's verdicts (read several times).
    """
    staged = stage(raw)
    limit = max_value_bytes if max_value_bytes is not None else 2**62

    def python(rows: DataFrame) -> DataFrame:
        return rows.mapInArrow(partial(classify_arrow, max_bytes=limit), CLASSIFIED_SCHEMA)

    if jvm:
        # Classified in the JVM (settlement.spark.jvmclassify); the partitions it leaves to
        # the worker are known once it has run, so ``cache`` persists its verdicts.
        verdicts = classify_jvm(staged, limit)
        verdicts = cache(verdicts) if cache is not None else verdicts
        return resolve_deferred(verdicts, limit, lambda parts: python(
            staged.where(F.col("kafka_partition").isin(parts)))).rows
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


def classify_kafka_ranges(spark: SparkSession, client: Mapping[str, Any], topic: str,
                          ranges: Mapping[int, tuple[int, int]],
                          max_value_bytes: int | None = None,
                          idle_timeout: float | None = None) -> DataFrame:
    """``classify_kafka_values``' rows for the offset ranges, each Kafka partition's read and
    classified by one task's Python worker (``settlement.spark.kafkaread.classify_ranges``)
    with the sites' client (``client``: ``Settings.kafka_client_config()``), not fetched by
    Spark's Kafka source in the JVM. The longest ranges are the first tasks: on two cores
    the last task to start is then a short one."""
    todo = sorted(((p, s, e) for p, (s, e) in ranges.items() if e > s),
                  key=lambda r: (r[1] - r[2], r[0]))
    ids = spark.range(0, len(todo), 1, max(1, len(todo)))
    return ids.mapInArrow(partial(
        classify_ranges, ranges=todo, config=consumer_config(client), topic=topic,
        idle_timeout=kafkaread.IDLE_TIMEOUT if idle_timeout is None else idle_timeout,
        max_bytes=max_value_bytes if max_value_bytes is not None else 2**62),
        CLASSIFIED_SCHEMA)


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
