"""Settlement steps: pure ``def step(df: DataFrame, ...) -> DataFrame`` functions.

Only the job's entry point reads configuration, makes the session and writes; everything
here is a transformation that tests run on tiny inline frames.

Money never passes through a float: prices are read from their JSON string and cast to
``decimal(18,4)``; an amount is ``decimal(18,4) * decimal(19,0) = decimal(38,4)`` (exact,
Spark needs no precision-loss rescaling below 38 digits); sums are narrowed to the tables'
``numeric(28,4)``. Spark 4 runs in ANSI mode (``session.build_session`` pins it), so an
overflow fails the job instead of silently becoming NULL.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal, localcontext
from functools import reduce
from typing import NamedTuple

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import (
    BinaryType,
    DataType,
    DateType,
    DecimalType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

PRICE = DecimalType(18, 4)
AMOUNT = DecimalType(28, 4)
VWAP = DecimalType(28, 10)
# Exact product of a price and a quantity: 18 + 19 + 1 = 38 digits, scale 4.
_PRODUCT = DecimalType(38, 4)


def _schema(*fields: tuple[str, DataType]) -> StructType:
    # Nullable: these are type contracts; NOT NULL is enforced by validation and the tables.
    return StructType([StructField(name, typ, True) for name, typ in fields])


TRADE_SCHEMA = _schema(
    ("trade_id", StringType()),
    ("trade_date", DateType()),
    ("seq", LongType()),
    ("kafka_partition", IntegerType()),
    ("kafka_offset", LongType()),
    ("symbol", StringType()),
    ("price", PRICE),
    ("quantity", LongType()),
    ("buyer", StringType()),
    ("seller", StringType()),
    ("executed_at", TimestampType()),
)

# Column order and types of the tables in sql/migrations/0002_settlement.sql.
POSITIONS_SCHEMA = _schema(
    ("trade_date", DateType()),
    ("account", StringType()),
    ("symbol", StringType()),
    ("bought_qty", LongType()),
    ("sold_qty", LongType()),
    ("net_qty", LongType()),
    ("buy_amount", AMOUNT),
    ("sell_amount", AMOUNT),
    ("net_cash", AMOUNT),
    ("trade_count", LongType()),
)
CASH_OBLIGATIONS_SCHEMA = _schema(
    ("trade_date", DateType()),
    ("account", StringType()),
    ("buy_amount", AMOUNT),
    ("sell_amount", AMOUNT),
    ("net_cash", AMOUNT),
    ("trade_count", LongType()),
)
INSTRUMENT_SUMMARY_SCHEMA = _schema(
    ("trade_date", DateType()),
    ("symbol", StringType()),
    ("trades", LongType()),
    ("volume", LongType()),
    ("notional", AMOUNT),
    ("vwap", VWAP),
    ("low_price", PRICE),
    ("high_price", PRICE),
)
# Shaped like the ledger's dead_letters (minus topic/site, which the caller knows).
MALFORMED_SCHEMA = _schema(
    ("kafka_partition", IntegerType()),
    ("kafka_offset", LongType()),
    ("raw", BinaryType()),
    ("reason", StringType()),
)
CLOSE_MARKERS_SCHEMA = _schema(
    ("trade_date", DateType()),
    ("kafka_partition", IntegerType()),
    ("kafka_offset", LongType()),
    ("last_seq", LongType()),
)

# -- validation rules for a trade message --------------------------------------------------
# The consumer sites apply the same rules before writing the ledger; keeping them identical
# is what makes the Kafka and database sources settle to the same positions.
TRADE_DATE_PATTERN = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$"
# ISO-8601 with a 'T'; a missing zone means UTC (the session time zone is pinned to UTC).
EXECUTED_AT_PATTERN = (
    r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,6})?"
    r"(Z|[+-][0-9]{2}:[0-9]{2})?$"
)
# numeric(18,4): at most 14 integer digits and 4 decimals, no sign, no exponent, no commas.
PRICE_PATTERN = r"^[0-9]{1,14}(\.[0-9]{1,4})?$"
_DECIMAL_TEXT = r"^-?[0-9]+(\.[0-9]+)?$"

_STRING_FIELDS = ("trade_id", "trade_date", "symbol", "price", "buyer", "seller", "executed_at")
_INTEGER_FIELDS = ("seq", "quantity")
_NON_EMPTY = ("trade_id", "symbol", "buyer", "seller")

# Every text field is read as a string so that the checks below, not Spark's lenient
# coercions, decide validity. seq/quantity are LongType: Spark's parser accepts only JSON
# integer tokens there (a string "10", 2.5, 1e2 or an overflow yields NULL).
_TRADE_JSON = StructType(
    [StructField(f, StringType()) for f in _STRING_FIELDS]
    + [StructField(f, LongType()) for f in _INTEGER_FIELDS]
)
_CLOSE_JSON = StructType(
    [
        StructField("trade_date", StringType()),
        StructField("partition", IntegerType()),
        StructField("last_seq", LongType()),
    ]
)
# Spark accepts {'a': 'b'} by default; JSON (and the Python consumer) does not.
_JSON_OPTIONS = {"allowSingleQuotes": "false"}


class ParsedBatch(NamedTuple):
    """The three kinds of row in a raw Kafka batch. All are lazy views of the same input:
    persist the input first if more than one of them is evaluated."""

    trades: DataFrame  # TRADE_SCHEMA
    malformed: DataFrame  # MALFORMED_SCHEMA; count() it for the run record
    closes: DataFrame  # CLOSE_MARKERS_SCHEMA


def parse_kafka_values(raw: DataFrame, max_value_bytes: int | None = None) -> ParsedBatch:
    """Split a Kafka batch (``key, value, partition, offset[, headers]``) into valid trades,
    malformed messages with a reason, and market-close markers: ``split_classified`` of
    ``classify_kafka_values``. Persist the classified frame in between when more than one of
    the three is evaluated, so that each message is parsed and checked once."""
    return split_classified(classify_kafka_values(raw, max_value_bytes))


def classify_kafka_values(raw: DataFrame, max_value_bytes: int | None = None) -> DataFrame:
    """One row per message: its partition and offset, ``reason`` (NULL when valid), the
    message type, the typed trade and close-marker fields, and the raw bytes of a malformed
    message only (valid rows carry NULL there, which keeps a cached batch small).

    A message is a close marker when its ``type`` header is ``close``, a trade when the header
    is ``trade`` or absent; any other type is malformed. A trade is malformed (first failing
    rule is the reason) when the value is empty, longer than ``max_value_bytes``, not UTF-8,
    not a JSON object, lacks a field, has a text field that is not a JSON string or an integer
    field that is not a JSON integer, has an invalid ``trade_date``/``executed_at``, a price
    that is not a positive decimal string fitting numeric(18,4), ``quantity <= 0``,
    ``seq <= 0``, an empty id/symbol/account, or ``buyer == seller``.

    Known leniency: Spark's JSON reader stops after the first value, so trailing bytes after
    the closing brace of a well-formed object (``{...}{...}``) are ignored; a value that does
    not end with ``}`` is rejected. Duplicate keys keep the last value, as Python's json does.
    """
    value = F.col("value")
    text = value.cast("string")
    kind = _message_type(raw)
    trade = F.when(kind == "trade", F.from_json(text, _TRADE_JSON, _JSON_OPTIONS))
    close = F.when(kind == "close", F.from_json(text, _CLOSE_JSON, _JSON_OPTIONS))
    staged = raw.select(
        F.col("partition").cast(IntegerType()).alias("kafka_partition"),
        F.col("offset").cast(LongType()).alias("kafka_offset"),
        value.alias("raw"),
        text.alias("_text"),
        kind.alias("_kind"),
        trade.alias("_t"),
        close.alias("_c"),
    )
    classified = staged.withColumn("reason", _first_failure(_checks(max_value_bytes)))
    t, c = F.col("_t"), F.col("_c")
    return classified.select(
        "kafka_partition",
        "kafka_offset",
        "reason",
        "_kind",
        F.when(F.col("reason").isNotNull(), F.col("raw")).alias("raw"),
        t["trade_id"].alias("trade_id"),
        t["trade_date"].try_cast(DateType()).alias("trade_date"),
        t["seq"].alias("seq"),
        t["symbol"].alias("symbol"),
        t["price"].try_cast(PRICE).alias("price"),
        t["quantity"].alias("quantity"),
        t["buyer"].alias("buyer"),
        t["seller"].alias("seller"),
        t["executed_at"].try_cast(TimestampType()).alias("executed_at"),
        c["trade_date"].try_cast(DateType()).alias("_close_date"),
        c["last_seq"].alias("_last_seq"),
    )


def split_classified(classified: DataFrame) -> ParsedBatch:
    """The three views of ``classify_kafka_values``' output."""
    valid = F.col("reason").isNull()
    kind = F.col("_kind")
    trades = classified.where(valid & (kind == "trade")).select(
        [f.name for f in TRADE_SCHEMA])
    closes = classified.where(valid & (kind == "close")).select(
        F.col("_close_date").alias("trade_date"),
        "kafka_partition",
        "kafka_offset",
        F.col("_last_seq").alias("last_seq"),
    )
    malformed = classified.where(~valid).select("kafka_partition", "kafka_offset", "raw", "reason")
    return ParsedBatch(trades, malformed, closes)


