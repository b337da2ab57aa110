"""Validation inside `settle eod` and the audit report, rendered in real Chromium."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote

import pytest

from settlement.close.pipeline import run_eod
from settlement.db import connect
from tests.conftest import Isolated
from tests.helpers import ROOT, chromium, ingest_day, last_json

pytestmark = pytest.mark.services
DATE = "2026-11-26"
ARTIFACTS = ROOT / "test-artifacts"


@pytest.fixture
def separate_day(isolated: Isolated, tmp_path: Path) -> tuple[Isolated, dict]:
    return isolated, ingest_day(isolated.env, tmp_path, DATE, ["a", "b"], "separate")


def test_eod_validates_records_and_reports(separate_day, tmp_path: Path) -> None:
    iso, sim = separate_day
    out = run_eod(iso.settings, DATE)
    assert out["source"] == "kafka" and out["validation_success"] is True, out["validation"]
    v = out["validation"]
    # Both site ledgers and Kafka were reconciled. The two checks on the read as it came in
    # cannot fail on this read, and say why (docs/operations.md): the reader compared every
    # copy in its partition, the checksums equal the ledger's, no other date was read. The
    # day has no bust or correction, in Kafka nor in the ledgers: their checks cannot fail.
    assert set(v["skipped"]) == {"read_dates@as_read", "read_copies@as_read",
                                 "amendments_day@amendments",
                                 "reconcile_amendments@amendments"}, v["skipped"]
    assert "checksums equal the ledger's" in v["skipped"]["read_copies@as_read"]
    assert v["skipped"]["reconcile_amendments@amendments"] == (
        "neither copy of the day holds a cancel or a correction")
    assert v["checks"] == 16  # every other check applies (docs/operations.md)
    assert v["figures"]["reconcile_kafka_ledger"]["differing"] == 0
    assert v["figures"]["reconcile_site_a_b"]["differing"] == 0
    facts = json.loads(Path(out["report_json"]).read_text())
    assert facts["trades"] == sim["trades"]
    assert set(facts["ledgers"]) == {"a", "b"}
    assert sum(facts["ledgers"]["a"]["dead_letters_by_reason"].values()) == \
        sim["malformed_injected"]
    with connect(iso.settings.settlement_dsn) as conn:
        run = conn.execute("select status, validation_success, report_path from settlement_runs"
                           " where run_id = %s", (out["run_id"],)).fetchone()
        stored = conn.execute("select report_json->>'trades' from audit_reports"
                              " where run_id = %s", (out["run_id"],)).fetchone()
    assert run == ("succeeded", True, out["report_path"])
    assert stored == (str(sim["trades"]),)

    shot = ARTIFACTS / "audit-report.png"
    dom = chromium(Path(out["report_path"]).as_uri(), tmp_path, screenshot=shot)
    assert "VALIDATION PASSED" in dom
    assert f'data-kpi="trades settled">{sim["trades"]:,}<' in dom
    eff = f"{float(out['netting_efficiency']) * 100:.2f}%"
    assert f'data-kpi="netting efficiency">{eff}<' in dom
    assert "Kafka is reachable and holds the whole day" in dom
    # Data Docs are links relative to the report file, and they lead to the run's pages.
    docs = re.findall(r'<li>[^<]*: <a href="([^"]+)">', dom)
    assert docs, "the report links no Data Docs page"
    for href in docs:
        assert not href.startswith("file:"), href
        assert (Path(out["report_path"]).parent / unquote(href)).is_file(), href
    # It fits a laptop's screen: nothing wider than a 1280-pixel window.
    assert _page_width(Path(out["report_path"]), tmp_path, 1280) <= 1280
    assert "<svg" in dom and "site a" in dom and "site b" in dom
    # The steps' timings explain a slow day, in the report and in the run's record.
    assert "Step timings" in dom and facts["timings"]["read_seconds"] > 0
    with connect(iso.settings.settlement_dsn) as conn:
        (timings,) = conn.execute("select timings from settlement_runs where run_id = %s",
                                  (out["run_id"],)).fetchone()
    assert {"choose_seconds", "read_seconds", "settle_seconds", "validate_seconds",
            "publish_seconds", "report_seconds", "total_seconds"} <= set(timings), timings
    assert shot.stat().st_size > 20_000


def test_a_site_missing_a_trade_fails_validation_and_names_it(separate_day) -> None:
    iso, _ = separate_day
    with connect(iso.settings.ledger_dsn("a")) as conn:
        lost = conn.execute("delete from trades where trade_id = (select min(trade_id)"
                            " from trades) returning trade_id").fetchone()[0]
        conn.commit()
    out = run_eod(iso.settings, DATE, source="db")
    # Ledger b is still complete, so settlement reads it; the site reconciliation fails.
    assert out["ledgers"] == ["b"]
    assert out["validation_success"] is False
    failures = out["validation"]["failures"]
    named = [f for f in failures if f["suite"] == "reconcile_site_a_b"]
    assert named and named[0]["examples"][0]["trade_id"] == lost
    with connect(iso.settings.settlement_dsn) as conn:
        status, error = conn.execute("select status, error from settlement_runs"
                                     " where run_id = %s", (out["run_id"],)).fetchone()
    assert status == "failed" and error.startswith("validation failed"), error
    assert "not published" in error and not out["published"]
    html = Path(out["report_path"]).read_text()
    assert "VALIDATION FAILED" in html and lost in html

    # The CLI says the same and exits non-zero.
    res = subprocess.run([sys.executable, "-m", "settlement.cli", "validate", "--date", DATE,
                          "--source", "db", "--json"], env=iso.env, capture_output=True,
                         text=True, cwd=ROOT, timeout=600)
    assert res.returncode == 1, res.stderr[-2000:]
    body = last_json(res.stdout)
    assert body["ok"] is False and "reconcile_site_a_b" in body["error"]
    assert any(lost in json.dumps(f["examples"]) for f in body["failures"])


def test_failover_events_from_heartbeats(isolated: Isolated) -> None:
    """The gaps and ownership moves are found in SQL, within the window only."""
    import datetime as dt

    from settlement.db import q
    from settlement.report.facts import FAILOVER_GAP, heartbeat_events

    t = dt.datetime(2026, 11, 26, 14, 0, tzinfo=dt.UTC)
    s = dt.timedelta(seconds=1)
    beats = [("a", t, [0, 1, 2]), ("a", t + s, [0, 1, 2]),
             ("b", t, [3, 4, 5]), ("b", t + s, [3, 4, 5]), ("b", t + 9 * s, [0, 1, 2, 3, 4, 5]),
             # outside the window: a silence and a move that belong to another day
             ("b", t + 100 * s, [3]), ("a", t - 50 * s, [7])]
    with connect(isolated.settings.ledger_dsn("a")) as conn:
        conn.cursor().executemany(
            "insert into site_heartbeats (site, scheme, beat_at, partitions, trades_total)"
            " values (%s, 'shared', %s, %s, 0)", beats)
        rows = conn.execute(q("report", "heartbeat_events"), {
            "start_at": t - s, "end_at": t + 10 * s, "gap": FAILOVER_GAP}).fetchall()
    assert len(rows) <= 4  # only the beats that matter leave the database
    events = heartbeat_events(rows)
    kinds = [(e["site"], e["event"]) for e in events]
    assert sorted(kinds) == [("a", "last heartbeat"), ("b", "last heartbeat"),
                             ("b", "partitions"), ("b", "silent")]
    moved = next(e for e in events if e["event"] == "partitions")
    assert moved["detail"] == "[3, 4, 5] -> [0, 1, 2, 3, 4, 5]"
    silent = next(e for e in events if e["event"] == "silent")
    assert silent["detail"] == "no heartbeat for 8s"


def test_report_of_a_day_counts_that_day_only(isolated: Isolated, tmp_path: Path) -> None:
    """Three days on one topic and one ledger: each day's figures are its own, and the
    settled day's audit report ignores the days before and after it."""
    from settlement.report.facts import ledger_facts

    days = ["2026-11-24", "2026-11-25", "2026-11-26"]
    sims = {}
    for i, day in enumerate(days):  # a different size and mix each day
        sims[day] = ingest_day(isolated.env, tmp_path / day, day, ["a"], "separate",
                               trades=1500 + 700 * i, seed=11 + i)
    assert len({s["malformed_injected"] for s in sims.values()}) > 1
    windows = []
    for day in days:
        led = ledger_facts(isolated.settings, day)["a"]
        sim = sims[day]
        assert sum(led["dead_letters_by_reason"].values()) == sim["malformed_injected"], day
        site = led["sites"]["a"]
        assert site["trades_ingested"] == sim["trades"], day
        assert site["duplicates_suppressed"] == sim["duplicates_injected"], day
        assert sum(sum(v) for v in led["ingest_series"]["sites"].values()) == sim["trades"]
        start, end = led["ingest_window"]
        assert end is not None and (start is None) == (day == days[0])
        # A site that ingests a small day in one batch may beat only after the close: that
        # beat is in the next day's window (the windows are consecutive).
        for beats in led["heartbeats"].values():
            assert (start is None or beats["first"] > start) and beats["last"] <= end
        assert all((start is None or e["at"] > start) and e["at"] <= end
                   for e in led["failover_events"])
        windows.append((start, end))
    # consecutive, non-overlapping windows: each ends where the next begins
    assert windows[0][1] == windows[1][0] and windows[1][1] == windows[2][0]

    steps: list[str] = []
    mid = days[1]
    out = run_eod(isolated.settings, mid, progress=steps.append)
    assert out["validation_success"] is True, out["validation"]
    order = ["choosing the source", "reading the day", "settling", "validating", "publishing",
             "writing the audit report"]
    at = [next(i for i, st in enumerate(steps) if o in st) for o in order]
    assert at == sorted(at), steps
    facts = json.loads(Path(out["report_json"]).read_text())
    led = facts["ledgers"]["a"]
    assert facts["trades"] == sims[mid]["trades"]
    assert sum(led["dead_letters_by_reason"].values()) == sims[mid]["malformed_injected"]
    assert led["sites"]["a"]["trades_ingested"] == sims[mid]["trades"]
    assert led["sites"]["a"]["duplicates_suppressed"] == sims[mid]["duplicates_injected"]
    html = Path(out["report_path"]).read_text()
    assert 'data-window="ingest"' in html and windows[1][0][:19].replace("T", " ") in html


