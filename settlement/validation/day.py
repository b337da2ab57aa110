"""Validating one settled day with the frames the run already holds, and recording the
verdict.

The run has read its day once; validation checks that read (and, for reconciliation, the
ledgers: read here only when the day came from Kafka, reused when it came from them).
"""

from __future__ import annotations

import json
import time

from pyspark.sql import DataFrame, SparkSession

from settlement.config import Settings
from settlement.db import connect, q
from settlement.eod.model import NoSource, Position, SourceChoice
from settlement.eod.sources import choose_db
from settlement.spark import transforms as T
from settlement.spark.figures import BUCKET_SEQS, Bucket, DaySide, bucket_sql
from settlement.spark.io import DayRead, read_ledger
from settlement.spark.schemas import POSITIONS_SCHEMA, TRADE_SCHEMA
from settlement.validation import DATA_LOSS_SCHEMA, validate_frames
from settlement.validation.run import ValidationOutcome


def _ledger_frame(spark: SparkSession, settings: Settings, choice: SourceChoice, read: DayRead,
                  name: str, trade_date: str) -> DataFrame:
    held = read.ledgers.get(name)
    if held is not None:
        return held
    # Read here (a Kafka-sourced day) and checked by several queries: read over JDBC once.
    frame = read_ledger(spark, settings, choice, name, trade_date).persist()
    read.cached.append(frame)
    read.ledgers[name] = frame
    return frame


def ledger_side(spark: SparkSession, settings: Settings, choice: SourceChoice, name: str,
                trade_date: str) -> DaySide:
    """A ledger's day as its bucket figures, taken by one SQL aggregate in PostgreSQL; the
    trades of a bucket are read over JDBC only when its figures differ from the other
    copy's."""
    t0 = time.perf_counter()
    with connect(settings.ledger_dsn(name)) as conn:
        rows = conn.execute(q("ledger", "day_figures"), {
            "trade_date": trade_date, "bucket_seqs": BUCKET_SEQS}).fetchall()
    figures = {(int(p), int(b)): (int(n), int(hi), int(lo)) for p, b, n, hi, lo in rows}

    def rows_in(buckets: list[Bucket]) -> DataFrame:
        if not buckets:
            return spark.createDataFrame([], TRADE_SCHEMA)
        return read_ledger(spark, settings, choice, name, trade_date,
                           where=bucket_sql(buckets))

    return DaySide(f"ledger_{name}", figures, rows_in, round(time.perf_counter() - t0, 3))


def validate_day(settings: Settings, spark: SparkSession, trade_date: str,
                 choice: SourceChoice, read: DayRead, trades: DataFrame,
                 positions: list[Position] | None) -> ValidationOutcome:
    """Every suite that applies to this day: the deduplicated day the settlement used, the
    ledger(s), Kafka when it was the source, both site ledgers in the separate scheme, the
    retention gaps the chooser found in the ledgers, the positions.

    A ledger the run already read (a ledger-sourced day) is compared in Spark; any other
    by its figures in PostgreSQL (``ledger_side``), without reading its trades."""
    skip: dict[str, str] = {}
    sides: dict[str, DataFrame | DaySide] = {}

    def side(name: str) -> DataFrame | DaySide:
        if name not in sides:
            held = read.ledgers.get(name)
            sides[name] = held if held is not None else ledger_side(
                spark, settings, choice, name, trade_date)
        return sides[name]

    ledger: DataFrame | DaySide | None = None
    try:
        ledgers = choice.ledgers or choose_db(settings, trade_date, choice.partitions,
                                              choice.states)[0]
    except NoSource as e:
        ledgers, skip["reconcile_kafka_ledger"] = (), str(e)
    if len(ledgers) == 1:
        ledger = side(ledgers[0])
    elif ledgers:
        # No ledger is complete alone: their union, deduplicated, is the day (read in full:
        # figures of a union across two databases cannot be summed from each one's).
        frames = [_ledger_frame(spark, settings, choice, read, n, trade_date) for n in ledgers]
        union = frames[0]
        for other in frames[1:]:
            union = union.unionByName(other)
        ledger = T.dedupe_trades(union)
    ledger_a = ledger_b = None
    if {"a", "b"} <= set(choice.ledgers_with_trades()):
        ledger_a, ledger_b = side("a"), side("b")
    if positions is None:
        skip["settlement_invariants"] = f"no positions stored for {trade_date}: run settle eod"
    return validate_frames(
        spark, trade_date=trade_date, partitions=choice.partitions or settings.partitions,
        as_read=read.as_read,
        settlement_trades=trades, close_markers=read.close_markers or choice.close_markers(),
        positions=None if positions is None
        else spark.createDataFrame(positions, POSITIONS_SCHEMA),
        ledger=ledger, kafka=trades if choice.source == "kafka" else None,
        ledger_a=ledger_a, ledger_b=ledger_b,
        data_loss=spark.createDataFrame(choice.data_loss(), DATA_LOSS_SCHEMA),
        unique_ids=read.unique_ids, skip=skip,
        # The read's figures describe its deduplicated day, which is what was settled when
        # the settlement took the read's trades as they were.
        settled_figures=read.figures if trades is read.trades else None,
    )


def record_validation(settings: Settings, run_id: int, outcome: ValidationOutcome,
                      report_path: str | None) -> None:
    with connect(settings.settlement_dsn) as conn:
        conn.execute(q("eod", "record_validation"), {
            "run_id": run_id, "success": outcome.success,
            "validation": json.dumps(outcome.as_dict(), default=str),
            "report_path": report_path,
        })
        conn.commit()
