"""The Spark Kafka reader's classifier on a small batch: typed trades and close markers,
dead letters with their reasons, the output schemas. Its agreement with the consumer sites'
parser on adversarial input is tests/test_parity.py's business."""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal
from typing import Any

from chispa import assert_df_equality
from pyspark.sql import DataFrame, SparkSession

from settlement.contract import MAX_DEPTH, MAX_QUANTITY, MAX_SEQ
from settlement.spark import schemas as S
from settlement.spark.parse import classify_kafka_values, parse_kafka_values, split_classified
from tests.spark_fixtures import spark  # noqa: F401

DAY = dt.date(2024, 3, 15)
UTC = dt.UTC
RAW_SCHEMA = (
    "key binary, value binary, partition int, offset long, "
    "headers array<struct<key:string,value:binary>>"
)
GOOD = {
    "trade_id": "T-1",
    "trade_date": "2024-03-15",
    "seq": 1,
    "symbol": "XAU",
    "price": "98765432109876.5432",
    "quantity": 3,
    "buyer": "A",
    "seller": "B",
    "executed_at": "2024-03-15T09:30:00.123456Z",
}


def message(value: Any, offset: int, kind: str | None = "trade", partition: int = 0) -> tuple:
    raw = value if isinstance(value, bytes | None) else json.dumps(value).encode()
    headers = [("type", kind.encode())] if kind else None
    return (b"XAU", raw, partition, offset, headers)


def same(actual: DataFrame, expected: DataFrame) -> None:
    assert_df_equality(actual, expected, ignore_row_order=True, ignore_nullable=True)


OVERSIZED = {**GOOD, "pad": "x" * 300}
PRICE_RULE = "price must be a positive decimal string fitting numeric(18,4), no leading zeros"
MALFORMED = {
    1: (b'{"trade_id": "T-2", "seq": ', "invalid JSON: not an object"),
    2: (b"not json", "invalid JSON: not an object"),
    3: (b"{'trade_id': 'T-3'}", "invalid JSON"),
    4: (b'{"trade_id": "\xff\xfe"}', "invalid UTF-8"),
    5: (None, "empty value"),
    6: ({**GOOD, "price": 12.5}, "field price is not a string"),  # a float never gets in
    7: ({**GOOD, "quantity": "3"}, "field quantity is not an integer"),
    8: ({**GOOD, "quantity": 2.5}, "field quantity is not an integer"),
    9: ({k: v for k, v in GOOD.items() if k != "buyer"}, "missing field buyer"),
    10: ({**GOOD, "seller": "A"}, "buyer equals seller"),
    11: ({**GOOD, "quantity": -4}, f"quantity must be in [1, {MAX_QUANTITY}]"),
    12: ({**GOOD, "price": "0.0000"}, PRICE_RULE),
    13: ({**GOOD, "price": "-1.5"}, PRICE_RULE),
    14: ({**GOOD, "price": "1.23456"}, PRICE_RULE),
    15: ({**GOOD, "price": "1,234.5"}, PRICE_RULE),
    16: ({**GOOD, "trade_date": "2024-02-30"}, "invalid trade_date"),
    17: ({**GOOD, "executed_at": 1710495000}, "invalid executed_at"),
    18: ({**GOOD, "trade_id": 17}, "field trade_id is not a string"),
    19: ({**GOOD, "seq": 0}, f"seq must be in [1, {MAX_SEQ}]"),
    20: ({**GOOD, "symbol": ""}, "symbol must have 1 to 32 characters"),
    21: (OVERSIZED, f"oversized: {len(json.dumps(OVERSIZED))} bytes > 400"),
    # Rules Spark used to be more lenient about than the consumer sites.
    22: ({**GOOD, "executed_at": "2024-03-15T09:30:00"}, "invalid executed_at"),  # no zone
    23: ({**GOOD, "price": "007.5"}, PRICE_RULE),  # leading zeros
    24: (json.dumps(GOOD).encode() + b"{}", "invalid JSON: content after the object, or "
         f"nested deeper than {MAX_DEPTH}"),
    25: (json.dumps(GOOD).encode() + b" x}", "invalid JSON: content after the object, or "
         f"nested deeper than {MAX_DEPTH}"),
    26: (json.dumps(GOOD)[:-1].encode() + b', "seq": 2}', "invalid JSON"),  # a repeated key
    27: ({**GOOD, "symbol": "X\tY"}, "text fields must not contain control characters"),
    28: ({**GOOD, "trade_id": "I" * 65}, "trade_id must have 1 to 64 characters"),
    29: ({**GOOD, "seq": 2**63}, "field seq is not an integer"),  # past bigint
    30: ({**GOOD, "seq": True}, "field seq is not an integer"),
    31: ({**GOOD, "quantity": 10.0}, "field quantity is not an integer"),
    32: ({**GOOD, "executed_at": "2024-03-15T23:59:60Z"}, "invalid executed_at"),  # leap second
    33: ({**GOOD, "trade_date": "1999-12-31"}, "invalid trade_date"),  # outside the window
    34: ({**GOOD, "x": float("inf")}, "invalid JSON"),  # json.dumps writes Infinity
    35: (json.dumps({**GOOD, "x": 1}).encode().replace(b"1}", b"1e400}"),
         "invalid JSON: a number overflows a double"),
    36: (json.dumps(GOOD).encode().replace(b'"T-1"', b'"T\\ud800"'), "invalid JSON"),
}


