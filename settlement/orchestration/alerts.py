"""Alerts of the end-of-day DAG: what to tell the operations team, and how it gets there.

Three alerts (runbook entries in docs/operations.md): the run **failed**, the day was
settled from the **database** because Kafka could not supply it, and the day is **late**
(not settled by the cutoff). Each names the trade date, the verdict of the day's latest run
and the link that opens its audit report in the Airflow UI.

Delivery: e-mail through the SMTP provider's hook (connection ``SETTLE_ALERT_SMTP_CONN_ID``,
default ``smtp_default``) to ``SETTLE_ALERT_EMAIL``, and/or a JSON POST to
``SETTLE_ALERT_WEBHOOK``; always the task log. A delivery that fails is logged and does
not mask what caused the alert.
"""

from __future__ import annotations

import json
import logging
import urllib.request
from dataclasses import asdict, dataclass
from html import escape
from typing import Any, Literal

from settlement.config import Settings
from settlement.db import redact
from settlement.orchestration.links import index_url, report_url

log = logging.getLogger(__name__)

AlertKind = Literal["failed", "db_fallback", "late", "instruction_fails"]
TITLES: dict[AlertKind, str] = {
    "failed": "end-of-day settlement FAILED",
    "db_fallback": "settled from the DATABASE (Kafka fallback)",
    "late": "NOT SETTLED by the cutoff",
    "instruction_fails": "settlement FAILS above their threshold",
}


@dataclass(frozen=True)
class DayVerdict:
    """Where a trade date stands: its latest run (if any) and that run's report."""

    trade_date: str
    run_id: int | None
    verdict: str
    source: str | None
    source_reason: str | None
    published: bool
    report_path: str | None
    report_link: str


def verdict_text(run: dict[str, Any]) -> str:
    """One phrase an operator can act on, from a ``pipeline.latest_run`` record."""
    if run["status"] == "running":
        return "running (no verdict yet)"
    if run["validation_success"] is None:
        return f"{run['status']}: no validation verdict ({run.get('error') or 'no report'})"
    if run["validation_success"]:
        return "validation passed, published" if run["published"] else "validation passed"
    if run["published"]:
        return f"validation FAILED, published by operator decision: {run['accepted_incomplete']}"
    return "validation FAILED, not published"


def day_verdict(settings: Settings, trade_date: str, base_url: str) -> DayVerdict:
    """The day's latest run as an alert states it; a day without a run links to the index."""
    from settlement.close.pipeline import latest_run

    try:
        run = latest_run(settings, trade_date)
    except RuntimeError:  # no run recorded for the date
        return DayVerdict(trade_date, None, "not settled: no run recorded", None, None, False,
                          None, index_url(base_url))
    return DayVerdict(trade_date, run["run_id"], verdict_text(run), run["source"],
                      run["source_reason"], bool(run["published"]), run["report_path"],
                      report_url(base_url, run["run_id"]))


@dataclass(frozen=True)
class Alert:
    kind: AlertKind
    day: DayVerdict
    detail: str  # why it fired: the failed task and its error, the fallback reason...
    dag_run: str | None = None

    @property
    def subject(self) -> str:
        return f"[settlement] {self.day.trade_date}: {TITLES[self.kind]} -- {self.day.verdict}"

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "subject": self.subject, "detail": self.detail,
                "dag_run": self.dag_run, **asdict(self.day)}

    def html(self) -> str:
        d = self.day
        rows = [("Trade date", d.trade_date), ("Alert", TITLES[self.kind]),
                ("Verdict", d.verdict), ("Why", self.detail),
                ("Source", f"{d.source or '-'}: {d.source_reason or ''}"),
                ("Run", d.run_id if d.run_id is not None else "-"),
                ("DAG run", self.dag_run or "-"), ("Report file", d.report_path or "-")]
        body = "".join(f"<tr><th align=left>{escape(k)}</th><td>{escape(str(v))}</td></tr>"
                       for k, v in rows)
        link = escape(d.report_link)
        return (f"<h2>{escape(self.subject)}</h2><table>{body}</table>"
                f'<p>Audit report: <a href="{link}">{link}</a></p>'
                "<p>Runbook: docs/operations.md, section Alerts.</p>")


def send_email(alert: Alert, to: str, smtp_conn_id: str) -> None:
    from airflow.providers.smtp.hooks.smtp import SmtpHook

    with SmtpHook(smtp_conn_id=smtp_conn_id) as hook:
        hook.send_email_smtp(to=[a.strip() for a in to.split(",") if a.strip()],
                             subject=alert.subject, html_content=alert.html(),
                             from_email=hook.from_email or "settlement@localhost")


def post_webhook(alert: Alert, url: str) -> None:
    req = urllib.request.Request(url, data=json.dumps(alert.as_dict()).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        resp.read()


def deliver(alert: Alert, settings: Settings) -> list[str]:
    """Log the alert and send it to every configured channel; returns the channels that
    took it."""
    print(f"ALERT {alert.subject}\n  {alert.detail}\n  report: {alert.day.report_link}",
          flush=True)
    sent: list[str] = []
    channels = []
    if settings.alert_email:
        channels.append(("email", lambda: send_email(alert, settings.alert_email or "",
                                                      settings.alert_smtp_conn_id)))
    if settings.alert_webhook:
        channels.append(("webhook", lambda: post_webhook(alert, settings.alert_webhook or "")))
    for name, send in channels:
        try:
            send()
            sent.append(name)
        except Exception as e:  # noqa: BLE001 - a lost alert is logged, never hides the cause
            log.error("alert %s via %s failed: %s", alert.kind, name, redact(str(e)))
            print(f"ALERT DELIVERY FAILED via {name}: {redact(str(e))}", flush=True)
    return sent
