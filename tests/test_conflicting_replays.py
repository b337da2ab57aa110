"""Replays: an identical copy of a trade (or close marker) is a suppressed duplicate; a copy
whose content differs from the kept one is a conflicting replay, dead-lettered with its raw
bytes and a reason naming the kept offset, by the sites and by the end of day's Kafka read
alike, so both sources reach the same verdict on such a day."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from settlement.close.pipeline import run_eod
from settlement.contract import CLOSE_HEADERS, TRADE_HEADERS
from settlement.db import connect
from settlement.simulator.gateway import DayGenerator, SimulationSpec, producer_config
from tests.conftest import Isolated
from tests.helpers import POSITIONS, start_site, wait_exit
from tests.test_ledger import Builder, _ledger, _rows, _write

pytestmark = pytest.mark.services
DAY = "2026-10-21"


def test_identical_replays_are_duplicates_and_conflicting_ones_dead_letters(
        isolated: Isolated) -> None:
    ledger = _ledger(isolated)
    # Batch 1: T1 kept at offset 0; an identical copy (the price written with more zeros, the
    # time in another zone: the same trade) and a conflicting copy in the same batch.
    res = _write(ledger, Builder().good(1, 0, 0, price="10.5")
                 .good(1, 0, 1, price="10.5000", executed_at="2026-11-23T15:00:00+01:00")
                 .good(1, 0, 2, price="11.5"))
    assert (res.inserted, res.duplicates, res.dead_letters) == (1, 1, 1), res
    # Batch 2: the same again across batches, and a conflicting copy with another quantity.
    res = _write(ledger, Builder().good(1, 0, 3, price="10.50").good(1, 0, 4, quantity=11))
    assert (res.inserted, res.duplicates, res.dead_letters) == (0, 1, 1), res
    dead = _rows(isolated, "select kafka_offset, reason, raw from dead_letters order by 1")
    assert [(o, r) for o, r, _ in dead] == [
        (2, "conflicting replay of trade 'T000001': its fields differ from the copy kept at "
            "partition 0 offset 0"),
        (4, "conflicting replay of trade 'T000001': its fields differ from the copy kept at "
            "partition 0 offset 0")]
    assert json.loads(bytes(dead[0][2]))["price"] == "11.5"  # the raw bytes, kept
    assert _rows(isolated, "select price, quantity from trades") == [(10.5, 10)]


def test_a_conflicting_close_marker_is_dead_lettered(isolated: Isolated) -> None:
    ledger = _ledger(isolated)
    res = _write(ledger, Builder().good(1, 0, 0).close(0, 1, 1).close(0, 2, 1).close(0, 3, 7))
    assert (res.close_markers, res.dead_letters) == (1, 1), res
    assert _rows(isolated, "select last_seq, kafka_offset from close_markers") == [(1, 1)]
    assert _rows(isolated, "select kafka_offset, reason from dead_letters") == [
        (3, "conflicting close marker of 2026-11-23 on partition 0: last_seq 7, the marker "
            "kept at offset 1 says 1")]


def _publish_day_with_replays(settings: Any) -> dict[str, Any]:
    """A small day with one identical and one conflicting replay before the close markers,
    and a conflicting close marker after them."""
    from confluent_kafka import Producer

    spec = SimulationSpec(trade_date=DAY, trades=400, seed=9)
    gen = DayGenerator(spec, 6)
    trades = list(gen.trades())
    producer = Producer(producer_config(settings, None))
    send = lambda value, key, p, headers: producer.produce(  # noqa: E731
        settings.topic, value=value, key=key, partition=p, headers=headers)
    for t in trades:
        send(t.value(), t.symbol.encode(), t.partition, TRADE_HEADERS)
    same, other = trades[10], trades[20]
    send(same.value(), same.symbol.encode(), same.partition, TRADE_HEADERS)
    changed = json.loads(other.value())
    changed["quantity"] += 1
    send(json.dumps(changed).encode(), other.symbol.encode(), other.partition, TRADE_HEADERS)
    for p in range(6):
        marker = {"trade_date": DAY, "partition": p, "last_seq": gen.last_seq.get(p, 0)}
        send(json.dumps(marker).encode(), None, p, CLOSE_HEADERS)
    bad = {"trade_date": DAY, "partition": 0, "last_seq": gen.last_seq.get(0, 0) + 5}
    send(json.dumps(bad).encode(), None, 0, CLOSE_HEADERS)
    assert producer.flush(60) == 0
    return {"trades": len(trades), "conflicting": other}


def test_both_sources_reach_the_same_verdict(isolated: Isolated, tmp_path: Path) -> None:
    s = isolated.settings
    day = _publish_day_with_replays(s)
    out = wait_exit(start_site("a", "separate", isolated.env, DAY, tmp_path / "a.log"),
                    tmp_path / "a.log")
    assert out["closed"] and out["inserted"] == day["trades"], out
    assert out["duplicates"] == 1, out  # the identical replay only
    with connect(s.ledger_dsn("a")) as conn:
        reasons = [r for (r,) in conn.execute("select reason from dead_letters order by 1")]
    assert len(reasons) == 2, reasons
    assert re.fullmatch(r"conflicting close marker of .* on partition 0: last_seq \d+, the "
                        r"marker kept at offset \d+ says \d+", reasons[0]), reasons
    assert reasons[1].startswith(
        f"conflicting replay of trade '{day['conflicting'].trade_id}'"), reasons

    kafka = run_eod(s, DAY, source="kafka")
    from_kafka = _positions(s)
    db = run_eod(s, DAY, source="db")
    from_db = _positions(s)
    for run in (kafka, db):
        assert run["trades"] == day["trades"], run
        assert run["validation_success"] is True, run
        assert run["published"] is True, run
    assert kafka["malformed"] == 1 and kafka["duplicates_removed"] == 1, kafka
    assert from_kafka == from_db


def _positions(s: Any) -> list[tuple[Any, ...]]:
    with connect(s.settlement_dsn) as conn:
        return conn.execute(POSITIONS, (DAY,)).fetchall()
