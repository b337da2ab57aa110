"""Plain trades and close markers classified inside the JVM, with the Python classifier's
verdicts (``settlement.spark.parse.classify_arrow``), for the Kafka partitions that hold
nothing else.

A message is native when its type header says ``trade`` and its value is a plain trade's
canonical text (``settlement.spark.canonical.TRADE_PATTERN``, its integers within the
contract's bounds, buyer and seller different), or ``close`` and a day's close marker's
canonical text naming its own partition. Such a value is one the contract accepts, with no
escape, so its fields are read off its text by position (one split on its quotes, not a
pattern per field) and typed by Spark's casts, which for these texts are exact.

What the Python worker keeps per partition is expressed over the whole partition instead,
with the same rules (``consumers.parse``, whose functions word the reasons here too):

- a day's close marker: the first per (partition, date) is kept; a later one with another
  last_seq is a conflicting marker (dead letter); one with the same last_seq stays valid;
- a trade of a date whose kept marker came before it on the partition is late;
- of a trade id's copies that are not late, the first is kept; a later one equal to it in
  the ledger's typed terms (``consumers.parse.fingerprint``: the price as a number, the
  execution time as an instant) is a duplicate (``_dup``), a different one a conflicting
  replay.

A partition holding any other message (an amendment, an amended close marker, a hostile or
merely unusual value) is classified whole by the Python worker, which keeps the state those
need; ``tests/test_native.py`` holds both to the same verdicts and values on every corpus.
"""

from __future__ import annotations

import re

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import BinaryType, BooleanType, IntegerType, LongType, StringType

from consumers.parse import conflict_reason, late_reason, marker_conflict_reason
from settlement.contract import (
    CLOSE,
    CLOSE_LAST_SEQ,
    QUANTITY,
    SEQ,
    STRING_FIELDS,
    TRADE,
    TRADE_FIELDS,
)
from settlement.spark.canonical import CLOSE_PATTERN, TRADE_PATTERN, anchored
from settlement.spark.figures import row_hash
from settlement.spark.schemas import PRICE

_TRADE_RE = anchored(TRADE_PATTERN)
_CLOSE_RE = anchored(CLOSE_PATTERN)
_TYPED = {"trade_date": "date", "seq": "long", "price": PRICE, "quantity": "long",
          "executed_at": "timestamp"}
# The trade's content as fingerprint() compares copies (all but the id).
_CONTENT = [f for f in TRADE_FIELDS if f != "trade_id"]


def _positions() -> dict[str, tuple[int, bool]]:
    """Where each field's text is among a canonical trade's pieces split on '"', and whether
    it is a string (an integer's piece also holds its ':' and ',' or '}')."""
    out, i = {}, 1  # piece 0 is '{', piece 1 the first key
    for f in TRADE_FIELDS:
        if f in STRING_FIELDS:
            out[f], i = (i + 2, True), i + 4
        else:
            out[f], i = (i + 1, False), i + 2
    return out


_POSITIONS = _positions()


def _text() -> Column:
    # Invalid UTF-8 becomes U+FFFD, which neither pattern admits.
    return F.col("value").cast(StringType())


def _kind_is(kind: str) -> Column:
    return F.col("_kind") == F.lit(kind.encode()).cast(BinaryType())


def _trade_fields(text: Column, canonical: Column) -> dict[str, Column]:
    """A canonical trade's fields, typed; NULL where the value is not one (nothing is split
    or cast then: a short piece list would be out of bounds under ANSI)."""
    pieces = F.split(text, '"')
    out = {}
    for f, (at, is_string) in _POSITIONS.items():
        piece = pieces.getItem(at)
        piece = piece if is_string else F.translate(piece, ":,}", "")
        out[f] = F.when(canonical, piece.try_cast(_TYPED[f]) if f in _TYPED else piece)
    return out


def native_columns(max_bytes: int) -> list[Column]:
    """Columns added to a staged message (``value``, ``_kind``, ``kafka_partition``): whether
    it is one this module classifies (``_native``: a canonical plain trade or day's close
    marker within the contract's bounds), ``_is_close``, and its typed fields (the trade's
    under their names, a marker's as ``_close_date`` and ``_last_seq``). Computed in the pass
    that decides which partitions are native and again in the classification: caching them
    cost more than that (docs/benchmarks.md)."""
    text, size = _text(), F.length(F.col("value"))
    is_trade = _kind_is(TRADE) & (size <= max_bytes) & text.rlike(_TRADE_RE)
    is_close = _kind_is(CLOSE) & (size <= max_bytes) & text.rlike(_CLOSE_RE)
    t = _trade_fields(text, is_trade)
    close_date = F.when(is_close, F.regexp_extract(text, _CLOSE_RE, 1).try_cast("date"))
    last_seq = F.when(is_close, F.regexp_extract(text, _CLOSE_RE, 3).try_cast(LongType()))
    partition = F.when(is_close, F.regexp_extract(text, _CLOSE_RE, 2).try_cast(LongType()))
    native = ((is_trade & (t["seq"] <= SEQ.maximum) & (t["quantity"] <= QUANTITY.maximum)
               & (t["buyer"] != t["seller"]))
              | (is_close & (partition == F.col("kafka_partition"))
                 & (last_seq <= CLOSE_LAST_SEQ.maximum)))
    return [F.coalesce(native, F.lit(False)).alias("_native"),
            F.coalesce(is_close, F.lit(False)).alias("_is_close"),
            *(c.alias(f) for f, c in t.items()),
            close_date.alias("_close_date"), last_seq.alias("_last_seq")]


