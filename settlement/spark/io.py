"""Reading a trade date into Spark: from Kafka (a bounded offset range) or the ledger(s).

What the source chooser decided (``SourceChoice``) is all a read needs: the Kafka offset
ranges, or the ledgers to read and their states. Nothing here asks the chooser's questions
again.
"""

from __future__ import annotations

import datetime as dt
import json
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import psycopg
from pyspark.errors import PythonException
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F

from settlement.config import Settings, jaas_login
from settlement.contract import AMENDMENT_COLUMNS, LEDGER_COLUMNS
from settlement.db import LIBPQ_TIMEOUTS, connect, dsn_password
from settlement.eod.model import SourceChoice
from settlement.spark import jvmclassify, kafkaread, smallday
from settlement.spark import parse as P
from settlement.spark import transforms as T
from settlement.spark.deferred import Picked, resolve_deferred
from settlement.spark.figures import SymbolSums
from settlement.spark.readfacts import (
    Counted,
    KafkaFacts,
    count_rows,
    decided_rows,
    facts_of,
    pass_facts,
)
from settlement.spark.schemas import AMENDMENT_SCHEMA
from settlement.spark.session import as_collected, is_small_day, local_frame, persist_sized
from settlement.threads import in_thread

# A cached verdict of a plain trade, uncompressed: 288 MiB for the 2M day's 2,000,006 rows
# (measured with Spark's storage info, row hashes included), rounded up.
VERDICT_ROW_BYTES = 160
# A staged message (the native path's cached read): a gateway trade's ~220-byte value, its
# partition, offset and type header.
STAGED_ROW_BYTES = 280
# A ledger's trade, cached uncompressed: its 36-character id, symbol and accounts, decimal
# price and five numbers (TRADE_SCHEMA), rounded up.
LEDGER_ROW_BYTES = 200


# The slices a ledger's day is read in (``read_ledger``): one a core of the project's machine.
LEDGER_SLICES = 2


def jdbc_options(dsn: str) -> tuple[str, dict[str, str]]:
    """A libpq URL as a JDBC URL and connection properties (the driver needs TCP)."""
    info = psycopg.conninfo.conninfo_to_dict(dsn)
    host = str(info.get("host") or "127.0.0.1")
    if host.startswith("/"):
        raise ValueError(f"the JDBC driver needs a TCP host, not the socket {host}")
    # Several servers (a cluster's members: libpq's host and port lists) become pgjdbc's
    # host:port list, and libpq's read-write session its primary: the job follows a failover.
    hosts = host.split(",")
    ports = str(info.get("port") or 5432).split(",")
    if len(ports) == 1:
        ports = ports * len(hosts)
    if len(ports) != len(hosts):
        raise ValueError(f"{len(hosts)} hosts but {len(ports)} ports in the DSN")
    servers = ",".join(f"{h}:{p or 5432}" for h, p in zip(hosts, ports, strict=True))
    url = f"jdbc:postgresql://{servers}/{info['dbname']}"
    props = {"user": str(info.get("user") or ""), "driver": "org.postgresql.Driver"}
    if info.get("target_session_attrs") in ("read-write", "primary"):
        props["targetServerType"] = "primary"
    password = dsn_password(dsn)  # the DSN's own, or its pgpass file's (embedded server)
    if password:
        props["password"] = password
    # Failure detection as for every libpq connection (settlement.db.LIBPQ_TIMEOUTS): a
    # silent member costs connectTimeout before the next is tried; keepalives find a
    # vanished server under an idle read. (pgjdbc has no tcp_user_timeout.)
    props["connectTimeout"] = str(info.get("connect_timeout")
                                  or LIBPQ_TIMEOUTS["connect_timeout"])
    props["tcpKeepAlive"] = "true"
    # TLS as libpq was told (the deployment's verify-full against its CA): pgjdbc takes the
    # same names and the same PEM files.
    for key in ("sslmode", "sslrootcert", "sslcert", "sslkey"):
        if info.get(key):
            props[key] = str(info[key])
    return url, props


