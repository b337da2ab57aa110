"""Validation of a real settlement run: collect its frames, validate, record, report."""

from __future__ import annotations

import json
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from settlement.config import Settings
from settlement.db import connect, q
from settlement.sources import NoSource, SourceChoice, choose_db, ledger_state
from settlement.spark import transforms as T
from settlement.spark.job import DayRead, SettlementResult, read_db, read_kafka
from settlement.spark.session import build_session
from settlement.validation import ValidationOutcome, validate_frames


def _ledger(spark: SparkSession, settings: Settings, ledgers: tuple[str, ...], day: str
            ) -> DataFrame:
    frame = read_db(spark, settings, ledgers, day).trades
    return T.dedupe_trades(frame) if len(ledgers) > 1 else frame


def validate_day(settings: Settings, spark: SparkSession, trade_date: str,
                 choice: SourceChoice, trades: DataFrame, close_markers: dict[int, int],
                 positions: list[tuple[Any, ...]] | None, settled_trades: int
                 ) -> ValidationOutcome:
    """Every suite that applies to this day: the frame the settlement used, the ledger(s),
    Kafka when it was the source, both site ledgers in the separate scheme, the positions."""
    skip: dict[str, str] = {}
    try:
        ledgers = choice.ledgers or choose_db(settings, trade_date, choice.partitions)[0]
        ledger = _ledger(spark, settings, ledgers, trade_date)
    except NoSource as e:
        ledger, skip["reconcile_kafka_ledger"] = None, str(e)
    with_trades = [n for n in ("a", "b")
                   if (st := ledger_state(settings, n, trade_date)) is not None and st.trades]
    ledger_a = ledger_b = None
    if with_trades == ["a", "b"]:
        ledger_a = _ledger(spark, settings, ("a",), trade_date)
        ledger_b = _ledger(spark, settings, ("b",), trade_date)
    if positions is None:
        skip["settlement_invariants"] = f"no positions stored for {trade_date}: run settle eod"
    return validate_frames(
        spark, trade_date=trade_date, partitions=choice.partitions or settings.partitions,
        settlement_trades=trades, close_markers=close_markers,
        positions=None if positions is None
        else spark.createDataFrame(positions, T.POSITIONS_SCHEMA),
        ledger=ledger, kafka=trades if choice.source == "kafka" else None,
        ledger_a=ledger_a, ledger_b=ledger_b, settled_trades=settled_trades, skip=skip,
    )


def gather_and_validate(settings: Settings, run_id: int, trade_date: str, choice: SourceChoice,
                        result: SettlementResult) -> dict[str, Any]:
    """After ``settle eod`` wrote its results: validate, report, record."""
    spark = SparkSession.getActiveSession()
    assert spark is not None
    return _validate_and_report(settings, spark, run_id, trade_date, choice, result)


def _validate_and_report(settings: Settings, spark: SparkSession, run_id: int, trade_date: str,
                         choice: SourceChoice, result: SettlementResult) -> dict[str, Any]:
    from settlement.report import write_report

    assert result.trades_df is not None
    outcome = validate_day(settings, spark, trade_date, choice, result.trades_df,
                           result.close_markers, result.positions, result.trades)
    report = write_report(settings, run_id, trade_date, choice, result, outcome)
    record_validation(settings, run_id, outcome, str(report.html))
    return {"validation_success": outcome.success, "validation": outcome.as_dict(),
            "report_path": str(report.html), "report_json": str(report.json)}


def _read_day(settings: Settings, spark: SparkSession, trade_date: str, choice: SourceChoice
              ) -> tuple[DataFrame, DayRead, int]:
    """The day's deduplicated trades from the chosen source, cached; and their count."""
    read = (read_kafka(spark, settings, choice, trade_date) if choice.source == "kafka"
            else read_db(spark, settings, choice.ledgers, trade_date))
    trades = T.dedupe_trades(read.trades.where(
        read.trades.trade_date == F.lit(trade_date).cast("date"))).persist()
    return trades, read, trades.count()


def _stored(settings: Settings, name: str, trade_date: str) -> list[tuple[Any, ...]]:
    with connect(settings.settlement_dsn) as conn:
        return [tuple(r) for r in
                conn.execute(q("eod", name), {"trade_date": trade_date}).fetchall()]


def validate_only(settings: Settings, trade_date: str, source: str = "auto") -> dict[str, Any]:
    """``settle validate``: re-read the day and check it against the stored results."""
    from settlement.sources import choose_source

    choice = choose_source(settings, trade_date, source)
    spark = build_session(settings, app_name=f"validate-{trade_date}")
    trades, read, n = _read_day(settings, spark, trade_date, choice)
    try:
        outcome = validate_day(settings, spark, trade_date, choice, trades, read.close_markers,
                               _stored(settings, "stored_positions", trade_date) or None, n)
    finally:
        trades.unpersist()
        read.cached.unpersist()
    return {"trade_date": trade_date, "source": choice.source,
            "source_reason": choice.reason, "trades": n, **outcome.as_dict()}


def validate_stored_run(settings: Settings, trade_date: str) -> dict[str, Any]:
    """Validate and report the latest settlement run of the date (the DAG's validate step,
    after spark-submit wrote the results): the same source, the stored results."""
    with connect(settings.settlement_dsn) as conn:
        row = conn.execute(q("eod", "latest_run"), {"trade_date": trade_date}).fetchone()
    if row is None:
        raise RuntimeError(f"no succeeded settlement run for {trade_date} to validate")
    run_id, offsets, trades_n, dups, malformed, gross, eff, timings = row
    choice = SourceChoice.from_dict(offsets)
    spark = build_session(settings, app_name=f"validate-{trade_date}")
    trades, read, n = _read_day(settings, spark, trade_date, choice)
    obligations = _stored(settings, "stored_obligations", trade_date)
    try:
        result = SettlementResult(
            trade_date=trade_date, source=choice.source, trades=trades_n,
            duplicates_removed=dups, malformed=malformed,
            positions=_stored(settings, "stored_positions", trade_date),
            obligations=obligations,
            instruments=_stored(settings, "stored_instruments", trade_date),
            gross_notional=gross, net_settlement=sum(abs(r[4]) for r in obligations),
            netting_efficiency=eff, close_markers=read.close_markers, timings=timings or {},
            trades_df=trades)
        out = _validate_and_report(settings, spark, run_id, trade_date, choice, result)
    finally:
        trades.unpersist()
        read.cached.unpersist()
    return {"run_id": run_id, "trade_date": trade_date, **choice.as_dict(),
            "trades": trades_n, "trades_reread": n, **out}


def record_validation(settings: Settings, run_id: int, outcome: ValidationOutcome,
                      report_path: str | None) -> None:
    with connect(settings.settlement_dsn) as conn:
        conn.execute(q("eod", "record_validation"), {
            "run_id": run_id, "success": outcome.success,
            "validation": json.dumps(outcome.as_dict(), default=str),
            "report_path": report_path,
        })
        conn.commit()
