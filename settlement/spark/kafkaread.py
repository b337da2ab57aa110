"""A day's Kafka offset ranges read with the sites' client (confluent-kafka), read_committed,
as the staged batches the classifier takes (``settlement.spark.parse.stage``'s columns).

Two readers use it: the driver, for a small day (``settlement.spark.smallday``), and each
Spark task's Python worker, for any other day on a local master (``classify_ranges``): the
task reads its Kafka partition's range and classifies it in the same process, so the
messages never pass through the JVM on their way in. Spark's Kafka source fetched them in the
JVM, built a row of each, and wrote them to the worker as Arrow: fetching a 2M day took 10.4 s
as a fresh JVM's first job (4.1 s once warmed), of a 27 s read (docs/benchmarks.md).

Imports nothing of Spark nor the settings: a worker imports this module to run
``classify_ranges``; it gets the client's configuration as a plain dict.
"""

from __future__ import annotations

import bisect
import re
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa

from consumers.parse import message_type as site_message_type
from settlement.contract import CLOSE, CLOSE_HEADERS, TRADE, TRADE_HEADERS
from settlement.errors import SettlementError

# What a Spark task hands the classifier (``settlement.spark.parse.stage``).
STAGED = pa.schema([("kafka_partition", pa.int32()), ("kafka_offset", pa.int64()),
                    ("value", pa.binary()), ("_kind", pa.binary())])
# Rows per staged batch: Spark's Arrow batch size (spark.sql.execution.arrow.maxRecordsPerBatch),
# the size the classifier's whole-batch path was measured at.
BATCH_ROWS = 10_000
_TRADE_B, _CLOSE_B = TRADE.encode(), CLOSE.encode()
# Seconds without a message of the range before the read is an error.
IDLE_TIMEOUT = 120.0


class KafkaReadError(SettlementError):
    """The day's committed range could not be read whole."""


def worker_error(text: str) -> KafkaReadError | None:
    """The KafkaReadError a Python worker raised, from the text of the Spark error that
    carries it (its traceback), to be raised in the driver with its own words."""
    found = re.findall(r"KafkaReadError: (.+)", text)
    return KafkaReadError(found[-1].strip()) if found else None


class TooLarge(Exception):
    """The range's messages add up to more than the reader may hold."""


def message_type(headers: list[tuple[str, bytes]] | None) -> bytes:
    """The type header by the sites' rule (``consumers.parse.message_type``), as the bytes the
    classifier reads (``settlement.spark.parse.stage``); the classifier decodes them with
    "replace" again, so a value that is not UTF-8 gets the same verdict either way."""
    return site_message_type(headers).encode()


def consumer_config(client: Mapping[str, Any]) -> dict[str, Any]:
    """A range reader's consumer: the settlement's client settings (``Settings.
    kafka_client_config()``) read_committed, by assignment, committing nothing."""
    return {**client,
            # Settlement's principal may use its probe groups (settlement.kafka.security
            # SETTLEMENT_GROUP_PREFIXES): a read by assignment, nothing committed.
            "group.id": f"eod-probe-read-{uuid.uuid4().hex}",
            "isolation.level": "read_committed", "enable.auto.commit": False,
            # An offset retention deleted since the day was located is an error, not a
            # silent jump to the log's end.
            "auto.offset.reset": "error",
            "fetch.wait.max.ms": 10, "log_level": 3,
            # A range is read as fast as the broker hands it over: 1 MB per partition and
            # fetch (the default) made a 695,000-message partition a latency-bound 5.5 s of
            # round trips, 16 MB 2.5 s, the client's CPU then the limit (the broker caps a
            # fetch at its own fetch.max.bytes).
            "max.partition.fetch.bytes": 16 << 20, "fetch.max.bytes": 64 << 20}