def _message_type(raw: DataFrame) -> Column:
    """'trade', 'close', or the unknown header value; no header means a trade."""
    if "headers" not in raw.columns:
        return F.lit("trade")
    # Field extraction and array_position rather than a filter() lambda: higher-order
    # functions have no generated code and would drag the whole parse stage into the
    # interpreter.
    headers = F.col("headers")
    at = F.array_position(headers["key"], "type").cast(IntegerType())
    typ = F.when(at > 0, F.try_element_at(headers["value"], at))
    return F.coalesce(typ.cast("string"), F.lit("trade"))


def _checks(max_value_bytes: int | None) -> list[tuple[Column, Column | str]]:
    """(failure condition, reason) in the order they are reported."""
    raw, text, kind = F.col("raw"), F.col("_text"), F.col("_kind")
    t, c = F.col("_t"), F.col("_c")
    is_trade, is_close = kind == "trade", kind == "close"
    checks: list[tuple[Column, Column | str]] = [
        (raw.isNull() | (F.length(raw) == 0), "empty value"),
    ]
    if max_value_bytes is not None:
        checks.append(
            (
                F.length(raw) > max_value_bytes,
                F.format_string(f"oversized: %d bytes > {max_value_bytes}", F.length(raw)),
            )
        )
    # Trimming, not a regex: an anchored pattern over the whole value costs more than the
    # JSON parse itself.
    stripped = F.btrim(text, F.lit(" \t\r\n"))
    # Spark's reader returns a row of NULLs for text it cannot parse, which would read as
    # "missing field"; a strict second parse settles it, run only for rows lacking a field.
    some_null = (is_trade & _any_null(t, _TRADE_JSON)) | (is_close & _any_null(c, _CLOSE_JSON))
    checks += [
        (~F.is_valid_utf8(text), "invalid UTF-8"),
        (~(is_trade | is_close), F.concat(F.lit("unknown message type "), kind)),
        (
            ~(stripped.startswith("{") & stripped.endswith("}"))
            | (is_trade & t.isNull())
            | (is_close & c.isNull())
            | (some_null & F.try_parse_json(text).isNull()),
            "invalid JSON",
        ),
    ]
    # Close markers: {"trade_date", "partition", "last_seq"} on the partition they close.
    checks += [
        (is_close & c["trade_date"].isNull(), "close marker: missing field trade_date"),
        (is_close & c["partition"].isNull(), "close marker: partition missing or not an int"),
        (is_close & c["last_seq"].isNull(), "close marker: last_seq missing or not an integer"),
        (is_close & _bad_date(c["trade_date"]), "close marker: invalid trade_date"),
        (is_close & (c["last_seq"] < 0), "close marker: last_seq must be >= 0"),
        (
            is_close & (c["partition"] != F.col("kafka_partition")),
            F.format_string(
                "close marker for partition %d arrived on partition %d",
                c["partition"],
                F.col("kafka_partition"),
            ),
        ),
    ]
    for f in _STRING_FIELDS:
        checks.append((is_trade & t[f].isNull(), f"missing field {f}"))
    for f in _INTEGER_FIELDS:
        present = text.rlike(rf'"{f}"\s*:')
        checks.append((is_trade & t[f].isNull() & ~present, f"missing field {f}"))
        checks.append((is_trade & t[f].isNull(), f"field {f} is not an integer"))
    # Spark renders a non-string token read into a string field as text (a number via a Java
    # double), so insist the raw JSON has the value quoted.
    for f in _STRING_FIELDS:
        checks.append((is_trade & ~text.rlike(rf'"{f}"\s*:\s*"'), f"field {f} is not a string"))
    for f in _NON_EMPTY:
        checks.append((is_trade & (F.length(t[f]) == 0), f"empty {f}"))
    price = t["price"]
    checks += [
        (is_trade & _bad_date(t["trade_date"]), "invalid trade_date"),
        (
            is_trade
            & (
                ~t["executed_at"].rlike(EXECUTED_AT_PATTERN)
                | t["executed_at"].try_cast(TimestampType()).isNull()
            ),
            "invalid executed_at",
        ),
        (is_trade & ~price.rlike(_DECIMAL_TEXT), "price is not a decimal string"),
        (is_trade & (price.startswith("-") | ~price.rlike("[1-9]")), "price must be > 0"),
        (is_trade & ~price.rlike(PRICE_PATTERN), "price does not fit numeric(18,4)"),
        (is_trade & (t["quantity"] <= 0), "quantity must be > 0"),
        (is_trade & (t["seq"] <= 0), "seq must be > 0"),
        (is_trade & (t["buyer"] == t["seller"]), "buyer equals seller"),
    ]
    return checks