def test_union_of_site_ledgers_when_neither_is_complete(separate_day) -> None:
    from settlement.eod.sources import choose_source

    iso, sim = separate_day
    gone = {}
    for ledger, pick in (("a", "min"), ("b", "max")):
        with connect(iso.settings.ledger_dsn(ledger)) as conn:
            gone[ledger] = conn.execute(
                f"delete from trades where trade_id = (select {pick}(trade_id) from trades)"
                " returning trade_id").fetchone()[0]
            conn.commit()
    choice = choose_source(iso.settings, DATE, "db")
    assert choice.ledgers == ("a", "b")
    assert "union of site ledgers a and b" in choice.reason
    out = run_eod(iso.settings, DATE, source="db", validate=False)
    # Each trade missing from one site is in the other: the union settles the whole day.
    assert out["trades"] == sim["trades"]
    assert out["duplicates_removed"] == sim["trades"] - 2


def _page_width(report: Path, tmp: Path, window: int) -> int:
    """The report's laid-out width in a ``window``-pixel Chromium window: a copy of the page
    with a script that writes ``scrollWidth`` into the DOM (the report itself forbids
    scripts, so the copy drops its CSP)."""
    html = re.sub(r'<meta http-equiv="Content-Security-Policy"[^>]*>', "", report.read_text())
    probe = report.with_name("width-probe.html")
    probe.write_text(html.replace("</body>", "<script>document.body.dataset.width = "
                                  "document.documentElement.scrollWidth</script></body>"))
    try:
        dom = chromium(probe.as_uri(), tmp, size=f"{window},900", window=True)
    finally:
        probe.unlink()
    found = re.search(r'data-width="(\d+)"', dom)
    assert found, "the probe did not run"
    return int(found.group(1))
