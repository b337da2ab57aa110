"""What the Airflow DAGs call. DAG files stay thin: wiring only, logic here.

Airflow connections (by conn_id) say where things are; tasks turn them into ``Settings``:

- ``kafka_default``: conn_type kafka, extra ``{"bootstrap.servers": "host:port,..."}``
- ``settlement_db``, ``ledger_a``, ``ledger_b``, ``ledger_shared``: PostgreSQL URIs
- ``spark_default``: conn_type spark, host = the master URL (``local[2]`` embedded)

``airflow_connections`` renders these as ``AIRFLOW_CONN_*`` environment variables for the
embedded services (used by ``make airflow`` and the DAG tests).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import sys
from pathlib import Path
from typing import Any

from settlement.config import CompressedDays, Settings, load_settings

LEDGER_CONNS = {"a": "ledger_a", "b": "ledger_b", "shared": "ledger_shared"}
# The time zone of a cron schedule (SETTLE_EOD_CRON) and, when set, of the trade date a
# scheduled run settles; unset, the trade date is the session's date in the exchange's zone.
EOD_TIMEZONE = os.environ.get("SETTLE_EOD_TIMEZONE", "America/New_York")
# Spark jobs take one slot of this pool (created by `make airflow`, `settle demo` and
# docker-compose's airflow-init), so two settlements never fight over two cores.
SPARK_POOL = "spark"
# The settle task may wait for another site's close of the date (SETTLE_CLOSE_WAIT_SECONDS)
# and then compute the day itself (its holder crashed): its timeout covers both, so the
# wait's own bound fires first and says why, instead of Airflow killing a silent waiter.
SETTLE_COMPUTE_ALLOWANCE = dt.timedelta(hours=1)
SPARK_POOL_DESCRIPTION = "one Spark settlement job at a time"
# Downstream DAGs schedule on this asset: an event per published trading day, its extra
# naming the date, the run and the report.
SETTLED_DAY_ASSET = "settled_trading_day"
SETTLED_DAY_URI = "settlement://published_days"
# The spark-submit application: a file, found next to this package (checkout or wheel).
JOB = Path(__file__).resolve().parents[1] / "submit.py"


def _pg_uri(dsn: str) -> str:
    return dsn.replace("postgresql://", "postgres://", 1)


def airflow_connections(settings: Settings) -> dict[str, str]:
    """AIRFLOW_CONN_* values pointing at the services this configuration uses: Airflow's
    tasks are the end of day, so they log in as the settlement user."""
    settings = settings.for_component("settlement")
    conns = {
        "AIRFLOW_CONN_KAFKA_DEFAULT": json.dumps({
            "conn_type": "kafka",
            "extra": {"bootstrap.servers": settings.bootstrap(),
                      "security.protocol": settings.kafka_protocol}}),
        "AIRFLOW_CONN_SETTLEMENT_DB": _pg_uri(settings.settlement_dsn),
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({
            "conn_type": "spark", "host": settings.spark_master,
            "extra": {"deploy-mode": "client", "spark-binary": "spark-submit"}}),
    }
    for ledger, conn_id in LEDGER_CONNS.items():
        conns[f"AIRFLOW_CONN_{conn_id.upper()}"] = _pg_uri(settings.ledger_dsn(ledger))
    return conns


def settings_from_airflow() -> Settings:
    """Settings for a task: the SETTLE_ environment, overridden by the Airflow connections."""
    from airflow.sdk import BaseHook

    def uri(conn_id: str) -> str:
        return BaseHook.get_connection(conn_id).get_uri().replace("postgres://",
                                                                  "postgresql://", 1)

    kafka = BaseHook.get_connection("kafka_default").extra_dejson
    spark = BaseHook.get_connection("spark_default")
    overrides: dict[str, Any] = {
        "kafka_bootstrap": kafka["bootstrap.servers"],
        "kafka_security_protocol": kafka.get("security.protocol"),
        "pg_dsn": uri("settlement_db"),
        "spark_master": spark.host or "local[2]",
        **{f"ledger_{led}_dsn": uri(cid) for led, cid in LEDGER_CONNS.items()},
    }
    return load_settings(**overrides)


def settle_env(settings: Settings) -> dict[str, str]:
    """Environment for the spark-submit'ed job: the same services, the same Python, logged
    in as the settlement user. On the embedded server the DSNs carry no password (it stays
    in the pgpass file they name)."""
    settings = settings.for_component("settlement")
    env = {
        "SETTLE_KAFKA_BOOTSTRAP": settings.bootstrap(),
        "SETTLE_KAFKA_SECURITY_PROTOCOL": settings.kafka_protocol,
        "SETTLE_PG_DSN": settings.settlement_dsn,
        "SETTLE_TOPIC": settings.topic,
        "SETTLE_PARTITIONS": str(settings.partitions),
        "SETTLE_SPARK_MASTER": settings.spark_master,
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": os.environ.get("SPARK_LOCAL_IP", "127.0.0.1"),
        "GX_ANALYTICS_ENABLED": "false",
        "PATH": os.environ.get("PATH", ""),
    }
    for ledger in LEDGER_CONNS:
        env[f"SETTLE_LEDGER_{ledger.upper()}_DSN"] = settings.ledger_dsn(ledger)
    return env


def eod_schedule(settings: Settings) -> Any:
    """``eod_settlement``'s schedule: the exchange's trading days (the default), a cron
    expression from ``SETTLE_EOD_CRON`` (weekdays regardless of holidays), or ``none`` for
    manual runs only."""
    from settlement.orchestration.calendar import TradingDayTimetable

    if settings.eod_compressed:
        return CompressedDays.parse(settings.eod_compressed).cron
    cron = settings.eod_cron.strip()
    if cron.lower() == "none":
        return None
    if cron:
        return cron
    return TradingDayTimetable(settings.exchange_calendar, settings.eod_after_close_minutes)


def eod_deadline(settings: Settings) -> Any:
    """The "not settled by the cutoff" alert: an Airflow deadline, ``SETTLE_EOD_CUTOFF_MINUTES``
    after the run was queued (a scheduled run is queued at close + the delay), whose
    callback runs in the triggerer."""
    from airflow.sdk.definitions.callback import AsyncCallback
    from airflow.sdk.definitions.deadline import DeadlineAlert, DeadlineReference

    return DeadlineAlert(reference=DeadlineReference.DAGRUN_QUEUED_AT,
                         interval=dt.timedelta(minutes=settings.eod_cutoff_minutes),
                         callback=AsyncCallback(on_deadline_missed), name="eod_cutoff")


def settled_day_asset() -> Any:
    from airflow.sdk import Asset

    return Asset(name=SETTLED_DAY_ASSET, uri=SETTLED_DAY_URI)


def drills_enabled() -> bool:
    """Whether to register the failover_drill DAG (``SETTLE_DRILLS_ENABLED``)."""
    return load_settings().drills_enabled


def trade_date_for(params: dict[str, Any], logical_date: dt.datetime | None,
                   calendar: str | None = None) -> str:
    """The business date of a run: the ``trade_date`` param, else the scheduled day in the
    exchange's time zone (a 16:30 New York run settles that New York day)."""
    if params.get("trade_date"):
        from settlement.config import check_date

        return check_date(str(params["trade_date"]))
    import pendulum

    from settlement.orchestration.calendar import calendar_timezone

    settings = load_settings()
    when = pendulum.instance(logical_date or dt.datetime.now(dt.UTC))
    if settings.eod_compressed:
        return CompressedDays.parse(settings.eod_compressed).trade_date(when)
    tz = os.environ.get("SETTLE_EOD_TIMEZONE") or calendar_timezone(
        calendar or settings.exchange_calendar)
    return when.in_timezone(tz).date().isoformat()


