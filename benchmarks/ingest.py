"""Ingest throughput of one consumer site, against a naive consumer and the COPY ceiling.

    .venv/bin/python benchmarks/ingest.py [--trades 1000000] [--naive 20000] [--processes 1,2]
                                          [--repeat 3]

Starts the embedded services if they are not running (and stops them again afterwards),
pre-produces the day on a private topic, then measures in the same run:
  site   - `settle site run` logic (parse + COPY to staging + insert + offsets), --repeat times
  processes - the real `settle site run --processes N` for each N, into a fresh ledger each
  naive  - one INSERT and one COMMIT per message, the textbook exactly-once consumer
  copy   - the same rows COPYed straight into an empty trades table and their ids into the
           trade_ids registry (what the ledger stores of them): the database ceiling,
           --repeat times, in turns with the site
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from consumers.parse import decode, trade_copy_line
from consumers.site import Site, SiteOptions, consumer_config
from settlement import services
from settlement.config import Settings, load_settings
from settlement.db import connect, ensure_database, migrate_database
from settlement.drills.namespace import delete_topic, drop_databases
from settlement.kafka.admin import ensure_topic
from settlement.simulator.gateway import DayGenerator, SimulationSpec, simulate

DATE = "2026-11-24"


# The ledgers fresh() made in this process, dropped by cleanup(): a 1M-trade run leaves
# several copies of the day, and runs used to pile them up (98 of them, 14 GB, once).
_MADE: list[str] = []


def fresh(settings: Settings, tag: str) -> Settings:
    name = f"bench_{tag}_{uuid.uuid4().hex[:6]}"
    embedded = settings.pg_dsn is None
    admin = settings.embedded_dsn(name, "admin") if embedded else settings.settlement_dsn
    ensure_database(admin)
    migrate_database(admin)
    if embedded:
        _MADE.append(name)
    # The site under test logs in as itself, as in production (append-only grants).
    dsn = settings.embedded_dsn(name, "site_a") if embedded else admin
    return settings.model_copy(update={"ledger_a_dsn": dsn, "ledger_shared_dsn": dsn})


def cleanup(settings: Settings, topic: str | None = None) -> None:
    """Drop the ledgers fresh() made (and the benchmark's topic): what a run measured is in
    its JSON, not in the services it leaves running."""
    if topic is not None:
        delete_topic(settings, topic)
    if _MADE:  # only on the embedded server (fresh() records no other)
        drop_databases(settings.embedded_dsn("postgres", "admin"), _MADE)
        _MADE.clear()


def steady(settings: Settings) -> dict[str, int | None]:
    """The ledger's steady ingest rate, read from its ``ingest_batches`` rows (``committed_at``
    is each batch transaction's start). The window runs from the first batch (process start and
    group join before it are excluded) to the start of the last full batch, and counts the
    trades of the batches that started inside it. A batch shorter than ``batch_size`` is one
    whose poll waited out its timeout: at the end of the day that is the tail, where the site
    waits for messages that do not exist (0.5 s, a sixth of a 300k run); not ingest work, and
    the COPY ceiling has no such wait. ``to_last_batch`` is the older figure (every trade over
    first to last batch start, tail included), printed for comparison with earlier runs."""
    with connect(settings.ledger_dsn("a")) as conn:
        batches = conn.execute("select committed_at, inserted, messages from ingest_batches"
                               " order by committed_at, id").fetchall()
        rows = conn.execute("select count(*) from trades").fetchone()[0]
    first, last = batches[0][0], batches[-1][0]
    full = [t for t, _, messages in batches if messages >= settings.batch_size]
    end = full[-1] if full and full[-1] > first else last
    window = (end - first).total_seconds()
    inside = sum(inserted for t, inserted, _ in batches if t < end)
    busy = (last - first).total_seconds()
    return {"trades": rows,
            "steady_trades_per_second": round(inside / window) if window else None,
            "to_last_batch_trades_per_second": round(rows / busy) if busy else None}


def bench_site(settings: Settings) -> dict[str, Any]:
    site = Site(settings, SiteOptions(site="a", scheme="separate", until_close=True,
                                      trade_date=DATE, max_seconds=900))
    out = site.run()
    rates = steady(settings)
    return {**rates, "wall_seconds": out["seconds"], "batches": out["batches"],
            "trades_per_second": round(rates["trades"] / out["seconds"])}


def bench_processes(settings: Settings, n: int) -> dict[str, Any]:
    """``settle site run --processes n --until-close`` as an operator runs it: n members of
    the site's consumer group writing one ledger. The steady rate is measured in the ledger
    (``steady``)."""
    env = {**os.environ, "SETTLE_TOPIC": settings.topic,
           "SETTLE_LEDGER_A_DSN": settings.ledger_dsn("a")}
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "settlement.cli", "site", "run", "--site", "a",
                          "--scheme", "separate", "--processes", str(n), "--until-close",
                          "--date", DATE, "--max-seconds", "900", "--json"],
                         env=env, capture_output=True, text=True, timeout=1200,
                         cwd=Path(__file__).resolve().parents[1])  # this checkout's code
    wall = time.perf_counter() - t0
    if res.returncode != 0:
        raise RuntimeError(f"site with {n} processes failed: {res.stderr[-2000:]}")
    rates = steady(settings)
    return {"processes": n, **rates, "wall_seconds": round(wall, 3),
            "trades_per_second": round(rates["trades"] / wall)}


def bench_naive(settings: Settings, limit: int) -> dict[str, Any]:
    from confluent_kafka import Consumer

    # The textbook consumer starts from Kafka's committed offsets (none: "earliest"); the
    # sites assign explicit positions and treat an out-of-range one as data loss ("error").
    c = Consumer({**consumer_config(settings, "naive", "separate"),
                  "group.id": f"naive-{uuid.uuid4().hex}", "auto.offset.reset": "earliest"})
    c.subscribe([settings.topic])
    n = 0
    with connect(settings.ledger_dsn("a")) as conn:
        conn.execute("select ensure_trade_partitions(array[%s::date])", (DATE,))
        conn.commit()
        t0 = time.perf_counter()
        while n < limit:
            m = c.poll(1.0)
            if m is None or m.error():
                continue
            line = trade_copy_line(decode(m.value(), 16384), m.partition(), m.offset(), "n")
            f = line.rstrip("\n").split("\t")
            # The trade id's registry and the trade, as a site stores them (sql/queries/
            # ingest.sql, insert_staged), a message at a time.
            conn.execute(
                "with kept as (insert into trade_ids values (%s, %s, %s, %s)"
                " on conflict do nothing returning 1)"
                " insert into trades (trade_id, trade_date, seq, kafka_partition, kafka_offset,"
                " symbol, price, quantity, buyer, seller, executed_at, site)"
                " select %s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s from kept",
                [f[0], f[1], f[3], f[4], *f])
            conn.execute(
                "insert into consumer_offsets (consumer_group, topic, kafka_partition,"
                " next_offset, site) values ('naive', %s, %s, %s, 'n')"
                " on conflict (consumer_group, topic, kafka_partition)"
                " do update set next_offset = excluded.next_offset",
                (settings.topic, m.partition(), m.offset() + 1))
            conn.commit()
            n += 1
        secs = time.perf_counter() - t0
    c.close()
    return {"trades": n, "seconds": round(secs, 3), "trades_per_second": round(n / secs)}


def copy_lines(trades: int, partitions: int, trade_date: str = DATE,
               seed: int = 1) -> list[str]:
    """A simulated day's trades (each once, as the ledger holds them) as COPY lines, built
    before anything is timed."""
    gen = DayGenerator(SimulationSpec(trade_date, trades, seed=seed), partitions)
    return [trade_copy_line(json.loads(t.value()), t.partition, i, "c")
            for i, t in enumerate(gen.trades())]


def copy_into(conn: psycopg.Connection, lines: list[str], table: str = "trades") -> float:
    """``lines`` COPYed into ``table`` and committed, in one transaction: its seconds. Into
    ``trades``, what a ledger stores of them: the rows, and their ids in the ``trade_ids``
    registry (sql/migrations/0023), a second COPY in the same transaction; the days'
    partitions, made first, and the registry's lines, built first, are not timed."""
    ids: list[str] = []
    if table == "trades":
        days = sorted({line.split("\t", 2)[1] for line in lines})
        conn.execute("select ensure_trade_partitions(%s::date[])", (days,))
        conn.commit()
        for line in lines:  # trade_id, trade_date, seq, kafka_partition, kafka_offset, ...
            f = line.split("\t", 5)
            ids.append(f"{f[0]}\t{f[1]}\t{f[3]}\t{f[4]}\n")
    t0 = time.perf_counter()
    with conn.cursor() as cur:
        with cur.copy(
            f"copy {table} (trade_id, trade_date, seq, kafka_partition, kafka_offset, symbol,"
            " price, quantity, buyer, seller, executed_at, site) from stdin"
        ) as copy:
            for i in range(0, len(lines), 20_000):
                copy.write("".join(lines[i:i + 20_000]))
        if ids:
            with cur.copy("copy trade_ids (trade_id, trade_date, kafka_partition, kafka_offset)"
                          " from stdin") as copy:
                for i in range(0, len(ids), 20_000):
                    copy.write("".join(ids[i:i + 20_000]))
    conn.commit()
    return time.perf_counter() - t0


