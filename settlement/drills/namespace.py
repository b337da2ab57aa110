"""A private namespace on shared services: its own topic and databases.

The demo and failover drills run next to whatever else uses the same Kafka and PostgreSQL;
a namespace (``<prefix>_trades``, ``<prefix>_settlement``, ``<prefix>_ledger_a`` ...) keeps
their data apart and lets them start from nothing.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

import psycopg
from psycopg import sql

from settlement.config import LEDGERS, Settings
from settlement.db import open_connection, with_dbname


def namespace_env(base: Settings, prefix: str) -> dict[str, str]:
    """SETTLE_ overrides that put every command in the namespace (same servers as ``base``).
    On the embedded server a database prefix, so that each command still logs in as its own
    component's user; with explicit DSNs, the same DSNs on other databases."""
    if base.pg_dsn is None and not any(getattr(base, f"ledger_{n}_dsn") for n in LEDGERS):
        return {"SETTLE_TOPIC": f"{prefix}_trades", "SETTLE_PG_DB_PREFIX": f"{prefix}_"}

    def dsn(name: str) -> str:
        return with_dbname(base.settlement_dsn, f"{prefix}_{name}")

    return {
        "SETTLE_TOPIC": f"{prefix}_trades",
        "SETTLE_PG_DSN": dsn("settlement"),
        "SETTLE_LEDGER_A_DSN": dsn("ledger_a"),
        "SETTLE_LEDGER_B_DSN": dsn("ledger_b"),
        "SETTLE_LEDGER_SHARED_DSN": dsn("ledger_shared"),
    }


def namespace_settings(base: Settings, env: dict[str, str]) -> Settings:
    """``base`` with a namespace's overrides (``namespace_env``) applied."""
    return base.model_copy(update={k.removeprefix("SETTLE_").lower(): v for k, v in env.items()})


def _databases(settings: Settings) -> list[str]:
    return [str(psycopg.conninfo.conninfo_to_dict(d)["dbname"])
            for d in settings.all_dsns().values()]


def delete_topic(settings: Settings, topic: str) -> None:
    """Delete a topic, if it exists, and wait (30 s at most) until the brokers stop listing it:
    one created again at once under the same name must not meet the old one's metadata."""
    from settlement.kafka.admin import admin_client

    admin = admin_client(settings.for_component("admin"))
    if topic in admin.list_topics(timeout=10).topics:
        admin.delete_topics([topic], operation_timeout=30)[topic].result(30)
        deadline = time.monotonic() + 30
        while topic in admin.list_topics(timeout=10).topics and time.monotonic() < deadline:
            time.sleep(0.2)


def drop_databases(admin_dsn: str, names: Iterable[str]) -> None:
    """Drop these databases (connections to them ended first), through ``admin_dsn``'s server."""
    with open_connection(admin_dsn, autocommit=True) as conn:
        for db in names:
            conn.execute(sql.SQL("drop database if exists {} with (force)").format(
                sql.Identifier(db)))


def drop_namespace(settings: Settings) -> None:
    settings = settings.for_component("admin")
    delete_topic(settings, settings.topic)
    drop_databases(with_dbname(settings.settlement_dsn, "postgres"), _databases(settings))


def reset_namespace(settings: Settings) -> None:
    """Drop and recreate the namespace's topic and databases, migrated."""
    from settlement.db import ensure_database, migrate_database
    from settlement.kafka.admin import ensure_topic

    settings = settings.for_component("admin")
    drop_namespace(settings)
    for dsn in settings.all_dsns().values():
        ensure_database(dsn)
        migrate_database(dsn)
    ensure_topic(settings)
