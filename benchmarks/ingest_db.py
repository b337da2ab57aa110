"""The consumer site's database side alone, against COPY straight into `trades`.

    .venv/bin/python benchmarks/ingest_db.py [--trades 300000] [--batch 20000]

Builds the gateway's trades as the site's COPY lines (no Kafka, no parse in the timing), then
writes them in batches, each into a fresh ledger as `site_a`, per path:
  on_conflict - COPY into the TEMP stage, the late check, `insert ... on conflict do nothing`
              into `trades`, commit (what `Ledger.write` does per batch, offsets aside, on
              a batch after one with replays)
  clean     - the same with a plain `insert ... select` in a savepoint (what it does after
              a batch without replays; a replay would roll it back to `on conflict`)
  not_exists - the same with `where not exists` instead of `on conflict`
  copy      - COPY straight into `trades` (the ceiling the ingest target is a ratio of)
Starts the embedded services if they are not running (and stops them again afterwards).
Prints one JSON object: microseconds per row of each step, and rows per second.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.ingest import cleanup, fresh  # a new ledger, logged into as site_a
from consumers.ledger import _COPY_STAGE
from consumers.parse import trade_copy_line
from settlement import services
from settlement.config import load_settings
from settlement.contract import STAGE_COLUMNS
from settlement.db import connect, q
from settlement.simulator.gateway import DayGenerator, SimulationSpec

DATE = "2026-11-24"
COLUMNS = ", ".join(STAGE_COLUMNS)  # what the site's COPY lines hold, in their order
INSERTS = {
    "on_conflict": q("ingest", "insert_staged"),
    "clean": q("ingest", "insert_staged_new"),
    "not_exists": (f"insert into trades ({COLUMNS}) select {COLUMNS} from trades_stage s "
                   "where not exists (select 1 from trades t where t.trade_id = s.trade_id)"),
}


def run_path(dsn: str, path: str, batches: list[str], rows: int) -> dict[str, Any]:
    steps: dict[str, float] = {}

    def timed(step: str, t0: float) -> None:
        steps[step] = steps.get(step, 0.0) + time.perf_counter() - t0

    with connect(dsn) as conn:
        conn.execute(q("ingest", "create_stage"))
        conn.commit()
        started = time.perf_counter()
        for batch in batches:
            with conn.cursor() as cur:
                t0 = time.perf_counter()
                if path == "copy":
                    with cur.copy(f"copy trades ({COLUMNS}) from stdin") as copy:
                        copy.write(batch)
                    timed("copy_trades", t0)
                else:
                    with cur.copy(_COPY_STAGE) as copy:
                        copy.write(batch)
                    timed("copy_stage", t0)
                    t0 = time.perf_counter()
                    cur.execute(q("ingest", "late_staged")).fetchall()
                    timed("late_check", t0)
                    t0 = time.perf_counter()
                    if path == "clean":
                        with conn.transaction():  # the savepoint Ledger._insert_staged takes
                            cur.execute(INSERTS[path])
                    else:
                        cur.execute(INSERTS[path])
                    timed("insert", t0)
            t0 = time.perf_counter()
            conn.commit()
            timed("commit", t0)
        seconds = time.perf_counter() - started
        stored = conn.execute("select count(*) from trades").fetchone()[0]
    if stored != rows:
        raise RuntimeError(f"{path}: {stored} rows stored of {rows}")
    return {"us_per_row": {k: round(v / rows * 1e6, 2) for k, v in steps.items()},
            "seconds": round(seconds, 3), "rows_per_second": round(rows / seconds)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trades", type=int, default=300_000)
    ap.add_argument("--batch", type=int, default=20_000)
    args = ap.parse_args()
    base = load_settings()
    if base.pg_dsn is not None:
        # Each path needs an empty ledger of its own, which only the embedded server makes.
        sys.exit("ingest_db.py measures fresh ledgers of the embedded PostgreSQL: unset "
                 "SETTLE_PG_DSN to run it")
    started = services.up(base)
    try:
        gen = DayGenerator(SimulationSpec(DATE, args.trades, seed=1), base.partitions)
        lines = [trade_copy_line(json.loads(t.value()), t.partition, i, "a")
                 for i, t in enumerate(gen.trades())]
        batches = ["".join(lines[i:i + args.batch]) for i in range(0, len(lines), args.batch)]
        results = {p: run_path(fresh(base, "db").ledger_dsn("a"), p, batches, len(lines))
                   for p in ("on_conflict", "clean", "not_exists", "copy")}
    finally:
        try:
            cleanup(base)
        finally:
            if started.get("kafka") == "started" or started.get("postgres") == "started":
                services.down(base)
    ceiling = results["copy"]["rows_per_second"]
    print(json.dumps({
        "benchmark": "ingest_db", "trades": args.trades, "batch": args.batch,
        "machine": {"cores": os.cpu_count()}, "paths": results,
        "vs_copy_ceiling": {p: round(r["rows_per_second"] / ceiling, 3)
                            for p, r in results.items()},
    }, indent=2))


if __name__ == "__main__":
    main()
