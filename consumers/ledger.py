"""The ledger side of a consumer site: one database transaction per batch.

A batch's trades, dead letters, close markers and the consumed offsets are committed
together, so the database alone says how far a site got (seed 000: the offset is processed
atomically with the message). Offsets are compare-and-set: a batch is applied only if every
partition's stored position is still the one this site last read or wrote, which fences a
paused "zombie" site whose partitions were meanwhile taken over.

Bad data never stops the line. A batch the database refuses for a data reason (a value it
cannot read or store, a constraint, a limit) is applied again with every step in savepoints,
halving the refused chunks until the offending messages are found; they become dead letters
with the database's message as the reason, and the rest commits with the offsets. The clean
path stays one COPY per batch: narrowing down only happens after a refusal. Any other error
(connection lost, serialization failure, a lock or statement timeout) leaves the batch
uncommitted for the site to retry.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import psycopg

from consumers.parse import (
    REPLAY,
    AmendedTrade,
    Amendment,
    CloseMarker,
    KeptMarker,
    Malformed,
    amended_marker_refusal,
    amendment,
    amendment_conflict_reason,
    amendment_refusal,
    conflict_reason,
    covered,
    decode,
    late_reason,
    marker_conflict_reason,
)
from settlement.contract import STAGE_COLUMNS
from settlement.db import open_connection, q

log = logging.getLogger("settle.ledger")

BEGINNING = -1  # stored next_offset meaning "from the start of the partition"
# The parser's COPY lines carry these columns, in this order (settlement.contract).
_COPY_STAGE = f"copy trades_stage ({', '.join(STAGE_COLUMNS)}) from stdin"
# SQLSTATE classes the data itself causes: the same rows fail the same way on every retry.
# 22 data exception (a value PostgreSQL cannot read or store), 23 integrity constraint
# violation (a CHECK or NOT NULL; the trade_id dedupe path never raises one), 54 program
# limit exceeded (e.g. a key too long for a btree index).
PERMANENT_CLASSES = frozenset({"22", "23", "54"})
# The keys a replayed trade id breaks: the registry's, or its day's partition of `trades`.
_REPLAY_KEY = re.compile(r"trade_ids_pkey|trades_\d{8}_pkey")
MAX_REASON = 2_000  # characters of a dead letter's reason that are kept

T = TypeVar("T")


class Fenced(RuntimeError):
    """Another consumer moved these partitions' stored offsets: our batch is stale."""

    def __init__(self, stored: dict[int, int]):
        super().__init__(f"offsets moved by another consumer: {stored}")
        self.stored = stored


class Refused(Exception):
    """A refusal found on our side (COPY read another number of rows than it was sent)."""


class KafkaMessage(Protocol):
    """What a dead letter needs of a consumed message (confluent_kafka.Message)."""

    def value(self) -> bytes | None: ...
    def partition(self) -> int: ...
    def offset(self) -> int: ...


@dataclass
class Batch:
    """What one poll produced, already parsed (see consumers/parse.py).

    ``trade_messages[i]`` is the message ``copy_lines[i]`` came from: a reference per trade,
    read only to dead-letter a line the database refuses or that arrived late."""

    copy_lines: list[str] = field(default_factory=list)
    trade_messages: list[KafkaMessage] = field(default_factory=list)
    dead_letters: list[dict[str, Any]] = field(default_factory=list)
    close_markers: list[dict[str, Any]] = field(default_factory=list)  # with the raw value
    # Cancels and corrections: {"a": Amendment, "partition", "offset", "raw"}, in offset order.
    amendments: list[dict[str, Any]] = field(default_factory=list)
    next_offsets: dict[int, int] = field(default_factory=dict)  # partition -> last offset + 1
    messages: int = 0


@dataclass(frozen=True)
class BatchResult:
    inserted: int
    duplicates: int
    dead_letters: int  # all dead letters written, late and refused ones included
    close_markers: int
    late: int = 0  # trades (and amendments) after their day's close marker on their partition
    refused: int = 0  # messages the database refused (data errors), dead-lettered
    seconds: float = 0.0


def is_permanent(e: BaseException) -> bool:
    """True for errors the data causes (retrying the same rows cannot succeed)."""
    if isinstance(e, Refused):
        return True
    if not isinstance(e, psycopg.Error):
        return False
    if e.sqlstate:
        return e.sqlstate[:2] in PERMANENT_CLASSES
    # Refused before it reached the server (e.g. NUL in a text parameter).
    return isinstance(e, psycopg.DataError | psycopg.IntegrityError)


