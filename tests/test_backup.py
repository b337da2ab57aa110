"""The point-in-time drill's pure parts (issue 60): which rows make a published day, and the
order they can be deleted and put back in. The drill itself runs on the stack
(tests/test_stack.py: `make stack-backup`, `make stack-drill FAULT=point-in-time`)."""

from __future__ import annotations

import re
import subprocess
from datetime import UTC, date
from pathlib import Path

import pytest

from settlement.errors import ServiceError
from settlement.stack import backup

SCHEMA = (Path(__file__).resolve().parent.parent / "sql" / "schema.sql").read_text()
# What a mistaken DELETE of a day's results leaves: the run history and the ledgers' rows.
NOT_PUBLISHED = {"settlement_runs", "close_leases", "reclose_decisions", "day_archives",
                 "data_loss_events", "late_amendments", "amended_close_markers",
                 "close_markers", "trades", "trade_amendments", "dead_letters",
                 "ingest_batches", "trade_ids"}


def _columns() -> dict[str, set[str]]:
    out = {}
    # A partitioned table's body ends with its PARTITION BY clause (sql/migrations/0023, 0024).
    for table, body in re.findall(r"CREATE TABLE public\.(\w+) \((.*?)\n\)"
                                  r"(?:\nPARTITION BY [^;]*)?;", SCHEMA, re.S):
        out[table] = {line.split()[0] for line in body.strip().splitlines()
                      if line.strip() and not line.strip().startswith("CONSTRAINT")}
    return out


def _foreign_keys() -> list[tuple[str, str]]:
    """(referencing table, referenced table) of every foreign key."""
    return re.findall(r"ALTER TABLE (?:ONLY )?public\.(\w+)\s+ADD CONSTRAINT \w+ FOREIGN KEY "
                      r"\(\w+\) REFERENCES public\.(\w+)", SCHEMA)


def test_every_table_holding_a_days_results_is_deleted_and_restored() -> None:
    columns = _columns()
    assert len(columns) == SCHEMA.count("CREATE TABLE public."), "a table the parse missed"
    tables = [t for t, _ in backup.DAY_TABLES]
    assert len(set(tables)) == len(tables)
    assert set(tables) <= set(columns), set(tables) - set(columns)
    dated = {t for t, cols in columns.items() if "trade_date" in cols}
    missing = dated - set(tables) - NOT_PUBLISHED
    assert not missing, f"tables of a day's results the drill would leave out: {missing}"
    # The instruction tables without a date are selected through their instruction.
    for table, condition in backup.DAY_TABLES:
        if "trade_date" not in columns[table]:
            assert "instruction_id" in columns[table] and "settlement_instructions" in \
                condition, table


def test_children_go_before_what_they_reference_and_come_back_after_it() -> None:
    order = [t for t, _ in backup.DAY_TABLES]
    keys = _foreign_keys()
    assert keys, "no foreign key parsed from sql/schema.sql"
    for child, parent in keys:
        if parent in order:
            # A row referencing a deleted one must be deleted too, and first.
            assert child in order, f"{child} references {parent} but is not deleted"
            assert order.index(child) < order.index(parent), (child, parent)


def test_the_day_reaches_sql_as_a_date_literal_only() -> None:
    where = backup._where("trade_date = {d}", date(2026, 3, 3))
    assert where == "trade_date = date '2026-03-03'"
    with pytest.raises(AttributeError):
        backup._where("trade_date = {d}", "2026-03-03'; drop table x; --")  # type: ignore[arg-type]


def test_a_backup_type_outside_pgbackrests_is_refused_before_anything_runs() -> None:
    with pytest.raises(ValueError, match="full, diff, incr"):
        backup.take_backup(None, "weekly", print)  # type: ignore[arg-type]


def test_a_restore_target_is_utc_to_the_millisecond_and_never_later() -> None:
    from datetime import datetime, timedelta, timezone

    moment = datetime(2026, 3, 3, 18, 4, 5, 987654, tzinfo=timezone(timedelta(hours=2)))
    assert backup.pgbackrest_time(moment) == "2026-03-03 16:04:05.987+00"


def test_a_restore_target_needs_a_time_and_its_zone() -> None:

    assert backup.parse_target(" 2026-11-30 02:58:27.17+00 ").tzinfo == UTC
    with pytest.raises(ValueError, match="no time zone: add it"):
        backup.parse_target("2026-11-30 02:58:27")
    with pytest.raises(ValueError, match="is not a time"):
        backup.parse_target("yesterday")


def test_a_lock_another_pgbackrest_holds_is_waited_for_and_any_other_failure_is_not(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """At `stack up` the primary's archive-push may hold the stanza's lock for a moment
    (pgBackRest's exit 50): stanza-create and check run again until it is free, within
    ``LOCK_WAIT_S``; another failure is raised at once, with pgBackRest's words."""
    answers: list[tuple[int, str]] = []
    calls: list[tuple[str, ...]] = []

    def run(stack: object, *argv: str, **_: object) -> subprocess.CompletedProcess[str]:
        calls.append(argv)
        code, out = answers.pop(0)
        return subprocess.CompletedProcess(argv, code, out, f"ERROR: [{code:03d}]: boom")

    monkeypatch.setattr(backup, "_exec", run)
    monkeypatch.setattr(backup.time, "sleep", lambda s: None)
    answers[:] = [(backup.LOCK_HELD, ""), (backup.LOCK_HELD, ""), (0, "created")]
    assert backup._while_locked(None, "stanza-create") == "created"  # type: ignore[arg-type]
    assert len(calls) == 3 and calls[-1][-1] == "stanza-create"
    calls.clear()
    answers[:] = [(28, ""), (0, "never asked")]
    with pytest.raises(ServiceError, match=r"exit 28\)[\s\S]*\[028\]"):
        backup._while_locked(None, "check")  # type: ignore[arg-type]
    assert len(calls) == 1
    calls.clear()
    monkeypatch.setattr(backup, "LOCK_WAIT_S", 0)
    answers[:] = [(backup.LOCK_HELD, ""), (0, "never asked")]
    with pytest.raises(ServiceError, match="exit 50"):
        backup._while_locked(None, "check")  # type: ignore[arg-type]
    assert len(calls) == 1
