"""Airflow DAGs: they import cleanly, follow the house rules, and run for real."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from settlement.config import load_settings
from tests.helpers import ROOT

DAG_FILES = sorted((ROOT / "dags").glob("*.py"))


def _dagbag(path: Path):
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(path))


@pytest.mark.parametrize("path", DAG_FILES, ids=lambda p: p.name)
def test_dag_file_imports_without_network_or_secrets(path: Path) -> None:
    # A bad bootstrap address proves parsing never contacts Kafka or PostgreSQL.
    env = {**os.environ, "SETTLE_KAFKA_BOOTSTRAP": "192.0.2.1:9", "SETTLE_PG_DSN":
           "postgresql://nobody:wrong@192.0.2.1:1/none"}
    code = ("import sys; from airflow.dag_processing.dagbag import DagBag; "
            f"b = DagBag(dag_folder={str(path)!r}); "
            "print(b.import_errors); sys.exit(1 if b.import_errors or not b.dags else 0)")
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]


@pytest.fixture(scope="module")
def dags() -> dict:
    bag = _dagbag(ROOT / "dags")
    assert not bag.import_errors
    return bag.dags


# Tasks allowed to run once, and why.
NO_RETRY = {
    "eod_settlement.wait_for_close": "a sensor: its timeout is its retry budget",
    "failover_drill.run_drill": "a failed drill is a finding, not a flake to retry away",
    "eod_reclose.approve": "an operator is asked once; no answer in time is a rejection",
}


def test_policies(dags: dict) -> None:
    assert {"eod_settlement", "failover_drill"} <= set(dags)
    for dag_id, dag in dags.items():
        assert dag.tags, f"{dag_id} has no tags"
        assert dag.doc_md and len(dag.doc_md) > 200, f"{dag_id} has no documentation"
        assert dag.catchup is False, f"{dag_id} would backfill"
        assert dag.max_active_runs == 1, f"{dag_id} could run two days at once"
        for t in dag.tasks:
            name = f"{dag_id}.{t.task_id}"
            assert t.retries >= 1 or name in NO_RETRY, f"{name} has no retries"
            assert t.execution_timeout is not None, f"{name} has no timeout"


def test_eod_shape(dags: dict) -> None:
    dag = dags["eod_settlement"]
    assert dag.schedule is not None or dag.timetable is not None
    assert set(dag.params) == {"trade_date", "source", "accept_incomplete", "rerun"}
    assert dag.params["rerun"] is False  # a DAG run settles a settled date only if asked
    ids = set(dag.task_ids)
    assert {"prepare", "wait_for_close", "choose_source", "settle_from_kafka", "settle_from_db",
            "publish_report", "write_instructions"} <= ids
    assert dag.get_task("publish_report").downstream_task_ids == {"write_instructions"}
    # The Spark job validates the day it read (no second read in another task).
    assert "validate_and_report" not in ids
    assert dag.get_task("wait_for_close").mode == "reschedule"
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

    for source in ("kafka", "db"):
        op = dag.get_task(f"settle_from_{source}")
        assert isinstance(op, SparkSubmitOperator) and op._conn_id == "spark_default"
        # Database URLs carry passwords: built at run time, never templated from an XCom.
        assert not op.env_vars, op.env_vars
    assert dag.get_task("choose_source").downstream_task_ids == {"settle_from_kafka",
                                                                 "settle_from_db"}
    for source in ("kafka", "db"):
        args = dag.get_task(f"settle_from_{source}").application_args
        assert "--no-validate" not in args
        # Both sites' schedulers run this: a settled date is skipped unless rerun is set.
        flag = args[args.index("--only-if-unsettled") + 1]
        assert flag == "{{ 'no' if params.rerun else 'yes' }}", flag
        assert dag.get_task(f"settle_from_{source}").application.endswith("settlement/submit.py")
        # A close may wait for the other site's close and then settle the day itself: Airflow
        # must not kill it before its own wait bound can say why (that bound once equalled
        # the timeout).
        wait = dt.timedelta(seconds=load_settings().close_wait_seconds)
        assert dag.get_task(f"settle_from_{source}").execution_timeout >= wait + \
            dt.timedelta(minutes=30)


def test_airflow_hygiene(dags: dict) -> None:
    from settlement.orchestration.tasks import (
        SETTLED_DAY_ASSET,
        SPARK_POOL,
        on_task_failure,
        settled_day_asset,
    )

    dag = dags["eod_settlement"]
    # One Spark job at a time: both settle tasks take the spark pool's single slot.
    assert SPARK_POOL == "spark"
    assert {dag.get_task(f"settle_from_{s}").pool for s in ("kafka", "db")} == {SPARK_POOL}
    assert {t.pool for t in dag.tasks if not t.task_id.startswith("settle_from_")} == {
        "default_pool"}
    # The settled day is an asset downstream DAGs can schedule on.
    (outlet,) = dag.get_task("publish_report").outlets
    assert outlet == settled_day_asset() and outlet.name == SETTLED_DAY_ASSET
    # Every task alerts when it fails for good.
    for t in dag.tasks:
        assert on_task_failure in (t.on_failure_callback or []), t.task_id


def test_drill_dag_only_when_drills_are_enabled() -> None:
    code = ("import json; from airflow.dag_processing.dagbag import DagBag; "
            f"b = DagBag(dag_folder={str(ROOT / 'dags')!r}); "
            "print(json.dumps({'dags': sorted(b.dags), 'errors': list(b.import_errors)}))")
    seen = {}
    for enabled in ("true", "false"):
        env = {**os.environ, "SETTLE_DRILLS_ENABLED": enabled}
        res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, timeout=180)
        out = json.loads(res.stdout.strip().splitlines()[-1])
        assert out["errors"] == [], out
        seen[enabled] = out["dags"]
    assert seen == {"true": ["eod_reclose", "eod_settlement", "failover_drill"],
                    "false": ["eod_reclose", "eod_settlement"]}


def test_connection_types_come_from_the_providers() -> None:
    """kafka_default and the databases are editable forms in the UI only if a provider
    registers their connection types."""
    from airflow.providers_manager import ProvidersManager

    from settlement.config import load_settings
    from settlement.orchestration.tasks import airflow_connections

    hooks = ProvidersManager().hooks
    for conn_type in ("kafka", "postgres", "spark", "smtp"):
        assert hooks.get(conn_type) is not None, f"no provider for {conn_type} connections"
    conns = airflow_connections(load_settings())
    assert json.loads(conns["AIRFLOW_CONN_KAFKA_DEFAULT"])["conn_type"] == "kafka"
    assert conns["AIRFLOW_CONN_SETTLEMENT_DB"].startswith("postgres://")


def test_drill_shape(dags: dict) -> None:
    dag = dags["failover_drill"]
    assert set(dag.params) == {"scheme", "fault", "trades", "seed", "at"}
    assert dag.get_task("run_drill").retries == 0


def _run_eod(iso, day: str, monkeypatch: pytest.MonkeyPatch, source: str = "auto",
             rerun: bool = False):
    """``iso``: an Isolated namespace or plain Settings (the connections point at these)."""
    from settlement.orchestration.tasks import airflow_connections

    for k, v in airflow_connections(getattr(iso, "settings", iso)).items():
        monkeypatch.setenv(k, v)
    from settlement.orchestration.dagtest import without_deadlines

    dag = without_deadlines(_dagbag(ROOT / "dags" / "eod_settlement.py").dags["eod_settlement"])
    return dag.test(run_conf={"trade_date": day, "source": source, "rerun": rerun})


def _airflow_texts() -> list[str]:
    """What the run left in Airflow's metadata database for people to see: XCom values and
    rendered template fields (the spark-submit task's environment among them)."""
    import sqlite3

    db = Path(os.environ["AIRFLOW_HOME"]) / "airflow.db"
    with sqlite3.connect(db) as conn:
        return [str(row[0]) for table, col in (("xcom", "value"),
                                                ("rendered_task_instance_fields",
                                                 "rendered_fields"))
                for row in conn.execute(f"select {col} from {table}")]  # names are constants


@pytest.mark.services
def test_eod_dag_settles_a_simulated_day(isolated, tmp_path: Path, airflow_db: None,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from settlement.db import connect
    from tests.helpers import ingest_day, published_positions

    day = "2026-11-27"
    sim = ingest_day(isolated.env, tmp_path, day, ["a", "b"], "shared")
    run = _run_eod(isolated, day, monkeypatch)
    assert str(run.state) == "success", run.state
    with connect(isolated.settings.settlement_dsn) as conn:
        row = conn.execute("select source, status, trades, validation_success, report_path"
                           " from settlement_runs where trade_date = %s", (day,)).fetchone()
    assert row[:4] == ("kafka", "succeeded", sim["trades"], True)
    assert Path(row[4]).exists()
    # The settlement instructions, written after publication: Friday settles on Monday.
    sent = run.get_task_instance("write_instructions").xcom_pull(task_ids="write_instructions")
    assert sent["settlement_date"] == "2026-11-30" and sent["instructions"] > 0, sent
    assert {Path(p).suffix for p in sent["paths"].values()} == {".csv", ".xml"}
    assert all(Path(p).exists() for p in sent["paths"].values())
    # Summed per account and instrument, the lines are the day's published net positions.
    import csv
    from decimal import Decimal

    signed: dict[tuple[str, str], tuple[int, Decimal]] = {}
    with open(sent["paths"]["csv"], encoding="utf-8") as f:
        for r in csv.DictReader(f):
            signed[(r["account"], r["symbol"])] = (
                int(r["quantity"]) * {"RECE": 1, "DELI": -1, "NONE": 0}[r["side"]],
                Decimal(r["amount"]) * {"RECV": 1, "PAY": -1, "NONE": 0}[r["payment"]])
    with connect(isolated.settings.settlement_dsn) as conn:
        nets = {(a, sym): (q, c) for a, sym, q, c in conn.execute(
            "select account, symbol, net_qty, net_cash from positions where trade_date = %s"
            " and (net_qty <> 0 or net_cash <> 0)", (day,))}
    assert signed == nets and len(nets) == sent["instructions"]

    # No password reached XCom or rendered fields (the ones this run stored: the
    # spark-submit task's and the report path it pushed are among them).
    from settlement.services.postgres import read_pgpass

    passwords = read_pgpass(isolated.settings.pg_passfile).values()
    texts = _airflow_texts()
    assert any("settlement/submit.py" in t for t in texts) and any(row[4] in t for t in texts)
    assert not [t[:200] for t in texts if any(p in t for p in passwords)]

    # The ledger loses a trade; the rerun settles from Kafka, validation finds the trade
    # missing from the ledger: nothing is published and the DAG run fails.
    before = published_positions(isolated.settings.settlement_dsn, day)
    assert before[0]
    with connect(isolated.settings.ledger_dsn("shared")) as conn:
        conn.execute("delete from trades where trade_id = (select min(trade_id) from trades)")
        conn.commit()
    # rerun=true: the date is settled already, and a DAG run settles it again only when asked.
    rerun = _run_eod(isolated, day, monkeypatch, rerun=True)
    assert str(rerun.state) == "failed", rerun.state
    assert published_positions(isolated.settings.settlement_dsn, day) == before
    with connect(isolated.settings.settlement_dsn) as conn:
        status, ok, published, staged = conn.execute(
            "select status, validation_success, published_at is not null,"
            " (select count(*) from run_positions p where p.run_id = r.run_id)"
            " from settlement_runs r where trade_date = %s order by run_id desc limit 1",
            (day,)).fetchone()
    assert (status, ok, published) == ("failed", False, False)
    assert staged > 0  # the failed run's results are kept for inspection


@pytest.mark.services
def test_eod_dag_falls_back_to_the_database_when_kafka_is_down(
        isolated, tmp_path: Path, airflow_db: None, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from settlement.db import connect
    from tests.helpers import ingest_day, kafka_down

    day = "2026-11-30"
    sim = ingest_day(isolated.env, tmp_path, day, ["a", "b"], "separate")
    with kafka_down(isolated.settings) as down:  # the tasks' kafka_default refuses
        run = _run_eod(down, day, monkeypatch)
    assert str(run.state) == "success", run.state
    with connect(isolated.settings.settlement_dsn) as conn:
        source, reason, trades, ok, path = conn.execute(
            "select source, source_reason, trades, validation_success, report_path"
            " from settlement_runs where trade_date = %s", (day,)).fetchone()
    assert (source, trades, ok) == ("db", sim["trades"], True)
    assert "Kafka is unreachable" in reason
    assert "Kafka is unreachable" in Path(path).read_text()


@pytest.mark.services
def test_failover_drill_dag_runs_a_drill(services, airflow_db: None,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The DAG's wiring, with a separate-scheme kill: no takeover time is judged, so it runs
    beside other tests (the shared-scheme takeover bound is tests/test_drills.py's)."""
    from settlement.orchestration.tasks import airflow_connections

    for k, v in airflow_connections(services).items():
        monkeypatch.setenv(k, v)
    dag = _dagbag(ROOT / "dags" / "failover_drill.py").dags["failover_drill"]
    run = dag.test(run_conf={"scheme": "separate", "fault": "kill", "trades": 6000, "seed": 2,
                             "at": 0.5})
    assert str(run.state) == "success", run.state
    ti = run.get_task_instance("run_drill")
    out = ti.xcom_pull(task_ids="run_drill")
    assert out["passed"] and out["lost"] == 0 and out["duplicated"] == 0
    assert Path(out["report_path"]).exists()
