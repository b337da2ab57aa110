"""What a year of history costs the day (issue 60, item 4): day 251's ingest, its closes and
`settle status`, on databases holding 250 earlier days, against the same on empty ones, in
one run.

    .venv/bin/python benchmarks/history.py [--days 250] [--day-trades 200000]
        [--trades 2000000] [--mix realistic] [--copy 500000]

Two namespaces on the embedded services (their own ledgers and settlement database), one
topic holding the day (published once, --mix as benchmarks/settlement.py):
  empty   - nothing before the day;
  history - --days weekdays before it, --day-trades trades each, in site A's ledger (with
            their close markers), and each day published in the settlement database (a run,
            its positions, cash obligations, instrument summary and instructions, each
            answered settled, in the close's tables):
            loaded by SQL inside PostgreSQL (generate_series, as a bulk COPY would, not
            through Kafka), then VACUUM ANALYZE, as autovacuum leaves a live database.
Then in each, the history one first:
  ingest  - site A takes the day from Kafka into the ledger (in process, as
            benchmarks/ingest.py: its steady rate read from ingest_batches);
  close   - `settle eod --source kafka` and `--source db` as processes, cold
            (benchmarks/settlement.py's cold_close), and the GROUP BY of the same rows;
  status  - `settle status` as a process, twice (the second counts: the first pays the
            interpreter's file cache);
  copy    - --copy trades of the next date COPYed into the same ledger: the database
            ceiling with that history under it (the ingest's ratio is to this).
Prints one JSON object with each figure, the history/empty ratios and issue 60's targets.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.ingest import copy_into, copy_lines, steady
from benchmarks.settlement import MIXES, SQL_NETTING, cold_close, namespace
from consumers.site import Site, SiteOptions
from settlement import services
from settlement.config import Settings, load_settings
from settlement.db import connect
from settlement.drills.namespace import drop_namespace
from settlement.simulator.gateway import SimulationSpec, simulate

DATE = "2026-11-24"
PARTITIONS = 6
ACCOUNTS, SYMBOLS = 300, 50

# One day of history in the ledger, built inside PostgreSQL: trade ids as the exchange's
# (T<yyyymmdd>-<n>), each partition's sequence numbers from 1, a close marker per partition,
# Kafka offsets before the topic's first (load_history).
LEDGER_DAY = """
insert into trades (trade_id, trade_date, seq, kafka_partition, kafka_offset, symbol, price,
                    quantity, buyer, seller, executed_at, site)
select 'T' || to_char(%(d)s::date, 'YYYYMMDD') || '-' || lpad((n + 1)::text, 9, '0'),
       %(d)s::date, n / {parts} + 1, n %% {parts}, %(offset)s + n / {parts},
       'SYM' || lpad((n %% {syms})::text, 3, '0'), 10 + (n %% 997) / 100.0, 1 + n %% 100,
       'ACC' || lpad((1 + n %% {accts})::text, 4, '0'),
       'ACC' || lpad((1 + (n + 1 + n / {accts} %% ({accts} - 1)) %% {accts})::text, 4, '0'),
       %(d)s::date + time '14:30' + n * interval '10 ms', 'a'
from generate_series(0, %(n)s - 1) n
"""
# The day's trade ids into the registry ingest keeps them in (sql/migrations/0023), so the
# measured day's inserts check a year of ids as they would in production.
TRADE_IDS = """
insert into trade_ids (trade_id, trade_date, kafka_partition, kafka_offset)
select trade_id, trade_date, kafka_partition, kafka_offset from trades where trade_date = %(d)s
"""
MARKERS = """
insert into close_markers (trade_date, kafka_partition, last_seq, kafka_offset, site)
select %(d)s::date, p, %(n)s / {parts} + 1, %(offset)s + %(n)s / {parts} + 1, 'a'
from generate_series(0, {parts} - 1) p
"""
LEDGER_DAY, MARKERS = (x.format(parts=PARTITIONS, syms=SYMBOLS, accts=ACCOUNTS)
                       for x in (LEDGER_DAY, MARKERS))

# One published day in the settlement database: its run and the close's tables' rows.
SETTLEMENT_DAY = f"""
with run as (
    insert into settlement_runs (trade_date, source, source_reason, status, trades, positions,
                                 accounts, started_at, finished_at, published_at,
                                 validation_success, settlement_date, version)
    values (%(d)s, 'db', 'history loaded by benchmarks/history.py', 'succeeded', %(n)s,
            {ACCOUNTS} * {SYMBOLS}, {ACCOUNTS}, now(), now(), now(), true, %(d)s::date + 1, 1)
    returning run_id),
legs as (
    select a, s, (a * 7 + s) %% 200 - 100 as q
    from generate_series(1, {ACCOUNTS}) a, generate_series(0, {SYMBOLS} - 1) s),
