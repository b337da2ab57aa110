"""Great Expectations validation of a settlement run: no trade lost, none duplicated.

``validate_frames`` is the core (Spark frames in, verdict out); ``validation.day`` hands it
the frames a real run holds (the day it read and settled, the ledgers, the positions) and
records the verdict in ``settlement_runs``.
"""

from __future__ import annotations

import datetime as dt

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from settlement.validation.run import ValidationOutcome, register_views, run_suites

__all__ = ["ValidationOutcome", "validate_frames"]

_MARKERS = T.StructType([T.StructField("kafka_partition", T.IntegerType()),
                         T.StructField("last_seq", T.LongType())])


def validate_frames(
    spark: SparkSession,
    *,
    trade_date: str,
    partitions: int,
    settlement_trades: DataFrame,
    close_markers: dict[int, int],
    positions: DataFrame | None = None,
    ledger: DataFrame | None = None,
    kafka: DataFrame | None = None,
    ledger_a: DataFrame | None = None,
    ledger_b: DataFrame | None = None,
    settled_trades: int | None = None,
    skip: dict[str, str] | None = None,
    only: set[str] | None = None,
) -> ValidationOutcome:
    """Run every applicable suite. ``close_markers``: partition -> last_seq of the day."""
    n = settled_trades if settled_trades is not None else settlement_trades.count()
    run_params = spark.createDataFrame(
        [(dt.date.fromisoformat(trade_date), partitions, n)],
        "trade_date date, partitions int, trades long")
    markers = spark.createDataFrame(sorted(close_markers.items()), _MARKERS)
    views = {"run_params": run_params, "close_markers_day": markers}
    skip = dict(skip or {})
    if kafka is not None:
        views["kafka_day"] = kafka
    else:
        skip.setdefault("reconcile_kafka_ledger", "Kafka was not read for this run")
    if ledger_a is not None and ledger_b is not None:
        views["ledger_a_day"] = ledger_a
    else:
        skip.setdefault("reconcile_site_a_b", "not the separate scheme (one ledger)")
    register_views(spark, views)
    frames = {"settlement_trades": settlement_trades, "ledger_trades": ledger,
              "ledger_b_trades": ledger_b if ledger_a is not None else None,
              "positions": positions}
    return run_suites(frames, skip, only)
