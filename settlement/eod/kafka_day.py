"""Finding a trade date in the Kafka log by itself, so that the Kafka source needs no ledger.

Along a partition the trade dates do not go back: a day's trades, then its close marker,
then the next day's trades. A probe reads a window of messages at an offset and takes the
median date of the valid ones (so a late trade of another day, or a malformed message, cannot
mislead it); a binary search over probes (about log2(messages) of them) finds where the
median reaches D and where it passes D. Each boundary is then made exact with the close
markers next to it: the day starts right after D-1's close marker and ends with D's own
(trades of D after their marker are late, and left out as the sites leave them out).

The ledgers' recorded marker offsets only speed this up: a recorded offset is probed first
and, if Kafka confirms it, no search is needed; a recorded offset Kafka contradicts is
reported, never trusted.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

from consumers.parse import Malformed, close_marker, decode, message_type, trade_copy_line
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
    """A valid message of the contract: a trade or a close marker, with its date."""

    offset: int
    day: str
    kind: str  # "trade" | "close"
    seq: int | None  # a trade's seq, a close marker's last_seq
    amended: int = 0  # an amended close marker's k (0: the day's close itself)


@dataclass(frozen=True)
class Window:
    """What a probe saw: the median date of its valid messages, and those messages."""

    day: str
    first: Dated
    messages: list[Dated]


@dataclass(frozen=True)
class DayInPartition:
    start: int  # first offset of the day (just after the previous day's close marker)
    end: int  # the close marker's offset + 1
    last_seq: int
    found_by: str  # "ledger" | "search"


def _dated(m: Any, partition: int, max_bytes: int) -> Dated | None:
    """The message as the sites would take it, or None for anything they would not settle
    (a malformed message's date means nothing)."""
    if m.error() is not None:
        return None
    try:
        obj = decode(m.value(), max_bytes)
        kind = message_type(m.headers())
        if kind == CLOSE:
            cm = close_marker(obj, partition)
            return Dated(m.offset(), cm.trade_date, CLOSE, cm.last_seq, cm.amended)
        if kind != TRADE:
            return None
        trade_copy_line(obj, partition, m.offset(), "probe")
    except Malformed:
        return None
    return Dated(m.offset(), str(obj["trade_date"]), TRADE, int(obj["seq"]))


class PartitionLog:
    """Probes of one partition through one consumer, memoised (a search revisits offsets)."""

    def __init__(self, consumer: Any, topic: str, partition: int, high: int, max_bytes: int,
                 timeout: float):
        self.c, self.topic, self.p, self.high = consumer, topic, partition, high
        self.max_bytes, self.timeout = max_bytes, timeout
        self.probes = 0
        self._seen: dict[int, Window | None] = {}

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
            # consume() waits for its whole batch or its timeout: a short timeout returns
            # what has arrived (a probe took 0.2 s waiting for a batch that was never full,
            # about 60 ms on average; with 10 ms, 15 ms).
            for m in self.c.consume(min(count - len(out), 500), timeout=0.01):
                err = m.error()
                if err is None:
                    out.append(m)
                elif err.code() == KafkaError._PARTITION_EOF:
                    at_end = True
            if at_end:
                break
        return out[:count]

    def window_at(self, offset: int) -> Window | None:
        """The valid messages among the next LOOKAHEAD readable ones at ``offset``, and their
        median date; None when there is none (past the last one)."""
        if offset >= self.high:
            return None
        if offset in self._seen:
            return self._seen[offset]
        self.probes += 1
        msgs = [d for m in self.read(offset, LOOKAHEAD)
                if (d := _dated(m, self.p, self.max_bytes)) is not None]
        found = None
        if msgs:
            days = sorted(d.day for d in msgs)
            found = Window(days[len(days) // 2], msgs[0], msgs)
        self._seen[offset] = found
        return found

    def first_offset(self, low: int, pred: Any) -> int:
        """The smallest offset in [low, high] whose window's median date satisfies ``pred``
        (the high watermark when none does); ``pred`` must be monotone along the log."""
        # The first probe is the log start: a topic's first day (or one whose earlier days
        # retention deleted) begins there, and then no search is needed (at 2M trades on 6
        # partitions the search cost the close 1.2 s). A start with no dated message in its
        # window (junk) proves nothing: the search then runs as it always did.
        w = self.window_at(low)
        if w is not None and pred(w.day):
            return low
        lo, hi = (low if w is None else low + 1), self.high
        while lo < hi:
            mid = (lo + hi) // 2
            w = self.window_at(mid)
            if w is None or pred(w.day):
                hi = mid
            else:
                lo = mid + 1
        return lo

    def scan(self, start: int, end: int) -> list[Dated]:
        """Every valid message in [start, end)."""
        out = []
        for m in self.read(start, max(end - start, 0)):
            if m.offset() >= end:
                break
            d = _dated(m, self.p, self.max_bytes)
            if d is not None:
                out.append(d)
        return out


def _closes(found: list[Dated], pred: Any) -> list[Dated]:
    return [d for d in found if d.kind == CLOSE and pred(d.day)]


def _day_start(log: PartitionLog, low: int, day: str) -> int:
    """Right after the latest close marker of an earlier day near where the median date
    reaches ``day``; the log start when the log begins with ``day``."""
    approx = log.first_offset(low, lambda d: d >= day)
    lo = max(low, approx - 2 * LOOKAHEAD)
    # An earlier day's amended close can sit among this day's trades: only a close itself
    # marks where a day ended.
    before = [d for d in _closes(log.scan(lo, approx + 2 * LOOKAHEAD), lambda d: d < day)
              if not d.amended]
    if before:
        return before[-1].offset + 1
    if lo == low:
        return low
    raise NotLocated(f"no close marker of the day before {day} on partition {log.p} near "
                     f"offset {approx}, where {day} begins")


def _day_marker(log: PartitionLog, start: int, day: str) -> Dated:
    """D's close marker near where the median date passes ``day``; the window widens
    backwards (many late trades after a marker) up to MAX_MARKER_WINDOW."""
    after = log.first_offset(start, lambda d: d > day)
    width = 2 * LOOKAHEAD
    while True:
        lo = max(start, after - width)
        found = _closes(log.scan(lo, min(after + 2 * LOOKAHEAD, log.high)),
                        lambda d: d == day)
        if found:
            return found[-1]
        if lo == start or width >= MAX_MARKER_WINDOW:
            raise NotLocated(f"no close marker of {day} on partition {log.p} in Kafka "
                             f"(the day's messages end near offset {after})")
        width *= 2


def locate_in_partition(log: PartitionLog, low: int, day: str,
                        recorded: int | None, previous: int | None) -> DayInPartition:
    """Where ``day`` sits in one partition. ``recorded``: the close marker offset a ledger
    holds (probed first); ``previous``: the previous day's marker offset a ledger holds."""
    if recorded is not None:
        w = log.window_at(recorded)
        d = w.first if w is not None else None
        if d is None or d.offset != recorded or d.kind != CLOSE or d.day != day:
            raise NotLocated(
                f"the close marker of partition {log.p} for {day} is not at offset "
                f"{recorded} in Kafka, where a ledger recorded it")
        start = (previous + 1 if previous is not None and previous + 1 >= low
                 else _day_start(log, low, day))
        return DayInPartition(start, recorded + 1, d.seq or 0, "ledger")
    start = _day_start(log, low, day)
    w = log.window_at(start)
    # The day's first message, not the window's: late trades of the day before (after its
    # close marker, before this day's first trade) come first there.
    first = next((d for d in (w.messages if w is not None else ()) if d.day == day), None)
    if first is None:
        raise NotLocated(f"partition {log.p} holds no message of {day} in Kafka")
    if start == low and low > 0 and first.kind == TRADE and first.seq != 1:
        raise NotLocated(
            f"the day's offsets are no longer retained in Kafka: partition {log.p} starts at "
            f"offset {low} with seq {first.seq} of {day}")
    marker = _day_marker(log, start, day)
    return DayInPartition(start, marker.offset + 1, marker.seq or 0, "search")


# Partitions searched at once (each thread its own consumer and connections).
LOCATE_THREADS = 8


def locate_day(settings: Settings, day: str, partitions: list[int],
               recorded: dict[int, int], previous: dict[int, int], timeout: float
               ) -> dict[int, DayInPartition]:
    """The day on every partition, or NotLocated saying where it failed (the first partition
    in ``partitions``' order that failed). The partitions are searched at once, each by a
    consumer of its own: a search is round trips to the broker (choosing a 2,000-trade day's
    Kafka source took 0.50-0.56 s with the partitions one after another, 0.36-0.50 s at
    once; a larger day's choice is mostly the ledgers' own state queries)."""
    from concurrent.futures import ThreadPoolExecutor

    if not partitions:
        return {}
    group = f"eod-probe-{uuid.uuid4().hex}"
    with ThreadPoolExecutor(max_workers=min(len(partitions), LOCATE_THREADS),
                            thread_name_prefix="locate-day") as pool:
        found = list(pool.map(lambda p: _locate_one(settings, group, day, p, recorded.get(p),
                                                    previous.get(p), timeout), partitions))
    return dict(zip(partitions, found, strict=True))


def _locate_one(settings: Settings, group: str, day: str, p: int, recorded: int | None,
                previous: int | None, timeout: float) -> DayInPartition:
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    c = Consumer({**settings.kafka_client_config(), "group.id": group,
                  "isolation.level": "read_committed", "enable.auto.commit": False,
                  "fetch.wait.max.ms": 10, "enable.partition.eof": True, "log_level": 3})
    try:
        low, high = c.get_watermark_offsets(TopicPartition(settings.topic, p), timeout=timeout)
        log = PartitionLog(c, settings.topic, p, high, settings.max_message_bytes, timeout)
        return locate_in_partition(log, low, day, recorded, previous)
    except KafkaException as e:
        raise NotLocated(f"Kafka failed while locating the day: {e}") from None
    finally:
        c.close()
