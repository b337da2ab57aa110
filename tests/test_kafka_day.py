"""Locating a trade date in the Kafka log by itself: the binary search over a modelled log,
and the whole end of day from Kafka after every ledger is lost, on the real services."""

from __future__ import annotations

import json
from collections import defaultdict
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pytest

from settlement.contract import CLOSE_HEADERS, TRADE_HEADERS
from settlement.db import connect, with_dbname
from settlement.eod.kafka_day import NotLocated, PartitionLog, _day_start, locate_in_partition
from settlement.simulator.gateway import DayGenerator, SimulationSpec, simulate
from tests.conftest import Isolated
from tests.helpers import start_site, wait_exit


class _Err:
    def code(self) -> int:
        from confluent_kafka import KafkaError

        return KafkaError._PARTITION_EOF


class _Msg:
    def __init__(self, offset: int, value: bytes | None, headers: Any) -> None:
        self._o, self._v, self._h = offset, value, headers

    def error(self) -> None:
        return None

    def offset(self) -> int:
        return self._o

    def value(self) -> bytes | None:
        return self._v

    def headers(self) -> Any:
        return self._h


class _EOF(_Msg):
    def __init__(self) -> None:
        super().__init__(-1, None, None)

    def error(self) -> Any:  # type: ignore[override]
        return _Err()


class _Log:
    """A partition as read_committed shows it: some offsets (transaction markers, aborted
    records) are never returned. Consumer-shaped: assign() then consume()."""

    def __init__(self, records: dict[int, _Msg], high: int) -> None:
        self.records, self.high, self.pos = records, high, 0

    def assign(self, tps: list[Any]) -> None:
        self.pos = tps[0].offset

    def consume(self, n: int, timeout: float) -> list[_Msg]:
        out: list[_Msg] = []
        while len(out) < n and self.pos < self.high:
            m = self.records.get(self.pos)
            self.pos += 1
            if m is not None:
                out.append(m)
        if self.pos >= self.high and len(out) < n:
            out.append(_EOF())
        return out


def _trade(day: str, seq: int, tid: str = "") -> bytes:
    return json.dumps({"trade_id": tid or f"{day}-{seq}", "trade_date": day, "seq": seq,
                       "symbol": "XAU", "price": "10.5", "quantity": 3, "buyer": "A",
                       "seller": "B", "executed_at": f"{day}T14:30:00Z"}).encode()


def _day(log: dict[int, _Msg], at: int, day: str, trades: int, partition: int = 0,
         bad_every: int = 0, late: str = "") -> int:
    """Append a day (trades, junk, a commit marker gap, the close marker); next offset.
    ``late``: a day whose trades keep arriving (valid, late) in the middle of this one."""
    for seq in range(1, trades + 1):
        log[at] = _Msg(at, _trade(day, seq), TRADE_HEADERS)
        at += 1
        if late and seq % 41 == 0:
            log[at] = _Msg(at, _trade(late, 10_000 + seq, f"late-{seq}"), TRADE_HEADERS)
            at += 1
        if bad_every and seq % (bad_every * 3) == 0:  # parses, but its date is no date
            log[at] = _Msg(at, b'{"trade_date": "1999-01-01"}', TRADE_HEADERS)
            at += 1
        if bad_every and seq % bad_every == 0:
            log[at] = _Msg(at, b"{not json", TRADE_HEADERS)  # malformed: no date
            at += 2  # and a transaction marker nobody sees
    close = {"trade_date": day, "partition": partition, "last_seq": trades}
    log[at] = _Msg(at, json.dumps(close).encode(), CLOSE_HEADERS)
    return at + 2  # the close marker's commit marker


def _partition(records: dict[int, _Msg], high: int) -> PartitionLog:
    return PartitionLog(_Log(records, high), "t", 0, high, 16384, timeout=1)


def test_finds_each_day_of_a_multi_day_log_by_search() -> None:
    records: dict[int, _Msg] = {}
    at = 0
    bounds = {}
    previous = ""
    for day, n in (("2026-11-23", 300), ("2026-11-24", 3000), ("2026-11-25", 50)):
        # A day starts right after the previous day's close marker (its commit marker
        # included) and ends after its own: the marker is at (next offset - 2). Late trades
        # of the previous day and malformed messages with other dates sit inside each day.
        start = max(at - 1, 0)
        at = _day(records, at, day, n, bad_every=37, late=previous)
        previous = day
        bounds[day] = (start, at - 1)
    for day, (start, after_marker) in bounds.items():
        log = _partition(records, at)
        found = locate_in_partition(log, 0, day, recorded=None, previous=None)
        assert (found.start, found.end) == (start, after_marker)
        assert found.found_by == "search"
        assert log.probes < 80, log.probes  # a search, not a scan


