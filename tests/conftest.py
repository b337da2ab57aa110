"""Session fixtures: the real embedded services, started once per test run.

The suite never touches a developer's running services: unless the caller already set
them, state and ports are the test ones (the Makefile's TEST_ENV sets the same values).
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("SETTLE_STATE_DIR", str(ROOT / ".state" / "test"))
os.environ.setdefault("SETTLE_KAFKA_PORT", "29092")
os.environ.setdefault("SETTLE_KAFKA_CONTROLLER_PORT", "29192")
os.environ.setdefault("SETTLE_PG_PORT", "25432")
os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
# Airflow reads its configuration at import time: a private home with SQLite, our DAGs only.
os.environ.setdefault("AIRFLOW_HOME", str(ROOT / ".state" / "test" / "airflow"))
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
os.environ.setdefault("AIRFLOW__CORE__DAGS_FOLDER", str(ROOT / "dags"))
# spark-submit (SparkSubmitOperator) and the settle CLI live next to this interpreter.
os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"

from settlement.config import Settings, load_settings  # noqa: E402


@pytest.fixture(scope="session")
def services() -> Iterator[Settings]:
    """Embedded PostgreSQL + one-broker Kafka, migrated; stopped at the end if we started them."""
    from settlement import services as svc
    from settlement.db import migrate_all

    settings = load_settings()
    result = svc.up(settings, brokers=1)
    migrate_all(settings)
    try:
        yield settings
    finally:
        if result.get("kafka") == "started" or result.get("postgres") == "started":
            svc.down(settings)


@dataclass(frozen=True)
class Isolated:
    """A private topic and private ledger databases for one test."""

    settings: Settings
    env: dict[str, str]
    name: str


@pytest.fixture
def isolated(services: Settings) -> Iterator[Isolated]:
    from settlement.db import ensure_database, migrate_database
    from settlement.kafka_admin import ensure_topic

    name = f"t{uuid.uuid4().hex[:10]}"
    env = {
        "SETTLE_TOPIC": f"trades_{name}",
        "SETTLE_PG_DSN": services.embedded_dsn(f"settlement_{name}"),
        **{f"SETTLE_LEDGER_{led.upper()}_DSN": services.embedded_dsn(f"ledger_{led}_{name}")
           for led in ("a", "b", "shared")},
    }
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        settings = load_settings()
        for dsn in settings.all_dsns().values():
            ensure_database(dsn)
            migrate_database(dsn)
        ensure_topic(settings)
        yield Isolated(settings, {**os.environ}, name)
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
