"""Bad data never stops the line, on the real broker and database: a batch the ledger refuses,
late trades, a retention gap, and a site frozen in the middle of a batch."""

from __future__ import annotations

import datetime as dt
import json
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from settlement.contract import TRADE_HEADERS
from settlement.db import connect, q
from settlement.drills.checker import check_ledger, read_kafka_day
from settlement.drills.drill import RTO_TARGET_SECONDS
from settlement.report.facts import ledger_facts
from settlement.simulator.gateway import SimulationSpec, simulate
from tests.conftest import Isolated
from tests.helpers import start_site, wait_exit, wait_for

pytestmark = pytest.mark.services
DAY1, DAY2 = "2026-11-23", "2026-11-24"


def publish(iso: Isolated, messages: list[tuple[int, bytes]]) -> None:
    """Trades (partition, value) as an upstream outside the gateway would send them."""
    from confluent_kafka import Producer

    p = Producer({**iso.settings.kafka_client_config(), "enable.idempotence": True,
                  "acks": "all"})
    for partition, value in messages:
        p.produce(iso.settings.topic, value=value, partition=partition, headers=TRADE_HEADERS)
    assert p.flush(30) == 0


def trade(trade_id: str, day: str, seq: int, **change: Any) -> bytes:
    return json.dumps({"trade_id": trade_id, "trade_date": day, "seq": seq, "symbol": "ZZZ",
                       "price": "12.5", "quantity": 7, "buyer": "ACC0001", "seller": "ACC0002",
                       "executed_at": f"{day}T15:00:00Z", **change}).encode()


