"""Airflow's real UI: standalone on our DAGs, a login in headless Chromium, a run via REST,
then the day's audit report opened from the UI (Browse > Audit reports)."""

from __future__ import annotations

import json
import os
import signal
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from settlement.orchestration.ui import USER, start, wait_ready
from tests.conftest import Isolated
from tests.helpers import CHROMIUM_FLAGS, ROOT, ingest_day

pytestmark = pytest.mark.services
DAY = "2026-12-01"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def standalone(isolated: Isolated, tmp_path: Path) -> Iterator[tuple[str, str, Isolated]]:
    port = _free_port()
    home = tmp_path / "airflow"
    # Manual-only schedule: unpausing must not create a scheduled run that would wait for
    # another day's close markers and hold the DAG's single active-run slot.
    os.environ["SETTLE_EOD_CRON"] = "none"
    proc = start(isolated.settings, home, port, tmp_path / "airflow.log")
    try:
        pw = wait_ready(proc, home, port, timeout=300)
        yield f"http://127.0.0.1:{port}", pw, isolated
    finally:
        os.environ.pop("SETTLE_EOD_CRON", None)
        # Standalone runs its scheduler, API server, triggerer and workers in its group.
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=60)
        except (ProcessLookupError, Exception):  # noqa: BLE001
            os.killpg(proc.pid, signal.SIGKILL)


def _api(base: str, token: str, method: str, path: str, body: Any = None) -> Any:
    req = urllib.request.Request(
        f"{base}{path}", method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read() or b"null")


def _token(base: str, password: str) -> str:
    req = urllib.request.Request(
        f"{base}/auth/token", method="POST",
        data=json.dumps({"username": USER, "password": password}).encode(),
        headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())["access_token"]


def test_login_see_dags_and_run_eod_through_the_api(standalone, tmp_path: Path) -> None:
    from playwright.sync_api import sync_playwright

    base, password, iso = standalone
    ingest_day(iso.env, tmp_path, DAY, ["a", "b"], "shared", trades=2000)
    token = _token(base, password)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:  # the dag processor parses the folder first
        try:
            ids = {d["dag_id"] for d in _api(base, token, "GET", "/api/v2/dags")["dags"]}
            if {"eod_settlement", "failover_drill"} <= ids:
                break
        except OSError:
            pass
        time.sleep(3)
    else:
        pytest.fail("the DAGs never appeared in the API")

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium",
                                    args=[a for a in CHROMIUM_FLAGS if a != "--headless"])
        page = browser.new_page()
        _login(page, base, password)
        page.goto(f"{base}/dags", wait_until="networkidle")
        page.get_by_text("failover_drill").first.wait_for(timeout=30_000)
        assert page.get_by_text("eod_settlement").count() >= 1
        (ROOT / "test-artifacts").mkdir(exist_ok=True)
        page.screenshot(path=str(ROOT / "test-artifacts" / "airflow-dags.png"))
        browser.close()

    # The providers' connection types: kafka_default and settlement_db are forms in the UI.
    hook_types = {h["connection_type"]
                  for h in _api(base, token, "GET", "/ui/connections/hook_meta")}
    assert {"kafka", "postgres", "spark", "smtp"} <= hook_types, hook_types

    _api(base, token, "PATCH", "/api/v2/dags/eod_settlement", {"is_paused": False})
    run = _api(base, token, "POST", "/api/v2/dags/eod_settlement/dagRuns",
               {"logical_date": None, "conf": {"trade_date": DAY, "source": "auto"}})
    run_id = run["dag_run_id"]
    deadline = time.monotonic() + 420
    state = run["state"]
    while time.monotonic() < deadline and state not in ("success", "failed"):
        time.sleep(5)
        state = _api(base, token, "GET",
                     f"/api/v2/dags/eod_settlement/dagRuns/{run_id}")["state"]
    assert state == "success", f"eod_settlement run {run_id} ended {state}"
    _open_report_from_the_ui(base, password, iso)


