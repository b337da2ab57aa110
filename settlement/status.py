"""`settle status`: are the sites healthy and caught up, and how did the last days settle?

Read only, from the sources of truth: heartbeats, close markers, dead letters and stored
positions in each ledger (offsets live there, not in Kafka's committed offsets), the high
watermarks from Kafka, and the runs from the settlement database. The verdict is a list of
problems; no problem means healthy (exit 0), which a liveness or readiness probe can use.
"""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass
from typing import Any

import psycopg

from settlement.config import LEDGERS, Settings
from settlement.db import open_connection, q
from settlement.errors import START_SERVICES, redact

BEGINNING = -1  # a stored next_offset meaning "from the start of the partition"


@dataclass(frozen=True)
class Thresholds:
    """What counts as unhealthy. A site that has not beaten for ``forget_after`` seconds is
    taken as retired (a scheme switch, a decommissioned site) rather than down."""

    max_heartbeat_age: float = 15.0
    max_lag: int = 10_000
    max_lag_seconds: float = 120.0
    forget_after: float = 3600.0


def status(settings: Settings, limits: Thresholds | None = None) -> dict[str, Any]:
    limits = limits or Thresholds()
    settings = settings.for_component("auditor")  # status reads, and may only read
    problems: list[str] = []
    kafka = kafka_watermarks(settings)
    if kafka.get("error"):
        problems.append(f"Kafka is not reachable at {settings.bootstrap()}: {START_SERVICES}")
    ledgers: dict[str, Any] = {}
    unreachable: list[str] = []
    for name in LEDGERS:
        try:
            led = ledger_status(settings, name, kafka.get("high", {}))
        except psycopg.Error as e:  # down, refused, not migrated, no privilege: all reported
            unreachable.append(name)
            ledgers[name] = {"reachable": False, "error": redact(str(e).strip())[:300]}
            continue
        if led is not None:
            ledgers[name] = led
    if unreachable:
        problems.append(_db_problem(f"ledger database(s) {', '.join(unreachable)}",
                                    ledgers[unreachable[0]]["error"], settings))
    if not kafka.get("error"):
        probe_lag_seconds(settings, ledgers, kafka.get("low", {}))
    runs = settlement_runs(settings)
    if runs.get("error"):
        problems.append(_db_problem("settlement database", runs["error"], settings))
    if not runs.get("error"):
        try:
            runs["awaiting_reclose"] = [a.as_dict() for a in awaiting_reclose(settings)]
        except psycopg.Error as e:
            runs["awaiting_reclose_error"] = redact(str(e).strip())[:300]
        amended = {a["trade_date"]: a for a in runs.get("awaiting_reclose", [])}
        for r in runs["runs"]:
            # The published run of a day amended since it: its report stands until a re-close
            # publishes the next version.
            a = amended.get(r["trade_date"])
            if a is not None and a["published_run"] == r["run_id"]:
                r["amended_since"] = a["since"]
    problems += judge(ledgers, runs, limits, kafka_ok=not kafka.get("error"))
    return {"healthy": not problems, "problems": problems,
            "checked_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "topic": settings.topic, "kafka": kafka, "ledgers": ledgers,
            "settlement": runs, "thresholds": limits.__dict__}


def judge(ledgers: dict[str, Any], runs: dict[str, Any], limits: Thresholds,
          kafka_ok: bool) -> list[str]:
    problems: list[str] = []
    live = 0
    for name, led in ledgers.items():
        if not led.get("reachable"):
            continue
        for site, s in led["sites"].items():
            age = s["age_seconds"]
            if age <= limits.max_heartbeat_age:
                live += 1
            elif age <= limits.forget_after:
                problems.append(f"site {site} (ledger {name}): last heartbeat {age:.0f}s ago "
                                f"(limit {limits.max_heartbeat_age:.0f}s): is it running?")
        for p, o in led["partitions"].items():
            if o.get("high") is not None and o["stored"] > o["high"]:
                problems.append(f"ledger {name} partition {p}: stored position {o['stored']} "
                                f"is past the end of the log ({o['high']}): the topic was "
                                "recreated or the ledger restored; the site has paused this "
                                "partition (docs/operations.md, \"A partition is stalled\")")
            if o.get("lag") is not None and o["lag"] > limits.max_lag:
                problems.append(f"ledger {name} partition {p}: {o['lag']} messages behind "
                                f"(limit {limits.max_lag})")
            if o.get("lag_seconds") is not None and o["lag_seconds"] > limits.max_lag_seconds:
                problems.append(f"ledger {name} partition {p}: {o['lag_seconds']:.0f}s behind "
                                f"(limit {limits.max_lag_seconds:.0f}s)")
    if kafka_ok and not live:
        problems.append("no site is running (no heartbeat in the last "
                        f"{limits.max_heartbeat_age:.0f}s): start `settle site run`")
    for close in runs.get("closes_in_progress", []):
        if close["lease_expired"]:
            problems.append(f"the close of {close['trade_date']} (run {close['run_id']}, "
                            f"{close['holder']}, since {close['since']}) stopped renewing its "
                            "lease: it was killed, is paused or is cut off; the next close of the "
                            "date takes it over (docs/operations.md, \"A close is stuck\")")
    latest = (runs.get("runs") or [None])[0]
    if latest is not None and latest["status"] != "succeeded":
        problems.append(f"the last settlement of {latest['trade_date']} (run "
                        f"{latest['run_id']}) {latest['status']}: {latest.get('error') or ''}"
                        .rstrip(": "))
    return problems


