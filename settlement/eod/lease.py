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

Faults the lease rides out (issue 42): a holder publishing for longer than its lease holds the
row (the fence locks it), and the function that ends expired closes skips a locked row, so a
publishing holder is never ended; a renewal that fails reconnects and takes its own lease back
(the row still carries its token) or tells the close it lost the date, which then stops at its
next step (``ensure_held``); after a server restart a waiter lets the holder come back until
its lease expires; a waiter whose holder's run crashed (no validation verdict) computes the
day itself instead of inheriting that failure.
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
from settlement.db import open_connection, q
from settlement.errors import redact

POLL_SECONDS = 0.5
SAY_EVERY_SECONDS = 10.0
# How long a waiter keeps reconnecting to a settlement database that went away under it (a
# restart takes seconds, a failover tens of seconds): then it gives up, saying why.
RECONNECT_SECONDS = 120.0


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
    run_status: str | None = None
    run_verdict: bool | None = None  # the run's validation_success: None = no verdict
    renewed_before_restart: bool = False

    @property
    def crashed(self) -> bool:
        """Its run failed before any validation verdict (an error, not the day's fault)."""
        return self.run_status == "failed" and self.run_verdict is None

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
    dsn: str  # the settlement database, to reconnect to
    abandoned: list[int] = field(default_factory=list)
    # Why this close no longer holds the date, once the renewal found out (None: held).
    lost: str | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    # The lease session is used by the renewal thread and the close's own thread.
    _conn_lock: threading.Lock = field(default_factory=threading.Lock)

    def _params(self, **more: Any) -> dict[str, Any]:
        return {"trade_date": self.trade_date, "token": self.token, "ttl": self.ttl, **more}

    def start_renewing(self) -> None:
        self._thread = threading.Thread(target=self._renew_loop, daemon=True,
                                        name=f"close-lease-{self.trade_date}")
        self._thread.start()

    def _renew_loop(self) -> None:
        # A third of the lease between renewals: two can fail (a slow server) before a
        # waiter may end this session. A renewal waits while this close publishes (the fence
        # locks the row), which is safe: nobody ends a session whose row is locked.
        last_renewed = time.monotonic()
        while not self._stop.wait(self.ttl / 3):
            try:
                with self._conn_lock:
                    renewed = self.conn.execute(q("lease", "renew"), self._params()).rowcount
                if renewed != 1:
                    self._lose("its lease row was taken over by another close")
                    return
                last_renewed = time.monotonic()
                continue
            except psycopg.Error as e:
                why = f"{type(e).__name__}: {str(e).strip()}"
                if not self.conn.broken and not self.conn.closed:
                    # The session lives (a statement failed, not the connection): it still
                    # holds the lock, so the next renewal tries again on it, while the lease
                    # lasts.
                    if time.monotonic() - last_renewed > self.ttl:
                        self._lose(f"its lease could not be renewed for {self.ttl:.0f}s: "
                                   f"{redact(why)}")
                        return
                    continue
            # The session went away (a server restart, a cut connection, this close paused
            # past its lease and ended by a waiter): take the lease back on a new session while
            # the row still names this close, until the lease would have run out.
            while not self._stop.is_set():
                verdict = self._retake()
                if verdict is None:
                    last_renewed = time.monotonic()
                    break
                if verdict or time.monotonic() - last_renewed > self.ttl:
                    self._lose(verdict or f"its lease could not be renewed for {self.ttl:.0f}s "
                               f"(SETTLE_CLOSE_LEASE_SECONDS): {redact(why)}")
                    return
                self._stop.wait(POLL_SECONDS)

    def _retake(self) -> str | None:
        """Take this close's lease back on a new session: None when done, "" to try again
        later (the server is not back, or the old session still holds the lock), or why the
        lease is lost for good (another close holds it now)."""
        try:
            conn = _lease_connection(self.dsn, self.trade_date, self.ttl)
        except psycopg.Error:
            return ""
        try:
            if not conn.execute(q("lease", "try_lock"), self._params()).fetchone()[0]:  # type: ignore[index]
                row = _lease_row(conn, self.trade_date)
                conn.close()
                if row is None or row.token != self.token or row.released:
                    return "another close took the date over while its lease session was away"
                return ""  # the old session has not ended yet: its lock goes with it
            if conn.execute(q("lease", "retake"), self._params()).rowcount != 1:
                conn.close()
                return "another close took the date over while its lease session was away"
        except psycopg.Error:
            conn.close()
            return ""
        with self._conn_lock:
            old, self.conn = self.conn, conn
        old.close()
        return None

    def _lose(self, why: str) -> None:
        self.lost = (f"the close of {self.trade_date} lost its lease ({why}): stopping; the "
                     "close that holds the date now settles it")

    def ensure_held(self) -> None:
        """Between the close's steps: stop early once the renewal found the lease lost."""
        if self.lost is not None:
            raise LeaseLost(self.lost)

    def attach(self, run_id: int) -> None:
        with self._conn_lock:
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
            self._thread.join(timeout=15)
        with self._conn_lock:
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
    (token, run_id, holder, pid, _acquired, released, expired, held, run_status, verdict,
     before_restart) = row
    return Holder(int(token), run_id, holder, int(pid), released is not None, bool(expired),
                  float(held), run_status, verdict, bool(before_restart))