def _login(page: Any, base: str, password: str) -> None:
    page.goto(base)
    page.wait_for_url("**/auth/login**", timeout=30_000)  # the real login page
    page.locator("input[name=username]").wait_for(timeout=30_000)
    page.fill("input[name=username]", USER)
    page.fill("input[name=password]", password)
    page.locator("button[type=submit]").click()
    page.wait_for_url(lambda url: "/auth/login" not in url, timeout=30_000)


def _menu_to(page: Any, menu: str, item: str, url: str, attempts: int = 3) -> None:
    """Open the nav menu and follow one of its items, as a person would. Under a loaded
    machine the menu can close (a re-render) before the click lands: a person clicks again,
    so does this, a bounded number of times."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    for attempt in range(attempts):
        page.get_by_role("button", name=menu).click()
        entry = page.get_by_text(item, exact=True).first
        try:
            entry.wait_for(state="visible", timeout=30_000)
            entry.click(timeout=30_000)
            page.wait_for_url(url, timeout=45_000)
            return
        except PlaywrightTimeout:
            if attempt == attempts - 1:
                page.screenshot(path=str(ROOT / "test-artifacts" / "airflow-menu-failed.png"))
                raise


def _open_report_from_the_ui(base: str, password: str, iso: Isolated) -> None:
    """Browse > Audit reports lists the day's report with its verdict; its link opens the
    report itself inside Airflow's UI."""
    from playwright.sync_api import sync_playwright

    from settlement.db import connect

    with connect(iso.settings.settlement_dsn) as conn:
        run_id, report_path, trades = conn.execute(
            "select run_id, report_path, trades from settlement_runs where trade_date = %s"
            " order by run_id desc limit 1", (DAY,)).fetchone()
    # The plugin's pages are Airflow-authenticated: no session, no report; FastAPI's own
    # docs and schema (outside app dependencies) are not served at all.
    for path, codes in (("/", (401, 403)), (f"/runs/{run_id}", (401, 403)),
                        (f"/runs/{run_id}.json", (401, 403)), ("/docs", (401, 403, 404)),
                        ("/redoc", (401, 403, 404)), ("/openapi.json", (401, 403, 404))):
        try:
            urllib.request.urlopen(f"{base}/settlement-reports{path}", timeout=30)
            pytest.fail(f"/settlement-reports{path} answered without a login")
        except urllib.error.HTTPError as e:
            assert e.code in codes, (path, e.code)

    shots = ROOT / "test-artifacts"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium",
                                    args=[a for a in CHROMIUM_FLAGS if a != "--headless"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        _login(page, base, password)
        page.goto(f"{base}/dags", wait_until="networkidle")
        _menu_to(page, "Browse", "Audit reports", "**/plugin/audit-reports")
        frame = page.frame_locator("iframe")
        link = frame.get_by_role("link", name=f"report {DAY} run {run_id}")
        link.wait_for(timeout=60_000)
        row = frame.locator("tr", has=link)
        assert "validation passed, published" in row.inner_text()
        assert "kafka" in row.inner_text()
        page.screenshot(path=str(shots / "airflow-report-index.png"))

        link.click()
        # The frame navigates from the index to the report: wait for the report's own title.
        frame.locator("h1", has_text=f"{DAY}").wait_for(timeout=60_000)
        assert frame.locator("span.verdict.pass").inner_text() == "VALIDATION PASSED"
        assert frame.locator('[data-kpi="trades settled"]').inner_text() == f"{trades:,}"
        # Still inside Airflow's UI, which mirrors the framed page's path in its own URL.
        assert "/plugin/audit-reports/settlement-reports/runs/" in page.url, page.url
        assert page.get_by_role("button", name="Browse").is_visible()
        page.screenshot(path=str(shots / "airflow-report-opened.png"))
        browser.close()
    assert Path(report_path).is_file()
