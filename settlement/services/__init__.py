"""Embedded services: PostgreSQL and a KRaft Kafka cluster on loopback."""

from __future__ import annotations

from typing import Any

from settlement.config import Settings
from settlement.errors import redact
from settlement.services.kafka import EmbeddedKafka
from settlement.services.postgres import EmbeddedPostgres
from settlement.services.procs import ServiceError
from settlement.services.spark import EmbeddedSparkCluster

__all__ = ["ServiceError", "up", "down", "status"]


def _endpoints(settings: Settings, brokers: int) -> dict[str, Any]:
    # Printed and logged: DSNs without their passwords.
    return {
        "kafka_bootstrap": settings.bootstrap(brokers),
        "postgres_dsn": redact(settings.settlement_dsn),
        "ledger_dsns": {k: redact(v) for k, v in settings.ledger_dsns().items()},
    }


def up(settings: Settings, brokers: int | None = None, spark_cluster: bool = False
       ) -> dict[str, Any]:
    """Start whatever embedded service is not already running; idempotent. ``spark_cluster``
    also starts the standalone Spark master and workers."""
    from settlement.kafka.admin import ensure_topic

    n = brokers or settings.kafka_brokers
    result: dict[str, Any] = {}
    if settings.pg_dsn is None:
        result["postgres"] = EmbeddedPostgres(settings).start()
    else:
        result["postgres"] = "external"
    if settings.embedded_kafka:
        result["kafka"] = EmbeddedKafka(settings).start(n)
    else:
        result["kafka"] = "external"
    result["topic"] = ensure_topic(settings, brokers=n)
    if spark_cluster:
        result["spark_cluster"] = EmbeddedSparkCluster(settings).start()
        result |= _spark_endpoints(settings)
    return {**result, "brokers": n, **_endpoints(settings, n)}


def _spark_endpoints(settings: Settings) -> dict[str, Any]:
    return {"spark_master_url": settings.spark_cluster_url,
            "spark_master_ui": f"http://127.0.0.1:{settings.spark_master_ui_port}"}


def down(settings: Settings) -> dict[str, Any]:
    """Stop only what `up` started (pid files under the state directory)."""
    # Spark first: its executors may still hold connections to Kafka and PostgreSQL.
    spark = EmbeddedSparkCluster(settings).stop()
    kafka = EmbeddedKafka(settings).stop()
    pg = EmbeddedPostgres(settings).stop()
    return {"kafka": "stopped" if kafka else "not running",
            "postgres": "stopped" if pg else "not running",
            "spark_cluster": "stopped" if spark else "not running"}


def status(settings: Settings) -> dict[str, Any]:
    kafka = EmbeddedKafka(settings)
    nodes = kafka.nodes()
    running = [node.node_id for node in nodes if node.running()]
    pg = EmbeddedPostgres(settings)
    return {
        "postgres": "running" if pg.running() else "stopped",
        "kafka": "running" if running and len(running) == len(nodes) else
                 ("degraded" if running else "stopped"),
        "kafka_nodes_running": running,
        "brokers": len(nodes),
        "spark_cluster": EmbeddedSparkCluster(settings).status(),
        **_endpoints(settings, len(nodes)),
    }
