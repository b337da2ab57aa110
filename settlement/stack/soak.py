"""`make stack-soak`: compressed trading days back to back, each close created by the stack's
own scheduler from its timetable (no run is triggered by hand).

The scheduler gets a compressed calendar (``SETTLE_EOD_COMPRESSED``: a close every
``minutes`` minutes, each settling the next weekday) and eod_settlement is unpaused. For every
run the scheduler creates, in order: the day that run settles (the same function the DAG
uses) is published from the gateway container, a site container chosen at random is killed
at a random point of its share and started again, and once the run ends the ledger is
compared with Kafka. Bounded: ``days`` runs, and a deadline of their slots plus 20 minutes.
"""

from __future__ import annotations

import datetime as dt
import random
import time
from typing import Any

from settlement.config import CompressedDays
from settlement.errors import ServiceError
from settlement.stack import envfile
from settlement.stack.compose import Stack, wait_ready
from settlement.stack.drill import DAG, check_day, operations_api, play_day, stack_settings
from settlement.stack.engine import Log


def compress_schedule(stack: Stack, base: str, minutes: int, log: Log) -> CompressedDays:
    """Give the stack's Airflow the compressed calendar, anchored at this minute."""
    anchor = dt.datetime.now(dt.UTC).replace(second=0, microsecond=0)
    text = f"{base}@{anchor.isoformat()}/{minutes}"
    days = CompressedDays.parse(text)
    envfile.write_env(stack.env_path, stack.certs, compressed=text)
    log(f"compressed calendar {text}: recreating Airflow's components...")
    stack.compose("up", "-d", timeout=1200)
    wait_ready(stack, log)
    return days


def next_scheduled_run(api: Any, seen: set[str], deadline: float) -> dict[str, Any]:
    """The oldest run the scheduler created that this soak has not handled yet."""
    while True:
        runs = api.call("GET", f"/api/v2/dags/{DAG}/dagRuns?run_type=scheduled"
                               "&order_by=logical_date&limit=100")["dag_runs"]
        fresh = [r for r in runs if r["dag_run_id"] not in seen]
        if fresh:
            return dict(fresh[0])
        if time.monotonic() > deadline:
            raise ServiceError("the scheduler created no run in time: is eod_settlement "
                               "unpaused and the scheduler healthy?")
        time.sleep(5)


def run_soak(stack: Stack, days: int, trades: int, minutes: int, log: Log, seed: int = 11,
             base: str = "2026-04-01") -> dict[str, Any]:
    calendar = compress_schedule(stack, base, minutes, log)
    settings = stack_settings(stack)
    api = operations_api(stack)
    api.wait_for_dag(DAG, timeout=300)
    api.call("PATCH", f"/api/v2/dags/{DAG}", {"is_paused": False})
    rng = random.Random(seed)
    deadline = time.monotonic() + days * minutes * 60 + 20 * 60
    seen: set[str] = set()
    results = []
    try:
        while len(results) < days:
            run = next_scheduled_run(api, seen, deadline)
            seen.add(run["dag_run_id"])
            day = calendar.trade_date(dt.datetime.fromisoformat(run["logical_date"]))
            log(f"the scheduler created {run['dag_run_id']}: trade date {day}")
            victim = rng.choice(["site-a", "site-b"])
            played = play_day(stack, settings, day, trades, seed + len(results), victim,
                              round(rng.uniform(0.2, 0.8), 2), log, restart=True)
            done = api.wait_for_run(DAG, run["dag_run_id"],
                                    max(60.0, deadline - time.monotonic()), tick=log)
            results.append({**check_day(stack, settings, day, done), **played})
            log(f"{day}: {done['state']}, lost {results[-1]['lost']}, duplicated "
                f"{results[-1]['duplicated']}")
    finally:
        # No further closes of days nobody publishes.
        api.call("PATCH", f"/api/v2/dags/{DAG}", {"is_paused": True})
    return {
        "days": results,
        "trade_dates": [r["trade_date"] for r in results],
        "lost": sum(r["lost"] for r in results),
        "duplicated": sum(r["duplicated"] for r in results),
        "passed": all(r["passed"] for r in results),
    }