def kafka_watermarks(settings: Settings, timeout: float = 5.0) -> dict[str, Any]:
    """Low and high watermark per partition of the topic, or the error."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    c = Consumer({**settings.kafka_client_config(), "group.id": "settle-status",
                  "enable.auto.commit": False, "log_level": 0,
                  "socket.timeout.ms": int(timeout * 1000)})
    try:
        md = c.list_topics(settings.topic, timeout=timeout)
        t = md.topics.get(settings.topic)
        if t is None or t.error is not None or not t.partitions:
            return {"error": f"topic {settings.topic} not found"}
        low: dict[int, int] = {}
        high: dict[int, int] = {}
        for p in sorted(t.partitions):
            low[p], high[p] = c.get_watermark_offsets(TopicPartition(settings.topic, p),
                                                      timeout=timeout)
        return {"low": low, "high": high}
    except KafkaException as e:
        # The code only (e.g. _TRANSPORT): the problem line says what to do.
        err = e.args[0] if e.args else None
        return {"error": f"not reachable at {settings.bootstrap()}"
                         + (f" ({err.name()})" if hasattr(err, "name") else "")}
    finally:
        c.close()


DEMO_HINT = ("`make demo` keeps its data in the demo namespace: look at it with "
             "`SETTLE_TOPIC=demo_trades SETTLE_PG_DB_PREFIX=demo_ settle status`")


def _db_problem(what: str, error: str, settings: Settings | None = None) -> str:
    """Say what is wrong with a database that did not answer as expected, and what to do:
    down, login refused, not migrated, or a privilege missing."""
    if "does not exist" in error and ("relation" in error or "database" in error):
        hint = ""
        if settings is not None and not settings.pg_db_prefix and namespace_exists(
                settings, "demo_"):
            hint = f" ({DEMO_HINT})"
        return f"{what} not migrated ({error[:160]}): run `settle db migrate`{hint}"
    if "permission denied for" in error:
        return (f"{what}: the login lacks a privilege ({error[:200]}): run `settle db "
                "migrate` as the admin (it grants each component its rights), or check "
                "the grants of SETTLE_PG_DSN's user")
    if "password" in error or "authentication" in error or "permission denied" in error:
        return (f"{what} refused the login ({error[:200]}): check the user and password of "
                "SETTLE_PG_DSN / SETTLE_LEDGER_*_DSN (embedded: "
                "<state>/secrets/pgpass-<component>)")
    return f"{what} not reachable: {START_SERVICES}"


def namespace_exists(settings: Settings, prefix: str) -> bool:
    """Whether databases of a namespace (``demo_settlement`` ...) exist on the server."""
    from settlement.db import with_dbname

    try:
        with open_connection(with_dbname(settings.settlement_dsn, "postgres")) as conn:
            row = conn.execute("select exists (select 1 from pg_database where datname = %s)",
                               (f"{prefix}settlement",)).fetchone()
    except psycopg.Error:
        return False
    return bool(row and row[0])


def ledger_status(settings: Settings, name: str, high: dict[int, int]) -> dict[str, Any] | None:
    """One ledger's view; None if no site ever wrote to it (e.g. the shared ledger in the
    separate scheme)."""
    with open_connection(settings.ledger_dsn(name)) as conn:
        beats = conn.execute(q("status", "last_heartbeats")).fetchall()
        offsets = conn.execute(q("status", "stored_offsets"), {"topic": settings.topic}
                               ).fetchall()
        if not (beats or offsets):
            return None
        row = conn.execute(q("ingest", "current_day")).fetchone()
        day = row[0].isoformat() if row and row[0] else None
        markers = dead = 0
        if day is not None:
            args = {"topic": settings.topic, "trade_date": day,
                    "partitions": settings.partitions}
            markers = conn.execute(q("ingest", "closed_partitions"), args).fetchone()[0]  # type: ignore[index]
            dead = sum(int(n) for _, n in conn.execute(q("report", "dead_letters_by_reason"),
                                                       args))
    sites = {site: {"scheme": scheme, "last_heartbeat": at.isoformat(timespec="seconds"),
                    "age_seconds": round(float(age), 1), "partitions": list(parts),
                    "trades_total": int(total)}
             for site, scheme, at, age, parts, total in beats}
    partitions: dict[str, Any] = {}
    for group, p, stored, owner, updated in offsets:
        h = high.get(int(p))
        lag = None if h is None else max(h - (0 if stored == BEGINNING else int(stored)), 0)
        partitions[str(p)] = {"group": group, "stored": int(stored), "high": h, "lag": lag,
                              "lag_seconds": None if lag is None else 0.0 if lag == 0 else None,
                              "last_writer": owner,
                              "updated_at": updated.isoformat(timespec="seconds")}
    return {"reachable": True, "sites": sites, "partitions": partitions, "day": day,
            "close_markers": markers, "partitions_total": settings.partitions,
            "closed": markers >= settings.partitions,
            "dead_letters_today": dead}


def probe_lag_seconds(settings: Settings, ledgers: dict[str, Any],
                      low: dict[int, int] | None = None, timeout: float = 5.0) -> None:
    """Lag in seconds: the age of the first committed message a ledger has not stored yet.
    A partition whose remaining offsets are only transaction markers or aborted messages
    (read_committed skips them) has nothing to read: its lag is 0. Each ledger's lagging
    partitions are probed at once (one assignment, answered as their first fetches return),
    not one after another: a caught-up site's six partitions used to cost three seconds.
    ``low``: each partition's first offset (``kafka_watermarks``), where a position "from the
    beginning" (or one that retention passed) starts: a concrete offset is fetched as soon as
    the leader is known, where librdkafka resolves a logical one on a 500 ms retry timer
    (0.54 s against 0.05 s for six partitions here). `settle status` then answers in about
    0.45 s, most of it the interpreter's start and imports."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    if not any(o.get("lag") for led in ledgers.values() if led.get("reachable")
               for o in led["partitions"].values()):
        return
    # A fetch at the end of a partition is held by the broker for fetch.wait.max.ms (500 ms
    # by default) waiting for data; the probe wants the end reported at once.
    c = Consumer({**settings.kafka_client_config(), "group.id": "settle-status",
                  "enable.auto.commit": False, "isolation.level": "read_committed",
                  "enable.partition.eof": True, "fetch.wait.max.ms": 10, "log_level": 0})
    try:
        for led in ledgers.values():  # positions differ per ledger
            if not led.get("reachable"):  # an unreachable ledger has no partitions listed
                continue
            todo = {int(p): o for p, o in led["partitions"].items() if o.get("lag")}
            if not todo:
                continue
            c.assign([TopicPartition(settings.topic, p, _probe_offset(o["stored"], p, low))
                      for p, o in todo.items()])
            deadline = time.monotonic() + timeout
            while todo and time.monotonic() < deadline:
                m = c.poll(0.1)
                if m is None or m.partition() not in todo:
                    continue
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        o = todo.pop(m.partition())
                        o["lag"], o["lag_seconds"] = 0, 0.0
                        o["note"] = "only transaction markers or aborted messages remain"
                    continue
                o = todo.pop(m.partition())
                _, ts = m.timestamp()
                if ts > 0:
                    o["lag_seconds"] = round(max(time.time() - ts / 1000, 0.0), 1)
            c.unassign()
    finally:
        c.close()