def _any_null(struct: Column, schema: StructType) -> Column:
    return reduce(lambda a, b: a | b, [struct[f.name].isNull() for f in schema.fields])


def _bad_date(col: Column) -> Column:
    return ~col.rlike(TRADE_DATE_PATTERN) | col.try_cast(DateType()).isNull()


def _first_failure(checks: list[tuple[Column, Column | str]]) -> Column:
    """The reason of the first failing check, NULL when all pass. CASE stops at the first
    true condition, so the order of ``checks`` is the order reasons are reported in."""
    expr: Column | None = None
    for cond, reason in checks:
        r = reason if isinstance(reason, Column) else F.lit(reason)
        expr = F.when(cond, r) if expr is None else expr.when(cond, r)
    assert expr is not None
    return expr


# -- settlement steps ----------------------------------------------------------------------


def conform_trades(df: DataFrame) -> DataFrame:
    """Select and cast TRADE_SCHEMA's columns (e.g. from a JDBC read of the ledger, whose
    ``executed_at`` is timestamptz and which has extra columns)."""
    return df.select([F.col(f.name).cast(f.dataType).alias(f.name) for f in TRADE_SCHEMA])


def dedupe_trades(df: DataFrame) -> DataFrame:
    """One row per ``trade_id``: the earliest copy in the log, lowest (kafka_partition,
    kafka_offset). The remaining columns break ties, so the choice never depends on how rows
    are spread over tasks (two ledgers holding the same offset, for instance)."""
    first = ["kafka_partition", "kafka_offset"]
    order = first + [c for c in df.columns if c not in first and c != "trade_id"]
    w = Window.partitionBy("trade_id").orderBy(*order)
    return df.withColumn("_n", F.row_number().over(w)).where(F.col("_n") == 1).drop("_n")