def clean_reason(text: str) -> str:
    """A reason PostgreSQL text can hold (no NUL), of bounded length."""
    text = text.replace("\x00", "\\x00")
    return text if len(text) <= MAX_REASON else text[: MAX_REASON - 1] + "…"


def db_reason(e: BaseException, what: str = "refused by the database") -> str:
    if isinstance(e, psycopg.Error):
        diag = e.diag
        msg = f"{what} ({e.sqlstate or 'client'}): {diag.message_primary or str(e).strip()}"
        if diag.message_detail:
            msg += f"; {diag.message_detail}"
        if diag.context:
            msg += f" [{diag.context.splitlines()[0]}]"
    else:
        msg = f"{what}: {e}"
    return clean_reason(msg)


def bisect(conn: psycopg.Connection, items: Sequence[T], apply: Callable[[Sequence[T]], int]
           ) -> tuple[int, list[tuple[T, str]]]:
    """Apply ``items`` in order, each attempt inside a savepoint; a chunk refused for a data
    reason is halved until the refused items stand alone. Returns the sum of what ``apply``
    returned for the chunks that were applied, and each refused item with the reason.

    k bad items among n cost about 2k·log2(n/k) attempts; other errors propagate. Must run
    inside an open transaction."""
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
    applied = 0
    refused: list[tuple[T, str]] = []

    def attempt(chunk: Sequence[T]) -> None:
        nonlocal applied
        if not chunk:
            return
        try:
            with conn.transaction():  # a savepoint: a refusal undoes this chunk only
                n = apply(chunk)
        except (psycopg.Error, Refused) as e:
            if not is_permanent(e):
                raise
            if len(chunk) == 1:
                refused.append((chunk[0], db_reason(e)))
                return
            mid = len(chunk) // 2
            attempt(chunk[:mid])
            attempt(chunk[mid:])
            return
        applied += n

    attempt(items)
    return applied, refused


