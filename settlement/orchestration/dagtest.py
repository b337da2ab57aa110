"""Run one DAG once, in-process, with ``dag.test()``:
``python -m settlement.orchestration.dagtest DAG CONF``.

Used by ``settle demo`` to run ``eod_settlement`` exactly as Airflow would, without a
scheduler. Airflow reads its configuration at import time, so this is its own process; the
caller sets ``AIRFLOW_HOME`` and the ``AIRFLOW_CONN_*`` variables.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from settlement.config import REPO_ROOT, Settings


def airflow_home_env(settings: Settings, home: Path) -> dict[str, str]:
    from settlement.orchestration.tasks import airflow_connections

    return {**os.environ, **airflow_connections(settings), "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__DAGS_FOLDER": str(REPO_ROOT / "dags"),
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}


def prepare_metadata(env: dict[str, str], log: Path) -> None:
    """Migrate the metadata database and create the ``spark`` pool the settlement tasks
    queue on (without it the scheduler never runs them)."""
    from settlement.orchestration.tasks import SPARK_POOL, SPARK_POOL_DESCRIPTION

    airflow = str(Path(sys.executable).parent / "airflow")
    with open(log, "ab") as out:
        for cmd in (["db", "migrate"],
                    ["pools", "set", SPARK_POOL, "1", SPARK_POOL_DESCRIPTION]):
            subprocess.run([airflow, *cmd], env=env, stdout=out, stderr=subprocess.STDOUT,
                           check=True)


def run_dag(settings: Settings, dag_id: str, conf: dict[str, Any], home: Path,
            log: Path) -> str:
    """Migrate the metadata database if needed, run the DAG once; returns its final state."""
    env = airflow_home_env(settings, home)
    home.mkdir(parents=True, exist_ok=True)
    log.write_text("")
    prepare_metadata(env, log)
    with open(log, "ab") as out:
        res = subprocess.run([sys.executable, "-m", "settlement.orchestration.dagtest", dag_id,
                              json.dumps(conf)], env=env, stdout=out, stderr=subprocess.STDOUT)
    lines = [ln for ln in log.read_text().splitlines() if ln.startswith('{"dag_state"')]
    if res.returncode != 0 or not lines:
        raise RuntimeError(f"dag.test() of {dag_id} failed; see {log}")
    return json.loads(lines[-1])["dag_state"]


def without_deadlines(dag: Any) -> Any:
    """The DAG for ``dag.test()``: without its deadline alerts.

    Airflow 3.3's ``dag.test()`` gives ``DagRun.update_state`` the DAG's DeadlineAlert
    definitions where the scheduler would give the ids of their stored rows, so a run that
    succeeds crashes (``'dict' object has no attribute 'hex'``). A deadline needs the
    scheduler and the triggerer anyway, which ``dag.test()`` does not run; its callback is
    tested on its own (tests/test_alerts.py)."""
    dag.deadline = None
    return dag


def main() -> int:
    from airflow.dag_processing.dagbag import DagBag

    dag_id, conf = sys.argv[1], json.loads(sys.argv[2])
    bag = DagBag(dag_folder=str(REPO_ROOT / "dags"))
    if bag.import_errors:
        print(json.dumps({"import_errors": {k: str(v) for k, v in bag.import_errors.items()}}))
        return 1
    run = without_deadlines(bag.dags[dag_id]).test(run_conf=conf)
    print(json.dumps({"dag_state": str(run.state)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
