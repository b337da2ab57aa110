"""Where the end-of-day settlement reads a trade date from: Kafka or the ledger database.

Kafka is preferred (it is the system of record the ledgers were built from). The database
is used when the broker is unreachable, the topic is missing, the day's offsets are no
longer retained, or the close markers are not in Kafka -- and when an operator asks. Every
choice carries a sentence an operator can read in the Airflow UI and the audit report.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from concurrent.futures import ThreadPoolExecutor

import psycopg

from settlement.config import LEDGERS, Settings
from settlement.db import open_connection, q, redact
from settlement.eod.kafka_day import NotLocated, locate_day
from settlement.eod.model import (
    DataLoss,
    LedgerState,
    MarkerAt,
    NoSource,
    PartitionMismatch,
    PartitionStats,
    SourceChoice,
)

log = logging.getLogger(__name__)


def ledger_state(settings: Settings, ledger: str, trade_date: str, ahead: bool = False
                 ) -> LedgerState | None:
    """None when the ledger cannot be reached (it is then not a candidate). ``ahead``: the
    close's call, which also makes the partitions of the days ahead (``_partitions_ahead``);
    a sensor's poke only reads."""
    params = {"trade_date": trade_date}
    try:
        with open_connection(settings.ledger_dsn(ledger)) as conn:
            markers = {int(p): MarkerAt(int(last), int(off), int(k), int(closed))
                       for p, last, off, k, closed
                       in conn.execute(q("eod", "close_markers"), params)}
            stats = {int(p): PartitionStats(int(n), int(distinct), int(mx), int(first),
                                            int(amended))
                     for p, n, distinct, mx, first, amended
                     in conn.execute(q("eod", "partition_stats"), params)}
            prev = {int(p): int(off)
                    for p, off in conn.execute(q("eod", "previous_close_markers"), params)}
            loss = tuple(
                DataLoss(ledger, int(p), int(a), int(b), site, at.isoformat())
                for p, a, b, site, at in conn.execute(
                    q("ledger", "data_loss_for_day"),
                    {"topic": settings.topic, "trade_date": trade_date}))
    except psycopg.Error:
        return None
    if ahead:
        _partitions_ahead(settings, ledger, trade_date)
    return LedgerState(ledger, markers, stats, prev, loss)


def marked_rows(settings: Settings, trade_date: str) -> int:
    """About how many rows the day holds, by the first ledger whose close markers cover it:
    its trades and amendments (each takes a seq), not Kafka's replays; 0 when no ledger has
    a close marker of the day. One indexed lookup, asked beside the choice (which counts
    the day's rows exactly, about a second for 2M trades): a close starts its JVM by it."""
    for name in ("shared", "a", "b"):
        try:
            with open_connection(settings.ledger_dsn(name)) as conn:
                row = conn.execute(q("eod", "marked_rows"), {"trade_date": trade_date}
                                   ).fetchone()
        except psycopg.Error:
            continue
        if row is not None and row[0]:
            return int(row[0])
    return 0


def _partitions_ahead(settings: Settings, ledger: str, trade_date: str) -> None:
    """The ledger's partitions of `trades` for the closing day and the week after it, made
    ahead of the sites (sql/migrations/0023): the next days' first batches then find theirs.
    A failure costs the close nothing (a site makes a missing day's partition itself); it
    is logged."""
    try:
        with open_connection(settings.ledger_dsn(ledger), autocommit=True) as conn:
            conn.execute(q("eod", "partitions_ahead"), {"trade_date": trade_date})
    except psycopg.Error as e:
        log.warning("ledger %s: the partitions after %s were not made ahead: %s", ledger,
                    trade_date, str(e).strip()[:300])


def ledger_states(settings: Settings, trade_date: str, ahead: bool = False
                  ) -> dict[str, LedgerState]:
    """Every reachable ledger's state of the day (an unreachable one is left out), the
    ledgers asked at once: each answer is a pass over the day (about a second for a 2M day),
    and in two rooms the ledgers are on servers of their own (each site's, the cluster's),
    one of them perhaps down, whose connect timeout is then waited for beside the others'
    answers."""
    with ThreadPoolExecutor(max_workers=len(LEDGERS), thread_name_prefix="ledger-state") as pool:
        found = dict(zip(LEDGERS, pool.map(
            lambda name: ledger_state(settings, name, trade_date, ahead), LEDGERS), strict=True))
    return {name: st for name, st in found.items() if st is not None}


