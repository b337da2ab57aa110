"""The audit report pages trust no database row: a forged ``audit_reports`` row can read no
file, run no script and follow no ``javascript:`` link; the files are private.

Unit tests render hostile facts; one test serves the plugin app (Airflow's login replaced by
a pass-through dependency, the rest real) on a real PostgreSQL namespace with forged rows.
"""

from __future__ import annotations

import copy
import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from settlement.orchestration.reports_app import render_report
from settlement.report.html import CSP, render_html, safe_link

HOSTILE = "<x"


def _facts() -> dict[str, Any]:
    """The shape gather_facts writes, small."""
    return {
        "title": "Settlement audit 2026-03-02", "run_id": 7, "generated_at": "2026-03-02T20:00",
        "trades": 1200, "source": "kafka", "source_reason": "the topic holds the day",
        "netting_efficiency": "0.9", "gross_notional": "1000.0000",
        "net_settlement": "100.0000", "accounts": 3, "duplicates_removed_in_settlement": 0,
        "malformed_in_source": 0,
        "publication": {"published": True, "note": "validated and published"},
        "partitions": {"0": {"offsets": "[0, 10)", "last_seq": 9, "trades": 10}},
        "validation": {"success": True, "failures": [], "warnings": [], "checks": 3,
                       "passed": ["a", "b", "c"], "skipped": {"late": "no late trades"},
                       "data_docs": "https://docs.example/index.html"},
        "late_trades_in_range": {},
        "largest_obligations": [{"account": "ACC1", "net_cash": "5.0", "pays": True,
                                 "buy_amount": "5", "sell_amount": "0", "trades": 1}],
        "ledgers": {"site-a": {
            "ingest_window": ["2026-03-01T20:00:00", "2026-03-02T20:00:00"],
            "ingest_series": {"sites": {"a": [1, 2]}, "seconds_per_bucket": 1,
                              "start": "2026-03-02T10:00:00", "end": "2026-03-02T10:00:02"},
            "sites": {"a": {"trades_ingested": 10, "duplicates_suppressed": 0,
                            "dead_letters": 0}},
            "dead_letters_by_reason": {"bad price": 1}, "late_trades": {},
            "data_loss_events": [], "failover_events": []}},
        "instruments": [{"symbol": "AAPL", "trades": 1, "volume": 5, "notional": "5",
                         "vwap": "1"}],
        "timings": {"read_seconds": 1.0},
        "settlement": {
            "settlement_date": "2026-03-03", "instructions": 2, "version": 1,
            "files": {"csv": "../instructions/2026-03-02-run7.csv"}, "carried_in": ["R6-000001"],
            "carried_out": [],
            "members": [{"member": "P1", "mapped": "yes", "accounts": "2", "instructions": "2",
                         "securities_in": "10", "securities_out": "4", "money_in": "40.5000",
                         "money_out": "100.0000", "net_money": "-59.5000",
                         "marks": "-3.2500", "money_line": "-62.75",
                         "fails_carried_in": "1", "oldest_fail_settlement_date": "2026-02-27",
                         "oldest_fail_age_days": "4"}]},
    }


