"""The operations audit report of one settlement run: HTML for people, JSON for tools.

Self-contained (inline CSS and SVG, no scripts or remote assets) so an auditor can open the
file anywhere. Both files go to the reports directory; the JSON is also stored in the
``audit_reports`` table next to the run it describes. They hold every account's
obligations, so they are written for their owner only (0600, folders 0700) whatever the
umask.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from settlement.config import Settings
from settlement.db import connect, q
from settlement.eod.model import Publication, SettlementResult, SourceChoice
from settlement.report.facts import gather_facts
from settlement.report.html import relative_docs, render_html
from settlement.services.procs import write_private
from settlement.validation.run import ValidationOutcome


@dataclass(frozen=True)
class ReportFiles:
    html: Path
    json: Path


@dataclass(frozen=True)
class PlannedReport:
    """A run's report as facts, before its files exist: the publishing transaction stores
    the facts (``store_report``), and whoever finishes the run writes the files from them."""

    trade_date: str
    run_id: int
    facts: dict[str, Any]
    files: ReportFiles


def report_files(settings: Settings, trade_date: str, run_id: int) -> ReportFiles:
    html = Path(settings.reports_dir) / trade_date / f"audit-{trade_date}-run{run_id}.html"
    return ReportFiles(html, html.with_suffix(".json"))


def plan_report(settings: Settings, run_id: int, trade_date: str, choice: SourceChoice,
                result: SettlementResult, outcome: ValidationOutcome, publication: Publication,
                instructions: dict[str, Any] | None = None) -> PlannedReport:
    facts = gather_facts(settings, run_id, trade_date, choice, result, outcome, publication,
                         instructions)
    return PlannedReport(trade_date, run_id, facts, report_files(settings, trade_date, run_id))


def store_report(conn: psycopg.Connection, report: PlannedReport) -> None:
    """The run's report row (append-only: one per run), in the caller's transaction."""
    conn.execute(q("report", "store_report"), {
        "trade_date": report.trade_date, "run_id": report.run_id,
        "report_json": json.dumps(report.facts, default=str),
        "html_path": str(report.files.html)})


def render_report(settings: Settings, report: PlannedReport) -> ReportFiles:
    """The report's files from its facts (rewriting them gives the same pages)."""
    settings.reports_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    write_private(report.files.json, json.dumps(report.facts, indent=2, default=str))
    # The stored facts keep the Data Docs' file:// addresses (the served page shows them as
    # text); the file on disk links them relative to itself.
    write_private(report.files.html,
                  render_html(relative_docs(report.facts, report.files.html.parent)))
    return report.files


def write_report(settings: Settings, run_id: int, trade_date: str, choice: SourceChoice,
                 result: SettlementResult, outcome: ValidationOutcome,
                 publication: Publication,
                 instructions: dict[str, Any] | None = None) -> ReportFiles:
    """The report of a run that did not publish: facts, files, then its row."""
    report = plan_report(settings, run_id, trade_date, choice, result, outcome, publication,
                         instructions)
    files = render_report(settings, report)
    with connect(settings.settlement_dsn) as conn:
        store_report(conn, report)
        conn.commit()
    return files


def stored_report(settings: Settings, run_id: int) -> PlannedReport | None:
    """A run's report as its row holds it (what a close that finds the day published
    renders when the files are missing)."""
    with connect(settings.settlement_dsn) as conn:
        row = conn.execute(q("report", "stored_report"), {"run_id": run_id}).fetchone()
    if row is None:
        return None
    trade_date, facts, html = str(row[0]), row[1], Path(row[2])
    return PlannedReport(trade_date, run_id, facts, ReportFiles(html, html.with_suffix(".json")))
