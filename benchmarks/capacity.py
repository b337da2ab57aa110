"""Capacity model: what it takes to ingest and settle N trades a day in a 30-minute EOD window.

    .venv/bin/python benchmarks/capacity.py [--days 10000000,100000000,500000000] [--json-only]

An extrapolation from per-unit figures measured by benchmarks/ingest.py and
benchmarks/settlement.py (docs/benchmarks.md; override any with a flag). Prints a Markdown
table, then one JSON object as the last line. Every figure below is either measured (its
flag's help says where) or a stated assumption (flag help says "assumed"); the model is
deliberately simple, linear in each resource, with a utilisation ceiling so nothing is
planned at 100%.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import asdict, dataclass
from typing import Any

TRADING_SECONDS = 6.5 * 3600  # one exchange session (09:30-16:00)


@dataclass(frozen=True)
class Figures:
    ingest_per_process: float  # trades/s one consumer process commits (steady state)
    settle_kafka_per_core: float  # trades/s per Spark core, Kafka source (parse + validate)
    settle_db_per_core: float  # trades/s per Spark core, ledger (JDBC) source
    copy_rows_per_server: float  # raw COPY rows/s into one PostgreSQL server
    ledger_cost_vs_copy: float  # a ledger row costs this many raw COPY rows (assumed)
    partition_rate: float  # trades/s one Kafka partition carries comfortably (assumed)
    peak_factor: float  # peak second / average second of the session (assumed)
    utilisation: float  # plan every resource at most this busy
    eod_window_s: float
    eod_read_passes: float  # the day is read this many times in the EOD (settle+validate)
    message_bytes: float  # one trade on the topic
    replication: int
    retention_days: int


@dataclass(frozen=True)
class Plan:
    trades_per_day: int
    avg_ingest_per_s: int
    peak_ingest_per_s: int
    partitions: int
    consumer_processes_per_site: int
    ledger_write_rows_per_s: int  # per site ledger, at the peak
    ledger_servers_per_site: int
    eod_required_per_s: int
    spark_cores_kafka: int
    spark_cores_db: int
    ledger_rows_per_day: int
    kafka_storage_gb: float
    first_bottleneck: str
    design_changes: list[str]


def _ceil(x: float) -> int:
    return max(1, math.ceil(x - 1e-9))


def _partitions(n: int) -> int:
    """Today's 6 if enough, else a multiple of 12: growing a topic re-maps keys, so it is done
    rarely and with room to spare."""
    return 6 if n <= 6 else 12 * math.ceil(n / 12)


def plan(trades: int, f: Figures) -> Plan:
    avg = trades / TRADING_SECONDS
    peak = avg * f.peak_factor
    processes = _ceil(peak / (f.ingest_per_process * f.utilisation))
    ledger_capacity = f.copy_rows_per_server / f.ledger_cost_vs_copy
    ledger_servers = _ceil(peak / (ledger_capacity * f.utilisation))
    need = trades * f.eod_read_passes / f.eod_window_s
    cores_kafka = _ceil(need / (f.settle_kafka_per_core * f.utilisation))
    cores_db = _ceil(need / (f.settle_db_per_core * f.utilisation))
    # Every process needs partitions of its own, with room to add processes without
    # re-partitioning (x2); no partition above its comfortable rate; and Spark's Kafka source
    # reads one task per partition, so at least one partition per Spark core.
    partitions = _partitions(max(2 * processes, _ceil(peak / f.partition_rate), cores_kafka))
    # One unit of each resource -- today's layout -- and how busy the peak second (or the
    # EOD window) makes it. Spark is judged on the Kafka source, the one the EOD prefers.
    single = {
        "one consumer process per site": peak / f.ingest_per_process,
        "one PostgreSQL ledger server per site": peak / ledger_capacity,
        "Spark local[2], Kafka source, in the EOD window":
            need / (2 * f.settle_kafka_per_core),
    }
    ranked = sorted(single.items(), key=lambda kv: kv[1], reverse=True)
    bottleneck = (f"{ranked[0][0]} ({ranked[0][1]:.0%} busy); next: {ranked[1][0]} "
                  f"({ranked[1][1]:.0%})")
    storage = trades * f.message_bytes * f.replication * f.retention_days / 1e9
    return Plan(
        trades_per_day=trades, avg_ingest_per_s=round(avg), peak_ingest_per_s=round(peak),
        partitions=partitions, consumer_processes_per_site=processes,
        ledger_write_rows_per_s=round(peak), ledger_servers_per_site=ledger_servers,
        eod_required_per_s=round(need), spark_cores_kafka=cores_kafka, spark_cores_db=cores_db,
        ledger_rows_per_day=trades, kafka_storage_gb=round(storage, 1),
        first_bottleneck=bottleneck, design_changes=changes(trades, partitions, processes,
                                                            ledger_servers, cores_kafka))


def changes(trades: int, partitions: int, processes: int, ledger_servers: int,
            cores_kafka: int) -> list[str]:
    out: list[str] = []
    if partitions > 6:
        out.append(f"topic at {partitions} partitions (today 6): more consumer processes and "
                   "more Spark read tasks; one close marker per partition")
    if processes > 1:
        out.append(f"`settle site run --processes {processes}` per site (more hosts per site "
                   "past the cores of one)")
    if trades >= 50_000_000:
        out.append("ledger `trades` partitioned by trade_date (detach/drop whole days, indexes "
                   "sized to a day, the EOD's JDBC slices prune to one partition)")
    if ledger_servers > 1:
        out.append(f"{ledger_servers} ledger servers per site: ledger sharded by Kafka "
                   "partition group (offsets and trades of a partition stay in one "
                   "transaction on one server)")
    if cores_kafka > 2:
        out.append(f"Spark standalone/k8s cluster: {cores_kafka} cores to settle from Kafka "
                   "in the window (the database source needs far fewer)")
    if trades >= 100_000_000:
        out.append("EOD validation over aggregates per partition instead of per-trade "
                   "frames in the driver; audit report examples sampled")
    return out or ["none: the single-machine layout (6 partitions, one process per site, "
                   "local[2]) fits"]


def markdown(plans: list[Plan], f: Figures) -> str:
    cols = ["trades/day", "peak ingest/s", "partitions", "consumer processes per site",
            "ledger writes/s (peak, per site)", "ledger servers per site",
            "Spark cores (Kafka source)", "Spark cores (DB source)", "Kafka storage GB",
            "first bottleneck"]
    rows = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for p in plans:
        rows.append("| " + " | ".join([
            f"{p.trades_per_day:,}", f"{p.peak_ingest_per_s:,}", str(p.partitions),
            str(p.consumer_processes_per_site), f"{p.ledger_write_rows_per_s:,}",
            str(p.ledger_servers_per_site), str(p.spark_cores_kafka), str(p.spark_cores_db),
            f"{p.kafka_storage_gb:,}", p.first_bottleneck]) + " |")
    notes = [f"- **{p.trades_per_day:,}/day**: " + "; ".join(p.design_changes) for p in plans]
    return "\n".join(rows + ["", "Design changes at each scale:", "", *notes])


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--days", default="10000000,100000000,500000000",
                    help="trades per day to plan for, comma-separated")
    ap.add_argument("--ingest-per-process", type=float, default=99_559,
                    help="measured: benchmarks/ingest.py, one site process, steady state")
    ap.add_argument("--settle-kafka-per-core", type=float, default=60_085 / 2,
                    help="measured: benchmarks/settlement.py, 10M from Kafka, 2 cores, 6g")
    ap.add_argument("--settle-db-per-core", type=float, default=171_615 / 2,
                    help="measured: benchmarks/settlement.py, 10M from the ledger, 2 cores, 6g")
    ap.add_argument("--copy-rows", type=float, default=291_564,
                    help="measured: benchmarks/ingest.py raw COPY ceiling of one server")
    ap.add_argument("--ledger-cost", type=float, default=2.0,
                    help="assumed: a ledger row is a staging COPY plus an insert on conflict, "
                         "about two raw COPY rows")
    ap.add_argument("--partition-rate", type=float, default=20_000,
                    help="assumed: trades/s per partition (about 6 MB/s of 300-byte "
                         "messages, well under a broker disk's rate)")
    ap.add_argument("--peak-factor", type=float, default=5.0,
                    help="assumed: the busiest second of the session vs the average (open "
                         "and close auctions)")
    ap.add_argument("--utilisation", type=float, default=0.7,
                    help="plan every resource at most this busy")
    ap.add_argument("--eod-minutes", type=float, default=30)
    ap.add_argument("--eod-read-passes", type=float, default=2.0,
                    help="assumed: settlement reads the day once, validation about once more")
    ap.add_argument("--message-bytes", type=float, default=300,
                    help="a trade's JSON on the topic (the simulator's are 250-300 bytes)")
    ap.add_argument("--replication", type=int, default=3)
    ap.add_argument("--retention-days", type=int, default=7)
    ap.add_argument("--json-only", action="store_true")
    args = ap.parse_args(argv)
    f = Figures(args.ingest_per_process, args.settle_kafka_per_core, args.settle_db_per_core,
                args.copy_rows, args.ledger_cost, args.partition_rate, args.peak_factor,
                args.utilisation, args.eod_minutes * 60, args.eod_read_passes,
                args.message_bytes, args.replication, args.retention_days)
    plans = [plan(int(d), f) for d in args.days.split(",") if d.strip()]
    out = {"benchmark": "capacity", "figures": asdict(f),
           "trading_seconds": TRADING_SECONDS, "plans": [asdict(p) for p in plans]}
    if not args.json_only:
        print(markdown(plans, f))
        print()
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
