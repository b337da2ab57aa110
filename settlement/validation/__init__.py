"""Great Expectations validation of a settlement run: no trade lost, none duplicated.

``validate_frames`` is the core (Spark frames in, verdict out); ``validation.day`` hands it
the frames a real run holds (the read as it came in, the day it settled, the ledgers, the
positions) and records the verdict in ``settlement_runs``. Which check runs on which frame,
and why: ``validation.suites``.
"""

from __future__ import annotations

import datetime as dt

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from settlement.validation.run import ValidationOutcome, register_views, run_suites

__all__ = ["ValidationOutcome", "validate_frames"]

# What the sites recorded about retention gaps (``settlement.eod.model.DataLoss``).
DATA_LOSS_SCHEMA = ("ledger string, kafka_partition int, from_offset long, to_offset long, "
                    "site string, detected_at string")
_MARKERS = T.StructType([T.StructField("kafka_partition", T.IntegerType()),
                         T.StructField("last_seq", T.LongType())])


def validate_frames(
    spark: SparkSession,
    *,
    trade_date: str,
    partitions: int,
    as_read: DataFrame,
    settlement_trades: DataFrame,
    close_markers: dict[int, int],
    positions: DataFrame | None = None,
    ledger: DataFrame | None = None,
    kafka: DataFrame | None = None,
    ledger_a: DataFrame | None = None,
    ledger_b: DataFrame | None = None,
    data_loss: DataFrame | None = None,
    unique_ids: bool = False,
    skip: dict[str, str] | None = None,
    only: set[str] | None = None,
) -> ValidationOutcome:
    """Run every suite that can fail on this run's frames.

    ``as_read``: every trade the read returned, of any date, before dedupe;
    ``settlement_trades``: the day the settlement netted (dated, deduplicated);
    ``close_markers``: partition -> last_seq of the day; ``kafka``: the settled day when
    Kafka was the source (None: the day was read from the ledger(s), by date);
    ``data_loss``: the retention gaps the reachable ledgers recorded for the day
    (``DATA_LOSS_SCHEMA``; a run always passes it, empty when there are none);
    ``unique_ids``: the read is one ledger, whose primary key is trade_id.
    """
    run_params = spark.createDataFrame(
        [(dt.date.fromisoformat(trade_date), partitions)], "trade_date date, partitions int")
    markers = spark.createDataFrame(sorted(close_markers.items()), _MARKERS)
    views = {"run_params": run_params, "close_markers_day": markers,
             "read_trades": as_read, "settled_day": settlement_trades}
    skip = dict(skip or {})
    if kafka is not None:
        views["kafka_day"] = kafka
    else:
        skip.setdefault("reconcile_kafka_ledger", "Kafka was not read for this run")
        # A check that cannot fail is not run: it would only look like a guarantee.
        skip.setdefault("read_dates", "the day was read from the ledger by date: no trade of "
                                      "another date can be in the read")
    if unique_ids:
        skip.setdefault("read_copies", "one ledger was read: trade_id is its primary key, so "
                                       "no trade id can repeat in the read")
    if ledger_a is not None and ledger_b is not None:
        views["ledger_a_day"] = ledger_a
    else:
        skip.setdefault("reconcile_site_a_b", "not the separate scheme (one ledger)")
    register_views(spark, views)
    frames = {"as_read": as_read, "settlement_trades": settlement_trades,
              "ledger_trades": ledger,
              "ledger_b_trades": ledger_b if ledger_a is not None else None,
              "data_loss": data_loss, "positions": positions}
    return run_suites(frames, skip, only)
