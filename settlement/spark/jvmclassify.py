"""Plain trades and close markers classified by compiled Java in the JVM
(``jvm/classifier/settle/KafkaClassifier.java``), per Kafka partition in offset order, as the
Python worker classifies them (``settlement.spark.worker``).

Why: a Kafka close spent most of its read in the Python workers, about 5 us of CPU per
message to parse and check it (a 2M day's read was 23-35 s as a process). Spark's own
expressions could not do better (``settlement.spark.native``: the pattern, one split and the
casts cost more than the workers, and its dedupe shuffled every message). Java compiled
ahead does what the worker does, message by message in the task that reads the partition, so
nothing is shuffled and nothing crosses to Python. Measured as users run the close
(docs/benchmarks.md): about 10% less CPU for a 2M day's close, and on two cores no wall-clock
gain beyond the machine's noise (the read shares the cores with what starts beside it). The
value is matched against the
canonical trade pattern with a group per field (``settlement.spark.canonical.TRADE_CAPTURE``,
generated from the contract, so it is strict where the contract is lenient), its fields typed,
its row hashed as the worker hashes it (``settlement.spark.rowhash``), and its copies and
late trades decided with the worker's rules and wording (``consumers.parse``).

A message the patterns do not vouch for (an amendment, an amended close, a malformed or unusual
value: a few per partition on the days exchanges send) is deferred: the Java task emits it
with its value and type header and goes on, its partition's state untouched. The deferred
messages are then decided in the driver by the Python classifier itself (``resolve_deferred``),
run over them and the JVM's rows they depend on (the first kept copy of each trade id they
name, rebuilt as canonical text, and the partition's kept close markers), in offset order: an
amendment finds its trade, a late amendment its amended close, a non-canonical copy the copy
it repeats or conflicts with, as in the whole partition. Only a deferred message that changes
what the messages after it were classified with (a valid trade the JVM did not keep, a plain
close marker it did not see) gives its partition back to the Python worker, read again whole;
so does a partition with more than ``DEFER_LIMIT`` deferred messages. Why it is exact: the
Python classifier's verdict on a message depends on the partition's messages before it only
through the trades kept per id, the close markers kept per date and the amendments and amended
closes (all deferred); the first two are the JVM rows handed to it, and no deferred message
that could change them is left standing.
``tests/test_native.py`` holds the two classifiers to the same row for every message.

The jar is built by ``make setup`` (``javac`` against Spark's own jars and the Kafka client
the connector step fetched); a close without it reads with the workers as before (its JSON's
``read_by`` says ``workers``).
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from py4j.protocol import Py4JError
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from consumers.parse import (
    Malformed,
    close_marker,
    conflict_reason,
    decode,
    late_reason,
    marker_conflict_reason,
)
from settlement.contract import (
    CLOSE,
    CLOSE_FIELDS,
    CLOSE_LAST_SEQ,
    MISSING_TYPE_MEANS,
    QUANTITY,
    SEQ,
    TRADE,
    TRADE_FIELDS,
    TYPE_HEADER,
)
from settlement.spark.canonical import CLOSE_PATTERN, TRADE_CAPTURE, anchored
from settlement.spark.worker import classify_arrow

JAR_NAME = "settle-classifier.jar"
CLASS = "settle.KafkaClassifier"

# Sentinel arguments the reasons are worded with, and the tokens the Java side replaces.
_DAY, _ID = "\x02day", "\x02id"
_P, _SEQ, _KSEQ, _KOFF = -9101, -9103, -9104, -9102
# Deferred messages a Kafka partition may have before the JVM gives it to the Python worker
# whole: they are decided in the driver, so this bounds what it collects (with the JVM rows
# they need, a few hundred bytes each). A realistic 10M-trade day defers about 14,000 per
# partition (0.1% malformed, 0.5% amended); a producer writing trades in another JSON shape
# would defer them all, and is better read by the workers.
DEFER_LIMIT = 50_000
# The JVM's rows a deferred message may depend on, with their canonical text rebuilt.
_KEPT_TRADES = "_kind = 'trade' and reason is null and not _dup and not _deferred"
_KEPT_CLOSES = "_kind = 'close' and reason is null and not _deferred"


def classifier_jar(jars_dir: Path) -> Path:
    """Where ``make setup`` puts the compiled classifier (``Settings.jars_dir``)."""
    return jars_dir / "classifier" / JAR_NAME


def _tokens(text: str, args: dict[str, str]) -> str:
    """``text`` with each sentinel replaced by its Java token; each must occur once."""
    for sentinel, token in args.items():
        if text.count(sentinel) != 1:
            raise ValueError(f"a reason's wording changed: {text!r}")
        text = text.replace(sentinel, token)
    return text


def reason_templates() -> tuple[str, str, str]:
    """The late, conflicting replay and conflicting marker reasons, worded by
    ``consumers.parse`` with the Java side's tokens where their values go."""
    late = _tokens(late_reason(_DAY, _P, _KOFF), {
        _DAY: "\x01day", str(_P): "\x01p", str(_KOFF): "\x01koff"})
    conflict = _tokens(conflict_reason(_ID, _P, _KOFF), {
        repr(_ID): "\x01id", str(_P): "\x01p", str(_KOFF): "\x01koff"})
    marker = _tokens(marker_conflict_reason(_DAY, _P, _SEQ, _KSEQ, _KOFF), {
        _DAY: "\x01day", str(_P): "\x01p", str(_SEQ): "\x01seq", str(_KSEQ): "\x01kseq",
        str(_KOFF): "\x01koff"})
    return late, conflict, marker


