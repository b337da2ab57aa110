"""Validating one settled day with the frames the run already holds, and recording the
verdict.

The run has read its day once; validation checks that read (and, for reconciliation, the
ledgers: read here only when the day came from Kafka, reused when it came from them).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from pyspark.sql import DataFrame, Row, SparkSession

from settlement.config import Settings
from settlement.db import connect, q
from settlement.eod.model import NoSource, Position, SourceChoice
from settlement.eod.sources import choose_db
from settlement.spark import transforms as T
from settlement.spark.figures import BUCKET_SEQS, Bucket, DaySide, Figures, bucket_sql
from settlement.spark.io import DayRead, ledger_amendments, read_ledger
from settlement.spark.schemas import AMENDMENT_SCHEMA, POSITIONS_SCHEMA, TRADE_SCHEMA
from settlement.spark.session import local_frame
from settlement.validation import DATA_LOSS_SCHEMA, validate_frames
from settlement.validation.run import Frame, ValidationOutcome


def _ledger_frame(spark: SparkSession, settings: Settings, read: DayRead, name: str,
                  trade_date: str) -> DataFrame:
    held = read.ledgers.get(name)
    if held is not None:
        return held
    # Read here (a Kafka-sourced day) and checked by several queries: read over JDBC once.
    frame = read_ledger(spark, settings, name, trade_date).persist()
    read.cached.append(frame)
    read.ledgers[name] = frame
    return frame


@dataclass
class Compared:
    """Which ledgers a run's validation compares: the one (or the union of those) holding the
    day for the Kafka reconciliation, and whether site A and site B are compared."""

    ledgers: tuple[str, ...]
    sites: bool
    why_not: str | None = None  # no ledger holds the day (the reconciliation is skipped)


def compared(settings: Settings, choice: SourceChoice, trade_date: str) -> Compared:
    sites = {"a", "b"} <= set(choice.ledgers_with_trades())
    try:
        return Compared(choice.ledgers or choose_db(settings, trade_date, choice.partitions,
                                                    choice.states)[0], sites)
    except NoSource as e:
        return Compared((), sites, str(e))


def settled_row_sums(settings: Settings, choice: SourceChoice, trade_date: str) -> bool:
    """Whether a ledger-sourced day is compared in Spark with the other site's copy (both
    site ledgers hold it): its figures then need the row hash sums (``dedupe_day``)."""
    return choice.source != "kafka" and compared(settings, choice, trade_date).sites


LedgerFigures = dict[str, "Future[tuple[Figures, float]]"]


def ledger_figures_ahead(settings: Settings, choice: SourceChoice, trade_date: str
                         ) -> LedgerFigures:
    """Start the SQL aggregates of the ledgers validation will compare by figures, each in
    a thread, so that PostgreSQL computes them while Spark reads and nets the day. Only
    ledgers the chooser found complete (their day no longer changes) or the site ledgers
    at the close; a ledger-sourced run's own ledgers are compared in Spark instead."""
    plan = compared(settings.for_component("settlement"), choice, trade_date)
    names = set(plan.ledgers) if len(plan.ledgers) == 1 else set()
    if plan.sites:
        names |= {"a", "b"}
    if choice.source != "kafka":
        names -= set(choice.ledgers)  # read by the run itself
    if not names:
        return {}
    pool = ThreadPoolExecutor(max_workers=len(names), thread_name_prefix="ledger-figures")
    try:
        return {n: pool.submit(_figures, settings.for_component("settlement"), n, trade_date)
                for n in sorted(names)}
    finally:
        pool.shutdown(wait=False)


def _figures(settings: Settings, name: str, trade_date: str) -> tuple[Figures, float]:
    t0 = time.perf_counter()
    with connect(settings.ledger_dsn(name)) as conn:
        rows = conn.execute(q("ledger", "day_figures"), {
            "trade_date": trade_date, "bucket_seqs": BUCKET_SEQS}).fetchall()
    return ({(int(p), int(b)): (int(n), int(hi), int(lo)) for p, b, n, hi, lo in rows},
            round(time.perf_counter() - t0, 3))


def ledger_side(spark: SparkSession, settings: Settings, name: str, trade_date: str,
                ahead: Future[tuple[Figures, float]] | None = None) -> DaySide:
    """A ledger's day as its bucket figures, taken by one SQL aggregate in PostgreSQL (or
    ``ahead``, started earlier); the trades of a bucket are read over JDBC only when its
    figures differ from the other copy's."""
    t0 = time.perf_counter()
    figures, seconds = ahead.result() if ahead is not None else _figures(
        settings, name, trade_date)

    def rows_in(buckets: list[Bucket]) -> DataFrame:
        if not buckets:
            return local_frame(spark, [], TRADE_SCHEMA)
        return read_ledger(spark, settings, name, trade_date,
                           where=bucket_sql(buckets))

    # What validation waited for: the aggregate's own time when it ran here, else the wait.
    waited = round(time.perf_counter() - t0, 3)
    return DaySide(f"ledger_{name}", figures, rows_in, waited if ahead is not None else seconds)