def kafka_options(settings: Settings) -> dict[str, str]:
    opts = {"kafka.bootstrap.servers": settings.bootstrap(),
            "kafka.security.protocol": settings.kafka_protocol}
    if settings.kafka_protocol.startswith("SASL"):
        user, password = settings.sasl_login()
        opts["kafka.sasl.mechanism"] = settings.kafka_sasl_mechanism
        opts["kafka.sasl.jaas.config"] = jaas_login(settings.kafka_sasl_mechanism, user,
                                                    password)
    if settings.kafka_ssl_ca_location:
        opts["kafka.ssl.truststore.type"] = "PEM"
        opts["kafka.ssl.truststore.location"] = settings.kafka_ssl_ca_location
    return opts


@dataclass
class DayRead:
    """One read of a trade date: its trades as read (TRADE_SCHEMA, the date's only, not yet
    deduplicated), what else the read learnt, and the frames to release afterwards."""

    trades: DataFrame
    malformed: int
    close_markers: dict[int, int]  # partition -> last_seq
    # Every trade the read returned, of any date, before any dedupe: what validation checks
    # the date filter and the dedupe against (the same frame as ``trades`` for a ledger,
    # which is read by date).
    as_read: DataFrame
    cached: list[DataFrame] = field(default_factory=list)
    # trade_id is already unique (one ledger: a unique constraint), so no dedupe pass.
    unique_ids: bool = False
    # Kafka: ``trades`` holds each trade's first copy only (the classifier dropped the later
    # copies in the same partition, ``duplicates`` of them); ``as_read`` holds them all.
    deduplicated: bool = False
    duplicates: int = 0
    # partition -> trades in ``trades``, when the read counted them already (Kafka).
    per_partition: dict[int, int] | None = None
    # ledger name -> its day's trades, when the day was read from ledgers (validation
    # reconciles them without reading them again).
    ledgers: dict[str, DataFrame] = field(default_factory=dict)
    # Kafka: trades of earlier dates found in the day's range, i.e. late trades of those days
    # (they came after their day's close marker): earlier date -> partition -> count. The
    # sites dead-letter the same messages as late; the report shows them either way.
    late: dict[str, dict[int, int]] = field(default_factory=dict)
    # Kafka: the day's figures per bucket (FIGURES_SCHEMA rows, validation's checksums),
    # taken in the pass that counted the read.
    figures: list[tuple[int, ...]] | None = None
    # The day's trades per instrument (``figures.SymbolSums``), when a pass took them already
    # (the Kafka read's counting pass, the ledger read's cache-filling one).
    symbol_sums: SymbolSums | None = None
    # Kafka: every later copy of a trade in its partition was compared with the first and
    # kept only when equal (a differing one is a dead letter), so copies can only disagree
    # across partitions; and how many valid trades of other dates the range held.
    copies_agree: bool = False
    other_dates: int = 0
    # The day's accepted cancels and corrections (AMENDMENT_SCHEMA, each once, as a collect
    # gives them: ``session.as_collected``), which the settlement applies to ``trades``;
    # None when there are none. Kafka: their figures per bucket (seq coverage).
    amendment_rows: list[Row] | None = None
    amendment_figures: list[tuple[int, ...]] | None = None
    # Who read the day: "spark" (its Kafka or JDBC reader), "driver" (a small day,
    # settlement.spark.smallday) or "workers" (a Kafka day read by the tasks' Python
    # workers, settlement.spark.kafkaread).
    read_by: str = "spark"
    # The day's trades its amendments name, when the read picked them out already (the JVM
    # read's, while the driver decided its deferred messages).
    amended: Picked | None = None
    _amendments: DataFrame | None = field(default=None, repr=False, compare=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def amendments(self) -> DataFrame | None:
        """``amendment_rows`` as a frame (validation's queries), built on first use: the
        settlement takes the rows, so nothing waits for the frame before the netting."""
        if self.amendment_rows is None:
            return None
        with self._lock:
            if self._amendments is None:
                self._amendments = local_frame(self.trades.sparkSession, self.amendment_rows,
                                               AMENDMENT_SCHEMA)
            return self._amendments

    def release(self) -> None:
        for df in self.cached:
            df.unpersist()


def read_day(spark: SparkSession, settings: Settings, choice: SourceChoice, trade_date: str,
             driver_read: bool | None = None) -> DayRead:
    """The day from the source the chooser picked. ``driver_read``: the day read by the
    driver (settlement.spark.smallday) or by Spark's readers; None: by the driver when the
    day is small and ``spark_small_day_driver_read`` is on."""
    if driver_read is None:
        driver_read = driver_reads(settings, choice)
    if choice.source == "kafka":
        return read_kafka(spark, settings, choice, trade_date, driver_read)
    return read_db(spark, settings, choice, choice.ledgers, trade_date, driver_read)


def jvm_classifies(spark: SparkSession, settings: Settings) -> bool:
    """Whether a Kafka day that is not the driver's is read and classified in the JVM
    (settlement.spark.jvmclassify): where the workers would read it (a local master: the
    tasks read with the client's settings, whose files a cluster's executors may not
    reach), the switch on, and the classifier's jar in the session (``make setup``)."""
    return (settings.spark_jvm_classifier and worker_reads(settings)
            and jvmclassify.loaded(spark._jvm))


def worker_reads(settings: Settings) -> bool:
    """Whether a Kafka day that is not the driver's is read by the tasks' Python workers
    (settlement.spark.kafkaread): the switch on, a local master, the native classifier off
    (it classifies what Spark's source fetched)."""
    return (settings.spark_kafka_worker_read and settings.spark_master.startswith("local")
            and not settings.native_trades)


def driver_reads(settings: Settings, choice: SourceChoice) -> bool:
    """Whether the driver reads the day itself: a small day, the switch on."""
    # A ledger the chooser could not count is not known to be small.
    counted = choice.source == "kafka" or all(n in choice.states for n in choice.ledgers)
    return (settings.spark_small_day_driver_read and counted
            and is_small_day(settings, choice.day_rows()))


def _on_date(df: DataFrame, trade_date: str) -> DataFrame:
    return df.where(F.col("trade_date") == F.lit(trade_date).cast("date"))


def read_kafka(spark: SparkSession, settings: Settings, choice: SourceChoice, trade_date: str,
               driver_read: bool = False) -> DayRead:
    """The day's bounded offset range, read_committed: by Spark's Kafka source, or with
    ``driver_read`` by the driver (a small day)."""
    if driver_read:
        try:
            return _kafka_read(spark, smallday.kafka_day(spark, settings, choice.kafka_ranges),
                               [], trade_date, "driver")
        except kafkaread.TooLarge:
            pass  # few messages but large ones: Spark's tasks stream them instead
    # Parsed and checked once; everything below reads the cached verdicts (uncompressed when
    # the range fits the storage memory comfortably: every offset is at most one row).
    offsets = sum(end - start for start, end in choice.kafka_ranges.values())
    if jvm_classifies(spark, settings):
        return _jvm_read(spark, settings, choice.kafka_ranges, trade_date, offsets)
    if worker_reads(settings):
        return _workers_read(spark, settings, choice.kafka_ranges, trade_date, offsets)
    raw = kafka_source(spark, settings, choice.kafka_ranges)
    staged: list[DataFrame] = []  # the read itself (native path), cached with the verdicts

    def keep(df: DataFrame) -> DataFrame:
        staged.append(persist_sized(spark, df, offsets, STAGED_ROW_BYTES))
        return staged[-1]

    classified = persist_sized(
        spark, P.classify_kafka_values(raw, settings.max_message_bytes,
                                       native=settings.native_trades, cache=keep),
        offsets, VERDICT_ROW_BYTES)
    return _kafka_read(spark, classified, staged, trade_date)


def _workers_read(spark: SparkSession, settings: Settings,
                  ranges: dict[int, tuple[int, int]], trade_date: str, offsets: int) -> DayRead:
    """The ranges read and classified by the tasks' Python workers (settlement.spark.kafkaread)."""
    classified = persist_sized(spark, P.classify_kafka_ranges(
        spark, settings.kafka_client_config(), settings.topic, ranges,
        settings.max_message_bytes), offsets, VERDICT_ROW_BYTES)
    with _worker_errors():  # the first pass over the verdicts is where the workers read
        return _kafka_read(spark, classified, [], trade_date, "workers")


@contextmanager
def _worker_errors() -> Iterator[None]:
    """A Python worker's KafkaReadError raised in the driver with its own words."""
    try:
        yield
    except PythonException as e:
        error = kafkaread.worker_error(str(e))
        if error is None:
            raise
        raise error from None


def _jvm_read(spark: SparkSession, settings: Settings, ranges: dict[int, tuple[int, int]],
              trade_date: str, offsets: int) -> DayRead:
    """The ranges read with the Java client and classified in the JVM
    (settlement.spark.jvmclassify), one task per partition. The messages the JVM defers (an
    amendment, an unusual value) are decided by the Python classifier in the driver; a
    partition it gives back is read again and classified by the Python workers, alone."""
    consumer = {k.removeprefix("kafka."): v for k, v in kafka_options(settings).items()
                if k.startswith("kafka.")}
    verdicts = persist_sized(spark, jvmclassify.classify_jvm_ranges(
        spark, consumer, settings.topic, ranges, settings.max_message_bytes,
        kafkaread.IDLE_TIMEOUT), offsets, VERDICT_ROW_BYTES)
    cached = [verdicts]

    def python(parts: list[int]) -> DataFrame:
        some = {p: ranges[p] for p in parts}
        rows = P.classify_kafka_ranges(spark, settings.kafka_client_config(), settings.topic,
                                       some, settings.max_message_bytes)
        cached.append(persist_sized(spark, rows, sum(e - s for s, e in some.values()),
                                    VERDICT_ROW_BYTES))
        return cached[-1]

    day = dt.date.fromisoformat(trade_date)
    counting: list[Future[list[Counted]]] = []

    def count_beside(standing: DataFrame) -> None:
        # The JVM's standing rows counted while the driver decides the deferred ones (2.5-4.3 s
        # of the driver's Python on a realistic 2M-trade day, the JVM idle but for the pick):
        # the count ran after it, 6.7-8.7 s (docs/benchmarks-history.md, 2026-12-01).
        counting.append(in_thread("count-read", lambda: count_rows(standing, day)))

    try:  # its first pass is where Kafka is read
        resolved = resolve_deferred(verdicts, settings.max_message_bytes, python, trade_date,
                                    count_beside)
    except Exception as e:  # a Py4J or Spark error carrying the Java KafkaReadError
        error = kafkaread.worker_error(str(e))
        if error is None:
            raise
        raise error from None
    # The decided rows counted here (a few thousand, in Python), merged with the JVM's count;
    # None when the JVM's count is of no use (a partition given back) or cannot be merged.
    decided = (decided_rows(resolved.decided, day)
               if counting and resolved.decided is not None else None)

    def merged() -> KafkaFacts:
        return facts_of([*counting[0].result(), *(decided or [])], day)

    with _worker_errors():
        return _kafka_read(spark, resolved.rows, cached, trade_date, resolved.read_by,
                           resolved.amendments, resolved.picked,
                           merged if decided is not None else None)


def kafka_source(spark: SparkSession, settings: Settings,
                 ranges: dict[int, tuple[int, int]]) -> DataFrame:
    """The offset ranges by Spark's Kafka source, read_committed, one task per partition."""
    topic = settings.topic
    starts = {topic: {str(p): s for p, (s, _) in ranges.items()}}
    ends = {topic: {str(p): e for p, (_, e) in ranges.items()}}
    return (
        spark.read.format("kafka")
        .options(**kafka_options(settings))
        .option("assign", json.dumps({topic: sorted(ranges)}))
        .option("startingOffsets", json.dumps(starts))
        .option("endingOffsets", json.dumps(ends))
        .option("kafka.isolation.level", "read_committed")
        .option("includeHeaders", "true")
        # Offsets of aborted records and transaction markers are never returned under
        # read_committed; Spark would call those gaps data loss. Real loss cannot hide: the
        # exchange sequence numbers are checked against the close markers afterwards.
        .option("failOnDataLoss", "false")
        # The range is committed and on the brokers: a fetch that finds nothing is one at a
        # range's end (where only transaction markers are left), and the broker's default
        # 500 ms wait for more data there was 1.5 s of a small day's 2 s Kafka read (3
        # waves of 2 tasks; docs/benchmarks.md). A fetch with data returns at once either way.
        .option("kafka.fetch.max.wait.ms", "10")
        # No minPartitions/maxRecordsPerPartition: one task reads one Kafka partition, in
        # offset order, which is what lets the classifier dedupe without a shuffle.
        .load()
    )


def _kafka_read(spark: SparkSession, classified: DataFrame, staged: list[DataFrame],
                trade_date: str, read_by: str = "spark",
                amendment_rows: list[tuple[Any, ...]] | None = None,
                picked: Picked | None = None,
                counted: Callable[[], KafkaFacts] | None = None) -> DayRead:
    """What a Kafka read hands the settlement, from its classified messages.
    ``amendment_rows``: the accepted amendments of every date when the read holds them
    already (AMENDMENT_SCHEMA rows: the JVM read's, decided in the driver). ``counted``: the
    read's facts when a pass is counting them already (waits for it); None: counted here."""
    day = dt.date.fromisoformat(trade_date)
    parsed = P.split_classified(classified)
    # The day's cancels and corrections are few: held by the driver (the settlement,
    # validation and the report each read them); None when there are none (nothing scans
    # the day for them, nothing applies them).
    held = None if amendment_rows is None else [r for r in amendment_rows if r[1] == day]
    amendments = as_collected(held, AMENDMENT_SCHEMA) if held else None
    facts = counted() if counted is not None else pass_facts(classified, day)
    if held is None and facts.amendment_figures:  # the counting pass found some
        amendments = _on_date(parsed.amendments, trade_date).collect()
    return DayRead(
        _on_date(P.first_copies(classified), trade_date), facts.malformed, facts.closes,
        parsed.trades, cached=[classified, *staged], late=facts.late, deduplicated=True,
        duplicates=facts.duplicates, per_partition=facts.per_partition,
        figures=facts.figures, symbol_sums=facts.symbol_sums, copies_agree=True,
        other_dates=facts.other_dates,
        amendment_rows=amendments, amendment_figures=facts.amendment_figures, read_by=read_by,
        amended=picked)


def read_ledger(spark: SparkSession, settings: Settings, ledger: str, trade_date: str,
                where: str | None = None) -> DataFrame:
    """One ledger's day over JDBC, in parallel slices by the exchange sequence number's
    remainder. ``where``: a further SQL condition built by the caller from integers
    (validation's bucket drill-down)."""
    url, props = jdbc_options(settings.ledger_dsn(ledger))
    # JDBC's dbtable takes no bind parameters: the date goes in as a re-rendered date.
    day = dt.date.fromisoformat(trade_date)
    more = f" and ({where})" if where else ""
    # The date is the query's, so it is not fetched: Spark adds it. The execution time comes
    # as microseconds since the epoch (exact: PostgreSQL's epoch is numeric): pgjdbc parses
    # a date or a timestamptz from its text per row: both cost a 2M-trade day's read 1.0 s
    # of its 6.0 s (warm, four slices).
    fetched = ", ".join("(extract(epoch from executed_at) * 1000000)::bigint as executed_us"
                        if c == "executed_at" else c
                        for c in LEDGER_COLUMNS if c != "trade_date")
    query = (f"(select {fetched} from trades "
             f"where trade_date = date '{day.isoformat()}'{more}) day")
    # Two slices, one a core: each slice's query scans the day's partition in PostgreSQL
    # (no index serves a seq range), on the cores Spark decodes on; four took 6.0-6.8 s
    # against two's 4.9-5.0 s for a 2M-trade day. Sliced by the seq's remainder, not by
    # ranges of it: each Kafka partition counts its own seqs from 1, so the lower half of
    # the highest seq held 70% of the 2M-trade day's trades (its partitions are of unequal
    # sizes, as a day's are), and the larger slice set the pace of the read and of every
    # pass over the cached day after it. (seq is NOT NULL: every trade is in one slice.)
    df = spark.read.jdbc(
        url, query, predicates=[f"seq % {LEDGER_SLICES} = {i}" for i in range(LEDGER_SLICES)],
        properties={**props, "fetchsize": "20000"},
    )
    return T.conform_trades(df.withColumn("trade_date", F.lit(day))
                            .withColumn("executed_at", F.timestamp_micros("executed_us")))


def amendment_rows(settings: Settings, ledger: str, trade_date: str) -> list[tuple[Any, ...]]:
    """One ledger's cancels and corrections of the day (AMENDMENT_SCHEMA's columns): few, so
    one query of the driver, handed to Spark in memory (Spark's JDBC reader cost a schema
    query and a Spark job: a 200,000-trade close's read step took 0.9-1.1 s with it, 0.5 s
    without)."""
    with connect(settings.ledger_dsn(ledger)) as conn:
        return conn.execute(f"select {', '.join(AMENDMENT_COLUMNS)} from trade_amendments "
                            "where trade_date = %s", (dt.date.fromisoformat(trade_date),)
                            ).fetchall()


def ledger_amendments(spark: SparkSession, settings: Settings, choice: SourceChoice,
                      ledgers: tuple[str, ...], trade_date: str
                      ) -> list[tuple[Any, ...]] | None:
    """The ledgers' cancels and corrections of the day (a union deduplicated), few: their
    rows (AMENDMENT_SCHEMA's columns), to be handed to Spark once as a local frame. None when
    the chooser counted none in any of them and each was complete then (its day no longer
    changes); a ledger it could not count, or that was still filling, is read."""
    states = [choice.states.get(n) for n in ledgers]
    if ledgers and all(st is not None and st.amendments == 0
                       and st.complete(choice.partitions or settings.partitions)
                       for st in states):
        return None
    rows = [amendment_rows(settings, n, trade_date) for n in ledgers]
    if len(rows) == 1:
        return rows[0]
    union = local_frame(spark, rows[0], AMENDMENT_SCHEMA)
    for more in rows[1:]:
        union = union.unionByName(local_frame(spark, more, AMENDMENT_SCHEMA))
    return [tuple(r) for r in T.dedupe_amendments(union).collect()]


def read_db(spark: SparkSession, settings: Settings, choice: SourceChoice,
            ledgers: tuple[str, ...], trade_date: str, driver_read: bool = False) -> DayRead:
    """The ledger(s); a union of two when no single ledger is complete. ``driver_read``: each
    ledger's day by one query of the driver (a small day), not by Spark's JDBC reader."""
    frames = {name: (smallday.ledger_day(spark, settings, name, trade_date) if driver_read
                     else read_ledger(spark, settings, name, trade_date))
              for name in ledgers}
    held = ledger_amendments(spark, settings, choice, ledgers, trade_date)
    amendments = None if held is None else as_collected(held, AMENDMENT_SCHEMA)
    picked = (ledger_amended(settings, choice, ledgers[0], trade_date, held)
              if len(ledgers) == 1 and held else None)
    closes: dict[int, int] = {}
    for name in ledgers:
        st = choice.states.get(name)
        for p, m in (st.markers if st else {}).items():
            closes[p] = max(closes.get(p, 0), m.last_seq)
    parts = list(frames.values())
    out = parts[0]
    for other in parts[1:]:
        out = out.unionByName(other)
    by = "driver" if driver_read else "spark"
    if len(parts) > 1:  # only a union can hold a trade twice; dedupe then reads it twice
        out = out.persist()
        return DayRead(out, 0, closes, out, cached=[out], unique_ids=False, ledgers=frames,
                       amendment_rows=amendments, read_by=by)
    # Cached for the settlement (``dedupe_day`` fills it), uncompressed when it fits, as a
    # Kafka read's verdicts are (``persist_sized``).
    out = persist_sized(spark, out, choice.day_rows(), LEDGER_ROW_BYTES)
    return DayRead(out, 0, closes, out, unique_ids=True, ledgers=frames,
                   amendment_rows=amendments, read_by=by, amended=picked)


def ledger_amended(settings: Settings, choice: SourceChoice, ledger: str, trade_date: str,
                   amendments: list[tuple[Any, ...]]) -> Picked | None:
    """The day's trades its amendments name, as the ledger holds them: one query of the
    driver (the primary key's index, one probe a trade), instead of a pass over the day in
    Spark beside the netting (1.7-2.4 s of validation's thread on a realistic 2M-trade day).
    Only from a ledger the chooser found complete: its day no longer changes (late trades and
    amendments are dead letters), so this query sees the rows the day's read saw, as the
    amendments' own query (``amendment_rows``) does. None otherwise: the day is scanned."""
    st = choice.states.get(ledger)
    if st is None or not st.complete(choice.partitions or settings.partitions):
        return None
    at = AMENDMENT_COLUMNS.index("trade_id")
    ids = sorted({r[at] for r in amendments if r[at] is not None})
    with connect(settings.ledger_dsn(ledger)) as conn:
        rows = conn.execute(
            "select trade_id, kafka_partition, kafka_offset, trade_date, price, quantity, "
            "symbol from trades where trade_date = %s and trade_id = any(%s)",
            (dt.date.fromisoformat(trade_date), ids)).fetchall()
    done: Future[list[tuple[Any, ...]]] = Future()
    done.set_result([tuple(r) for r in rows])
    return Picked(frozenset(ids), done)
