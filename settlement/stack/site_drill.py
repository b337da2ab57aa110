"""`make stack-drill FAULT=site-loss|site-freeze SITE=a`: a whole site lost or frozen on the
running stack.

site-loss: the settlement database's primary is first moved to the doomed site (a Patroni
switchover if needed), so that losing it exercises the failover. The gateway publishes the day;
once the site's consumer has committed ``kill_at`` of its share, every running container of
the site (broker, etcd member, cluster member, own server, consumer, Airflow) is SIGKILLed in
one command. Trading goes on; the other site's consumer takes the partitions over; its Airflow
runs the close (a run created through its REST API). Then the lost site is started again and
must rejoin by itself: its member a streaming replica of the new primary (pg_rewind where
needed), its broker back in every ISR, its consumer running.

site-freeze: the day is published whole; the doomed site's Airflow starts the close and, once
that close holds the date's lease, every container of the site is paused (docker pause) for
longer than the leases (Patroni's and the close's). The other site's Airflow closes the day
meanwhile; then the site wakes. The woken primary must be demoted and the woken close must not
publish (the fencing token): one publication, nothing lost, nothing twice.
"""

from __future__ import annotations

import re
import time
from collections import defaultdict
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from settlement.config import Settings
from settlement.db import connect, q
from settlement.drills.checker import (
    KafkaDay,
    check_ledger,
    day_share,
    read_kafka_day,
    wait_for_owners,
    wait_for_share,
)
from settlement.errors import ServiceError
from settlement.stack import sites
from settlement.stack.airflow_api import AirflowApi
from settlement.stack.compose import Stack, airflow_api, read_secrets
from settlement.stack.drill import DAG, publish_day, stack_settings
from settlement.stack.engine import Log
from settlement.stack.monitoring import AlertWatch, monitoring, wait_alert_quiet

FAULTS = ("site-loss", "site-freeze")
HOLDER_SITE = re.compile(r" site (\w+)$")


# -- steps --------------------------------------------------------------------------------------

def create_close(stack: Stack, site: str, trade_date: str, log: Log) -> tuple[AirflowApi, str]:
    """A run of eod_settlement for the date on ``site``'s Airflow, through its REST API as
    `operations` (role Op); that site's scheduler runs it."""
    api = airflow_api(stack, "operations", site)
    api.wait_for_dag(DAG, timeout=300)
    api.call("PATCH", f"/api/v2/dags/{DAG}", {"is_paused": False})
    run_id = f"site_drill__{trade_date}__{site}__{int(time.time())}"
    api.call("POST", f"/api/v2/dags/{DAG}/dagRuns", {
        "dag_run_id": run_id, "logical_date": None,
        "conf": {"trade_date": trade_date, "source": "auto"}})
    log(f"created {DAG} run {run_id} on site {site}'s Airflow")
    return api, run_id


def close_holder_site(settings: Settings, trade_date: str) -> str | None:
    """The site whose close holds the date's lease now (None: nobody, or not reachable)."""
    try:
        with connect(settings.settlement_dsn, autocommit=True, timeout=3) as conn:
            row = conn.execute(q("drill", "close_holder"), {"trade_date": trade_date}).fetchone()
    except Exception:  # noqa: BLE001 - the primary may be failing over: not known yet
        return None
    m = HOLDER_SITE.search(str(row[0])) if row else None
    return m.group(1) if m else None


def wait_holder(settings: Settings, trade_date: str, site: str, timeout: float) -> float:
    """Until ``site``'s close holds the date's lease; returns when (epoch seconds)."""
    deadline = time.monotonic() + timeout
    while close_holder_site(settings, trade_date) != site:
        if time.monotonic() > deadline:
            raise ServiceError(f"site {site}'s close did not take the lease of {trade_date} "
                               f"in {timeout:.0f} s")
        time.sleep(1)
    return time.time()


