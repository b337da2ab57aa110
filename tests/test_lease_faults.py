"""The close lease under the faults a review found (issue 42): the definer function that ends
an expired close must end nothing else, a holder slowed while it publishes is never judged
expired, a liveness check that a reused PID cannot pass, a close that rides out a settlement
database restart, and a joiner that takes the date over from a holder that crashed. On the
real PostgreSQL, with closes in their own processes (tests/lease_worker.py)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from settlement.config import EMBEDDED_USERS
from settlement.db import connect
from settlement.eod import lease as close_lease
from tests.conftest import Isolated
from tests.test_close_lease import DAY, _acquire, _line, _published, _runs, _worker

pytestmark = pytest.mark.services


def _dbname(conn: psycopg.Connection) -> str:
    return str(conn.execute("select current_database()").fetchone()[0])  # type: ignore[index]


def _alive(conn: psycopg.Connection) -> bool:
    try:
        return conn.execute("select 1").fetchone() == (1,)
    except psycopg.OperationalError:
        return False


def _plant_expired_lease(attacker: psycopg.Connection, pid: int) -> None:
    """What the role holding EXECUTE can write: an expired lease row naming any pid."""
    attacker.execute(
        "insert into close_leases (trade_date, token, holder, backend_pid, expires_at)"
        " values (%s, nextval('close_lease_tokens'), 'attacker', %s,"
        "         now() - interval '1 hour')"
        " on conflict (trade_date) do update set backend_pid = excluded.backend_pid,"
        "     expires_at = excluded.expires_at, released_at = null", (DAY, pid))


def test_the_definer_function_ends_no_session_but_an_expired_close(isolated: Isolated) -> None:
    """The attack of the review: as the settlement login (which holds EXECUTE), a temporary
    view named pg_stat_activity lists a victim's pid as a 'settle-close' session and an
    expired lease row names it. Neither a site's ledger session nor a settlement session
    that does not hold the date's lock may be ended."""
    s = isolated.settings
    eod = s.for_component("settlement")
    with connect(s.for_component("admin").settlement_dsn, autocommit=True) as admin:
        # TEMP as every role had it before PUBLIC lost it: the function itself must resist.
        admin.execute(sql.SQL("grant temporary on database {} to {}").format(
            sql.Identifier(_dbname(admin)), sql.Identifier(EMBEDDED_USERS["settlement"])))
    site_victim = psycopg.connect(s.for_component("site_a").ledger_dsn("a"), autocommit=True,
                                  application_name="settle-site a")
    close_victim = psycopg.connect(eod.settlement_dsn, autocommit=True,
                                   application_name=f"settle-close {DAY}")
    attacker = psycopg.connect(eod.settlement_dsn, autocommit=True)
    try:
        for victim in (site_victim, close_victim):
            pid = victim.info.backend_pid
            attacker.execute(sql.SQL(
                "create or replace temporary view pg_stat_activity as select {}::integer as"
                " pid, 'settle-close x'::text as application_name,"
                " (select oid from pg_roles where rolname = 'settle_settlement') as usesysid"
            ).format(sql.Literal(pid)))
            _plant_expired_lease(attacker, pid)
            ended = attacker.execute("select end_expired_close(%s)", (DAY,)).fetchone()
            time.sleep(0.3)  # a terminated backend is gone within milliseconds
            assert ended == (False,) and _alive(victim), f"pid {pid} was ended"
    finally:
        for conn in (attacker, site_victim, close_victim):
            conn.close()


def test_only_the_sites_may_create_temporary_objects(isolated: Isolated) -> None:
    """TEMP is a PUBLIC default nothing revoked: the sites need it (their COPY stage), the
    settlement job and the auditors do not."""
    can = "select has_database_privilege(current_user, current_database(), 'TEMP')"
    for component, has in (("site_a", True), ("settlement", False), ("auditor", False)):
        s = isolated.settings.for_component(component)  # type: ignore[arg-type]
        for dsn in (s.settlement_dsn, s.ledger_dsn("a")):
            with connect(dsn) as conn:
                if component != "site_a" or "ledger" in _dbname(conn):
                    assert conn.execute(can).fetchone() == (has,), (component, dsn)


