"""The settlement cluster's backups and a point-in-time restore (issue 60), with pgBackRest.

The repository is the witness's `backup` service (deploy/pgbackrest/repo.conf); whichever
member is primary archives its WAL there (patroni.yml's archive_command). This module runs
pgBackRest inside that service:

- `ensure_stanza`: the stanza created (idempotent) and WAL archiving checked, at `stack up`;
- `take_backup`: `make stack-backup` (full, differential or incremental);
- `point_in_time_drill`: `make stack-drill FAULT=point-in-time DATE=D`. A published day's rows
  are deleted by mistake as the admin; a copy of the cluster as it stood the moment before is
  restored from the repository beside it at the witness (pgBackRest `--type=time`, then a
  PostgreSQL on that copy); the day's rows are put back into the live cluster from it, and
  checked against what was published before and against Kafka.

Why the deleted rows are copied back rather than the whole cluster rewound: the cluster kept
taking writes after the mistake (both sites' ingest, other days' closes, heartbeats); rewinding
it would throw those away at both sites. The copy is restored to the same moment a rewind
would reach, and only what the mistake removed is taken from it (docs/operations.md, "Backups
and restore", has both runbooks).
"""

from __future__ import annotations

import json
import subprocess
import time
from collections import Counter
from datetime import UTC, date, datetime
from typing import Any

import psycopg
from psycopg import sql

from settlement.errors import ServiceError
from settlement.stack.compose import Stack
from settlement.stack.engine import Log

STANZA = "settlement"
# Where a restored copy is made and run, inside the backup service (its repository's volume),
# and the port naming its socket: it listens on no TCP address (listen_addresses ''), so it
# takes no port of the host's and nobody else can reach it.
RESTORED_DIR = "/var/lib/pgbackrest/restored"
RESTORED_SOCKET = ("/tmp", 27453)
RESTORE_CONF = "/tmp/pgbackrest-restore.conf"
# The published day's rows, each table with the condition selecting them (``{d}``: the date
# as an SQL literal), in the order they can be deleted (children before what they reference);
# they are put back in the reverse order. Run history (settlement_runs, close leases, re-close
# decisions) is not in it: a mistaken DELETE of a day's results leaves it.
_OF_DAYS_INSTRUCTIONS = ("instruction_id in (select instruction_id from settlement_instructions"
                         " where trade_date = {d})")
DAY_TABLES: tuple[tuple[str, str], ...] = (
    ("instruction_answers", _OF_DAYS_INSTRUCTIONS),
    ("instruction_marks", _OF_DAYS_INSTRUCTIONS),
    ("instruction_statuses", _OF_DAYS_INSTRUCTIONS),
    ("settlement_instructions", "trade_date = {d}"),
    ("run_positions", "trade_date = {d}"),
    ("run_cash_obligations", "trade_date = {d}"),
    ("run_instrument_summary", "trade_date = {d}"),
    ("positions", "trade_date = {d}"),
    ("cash_obligations", "trade_date = {d}"),
    ("instrument_summary", "trade_date = {d}"),
    ("audit_reports", "trade_date = {d}"),
    ("published_days", "trade_date = {d}"),
)
BACKUP_TYPES = ("full", "diff", "incr")


def _where(condition: str, day: date) -> str:
    # The date is a date object rendered by isoformat: never text from outside.
    return condition.format(d=f"date '{day.isoformat()}'")


def _exec(stack: Stack, *argv: str, timeout: float = 1800, check: bool = True,
          env_unset: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    """A command in the backup service, as its user (postgres)."""
    unset = [f"-u{name}" for name in env_unset]
    cmd = stack.compose_argv("exec", "-T", "backup", *(["env", *unset] if unset else []), *argv)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False,
                          cwd=stack.root)
    if check and proc.returncode != 0:
        raise _failed(argv, proc)
    return proc