def close_markers_in(settings: Settings, trade_date: str) -> tuple[bool, str]:
    """Sensor check: some ledger holds every partition's close marker for the day."""
    from settlement.eod.sources import ledger_states

    seen = []
    for name, st in ledger_states(settings, trade_date).items():
        seen.append(f"{name}: {len(st.markers)}/{settings.partitions}")
        if len(st.markers) >= settings.partitions:
            return True, f"ledger {name} has all {settings.partitions} close markers"
    return False, "waiting for close markers (" + ", ".join(seen) + ")"


def settle_timeout(settings: Settings) -> dt.timedelta:
    """The settle task's execution_timeout: the longest wait for another close, then a close."""
    return dt.timedelta(seconds=settings.close_wait_seconds) + SETTLE_COMPUTE_ALLOWANCE


def spark_jars_csv(settings: Settings) -> str:
    from settlement.spark.session import spark_jars

    return ",".join(spark_jars(settings))


def run_outcome(settings: Settings, trade_date: str, rerun: bool = True) -> dict[str, Any]:
    """What the settle task's run recorded: verdict, report, and the failures in one line
    each (no secrets: this is an XCom). Without ``rerun`` the settle task settled only an
    unsettled date: a date already settled (by the other site's close, say) reports the run
    that settled it."""
    from settlement.close.pipeline import latest_run
    from settlement.eod.lease import settled_by

    done = None if rerun else settled_by(settings, trade_date)
    if done is not None:
        print(f"{trade_date} is settled by run {done}")
    run = latest_run(settings, trade_date, done)
    if run["report_path"] is None:
        raise RuntimeError(f"run {run['run_id']} for {trade_date} wrote no report "
                           f"(status {run['status']}: {run['error']})")
    def lines(kind: str) -> list[str]:
        return [f"{f['suite']}: {f['name']} {f['examples'][:3]}"
                for f in run["validation"].get(kind, [])]

    return {k: run[k] for k in ("run_id", "trade_date", "source", "source_reason", "trades",
                                "validation_success", "report_path", "published",
                                "accepted_incomplete")} | {"failures": lines("failures"),
                                                           "warnings": lines("warnings")}