def choose_db(settings: Settings, trade_date: str, partitions: int,
              states: dict[str, LedgerState]) -> tuple[tuple[str, ...], str]:
    """The ledger(s) to read: one complete ledger, else the union of the site ledgers."""
    usable = {n: s for n, s in states.items() if s.trades > 0}
    for name in ("shared", "a", "b"):
        st = usable.get(name)
        if st is not None and st.complete(partitions):
            return (name,), (f"ledger '{name}' is complete for {trade_date} "
                             f"({st.trades} trades, {len(st.markers)}/{partitions} "
                             "partitions closed, sequences contiguous)")
    sites = tuple(n for n in ("a", "b") if n in usable)
    if len(sites) == 2:
        return sites, ("no single ledger is complete for the day; reading the union of site "
                       "ledgers a and b, deduplicated by trade_id")
    if usable:
        best = max(usable.values(), key=lambda s: s.trades)
        return (best.name,), (f"no ledger is complete for {trade_date}; reading '{best.name}' "
                              f"({best.trades} of {best.expected_trades} trades): validation "
                              "will name what is missing")
    raise NoSource(f"no ledger holds trades for {trade_date} "
                   f"(checked {', '.join(redact(settings.ledger_dsn(n)) for n in LEDGERS)})")


@dataclasses.dataclass(frozen=True)
class TopicView:
    """The topic as Kafka reports it now, or why it cannot (``partitions`` is then None)."""

    partitions: list[int] | None
    why_not: str = ""


def topic_view(settings: Settings, timeout: float) -> TopicView:
    from confluent_kafka import KafkaException

    from settlement.kafka.admin import admin_client, brokers_refuse

    if brokers_refuse(settings, min(timeout, 2.0)):
        # Brokers that are down refuse at once; the fallback need not wait out the timeout.
        return TopicView(None, f"Kafka is unreachable at {settings.bootstrap()}: every "
                               "bootstrap server refused the connection")
    try:
        md = admin_client(settings).list_topics(timeout=timeout)
    except KafkaException as e:
        return TopicView(None, f"Kafka is unreachable at {settings.bootstrap()} within "
                               f"{timeout:.0f}s ({e})")
    topic = md.topics.get(settings.topic)
    if topic is None or topic.error is not None:
        return TopicView(None, f"topic '{settings.topic}' does not exist on "
                               f"{settings.bootstrap()}")
    return TopicView(sorted(topic.partitions))


def recorded_partitions(settings: Settings, trade_date: str) -> tuple[int, int, str] | None:
    """The topic's partition count as Kafka last reported it to a run of this date or an
    earlier one: (count, run_id, trade_date), or None when no run has recorded it."""
    with open_connection(settings.settlement_dsn) as conn:
        row = conn.execute(q("eod", "recorded_partitions"),
                           {"trade_date": trade_date}).fetchone()
    return None if row is None else (int(row[0]), int(row[1]), row[2].isoformat())


def day_partitions(settings: Settings, trade_date: str, topic: TopicView,
                   states: dict[str, LedgerState]) -> int:
    """How many partitions the day has. The topic's real count wherever Kafka answers (the
    sites use it too: SETTLE_PARTITIONS only sizes a topic the services create). Without
    Kafka, SETTLE_PARTITIONS is checked against the count Kafka last reported to a run and
    against the partitions the ledgers hold: a topic that grew while the setting stayed put
    would otherwise let a database-sourced day publish without its new partitions."""
    if topic.partitions is not None:
        return len(topic.partitions)
    n = settings.partitions
    recorded = recorded_partitions(settings, trade_date)
    if recorded is not None and recorded[0] != n:
        count, run_id, day = recorded
        raise PartitionMismatch(
            f"SETTLE_PARTITIONS={n} but topic '{settings.topic}' had {count} partitions when "
            f"run {run_id} ({day}) read it, and Kafka cannot be asked now ({topic.why_not}): "
            f"set SETTLE_PARTITIONS={count} if the topic still has {count} partitions")
    seen = max((p for st in states.values() for p in (*st.markers, *st.stats)), default=-1)
    if seen >= n:
        raise PartitionMismatch(
            f"SETTLE_PARTITIONS={n} but the ledgers hold partition {seen} of "
            f"'{settings.topic}', and Kafka cannot be asked now ({topic.why_not}): set "
            "SETTLE_PARTITIONS to the topic's partition count")
    return n


