"""End-of-day settlement on real Kafka, PostgreSQL and Spark."""

from __future__ import annotations

import json
from collections import defaultdict
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from settlement.close.pipeline import run_eod
from settlement.db import connect
from settlement.eod.sources import NoSource, choose_source
from settlement.simulator.gateway import SimulationSpec, simulate
from tests.conftest import Isolated
from tests.helpers import POSITIONS, published_positions, reference_positions, start_site, wait_exit

pytestmark = pytest.mark.services
DATE = "2026-11-25"
SPEC = SimulationSpec(DATE, 4000, seed=5, dup_rate=0.02, bad_rate=0.005, abort_rate=0.3,
                      txn_size=500)


@pytest.fixture
def settled_day(isolated: Isolated, tmp_path: Path) -> Isolated:
    """A faulty day published and ingested by site A (separate scheme)."""
    simulate(isolated.settings, SPEC)
    out = wait_exit(start_site("a", "separate", isolated.env, DATE, tmp_path / "a.log"),
                    tmp_path / "a.log")
    assert out["closed"]
    return isolated


def _table(dsn: str, sql: str) -> list[tuple[Any, ...]]:
    with connect(dsn) as conn:
        return conn.execute(sql, (DATE,)).fetchall()


def test_kafka_and_database_sources_agree_with_plain_python(settled_day: Isolated) -> None:
    s = settled_day.settings
    kafka = run_eod(s, DATE, source="auto")
    assert kafka["source"] == "kafka", kafka["source_reason"]
    assert "close markers confirmed on all 6 partitions" in kafka["source_reason"]
    assert kafka["trades"] == SPEC.trades
    assert kafka["malformed"] > 0 and kafka["duplicates_removed"] > 0
    from_kafka = _table(s.settlement_dsn, POSITIONS)

    db = run_eod(s, DATE, source="db")
    assert db["source"] == "db" and db["ledgers"] == ["a"]
    assert "ledger 'a' is complete" in db["source_reason"]
    from_db = _table(s.settlement_dsn, POSITIONS)
    assert from_db == from_kafka
    assert db["netting_efficiency"] == kafka["netting_efficiency"]

    got = {(r[0], r[1]): tuple(r[2:]) for r in from_db}
    assert got == reference_positions(SPEC)
    # Invariants: every instrument's quantity and all cash net to zero.
    per_symbol: dict[str, int] = defaultdict(int)
    for (_, sym), v in got.items():
        per_symbol[sym] += v[2]
    assert set(per_symbol.values()) == {0}
    assert sum(v[5] for v in got.values()) == 0
    assert all(isinstance(v[3], Decimal) for v in got.values())


def test_a_ledger_altered_after_ingest_is_found_by_its_checksums(settled_day: Isolated
                                                                   ) -> None:
    """Kafka-sourced: the ledger is compared by bucket checksums taken in PostgreSQL, and the
    one bucket whose figures differ is read and compared trade by trade, naming the trade
    (here only its execution time moved by a microsecond)."""
    s = settled_day.settings
    good = run_eod(s, DATE, source="kafka")
    figures = good["validation"]["figures"]["reconcile_kafka_ledger"]
    assert good["validation_success"], good["validation"]["failures"]
    # Spark's figures of the Kafka day and PostgreSQL's of the ledger agree on every bucket.
    assert figures["buckets"] == 6 and figures["differing"] == 0, figures
    with connect(s.ledger_dsn("a")) as conn:
        altered, partition = conn.execute(
            "update trades set executed_at = executed_at + interval '1 microsecond'"
            " where trade_id = (select min(trade_id) from trades where trade_date = %s)"
            " returning trade_id, kafka_partition", (DATE,)).fetchone()
        conn.commit()
    bad = run_eod(s, DATE, source="kafka")
    figures = bad["validation"]["figures"]["reconcile_kafka_ledger"]
    assert figures["differing"] == 1 and figures["named"] == [[partition, 0]], figures
    failures = bad["validation"]["failures"]
    assert [f["name"] for f in failures] == ["kafka_day and ledger agree on each trade"]
    assert [e["trade_id"] for e in failures[0]["examples"]] == [altered]
    assert not bad["published"]