def native_message(max_bytes: int) -> Column:
    """Whether a staged message is one this module classifies (``native_columns``)."""
    return native_columns(max_bytes)[0]


def _worded(text: str, args: dict[str, Column]) -> Column:
    """``text`` (a reason worded by consumers.parse with sentinel arguments) with each
    sentinel replaced by its column: one wording for both classifiers."""
    pieces = re.split("(" + "|".join(map(re.escape, args)) + ")", text)
    if sum(p in args for p in pieces) != len(args):
        raise ValueError(f"a reason's wording changed: {text!r}")
    return F.concat(*(args[p].cast(StringType()) if p in args else F.lit(p)
                      for p in pieces if p))


def _repr(s: Column) -> Column:
    """Python's repr() of a canonical text field (printable ASCII without '"' or '\\'):
    single quotes, or double quotes when it holds a single one."""
    q = F.when(s.contains("'"), F.lit('"')).otherwise(F.lit("'"))
    return F.concat(q, s, q)


# Sentinels the reasons are worded with: integers no offset or partition is, a date no
# trade has, an id whose repr() is recognisable.
_P, _O, _S, _K = "-9101", "-9102", "-9103", "-9104"
_D, _ID = "\x01day", "\x02id"


def classify_native(marked: DataFrame) -> DataFrame:
    """The verdicts of staged messages that are all native, with ``native_columns`` added,
    in ``CLASSIFIED_SCHEMA``'s columns and order."""
    typed = marked.select(
        "kafka_partition", "kafka_offset", "value", "_is_close", *TRADE_FIELDS,
        "_close_date", "_last_seq",
    ).withColumn("_day", F.coalesce("trade_date", "_close_date"))
    # Each (partition, date)'s kept marker: its first. Markers are few: a broadcast join.
    kept = (typed.where("_is_close").groupBy("kafka_partition", "_day")
            .agg(F.min(F.struct("kafka_offset", "_last_seq")).alias("_marker")))
    joined = typed.join(F.broadcast(kept), ["kafka_partition", "_day"], "left")
    marker = F.col("_marker")
    late = (~F.col("_is_close") & marker.isNotNull()
            & (marker["kafka_offset"] < F.col("kafka_offset")))
    conflicting_marker = F.col("_is_close") & (F.col("_last_seq") != marker["_last_seq"])
    # Each trade id's kept copy in its partition: its first copy that is not late.
    content = F.struct(*_CONTENT)
    first = F.min(F.when(~F.col("_is_close") & ~late, F.struct(
        F.col("kafka_offset").alias("o"), content.alias("c")))).over(
        Window.partitionBy("kafka_partition", "trade_id"))
    decided = joined.select("*", late.alias("_late"), first.alias("_first"),
                            conflicting_marker.alias("_conflicting_marker"))
    later_copy = (~F.col("_is_close") & ~F.col("_late")
                  & (F.col("_first")["o"] != F.col("kafka_offset")))
    replay = later_copy & (F.col("_first")["c"] == content)
    p, o = F.col("kafka_partition"), F.col("kafka_offset")
    reason = (
        F.when(F.col("_late"), _worded(late_reason(_D, int(_P), int(_K)), {
            _D: F.col("trade_date"), _P: p, _K: marker["kafka_offset"]}))
        .when(later_copy & ~replay, _worded(conflict_reason(_ID, int(_P), int(_K)), {
            repr(_ID): _repr(F.col("trade_id")), _P: p, _K: F.col("_first")["o"]}))
        .when(F.col("_conflicting_marker"), _worded(
            marker_conflict_reason(_D, int(_P), int(_S), int(_K), int(_O)), {
                _D: F.col("_close_date"), _P: p, _S: F.col("_last_seq"),
                _K: marker["_last_seq"], _O: marker["kafka_offset"]})))
    valid = reason.isNull()
    trade_ok, close_ok = valid & ~F.col("_is_close"), valid & F.col("_is_close")
    out = decided.select(
        p.cast(IntegerType()).alias("kafka_partition"), o.cast(LongType()).alias("kafka_offset"),
        reason.alias("reason"),
        F.when(F.col("_is_close"), F.lit(CLOSE)).otherwise(F.lit(TRADE)).alias("_kind"),
        F.when(~valid, F.col("value")).alias("raw"),
        *(F.when(trade_ok, F.col(f)).alias(f) for f in TRADE_FIELDS),
        F.when(close_ok, F.col("_close_date")).alias("_close_date"),
        F.when(close_ok, F.col("_last_seq")).alias("_last_seq"),
        (valid & replay).cast(BooleanType()).alias("_dup"),
        F.lit(None).cast(IntegerType()).alias("_version"),
        F.lit(None).cast(StringType()).alias("_note"),
    )
    hi, lo = row_hash()  # of the typed columns, as the worker hashes its typed values
    has_id = F.col("trade_id").isNotNull()
    return out.select("*", F.when(has_id, hi).alias("_row_hi"),
                      F.when(has_id, lo).alias("_row_lo"))
