"""Airflow's real UI: standalone on our DAGs, a login in headless Chromium, a run via REST."""

from __future__ import annotations

import json
import os
import signal
import socket
import time
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
        page.goto(base)
        page.wait_for_url("**/auth/login**", timeout=30_000)  # the real login page
        page.locator("input[name=username]").wait_for(timeout=30_000)
        page.fill("input[name=username]", USER)
        page.fill("input[name=password]", password)
        page.locator("button[type=submit]").click()
        page.wait_for_url(lambda url: "/auth/login" not in url, timeout=30_000)
        page.goto(f"{base}/dags", wait_until="networkidle")
        page.get_by_text("failover_drill").first.wait_for(timeout=30_000)
        assert page.get_by_text("eod_settlement").count() >= 1
        (ROOT / "test-artifacts").mkdir(exist_ok=True)
        page.screenshot(path=str(ROOT / "test-artifacts" / "airflow-dags.png"))
        browser.close()

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