def test_parse_kafka_values(spark: SparkSession) -> None:  # noqa: F811
    rows = [message(GOOD, 0)]
    rows += [message(value, offset) for offset, (value, _) in MALFORMED.items()]
    rows += [
        # No type header: a trade, with a UTC offset that is converted.
        message({**GOOD, "trade_id": "T-9", "executed_at": "2024-03-15T11:30:00+02:00"}, 50, None),
        message({"trade_date": "2024-03-15", "partition": 0, "last_seq": 1}, 51, "close"),
        message({"trade_date": "2024-03-15", "partition": 4, "last_seq": 1}, 52, "close"),
        message(GOOD, 53, "heartbeat"),
        (b"XAU", json.dumps(GOOD).encode(), 0, 54, [("type", None)]),  # a null type header
        message({"trade_date": "2024-03-15", "partition": 0, "last_seq": -1}, 55, "close"),
    ]
    parsed = parse_kafka_values(spark.createDataFrame(rows, RAW_SCHEMA), max_value_bytes=400)

    at = dt.datetime(2024, 3, 15, 9, 30, tzinfo=UTC)
    price = Decimal("98765432109876.5432")
    same(
        parsed.trades,
        spark.createDataFrame(
            [
                ("T-1", DAY, 1, 0, 0, "XAU", price, 3, "A", "B", at.replace(microsecond=123456)),
                ("T-9", DAY, 1, 0, 50, "XAU", price, 3, "A", "B", at),
            ],
            S.TRADE_SCHEMA,
        ),
    )
    same(parsed.closes, spark.createDataFrame([(DAY, 0, 51, 1)], S.CLOSE_MARKERS_SCHEMA))
    reasons = {r["kafka_offset"]: r["reason"] for r in parsed.malformed.collect()}
    expected = {offset: reason for offset, (_, reason) in MALFORMED.items()}
    expected[52] = "close marker for partition 4 arrived on partition 0"
    expected[53] = "unknown message type heartbeat"
    expected[54] = "unknown message type "
    expected[55] = f"close marker: last_seq must be in [0, {MAX_SEQ}]"
    assert reasons == expected
    assert parsed.malformed.schema == S.MALFORMED_SCHEMA
    assert parsed.trades.schema == S.TRADE_SCHEMA
    # Malformed rows keep their bytes, valid ones do not.
    raw = {r["kafka_offset"]: r["raw"] for r in parsed.malformed.collect()}
    assert raw[10] == json.dumps(MALFORMED[10][0]).encode()


def test_without_a_headers_column_every_message_is_a_trade(spark: SparkSession) -> None:  # noqa: F811
    raw = spark.createDataFrame(
        [(b"XAU", json.dumps(GOOD).encode(), 0, 7)],
        "key binary, value binary, partition int, offset long",
    )
    classified = classify_kafka_values(raw).persist()
    parsed = split_classified(classified)
    assert [r["trade_id"] for r in parsed.trades.collect()] == ["T-1"]
    assert parsed.malformed.count() == 0 and parsed.closes.count() == 0
    classified.unpersist()