class Ledger:
    def __init__(self, dsn: str, *, site: str, scheme: str, group: str, topic: str,
                 role: str = "writer", lock_timeout_ms: int = 2_000,
                 statement_timeout_ms: int = 30_000, idle_timeout_ms: int = 5_000):
        self.dsn, self.site, self.scheme, self.group, self.topic = dsn, site, scheme, group, topic
        self.role = role
        self.timeouts = {"lock_timeout": lock_timeout_ms,
                         "statement_timeout": statement_timeout_ms,
                         "idle_in_transaction_session_timeout": idle_timeout_ms}
        self.conn: psycopg.Connection | None = None
        # Whether the next batch tries a plain insert first (see _insert_staged): only after a
        # batch without replays, so a replay window pays for at most one failed attempt.
        self.optimistic = False
        # The trade dates whose partition of `trades` is known to exist (see _partitions).
        self.days: set[Any] = set()

    def _params(self, **kw: Any) -> dict[str, Any]:
        return {"group": self.group, "topic": self.topic, "site": self.site, **kw}

    def connect(self) -> None:
        self.close()
        conn = open_connection(self.dsn, autocommit=False,
                               application_name=f"settle-site-{self.site}-{self.role}")
        # Every wait is bounded, so a site frozen inside a batch (SIGSTOP, a GC pause, a hung
        # VM) cannot stall its successor: the server ends a session idle inside a transaction
        # (which frees the offset row locks), a lock wait gives up (the batch is retried) and
        # a statement is cancelled. No timeout ends a session waiting for COPY data, which is
        # why write() sends its COPY before it locks anything another site could wait for.
        for name, ms in self.timeouts.items():
            conn.execute("select set_config(%s, %s, false)", (name, f"{ms}ms"))
        conn.execute(q("ingest", "create_stage"))
        conn.commit()
        self.conn = conn
        self.optimistic = False  # a new session often starts by replaying what was in flight

    def close(self) -> None:
        if self.conn is not None:
            try:
                self.conn.close()
            finally:
                self.conn = None

    @property
    def c(self) -> psycopg.Connection:
        if self.conn is None or self.conn.closed:
            self.connect()
        assert self.conn is not None
        return self.conn

    def claim(self, partitions: list[int]) -> dict[int, int]:
        """Stored next offsets for these partitions (BEGINNING if never consumed)."""
        conn = self.c
        with conn.transaction():
            conn.execute(q("ingest", "claim_partitions"), self._params(partitions=partitions))
            rows = conn.execute(q("ingest", "read_offsets"), self._params(partitions=partitions))
            return {int(p): int(o) for p, o in rows}

    def positions(self, partitions: list[int]) -> dict[int, tuple[int, str]]:
        """Stored next offsets and the site that stored each, read only (partitions never
        consumed are absent)."""
        conn = self.c
        with conn.transaction():
            rows = conn.execute(q("ingest", "read_positions"),
                                self._params(partitions=partitions))
            return {int(p): (int(o), str(site)) for p, o, site in rows}

    def skip_gap(self, partition: int, expected: int, log_start: int) -> None:
        """Retention deleted [expected, log_start) unread: record the data loss and move the
        stored position to the log start, in one transaction (compare-and-set like a batch,
        so the event is recorded once even if two sites find the same gap)."""
        conn = self.c
        with conn.transaction():
            row = conn.execute(q("ingest", "lock_offset"),
                               self._params(partition=partition)).fetchone()
            stored = int(row[0]) if row else BEGINNING
            if stored != expected:
                raise Fenced({partition: stored})
            conn.execute(q("ingest", "insert_data_loss"), self._params(
                partition=partition, from_offset=expected, to_offset=log_start))
            conn.execute(q("ingest", "move_offset"), self._params(
                partition=partition, next_offset=log_start))

    def write(self, batch: Batch, expected: dict[int, int],
              before_commit: Callable[[], None] | None = None) -> BatchResult:
        """Apply one batch atomically; raises Fenced if the offsets moved under us."""
        t0 = time.perf_counter()
        conn = self.c
        try:
            try:
                res = self._apply(conn, batch, expected, careful=False)
            except (psycopg.Error, Refused) as e:
                if not is_permanent(e):
                    raise
                log.warning("site %s: the ledger refused a batch of %d messages (%s); narrowing "
                            "it down to the offending messages", self.site, batch.messages,
                            db_reason(e)[:300])
                conn.rollback()
                # Open the transaction first: the savepoints of the careful path live in it
                # (a transaction() block on an idle connection would commit on its own).
                conn.execute("select 1")
                res = self._apply(conn, batch, expected, careful=True)
            if before_commit is not None:
                before_commit()
            conn.commit()
        except BaseException:
            if not conn.closed:
                try:
                    conn.rollback()
                except psycopg.Error:
                    self.close()  # the session is gone (e.g. ended by a server timeout)
            raise
        return BatchResult(res.inserted, res.duplicates, res.dead_letters, res.close_markers,
                           res.late, res.refused, time.perf_counter() - t0)

    # -- one batch: the clean path, or the careful one after a refusal ---------------------------
    def _apply(self, conn: psycopg.Connection, batch: Batch, expected: dict[int, int],
               careful: bool) -> BatchResult:
        t0 = time.perf_counter()
        parts = sorted(batch.next_offsets)
        lines, msgs = batch.copy_lines, batch.trade_messages
        dead: list[dict[str, Any]] = [self._dead(**d) for d in batch.dead_letters]
        refused = 0
        with conn.cursor() as cur:
            # 1. The trades go into this session's staging table before any shared row is
            # locked: a site frozen while sending COPY data blocks nobody.
            staged = list(range(len(lines)))
            if lines and careful:
                _, bad = bisect(conn, staged, lambda ix: self._copy(cur, [lines[i] for i in ix]))
                dead += [self._dead_message(msgs[i], reason) for i, reason in bad]
                refused += len(bad)
                gone = {i for i, _ in bad}
                staged = [i for i in staged if i not in gone]
            elif lines:
                self._copy(cur, lines)
            if staged:
                self._partitions(cur)
            # 2. Compare-and-set on the stored offsets (row locks until commit).
            self._check_offsets(cur, parts, expected)
            # 3. Close markers before trades: a marker earlier in this batch closes its day for
            # the trades after it (step 4).
            # A second marker of a day's partition with another last_seq is dead-lettered.
            markers = [self._params(**{"amended": 0, **m}) for m in batch.close_markers]
            marker_conflicts: dict[tuple[int, int], dict[str, Any]] = {}
            # Amended close markers kept in this batch: they decide the held amendments once
            # the batch's own amendments are in (step 5d).
            amended_kept: dict[tuple[int, int], dict[str, Any]] = {}
            if markers and careful:
                n_markers, bad_m = bisect(
                    conn, markers,
                    lambda ms: self._markers(cur, ms, marker_conflicts, amended_kept))
                dead += [self._dead(partition=m["partition"], offset=m["offset"], raw=m["raw"],
                                    reason=f"close marker {reason}") for m, reason in bad_m]
                refused += len(bad_m)
            elif markers:
                n_markers = self._markers(cur, markers, marker_conflicts, amended_kept)
            else:
                n_markers = 0
            dead += marker_conflicts.values()
            # 4. Late trades: their day had closed on their partition before they arrived.
            late: list[tuple[int, int]] = []
            if staged:
                late_rows = cur.execute(q("ingest", "late_staged")).fetchall()
                if late_rows:
                    by_pos = _positions(msgs, staged)
                    for p, off, day, close_off in late_rows:
                        late.append((int(p), int(off)))
                        dead.append(self._dead_message(
                            by_pos[(p, off)], late_reason(day.isoformat(), p, int(close_off)),
                            trade_date=day))
                    cur.execute(q("ingest", "drop_staged"), {
                        "partitions": [p for p, _ in late], "offsets": [o for _, o in late]})
            # 5. Staged trades into the ledger; a replayed trade_id is a duplicate, not an error.
            n_staged = len(staged) - len(late)
            if careful and n_staged:
                gone_pos = set(late)
                keys = [pos for pos in ((msgs[i].partition(), msgs[i].offset()) for i in staged)
                        if pos not in gone_pos]
                inserted, bad_t = bisect(conn, keys, lambda ks: self._insert_subset(cur, ks))
                by_pos = _positions(msgs, staged)
                dead += [self._dead_message(by_pos[pos], reason) for pos, reason in bad_t]
                refused += len(bad_t)
                n_staged -= len(bad_t)
            elif n_staged:
                inserted = self._insert_staged(cur, n_staged)
            else:
                inserted = 0
            # 5b. A copy that was not inserted is a replay; one whose content differs from the
            # copy kept is a conflicting replay: a dead letter naming the kept offset, not a
            # duplicate. Only batches with replays pay for the query.
            conflicting = 0
            if n_staged > inserted:
                rows = cur.execute(q("ingest", "conflicting_staged")).fetchall()
                done = {(d["partition"], d["offset"]) for d in dead}  # refused already
                by_pos = _positions(msgs, staged)
                for p, off, trade_id, kept_p, kept_off in rows:
                    if (p, off) not in done:
                        dead.append(self._dead_message(
                            by_pos[(p, off)], conflict_reason(trade_id, kept_p, kept_off)))
                        conflicting += 1
            # 5c. Cancels and corrections, after the trades they may amend (a handful a day).
            amended = dups_a = 0
            if batch.amendments:
                amended, dups_a, bad_a = self._amendments(cur, batch.amendments)
                dead += bad_a
            # 5d. Amended close markers decide the amendments held since the day's close.
            for m in sorted(amended_kept.values(), key=lambda m: m["offset"]):
                amended += self._decide_held(cur, m)
            # 6. Dead letters (those of the parser, the late, refused and conflicting ones).
            if dead and careful:
                _, bad_d = bisect(conn, dead, lambda ds: self._dead_letters(cur, ds))
                # Only the reason can be refused (raw is bytea): keep the message anyway.
                self._dead_letters(cur, [
                    {**d, "trade_date": None,
                     "reason": clean_reason(f"dead letter {reason}; original reason "
                                            f"{d['reason'][:200]!r}")} for d, reason in bad_d])
            elif dead:
                self._dead_letters(cur, dead)
            # 7. The offsets and the batch's row, in the same transaction.
            cur.execute(q("ingest", "store_offsets"), self._params(
                partitions=parts, next_offsets=[batch.next_offsets[p] for p in parts]))
            duplicates = n_staged - inserted - conflicting + dups_a
            inserted += amended
            cur.execute(q("ingest", "insert_batch"), self._params(
                messages=batch.messages, inserted=inserted, duplicates=duplicates,
                dead_letters=len(dead), close_markers=n_markers, partitions=parts,
                duration_ms=round((time.perf_counter() - t0) * 1000, 3)))
        return BatchResult(inserted, duplicates, len(dead), n_markers, len(late), refused)

    def _insert_staged(self, cur: psycopg.Cursor[Any], n_staged: int) -> int:
        """The staged trades into the ledger; returns how many were new.

        ``on conflict do nothing`` inserts each row speculatively (4.1-4.8 us a row against
        2.6-2.9 for a plain insert, benchmarks/ingest_db.py), a price every batch pays for the
        few that hold replays. So after a batch without replays the plain insert goes first,
        in a savepoint: a replay in it (the trade's primary key) rolls it back and the batch
        takes ``on conflict`` as before, with the same winner (the first staged copy). The
        replay is refused by the registry's key or, a copy of the same day, by its day's
        partition's (PostgreSQL runs the registry's insert, a WITH query the insert does not
        read, after it)."""
        if self.optimistic:
            try:
                with cur.connection.transaction():  # a savepoint: the batch's work so far stays
                    cur.execute(q("ingest", "insert_staged_new"))
                    return cur.rowcount
            except psycopg.errors.UniqueViolation as e:
                if not _REPLAY_KEY.fullmatch(e.diag.constraint_name or ""):
                    raise
            self.optimistic = False
        cur.execute(q("ingest", "insert_staged"))
        self.optimistic = cur.rowcount == n_staged
        return cur.rowcount

    def _partitions(self, cur: psycopg.Cursor[Any]) -> None:
        """Create the partitions of `trades` the staged days lack (a day's first batch).

        On a connection of its own, committed at once: creating one locks `trades` against
        other creators until commit, and a site frozen inside its batch must not hold that
        (the other site would wait for the day's partition). Later batches of a known day
        pay one query over the staged rows."""
        row = cur.execute(q("ingest", "new_staged_days"), {"known": sorted(self.days)}
                          ).fetchone()
        days = row[0] if row and row[0] else []
        if days:
            with open_connection(self.dsn, autocommit=True, application_name=(
                    f"settle-site-{self.site}-partitions")) as ddl:
                for name, ms in self.timeouts.items():
                    ddl.execute("select set_config(%s, %s, false)", (name, f"{ms}ms"))
                ddl.execute(q("ingest", "ensure_partitions"), {"days": days})
            self.days.update(days)

    def _copy(self, cur: psycopg.Cursor[Any], lines: Sequence[str]) -> int:
        with cur.copy(_COPY_STAGE) as copy:
            copy.write("".join(lines))
        # A line that is not exactly one row (an end-of-data marker, a stray newline) must not
        # make COPY drop or invent rows silently.
        if cur.rowcount != len(lines):
            raise Refused(f"COPY read {cur.rowcount} rows from {len(lines)} lines")
        return len(lines)

    def _check_offsets(self, cur: psycopg.Cursor[Any], parts: list[int],
                       expected: dict[int, int]) -> None:
        stored = {int(p): int(o) for p, o in cur.execute(
            q("ingest", "lock_offsets"), self._params(partitions=parts))}
        moved = {p: stored.get(p, BEGINNING) for p in parts
                 if stored.get(p, BEGINNING) != expected.get(p)}
        if moved:
            raise Fenced(moved)

    def _markers(self, cur: psycopg.Cursor[Any], markers: Sequence[dict[str, Any]],
                 conflicts: dict[tuple[int, int], dict[str, Any]],
                 amended_kept: dict[tuple[int, int], dict[str, Any]]) -> int:
        """Insert the markers (a handful per day); returns how many were new. A replayed
        marker is ignored; one that contradicts the kept marker's last_seq goes into
        ``conflicts`` as a dead letter (keyed by position: a narrowed-down retry redoes it).
        Amended close markers kept go into ``amended_kept``."""
        new = 0
        for m in markers:
            pos = (m["partition"], m["offset"])
            if m["amended"]:
                amended_kept.pop(pos, None)
                conflicts.pop(pos, None)
                why = self._amended_marker(cur, m)
                if why is None:
                    new += 1
                    amended_kept[pos] = m
                elif why != REPLAY:
                    conflicts[pos] = self._dead(
                        partition=m["partition"], offset=m["offset"], raw=m["raw"],
                        trade_date=m["trade_date"], reason=why)
                continue
            if cur.execute(q("ingest", "insert_close_marker"), m).fetchone() is not None:
                new += 1
                conflicts.pop(pos, None)
                continue
            kept = cur.execute(q("ingest", "stored_close_marker"), m).fetchone()
            if kept is not None and int(kept[0]) != m["last_seq"]:
                conflicts[pos] = self._dead(
                    partition=m["partition"], offset=m["offset"], raw=m["raw"],
                    trade_date=m["trade_date"], reason=marker_conflict_reason(
                        m["trade_date"], m["partition"], m["last_seq"], int(kept[0]),
                        int(kept[1])))
        return new

    def _amended_marker(self, cur: psycopg.Cursor[Any], m: dict[str, Any]) -> str | None:
        """Keep an amended close marker, or say why not (``REPLAY``: an equal copy)."""
        closed = cur.execute(q("ingest", "stored_close_marker"), m).fetchone()
        kept = [KeptMarker(int(k), int(last), int(off))
                for k, last, off in cur.execute(q("ingest", "amended_markers"), m)]
        why = amended_marker_refusal(
            CloseMarker(str(m["trade_date"]), m["partition"], m["last_seq"], m["amended"]),
            m["offset"], None if closed is None else (int(closed[0]), int(closed[1])), kept)
        if why is None:
            cur.execute(q("ingest", "insert_amended_marker"), m)
        return why

    def _decide_held(self, cur: psycopg.Cursor[Any], m: dict[str, Any]) -> int:
        """The held amendments an amended close marker covers, in offset order: each stored
        as a post-close amendment of its day or refused (the verdict is recorded with it; its
        `late` dead letter stays, as the message's history). Returns how many were stored."""
        p, k = m["partition"], m["amended"]
        stored = 0
        held = cur.execute(q("ingest", "held_amendments"), self._params(
            trade_date=m["trade_date"], partition=p, offset=m["offset"])).fetchall()
        for off, kind, seq, raw in held:
            if not covered(int(seq), int(off), m["last_seq"], m["offset"]):
                continue
            raw = bytes(raw)
            try:
                a = amendment(decode(raw, len(raw) + 1), kind)
            except Malformed as e:  # it passed the parser when it arrived: never expected
                verdict = str(e)
            else:
                verdict = self._amendment_refusal(cur, a, p, int(off), after_close=True) or ""
                if not verdict:
                    try:
                        with cur.connection.transaction():
                            cur.execute(q("ingest", "insert_amendment"), self._params(
                                trade_id=a.trade_id, trade_date=a.trade_date, seq=a.seq,
                                partition=p, offset=int(off), kind=a.kind, version=a.version,
                                reason=a.reason, amended=k, **_corrected(a.values)))
                        stored += 1
                        verdict = "stored"
                    except psycopg.Error as e:
                        if not is_permanent(e):
                            raise
                        verdict = db_reason(e)
            cur.execute(q("ingest", "decide_late_amendment"), self._params(
                partition=p, offset=int(off), amended=k, verdict=clean_reason(verdict)))
        return stored

    def _amendments(self, cur: psycopg.Cursor[Any], amendments: Sequence[dict[str, Any]]
                    ) -> tuple[int, int, list[dict[str, Any]]]:
        """Store the batch's cancels and corrections in offset order, each checked as the
        Kafka read checks it (``consumers.parse.amendment_refusal``). Returns (stored,
        replays suppressed, dead letters). One at a time inside a savepoint: the ledger may
        refuse one (a constraint) without losing the others."""
        stored = dups = 0
        dead: list[dict[str, Any]] = []
        for m in amendments:
            a: Amendment = m["a"]
            p, off = m["partition"], m["offset"]
            reason = self._amendment_refusal(cur, a, p, off)
            if reason == REPLAY:
                dups += 1
                continue
            if reason is not None and reason.startswith("late: "):
                # Held: an amended close marker behind it may yet make it a post-close
                # amendment of its day (_decide_held); until then it is a late dead letter.
                cur.execute(q("ingest", "hold_late_amendment"), self._params(
                    partition=p, offset=off, trade_date=a.trade_date, kind=a.kind, seq=a.seq,
                    raw=m["raw"]))
            if reason is None:
                v = a.values
                try:
                    with cur.connection.transaction():
                        cur.execute(q("ingest", "insert_amendment"), self._params(
                            trade_id=a.trade_id, trade_date=a.trade_date, seq=a.seq,
                            partition=p, offset=off, kind=a.kind, version=a.version,
                            reason=a.reason, amended=None,
                            **_corrected(v)))
                    stored += 1
                    continue
                except psycopg.Error as e:
                    if not is_permanent(e):
                        raise
                    reason = db_reason(e)
            dead.append(self._dead(partition=p, offset=off, raw=m["raw"], reason=reason,
                                   trade_date=a.trade_date))
        return stored, dups, dead

    def _amendment_refusal(self, cur: psycopg.Cursor[Any], a: Amendment, p: int, off: int,
                           after_close: bool = False) -> str | None:
        """Why ``a`` may not be stored (``REPLAY`` for an equal copy of a stored one), or
        None. ``after_close``: an amended close decides it, so its day's close does not."""
        if not after_close:
            closed = cur.execute(q("ingest", "stored_close_marker"),
                                 {"trade_date": a.trade_date, "partition": p}).fetchone()
            if closed is not None and int(closed[1]) < off:
                return late_reason(a.trade_date, p, int(closed[1]))
        copy = cur.execute(q("ingest", "amendment_copy"), {
            "trade_id": a.trade_id, "kind": a.kind, "version_key": a.version or 0,
            "seq": a.seq, "reason": a.reason, **_corrected(a.values)}).fetchone()
        if copy is not None:
            return REPLAY if copy[2] else amendment_conflict_reason(a, int(copy[0]),
                                                                       int(copy[1]))
        row = cur.execute(q("ingest", "amended_trade"), {"trade_id": a.trade_id}).fetchone()
        trade = None
        # The trade must be on the amendment's partition, before it (as the Kafka read sees it).
        if row is not None and int(row[1]) == p and int(row[2]) < off:
            trade = AmendedTrade(row[0].isoformat(), int(row[3]), bool(row[4]))
        return amendment_refusal(a, trade)

    def _insert_subset(self, cur: psycopg.Cursor[Any], keys: Sequence[tuple[int, int]]) -> int:
        cur.execute(q("ingest", "insert_staged_subset"), {
            "partitions": [p for p, _ in keys], "offsets": [o for _, o in keys]})
        return cur.rowcount

    def _dead_letters(self, cur: psycopg.Cursor[Any], dead: Sequence[dict[str, Any]]) -> int:
        if dead:
            cur.executemany(q("ingest", "insert_dead_letter"), dead)
        return len(dead)

    def _dead(self, *, partition: int, offset: int, raw: bytes, reason: str,
              trade_date: Any = None) -> dict[str, Any]:
        return self._params(partition=partition, offset=offset, raw=raw,
                            reason=clean_reason(reason), trade_date=trade_date)

    def _dead_message(self, m: KafkaMessage, reason: str, trade_date: Any = None
                      ) -> dict[str, Any]:
        return self._dead(partition=m.partition(), offset=m.offset(), raw=m.value() or b"",
                          reason=reason, trade_date=trade_date)

    # -- the site's other statements -------------------------------------------------------------
    def heartbeat(self, partitions: list[int], trades_total: int) -> None:
        conn = self.c
        conn.execute(q("ingest", "heartbeat"), self._params(
            scheme=self.scheme, partitions=partitions, trades_total=trades_total))
        conn.commit()

    def prune_heartbeats(self, days: int) -> int:
        """Delete heartbeats older than ``days``; returns how many went."""
        conn = self.c
        n = conn.execute(q("ingest", "prune_heartbeats"), {"days": days}).rowcount
        conn.commit()
        return n

    def day_closed(self, trade_date: str | None, partitions: int) -> tuple[str | None, bool]:
        conn = self.c
        day = trade_date
        if day is None:
            row = conn.execute(q("ingest", "current_day")).fetchone()
            day = row[0].isoformat() if row and row[0] else None
        if day is None:
            conn.commit()
            return None, False
        row = conn.execute(q("ingest", "closed_partitions"), {"trade_date": day}).fetchone()
        conn.commit()
        return day, bool(row and row[0] >= partitions)


def _positions(msgs: list[KafkaMessage], indexes: list[int]) -> dict[tuple[int, int], Any]:
    """(partition, offset) -> message, for the staged lines (built only off the clean path)."""
    return {(msgs[i].partition(), msgs[i].offset()): msgs[i] for i in indexes}


def _corrected(v: Any) -> dict[str, Any]:
    """A correction's new values as statement parameters (all None for a cancel)."""
    if v is None:
        return dict.fromkeys(("symbol", "price", "quantity", "buyer", "seller", "executed_at"))
    return {"symbol": v.symbol, "price": v.price, "quantity": v.quantity, "buyer": v.buyer,
            "seller": v.seller, "executed_at": v.executed_at}