def _poison(v: Any) -> Any:
    """Every string value prefixed with a hostile one, keeping the shape."""
    if isinstance(v, dict):
        return {k: _poison(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_poison(x) for x in v]
    if isinstance(v, str):
        return HOSTILE + v
    return v


def test_the_sample_facts_render_as_a_report() -> None:
    page = render_html(_facts())
    assert "VALIDATION PASSED" in page and "1,200" in page
    # The per-member summary (issue 59): one member, its money as money, its marks and its
    # one money figure.
    assert 'data-members="1"' in page and "<td class=\"n\">-59.50</td>" in page
    assert "<td class=\"n\">-3.25</td>" in page and "<td class=\"n\">-62.75</td>" in page
    assert 'href="https://docs.example/index.html"' in page
    assert f'content="{CSP.replace(chr(39), "&#x27;")}"' in page


def test_every_string_field_is_escaped() -> None:
    facts = _poison(_facts())
    # The keys that are data (partitions, ledgers, sites, reasons) poisoned too; and the
    # fields that are numbers when the job writes them.
    facts["partitions"] = {HOSTILE: facts["partitions"]["0"]}
    led = facts["ledgers"].pop("site-a")
    led["sites"] = {HOSTILE: led["sites"]["a"]}
    led["dead_letters_by_reason"] = {HOSTILE: HOSTILE}
    led["ingest_series"]["sites"] = {HOSTILE: [1, 2]}
    led["late_trades"] = {HOSTILE: HOSTILE}
    facts["ledgers"] = {HOSTILE: led}
    facts["late_trades_in_range"] = {HOSTILE: {HOSTILE: HOSTILE}}
    facts["run_id"] = HOSTILE
    facts["trades"] = HOSTILE
    facts["validation"]["checks"] = HOSTILE
    facts["validation"]["skipped"] = {HOSTILE: HOSTILE}
    for page in (render_html(facts), render_report(facts)):
        assert HOSTILE not in page, page[max(0, page.find(HOSTILE) - 200):][:400]
        assert "&lt;x" in page


def test_a_failing_report_escapes_its_checks() -> None:
    facts = _facts()
    facts["validation"].update(success=False, failures=[{
        "suite": HOSTILE, "asset": HOSTILE, "name": HOSTILE, "observed": HOSTILE,
        "examples": [HOSTILE]}])
    page = render_html(facts)
    assert "VALIDATION FAILED" in page and HOSTILE not in page


@pytest.mark.parametrize("url", [
    "javascript:alert(1)", "JavaScript:alert(1)", " java\tscript:alert(1)",
    "data:text/html,<script>x</script>", "file:///etc/passwd", "//evil.example/x",
    "vbscript:msgbox", 42, None, ""])
def test_only_http_and_relative_links_are_followed(url: Any) -> None:
    assert safe_link(url) is None
    facts = _facts()
    facts["validation"]["data_docs"] = url
    page = render_html(facts)
    assert "<a href" not in page.split("Data Docs", 1)[-1].split("</p>", 1)[0]
    if isinstance(url, str) and url.strip():
        assert "<script" not in page


def test_the_runs_own_data_docs_pages_are_listed_and_only_safe_ones_followed() -> None:
    facts = _facts()
    facts["validation"]["data_docs_pages"] = {
        "trades_day@settlement_trades": "https://docs.example/validations/trades_day/r.html",
        "read_copies@as_read": "file:///srv/gx/validations/read_copies/r.html",
        "x@y": "javascript:alert(1)"}
    page = render_html(facts)
    pages = page.split('<ul class="docs-pages">', 1)[1].split("</ul>", 1)[0]
    assert pages.count("<li>") == 3
    assert '<a href="https://docs.example/validations/trades_day/r.html">' in pages
    assert "<code>file:///srv/gx/validations/read_copies/r.html</code>" in pages
    assert pages.count("<a href") == 1 and "<code>javascript:alert(1)</code>" in pages


@pytest.mark.parametrize("url", ["https://x.example/docs", "http://x/y", "docs/index.html"])
def test_http_and_relative_links_stay(url: str) -> None:
    assert safe_link(url) == url


@pytest.mark.parametrize("facts", [
    None, [], "text", 7, {"title": HOSTILE}, {**_facts(), "partitions": [HOSTILE]},
    {**_facts(), "validation": {"success": HOSTILE}}])
def test_unreadable_facts_are_shown_as_escaped_json(facts: Any) -> None:
    page = render_report(facts)
    assert HOSTILE not in page
    assert "Content-Security-Policy" in page


def test_report_files_are_private(tmp_path: Path) -> None:
    from settlement.report import write_private as _write_private

    old = os.umask(0)
    try:
        target = tmp_path / "r.html"
        target.write_text("old")
        target.chmod(0o644)
        _write_private(target, "new")
        _write_private(tmp_path / "n.json", "{}")
    finally:
        os.umask(old)
    assert target.read_text() == "new"
    for p in (target, tmp_path / "n.json"):
        assert stat.S_IMODE(p.stat().st_mode) == 0o600, oct(p.stat().st_mode)


@pytest.mark.usefixtures("services")
def test_forged_rows_read_no_file_and_run_no_script(isolated: Any, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from fastapi.testclient import TestClient

    from settlement.db import connect
    from settlement.orchestration import reports_app

    secret = tmp_path / "outside.html"
    secret.write_text("SECRET-OUTSIDE-THE-REPORTS-DIR")
    link = tmp_path / "link.html"
    link.symlink_to(secret)
    paths = ["/proc/self/environ", str(secret), str(link),
             str(isolated.settings.reports_dir / ".." / ".." / secret.name)]
    facts = _facts()
    facts["title"] = HOSTILE
    facts["validation"]["data_docs"] = "javascript:alert(document.cookie)"
    with connect(isolated.settings.settlement_dsn) as conn:
        ids = []
        for i, path in enumerate(paths):
            run_id = conn.execute(
                "insert into settlement_runs (trade_date, source, source_reason, status) "
                "values (%s, 'kafka', %s, 'succeeded') returning run_id",
                (f"2026-03-0{i + 2}", HOSTILE)).fetchone()[0]
            body = copy.deepcopy(facts)
            body["run_id"] = run_id
            conn.execute("insert into audit_reports (trade_date, run_id, report_json, html_path)"
                         " values (%s, %s, %s, %s)",
                         (f"2026-03-0{i + 2}", run_id, json.dumps(body), path))
            ids.append(run_id)
        conn.commit()

    monkeypatch.setattr(reports_app, "settlement_dsn", lambda: isolated.settings.settlement_dsn)
    reports_app.app.dependency_overrides[reports_app._authorized] = lambda: None
    try:
        client = TestClient(reports_app.app)
        env_bytes = Path("/proc/self/environ").read_bytes().split(b"\0")[0].decode(errors="replace")
        for run_id in ids:
            res = client.get(f"/runs/{run_id}")
            assert res.status_code == 200
            page = res.text
            assert "SECRET-OUTSIDE" not in page and (not env_bytes or env_bytes not in page)
            assert HOSTILE not in page
            assert 'href="javascript' not in page.lower()
            assert "script-src" not in res.headers["content-security-policy"]
            assert "default-src 'none'" in res.headers["content-security-policy"]
            assert res.headers["x-content-type-options"] == "nosniff"
            assert client.get(f"/runs/{run_id}.json").json()["run_id"] == run_id
        index = client.get("/")
        assert index.status_code == 200 and HOSTILE not in index.text
        for path in ("/docs", "/redoc", "/openapi.json"):
            assert client.get(path).status_code == 404, path
        assert client.get("/runs/999999").status_code == 404
    finally:
        reports_app.app.dependency_overrides.clear()
