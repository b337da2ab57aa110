"""A small day read by the driver and handed to Spark as a frame in memory.

A close of a small day (``settlement.spark.session.is_small_day``: at most
``spark_small_day_rows`` offsets or ledger rows) spent most of its read on Spark's machinery,
not on the day: from Kafka, six tasks in three waves on two cores, a Python worker started
for each to run the classifier, Arrow's first use in the JVM and the worker (3.5-4 s of a
5.7 s read for 2,000 trades, docs/benchmarks.md); from a ledger, a JDBC read that every
later query of the close (dedupe, netting, a dozen validation checks) ran again.

Here the driver reads the day itself: the Kafka offset ranges through one read_committed
consumer (the client the sites and the source chooser use), classified by the very function
a Spark task's Python worker runs (``settlement.spark.worker.classify_arrow``, one call per
Kafka partition, in offset order, as a task sees it); a ledger's day by one query (one
snapshot, where the JDBC read's slices were each their own). The rows become one Arrow-backed
frame in the JVM, of the same schema the Spark read gives, and everything after the read
(facts, dedupe, netting, validation) is unchanged. ``tests/test_smallday.py`` holds the two
reads of the same days to the same rows.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession

from consumers.parse import message_type as site_message_type
from settlement.config import Settings
from settlement.contract import LEDGER_COLUMNS
from settlement.db import connect
from settlement.spark.parse import CLASSIFIED_SCHEMA
from settlement.spark.schemas import TRADE_SCHEMA
from settlement.spark.session import local_frame
from settlement.spark.worker import classify_arrow

# What a Spark task hands the classifier (``settlement.spark.parse.stage``).
STAGED = pa.schema([("kafka_partition", pa.int32()), ("kafka_offset", pa.int64()),
                    ("value", pa.binary()), ("_kind", pa.binary())])


# The most message bytes a driver read holds (a small day is counted in offsets, and a day of
# few but huge messages is still Spark's to read): 2,000 gateway trades are about 0.5 MB.
MAX_READ_BYTES = 256 << 20


class KafkaReadError(RuntimeError):
    """The day's committed range could not be read whole in time."""


class TooLarge(Exception):
    """The range's messages add up to more than a driver read holds."""


def message_type(headers: list[tuple[str, bytes]] | None) -> bytes:
    """The type header by the sites' rule (``consumers.parse.message_type``), as the bytes the
    classifier reads (``settlement.spark.parse.stage``); the classifier decodes them with
    "replace" again, so a value that is not UTF-8 gets the same verdict either way."""
    return site_message_type(headers).encode()