def test_rerun_replaces_the_day_and_records_runs(settled_day: Isolated) -> None:
    s = settled_day.settings
    first = run_eod(s, DATE, source="db")
    before = _table(s.settlement_dsn, POSITIONS)
    second = run_eod(s, DATE, source="db")
    after = _table(s.settlement_dsn, POSITIONS)
    assert before == after and len(after) == first["positions"] == second["positions"]
    runs = _table(s.settlement_dsn, "select source, status, trades, offsets, timings"
                  " from settlement_runs where trade_date = %s order by run_id")
    assert [r[:3] for r in runs] == [("db", "succeeded", SPEC.trades)] * 2
    assert runs[0][3]["ledgers"] == ["a"] and "read_seconds" in runs[0][4]


def test_falls_back_to_the_database_when_kafka_is_unreachable(settled_day: Isolated) -> None:
    down = settled_day.settings.model_copy(update={"kafka_bootstrap": "127.0.0.1:1"})
    choice = choose_source(down, DATE, timeout=3)
    assert choice.source == "db"
    assert "Kafka is unreachable at 127.0.0.1:1" in choice.reason
    assert choice.ledgers == ("a",)


def test_a_lost_ledger_and_kafka_down_are_each_left_out(settled_day: Isolated) -> None:
    """A ledger that cannot be reached and brokers that refuse, at once (a room lost): each
    is left out and the others' answers are kept. The chooser asks them in threads side by
    side; this checks the answers, not the timing (docs/benchmarks.md has that)."""
    lost = settled_day.settings.model_copy(update={
        "kafka_bootstrap": "127.0.0.1:1",
        "ledger_b_dsn": "postgresql://nobody@127.0.0.1:1/ledger_b"})
    choice = choose_source(lost, DATE, timeout=3)
    assert choice.source == "db" and "Kafka is unreachable at 127.0.0.1:1" in choice.reason
    assert "b" not in choice.states and "a" in choice.states
    assert choice.states["a"].trades == SPEC.trades
    assert choice.ledgers == ("a",)


def test_falls_back_when_the_topic_is_missing(settled_day: Isolated) -> None:
    gone = settled_day.settings.model_copy(update={"topic": "no_such_topic"})
    choice = choose_source(gone, DATE)
    assert choice.source == "db"
    assert "topic 'no_such_topic' does not exist" in choice.reason


def test_kafka_ranges_cover_the_day(settled_day: Isolated) -> None:
    choice = choose_source(settled_day.settings, DATE)
    assert choice.source == "kafka" and len(choice.kafka_ranges) == 6
    markers = _table(settled_day.settings.ledger_dsn("a"),
                     "select kafka_partition, kafka_offset from close_markers"
                     " where trade_date = %s")
    assert {p: off + 1 for p, off in markers} == {p: e for p, (_, e) in
                                                  choice.kafka_ranges.items()}
    json.dumps(choice.as_dict())  # recorded in settlement_runs.offsets


def test_falls_back_when_the_days_offsets_are_no_longer_retained(settled_day: Isolated) -> None:
    """Retention (here: an operator's delete-records) moved a partition's log start past the
    day's first trade: Kafka no longer holds the whole day, so the ledger settles it."""
    from confluent_kafka import TopicPartition

    from settlement.kafka.admin import admin_client

    s = settled_day.settings
    first = _table(s.ledger_dsn("a"), "select min(kafka_offset) from trades"
                   " where trade_date = %s and kafka_partition = 0")[0][0]
    admin = admin_client(s)
    for fut in admin.delete_records([TopicPartition(s.topic, 0, first + 1)],
                                    request_timeout=30).values():
        fut.result()
    choice = choose_source(s, DATE)
    assert choice.source == "db" and choice.ledgers == ("a",)
    assert "the day's offsets are no longer retained in Kafka: partition 0 now starts at " \
           f"offset {first + 1}" in choice.reason
    out = run_eod(s, DATE, source="auto", validate=False)
    assert out["source"] == "db" and out["trades"] == SPEC.trades


