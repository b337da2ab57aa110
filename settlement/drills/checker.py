"""Independent reads of Kafka and the ledger, compared in Jepsen's vocabulary.

``lost``: committed in Kafka, missing from the ledger. ``duplicated``: a trade id or a
Kafka offset applied twice. ``unexpected``: in the ledger but not a committed message at
that offset (e.g. read from an aborted transaction). A malformed message, or a trade that
came after its day's close marker on its partition (late), must be a dead letter instead.
A cancel or correction (``amendments``) must be stored once or dead-lettered: one whose
identity (trade id, kind, version) is in neither is lost. Used by tests and failover drills.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from consumers.parse import (
    Malformed,
    amendment,
    close_marker,
    decode,
    message_type,
    trade_copy_line,
)
from settlement.config import Settings
from settlement.contract import AMENDMENTS
from settlement.db import connect, q

Identity = tuple[str, str, int]  # an amendment's: trade id, kind, version (0 for a cancel)


@dataclass
class KafkaDay:
    """Everything committed on the topic for one trade date."""

    trade_date: str
    # (partition, offset) -> trade_id of every valid committed trade of the date
    trades: dict[tuple[int, int], str] = field(default_factory=dict)
    malformed: set[tuple[int, int]] = field(default_factory=set)
    close_markers: dict[int, int] = field(default_factory=dict)  # partition -> last_seq
    # (partition, offset) -> trade_id of valid trades of the date after its close marker on
    # their partition: the sites dead-letter them as late
    late: dict[tuple[int, int], str] = field(default_factory=dict)
    close_offsets: dict[int, int] = field(default_factory=dict)  # partition -> first marker
    # (partition, offset) -> identity of each well-formed cancel and correction of the date
    amendments: dict[tuple[int, int], Identity] = field(default_factory=dict)
    # trade_id -> the first valid committed copy of each trade of the date (not late): what an
    # independent netting of the day reads (the stack's site drills)
    rows: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def trade_ids(self) -> set[str]:
        return set(self.trades.values())


def read_kafka_day(settings: Settings, trade_date: str, timeout: float = 60) -> KafkaDay:
    """Read the whole topic with read_committed and keep what belongs to ``trade_date``.

    Malformed messages carry no reliable date, so every malformed message on the topic is
    reported; the callers use a topic per day or compare only offsets they care about.
    """
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

    c = Consumer({
        **settings.kafka_client_config(),
        "group.id": f"checker-{uuid.uuid4().hex}",
        "isolation.level": "read_committed",
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        # The end of each partition is signalled (read_committed never returns a trailing
        # transaction marker, so the last offset alone cannot tell).
        "enable.partition.eof": True,
        "fetch.wait.max.ms": 10,
        "log_level": 3,
    })
    day = KafkaDay(trade_date)
    try:
        md = c.list_topics(settings.topic, timeout=10)
        parts = sorted(md.topics[settings.topic].partitions)
        ends = {p: c.get_watermark_offsets(TopicPartition(settings.topic, p), timeout=10)[1]
                for p in parts}
        c.assign([TopicPartition(settings.topic, p, OFFSET_BEGINNING) for p in parts])
        done: set[int] = {p for p in parts if ends[p] == 0}
        deadline = time.monotonic() + timeout
        idle_since = time.monotonic()
        while len(done) < len(parts) and time.monotonic() < deadline:
            # A short timeout: consume() otherwise waits for all 10,000 messages.
            msgs = c.consume(num_messages=10_000, timeout=0.05)
            if not msgs:
                # Partition EOF should end the loop; quiet for a while ends it too.
                if time.monotonic() - idle_since > 3:
                    break
                continue
            idle_since = time.monotonic()
            for m in msgs:
                if m.error():
                    if m.error().code() == KafkaError._PARTITION_EOF:
                        done.add(m.partition())
                    continue
                p, off = m.partition(), m.offset()
                if off + 1 >= ends[p] - 1:
                    done.add(p)
                _classify(day, m, p, off, settings.max_message_bytes)
    finally:
        c.close()
    return day


def _classify(day: KafkaDay, m: Any, p: int, off: int, max_bytes: int) -> None:
    try:
        obj = decode(m.value(), max_bytes)
        kind = message_type(m.headers())
        if kind == "close":
            cm = close_marker(obj, p)
            if cm.trade_date == day.trade_date:
                day.close_markers[p] = cm.last_seq
                day.close_offsets.setdefault(p, off)
            return
        if kind in AMENDMENTS:
            a = amendment(obj, kind)
            if a.trade_date == day.trade_date:
                day.amendments[(p, off)] = (a.trade_id, a.kind, a.version or 0)
            return
        trade_copy_line(obj, p, off, "checker")
    except Malformed:
        day.malformed.add((p, off))
        return
    if obj["trade_date"] == day.trade_date:
        # A partition is read in offset order, so a marker seen before is at a lower offset.
        if p in day.close_offsets:
            day.late[(p, off)] = str(obj["trade_id"])
        else:
            day.trades[(p, off)] = str(obj["trade_id"])
            day.rows.setdefault(str(obj["trade_id"]), obj)


@dataclass
class LedgerCheck:
    ledger_rows: int
    lost: list[str]
    duplicated: list[str]
    unexpected: list[dict[str, Any]]
    missing_dead_letters: list[tuple[int, int]]
    dead_letters_without_reason: int
    amendments: int = 0  # cancels and corrections stored
    lost_amendments: list[Identity] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.lost or self.duplicated or self.unexpected
                    or self.missing_dead_letters or self.dead_letters_without_reason
                    or self.lost_amendments)

    def as_dict(self) -> dict[str, Any]:
        return {
            "ledger_rows": self.ledger_rows,
            "lost": len(self.lost), "duplicated": len(self.duplicated),
            "unexpected": len(self.unexpected),
            "missing_dead_letters": len(self.missing_dead_letters),
            "amendments": self.amendments, "lost_amendments": len(self.lost_amendments),
            "examples": {"lost": self.lost[:5], "duplicated": self.duplicated[:5],
                         "unexpected": self.unexpected[:5]},
        }


def check_ledger(dsn: str, day: KafkaDay, topic: str) -> LedgerCheck:
    with connect(dsn) as conn:
        rows = conn.execute(
            "select trade_id, kafka_partition, kafka_offset from trades where trade_date = %s",
            (day.trade_date,),
        ).fetchall()
        dead = conn.execute(
            "select kafka_partition, kafka_offset, reason from dead_letters where topic = %s",
            (topic,),
        ).fetchall()
        amended = {(t, k, int(v or 0)) for t, k, v in conn.execute(
            "select trade_id, kind, version from trade_amendments where trade_date = %s",
            (day.trade_date,))}
    by_id = Counter(r[0] for r in rows)
    by_offset = Counter((r[1], r[2]) for r in rows)
    duplicated = sorted({t for t, n in by_id.items() if n > 1}
                        | {f"offset {p}:{o}" for (p, o), n in by_offset.items() if n > 1})
    unexpected = [
        {"trade_id": t, "partition": p, "offset": o}
        for t, p, o in rows if day.trades.get((p, o)) != t
    ]
    lost = sorted(day.trade_ids - set(by_id))
    dead_offsets = {(p, o) for p, o, _ in dead}
    # Stored under its identity, or every copy of it dead-lettered (a refused amendment, or a
    # conflicting replay of a stored one, whose identity is then stored).
    handled = amended | {i for pos, i in day.amendments.items() if pos in dead_offsets}
    return LedgerCheck(
        ledger_rows=len(rows),
        lost=lost,
        duplicated=duplicated,
        unexpected=unexpected,
        missing_dead_letters=sorted((day.malformed | set(day.late)) - dead_offsets),
        dead_letters_without_reason=sum(1 for *_, r in dead if not r),
        amendments=len(amended),
        lost_amendments=sorted(set(day.amendments.values()) - handled),
    )


# -- progress: faults are injected when the victim is that far into its share of the day ------


def day_share(trade_date: str, trades: int, seed: int, partitions: int) -> dict[int, int]:
    """Trades per partition of a simulated day: the gateway's generator is deterministic, so
    what each partition will carry is known before it is published."""
    from settlement.simulator.gateway import DayGenerator, SimulationSpec

    return dict(Counter(t.partition for t in DayGenerator(
        SimulationSpec(trade_date, trades, seed=seed), partitions).trades()))


@dataclass(frozen=True)
class Progress:
    """How far a site got with its share of the day, read from its ledger."""

    site: str
    committed: int  # trades the site committed in the ledger
    share: int  # trades of the day on the partitions it owns (all of them in "separate")
    partitions: tuple[int, ...]
    reached: bool
    seconds: float  # waited

    @property
    def fraction(self) -> float:
        return self.committed / self.share if self.share else 0.0

    def describe(self) -> str:
        head = (f"site {self.site.upper()} had committed {self.committed} of its "
                f"{self.share} trades ({self.fraction:.0%}, partitions "
                f"{list(self.partitions)})")
        return head if self.reached else f"{head}; the target was not reached in time"


def wait_for_owners(dsns: dict[str, str], timeout: float) -> bool:
    """Wait until every site (site -> its ledger's DSN) beats with partitions of its own: the
    group has settled, so a day published now is shared as the scheme says."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        owned = []
        for site, dsn in dsns.items():
            with connect(dsn, autocommit=True) as conn:
                row = conn.execute(q("drill", "site_partitions"), {"site": site}).fetchone()
            owned.append(bool(row and row[0]))
        if all(owned):
            return True
        time.sleep(0.2)
    return False


def wait_for_share(dsn: str, site: str, per_partition: dict[int, int], fraction: float,
                   timeout: float, own_all: bool = False,
                   alive: Callable[[], bool] = lambda: True,
                   trade_date: str | None = None) -> Progress:
    """Wait until ``site`` has committed ``fraction`` of its share of the day: the trades on
    the partitions it owns by its latest heartbeat (``own_all``: every partition, as in the
    separate scheme), of ``trade_date`` if given (a ledger holding several days). Gives up
    after ``timeout`` seconds or when ``alive()`` turns false."""
    t0 = time.monotonic()
    committed, share, parts = 0, 0, tuple(sorted(per_partition)) if own_all else ()
    with connect(dsn, autocommit=True) as conn:
        while True:
            if not own_all:
                row = conn.execute(q("drill", "site_partitions"), {"site": site}).fetchone()
                parts = tuple(sorted(row[0])) if row else ()
            share = sum(per_partition.get(p, 0) for p in parts)
            row = conn.execute(q("drill", "site_trades"),
                               {"site": site, "trade_date": trade_date}).fetchone()
            committed = int(row[0]) if row else 0
            reached = share > 0 and committed >= fraction * share
            waited = time.monotonic() - t0
            if reached or waited > timeout or not alive():
                return Progress(site, committed, share, parts, reached, round(waited, 3))
            time.sleep(0.05)