def _failed(argv: tuple[str, ...], proc: subprocess.CompletedProcess[str]) -> ServiceError:
    tail = (proc.stderr + proc.stdout).strip().splitlines()[-12:]
    return ServiceError(f"{' '.join(argv[:4])} in the backup service failed "
                        f"(exit {proc.returncode}):\n" + "\n".join(tail))


def pgbackrest(stack: Stack, *args: str, timeout: float = 1800) -> str:
    return _exec(stack, "pgbackrest", f"--stanza={STANZA}", *args, timeout=timeout).stdout


# pgBackRest's exit code when another of its processes holds the lock it needs.
LOCK_HELD = 50
# How long a command waits for such a lock: at `stack up` the new primary's archive_command
# (an archive-push to this repository) may hold the stanza's archive lock for a moment, and
# stanza-create then failed a fresh clone's `make test` (2026-12-01) where it had passed before.
LOCK_WAIT_S = 60


def _while_locked(stack: Stack, command: str) -> str:
    """``pgbackrest`` ``command``, run again while another pgBackRest process holds its lock
    (exit 50), for at most ``LOCK_WAIT_S``; any other failure, or the lock still held then,
    is raised as ``pgbackrest`` raises it."""
    argv = ("pgbackrest", f"--stanza={STANZA}", command)
    deadline = time.monotonic() + LOCK_WAIT_S
    proc = _exec(stack, *argv, timeout=300, check=False)
    while proc.returncode == LOCK_HELD and time.monotonic() < deadline:
        time.sleep(2)
        proc = _exec(stack, *argv, timeout=300, check=False)
    if proc.returncode != 0:
        raise _failed(argv, proc)
    return proc.stdout


def ensure_stanza(stack: Stack, log: Log) -> dict[str, Any]:
    """The stanza in the repository (created once; a second call finds it) and WAL archiving
    checked end to end: `check` switches the primary to a new segment and waits for it to
    reach the repository."""
    t0 = time.monotonic()
    _while_locked(stack, "stanza-create")
    _while_locked(stack, "check")
    log(f"backups: stanza {STANZA} ready at the witness, WAL archiving checked "
        f"({time.monotonic() - t0:.1f} s)")
    return {"backup_stanza": STANZA, "wal_archiving": True}


def info(stack: Stack) -> dict[str, Any]:
    """pgBackRest's account of the stanza: its backups (oldest first) and archived WAL."""
    found = json.loads(pgbackrest(stack, "info", "--output=json", timeout=120) or "[]")
    return found[0] if found else {}


def describe_backup(entry: dict[str, Any]) -> dict[str, Any]:
    stamp = entry.get("timestamp", {})
    return {"label": entry.get("label"), "type": entry.get("type"),
            "started": _iso(stamp.get("start")), "stopped": _iso(stamp.get("stop")),
            "database_bytes": entry.get("info", {}).get("size"),
            "repository_bytes": entry.get("info", {}).get("repository", {}).get("delta"),
            "wal_start": entry.get("archive", {}).get("start"),
            "wal_stop": entry.get("archive", {}).get("stop")}


def _iso(epoch: float | None) -> str | None:
    return None if epoch is None else datetime.fromtimestamp(epoch).astimezone().isoformat()


def take_backup(stack: Stack, kind: str, log: Log) -> dict[str, Any]:
    """A backup of the settlement cluster's primary into the repository (an incremental or a
    differential with no full one before it is taken full: pgBackRest's own rule)."""
    if kind not in BACKUP_TYPES:
        raise ValueError(f"backup type {kind!r}: choose one of {', '.join(BACKUP_TYPES)}")
    t0 = time.monotonic()
    log(f"backups: taking a {kind} backup of the primary into the witness's repository...")
    pgbackrest(stack, f"--type={kind}", "backup")
    seconds = round(time.monotonic() - t0, 1)
    stanza = info(stack)
    backups = stanza.get("backup", [])
    if not backups:
        raise ServiceError("pgBackRest reported no backup after taking one: see `docker "
                           "compose logs backup`")
    latest = describe_backup(backups[-1])
    log(f"backups: {latest['label']} ({latest['type']}) in {seconds} s")
    return {"backup": latest, "backups": [describe_backup(b) for b in backups],
            "status": stanza.get("status", {}).get("message"), "seconds": seconds,
            "passed": True}


