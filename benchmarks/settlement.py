"""End-of-day settlement throughput from each source, against one SQL GROUP BY.

    .venv/bin/python benchmarks/settlement.py [--trades 1000000[,10000000]]

For each size: publish the day (no faults) to a private topic, ingest it with one site into
a private ledger, then time in the same run
  kafka - settlement only, `run_eod(source="kafka", validate=False)` (bounded read_committed
          Kafka read, parse and check, dedupe, positions, obligations, instrument summary,
          staged results), Spark local[2]
  db    - the same from the ledger over JDBC
  sql   - the positions netting as one GROUP BY inside PostgreSQL on the same rows (the
          baseline the targets are ratios of)
  eod_kafka, eod_db - `settle eod` end to end: the same plus Great Expectations, publication
          and the audit report, with each step's seconds
The Spark session is started and warmed once before timing; the driver JVM's peak resident
memory (VmHWM) is reported after each size. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from consumers.site import Site, SiteOptions
from settlement import services
from settlement.close.pipeline import run_eod
from settlement.config import Settings, load_settings
from settlement.db import connect
from settlement.drills.namespace import (
    drop_namespace,
    namespace_env,
    namespace_settings,
    reset_namespace,
)
from settlement.simulator.gateway import SimulationSpec, simulate
from settlement.spark.session import build_session

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

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
    s = namespace_settings(base, ns)
    reset_namespace(s)
    return s


def driver_peak_rss_mib(spark: SparkSession) -> int | None:
    """The local driver JVM's peak resident memory so far (Linux VmHWM); None when the JVM
    is not a child of this process."""
    proc = getattr(spark.sparkContext._gateway, "proc", None)
    status = Path(f"/proc/{proc.pid}/status") if proc is not None else None
    if status is None or not status.exists():
        return None
    for line in status.read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) // 1024
    return None


def spark_work(spark: SparkSession, group: str) -> dict[str, int]:
    """The Spark jobs and stages a run started (its job group), and the stages skipped
    because their output was already computed (a cached or reused shuffle)."""
    tracker = spark.sparkContext.statusTracker()
    jobs = [tracker.getJobInfo(j) for j in tracker.getJobIdsForGroup(group)]
    stages = {st for j in jobs if j is not None for st in j.stageIds}
    ran = {st for st in stages if tracker.getStageInfo(st) is not None
           and tracker.getStageInfo(st).numCompletedTasks > 0}
    return {"spark_jobs": len(jobs), "spark_stages": len(stages),
            "spark_stages_run": len(ran)}


def _validation_vs_work(run: dict[str, Any]) -> bool:
    """Validation took less time than reading plus netting (the ledger's read is timed as
    the settlement's dedupe step: the rows arrive there)."""
    t = run["timings"]
    work = t.get("read_seconds", 0) + t.get("dedupe_seconds", 0) + t.get("netting_seconds", 0)
    return t.get("validate_seconds", 0) < work


def targets(results: list[dict[str, Any]], growth: dict[str, float] | None
            ) -> dict[str, Any]:
    """Issue #26's targets: the ratios at the size nearest 2M, the seconds at the largest
    size when it is 10M or more, validation against read plus netting at every size."""
    near = min(results, key=lambda r: abs(r["trades"] - 2_000_000))
    big = results[-1]
    out: dict[str, Any] = {
        "ratio_trades": near["trades"],
        "eod_kafka_le_15x_group_by": near["eod_kafka"]["vs_group_by"] <= 15,
        "eod_db_le_10x_group_by": near["eod_db"]["vs_group_by"] <= 10,
        "validation_lt_read_plus_netting": all(
            _validation_vs_work(r[k]) for r in results for k in ("eod_kafka", "eod_db")),
        "growth_no_worse_than_linear": None if growth is None
        else all(g <= 1.0 for g in growth.values()),
    }
    if big["trades"] >= 10_000_000:
        out["eod_kafka_10m_le_150s"] = big["eod_kafka"]["seconds"] <= 150
        out["eod_db_10m_le_75s"] = big["eod_db"]["seconds"] <= 75
    return out


def one_size(spark: SparkSession, base: Settings, n: int) -> dict[str, Any]:
    s = namespace(base)
    try:
        print(f"[{n}] publishing...", file=sys.stderr, flush=True)
        simulate(s, SimulationSpec(DATE, n, seed=1, txn_size=5_000))
        print(f"[{n}] ingesting with site a...", file=sys.stderr, flush=True)
        Site(s, SiteOptions("a", "separate", True, DATE, 3600)).run()
        out: dict[str, Any] = {"trades": n}
        with connect(s.ledger_dsn("a")) as conn:
            # Twice, the faster counts: the first read of freshly ingested rows also sets
            # their hint bits (writes), which no later reader pays.
            runs = []
            for _ in range(2):
                t0 = time.perf_counter()
                rows = conn.execute(SQL_NETTING, {"d": DATE}).fetchall()
                runs.append(time.perf_counter() - t0)
            secs = min(runs)
        out["sql_group_by"] = {"seconds": round(secs, 2), "trades_per_second": round(n / secs),
                               "positions": len(rows)}
        for source, validate in (("kafka", False), ("db", False), ("kafka", True),
                                 ("db", True)):
            key = f"eod_{source}" if validate else source
            print(f"[{n}] {key}...", file=sys.stderr, flush=True)
            group = f"{key}-{n}"
            spark.sparkContext.setJobGroup(group, f"benchmark {key} {n}")
            t0 = time.perf_counter()
            res = run_eod(s, DATE, source=source, validate=validate)
            secs = time.perf_counter() - t0
            assert res["trades"] == n, res
            assert not validate or res["validation_success"], res.get("validation")
            out[key] = {"seconds": round(secs, 2), "trades_per_second": round(n / secs),
                        "vs_group_by": round(secs / out["sql_group_by"]["seconds"], 2),
                        "timings": res["timings"], **spark_work(spark, group)}
            if validate:
                val = res["validation"]
                out[key]["validation_suites_seconds"] = val.get("seconds")
                out[key]["validation_figures"] = val.get("figures")
        out["driver_peak_rss_mib"] = driver_peak_rss_mib(spark)
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
        results = [one_size(spark, base, n) for n in sizes]
    finally:
        if started.get("kafka") == "started" or started.get("postgres") == "started":
            services.down(base)
    growth = None
    if len(results) > 1:
        a, b = results[0], results[-1]
        growth = {src: round((b[src]["seconds"] / a[src]["seconds"])
                             / (b["trades"] / a["trades"]), 2)
                  for src in ("kafka", "db", "eod_kafka", "eod_db")}
    print(json.dumps({
        "benchmark": "settlement", "spark_master": base.spark_master,
        "machine": {"cores": os.cpu_count()}, "results": results,
        "cost_growth_vs_linear": growth, "targets": targets(results, growth),
    }, indent=2))


if __name__ == "__main__":
    main()
