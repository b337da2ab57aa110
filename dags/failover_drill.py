"""
### Failover drill

Proves, before the bad day, that failover loses nothing. Triggered by hand (optionally
weekly: set `SETTLE_DRILL_CRON`, e.g. `0 6 * * 6`). One run starts the gateway and both
consumer sites as real processes in a private namespace, injects one fault once site A has
committed the chosen fraction of its share of a simulated trading day (read from the ledger),
lets the day finish and checks an independent read_committed read of Kafka against the
ledgers:

- `lost` (committed in Kafka, missing from a ledger), `duplicated`, `unexpected` (in a
  ledger, not committed in Kafka), `nonmonotonic` (offsets applied out of order);
- `rto_seconds`: shared scheme, fault to site B's first trade from site A's partitions.

Faults: `kill` (SIGKILL site A), `pause` (SIGSTOP inside a ledger transaction, past the
session timeout; the stale batch is refused when it wakes), `db-restart`
(PostgreSQL crash-restart), `broker-kill` (one of three brokers; needs
`settle services up --brokers 3`), `eod-kill` (both sites close the day at once and site A's
close is killed mid-run: site B's takes over, the killed run is recorded abandoned and the
day is published once). The task output is the verdict; the HTML page's path is
in the log. A drill that loses or duplicates anything fails the run.

Registered only when drills are enabled (`SETTLE_DRILLS_ENABLED`, on by default for the
embedded setup, off in docker-compose.yml): a drill injects faults into the sites it runs.
"""

from __future__ import annotations

import datetime as dt
import os

import pendulum
from airflow.sdk import Param, dag, task

from settlement.orchestration.tasks import drills_enabled


@dag(
    dag_id="failover_drill",
    schedule=os.environ.get("SETTLE_DRILL_CRON") or None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    tags=["settlement", "drill", "resilience"],
    doc_md=__doc__,
    default_args={"retries": 1, "retry_delay": dt.timedelta(minutes=1),
                  "execution_timeout": dt.timedelta(minutes=30), "owner": "operations"},
    params={
        "scheme": Param("shared", enum=["separate", "shared"]),
        "fault": Param("kill", enum=["kill", "pause", "db-restart", "broker-kill",
                                     "eod-kill"]),
        "trades": Param(20_000, type="integer", minimum=1000, maximum=2_000_000),
        "seed": Param(1, type="integer", minimum=0),
        "at": Param(0.4, type="number", exclusiveMinimum=0, exclusiveMaximum=1,
                    description="inject when site A has committed this fraction "
                                "of its share of the day"),
    },
)
def failover_drill() -> None:
    @task(retries=0)  # a drill that failed is a finding, not a flake to retry away
    def run_drill(params: dict) -> dict:
        from settlement.orchestration.tasks import run_drill_task

        return run_drill_task(params)

    run_drill()


if drills_enabled():
    failover_drill()