def _classifier(spark: SparkSession, max_bytes: int) -> Any:
    """The Java classifier with the contract's patterns, bounds and wordings."""
    late, conflict, marker = reason_templates()
    return spark._jvm.settle.KafkaClassifier(  # type: ignore[union-attr]
        anchored(TRADE_CAPTURE), anchored(CLOSE_PATTERN), max_bytes, SEQ.maximum,
        QUANTITY.maximum, CLOSE_LAST_SEQ.maximum, late, conflict, marker, MISSING_TYPE_MEANS,
        TYPE_HEADER, DEFER_LIMIT)


def classify_jvm(staged: DataFrame, max_bytes: int) -> DataFrame:
    """The staged messages (``settlement.spark.parse.stage``), each Kafka partition's in
    offset order within one task, classified in the JVM: ``CLASSIFIED_SCHEMA``'s columns,
    ``_deferred`` (true on a message left to the Python classifier, its value in ``raw`` and
    its type header in ``_type``) and ``_fallback`` (true on the one row of a Kafka partition
    left to the worker whole): ``resolve_deferred`` makes them ``CLASSIFIED_SCHEMA`` rows.
    The rows are built by the Java side in Spark's internal form, already of those types.

    The close reads with ``classify_jvm_ranges``; this runs the same Java classification over
    a frame, which is how tests/test_native.py holds it to the Python classifier's rows."""
    spark = staged.sparkSession
    return DataFrame(_classifier(spark, max_bytes).classify(staged._jdf), spark)


def classify_jvm_ranges(spark: SparkSession, consumer: Mapping[str, str], topic: str,
                        ranges: Mapping[int, tuple[int, int]], max_bytes: int,
                        idle_timeout: float) -> DataFrame:
    """``classify_jvm``'s rows for the offset ranges, each Kafka partition's read by one
    Spark task with the Java client (``consumer``: Spark's Kafka source options without
    their ``kafka.`` prefix) and classified as it arrives, longest ranges first. A cold JVM
    fetched a 2M day so in 4.6 s on two threads, Spark's Kafka source in 13-16 s (its rows
    built for every record and projected again): docs/benchmarks.md."""
    todo = sorted(((p, s, e) for p, (s, e) in ranges.items() if e > s),
                  key=lambda r: (r[1] - r[2], r[0]))
    jdf = _classifier(spark, max_bytes).classifyRanges(
        spark._jsparkSession, dict(consumer), topic, [p for p, _, _ in todo],
        [s for _, s, _ in todo], [e for _, _, e in todo], int(idle_timeout * 1000))
    return DataFrame(jdf, spark)


class Deferred:
    """The JVM's verdicts with their deferred messages decided (``resolve_deferred``)."""

    def __init__(self, rows: DataFrame, workers: list[int], deferred: int) -> None:
        self.rows = rows  # CLASSIFIED_SCHEMA, every message once
        self.workers = workers  # the Kafka partitions read again by the Python worker
        self.deferred = deferred  # the messages the Python classifier decided in the driver

    @property
    def read_by(self) -> str:
        """What the close's JSON says read the day (``read_by``)."""
        if self.workers:
            return f"jvm, workers for partitions {self.workers}"
        return "jvm" if not self.deferred else f"jvm, {self.deferred} messages by python"