def positions(trades: DataFrame, trade_date: str | dt.date) -> DataFrame:
    """Net position per (account, symbol) for one business date (POSITIONS_SCHEMA).

    Each trade becomes two legs, the buyer's and the seller's, which are then summed; trades
    of other dates are ignored. ``trade_count`` counts the trades the account took part in on
    either side (buyer == seller is rejected upstream, so one trade is one leg).
    """
    day = _on_date(trades, trade_date)
    amount = _amount(F.col("price"), F.col("quantity"))
    no_qty = F.lit(0).cast(LongType())
    no_amount = F.lit(0).cast(_PRODUCT)

    def leg(account: str, bought: Column, sold: Column, paid: Column, got: Column) -> Column:
        return F.struct(
            F.col(account).alias("account"),
            bought.alias("bought_qty"),
            sold.alias("sold_qty"),
            paid.alias("buy_amount"),
            got.alias("sell_amount"),
        )

    qty = F.col("quantity").cast(LongType())
    legs = day.select(
        "symbol",
        F.inline(
            F.array(
                leg("buyer", qty, no_qty, amount, no_amount),
                leg("seller", no_qty, qty, no_amount, amount),
            )
        ),
    )
    grouped = legs.groupBy("account", "symbol").agg(
        F.sum("bought_qty").alias("bought_qty"),
        F.sum("sold_qty").alias("sold_qty"),
        F.sum("buy_amount").cast(AMOUNT).alias("buy_amount"),
        F.sum("sell_amount").cast(AMOUNT).alias("sell_amount"),
        F.count(F.lit(1)).alias("trade_count"),
    )
    return grouped.select(
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
    day = _on_date(trades, trade_date)
    grouped = day.groupBy("symbol").agg(
        F.count(F.lit(1)).alias("trades"),
        F.sum(F.col("quantity").cast(LongType())).alias("volume"),
        F.sum(_amount(F.col("price"), F.col("quantity"))).cast(AMOUNT).alias("notional"),
        F.min(F.col("price").cast(PRICE)).alias("low_price"),
        F.max(F.col("price").cast(PRICE)).alias("high_price"),
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


@dataclass(frozen=True)
class Netting:
    """Multilateral netting totals for one business date."""

    gross_notional: Decimal  # sum of price * quantity over the trades, each trade once
    net_settlement: Decimal  # sum over accounts of |net cash|: the cash that actually moves
    # 1 - net_settlement / (2 * gross_notional); None for a day without trades.
    efficiency: Decimal | None


def netting(obligations: DataFrame) -> Netting:
    """Netting totals from cash obligations (or positions: they are summed per account
    first, since |net| must be taken per account, not per symbol). One business date.

    Efficiency compares like with like: without netting, every trade settles both legs with
    the CCP (the buyer pays, the seller is paid), so the gross cash is twice the notional;
    with netting only sum |net cash| moves. One trade therefore nets 0 %, a ring of trades
    that cancels out nets 100 %. (1 - sum|net| / notional would call one trade -100 %.)
    """
    per_account = obligations.groupBy("trade_date", "account").agg(
        F.sum("net_cash").alias("net_cash"), F.sum("buy_amount").alias("buy_amount")
    )
    row = per_account.agg(
        F.sum(F.abs("net_cash")).alias("net"), F.sum("buy_amount").alias("gross")
    ).first()
    net = Decimal(0) if row is None or row["net"] is None else row["net"]
    gross = Decimal(0) if row is None or row["gross"] is None else row["gross"]
    return Netting(gross, net, efficiency_from_totals(gross, net))


def netting_efficiency(obligations: DataFrame) -> Decimal | None:
    """``1 - sum|net cash| / (2 * gross notional)`` to 10 places; None when there were no
    trades (no netting happened, and 0 would read as "netting failed")."""
    return netting(obligations).efficiency


def efficiency_from_totals(gross_notional: Decimal, net_settlement: Decimal) -> Decimal | None:
    if gross_notional == 0:
        return None
    with localcontext() as ctx:
        ctx.prec = 60  # amounts have up to 28 digits; keep the quotient exact to 10 places
        ratio = net_settlement / (2 * gross_notional)
        return (Decimal(1) - ratio).quantize(Decimal("1e-10"), rounding=ROUND_HALF_UP)


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