def publish_report(settings: Settings, outcome: dict[str, Any],
                   outlet_events: Any = None) -> str:
    """Say where the audit report is; alert when the day came from the database; fail the
    run when the day was not published because validation failed (the report, already
    written, says why). A day an operator forced through is published with a warning naming
    their reason. A published day emits the settled-day asset event."""
    from airflow.sdk.exceptions import AirflowFailException

    from settlement.orchestration.alerts import Alert, day_verdict, deliver
    from settlement.orchestration.links import airflow_base_url, report_url

    path = outcome["report_path"]
    base = airflow_base_url()
    print(f"audit report for {outcome['trade_date']} (run {outcome['run_id']}): {path}")
    print(f"open it in the Airflow UI: {report_url(base, outcome['run_id'])}")
    print(f"source: {outcome['source']} -- {outcome['source_reason']}")
    if outcome["source"] == "db":
        deliver(Alert("db_fallback", day_verdict(settings, outcome["trade_date"], base),
                      f"Kafka could not supply the day: {outcome['source_reason']}"), settings)
    if outcome.get("published") and outlet_events is not None:
        outlet_events[settled_day_asset()].extra = {
            "trade_date": outcome["trade_date"], "run_id": outcome["run_id"],
            "source": outcome["source"], "validation_success": outcome["validation_success"],
            "report_url": report_url(base, outcome["run_id"])}
    for warning in outcome.get("warnings", []):
        print(f"WARNING (does not block publication): {warning}")
    if outcome["validation_success"]:
        return path
    failures = "; ".join(outcome["failures"])
    if outcome.get("published"):
        print(f"WARNING: validation failed ({failures}) but the day was published by operator "
              f"decision: {outcome.get('accepted_incomplete')}")
        return path
    raise AirflowFailException(
        f"validation failed for {outcome['trade_date']}, not published (the previous "
        f"published day is unchanged): {failures} -- see {path}")


