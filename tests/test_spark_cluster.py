"""The end of day on a real Spark standalone cluster (a master and two one-core workers on
loopback), through the production paths: the ``settle eod`` CLI with SETTLE_SPARK_MASTER, and
the DAG's SparkSubmitOperator on the ``spark_default`` connection. It must publish exactly
the positions of the plain-Python reference (the one ``local[2]`` is held to in
test_settlement, so no local run is repeated here), and the master must show the work ran on
its workers.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from settlement.config import Settings
from settlement.services.spark import EmbeddedSparkCluster, master_json
from settlement.simulator.gateway import SimulationSpec
from tests.conftest import Isolated
from tests.helpers import (
    ROOT,
    ingest_day,
    last_json,
    positions_table,
    published_positions,
    reference_positions,
)

pytestmark = pytest.mark.services
DATE = "2026-12-02"
TRADES, SEED = 1500, 5
# The day ingest_day publishes: its valid trades are the generator's for (date, seed).
REFERENCE = SimulationSpec(DATE, TRADES, seed=SEED)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class Cluster:
    settings: Settings
    env: dict[str, str]  # SETTLE_SPARK_* of this cluster, to add to a test's environment

    @property
    def url(self) -> str:
        return self.settings.spark_cluster_url


@pytest.fixture(scope="module")
def cluster(services: Settings) -> Iterator[Cluster]:
    """Started with the real command, on ports free right now (others share the host)."""
    env = {"SETTLE_SPARK_MASTER_PORT": str(_free_port()),
           "SETTLE_SPARK_MASTER_UI_PORT": str(_free_port())}
    res = subprocess.run([sys.executable, "-m", "settlement.cli", "services", "up",
                          "--spark-cluster", "--json"], env={**os.environ, **env},
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-3000:]
    out = last_json(res.stdout)
    settings = services.model_copy(update={
        "spark_master_port": int(env["SETTLE_SPARK_MASTER_PORT"]),
        "spark_master_ui_port": int(env["SETTLE_SPARK_MASTER_UI_PORT"])})
    assert out["spark_master_url"] == settings.spark_cluster_url
    try:
        yield Cluster(settings, env)
    finally:
        EmbeddedSparkCluster(settings).stop()


def _eod(env: dict[str, str], cwd: Path, source: str) -> dict[str, Any]:
    # Run from an empty folder: nothing may depend on the checkout being the working directory.
    cwd.mkdir(parents=True, exist_ok=True)
    res = subprocess.run([sys.executable, "-m", "settlement.cli", "eod", "--date", DATE,
                          "--source", source, "--json"], env=env, capture_output=True,
                         text=True, timeout=900, cwd=cwd)
    assert res.returncode == 0, res.stderr[-3000:]
    return last_json(res.stdout)


def _apps(cluster: Cluster) -> dict[str, dict[str, Any]]:
    return {a["id"]: a for a in master_json(cluster.settings)["completedapps"]}


def _executors_by_worker(cluster: Cluster, app_id: str) -> dict[str, int]:
    """worker id -> executors it ran for the application (each worker's own JSON)."""
    out: dict[str, int] = {}
    for w in master_json(cluster.settings)["workers"]:
        with urllib.request.urlopen(f"{w['webuiaddress']}/json/", timeout=5) as resp:
            info = json.loads(resp.read())
        ran = [e for e in info.get("finishedexecutors", []) + info.get("executors", [])
               if e.get("appid") == app_id]
        out[w["id"]] = len(ran)
    return out


def _fetched(cluster: Cluster, app_id: str) -> set[str]:
    """Files the application's executors fetched into their own work directories."""
    work = cluster.settings.state_dir / "spark"
    return {p.name for p in work.glob(f"worker-*/work/{app_id}/*/*") if p.is_file()}


def _ran_on_the_workers(cluster: Cluster, before: set[str], name: str) -> str:
    apps = {k: v for k, v in _apps(cluster).items() if k not in before and v["name"] == name}
    assert len(apps) == 1, f"expected one new completed application {name!r}: {apps}"
    app_id, app = next(iter(apps.items()))
    assert app["state"] == "FINISHED" and app["cores"] >= 1, app
    # Two one-core workers, one-core executors: the application had executors on both.
    per_worker = _executors_by_worker(cluster, app_id)
    assert len(per_worker) == 2 and all(n >= 1 for n in per_worker.values()), per_worker
    fetched = _fetched(cluster, app_id)
    assert any(f.startswith("postgresql-") for f in fetched), fetched
    assert any(f.startswith("spark-sql-kafka-") for f in fetched), fetched
    assert any(f.startswith("settlement-") and f.endswith(".zip") for f in fetched), fetched
    return app_id


def _published_exactly_the_reference(dsn: str) -> None:
    positions, run = published_positions(dsn, DATE)
    assert run is not None and positions  # the date is published ...
    assert positions_table(dsn, DATE) == reference_positions(REFERENCE)  # ... and exact


def test_the_cli_settles_a_day_on_the_cluster_exactly_as_the_reference(
        isolated: Isolated, cluster: Cluster, tmp_path: Path) -> None:
    sim = ingest_day(isolated.env, tmp_path, DATE, ["a"], "separate", trades=TRADES, seed=SEED)
    before = set(_apps(cluster))
    env = {**isolated.env, **cluster.env, "SETTLE_SPARK_MASTER": cluster.url}
    remote = _eod(env, tmp_path / "c", "kafka")
    assert remote["trades"] == sim["trades"] and remote["validation_success"]
    assert remote["malformed"] > 0 and remote["duplicates_removed"] > 0  # a faulty day
    _published_exactly_the_reference(isolated.settings.settlement_dsn)
    _ran_on_the_workers(cluster, before, f"settlement-{DATE}")


def test_the_dag_settles_on_the_cluster_through_spark_default(
        isolated: Isolated, cluster: Cluster, tmp_path: Path, airflow_db: None,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.test_dags import _run_eod

    ingest_day(isolated.env, tmp_path, DATE, ["a"], "separate", trades=TRADES, seed=SEED)
    before = set(_apps(cluster))
    # The spark_default connection points at the master (airflow_connections renders it).
    remote = isolated.settings.model_copy(update={"spark_master": cluster.url})
    monkeypatch.setenv("SETTLE_SPARK_MASTER", cluster.url)
    run = _run_eod(remote, DATE, monkeypatch, source="db")
    assert str(run.state) == "success", run.state
    _published_exactly_the_reference(isolated.settings.settlement_dsn)
    _ran_on_the_workers(cluster, before, "settlement-db")
