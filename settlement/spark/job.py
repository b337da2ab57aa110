"""The end-of-day settlement job: read one trade date, net it, return exact results.

Entry point for ``spark-submit settlement/spark/job.py --date D --source kafka|db`` (what
Airflow's SparkSubmitOperator runs) and for ``settle eod`` in-process. Only this module reads
configuration, makes the session and touches external systems; the steps are the pure
functions of ``settlement.spark.transforms``.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import psycopg
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from settlement.config import Settings
from settlement.sources import SourceChoice, ledger_state
from settlement.spark import transforms as T


@dataclass
class SettlementResult:
    trade_date: str
    source: str
    trades: int
    duplicates_removed: int
    malformed: int
    positions: list[tuple[Any, ...]]
    obligations: list[tuple[Any, ...]]
    instruments: list[tuple[Any, ...]]
    gross_notional: Decimal
    net_settlement: Decimal
    netting_efficiency: Decimal | None
    close_markers: dict[int, int] = field(default_factory=dict)  # partition -> last_seq
    timings: dict[str, float] = field(default_factory=dict)
    trades_df: DataFrame | None = None  # the deduplicated day, cached, for validation

    def summary(self) -> dict[str, Any]:
        return {
            "trade_date": self.trade_date, "source": self.source, "trades": self.trades,
            "duplicates_removed": self.duplicates_removed, "malformed": self.malformed,
            "positions": len(self.positions), "accounts": len(self.obligations),
            "instruments": len(self.instruments),
            "gross_notional": str(self.gross_notional),
            "net_settlement": str(self.net_settlement),
            "netting_efficiency": None if self.netting_efficiency is None
            else str(self.netting_efficiency),
            "timings": self.timings,
        }


def jdbc_options(dsn: str) -> tuple[str, dict[str, str]]:
    """A libpq URL as a JDBC URL and connection properties (the driver needs TCP)."""
    info = psycopg.conninfo.conninfo_to_dict(dsn)
    host = str(info.get("host") or "127.0.0.1")
    if host.startswith("/"):
        raise ValueError(f"the JDBC driver needs a TCP host, not the socket {host}")
    url = f"jdbc:postgresql://{host}:{info.get('port') or 5432}/{info['dbname']}"
    props = {"user": str(info.get("user") or ""), "driver": "org.postgresql.Driver"}
    if info.get("password"):
        props["password"] = str(info["password"])
    return url, props


def kafka_options(settings: Settings) -> dict[str, str]:
    opts = {"kafka.bootstrap.servers": settings.bootstrap(),
            "kafka.security.protocol": settings.kafka_security_protocol}
    if settings.kafka_security_protocol.startswith("SASL"):
        module = ("org.apache.kafka.common.security.plain.PlainLoginModule"
                  if settings.kafka_sasl_mechanism == "PLAIN"
                  else "org.apache.kafka.common.security.scram.ScramLoginModule")
        opts["kafka.sasl.mechanism"] = settings.kafka_sasl_mechanism
        opts["kafka.sasl.jaas.config"] = (
            f'{module} required username="{settings.kafka_sasl_username}" '
            f'password="{settings.kafka_sasl_password}";')
    if settings.kafka_ssl_ca_location:
        opts["kafka.ssl.truststore.type"] = "PEM"
        opts["kafka.ssl.truststore.location"] = settings.kafka_ssl_ca_location
    return opts


@dataclass
class DayRead:
    trades: DataFrame  # TRADE_SCHEMA, not yet deduplicated
    malformed: int
    close_markers: dict[int, int]  # partition -> last_seq
    cached: DataFrame  # what to unpersist once the deduplicated day is cached
    # trade_id is already unique (one ledger: a unique constraint), so no dedupe pass.
    unique_ids: bool = False


def read_kafka(spark: SparkSession, settings: Settings, choice: SourceChoice, trade_date: str
               ) -> DayRead:
    """The day's bounded offset range, read_committed."""
    topic = settings.topic
    starts = {topic: {str(p): s for p, (s, _) in choice.kafka_ranges.items()}}
    ends = {topic: {str(p): e for p, (_, e) in choice.kafka_ranges.items()}}
    raw = (
        spark.read.format("kafka")
        .options(**kafka_options(settings))
        .option("assign", json.dumps({topic: sorted(choice.kafka_ranges)}))
        .option("startingOffsets", json.dumps(starts))
        .option("endingOffsets", json.dumps(ends))
        .option("kafka.isolation.level", "read_committed")
        .option("includeHeaders", "true")
        # Offsets of aborted records and transaction markers are never returned under
        # read_committed; Spark would call those gaps data loss. Real loss cannot hide: the
        # exchange sequence numbers are checked against the close markers afterwards.
        .option("failOnDataLoss", "false")
        .load()
    )
    # Split three ways below: read the broker, parse and check each message once.
    classified = T.classify_kafka_values(raw, settings.max_message_bytes).persist()
    parsed = T.split_classified(classified)
    malformed = parsed.malformed.count()
    closes = {int(r["kafka_partition"]): int(r["last_seq"])
              for r in parsed.closes.where(F.col("trade_date") == F.lit(trade_date).cast("date"))
              .collect()}
    return DayRead(parsed.trades, malformed, closes, classified)


