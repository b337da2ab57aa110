"""Finding a trade date in the Kafka log by itself, so that the Kafka source needs no ledger.

Along a partition the trade dates do not go back: a day's trades, then its close marker,
then the next day's trades. So the first offset whose next dated message is of day >= D is
where D starts (just after D-1's close marker) and the first whose next dated message is of a
later day is just past D's end; each is a binary search of single-message probes (about
log2(messages) probes a partition). D's close marker must be the last dated message before
that end; it is looked for in a bounded window there (trades of D arriving after the marker
are left out of the range: they are late, as the sites treat them).

The ledgers' recorded marker offsets only speed this up: a recorded offset is probed first
and, if Kafka confirms it, no search is needed; a recorded offset Kafka contradicts is
reported, never trusted.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

from consumers.parse import Malformed, close_marker, decode, message_type
from settlement.config import Settings
from settlement.contract import CLOSE, TRADE

# How many messages a probe reads ahead for the next dated one (malformed messages and
# transaction markers carry no date).
LOOKAHEAD = 256
# The widest window searched backwards from a day's end for its close marker.
MAX_MARKER_WINDOW = 1 << 20


class NotLocated(RuntimeError):
    """The day cannot be located in Kafka; the message says why (the fallback reason)."""


@dataclass(frozen=True)
class Dated:
    """The first message with a trade date at or after a probed offset."""

    offset: int
    day: str
    kind: str  # "trade" | "close"
    seq: int | None  # a trade's seq, a close marker's last_seq


@dataclass(frozen=True)
class DayInPartition:
    start: int  # first offset of the day (just after the previous day's close marker)
    end: int  # the close marker's offset + 1
    last_seq: int
    found_by: str  # "ledger" | "search"


def _dated(m: Any, partition: int, max_bytes: int) -> Dated | None:
    if m.error() is not None:
        return None
    try:
        obj = decode(m.value(), max_bytes)
        kind = message_type(m.headers())
        if kind == CLOSE:
            cm = close_marker(obj, partition)
            return Dated(m.offset(), cm.trade_date, CLOSE, cm.last_seq)
        day, seq = obj.get("trade_date"), obj.get("seq")
    except Malformed:
        return None
    if kind != TRADE or not isinstance(day, str) or len(day) != 10:
        return None
    return Dated(m.offset(), day, TRADE, seq if type(seq) is int else None)


class PartitionLog:
    """Probes of one partition through one consumer, memoised (a search revisits offsets)."""

    def __init__(self, consumer: Any, topic: str, partition: int, high: int, max_bytes: int,
                 timeout: float):
        self.c, self.topic, self.p, self.high = consumer, topic, partition, high
        self.max_bytes, self.timeout = max_bytes, timeout
        self.probes = 0
        self._seen: dict[int, Dated | None] = {}

    def read(self, offset: int, count: int) -> list[Any]:
        """Up to ``count`` readable messages from ``offset`` on (fewer at the log end)."""
        from confluent_kafka import KafkaError, TopicPartition

        self.c.assign([TopicPartition(self.topic, self.p, offset)])
        out: list[Any] = []
        deadline = time.monotonic() + self.timeout
        while len(out) < count and time.monotonic() < deadline:
            # read_committed hides control records and aborted data, so the log's end is
            # known by the partition-EOF event, not by reaching the high watermark's offset.
            at_end = False
            for m in self.c.consume(min(count - len(out), 500), timeout=0.2):
                err = m.error()
                if err is None:
                    out.append(m)
                elif err.code() == KafkaError._PARTITION_EOF:
                    at_end = True
            if at_end:
                break
        return out[:count]

    def dated_at(self, offset: int) -> Dated | None:
        """The first dated message at or after ``offset``; None past the last one."""
        if offset >= self.high:
            return None
        if offset in self._seen:
            return self._seen[offset]
        self.probes += 1
        found = None
        for m in self.read(offset, LOOKAHEAD):
            found = _dated(m, self.p, self.max_bytes)
            if found is not None:
                break
        self._seen[offset] = found
        return found

    def first_offset(self, low: int, pred: Any) -> int:
        """The smallest offset in [low, high] whose next dated message satisfies ``pred``
        (the high watermark when none does); ``pred`` must be monotone along the log."""
        lo, hi = low, self.high
        while lo < hi:
            mid = (lo + hi) // 2
            d = self.dated_at(mid)
            if d is None or pred(d):
                hi = mid
            else:
                lo = mid + 1
        return lo


def _marker_before(log: PartitionLog, start: int, end: int, day: str) -> Dated | None:
    """D's close marker: the last one in [start, end), looked for in a window that doubles
    backwards from ``end``."""
    width = LOOKAHEAD
    while True:
        lo = max(start, end - width)
        found = None
        for m in log.read(lo, end - lo):
            if m.offset() >= end:
                break
            d = _dated(m, log.p, log.max_bytes)
            if d is not None and d.kind == CLOSE and d.day == day:
                found = d
        if found is not None or lo == start or width >= MAX_MARKER_WINDOW:
            return found
        width *= 2


def locate_in_partition(log: PartitionLog, low: int, day: str,
                        recorded: int | None, previous: int | None) -> DayInPartition:
    """Where ``day`` sits in one partition. ``recorded``: the close marker offset a ledger
    holds (probed first); ``previous``: the previous day's marker offset a ledger holds."""
    if recorded is not None:
        d = log.dated_at(recorded)
        if d is None or d.offset != recorded or d.kind != CLOSE or d.day != day:
            raise NotLocated(
                f"the close marker of partition {log.p} for {day} is not at offset "
                f"{recorded} in Kafka, where a ledger recorded it")
        start = previous + 1 if previous is not None and previous + 1 >= low else None
        if start is None:
            start = log.first_offset(low, lambda x: x.day >= day)
        return DayInPartition(start, recorded + 1, d.seq or 0, "ledger")
    start = log.first_offset(low, lambda x: x.day >= day)
    first = log.dated_at(start)
    if first is None or first.day != day:
        raise NotLocated(f"partition {log.p} holds no message of {day} in Kafka")
    if start == low and low > 0 and first.kind == TRADE and first.seq != 1:
        raise NotLocated(
            f"the day's offsets are no longer retained in Kafka: partition {log.p} starts at "
            f"offset {low} with seq {first.seq} of {day}")
    after = log.first_offset(start, lambda x: x.day > day)
    marker = _marker_before(log, start, after, day)
    if marker is None:
        raise NotLocated(f"no close marker of {day} on partition {log.p} in Kafka "
                         f"(the day's messages end at offset {after})")
    return DayInPartition(start, marker.offset + 1, marker.seq or 0, "search")


def locate_day(settings: Settings, day: str, partitions: list[int],
               recorded: dict[int, int], previous: dict[int, int], timeout: float
               ) -> dict[int, DayInPartition]:
    """The day on every partition, or NotLocated saying where it failed."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    c = Consumer({**settings.kafka_client_config(), "group.id": f"eod-probe-{uuid.uuid4().hex}",
                  "isolation.level": "read_committed", "enable.auto.commit": False,
                  "fetch.wait.max.ms": 10, "enable.partition.eof": True, "log_level": 3})
    try:
        out: dict[int, DayInPartition] = {}
        for p in partitions:
            low, high = c.get_watermark_offsets(TopicPartition(settings.topic, p),
                                                timeout=timeout)
            log = PartitionLog(c, settings.topic, p, high, settings.max_message_bytes, timeout)
            out[p] = locate_in_partition(log, low, day, recorded.get(p), previous.get(p))
        return out
    except KafkaException as e:
        raise NotLocated(f"Kafka failed while locating the day: {e}") from None
    finally:
        c.close()
