"""Archives (issue 60, item 2) on the real services: two days ingested by both sites (each
its own ledger), dead letters, busts and corrections among them, both published; the older
one archived to Parquet by Spark and removed from the ledgers, its audit report still served,
restored, and settled again to the positions it was published with."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.helpers import published_positions, settle, start_site, wait_exit

DAYS = ("2026-03-02", "2026-03-03")
TABLES = ("trades", "trade_amendments", "dead_letters", "late_amendments")


def _counts(settings: Any, day: str) -> dict[tuple[str, str], int]:
    from settlement.db import connect

    out = {}
    for ledger in ("a", "b"):
        with connect(settings.for_component("admin").ledger_dsn(ledger)) as conn:
            for table in TABLES:
                out[(ledger, table)] = conn.execute(
                    f"select count(*) from {table} where trade_date = %s", (day,)).fetchone()[0]
    return out


def _report_page(settings: Any, run_id: int, monkeypatch: pytest.MonkeyPatch) -> str:
    from fastapi.testclient import TestClient

    from settlement.orchestration import reports_app

    monkeypatch.setattr(reports_app, "settlement_dsn", lambda: settings.settlement_dsn)
    reports_app.app.dependency_overrides[reports_app._authorized] = lambda: None
    try:
        res = TestClient(reports_app.app).get(f"/runs/{run_id}")
        assert res.status_code == 200, res.text[:500]
        return res.text
    finally:
        reports_app.app.dependency_overrides.clear()


def _marked_seqs(s: Any, day: str) -> int:
    from settlement.db import connect

    with connect(s.for_component("admin").ledger_dsn("a")) as conn:
        row = conn.execute("select sum(last_seq) from close_markers where trade_date = %s",
                           (day,)).fetchone()
    return int(row[0])


@pytest.mark.services
def test_an_archived_day_restored_and_settled_again_gives_its_published_positions(
        isolated: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    archive_dir = tmp_path / "archive"
    env = {**isolated.env, "SETTLE_RETENTION_DAYS": "0", "SETTLE_ARCHIVE_DIR": str(archive_dir)}
    s = isolated.settings
    for n, day in enumerate(DAYS):
        settle(["simulate", "--date", day, "--trades", "1500", "--seed", str(11 + n),
                "--dup-rate", "0.02", "--bad-rate", "0.01", "--cancel-rate", "0.02",
                "--correct-rate", "0.02"], env)
        procs = [(start_site(x, "separate", env, day, tmp_path / f"{x}{n}.log"),
                  tmp_path / f"{x}{n}.log") for x in ("a", "b")]
        for proc, log in procs:
            assert wait_exit(proc, log)["closed"]
        closed = settle(["eod", "--date", day, "--source", "db"], env)
        assert closed["published"]
        # A cold close starts its JVM beside the source's choice, sized by the close markers
        # (each seq: a trade or an amendment), and sets its SQL by the exact count.
        assert closed["jvm"]["sized_by_close_markers"] == _marked_seqs(s, day) > 1500
        assert closed["jvm"]["small_day"] is True
    # Malformed messages have no trade date (they stay); a dated dead letter, as a late
    # trade leaves, with bytes that are not text, in each ledger.
    from settlement.db import connect

    for ledger in ("a", "b"):
        with connect(s.for_component("admin").ledger_dsn(ledger)) as conn:
            conn.execute("insert into dead_letters (topic, kafka_partition, kafka_offset, raw,"
                         " reason, site, trade_date) values (%s, 0, 999999, %s, %s, %s, %s)",
                         ("trades", b"\xff\x00late", "late: trade_date closed", ledger,
                          DAYS[0]))
            conn.commit()
    published = {day: published_positions(s.settlement_dsn, day) for day in DAYS}
    before = {day: _counts(s, day) for day in DAYS}
    old = before[DAYS[0]]
    assert old[("a", "trades")] > 1000 and old[("a", "dead_letters")] > 0
    assert old[("a", "trade_amendments")] > 0
    assert all(old[("a", t)] == old[("b", t)] for t in TABLES)  # each site took the whole day

    out = settle(["archive", "--before", DAYS[1]], env, timeout=600)
    assert [a["trade_date"] for a in out["archived"]] == [DAYS[0]]
    parts = {(p["ledger"], p["table"]): p for p in out["archived"][0]["parts"]}
    assert {k: p["rows"] for k, p in parts.items() if k[0] in ("a", "b")} == old
    assert out["rows_removed"] == sum(old.values())
    assert set(_counts(s, DAYS[0]).values()) == {0}        # gone from both ledgers
    assert _counts(s, DAYS[1]) == before[DAYS[1]]           # the younger day untouched
    assert list((archive_dir / DAYS[0] / "a" / "trades").glob("*.parquet"))
    again = settle(["archive", "--before", DAYS[1]], env, timeout=600)
    assert (again["archived"], again["rows_removed"]) == ([], 0)
    # Everything published about the day stays in the settlement database: its report opens.
    page = _report_page(s, published[DAYS[0]][1], monkeypatch)
    assert DAYS[0] in page and "VALIDATION PASSED" in page

    restored = settle(["archive", "restore", "--date", DAYS[0]], env, timeout=600)
    assert {(r["ledger"], r["table"]): r["rows"] for r in restored["restored"]
            if r["ledger"] in ("a", "b")} == old
    assert _counts(s, DAYS[0]) == old
    assert settle(["eod", "--date", DAYS[0], "--source", "db"], env)["published"]
    rows, run = published_positions(s.settlement_dsn, DAYS[0])
    assert run != published[DAYS[0]][1] and rows == published[DAYS[0]][0]

    # Archived again, then a file changed: the restore refuses it and brings nothing back.
    assert settle(["archive", "--before", DAYS[1]], env, timeout=600)["archived"]
    part = sorted((archive_dir / DAYS[0] / "b" / "trades").glob("*.parquet"))[0]
    part.write_bytes(part.read_bytes() + b"\0")
    bad = settle(["archive", "restore", "--date", DAYS[0]], env, timeout=600, check=False)
    assert bad["_returncode"] != 0 and "SHA-256 differs" in bad["error"], bad
    assert set(_counts(s, DAYS[0]).values()) == {0}
