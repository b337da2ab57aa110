"""Classifying a raw Kafka batch: valid trades, close markers, and dead letters with a reason.

The Spark twin of ``consumers.parse``: both apply the rules of ``settlement.contract``, and
``tests/test_parity.py`` feeds both the same adversarial corpus. Any rule changed here alone
makes that test fail.

Everything is a column expression (no Python UDF, no higher-order function), so the whole
classification is one generated-code stage. Spark's JSON reader (``from_json``) reads the
fields; what it does not check, the contract's JSON rules (one object and nothing after it,
no repeated key, no lone surrogate, finite numbers, nesting and length limits, strings where
strings belong), is settled in two ways:

- fast: a value without backslashes or '[', whose only '}' is its last character and whose
  quotes and ``"key":`` pairs are exactly those of the expected fields, cannot break any of
  those rules (the counting argument is in ``_flat_object``); one regex and one count per row;
- slow, for every other value: ``try_parse_json`` (strict, refuses repeated keys and lone
  surrogates), the value reduced to its bracket structure for what follows the object and
  the depth, and the variant's types for the fields.
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

from settlement.contract import (
    CLOSE,
    CLOSE_FIELDS,
    CLOSE_LAST_SEQ,
    CLOSE_PARTITION,
    DATE_PATTERN,
    EXECUTED_AT_PATTERN,
    INT_FIELDS,
    JSON_WHITESPACE,
    MAX_DEPTH,
    MAX_NUMBER_LENGTH,
    MISSING_TYPE_MEANS,
    NONZERO_PATTERN,
    PRICE_PATTERN,
    PRINTABLE_PATTERN,
    STRING_FIELDS,
    TEXT_FIELDS,
    TRADE,
    TRADE_FIELDS,
    TYPE_HEADER,
)
from settlement.spark.schemas import PRICE, TRADE_SCHEMA


def _full(pattern: str) -> str:
    """A contract pattern matched against the whole string. Java's ``$`` would also match
    before a final newline; ``\\z`` is the very end."""
    return rf"^(?:{pattern})\z"


_DATE = _full(DATE_PATTERN)
_EXECUTED_AT = _full(EXECUTED_AT_PATTERN)
_PRICE = _full(f"(?={NONZERO_PATTERN})(?:{PRICE_PATTERN})")
_PRINTABLE = _full(PRINTABLE_PATTERN)
_WS = f"[{JSON_WHITESPACE}]"

# Every string field is read as a string so that the checks below, not Spark's lenient
# coercions, decide validity. Integer fields are LongType: Spark's reader accepts only JSON
# integer tokens there (a string "10", true, 2.5, 1e2 or an overflow yields NULL).
_INT_NAMES = tuple(f.name for f in INT_FIELDS)
assert set(STRING_FIELDS) | set(_INT_NAMES) == set(TRADE_FIELDS)
_TRADE_JSON = StructType(
    [StructField(f, StringType()) for f in STRING_FIELDS]
    + [StructField(f, LongType()) for f in _INT_NAMES]
)
_CLOSE_INTS = (CLOSE_PARTITION, CLOSE_LAST_SEQ)
_CLOSE_STRINGS = tuple(f for f in CLOSE_FIELDS if f not in {i.name for i in _CLOSE_INTS})
_CLOSE_JSON = StructType(
    [StructField(f, StringType()) for f in _CLOSE_STRINGS]
    + [StructField(f.name, LongType()) for f in _CLOSE_INTS]
)
# String fields whose own pattern a non-string token could satisfy: Spark renders a number
# or a boolean read into a string field as its text ("5", "true"). Dates and timestamps
# cannot look like a number, so their pattern already proves they were strings.
_MUST_BE_QUOTED = (*(f.name for f in TEXT_FIELDS), "price")
# Strict JSON: Spark's reader accepts NaN and Infinity and single quotes by default.
_JSON_OPTIONS = {"allowSingleQuotes": "false", "allowNonNumericNumbers": "false"}

# JSON mechanics for the slow path (RFC 8259, not contract rules).
_ESCAPE = r"(?s)\\."  # a backslash escape; once removed, every '"' delimits a string
_STRING = r'"[^"]*"'
_INNERMOST = r"\{[^{}\[\]]*\}|\[[^{}\[\]]*\]"  # an object or array holding no other
_NUMBER = r"-?[0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?"
# Only a number with an exponent or more than 308 digits can overflow a double.
_MAY_OVERFLOW = r"[0-9][eE]|[0-9]{309}"


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

    A message is a close marker when its first ``type`` header is ``close``, a trade when it
    is ``trade`` or there is none; any other value (null and empty included) is malformed.
    A message is malformed (the first failing rule is the reason) when its value is empty,
    longer than ``max_value_bytes``, not UTF-8, not JSON the contract accepts, or when a
    field is missing, of the wrong JSON type, or breaks its contract rule (text length and
    printable characters, date window and calendar, timestamp format, canonical positive
    price, integer range, buyer differing from seller, the close marker's partition).
    """
    value = F.col("value")
    text = value.cast("string")
    kind = _message_type(raw)
    staged = raw.select(
        F.col("partition").cast(IntegerType()).alias("kafka_partition"),
        F.col("offset").cast(LongType()).alias("kafka_offset"),
        value.alias("raw"),
        text.alias("_text"),
        kind.alias("_kind"),
        F.when(kind == TRADE, F.from_json(text, _TRADE_JSON, _JSON_OPTIONS)).alias("_t"),
        F.when(kind == CLOSE, F.from_json(text, _CLOSE_JSON, _JSON_OPTIONS)).alias("_c"),
    )
    t, c = F.col("_t"), F.col("_c")
    staged = staged.withColumns({
        "_fast": _fast_path(),
        # Typed once, for the checks and the output.
        "trade_date": t["trade_date"].try_cast(DateType()),
        "price": t["price"].try_cast(PRICE),
        "executed_at": t["executed_at"].try_cast(TimestampType()),
        "_close_date": c["trade_date"].try_cast(DateType()),
    })
    # Parsed once, and only for values the fast path cannot vouch for.
    slow = ~F.col("_fast") & F.col("_kind").isin(TRADE, CLOSE)
    staged = staged.withColumn("_v", F.when(slow, F.try_parse_json(F.col("_text"))))
    staged = staged.withColumn("_bad_json", F.when(slow, _json_violation()))
    classified = staged.withColumn("reason", _first_failure(_checks(max_value_bytes)))
    return classified.select(
        "kafka_partition",
        "kafka_offset",
        "reason",
        "_kind",
        F.when(F.col("reason").isNotNull(), F.col("raw")).alias("raw"),
        t["trade_id"].alias("trade_id"),
        "trade_date",
        t["seq"].alias("seq"),
        t["symbol"].alias("symbol"),
        "price",
        t["quantity"].alias("quantity"),
        t["buyer"].alias("buyer"),
        t["seller"].alias("seller"),
        "executed_at",
        "_close_date",
        c[CLOSE_LAST_SEQ.name].alias("_last_seq"),
    )


