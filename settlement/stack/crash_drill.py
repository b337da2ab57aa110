"""`make stack-drill FAULT=switchover-at-commit`: the crash-point campaign's stack variant
(issue 56). A close of the day, at site A, freezes itself at a point around its publishing
commit (settlement.crashpoints ``pause``); meanwhile the settlement cluster's primary is
switched over from site A's member to site B's (Patroni); the close is woken, then the date
is closed again as site B. Whatever the point, the day ends with one published run and one
instruction set, no run left running, and positions equal to a netting of the day read
from Kafka.

- ``publish.before_commit``: the frozen close's publishing transaction was on the old
  primary, which the switchover restarted as a standby; woken, its commit fails and it
  publishes nothing; B's close computes and publishes the day.
- ``publish.after_commit``: the publication is committed (and replicated: the standby is
  synchronous); woken, the close finishes on the new primary; B's close finds the day
  published and computes nothing.

The closes run on this host against the stack (``stack_settings``: the settlement user, the
auditor's Kafka login), each a ``settle eod`` process, reading the day from the ledgers.
"""

from __future__ import annotations

import datetime as dt
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from settlement.db import connect, q
from settlement.drills.checker import wait_for_share
from settlement.errors import ServiceError
from settlement.stack import sites
from settlement.stack.compose import Stack
from settlement.stack.drill import stack_settings
from settlement.stack.engine import Log
from settlement.stack.site_drill import finish_trading, judge, start_trading

POINTS = ("publish.before_commit", "publish.after_commit")


def _host_env(stack: Stack, site: str, reports: Path, crash_at: str = "") -> dict[str, str]:
    """A host process's environment reaching the stack as ``stack_settings`` does."""
    s = stack_settings(stack)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SETTLE_")}
    env.update({
        "SETTLE_KAFKA_BOOTSTRAP": str(s.kafka_bootstrap),
        "SETTLE_KAFKA_SECURITY_PROTOCOL": s.kafka_security_protocol,
        "SETTLE_KAFKA_SASL_MECHANISM": s.kafka_sasl_mechanism,
        "SETTLE_KAFKA_SASL_USERNAME": str(s.kafka_sasl_username),
        "SETTLE_KAFKA_SASL_PASSWORD": str(s.kafka_sasl_password),
        "SETTLE_KAFKA_SSL_CA_LOCATION": str(s.kafka_ssl_ca_location),
        "SETTLE_TOPIC": s.topic, "SETTLE_PARTITIONS": str(s.partitions),
        "SETTLE_PG_DSN": s.pg_dsn, "SETTLE_LEDGER_A_DSN": str(s.ledger_a_dsn),
        "SETTLE_LEDGER_B_DSN": str(s.ledger_b_dsn),
        "SETTLE_LEDGER_SHARED_DSN": str(s.ledger_shared_dsn),
        "SETTLE_SITE_NAME": site, "SETTLE_REPORTS_DIR": str(reports),
        "SETTLE_STATE_DIR": str(reports / "state"), "SETTLE_CRASH_AT": crash_at,
    })
    return env


def _close(stack: Stack, trade_date: str, site: str, reports: Path, log_file: Path,
           crash_at: str = "") -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "settlement.cli", "eod", "--date", trade_date, "--source", "db",
         "--only-if-unsettled", "--json"], cwd=stack.root,
        env=_host_env(stack, site, reports, crash_at), stdout=subprocess.PIPE,
        stderr=log_file.open("w"), text=True)