def test_the_fence_wants_the_dates_lock_held_not_just_a_live_pid(isolated: Isolated) -> None:
    """After a restart a new session can carry the lease session's old number: the fence
    must see the date's advisory lock held by that pid, not only that the pid lives."""
    from settlement.close.pipeline import publish, start_run
    from settlement.eod.model import SourceChoice

    s = isolated.settings.for_component("settlement")
    got, _ = _acquire(isolated.settings, ttl=300)  # no renewal during the test
    assert isinstance(got, close_lease.Lease)
    run = start_run(s, DAY, SourceChoice("db", "pid reuse"), got)
    got.attach(run)
    other = psycopg.connect(s.settlement_dsn, autocommit=True)
    try:
        with connect(isolated.settings.settlement_dsn, autocommit=True) as admin:
            admin.execute("select pg_terminate_backend(%s, 5000)", (got.conn.info.backend_pid,))
            admin.execute("update close_leases set backend_pid = %s where trade_date = %s",
                          (other.info.backend_pid, DAY))
        with pytest.raises(close_lease.LeaseLost, match="lost its lease session"):
            publish(s, run, DAY, None, got)
    finally:
        other.close()
        got.release()
    assert _published(s.settlement_dsn) is None


def _said(proc: Any, text: str, timeout: float) -> None:
    """Wait until a line of the worker's stderr holds ``text`` (bounded). The reader goes on
    draining stderr afterwards, so the worker never blocks on a full pipe."""
    found = threading.Event()

    def read() -> None:
        for line in proc.stderr:
            if text in line:
                found.set()

    threading.Thread(target=read, daemon=True).start()
    assert found.wait(timeout), f"the worker did not say {text!r} in {timeout}s"


def test_a_publication_slowed_past_the_lease_completes_and_stays_the_only_one(
        isolated: Isolated, tmp_path: Path) -> None:
    """The holder's publishing transaction locks the lease row for longer than the lease
    (its renewal waits on that row): a waiter must not judge it expired, end it and compute
    the day again. The waiter joins the holder's run; one run, one publication."""
    ttl = 3.0
    go = tmp_path / "go"
    holder = _worker(isolated.env, go, ttl=ttl, mode=f"slow-publish={ttl * 2.5}")
    held = _line(holder)
    waiter = _worker(isolated.env, go, ttl=ttl)
    # The waiter waits on the holder before the publication starts, so it is waiting all
    # through it. (Started a second into the publication instead, a waiter slow to start
    # on a loaded host, CI's phase 1, arrived after the holder had finished: a new close.)
    _said(waiter, "waiting for the close in progress", timeout=60)
    go.touch()
    assert _line(holder, timeout=60) == {"published": held["held"]}
    assert holder.wait(30) == 0
    assert _line(waiter, timeout=60) == {"joined": held["held"]}
    assert waiter.wait(30) == 0
    assert _runs(isolated.settings.settlement_dsn) == {held["held"]: ("succeeded", None)}
    assert _published(isolated.settings.settlement_dsn) == held["held"]


