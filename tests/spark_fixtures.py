"""The SparkSession for tests of Spark steps. A test module uses it with
``from tests.spark_fixtures import spark  # noqa: F401``.

One session per test run: starting a JVM costs seconds, the steps under test take
milliseconds. It is built by the same ``build_session`` the job uses, with the connector
jars, so that a Kafka or JDBC test that runs later in the same process gets a session able
to read them (getOrCreate hands every caller this one).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    # Must be in the environment before the JVM starts; a resolvable-but-unreachable host
    # name otherwise stalls start-up on some machines.
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    from settlement.config import load_settings
    from settlement.spark.session import build_session

    session = build_session(
        load_settings(spark_master="local[1]"),
        "settlement-tests",
        # Tiny frames: 2 shuffle tasks instead of 8 keeps each step's overhead low.
        {"spark.sql.shuffle.partitions": "2", "spark.ui.enabled": "false"},
    )
    yield session
    session.stop()
