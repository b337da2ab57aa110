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

A Kafka partition holding anything else (an amendment, an amended close, a value the pattern
does not vouch for, a value over the size limit) is the Python worker's, whole, since its
state spans the partition: the Java task emits one ``_fallback`` row for it and skips the
rest, and the caller classifies that partition again by the worker (``with_fallback``).
``tests/test_native.py`` holds the two classifiers to the same row for every message.

The jar is built by ``make setup`` (``javac`` against Spark's own jars and the Kafka client
the connector step fetched); a close without it reads with the workers as before (its JSON's
``read_by`` says ``workers``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from py4j.protocol import Py4JError
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from consumers.parse import conflict_reason, late_reason, marker_conflict_reason
from settlement.contract import (
    CLOSE_LAST_SEQ,
    MISSING_TYPE_MEANS,
    QUANTITY,
    SEQ,
    TYPE_HEADER,
)
from settlement.spark.canonical import CLOSE_PATTERN, TRADE_CAPTURE, anchored

JAR_NAME = "settle-classifier.jar"
CLASS = "settle.KafkaClassifier"

# Sentinel arguments the reasons are worded with, and the tokens the Java side replaces.
_DAY, _ID = "\x02day", "\x02id"
_P, _SEQ, _KSEQ, _KOFF = -9101, -9103, -9104, -9102


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
        TYPE_HEADER)


def classify_jvm(staged: DataFrame, max_bytes: int) -> DataFrame:
    """The staged messages (``settlement.spark.parse.stage``), each Kafka partition's in
    offset order within one task, classified in the JVM: ``CLASSIFIED_SCHEMA``'s columns and
    a ``_fallback`` column, true on the one row of each Kafka partition left to the worker
    (that partition's other rows are to be dropped: ``with_fallback``). The rows are built
    by the Java side in Spark's internal form, already of those types.

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


def fallback_partitions(classified: DataFrame) -> list[int]:
    """The Kafka partitions ``classify_jvm`` left to the worker (evaluates it: persist it
    first)."""
    return sorted(r[0] for r in classified.where("_fallback").select("kafka_partition")
                  .collect())


def with_fallback(classified: DataFrame, partitions: list[int],
                  python: Callable[[list[int]], DataFrame]) -> DataFrame:
    """``classify_jvm``'s rows without ``_fallback``, the partitions left to the worker
    classified by ``python`` (their rows, ``CLASSIFIED_SCHEMA``) instead."""
    rows = classified.drop("_fallback")
    if not partitions:
        return rows
    return (rows.where(~F.col("kafka_partition").isin(partitions))
            .unionByName(python(partitions)))


def loaded(spark_jvm: object) -> bool:
    """Whether the session's JVM has the classifier (its jar in ``spark.jars``)."""
    try:
        spark_jvm.java.lang.Class.forName(  # type: ignore[attr-defined]
            CLASS, False, spark_jvm.java.lang.Thread.currentThread().getContextClassLoader())
    except Py4JError:  # a ClassNotFoundException, as py4j raises it
        return False
    return True

