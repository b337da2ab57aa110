"""`trades` partitioned by trade date (issue 60, item 1; sql/migrations/0023; the other tables
a month a partition, 0024) against the real PostgreSQL: a day's partition made by the site
that meets the day first, a trade id unique across every day through the `trade_ids`
registry (a replay across a partition boundary is a conflicting replay, also once the kept
copy's day was archived), the close making the week ahead, two creators racing on the same
days, and an existing database migrated."""

from __future__ import annotations

import datetime as dt
import threading
from typing import Any

import psycopg
import pytest

from settlement.db import connect
from settlement.eod.sources import ledger_state
from tests.conftest import Isolated
from tests.test_ledger import DATE, Builder, _ledger, _rows, _write

pytestmark = pytest.mark.services
NEXT = "2026-11-24"
LATER = "2026-12-01"


def _partitions(iso: Isolated, ledger: str = "a", table: str = "trades") -> list[str]:
    with connect(iso.settings.ledger_dsn(ledger)) as conn:
        return _children(conn, table)


def _children(conn: psycopg.Connection[Any], table: str) -> list[str]:
    return [r[0] for r in conn.execute(
        "select c.relname from pg_inherits i join pg_class c on c.oid = i.inhrelid"
        " where i.inhparent = %s::regclass order by 1", (table,))]


def _conflict(kept_offset: int) -> str:
    return ("conflicting replay of trade 'T000001': its fields differ from the copy kept at "
            f"partition 0 offset {kept_offset}")


def test_a_site_makes_a_days_partition_and_keeps_a_trade_id_unique_across_days(
        isolated: Isolated) -> None:
    ledger = _ledger(isolated)
    assert _partitions(isolated) == []
    res = _write(ledger, Builder().good(1, 0, 0).good(2, 0, 1))
    assert (res.inserted, res.refused, res.dead_letters) == (2, 0, 0), res
    assert _partitions(isolated) == ["trades_20261123"]
    assert ledger.optimistic  # a clean batch: the next one tries the plain insert first
    # T1 again with the next day's date: the registry holds T1 (at offset 0), so the copy is
    # refused across the partition boundary, on the plain insert and on its fallback alike,
    # and dead-lettered as a conflicting replay; T3 of the next day is stored in its own
    # partition, made by this batch.
    res = _write(ledger, Builder().good(1, 0, 2, trade_date=NEXT, seq=3)
                 .good(3, 0, 3, trade_date=NEXT))
    assert (res.inserted, res.duplicates, res.dead_letters, res.refused) == (1, 0, 1, 0), res
    assert _partitions(isolated) == ["trades_20261123", "trades_20261124"]
    assert _rows(isolated, "select trade_id, trade_date::text from trades order by 1") == [
        ("T000001", DATE), ("T000002", DATE), ("T000003", NEXT)]
    assert _rows(isolated, "select trade_id, trade_date::text, kafka_offset from trade_ids"
                           " order by 1") == [("T000001", DATE, 0), ("T000002", DATE, 1),
                                              ("T000003", NEXT, 3)]
    assert _rows(isolated, "select kafka_offset, reason from dead_letters") == [
        (2, _conflict(0))]
    # In one batch too: the first staged copy wins, the other day's copy is the conflict.
    res = _write(ledger, Builder().good(4, 0, 4).good(4, 0, 5, trade_date=NEXT))
    assert (res.inserted, res.dead_letters) == (1, 1), res
    assert _rows(isolated, "select trade_date::text from trades where trade_id = 'T000004'"
                 ) == [(DATE,)]


