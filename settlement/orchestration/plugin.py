"""The project's Airflow plugin, found through the ``airflow.plugins`` entry point
(pyproject.toml) by every Airflow component:

- the audit reports: a FastAPI app on the API server (``settlement.orchestration.
  reports_app``) and a nav entry, Browse > Audit reports, that shows its index inside the UI;
- the trading-day timetable of ``eod_settlement`` (Airflow only deserialises custom
  timetables that a plugin registers).
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from settlement.orchestration.calendar import TradingDayTimetable
from settlement.orchestration.links import REPORTS_PREFIX, UI_ROUTE


def _reports_app() -> object:
    from settlement.orchestration.reports_app import app

    return app


class SettlementPlugin(AirflowPlugin):
    name = "settlement"
    fastapi_apps = [{"app": _reports_app(), "url_prefix": REPORTS_PREFIX,
                     "name": "Settlement audit reports"}]
    # url_route set: Airflow frames href inside its own page at /plugin/audit-reports. href
    # is relative (no leading slash) so it works behind a reverse proxy's sub-path.
    external_views = [{"name": "Audit reports", "href": f"{REPORTS_PREFIX.lstrip('/')}/",
                       "url_route": UI_ROUTE, "destination": "nav", "category": "browse"}]
    timetables = [TradingDayTimetable]