def test_a_joiner_whose_holder_crashed_takes_the_date_and_one_with_a_verdict_joins(
        isolated: Isolated, tmp_path: Path) -> None:
    """Site A's close fails for a transient reason: site B's close, waiting on it, computes
    the day itself (once) rather than fail too. A holder that reached a validation verdict
    is joined: the verdict is the day's, computing again would give it again."""
    go = tmp_path / "go"
    first = _worker(isolated.env, go, mode="crash")
    crashed = _line(first)["held"]
    threading.Timer(1.5, go.touch).start()  # crashes while this close waits on it
    got, said = _acquire(isolated.settings)
    try:
        assert isinstance(got, close_lease.Lease), got
        assert any(f"run {crashed}" in line and "failed" in line for line in said), said
    finally:
        got.release()
    assert first.wait(30) == 1
    assert _runs(isolated.settings.settlement_dsn)[crashed][0] == "failed"

    go2 = tmp_path / "go2"
    second = _worker(isolated.env, go2, mode="crash")
    verdict = _line(second)["held"]
    # The run as a validation failure leaves it: failed with a verdict (the admin is exempt
    # from the append-only rule and writes it as the validation step would).
    with connect(isolated.settings.settlement_dsn) as admin:
        admin.execute("update settlement_runs set validation_success = false where run_id = %s",
                      (verdict,))
        admin.commit()
    threading.Timer(1.5, go2.touch).start()
    joined, _ = _acquire(isolated.settings)
    assert isinstance(joined, close_lease.Joined) and joined.run_id == verdict, joined
    assert second.wait(30) == 1


def _restart_postgres(isolated: Isolated, down_seconds: float) -> None:
    from settlement.services.postgres import EmbeddedPostgres

    pg = EmbeddedPostgres(isolated.settings)
    pg.stop("immediate")
    time.sleep(down_seconds)
    pg.start()


@pytest.mark.exclusive  # restarts the PostgreSQL server every test shares
def test_a_close_rides_out_a_settlement_database_restart(isolated: Isolated,
                                                         tmp_path: Path) -> None:
    """A restart shorter than the lease: the holder reconnects and takes its own lease back
    (same token), the waiter reconnects and keeps waiting, then joins. One run, published
    once, nothing abandoned."""
    ttl = 12.0
    go = tmp_path / "go"
    holder = _worker(isolated.env, go, ttl=ttl)
    held = _line(holder)
    waiter = _worker(isolated.env, go, ttl=ttl)
    time.sleep(1.5)  # the waiter is waiting
    _restart_postgres(isolated, down_seconds=2.0)
    time.sleep(ttl / 3 + 2)  # the holder's next renewal finds the server back
    go.touch()
    out: dict[str, Any] = _line(holder, timeout=60)
    assert out == {"published": held["held"]}, out
    assert holder.wait(30) == 0
    assert _line(waiter, timeout=60) == {"joined": held["held"]}
    assert waiter.wait(30) == 0
    assert _runs(isolated.settings.settlement_dsn) == {held["held"]: ("succeeded", None)}
    assert _published(isolated.settings.settlement_dsn) == held["held"]
    with connect(isolated.settings.settlement_dsn) as conn:
        token = conn.execute("select token from close_leases where trade_date = %s",
                             (DAY,)).fetchone()
    assert token == (held["token"],)  # taken back, never taken over


def _marker(dsn: str, partition: int, offset: int, ingested: str) -> None:
    with connect(dsn) as conn:
        conn.execute("insert into close_markers (trade_date, kafka_partition, last_seq,"
                     " kafka_offset, site, ingested_at) values (%s, %s, 5, %s, 'a', " + ingested
                     + ")", (DAY, partition, offset))  # type: ignore[operator]
        conn.commit()