rp as (
    insert into run_positions
    select run.run_id, %(d)s::date, 'ACC' || lpad(a::text, 4, '0'),
           'SYM' || lpad(s::text, 3, '0'), greatest(q, 0), greatest(-q, 0), q,
           greatest(q, 0) * 10.5, greatest(-q, 0) * 10.5, -q * 10.5, 10
    from legs, run returning 1),
p as (
    insert into positions
    select %(d)s::date, 'ACC' || lpad(a::text, 4, '0'), 'SYM' || lpad(s::text, 3, '0'),
           greatest(q, 0), greatest(-q, 0), q, greatest(q, 0) * 10.5,
           greatest(-q, 0) * 10.5, -q * 10.5, 10
    from legs returning 1),
c as (
    insert into cash_obligations
    select %(d)s::date, 'ACC' || lpad(a::text, 4, '0'), 100, 100, 0, 10
    from generate_series(1, {ACCOUNTS}) a returning 1),
i as (
    insert into instrument_summary
    select %(d)s::date, 'SYM' || lpad(s::text, 3, '0'), 1000, 50000, 525000, 10.5, 10, 11,
           10.5
    from generate_series(0, {SYMBOLS} - 1) s returning 1),
-- Its instructions (settlement_instructions is not partitioned: sql/migrations/0024), one
-- per line that moves, each answered settled, as a year of them would be.
si as (
    insert into settlement_instructions (instruction_id, run_id, trade_date, settlement_date,
                                         account, symbol, side, quantity, payment, amount,
                                         version)
    select 'R' || run.run_id || '-' || lpad((row_number() over (order by a, s))::text, 6, '0'),
           run.run_id, %(d)s::date, %(d)s::date + 1, 'ACC' || lpad(a::text, 4, '0'),
           'SYM' || lpad(s::text, 3, '0'), case when q > 0 then 'RECE' else 'DELI' end,
           abs(q), case when q > 0 then 'PAY' else 'RECV' end, abs(q) * 10.5, 1
    from legs, run where q <> 0
    returning instruction_id, quantity),
st as (
    insert into instruction_statuses (instruction_id, status, settled_quantity,
                                      open_quantity, open_amount)
    select instruction_id, 'settled', quantity, 0, 0 from si returning 1)
