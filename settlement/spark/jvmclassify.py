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
messages are then decided in the driver by the Python classifier itself, with the state they
need (``settlement.spark.deferred`` says how and why that is exact). Only a deferred message
that changes what the messages after it were classified with (a valid trade the JVM did not
keep, a plain close marker it did not see) gives its partition back to the Python worker, read
again whole; so does a partition with more than ``DEFER_LIMIT`` deferred messages.
``tests/test_native.py`` holds the two classifiers to the same row for every message.

The jar is built by ``make setup`` (``javac`` against Spark's own jars and the Kafka client
the connector step fetched); a close without it reads with the workers as before (its JSON's
``read_by`` says ``workers``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from py4j.protocol import Py4JError
from pyspark.sql import DataFrame, SparkSession

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
# Deferred messages a Kafka partition may have before the JVM gives it to the Python worker
# whole: they are decided in the driver, so this bounds what it collects (with the JVM rows
# they need, a few hundred bytes each). A realistic 2M-trade day deferred 13,660 over six
# partitions (benchmarks/settlement.py --mix realistic), so a 10M day about 11,000 per
# partition; a producer writing trades in another JSON shape
# would defer them all, and is better read by the workers.
DEFER_LIMIT = 50_000


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
    ``_deferred`` (true on a message left to the Python classifier, its value in ``raw``,
    its type header in ``_type``, the trade it seems to name in ``trade_id`` and where this
    partition kept that trade before it in ``_ref_offset`` and ``_ref_date``) and
    ``_fallback`` (true on the one row of a Kafka partition left to the worker whole):
    ``settlement.spark.deferred.resolve_deferred`` makes them ``CLASSIFIED_SCHEMA`` rows.
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


def loaded(spark_jvm: object) -> bool:
    """Whether the session's JVM has the classifier (its jar in ``spark.jars``)."""
    try:
        spark_jvm.java.lang.Class.forName(  # type: ignore[attr-defined]
            CLASS, False, spark_jvm.java.lang.Thread.currentThread().getContextClassLoader())
    except Py4JError:  # a ClassNotFoundException, as py4j raises it
        return False
    return True

