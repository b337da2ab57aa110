"""The embedded services are real: Kafka transactions, PostgreSQL migrations, clear errors."""

from __future__ import annotations

import socket
import subprocess
import uuid

import psycopg
import pytest

from settlement import services as svc
from settlement.config import Settings, load_settings
from settlement.db import SQL_DIR, connect, migrate_database
from settlement.services.postgres import pg_bin
from settlement.services.procs import ServiceError
from settlement.services.schema import dump_schema, normalise_dump
from tests.conftest import Isolated

pytestmark = pytest.mark.services


def test_up_is_idempotent_and_status_reports(services: Settings) -> None:
    again = svc.up(services)
    assert again["postgres"] == "already running"
    assert again["kafka"] == "already running"
    assert again["topic"] == "exists"
    st = svc.status(services)
    assert st["postgres"] == "running" and st["kafka"] == "running"
    assert set(st["ledger_dsns"]) == {"a", "b", "shared"}
    assert st["kafka_bootstrap"] == services.bootstrap()


def test_topic_has_the_configured_partitions(services: Settings) -> None:
    from settlement.kafka.admin import admin_client

    md = admin_client(services).list_topics(services.topic, timeout=10)
    assert len(md.topics[services.topic].partitions) == services.partitions


def test_taken_port_is_a_clear_error(tmp_path, services: Settings) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        other = load_settings(state_dir=tmp_path, pg_port=port, kafka_port=port + 1)
        with pytest.raises(ServiceError, match=f"port 127.0.0.1:{port} is already taken.*"
                                               "SETTLE_PG_PORT"):
            svc.up(other)


def test_transactions_round_trip_and_aborts_stay_invisible(isolated: Isolated) -> None:
    from confluent_kafka import Consumer, KafkaError, Producer

    s = isolated.settings
    p = Producer({**s.kafka_client_config(), "transactional.id": f"t-{uuid.uuid4()}",
                  "enable.idempotence": True, "acks": "all"})
    p.init_transactions(30)
    p.begin_transaction()
    for i in range(10):
        p.produce(s.topic, value=f"committed-{i}".encode(), partition=i % s.partitions)
    p.commit_transaction(30)
    p.begin_transaction()
    for i in range(10):
        p.produce(s.topic, value=f"aborted-{i}".encode(), partition=i % s.partitions)
    p.flush(30)  # the aborted records really reach the log
    p.abort_transaction(30)
    p.begin_transaction()
    p.produce(s.topic, value=b"after-abort", partition=0)
    p.commit_transaction(30)

    def read(isolation: str) -> list[bytes]:
        """Everything the isolation level shows, up to the end of every partition: a stop
        after some count could end before a slower partition's records arrived."""
        c = Consumer({**s.kafka_client_config(), "group.id": f"g-{uuid.uuid4()}",
                      "isolation.level": isolation, "auto.offset.reset": "earliest",
                      "enable.auto.commit": False, "enable.partition.eof": True})
        c.subscribe([s.topic])
        got: list[bytes] = []
        at_end: set[int] = set()
        try:
            # Bounded, but generous: joining a new group on three loaded brokers can take
            # most of the old 20 s budget.
            for _ in range(120):
                for m in c.consume(100, timeout=0.5):
                    if m.error() is None:
                        got.append(m.value())
                    elif m.error().code() == KafkaError._PARTITION_EOF:
                        at_end.add(m.partition())
                if len(at_end) == s.partitions:
                    break
        finally:
            c.close()
        assert len(at_end) == s.partitions, f"{isolation}: only {sorted(at_end)} read to the end"
        return got

    committed = read("read_committed")
    assert sorted(committed) == sorted([f"committed-{i}".encode() for i in range(10)]
                                       + [b"after-abort"])
    uncommitted = read("read_uncommitted")
    assert sum(v.startswith(b"aborted-") for v in uncommitted) == 10


def test_migrations_apply_twice_cleanly(isolated: Isolated) -> None:
    dsn = isolated.settings.ledger_dsn("a")
    assert migrate_database(dsn) == []  # the fixture already migrated it
    with connect(dsn) as conn:
        n = conn.execute("select count(*) from schema_migrations").fetchone()[0]
    assert n == len(list((SQL_DIR / "migrations").glob("*.sql")))


