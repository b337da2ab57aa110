"""One close per trade date across both sites: a lease in the settlement database.

Both sites' orchestrators start the close of a day (seed 004 leaves this open); only one may
compute it. A close first takes the date's lease (migration 0008):

- a session-level advisory lock on a connection of its own, held for the whole run: the
  server releases it the moment that session ends, so a close killed with SIGKILL, or whose
  connection is cut, frees the date at once;
- the ``close_leases`` row naming the holder (host, pid), its run, since when, and a fencing
  token from a sequence (every new holder's is larger). The holder renews the row's expiry
  from a thread; a holder that stops renewing (SIGSTOP, a host gone while the server still
  sees its connection) has its lease session ended by the next close once the lease expired.

A close that finds the lease held waits (bounded, saying so every few seconds) and then
*joins*: it returns the outcome of the run it waited for instead of computing the day again.
If that holder died instead, the waiter takes over and its predecessor's run becomes
``abandoned``. Publication checks the token inside its transaction (``check_fence``), so a
close that lost its lease can never publish over the one that took it.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg

from settlement.config import LEDGERS, Settings
from settlement.db import q

POLL_SECONDS = 0.5
SAY_EVERY_SECONDS = 10.0


class LeaseLost(Exception):
    """This close no longer holds its date's lease: another close took the date over."""


class LeaseWaitTimeout(Exception):
    """Another close held the date for longer than this close was willing to wait."""


@dataclass(frozen=True)
class Holder:
    """The lease row as a waiter saw it."""

    token: int
    run_id: int | None
    holder: str
    backend_pid: int
    released: bool
    expired: bool
    held_seconds: float

    def describe(self) -> str:
        run = f"run {self.run_id}" if self.run_id is not None else "a close (no run yet)"
        return f"{run} held by {self.holder} for {self.held_seconds:.0f}s"


@dataclass(frozen=True)
class Joined:
    """The close this one waited for finished: its run is the outcome."""

    run_id: int
    waited_seconds: float


@dataclass
class Lease:
    """The date's lease, held: renewed from a thread until released."""

    trade_date: str
    token: int
    holder: str
    ttl: float
    conn: psycopg.Connection
    abandoned: list[int] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def _params(self, **more: Any) -> dict[str, Any]:
        return {"trade_date": self.trade_date, "token": self.token, "ttl": self.ttl, **more}

    def start_renewing(self) -> None:
        self._thread = threading.Thread(target=self._renew_loop, daemon=True,
                                        name=f"close-lease-{self.trade_date}")
        self._thread.start()

    def _renew_loop(self) -> None:
        # A third of the lease between renewals: two can fail (a slow server) before a
        # waiter may end this session. Renewing stops once the row or the session is gone;
        # the fence in the publishing transaction is what refuses the publication.
        while not self._stop.wait(self.ttl / 3):
            try:
                if self.conn.execute(q("lease", "renew"), self._params()).rowcount != 1:
                    return  # another close took the row over
            except psycopg.Error:
                return  # the lease session ended

    def attach(self, run_id: int) -> None:
        self.conn.execute(q("lease", "attach_run"), self._params(run_id=run_id))

    def check_fence(self, conn: psycopg.Connection) -> None:
        """In the publishing transaction: the row still holds this close's token (and stays
        locked until commit, so a takeover waits for this publication)."""
        row = conn.execute(q("lease", "fence"), self._params()).fetchone()
        if row is None or int(row[0]) != self.token:
            raise LeaseLost(f"the close of {self.trade_date} was taken over (token "
                            f"{None if row is None else row[0]} replaced this close's "
                            f"{self.token}): not publishing")
        if not row[1]:
            raise LeaseLost(f"the close of {self.trade_date} lost its lease session (ended "
                            "after its lease expired, or cut off): not publishing; the next "
                            "close of the date takes over")

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        try:
            self.conn.execute(q("lease", "release"), self._params())
            self.conn.execute(q("lease", "unlock"), self._params())
        except psycopg.Error:
            pass  # the session is gone: the server released the lock with it
        finally:
            self.conn.close()


def holder_name(site: str | None) -> str:
    return f"{socket.gethostname()} pid {os.getpid()}" + (f" site {site}" if site else "")


def _lease_row(conn: psycopg.Connection, trade_date: str) -> Holder | None:
    row = conn.execute(q("lease", "lease"), {"trade_date": trade_date}).fetchone()
    if row is None:
        return None
    token, run_id, holder, pid, _acquired, released, expired, held = row
    return Holder(int(token), run_id, holder, int(pid), released is not None, bool(expired),
                  float(held))