def resolve_deferred(verdicts: DataFrame, max_bytes: int,
                     python: Callable[[list[int]], DataFrame]) -> Deferred:
    """``classify_jvm``'s verdicts (persisted: this reads them a few times) as
    ``CLASSIFIED_SCHEMA`` rows: the deferred messages decided by the Python classifier with
    the JVM rows they depend on, and the partitions that must go back to the worker
    classified by ``python`` (their rows, ``CLASSIFIED_SCHEMA``) instead. The first pass
    over ``verdicts`` is where the JVM reads Kafka."""
    spark = verdicts.sparkSession
    marked = verdicts.where("_fallback or _deferred").select(
        "kafka_partition", "kafka_offset", "raw", "_type", "_fallback").collect()
    workers = {r[0] for r in marked if r[4]}
    deferred = [(r[0], r[1], r[2], r[3]) for r in marked if r[0] not in workers]
    decided: DataFrame | None = None
    if deferred:
        table = _decide(verdicts, deferred, max_bytes)
        workers |= _state_changers(table, deferred, max_bytes)
        if workers:
            table = table.filter(pc.invert(pc.is_in(table["kafka_partition"],
                                                    pa.array(sorted(workers), pa.int32()))))
        if table.num_rows:
            decided = spark.createDataFrame(table, _classified_schema())
    rows = verdicts.where("not _deferred").drop("_fallback", "_deferred", "_type")
    out = rows.where(~F.col("kafka_partition").isin(sorted(workers))) if workers else rows
    if decided is not None:
        out = out.unionByName(decided)
    if workers:
        out = out.unionByName(python(sorted(workers)))
    kept = sum(1 for d in deferred if d[0] not in workers)
    return Deferred(out, sorted(workers), kept)


def _classified_schema() -> Any:
    from settlement.spark.parse import CLASSIFIED_SCHEMA  # parse imports this module

    return CLASSIFIED_SCHEMA


def _trade_id(value: bytes | None, max_bytes: int) -> str | None:
    """The trade id a message names, when it is a JSON object the contract reads."""
    try:
        tid = decode(value, max_bytes).get("trade_id")
    except Malformed:
        return None
    return tid if isinstance(tid, str) else None


def _decide(verdicts: DataFrame, deferred: list[tuple[int, int, bytes | None, bytes | None]],
            max_bytes: int) -> pa.Table:
    """The deferred messages' rows (``CLASSIFIED_SCHEMA``), as the Python classifier gives
    them over the deferred messages and the JVM's rows they depend on, in offset order."""
    spark = verdicts.sparkSession
    parts = sorted({d[0] for d in deferred})
    ids = sorted({(d[0], t) for d in deferred if (t := _trade_id(d[2], max_bytes))})
    context: list[tuple[int, int, bytes, bytes]] = []
    if ids:
        keys = spark.createDataFrame(ids, "kafka_partition int, trade_id string")
        kept = verdicts.where(_KEPT_TRADES).join(
            F.broadcast(keys), ["kafka_partition", "trade_id"], "left_semi").select(
            "kafka_partition", "kafka_offset", "trade_id", F.col("trade_date").cast("string"),
            "seq", "symbol", F.col("price").cast("string"), "quantity", "buyer", "seller",
            F.unix_micros("executed_at"))
        context += [(r[0], r[1], _trade_text(r[2:]), TRADE.encode()) for r in kept.collect()]
    closes = verdicts.where(_KEPT_CLOSES).where(F.col("kafka_partition").isin(parts)).select(
        "kafka_partition", "kafka_offset", F.col("_close_date").cast("string"), "_last_seq")
    context += [(r[0], r[1], _close_text(r[2], r[0], r[3]), CLOSE.encode())
                for r in closes.collect()]
    log = sorted([*deferred, *context], key=lambda m: (m[0], m[1]))
    batch = pa.RecordBatch.from_arrays(
        [pa.array([m[0] for m in log], pa.int32()), pa.array([m[1] for m in log], pa.int64()),
         pa.array([m[2] for m in log], pa.binary()), pa.array([m[3] for m in log], pa.binary())],
        names=["kafka_partition", "kafka_offset", "value", "_kind"])
    got = pa.Table.from_batches(list(classify_arrow(iter([batch]), max_bytes)))
    keys = pc.binary_join_element_wise(
        pc.cast(got["kafka_partition"], pa.string()), pc.cast(got["kafka_offset"], pa.string()),
        ":")
    wanted = pa.array([f"{d[0]}:{d[1]}" for d in deferred], pa.string())
    return got.filter(pc.is_in(keys, wanted))


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


def _state_changers(decided: pa.Table,
                    deferred: list[tuple[int, int, bytes | None, bytes | None]],
                    max_bytes: int) -> set[int]:
    """The partitions where a deferred message (``decided``: their rows) changes the state
    the JVM classified the messages after it with: a valid trade kept as its id's first copy,
    or a valid plain close marker (an amended one only decides amendments, all deferred)."""
    value_of = {(d[0], d[1]): d[2] for d in deferred}
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


def loaded(spark_jvm: object) -> bool:
    """Whether the session's JVM has the classifier (its jar in ``spark.jars``)."""
    try:
        spark_jvm.java.lang.Class.forName(  # type: ignore[attr-defined]
            CLASS, False, spark_jvm.java.lang.Thread.currentThread().getContextClassLoader())
    except Py4JError:  # a ClassNotFoundException, as py4j raises it
        return False
    return True

