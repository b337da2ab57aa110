"""Great Expectations validation of a settlement run: no trade lost, none duplicated.

``validate_frames`` is the core (Spark frames in, verdict out); ``validation.day`` hands it
the frames a real run holds (the read as it came in, the day it settled, the ledgers, the
positions) and records the verdict in ``settlement_runs``. Which check runs on which frame,
and why: ``validation.suites``.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from typing import Any

from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from settlement.contract import CANCEL
from settlement.spark.figures import (
    DaySide,
    collect_figures,
    differing,
    partition_figures,
    seq_figures,
)
from settlement.spark.schemas import AMENDMENT_SCHEMA, TRADE_SCHEMA
from settlement.spark.session import local_frame
from settlement.spark.settle import AMENDED_SCHEMA, AmendedTrades
from settlement.spark.transforms import final_states
from settlement.validation.amendments import suspects as amendment_suspects
from settlement.validation.run import Frame, ValidationOutcome, register_views, run_suites

__all__ = ["DaySide", "ValidationOutcome", "validate_frames"]
# The drill-down lists at most this many differing buckets by name (all are counted).
_NAMED_BUCKETS = 20

# What the sites recorded about retention gaps (``settlement.eod.model.DataLoss``).
DATA_LOSS_SCHEMA = ("ledger string, kafka_partition int, from_offset long, to_offset long, "
                    "site string, detected_at string")
# The settled day per instrument (``settled_symbols``): its volume and its notional, exact
# (a price times a quantity is decimal(38,4) in Spark, and so is their sum).
SETTLED_SYMBOLS = "symbol string, volume long, notional decimal(38,4)"
_MARKERS = T.StructType([T.StructField("kafka_partition", T.IntegerType()),
                         T.StructField("last_seq", T.LongType())])


def validate_frames(
    spark: SparkSession,
    *,
    trade_date: str,
    partitions: int,
    as_read: DataFrame,
    settlement_trades: DataFrame,
    close_markers: dict[int, int],
    positions: Frame | None = None,
    ledger: DataFrame | DaySide | None = None,
    kafka: DataFrame | None = None,
    ledger_a: DataFrame | DaySide | None = None,
    ledger_b: DataFrame | DaySide | None = None,
    data_loss: DataFrame | None = None,
    unique_ids: bool = False,
    skip: dict[str, str] | None = None,
    only: set[str] | None = None,
    settled_figures: list[tuple[int, ...]] | None = None,
    copies_agree_within_partitions: bool = False,
    as_read_only_the_day: bool = False,
    amendments: DataFrame | None = None,
    amendment_rows: list[Row] | None = None,
    amendment_figures: list[tuple[int, ...]] | None = None,
    other_amendments: DataFrame | None = None,
    other_amendment_rows: list[tuple[Any, ...]] | None = None,
    amended_trades: Callable[[], list[tuple[Any, ...]]] | None = None,
    settled_symbols: Callable[[], list[tuple[Any, ...]]] | None = None,
    docs_in_background: bool = False,
) -> ValidationOutcome:
    """Run every suite that can fail on this run's frames.

    ``as_read``: every trade the read returned, of any date, before dedupe;
    ``settlement_trades``: the day the settlement netted (dated, deduplicated);
    ``close_markers``: partition -> last_seq of the day; ``kafka``: the settled day when
    Kafka was the source (None: the day was read from the ledger(s), by date);
    ``data_loss``: the retention gaps the reachable ledgers recorded for the day
    (``DATA_LOSS_SCHEMA``; a run always passes it, empty when there are none);
    ``unique_ids``: the read is one ledger, whose primary key is trade_id;
    ``settled_figures``: the settled day's figures when the read took them already;
    ``copies_agree_within_partitions``: the reader compared every later copy of a trade in
    its partition with the first (the Kafka reader does; ``read_copies`` is then skipped when
    the ledger's checksums prove the day's trade ids unique and the read held only the
    day's trades, the only cases left where it could fail); ``as_read_only_the_day``: the
    read held no trade of another date (``read_dates`` cannot fail). A ledger is a frame or
    a ``DaySide`` (its figures taken in PostgreSQL, its trades fetched by bucket).

    Busts and corrections: ``amendments`` are the day's accepted cancels and corrections
    (AMENDMENT_SCHEMA; None: the read has none), ``amendment_rows`` the same collected when
    the caller holds them already (a close: 10,000 rows of the 2M-trade day, collected
    again here in 0.3-0.5 s), ``amendment_figures`` their figures when the read took them,
    ``other_amendments`` another copy's (the ledger's for a Kafka-sourced run, site B's for
    a ledger-sourced one) to reconcile, ``other_amendment_rows`` the same as the caller
    holds them (None: collected here),
    ``amended_trades`` the settled day's trades they name (``settlement.spark.settle``'s
    AMENDED_SCHEMA rows) and ``settled_symbols`` the day's volume and notional per
    instrument in final states (SETTLED_SYMBOLS rows): both as the close shares them
    (``AmendedTrades``: the amended trades picked out of the day, the sums derived from the
    day's as sent); None: taken here the same way.

    The settled day's figures (``settlement.spark.figures``) are taken once, or handed over
    by the read (``settled_figures``); the checks then read the figures and, trade by trade,
    only the partitions and buckets whose figures say something is wrong (``figures`` in the
    outcome says which).
    """
    run_params = local_frame(spark, [(dt.date.fromisoformat(trade_date), partitions)],
                             "trade_date date, partitions int")
    markers = local_frame(spark, sorted(close_markers.items()), _MARKERS)
    t0 = time.perf_counter()
    # The settled day's row hash sums are needed only when another copy is compared with
    # it in Spark (``side`` below hands them to DaySide.of_frame); its completeness needs
    # the counts and seq sums alone.
    compared_here = (kafka if ledger is not None else None,
                     *((ledger_a, ledger_b) if ledger_a is not None and ledger_b is not None
                       else ()))
    row_sums = any(x is settlement_trades for x in compared_here)
    if row_sums and settled_figures and settled_figures[0][7] is None:
        settled_figures = None  # taken without the row hash sums this comparison needs
    buckets = collect_figures(spark, settlement_trades, settled_figures, row_sums=row_sums)
    day_amendments = amendments if amendments is not None else local_frame(
        spark, [], AMENDMENT_SCHEMA)
    if amendments is None:
        amendment_rows = []
    elif amendment_rows is None:
        amendment_rows = amendments.collect()
    if amendment_figures is None and amendments is not None:
        # Their seq coverage only: nothing compares amendments by their figures. They are
        # few and held by the driver: summed here, not by a Spark job.
        amendment_figures = seq_figures([(r["kafka_partition"], r["seq"])
                                         for r in amendment_rows])
    parts = partition_figures(spark, buckets, close_markers, amendment_figures)
    part_rows = parts.collect()
    suspect = sorted(int(r["kafka_partition"]) for r in part_rows if r["suspect"])
    drill: dict[str, Any] = {"trades_day": {
        "partitions": len(part_rows), "suspect_partitions": suspect,
        "seconds": round(time.perf_counter() - t0, 3)}}
    settled_suspect = (with_amendment_seqs(settlement_trades, day_amendments)
                       .where(F.col("kafka_partition").isin(suspect))
                       if suspect else settlement_trades.limit(0))
    views = {"run_params": run_params, "close_markers_day": markers,
             "read_trades": as_read,
             "day_amendments": day_amendments, "day_partitions": parts}

    def wanted(suite: str) -> bool:
        return only is None or any(n.split("@")[0] == suite for n in only)

    # The day's trades that its amendments name (few) and the settled day's volume and
    # notional per instrument (what the positions must carry), which the close shares with
    # the amendments' effects and takes while it nets the day: the amended trades by a
    # semi join, the sums from the day's as sent (taken by the read's pass, else by an
    # aggregate of their own). Once the positions come, the invariants compare small
    # frames. amendments_day checks each amendment against those trades, and how many
    # trades of the day are busted is counted from them (a cancel of a trade not in the day
    # is amendments_day's to name).
    if amended_trades is None or settled_symbols is None:
        taken = AmendedTrades(settlement_trades, final_states(amendment_rows))
        amended_trades, settled_symbols = taken.rows, taken.settled_symbols
    t1 = time.perf_counter()
    amended = amended_trades() if amendments is not None else []
    if (positions is not None and wanted("settlement_invariants")
            and "settlement_invariants" not in (skip or {})):
        views["settled_symbols"] = local_frame(spark, settled_symbols(), SETTLED_SYMBOLS)
    drill["day_scan"] = {"amended_trades": len(amended),
                         "seconds": round(time.perf_counter() - t1, 3)}
    views["amended_trades"] = local_frame(spark, amended, AMENDED_SCHEMA)
    busted = {r["trade_id"] for r in amendment_rows if r["kind"] == CANCEL}
    cancelled = len({r[0] for r in amended if r[0] in busted})
    views["day_cancelled"] = local_frame(spark, [(cancelled,)], "cancelled long")
    skip = dict(skip or {})
    if amendments is None or not any(r["amendments"] for r in part_rows):
        skip.setdefault("amendments_day", "no cancel or correction on this day")
    checked_amendments = day_amendments
    if amendments is not None:
        # Only the amendments the suites could name go to them (``validation.amendments``):
        # on a day where nothing is wrong, none.
        t2 = time.perf_counter()
        other_rows = other_amendment_rows
        if other_rows is None and other_amendments is not None:
            other_rows = other_amendments.collect()
        ours, theirs = amendment_suspects(amendment_rows, amended, other_rows)
        checked_amendments = local_frame(spark, [amendment_rows[i] for i in ours],
                                         AMENDMENT_SCHEMA)
        drill["amendments"] = {"settled": len(amendment_rows), "checked": len(ours)}
        if other_rows is not None and theirs is not None:
            other_amendments = local_frame(spark, [other_rows[i] for i in theirs],
                                           AMENDMENT_SCHEMA)
            drill["amendments"].update(other=len(other_rows), other_checked=len(theirs))
        drill["amendments"]["seconds"] = round(time.perf_counter() - t2, 3)
    if other_amendments is not None:
        views["other_amendments"] = other_amendments
    else:
        skip.setdefault("reconcile_amendments", "no other copy of the day's cancels and "
                                                "corrections to compare with")

    def side(name: str, x: DataFrame | DaySide) -> DaySide:
        if isinstance(x, DaySide):
            return x
        return DaySide.of_frame(name, x, buckets if x is settlement_trades else None)

    def drill_down(suite: str, a: DaySide, b: DaySide) -> tuple[DataFrame, DataFrame]:
        """Both copies' trades of the buckets whose figures differ."""
        t1 = time.perf_counter()
        diff = differing(a, b)
        drill[suite] = {"buckets": len(a.figures.keys() | b.figures.keys()),
                        "differing": len(diff), "named": [list(k) for k in
                                                          diff[:_NAMED_BUCKETS]],
                        "seconds": round(a.seconds + b.seconds + time.perf_counter() - t1, 3)}
        return a.rows_in(diff), b.rows_in(diff)

    ledger_rows = ledger_b_rows = None
    if kafka is not None and ledger is not None and wanted("reconcile_kafka_ledger"):
        views["kafka_day"], ledger_rows = drill_down(
            "reconcile_kafka_ledger", side("kafka_day", kafka), side("ledger", ledger))
    if kafka is None:
        skip.setdefault("reconcile_kafka_ledger", "Kafka was not read for this run")
        # A check that cannot fail is not run: it would only look like a guarantee.
        skip.setdefault("read_dates", "the day was read from the ledger by date: no trade of "
                                      "another date can be in the read")
    if unique_ids:
        skip.setdefault("read_copies", "one ledger was read: trade_id is its primary key, so "
                                       "no trade id can repeat in the read")
    if as_read_only_the_day:
        skip.setdefault("read_dates", "the reader counted no trade of another date in the "
                                      "day's range")
    kafka_vs_ledger = drill.get("reconcile_kafka_ledger")
    if (copies_agree_within_partitions and kafka_vs_ledger is not None
            and kafka_vs_ledger["differing"] == 0 and kafka_vs_ledger["buckets"] > 0
            and as_read_only_the_day):
        # Two different trades under one id would be two first copies in two partitions
        # (the reader dead-letters a differing copy in the same partition): both in the
        # settled day, which has the ledger's trades exactly, and the ledger holds a trade
        # id once (its primary key). So the check cannot fail here.
        skip.setdefault("read_copies", "the reader compared every copy in its partition, and "
                                       "the day's checksums equal the ledger's, whose trade "
                                       "ids are unique: no trade id can hold two trades")
    if ledger_a is not None and ledger_b is not None:
        if wanted("reconcile_site_a_b"):
            views["ledger_a_day"], ledger_b_rows = drill_down(
                "reconcile_site_a_b", side("ledger_a", ledger_a), side("ledger_b", ledger_b))
    else:
        skip.setdefault("reconcile_site_a_b", "not the separate scheme (one ledger)")
    register_views(spark, views)
    frames = {"as_read": as_read, "settlement_trades": settled_suspect,
              "amendments": checked_amendments,
              "ledger_trades": ledger_rows, "ledger_b_trades": ledger_b_rows,
              "data_loss": data_loss, "positions": positions}
    outcome = run_suites(frames, skip, only, docs_in_background)
    outcome.figures = drill
    return outcome


def with_amendment_seqs(trades: DataFrame, amendments: DataFrame) -> DataFrame:
    """The trades and the seqs the amendments took, as rows of TRADE_SCHEMA (an amendment's
    trade id tagged with its kind, so that "one trade per partition and seq" names it): what
    the completeness checks search in a suspect partition."""
    tagged = amendments.select(
        F.concat(F.col("trade_id"), F.lit(" ("), F.col("kind"), F.lit(")")).alias("trade_id"),
        *(F.col(f.name) if f.name in amendments.columns and f.name != "trade_id"
          else F.lit(None).cast(f.dataType).alias(f.name) for f in TRADE_SCHEMA.fields[1:]))
    return trades.unionByName(tagged)