def test_settled_by_compares_marker_offsets_never_two_servers_clocks(
        isolated: Isolated) -> None:
    """A scheduled close skips a date a passing run published only if no ledger holds a close
    marker newer than those the run was chosen against. A ledger whose clock runs behind made
    a late marker look older than the run; an unreachable ledger is not 'nothing new'."""
    from settlement.close.pipeline import finish_run, publish, start_run
    from settlement.eod.model import LedgerState, MarkerAt, SourceChoice

    s = isolated.settings.for_component("settlement")
    ledger = isolated.settings.ledger_dsn("a")
    _marker(ledger, 0, 100, "now()")
    state = LedgerState("a", {0: MarkerAt(5, 100)}, {}, {})
    run = start_run(s, DAY, SourceChoice("db", "markers", ledgers=("a",), partitions=2,
                                         states={"a": state}))
    publish(s, run, DAY, None)
    finish_run(s, run, "succeeded", {})
    with connect(isolated.settings.settlement_dsn) as admin:
        admin.execute("update settlement_runs set validation_success = true where run_id = %s",
                      (run,))
        admin.commit()
    said: list[str] = []
    assert close_lease.settled_by(s, DAY, said.append) == run, said
    # Partition 1's marker arrives after the run, stamped by a ledger clock a day behind.
    _marker(ledger, 1, 205, "now() - interval '1 day'")
    assert close_lease.settled_by(s, DAY, said.append) is None
    assert "partitions 1" in said[-1], said
    # A ledger that cannot be asked may hold a marker nobody has seen.
    with connect(ledger) as conn:
        conn.execute("delete from close_markers where kafka_partition = 1")
        conn.commit()
    assert close_lease.settled_by(s, DAY) == run
    gone = s.model_copy(update={"ledger_b_dsn": "postgresql://nobody@127.0.0.1:1/ledger_b"})
    assert close_lease.settled_by(gone, DAY, said.append) is None
    assert "ledger b is unreachable" in said[-1], said


def test_a_close_whose_renewal_finds_the_lease_taken_stops_at_its_next_step(
        isolated: Isolated) -> None:
    """The renewal used to stop for good on its first error and tell nobody: the close went
    on computing a day it could not publish. Now it reconnects; finding the date taken over,
    it tells the close, which stops between its steps."""
    got, _ = _acquire(isolated.settings, ttl=3)
    assert isinstance(got, close_lease.Lease)
    try:
        got.ensure_held()
        with connect(isolated.settings.settlement_dsn, autocommit=True) as admin:
            # Another close took the date while this one's session was cut off.
            admin.execute("update close_leases set token = nextval('close_lease_tokens')"
                          " where trade_date = %s", (DAY,))
            admin.execute("select pg_terminate_backend(%s, 5000)", (got.conn.info.backend_pid,))
        deadline = time.monotonic() + 15
        while got.lost is None and time.monotonic() < deadline:
            time.sleep(0.2)
        with pytest.raises(close_lease.LeaseLost, match="took the date over"):
            got.ensure_held()
    finally:
        got.release()


def test_a_holder_renewed_on_another_server_gets_its_grace(isolated: Isolated,
                                                           tmp_path: Path) -> None:
    """After a failover the server a waiter asks is another member than the one the holder
    renewed on, and the holder's lease session ended with the old one, not with the holder.
    The row records where it was renewed (migration 0016): a waiter leaves such a holder its
    lease until it expires (before, it compared times with the new member's start, which
    predates the renewal, and took the date from a live holder). The failover is played on
    the one embedded server: the row's renewal moved to another incarnation, the holder's
    lease session ended; the holder, frozen meanwhile, then takes its lease back and
    publishes, alone."""
    import os
    import signal

    s = isolated.settings
    ttl = 12.0
    go = tmp_path / "go"
    holder = _worker(isolated.env, go, ttl=ttl)
    held = _line(holder)
    os.kill(holder.pid, signal.SIGSTOP)
    try:
        with connect(s.for_component("admin").settlement_dsn, autocommit=True) as admin:
            admin.execute("update close_leases set renewed_on = renewed_on - interval '1 day'"
                          " where trade_date = %s", (DAY,))
            ended = admin.execute(
                "select pg_terminate_backend(backend_pid) from close_leases"
                " where trade_date = %s", (DAY,)).fetchone()
        assert ended == (True,)
        with pytest.raises(close_lease.LeaseWaitTimeout):
            _acquire(s, ttl=ttl, wait=4)  # well inside the holder's lease
    finally:
        os.kill(holder.pid, signal.SIGCONT)
    time.sleep(ttl / 3 + 2)  # the holder's next renewal takes its lease back
    go.touch()
    assert _line(holder, timeout=60) == {"published": held["held"]}
    assert holder.wait(30) == 0
    assert _runs(s.settlement_dsn) == {held["held"]: ("succeeded", None)}
    assert _published(s.settlement_dsn) == held["held"]