def _lease_connection(dsn: str, trade_date: str, ttl: float) -> psycopg.Connection:
    conn = open_connection(dsn, autocommit=True, application_name=f"settle-close {trade_date}")
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
    this close waited. Raises ``LeaseWaitTimeout`` after ``wait_seconds``. A settlement
    database that goes away while this close waits (a restart, a failover) is reconnected
    to for up to ``RECONNECT_SECONDS``.
    """
    waiting = _Waiting(settings, trade_date, ttl, say)
    conn = _lease_connection(settings.settlement_dsn, trade_date, ttl)
    try:
        while True:
            try:
                got = waiting.step(conn)
            except psycopg.OperationalError as e:
                if not conn.broken:
                    raise
                conn = waiting.reconnect(e)
                continue
            if got is not None:
                return got
            waiting.check_bound(wait_seconds)
            time.sleep(POLL_SECONDS)
    except BaseException:
        if not conn.closed:
            conn.close()  # the lock, if taken, goes with the session
        raise


@dataclass
class _Waiting:
    """What a close waiting for its date's lease has seen so far."""

    settings: Settings
    trade_date: str
    ttl: float
    say: Callable[[str], None]
    t0: float = field(default_factory=time.monotonic)
    waited_for: Holder | None = None  # the newest live holder seen while waiting
    next_say: float = 0.0
    ended: set[int] = field(default_factory=set)

    @property
    def params(self) -> dict[str, Any]:
        return {"trade_date": self.trade_date}

    def step(self, conn: psycopg.Connection) -> Lease | Joined | None:
        """One look: the lease taken, the close waited for joined, or None (wait on)."""
        if conn.execute(q("lease", "try_lock"), self.params).fetchone()[0]:  # type: ignore[index]
            return self._locked(conn, _lease_row(conn, self.trade_date))
        row = _lease_row(conn, self.trade_date)
        if row is not None and not row.released:
            self.waited_for = row
            # Paused or cut off past its lease: end its lease session so the lock frees (the
            # server refuses while it publishes: its row is locked); its token is replaced
            # when this close takes the lease.
            if (row.expired and row.backend_pid not in self.ended
                    and conn.execute(q("lease", "end_expired"), self.params).fetchone()[0]):  # type: ignore[index]
                self.say(f"{self.trade_date}: the close's lease expired ({row.describe()}): "
                         "ended its session to take over")
                self.ended.add(row.backend_pid)
        return None

    def _locked(self, conn: psycopg.Connection, row: Holder | None) -> Lease | Joined | None:
        """This close holds the date's lock: take the lease, join, or give it back."""
        d = self.trade_date
        if (row is not None and not row.released and not row.expired
                and row.renewed_before_restart):
            # Its holder's session ended with the server, not with the holder: let it take
            # its lease back until the lease runs out.
            conn.execute(q("lease", "unlock"), self.params)
            self.waited_for = row
            return None
        waited = round(time.monotonic() - self.t0, 3)
        # Joined only if the close waited for finished a run: one that found the date
        # already settled leaves none, and this close goes on by itself. Finished means
        # released, or its run recorded done: a publication that outlasted the lease leaves
        # it expired until the holder's renewal, so a waiter may end the holder's session
        # between its run's end and its release (that holder's work is done all the same).
        if (self.waited_for is not None and row is not None
                and row.token == self.waited_for.token and row.run_id is not None
                and (row.released or row.run_status in ("succeeded", "failed"))):
            if not row.crashed:
                conn.execute(q("lease", "unlock"), self.params)
                conn.close()
                return Joined(row.run_id, waited)
            self.say(f"{d}: run {row.run_id}, which this close waited for, failed without a "
                     "validation verdict (an error, not the day's data): this close settles "
                     "the date itself")
        return _take(conn, self.settings, d, self.ttl, row)

    def reconnect(self, error: psycopg.OperationalError) -> psycopg.Connection:
        """A new lease session after the server went away, retried for RECONNECT_SECONDS."""
        self.say(f"{self.trade_date}: the settlement database went away while waiting for the "
                 f"close ({redact(str(error).strip())}): reconnecting")
        deadline = time.monotonic() + RECONNECT_SECONDS
        while True:
            try:
                return _lease_connection(self.settings.settlement_dsn, self.trade_date,
                                         self.ttl)
            except psycopg.OperationalError as e:
                if time.monotonic() > deadline:
                    raise LeaseWaitTimeout(
                        f"the settlement database stayed unreachable for "
                        f"{RECONNECT_SECONDS:.0f}s while the close of {self.trade_date} "
                        f"waited for its lease: {redact(str(e).strip())}") from None
                time.sleep(POLL_SECONDS)

    def check_bound(self, wait_seconds: float) -> None:
        now = time.monotonic()
        who = self.waited_for.describe() if self.waited_for else "another close"
        if now - self.t0 > wait_seconds:
            raise LeaseWaitTimeout(
                f"the close of {self.trade_date} is held by {who}; gave up after "
                f"{wait_seconds:.0f}s (SETTLE_CLOSE_WAIT_SECONDS); `settle status` shows "
                "the close in progress")
        if now >= self.next_say:
            self.say(f"{self.trade_date}: waiting for the close in progress ({who}) to "
                     f"finish, then joining it ({now - self.t0:.0f}s so far)")
            self.next_say = now + SAY_EVERY_SECONDS


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
    lease = Lease(trade_date, token, holder, ttl, conn, settings.settlement_dsn,
                  abandoned=abandoned)
    lease.start_renewing()
    return lease


