"""`make stack-drill FAULT=site-partition|standby-partition|witness-partition SITE=a`: a
location cut off alive (settlement/stack/netcut.py: its packets to the others, and theirs to
it, dropped), then healed.

site-partition: site A holds the settlement primary; mid-day (40% of its consumer's share in)
it is cut off from site B and the witness, both ways. Everything at A keeps running: its
consumer, its broker, its member, its Airflow. The cut-off primary must demote itself (it can
no longer renew its leader key), B's member must take writes, B's consumer must take A's
partitions, and B's Airflow closes the day. Meanwhile a writer on the host keeps committing
to A's member directly: whatever A acknowledged must still be there after the heal
(`acknowledged_then_lost` 0). Then the cut heals and A must rejoin by itself. With AT=close
the cut comes instead once the day is in and A's own close holds the date's lease: that close
runs on, cut off, and must never publish. At ingest the drill ends by cutting A off again, as
the standby's site now, for half a minute, timing commits on B (`commit_stall_s`).

standby-partition: the standby's site (SITE) is cut off while the other holds the primary;
commits on the primary stall until the standby leaves the synchronous set, then go on
(`commit_stall_s`). witness-partition: the witness is cut off; nothing should stall beyond
Kafka's replica timeout. Both close the day at the primary's site and heal.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import psycopg

from settlement.db import open_connection
from settlement.drills.checker import wait_for_share
from settlement.errors import ServiceError
from settlement.stack import netcut, sites
from settlement.stack.compose import Stack
from settlement.stack.drill import stack_settings
from settlement.stack.engine import Log
from settlement.stack.site_drill import (
    LOSS_DAY_S,
    create_close,
    finish_trading,
    ingest_gap,
    judge,
    start_trading,
    wait_holder,
    wait_run,
)

PROBE_DB = "settle_drill_probe"


def admin_dsn(stack: Stack, sites_: tuple[str, ...], db: str) -> str:
    """The cluster's admin on the members of ``sites_`` (in order), TLS verified, with the
    admin's client certificate (no server takes the admin over TCP without it)."""
    from settlement.stack import envfile

    env = stack.env()
    hosts = ",".join(f"127.0.0.1:{envfile.PG_PORTS[0 if s == 'a' else 1]}" for s in sites_)
    return (f"postgresql://settle:{env['SETTLE_PG_ADMIN_PASSWORD']}@{hosts}/{db}"
            f"?sslmode=verify-full&sslrootcert={stack.certs / 'ca.crt'}"
            f"&sslcert={stack.certs / 'postgres-admin-operator.crt'}"
            f"&sslkey={stack.certs / 'postgres-admin-operator.key'}")