def _rows(conn: psycopg.Connection[Any], day: date) -> dict[str, Counter[str]]:
    """Each of the day's tables' rows as text (a multiset: a row's every column)."""
    out = {}
    for table, condition in DAY_TABLES:
        query = sql.SQL("select t::text from {} t where ").format(sql.Identifier(table))
        rows = conn.execute(query + sql.SQL(_where(condition, day))).fetchall()
        out[table] = Counter(str(r[0]) for r in rows)
    return out


def _server_now(conn: psycopg.Connection[Any]) -> datetime:
    row = conn.execute("select clock_timestamp()").fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


def _restored_psql(stack: Stack, query: str, timeout: float = 600) -> str:
    host, port = RESTORED_SOCKET
    return _exec(stack, "psql", "-X", "-q", "-h", host, "-p", str(port), "-U", "settle",
                 "-d", "settlement", "-v", "ON_ERROR_STOP=1", "-Atc", query,
                 timeout=timeout).stdout


# The backup service's own addresses of the members: a restore and the copy's archive-get are
# local to it (its repository), so pgBackRest must not see them.
_MEMBER_ENV = ("PGBACKREST_PG1_HOST", "PGBACKREST_PG1_HOST_PORT", "PGBACKREST_PG1_PORT",
               "PGBACKREST_PG2_HOST", "PGBACKREST_PG2_HOST_PORT", "PGBACKREST_PG2_PORT")


def pgbackrest_time(moment: datetime) -> str:
    """``moment`` as pgBackRest's --target takes it: UTC, to the millisecond, cut down (never
    later than the moment)."""
    utc = moment.astimezone(UTC)
    return f"{utc:%Y-%m-%d %H:%M:%S}.{utc.microsecond // 1000:03d}+00"


def restore_copy(stack: Stack, target: datetime, log: Log) -> None:
    """The cluster as it stood at ``target`` restored into RESTORED_DIR at the witness, and a
    PostgreSQL started on it (socket only) once recovery reached the target and promoted."""
    host, port = RESTORED_SOCKET
    _exec(stack, "rm", "-rf", RESTORED_DIR)
    log(f"restore: the cluster as of {target.isoformat()} into {RESTORED_DIR} at the witness")
    # A configuration of its own: the repository, read locally, and the copy as the only
    # PostgreSQL (the service's file names the members; its restore_command keeps this one).
    _exec(stack, "bash", "-c", f"printf '[global]\\nrepo1-path=/var/lib/pgbackrest\\n"
          f"log-level-console=warn\\nlog-level-file=off\\n' > {RESTORE_CONF}")
    try:
        _exec(stack, "pgbackrest", f"--config={RESTORE_CONF}", f"--stanza={STANZA}",
              f"--pg1-path={RESTORED_DIR}", "--type=time",
              f"--target={pgbackrest_time(target)}", "--target-action=promote", "restore",
              env_unset=_MEMBER_ENV)
    except ServiceError as exc:
        if "[075]" not in str(exc):
            raise
        ends = [describe_backup(b)["stopped"] for b in info(stack).get("backup", [])]
        raise ServiceError(f"no backup ended before {pgbackrest_time(target)}: a restore "
                           "starts from one and replays WAL forward; the backups kept ended "
                           f"at {', '.join(str(e) for e in ends) or 'none'} (retention keeps "
                           "two full ones: restore targets before the oldest are gone)"
                           ) from exc
    # The copy's configuration is the primary's (Patroni's): its TLS files, pg_hba path,
    # archiving and synchronous standby do not apply to a copy nobody but this drill reads.
    options = " ".join([
        f"-c port={port}", f"-c unix_socket_directories={host}", "-c listen_addresses=''",
        "-c ssl=off", "-c archive_mode=off", "-c synchronous_standby_names=''",
        f"-c hba_file={RESTORED_DIR}/pg_hba.conf", f"-c ident_file={RESTORED_DIR}/pg_ident.conf",
        "-c logging_collector=off", "-c shared_buffers=128MB"])
    _exec(stack, "bash", "-c", f'"$PG_BIN_DIR/pg_ctl" -D {RESTORED_DIR} -w -t 600 '
          f'-l {RESTORED_DIR}.log -o "{options}" start', env_unset=_MEMBER_ENV, timeout=700)
    deadline = time.monotonic() + 600
    while _restored_psql(stack, "select pg_is_in_recovery()").strip() != "f":
        if time.monotonic() > deadline:
            tail = _exec(stack, "tail", "-n", "20", f"{RESTORED_DIR}.log", check=False).stdout
            raise ServiceError(f"the restored copy did not finish recovery in 600 s:\n{tail}")
        time.sleep(1)


