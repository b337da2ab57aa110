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
from decimal import Decimal, localcontext
from typing import Any

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
    positions_of,
    rows_of,
)
from settlement.spark import transforms as T
from settlement.spark.deferred import Picked
from settlement.spark.figures import EXACT, SymbolSums, figures_and_symbols, symbol_columns
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
    settled day's volume and notional per instrument, on first use, whichever thread asks
    first: validation's amendment checks and invariants and the amendments' effects read
    them. The settled day's sums are the day's as sent (``sent``: taken by the read's pass
    over every trade, else by an aggregate here), less the amended trades as sent, plus
    those not busted in their final states: so the only scan here picks out the amended
    trades, and a day with none has no scan. (One aggregate of the day joined with the final
    states took 5.1-5.3 s of a cold 2M-trade close from the ledger, beside the netting.)"""

    def __init__(self, trades: DataFrame, states: list[tuple[object, ...]],
                 sent: SymbolSums | None = None, picked: Picked | None = None):
        self._trades = trades
        self._states = states
        self._sent = sent
        self._picked = picked
        # Where the amended trades came from, once taken: "the read" or "a scan of the day".
        self.taken_by: str | None = None
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
                sent = self._sent if self._sent is not None else symbol_sums(self._trades)
                # Picked out by the read already (a Kafka day the JVM read, a complete
                # ledger's day), unless some amended id was not looked for there.
                amended = (self._picked.of({str(s[0]) for s in self._states})
                           if self._picked is not None else None)
                self.taken_by = "the read"
                if amended is None:
                    amended = amended_trades(self._trades, self._states)
                    self.taken_by = "a scan of the day"
                self._taken = ([r[:-1] for r in amended],
                               settled_symbols(sent, amended, self._states))
            return self._taken


def symbol_sums(trades: DataFrame) -> SymbolSums:
    """The day's ``SymbolSums`` by an aggregate of their own (a read that took none)."""
    return [(r["symbol"], int(r["symbol_trades"]), int(r["volume"]), r["notional"])
            for r in trades.groupBy("symbol").agg(*symbol_columns()).collect()]


def amended_trades(trades: DataFrame, states: list[tuple[object, ...]]
                   ) -> list[tuple[object, ...]]:
    """The day's trades that ``states`` name, as sent: AMENDED_SCHEMA rows, then the symbol,
    in trade id order (a semi join with the few ids broadcast: a scan, no shuffle)."""
    if not states:
        return []
    ids = local_frame(trades.sparkSession, [(s[0],) for s in states], "trade_id string")
    got = trades.join(F.broadcast(ids), "trade_id", "left_semi").select(
        *AMENDED_COLUMNS, "symbol").collect()
    return sorted(tuple(r) for r in got)


def settled_symbols(sent: SymbolSums, amended: list[tuple[object, ...]],
                    states: list[tuple[object, ...]]) -> list[tuple[object, ...]]:
    """(symbol, volume, notional) of the day in final states per instrument with a trade left
    (exact: ints and Decimals): ``sent`` less each amended trade as sent (``amended_trades``'
    rows), plus its final state unless busted (FINAL_STATES rows: a corrected field's new
    value, or NULL for the one sent)."""
    sums: dict[str, list[Any]] = {s: [n, v, x] for s, n, v, x in sent}

    def add(sign: int, symbol: Any, price: Any, quantity: Any) -> None:
        s = sums.setdefault(str(symbol), [0, 0, Decimal(0)])
        s[0] += sign
        s[1] += sign * int(quantity)
        with localcontext(EXACT):
            s[2] += sign * price * int(quantity)

    final = {s[0]: dict(zip(T.FINAL_STATES_COLUMNS, s, strict=True)) for s in states}
    for r in amended:
        sent_as = dict(zip((*AMENDED_COLUMNS, "symbol"), r, strict=True))
        add(-1, sent_as["symbol"], sent_as["price"], sent_as["quantity"])
        state = final[sent_as["trade_id"]]
        if not state["_cancelled"]:
            now = {f: sent_as[f] if state[f"_new_{f}"] is None else state[f"_new_{f}"]
                   for f in ("symbol", "price", "quantity")}
            add(1, now["symbol"], now["price"], now["quantity"])
    return sorted((s, v, x) for s, (n, v, x) in sums.items() if n)


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
        # The day's sums per instrument too: the settled day's are derived from them.
        read.figures, read.symbol_sums = figures_and_symbols(trades, rows=row_sums)
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
    amendments = amendments_in_order(read.amendment_rows)
    states = T.final_states(amendments)
    final = T.with_final_states(trades, states)
    timings["amendments_seconds"] = round(time.perf_counter() - t1, 3)
    return DedupedDay(trades, final, amendments, n, n_raw, timings, per_partition,
                      AmendedTrades(trades, states, read.symbol_sums, read.amended))


def net_day(day: DedupedDay, read: DayRead, trade_date: str, source: str,
            on_positions: Callable[[list[Position]], None] | None = None) -> SettledDay:
    """Positions, obligations and instrument summaries of a deduplicated day.
    ``on_positions``: called with the positions as soon as they are netted (validation's
    last suite waits for them), before the closing prices and the amendments' effects are
    looked up."""
    timings = dict(day.timings)
    t1 = time.perf_counter()
    # One pass over the day in Spark, its legs (at most accounts x symbols rows) collected;
    # positions, obligations and instruments are small aggregates of them, taken in Python
    # (sorted there too: Python's order of str is Spark's of UTF-8 strings, by code point).
    positions, obligations, instruments = net(day.final, trade_date, on_positions)
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


def net(final: DataFrame, trade_date: str | dt.date,
        on_positions: Callable[[list[Position]], None] | None = None) -> Netted:
    """The positions, cash obligations and instrument summary of a day in final states: its
    legs summed by Spark in one pass (at most accounts x symbols rows, collected), the rest
    taken from them in Python (``settlement.eod.model.net_legs``).

    ``on_positions`` gets the positions as soon as the legs are summed: they need nothing
    else, and the closing prices take another pass over the day, which validation's last
    suite (waiting for the positions) then runs beside."""
    day = trade_date if isinstance(trade_date, dt.date) else dt.date.fromisoformat(trade_date)
    legs = rows_of(Leg, T.netting_legs(final, day).collect())
    positions = None
    if on_positions is not None:
        positions = positions_of(legs, day)
        on_positions(positions)
    last = latest_times(legs)
    close: dict[str, Decimal] = {}
    if last:  # an empty day has no close to find, and no query is run for it
        at = local_frame(final.sparkSession, sorted(last.items()), T.LATEST_TIMES)
        close = closes(T.closing_trades(final, day, at).collect())
    return net_legs(legs, day, close, positions)


def settle_day(read: DayRead, trade_date: str, source: str) -> SettledDay:
    """Dedupe and net, one after the other (a close validates between the two)."""
    return net_day(dedupe_day(read), read, trade_date, source)


def amendments_in_order(amendments: list[Row] | None) -> list[Row]:
    """The day's cancels and corrections (few, held by the driver: ``DayRead``'s
    ``amendment_rows``), in log order per trade."""
    if amendments is None:
        return []
    return sorted(amendments,
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
