"""End-of-day settlement throughput from each source, against one SQL GROUP BY.

    .venv/bin/python benchmarks/settlement.py [--trades 1000000[,10000000]]

For each size: publish the day (no faults) to a private topic, ingest it with one site into
a private ledger, then time in the same run
  kafka - `settle eod --source kafka` (bounded read_committed Kafka read, parse, dedupe,
          positions, obligations, instrument summary, atomic write), Spark local[2]
  db    - the same from the ledger over JDBC
  sql   - the positions netting as one GROUP BY inside PostgreSQL on the same rows
Validation is not included (it is timed separately by the report). The Spark session is
started and warmed once before timing. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from consumers.site import Site, SiteOptions
from settlement import services
from settlement.config import Settings, load_settings
from settlement.db import connect
from settlement.drills.namespace import drop_namespace, namespace_env, reset_namespace
from settlement.eod.pipeline import run_eod
from settlement.simulator.gateway import SimulationSpec, simulate
from settlement.spark.session import build_session

DATE = "2026-11-24"
SQL_NETTING = """
select account, symbol, sum(bq), sum(sq), sum(bq) - sum(sq), sum(ba), sum(sa),
       sum(sa) - sum(ba), count(*)
from (select buyer as account, symbol, quantity as bq, 0 as sq, price * quantity as ba,
             0 as sa from trades where trade_date = %(d)s
      union all
      select seller, symbol, 0, quantity, 0, price * quantity
      from trades where trade_date = %(d)s) legs
group by account, symbol
"""


def namespace(base: Settings) -> Settings:
    ns = namespace_env(base, f"bench_{uuid.uuid4().hex[:6]}")
    s = base.model_copy(update={
        "topic": ns["SETTLE_TOPIC"], "pg_dsn": ns["SETTLE_PG_DSN"],
        **{f"ledger_{x}_dsn": ns[f"SETTLE_LEDGER_{x.upper()}_DSN"] for x in ("a", "b", "shared")}})
    reset_namespace(s)
    return s


def one_size(base: Settings, n: int) -> dict[str, Any]:
    s = namespace(base)
    try:
        print(f"[{n}] publishing...", file=sys.stderr, flush=True)
        simulate(s, SimulationSpec(DATE, n, seed=1, txn_size=5_000))
        print(f"[{n}] ingesting with site a...", file=sys.stderr, flush=True)
        Site(s, SiteOptions("a", "separate", True, DATE, 3600)).run()
        out: dict[str, Any] = {"trades": n}
        for source in ("kafka", "db"):
            print(f"[{n}] settling from {source}...", file=sys.stderr, flush=True)
            t0 = time.perf_counter()
            res = run_eod(s, DATE, source=source, validate=False)
            secs = time.perf_counter() - t0
            assert res["trades"] == n, res
            out[source] = {"seconds": round(secs, 2), "trades_per_second": round(n / secs),
                           "timings": res["timings"]}
        with connect(s.ledger_dsn("a")) as conn:
            t0 = time.perf_counter()
            rows = conn.execute(SQL_NETTING, {"d": DATE}).fetchall()
            secs = time.perf_counter() - t0
        out["sql_group_by"] = {"seconds": round(secs, 2), "trades_per_second": round(n / secs),
                               "positions": len(rows)}
        return out
    finally:
        drop_namespace(s)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trades", default="1000000", help="comma-separated day sizes")
    args = ap.parse_args()
    sizes = [int(x) for x in args.trades.split(",")]
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    base = load_settings()
    started = services.up(base)
    try:
        spark = build_session(base, "settlement-benchmark")
        spark.range(1000).selectExpr("sum(id)").collect()  # JVM and session warm-up
        results = [one_size(base, n) for n in sizes]
    finally:
        if started.get("kafka") == "started" or started.get("postgres") == "started":
            services.down(base)
    growth = None
    if len(results) > 1:
        a, b = results[0], results[-1]
        growth = {src: round((b[src]["seconds"] / a[src]["seconds"])
                             / (b["trades"] / a["trades"]), 2) for src in ("kafka", "db")}
    print(json.dumps({
        "benchmark": "settlement", "spark_master": base.spark_master,
        "machine": {"cores": os.cpu_count()}, "results": results,
        "cost_growth_vs_linear": growth,
    }, indent=2))


if __name__ == "__main__":
    main()
