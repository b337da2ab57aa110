"""Session fixtures: the real embedded services, started once per test run.

The suite never touches a developer's running services: unless the caller already set
them, state and ports are the test ones (the Makefile's TEST_ENV sets the same values).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("SETTLE_STATE_DIR", str(ROOT / ".state" / "test"))
os.environ.setdefault("SETTLE_KAFKA_PORT", "29092")
os.environ.setdefault("SETTLE_KAFKA_CONTROLLER_PORT", "29192")
os.environ.setdefault("SETTLE_PG_PORT", "25432")
# Three brokers (replication 3, min.insync.replicas 2): the drills kill one of them.
os.environ.setdefault("SETTLE_KAFKA_BROKERS", "3")
os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
# Every JVM the tests start through spark-submit (in-process sessions, `settle eod`,
# Airflow's spark-submit, the embedded cluster) takes these options. A test's JVM lives a
# minute on a few thousand trades: C2's optimising compiler costs more CPU than it ever pays
# back (a cold end of day 59 s -> 49 s alone), and G1's concurrent and parallel threads cost
# CPU a small heap never needs (a 3,000-trade `settle eod`: 40 -> 36 s of machine CPU); a
# close of a small day chooses the quick compiler itself (settlement.spark.jvm). Options, not
# a SPARK_CONF_DIR with a spark-defaults.conf: the JVM maps no class archive while a folder on
# its class path holds files. Production keeps the JVM defaults.
os.environ.setdefault("SPARK_SUBMIT_OPTS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
# pytest-xdist runs the suite in several worker processes (`make test`): each has its own
# Airflow home, since SQLite takes one writer at a time. Unset outside xdist.
WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
if WORKER:
    # Great Expectations' file context and the audit reports are written by every end of
    # day; two workers must not write one folder at once.
    os.environ.setdefault("SETTLE_GX_DIR", str(ROOT / ".state" / "test" / f"gx-{WORKER}"))
    os.environ.setdefault("SETTLE_REPORTS_DIR",
                          str(ROOT / ".state" / "test" / f"reports-{WORKER}"))
# Airflow reads its configuration at import time: a private home with SQLite, our DAGs only;
# a worker's own. The xdist controller loads this file too and sets the home first, and its
# workers inherit its environment: a worker takes that home with its name appended (with
# setdefault both workers shared one SQLite database, and a human-in-the-loop answer written
# by one process was never seen by the DAG run of another).
os.environ.setdefault("AIRFLOW_HOME", str(ROOT / ".state" / "test" / "airflow"))
if WORKER and not os.environ["AIRFLOW_HOME"].endswith(f"-{WORKER}"):
    os.environ["AIRFLOW_HOME"] = f"{os.environ['AIRFLOW_HOME']}-{WORKER}"
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
os.environ.setdefault("AIRFLOW__CORE__DAGS_FOLDER", str(ROOT / "dags"))
# spark-submit (SparkSubmitOperator) and the settle CLI live next to this interpreter.
os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"

from settlement.config import Settings, load_settings  # noqa: E402

# py4j logs "closing connection" from a finaliser after pytest closed its streams.
logging.getLogger("py4j").setLevel(logging.WARNING)


# Tests that need the embedded services, Airflow's database or a server of their own: the
# rest is `make test-quick`. Marked from the fixtures a test uses, so a new test is sorted
# without anyone remembering a marker.
SERVICE_FIXTURES = {"services", "isolated", "airflow_db"}
OWN_SERVERS = {"test_kafka_auth.py", "test_spark_cluster.py", "test_airflow_ui.py",
               "test_airflow_roles.py", "test_wheel.py"}


# The files that take minutes, slowest first (`--durations` of `make test`): run first, so
# the parallel phase does not end with one worker on a long file while the other idles.
SLOW_FIRST = ("test_crash_points.py", "test_dags.py", "test_spark_cluster.py",
              "test_settlement.py", "test_airflow_ui.py", "test_report.py", "test_alerts.py",
              "test_close_lease.py", "test_hostile.py",
              "test_airflow_roles.py", "test_conflicting_replays.py", "test_wheel.py",
              "test_kafka_day.py", "test_validation.py", "test_site_partitions.py",
              "test_ingest.py", "test_ingest_faults.py", "test_parity.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if (SERVICE_FIXTURES & set(getattr(item, "fixturenames", ()))
                or item.path.name in OWN_SERVERS):
            item.add_marker(pytest.mark.services)
    rank = {name: i for i, name in enumerate(SLOW_FIRST)}
    # A stable sort: the order inside a file stays as written.
    items.sort(key=lambda item: rank.get(item.path.name, len(SLOW_FIRST)))


@pytest.fixture(scope="session")
def services() -> Iterator[Settings]:
    """Embedded PostgreSQL + three-broker Kafka, migrated; stopped at the end if this process
    started them. Under xdist the workers share one set: the first starts it (the others
    wait on a lock file) and nobody stops it, since a worker that finishes first would pull
    it from under the others: `make test` starts the services before and stops them after."""
    import fcntl

    from settlement import services as svc
    from settlement.db import migrate_all

    settings = load_settings()
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    with open(settings.state_dir / "services.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        result = svc.up(settings)
        migrate_all(settings)
    try:
        yield settings
    finally:
        started = result.get("kafka") == "started" or result.get("postgres") == "started"
        if started and not WORKER:
            svc.down(settings)


@dataclass(frozen=True)
class Isolated:
    """A private topic and private ledger databases for one test."""

    settings: Settings
    env: dict[str, str]
    name: str


@contextmanager
def namespace(services: Settings, name: str,
              extra: dict[str, str] | None = None) -> Iterator[Isolated]:
    """A private topic and databases named ``name`` on the shared services, this process's
    environment pointing at them (with ``extra``) while the block runs; dropped after."""
    from settlement.drills.namespace import drop_namespace, namespace_env, reset_namespace

    # Its own reports directory too: run ids restart at 1 in every namespace, so two tests
    # running at once would otherwise write the same report file.
    env = {**namespace_env(services, name),
           "SETTLE_REPORTS_DIR": str(services.state_dir / "reports" / name), **(extra or {})}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    settings = load_settings()
    try:
        reset_namespace(settings)
        yield Isolated(settings, {**os.environ}, name)
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        try:
            drop_namespace(settings)  # keep the shared services lean across the suite
        except Exception:  # noqa: BLE001 - cleanup must not mask the test's own outcome
            pass


@pytest.fixture
def isolated(services: Settings) -> Iterator[Isolated]:
    with namespace(services, f"t{uuid.uuid4().hex[:10]}") as ns:
        yield ns


@pytest.fixture(scope="session")
def airflow_db() -> Iterator[None]:
    """A migrated SQLite metadata database under the test AIRFLOW_HOME."""
    res = subprocess.run([str(Path(sys.executable).parent / "airflow"), "db", "migrate"],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