def validate_day(settings: Settings, spark: SparkSession, trade_date: str,
                 choice: SourceChoice, read: DayRead, trades: DataFrame,
                 positions: list[Position] | Callable[[], list[Position]] | None,
                 ahead: LedgerFigures | None = None,
                 docs_in_background: bool = False,
                 amended_trades: Callable[[], list[tuple[object, ...]]] | None = None,
                 settled_symbols: Callable[[], list[tuple[object, ...]]] | None = None,
                 amendment_rows: list[Row] | None = None) -> ValidationOutcome:
    """Every suite that applies to this day: the deduplicated day the settlement used, the
    ledger(s), Kafka when it was the source, both site ledgers in the separate scheme, the
    retention gaps the chooser found in the ledgers, the positions.

    A ledger the run already read (a ledger-sourced day) is compared in Spark; any other
    by its figures in PostgreSQL (``ledger_side``; ``ahead``: those started early by
    ``ledger_figures_ahead``), without reading its trades.
    ``positions`` as a function: called when the invariants' suite runs, the last (a close
    nets the day while the suites before it run).
    ``docs_in_background``: ``run_suites``'; ``amended_trades``, ``settled_symbols``,
    ``amendment_rows`` (``read.amendment_rows`` in log order; None: as the read holds
    them): ``validate_frames``'."""
    skip: dict[str, str] = {}
    sides: dict[str, DataFrame | DaySide] = {}

    def side(name: str) -> DataFrame | DaySide:
        if name not in sides:
            held = read.ledgers.get(name)
            sides[name] = held if held is not None else ledger_side(
                spark, settings, name, trade_date, (ahead or {}).get(name))
        return sides[name]

    ledger: DataFrame | DaySide | None = None
    plan = compared(settings, choice, trade_date)
    if plan.why_not is not None:
        skip["reconcile_kafka_ledger"] = plan.why_not
    if len(plan.ledgers) == 1:
        ledger = side(plan.ledgers[0])
    elif plan.ledgers:
        # No ledger is complete alone: their union, deduplicated, is the day (read in full:
        # figures of a union across two databases cannot be summed from each one's).
        frames = [_ledger_frame(spark, settings, read, n, trade_date)
                  for n in plan.ledgers]
        union = frames[0]
        for other in frames[1:]:
            union = union.unionByName(other)
        ledger = T.dedupe_trades(union)
    ledger_a = ledger_b = None
    if plan.sites:
        ledger_a, ledger_b = side("a"), side("b")
    # The day's cancels and corrections against another copy of them: the ledger's for a
    # Kafka-sourced day, the other site's for a day read from one site's ledger.
    others: tuple[str, ...] = ()
    if choice.source == "kafka":
        others = plan.ledgers
    elif plan.sites and len(choice.ledgers) == 1:
        others = tuple(n for n in ("a", "b") if n not in choice.ledgers)
    other_amendments: list[tuple[Any, ...]] | None = None
    if others:
        other_amendments = ledger_amendments(spark, settings, choice, others, trade_date)
        if other_amendments is None and read.amendment_rows is None:
            skip["reconcile_amendments"] = ("neither copy of the day holds a cancel or a "
                                            "correction")
        elif other_amendments is None:
            other_amendments = []
    if positions is None:
        skip["settlement_invariants"] = f"no positions stored for {trade_date}: run settle eod"
    return validate_frames(
        spark, trade_date=trade_date, partitions=choice.partitions or settings.partitions,
        as_read=read.as_read,
        settlement_trades=trades, close_markers=read.close_markers or choice.close_markers(),
        positions=None if positions is None else _positions_frame(spark, positions),
        ledger=ledger, kafka=trades if choice.source == "kafka" else None,
        ledger_a=ledger_a, ledger_b=ledger_b,
        data_loss=local_frame(spark, choice.data_loss(), DATA_LOSS_SCHEMA),
        unique_ids=read.unique_ids, skip=skip,
        # The read's figures describe its deduplicated day, which is what was settled when
        # the settlement took the read's trades as they were.
        settled_figures=read.figures if trades is read.trades else None,
        copies_agree_within_partitions=read.copies_agree,
        as_read_only_the_day=read.copies_agree and read.other_dates == 0,
        amendments=read.amendments(),
        amendment_rows=read.amendment_rows if amendment_rows is None else amendment_rows,
        amendment_figures=read.amendment_figures,
        other_amendments=None if other_amendments is None else local_frame(
            spark, other_amendments, AMENDMENT_SCHEMA),
        other_amendment_rows=other_amendments,
        amended_trades=amended_trades, settled_symbols=settled_symbols,
        docs_in_background=docs_in_background,
    )



def _positions_frame(spark: SparkSession,
                     positions: list[Position] | Callable[[], list[Position]]) -> Frame:
    if callable(positions):
        netted = positions
        return lambda: local_frame(spark, netted(), POSITIONS_SCHEMA)
    return local_frame(spark, positions, POSITIONS_SCHEMA)


def record_validation(settings: Settings, run_id: int, outcome: ValidationOutcome,
                      report_path: str | None) -> None:
    with connect(settings.settlement_dsn) as conn:
        conn.execute(q("eod", "record_validation"), {
            "run_id": run_id, "success": outcome.success,
            "validation": json.dumps(outcome.as_dict(), default=str),
            "report_path": report_path,
        })
        conn.commit()
