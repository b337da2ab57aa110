"""Validating one settled day with the frames the run already holds, and recording the
verdict.

The run has read its day once; validation checks that read (and, for reconciliation, the
ledgers: read here only when the day came from Kafka, reused when it came from them).
"""

from __future__ import annotations

import json

from pyspark.sql import DataFrame, SparkSession

from settlement.config import Settings
from settlement.db import connect, q
from settlement.eod.model import NoSource, Position, SourceChoice
from settlement.eod.sources import choose_db
from settlement.spark import transforms as T
from settlement.spark.io import DayRead, read_ledger
from settlement.spark.schemas import POSITIONS_SCHEMA
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


def validate_day(settings: Settings, spark: SparkSession, trade_date: str,
                 choice: SourceChoice, read: DayRead, trades: DataFrame,
                 positions: list[Position] | None) -> ValidationOutcome:
    """Every suite that applies to this day: the deduplicated day the settlement used, the
    ledger(s), Kafka when it was the source, both site ledgers in the separate scheme, the
    retention gaps the chooser found in the ledgers, the positions."""
    skip: dict[str, str] = {}
    ledger: DataFrame | None = None
    try:
        ledgers = choice.ledgers or choose_db(settings, trade_date, choice.partitions,
                                              choice.states)[0]
    except NoSource as e:
        ledgers, skip["reconcile_kafka_ledger"] = (), str(e)
    if ledgers:
        frames = [_ledger_frame(spark, settings, choice, read, n, trade_date) for n in ledgers]
        ledger = frames[0]
        for other in frames[1:]:
            ledger = ledger.unionByName(other)
        if len(frames) > 1:
            ledger = T.dedupe_trades(ledger)
    ledger_a = ledger_b = None
    if {"a", "b"} <= set(choice.ledgers_with_trades()):
        ledger_a = _ledger_frame(spark, settings, choice, read, "a", trade_date)
        ledger_b = _ledger_frame(spark, settings, choice, read, "b", trade_date)
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