def test_falls_back_when_the_close_markers_are_not_in_kafka(settled_day: Isolated) -> None:
    """The topic was recreated (say, a cluster rebuilt from scratch) and holds other data: the
    offsets the ledger recorded for the close markers no longer hold them."""
    from settlement.kafka.admin import admin_client, ensure_topic, topic_partitions
    from tests.helpers import wait_for

    s = settled_day.settings
    admin = admin_client(s)
    admin.delete_topics([s.topic], operation_timeout=30)[s.topic].result()
    wait_for(lambda: s.topic not in admin.list_topics(timeout=5).topics, 30, "topic deletion")

    def recreate() -> bool:
        # A broker may still list the deleted topic ("exists") while the deletion settles:
        # done only when every partition is there again.
        try:
            ensure_topic(s)
            return topic_partitions(s, timeout=5, settle=0) == s.partitions
        except Exception:  # noqa: BLE001 - deletion still settling on some broker
            return False

    wait_for(recreate, 60, "topic re-creation", interval=1)
    simulate(s, SimulationSpec("2026-11-26", SPEC.trades + 500, seed=9, txn_size=500))
    choice = choose_source(s, DATE, timeout=5)
    assert choice.source == "db" and choice.ledgers == ("a",)
    assert f"for {DATE} is not at offset" in choice.reason, choice.reason
    with pytest.raises(NoSource, match="--source kafka was requested"):
        choose_source(s, DATE, requested="kafka", timeout=5)


def test_only_validated_results_are_published(settled_day: Isolated) -> None:
    s = settled_day.settings
    good = run_eod(s, DATE, source="db")
    assert good["published"] and good["validation_success"]
    before = published_positions(s.settlement_dsn, DATE)
    assert before == (before[0], good["run_id"]) and before[0]

    # The ledger loses a trade: the rerun fails validation and publishes nothing.
    with connect(s.ledger_dsn("a")) as conn:
        lost = conn.execute("delete from trades where trade_id = (select max(trade_id)"
                            " from trades) returning trade_id").fetchone()[0]
        conn.commit()
    bad = run_eod(s, DATE, source="db")
    assert bad["validation_success"] is False and not bad["published"]
    assert bad["status"] == "failed" and "not published" in bad["publication"]
    assert published_positions(s.settlement_dsn, DATE) == before  # byte for byte, same run
    runs = _table(s.settlement_dsn, "select run_id, status, published_at is not null, error"
                  " from settlement_runs where trade_date = %s order by run_id")
    assert [(r[1], r[2]) for r in runs] == [("succeeded", True), ("failed", False)]
    staged = _table(s.settlement_dsn, "select count(*), sum(trade_count) from run_positions"
                    f" where run_id = {bad['run_id']} and trade_date = %s")
    assert staged[0][0] > 0 and staged[0][1] == 2 * (SPEC.trades - 1)  # kept for inspection
    assert lost and bad["validation"]["failures"]

    # An operator forces the incomplete day through: published, and the decision recorded.
    why = "OPS-1234: trade lost upstream, settling the rest by agreement"
    forced = run_eod(s, DATE, source="db", accept_incomplete=why)
    assert forced["published"] and forced["validation_success"] is False
    assert forced["status"] == "succeeded" and forced["accepted_incomplete"] == why
    after, run_id = published_positions(s.settlement_dsn, DATE)
    assert run_id == forced["run_id"] and after != before[0]
    recorded = _table(s.settlement_dsn, "select accepted_incomplete from settlement_runs"
                      f" where run_id = {forced['run_id']} and trade_date = %s")
    assert recorded == [(why,)]
    report = json.loads(Path(forced["report_json"]).read_text())
    assert report["publication"]["accepted_incomplete"] == why
    assert why in Path(forced["report_path"]).read_text()
    with pytest.raises(ValueError, match="needs the reason"):
        run_eod(s, DATE, source="db", accept_incomplete="  ")


