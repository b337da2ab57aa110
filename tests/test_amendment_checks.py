"""The amendment suites see only the amendments they could name (``validation.amendments``).

The reduction must be exact: each of the five queries of ``amendments_day`` and
``reconcile_amendments`` returns the same rows on the kept amendments as on all of them. Held
here against Spark itself, on random days of amendments with every fault the suites look for
(and nulls where the joins use ``=``), and for the plain cases by name.
"""

from __future__ import annotations

import datetime as dt
import random
from collections import Counter
from decimal import Decimal
from typing import Any

import pytest
from pyspark.sql import SparkSession

from settlement.contract import AMENDMENT_COLUMNS, CANCEL, CORRECT
from settlement.spark.schemas import AMENDMENT_SCHEMA
from settlement.spark.session import local_frame
from settlement.spark.settle import AMENDED_SCHEMA
from settlement.validation.amendments import suspects
from settlement.validation.suites import amendments_suite, reconcile_amendments_suite
from tests.spark_fixtures import spark  # noqa: F401

DAY = dt.date(2026, 11, 24)
AT = dt.datetime(2026, 11, 24, 9, 30)


def _amendment(tid: str | None, partition: int | None, offset: int | None, kind: str | None,
               version: int | None, **change: Any) -> tuple[Any, ...]:
    row = {"trade_id": tid, "trade_date": DAY, "seq": offset, "kafka_partition": partition,
           "kafka_offset": offset, "kind": kind, "version": version, "reason": "fat finger",
           "symbol": "SYM1", "price": Decimal("10.5000"), "quantity": 10, "buyer": "ACC1",
           "seller": "ACC2", "executed_at": AT, **change}
    return tuple(row[c] for c in AMENDMENT_COLUMNS)


def _random_day(rng: random.Random) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]],
                                             list[tuple[Any, ...]]]:
    """Amended trades, the settled amendments and another copy of them, most of them sound
    and a few of each fault."""
    trades = [(f"T{n}", n % 3, 10 * n, DAY, Decimal("10.5000"), 10) for n in range(200)]
    day: list[tuple[Any, ...]] = []
    offset = 5_000
    for n in range(200):
        tid, partition = f"T{n}", n % 3
        count = rng.choice((1, 1, 1, 2, 3))
        version = 1
        for k in range(count):
            offset += 1
            fault = rng.random()
            kind = CANCEL if k == count - 1 and rng.random() < 0.4 else CORRECT
            version += 1 if fault > 0.05 else -1  # sometimes a falling version
            row = dict(tid=tid, partition=partition, offset=offset, kind=kind,
                       version=None if kind == CANCEL else version)
            if fault < 0.02:
                row["tid"] = f"X{n}"  # a trade not in the day
            elif fault < 0.03:
                row["partition"] = (partition + 1) % 3  # on another partition
            elif fault < 0.04:
                row["offset"] = 5  # before its trade on the log
            elif fault < 0.045:
                row["offset"] = None
            elif fault < 0.05:
                row["tid"] = None
            extra = {"trade_date": DAY - dt.timedelta(days=1)} if rng.random() < 0.01 else {}
            if rng.random() < 0.01:
                extra["executed_at"] = None
            day.append(_amendment(row["tid"], row["partition"], row["offset"], row["kind"],
                                  row["version"], **extra))
    at = AMENDMENT_COLUMNS.index("executed_at")
    other = []
    for r in day:
        roll = rng.random()
        if roll < 0.02:
            continue  # missing from the other copy
        o = list(r)
        if roll < 0.04:
            o[AMENDMENT_COLUMNS.index("price")] = Decimal("10.4000")
        elif roll < 0.05:
            o[AMENDMENT_COLUMNS.index("buyer")] = None
        if o[at] is not None and rng.random() < 0.5:
            o[at] = o[at].astimezone(dt.UTC)  # as PostgreSQL hands it: the same instant
        other.append(tuple(o))
        if rng.random() < 0.01:
            other.append(tuple(o))  # an identity twice
    other.append(_amendment("T7", 1, 99_999, CORRECT, 42))  # only in the other copy
    return trades, day, other


def _queries() -> list[str]:
    return [e.unexpected_rows_query for suite in (amendments_suite(), reconcile_amendments_suite())
            for e in suite.expectations]


def _answers(spark: SparkSession, trades: list[tuple[Any, ...]],  # noqa: F811
             day: list[tuple[Any, ...]], other: list[tuple[Any, ...]]) -> list[Counter[Any]]:
    local_frame(spark, trades, AMENDED_SCHEMA).createOrReplaceTempView("amended_trades")
    local_frame(spark, day, AMENDMENT_SCHEMA).createOrReplaceTempView("checked_amendments")
    local_frame(spark, other, AMENDMENT_SCHEMA).createOrReplaceTempView("other_amendments")
    return [Counter(tuple(r) for r in spark.sql(
        q.replace("{batch}", "checked_amendments")).collect()) for q in _queries()]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_suites_name_the_same_rows_on_the_kept_amendments(spark: SparkSession,  # noqa: F811
                                                              seed: int) -> None:
    trades, day, other = _random_day(random.Random(seed))
    ours, theirs = suspects(day, trades, other)
    assert theirs is not None
    everything = _answers(spark, trades, day, other)
    kept = _answers(spark, trades, [day[i] for i in ours], [other[i] for i in theirs])
    assert kept == everything
    assert all(everything), "each query names some row on these days"
    assert len(ours) < len(day) / 2 and len(theirs) < len(other) / 2  # and most are left out


def test_sound_amendments_are_left_out_and_faults_kept() -> None:
    trades = [("T1", 0, 10, DAY, Decimal("1.0000"), 5), ("T2", 0, 11, DAY, Decimal("1.0000"), 5),
              ("T3", 1, 12, DAY, Decimal("1.0000"), 5)]
    day = [_amendment("T1", 0, 20, CORRECT, 2), _amendment("T1", 0, 21, CORRECT, 3),  # rising
           _amendment("T2", 0, 22, CANCEL, None), _amendment("T2", 0, 23, CORRECT, 2),  # after
           _amendment("T3", 0, 24, CANCEL, None),  # on another partition than its trade
           _amendment("T9", 0, 25, CANCEL, None)]  # no such trade
    assert suspects(day, trades, None) == ([2, 3, 4, 5], None)
    aware = [(*r[:-1], r[-1].astimezone(dt.UTC)) for r in day]
    assert suspects(day, trades, aware) == ([2, 3, 4, 5], [2, 3, 4, 5])
    moved = [*aware[:1], _amendment("T1", 0, 21, CORRECT, 3, quantity=9), *aware[2:]]
    assert suspects(day, trades, moved) == ([1, 2, 3, 4, 5], [1, 2, 3, 4, 5])
    assert suspects(day, trades, aware[1:]) == ([0, 2, 3, 4, 5], [1, 2, 3, 4])