def split_classified(classified: DataFrame) -> ParsedBatch:
    """The three views of ``classify_kafka_values``' output."""
    valid = F.col("reason").isNull()
    kind = F.col("_kind")
    trades = classified.where(valid & (kind == TRADE)).select(
        [f.name for f in TRADE_SCHEMA])
    closes = classified.where(valid & (kind == CLOSE)).select(
        F.col("_close_date").alias("trade_date"),
        "kafka_partition",
        "kafka_offset",
        F.col("_last_seq").alias("last_seq"),
    )
    malformed = classified.where(~valid).select("kafka_partition", "kafka_offset", "raw", "reason")
    return ParsedBatch(trades, malformed, closes)


def _message_type(raw: DataFrame) -> Column:
    """The first type header's value ('' when null); no header means MISSING_TYPE_MEANS."""
    if "headers" not in raw.columns:
        return F.lit(MISSING_TYPE_MEANS)
    # Field extraction and array_position rather than a filter() lambda: higher-order
    # functions have no generated code and would drag the whole parse stage into the
    # interpreter.
    headers = F.col("headers")
    at = F.array_position(headers["key"], TYPE_HEADER).cast(IntegerType())
    typ = F.try_element_at(headers["value"], at).cast("string")
    return F.when(at > 0, F.coalesce(typ, F.lit(""))).otherwise(F.lit(MISSING_TYPE_MEANS))


