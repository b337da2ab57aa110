"""PostgreSQL access: connections, named SQL blocks, forward-only migrations."""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import psycopg

from settlement.config import Settings, resource_dir
from settlement.errors import DatabaseError
from settlement.errors import redact as _redact

SQL_DIR = resource_dir("sql")  # the checkout's sql/, or the copy inside the wheel
MIGRATIONS_DIR = SQL_DIR / "migrations"
_NAME = re.compile(r"^--\s*name:\s*(\w+)\s*$", re.M)
_MIGRATION = re.compile(r"^(\d{4})_(\w+)\.sql$")
# Serialises concurrent migrators on one database (two sites starting at once).
_LOCK_KEY = 7_201_301


# How long any connection this code opens waits on a server that has gone silent (a site
# lost or cut off drops packets; it does not refuse them). libpq's own parameters, applied
# by open_connection unless the DSN sets them itself (docs/operations.md, "Failure detection"):
# - connect_timeout, per host of a multi-host DSN: a silent member costs 3 s before the next
#   is tried (libpq's default waits for the operating system, about two minutes);
# - keepalives: an idle session to a vanished server is found dead in 5 + 2 x 3 = 11 s;
# - tcp_user_timeout: a request the server has not acknowledged within 10 s ends the
#   session (TCP's own retransmissions would wait about 15 minutes).
# A slow but answering server is not cut short: these act on the network, not on queries.
LIBPQ_TIMEOUTS: dict[str, int] = {
    "connect_timeout": 3, "keepalives": 1, "keepalives_idle": 5, "keepalives_interval": 2,
    "keepalives_count": 3, "tcp_user_timeout": 10_000}


def timeout_params(dsn: str, timeout: int | None = None) -> dict[str, Any]:
    """The failure-detection parameters ``dsn`` does not set itself (``timeout``: another
    connect_timeout, e.g. a quick probe's)."""
    given = psycopg.conninfo.conninfo_to_dict(dsn)
    params: dict[str, Any] = {k: v for k, v in LIBPQ_TIMEOUTS.items() if k not in given}
    if timeout is not None:
        params["connect_timeout"] = timeout
    return params


def open_connection(dsn: str, *, autocommit: bool = False, timeout: int | None = None,
                    **kwargs: Any) -> psycopg.Connection:
    """psycopg.connect with the failure-detection parameters; psycopg's errors pass through
    (for callers that tell an unreachable server from other failures)."""
    return psycopg.connect(dsn, autocommit=autocommit, **timeout_params(dsn, timeout),
                           **kwargs)


def connect(dsn: str, *, autocommit: bool = False, timeout: int | None = None,
            **kwargs: Any) -> psycopg.Connection:
    try:
        return open_connection(dsn, autocommit=autocommit, timeout=timeout, **kwargs)
    except psycopg.OperationalError as e:
        raise DatabaseError(f"cannot connect to {redact(dsn)}: {str(e).strip()}") from None


def with_dbname(dsn: str, dbname: str) -> str:
    """The same server and credentials, another database (URL form kept as a URL)."""
    from urllib.parse import urlsplit, urlunsplit

    if dsn.startswith(("postgresql://", "postgres://")):
        parts = urlsplit(dsn)
        return urlunsplit(parts._replace(path=f"/{dbname}"))
    return psycopg.conninfo.make_conninfo(dsn, dbname=dbname)


def redact(dsn: str) -> str:
    return _redact(dsn)


def pgpass_entries(path: str | Path) -> list[list[str]]:
    """The lines of a pgpass file as [host, port, database, user, password], unescaped
    (libpq's format: ``\\:`` and ``\\\\`` inside a field, ``#`` starts a comment)."""
    if not os.path.exists(path):
        return []
    out = []
    with open(path) as f:
        for line in f:
            fields = re.split(r"(?<!\\):", line.rstrip("\n"), maxsplit=4)
            if len(fields) == 5 and not line.startswith("#"):
                out.append([x.replace("\\:", ":").replace("\\\\", "\\") for x in fields])
    return out