def test_a_netting_that_fails_beside_the_suites_fails_the_run(
        settled_day: Isolated, monkeypatch: pytest.MonkeyPatch) -> None:
    """The suites run in a thread while the day is netted. A netting error fails the run in
    its own words, and the close returns only once its suites stopped (the invariants' wait
    for the positions fails too): no thread is left querying the day it released."""
    import threading

    import settlement.spark.settle as S

    s = settled_day.settings

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("netting broke: injected")

    monkeypatch.setattr(S, "net_day", broken)
    with pytest.raises(RuntimeError, match="netting broke: injected"):
        run_eod(s, DATE, source="db")
    assert not [t.name for t in threading.enumerate() if t.name.startswith("validation")]
    runs = _table(s.settlement_dsn, "select status, published_at is null, error from "
                  "settlement_runs where trade_date = %s order by run_id")
    assert runs[-1][:2] == ("failed", True) and "netting broke: injected" in runs[-1][2]
    assert published_positions(s.settlement_dsn, DATE) == (b"", None)
    monkeypatch.undo()
    good = run_eod(s, DATE, source="db")
    assert good["published"] and good["validation_success"]
    assert good["timings"]["validate_seconds"] > 0


def test_an_older_run_never_publishes_over_a_newer_one(isolated: Isolated) -> None:
    """Two runs of a date: the newer publishes first, the older finishes late. The late one
    must not replace the newer day (its asset was already emitted)."""
    from settlement.close.pipeline import Superseded, publish, published_run, start_run
    from settlement.eod.model import SourceChoice

    s = isolated.settings.for_component("settlement")
    choice = SourceChoice("db", "test")
    older, newer = start_run(s, DATE, choice), start_run(s, DATE, choice)
    publish(s, newer, DATE, None)
    with pytest.raises(Superseded, match=f"run {newer} started later"):
        publish(s, older, DATE, None)
    assert published_run(s, DATE) == newer
    publish(s, newer, DATE, None)  # the same run again (a retried publication) is fine


def test_a_failed_runs_error_is_stored_redacted(isolated: Isolated) -> None:
    from settlement.close.pipeline import finish_run, start_run
    from settlement.eod.model import SourceChoice

    s = isolated.settings.for_component("settlement")
    run_id = start_run(s, DATE, SourceChoice("db", "test"))
    finish_run(s, run_id, "failed", {}, error=(
        'connection to "postgresql://settle_settlement:hunter2-SECRET@db:5432/x" failed; '
        "password=hunter2-SECRET"))
    with connect(s.settlement_dsn) as conn:
        (error,) = conn.execute("select error from settlement_runs where run_id = %s",
                                (run_id,)).fetchone()
    assert "failed" in error and "hunter2" not in error, error


def test_the_day_has_the_topics_partitions_not_the_setting(settled_day: Isolated) -> None:
    """The topic has 6 partitions, SETTLE_PARTITIONS says 4, and the ledger lost partitions 4
    and 5 (sites that never consumed them). Trusting the setting would call the ledger
    complete and publish a day without two partitions."""
    from settlement.eod.model import PartitionMismatch

    s = settled_day.settings
    with connect(s.ledger_dsn("a")) as conn:
        for table in ("trades", "close_markers"):
            conn.execute(f"delete from {table} where kafka_partition >= 4")
        conn.commit()
    four = s.model_copy(update={"partitions": 4})
    choice = choose_source(four, DATE, requested="db")
    assert choice.partitions == 6 and choice.as_dict()["topic_partitions"] == 6
    assert "ledger 'a' is complete" not in choice.reason
    out = run_eod(four, DATE, source="db")
    assert not out["published"] and out["validation_success"] is False

    # Kafka down: the count Kafka reported to that run is checked against the setting.
    down = four.model_copy(update={"kafka_bootstrap": "127.0.0.1:1"})
    with pytest.raises(PartitionMismatch, match="SETTLE_PARTITIONS=4 but topic .* had 6 "
                       f"partitions when run {out['run_id']}"):
        choose_source(down, DATE, timeout=2)
    six = down.model_copy(update={"partitions": 6})
    assert choose_source(six, DATE, timeout=2).partitions == 6
