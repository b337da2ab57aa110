"""Settlement steps: pure ``def step(df: DataFrame, ...) -> DataFrame`` functions.

Reading and writing live in ``settlement.spark.io`` and the pipeline; everything here is a
transformation that tests run on tiny inline frames.

Money never passes through a float: prices are read from their JSON string and cast to
``decimal(18,4)``; an amount is ``decimal(18,4) * decimal(19,0) = decimal(38,4)`` (exact,
Spark needs no precision-loss rescaling below 38 digits); sums are narrowed to the tables'
``numeric(28,4)``. Spark 4 runs in ANSI mode (``session.build_session`` pins it), so an
overflow fails the job instead of silently becoming NULL.
"""

from __future__ import annotations

import datetime as dt

from pyspark.sql import Column, DataFrame, Row, Window
from pyspark.sql import functions as F
from pyspark.sql.types import DateType, DecimalType, LongType

from settlement.contract import CANCEL, CORRECT, CORRECTED_FIELDS
from settlement.spark.schemas import (
    AMOUNT,
    PRICE,
    PRODUCT,
    TRADE_SCHEMA,
)
from settlement.spark.session import local_frame

# -- settlement steps ----------------------------------------------------------------------


def conform_trades(df: DataFrame) -> DataFrame:
    """Select and cast TRADE_SCHEMA's columns (e.g. from a JDBC read of the ledger, whose
    ``executed_at`` is timestamptz and which has extra columns)."""
    return df.select([F.col(f.name).cast(f.dataType).alias(f.name) for f in TRADE_SCHEMA])


def dedupe_trades(df: DataFrame) -> DataFrame:
    """One row per ``trade_id``: the earliest copy in the log, lowest (kafka_partition,
    kafka_offset). The remaining columns break ties, so the choice never depends on how rows
    are spread over tasks (two ledgers holding the same offset, for instance)."""
    return _earliest(df, ("trade_id",))


def dedupe_amendments(df: DataFrame) -> DataFrame:
    """One row per amendment identity (trade id, kind, version): the earliest copy, as
    ``dedupe_trades`` (two ledgers' union holds the amendments both stored)."""
    return _earliest(df, ("trade_id", "kind", "version"))


def _earliest(df: DataFrame, key: tuple[str, ...]) -> DataFrame:
    """One row per ``key``: the lowest (kafka_partition, kafka_offset), then the other
    columns, so that ties never depend on how rows are spread over tasks."""
    first = ["kafka_partition", "kafka_offset"]
    order = first + [c for c in df.columns if c not in (*first, *key)]
    w = Window.partitionBy(*key).orderBy(*order)
    return df.withColumn("_n", F.row_number().over(w)).where(F.col("_n") == 1).drop("_n")


def with_final_states(trades: DataFrame, states: list[tuple[object, ...]]) -> DataFrame:
    """The day's trades in their final states (TRADE_SCHEMA): a cancelled trade left out, a
    corrected one with its highest version's values (its identity, date, seq and offset stay
    the original's). ``states``: each amended trade's final state (``final_states``) of the
    day's accepted cancels and corrections (the readers and the sites refused the rest),
    decided by the driver from those few and broadcast, so the day is joined once and
    nothing is shuffled. (A distinct of the cancels and a window over the corrections in
    Spark were two shuffles in every query of the final day: 0.7-1.2 s of a 2M-trade day's
    netting, warm.)"""
    if not states:
        return trades
    out = joined_final_states(trades, states).where(~busted())
    fields = [final_field(f.name).alias(f.name) if f.name in CORRECTED_FIELDS
              else F.col(f.name) for f in TRADE_SCHEMA]
    return out.select(fields)


def joined_final_states(trades: DataFrame, states: list[tuple[object, ...]]) -> DataFrame:
    """The day with each amended trade's final state beside it (FINAL_STATES' columns, NULL
    for a trade nobody amended), the states broadcast from the driver."""
    finals = local_frame(trades.sparkSession, states, FINAL_STATES)
    return trades.join(F.broadcast(finals), "trade_id", "left")


def busted() -> Column:
    """On ``joined_final_states``: the trade was cancelled."""
    return F.coalesce(F.col("_cancelled"), F.lit(False))


def final_field(name: str) -> Column:
    """On ``joined_final_states``: a corrected field's final value."""
    return F.coalesce(F.col(f"_new_{name}"), F.col(name))


# An amended trade's final state (``final_states``): busted, or its corrected fields.
FINAL_STATES = ", ".join(["trade_id string", "_cancelled boolean"] + [
    f"_new_{f.name} {f.dataType.simpleString()}" for f in TRADE_SCHEMA
    if f.name in CORRECTED_FIELDS])


FINAL_STATES_COLUMNS = tuple(c.split()[0] for c in FINAL_STATES.split(", "))