def _kafka_close_markers(settings: Settings, trade_date: str, timeout: float,
                         topic: TopicView, states: dict[str, LedgerState]
                         ) -> tuple[dict[int, tuple[int, int]] | None, str]:
    """partition -> [start, end) offsets of the day in Kafka and how they were found, or
    None and why not (the fallback reason)."""
    if topic.partitions is None:
        return None, topic.why_not
    parts = topic.partitions
    # What the ledgers recorded (marker offsets, where the previous day ended) only speeds the
    # search up; Kafka must confirm every recorded offset.
    recorded: dict[int, int] = {}
    previous: dict[int, int] = {}
    first_trade: dict[int, int] = {}
    for st in states.values():
        for p, m in st.markers.items():
            # The furthest: a ledger that holds an amended close ends the day there.
            recorded[p] = max(recorded.get(p, -1), m.offset)
        for p, off in st.previous_markers.items():
            previous[p] = max(previous.get(p, -1), off)
        for p, stat in st.stats.items():
            first_trade[p] = min(first_trade.get(p, stat.first_offset), stat.first_offset)
    try:
        lows = _low_watermarks(settings, parts, timeout)
        for p, first in sorted(first_trade.items()):
            if lows.get(p, 0) > first:
                raise NotLocated(
                    f"the day's offsets are no longer retained in Kafka: partition {p} now "
                    f"starts at offset {lows[p]}, the day's first trade was at {first}")
        located = locate_day(settings, trade_date, parts, recorded, previous, timeout)
    except NotLocated as e:
        return None, str(e)
    searched = sorted(p for p, d in located.items() if d.found_by == "search")
    how = ("found in Kafka by search on partitions " + ", ".join(map(str, searched))
           if searched else "at the offsets the ledgers recorded")
    return {p: (d.start, d.end) for p, d in located.items()}, how


def _low_watermarks(settings: Settings, parts: list[int], timeout: float) -> dict[int, int]:
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    c = Consumer({**settings.kafka_client_config(), "group.id": f"eod-probe-{uuid.uuid4().hex}",
                  "log_level": 3})
    try:
        return {p: c.get_watermark_offsets(TopicPartition(settings.topic, p),
                                           timeout=timeout)[0] for p in parts}
    except KafkaException as e:
        raise NotLocated(f"Kafka failed while locating the day: {e}") from None
    finally:
        c.close()


def choose_source(settings: Settings, trade_date: str, requested: str = "auto",
                  timeout: float = 10.0) -> SourceChoice:
    if requested not in ("auto", "kafka", "db"):
        raise ValueError(f"--source: expected auto, kafka or db, got {requested!r}")
    # The ledgers are asked once; every later step of the run reads the answer from the choice.
    # Kafka's view of the topic is asked meanwhile: after an outage that is the brokers'
    # refusal or timeout, waited for beside the ledgers' queries rather than after them.
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="topic-view") as pool:
        asked = pool.submit(topic_view, settings, timeout)
        states = ledger_states(settings, trade_date, ahead=True)
        topic = asked.result()
    partitions = day_partitions(settings, trade_date, topic, states)
    known = {"topic_partitions": partitions} if topic.partitions is not None else {}
    if requested == "db":
        ledgers, why = choose_db(settings, trade_date, partitions, states)
        return SourceChoice("db", f"requested by the operator (--source db); {why}",
                            ledgers=ledgers, partitions=partitions, states=states, **known)
    ranges, why_not = _kafka_close_markers(settings, trade_date, timeout, topic, states)
    if ranges is not None:
        n = sum(end - start for start, end in ranges.values())
        how = why_not  # on success: how the day was found
        reason = (f"requested by the operator (--source kafka); close markers {how}"
                  if requested == "kafka" else
                  f"Kafka is reachable and holds the whole day: close markers confirmed on "
                  f"all {len(ranges)} partitions ({how}), {n} offsets retained")
        return SourceChoice("kafka", reason, kafka_ranges=ranges, partitions=len(ranges),
                            states=states, **known)
    if requested == "kafka":
        raise NoSource(f"--source kafka was requested but {why_not}")
    ledgers, why = choose_db(settings, trade_date, partitions, states)
    return SourceChoice("db", f"fell back to the database: {why_not}; {why}",
                        ledgers=ledgers, partitions=partitions, states=states, **known)


def with_reason(choice: SourceChoice, reason: str | None) -> SourceChoice:
    """The choice with the reason a caller recorded (the DAG's branch chose the source)."""
    return dataclasses.replace(choice, reason=reason) if reason else choice
