"""Settling a day that has been read: dedupe, net, collect the exact results.

The day arrives as a ``DayRead`` (``settlement.spark.io``); what leaves is a plain-Python
``SettlementResult`` (named rows, Decimals) plus the deduplicated day, cached, which
validation checks in hand instead of reading the day again.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal

from pyspark.sql import DataFrame, Row
from pyspark.sql import functions as F

from settlement.contract import CANCEL
from settlement.eod.model import (
    AmendmentEffect,
    Leg,
    Netted,
    Position,
    SettlementResult,
    closes,
    latest_times,
    net_legs,
    netting,
    rows_of,
)
from settlement.spark import transforms as T
from settlement.spark.figures import figures
from settlement.spark.io import DayRead
from settlement.spark.session import local_frame


@dataclass
class SettledDay:
    result: SettlementResult
    trades: DataFrame  # the deduplicated day as sent, cached: unpersist when done
    # the day in final states (cancels and corrections applied): what was netted
    final: DataFrame | None = None


# What validation and the amendments' effects need of an amended trade.
AMENDED_SCHEMA = ("trade_id string, kafka_partition int, kafka_offset long, trade_date date, "
                  "price decimal(18,4), quantity long")
AMENDED_COLUMNS = tuple(c.split()[0] for c in AMENDED_SCHEMA.split(", "))


class AmendedTrades:
    """The day's trades that its cancels and corrections name (few, as sent), and the
    settled day's volume and notional per instrument, from one scan of the day on first use,
    whichever thread asks first: validation's amendment checks and invariants and the
    amendments' effects read them. (Collecting the trades and summing the settled day were
    a scan each, beside the netting: 1.9 s and 2.5 s of a 2M-trade day from the ledger,
    5.0 s and 3.2 s from Kafka, where each scan derives the day from the read's verdicts.)"""

    def __init__(self, trades: DataFrame, states: list[tuple[object, ...]]):
        self._trades = trades
        self._states = states
        self._taken: tuple[list[tuple[object, ...]], list[tuple[object, ...]]] | None = None
        self._lock = threading.Lock()

    def rows(self) -> list[tuple[object, ...]]:
        """AMENDED_SCHEMA rows, in trade id order."""
        return self._take()[0]

    def settled_symbols(self) -> list[tuple[object, ...]]:
        """(symbol, volume, notional) of the day in final states, per instrument that has a
        trade left in it (validation's SETTLED_SYMBOLS)."""
        return self._take()[1]

    def _take(self) -> tuple[list[tuple[object, ...]], list[tuple[object, ...]]]:
        with self._lock:
            if self._taken is None:
                self._taken = amended_and_settled(self._trades, self._states)
            return self._taken


def amended_and_settled(trades: DataFrame, states: list[tuple[object, ...]]
                        ) -> tuple[list[tuple[object, ...]], list[tuple[object, ...]]]:
    """``AmendedTrades``' two answers in one aggregate: the day joined with the amended
    trades' final states (broadcast), summed per final symbol over the trades not busted,
    each group also listing its amended trades as sent (a few per symbol)."""
    if states:
        day = T.joined_final_states(trades, states)
        qty, price, live = T.final_field("quantity"), T.final_field("price"), ~T.busted()
        symbol = T.final_field("symbol")
        amended = F.collect_list(F.when(F.col("_cancelled").isNotNull(), F.struct(
            *(F.col(c) for c in AMENDED_COLUMNS))))
    else:  # nothing amended: the day as it is
        day, symbol, qty, price = trades, F.col("symbol"), F.col("quantity"), F.col("price")
        live, amended = F.lit(True), None
    sums = [F.count(F.when(live, F.lit(1))).alias("trades"),
            F.sum(F.when(live, qty)).alias("volume"),
            F.sum(F.when(live, price * qty)).alias("notional")]
    groups = day.groupBy(symbol.alias("symbol")).agg(
        *sums, *([] if amended is None else [amended.alias("amended")])).collect()
    rows = sorted(tuple(a) for g in groups if amended is not None for a in g["amended"])
    return rows, [(g["symbol"], g["volume"], g["notional"]) for g in groups if g["trades"]]


@dataclass
class DedupedDay:
    """The day as it will be netted, before netting: what validation needs of it."""
    trades: DataFrame  # the deduplicated day as sent, cached: unpersist when done
    final: DataFrame  # in final states (cancels and corrections applied)
    amendments: list[Row]  # the day's cancels and corrections, in log order per trade
    trades_count: int
    raw_count: int  # before dedupe
    timings: dict[str, float]
    per_partition: dict[int, int] | None  # partition -> trades, when counted already
    # the trades the amendments name, and the settled day's sums (one scan, shared)
    amended: AmendedTrades