def ingest_gap(settings: Settings, survivor: str, since: float, timeout: float) -> float | None:
    """From ``since`` until the surviving site stored a trade again (its ledger's clock: the
    storing transaction's start); waits up to ``timeout`` for that first trade."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with connect(settings.ledger_dsn("shared"), autocommit=True) as conn:
                row = conn.execute(q("drill", "site_stored_after"),
                                   {"site": survivor, "after": since}).fetchone()
            if row and row[0] is not None:
                return round(float(row[0]) - since, 1)
        except Exception:  # noqa: BLE001 - the primary may still be failing over
            pass
        if time.monotonic() > deadline:
            return None
        time.sleep(1)


@dataclass(frozen=True)
class Publications:
    run_ids: tuple[int, ...]
    sites: tuple[str, ...]  # the site whose close published each


def publications(settings: Settings, trade_date: str) -> Publications:
    with connect(settings.settlement_dsn, autocommit=True) as conn:
        rows = conn.execute(q("drill", "publications"), {"trade_date": trade_date}).fetchall()
    found = [(int(r[0]), HOLDER_SITE.search(str(r[1] or ""))) for r in rows]
    return Publications(tuple(r for r, _ in found), tuple(m.group(1) if m else "?"
                                                          for _, m in found))


def wait_run(api: AirflowApi, run_id: str, timeout: float, log: Log) -> str:
    """The DAG run's final state, or its state when ``timeout`` ran out."""
    try:
        return str(api.wait_for_run(DAG, run_id, timeout, tick=log)["state"])
    except ServiceError as exc:
        log(str(exc))
        return str(api.call("GET", f"/api/v2/dags/{DAG}/dagRuns/{run_id}")["state"])


Net = dict[tuple[str, str], tuple[int, Decimal]]  # (account, symbol) -> net qty, net cash


def kafka_netting(day: KafkaDay) -> Net | None:
    """The day netted from Kafka's copies alone (read as the auditor), one leg per side of
    each distinct trade: the independent check of what the close published. None when the
    day carries amendments (their final state is the close's own computation)."""
    if day.amendments:
        return None
    net: dict[tuple[str, str], list[Any]] = defaultdict(lambda: [0, Decimal(0)])
    for t in day.rows.values():
        qty = int(t["quantity"])
        amount = Decimal(str(t["price"])) * qty
        bought, sold = net[(str(t["buyer"]), str(t["symbol"]))], net[(str(t["seller"]),
                                                                    str(t["symbol"]))]
        bought[0] += qty
        bought[1] -= amount
        sold[0] -= qty
        sold[1] += amount
    return {k: (int(qty), Decimal(cash)) for k, (qty, cash) in net.items()}


def published_positions(settings: Settings, trade_date: str) -> Net:
    with connect(settings.settlement_dsn, autocommit=True) as conn:
        rows = conn.execute(q("drill", "published_positions"), {"trade_date": trade_date})
        return {(str(acct), str(sym)): (int(qty), Decimal(cash))
                for acct, sym, qty, cash in rows}


def judge(settings: Settings, trade_date: str) -> dict[str, Any]:
    """The ledger against Kafka (read as the auditor) and what was published."""
    day = read_kafka_day(settings, trade_date)
    check = check_ledger(settings.ledger_dsn("shared"), day, settings.topic)
    netted = kafka_netting(day)
    published = published_positions(settings, trade_date)
    pubs = publications(settings, trade_date)
    with connect(settings.settlement_dsn, autocommit=True) as conn:
        statuses = {str(st): int(n) for st, n in conn.execute(
            q("drill", "run_statuses"), {"trade_date": trade_date})}
    return {"settlement_runs": statuses,
            # The published positions equal a netting of the day read from Kafka.
            "positions_match": None if netted is None else netted == published,
            "positions": len(published),"trade_messages": len(day.trades), "lost": len(check.lost),
            "duplicated": len(check.duplicated), "unexpected": len(check.unexpected),
            "ledger_ok": check.ok, "publications": len(pubs.run_ids),
            "published_run_id": pubs.run_ids[-1] if pubs.run_ids else None,
            "closed_by": pubs.sites[-1] if pubs.sites else None}


# A lost site's day is published over about this long: unpaced, an idle machine's site took
# a 5,000-trade day's whole share in one poll, so the kill "at 40%" came after the last trade
# (committed 1630 of 1630) and the survivor had nothing left to store (no ingest gap).
LOSS_DAY_S = 60


def start_trading(stack: Stack, settings: Settings, trade_date: str, trades: int,
                  seed: int, log: Log, rate: int | None = None) -> tuple[Any, dict[int, int]]:
    shared = settings.ledger_dsn("shared")
    if not wait_for_owners({"a": shared, "b": shared}, timeout=180):
        raise ServiceError("site-a and site-b do not both own partitions: is the stack up "
                           "(make stack-up) and are both sites healthy?")
    paced = f" at {rate} trades/s" if rate else ""
    log(f"publishing {trades} trades for {trade_date} from the gateway container{paced}...")
    return publish_day(stack, trade_date, trades, seed, rate), day_share(
        trade_date, trades, seed, settings.partitions)