def drop_copy(stack: Stack) -> None:
    _exec(stack, "bash", "-c", f'"$PG_BIN_DIR/pg_ctl" -D {RESTORED_DIR} -m fast stop || true',
          check=False, timeout=120)
    _exec(stack, "rm", "-rf", RESTORED_DIR, f"{RESTORED_DIR}.log", RESTORE_CONF, check=False)


def put_back(stack: Stack, conn: psycopg.Connection[Any], day: date) -> dict[str, int]:
    """The day's rows copied from the restored copy into the live cluster, in one transaction:
    those the live cluster lacks only (a row it still has, or got again, is not doubled)."""
    added = {}
    with conn.transaction():
        for table, condition in reversed(DAY_TABLES):
            where = _where(condition, day)
            data = _restored_psql(stack, f"copy (select * from {table} where {where}) to stdout")
            ident = sql.Identifier(table)
            conn.execute(sql.SQL("create temp table restored (like {}) on commit drop")
                         .format(ident))
            with conn.cursor().copy("copy restored from stdin") as copy:
                copy.write(data)
            # overriding: an answer's id is an identity column; it keeps the id it had.
            cur = conn.execute(sql.SQL("insert into {} overriding system value select * from "
                                       "restored except all select * from {} where ")
                               .format(ident, ident)
                               + sql.SQL(where))
            added[table] = cur.rowcount
            conn.execute("drop table restored")
    return added


def parse_target(text: str) -> datetime:
    """An operator's restore target: an ISO time with its zone (a bare time would be read in
    whichever zone the server or this host has)."""
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(f"--target {text!r} is not a time: give the moment before the "
                         "mistake as YYYY-MM-DD HH:MM:SS[.fff]+00 (its zone included)") from None
    if moment.tzinfo is None:
        raise ValueError(f"--target {text!r} has no time zone: add it (+00 for UTC), e.g. "
                         f"'{text.strip()}+00'")
    return moment


def restore_day(stack: Stack, conn: psycopg.Connection[Any], day: date, target: datetime,
                log: Log) -> dict[str, Any]:
    """The day's published rows as they stood at ``target`` put back into the live cluster
    (``conn``: the admin on the primary) from a copy restored at the witness: what an operator
    runs after a mistaken DELETE (`settle stack restore --date D --target T`), and the
    drill's second half."""
    t0 = time.monotonic()
    pgbackrest(stack, "check", timeout=300)  # the mistake's WAL segment in the repository
    try:
        restore_copy(stack, target, log)
        replayed = _restored_psql(
            stack, "select extract(epoch from pg_last_xact_replay_timestamp())").strip()
        added = put_back(stack, conn, day)
    finally:
        drop_copy(stack)
    seconds = round(time.monotonic() - t0, 1)
    log(f"restore: {sum(added.values())} rows of {day} back in {seconds} s")
    return {"trade_date": day.isoformat(), "restore_target": target.isoformat(),
            "put_back": added, "restore_s": seconds,
            "last_restored_commit": (datetime.fromtimestamp(float(replayed), UTC)
                                     .isoformat() if replayed else None)}