def _flat_object(quotes: int) -> str:
    """A value with no backslash, no '[', no '}' but its last non-blank character, and
    exactly ``quotes`` quote characters.

    Say such a value parses with all n expected fields non-NULL, k of which are strings and
    the others integers (Spark's reader yields NULL for anything else there), and has n
    top-level keys, repetitions included. Then it has exactly the expected keys; without
    backslashes there is no escape (no lone surrogate) and every quote delimits a string;
    every value is a scalar (no '[', no '}' before the last one), so numbers appear only in
    the integer fields and nothing follows the closing brace; and with
    ``quotes == 2 * (n + k)`` exactly k values are strings, which must be the k string
    fields: a number or a boolean read into a string field (which Spark renders as its text,
    "5") is impossible.
    """
    other = r'[^"\\\[}]*+'
    return rf"^{other}(?:\"{other}){{{quotes}}}\}}{_WS}*\z"


_TRADE_SHAPE = _flat_object(2 * (len(TRADE_FIELDS) + len(STRING_FIELDS)))
_CLOSE_SHAPE = _flat_object(2 * (len(CLOSE_FIELDS) + len(_CLOSE_STRINGS)))


def _fast_path() -> Column:
    """True when the value is certainly JSON the contract accepts with every field present
    and of its JSON type; see ``_flat_object``. False says nothing. Costs one regex and a
    scan of the top-level keys (Spark's JSON reader skips the values; repeated keys count)."""
    text, kind = F.col("_text"), F.col("_kind")
    t, c = F.col("_t"), F.col("_c")
    keys = F.size(F.json_object_keys(text))
    trade = (
        text.rlike(_TRADE_SHAPE)
        & reduce(lambda a, b: a & b, [t[f].isNotNull() for f in TRADE_FIELDS])
        & (keys == len(TRADE_FIELDS))
    )
    close = (
        text.rlike(_CLOSE_SHAPE)
        & reduce(lambda a, b: a & b, [c[f].isNotNull() for f in CLOSE_FIELDS])
        & (keys == len(CLOSE_FIELDS))
    )
    return F.coalesce(
        F.when(kind == TRADE, trade).when(kind == CLOSE, close), F.lit(False))


def _json_violation() -> Column:
    """For values off the fast path: why the value is not JSON the contract accepts, or
    NULL. ``try_parse_json`` is strict RFC 8259 and also refuses repeated keys and lone
    surrogates, but stops reading after the first value, so what follows it, the depth and
    the numbers are judged on the value's structure: escapes dropped, strings reduced to a
    token, innermost objects and arrays reduced MAX_DEPTH times must leave one token."""
    text = F.col("_text")
    plain = F.regexp_replace(F.regexp_replace(text, _ESCAPE, ""), _STRING, "0")
    nested = plain
    for _ in range(MAX_DEPTH):
        nested = F.regexp_replace(nested, _INNERMOST, "0")
    numbers = F.regexp_extract_all(plain, F.lit(_NUMBER), 0).try_cast("array<double>")
    overflow = plain.rlike(_MAY_OVERFLOW) & (
        F.array_contains(numbers, float("inf")) | F.array_contains(numbers, float("-inf")))
    return (
        F.when(F.col("_v").isNull(), F.lit("invalid JSON"))
        .when(F.btrim(nested, F.lit(JSON_WHITESPACE)) != "0", F.lit(
            f"invalid JSON: content after the object, or nested deeper than {MAX_DEPTH}"))
        .when(plain.rlike(f"[-+.eE0-9]{{{MAX_NUMBER_LENGTH + 1}}}"), F.lit(
            f"invalid JSON: a number longer than {MAX_NUMBER_LENGTH} characters"))
        .when(overflow, F.lit("invalid JSON: a number overflows a double"))
    )


def _not_a_string(field: str) -> Column:
    """Off the fast path: the field's JSON value is not a string (the variant knows)."""
    v = F.variant_get(F.col("_v"), f"$.{field}", "variant")
    return ~F.col("_fast") & (F.schema_of_variant(v) != "STRING")


