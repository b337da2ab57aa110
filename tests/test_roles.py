"""Least privilege on the real server: every component logs in as its own user (SCRAM over
TCP), holds exactly its group role, and is refused everything wider than its work."""

from __future__ import annotations

import psycopg
import pytest

from settlement.config import COMPONENT_GROUPS, COMPONENTS, EMBEDDED_USERS, Settings
from settlement.db import connect
from tests.conftest import Isolated

pytestmark = pytest.mark.services

DAY = "2026-11-23"
TRADE = ("insert into trades (trade_id, trade_date, seq, kafka_partition, kafka_offset,"
         " symbol, price, quantity, buyer, seller, executed_at, site) values"
         " ('R1', '2026-11-23', 1, 0, 0, 'AAPL', 1.5, 10, 'A', 'B', now(), 'a')")
# A day's partition of `trades` (sql/migrations/0023): the sites and the close may add one.
PARTITION = "select ensure_trade_partitions(array['2026-11-23'::date])"
# The month's partitions of the close's tables (sql/migrations/0024): the close's to add.
MONTH = "select ensure_settlement_partitions(array['2026-11-23'::date])"
POSITION = "insert into positions values ('2026-11-23', 'A', 'AAPL', 1, 0, 1, 1.5, 0, -1.5, 1)"
DEAD = ("insert into dead_letters (topic, kafka_partition, kafka_offset, raw, reason, site)"
        " values ('t', 0, 1, '\\x00', 'bad', 'a')")
MARKER = ("insert into close_markers (trade_date, kafka_partition, last_seq, kafka_offset, site)"
          " values ('2026-11-23', 0, 1, 2, 'a')")
BATCH = ("insert into ingest_batches (site, messages, inserted, duplicates, dead_letters,"
         " close_markers, partitions, duration_ms) values ('a', 1, 1, 0, 0, 0, '{0}', 1.5)")
HEARTBEAT = ("insert into site_heartbeats (site, scheme, partitions, trades_total)"
             " values ('a', 'shared', '{0}', 1)")
OFFSET = ("insert into consumer_offsets (consumer_group, topic, kafka_partition, next_offset,"
          " site) values ('g', 't', 0, 0, 'a')")


def _run(settings: Settings, component: str, *statements: str, db: str = "ledger_a") -> None:
    """Run ``statements`` in one transaction as ``component``'s own login user."""
    s = settings.for_component(component)  # type: ignore[arg-type]
    dsn = s.settlement_dsn if db == "settlement" else s.ledger_dsn(db.removeprefix("ledger_"))
    with connect(dsn) as conn:
        for sql in statements:
            conn.execute(sql)  # type: ignore[arg-type]
        conn.commit()


def _refused(settings: Settings, component: str, sql: str, db: str = "ledger_a") -> str:
    with pytest.raises(psycopg.errors.InsufficientPrivilege) as err:
        _run(settings, component, sql, db=db)
    return str(err.value)


def test_each_component_logs_in_as_its_own_user_with_only_its_group(
        isolated: Isolated) -> None:
    for component in COMPONENTS:
        dsn = isolated.settings.for_component(component).ledger_dsn("a")
        assert "password" not in dsn.split("?")[0]  # the DSN carries no secret
        with connect(dsn) as conn:
            user, superuser = conn.execute(
                "select current_user, rolsuper from pg_roles where rolname = current_user"
            ).fetchone()
            groups = {r[0] for r in conn.execute(
                "select g.rolname from pg_auth_members m join pg_roles g on g.oid = m.roleid"
                " where m.member = (select oid from pg_roles where rolname = current_user)")}
        assert user == EMBEDDED_USERS[component]
        if component == "admin":
            assert superuser
        else:
            assert not superuser and groups == {COMPONENT_GROUPS[component]}


def test_tcp_logins_need_the_right_password(isolated: Isolated) -> None:
    port = isolated.settings.pg_port
    for password in ("wrong", None):
        with pytest.raises(psycopg.OperationalError, match="password"):
            psycopg.connect(host="127.0.0.1", port=port, dbname="postgres",
                            user=EMBEDDED_USERS["admin"], password=password,
                            passfile="/nonexistent", connect_timeout=5).close()