def read_ranges(config: Mapping[str, Any], topic: str, ranges: Mapping[int, tuple[int, int]],
                idle_timeout: float = IDLE_TIMEOUT, batch_rows: int = BATCH_ROWS,
                max_bytes: int | None = None) -> Iterator[pa.RecordBatch]:
    """Each partition's [start, end) as staged batches of one partition each, in offset order
    per partition, read_committed (``config``: ``consumer_config``'s).

    A located day ends with its close marker, a committed message at ``end - 1``, so a
    partition is read whole when that offset arrives (aborted records and transaction
    markers in between are never returned, as in Spark's read). When no message of the
    ranges arrives for ``idle_timeout`` seconds the read is an error naming the partitions
    and how far each got, and the last error the client was retrying. TooLarge when the
    values read add up to more than ``max_bytes`` (None: no limit; a worker streams)."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    # Errors librdkafka retries by itself (a broker restarting, a leader moving): the read
    # goes on until its deadline, and the last one is named if it is not met.
    passing = {KafkaError._PARTITION_EOF, KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN}
    last_error = ""
    held = 0
    todo = {p: r for p, r in ranges.items() if r[1] > r[0]}
    rows: dict[int, tuple[list[int], list[bytes | None], list[bytes]]] = {
        p: ([], [], []) for p in todo}
    reached = {p: s - 1 for p, (s, _) in todo.items()}

    def batch(p: int) -> pa.RecordBatch:
        offsets, values, kinds = rows[p]
        rows[p] = ([], [], [])
        return pa.RecordBatch.from_arrays(
            [pa.array([p] * len(offsets), pa.int32()), pa.array(offsets, pa.int64()),
             pa.array(values, pa.binary()), pa.array(kinds, pa.binary())], schema=STAGED)

    c = Consumer(dict(config))
    deadline = time.monotonic() + idle_timeout
    try:
        c.assign([TopicPartition(topic, p, s) for p, (s, _) in sorted(todo.items())])
        while todo:
            if time.monotonic() > deadline:
                where = ", ".join(f"partition {p} at offset {reached[p] + 1} of [{s}, {e})"
                                  for p, (s, e) in sorted(todo.items()))
                raise KafkaReadError(
                    f"the day's range was not read whole: no message for {idle_timeout:.0f} s "
                    f"at {where}{last_error}")
            by_partition: dict[int, list[Any]] = {}
            for m in c.consume(batch_rows, timeout=0.02):
                err = m.error()
                if err is not None:
                    if err.code() in passing or (err.retriable() and not err.fatal()):
                        if err.code() != KafkaError._PARTITION_EOF:
                            last_error = f" (last Kafka error: {err.str()})"
                        continue
                    raise KafkaReadError(f"Kafka refused the day's read: {err.str()}")
                by_partition.setdefault(m.partition(), []).append(m)
            # Each partition's messages of the poll at once: a 2M day is millions of them, and
            # per message this is a few calls into the client, not a dozen Python steps.
            for p, msgs in by_partition.items():
                if p not in todo:
                    continue  # a partition done
                end = todo[p][1]
                msgs = _in_range(msgs, reached[p], end)
                if not msgs:
                    continue  # past the range (a later day)
                values = [m.value() for m in msgs]
                if max_bytes is not None:
                    held += sum(len(v) for v in values if v is not None)
                    if held > max_bytes:
                        raise TooLarge(f"the range holds more than {max_bytes} bytes of "
                                       "messages")
                offsets, kept, kinds = rows[p]
                offsets.extend([m.offset() for m in msgs])
                kept.extend(values)
                kinds.extend([_TRADE_B if h == TRADE_HEADERS else _CLOSE_B if h == CLOSE_HEADERS
                              else message_type(h) for h in [m.headers() for m in msgs]])
                reached[p] = offsets[-1]
                deadline = time.monotonic() + idle_timeout
                if reached[p] >= end - 1:
                    del todo[p]
                    c.pause([TopicPartition(topic, p)])
                    yield batch(p)
                elif len(offsets) >= batch_rows:
                    yield batch(p)
    finally:
        c.close()


def _in_range(msgs: list[Any], reached: int, end: int) -> list[Any]:
    """The messages of one partition after offset ``reached`` and before ``end``, in the
    order polled. The client returns a partition's messages in offset order, so they are a
    slice; were they not, each is checked against the last one taken."""
    offsets = [m.offset() for m in msgs]
    if all(a < b for a, b in zip(offsets, offsets[1:], strict=False)):
        return msgs[bisect.bisect_right(offsets, reached):bisect.bisect_left(offsets, end)]
    out = []
    for m, off in zip(msgs, offsets, strict=True):
        if reached < off < end:
            out.append(m)
            reached = off
    return out


def classify_ranges(ids: Iterator[pa.RecordBatch], ranges: Sequence[tuple[int, int, int]],
                    config: Mapping[str, Any], topic: str, idle_timeout: float,
                    max_bytes: int) -> Iterator[pa.RecordBatch]:
    """A Spark task's Python worker side (``settlement.spark.parse.classify_kafka_ranges``):
    ``ids`` name entries of ``ranges`` ((partition, start, end)); each partition's range is
    read here and classified as it arrives, one ``classify_arrow`` per partition, as a task
    of Spark's Kafka source would (its state is per partition, in offset order)."""
    from settlement.spark.worker import classify_arrow

    for b in ids:
        for i in b.column(0).to_pylist():
            p, start, end = ranges[i]
            yield from classify_arrow(
                read_ranges(config, topic, {p: (start, end)}, idle_timeout), max_bytes)
