"""Least privilege: the PostgreSQL roles the migrations create really restrict writes."""

from __future__ import annotations

import psycopg
import pytest

from settlement.db import connect
from tests.conftest import Isolated

pytestmark = pytest.mark.services

TRADE = ("insert into trades (trade_id, trade_date, seq, kafka_partition, kafka_offset,"
         " symbol, price, quantity, buyer, seller, executed_at, site) values"
         " ('R1', '2026-11-23', 1, 0, 0, 'AAPL', 1.5, 10, 'A', 'B', now(), 'a')")
POSITION = ("insert into positions values ('2026-11-23', 'A', 'AAPL', 1, 0, 1, 1.5, 0, -1.5, 1)")


def _as(dsn: str, role: str, sql: str) -> None:
    with connect(dsn) as conn:
        conn.execute(f"set role {role}")  # type: ignore[arg-type]
        conn.execute(sql)  # type: ignore[arg-type]
        conn.rollback()


def test_site_role_writes_only_its_ledger(isolated: Isolated) -> None:
    dsn = isolated.settings.ledger_dsn("a")
    _as(dsn, "settle_site", TRADE)
    _as(dsn, "settle_site", "create temp table s (like trades)")
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        _as(dsn, "settle_site", POSITION)
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        _as(dsn, "settle_site", "delete from settlement_runs")


def test_settlement_role_reads_ledgers_and_writes_results(isolated: Isolated) -> None:
    dsn = isolated.settings.settlement_dsn
    _as(dsn, "settle_settlement", POSITION)
    _as(dsn, "settle_settlement", "select count(*) from trades")
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        _as(dsn, "settle_settlement", TRADE)


@pytest.mark.parametrize("sql", [TRADE, POSITION, "update consumer_offsets set next_offset = 0",
                                 "delete from dead_letters", "truncate audit_reports"])
def test_auditor_cannot_write_anything(isolated: Isolated, sql: str) -> None:
    dsn = isolated.settings.settlement_dsn
    _as(dsn, "settle_auditor", "select count(*) from positions, trades")
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        _as(dsn, "settle_auditor", sql)