def test_a_late_trade_right_after_the_close_does_not_hide_the_next_day() -> None:
    # A trade of D-1 that arrives after D-1's close marker, before D's first trade: the first
    # message of D's range is not D's, yet the range is D's (the late trade is its dead
    # letter). The search once reported "holds no message of D" and the close fell back.
    records: dict[int, _Msg] = {}
    at = _day(records, 0, "2026-11-23", 300)
    for k in range(3):
        records[at + k] = _Msg(at + k, _trade("2026-11-23", 9_000 + k, f"late-{k}"),
                               TRADE_HEADERS)
    end = _day(records, at + 3, "2026-11-24", 500)
    found = locate_in_partition(_partition(records, end), 0, "2026-11-24", recorded=None,
                                previous=None)
    assert (found.start, found.end, found.last_seq) == (at - 1, end - 1, 500)


def test_a_day_at_the_log_start_is_found_by_one_probe_of_its_start() -> None:
    # A topic's first day (or the first retained) starts at the log start: the search for
    # its start is one probe there, not a binary search over the whole partition.
    records: dict[int, _Msg] = {}
    end = _day(records, 0, "2026-11-24", 3000)
    end = _day(records, end, "2026-11-25", 3000)
    log = _partition(records, end)
    assert _day_start(log, 0, "2026-11-24") == 0
    assert log.probes == 1
    # The next day's start is still searched for, and found exactly.
    log = _partition(records, end)
    assert _day_start(log, 0, "2026-11-25") == 3001
    assert log.probes > 5
    # A log that starts with more junk than a probe's window (no dated message there): the
    # day after the first is still found by the search, not taken to start at the log start.
    junk = {o: _Msg(o, b"{not json", TRADE_HEADERS) for o in range(400)}
    end = _day(junk, 400, "2026-11-24", 3000)
    end = _day(junk, end, "2026-11-25", 3000)
    assert _day_start(_partition(junk, end), 0, "2026-11-25") == 3401


def test_a_recorded_offset_is_confirmed_or_refused() -> None:
    records: dict[int, _Msg] = {}
    first_end = _day(records, 0, "2026-11-23", 10)
    end = _day(records, first_end, "2026-11-24", 10)
    marker = end - 2
    found = locate_in_partition(_partition(records, end), 0, "2026-11-24",
                                recorded=marker, previous=first_end - 2)
    assert (found.start, found.end, found.found_by) == (first_end - 1, marker + 1, "ledger")
    with pytest.raises(NotLocated, match="is not at offset 5 in Kafka"):
        locate_in_partition(_partition(records, end), 0, "2026-11-24", recorded=5,
                            previous=None)


def test_a_day_cut_by_retention_or_missing_is_not_located() -> None:
    records: dict[int, _Msg] = {}
    end = _day(records, 0, "2026-11-23", 100)
    cut = {o: m for o, m in records.items() if o >= 40}
    with pytest.raises(NotLocated, match="no longer retained"):
        locate_in_partition(_partition(cut, end), 40, "2026-11-23", None, None)
    with pytest.raises(NotLocated, match="holds no message of 2026-11-24"):
        locate_in_partition(_partition(records, end), 0, "2026-11-24", None, None)
    no_marker = {o: m for o, m in records.items() if o != end - 2}
    with pytest.raises(NotLocated, match="no close marker of 2026-11-23"):
        locate_in_partition(_partition(no_marker, end), 0, "2026-11-23", None, None)


def test_a_tombstone_or_odd_value_where_a_marker_was_recorded_is_a_reason() -> None:
    records: dict[int, _Msg] = {}
    end = _day(records, 0, "2026-11-23", 5)
    marker = end - 2
    for odd in (None, b"[1, 2]", b"null", b"\xff\xfe"):
        records[marker] = _Msg(marker, odd, CLOSE_HEADERS)
        with pytest.raises(NotLocated, match="is not at offset"):
            locate_in_partition(_partition(dict(records), end), 0, "2026-11-23", marker, None)


# -- on the real services ---------------------------------------------------------------------