def test_a_replay_of_an_archived_days_trade_is_still_refused(isolated: Isolated) -> None:
    """Archiving drops the day's partition but leaves its ids in the registry: a copy of an
    archived trade with another date is a conflicting replay, never a new trade."""
    ledger = _ledger(isolated)
    _write(ledger, Builder().good(1, 0, 0).good(2, 0, 1))
    with connect(isolated.settings.for_component("admin").ledger_dsn("a")) as conn:
        assert conn.execute("select drop_trade_partition(%s)", (DATE,)).fetchone() == (2,)
        assert conn.execute("select drop_trade_partition(%s)", (DATE,)).fetchone() == (0,)
        conn.commit()
    assert _partitions(isolated) == []
    res = _write(ledger, Builder().good(1, 0, 2, trade_date=NEXT, seq=3))
    assert (res.inserted, res.dead_letters) == (0, 1), res
    assert _rows(isolated, "select count(*) from trades") == [(0,)]
    assert _rows(isolated, "select kafka_offset, reason from dead_letters") == [
        (2, _conflict(0))]


def test_the_close_makes_the_week_ahead_and_creators_racing_make_each_day_once(
        isolated: Isolated) -> None:
    s = isolated.settings
    assert ledger_state(s.for_component("settlement"), "b", DATE) is not None
    assert _partitions(isolated, "b") == []  # a sensor's poke reads only
    assert ledger_state(s.for_component("settlement"), "b", DATE, ahead=True) is not None
    assert _partitions(isolated, "b") == [
        f"trades_{(dt.date(2026, 11, 23) + dt.timedelta(days=n)):%Y%m%d}" for n in range(8)]
    # Four sessions (the sites' role) ask for the same twelve new days at once, in opposite
    # orders, while a fifth inserts into a day that exists: each day is made once, nobody
    # deadlocks or waits on the inserts.
    days = [dt.date(2027, 1, 1) + dt.timedelta(days=n) for n in range(12)]
    site = s.for_component("site_a").ledger_dsn("b")
    made: list[int] = []
    errors: list[Exception] = []
    start = threading.Barrier(4)

    def create(order: list[dt.date]) -> None:
        try:
            with psycopg.connect(site, autocommit=True) as conn:
                start.wait(timeout=30)
                made.append(conn.execute("select ensure_trade_partitions(%s::date[])",
                                         (order,)).fetchone()[0])
        except (psycopg.Error, threading.BrokenBarrierError) as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=create, args=(o,))
               for o in (days, days[::-1], days, days[::-1])]
    for t in threads:
        t.start()
    with psycopg.connect(site) as conn:
        conn.execute("set lock_timeout = '5s'")
        conn.execute("insert into trades (trade_id, trade_date, seq, kafka_partition,"
                     " kafka_offset, symbol, price, quantity, buyer, seller, executed_at, site)"
                     " values ('R1', %s, 1, 0, 0, 'AAPL', 1.5, 10, 'A', 'B', now(), 'a')",
                     (DATE,))
        conn.commit()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    # Each day once, and January's month of amendments once (sql/migrations/0024).
    assert sorted(made, reverse=True)[0] >= 1 and sum(made) == len(days) + 1, made
    assert len(_partitions(isolated, "b")) == 8 + len(days)
    assert _partitions(isolated, "b", "trade_amendments") == [
        "trade_amendments_202611", "trade_amendments_202701"]


def test_the_close_makes_its_month_and_the_next_a_week_ahead(isolated: Isolated) -> None:
    """Before a run's results are staged: the day's month of each of the close's six tables,
    and the next month's once the day is in its month's last week."""
    from settlement.db import q

    s = isolated.settings.for_component("settlement")
    with connect(s.settlement_dsn, autocommit=True) as conn:
        for day, made in (("2026-11-20", 6), ("2026-11-23", 0), ("2026-11-24", 6),
                          ("2026-11-27", 0)):
            assert conn.execute(q("eod", "settlement_partitions"),
                                {"trade_date": day}).fetchone() == (made,), day
        assert _children(conn, "run_positions") == ["run_positions_202611",
                                                    "run_positions_202612"]
        assert _children(conn, "instrument_summary") == ["instrument_summary_202611",
                                                         "instrument_summary_202612"]


