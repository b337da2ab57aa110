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

from settlement.config import Settings
from settlement.db import connect, q
from settlement.eod.model import Publication, SettlementResult, SourceChoice
from settlement.report.facts import gather_facts
from settlement.report.html import render_html
from settlement.services.procs import write_private
from settlement.validation.run import ValidationOutcome


@dataclass(frozen=True)
class ReportFiles:
    html: Path
    json: Path


def write_report(settings: Settings, run_id: int, trade_date: str, choice: SourceChoice,
                 result: SettlementResult, outcome: ValidationOutcome,
                 publication: Publication,
                 instructions: dict[str, Any] | None = None) -> ReportFiles:
    facts = gather_facts(settings, run_id, trade_date, choice, result, outcome, publication,
                         instructions)
    out = settings.reports_dir / trade_date
    settings.reports_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    html_path = out / f"audit-{trade_date}-run{run_id}.html"
    json_path = html_path.with_suffix(".json")
    write_private(json_path, json.dumps(facts, indent=2, default=str))  # makes `out` 0700
    write_private(html_path, render_html(facts))
    with connect(settings.settlement_dsn) as conn:
        conn.execute(q("report", "store_report"), {
            "trade_date": trade_date, "run_id": run_id,
            "report_json": json.dumps(facts, default=str), "html_path": str(html_path)})
        conn.commit()
    return ReportFiles(html_path, json_path)
