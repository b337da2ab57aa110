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

from collections.abc import Mapping

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession

from settlement.config import Settings
from settlement.contract import LEDGER_COLUMNS
from settlement.db import connect
from settlement.spark.kafkaread import STAGED, consumer_config, read_ranges
from settlement.spark.parse import CLASSIFIED_SCHEMA
from settlement.spark.schemas import TRADE_SCHEMA
from settlement.spark.session import local_frame
from settlement.spark.worker import classify_arrow

# The most message bytes a driver read holds (a small day is counted in offsets, and a day of
# few but huge messages is still Spark's to read): 2,000 gateway trades are about 0.5 MB.
MAX_READ_BYTES = 256 << 20


def fetch_ranges(settings: Settings, ranges: Mapping[int, tuple[int, int]],
                 timeout: float = 120.0, max_bytes: int | None = None
                 ) -> dict[int, pa.RecordBatch]:
    """Each partition's [start, end) as one staged batch, read_committed, in offset order
    (``settlement.spark.kafkaread.read_ranges``: an error when nothing arrives for
    ``timeout`` seconds); TooLarge when its values add up to more than ``max_bytes``
    (MAX_READ_BYTES)."""
    got: dict[int, list[pa.RecordBatch]] = {p: [] for p in ranges}
    for batch in read_ranges(consumer_config(settings.kafka_client_config()), settings.topic,
                             ranges, timeout,
                             max_bytes=MAX_READ_BYTES if max_bytes is None else max_bytes):
        got[batch.column(0)[0].as_py()].append(batch)
    return {p: pa.concat_batches(batches) if batches
            else pa.RecordBatch.from_pylist([], schema=STAGED)
            for p, batches in sorted(got.items())}


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