def point_in_time_drill(stack: Stack, admin_dsn: str, trade_date: str, log: Log,
                        judge: Any) -> dict[str, Any]:
    """A published day's rows deleted by mistake as the admin, then restored from the backup
    repository as of the moment before; ``judge(trade_date)`` checks the published positions
    against the day read from Kafka."""
    day = date.fromisoformat(trade_date)
    with psycopg.connect(admin_dsn + "&target_session_attrs=read-write",
                         autocommit=True) as conn:
        if conn.execute("select 1 from published_days where trade_date = %s",
                        (day,)).fetchone() is None:
            raise ServiceError(f"{trade_date} is not published in the settlement database: "
                               f"settle it first (make stack-drill DATE={trade_date})")
        if not info(stack).get("backup"):
            log("restore: no backup in the repository yet: taking a full one first")
            take_backup(stack, "full", log)
        # A restore starts from a backup that ended before its target, and pgBackRest keeps
        # a backup's end to the second: right after one (`make stack-backup`, then the drill)
        # the moment before the mistake would lie inside it (CI met "unable to find backup
        # set with stop time less than" the target).
        ended = info(stack)["backup"][-1]["timestamp"]["stop"]
        time.sleep(max(0.0, ended + 1.5 - time.time()))
        before = _rows(conn, day)
        target = _server_now(conn)
        time.sleep(0.2)  # the delete's commit lies clearly after the target
        with conn.transaction():  # the mistake
            deleted = {table: conn.execute(
                sql.SQL("delete from {} where ").format(sql.Identifier(table))
                + sql.SQL(_where(condition, day))).rowcount
                for table, condition in DAY_TABLES}
        deleted_at = _server_now(conn)
        log(f"restore: the admin deleted {sum(deleted.values())} rows of {trade_date} "
            f"({deleted_at.isoformat()})")
        try:
            restored = restore_day(stack, conn, day, target, log)
        except Exception as exc:
            raise ServiceError(
                f"{exc}\nThe drill deleted {trade_date}'s published rows at "
                f"{deleted_at.isoformat()}; once the cause is mended, put them back with: "
                f"settle stack restore --date {trade_date} --target "
                f"'{pgbackrest_time(target)}'") from exc
        after = _rows(conn, day)
    lost = sum((before[t] - after[t]).total() for t in before)
    extra = sum((after[t] - before[t]).total() for t in before)
    verdict = judge(trade_date)
    last = restored["last_restored_commit"]
    rpo_s = (round(deleted_at.timestamp() - datetime.fromisoformat(last).timestamp(), 3)
             if last else None)
    result = {
        "fault": "point-in-time", **restored, "deleted_at": deleted_at.isoformat(),
        "deleted": deleted, "published_rows": sum(c.total() for c in before.values()),
        "published_lost": lost, "unexpected_rows": extra,
        # How long before the DELETE the restored copy's last commit was: what a restore to
        # that moment gives up (the target, less what was quiet in between).
        "rpo_s": rpo_s,
        "positions_match": verdict["positions_match"], "positions": verdict["positions"],
        "lost": verdict["lost"], "duplicated": verdict["duplicated"],
        "publications": verdict["publications"],
    }
    result["restored"] = bool(sum(deleted.values()) > 0 and lost == 0 and extra == 0)
    result["passed"] = bool(result["restored"] and verdict["positions_match"] is not False
                            and verdict["lost"] == 0 and verdict["duplicated"] == 0
                            and verdict["publications"] == 1)
    return result