def finish_trading(gateway: Any) -> str | None:
    out, err = gateway.communicate(timeout=1200)
    if gateway.returncode != 0:
        raise ServiceError(f"the gateway failed (exit {gateway.returncode}): {err[-2000:]}")
    return out.strip().splitlines()[-1] if out.strip() else None


# -- the drills ---------------------------------------------------------------------------------

def site_loss(stack: Stack, trade_date: str, trades: int, site: str, log: Log, seed: int = 7,
              kill_at: float = 0.4, close_timeout: float = 1500) -> dict[str, Any]:
    settings = stack_settings(stack)
    survivor = sites.other(site)
    before = sites.make_primary(stack, site, log)
    primary_before = sites.primary_site(stack)
    broker = sites.broker_of(stack, site)
    # The site's heartbeat alert quiet before the fault (an earlier drill's may still be
    # resolving), so that the watch below times this loss's alert.
    mon = monitoring(stack)
    quiet = wait_alert_quiet(mon, site)
    if quiet is None:
        log(f"site {site}'s heartbeat alert was still active before the kill")
    gateway, share = start_trading(stack, settings, trade_date, trades, seed, log,
                                   rate=max(1, trades // LOSS_DAY_S))
    progress = wait_for_share(settings.ledger_dsn("shared"), site, share, kill_at,
                              timeout=600, trade_date=trade_date)
    if progress.share and progress.committed >= progress.share:
        # Nothing of the day is left for the survivor to take over: killing now would wait
        # (600 s) for a trade that never comes. Seen with a 2,000-trade day, whose two
        # gateway transactions reached a late-starting consumer at once.
        finish_trading(gateway)
        raise ServiceError(f"the drill needs site {site} killed mid-day, but {progress.describe()}"
                           f" before it could be: run it with more trades (TRADES=5000, as "
                           f"make test does)")
    victims = sites.running_containers(site)
    t_kill = time.time()
    sites.docker_all(["kill", "-s", "KILL"], victims)
    probe = sites.WriteProbe(sites.member_dsn(stack, survivor)).start(t_kill)
    # Prometheus and Alertmanager live at the witness: they must tell the loss.
    alert = AlertWatch(mon, site).start(t_kill)
    log(f"killed site {site} ({', '.join(victims.services)}): {progress.describe()}")
    db_failover = probe.wait(300)
    log(f"the settlement database accepts writes at site {survivor} after {db_failover} s")
    gap = ingest_gap(settings, survivor, t_kill, timeout=600)
    log(f"site {survivor} stored a trade again {gap} s after the kill")
    gateway_out = finish_trading(gateway)
    t_close = time.time()
    api, run_id = create_close(stack, survivor, trade_date, log)
    state = wait_run(api, run_id, close_timeout, log)
    close_s = round(time.time() - t_close, 1)
    primary_after = sites.primary_site(stack, (survivor,))
    # The site stays lost until its loss is told (bounded: a silent alert fails the drill).
    if not alert.wait_raised(timeout=max(0.0, 240 - (time.time() - t_kill))):
        log(f"site {site}'s heartbeat alert was not raised within 240 s of the kill")
    t_start = time.time()
    sites.docker_all(["start"], victims)
    alert.restarted(t_start)
    log(f"started site {site} again")
    back = sites.wait_rejoined(stack, site, broker, t_start, timeout=600, log=log)
    alerted = alert.finish(timeout=300)
    log(f"site {site}'s heartbeat alert: fired {alerted.fired_s} s after the kill (for: "
        f"{alerted.for_s} s), in Alertmanager after {alerted.notified_s} s, resolved "
        f"{alerted.resolved_s} s after the restart")
    verdict = judge(settings, trade_date)
    published = verdict["published_run_id"]
    # The day's audit report, on site A's Airflow (back by now) like any report.
    base = read_secrets(stack)["airflow_url"]
    return {
        "fault": "site-loss", "site_lost": site, "trade_date": trade_date, **verdict,
        "report_url": f"{base}/settlement-reports/runs/{published}" if published else None,
        "dag_run_id": run_id, "dag_run_state": state, "close_s": close_s,
        "settlement_primary_initially": before,
        "settlement_primary_before": primary_before,
        "settlement_primary_after": primary_after,
        "db_failover_s": db_failover, "ingest_gap_s": gap,
        "killed_at": progress.describe(), "killed": list(victims.services),
        "rejoined": back.rejoined, "rejoin_s": back.seconds, "rejoined_member": back.member,
        "partitions_out_of_isr": back.partitions_out_of_isr,
        "gateway": gateway_out, **alerted.as_json(),
        "passed": bool(verdict["ledger_ok"] and state == "success"
                       and verdict["positions_match"] is not False
                       and verdict["publications"] == 1 and verdict["closed_by"] == survivor
                       and primary_before == site and primary_after == survivor
                       and back.rejoined and alerted.passed),
    }


def site_freeze(stack: Stack, trade_date: str, trades: int, site: str, log: Log,
                seed: int = 7, frozen_at_least: float = 60,
                close_timeout: float = 1500) -> dict[str, Any]:
    settings = stack_settings(stack)
    survivor = sites.other(site)
    sites.make_primary(stack, site, log)
    primary_before = sites.primary_site(stack)
    broker = sites.broker_of(stack, site)
    gateway, _ = start_trading(stack, settings, trade_date, trades, seed, log)
    gateway_out = finish_trading(gateway)
    api_frozen, run_frozen = create_close(stack, site, trade_date, log)
    wait_holder(settings, trade_date, site, timeout=900)
    victims = sites.running_containers(site)
    t_freeze = time.time()
    sites.docker_all(["pause"], victims)
    probe = sites.WriteProbe(sites.member_dsn(stack, survivor)).start(t_freeze)
    log(f"froze site {site} ({', '.join(victims.services)}) while its close held the lease")
    t_close = time.time()
    api, run_id = create_close(stack, survivor, trade_date, log)
    db_failover = probe.wait(300)
    log(f"the settlement database accepts writes at site {survivor} after {db_failover} s")
    # Frozen past both leases, and until the survivor's close has taken the date's lease over:
    # the frozen close then wakes up into a close that is no longer its own.
    wait_holder(settings, trade_date, survivor, timeout=900)
    time.sleep(max(0.0, t_freeze + frozen_at_least - time.time()))
    sites.docker_all(["unpause"], victims)
    t_wake = time.time()
    frozen_s = round(t_wake - t_freeze, 1)
    log(f"woke site {site} after {frozen_s} s")
    demoted_s = _wait_demoted(stack, site, t_wake, timeout=180)
    log(f"site {site}'s woken member is a standby after {demoted_s} s")
    back = sites.wait_rejoined(stack, site, broker, t_wake, timeout=600, log=log)
    state = wait_run(api, run_id, close_timeout, log)
    close_s = round(time.time() - t_close, 1)
    woken_state = wait_run(api_frozen, run_frozen, 600, log)
    primary_after = sites.primary_site(stack)
    verdict = judge(settings, trade_date)
    return {
        "fault": "site-freeze", "site_lost": site, "trade_date": trade_date, **verdict,
        "dag_run_id": run_id, "dag_run_state": state, "close_s": close_s,
        "frozen_dag_run_id": run_frozen, "frozen_dag_run_state": woken_state,
        "settlement_primary_before": primary_before,
        "settlement_primary_after": primary_after,
        "woken_primary_demoted": demoted_s is not None, "demoted_s": demoted_s,
        "db_failover_s": db_failover, "ingest_gap_s": None, "frozen_s": frozen_s,
        "frozen": list(victims.services),
        "rejoined": back.rejoined, "rejoin_s": back.seconds, "rejoined_member": back.member,
        "partitions_out_of_isr": back.partitions_out_of_isr,
        "gateway": gateway_out,
        "passed": bool(verdict["ledger_ok"] and state == "success"
                       and verdict["positions_match"] is not False
                       and verdict["publications"] == 1 and demoted_s is not None
                       and primary_before == site and primary_after == survivor
                       and back.rejoined),
    }


def _wait_demoted(stack: Stack, site: str, t0: float, timeout: float) -> float | None:
    """Seconds from ``t0`` until the woken member's server is a standby (asked directly, not
    through Patroni); None if it still was not after ``timeout``."""
    dsn = sites.member_dsn(stack, site)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sites.in_recovery(dsn) is True:
            return round(time.time() - t0, 1)
        time.sleep(0.5)
    return None


def run_site_drill(stack: Stack, fault: str, site: str, trade_date: str, trades: int,
                   log: Log, seed: int = 7) -> dict[str, Any]:
    if fault not in FAULTS:
        raise ServiceError(f"FAULT={fault}: expected one of {', '.join(FAULTS)}")
    if site not in sites.MEMBERS:
        raise ServiceError(f"SITE={site}: expected a or b")
    drill = site_loss if fault == "site-loss" else site_freeze
    return drill(stack, trade_date, trades, site, log, seed=seed)