def _probe_offset(stored: int, partition: int, low: dict[int, int] | None) -> int:
    """Where the lag probe of a partition starts: the stored position, or the log's first
    offset when the position is before it or "from the beginning"."""
    from confluent_kafka import OFFSET_BEGINNING

    first = (low or {}).get(partition)
    if first is None:
        return OFFSET_BEGINNING if stored == BEGINNING else stored
    return max(first, 0 if stored == BEGINNING else stored)


def settlement_runs(settings: Settings, days: int = 7) -> dict[str, Any]:
    """The last run of each of the newest ``days`` dates."""
    try:
        with open_connection(settings.settlement_dsn) as conn:
            rows = conn.execute(q("status", "last_runs"), {"days": days}).fetchall()
            closes = [{"trade_date": d.isoformat(), "run_id": run, "holder": holder,
                       "since": since.isoformat(timespec="seconds"), "lease_expired": expired,
                       "token": token}
                      for d, run, holder, since, expired, token
                      in conn.execute(q("lease", "closes_in_progress"))]
            abandoned = [{"run_id": run, "trade_date": d.isoformat(), "holder": holder,
                          "at": at.isoformat(timespec="seconds"), "reason": why}
                         for run, d, holder, at, why
                         in conn.execute(q("lease", "abandoned_runs"), {"days": days})]
            # Instructions the settlement agent reported failed (or settled in part) that no
            # later settlement date's instructions have taken over yet (custodian mode: still
            # pending with the agent), less those a re-close cancelled.
            open_fails = int(conn.execute(  # type: ignore[index]
                q("instructions", "open_fail_count")).fetchone()[0])
    except psycopg.Error as e:
        return {"error": redact(str(e).strip())[:300], "runs": []}
    cols = ("trade_date", "run_id", "source", "status", "validation_success", "published",
            "finished_at", "report_path", "error", "settlement_date")
    runs = []
    for r in rows:
        d = dict(zip(cols, r, strict=True))
        d["trade_date"] = d["trade_date"].isoformat()
        d["finished_at"] = d["finished_at"] and d["finished_at"].isoformat(timespec="seconds")
        d["settlement_date"] = d["settlement_date"] and d["settlement_date"].isoformat()
        runs.append(d)
    return {"runs": runs, "closes_in_progress": closes, "abandoned": abandoned,
            "open_fails": open_fails}


