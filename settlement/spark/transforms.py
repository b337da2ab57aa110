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

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import DateType, DecimalType, LongType

from settlement.contract import CANCEL, CORRECT, CORRECTED_FIELDS
from settlement.spark.schemas import (
    AMENDMENT_SCHEMA,
    AMOUNT,
    PRICE,
    PRODUCT,
    TRADE_SCHEMA,
    VWAP,
)

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


def conform_amendments(df: DataFrame) -> DataFrame:
    """Select and cast AMENDMENT_SCHEMA's columns (a JDBC read of ``trade_amendments``)."""
    return df.select([F.col(f.name).cast(f.dataType).alias(f.name) for f in AMENDMENT_SCHEMA])


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


def final_trades(trades: DataFrame, amendments: DataFrame | None) -> DataFrame:
    """The day's trades in their final states (TRADE_SCHEMA): a cancelled trade left out, a
    corrected one with its highest version's values (its identity, date, seq and offset stay
    the original's). ``amendments``: the day's accepted cancels and corrections (the readers
    and the sites refused the rest), few: they are broadcast, the day is not shuffled."""
    if amendments is None:
        return trades
    cancelled = amendments.where(F.col("kind") == CANCEL).select("trade_id").distinct()
    w = Window.partitionBy("trade_id").orderBy(F.col("version").desc())
    latest = (amendments.where(F.col("kind") == CORRECT)
              .withColumn("_n", F.row_number().over(w)).where(F.col("_n") == 1)
              .select("trade_id", *(F.col(c).alias(f"_new_{c}") for c in CORRECTED_FIELDS)))
    out = (trades.join(F.broadcast(cancelled), "trade_id", "left_anti")
           .join(F.broadcast(latest), "trade_id", "left"))
    fields = [F.coalesce(F.col(f"_new_{f.name}"), F.col(f.name)).alias(f.name)
              if f.name in CORRECTED_FIELDS else F.col(f.name) for f in TRADE_SCHEMA]
    return out.select(fields)


def netting_legs(trades: DataFrame, trade_date: str | dt.date) -> DataFrame:
    """The day's trades summed per (account, symbol): the one pass over the day that both
    the positions (``positions_of``) and the instrument summary (``instruments_of``) are
    taken from, each a small aggregate of this one (a 2M day scanned once instead of twice).

    Each trade becomes two legs, the buyer's and the seller's, which are then summed; trades
    of other dates are ignored. ``trade_count`` counts the trades the account took part in on
    either side (buyer == seller is rejected upstream, so one trade is one leg), ``buys``
    those it bought (a trade has one buyer), ``low_price``/``high_price`` its trades' prices.
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
    )


def positions(trades: DataFrame, trade_date: str | dt.date) -> DataFrame:
    """Net position per (account, symbol) for one business date (POSITIONS_SCHEMA)."""
    return positions_of(netting_legs(trades, trade_date), trade_date)


def positions_of(legs: DataFrame, trade_date: str | dt.date) -> DataFrame:
    """The positions (POSITIONS_SCHEMA) from ``netting_legs``' rows."""
    return legs.select(
        _date_lit(trade_date).alias("trade_date"),
        "account",
        "symbol",
        "bought_qty",
        "sold_qty",
        (F.col("bought_qty") - F.col("sold_qty")).alias("net_qty"),
        "buy_amount",
        "sell_amount",
        (F.col("sell_amount") - F.col("buy_amount")).cast(AMOUNT).alias("net_cash"),
        "trade_count",
    )


def cash_obligations(positions: DataFrame) -> DataFrame:
    """Net cash per account against the central counterparty (CASH_OBLIGATIONS_SCHEMA);
    ``net_cash > 0``: the CCP pays the account.

    ``trade_count`` sums the positions' counts over symbols. That is exactly the number of
    trades the account took part in: a trade has one symbol and the account is on one side.
    """
    grouped = positions.groupBy("trade_date", "account").agg(
        F.sum("buy_amount").cast(AMOUNT).alias("buy_amount"),
        F.sum("sell_amount").cast(AMOUNT).alias("sell_amount"),
        F.sum("trade_count").cast(LongType()).alias("trade_count"),
    )
    return grouped.select(
        "trade_date",
        "account",
        "buy_amount",
        "sell_amount",
        (F.col("sell_amount") - F.col("buy_amount")).cast(AMOUNT).alias("net_cash"),
        "trade_count",
    )


def instrument_summary(trades: DataFrame, trade_date: str | dt.date) -> DataFrame:
    """Per symbol: trades, volume, notional, VWAP (notional / volume rounded half-up to 10
    places), low and high price (INSTRUMENT_SUMMARY_SCHEMA)."""
    return instruments_of(netting_legs(trades, trade_date), trade_date)


def instruments_of(legs: DataFrame, trade_date: str | dt.date) -> DataFrame:
    """The instrument summary (INSTRUMENT_SUMMARY_SCHEMA) from ``netting_legs``' rows: every
    trade is one buy of one account, so a symbol's trades, volume and notional are its
    accounts' buys, bought quantities and buy amounts (exact: sums of decimals of scale 4),
    its low and high the lowest and highest of theirs."""
    grouped = legs.groupBy("symbol").agg(
        F.sum("buys").alias("trades"),
        F.sum("bought_qty").alias("volume"),
        F.sum("buy_amount").cast(AMOUNT).alias("notional"),
        F.min("low_price").alias("low_price"),
        F.max("high_price").alias("high_price"),
    )
    return grouped.select(
        _date_lit(trade_date).alias("trade_date"),
        "symbol",
        "trades",
        "volume",
        "notional",
        _div_half_up(F.col("notional"), F.col("volume"), 10).cast(VWAP).alias("vwap"),
        "low_price",
        "high_price",
    )


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


def _div_half_up(num: Column, den: Column, scale: int) -> Column:
    """``num / den`` rounded half-up to ``scale`` (<= 10) places, exactly; num >= 0 with at
    most ``scale`` decimals, den a positive integer, the quotient below 10**(28 - scale).

    Spark divides decimals at a bounded scale, rounding half-up, and the cast to the target
    scale rounds again; that double rounding lifts a quotient just below a half (…4999|7)
    up. So this works in integers: with N = num * 10**scale, the answer is
    floor((2N + den) / (2 * den)) / 10**scale, the floor taken through the remainder.
    """
    unit = F.lit(10**scale).cast(DecimalType(scale + 1, 0))
    n = (num * unit).cast(DecimalType(38, 0))  # exact: num has at most `scale` decimals
    d = den.cast(DecimalType(19, 0))
    top = n + n + d
    bottom = d + d
    quotient = ((top - top % bottom) / bottom).cast(DecimalType(28, 0))
    # decimal(28,0) / decimal(scale+1,0) gets scale 10 within Spark's 38 digits: exact here.
    return quotient / unit

