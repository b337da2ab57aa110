"""The ``eod-kill`` drill's close phase: both sites close the ingested day at once, site A's
close is SIGKILLed in the middle of its run, site B's close (waiting on the date's lease)
takes over and publishes. Judged: the killed run is ``abandoned`` (never left ``running``),
the day is published once, by B's run, with every trade of the day and a passing validation.
"""

from __future__ import annotations

import datetime as dt
import signal
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from settlement.config import Settings
from settlement.db import open_connection
from settlement.drills.runner import spawn_settle, wait


@dataclass(frozen=True)
class CloseOutcome:
    fault_at: dt.datetime
    note: str
    killed_run: int
    killed_status: str
    published_run: int | None
    publications: int  # runs of the date that published
    running: int  # runs of the date still 'running' after the drill
    takeover_seconds: float | None  # kill -> site B's run started
    trades: int | None  # what the published run settled
    validation_success: bool | None

    def passed(self, kafka_trades: int) -> bool:
        return (self.killed_status == "abandoned" and self.running == 0
                and self.publications == 1 and self.published_run not in (None,
                                                                          self.killed_run)
                and self.trades == kafka_trades and bool(self.validation_success))

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "fault_at": self.fault_at.isoformat()}


def _poll(what: str, timeout: float, fn: Callable[[], Any]) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = fn()
        if got:
            return got
        time.sleep(0.2)
    raise RuntimeError(f"eod-kill drill: timed out after {timeout:.0f}s waiting for {what}")


# Where A's close is held for the kill, by the drill's ``at``: steps of its run before the
# publication. A time into the run was used before: a faster close (a small day's run takes
# about 5 s) published before the kill, and the drill judged a takeover that never happened.
KILL_POINTS = ("close.run_started", "close.staged", "close.validated")


def kill_point(at: float) -> str:
    """The crash point (settlement.crashpoints) A's close is held at, for ``at`` in (0, 1)."""
    return KILL_POINTS[min(int(at * len(KILL_POINTS)), len(KILL_POINTS) - 1)]


def kill_a_close(settings: Settings, env: dict[str, str], trade_date: str, logs: Path,
                 at: float, say: Callable[[str], None]) -> CloseOutcome:
    """Start both sites' closes of ``trade_date``. Site A's freezes itself at a step of its
    run (``kill_point(at)``, holding the date's lease); once B waits on the lease, A is
    SIGKILLed from outside, frozen mid-run."""
    dsn = settings.for_component("settlement").settlement_dsn
    log_a, log_b = logs / "close-a.log", logs / "close-b.log"
    point = kill_point(at)
    close_a = spawn_settle(["eod", "--date", trade_date],
                           {**env, "SETTLE_SITE_NAME": "a",
                            "SETTLE_CRASH_AT": f"{point}:pause"}, log_a)

    def holding() -> int | None:
        with open_connection(dsn) as conn:
            row = conn.execute("select run_id from close_leases where trade_date = %s"
                               " and released_at is null and holder like '%% site a'",
                               (trade_date,)).fetchone()
        return None if row is None else row[0]

    run_a = _poll("site A's close to start its run", 180, holding)
    started = time.monotonic()
    close_b = spawn_settle(["eod", "--date", trade_date], {**env, "SETTLE_SITE_NAME": "b"},
                           log_b)
    _poll("site B's close to wait on the lease", 120,
          lambda: "waiting for the close in progress" in log_b.read_text(errors="replace"))
    _poll(f"site A's close to reach {point}", 300,
          lambda: f"crash point {point}: pause" in log_a.read_text(errors="replace")
          or close_a.poll() is not None)
    close_a.send_signal(signal.SIGKILL)
    fault_at, into = dt.datetime.now(dt.UTC), time.monotonic() - started
    close_a.wait(timeout=30)
    say(f"site A's close (run {run_a}) killed; site B's close takes over")
    out_b = wait(close_b, "site B's close", log_b, 900)
    with open_connection(dsn) as conn:
        runs = {r: (status, started_at, published) for r, status, started_at, published
                in conn.execute("select run_id, status, started_at, published_at is not null"
                                " from settlement_runs where trade_date = %s", (trade_date,))}
        row = conn.execute("select p.run_id, r.trades, r.validation_success"
                           " from published_days p join settlement_runs r using (run_id)"
                           " where p.trade_date = %s", (trade_date,)).fetchone()
    published, trades, success = row if row else (None, None, None)
    later = [s for r, (_, s, _) in runs.items() if r != run_a and s > fault_at]
    takeover = round((min(later) - fault_at).total_seconds(), 3) if later else None
    note = (f"site A's close killed at {point}, {into:.1f}s into run {run_a}; "
            f"site B's close took over: run {out_b.get('run_id')}, abandoned "
            f"{out_b.get('abandoned_runs')}")
    return CloseOutcome(
        fault_at=fault_at, note=note, killed_run=run_a, killed_status=runs[run_a][0],
        published_run=published, publications=sum(1 for *_, p in runs.values() if p),
        running=sum(1 for s, *_ in runs.values() if s == "running"),
        takeover_seconds=takeover, trades=trades, validation_success=success)