# -- days awaiting a re-close ------------------------------------------------------------------
@dataclass(frozen=True)
class AwaitingReclose:
    """A published day with post-close amendments its published run did not settle."""

    trade_date: str
    amendments: int  # post-close amendments stored since the published run's amended closes
    since: str  # when the first amended close not yet settled arrived (ISO 8601, UTC)
    published_run: int
    version: int | None

    def as_dict(self) -> dict[str, Any]:
        return {"trade_date": self.trade_date, "amendments": self.amendments,
                "since": self.since, "published_run": self.published_run,
                "version": self.version}


def awaiting_reclose(settings: Settings, trade_date: str | None = None
                     ) -> list[AwaitingReclose]:
    """Every published day (or ``trade_date`` only) whose ledgers hold amended closes newer
    than those its published run settled, with post-close amendments stored by them. The
    ledgers are read as the close reads them: each reachable one, the same amended close in
    two site ledgers counted once. Raises psycopg.Error when the settlement database cannot
    be read."""
    params = {"trade_date": trade_date}
    found: dict[tuple[str, int, int], tuple[dt.datetime, int]] = {}
    for name in LEDGERS:
        try:
            with open_connection(settings.ledger_dsn(name)) as conn:
                rows = conn.execute(q("status", "amended_closes"), params).fetchall()
        except psycopg.Error:
            continue  # unreachable or not this deployment's ledger: the others answer
        for d, p, k, at, n in rows:
            key = (d.isoformat(), int(p), int(k))
            seen = found.get(key)
            found[key] = (at, int(n)) if seen is None else (min(at, seen[0]), max(int(n), seen[1]))
    if not found:
        return []
    with open_connection(settings.settlement_dsn) as conn:
        published = {d.isoformat(): (int(run), version, settled or {})
                     for d, run, version, settled
                     in conn.execute(q("status", "published_amended_closes"), params)}
    days: dict[str, tuple[int, dt.datetime]] = {}
    for (d, p, k), (at, n) in found.items():
        pub = published.get(d)
        if pub is None or not n or k <= int(pub[2].get(str(p), 0)):
            continue  # not published yet (a close settles it), no amendment, or settled
        count, since = days.get(d, (0, at))
        days[d] = (count + n, min(since, at))
    return [AwaitingReclose(d, n, since.astimezone(dt.UTC).isoformat(timespec="seconds"),
                            published[d][0], published[d][1])
            for d, (n, since) in sorted(days.items(), reverse=True)]
