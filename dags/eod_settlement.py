"""
### End-of-day settlement

Runs on the exchange's trading days only (`SETTLE_EXCHANGE_CALENDAR`, default `XNYS`:
holidays and weekends skipped), `SETTLE_EOD_AFTER_CLOSE_MINUTES` (default 30) after each
session's close, early closes included; `SETTLE_EOD_CRON` replaces that with a cron
expression, or `none` for manual runs only (and, in soak tests only, `SETTLE_EOD_COMPRESSED`
with compressed trading days). It settles one trade date:

1. **wait_for_close**: a reschedule-mode sensor until a ledger holds every partition's
   market-close marker for the day;
2. **choose_source**: Kafka when it holds the whole day, else the ledger database; the
   reason is in this task's log and its `source_reason` XCom;
3. **settle_from_kafka / settle_from_db**: the PySpark job via `spark-submit` on the
   `spark_default` connection (master `local[2]` embedded, a cluster in production), one
   slot of the `spark` pool. One job reads the day once, settles it, validates it in hand
   with Great Expectations (no trade lost, none duplicated, sites reconcile, netting
   balances), publishes the results and writes the audit report (HTML + JSON, also in
   PostgreSQL);
4. **publish_report**: reads the run's record, names the report (Browse > Audit reports
   opens it); fails the run if validation failed; a published day updates the
   `settled_trading_day` asset, which downstream DAGs can schedule on;
5. **write_instructions**: the published day's settlement instructions for its settlement
   date (T+`SETTLE_SETTLEMENT_CYCLE` settlement days), CSV and ISO 20022 sese.023, beside the
   audit reports, with the fails the settlement agent reported carried in.

Alerts (e-mail to `SETTLE_ALERT_EMAIL` via `smtp_default`, and/or `SETTLE_ALERT_WEBHOOK`;
runbook in docs/operations.md): a task failed, the day was settled from the database, the
day is not settled `SETTLE_EOD_CUTOFF_MINUTES` (default 180) after the run was queued.

One close per date across both sites: both sites' schedulers may run this DAG; the settle
task takes the date's close lease in the settlement database, or waits for the close holding
it and reports that run (`joined_run_id`). A date a passing run already published since its
close markers is not settled again ("already settled by run N") unless `rerun` is set.

Params: `trade_date` (YYYY-MM-DD, default: the scheduled day), `source` (auto|kafka|db),
`accept_incomplete` (a reason to publish a day that fails validation; recorded) and `rerun`
(settle a settled date again).
Connections: `kafka_default`, `settlement_db`, `ledger_a`, `ledger_b`, `ledger_shared`,
`spark_default`, `smtp_default`. Logic lives in `settlement.orchestration`; reruns of a date
are idempotent.
"""

from __future__ import annotations

import datetime as dt

import pendulum
from airflow.sdk import Param, PokeReturnValue, dag, task

from settlement.config import load_settings
from settlement.orchestration import tasks as orch
from settlement.orchestration.operators import SettlementSparkSubmitOperator

SETTINGS = load_settings()  # no network: the calendar is loaded when the scheduler asks


@dag(
    dag_id="eod_settlement",
    schedule=orch.eod_schedule(SETTINGS),
    start_date=pendulum.datetime(2026, 1, 1, tz=orch.EOD_TIMEZONE),
    deadline=orch.eod_deadline(SETTINGS),
    catchup=False,
    max_active_runs=1,
    render_template_as_native_obj=True,
    tags=["settlement", "eod"],
    doc_md=__doc__,
    default_args={"retries": 2, "retry_delay": dt.timedelta(minutes=1),
                  "execution_timeout": dt.timedelta(hours=1), "owner": "operations",
                  "on_failure_callback": orch.on_task_failure},
    params={
        "trade_date": Param(None, type=["null", "string"], format="date",
                            description="YYYY-MM-DD; empty = the scheduled day"),
        "source": Param("auto", enum=["auto", "kafka", "db"],
                        description="auto: Kafka if it holds the whole day"),
        "accept_incomplete": Param(None, type=["null", "string"],
                                   description="publish even if validation fails; the reason "
                                               "is recorded in the run and the audit report"),
        "rerun": Param(False, type="boolean",
                       description="settle again even if a run that passed validation has "
                                   "already published the date since its close markers"),
    },
)
def eod_settlement() -> None:
    @task
    def prepare(params: dict, logical_date: dt.datetime | None = None) -> dict:
        settings = orch.settings_from_airflow()
        # No secrets here: XComs are visible in the UI. The job's environment (database
        # URLs) is built inside the settle task.
        return {"trade_date": orch.trade_date_for(params, logical_date),
                "jars": orch.spark_jars_csv(settings)}

    @task.sensor(poke_interval=30, timeout=6 * 3600, mode="reschedule", retries=0)
    def wait_for_close(job: dict) -> PokeReturnValue:
        done, why = orch.close_markers_in(orch.settings_from_airflow(), job["trade_date"])
        print(why)
        return PokeReturnValue(is_done=done, xcom_value=job["trade_date"])

    @task.branch
    def choose_source(day: str, params: dict, ti=None) -> str:
        from settlement.eod.sources import choose_source as choose

        choice = choose(orch.settings_from_airflow(), day, params["source"])
        print(f"source: {choice.source} -- {choice.reason}")
        ti.xcom_push(key="source_reason", value=choice.reason)
        ti.xcom_push(key="day_rows", value=choice.day_rows())  # the driver's JIT follows it
        return f"settle_from_{choice.source}"

    def settle(source: str) -> SettlementSparkSubmitOperator:
        return SettlementSparkSubmitOperator(
            task_id=f"settle_from_{source}",
            conn_id="spark_default",
            application=str(orch.JOB),
            name=f"settlement-{source}",
            application_args=[
                "--date", "{{ ti.xcom_pull(task_ids='wait_for_close') }}",
                "--source", source, "--reason",
                "{{ ti.xcom_pull(task_ids='choose_source', key='source_reason') }}",
                "--accept-incomplete", "{{ params.accept_incomplete or '' }}",
                "--only-if-unsettled", "{{ 'no' if params.rerun else 'yes' }}"],
            jars="{{ ti.xcom_pull(task_ids='prepare')['jars'] }}",
            day_rows="{{ ti.xcom_pull(task_ids='choose_source', key='day_rows') }}",
            conf={"spark.ui.enabled": "false", "spark.sql.session.timeZone": "UTC"},
            pool=orch.SPARK_POOL,
            execution_timeout=orch.settle_timeout(SETTINGS),
        )

    @task(trigger_rule="none_failed_min_one_success", outlets=[orch.settled_day_asset()])
    def publish_report(day: str, params: dict, outlet_events=None) -> str:
        settings = orch.settings_from_airflow()
        return orch.publish_report(settings, orch.run_outcome(settings, day, params["rerun"]),
                                   outlet_events)

    @task
    def write_instructions(day: str) -> dict:
        return orch.write_instructions(orch.settings_from_airflow(), day)

    job = prepare()
    day = wait_for_close(job)
    branch = choose_source(day)
    settled = [settle("kafka"), settle("db")]
    branch >> settled >> publish_report(day) >> write_instructions(day)


eod_settlement()
