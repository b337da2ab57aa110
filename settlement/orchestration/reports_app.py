"""The audit reports in the Airflow UI: a FastAPI app that Airflow's API server mounts (see
``settlement.orchestration.plugin``) at ``/settlement-reports``.

- ``/settlement-reports/``: the index, one row per stored report (date, run, source,
  verdict), newest first, each linking to its report;
- ``/settlement-reports/runs/<run_id>``: the report rendered from the JSON facts stored in
  ``audit_reports`` (never from a file a row names: a forged ``html_path`` must not make
  the API server read ``/proc/self/environ`` for a viewer);
- ``/settlement-reports/runs/<run_id>.json``: the JSON facts.

Plugin apps are not behind Airflow's authentication by themselves: every route requires a
logged-in Airflow user allowed to read ``eod_settlement``'s runs (the UI's session cookie
or a bearer token, checked by Airflow's own auth manager). FastAPI's own ``/docs``,
``/redoc`` and ``/openapi.json`` would answer outside those dependencies, so they are off.
Every answer carries a Content-Security-Policy without scripts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from html import escape
from typing import Any

from fastapi import Depends, FastAPI, HTTPException, Request, Response
from fastapi.responses import HTMLResponse, JSONResponse

from settlement.db import connect, q
from settlement.orchestration.alerts import verdict_text

EOD_DAG_ID = "eod_settlement"
INDEX_LIMIT = 500


async def _authorized(request: Request) -> None:
    """Airflow's own user resolution (bearer token, else the UI's session cookie: 401 without
    either), then its auth manager's verdict on reading the end-of-day DAG's runs.

    Imported here, not at the top: every Airflow process loads the plugin, and only the API
    server needs the API's security machinery (seconds of imports)."""
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.models.resource_details import (
        DagAccessEntity,
        DagDetails,
    )
    from airflow.api_fastapi.core_api.security import get_user
    from fastapi.security import HTTPAuthorizationCredentials

    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    bearer = (HTTPAuthorizationCredentials(scheme=scheme, credentials=token)
              if scheme.lower() == "bearer" and token else None)
    user = await get_user(request, None, bearer)
    if not get_auth_manager().is_authorized_dag(
            method="GET", access_entity=DagAccessEntity.RUN, details=DagDetails(id=EOD_DAG_ID),
            user=user):
        raise HTTPException(status_code=403, detail=f"not allowed to read {EOD_DAG_ID} runs")


app = FastAPI(title="Settlement audit reports", dependencies=[Depends(_authorized)],
              docs_url=None, redoc_url=None, openapi_url=None)


@app.middleware("http")
async def _headers(request: Request, call_next: Any) -> Response:
    from settlement.report.html import CSP

    response: Response = await call_next(request)
    response.headers["Content-Security-Policy"] = CSP
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Referrer-Policy"] = "no-referrer"
    return response


def settlement_dsn() -> str:
    """The settlement database: the ``settlement_db`` Airflow connection, else SETTLE_PG_DSN
    (the embedded default)."""
    from airflow.exceptions import AirflowNotFoundException
    from airflow.models.connection import Connection

    from settlement.config import load_settings

    try:
        uri = Connection.get_connection_from_secrets("settlement_db").get_uri()
        return uri.replace("postgres://", "postgresql://", 1)
    except AirflowNotFoundException:
        return load_settings().for_component("auditor").settlement_dsn


@dataclass(frozen=True)
class IndexRow:
    trade_date: str
    run_id: int
    source: str
    source_reason: str
    verdict: str
    ok: bool
    trades: int | None
    created_at: str


def report_index(dsn: str, limit: int = INDEX_LIMIT) -> list[IndexRow]:
    with connect(dsn) as conn:
        rows = conn.execute(q("reports_ui", "report_index"), {"limit": limit}).fetchall()
    out = []
    for (day, run_id, source, reason, status, success, published, accepted, error, trades,
         created) in rows:
        run = {"status": status, "validation_success": success, "published": published,
               "accepted_incomplete": accepted, "error": error}
        out.append(IndexRow(day.isoformat(), run_id, source, reason, verdict_text(run),
                            bool(success), trades, created.strftime("%Y-%m-%d %H:%M:%S %Z")))
    return out


def render_index(rows: list[IndexRow]) -> str:
    body = "".join(
        f'<tr class="{"ok" if r.ok else "bad"}"><td>{escape(r.trade_date)}</td>'
        f'<td class="n">{r.run_id}</td><td title="{escape(r.source_reason)}">'
        f'{escape(r.source)}</td><td class="verdict">{escape(r.verdict)}</td>'
        f'<td class="n">{"" if r.trades is None else f"{r.trades:,}"}</td>'
        f"<td>{escape(r.created_at)}</td>"
        f'<td><a href="runs/{r.run_id}">report {escape(r.trade_date)} run {r.run_id}</a>'
        f' · <a href="runs/{r.run_id}.json">JSON</a></td></tr>' for r in rows)
    empty = "" if rows else '<p class="muted">No audit reports yet.</p>'
    return f"""<!doctype html><html><head><meta charset="utf-8">
<title>Audit reports</title><style>
body{{font:14px/1.45 system-ui,sans-serif;margin:1.5rem;color:#1b1f24}}
table{{border-collapse:collapse;width:100%}}th,td{{border-bottom:1px solid #eaeef2;
padding:.35rem .5rem;text-align:left}}td.n{{text-align:right}}
tr.ok td.verdict{{color:#116329}}tr.bad td.verdict{{color:#a40e26;font-weight:600}}
.muted{{color:#57606a}}</style></head><body>
<h1>Audit reports</h1>
<p class="muted">One row per end-of-day settlement run with a report, newest trade date first.
The source's reason is in its tooltip.</p>{empty}
<table><thead><tr><th>Trade date</th><th>Run</th><th>Source</th><th>Verdict</th>
<th>Trades</th><th>Written</th><th>Report</th></tr></thead><tbody>{body}</tbody></table>
</body></html>"""


