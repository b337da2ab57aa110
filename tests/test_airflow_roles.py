"""Airflow's roles in production: the FAB auth manager (as docker-compose runs it) on a real
API server over our DAGs. An auditor sees the runs and the audit reports and is refused
triggering, clearing and pausing; operations may; a password rotation locks the old one out.
"""

from __future__ import annotations

import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.conftest import Isolated
from tests.helpers import ROOT, settle

pytestmark = pytest.mark.services
FAB = "airflow.providers.fab.auth_manager.fab_auth_manager.FabAuthManager"
DAG = "eod_settlement"


@dataclass(frozen=True)
class Server:
    base: str
    env: dict[str, str]
    passwords: dict[str, str]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _airflow(env: dict[str, str], *args: str) -> None:
    res = subprocess.run([str(Path(sys.executable).parent / "airflow"), *args], env=env,
                         capture_output=True, text=True, timeout=300, check=False)
    assert res.returncode == 0, res.stderr[-3000:]


@pytest.fixture
def fab(isolated: Isolated, tmp_path: Path) -> Iterator[Server]:
    port, home = _free_port(), tmp_path / "airflow"
    passwords = {"auditor": secrets.token_urlsafe(16), "operations": secrets.token_urlsafe(16)}
    env = {**isolated.env,
           "AIRFLOW_HOME": str(home),
           "AIRFLOW__CORE__AUTH_MANAGER": FAB,
           "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
           "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
           "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
           "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}",
           "AIRFLOW__API__SECRET_KEY": secrets.token_hex(16),
           "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(32),
           "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(_free_port()),
           "SETTLE_EOD_CRON": "none",
           "PW_AUDITOR": passwords["auditor"], "PW_OPS": passwords["operations"]}
    home.mkdir()
    _airflow(env, "db", "migrate")
    out = settle(["airflow-users", "--grant", "auditor:audit-team:PW_AUDITOR",
                  "--grant", "operations:ops:PW_OPS"], env, timeout=300)
    assert out["users"] == {"audit-team": {"role": "Viewer", "result": "created"},
                            "ops": {"role": "Op", "result": "created"}}
    _airflow(env, "dags", "reserialize")
    log = open(tmp_path / "api-server.log", "wb")
    proc = subprocess.Popen([str(Path(sys.executable).parent / "airflow"), "api-server",
                             "--host", "127.0.0.1", "--port", str(port)], env=env,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            assert proc.poll() is None, (tmp_path / "api-server.log").read_text()[-3000:]
            try:
                if httpx.get(f"{base}/api/v2/monitor/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(1)
        else:
            pytest.fail("the API server did not answer within 180 s")
        yield Server(base, env, passwords)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()


def _client(s: Server, user: str, password: str) -> httpx.Client:
    r = httpx.post(f"{s.base}/auth/token", json={"username": user, "password": password},
                   timeout=30)
    assert r.status_code == 201, (r.status_code, r.text[:300])
    return httpx.Client(base_url=s.base, timeout=60,
                        headers={"Authorization": f"Bearer {r.json()['access_token']}"})


def _trigger(c: httpx.Client) -> httpx.Response:
    return c.post(f"/api/v2/dags/{DAG}/dagRuns",
                  json={"logical_date": None, "conf": {"trade_date": "2026-12-02"}})


def _clear(c: httpx.Client) -> httpx.Response:
    return c.post(f"/api/v2/dags/{DAG}/clearTaskInstances", json={"dry_run": False})


def test_auditors_view_and_operations_act(fab: Server) -> None:
    ops = _client(fab, "ops", fab.passwords["operations"])
    auditor = _client(fab, "audit-team", fab.passwords["auditor"])

    # Operations triggers a run and clears the DAG's tasks.
    triggered = _trigger(ops)
    assert triggered.status_code == 200, triggered.text[:500]
    run_id = triggered.json()["dag_run_id"]
    assert _clear(ops).status_code == 200

    # The auditor sees the DAG, its runs, the run's tasks and the audit reports...
    assert auditor.get(f"/api/v2/dags/{DAG}").status_code == 200
    runs = auditor.get(f"/api/v2/dags/{DAG}/dagRuns")
    assert runs.status_code == 200 and run_id in {r["dag_run_id"] for r in
                                                  runs.json()["dag_runs"]}
    assert auditor.get(f"/api/v2/dags/{DAG}/dagRuns/{run_id}/taskInstances").status_code == 200
    assert auditor.get("/settlement-reports/").status_code == 200
    # ...and may not trigger, clear, pause, delete a run or read connections.
    assert _trigger(auditor).status_code == 403
    assert _clear(auditor).status_code == 403
    assert auditor.patch(f"/api/v2/dags/{DAG}", json={"is_paused": True}).status_code == 403
    assert auditor.delete(f"/api/v2/dags/{DAG}/dagRuns/{run_id}").status_code == 403
    assert auditor.get("/api/v2/connections").status_code == 403
    # Nobody gets in without a login.
    assert httpx.get(f"{fab.base}/api/v2/dags/{DAG}/dagRuns", timeout=30).status_code == 401
    assert httpx.post(f"{fab.base}/auth/token", timeout=30,
                      json={"username": "ops", "password": "wrong"}).status_code == 401


def test_the_ui_login_carries_the_role_and_a_rotation_locks_the_old_password_out(
        fab: Server) -> None:
    # The UI's own login form (FAB's, with its CSRF token), as a browser submits it.
    with httpx.Client(base_url=fab.base, timeout=60, follow_redirects=False) as ui:
        form = ui.get("/auth/login/")
        assert form.status_code == 200
        csrf = re.search(r'name="csrf_token"[^>]*value="([^"]+)"', form.text)
        assert csrf, form.text[:1000]
        done = ui.post("/auth/login/", data={"csrf_token": csrf.group(1),
                                             "username": "audit-team",
                                             "password": fab.passwords["auditor"]})
        assert done.status_code in (302, 303), done.text[:500]
        token = ui.cookies.get("_token")
        assert token
        as_ui = {"Authorization": f"Bearer {token}"}
        assert ui.get(f"/api/v2/dags/{DAG}/dagRuns", headers=as_ui).status_code == 200
        assert ui.post(f"/api/v2/dags/{DAG}/dagRuns", headers=as_ui,
                       json={"logical_date": None}).status_code == 403

    # Rotation: re-running the one-shot with a new password replaces the old one.
    new = secrets.token_urlsafe(16)
    out = settle(["airflow-users", "--grant", "auditor:audit-team:PW_AUDITOR"],
                 {**fab.env, "PW_AUDITOR": new}, timeout=300)
    assert out["users"]["audit-team"] == {"role": "Viewer", "result": "updated"}
    old = httpx.post(f"{fab.base}/auth/token", timeout=30,
                     json={"username": "audit-team", "password": fab.passwords["auditor"]})
    assert old.status_code == 401
    assert _client(fab, "audit-team", new).get(f"/api/v2/dags/{DAG}").status_code == 200


def test_user_grants_are_checked() -> None:
    from settlement.config import ConfigError
    from settlement.orchestration.fab_users import UserGrant

    assert UserGrant.parse("auditor:a:PW") == UserGrant("auditor", "a", "PW")
    for bad in ("viewer:a:PW", "auditor:a", "auditor:bad name:PW"):
        with pytest.raises(ConfigError, match="--grant"):
            UserGrant.parse(bad)
    with pytest.raises(ConfigError, match="SETTLE_TEST_UNSET_PW"):
        UserGrant.parse("auditor:a:SETTLE_TEST_UNSET_PW").password()


def test_a_permission_sync_racing_the_grants_is_retried(monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    """The api-server's start syncs FAB's permissions while the one-shot does the same: the
    unique violation the loser gets is retried (a stack start failed on it once), and a
    violation that persists is raised after the last attempt."""
    from sqlalchemy.exc import IntegrityError

    from settlement.orchestration import fab_users

    monkeypatch.setenv("SETTLE_TEST_PW", "a-long-enough-password")
    grants = [fab_users.UserGrant("auditor", "a", "SETTLE_TEST_PW")]
    calls: list[dict[str, str]] = []

    def collide_once(g: list, passwords: dict[str, str]) -> dict:
        calls.append(passwords)
        if len(calls) == 1:
            raise IntegrityError("INSERT INTO ab_permission_view_role", {}, Exception("dup"))
        return {"a": {"role": "Viewer", "result": "created"}}

    monkeypatch.setattr(fab_users, "_apply", collide_once)
    assert fab_users.apply_user_grants(grants, pause=0) == {
        "a": {"role": "Viewer", "result": "created"}}
    assert calls == [{"a": "a-long-enough-password"}] * 2

    def always(g: list, passwords: dict[str, str]) -> dict:
        calls.append(passwords)
        raise IntegrityError("INSERT", {}, Exception("dup"))

    calls.clear()
    monkeypatch.setattr(fab_users, "_apply", always)
    with pytest.raises(IntegrityError):
        fab_users.apply_user_grants(grants, pause=0)
    assert len(calls) == fab_users.ATTEMPTS
