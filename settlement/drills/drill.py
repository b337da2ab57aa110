"""Failover drills: real gateway and sites, one injected fault, a Jepsen-style verdict.

A drill runs in a private namespace (topic and ledgers of its own) on the configured
services. The gateway publishes a paced trading day; sites A and B consume it in the chosen
scheme; one fault is injected once site A (the victim) has committed a chosen fraction of its
share of the day, read from the ledger (its share: the day's trades on the partitions it owns,
which the deterministic gateway tells in advance) -- by progress, not by the clock, so the
fault always finds A working:

- ``kill``: SIGKILL site A (in the separate scheme it is restarted and resumes);
- ``pause``: SIGSTOP site A while its writer is inside a ledger transaction, for longer than
  the consumer session timeout, then SIGCONT; its partitions move to B meanwhile (the server
  ends A's idle transaction, so B is not blocked), and the batch A held is refused when it
  wakes (zombie fencing: the "fenced" count);
- ``db-restart``: crash-restart PostgreSQL (immediate stop, no checkpoint) mid-batch;
- ``broker-kill``: SIGKILL one broker of the three-node cluster while the gateway produces
  with acks=all (it is restarted after the day);
- ``eod-kill``: the day is ingested without a fault, then both sites close it at once and
  site A's close is SIGKILLed mid-run (held frozen at a step before its publication, chosen
  by ``at``: settlement/drills/close.py); site B's close takes the date's lease over and
  publishes (settlement/drills/close.py judges the close: one publication, the killed run
  abandoned, none left running).

Then the day finishes and the checker compares an independent read_committed read of Kafka
with the ledger(s): ``lost``, ``duplicated``, ``unexpected``, ``nonmonotonic``, plus the
recovery time (RTO) and RPO (= trades lost).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import random
import signal
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from settlement.config import Settings, load_settings
from settlement.db import open_connection, q
from settlement.drills.checker import (
    Progress,
    check_ledger,
    day_share,
    read_kafka_day,
    wait_for_owners,
    wait_for_share,
)
from settlement.drills.close import CloseOutcome, kill_a_close
from settlement.drills.namespace import (
    drop_namespace,
    namespace_env,
    namespace_settings,
    reset_namespace,
)
from settlement.drills.runner import SiteProcesses, spawn_settle, wait

FAULTS = ("kill", "pause", "db-restart", "broker-kill", "eod-kill")
SCHEMES = ("separate", "shared")
RTO_TARGET_SECONDS = 10.0
# Every drill's day carries busts and corrections (issue 28): the failover must keep them
# exactly once like the trades, and the eod-kill drill's close settles them.
CANCEL_RATE = 0.002
CORRECT_RATE = 0.003


@dataclass(frozen=True)
class DrillSpec:
    scheme: str
    fault: str
    trades: int = 20_000
    seed: int = 1
    at: float = 0.4  # fraction of site A's share of the day committed when the fault hits
    rate: int = 4_000  # trades/s the gateway publishes
    trade_date: str = "2026-11-23"
    # Consumer processes per site (members of the site's group; all four in the shared group
    # in the shared scheme). A fault hits every process of site A.
    processes: int = 1


@dataclass
class DrillResult:
    spec: dict[str, Any]
    lost: int
    duplicated: int
    unexpected: int
    nonmonotonic: int
    rto_seconds: float | None
    rto_note: str
    rpo_trades: int
    ledger_trades: dict[str, int]
    kafka_trades: int
    fenced_batches: int
    fault_at: str
    fault_note: str  # how far site A had got, and how the fault landed
    seconds: float
    examples: dict[str, Any] = field(default_factory=dict)
    close: dict[str, Any] | None = None  # eod-kill: how the close phase went
    # Busts and corrections the gateway sent, and each ledger's stored (all, once each).
    amendments_sent: int = 0
    ledger_amendments: dict[str, int] = field(default_factory=dict)
    passed: bool = False
    report_path: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _env(settings: Settings, ns: dict[str, str]) -> dict[str, str]:
    return {**os.environ, **ns,
            # Small batches: many commits per second, so faults land between and inside them.
            "SETTLE_BATCH_SIZE": "500",
            "SETTLE_SESSION_TIMEOUT_MS": str(settings.session_timeout_ms),
            "SETTLE_HEARTBEAT_INTERVAL_MS": str(settings.heartbeat_interval_ms)}


def _ledgers(spec: DrillSpec) -> list[str]:
    return ["a", "b"] if spec.scheme == "separate" else ["shared"]


def _nonmonotonic(conn: psycopg.Connection, trade_date: str) -> int:
    row = conn.execute(q("drill", "nonmonotonic"), {"trade_date": trade_date}).fetchone()
    return int(row[0]) if row else 0


def _partitions_of(conn: psycopg.Connection, site: str, before: dt.datetime) -> list[int]:
    row = conn.execute(q("drill", "last_partitions"), {"site": site, "before": before}
                       ).fetchone()
    return list(row[0]) if row else []


def _rto(settings: Settings, spec: DrillSpec, fault_at: dt.datetime
         ) -> tuple[float | None, str]:
    if spec.scheme == "separate" and spec.fault in ("kill", "pause"):
        return 0.0, "separate scheme: site B consumes every partition all day (RTO 0 by design)"
    dsn = settings.ledger_dsn(_ledgers(spec)[-1])
    with open_connection(dsn) as conn:
        if spec.fault in ("kill", "pause"):
            parts = _partitions_of(conn, "a", fault_at)
            row = conn.execute(q("drill", "first_takeover"), {
                "site": "b", "partitions": parts, "after": fault_at}).fetchone()
            what = f"site B's first trade from site A's partitions {parts}"
        else:
            row = conn.execute(q("drill", "first_after"), {"after": fault_at}).fetchone()
            what = "the first trade ingested after the fault"
    if not row or row[0] is None:
        return None, f"no recovery observed ({what})"
    return round((row[0] - fault_at).total_seconds(), 3), f"fault -> {what}"


def _victim_progress(settings: Settings, spec: DrillSpec, site_a: Any) -> Progress:
    """Wait until site A has committed ``spec.at`` of its share of the day (bounded)."""
    per_partition = day_share(spec.trade_date, spec.trades, spec.seed, settings.partitions)
    dsn = settings.ledger_dsn(settings.site_ledger("a", spec.scheme))
    return wait_for_share(dsn, "a", per_partition, spec.at,
                          timeout=spec.trades / spec.rate * 2 + 60,
                          own_all=spec.scheme == "separate",
                          alive=lambda: site_a.poll() is None)


def _inject(base: Settings, settings: Settings, spec: DrillSpec, site_a: Any
            ) -> tuple[dt.datetime, str]:
    """Inject the fault; returns when it hit and how."""
    from settlement.services.kafka import EmbeddedKafka
    from settlement.services.postgres import EmbeddedPostgres

    note = ""
    at = dt.datetime.now(dt.UTC)
    if spec.fault == "kill":
        site_a.send_signal(signal.SIGKILL)
    elif spec.fault == "pause":
        at, note = _freeze_in_batch(settings.ledger_dsn(settings.site_ledger("a", spec.scheme)),
                                    site_a)
        time.sleep(base.session_timeout_ms / 1000 + 4)
        site_a.send_signal(signal.SIGCONT)
    elif spec.fault == "db-restart":
        EmbeddedPostgres(base).restart("immediate")
    elif spec.fault == "broker-kill":
        nodes = EmbeddedKafka(base).nodes()
        random.Random(spec.seed).choice(nodes[1:]).stop(kill=True)
    return at, note


def _freeze_in_batch(dsn: str, site_a: Any, timeout: float = 10.0) -> tuple[dt.datetime, str]:
    """SIGSTOP site A while its ledger writer is inside a batch transaction: the worst moment
    (offset rows locked, or COPY data half sent). A batch that commits between the look and
    the signal is let go (SIGCONT) and the next one is caught."""
    query, app = q("drill", "writer_in_transaction"), {"application_name": "settle-site-a-writer"}
    deadline = time.monotonic() + timeout
    with open_connection(dsn, autocommit=True) as conn:
        def inside() -> bool:
            return conn.execute(query, app).fetchone() is not None

        while time.monotonic() < deadline and site_a.poll() is None:
            if inside():
                site_a.send_signal(signal.SIGSTOP)
                at = dt.datetime.now(dt.UTC)
                time.sleep(0.05)  # what the writer had sent reaches the server
                if inside():
                    return at, "site A frozen inside a ledger transaction"
                site_a.send_signal(signal.SIGCONT)
            time.sleep(0.005)
    site_a.send_signal(signal.SIGSTOP)
    return dt.datetime.now(dt.UTC), "site A frozen (not caught inside a ledger transaction)"


def _check_preconditions(settings: Settings, spec: DrillSpec) -> None:
    if spec.scheme not in SCHEMES:
        raise ValueError(f"--scheme: expected one of {', '.join(SCHEMES)}, got {spec.scheme!r}")
    if spec.fault not in FAULTS:
        raise ValueError(f"--fault: expected one of {', '.join(FAULTS)}, got {spec.fault!r}")
    if spec.processes < 1:
        raise ValueError(f"--processes: expected at least 1, got {spec.processes}")
    if not 0 < spec.at < 1:
        raise ValueError(f"--at: expected a fraction of site A's share of the day between 0 "
                         f"and 1, got {spec.at}")
    if spec.fault == "db-restart" and settings.pg_dsn is not None:
        raise ValueError("--fault db-restart restarts the embedded PostgreSQL; it cannot "
                         "restart an external SETTLE_PG_DSN server")
    if spec.fault == "broker-kill":
        from settlement.services.kafka import EmbeddedKafka

        if not settings.embedded_kafka or len(EmbeddedKafka(settings).running_nodes()) < 3:
            raise ValueError("--fault broker-kill needs the embedded three-broker cluster: "
                             "`settle services down && settle services up --brokers 3`")


def run_drill(spec: DrillSpec, base: Settings | None = None, keep: bool = False,
              log_dir: Path | None = None,
              progress: Callable[[str], None] | None = None) -> DrillResult:
    """One drill; ``progress`` is told each phase as it starts (a drill takes minutes)."""
    from settlement import services

    say = progress or (lambda _step: None)

    base = base or load_settings()
    _check_preconditions(base, spec)
    started = time.monotonic()
    name = f"drill_{uuid.uuid4().hex[:8]}"
    ns = namespace_env(base, name)
    settings = namespace_settings(base, ns)
    reset_namespace(settings)
    env = _env(base, ns)
    logs = log_dir or base.state_dir / "drills" / name
    say(f"{spec.scheme} / {spec.fault}: starting sites A and B (logs in {logs})")
    a = SiteProcesses.start("a", spec.scheme, spec.trade_date, env, logs / "site-a.log",
                            spec.processes)
    b = SiteProcesses.start("b", spec.scheme, spec.trade_date, env, logs / "site-b.log",
                            spec.processes)
    # Both sites in the group before trading starts (a fixed sleep is too short on a busy
    # machine, where a site can take seconds to start).
    wait_for_owners({s: settings.ledger_dsn(settings.site_ledger(s, spec.scheme))
                     for s in ("a", "b")}, timeout=60)
    gw = spawn_settle(["simulate", "--date", spec.trade_date, "--trades", str(spec.trades),
                       "--seed", str(spec.seed), "--dup-rate", "0.01", "--bad-rate", "0.002",
                       "--abort-rate", "0.1", "--cancel-rate", str(CANCEL_RATE),
                       "--correct-rate", str(CORRECT_RATE), "--rate", str(spec.rate)], env,
                      logs / "gateway.log")
    say(f"publishing {spec.trades:,} trades; {spec.fault} when site A has {spec.at:.0%} "
        "of its share")
    if spec.fault == "eod-kill":  # the sites ingest undisturbed; the close is hit later
        fault_at, fault_note = dt.datetime.now(dt.UTC), ""
    else:
        progress = _victim_progress(settings, spec, a)
        fault_at, how = _inject(base, settings, spec, a)
        say(f"fault injected ({spec.fault}); waiting for the day to close")
        fault_note = "; ".join(x for x in (progress.describe(), how) if x)
    sim = wait(gw, "gateway", logs / "gateway.log", 600)
    outputs = []
    if spec.fault == "kill":
        a.wait(timeout=30)
        if spec.scheme == "separate":  # its own ledger only completes if it comes back
            a = SiteProcesses.start("a", spec.scheme, spec.trade_date, env,
                                    logs / "site-a-restarted.log", spec.processes)
            outputs += a.results("restarted site A", 600)
    else:
        outputs += a.results("site A", 600)
    outputs += b.results("site B", 600)
    if spec.fault == "broker-kill":
        services.up(base)  # bring the killed broker back for whatever runs next

    close: CloseOutcome | None = None
    if spec.fault == "eod-kill":
        say("closing the day from both sites at once; site A's close is killed mid-run")
        close = kill_a_close(settings, env, spec.trade_date, logs, spec.at, say)
        fault_at, fault_note = close.fault_at, close.note

    say("checking the ledger(s) against an independent read of Kafka")
    day = read_kafka_day(settings, spec.trade_date)
    lost = duplicated = unexpected = nonmono = 0
    rows: dict[str, int] = {}
    amended: dict[str, int] = {}
    examples: dict[str, Any] = {}
    for ledger in _ledgers(spec):
        res = check_ledger(settings.ledger_dsn(ledger), day, settings.topic)
        with open_connection(settings.ledger_dsn(ledger)) as conn:
            nonmono += _nonmonotonic(conn, spec.trade_date)
        # A bust or correction neither stored nor dead-lettered is lost like a trade.
        lost += len(res.lost) + len(res.lost_amendments)
        amended[ledger] = res.amendments
        duplicated += len(res.duplicated)
        unexpected += len(res.unexpected)
        rows[ledger] = res.ledger_rows
        if not res.ok:
            examples[ledger] = res.as_dict()["examples"]
    rto, note = ((close.takeover_seconds, "site A's close killed -> site B's run started")
                 if close is not None else _rto(settings, spec, fault_at))
    result = DrillResult(
        spec=asdict(spec), lost=lost, duplicated=duplicated, unexpected=unexpected,
        nonmonotonic=nonmono, rto_seconds=rto, rto_note=note, rpo_trades=lost,
        ledger_trades=rows, kafka_trades=len(day.trade_ids),
        amendments_sent=int(sim.get("cancels", 0)) + int(sim.get("corrections", 0)),
        ledger_amendments=amended,
        fenced_batches=sum(int(o.get("fenced", 0)) for o in outputs),
        fault_at=fault_at.isoformat(), fault_note=fault_note,
        seconds=round(time.monotonic() - started, 1),
        examples=examples, close=None if close is None else close.as_dict())
    # The RTO target is for a dead site (SIGKILL) in the shared scheme; a paused site is not
    # dead, and its takeover time is reported, not judged.
    result.passed = (lost == duplicated == unexpected == nonmono == 0
                     and len(day.trade_ids) == sim.get("trades")
                     and all(n == result.amendments_sent for n in amended.values())
                     and rto is not None
                     and not (spec.scheme == "shared" and spec.fault == "kill"
                              and rto > RTO_TARGET_SECONDS)
                     and (close is None or close.passed(len(day.trade_ids))))
    result.report_path = str(write_drill_page([result], logs / "drill.html"))
    if result.passed and not keep:
        drop_namespace(settings)
    return result


def campaign_pairs(faults: tuple[str, ...] = FAULTS) -> list[tuple[str, str]]:
    """Every (fault, scheme) pair, dealt so that the first ``len(faults)`` cover every fault
    once and put the failover paths -- kill and pause -- in the shared scheme (takeover and
    zombie fencing), the others in the separate scheme; the rest swap schemes."""
    def first(fault: str) -> str:
        return "shared" if fault in ("kill", "pause") else "separate"

    def other(fault: str) -> str:
        return "separate" if first(fault) == "shared" else "shared"

    return [(f, first(f)) for f in faults] + [(f, other(f)) for f in faults]


def run_campaign(runs: int, seed: int, trades: int = 15_000, base: Settings | None = None,
                 faults: tuple[str, ...] = FAULTS) -> list[DrillResult]:
    """Random order, seeds and progress points over ``campaign_pairs``: every fault appears
    once ``runs >= len(faults)`` (kill and pause in the shared scheme first), and every pair
    once ``runs >= 2 * len(faults)``."""
    rng = random.Random(seed)
    pairs = campaign_pairs(faults)
    plan = [pairs[i % len(pairs)] for i in range(runs)]
    rng.shuffle(plan)
    out = []
    for i, (fault, scheme) in enumerate(plan):
        spec = DrillSpec(scheme=scheme, fault=fault, trades=trades,
                         seed=rng.randrange(1_000_000), at=round(rng.uniform(0.2, 0.7), 2))
        print(f"drill {i + 1}/{runs}: {spec.scheme} / {spec.fault} at {spec.at:.0%} of site "
              "A's share ...", flush=True)
        out.append(run_drill(spec, base))
    return out


def summary(results: list[DrillResult]) -> dict[str, Any]:
    return {
        "runs": len(results), "passed": sum(r.passed for r in results),
        "lost": sum(r.lost for r in results), "duplicated": sum(r.duplicated for r in results),
        "unexpected": sum(r.unexpected for r in results),
        "nonmonotonic": sum(r.nonmonotonic for r in results),
        "max_shared_kill_rto_seconds": max(
            (r.rto_seconds or 0 for r in results
             if r.spec["scheme"] == "shared" and r.spec["fault"] == "kill"), default=None),
        "drills": [_row(r) for r in results],
    }


def _row(r: DrillResult) -> dict[str, Any]:
    return {"scheme": r.spec["scheme"], "fault": r.spec["fault"], "at": r.spec["at"],
            "trades": r.kafka_trades, "lost": r.lost, "duplicated": r.duplicated,
            "unexpected": r.unexpected, "nonmonotonic": r.nonmonotonic,
            "rto_seconds": r.rto_seconds, "fenced": r.fenced_batches, "passed": r.passed}


def markdown(results: list[DrillResult], command: str) -> str:
    s = summary(results)
    head = ("| scheme | fault | at (A's share) | trades | lost | duplicated | unexpected "
            "| nonmonotonic | RTO s | fenced batches | passed |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|")
    lines = [f"| {d['scheme']} | {d['fault']} | {d['at']:.0%} | {d['trades']} | {d['lost']} | "
             f"{d['duplicated']} | {d['unexpected']} | {d['nonmonotonic']} | "
             f"{d['rto_seconds']} | {d['fenced']} | {'yes' if d['passed'] else '**no**'} |"
             for d in s["drills"]]
    return "\n".join([
        f"Command: `{command}`", "",
        f"{s['passed']}/{s['runs']} drills passed; lost {s['lost']}, duplicated "
        f"{s['duplicated']}, unexpected {s['unexpected']}, nonmonotonic {s['nonmonotonic']}; "
        f"worst shared-scheme takeover RTO {s['max_shared_kill_rto_seconds']} s.", "",
        head, *lines, ""])


def write_drill_page(results: list[DrillResult], path: Path) -> Path:
    from html import escape

    rows = "".join(
        "<tr>" + "".join(f"<td>{escape(str(v))}</td>" for v in _row(r).values()) + "</tr>"
        for r in results)
    heads = "".join(f"<th>{escape(k)}</th>" for k in _row(results[0]))
    notes = "".join(f"<li>{escape(r.spec['scheme'])}/{escape(r.spec['fault'])}: "
                    f"{escape(r.fault_note)}; {escape(r.rto_note)}; "
                    f"examples: {escape(json.dumps(r.examples))}</li>"
                    for r in results)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "<!doctype html><meta charset=utf-8><title>Failover drill</title>"
        "<style>body{font:14px system-ui;margin:2rem}td,th{border-bottom:1px solid #ddd;"
        "padding:.3rem .6rem;text-align:left}</style>"
        f"<h1>Failover drill</h1><table><tr>{heads}</tr>{rows}</table><ul>{notes}</ul>")
    return path
