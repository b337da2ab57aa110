"""Where the audit reports are in the Airflow UI: one place for the plugin's routes and the
links that alerts and task logs print."""

from __future__ import annotations

# Mounted by settlement.orchestration.plugin on Airflow's API server (not under the reserved
# /api/v2, /ui, /auth, /execution prefixes).
REPORTS_PREFIX = "/settlement-reports"
# The page inside Airflow's own UI (nav menu "Browse > Audit reports") that frames the index.
UI_ROUTE = "audit-reports"


def airflow_base_url() -> str:
    """Airflow's public URL ([api] base_url), as the people reading an alert reach it."""
    from airflow.configuration import conf

    return str(conf.get("api", "base_url", fallback="http://localhost:8080")).rstrip("/")


def index_url(base: str) -> str:
    return f"{base}{REPORTS_PREFIX}/"


def report_url(base: str, run_id: int) -> str:
    return f"{base}{REPORTS_PREFIX}/runs/{run_id}"
