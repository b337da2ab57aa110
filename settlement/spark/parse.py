"""Classifying a raw Kafka batch: valid trades, close markers, and dead letters with a reason.

The Spark twin of ``consumers.parse``: both apply the rules of ``settlement.contract``, and
``tests/test_parity.py`` feeds both the same adversarial corpus. Any rule changed here alone
makes that test fail.
"""

from __future__ import annotations

from functools import reduce
from typing import NamedTuple

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import (
    DateType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from settlement.spark.schemas import PRICE, TRADE_SCHEMA

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


