"""What a Kafka read learnt, counted once over its classified messages: the day's trades per
partition and their figures, dead letters, close markers, repeated copies, trades of other
dates, the day's amendments' figures.

The count is a pass of Spark over the cached verdicts, each task reducing its rows to a few
aggregate rows (``count_rows``), turned into ``KafkaFacts`` by ``facts_of``. Every aggregate is
a count, a sum, a least or a greatest, so the rows of two disjoint sets of messages, counted
apart, make the facts of their union: a read whose JVM verdicts are final but for a few
deferred messages counts the JVM's rows in Spark while the driver decides the rest
(``settlement.spark.deferred``), then counts the decided rows here in Python
(``decided_rows``) and hands both to ``facts_of``.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from settlement.contract import CLOSE, TRADE
from settlement.spark.figures import (
    FIGURE_FIELDS,
    FiguresBySymbol,
    SymbolSums,
    bucket_of,
    figure_columns,
    seq_figures,
    symbol_columns,
)
from settlement.spark.schemas import TRADE_SCHEMA

# One aggregate row of ``count_rows``: its columns by name (a Spark Row, or a dict of the same
# names from ``decided_rows``).
Counted = Any


@dataclass
class KafkaFacts:
    malformed: int
    closes: dict[int, int]
    late: dict[str, dict[int, int]]
    duplicates: int
    per_partition: dict[int, int]  # the day's first copies
    figures: list[tuple[int, ...]]  # their FIGURES_SCHEMA rows
    symbol_sums: SymbolSums = field(default_factory=list)  # theirs per instrument
    other_dates: int = 0  # valid trades of any other date in the range
    # the day's accepted cancels and corrections, FIGURES_SCHEMA rows (their seqs count)
    amendment_figures: list[tuple[int, ...]] = field(default_factory=list)


def count_rows(classified: DataFrame, trade_date: dt.date) -> list[Counted]:
    """The pass: ``classified``'s messages reduced to aggregate rows by what they are
    (``what``), date, partition, bucket and (the day's trades) symbol. Each task reduces its
    rows to a few, so the pass costs a scan, not a shuffle."""
    day = F.lit(trade_date)
    valid, kind = F.col("reason").isNull(), F.col("_kind")
    what = (F.when(~valid, F.lit("malformed"))
            .when(kind == CLOSE, F.lit("close"))
            .when(F.col("trade_date") != day, F.lit("other_date"))
            .when(F.col("_dup"), F.lit("dup"))
            .when(kind != TRADE, F.lit("amend"))
            .otherwise(F.lit("day")))
    # The settled day's figures (validation's checksums, by bucket) in the same pass; the
    # day's amendments' too (their seqs count in the close markers).
    is_day = F.col("what").isin("day", "amend")
    return (classified
            .select(what.alias("what"),
                    F.coalesce(F.col("trade_date"), F.col("_close_date")).alias("d"),
                    "kafka_partition", "_last_seq", "_row_hi", "_row_lo",
                    *TRADE_SCHEMA.fieldNames())
            .groupBy("what", "d", "kafka_partition",
                     F.when(is_day, bucket_of(F.col("seq"))).alias("bucket"),
                     F.when(F.col("what") == "day", F.col("symbol")).alias("symbol"))
            .agg(F.count(F.lit(1)).alias("n"), F.max("_last_seq").alias("last_seq"),
                 *figure_columns(is_day, (F.col("_row_hi"), F.col("_row_lo"))),
                 *symbol_columns(F.col("what") == "day"))
            .collect())


def facts_of(rows: list[Counted], trade_date: dt.date) -> KafkaFacts:
    """The facts of ``count_rows``' rows, of one pass or of several over disjoint messages
    (rows with the same key are merged: counts and sums added, extremes kept)."""
    facts = KafkaFacts(0, {}, {}, 0, {}, [])
    day_rows, amended = FiguresBySymbol(), FiguresBySymbol()
    for r in rows:
        what, p = r["what"], int(r["kafka_partition"])
        if what == "amend":
            amended.add(p, r, None)
        elif what == "day":
            facts.per_partition[p] = facts.per_partition.get(p, 0) + int(r["n"])
            day_rows.add(p, r, r["symbol"])
        elif what == "malformed":
            facts.malformed += int(r["n"])
        elif what == "dup":
            facts.duplicates += int(r["n"])
        elif what == "close" and r["d"] == trade_date:
            seq = int(r["last_seq"])
            facts.closes[p] = max(facts.closes.get(p, seq), seq)
        elif what == "other_date":
            facts.other_dates += int(r["n"])
            if r["d"] < trade_date:
                # Trades of earlier dates in the day's range: late trades of those days.
                late = facts.late.setdefault(r["d"].isoformat(), {})
                late[p] = late.get(p, 0) + int(r["n"])
    facts.figures, facts.symbol_sums = day_rows.figures(), day_rows.symbols()
    facts.amendment_figures = amended.figures()
    return facts


def decided_rows(decided: pa.Table, trade_date: dt.date) -> list[Counted] | None:
    """``count_rows``' rows of a few decided messages (``CLASSIFIED_SCHEMA`` columns, in
    Arrow), counted in the driver; None when one of them is a trade of the day, whose
    figures (its symbol's sums) only the pass takes. None of them is when the decided
    messages leave the JVM's verdicts standing: such a trade changes its partition's state
    (``deferred._state_changers``), and the partition is read again whole."""
    out: dict[tuple[Any, ...], dict[str, Any]] = {}
    seqs: list[tuple[int, int]] = []  # the day's amendments': (partition, seq)
    hashes: list[tuple[int, int]] = []  # and their row hash halves
    columns = ("kafka_partition", "reason", "_kind", "trade_date", "_close_date", "_dup",
               "_last_seq", "seq", "_row_hi", "_row_lo")
    for r in decided.select(list(columns)).to_pylist():
        what = _what(r, trade_date)
        if what == "day":
            return None
        p = int(r["kafka_partition"])
        if what == "amend":
            seqs.append((p, int(r["seq"])))
            hashes.append((int(r["_row_hi"]), int(r["_row_lo"])))
            continue
        d = r["trade_date"] if r["trade_date"] is not None else r["_close_date"]
        got = out.setdefault((what, d, p), {"what": what, "d": d, "kafka_partition": p,
                                            "n": 0, "last_seq": None})
        got["n"] += 1
        if r["_last_seq"] is not None:
            held = got["last_seq"]
            got["last_seq"] = r["_last_seq"] if held is None else max(held, r["_last_seq"])
    amended = [{"what": "amend", "kafka_partition": f[0], "n": f[2],
                **dict(zip(FIGURE_FIELDS, f[1:], strict=True))}
               for f in seq_figures(seqs, hashes)]
    return [*out.values(), *amended]


def _what(r: dict[str, Any], trade_date: dt.date) -> str:
    """``count_rows``' ``what`` of one row, as its SQL decides it (a comparison with NULL is
    not true)."""
    if r["reason"] is not None:
        return "malformed"
    if r["_kind"] == CLOSE:
        return "close"
    if r["trade_date"] is not None and r["trade_date"] != trade_date:
        return "other_date"
    if r["_dup"]:
        return "dup"
    return "amend" if r["_kind"] is not None and r["_kind"] != TRADE else "day"


def pass_facts(classified: DataFrame, trade_date: dt.date) -> KafkaFacts:
    """The facts of ``classified``, counted in one pass."""
    return facts_of(count_rows(classified, trade_date), trade_date)