def dsn_password(dsn: str) -> str | None:
    """The password libpq would use for ``dsn``: its own, else the matching line of its
    passfile (``?passfile=`` or $PGPASSFILE). For clients that are not libpq (Spark's JDBC
    driver), so that no password has to be written into a DSN."""
    info = psycopg.conninfo.conninfo_to_dict(dsn)
    if info.get("password"):
        return str(info["password"])
    passfile = info.get("passfile") or os.environ.get("PGPASSFILE")
    if not passfile:
        return None
    want = [str(info.get("host") or "localhost"), str(info.get("port") or 5432),
            str(info.get("dbname") or ""), str(info.get("user") or "")]
    for fields in pgpass_entries(str(passfile)):
        if all(have in ("*", w) for have, w in zip(fields[:4], want, strict=True)):
            return fields[4]
    return None


@cache
def queries(name: str) -> dict[str, str]:
    """Named blocks of ``sql/queries/<name>.sql`` (``-- name: foo`` starts a block)."""
    text = (SQL_DIR / "queries" / f"{name}.sql").read_text()
    parts = _NAME.split(text)
    return {parts[i]: parts[i + 1].strip() for i in range(1, len(parts), 2)}


def q(module: str, name: str) -> str:
    return queries(module)[name]


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    path: Path

    @property
    def sql(self) -> str:
        return self.path.read_text()

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


def migrations() -> list[Migration]:
    found = []
    for p in sorted(MIGRATIONS_DIR.glob("*.sql")):
        m = _MIGRATION.match(p.name)
        if not m:
            raise DatabaseError(f"{p}: migration files are named NNNN_description.sql")
        found.append(Migration(int(m.group(1)), m.group(2), p))
    versions = [m.version for m in found]
    if versions != list(range(1, len(found) + 1)):
        raise DatabaseError(f"migrations must be numbered 1..N without gaps, found {versions}")
    return found


def migrate_database(dsn: str) -> list[str]:
    """Apply pending migrations to one database; returns the names applied."""
    applied: list[str] = []
    with connect(dsn) as conn:
        conn.execute("select pg_advisory_lock(%s)", (_LOCK_KEY,))
        try:
            conn.execute(
                "create table if not exists schema_migrations ("
                " version integer primary key, name text not null, checksum text not null,"
                " applied_at timestamptz not null default now())"
            )
            conn.commit()
            done = {
                v: c for v, c in conn.execute("select version, checksum from schema_migrations")
            }
            for m in migrations():
                if m.version in done:
                    if done[m.version] != m.checksum:
                        raise DatabaseError(
                            f"{redact(dsn)}: migration {m.path.name} was edited after it was "
                            "applied; migrations are forward-only, add a new numbered file"
                        )
                    continue
                with conn.transaction():
                    conn.execute(m.sql)  # type: ignore[arg-type]
                    conn.execute(
                        "insert into schema_migrations (version, name, checksum)"
                        " values (%s, %s, %s)",
                        (m.version, m.name, m.checksum),
                    )
                applied.append(m.path.name)
        finally:
            conn.execute("select pg_advisory_unlock(%s)", (_LOCK_KEY,))
            conn.commit()
    return applied


def ensure_database(dsn: str) -> bool:
    """Create the DSN's database if the server lacks it (needs CREATEDB); True if created."""
    info = psycopg.conninfo.conninfo_to_dict(dsn)
    dbname = info.get("dbname")
    if not dbname:
        return False
    try:
        open_connection(dsn).close()
        return False
    except psycopg.OperationalError as e:
        if "does not exist" not in str(e):
            raise DatabaseError(f"cannot connect to {redact(dsn)}: {str(e).strip()}") from None
    with connect(with_dbname(dsn, "postgres"), autocommit=True) as conn:
        conn.execute(psycopg.sql.SQL("create database {}").format(
            psycopg.sql.Identifier(str(dbname))))
    return True


def migrate_all(settings: Settings) -> dict[str, Any]:
    """`settle db migrate`: every database this deployment uses, each once."""
    result: dict[str, Any] = {}
    seen: set[str] = set()
    for role, dsn in settings.for_component("admin").all_dsns().items():
        if dsn in seen:
            result[role] = "same database as another role"
            continue
        seen.add(dsn)
        created = ensure_database(dsn)
        result[role] = {"created": created, "applied": migrate_database(dsn)}
    return result
