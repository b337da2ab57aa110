"""A consumer site: Kafka ``trades`` -> its PostgreSQL ledger, exactly once.

Scheme "separate" (seed 004, scheme 1): every site has its own consumer group and ledger
and consumes everything. Scheme "shared" (scheme 2): both sites are one group writing one
ledger; when a site dies the group rebalances and the survivor resumes from the offsets
stored in the ledger -- not from Kafka's committed offsets, which is what made the seed's
survivor re-read the whole topic.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import psycopg

from consumers.ledger import BEGINNING, Batch, BatchResult, Fenced, Ledger
from consumers.metrics import SiteMetrics, stats_line
from consumers.parse import (
    Malformed,
    amendment,
    close_marker,
    copy_line,
    decode,
    fast_trade,
    fast_trade_lines,
    message_type,
    trade_copy_line,
)
from consumers.runtime import hot_loop
from settlement.config import Settings
from settlement.contract import AMENDMENTS, TRADE, TRADE_HEADERS, group_id
from settlement.kafka.admin import topic_partitions

log = logging.getLogger("settle.site")
FAILPOINTS = ("after_db_commit", "before_db_commit")
PRUNE_EVERY = 3600.0  # seconds between heartbeat retention passes
# The writer thread takes the GIL back after each of a batch's dozen ledger round trips while
# the main thread parses the next poll; at Python's default interval (5 ms) each of those
# waits could last that long, and the batch's commit with them (+10-15% steady ingest at
# 0.5 ms, alternating runs; docs/benchmarks.md).
GIL_SWITCH_SECONDS = 0.0005
FREE_SLICE = 500  # messages freed at a time (about 0.1 ms with the GIL held); see _release


@dataclass(frozen=True)
class InFlight:
    """The batch handed to the writer thread, what it expects stored, and its outcome."""

    batch: Batch
    expected: dict[int, int]
    future: Future[BatchResult]


@dataclass(frozen=True)
class SiteOptions:
    site: str
    scheme: str
    until_close: bool = False
    trade_date: str | None = None
    max_seconds: float | None = None


def consumer_config(settings: Settings, site: str, scheme: str) -> dict[str, Any]:
    return {
        **settings.kafka_client_config(),
        "group.id": group_id(site, scheme),
        "client.id": f"site-{site}",
        # Never see trades of aborted or still-open transactions.
        "isolation.level": "read_committed",
        # Positions live in the ledger; Kafka's committed offsets are informational only.
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        # Every partition is assigned at an explicit position: the ledger's stored offset, or
        # OFFSET_BEGINNING ("earliest") for one never consumed. So the reset policy only acts
        # when a stored position is out of range, i.e. retention deleted what we had not read
        # yet: "error" hands that to the site, which records the data loss (never a silent
        # skip to the log start, which is what "earliest" would do).
        "auto.offset.reset": "error",
        # Fast failover in the shared scheme: a dead site is noticed after the session
        # timeout (6 s by default here, Kafka's own default is 45 s), heartbeats every 1 s.
        "session.timeout.ms": settings.session_timeout_ms,
        "heartbeat.interval.ms": settings.heartbeat_interval_ms,
        "partition.assignment.strategy": "roundrobin",
        # A partition whose leader's site went silent gets a new leader within the brokers'
        # session timeout; a site asks for the leaders every 5 s (librdkafka's default: 5
        # minutes) so that it fetches from the new one at once, instead of after a request to
        # the silent one has timed out (socket.timeout.ms). One small request per 5 s.
        "topic.metadata.refresh.interval.ms": 5000,
        # Large fetches keep librdkafka's prefetch queue ahead of a 20k-message batch.
        "fetch.wait.max.ms": 100,
        "max.partition.fetch.bytes": 8 << 20,
        "fetch.max.bytes": 64 << 20,
        "queued.min.messages": 400_000,
        "queued.max.messages.kbytes": 262_144,
        "log_level": 3,
    }


class Site:
    """One site's consume loop. Parsing batch N+1 overlaps the ledger commit of batch N (a
    single writer thread, at most one batch in flight): Python parses while PostgreSQL
    writes, which roughly doubles throughput on two cores."""

    def __init__(self, settings: Settings, opts: SiteOptions):
        from confluent_kafka import Consumer

        # A site logs in to its ledger as itself (an append-only role, migration 0007).
        settings = settings.for_component("site_a" if opts.site == "a" else "site_b")
        self.settings, self.opts = settings, opts
        self.topic = settings.topic
        ledger_args: dict[str, Any] = {
            "dsn": settings.ledger_dsn(settings.site_ledger(opts.site, opts.scheme)),
            "site": opts.site, "scheme": opts.scheme,
            "group": group_id(opts.site, opts.scheme), "topic": self.topic,
            "lock_timeout_ms": settings.ledger_lock_timeout_ms,
            "statement_timeout_ms": settings.ledger_statement_timeout_ms,
            "idle_timeout_ms": settings.ledger_idle_timeout_ms,
        }
        # batches and positions (writer thread); heartbeats and close checks (main thread)
        self.ledger = Ledger(**ledger_args, role="writer")
        self.aux = Ledger(**ledger_args, role="aux")
        self.writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"ledger-{opts.site}")
        self.pending: InFlight | None = None
        self.spent: InFlight | None = None  # the last batch written, until the next is handed over
        self.consumer = Consumer(consumer_config(settings, opts.site, opts.scheme))
        # partition -> stored next offset after the batches handed to the writer (the
        # compare-and-set value the next batch expects)
        self.expected: dict[int, int] = {}
        # The partitions the group gave us. What librdkafka fetches may be fewer: none while
        # the ledger is unreachable, never the stalled ones (see _fetch).
        self.owned: set[int] = set()
        self.needs_resync = False
        # After a write error: not before this (monotonic) time, and the batch whose outcome
        # the ledger's offsets will tell (partition -> the offset it expected stored).
        self.retry_at = 0.0
        self.failures = 0
        self.unknown: dict[int, int] = {}
        # Partitions whose stored position lies past the end of the log (a recreated topic, a
        # restored ledger, a mirrored cluster): not fetched, reported, and never a reason to stop
        # the other partitions. partition -> the stored position.
        self.stalled: dict[int, int] = {}
        self.stop = False
        self.stats = {"messages": 0, "inserted": 0, "duplicates": 0, "dead_letters": 0,
                      "late": 0, "refused": 0, "close_markers": 0, "batches": 0, "fenced": 0,
                      "db_errors": 0, "data_loss_events": 0, "rebalances": 0,
                      "stalled_partitions": 0}
        self.partition_count = 0
        self.failpoint = _failpoint()
        self.metrics = SiteMetrics(opts.site, opts.scheme)
        self.lag: dict[int, int] = {}
        # trade date -> the partitions whose close marker this site has handed to the writer
        self.marked: dict[str, set[int]] = {}

    # -- rebalance callbacks (run inside consume()) -----------------------------------------
    def _on_assign(self, consumer: Any, partitions: list[Any]) -> None:
        self._drain()
        self.stats["rebalances"] += 1
        ids = [tp.partition for tp in partitions]
        self.owned = set(ids)  # eager protocol: the whole assignment, every time
        try:
            stored = self.ledger.claim(ids)
        except psycopg.Error as e:
            log.warning("site %s: ledger unavailable during assignment (%s); nothing fetched "
                        "until it is back", self.opts.site, e)
            self.ledger.close()
            consumer.unassign()  # the group's partitions stay ours; the resync fetches them
            self.needs_resync = True
            return
        for p in ids:
            self.expected[p] = stored.get(p, BEGINNING)
        self._fetch()
        log.info("site %s assigned %s at %s", self.opts.site, ids,
                 {p: self.expected[p] for p in ids})

    def _on_revoke(self, consumer: Any, partitions: list[Any]) -> None:
        # Let the batch in flight land first, so the next owner reads our final positions.
        self._drain()
        for tp in partitions:
            self.expected.pop(tp.partition, None)
            self.owned.discard(tp.partition)  # a resync before the next assignment skips it
        log.info("site %s revoked %s", self.opts.site, [tp.partition for tp in partitions])

    # -- the loop ---------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        with hot_loop(GIL_SWITCH_SECONDS):
            return self._run()

    def _run(self) -> dict[str, Any]:
        opts = self.opts
        started = time.monotonic()
        deadline = started + opts.max_seconds if opts.max_seconds else None
        self.partition_count = self._partition_count()
        if self.settings.metrics_port:
            port = self.metrics.serve(self.settings.metrics_port,
                                      self.settings.metrics_address,
                                      self.settings.metrics_tls_cert,
                                      self.settings.metrics_tls_key)
            log.info("site %s: Prometheus metrics on port %d (/metrics)", opts.site, port)
        last_stats, stats_at = dict(self.stats), started
        last_prune = -PRUNE_EVERY  # a first pass at start
        self.consumer.subscribe([self.topic], on_assign=self._on_assign,
                                on_revoke=self._on_revoke, on_lost=self._on_revoke)
        last_beat = last_close_check = 0.0
        closed, day = False, opts.trade_date
        try:
            while not self.stop:
                if deadline and time.monotonic() > deadline:
                    break
                if self.needs_resync and (time.monotonic() < self.retry_at
                                          or not self._resync()):
                    # Serve callbacks; whatever this returns is re-read after the resync.
                    self.consumer.consume(num_messages=1, timeout=0.1)
                    continue
                msgs = self.consumer.consume(num_messages=self.settings.batch_size,
                                             timeout=0.5)
                batch = self._parse(msgs)
                self._drain()
                if batch.next_offsets and not self.needs_resync:
                    self._submit(batch)
                self._release()
                now = time.monotonic()
                if now - last_beat >= 1.0:
                    last_beat = now
                    self._heartbeat()
                    self._update_lag()
                interval = self.settings.stats_interval_seconds
                if interval and now - stats_at >= interval:
                    log.info(stats_line(opts.site, self.stats, self.lag, last_stats,
                                        now - stats_at))
                    last_stats, stats_at = dict(self.stats), now
                if self.settings.heartbeat_retention_days and now - last_prune >= PRUNE_EVERY:
                    last_prune = now
                    self._prune()
                may_close = opts.until_close and self._may_close(batch, day)
                if may_close or (opts.until_close and now - last_close_check >= 1.0):
                    # Markers that may close the day must be committed before we look for
                    # them. Any other look reads what is committed (on the aux connection; the
                    # finally block drains before we stop) and needs no drain: draining empties
                    # the pipeline, a parse's worth of writer time each time.
                    if may_close:
                        self._drain()
                    last_close_check = now
                    closed, day = self._closed(day)
                    if closed:
                        break
        finally:
            try:
                self._drain()
                self.consumer.close()  # leave the group now: the other site takes over at once
                try:  # a batch that failed just before we stopped: say whether it was stale
                    self._settle_unknown()
                except psycopg.Error:
                    pass
            finally:
                self.writer.shutdown(wait=True)
                self.ledger.close()
                self.aux.close()
        seconds = time.monotonic() - started
        return {
            "site": opts.site, "scheme": opts.scheme, "group": group_id(opts.site, opts.scheme),
            "ledger": self.settings.site_ledger(opts.site, opts.scheme),
            "trade_date": day, "closed": closed, **self.stats, "stalled": sorted(self.stalled),
            "seconds": round(seconds, 3),
            "trades_per_second": round(self.stats["inserted"] / seconds) if seconds else 0,
        }

    def _parse(self, msgs: list[Any]) -> Batch:
        """Parse one poll's messages: the common poll whole (``_parse_poll``), any other one
        message by message."""
        batch = self._parse_poll(msgs)
        if batch is None:
            batch = Batch()
            batch.messages = self._parse_each(msgs, batch)
        return batch

    def _parse_poll(self, msgs: list[Any]) -> Batch | None:
        """A poll without errors, of owned partitions, whose trades are all plain ones
        (``fast_trade_lines``) and whose other messages are close markers and amendments;
        None for any other poll. The poll's trades keep their order, so the first copy of a
        replayed trade is still the first staged."""
        from confluent_kafka import Message

        if not msgs or any(map(Message.error, msgs)):
            return None
        partitions = list(map(Message.partition, msgs))
        if not self.expected.keys() >= set(partitions):
            return None
        headers = list(map(Message.headers, msgs))
        if headers.count(TRADE_HEADERS) == len(msgs):
            trades, others = msgs, []
            trade_partitions = partitions
        else:
            others = [m for m, h in zip(msgs, headers, strict=True) if h != TRADE_HEADERS]
            # A trade in another header form is parsed the slow way, in its place among the
            # poll's trades: the whole poll goes message by message.
            if any(message_type(h) == TRADE for h in headers if h != TRADE_HEADERS):
                return None
            trades = [m for m, h in zip(msgs, headers, strict=True) if h == TRADE_HEADERS]
            trade_partitions = list(map(Message.partition, trades))
        lines = fast_trade_lines(list(map(Message.value, trades)), trade_partitions,
                                 list(map(Message.offset, trades)), self.opts.site,
                                 self.settings.max_message_bytes)
        if lines is None:
            return None
        batch = Batch(copy_lines=lines, trade_messages=trades)
        if others:
            self._parse_each(others, batch)
        # A partition's messages come in offset order: its last one in the poll is its highest.
        batch.next_offsets = {p: o + 1 for p, o in zip(partitions, map(Message.offset, msgs),
                                                       strict=True)}
        batch.messages = len(msgs)
        return batch

    def _parse_each(self, msgs: list[Any], batch: Batch) -> int:
        """Parse messages one by one into ``batch``; returns how many were ours. The hot loop
        of a hostile poll: locals, no per-message calls beyond the parser itself."""
        from confluent_kafka import KafkaError

        expected, next_offsets = self.expected, batch.next_offsets
        add_line, add_dead = batch.copy_lines.append, batch.dead_letters.append
        add_msg = batch.trade_messages.append
        site, max_bytes = self.opts.site, self.settings.max_message_bytes
        n = 0
        for m in msgs:
            err = m.error()
            if err is not None:
                if err.code() == KafkaError._AUTO_OFFSET_RESET:
                    if m.partition() in self.stalled:
                        continue  # known, and no longer fetched: queued before the resync
                    # Our position is outside the log: retention deleted it unread (the
                    # resync records the gap and moves on from the log start), or the log
                    # ends before it (the resync stops that partition alone).
                    log.error("site %s: partition %s offset %s is no longer in the log: %s",
                              site, m.partition(), m.offset(), err)
                    self.needs_resync = True
                    self.retry_at = time.monotonic() + 1.0
                elif err.code() != KafkaError._PARTITION_EOF:
                    log.warning("site %s: kafka: %s", site, err)
                continue
            p = m.partition()
            if p not in expected:
                continue  # from a partition we no longer own (a rebalance raced this poll)
            off = m.offset()
            n += 1
            next_offsets[p] = off + 1
            raw = m.value()
            headers = m.headers()
            if headers == TRADE_HEADERS:
                fast = fast_trade(raw, max_bytes)
                if fast is not None:  # the common plain trade, checked in C (consumers.parse)
                    add_line(copy_line(fast, p, off, site))
                    add_msg(m)
                    continue
            try:
                obj = decode(raw, max_bytes)
                kind = "trade" if headers == TRADE_HEADERS else message_type(headers)
                if kind == "trade":
                    add_line(trade_copy_line(obj, p, off, site))
                    add_msg(m)
                elif kind == "close":
                    cm = close_marker(obj, p)
                    batch.close_markers.append({"trade_date": cm.trade_date, "partition": p,
                                                "last_seq": cm.last_seq, "offset": off,
                                                "amended": cm.amended, "raw": raw})
                elif kind in AMENDMENTS:
                    batch.amendments.append({"a": amendment(obj, kind), "partition": p,
                                             "offset": off, "raw": raw})
                else:
                    raise Malformed(f"unknown message type header {kind!r}")
            except Malformed as e:
                add_dead({"partition": p, "offset": off, "raw": raw or b"", "reason": str(e)})
        return n

    def _submit(self, batch: Batch) -> None:
        expected = {p: self.expected[p] for p in batch.next_offsets}
        self.pending = InFlight(batch, expected, self.writer.submit(self._write, batch, expected))
        self.expected.update(batch.next_offsets)  # what the next batch will find stored

    def _write(self, batch: Batch, expected: dict[int, int]) -> BatchResult:
        n = self.stats["batches"] + 1
        freeze = None
        if self.failpoint == ("before_db_commit", n):
            # Freeze the whole site inside the transaction, offset rows locked (SIGCONT
            # resumes it): what a GC pause or a hung VM does at the worst moment.
            def freeze() -> None:
                self.failpoint = None  # once: the batch is retried after the resync
                log.warning("site %s: failpoint before_db_commit:%d: stopping", self.opts.site, n)
                # To this thread: it takes the stop itself before it returns (a process-wide
                # kill may be taken by another thread while this one commits).
                signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)
                log.warning("site %s: resumed, committing batch %d", self.opts.site, n)

        res = self.ledger.write(batch, expected, before_commit=freeze)
        if self.failpoint == ("after_db_commit", n):
            os.kill(os.getpid(), signal.SIGKILL)  # crash between the ledger commit and the rest
        return res

    def _drain(self) -> None:
        """Wait for the batch in flight and account for it (or recover from its failure)."""
        from confluent_kafka import TopicPartition

        if self.pending is None:
            return
        batch, fut = self.pending.batch, self.pending.future
        expected = self.pending.expected
        self.spent = self.pending  # freed once the next batch is handed over (_release)
        self.pending = None
        try:
            res = fut.result()
        except Fenced as e:
            # A successor advanced these partitions while we were stalled: drop the batch
            # and continue from what the ledger says (if the partitions are still ours).
            self.stats["fenced"] += 1
            log.warning("site %s: fenced on %s; re-reading positions", self.opts.site, e.stored)
            self.needs_resync = True
            return
        except psycopg.Error as e:
            # A transient error (connection lost, serialization failure, a lock or statement
            # timeout, the session ended while we were frozen): the batch did not commit, or
            # its outcome is unknown; the ledger's offsets will tell. Retried with backoff.
            self.stats["db_errors"] += 1
            self.metrics.db_error()
            self.failures += 1
            delay = min(0.25 * 2 ** self.failures, 5.0)
            self.retry_at = time.monotonic() + delay
            log.warning("site %s: ledger error, pausing %.1fs: %s", self.opts.site, delay,
                        str(e).strip())
            self.ledger.close()
            self.consumer.unassign()  # nothing fetched until the resync
            self.unknown = dict(expected)
            self.needs_resync = True
            return
        self.failures = 0
        st = self.stats
        st["batches"] += 1
        st["messages"] += batch.messages
        st["inserted"] += res.inserted
        st["duplicates"] += res.duplicates
        st["dead_letters"] += res.dead_letters
        st["late"] += res.late
        st["refused"] += res.refused
        st["close_markers"] += res.close_markers
        self.metrics.batch(batch.messages, res.inserted, res.duplicates, res.dead_letters,
                           res.seconds)
        if res.late or res.refused:
            log.warning("site %s: dead-lettered %d late trades and %d messages the ledger "
                        "refused", self.opts.site, res.late, res.refused)
        try:  # informational: lets Kafka tooling show the group's lag
            self.consumer.commit(
                offsets=[TopicPartition(self.topic, p, o) for p, o in batch.next_offsets.items()],
                asynchronous=True)
        except Exception:  # noqa: BLE001 - Kafka's view of offsets is not authoritative
            pass

    def _release(self) -> None:
        """Free the last batch written, in slices. Freeing a batch's 20,000 messages and lines
        is one C call that holds the GIL for 4 ms: where _drain returned, the writer waited
        that long for its next batch; right after the hand-over, it waited as long to start.
        Slices let the writer take the GIL between them (the switch interval)."""
        spent, self.spent = self.spent, None
        if spent is None:
            return
        for items in (spent.batch.copy_lines, spent.batch.trade_messages):
            while items:
                del items[-FREE_SLICE:]

    def _resync(self) -> bool:
        """After a ledger error, fencing or a position outside the log: read the stored
        offsets, record any retention gap, and restart every owned partition there."""
        ids = sorted(self.owned)
        try:
            self._settle_unknown()
            stored = self.ledger.claim(ids) if ids else {}
            stored.update(self._skip_gaps(stored))
        except (psycopg.Error, Fenced) as e:
            # Fenced: another site moved a gap's partition meanwhile; a rebalance follows.
            if isinstance(e, psycopg.Error):
                self.stats["db_errors"] += 1
                self.ledger.close()
            self.failures += 1
            self.retry_at = time.monotonic() + min(0.25 * 2 ** self.failures, 5.0)
            log.warning("site %s: cannot resynchronise yet: %s", self.opts.site, str(e).strip())
            return False
        self.expected = {p: stored.get(p, BEGINNING) for p in ids}
        self._fetch()
        self.needs_resync = False
        log.info("site %s: resynchronised at %s", self.opts.site, stored)
        return True

    def _fetch(self) -> None:
        """Fetch the owned partitions from their expected positions, less the stalled ones.

        The site never calls pause()/resume(): librdkafka applies them asynchronously under
        per-partition version barriers, and a resume that races the fetch start of a new
        assign() can leave a partition assigned but never fetched again, with no error
        (librdkafka issues #2190 and #5591; seen here as a site stuck on one partition after
        a PostgreSQL restart, and reproduced under CPU load: 3 of 150 pause-assign-resume
        cycles). A partition left out of the assignment is stopped at once and for sure;
        assign(), not seek(), also restarts one whose fetch stopped out of range."""
        from confluent_kafka import OFFSET_BEGINNING, TopicPartition

        self.consumer.assign([
            TopicPartition(self.topic, p, OFFSET_BEGINNING if off == BEGINNING else off)
            for p, off in sorted(self.expected.items())
            if p in self.owned and p not in self.stalled])

    def _settle_unknown(self) -> None:
        """A batch that failed with an unknown outcome was stale if another consumer has
        since stored positions on its partitions: the ledger refused it, like a fenced
        batch (in the shared scheme: a frozen site's transaction the server ended)."""
        if not self.unknown:
            return
        stored = self.ledger.positions(sorted(self.unknown))
        moved = {p: stored[p][0] for p, exp in self.unknown.items()
                 if p in stored and stored[p][0] != exp and stored[p][1] != self.opts.site}
        self.unknown = {}
        if moved:
            self.stats["fenced"] += 1
            log.warning("site %s: the failed batch was stale, offsets moved by another "
                        "consumer to %s", self.opts.site, moved)

    def _skip_gaps(self, stored: dict[int, int]) -> dict[int, int]:
        """Partitions whose stored position retention has deleted: record the data loss
        [stored, log start) in the ledger and resume from the log start (a site down longer
        than the topic's retention). Returns the new positions."""
        from confluent_kafka import KafkaException, TopicPartition

        moved: dict[int, int] = {}
        for p, off in sorted(stored.items()):
            if off == BEGINNING:
                continue  # never consumed: OFFSET_BEGINNING is the log start, whatever it is
            try:
                low, high = self.consumer.get_watermark_offsets(
                    TopicPartition(self.topic, p), timeout=10)
            except KafkaException as e:
                # Unknown now; a position outside the log comes back as a fetch error.
                log.warning("site %s: no watermarks for partition %d: %s", self.opts.site, p, e)
                continue
            if off < low:
                self.ledger.skip_gap(p, off, low)
                self.stats["data_loss_events"] += 1
                log.error("site %s: DATA LOSS on %s partition %d: offsets %d to %d were deleted "
                          "by retention before this site read them; recorded in "
                          "data_loss_events, resuming at %d", self.opts.site, self.topic, p,
                          off, low - 1, low)
                moved[p] = low
            elif off > high:
                # The log ends before our position (a recreated or truncated topic, a restored
                # ledger): not a gap we can name, and not ours to skip. This partition alone
                # is left out of the fetch (checked again at every resync) until an operator
                # repositions the site; the other partitions keep going.
                if p not in self.stalled:
                    self.stats["stalled_partitions"] += 1
                    log.error("site %s: partition %d ends at offset %d, before the stored "
                              "position %d (was the topic recreated or the ledger restored?): "
                              "partition %d paused, the others go on; see docs/operations.md "
                              "\"A partition is stalled\"", self.opts.site, p, high, off, p)
                self.stalled[p] = off
            elif p in self.stalled:
                log.warning("site %s: partition %d reaches its stored position %d again: "
                            "resumed", self.opts.site, p, off)
                del self.stalled[p]
        return moved

    def _heartbeat(self) -> None:
        try:
            self.aux.heartbeat(sorted(self.expected), self.stats["inserted"])
        except psycopg.Error:
            self.aux.close()  # the writer notices a real outage and pauses; beats just skip
            return
        self.metrics.heartbeat()

    def _update_lag(self) -> None:
        """Lag per owned partition: the high watermark librdkafka last saw (cached, no
        request) minus the position handed to the ledger. It counts Kafka's transaction
        markers too, so a caught-up transactional partition can show 1."""
        from confluent_kafka import TopicPartition

        lag: dict[int, int] = {}
        for p, off in list(self.expected.items()):
            try:
                low, high = self.consumer.get_watermark_offsets(
                    TopicPartition(self.topic, p), cached=True)
            except Exception:  # noqa: BLE001 - a metric must never stop the line
                continue
            if high < 0:
                continue  # nothing fetched from this partition yet
            start = max(low, 0) if off == BEGINNING else off
            lag[p] = max(high - start, 0)
        self.lag = lag
        self.metrics.positions(lag)

    def _prune(self) -> None:
        try:
            n = self.aux.prune_heartbeats(self.settings.heartbeat_retention_days)
        except psycopg.Error as e:
            self.aux.close()
            log.warning("site %s: heartbeat retention skipped: %s", self.opts.site,
                        str(e).strip())
            return
        if n:
            log.info("site %s: deleted %d heartbeats older than %d days", self.opts.site, n,
                     self.settings.heartbeat_retention_days)

    def _may_close(self, batch: Batch, day: str | None) -> bool:
        """Whether this poll's close markers may complete ``day``'s close: they do once every
        partition this site owns has its marker. A backlog read (a catch-up after a failover,
        a day produced before the site starts) meets its partitions' markers one poll at a
        time, and a look after each drained the pipeline each time (in 5-6 of the 16 polls of
        a 300,000-trade day on six partitions). A close completed by another consumer's
        markers, or by markers committed before a restart, is seen by the periodic look,
        within a second or two."""
        if not batch.close_markers:
            return False
        for m in batch.close_markers:
            self.marked.setdefault(m["trade_date"], set()).add(m["partition"])
        if day is None:
            return True  # the day is not known yet: look after any marker, as before
        return self.owned <= self.marked.get(day, set())

    def _closed(self, day: str | None) -> tuple[bool, str | None]:
        try:
            d, closed = self.aux.day_closed(day, self.partition_count)
        except psycopg.Error:
            self.aux.close()
            return False, day
        return closed, d

    def _partition_count(self) -> int:
        return topic_partitions(self.settings)


def _failpoint() -> tuple[str, int] | None:
    """Fault injection for crash tests. ``SETTLE_FAILPOINT=after_db_commit:N`` SIGKILLs the
    site right after its N-th batch commits in the ledger, before anything else happens;
    ``before_db_commit:N`` SIGSTOPs it with its N-th batch applied but not committed (offset
    rows locked), until someone sends SIGCONT."""
    spec = os.environ.get("SETTLE_FAILPOINT")
    if not spec:
        return None
    name, _, n = spec.partition(":")
    if name not in FAILPOINTS or not n.isdigit():
        raise ValueError(f"SETTLE_FAILPOINT: expected one of {', '.join(FAILPOINTS)} followed "
                         f"by :N, got {spec!r}")
    return name, int(n)


def run_site(settings: Settings, opts: SiteOptions) -> dict[str, Any]:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    site = Site(settings, opts)

    def on_term(signum: int, _frame: Any) -> None:
        site.stop = True  # finish the batch in hand, then leave the group and exit

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    return site.run()