def _fresh_db(settings: Settings) -> str:
    name = f"scratch_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(settings.embedded_dsn("postgres"), autocommit=True) as conn:
        conn.execute(f'create database "{name}"')
    return settings.embedded_dsn(name)


def test_migrations_from_empty_equal_the_schema_dump(services: Settings) -> None:
    migrated = _fresh_db(services)
    migrate_database(migrated)
    schema_file = (SQL_DIR / "schema.sql").read_text()
    assert dump_schema(migrated) == normalise_dump(schema_file), (
        "sql/schema.sql is stale: run `settle db schema`")
    # ...and the dump itself loads with psql into an empty database to the same schema.
    loaded = _fresh_db(services)
    subprocess.run([str(pg_bin() / "psql"), "-v", "ON_ERROR_STOP=1", "-q", "-f",
                    str(SQL_DIR / "schema.sql"), loaded], check=True, capture_output=True)
    assert dump_schema(loaded) == dump_schema(migrated)


def test_edited_migration_is_refused(services: Settings, tmp_path, monkeypatch) -> None:
    import settlement.db as db

    dsn = _fresh_db(services)
    migrate_database(dsn)
    for f in (SQL_DIR / "migrations").glob("*.sql"):
        (tmp_path / f.name).write_text(f.read_text())
    first = sorted(tmp_path.glob("*.sql"))[0]
    first.write_text(first.read_text() + "\n-- edited\n")
    monkeypatch.setattr(db, "MIGRATIONS_DIR", tmp_path)
    with pytest.raises(db.DatabaseError, match="edited after it was applied"):
        migrate_database(dsn)


def test_storage_format_accepts_a_cluster_id_starting_with_a_dash(tmp_path) -> None:
    # Random base64 ids start with "-" one time in 64; that once broke `kafka-storage format`.
    from settlement.services.kafka import KafkaNode

    node = KafkaNode(load_settings(state_dir=tmp_path), 1, 1)
    node.format_storage("-AbCdEfGhIjKlMnOpQrStU")
    assert "cluster.id=-AbCdEfGhIjKlMnOpQrStU" in (node.root / "data" / "meta.properties"
                                                   ).read_text()


def test_each_component_holds_only_its_own_password(services: Settings) -> None:
    import stat

    from settlement.config import EMBEDDED_USERS
    from settlement.services.postgres import read_pgpass

    every = read_pgpass(services.pg_passfile)
    assert set(every) == set(EMBEDDED_USERS.values())
    for component, user in EMBEDDED_USERS.items():
        own = services.component_passfile(component)  # type: ignore[arg-type]
        assert stat.S_IMODE(own.stat().st_mode) == 0o600
        assert read_pgpass(own) == {user: every[user]}, component  # no one else's line
        dsn = services.for_component(component).settlement_dsn  # type: ignore[arg-type]
        with connect(dsn) as conn:
            assert conn.execute("select current_user").fetchone() == (user,)


def test_terminate_all_signals_together_and_kills_what_ignores_it(tmp_path) -> None:
    """How `services down` stops the Kafka nodes: one signal to each at once, then SIGKILL
    for any still running at the deadline (no services needed: two real processes)."""
    import sys
    import time

    from settlement.services.procs import PidFile, spawn, terminate_all

    polite = "import time; time.sleep(60)"
    deaf = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "print('deaf', flush=True); time.sleep(60)")
    files = []
    for i, code in enumerate((polite, deaf)):
        pf = PidFile(tmp_path / f"p{i}.pid")
        spawn([sys.executable, "-c", code, f"marker-{i}"], tmp_path / f"p{i}.log", pf,
              marker=f"marker-{i}")
        files.append(pf)
    deadline = time.monotonic() + 30  # the deaf one has installed its handler
    while "deaf" not in (tmp_path / "p1.log").read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    started = time.monotonic()
    assert terminate_all(files, timeout=2.0) is True
    took = time.monotonic() - started
    assert [pf.alive_pid() for pf in files] == [None, None]
    assert 2.0 <= took < 10, took  # the deaf one waited for the deadline, then SIGKILL
    assert terminate_all(files, timeout=2.0) is False  # nothing left to stop