def bench_copy(settings: Settings, lines: list[str]) -> dict[str, Any]:
    trades = len(lines)
    with connect(settings.ledger_dsn("a")) as conn:
        secs = copy_into(conn, lines)
    return {"trades": trades, "seconds": round(secs, 3), "trades_per_second": round(trades / secs)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trades", type=int, default=1_000_000)
    ap.add_argument("--naive", type=int, default=20_000, help="messages for the naive consumer")
    ap.add_argument("--processes", default="1,2",
                    help="comma-separated process counts for `settle site run --processes`")
    ap.add_argument("--repeat", type=int, default=3,
                    help="runs of the in-process site and of the COPY ceiling (medians count)")
    args = ap.parse_args()
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    base = load_settings()
    started = services.up(base)
    topic = f"bench_{uuid.uuid4().hex[:8]}"
    try:
        s = base.model_copy(update={"topic": topic})
        ensure_topic(s)
        print(f"producing {args.trades} trades to {topic}...", file=sys.stderr)
        sim = simulate(s, SimulationSpec(DATE, args.trades, seed=1, txn_size=5_000))
        # The in-process site and the ceiling take turns, each into a fresh ledger: a machine
        # that drifts (a checkpoint, the broker's GC) touches both alike.
        sites, copies = [], []
        lines = copy_lines(args.trades, sim["partitions"])
        for i in range(args.repeat):
            print(f"site ({i + 1}/{args.repeat})...", file=sys.stderr)
            sites.append(bench_site(fresh(s, "site")))
            print(f"copy ceiling ({i + 1}/{args.repeat})...", file=sys.stderr)
            copies.append(bench_copy(fresh(s, "copy"), lines))
        per_processes = {}
        for n in [int(x) for x in args.processes.split(",") if x.strip()]:
            print(f"site with {n} processes...", file=sys.stderr)
            per_processes[str(n)] = bench_processes(fresh(s, f"p{n}"), n)
        print("naive...", file=sys.stderr)
        naive = bench_naive(fresh(s, "naive"), args.naive)
    finally:
        try:
            cleanup(base, topic)
        finally:
            if started.get("kafka") == "started" or started.get("postgres") == "started":
                services.down(base)
    site_rates = [r["steady_trades_per_second"] or r["trades_per_second"] for r in sites]
    copy_rates = [c["trades_per_second"] for c in copies]
    rate, ceiling = statistics.median_low(site_rates), statistics.median_low(copy_rates)
    # A site with N consumer processes is still one site: its best steady rate counts too.
    best = max([*site_rates, *(p["steady_trades_per_second"] or 0
                                for p in per_processes.values())])
    result = {
        "benchmark": "ingest",
        "trades": args.trades,
        "repeat": args.repeat,
        "machine": {"cores": os.cpu_count()},
        "producer_trades_per_second": sim["trades_per_second"],
        "site": sites[site_rates.index(rate)],  # the median run
        "site_steady_runs": site_rates,
        "site_processes": per_processes,
        "naive": naive,
        "copy_ceiling": {"trades": args.trades, "trades_per_second": round(ceiling),
                         "runs": copy_rates},
        # Medians of the in-process site (one process) and of the ceiling, run in turns.
        "site_vs_naive": round(rate / naive["trades_per_second"], 1),
        "site_vs_copy_ceiling": round(rate / ceiling, 3),
        "best_site_trades_per_second": best,
        "best_site_vs_best_copy_ceiling": round(best / max(copy_rates), 3),
        "targets": {
            # Issue #15, steady state.
            "site_vs_naive>=25": best / naive["trades_per_second"] >= 25,
            "site_vs_copy_ceiling>=0.5": best / max(copy_rates) >= 0.5,
            # Issue #26: one process, the medians.
            "one_process_site_vs_copy_ceiling>=0.45": rate / ceiling >= 0.45,
        },
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