@dataclass
class AckProbe:
    """Commits rows (numbered by the server) to one member (no statement timeout: a commit
    waiting for its synchronous standby is never cancelled into a local-only success) and
    notes each one the server acknowledged, with when it was sent and acknowledged."""

    dsn: str
    acked: list[tuple[int, float, float]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    @staticmethod
    def prepare(cluster_dsn: str) -> None:
        with open_connection(cluster_dsn.replace("/settlement?", "/postgres?")
                             + "&target_session_attrs=read-write", autocommit=True) as conn:
            if conn.execute("select 1 from pg_database where datname = %s",
                            (PROBE_DB,)).fetchone() is None:
                conn.execute(f"create database {PROBE_DB}")
        with open_connection(cluster_dsn.replace("/settlement?", f"/{PROBE_DB}?")
                             + "&target_session_attrs=read-write", autocommit=True) as conn:
            conn.execute("drop table if exists acks")
            conn.execute("create table acks (id bigserial primary key, at timestamptz "
                         "not null default now())")

    def start(self) -> AckProbe:
        self._thread = threading.Thread(target=self._run, daemon=True, name="ack-probe")
        self._thread.start()
        return self

    def _run(self) -> None:
        # The server numbers the rows: probes one after the other share the table.
        while not self._stop.is_set():
            try:
                with open_connection(self.dsn, timeout=3, autocommit=True) as conn:
                    while not self._stop.is_set():
                        sent = time.time()
                        row = conn.execute("insert into acks default values returning id"
                                           ).fetchone()
                        if row is not None:
                            self.acked.append((int(row[0]), sent, time.time()))
                        time.sleep(0.2)
            except psycopg.Error:
                time.sleep(0.5)  # read-only (demoted), unreachable: try again

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(60)

    def stall_after(self, t0: float) -> float | None:
        """The longest wait for an acknowledgement from ``t0`` on: from ``t0`` (or the
        previous acknowledgement) to the next one. None if none came after ``t0``."""
        times = [t0] + [acked for _, _, acked in self.acked if acked >= t0]
        if len(times) < 2:
            return None
        return round(max(b - a for a, b in zip(times, times[1:], strict=False)), 1)

    def lost(self, cluster_dsn: str) -> int:
        """Acknowledged rows missing from the cluster's primary now."""
        with open_connection(cluster_dsn.replace("/settlement?", f"/{PROBE_DB}?")
                             + "&target_session_attrs=read-write", autocommit=True) as conn:
            there = {int(r[0]) for r in conn.execute("select id from acks")}
        return len({n for n, _, _ in self.acked} - there)


def wait_refusing_writes(dsn: str, t0: float, timeout: float) -> float | None:
    """Seconds from ``t0`` until the server behind ``dsn`` (one member, asked from the host,
    which no cut separates from it) no longer takes writes: a standby, or stopped (Patroni
    demotes a primary that lost etcd "offline": it stops it until it knows the leader)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sites.in_recovery(dsn) is not False:
            return round(time.time() - t0, 1)
        time.sleep(0.5)
    return None


def standby_cut(stack: Stack, standby: str, primary: str, broker: int, log: Log,
                cut_s: float = 30) -> tuple[float | None, int, bool]:
    """Cut the standby's site off for ``cut_s`` while a writer commits on the primary: the
    longest wait for a commit after the cut, how many commits were acknowledged, and
    whether the site was whole again after the heal (the next drill switches over to it)."""
    acks = AckProbe(admin_dsn(stack, (primary,), PROBE_DB)).start()
    others = tuple(x for x in ("a", "b", "witness") if x != standby)
    with netcut.partitioned(standby, others, log) as cut:
        time.sleep(cut_s)
        stall = acks.stall_after(cut.at)
    acks.stop()
    log(f"with site {standby} (the standby's) cut off, commits on site {primary}'s member "
        f"waited at most {stall} s")
    back = sites.wait_rejoined(stack, standby, broker, time.time(), timeout=600, log=log)
    return stall, len(acks.acked), back.rejoined


def site_partition(stack: Stack, trade_date: str, trades: int, site: str, log: Log,
                   seed: int = 7, at: str = "ingest", cut_at: float = 0.4,
                   close_timeout: float = 1500) -> dict[str, Any]:
    """``site`` (the primary's) cut off alive during ingest, or while its own close holds
    the date's lease (``at="close"``); the other site's Airflow closes the day; the cut
    heals and the site must rejoin; then, as the standby's site now, it is cut off again
    for half a minute while commits on the new primary are timed."""
    settings = stack_settings(stack)
    survivor = sites.other(site)
    sites.make_primary(stack, site, log)
    primary_before = sites.primary_site(stack)
    broker = sites.broker_of(stack, site)
    both = admin_dsn(stack, (site, survivor), "settlement")
    AckProbe.prepare(both)
    acks = AckProbe(admin_dsn(stack, (site,), PROBE_DB)).start()
    gateway, share = start_trading(stack, settings, trade_date, trades, seed, log,
                                   rate=max(1, trades // LOSS_DAY_S) if at == "ingest" else None)
    cut_close: tuple[Any, str] | None = None
    if at == "ingest":
        progress = wait_for_share(settings.ledger_dsn("shared"), site, share, cut_at,
                                  timeout=600, trade_date=trade_date).describe()
        gateway_out = None
    else:
        gateway_out = finish_trading(gateway)
        cut_close = create_close(stack, site, trade_date, log)
        wait_holder(settings, trade_date, site, timeout=900)
        progress = f"site {site}'s close held the lease of {trade_date}"
    with netcut.partitioned(site, (survivor, "witness"), log) as cut:
        probe = sites.WriteProbe(sites.member_dsn(stack, survivor)).start(cut.at)
        log(f"site {site} cut off: {progress}")
        demoted_s = wait_refusing_writes(sites.member_dsn(stack, site), cut.at, timeout=180)
        log(f"site {site}'s cut-off member stopped taking writes after {demoted_s} s")
        db_failover = probe.wait(300)
        log(f"site {survivor}'s member takes writes {db_failover} s after the cut")
        gap = None
        if at == "ingest":
            gap = ingest_gap(settings, survivor, cut.at, timeout=600)
            log(f"site {survivor} stored a trade {gap} s after the cut")
            gateway_out = finish_trading(gateway)
        api, run_id = create_close(stack, survivor, trade_date, log)
        state = wait_run(api, run_id, close_timeout, log)
        acks.stop()
        primary_after = sites.primary_site(stack, (survivor,))
    t_heal = time.time()
    back = sites.wait_rejoined(stack, site, broker, t_heal, timeout=600, log=log)
    cut_state = None if cut_close is None else wait_run(*cut_close, 600, log)
    lost_acks = acks.lost(both)
    log(f"{len(acks.acked)} writes acknowledged by site {site}'s member, {lost_acks} missing "
        "after the heal")
    # At ingest only (CI's hour): the closing cut of the standby's site.
    stall, stall_acks, whole = (standby_cut(stack, site, survivor, broker, log)
                                if at == "ingest" and back.rejoined else (None, 0, back.rejoined))
    verdict = judge(settings, trade_date)
    return {
        "fault": "site-partition", "at": at, "site_lost": site, "trade_date": trade_date,
        **verdict, "dag_run_id": run_id, "dag_run_state": state,
        "cut_dag_run_state": cut_state,
        "settlement_primary_before": primary_before, "settlement_primary_after": primary_after,
        "cut_at": progress, "acknowledged": len(acks.acked),
        "acknowledged_then_lost": lost_acks, "db_failover_s": db_failover,
        "ingest_gap_s": gap, "demoted_s": demoted_s,
        "heal_s": back.seconds, "rejoined": back.rejoined, "rejoined_member": back.member,
        "partitions_out_of_isr": back.partitions_out_of_isr,
        "commit_stall_s": stall, "standby_cut_commits": stall_acks,
        "whole_after_standby_cut": whole, "gateway": gateway_out,
        "passed": bool(verdict["ledger_ok"] and state == "success"
                       and verdict["positions_match"] is not False
                       and verdict["publications"] == 1 and verdict["closed_by"] == survivor
                       and primary_before == site and primary_after == survivor
                       and demoted_s is not None and lost_acks == 0 and back.rejoined
                       and whole and (at != "ingest" or (stall is not None and stall_acks > 0))
                       and cut_state in (None, "success", "failed")),
    }


def quiet_partition(stack: Stack, fault: str, trade_date: str, trades: int, isolated: str,
                    primary: str, log: Log, seed: int = 7, cut_s: float = 45,
                    close_timeout: float = 1500) -> dict[str, Any]:
    """``isolated`` (the standby's site, or the witness) cut off while ``primary``'s member
    stays the primary: commits stall until the standby leaves the synchronous set, ingest
    and the close go on at the primary's site."""
    settings = stack_settings(stack)
    sites.make_primary(stack, primary, log)
    others = tuple(x for x in ("a", "b", "witness") if x != isolated)
    both = admin_dsn(stack, (primary, sites.other(primary)), "settlement")
    AckProbe.prepare(both)
    acks = AckProbe(admin_dsn(stack, (primary,), PROBE_DB)).start()
    gateway, share = start_trading(stack, settings, trade_date, trades, seed, log,
                                   rate=max(1, trades // LOSS_DAY_S))
    wait_for_share(settings.ledger_dsn("shared"), primary, share, 0.3, timeout=600,
                   trade_date=trade_date)
    broker = sites.broker_of(stack, isolated) if isolated in sites.MEMBERS else None
    with netcut.partitioned(isolated, others, log) as cut:
        time.sleep(cut_s)  # long past the timeouts that should end any stall
        stall = acks.stall_after(cut.at)
        log(f"commits on site {primary}'s member stalled at most {stall} s after the cut")
        gateway_out = finish_trading(gateway)
        api, run_id = create_close(stack, primary, trade_date, log)
        state = wait_run(api, run_id, close_timeout, log)
        acks.stop()
    t_heal = time.time()
    back = None if broker is None else sites.wait_rejoined(stack, isolated, broker, t_heal,
                                                           timeout=600, log=log)
    lost_acks = acks.lost(both)
    verdict = judge(settings, trade_date)
    return {
        "fault": fault, "site_lost": isolated, "trade_date": trade_date, **verdict,
        "dag_run_id": run_id, "dag_run_state": state,
        "settlement_primary_after": sites.primary_site(stack),
        "acknowledged": len(acks.acked), "acknowledged_then_lost": lost_acks,
        "db_failover_s": None, "ingest_gap_s": None, "commit_stall_s": stall,
        "demoted_s": None, "heal_s": back.seconds if back else None,
        "rejoined": back.rejoined if back else True, "gateway": gateway_out,
        "passed": bool(verdict["ledger_ok"] and state == "success"
                       and verdict["positions_match"] is not False
                       and verdict["publications"] == 1 and verdict["closed_by"] == primary
                       and stall is not None and lost_acks == 0
                       and (back is None or back.rejoined)),
    }


def run_partition_drill(stack: Stack, fault: str, site: str, trade_date: str, trades: int,
                        log: Log, seed: int = 7, at: str = "ingest") -> dict[str, Any]:
    if at not in ("ingest", "close"):
        raise ServiceError(f"AT={at}: expected ingest or close")
    if fault == "site-partition":
        return site_partition(stack, trade_date, trades, site, log, seed=seed, at=at)
    if fault == "standby-partition":
        return quiet_partition(stack, fault, trade_date, trades, site, sites.other(site), log,
                               seed=seed)
    # The witness cut off: the primary stays wherever it is (site SITE's member made it).
    return quiet_partition(stack, fault, trade_date, trades, "witness", site, log, seed=seed)
