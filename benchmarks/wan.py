"""The WAN's cost on the stack: ingest's ratio to COPY and a close's time at several round
trips between the sites, in one run.

    make stack-up                  # the stack measured (this sets each round's WAN itself)
    .venv/bin/python benchmarks/wan.py [--rtts 0,5,20] [--trades 2000000]

For each round trip (settlement/stack/wan.py sets it between site A, site B and the
witness), a trading day of its own on the one topic, in order:
  commit   - one-row commits on the settlement primary from this host, median ms: the
             synchronous standby is across the WAN, so each commit waits a round trip
  publish  - the gateway container publishes the day (the drills' mix: 2% replays, 0.5%
             malformed, a quarter of its transactions aborted) with both sites stopped
  ingest   - both sites started; until the shared ledger holds the whole day; the steady rate
             is taken between 10% and 90% of it
  copy     - the same trades COPYed into a table of the shared ledger on the primary in one
             transaction: what the database takes at this round trip, ingest's ceiling
  close    - eod_settlement created through Airflow's REST API at site A, as an operator
             does: the run's wall time and the close's own (settlement_runs)
Ratios are against the round with the shortest round trip, measured in the same run. Prints
one JSON object; the WAN is set back to what it was.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.ingest import copy_into, copy_lines
from settlement.db import open_connection
from settlement.stack import wan
from settlement.stack.compose import Stack, open_stack
from settlement.stack.drill import publish_day, stack_settings, trigger_close
from settlement.stack.partition_drill import admin_dsn
from settlement.stack.sites import primary_site

ROOT = Path(__file__).resolve().parents[1]
SEED = 11
COPY_TABLE = "wan_bench_copy"


def say(message: str) -> None:
    print(f"wan: {message}", file=sys.stderr, flush=True)


def business_days(first: dt.date, n: int) -> list[str]:
    days, d = [], first
    while len(days) < n:
        if d.weekday() < 5:
            days.append(d.isoformat())
        d += dt.timedelta(days=1)
    return days


def primary_ledger(stack: Stack) -> str:
    return admin_dsn(stack, ("a", "b"), "ledger_shared") + "&target_session_attrs=read-write"


def copy_seconds(dsn: str, lines: list[str]) -> dict[str, Any]:
    with open_connection(dsn, autocommit=True) as conn:
        conn.execute(f"drop table if exists {COPY_TABLE}")
        conn.execute(f"create table {COPY_TABLE} (like trades including all)")
    with open_connection(dsn) as conn:
        secs = copy_into(conn, lines, COPY_TABLE)
        conn.execute(f"drop table {COPY_TABLE}")
        conn.commit()
    return {"seconds": round(secs, 2), "trades_per_second": round(len(lines) / secs)}


def ingest(stack: Stack, dsn: str, trade_date: str, expected: int,
           timeout: float = 1800) -> dict[str, Any]:
    """Both sites started on a day already in Kafka; until the ledger holds all of it."""
    t0 = time.monotonic()
    stack.compose("start", "site-a", "site-b")
    samples: list[tuple[float, int]] = []
    with open_connection(dsn, autocommit=True) as conn:
        while True:
            n = int(conn.execute("select count(*) from trades where trade_date = %s",
                                 (trade_date,)).fetchone()[0])
            samples.append((time.monotonic() - t0, n))
            if n >= expected:
                break
            if time.monotonic() - t0 > timeout:
                raise SystemExit(f"wan: the sites ingested {n} of {expected} trades of "
                                 f"{trade_date} in {timeout:.0f} s")
            time.sleep(1)

    def at(fraction: float) -> tuple[float, int]:
        return next(s for s in samples if s[1] >= fraction * expected)

    (ta, na), (tb, nb) = at(0.1), at(0.9)
    steady = round((nb - na) / (tb - ta)) if tb > ta else None
    return {"trades": expected, "seconds": round(samples[-1][0], 1),
            "steady_trades_per_second": steady}


def close(stack: Stack, dsn: str, trade_date: str) -> dict[str, Any]:
    api, run_id = trigger_close(stack, trade_date, say)
    t0 = time.monotonic()
    run = api.wait_for_run("eod_settlement", run_id, 3600)
    wall = time.monotonic() - t0
    settlement = dsn.replace("/ledger_shared?", "/settlement?")
    with open_connection(settlement, autocommit=True) as conn:
        row = conn.execute(
            "select r.run_id, r.source, extract(epoch from r.finished_at - r.started_at)"
            " from published_days p join settlement_runs r using (run_id)"
            " where p.trade_date = %s", (trade_date,)).fetchone()
    if run["state"] != "success" or row is None:
        raise SystemExit(f"wan: the close of {trade_date} ended {run['state']}, "
                         f"published: {row is not None}")
    return {"dag_run_seconds": round(wall, 1), "close_seconds": round(float(row[2]), 1),
            "source": row[1], "run_id": int(row[0])}


def measure(stack: Stack, rtt: float, trade_date: str, trades: int) -> dict[str, Any]:
    settings = stack_settings(stack)
    wan.apply(ROOT, stack.state, rtt, say)
    dsn = primary_ledger(stack)
    out: dict[str, Any] = {"rtt_ms": rtt, "trade_date": trade_date,
                           "primary_site": primary_site(stack),
                           "commit_ms": wan.commit_round_trip_ms(dsn, n=31)}
    say(f"{rtt:g} ms: the day's trades for COPY ({trades})...")
    lines = copy_lines(trades, settings.partitions, trade_date, SEED)
    stack.compose("stop", "site-a", "site-b")
    say(f"{rtt:g} ms: publishing {trade_date} from the gateway, both sites stopped...")
    t0 = time.monotonic()
    gateway = publish_day(stack, trade_date, trades, SEED)
    _, err = gateway.communicate(timeout=3600)
    if gateway.returncode != 0:
        raise SystemExit(f"wan: the gateway failed: {err[-2000:]}")
    out["publish_seconds"] = round(time.monotonic() - t0, 1)
    say(f"{rtt:g} ms: ingesting ({out['publish_seconds']} s to publish)...")
    out["ingest"] = ingest(stack, dsn, trade_date, len(lines))
    out["copy"] = copy_seconds(dsn, lines)
    if out["ingest"]["steady_trades_per_second"]:
        out["ingest_vs_copy"] = round(out["ingest"]["steady_trades_per_second"]
                                      / out["copy"]["trades_per_second"], 3)
    say(f"{rtt:g} ms: closing {trade_date} through Airflow...")
    out["close"] = close(stack, dsn, trade_date)
    say(f"{rtt:g} ms: {json.dumps(out)}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rtts", default="0,5,20", help="round trips in ms, comma-separated")
    ap.add_argument("--trades", type=int, default=2_000_000, help="trades a day")
    ap.add_argument("--first-date", default="2026-12-07",
                    help="the first round's trade date (each round the next business day)")
    args = ap.parse_args()
    rtts = [float(r) for r in args.rtts.split(",")]
    for r in rtts:
        wan.check_rtt(r)
    stack = open_stack(ROOT, say)
    before = wan.current(stack.state)
    dates = business_days(dt.date.fromisoformat(args.first_date), len(rtts))
    rounds = []
    try:
        for rtt, day in zip(rtts, dates, strict=True):
            rounds.append(measure(stack, rtt, day, args.trades))
    finally:
        stack.compose("start", "site-a", "site-b", check=False)
        wan.apply(ROOT, stack.state, before.rtt_ms, say, before.loss, before.jitter_ms)
    base = min(rounds, key=lambda r: r["rtt_ms"])  # the baseline: the shortest round trip
    for r in rounds:
        r["close_vs_shortest"] = round(r["close"]["close_seconds"]
                                       / base["close"]["close_seconds"], 2)
        rate, base_rate = (x["ingest"]["steady_trades_per_second"] for x in (r, base))
        if rate and base_rate:  # a small day has no steady stretch to take
            r["ingest_vs_shortest"] = round(rate / base_rate, 2)
    print(json.dumps({"trades": args.trades, "rounds": rounds}, indent=2))


if __name__ == "__main__":
    main()