def test_an_existing_database_moves_into_the_partitioned_tables(isolated: Isolated) -> None:
    """A database migrated before 0023, with trades of three days over two months, a bust,
    and a published run, migrated: every row in its day's or month's partition, every id in
    the registry, a month of amendments for every month with trades, the grants and the
    versions' view as they were, the old tables gone."""
    from psycopg.conninfo import make_conninfo

    from settlement.db import migrate_database, migrations

    admin = isolated.settings.for_component("admin").ledger_dsn("a")
    name = f"{isolated.name}_premig"
    dsn = make_conninfo(admin, dbname=name)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'create database "{name}"')  # type: ignore[arg-type]
    try:
        with psycopg.connect(dsn) as conn:
            conn.execute("create table schema_migrations (version integer primary key,"
                         " name text not null, checksum text not null,"
                         " applied_at timestamptz not null default now())")
            for m in migrations():
                if m.version >= 23:
                    break
                conn.execute(m.sql)  # type: ignore[arg-type]
                conn.execute("insert into schema_migrations values (%s, %s, %s)",
                             (m.version, m.name, m.checksum))
            for n, day in enumerate((DATE, DATE, NEXT, LATER), start=1):
                conn.execute("insert into trades (trade_id, trade_date, seq, kafka_partition,"
                             " kafka_offset, symbol, price, quantity, buyer, seller,"
                             " executed_at, site) values (%s, %s, %s, 0, %s, 'AAPL', 1.5, 10,"
                             " 'A', 'B', now(), 'a')", (f"T{n}", day, n, n))
            conn.execute("insert into trade_amendments (trade_id, trade_date, seq,"
                         " kafka_partition, kafka_offset, kind, reason, site)"
                         " values ('T2', %s, 9, 0, 9, 'cancel', 'bust', 'a')", (DATE,))
            run = conn.execute("insert into settlement_runs (trade_date, source, source_reason,"
                               " status, version) values (%s, 'db', 'x', 'succeeded', 1)"
                               " returning run_id", (DATE,)).fetchone()[0]
            for table, run_tag in (("run_positions", (run,)), ("positions", ())):
                conn.execute(f"insert into {table} values ({'%s, ' * len(run_tag)}%s, 'A',"
                             " 'AAPL', 10, 0, 10, 15, 0, -15, 1)", (*run_tag, DATE))
            conn.commit()
        assert migrate_database(dsn) == [m.path.name for m in migrations() if m.version >= 23]
        with psycopg.connect(dsn) as conn:
            rows = conn.execute("select tableoid::regclass::text, trade_id from trades"
                                " order by 2").fetchall()
            assert rows == [("trades_20261123", "T1"), ("trades_20261123", "T2"),
                            ("trades_20261124", "T3"), ("trades_20261201", "T4")]
            assert conn.execute("select trade_id, trade_date::text, kafka_offset from trade_ids"
                                " order by 1").fetchall() == [
                ("T1", DATE, 1), ("T2", DATE, 2), ("T3", NEXT, 3), ("T4", LATER, 4)]
            # 0024: the bust and the run's rows in their month; December, which has trades
            # and no amendment yet, has its month of amendments for the first bust to come.
            assert conn.execute("select tableoid::regclass::text, trade_id"
                                " from trade_amendments").fetchall() == [
                ("trade_amendments_202611", "T2")]
            assert _children(conn, "trade_amendments") == ["trade_amendments_202611",
                                                         "trade_amendments_202612"]
            for table in ("run_positions", "positions"):
                assert conn.execute(f"select tableoid::regclass::text, net_qty"  # type: ignore
                                    f" from {table}").fetchall() == [(f"{table}_202611", 10)]
            assert conn.execute("select run_id, net_cash, current from positions_by_version"
                                ).fetchall() == [(run, -15, None)]
            assert conn.execute(
                "select has_table_privilege('settle_settlement', 'run_positions', 'insert'),"
                " has_table_privilege('settle_site', 'trade_amendments', 'insert'),"
                " has_table_privilege('settle_site', 'positions', 'select'),"
                " has_table_privilege('settle_auditor', 'cash_obligations', 'select')"
            ).fetchone() == (True, True, False, True)
            assert conn.execute("select count(*) from pg_class where relname like"
                                " '%_unpartitioned'").fetchone() == (0,)
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'drop database if exists "{name}" with (force)')  # type: ignore
