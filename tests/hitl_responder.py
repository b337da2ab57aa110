"""An operator answering a DAG's approval, from outside the DAG run (its own process, or
``answer`` in a thread of the test's: tests/test_reclose.py), as the Airflow API records an
answer (PATCH .../hitlDetails: the response on the HITL row, then the
parked task resumed): ``python -m tests.hitl_responder DAG_ID TASK_ID ANSWER USER``. Prints the
approval's subject and body as one JSON line once it has answered. dag.test() waits for
exactly this (it never answers a human-in-the-loop task itself)."""

from __future__ import annotations

import json
import sys
import time


def answer(dag_id: str, task_id: str, option: str, user: str, timeout: float) -> dict[str, str]:
    from airflow._shared.timezones import timezone
    from airflow.models.hitl import HITLDetail
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.trigger import handle_event_submit
    from airflow.triggers.base import TriggerEvent
    from airflow.utils.session import create_session
    from airflow.utils.state import TaskInstanceState
    from sqlalchemy import select

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with create_session() as session:
            row = session.execute(
                select(TaskInstance, HITLDetail)
                .join(HITLDetail, HITLDetail.ti_id == TaskInstance.id)
                .where(TaskInstance.dag_id == dag_id, TaskInstance.task_id == task_id,
                       TaskInstance.state == TaskInstanceState.AWAITING_INPUT)).first()
            if row is not None:
                ti, detail = row
                shown = {"subject": detail.subject, "body": detail.body}
                detail.responded_by = {"id": user, "name": user}
                detail.responded_at = timezone.utcnow()
                detail.chosen_options = [option]
                detail.params_input = {}
                session.add(detail)
                handle_event_submit(TriggerEvent(detail.as_resume_event_payload()),
                                    task_instance=ti, session=session)
                return shown
        time.sleep(0.5)
    raise TimeoutError(f"no {dag_id}.{task_id} awaited an answer within {timeout:.0f}s")


if __name__ == "__main__":
    dag_id, task_id, option, user = sys.argv[1:5]
    print(json.dumps(answer(dag_id, task_id, option, user, timeout=900)), flush=True)