def _checks(max_value_bytes: int | None) -> list[tuple[Column, Column | str]]:
    """(failure condition, reason) in the order they are reported."""
    raw, text, kind = F.col("raw"), F.col("_text"), F.col("_kind")
    t, c = F.col("_t"), F.col("_c")
    fast = F.col("_fast")
    is_trade, is_close = kind == TRADE, kind == CLOSE
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
    stripped = F.btrim(text, F.lit(JSON_WHITESPACE))
    bad_json = F.col("_bad_json")
    checks += [
        (~F.is_valid_utf8(text), "invalid UTF-8"),
        (~(is_trade | is_close), F.concat(F.lit("unknown message type "), kind)),
        (~(stripped.startswith("{") & stripped.endswith("}")), "invalid JSON: not an object"),
        (~fast & bad_json.isNotNull(), bad_json),
    ]
    # Close markers: {"trade_date", "partition", "last_seq"} on the partition they close.
    part, last_seq = c[CLOSE_PARTITION.name], c[CLOSE_LAST_SEQ.name]
    checks += [(is_close & c[f].isNull(), f"close marker: {f} missing or of the wrong type")
               for f in CLOSE_FIELDS]
    checks += [
        (is_close & _bad_date(c["trade_date"], F.col("_close_date")),
         "close marker: invalid trade_date"),
        (
            is_close & ~part.between(CLOSE_PARTITION.minimum, CLOSE_PARTITION.maximum),
            "close marker: partition out of range",
        ),
        (
            is_close & (part != F.col("kafka_partition")),
            F.format_string(
                "close marker for partition %d arrived on partition %d",
                part,
                F.col("kafka_partition"),
            ),
        ),
        (
            is_close & ~last_seq.between(CLOSE_LAST_SEQ.minimum, CLOSE_LAST_SEQ.maximum),
            f"close marker: last_seq must be in [{CLOSE_LAST_SEQ.minimum}, "
            f"{CLOSE_LAST_SEQ.maximum}]",
        ),
    ]
    # Trades. A field that is JSON null reads as NULL too: "missing" covers both.
    for f in TRADE_FIELDS:
        present = text.rlike(f'"{f}"{_WS}*:')
        checks.append((is_trade & t[f].isNull() & ~present, f"missing field {f}"))
    for f in _INT_NAMES:
        checks.append((is_trade & t[f].isNull(), f"field {f} is not an integer"))
    for f in STRING_FIELDS:
        checks.append((is_trade & t[f].isNull(), f"field {f} is not a string"))
    for f in _MUST_BE_QUOTED:
        checks.append((is_trade & _not_a_string(f), f"field {f} is not a string"))
    for field in TEXT_FIELDS:
        v = t[field.name]
        checks.append(
            (
                is_trade & ~F.length(v).between(1, field.max_length),
                f"{field.name} must have 1 to {field.max_length} characters",
            )
        )
    texts = F.concat(*(t[field.name] for field in TEXT_FIELDS))
    price = t["price"]
    checks += [
        (is_trade & ~texts.rlike(_PRINTABLE), "text fields must not contain control characters"),
        (is_trade & (t["buyer"] == t["seller"]), "buyer equals seller"),
        (is_trade & _bad_date(t["trade_date"], F.col("trade_date")), "invalid trade_date"),
        (
            is_trade
            & (~t["executed_at"].rlike(_EXECUTED_AT) | F.col("executed_at").isNull()),
            "invalid executed_at",
        ),
        (
            is_trade & ~price.rlike(_PRICE),
            "price must be a positive decimal string fitting numeric(18,4), no leading zeros",
        ),
    ]
    for f in INT_FIELDS:
        checks.append(
            (
                is_trade & ~t[f.name].between(f.minimum, f.maximum),
                f"{f.name} must be in [{f.minimum}, {f.maximum}]",
            )
        )
    return checks


def _bad_date(text: Column, typed: Column) -> Column:
    return ~text.rlike(_DATE) | typed.isNull()


def _first_failure(checks: list[tuple[Column, Column | str]]) -> Column:
    """The reason of the first failing check, NULL when all pass. CASE stops at the first
    true condition, so the order of ``checks`` is the order reasons are reported in."""
    expr: Column | None = None
    for cond, reason in checks:
        r = reason if isinstance(reason, Column) else F.lit(reason)
        expr = F.when(cond, r) if expr is None else expr.when(cond, r)
    assert expr is not None
    return expr
