"""`make stack-drill`: a faulty day through the running stack, a site container killed in the
middle of it, and the day settled by the stack's own scheduler through Airflow's REST API.

1. the gateway container publishes the day (replays, malformed messages, aborted
   transactions) while both site containers consume it (shared scheme);
2. site-a's container is killed (SIGKILL) once it has committed ``kill_at`` of its share of
   the day, read from the ledger; site-b takes its partitions over;
3. a run of eod_settlement for the date is created through the REST API as the `operations`
   user (role Op) and run by the stack's scheduler; it waits for the close markers itself;
4. the checker compares the ledger with Kafka (read as the auditor); site-a is started again.
"""

from __future__ import annotations

import subprocess
import time
from typing import Any

from settlement.config import Settings
from settlement.db import connect
from settlement.drills.checker import (
    check_ledger,
    day_share,
    read_kafka_day,
    wait_for_owners,
    wait_for_share,
)
from settlement.errors import ServiceError
from settlement.stack.airflow_api import AirflowApi
from settlement.stack.compose import Stack, pg_dsn
from settlement.stack.engine import Log

DAG = "eod_settlement"


def stack_settings(stack: Stack) -> Settings:
    """Settings that reach the stack from this host: Kafka as the auditor, the ledgers and
    the settlement database as the end of day's user (read-only here)."""
    env = stack.env()
    ca = str(stack.certs / "ca.crt")

    def dsn(db: str) -> str:
        return pg_dsn(env, "settle_eod", env["SETTLE_PG_SETTLEMENT_PASSWORD"], db, ca)

    return Settings(
        kafka_bootstrap=env["KAFKA_BOOTSTRAP"], kafka_security_protocol="SASL_SSL",
        kafka_sasl_mechanism="SCRAM-SHA-512", kafka_sasl_username="auditor",
        kafka_sasl_password=env["SETTLE_KAFKA_AUDITOR_PASSWORD"], kafka_ssl_ca_location=ca,
        topic=env.get("SETTLE_TOPIC", "trades"), partitions=int(env.get("SETTLE_PARTITIONS", "6")),
        pg_dsn=dsn("settlement"), ledger_a_dsn=dsn("ledger_a"), ledger_b_dsn=dsn("ledger_b"),
        ledger_shared_dsn=dsn("ledger_shared"),
    )


def publish_day(stack: Stack, trade_date: str, trades: int, seed: int) -> subprocess.Popen[str]:
    """The gateway container publishing the faulty day (in the background: sites consume it
    as it arrives)."""
    cmd = stack.compose_argv(
        "--profile", "simulator", "run", "--rm", "--no-deps", "gateway",
        "simulate", "--date", trade_date, "--trades", str(trades), "--seed", str(seed),
        "--dup-rate", "0.02", "--bad-rate", "0.005", "--abort-rate", "0.02", "--json")
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=stack.root)


def trigger_close(stack: Stack, trade_date: str, log: Log) -> tuple[AirflowApi, str]:
    env = stack.env()
    api = AirflowApi(env["AIRFLOW_BASE_URL"], "operations", env["AIRFLOW_OPERATIONS_PASSWORD"])
    api.wait_for_dag(DAG, timeout=300)
    api.call("PATCH", f"/api/v2/dags/{DAG}", {"is_paused": False})
    run_id = f"stack_drill__{trade_date}__{int(time.time())}"
    api.call("POST", f"/api/v2/dags/{DAG}/dagRuns", {
        "dag_run_id": run_id, "logical_date": None,
        "conf": {"trade_date": trade_date, "source": "auto"}})
    log(f"created {DAG} run {run_id} as operations (role Op)")
    return api, run_id


def published_run(settings: Settings, trade_date: str) -> int | None:
    with connect(settings.settlement_dsn, autocommit=True) as conn:
        row = conn.execute("select run_id from published_days where trade_date = %s",
                           (trade_date,)).fetchone()
    return int(row[0]) if row else None


def run_stack_drill(stack: Stack, trade_date: str, trades: int, log: Log, seed: int = 7,
                    kill_at: float = 0.4, close_timeout: float = 1200) -> dict[str, Any]:
    settings = stack_settings(stack)
    shared = settings.ledger_dsn("shared")
    if not wait_for_owners({"a": shared, "b": shared}, timeout=120):
        raise ServiceError("site-a and site-b do not both own partitions: is the stack up "
                           "(make stack-up) and are both sites healthy?")
    per_partition = day_share(trade_date, trades, seed, settings.partitions)
    log(f"publishing {trades} trades for {trade_date} from the gateway container...")
    gateway = publish_day(stack, trade_date, trades, seed)
    progress = wait_for_share(shared, "a", per_partition, kill_at, timeout=600,
                              trade_date=trade_date)
    stack.compose("kill", "-s", "SIGKILL", "site-a")
    log(f"killed site-a: {progress.describe()}")
    out, err = gateway.communicate(timeout=900)
    if gateway.returncode != 0:
        raise ServiceError(f"the gateway failed (exit {gateway.returncode}): {err[-2000:]}")
    api, run_id = trigger_close(stack, trade_date, log)
    run = api.wait_for_run(DAG, run_id, close_timeout, tick=log)
    day = read_kafka_day(settings, trade_date)
    check = check_ledger(shared, day, settings.topic)
    stack.compose("start", "site-a")
    published = published_run(settings, trade_date)
    env = stack.env()
    return {
        "trade_date": trade_date,
        "site_killed": "site-a",
        "killed_at": progress.describe(),
        "trade_messages": len(day.trades),  # valid committed copies, replays included
        "lost": len(check.lost),
        "duplicated": len(check.duplicated),
        "unexpected": len(check.unexpected),
        "missing_dead_letters": len(check.missing_dead_letters),
        "dag_run_id": run_id,
        "dag_run_state": run["state"],
        "published": published is not None,
        "published_run_id": published,
        "report_url": (f"{env['AIRFLOW_BASE_URL']}/settlement-reports/runs/{published}"
                       if published else None),
        "passed": bool(check.ok and run["state"] == "success" and published),
        "gateway": out.strip().splitlines()[-1] if out.strip() else None,
    }
