"""The Spark Kafka reader's classifier on a small batch: typed trades and close markers,
dead letters with their reasons, the output schemas. Its agreement with the consumer sites'
parser on adversarial input is tests/test_parity.py's business."""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal
from typing import Any

import pytest
from chispa import assert_df_equality
from pyspark.sql import DataFrame, SparkSession

from settlement.contract import MAX_DEPTH, MAX_QUANTITY, MAX_SEQ
from settlement.spark import schemas as S
from settlement.spark.parse import (
    classify_kafka_values,
    first_copies,
    parse_kafka_values,
    split_classified,
)
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
PRICE_RULE = "price must be a positive decimal with at most 14 integer digits, no leading zeros"
# offset -> (value, what its dead-letter reason must say): the consumer sites' reasons, since
# the classifier runs their parser.
MALFORMED = {
    1: (b'{"trade_id": "T-2", "seq": ', "invalid JSON: unexpected end of data"),
    2: (b"not json", "invalid JSON: invalid literal"),
    3: (b"{'trade_id': 'T-3'}", "invalid JSON: unexpected character, expected a string key"),
    4: (b'{"trade_id": "\xff\xfe"}', "invalid UTF-8 at byte 14"),
    5: (None, "empty message (null value)"),
    6: ({**GOOD, "price": 12.5}, "price must be a decimal string, got float"),  # never a float
    7: ({**GOOD, "quantity": "3"}, "quantity must be an integer, got str"),
    8: ({**GOOD, "quantity": 2.5}, "quantity must be an integer, got float"),
    9: ({k: v for k, v in GOOD.items() if k != "buyer"}, "missing field 'buyer'"),
    10: ({**GOOD, "seller": "A"}, "buyer equals seller ('A')"),
    11: ({**GOOD, "quantity": -4}, f"quantity must be in [1, {MAX_QUANTITY}], got -4"),
    12: ({**GOOD, "price": "0.0000"}, PRICE_RULE),
    13: ({**GOOD, "price": "-1.5"}, PRICE_RULE),
    14: ({**GOOD, "price": "1.23456"}, PRICE_RULE),
    15: ({**GOOD, "price": "1,234.5"}, PRICE_RULE),
    16: ({**GOOD, "trade_date": "2024-02-30"}, "unknown trade_date '2024-02-30'"),
    17: ({**GOOD, "executed_at": 1710495000}, "executed_at must be an ISO-8601 string"),
    18: ({**GOOD, "trade_id": 17}, "trade_id must be a string of 1 to 64 characters"),
    19: ({**GOOD, "seq": 0}, f"seq must be in [1, {MAX_SEQ}], got 0"),
    20: ({**GOOD, "symbol": ""}, "symbol must be a string of 1 to 32 characters"),
    21: (OVERSIZED, f"oversized: {len(json.dumps(OVERSIZED))} bytes > limit 400"),
    # Rules Spark's own reader was once more lenient about than the consumer sites.
    22: ({**GOOD, "executed_at": "2024-03-15T09:30:00"},  # no zone
         "executed_at is not ISO-8601 with seconds and a zone"),
    23: ({**GOOD, "price": "007.5"}, PRICE_RULE),  # leading zeros
    24: (json.dumps(GOOD).encode() + b"{}", "invalid JSON: unexpected content after document"),
    25: (json.dumps(GOOD).encode() + b" x}", "invalid JSON: unexpected content after document"),
    26: (json.dumps(GOOD)[:-1].encode() + b', "seq": 2}', "invalid JSON: duplicate key 'seq'"),
    27: ({**GOOD, "symbol": "X\tY"}, "text fields must not contain control characters"),
    28: ({**GOOD, "trade_id": "I" * 65}, "trade_id must be a string of 1 to 64 characters"),
    29: ({**GOOD, "seq": 2**63}, f"seq must be in [1, {MAX_SEQ}], got {2**63}"),  # past bigint
    30: ({**GOOD, "seq": True}, "seq must be an integer, got bool"),
    31: ({**GOOD, "quantity": 10.0}, "quantity must be an integer, got float"),
    32: ({**GOOD, "executed_at": "2024-03-15T23:59:60Z"},  # leap second
         "executed_at is not ISO-8601 with seconds and a zone"),
    33: ({**GOOD, "trade_date": "1999-12-31"}, "unknown trade_date '1999-12-31'"),  # window
    34: ({**GOOD, "x": float("inf")}, "invalid JSON: unexpected character"),  # Infinity
    35: (json.dumps({**GOOD, "x": 1}).encode().replace(b"1}", b"1e400}"),
         "invalid JSON: number is infinity when parsed as double"),
    36: (json.dumps(GOOD).encode().replace(b'"T-1"', b'"T\\ud800"'),
         "invalid JSON: no low surrogate in string"),
    37: (json.dumps({**GOOD, "x": [[[[[[[[[1]]]]]]]]]}).encode(),
         f"invalid JSON: nested deeper than {MAX_DEPTH} levels"),
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
    expected[53] = "unknown message type 'heartbeat'"
    expected[54] = "unknown message type ''"
    expected[55] = f"last_seq must be in [0, {MAX_SEQ}], got -1"
    assert reasons.keys() == expected.keys()
    wrong = {o: (reasons[o], want) for o, want in expected.items() if want not in reasons[o]}
    assert not wrong, wrong
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


def test_later_copies_of_a_trade_in_a_partition_are_marked(spark: SparkSession) -> None:  # noqa: F811
    """A task reads one Kafka partition in offset order: the first copy of each id is kept,
    later identical ones are marked; a later copy with other content (here another date) is
    a conflicting replay, a dead letter naming the kept offset, as the sites make it; a dead
    letter is never a copy."""
    rows = [
        message(GOOD, 0),
        message(GOOD, 1),
        message({**GOOD, "trade_date": "2024-03-16"}, 2),  # same id, another date
        message({**GOOD, "trade_id": "T-2"}, 3),
        message({**GOOD, "seller": "A"}, 4),  # malformed copy of T-1
        message(GOOD, 5),
    ]
    # One task, as one Kafka partition is.
    classified = classify_kafka_values(spark.createDataFrame(rows, RAW_SCHEMA).coalesce(1))
    dups = {r["kafka_offset"]: r["_dup"] for r in classified.collect()}
    assert dups == {0: False, 1: True, 2: False, 3: False, 4: False, 5: True}
    kept = first_copies(classified).collect()
    assert sorted(r["kafka_offset"] for r in kept) == [0, 3]
    reasons = {r["kafka_offset"]: r["reason"] for r in classified.collect() if r["reason"]}
    assert reasons[2] == ("conflicting replay of trade 'T-1': its fields differ from the copy "
                          "kept at partition 0 offset 0"), reasons


def test_a_batch_of_plain_trades_gets_the_verdicts_each_message_would(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The Python worker's side alone (no Spark): a batch of plain trades only is checked whole
    (``fast_trades``); every verdict, typed value and copy mark must be the one the message
    by message path gives, and what it keeps (first copies, their dates) must serve the later
    batches: a replay, a conflicting replay, another date, then a cancel of a trade the whole
    batch path kept, a second cancel, a close marker and a replay across batches."""
    import pyarrow as pa

    import consumers.parse
    from settlement.spark.parse import classify_arrow

    def trade(i: int, **kw: Any) -> dict[str, Any]:
        return {**GOOD, "trade_id": f"T-{i}", "seq": i, **kw}

    plain = [trade(1), trade(2), trade(1), trade(3, price="1.5"), trade(3, price="1.50"),
             trade(1, quantity=4), trade(4, trade_date="2024-03-14"), trade(5, buyer="Z")]
    cancel = {"trade_id": "T-2", "trade_date": "2024-03-15", "seq": 9, "reason": "bust"}
    later = [(cancel, "cancel"), (trade(2), "trade"), (cancel, "cancel"),
             ({"trade_date": "2024-03-15", "partition": 0, "last_seq": 9}, "close"),
             ({**cancel, "trade_id": "T-4", "trade_date": "2024-03-14"}, "cancel")]

    def batch(values: list[tuple[dict[str, Any], str]], first: int) -> pa.RecordBatch:
        return pa.record_batch([
            pa.array([0] * len(values), pa.int32()),
            pa.array(range(first, first + len(values)), pa.int64()),
            pa.array([json.dumps(v, separators=(",", ":")).encode() for v, _ in values]),
            pa.array([k.encode() for _, k in values])], names=["p", "o", "value", "kind"])

    batches = [batch([(v, "trade") for v in plain], 0), batch(later, len(plain))]
    real, taken = consumers.parse.fast_trades, []

    def counted(raws: list[bytes], max_bytes: int) -> Any:
        taken.append(real(raws, max_bytes) is not None)
        return real(raws, max_bytes)

    monkeypatch.setattr(consumers.parse, "fast_trades", counted)
    whole = [b.to_pylist() for b in classify_arrow(iter(batches), 400)]
    assert taken == [True]  # the first batch went whole; the mixed one was not offered
    monkeypatch.setattr(consumers.parse, "fast_trades", lambda raws, max_bytes: None)
    each = [b.to_pylist() for b in classify_arrow(iter(batches), 400)]
    assert whole == each
    rows = [r for b in whole for r in b]
    assert [r["_dup"] for r in rows[:8]] == [False, False, True, False, True, False, False,
                                            False]
    assert [bool(r["reason"]) for r in rows] == [False] * 5 + [True] + [False] * 7
    assert "conflicting replay of trade 'T-1'" in rows[5]["reason"]
    assert rows[6]["trade_date"] == dt.date(2024, 3, 14)
    assert rows[3]["price"] == Decimal("1.5000") and rows[9]["_dup"]  # T-2 again: a replay
    assert [r["_kind"] for r in rows[8:]] == ["cancel", "trade", "cancel", "close", "cancel"]
    assert rows[8]["reason"] is None and rows[10]["_dup"] and rows[12]["reason"] is None


def test_the_workers_batch_fingerprints_are_the_sites() -> None:
    """``worker.fingerprints`` normalises a batch's prices and execution times with Arrow; it
    must give ``consumers.parse.fingerprint`` of each trade, equal copies equal (10.5 is
    10.50, 15:00+01:00 is 14:00Z, .500000 is .5) and different ones different, for a batch
    in UTC (Arrow's path) and one with an offset in it (``utc_instant``'s)."""
    from consumers.parse import fingerprint
    from settlement.spark.worker import fingerprints

    def t(price: str, at: str, **kw: Any) -> tuple[Any, ...]:
        v = {**GOOD, "price": price, "executed_at": at, **kw}
        return tuple(v[f] for f in ("trade_id", "trade_date", "seq", "symbol", "price",
                                    "quantity", "buyer", "seller", "executed_at"))

    utc = [t("10.5", "2024-03-15T14:00:00Z"), t("10.50", "2024-03-15T14:00:00.000Z"),
           t("10", "2024-03-15T14:00:00.5Z"), t("10.0000", "2024-03-15T14:00:00.500000Z"),
           t("100", "2024-03-15T14:00:10Z"), t("0.0001", "2024-03-15T14:00:00.000001Z"),
           t("1.1", "2024-03-15T14:00:00Z", seq=8), t("1.1", "2024-03-15T14:00:00Z", buyer="Q")]
    offsets = [*utc, t("10.5", "2024-03-15T15:00:00+01:00"),
               t("10.5", "2024-03-15T09:00:00.50-05:00")]
    for batch in (utc, offsets):
        assert fingerprints(batch) == [fingerprint(x) for x in batch]
    fps = fingerprints(offsets)
    assert fps[0] == fps[1] == fps[8] and fps[2] == fps[3] and fps[4] != fps[0] != fps[9]
    assert len({fps[0], fps[4], fps[5], fps[6], fps[7]}) == 5


def test_batches_of_new_trades_are_kept_whole_and_every_other_batch_trade_by_trade() -> None:
    """Most batches of a day are plain trades, all new ids of the partition's date: they are
    kept by set operations (``all_first_copies``). Each thing that sends a plain batch trade
    by trade must still get the verdicts the message by message path gives: an id repeated
    inside the batch, an id kept in an earlier batch (a replay, and a conflicting one), a
    trade of another date, a trade of a day closed earlier (late), two partitions in one
    batch; and the trades kept whole must be found by the later batches."""
    import pyarrow as pa

    import consumers.parse
    from settlement.spark.worker import classify_arrow

    def trade(i: int, **kw: Any) -> tuple[dict[str, Any], str]:
        return {**GOOD, "trade_id": f"T-{i}", "seq": i, **kw}, "trade"

    close = ({"trade_date": "2024-03-15", "partition": 0, "last_seq": 99}, "close")
    days = [
        [trade(1), trade(2), trade(3)],  # new ids: whole
        [trade(4), trade(5), trade(4)],  # repeated inside the batch
        [trade(6), trade(1)],  # a replay of a trade kept whole
        [trade(7), trade(2, quantity=9)],  # a conflicting replay of one kept whole
        [trade(8), trade(9, trade_date="2024-03-14")],  # another date
        [trade(10, trade_date="2024-03-14"), trade(11, trade_date="2024-03-14")],
        [trade(12), trade(13)],  # new ids again: whole
        [close],
        [trade(14), trade(15)],  # trades of the closed day: late
        [trade(16, trade_date="2024-03-16"), trade(17, trade_date="2024-03-16")],
    ]
    two = [trade(20), trade(21)]

    def batch(values: list[tuple[dict[str, Any], str]], first: int,
              partitions: list[int] | None = None) -> pa.RecordBatch:
        return pa.record_batch([
            pa.array(partitions or [0] * len(values), pa.int32()),
            pa.array(range(first, first + len(values)), pa.int64()),
            pa.array([json.dumps(v, separators=(",", ":")).encode() for v, _ in values]),
            pa.array([k.encode() for _, k in values])], names=["p", "o", "value", "kind"])

    batches, at = [], 0
    for values in days:
        batches.append(batch(values, at))
        at += len(values)
    batches.append(batch(two, at, [0, 1]))
    whole = [b.to_pylist() for b in classify_arrow(iter(batches), 400)]
    real = consumers.parse.fast_trades
    try:
        consumers.parse.fast_trades = lambda raws, max_bytes: None  # type: ignore[assignment]
        each = [b.to_pylist() for b in classify_arrow(iter(batches), 400)]
    finally:
        consumers.parse.fast_trades = real
    assert whole == each
    rows = [r for b in whole for r in b]
    dups = [r["kafka_offset"] for r in rows if r["_dup"]]
    assert dups == [5, 7], dups
    reasons = {r["kafka_offset"]: r["reason"] for r in rows if r["reason"]}
    # T-14, T-15 and T-20 (partition 0) are of the day closed at offset 16.
    assert sorted(reasons) == [9, 17, 18, 21], reasons
    assert "conflicting replay of trade 'T-2'" in reasons[9]
    assert all(reasons[o].startswith("late: ") for o in (17, 18, 21)), reasons
    assert all(r["_row_hi"] is not None for r in rows if r["trade_id"] and not r["reason"])


def test_the_workers_module_agrees_with_the_classifiers_schema() -> None:
    """settlement.spark.worker repeats what it must not import Spark's SQL types for."""
    from settlement.spark import worker
    from settlement.spark.parse import CLASSIFIED_SCHEMA

    assert tuple(CLASSIFIED_SCHEMA.fieldNames()) == worker.CLASSIFIED_FIELDS
    assert (S.PRICE.precision, S.PRICE.scale) == (worker.PRICE_PRECISION, worker.PRICE_SCALE)


def test_a_worker_imports_no_settings_nor_sparks_sql_functions() -> None:
    """What a Python worker imports to classify (its start is paid by every close; pandas
    comes with pyarrow's first conversion of a list whatever this module does)."""
    import subprocess
    import sys

    code = ("import sys, pyspark.worker; before = set(sys.modules); "
            "import settlement.spark.worker, consumers.parse, consumers.runtime; "
            "new = set(sys.modules) - before; "
            "print(sorted(m for m in new if m.split('.')[0] in "
            "('pydantic_settings', 'great_expectations') "
            "or m in ('pyspark.sql.functions', 'settlement.config')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True).stdout.strip()
    assert out == "[]", out