def read_db(spark: SparkSession, settings: Settings, ledgers: tuple[str, ...], trade_date: str
            ) -> DayRead:
    """The ledger(s), read over JDBC in parallel slices of the exchange sequence number."""
    frames = []
    closes: dict[int, int] = {}
    cols = ", ".join(f.name for f in T.TRADE_SCHEMA)
    for ledger in ledgers:
        dsn = settings.ledger_dsn(ledger)
        url, props = jdbc_options(dsn)
        st = ledger_state(settings, ledger, trade_date)
        max_seq = max((s[2] for s in st.stats.values()), default=1) if st else 1
        for p, (last, _) in (st.markers if st else {}).items():
            closes[p] = max(closes.get(p, 0), last)
        query = f"(select {cols} from trades where trade_date = date '{trade_date}') day"
        df = spark.read.jdbc(
            url, query, column="seq", lowerBound=1, upperBound=max(max_seq, 2),
            numPartitions=4, properties={**props, "fetchsize": "20000"},
        )
        frames.append(T.conform_trades(df))
    out = frames[0]
    for other in frames[1:]:
        out = out.unionByName(other)
    if len(frames) > 1:  # only a union can hold a trade twice; dedupe() then reads it twice
        out = out.persist()
    return DayRead(out, 0, closes, out, unique_ids=len(frames) == 1)


def settle(spark: SparkSession, settings: Settings, trade_date: str, choice: SourceChoice
           ) -> SettlementResult:
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    read = (read_kafka(spark, settings, choice, trade_date) if choice.source == "kafka"
            else read_db(spark, settings, choice.ledgers, trade_date))
    day_raw = read.trades.where(F.col("trade_date") == F.lit(trade_date).cast("date"))
    if read.unique_ids:
        trades = day_raw.persist()
        n_raw = n = trades.count()
    else:
        trades = T.dedupe_trades(day_raw).persist()
        n_raw = day_raw.count()
        n = trades.count()
    timings["read_seconds"] = round(time.perf_counter() - t0, 3)

    t1 = time.perf_counter()
    pos = T.positions(trades, trade_date).persist()
    obligations = T.cash_obligations(pos)
    instruments = T.instrument_summary(trades, trade_date)
    pos_rows = [tuple(r) for r in pos.orderBy("account", "symbol").collect()]
    obl_rows = [tuple(r) for r in obligations.orderBy("account").collect()]
    ins_rows = [tuple(r) for r in instruments.orderBy("symbol").collect()]
    # (trade_date, account, buy_amount, sell_amount, net_cash, trade_count): every trade is
    # bought once, so the buy amounts add up to the gross notional.
    gross = sum((r[2] for r in obl_rows), Decimal(0))
    net = sum((abs(r[4]) for r in obl_rows), Decimal(0))
    pos.unpersist()
    read.cached.unpersist()
    timings["netting_seconds"] = round(time.perf_counter() - t1, 3)
    return SettlementResult(
        trade_date=trade_date, source=choice.source, trades=n, duplicates_removed=n_raw - n,
        malformed=read.malformed, positions=pos_rows, obligations=obl_rows, instruments=ins_rows,
        gross_notional=gross, net_settlement=net,
        netting_efficiency=T.efficiency_from_totals(gross, net), close_markers=read.close_markers,
        timings=timings,
        trades_df=trades,
    )


def main(argv: list[str] | None = None) -> int:
    """spark-submit entry point: settle, write, print the summary as one JSON line."""
    import argparse

    from settlement.config import check_date, load_settings
    from settlement.eod import run_eod

    ap = argparse.ArgumentParser(prog="settlement-job", description=__doc__.splitlines()[0])
    ap.add_argument("--date", required=True, type=check_date)
    ap.add_argument("--source", choices=["auto", "kafka", "db"], default="auto")
    ap.add_argument("--no-validate", action="store_true")
    ap.add_argument("--reason", default=None,
                    help="why the caller chose --source (recorded instead of 'requested')")
    args = ap.parse_args(argv)
    out = run_eod(load_settings(), args.date, source=args.source, validate=not args.no_validate,
                  reason=args.reason)
    print(json.dumps(out, default=str), flush=True)
    return 0 if out.get("status") == "succeeded" else 1


if __name__ == "__main__":
    import sys

    sys.exit(main())