insert into published_days (trade_date, run_id)
select %(d)s::date, run_id from run  -- the CTEs above run whether read or not
"""


def history_dates(days: int) -> list[dt.date]:
    """The ``days`` weekdays before DATE, oldest first."""
    out, day = [], dt.date.fromisoformat(DATE)
    while len(out) < days:
        day -= dt.timedelta(days=1)
        if day.weekday() < 5:
            out.append(day)
    return out[::-1]


def load_history(s: Settings, days: int, per_day: int) -> dict[str, Any]:
    admin = s.for_component("admin")
    t0 = time.perf_counter()
    # Offsets below the topic's first: these days' messages left the log long ago (its
    # retention), as a year's would; the day's Kafka range then starts at the log's start.
    offset = -days * (per_day // PARTITIONS + 2) - 1
    with connect(admin.ledger_dsn("a"), autocommit=True) as ledger, \
            connect(admin.settlement_dsn, autocommit=True) as settlement:
        for n, day in enumerate(history_dates(days), start=1):
            params = {"d": day, "n": per_day, "offset": offset}
            ledger.execute("select ensure_trade_partitions(array[%(d)s::date])", params)
            ledger.execute(LEDGER_DAY, params)
            ledger.execute(TRADE_IDS, params)
            ledger.execute(MARKERS, params)
            settlement.execute("select ensure_settlement_partitions(array[%(d)s::date])",
                               params)
            settlement.execute(SETTLEMENT_DAY, {"d": day, "n": per_day})
            offset += per_day // PARTITIONS + 2
            if n % 10 == 0 or n == days:
                print(f"history: {n}/{days} days ({time.perf_counter() - t0:.0f} s)",
                      file=sys.stderr, flush=True)
        ledger.execute("vacuum analyze")
        settlement.execute("vacuum analyze")
        size = ledger.execute("select pg_database_size(current_database())").fetchone()[0]
        rows = ledger.execute("select count(*) from trades").fetchone()[0]
    return {"days": days, "trades": rows, "ledger_bytes": size,
            "seconds": round(time.perf_counter() - t0, 1)}


def copy_next_day(s: Settings, n: int) -> dict[str, Any]:
    """COPY ``n`` trades of the day after DATE into the ledger (timed), then remove them."""
    nxt = (dt.date.fromisoformat(DATE) + dt.timedelta(days=1)).isoformat()
    lines = copy_lines(n, PARTITIONS, nxt, seed=2)
    admin = s.for_component("admin")
    with connect(admin.ledger_dsn("a")) as conn:
        secs = copy_into(conn, lines)
        conn.execute("select drop_trade_partition(%s)", (nxt,))
        conn.execute("delete from trade_ids where trade_date = %s", (nxt,))
        conn.commit()
    return {"trades": n, "seconds": round(secs, 2), "trades_per_second": round(n / secs)}


def status_seconds(env: dict[str, str]) -> list[float]:
    settle = Path(sys.executable).parent / "settle"
    runs = []
    for _ in range(2):
        t0 = time.perf_counter()
        subprocess.run([str(settle), "status", "--json"], env={**os.environ, **env},
                       capture_output=True, text=True, timeout=120)
        runs.append(round(time.perf_counter() - t0, 2))
    return runs


def measure(s: Settings, env: dict[str, str], n: int, copy_n: int) -> dict[str, Any]:
    print(f"[{s.pg_db_prefix}] ingesting with site a...", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    Site(s, SiteOptions("a", "separate", True, DATE, 3600)).run()
    ingest = {**steady(s), "wall_seconds": round(time.perf_counter() - t0, 2)}
    with connect(s.ledger_dsn("a")) as conn:
        # steady() counts the whole table (its to_last_batch rate then means nothing here).
        ingest["trades"] = conn.execute("select count(*) from trades where trade_date = %s",
                                        (DATE,)).fetchone()[0]
        ingest.pop("to_last_batch_trades_per_second")
        runs = []
        for _ in range(2):  # the faster counts: the first read sets hint bits
            t1 = time.perf_counter()
            conn.execute(SQL_NETTING, {"d": DATE}).fetchall()
            runs.append(time.perf_counter() - t1)
    group_by = round(min(runs), 2)
    out: dict[str, Any] = {"ingest": ingest, "sql_group_by_seconds": group_by}
    for source in ("kafka", "db"):
        print(f"[{s.pg_db_prefix}] settle eod --source {source}...", file=sys.stderr,
              flush=True)
        close = cold_close(env, source, n, group_by)
        out[f"process_{source}"] = {k: close[k] for k in ("seconds", "vs_group_by",
                                                          "read_by")}
    out["status_seconds"] = status_seconds(env)
    out["copy"] = copy_next_day(s, copy_n)
    out["ingest_vs_copy"] = round(ingest["steady_trades_per_second"]
                                  / out["copy"]["trades_per_second"], 3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--days", type=int, default=250)
    ap.add_argument("--day-trades", type=int, default=200_000)
    ap.add_argument("--trades", type=int, default=2_000_000, help="day 251's trades")
    ap.add_argument("--mix", choices=sorted(MIXES), default="realistic")
    ap.add_argument("--copy", type=int, default=500_000, help="trades of the COPY ceiling")
    args = ap.parse_args()
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    base = load_settings()
    started = services.up(base)
    (empty, env_e), (own, env_h) = namespace(base), namespace(base)
    # One topic, the day published once: both namespaces ingest the same messages.
    hist = own.model_copy(update={"topic": empty.topic})
    env_h = {**env_h, "SETTLE_TOPIC": empty.topic}
    try:
        print(f"loading {args.days} days of {args.day_trades} trades...", file=sys.stderr,
              flush=True)
        loaded = load_history(hist, args.days, args.day_trades)
        print(f"publishing day 251 ({args.trades} trades, {args.mix})...", file=sys.stderr,
              flush=True)
        simulate(empty, SimulationSpec(DATE, args.trades, seed=1, txn_size=5_000,
                                       **MIXES[args.mix]))
        with_history = measure(hist, env_h, args.trades, args.copy)
        without = measure(empty, env_e, args.trades, args.copy)
    finally:
        for s in (own, empty):  # each its own topic and databases
            try:
                drop_namespace(s)
            except Exception as e:  # noqa: BLE001 - one failed cleanup must not stop the other
                print(f"cleanup: {e}", file=sys.stderr)
        if started.get("kafka") == "started" or started.get("postgres") == "started":
            services.down(base)

    def ratio(key: str) -> float:
        return round(with_history[key]["seconds"] / without[key]["seconds"], 3)

    ingest_ratio = round(with_history["ingest_vs_copy"] / without["ingest_vs_copy"], 3)
    result = {
        "benchmark": "history", "date": DATE, "trades": args.trades, "mix": args.mix,
        "history": loaded, "with_history": with_history, "empty": without,
        "ingest_vs_copy_history_over_empty": ingest_ratio,
        "process_kafka_history_over_empty": ratio("process_kafka"),
        "process_db_history_over_empty": ratio("process_db"),
        "targets": {  # issue 60
            "ingest_vs_copy_within_10%": ingest_ratio >= 0.9,
            "close_kafka_within_10%": ratio("process_kafka") <= 1.1,
            "close_db_within_10%": ratio("process_db") <= 1.1,
            "status_under_1s": min(with_history["status_seconds"]) < 1.0,
        },
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