def _lease_connection(settings: Settings, trade_date: str, ttl: float) -> psycopg.Connection:
    conn = psycopg.connect(settings.settlement_dsn, autocommit=True, connect_timeout=10,
                           application_name=f"settle-close {trade_date}")
    # The server notices a vanished host within about a lease (TCP logins; a Unix socket
    # ignores these): then the lock is freed without waiting for an expiry.
    idle = max(1, int(ttl / 3))
    conn.execute(f"set tcp_keepalives_idle = {idle}")
    conn.execute(f"set tcp_keepalives_interval = {idle}")
    conn.execute("set tcp_keepalives_count = 3")
    return conn


def acquire(settings: Settings, trade_date: str, *, ttl: float, wait_seconds: float,
            say: Callable[[str], None]) -> Lease | Joined:
    """Take the date's lease, or wait for the close holding it and join that close.

    Returns a held ``Lease`` (this close computes the day; runs its dead predecessors left
    ``running`` are now ``abandoned``), or ``Joined`` naming the run that finished while
    this close waited. Raises ``LeaseWaitTimeout`` after ``wait_seconds``.
    """
    conn = _lease_connection(settings, trade_date, ttl)
    params = {"trade_date": trade_date}
    t0 = time.monotonic()
    waited_for: Holder | None = None  # the newest live holder seen while waiting
    next_say = t0
    ended: set[int] = set()
    try:
        while True:
            if conn.execute(q("lease", "try_lock"), params).fetchone()[0]:  # type: ignore[index]
                row = _lease_row(conn, trade_date)
                waited = time.monotonic() - t0
                # Joined only if the close waited for finished a run: one that found the
                # date already settled leaves none, and this close goes on by itself.
                if (waited_for is not None and row is not None and row.token == waited_for.token
                        and row.released and row.run_id is not None):
                    conn.execute(q("lease", "unlock"), params)
                    conn.close()
                    return Joined(row.run_id, round(waited, 3))
                return _take(conn, settings, trade_date, ttl, row)
            row = _lease_row(conn, trade_date)
            if row is not None and not row.released:
                waited_for = row
                if row.expired and row.backend_pid not in ended:
                    # Paused or cut off past its lease: end its lease session so the lock
                    # frees; its token is replaced when this close takes the lease.
                    say(f"{trade_date}: the close's lease expired ({row.describe()}): ending "
                        "its session to take over")
                    conn.execute(q("lease", "end_expired"), params)
                    ended.add(row.backend_pid)
            now = time.monotonic()
            if now - t0 > wait_seconds:
                who = waited_for.describe() if waited_for else "another close"
                raise LeaseWaitTimeout(
                    f"the close of {trade_date} is held by {who}; gave up after "
                    f"{wait_seconds:.0f}s (SETTLE_CLOSE_WAIT_SECONDS); `settle status` shows "
                    "the close in progress")
            if now >= next_say:
                who = waited_for.describe() if waited_for else "another close"
                say(f"{trade_date}: waiting for the close in progress ({who}) to finish, "
                    f"then joining it ({now - t0:.0f}s so far)")
                next_say = now + SAY_EVERY_SECONDS
            time.sleep(POLL_SECONDS)
    except BaseException:
        if not conn.closed:
            conn.close()  # the lock, if taken, goes with the session
        raise


def _take(conn: psycopg.Connection, settings: Settings, trade_date: str, ttl: float,
          previous: Holder | None) -> Lease:
    holder = holder_name(settings.site_name)
    token = int(conn.execute(q("lease", "take"), {  # type: ignore[index]
        "trade_date": trade_date, "holder": holder, "ttl": ttl}).fetchone()[0])
    reason = ("abandoned: its close stopped holding the date's lease "
              + (f"({previous.holder}) " if previous is not None and not previous.released
                 else "")
              + f"and {holder} took the close over (token {token})")
    abandoned = [int(r[0]) for r in conn.execute(q("lease", "abandon_running"), {
        "trade_date": trade_date, "reason": reason})]
    lease = Lease(trade_date, token, holder, ttl, conn, abandoned=abandoned)
    lease.start_renewing()
    return lease


def markers_at(settings: Settings, trade_date: str) -> Any:
    """When the newest close marker of the date reached any reachable ledger (None: none)."""
    newest = None
    for ledger in LEDGERS:
        try:
            with psycopg.connect(settings.ledger_dsn(ledger), connect_timeout=5) as conn:
                row = conn.execute(q("eod", "last_marker_at"),
                                   {"trade_date": trade_date}).fetchone()
        except psycopg.Error:
            continue  # an unreachable or unused ledger holds no markers we could use
        if row is not None and row[0] is not None and (newest is None or row[0] > newest):
            newest = row[0]
    return newest


def settled_by(settings: Settings, trade_date: str) -> int | None:
    """The run that already settled the date: published, passed validation, and started
    after the day's newest close marker arrived. None: the date needs a close."""
    at = markers_at(settings, trade_date)
    with psycopg.connect(settings.settlement_dsn, connect_timeout=10) as conn:
        row = conn.execute(q("lease", "settled_by"),
                           {"trade_date": trade_date, "markers_at": at}).fetchone()
    return None if row is None else int(row[0])