def _facts(dsn: str, run_id: int) -> Any:
    with connect(dsn) as conn:
        row = conn.execute(q("reports_ui", "report_of_run"), {"run_id": run_id}).fetchone()
    if row is None:
        raise HTTPException(status_code=404, detail=f"no audit report for run {run_id}")
    facts = row[0]
    return json.loads(facts) if isinstance(facts, str) else facts


def render_report(facts: Any) -> str:
    """The report page from stored facts; facts the renderer cannot read (a hand-edited or
    forged row) are shown as escaped JSON rather than failing the page."""
    from settlement.report.html import CSP, render_html

    try:
        if isinstance(facts, dict):
            return render_html(facts)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError):
        pass
    return ('<!doctype html><html lang=en><head><meta charset=utf-8>'
            f'<meta http-equiv="Content-Security-Policy" content="{escape(CSP)}">'
            "<title>Audit report (raw facts)</title></head><body>"
            "<p>This report's stored facts do not have the expected shape; they are shown "
            "as stored.</p><pre>" + escape(json.dumps(facts, indent=2, default=str))
            + "</pre></body></html>")


@app.get("/", response_class=HTMLResponse)
def index() -> HTMLResponse:
    return HTMLResponse(render_index(report_index(settlement_dsn())))


@app.get("/runs/{run_id}.json")
def report_json(run_id: int) -> JSONResponse:
    return JSONResponse(_facts(settlement_dsn(), run_id))


@app.get("/runs/{run_id}", response_class=HTMLResponse)
def report_html(run_id: int) -> HTMLResponse:
    dsn = settlement_dsn()
    facts = _facts(dsn, run_id)
    if isinstance(facts, dict) and isinstance(facts.get("settlement"), dict):
        # The page links the instructions served below, and lists the fails the agent has
        # reported since the report was written (the file cannot know them).
        from settlement.instructions.store import carried_out

        facts["settlement"] = {**facts["settlement"], "carried_out": carried_out(dsn, run_id),
                               "members": _members(dsn, run_id),
                               "files": {"csv": f"{run_id}/instructions.csv",
                                         "iso20022": f"{run_id}/instructions.xml"}}
    if isinstance(facts, dict):
        amended = amended_since(str(facts.get("trade_date")), run_id)
        if amended is not None:
            facts["amended_since"] = amended
    return HTMLResponse(render_report(facts))


def _members(dsn: str, run_id: int) -> list[dict[str, Any]]:
    """The run's per-member summary as the reference data maps its accounts now."""
    from settlement.config import load_settings
    from settlement.instructions import member_summary
    from settlement.instructions.store import run_set

    day = run_set(dsn, run_id)
    if day is None:
        return []
    return [m.as_dict() for m in member_summary(load_settings(), day, dsn)]


def amended_since(trade_date: str, run_id: int) -> dict[str, Any] | None:
    """When ``run_id`` is its date's published run and post-close amendments have come since
    (the day awaits a re-close): how many and since when; the report was written before them."""
    import psycopg

    from settlement.config import load_settings
    from settlement.status import awaiting_reclose

    try:
        waiting = awaiting_reclose(load_settings().for_component("auditor"), trade_date)
    except (psycopg.Error, ValueError):
        return None  # the page stands without the note
    for w in waiting:
        if w.published_run == run_id:
            return w.as_dict()
    return None


@app.get("/runs/{run_id}/instructions.{fmt}")
def instructions_file(run_id: int, fmt: str) -> Response:
    """A run's settlement instructions, rendered from the database (never from a file)."""
    from settlement.config import load_settings
    from settlement.instructions import render_set
    from settlement.instructions.store import run_set

    kinds = {"csv": ("csv", "text/csv"), "xml": ("iso20022", "application/xml")}
    if fmt not in kinds:
        raise HTTPException(status_code=404, detail="instructions are .csv or .xml")
    day = run_set(settlement_dsn(), run_id)
    if day is None:
        raise HTTPException(status_code=404, detail=f"run {run_id} has no instructions")
    kind, media = kinds[fmt]
    return Response(render_set(load_settings(), day, kind, settlement_dsn())[0],
                    media_type=media,
                    headers={"Content-Disposition": f'attachment; filename="{day.trade_date}'
                             f'-run{run_id}.{fmt}"'})
