"""
### Re-close of a trade date (busts after the close), approved in the UI

Exchanges bust or correct trades after the close; the sites store them as post-close
amendments of the day once an amended close marker follows them (`settle status` lists the
days awaiting a re-close). This DAG settles such a day again, manually triggered:

1. **compute**: `settle eod --reclose` in process: takes the date's close lease (or joins the
   close holding it), reads the day with its amendments from Kafka or the ledger (`source`),
   settles, validates it like any close and writes its audit report, but holds the result
   instead of publishing it. Without post-close amendments awaiting, it says so and nothing
   is published.
2. **approve**: Airflow's human-in-the-loop `ApprovalOperator` (keeping the answer as the
   XCom `decision`) waits for an operator (Browse > Required Actions, or the task's page) with
   the delta's size: how many positions and accounts change, the quantity and cash moved.
3. **publish**: approved by someone other than the user who triggered the DAG run (the
   approval of whoever asked for the re-close is refused), and while the run it was computed
   against is still the published one: the held run becomes the day's next version (the
   earlier one stays readable in `positions_by_version`), its settlement instructions are
   written
   (`settle instructions --date D --delta` gives what to add or reverse). Rejected: skipped.
4. **record_decision**: approved or rejected, who, the delta and the outcome go into
   `reclose_decisions` (the audit trail).

Params: `trade_date` (YYYY-MM-DD), `source` (auto|kafka|db). Logic lives in
`settlement.orchestration.reclose`.
"""

from __future__ import annotations

import datetime as dt

import pendulum
from airflow.sdk import Param, dag, task

from settlement.orchestration import tasks as orch
from settlement.orchestration.operators import RecloseApproval


@dag(
    dag_id="eod_reclose",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz=orch.EOD_TIMEZONE),
    catchup=False,
    max_active_runs=1,
    tags=["settlement", "eod", "reclose"],
    doc_md=__doc__,
    default_args={"retries": 1, "retry_delay": dt.timedelta(minutes=1),
                  "execution_timeout": dt.timedelta(hours=2), "owner": "operations",
                  "on_failure_callback": orch.on_task_failure},
    params={
        "trade_date": Param(type="string", format="date",
                            description="the published trade date to re-close, YYYY-MM-DD"),
        "source": Param("auto", enum=["auto", "kafka", "db"],
                        description="auto: Kafka if it holds the whole day"),
    },
)
def eod_reclose() -> None:
    @task
    def compute(params: dict, dag_run=None) -> dict:
        from settlement.orchestration import reclose

        return reclose.compute(orch.settings_from_airflow(), params["trade_date"],
                               params["source"],
                               getattr(dag_run, "triggering_user_name", None))

    @task
    def describe(held: dict) -> str:
        from settlement.orchestration import reclose

        return reclose.approval_body(held)

    approve = RecloseApproval(
        task_id="approve",
        subject="Re-close {{ params.trade_date }}: publish the next version?",
        body="{{ ti.xcom_pull(task_ids='describe') }}",
        retries=0,
        # The time to start waiting; the wait itself is bounded by response_timeout.
        execution_timeout=dt.timedelta(minutes=10),
        response_timeout=dt.timedelta(hours=12),
    )

    @task
    def publish(held: dict, ti=None) -> dict:
        from settlement.orchestration import reclose

        decision = ti.xcom_pull(task_ids="approve", key="decision")
        return reclose.publish(orch.settings_from_airflow(), held, decision)

    @task(trigger_rule="all_done")
    def record_decision(held: dict, ti=None) -> dict:
        from settlement.orchestration import reclose

        decision = ti.xcom_pull(task_ids="approve", key="decision")
        published = ti.xcom_pull(task_ids="publish")
        return reclose.record(orch.settings_from_airflow(), held, decision, published)

    held = compute()
    body = describe(held)
    done = publish(held)
    body >> approve >> done >> record_decision(held)


eod_reclose()