def marker_offsets(settings: Settings, trade_date: str) -> dict[int, int] | str:
    """partition -> the Kafka offset of the date's newest close marker over every ledger, or
    why that cannot be known (an unreachable ledger may hold a marker nobody has seen)."""
    newest: dict[int, int] = {}
    for ledger in LEDGERS:
        try:
            with open_connection(settings.ledger_dsn(ledger)) as conn:
                rows = conn.execute(q("eod", "marker_offsets"),
                                    {"trade_date": trade_date}).fetchall()
        except psycopg.Error as e:
            return f"ledger {ledger} is unreachable ({redact(str(e).strip())})"
        for p, offset in rows:
            newest[int(p)] = max(newest.get(int(p), -1), int(offset))
    return newest


def settled_by(settings: Settings, trade_date: str,
               say: Callable[[str], None] | None = None,
               markers: dict[int, int] | str | None = None) -> int | None:
    """The run that already settled the date: published, passed validation, and chosen when
    the ledgers held every close marker they hold now (a new or amended marker, a later
    offset, means the day changed). Offsets, not clocks: the ledgers' and the settlement
    database's clocks are two servers'. None: the date needs a close. ``markers``: what
    ``marker_offsets`` already answered for this close (the ledgers are asked once)."""
    with open_connection(settings.settlement_dsn) as conn:
        row = conn.execute(q("lease", "settled_by"), {"trade_date": trade_date}).fetchone()
    if row is None:
        return None
    run_id, seen = int(row[0]), row[1]
    now = marker_offsets(settings, trade_date) if markers is None else markers
    note = say or (lambda _line: None)
    if isinstance(now, str):
        note(f"{trade_date}: cannot tell whether run {run_id} saw every close marker: {now}; "
             "settling the date again")
        return None
    if seen is None:
        note(f"{trade_date}: run {run_id} recorded no close markers it settled against (a run "
             "older than this check): settling the date again")
        return None
    recorded = {int(p): int(o) for p, o in seen.items()}
    newer = sorted(p for p, o in now.items() if o > recorded.get(p, -1))
    if newer:
        note(f"{trade_date}: close markers arrived after run {run_id} was chosen (partitions "
             f"{', '.join(map(str, newer))}): settling the date again")
        return None
    return run_id
