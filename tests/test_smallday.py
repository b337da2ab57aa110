"""A small day read by the driver (settlement.spark.smallday), and a Kafka day read by the
tasks' Python workers (settlement.spark.kafkaread), give the close what Spark's readers give
it: the same trades, dead letters, copies, late trades, markers, amendments and
figures, from Kafka and from a ledger, on a topic holding several days with aborted
transactions, replays, malformed and hostile messages."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession

from settlement.config import Settings
from settlement.contract import MISSING_TYPE_MEANS, TRADE_HEADERS, TYPE_HEADER
from settlement.eod.model import SourceChoice
from settlement.simulator.gateway import SimulationSpec, simulate
from settlement.spark import kafkaread, smallday
from tests.conftest import Isolated
from tests.helpers import start_site, wait_exit
from tests.spark_fixtures import spark  # noqa: F401

DAYS = [SimulationSpec("2026-06-01", 900, seed=11, dup_rate=0.05, bad_rate=0.02,
                       abort_rate=0.2, txn_size=150, cancel_rate=0.03, correct_rate=0.03),
        SimulationSpec("2026-06-02", 1200, seed=12, dup_rate=0.03, bad_rate=0.01,
                       abort_rate=0.1, txn_size=200, hostile_names=True),
        SimulationSpec("2026-06-03", 700, seed=13, cancel_rate=0.05, correct_rate=0.05)]


def test_the_type_header_is_read_as_spark_stages_it() -> None:
    kind = TYPE_HEADER
    assert kafkaread.message_type(None) == MISSING_TYPE_MEANS.encode()
    assert kafkaread.message_type([]) == MISSING_TYPE_MEANS.encode()
    assert kafkaread.message_type([("other", b"x")]) == MISSING_TYPE_MEANS.encode()
    assert kafkaread.message_type([(kind, None), (kind, b"trade")]) == b""
    assert kafkaread.message_type([("x", b"y"), (kind, b"close"), (kind, b"trade")]) == b"close"


def test_a_polls_messages_in_the_range_are_taken_in_order() -> None:
    """What a poll of one partition contributes: the messages after the offset read last and
    before the range's end (a later day's are left), whether the client returned them in
    offset order (a slice) or not (each checked against the last taken)."""
    class Msg:
        def __init__(self, offset: int) -> None:
            self._offset = offset

        def offset(self) -> int:
            return self._offset

    def taken(offsets: list[int], reached: int, end: int) -> list[int]:
        return [m.offset() for m in kafkaread._in_range([Msg(o) for o in offsets], reached, end)]

    assert taken([5, 6, 7, 9, 12, 13], 6, 13) == [7, 9, 12]
    assert taken([5, 6], 6, 13) == [] and taken([13, 14], 6, 13) == []
    assert taken([], 0, 5) == [] and taken([0], -1, 1) == [0]
    # Out of order (never seen from the client): nothing at or before the last taken twice.
    assert taken([7, 9, 8, 10, 4, 11, 14], 6, 13) == [7, 9, 10, 11]


def test_only_a_counted_small_day_is_read_by_the_driver(settings: Settings) -> None:
    from settlement.eod.model import LedgerState, PartitionStats
    from settlement.spark.io import driver_reads

    kafka = SourceChoice("kafka", "", kafka_ranges={0: (10, 1010), 1: (0, 500)})
    assert driver_reads(settings.model_copy(update={"spark_small_day_rows": 1500}), kafka)
    assert not driver_reads(settings.model_copy(update={"spark_small_day_rows": 1499}), kafka)
    assert not driver_reads(settings.model_copy(update={"spark_small_day_rows": 0}), kafka)
    assert not driver_reads(settings.model_copy(
        update={"spark_small_day_rows": 1500, "spark_small_day_driver_read": False}), kafka)
    counted = LedgerState("a", {}, {0: PartitionStats(30, 31, 31, 0, 1),
                                    1: PartitionStats(10, 11, 11, 0, 1)}, {})
    db = SourceChoice("db", "", ledgers=("a",), states={"a": counted})
    assert driver_reads(settings.model_copy(update={"spark_small_day_rows": 42}), db)
    assert not driver_reads(settings.model_copy(update={"spark_small_day_rows": 41}), db)
    # A ledger the chooser could not count is not known to be small.
    unknown = SourceChoice("db", "", ledgers=("a", "b"), states={"a": counted})
    assert not driver_reads(settings, unknown)


@pytest.fixture
def settings() -> Settings:
    from settlement.config import load_settings

    return load_settings()


def _rows(df: DataFrame | None) -> list[tuple[Any, ...]]:
    return sorted((tuple(r) for r in df.collect()), key=repr) if df is not None else []


def _facts(read: Any) -> dict[str, Any]:
    """Everything a read hands the settlement and validation, comparable."""
    return {
        "trades": _rows(read.trades), "as_read": _rows(read.as_read),
        "malformed": read.malformed, "closes": read.close_markers,
        "late": read.late, "duplicates": read.duplicates,
        "per_partition": read.per_partition, "figures": sorted(read.figures or []),
        "other_dates": read.other_dates, "amendments": _rows(read.amendments()),
        "amendment_figures": sorted(read.amendment_figures or []),
        "deduplicated": read.deduplicated, "unique_ids": read.unique_ids,
        "ledgers": {k: _rows(v) for k, v in read.ledgers.items()},
    }


@pytest.fixture
def published(isolated: Isolated, spark: SparkSession) -> Iterator[Isolated]:  # noqa: F811
    """Three days on one topic, and between them what production also sees: a trade of the
    first day after its close (late), a tombstone, messages without a type header, of an
    unknown type, with a null type header and with two."""
    from confluent_kafka import Producer

    from settlement.simulator.gateway import producer_config

    s = isolated.settings
    simulate(s, DAYS[0])
    producer = Producer(producer_config(s, None))
    late = {"trade_id": "late-1", "trade_date": DAYS[0].trade_date, "seq": 10**6,
            "symbol": "XAU", "price": "10.5", "quantity": 3, "buyer": "A", "seller": "B",
            "executed_at": f"{DAYS[0].trade_date}T23:59:00Z"}
    producer.produce(s.topic, json.dumps(late).encode(), b"XAU", partition=0,
                     headers=TRADE_HEADERS)
    producer.produce(s.topic, None, b"XAU", partition=1, headers=TRADE_HEADERS)
    producer.produce(s.topic, b'{"trade_id": "x"}', b"XAU", partition=2)
    producer.produce(s.topic, b"{}", b"XAU", partition=3, headers=[(TYPE_HEADER, b"bogus")])
    # A null type header, and two of them (the first counts).
    producer.produce(s.topic, json.dumps({**late, "trade_id": "null-type"}).encode(), b"XAU",
                     partition=4, headers=[(TYPE_HEADER, None)])
    producer.produce(s.topic, json.dumps({**late, "trade_id": "two-types"}).encode(), b"XAU",
                     partition=5, headers=[("x", b"1"), (TYPE_HEADER, b"close"),
                                           (TYPE_HEADER, b"trade")])
    assert producer.flush(30) == 0
    for spec in DAYS[1:]:
        simulate(s, spec)
    yield isolated


@pytest.mark.services
def test_a_kafka_day_read_by_the_driver_is_the_spark_read(
        published: Isolated, spark: SparkSession, tmp_path: Path,  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    from settlement.eod.sources import choose_source
    from settlement.spark.io import read_day

    s = published.settings
    workers = s.model_copy(update={"spark_jvm_classifier": False})
    by_source = workers.model_copy(update={"spark_kafka_worker_read": False})
    assert s.spark_kafka_worker_read and s.spark_master.startswith("local")
    assert s.spark_jvm_classifier
    seen: dict[str, int] = {"malformed": 0, "duplicates": 0, "late": 0, "amendments": 0}
    jvm_modes: set[str] = set()
    for spec in DAYS:
        choice = choose_source(s, spec.trade_date, "kafka")
        assert choice.source == "kafka", choice.reason
        by_driver = read_day(spark, s, choice, spec.trade_date, driver_read=True)
        by_workers = read_day(spark, workers, choice, spec.trade_date, driver_read=False)
        by_spark = read_day(spark, by_source, choice, spec.trade_date, driver_read=False)
        by_jvm = read_day(spark, s, choice, spec.trade_date, driver_read=False)
        assert (by_driver.read_by, by_workers.read_by, by_spark.read_by) == (
            "driver", "workers", "spark")
        # The JVM classifier (settlement.spark.jvmclassify) read it, leaving to the workers
        # the partitions holding amendments or hostile values.
        assert by_jvm.read_by.startswith("jvm"), by_jvm.read_by
        jvm_modes.add("jvm" if by_jvm.read_by == "jvm" else "mixed")
        if spec is DAYS[0]:  # a day too large in bytes for the driver goes to the workers
            monkeypatch.setattr(smallday, "MAX_READ_BYTES", 1000)
            fallback = read_day(spark, workers, choice, spec.trade_date,
                                    driver_read=True)
            monkeypatch.undo()
            fallback.release()
            assert fallback.read_by == "workers"
        try:
            got, want = _facts(by_driver), _facts(by_spark)
            assert got == want, spec.trade_date
            assert _facts(by_workers) == want, spec.trade_date
            assert _facts(by_jvm) == want, spec.trade_date
        finally:
            by_driver.release()
            by_workers.release()
            by_jvm.release()
            by_spark.release()
        assert len(got["trades"]) == spec.trades
        seen["malformed"] += got["malformed"]
        seen["duplicates"] += got["duplicates"]
        seen["late"] += sum(n for parts in got["late"].values() for n in parts.values())
        seen["amendments"] += len(got["amendments"])
    # Not a parity of empty sets: the days held every kind of message compared.
    assert all(n > 0 for n in seen.values()), seen
    assert "mixed" in jvm_modes, jvm_modes  # the JVM's fallback to the workers was taken

    # The ledger a site wrote, read both ways.
    out = wait_exit(start_site("a", "separate", published.env, DAYS[-1].trade_date,
                               tmp_path / "a.log"), tmp_path / "a.log")
    assert out["closed"]
    for spec in DAYS:
        choice = choose_source(s, spec.trade_date, "db")
        by_driver = read_day(spark, s, choice, spec.trade_date, driver_read=True)
        by_spark = read_day(spark, s, choice, spec.trade_date, driver_read=False)
        got, want = _facts(by_driver), _facts(by_spark)
        assert got == want, spec.trade_date
        assert len(got["trades"]) == spec.trades and got["ledgers"]["a"]


@pytest.mark.services
def test_a_range_that_cannot_be_read_whole_is_an_error(
        isolated: Isolated, spark: SparkSession,  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A range ending past what Kafka holds (a truncated or mislocated day) is not settled
    short: the read names the partition and how far it got."""
    from confluent_kafka import Producer, TopicPartition

    from settlement.kafka.admin import admin_client
    from settlement.simulator.gateway import producer_config
    from settlement.spark.io import jvm_classifies, read_kafka

    s = isolated.settings
    producer = Producer(producer_config(s, None))
    for seq in (1, 2, 3):
        producer.produce(s.topic, json.dumps({"seq": seq}).encode(), b"XAU", partition=0,
                         headers=TRADE_HEADERS)
    assert producer.flush(30) == 0
    got = smallday.fetch_ranges(s, {0: (0, 3)}, timeout=10)
    assert got[0].num_rows == 3 and got[0].column("kafka_offset").to_pylist() == [0, 1, 2]
    with pytest.raises(kafkaread.KafkaReadError, match=r"partition 0 at offset 3 of \[0, 10\)"):
        smallday.fetch_ranges(s, {0: (0, 10)}, timeout=2)
    # The same read by a task's Python worker, and by the JVM classifier's task: the close
    # gets the task's error, in its words.
    monkeypatch.setattr(kafkaread, "IDLE_TIMEOUT", 2.0)
    past_end = SourceChoice("kafka", "", kafka_ranges={0: (0, 10)})
    readers = [s.model_copy(update={"spark_jvm_classifier": False}), s]
    assert jvm_classifies(spark, s)
    for reader in readers:
        with pytest.raises(kafkaread.KafkaReadError,
                           match=r"^the day's range was not read whole: no message for 2 s at "
                                 r"partition 0 at offset 3 of \[0, 10\)$"):
            read_kafka(spark, reader, past_end, "2026-06-01")
    # Few offsets but more bytes than a driver read holds: Spark's tasks read the day.
    size = sum(len(v) for v in got[0].column("value").to_pylist())
    assert smallday.fetch_ranges(s, {0: (0, 3)}, timeout=10, max_bytes=size)[0].num_rows == 3
    with pytest.raises(kafkaread.TooLarge):
        smallday.fetch_ranges(s, {0: (0, 3)}, timeout=10, max_bytes=size - 1)
    # Retention deleted the range's start since the day was located: an error at once, not
    # a read that jumps to the log's end and waits out its deadline.
    admin = admin_client(s)
    for fut in admin.delete_records([TopicPartition(s.topic, 0, 2)],
                                    request_timeout=30).values():
        fut.result()
    t0 = time.monotonic()
    with pytest.raises(kafkaread.KafkaReadError, match="refused the day's read"):
        smallday.fetch_ranges(s, {0: (0, 3)}, timeout=60)
    assert time.monotonic() - t0 < 30
    for reader in readers:
        with pytest.raises(kafkaread.KafkaReadError, match="refused the day's read"):
            read_kafka(spark, reader, SourceChoice("kafka", "", kafka_ranges={0: (0, 3)}),
                       "2026-06-01")
