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
from settlement.stack.compose import Stack, airflow_api, pg_dsn, read_secrets
from settlement.stack.engine import Log

DAG = "eod_settlement"


def stack_settings(stack: Stack) -> Settings:
    """Settings that reach the stack from this host: Kafka as the auditor, the ledgers and
    the settlement database as the end of day's user (read-only here)."""
    env = stack.env()
    ca = str(stack.certs / "ca.crt")

    def dsn(db: str, address: str | None = None) -> str:
        return pg_dsn(env, "settle_eod", env["SETTLE_PG_SETTLEMENT_PASSWORD"], db, ca, address)

    return Settings(
        kafka_bootstrap=env["KAFKA_BOOTSTRAP"], kafka_security_protocol="SASL_SSL",
        kafka_sasl_mechanism="SCRAM-SHA-512", kafka_sasl_username="auditor",
        kafka_sasl_password=env["SETTLE_KAFKA_AUDITOR_PASSWORD"], kafka_ssl_ca_location=ca,
        topic=env.get("SETTLE_TOPIC", "trades"), partitions=int(env.get("SETTLE_PARTITIONS", "6")),
        # ledger_a and ledger_b live on each site's own server, not in the cluster.
        pg_dsn=dsn("settlement"), ledger_a_dsn=dsn("ledger_a", env["PG_SITE_A_ADDRESS"]),
        ledger_b_dsn=dsn("ledger_b", env["PG_SITE_B_ADDRESS"]),
        ledger_shared_dsn=dsn("ledger_shared"),
    )


def publish_day(stack: Stack, trade_date: str, trades: int, seed: int,
                rate: int | None = None) -> subprocess.Popen[str]:
    """The gateway container publishing the faulty day (in the background: sites consume it
    as it arrives), paced at ``rate`` trades/s if given."""
    pace = ("--rate", str(rate)) if rate else ()
    cmd = stack.compose_argv(
        "--profile", "simulator", "run", "--rm", "--no-deps", "gateway",
        "simulate", "--date", trade_date, "--trades", str(trades), "--seed", str(seed),
        "--dup-rate", "0.02", "--bad-rate", "0.005", "--abort-rate", "0.25", *pace, "--json")
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=stack.root)


def operations_api(stack: Stack) -> AirflowApi:
    """Airflow's REST API as `operations` (role Op: may unpause and create runs), its login
    from the secrets file `make stack-up` wrote, over HTTPS verified against the stack's CA."""
    return airflow_api(stack, "operations")


def trigger_close(stack: Stack, trade_date: str, log: Log) -> tuple[AirflowApi, str]:
    api = operations_api(stack)
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


def play_day(stack: Stack, settings: Settings, trade_date: str, trades: int, seed: int,
             victim: str, kill_at: float, log: Log, restart: bool) -> dict[str, Any]:
    """Publish the day from the gateway container and SIGKILL ``victim`` (site-a or site-b)
    once it has committed ``kill_at`` of its share; ``restart``: start it again once the
    gateway is done (the other site has taken its partitions over meanwhile)."""
    shared = settings.ledger_dsn("shared")
    if not wait_for_owners({"a": shared, "b": shared}, timeout=120):
        raise ServiceError("site-a and site-b do not both own partitions: is the stack up "
                           "(make stack-up) and are both sites healthy?")
    per_partition = day_share(trade_date, trades, seed, settings.partitions)
    log(f"publishing {trades} trades for {trade_date} from the gateway container...")
    gateway = publish_day(stack, trade_date, trades, seed)
    progress = wait_for_share(shared, victim.removeprefix("site-"), per_partition, kill_at,
                              timeout=600, trade_date=trade_date)
    stack.compose("kill", "-s", "SIGKILL", victim)
    log(f"killed {victim}: {progress.describe()}")
    out, err = gateway.communicate(timeout=900)
    if gateway.returncode != 0:
        raise ServiceError(f"the gateway failed (exit {gateway.returncode}): {err[-2000:]}")
    if restart:
        stack.compose("start", victim)
        log(f"started {victim} again")
    return {"site_killed": victim, "killed_at": progress.describe(),
            "gateway": out.strip().splitlines()[-1] if out.strip() else None}


def check_day(stack: Stack, settings: Settings, trade_date: str,
              run: dict[str, Any]) -> dict[str, Any]:
    """The ledger against Kafka for the day, and what the close published."""
    day = read_kafka_day(settings, trade_date)
    check = check_ledger(settings.ledger_dsn("shared"), day, settings.topic)
    published = published_run(settings, trade_date)
    base = read_secrets(stack)["airflow_url"]
    return {
        "trade_date": trade_date,
        "trade_messages": len(day.trades),  # valid committed copies, replays included
        "lost": len(check.lost),
        "duplicated": len(check.duplicated),
        "unexpected": len(check.unexpected),
        "missing_dead_letters": len(check.missing_dead_letters),
        "dag_run_id": run["dag_run_id"],
        "dag_run_state": run["state"],
        "published": published is not None,
        "published_run_id": published,
        "report_url": f"{base}/settlement-reports/runs/{published}" if published else None,
        "passed": bool(check.ok and run["state"] == "success" and published),
    }


def run_stack_drill(stack: Stack, trade_date: str, trades: int, log: Log, seed: int = 7,
                    kill_at: float = 0.4, close_timeout: float = 1200) -> dict[str, Any]:
    settings = stack_settings(stack)
    played = play_day(stack, settings, trade_date, trades, seed, "site-a", kill_at, log,
                      restart=False)
    api, run_id = trigger_close(stack, trade_date, log)
    run = api.wait_for_run(DAG, run_id, close_timeout, tick=log)
    result = {**check_day(stack, settings, trade_date, run), **played}
    stack.compose("start", "site-a")  # the stack whole again
    return result
