"""The ledger side of a consumer site: one database transaction per batch.

A batch's trades, dead letters, close markers and the consumed offsets are committed
together, so the database alone says how far a site got (seed 000: the offset is processed
atomically with the message). Offsets are compare-and-set: a batch is applied only if every
partition's stored position is still the one this site last read or wrote, which fences a
paused "zombie" site whose partitions were meanwhile taken over.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import psycopg

from settlement.contract import STAGE_COLUMNS
from settlement.db import q

BEGINNING = -1  # stored next_offset meaning "from the start of the partition"
# The parser's COPY lines carry these columns, in this order (settlement.contract).
_COPY_STAGE = f"copy trades_stage ({', '.join(STAGE_COLUMNS)}) from stdin"


class Fenced(RuntimeError):
    """Another consumer moved these partitions' stored offsets: our batch is stale."""

    def __init__(self, stored: dict[int, int]):
        super().__init__(f"offsets moved by another consumer: {stored}")
        self.stored = stored


@dataclass
class Batch:
    """What one poll produced, already parsed (see consumers/parse.py)."""

    copy_lines: list[str] = field(default_factory=list)
    dead_letters: list[dict[str, Any]] = field(default_factory=list)
    close_markers: list[dict[str, Any]] = field(default_factory=list)
    next_offsets: dict[int, int] = field(default_factory=dict)  # partition -> last offset + 1
    messages: int = 0


@dataclass(frozen=True)
class BatchResult:
    inserted: int
    duplicates: int
    dead_letters: int
    close_markers: int
    seconds: float


class Ledger:
    def __init__(self, dsn: str, *, site: str, scheme: str, group: str, topic: str):
        self.dsn, self.site, self.scheme, self.group, self.topic = dsn, site, scheme, group, topic
        self.conn: psycopg.Connection | None = None

    def _params(self, **kw: Any) -> dict[str, Any]:
        return {"group": self.group, "topic": self.topic, "site": self.site, **kw}

    def connect(self) -> None:
        self.close()
        conn = psycopg.connect(self.dsn, connect_timeout=5, autocommit=False)
        # A site frozen inside a batch (SIGSTOP, a GC pause, a hung VM) would hold the
        # offset row locks and stall its successor; the server ends such a session instead.
        conn.execute("set idle_in_transaction_session_timeout = '5s'")
        conn.execute(q("ingest", "create_stage"))
        conn.commit()
        self.conn = conn

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

    def write(self, batch: Batch, expected: dict[int, int]) -> BatchResult:
        """Apply one batch atomically; raises Fenced if the offsets moved under us."""
        t0 = time.perf_counter()
        conn = self.c
        parts = sorted(batch.next_offsets)
        try:
            with conn.cursor() as cur:
                stored = {
                    int(p): int(o)
                    for p, o in cur.execute(
                        q("ingest", "lock_offsets"), self._params(partitions=parts)
                    )
                }
                moved = {p: stored.get(p, BEGINNING) for p in parts
                         if stored.get(p, BEGINNING) != expected.get(p)}
                if moved:
                    raise Fenced(moved)
                inserted = 0
                if batch.copy_lines:
                    with cur.copy(_COPY_STAGE) as copy:
                        copy.write("".join(batch.copy_lines))
                    cur.execute(q("ingest", "insert_staged"))
                    inserted = cur.rowcount
                if batch.dead_letters:
                    cur.executemany(
                        q("ingest", "insert_dead_letter"),
                        [self._params(**d) for d in batch.dead_letters],
                    )
                if batch.close_markers:
                    cur.executemany(
                        q("ingest", "insert_close_marker"),
                        [self._params(**m) for m in batch.close_markers],
                    )
                cur.execute(
                    q("ingest", "store_offsets"),
                    self._params(partitions=parts,
                                 next_offsets=[batch.next_offsets[p] for p in parts]),
                )
                duplicates = len(batch.copy_lines) - inserted
                seconds = time.perf_counter() - t0
                cur.execute(
                    q("ingest", "insert_batch"),
                    self._params(
                        messages=batch.messages, inserted=inserted, duplicates=duplicates,
                        dead_letters=len(batch.dead_letters),
                        close_markers=len(batch.close_markers), partitions=parts,
                        duration_ms=round(seconds * 1000, 3),
                    ),
                )
            conn.commit()
        except BaseException:
            if not conn.closed:
                conn.rollback()
            raise
        return BatchResult(inserted, duplicates, len(batch.dead_letters),
                           len(batch.close_markers), time.perf_counter() - t0)

    def heartbeat(self, partitions: list[int], trades_total: int) -> None:
        conn = self.c
        conn.execute(q("ingest", "heartbeat"), self._params(
            scheme=self.scheme, partitions=partitions, trades_total=trades_total))
        conn.commit()

    def day_closed(self, trade_date: str | None, partitions: int) -> tuple[str | None, bool]:
        conn = self.c
        day = trade_date
        if day is None:
            row = conn.execute(q("ingest", "newest_day")).fetchone()
            day = row[0].isoformat() if row and row[0] else None
        if day is None:
            conn.commit()
            return None, False
        row = conn.execute(q("ingest", "closed_partitions"), {"trade_date": day}).fetchone()
        conn.commit()
        return day, bool(row and row[0] >= partitions)