def rows(iso: Isolated, ledger: str, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    with connect(iso.settings.ledger_dsn(ledger)) as conn:
        return conn.execute(sql, params).fetchall()  # type: ignore[arg-type]


def run_site(iso: Isolated, tmp: Path, day: str, name: str, site: str = "a",
             scheme: str = "separate", extra: dict[str, str] | None = None) -> dict[str, Any]:
    log = tmp / f"{name}.log"
    out = wait_exit(start_site(site, scheme, iso.env, day, log, extra), log)
    assert out["closed"], out
    return out


def test_a_batch_the_ledger_refuses_is_narrowed_down_and_the_day_closes(
        isolated: Isolated, tmp_path: Path) -> None:
    """Trades the contract accepts but this ledger refuses (an operator's extra CHECK, as a
    stand-in for anything PostgreSQL may refuse) are dead-lettered with the database's
    reason; everything else of the day commits, and the site reaches the close markers."""
    with connect(isolated.settings.ledger_dsn("a")) as conn:
        conn.execute("alter table trades add constraint no_house_account"
                     " check (buyer <> 'HOUSE')")
        conn.commit()
    poison = [(p, trade(f"P{p}", DAY1, 1, buyer="HOUSE")) for p in range(3)]
    publish(isolated, poison)
    sim = simulate(isolated.settings, SimulationSpec(DAY1, 600, seed=4, txn_size=200))
    out = run_site(isolated, tmp_path, DAY1, "a", extra={"SETTLE_BATCH_SIZE": "5000"})
    assert (out["refused"], out["inserted"], out["batches"] >= 1) == (3, sim["trades"], True)

    dead = rows(isolated, "a", "select kafka_partition, kafka_offset, raw, reason"
                               " from dead_letters order by 1")
    assert [(p, o, json.loads(bytes(raw))["trade_id"]) for p, o, raw, _ in dead] == [
        (p, 0, f"P{p}") for p in range(3)]
    assert all('violates check constraint "no_house_account"' in r for *_, r in dead), dead
    day = read_kafka_day(isolated.settings, DAY1)
    res = check_ledger(isolated.settings.ledger_dsn("a"), day, isolated.settings.topic)
    assert set(res.lost) == {"P0", "P1", "P2"} and not res.duplicated and not res.unexpected


def test_late_trades_are_dead_lettered_across_restarts(isolated: Isolated,
                                                       tmp_path: Path) -> None:
    s = isolated.settings
    sim1 = simulate(s, SimulationSpec(DAY1, 400, seed=1, txn_size=200))
    run_site(isolated, tmp_path, DAY1, "a1")
    markers = dict(rows(isolated, "a", "select kafka_partition, kafka_offset from close_markers"
                                       " where trade_date = %s", DAY1))
    # After the day closed (and the site exited): three trades for it, then the next day.
    publish(isolated, [(p, trade(f"LATE{p}", DAY1, 10_000 + p)) for p in (0, 1, 2)])
    sim2 = simulate(s, SimulationSpec(DAY2, 400, seed=2, txn_size=200))
    out = run_site(isolated, tmp_path, DAY2, "a2")
    assert out["late"] == 3 and out["inserted"] == sim2["trades"]

    late = rows(isolated, "a", "select kafka_partition, trade_date, reason from dead_letters"
                               " order by 1")
    assert late == [(p, dt.date.fromisoformat(DAY1),
                     f"late: trade_date {DAY1} closed on partition {p} at offset {markers[p]}")
                    for p in (0, 1, 2)]
    with connect(s.ledger_dsn("a")) as conn:
        counted = conn.execute(q("ledger", "late_trades"),
                               {"topic": s.topic, "trade_date": DAY1}).fetchall()
    assert counted == [(0, 1), (1, 1), (2, 1)]
    assert ledger_facts(s, DAY1)["a"]["late_trades"] == {"0": 1, "1": 1, "2": 1}
    assert ledger_facts(s, DAY2)["a"]["late_trades"] == {}
    # The independent read agrees: the late ones are neither settled nor lost.
    for day, sim in ((DAY1, sim1), (DAY2, sim2)):
        kday = read_kafka_day(s, day)
        res = check_ledger(s.ledger_dsn("a"), kday, s.topic)
        assert res.ok and res.ledger_rows == sim["trades"], (day, res.as_dict())
    assert len(read_kafka_day(s, DAY1).late) == 3
    # The Kafka source reports them too: DAY2's range holds DAY1's late trades, which the
    # date filter leaves out of DAY2; its report names them by day and partition.
    from settlement.close.pipeline import run_eod

    res = run_eod(s, DAY2, source="kafka")
    assert res["trades"] == sim2["trades"] and res["validation_success"], res["validation"]
    assert [w["name"] for w in res["validation"]["warnings"]] == [
        "every trade read is of the run's date"]
    facts = json.loads(Path(res["report_json"]).read_text())
    assert facts["late_trades_in_range"] == {DAY1: {"0": 1, "1": 1, "2": 1}}
    assert "Late trades of earlier days" in Path(res["report_path"]).read_text()


def test_a_retention_gap_is_recorded_as_data_loss_not_skipped(isolated: Isolated,
                                                              tmp_path: Path) -> None:
    from confluent_kafka import TopicPartition

    from settlement.kafka.admin import admin_client

    s = isolated.settings
    simulate(s, SimulationSpec(DAY1, 400, seed=1, txn_size=200))
    run_site(isolated, tmp_path, DAY1, "a1")
    (stored,) = rows(isolated, "a", "select next_offset from consumer_offsets"
                                    " where kafka_partition = 0")[0]
    simulate(s, SimulationSpec(DAY2, 400, seed=2, txn_size=200))
    # The site is "down longer than retention": the start of the next day on partition 0 is
    # deleted before it reads it (delete-records moves the log start as retention does).
    low = stored + 20
    admin = admin_client(s)  # held: the futures die with the client
    for fut in admin.delete_records([TopicPartition(s.topic, 0, low)],
                                    request_timeout=30).values():
        fut.result(timeout=60)
    out = run_site(isolated, tmp_path, DAY2, "a2")
    assert out["data_loss_events"] == 1
    assert "DATA LOSS" in (tmp_path / "a2.log").read_text()

    assert rows(isolated, "a", "select kafka_partition, from_offset, to_offset, site"
                               " from data_loss_events") == [(0, stored, low, "a")]
    assert rows(isolated, "a", "select next_offset >= %s from consumer_offsets"
                               " where kafka_partition = 0", low) == [(True,)]
    # Nothing of the gap is in the ledger; the rest of the day is.
    assert rows(isolated, "a", "select count(*) from trades where kafka_partition = 0 and"
                               " kafka_offset >= %s and kafka_offset < %s", stored, low) == [(0,)]
    with connect(s.ledger_dsn("a")) as conn:
        def loss(day: str) -> list[tuple[Any, ...]]:
            return conn.execute(q("ledger", "data_loss_for_day"),
                                {"topic": s.topic, "trade_date": day}).fetchall()

        assert [r[:3] for r in loss(DAY2)] == [(0, stored, low)]
        assert loss(DAY1) == []
    # The audit report of the day names it.
    facts = ledger_facts(s, DAY2)["a"]["data_loss_events"]
    assert [(e["partition"], e["from_offset"], e["to_offset"]) for e in facts] == [
        (0, stored, low)]
    # Validation of the day fails and names the gap; the day is not published.
    from settlement.close.pipeline import run_eod

    res = run_eod(s, DAY2, source="db")
    assert not res["validation_success"] and not res["published"]
    (check,) = [f for f in res["validation"]["failures"] if f["suite"] == "data_loss"]
    assert [(e["ledger"], e["kafka_partition"], e["from_offset"], e["to_offset"])
            for e in check["examples"]] == [("a", 0, stored, low)]


def _stopped(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2] == "T"


def test_a_site_frozen_mid_batch_blocks_nobody_and_its_batch_is_refused(
        isolated: Isolated, tmp_path: Path) -> None:
    """Shared scheme. Site A stops itself (SIGSTOP) with its 3rd batch applied but not
    committed, the offset rows locked. Site B takes A's partitions over within the RTO target
    (the server ends A's idle transaction, B's waits are bounded); when A resumes, its stale
    batch is refused, and the ledger holds every trade once."""
    import subprocess

    from tests.helpers import ROOT, SETTLE, last_json

    s = isolated.settings
    env = {**isolated.env, "SETTLE_BATCH_SIZE": "300"}
    a = start_site("a", "shared", env, DAY1, tmp_path / "a.log",
                   {"SETTLE_FAILPOINT": "before_db_commit:3"})
    b = start_site("b", "shared", env, DAY1, tmp_path / "b.log")
    # Both sites in the group, each having said which partitions it owns, before trading
    # starts: the freeze comes a few batches in, and A's last beat must name its partitions.
    def beaten(site: str) -> bool:
        beat = rows(isolated, "shared", "select partitions from site_heartbeats where site = %s"
                                        " order by beat_at desc, id desc limit 1", site)
        return bool(beat and beat[0][0])

    wait_for(lambda: beaten("a") and beaten("b"), 60, "both sites to own partitions")
    time.sleep(1.5)  # a last rebalance settled: the next beats name the same partitions
    day = subprocess.Popen(
        [*SETTLE, "simulate", "--date", DAY1, "--trades", "12000", "--seed", "8",
         "--dup-rate", "0.01", "--abort-rate", "0.1", "--rate", "800", "--json"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        wait_for(lambda: _stopped(a.pid), 60, "site A to freeze itself")
        frozen_at = dt.datetime.now(dt.UTC)
        owned = rows(isolated, "shared", "select partitions from site_heartbeats"
                                         " where site = 'a' order by beat_at desc limit 1")[0][0]
        assert owned, "site A owned no partition when it froze"

        def takeover() -> dt.datetime | None:
            return rows(isolated, "shared", "select min(ingested_at) from trades where site = 'b'"
                                            " and kafka_partition = any(%s) and ingested_at > %s",
                        owned, frozen_at)[0][0]

        wait_for(lambda: takeover() is not None, 40, "site B to take A's partitions over")
        rto = (takeover() - frozen_at).total_seconds()
        assert rto <= RTO_TARGET_SECONDS, rto
    finally:
        a.send_signal(signal.SIGCONT)
    out, err = day.communicate(timeout=180)
    assert day.returncode == 0, err[-3000:]
    sim = last_json(out)
    out_a = wait_exit(a, tmp_path / "a.log")
    out_b = wait_exit(b, tmp_path / "b.log")
    assert out_a["fenced"] >= 1, out_a
    assert out_b["closed"] and out_a["closed"]
    kday = read_kafka_day(s, DAY1)
    res = check_ledger(s.ledger_dsn("shared"), kday, s.topic)
    assert res.ok and res.ledger_rows == sim["trades"], res.as_dict()
