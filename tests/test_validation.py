"""Every Great Expectations check fails when it should, and names what is wrong."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

from pyspark.sql import DataFrame, SparkSession

from settlement.spark import transforms as T
from settlement.validation import ValidationOutcome, validate_frames
from tests.spark_fixtures import spark  # noqa: F401

DATE = "2026-11-23"
D = dt.date(2026, 11, 23)
TS = dt.datetime(2026, 11, 23, 14, 30, tzinfo=dt.UTC)


def _trade(i: int, partition: int, seq: int, buyer: str = "A", seller: str = "B",
           qty: int = 10) -> tuple:
    return (f"T{i}", D, seq, partition, 100 + i, "AAPL" if partition == 0 else "MSFT",
            Decimal("10.5000"), qty, buyer, seller, TS)


GOOD = [_trade(1, 0, 1), _trade(2, 0, 2, "B", "C"), _trade(3, 0, 3, "C", "A"),
        _trade(4, 1, 1), _trade(5, 1, 2, "C", "B")]
MARKERS = {0: 3, 1: 2}


def frame(spark: SparkSession, rows: list[tuple]) -> DataFrame:  # noqa: F811
    return spark.createDataFrame(rows, T.TRADE_SCHEMA)


TRADES = "trades_day@settlement_trades"
INVARIANTS = "settlement_invariants@positions"
SITES = "reconcile_site_a_b@ledger_b_trades"
KAFKA = "reconcile_kafka_ledger@ledger_trades"


def run(spark: SparkSession, rows: list[tuple], markers: dict[int, int] | None = None,  # noqa: F811
        only: set[str] | None = None, **kw: object) -> ValidationOutcome:
    """Validate; ``only`` keeps a failure test to the suite it is about (GX on Spark costs
    about half a second per expectation)."""
    trades = frame(spark, rows)
    good_positions = T.positions(frame(spark, GOOD), DATE)
    args = {"positions": kw.pop("positions", good_positions), "ledger": trades,
            "settled_trades": len(GOOD), **kw}
    return validate_frames(spark, trade_date=DATE, partitions=2, settlement_trades=trades,
                           close_markers=markers or MARKERS, only=only,
                           **args)  # type: ignore[arg-type]


def failed(out: ValidationOutcome) -> dict[str, list]:
    return {f"{c.suite}@{c.asset}: {c.name}": c.examples for c in out.failures}


def test_a_good_day_passes(spark: SparkSession) -> None:  # noqa: F811
    out = run(spark, GOOD)
    assert out.success, failed(out)
    assert len(out.checks) >= 20
    assert "reconcile_site_a_b@ledger_b_trades" in out.skipped


def test_a_deleted_trade_is_named_by_partition_and_seq(spark: SparkSession) -> None:  # noqa: F811
    out = run(spark, [t for t in GOOD if t[0] != "T2"], only={TRADES})
    f = failed(out)
    gap = f["trades_day@settlement_trades: no sequence gaps"]
    assert gap == [{"trade_date": str(D), "kafka_partition": 0, "seq": 2}]


def test_a_duplicated_trade_is_named(spark: SparkSession) -> None:  # noqa: F811
    out = run(spark, [*GOOD, GOOD[0]], only={TRADES})
    f = failed(out)
    assert f["trades_day@settlement_trades: trade_id unique"][:1] == ["T1"]
    assert any(r["seq"] == 1 for r in f["trades_day@settlement_trades: no sequence beyond close"])


def test_a_missing_partition_tail_is_named(spark: SparkSession) -> None:  # noqa: F811
    out = run(spark, GOOD, markers={0: 5, 1: 2}, only={TRADES})
    gaps = failed(out)["trades_day@settlement_trades: no sequence gaps"]
    assert [(r["kafka_partition"], r["seq"]) for r in gaps] == [(0, 4), (0, 5)]


def test_a_missing_close_marker_is_named(spark: SparkSession) -> None:  # noqa: F811
    out = run(spark, GOOD, markers={0: 3}, only={TRADES})
    assert failed(out)["trades_day@settlement_trades: every partition closed"] == [
        {"kafka_partition": 1}]


def test_invalid_trades_are_named(spark: SparkSession) -> None:  # noqa: F811
    bad = [*GOOD[:4], _trade(5, 1, 2, "C", "C")]
    out = run(spark, bad, only={TRADES})
    f = failed(out)
    assert f["trades_day@settlement_trades: buyer <> seller"][0]["trade_id"] == "T5"


def test_an_unbalanced_position_is_named(spark: SparkSession) -> None:  # noqa: F811
    pos = T.positions(frame(spark, GOOD), DATE)
    broken = pos.withColumn("net_qty", pos.net_qty + (pos.account == "A").cast("long"))
    out = run(spark, GOOD, positions=broken, only={INVARIANTS})
    f = failed(out)
    assert "settlement_invariants@positions: net quantity sums to 0 per symbol" in f
    assert "settlement_invariants@positions: net columns are consistent" in f


def test_a_site_ledger_missing_rows_is_named(spark: SparkSession) -> None:  # noqa: F811
    a = frame(spark, GOOD)
    b = frame(spark, GOOD[:-1])
    out = run(spark, GOOD, ledger_a=a, ledger_b=b, only={SITES})
    f = failed(out)
    missing = f["reconcile_site_a_b@ledger_b_trades: in ledger_a_day, missing from ledger_b"]
    assert [r["trade_id"] for r in missing] == ["T5"]


def test_kafka_vs_ledger_is_reconciled(spark: SparkSession) -> None:  # noqa: F811
    kafka = frame(spark, GOOD)
    out = run(spark, GOOD[1:], kafka=kafka, only={KAFKA})
    f = failed(out)
    missing = f["reconcile_kafka_ledger@ledger_trades: in kafka_day, missing from ledger"]
    assert [r["trade_id"] for r in missing] == ["T1"]


def test_an_empty_day_with_no_markers_passes_invariants(spark: SparkSession) -> None:  # noqa: F811
    out = run(spark, [], markers={0: 0, 1: 0}, settled_trades=0,
              positions=T.positions(frame(spark, []), DATE), only={TRADES, INVARIANTS})
    assert out.success, failed(out)