def final_states(amendments: list[Row]) -> list[tuple[object, ...]]:
    """Per amended trade id (FINAL_STATES rows, by id): whether a cancel busted it, else the
    fields of its correction of the highest version (a version missing ranks lowest)."""
    cancelled: set[str] = set()
    latest: dict[str, Row] = {}
    for r in amendments:
        if r["kind"] == CANCEL:
            cancelled.add(r["trade_id"])
        elif r["kind"] == CORRECT:
            held = latest.get(r["trade_id"])
            if held is None or _version(r) > _version(held):
                latest[r["trade_id"]] = r
    out: list[tuple[object, ...]] = []
    for trade_id in sorted(cancelled | latest.keys()):
        new = latest.get(trade_id) if trade_id not in cancelled else None
        out.append((trade_id, trade_id in cancelled,
                    *(None if new is None else new[c] for c in _CORRECTED_ORDER)))
    return out


_CORRECTED_ORDER = tuple(f.name for f in TRADE_SCHEMA if f.name in CORRECTED_FIELDS)


def _version(r: Row) -> int:
    return -1 if r["version"] is None else int(r["version"])


def netting_legs(trades: DataFrame, trade_date: str | dt.date) -> DataFrame:
    """The day's trades summed per (account, symbol) (``settlement.eod.model.Leg``): the one
    pass over the day; the positions, cash obligations and instrument summary are small
    aggregates of its rows, taken in the driver (``settlement.eod.model.net_legs``).

    Each trade becomes two legs, the buyer's and the seller's, which are then summed; trades
    of other dates are ignored. ``trade_count`` counts the trades the account took part in on
    either side (buyer == seller is rejected upstream, so one trade is one leg), ``buys``
    those it bought (a trade has one buyer), ``low_price``/``high_price`` its trades' prices,
    ``last_executed_at`` its latest trade's time (``closing_trades`` finds the symbol's
    closing trade from it).

    Every aggregate here has a fixed-width buffer, so Spark sums the legs in a hash aggregate.
    A max over a struct holding the trade id (a string) made it a sort aggregate: every leg
    sorted by (account, symbol), 4M legs for a 2M-trade day (docs/benchmarks-history.md,
    2026-11-30).
    """
    day = _on_date(trades, trade_date)
    amount = _amount(F.col("price"), F.col("quantity"))
    no_qty = F.lit(0).cast(LongType())
    no_amount = F.lit(0).cast(PRODUCT)

    def leg(account: str, bought: Column, sold: Column, paid: Column, got: Column,
            buys: int) -> Column:
        return F.struct(
            F.col(account).alias("account"),
            bought.alias("bought_qty"),
            sold.alias("sold_qty"),
            paid.alias("buy_amount"),
            got.alias("sell_amount"),
            F.lit(buys).cast(LongType()).alias("buys"),
        )

    qty = F.col("quantity").cast(LongType())
    legs = day.select(
        "symbol",
        F.col("price").cast(PRICE).alias("price"),
        "executed_at",
        F.inline(
            F.array(
                leg("buyer", qty, no_qty, amount, no_amount, 1),
                leg("seller", no_qty, qty, no_amount, amount, 0),
            )
        ),
    )
    return legs.groupBy("account", "symbol").agg(
        F.sum("bought_qty").alias("bought_qty"),
        F.sum("sold_qty").alias("sold_qty"),
        F.sum("buy_amount").cast(AMOUNT).alias("buy_amount"),
        F.sum("sell_amount").cast(AMOUNT).alias("sell_amount"),
        F.count(F.lit(1)).alias("trade_count"),
        F.sum("buys").alias("buys"),
        F.min("price").alias("low_price"),
        F.max("price").alias("high_price"),
        F.max("executed_at").alias("last_executed_at"),
    )


LATEST_TIMES = "symbol string, last_executed_at timestamp"


def closing_trades(trades: DataFrame, trade_date: str | dt.date, at: DataFrame) -> DataFrame:
    """The trades of the day at each symbol's latest time (``at``: LATEST_TIMES rows, from the
    legs): (symbol, trade_id, price), a few rows. The symbol's close is the one with the
    greatest trade id among them. One scan of the (cached) day, joined with ``at``
    broadcast: no shuffle."""
    day = _on_date(trades, trade_date)
    return (day.join(F.broadcast(at), (day["symbol"] == at["symbol"])
                     & (day["executed_at"] == at["last_executed_at"]))
            .select(day["symbol"], day["trade_id"], day["price"].cast(PRICE).alias("price")))


# -- helpers -------------------------------------------------------------------------------


def _as_date(value: str | dt.date) -> dt.date:
    return value if isinstance(value, dt.date) else dt.date.fromisoformat(value)


def _date_lit(value: str | dt.date) -> Column:
    return F.lit(_as_date(value)).cast(DateType())


def _on_date(trades: DataFrame, trade_date: str | dt.date) -> DataFrame:
    return trades.where(F.col("trade_date") == _date_lit(trade_date))


def _amount(price: Column, quantity: Column) -> Column:
    """price * quantity as decimal(38,4), exact."""
    return price.cast(PRICE) * quantity.cast(DecimalType(19, 0))