def fetch_ranges(settings: Settings, ranges: Mapping[int, tuple[int, int]],
                 timeout: float = 120.0, max_bytes: int | None = None
                 ) -> dict[int, pa.RecordBatch]:
    """Each partition's [start, end) as one staged batch, read_committed, in offset order.

    A located day ends with its close marker, a committed message at ``end - 1``, so a
    partition is read whole when that offset arrives (aborted records and transaction
    markers in between are never returned, as in Spark's read). A range not read whole
    within ``timeout`` seconds is an error naming the partitions and how far each got;
    TooLarge when its values add up to more than ``max_bytes`` (MAX_READ_BYTES)."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    # Errors librdkafka retries by itself (a broker restarting, a leader moving): the read
    # goes on until its deadline, and the last one is named if it is not met.
    passing = {KafkaError._PARTITION_EOF, KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN}
    limit = MAX_READ_BYTES if max_bytes is None else max_bytes
    held = 0
    last_error = ""
    todo = {p: r for p, r in ranges.items() if r[1] > r[0]}
    rows: dict[int, tuple[list[int], list[bytes | None], list[bytes]]] = {
        p: ([], [], []) for p in ranges}
    reached = {p: s - 1 for p, (s, _) in todo.items()}
    c = Consumer({**settings.kafka_client_config(),
                  # Settlement's principal may use its probe groups (settlement.kafka.security
                  # SETTLEMENT_GROUP_PREFIXES): a read by assignment, nothing committed.
                  "group.id": f"eod-probe-read-{uuid.uuid4().hex}",
                  "isolation.level": "read_committed", "enable.auto.commit": False,
                  # An offset retention deleted since the day was located is an error, not
                  # a silent jump to the log's end.
                  "auto.offset.reset": "error",
                  "fetch.wait.max.ms": 10, "log_level": 3})
    deadline = time.monotonic() + timeout
    try:
        c.assign([TopicPartition(settings.topic, p, s) for p, (s, _) in sorted(todo.items())])
        while todo:
            if time.monotonic() > deadline:
                where = ", ".join(f"partition {p} at offset {reached[p] + 1} of [{s}, {e})"
                                  for p, (s, e) in sorted(todo.items()))
                raise KafkaReadError(f"the day's range was not read whole in {timeout:.0f} s: "
                                     f"{where}{last_error}")
            for m in c.consume(1000, timeout=0.02):
                err = m.error()
                if err is not None:
                    if err.code() in passing or (err.retriable() and not err.fatal()):
                        if err.code() != KafkaError._PARTITION_EOF:
                            last_error = f" (last Kafka error: {err.str()})"
                        continue
                    raise KafkaReadError(f"Kafka refused the day's read: {err.str()}")
                p, off = m.partition(), m.offset()
                if p not in todo or off >= todo[p][1] or off <= reached[p]:
                    continue  # past the range (a later day), or a partition done
                offsets, values, kinds = rows[p]
                value = m.value()
                held += len(value or b"")
                if held > limit:
                    raise TooLarge(f"the range holds more than {limit} bytes of messages")
                offsets.append(off)
                values.append(value)
                kinds.append(message_type(m.headers()))
                reached[p] = off
                if off >= todo[p][1] - 1:
                    del todo[p]
                    c.pause([TopicPartition(settings.topic, p)])
    finally:
        c.close()
    return {p: pa.RecordBatch.from_arrays(
        [pa.array([p] * len(offs), pa.int32()), pa.array(offs, pa.int64()),
         pa.array(values, pa.binary()), pa.array(kinds, pa.binary())], schema=STAGED)
        for p, (offs, values, kinds) in sorted(rows.items())}


def classify_batches(batches: Mapping[int, pa.RecordBatch], max_bytes: int) -> pa.Table:
    """The classifier's verdicts (CLASSIFIED_SCHEMA), one call per partition as a task makes
    it: its state (copies, markers, amendments) is per partition and offset order."""
    out: list[pa.RecordBatch] = []
    for _, batch in sorted(batches.items()):
        out.extend(classify_arrow(iter([batch]), max_bytes))
    if not out:
        return _empty_classified()
    return pa.Table.from_batches(out)


def _empty_classified() -> pa.Table:
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(CLASSIFIED_SCHEMA, timezone="UTC").empty_table()


def kafka_day(spark: SparkSession, settings: Settings, ranges: Mapping[int, tuple[int, int]]
              ) -> DataFrame:
    """The classified day (``settlement.spark.parse.classify_kafka_values``' rows), read and
    classified in the driver."""
    limit = settings.max_message_bytes
    table = classify_batches(fetch_ranges(settings, ranges),
                             limit if limit is not None else 2**62)
    return spark.createDataFrame(table, CLASSIFIED_SCHEMA)


def ledger_day(spark: SparkSession, settings: Settings, ledger: str, trade_date: str
               ) -> DataFrame:
    """One ledger's day (TRADE_SCHEMA) by one query, as a frame in memory."""
    with connect(settings.ledger_dsn(ledger)) as conn:
        rows = conn.execute(
            f"select {', '.join(LEDGER_COLUMNS)} from trades where trade_date = %s",
            (trade_date,)).fetchall()
    return local_frame(spark, rows, TRADE_SCHEMA)