def test_sites_append_and_move_only_their_offsets(isolated: Isolated) -> None:
    s = isolated.settings
    for site in ("site_a", "site_b"):
        _run(s, site, PARTITION, TRADE.replace("'R1'", f"'R-{site}'"),
             f"insert into trade_ids values ('R-{site}', '2026-11-23', 0, 0)")
    _run(s, "site_a", DEAD, MARKER, BATCH, HEARTBEAT, OFFSET,
         "create temp table stage (like trades)",
         "update consumer_offsets set next_offset = 5 where consumer_group = 'g'",
         "select * from consumer_offsets for update",
         "delete from site_heartbeats where beat_at < now() - interval '7 days'")
    for table in ("trades", "dead_letters", "close_markers", "ingest_batches",
                  "site_heartbeats"):
        assert "permission denied" in _refused(s, "site_a", f"update {table} set site = 'x'")
    for table in ("trades", "dead_letters", "close_markers", "ingest_batches",
                  "consumer_offsets", "data_loss_events"):
        _refused(s, "site_a", f"delete from {table}")
    for sql in (POSITION, "delete from settlement_runs", "truncate trades",
                "create table evil (x int)", "copy (select 1) to program 'true'",
                "alter table trades add column evil int", "create role evil",
                "select drop_trade_partition('2026-11-23')",
                "alter table trades detach partition trades_20261123",
                "delete from trade_ids", "update trade_ids set trade_date = '2026-01-01'",
                MONTH):
        _refused(s, "site_b", sql)


def _run_row(settings: Settings) -> int:
    with connect(settings.for_component("settlement").settlement_dsn) as conn:
        run_id = conn.execute(
            "insert into settlement_runs (trade_date, source, source_reason, status)"
            " values (%s, 'kafka', 'test', 'running') returning run_id", (DAY,)).fetchone()[0]
        conn.commit()
    return int(run_id)


def test_the_audit_trail_is_append_only_except_for_the_admin(isolated: Isolated) -> None:
    s = isolated.settings
    run_id = _run_row(s)
    where = f"where run_id = {run_id}"
    # A running run is finished, then its empty columns are filled (validation, publication).
    _run(s, "settlement", f"update settlement_runs set status = 'succeeded', trades = 3,"
                          f" finished_at = now() {where}",
         f"update settlement_runs set validation_success = true, report_path = '/r' {where}",
         f"update settlement_runs set published_at = now() {where}",
         f"insert into audit_reports values ('{DAY}', {run_id}, now(), '{{}}', '/r')",
         MONTH, POSITION, "delete from positions", db="settlement")
    # Nothing recorded may change, and nothing may be deleted.
    for sql in (f"update settlement_runs set trades = 4 {where}",
                f"update settlement_runs set status = 'failed' {where}",
                f"update settlement_runs set report_path = '/forged' {where}",
                f"update settlement_runs set trade_date = '2026-01-01' {where}"):
        assert "append-only" in _refused(s, "settlement", sql, db="settlement")
    for sql in (f"delete from settlement_runs {where}", "delete from audit_reports",
                "update audit_reports set html_path = '/forged'", "truncate audit_reports"):
        assert "permission denied" in _refused(s, "settlement", sql, db="settlement")
    # The close adds a month (MONTH above); it may not take one away.
    for sql in ("alter table positions detach partition positions_202611",
                "drop table run_positions_202611"):
        assert "must be owner" in _refused(s, "settlement", sql, db="settlement")
    # The admin (a superuser) may repair by hand.
    _run(s, "admin", f"update settlement_runs set trades = 5 {where}", db="settlement")
    with connect(s.settlement_dsn) as conn:
        assert conn.execute(f"select trades from settlement_runs {where}").fetchone() == (5,)


def test_settlement_reads_the_ledgers_and_cannot_write_them(isolated: Isolated) -> None:
    s = isolated.settings
    _run(s, "settlement", "select count(*) from trades, consumer_offsets, close_markers",
         PARTITION, "select count(*) from trade_ids")
    for sql in (TRADE, "insert into trade_ids values ('R9', '2026-11-23', 0, 0)",
                "select drop_trade_partition('2026-11-23')",
                "update consumer_offsets set next_offset = 0", "delete from trades"):
        _refused(s, "settlement", sql)


@pytest.mark.parametrize("sql", [TRADE, POSITION, MONTH,
                                 "update consumer_offsets set next_offset = 0",
                                 "delete from dead_letters", "truncate audit_reports",
                                 "insert into settlement_runs (trade_date, source,"
                                 " source_reason, status) values (now(), 'db', 'x', 'running')"])
def test_auditor_cannot_write_anything(isolated: Isolated, sql: str) -> None:
    s = isolated.settings
    _run(s, "auditor", "select count(*) from positions, trades, settlement_runs, audit_reports",
         db="settlement")
    _refused(s, "auditor", sql, db="settlement")


def test_login_grants_are_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    from settlement.config import ConfigError
    from settlement.dbusers import LoginGrant

    assert LoginGrant.parse("site_a:settle_site_a:PW") == LoginGrant("site_a", "settle_site_a",
                                                                     "PW")
    for bad in ("admin:settle:PW", "site_a:Bad-Name:PW", "site_a:x", "site_c:x:PW"):
        with pytest.raises(ConfigError, match="--grant"):
            LoginGrant.parse(bad)
    monkeypatch.setenv("SETTLE_TEST_SHORT_PW", "short")
    with pytest.raises(ConfigError, match="SETTLE_TEST_SHORT_PW"):
        LoginGrant.parse("auditor:settle_audit:SETTLE_TEST_SHORT_PW").password()