def dedupe_day(read: DayRead, row_sums: bool = False) -> DedupedDay:
    """The read day deduplicated and cached, its busts and corrections applied (lazily).
    ``row_sums``: a ledger's day is compared in Spark with another copy (validation's
    figures then carry its row hash sums, which cost an md5 of every trade)."""
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    per_partition = read.per_partition
    if read.unique_ids:
        trades = read.trades if read.trades.is_cached else read.trades.persist()
        # Validation's figures of the day (its checksums per bucket: ``read.figures``, as a
        # Kafka read takes them), in the pass that fills the cache, and the trades per
        # partition summed from them: a pass of their own cost a 2M-trade day's validation
        # 5.7 s, most of it beside the netting on the same two cores.
        read.figures = [tuple(r) for r in figures(trades, rows=row_sums).collect()]
        per_partition = {}
        for r in read.figures:
            per_partition[int(r[0])] = per_partition.get(int(r[0]), 0) + int(r[2])
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
    # Busts and corrections: what a clearing house settles is each trade's final state
    # (lazily: validation starts on it at once; their effects are taken while it runs).
    amendments = amendments_in_order(read.amendments)
    states = T.final_states(amendments)
    final = T.with_final_states(trades, states)
    timings["amendments_seconds"] = round(time.perf_counter() - t1, 3)
    return DedupedDay(trades, final, amendments, n, n_raw, timings, per_partition,
                      AmendedTrades(trades, states))


def net_day(day: DedupedDay, read: DayRead, trade_date: str, source: str,
            on_positions: Callable[[list[Position]], None] | None = None) -> SettledDay:
    """Positions, obligations and instrument summaries of a deduplicated day.
    ``on_positions``: called with the positions as soon as they are netted (validation's
    last suite waits for them), before the amendments' effects are looked up."""
    timings = dict(day.timings)
    t1 = time.perf_counter()
    # One pass over the day in Spark, its legs (at most accounts x symbols rows) collected;
    # positions, obligations and instruments are small aggregates of them, taken in Python
    # (sorted there too: Python's order of str is Spark's of UTF-8 strings, by code point).
    positions, obligations, instruments = net(day.final, trade_date)
    if on_positions is not None:
        on_positions(positions)
    per_partition = day.per_partition if day.per_partition is not None else {
        int(r["kafka_partition"]): int(r["count"])
        for r in day.trades.groupBy("kafka_partition").count().collect()}
    timings["netting_seconds"] = round(time.perf_counter() - t1, 3)
    t2 = time.perf_counter()
    effects = amendment_effects(day.amended, day.amendments)
    timings["amendments_seconds"] = round(
        timings.get("amendments_seconds", 0) + time.perf_counter() - t2, 3)
    result = SettlementResult(
        trade_date=trade_date, source=source, trades=day.trades_count,
        duplicates_removed=day.raw_count - day.trades_count,
        malformed=read.malformed, positions=positions, obligations=obligations,
        instruments=instruments, netting=netting(obligations),
        close_markers=read.close_markers, trades_per_partition=per_partition,
        timings=timings, late_in_range=read.late, amendments=effects,
    )
    return SettledDay(result, day.trades, day.final)


def net(final: DataFrame, trade_date: str | dt.date) -> Netted:
    """The positions, cash obligations and instrument summary of a day in final states: its
    legs summed by Spark in one pass (at most accounts x symbols rows, collected), the rest
    taken from them in Python (``settlement.eod.model.net_legs``)."""
    day = trade_date if isinstance(trade_date, dt.date) else dt.date.fromisoformat(trade_date)
    legs = rows_of(Leg, T.netting_legs(final, day).collect())
    last = latest_times(legs)
    close: dict[str, Decimal] = {}
    if last:  # an empty day has no close to find, and no query is run for it
        at = local_frame(final.sparkSession, sorted(last.items()), T.LATEST_TIMES)
        close = closes(T.closing_trades(final, day, at).collect())
    return net_legs(legs, day, close)


def settle_day(read: DayRead, trade_date: str, source: str) -> SettledDay:
    """Dedupe and net, one after the other (a close validates between the two)."""
    return net_day(dedupe_day(read), read, trade_date, source)


def amendments_in_order(amendments: DataFrame | None) -> list[Row]:
    """The day's cancels and corrections (few, held by the driver already: the readers
    collect them), in log order per trade. Sorted here: an orderBy is a Spark job."""
    if amendments is None:
        return []
    return sorted(amendments.collect(),
                  key=lambda r: (r["trade_id"], r["kafka_partition"], r["kafka_offset"]))


def amendment_effects(amended: AmendedTrades, rows: list[Row]) -> list[AmendmentEffect]:
    """Each cancel and correction of the day (``amendments_in_order``) with the trade before
    and after it, in log order per trade: the audit report's list and its cash effect. Only
    their trades are collected (``amended``)."""
    if not rows:
        return []
    state = {r[0]: (r[4], r[5]) for r in amended.rows()}  # AMENDED_SCHEMA: price, quantity
    out = []
    for r in rows:
        before = state.get(r["trade_id"])
        after = None if r["kind"] == CANCEL else (r["price"], r["quantity"])
        out.append(AmendmentEffect.of(r, before, after))
        state[r["trade_id"]] = after
    return out
