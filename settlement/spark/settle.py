"""Settling a day that has been read: dedupe, net, collect the exact results.

The day arrives as a ``DayRead`` (``settlement.spark.io``); what leaves is a plain-Python
``SettlementResult`` (named rows, Decimals) plus the deduplicated day, cached, which
validation checks in hand instead of reading the day again.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from settlement.contract import CANCEL
from settlement.eod.model import (
    AmendmentEffect,
    CashObligation,
    InstrumentSummary,
    Position,
    SettlementResult,
    netting,
    rows_of,
)
from settlement.spark import transforms as T
from settlement.spark.io import DayRead


@dataclass
class SettledDay:
    result: SettlementResult
    trades: DataFrame  # the deduplicated day as sent, cached: unpersist when done
    # the day in final states (cancels and corrections applied): what was netted
    final: DataFrame | None = None


@dataclass
class DedupedDay:
    """The day as it will be netted, before netting: what validation needs of it."""
    trades: DataFrame  # the deduplicated day as sent, cached: unpersist when done
    final: DataFrame  # in final states (cancels and corrections applied)
    effects: list[AmendmentEffect]
    trades_count: int
    raw_count: int  # before dedupe
    timings: dict[str, float]
    per_partition: dict[int, int] | None = None  # partition -> trades, when counted already


def dedupe_day(read: DayRead) -> DedupedDay:
    """The read day deduplicated and cached, its busts and corrections applied (lazily)."""
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    per_partition = read.per_partition
    if read.unique_ids:
        trades = read.trades.persist()
        # Counted per partition: the result's trades_per_partition, in the pass that fills
        # the cache (a count and then a second job for them cost a job more).
        per_partition = {int(r["kafka_partition"]): int(r["count"])
                         for r in trades.groupBy("kafka_partition").count().collect()}
        n_raw = n = sum(per_partition.values())
    elif read.deduplicated:
        # Kafka: copies of a trade share its partition (the key is the symbol), where the
        # classifier kept the first. A trade id in two partitions breaks that premise; the
        # read_copies check names it (the partition is part of a trade's identity) and the
        # run is not published.
        trades = read.trades
        n = sum(read.per_partition.values()) if read.per_partition is not None \
            else trades.count()
        n_raw = n + read.duplicates
    else:
        trades = T.dedupe_trades(read.trades).persist()
        n_raw = read.trades.count()
        n = trades.count()
    # The first action on the day: for a database read this is where the rows arrive.
    timings["dedupe_seconds"] = round(time.perf_counter() - t0, 3)
    t1 = time.perf_counter()
    # Busts and corrections: what a clearing house settles is each trade's final state.
    effects = amendment_effects(trades, read.amendments)
    final = T.final_trades(trades, read.amendments if effects else None)
    timings["amendments_seconds"] = round(time.perf_counter() - t1, 3)
    return DedupedDay(trades, final, effects, n, n_raw, timings, per_partition)


def net_day(day: DedupedDay, read: DayRead, trade_date: str, source: str) -> SettledDay:
    """Positions, obligations and instrument summaries of a deduplicated day."""
    timings = dict(day.timings)
    t1 = time.perf_counter()
    # One pass over the day; positions, obligations and instruments are aggregates of it.
    legs = T.netting_legs(day.final, trade_date).persist()
    pos = T.positions_of(legs, trade_date)
    # Sorted here, not by Spark: an orderBy is a sampling job and a range shuffle more per
    # result, and the results are at most accounts x symbols rows (Python's order of str is
    # Spark's of UTF-8 strings: by code point).
    positions = sorted(rows_of(Position, pos.collect()), key=lambda p: (p.account, p.symbol))
    obligations = sorted(rows_of(CashObligation, T.cash_obligations(pos).collect()),
                         key=lambda o: o.account)
    instruments = sorted(rows_of(InstrumentSummary,
                                 T.instruments_of(legs, trade_date).collect()),
                         key=lambda i: i.symbol)
    per_partition = day.per_partition if day.per_partition is not None else {
        int(r["kafka_partition"]): int(r["count"])
        for r in day.trades.groupBy("kafka_partition").count().collect()}
    legs.unpersist()
    timings["netting_seconds"] = round(time.perf_counter() - t1, 3)
    result = SettlementResult(
        trade_date=trade_date, source=source, trades=day.trades_count,
        duplicates_removed=day.raw_count - day.trades_count,
        malformed=read.malformed, positions=positions, obligations=obligations,
        instruments=instruments, netting=netting(obligations),
        close_markers=read.close_markers, trades_per_partition=per_partition,
        timings=timings, late_in_range=read.late, amendments=day.effects,
    )
    return SettledDay(result, day.trades, day.final)


def settle_day(read: DayRead, trade_date: str, source: str) -> SettledDay:
    """Dedupe and net, one after the other (a close validates between the two)."""
    return net_day(dedupe_day(read), read, trade_date, source)


def amendment_effects(trades: DataFrame, amendments: DataFrame | None) -> list[AmendmentEffect]:
    """Each cancel and correction of the day with the trade before and after it, in log
    order per trade: the audit report's list and its cash effect. The amendments are few;
    only their trades are collected."""
    if amendments is None:
        return []
    # Sorted here: the amendments are few, and an orderBy is a Spark job of its own.
    rows = sorted(amendments.collect(),
                  key=lambda r: (r["trade_id"], r["kafka_partition"], r["kafka_offset"]))
    if not rows:
        return []
    # A set lookup in the scan (Spark's InSet): no broadcast of the ids to build first.
    ids = sorted({r["trade_id"] for r in rows})
    state = {r["trade_id"]: (r["price"], r["quantity"])
             for r in trades.where(F.col("trade_id").isin(ids))
             .select("trade_id", "price", "quantity").collect()}
    out = []
    for r in rows:
        before = state.get(r["trade_id"])
        after = None if r["kind"] == CANCEL else (r["price"], r["quantity"])
        out.append(AmendmentEffect.of(r, before, after))
        state[r["trade_id"]] = after
    return out