def write_instructions(settings: Settings, trade_date: str) -> dict[str, Any]:
    """After publication: the published day's settlement instructions as CSV and ISO 20022
    files beside the audit reports (the close wrote them already; a close this site joined
    was another site's, so this site's files are written here). Idempotent: a run's
    instructions are fixed once written. The XCom holds paths and counts, no secret."""
    from settlement.instructions import write_files

    sent = write_files(settings, trade_date)
    print(f"{sent['instructions']} settlement instructions of {trade_date} (run "
          f"{sent['run_id']}, version {sent['version']}) settle on {sent['settlement_date']}:")
    for fmt, path in sent["paths"].items():
        print(f"  {fmt}: {path}")
    if sent["carried_in"]:
        print(f"  fails carried in: {', '.join(sent['carried_in'])}")
    return sent


def run_drill_task(params: dict[str, Any]) -> dict[str, Any]:
    """The failover_drill DAG's task: one drill; raises if it lost or duplicated anything."""
    from airflow.sdk.exceptions import AirflowFailException

    from settlement.drills import drill

    spec = drill.DrillSpec(scheme=params["scheme"], fault=params["fault"],
                           trades=int(params["trades"]), seed=int(params["seed"]),
                           at=float(params["at"]))
    # A drill is the admin's exercise (enabled only outside production, SETTLE_DRILLS_ENABLED):
    # it creates its own namespace and kills and restarts services, so it runs with the
    # SETTLE_ configuration, not Airflow's connections (they log in as the settlement user,
    # which may not create databases).
    res = drill.run_drill(spec, load_settings())
    out = drill.summary([res])["drills"][0] | {"rto_note": res.rto_note,
                                              "report_path": res.report_path}
    print(json.dumps(out, indent=2))
    if not res.passed:
        raise AirflowFailException(f"drill failed: {out}")
    return out


def _alert_for_run(kind: str, trade_date: str, detail: str, dag_run: str | None) -> None:
    from settlement.orchestration.alerts import Alert, day_verdict, deliver
    from settlement.orchestration.links import airflow_base_url

    try:
        settings = settings_from_airflow()
    except Exception:  # noqa: BLE001 - the alert must go out even without the connections
        settings = load_settings()
    verdict = day_verdict(settings, trade_date, airflow_base_url())
    if kind == "late" and verdict.published:
        print(f"{trade_date} was published meanwhile ({verdict.verdict}): not late")
        return
    deliver(Alert(kind, verdict, detail, dag_run), settings)  # type: ignore[arg-type]


def on_task_failure(context: Any) -> None:
    """eod_settlement's on_failure_callback: a task failed for good (retries spent)."""
    from settlement.db import redact

    ti = context["ti"]
    day = trade_date_for(context.get("params") or {}, context.get("logical_date"))
    error = redact(str(context.get("exception") or "see the task log"))[:500]
    run = context.get("dag_run")
    _alert_for_run("failed", day, f"task {ti.task_id} failed: {error}",
                   getattr(run, "run_id", None))


async def on_deadline_missed(context: dict[str, Any] | None = None, **_: Any) -> None:
    """The eod_cutoff deadline's callback (in the triggerer): the run has not finished by
    the cutoff. A day published meanwhile is not late."""
    import asyncio

    import pendulum

    run = (context or {}).get("dag_run") or {}
    logical = run.get("logical_date")
    day = trade_date_for(run.get("conf") or {}, pendulum.parse(logical) if logical else None)
    deadline = ((context or {}).get("deadline") or {}).get("deadline_time")
    await asyncio.to_thread(
        _alert_for_run, "late", day,
        f"the run had not finished by the cutoff ({deadline}); state {run.get('state')}",
        run.get("run_id"))
