"""Alerts of the end-of-day DAG, delivered to a real SMTP server (aiosmtpd) and a real
webhook receiver on loopback: a database fallback, a failed run, a day late."""

from __future__ import annotations

import asyncio
import datetime as dt
import email
import email.policy
import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from email.message import EmailMessage
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from tests.helpers import ROOT

OPS = "ops@example.test"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Inbox:
    messages: list[EmailMessage] = field(default_factory=list)

    async def handle_DATA(self, server, session, envelope) -> str:  # aiosmtpd's handler hook
        msg = email.message_from_bytes(envelope.content, policy=email.policy.default)
        assert isinstance(msg, EmailMessage)
        msg["X-Envelope-To"] = ",".join(envelope.rcpt_tos)
        self.messages.append(msg)
        return "250 OK"

    def wait(self, n: int, timeout: float = 30) -> list[EmailMessage]:
        deadline = time.monotonic() + timeout
        while len(self.messages) < n and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(self.messages) >= n, f"{len(self.messages)} mails arrived, expected {n}"
        return self.messages


def _html(msg: EmailMessage) -> str:
    part = msg.get_body(preferencelist=("html", "plain"))
    assert part is not None
    return part.get_content()


@pytest.fixture
def smtp(monkeypatch: pytest.MonkeyPatch) -> Iterator[Inbox]:
    """A real SMTP server; the smtp_default connection and SETTLE_ALERT_EMAIL point at it."""
    from aiosmtpd.controller import Controller

    inbox = Inbox()
    port = _free_port()
    controller = Controller(inbox, hostname="127.0.0.1", port=port)
    controller.start()
    monkeypatch.setenv("AIRFLOW_CONN_SMTP_DEFAULT", json.dumps({
        "conn_type": "smtp", "host": "127.0.0.1", "port": port,
        "extra": {"disable_ssl": True, "disable_tls": True, "retry_limit": 0,
                  "from_email": "settlement@example.test"}}))
    monkeypatch.setenv("SETTLE_ALERT_EMAIL", OPS)
    try:
        yield inbox
    finally:
        controller.stop()


@pytest.fixture
def webhook(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[dict]]:
    received: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("SETTLE_ALERT_WEBHOOK", f"http://127.0.0.1:{server.server_port}/hook")
    try:
        yield received
    finally:
        server.shutdown()


def _run_eod(settings, day: str, monkeypatch: pytest.MonkeyPatch, source: str = "auto"):
    from airflow.dag_processing.dagbag import DagBag

    from settlement.orchestration.tasks import airflow_connections

    for k, v in airflow_connections(settings).items():
        monkeypatch.setenv(k, v)
    from settlement.orchestration.dagtest import without_deadlines

    dag = without_deadlines(
        DagBag(dag_folder=str(ROOT / "dags" / "eod_settlement.py")).dags["eod_settlement"])
    for task in dag.tasks:
        # Every retry still runs (a failure is mailed only after the last one), a second
        # apart instead of the production minute: dag.test() sleeps through the delay.
        task.retry_delay = dt.timedelta(seconds=1)
    return dag.test(run_conf={"trade_date": day, "source": source})


def _latest_run(dsn: str, day: str) -> tuple[int, str]:
    from settlement.db import connect

    with connect(dsn) as conn:
        row = conn.execute("select run_id, report_path from settlement_runs"
                           " where trade_date = %s order by run_id desc limit 1",
                           (day,)).fetchone()
    assert row is not None
    return row[0], row[1]


@pytest.fixture(scope="session")
def airflow_db() -> None:
    import subprocess
    import sys

    res = subprocess.run([str(Path(sys.executable).parent / "airflow"), "db", "migrate"],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]


@pytest.mark.services
def test_db_fallback_then_failure_are_mailed_with_date_verdict_and_report_link(
        isolated, tmp_path: Path, airflow_db: None, smtp: Inbox,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.helpers import ingest_day, kafka_down

    day = "2026-11-24"
    ingest_day(isolated.env, tmp_path, day, ["a", "b"], "separate", trades=2000)

    with kafka_down(isolated.settings) as down:  # the tasks' kafka_default refuses
        # Kafka down: the day is settled from the ledgers, and operations are told so.
        run = _run_eod(down, day, monkeypatch)
        assert str(run.state) == "success", run.state
        run_id, report = _latest_run(isolated.settings.settlement_dsn, day)
        (mail,) = smtp.wait(1)
        assert mail["X-Envelope-To"] == OPS
        assert day in mail["Subject"] and "DATABASE" in mail["Subject"]
        body = _html(mail)
        assert "validation passed, published" in body
        assert "Kafka is unreachable" in body
        assert f"/settlement-reports/runs/{run_id}" in body and report in body

        # An operator insists on Kafka while it is still down: choose_source fails (after its
        # retries) and the failure is mailed, with the day's standing (run 1 published it).
        failed = _run_eod(down, day, monkeypatch, source="kafka")
        assert str(failed.state) == "failed", failed.state
    mails = smtp.wait(2)
    assert len(mails) == 2, [m["Subject"] for m in mails]
    failure = mails[-1]
    assert day in failure["Subject"] and "FAILED" in failure["Subject"]
    body = _html(failure)
    assert "task choose_source failed" in body and "--source kafka was requested" in body
    assert "validation passed, published" in body
    assert f"/settlement-reports/runs/{run_id}" in body


@pytest.mark.services
def test_late_day_is_mailed_and_posted(services, smtp: Inbox, webhook: list[dict]) -> None:
    """The cutoff deadline's callback, as the triggerer calls it, for a day with no run."""
    from airflow.dag_processing.dagbag import DagBag

    from settlement.orchestration.tasks import on_deadline_missed

    dag = DagBag(dag_folder=str(ROOT / "dags" / "eod_settlement.py")).dags["eod_settlement"]
    (deadline,) = dag.deadline
    assert deadline.callback.path == "settlement.orchestration.tasks.on_deadline_missed"
    assert deadline.interval.total_seconds() == 180 * 60  # SETTLE_EOD_CUTOFF_MINUTES default

    day = "2031-01-02"  # nothing has ever been settled for it
    context = {"dag_run": {"dag_id": "eod_settlement", "run_id": "scheduled__late",
                           "logical_date": "2031-01-02T21:30:00+00:00", "conf": {},
                           "state": "running"},
               "deadline": {"id": "x", "deadline_time": "2031-01-03T00:30:00+00:00"}}
    asyncio.run(on_deadline_missed(context=context))
    (mail,) = smtp.wait(1)
    assert day in mail["Subject"] and "NOT SETTLED" in mail["Subject"]
    body = _html(mail)
    assert "not settled: no run recorded" in body
    assert "/settlement-reports/" in body and "scheduled__late" in body
    (posted,) = webhook
    assert posted["kind"] == "late" and posted["trade_date"] == day
    assert posted["report_link"].endswith("/settlement-reports/")