DAYS = [SimulationSpec(d, n, seed=s, dup_rate=0.02, bad_rate=0.005, abort_rate=0.2,
                       txn_size=300)
        for d, n, s in (("2026-12-01", 1500, 1), ("2026-12-02", 2500, 2),
                        ("2026-12-03", 1200, 3))]


def _expected(spec: SimulationSpec) -> dict[tuple[str, str], tuple[Any, ...]]:
    """The day's netting in plain Python with Decimal, from the generator's own trades."""
    acc: dict[tuple[str, str], list[Any]] = defaultdict(
        lambda: [0, 0, Decimal(0), Decimal(0), 0])
    for t in DayGenerator(spec, 6).trades():
        amount = t.price * t.quantity
        b, s = acc[(t.buyer, t.symbol)], acc[(t.seller, t.symbol)]
        b[0] += t.quantity
        b[2] += amount
        b[4] += 1
        s[1] += t.quantity
        s[3] += amount
        s[4] += 1
    return {k: (v[0], v[1], v[0] - v[1], v[2], v[3], v[3] - v[2], v[4]) for k, v in acc.items()}


@pytest.mark.services
def test_ledgers_lost_settles_from_kafka_alone(isolated: Isolated, tmp_path: Path) -> None:
    from settlement.close.pipeline import run_eod

    s = isolated.settings
    for spec in DAYS:  # three days on one topic, one ledger, as production runs
        simulate(s, spec)
    out = wait_exit(start_site("a", "separate", isolated.env, DAYS[-1].trade_date,
                               tmp_path / "a.log"), tmp_path / "a.log")
    assert out["closed"]
    # The database side fails: every ledger database is gone.
    with psycopg.connect(with_dbname(s.settlement_dsn, "postgres"), autocommit=True) as conn:
        for name in ("a", "b", "shared"):
            db = psycopg.conninfo.conninfo_to_dict(s.ledger_dsn(name))["dbname"]
            conn.execute(f'drop database if exists "{db}" with (force)')  # type: ignore[arg-type]

    spec = DAYS[1]
    res = run_eod(s, spec.trade_date, source="auto")
    assert res["source"] == "kafka", res["source_reason"]
    assert "found in Kafka by search" in res["source_reason"]
    assert res["trades"] == spec.trades and res["duplicates_removed"] > 0
    with connect(s.settlement_dsn) as conn:
        rows = conn.execute(
            "select account, symbol, bought_qty, sold_qty, net_qty, buy_amount, sell_amount,"
            " net_cash, trade_count from positions where trade_date = %s",
            (spec.trade_date,)).fetchall()
    assert {(r[0], r[1]): tuple(r[2:]) for r in rows} == _expected(spec)
    assert res["validation_success"], res["validation"]["failures"]
    assert "reconcile_kafka_ledger@ledger_trades" in res["validation"]["skipped"]


@pytest.mark.services
def test_a_trade_id_in_two_partitions_fails_validation_and_is_not_published(
        isolated: Isolated) -> None:
    """The Kafka day is deduplicated within each partition (copies of a trade share its key,
    so its partition). A copy in another partition breaks that premise: the read_copies check
    names it (the partition is part of a trade's identity) and the day is not published."""
    from confluent_kafka import Producer

    from settlement.close.pipeline import published_run, run_eod
    from settlement.simulator.gateway import producer_config

    s = isolated.settings
    day = "2026-03-02"
    producer = Producer(producer_config(s, None))
    for p in range(s.partitions):
        for seq in (1, 2, 3):
            producer.produce(s.topic, _trade(day, seq, f"p{p}-{seq}"), b"XAU", partition=p,
                             headers=TRADE_HEADERS)
        if p == 1:  # the same trade as partition 0's first, on partition 1
            producer.produce(s.topic, _trade(day, 1, "p0-1"), b"XAU", partition=1,
                             headers=TRADE_HEADERS)
        close = {"trade_date": day, "partition": p, "last_seq": 3}
        producer.produce(s.topic, json.dumps(close).encode(), b"", partition=p,
                         headers=CLOSE_HEADERS)
    assert producer.flush(30) == 0

    res = run_eod(s, day, source="kafka")
    assert not res["published"] and res["status"] == "failed"
    failed = {f["name"]: f for f in res["validation"]["failures"]}
    assert "copies of a trade id agree" in failed, sorted(failed)
    assert [e["trade_id"] for e in failed["copies of a trade id agree"]["examples"]] == ["p0-1"]
    assert published_run(s, day) is None