def _wait_said(proc: subprocess.Popen[str], log_file: Path, line: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while line not in log_file.read_text(errors="replace"):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise ServiceError(f"the close never reached {line!r} (exit {proc.poll()}); its "
                               f"log ends:\n{log_file.read_text(errors='replace')[-3000:]}")
        time.sleep(0.2)


def _instruction_sets(settings: Any, trade_date: str) -> list[int]:
    with connect(settings.settlement_dsn, autocommit=True) as conn:
        return [int(r[0]) for r in conn.execute(q("drill", "instruction_sets"),
                                                {"trade_date": trade_date})]


def _one_point(stack: Stack, point: str, trade_date: str, trades: int, seed: int,
               work: Path, log: Log) -> dict[str, Any]:
    settings = stack_settings(stack)
    sites.make_primary(stack, "a", log)
    gateway, share = start_trading(stack, settings, trade_date, trades, seed, log)
    gateway_out = finish_trading(gateway)
    for site in ("a", "b"):  # the whole day in the ledger: the closes read it from there
        wait_for_share(settings.ledger_dsn("shared"), site, share, 1.0, timeout=600,
                       trade_date=trade_date)
    first_log, again_log = work / f"{point}-a.err", work / f"{point}-b.err"
    first = _close(stack, trade_date, "a", work, first_log, f"{point}:pause")
    try:
        _wait_said(first, first_log, f"crash point {point}: pause", timeout=600)
        log(f"site a's close frozen at {point}: switching the primary over to site b")
        t0 = time.monotonic()
        sites.make_primary(stack, "b", log)
        switchover_s = round(time.monotonic() - t0, 1)
    finally:
        os.kill(first.pid, signal.SIGCONT)
    try:
        first.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        first.kill()
        raise ServiceError(f"site a's close did not end after its wake-up: "
                           f"{first_log.read_text(errors='replace')[-3000:]}") from None
    log(f"site a's close ended with exit {first.returncode}; closing the date again as site b")
    again = _close(stack, trade_date, "b", work, again_log)
    out, _ = again.communicate(timeout=900)
    if again.returncode != 0:
        raise ServiceError(f"site b's close failed (exit {again.returncode}): "
                           f"{again_log.read_text(errors='replace')[-3000:]}")
    verdict = judge(settings, trade_date)
    sets = _instruction_sets(settings, trade_date)
    # Before the commit nothing was published: the woken close must fail and B publish;
    # after it, the woken close finishes its publication and B's computes nothing.
    committed = point == "publish.after_commit"
    expected_first = first.returncode == 0 if committed else first.returncode != 0
    runs = verdict["settlement_runs"]
    return {
        "point": point, "trade_date": trade_date, "switchover_s": switchover_s,
        "first_exit": first.returncode, "instruction_sets": len(sets),
        "instruction_set_is_published": sets == [verdict["published_run_id"]],
        "gateway": gateway_out, **verdict,
        "passed": bool(verdict["ledger_ok"] and verdict["publications"] == 1
                       and verdict["positions_match"] is not False
                       and sets == [verdict["published_run_id"]] and expected_first
                       and not runs.get("running")
                       and verdict["closed_by"] == ("a" if committed else "b")),
    }


def _next_weekday(day: str) -> str:
    d = dt.date.fromisoformat(day) + dt.timedelta(days=1)
    while d.weekday() >= 5:
        d += dt.timedelta(days=1)
    return d.isoformat()


def run_switchover_drill(stack: Stack, trade_date: str, trades: int, log: Log,
                         seed: int = 7) -> dict[str, Any]:
    """Each point around the commit on a day of its own (``trade_date``, then the next
    weekday); site A's member is the primary again at the end."""
    results = []
    day = trade_date
    with tempfile.TemporaryDirectory(prefix="settle-switchover-") as tmp:
        for point in POINTS:
            results.append(_one_point(stack, point, day, trades, seed, Path(tmp), log))
            day = _next_weekday(day)
    sites.make_primary(stack, "a", log)
    return {"fault": "switchover-at-commit", "trade_date": trade_date, "points": results,
            "publications": sum(r["publications"] for r in results),
            "lost": sum(r["lost"] for r in results),
            "duplicated": sum(r["duplicated"] for r in results),
            "passed": all(r["passed"] for r in results)}
