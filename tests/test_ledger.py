"""The ledger writer against the real PostgreSQL: poison batches, late trades, retention gaps
and bounded waits, without Kafka in the loop (the site tests cover that)."""

from __future__ import annotations

import datetime as dt
import json
import random
import string
from dataclasses import dataclass

import psycopg
import pytest

from consumers.ledger import BEGINNING, Batch, Fenced, Ledger, is_permanent
from consumers.parse import trade_copy_line
from settlement.db import connect
from tests.conftest import Isolated

pytestmark = pytest.mark.services
DATE = "2026-11-23"


@dataclass(frozen=True)
class Message:
    """The parts of a confluent_kafka.Message the ledger reads."""

    raw: bytes
    p: int
    off: int

    def value(self) -> bytes:
        return self.raw

    def partition(self) -> int:
        return self.p

    def offset(self) -> int:
        return self.off


def _trade(n: int, **change: object) -> dict[str, object]:
    return {"trade_id": f"T{n:06d}", "trade_date": DATE, "seq": n, "symbol": "AAPL",
            "price": "10.5", "quantity": 10, "buyer": "ACC1", "seller": "ACC2",
            "executed_at": f"{DATE}T14:00:00Z", **change}


class Builder:
    """A batch as the site's parser would make it, with lines the parser would never emit
    mixed in (so the ledger's own defences are exercised)."""

    def __init__(self) -> None:
        self.batch = Batch()

    def good(self, n: int, p: int, off: int, **change: object) -> Builder:
        obj = _trade(n, **change)
        return self.line(trade_copy_line(obj, p, off, "a"), p, off, json.dumps(obj).encode())

    def line(self, line: str, p: int, off: int, raw: bytes | None = None) -> Builder:
        self.batch.copy_lines.append(line)
        self.batch.trade_messages.append(Message(raw or line.encode(), p, off))
        return self._seen(p, off)

    def close(self, p: int, off: int, last_seq: int, day: str = DATE) -> Builder:
        raw = json.dumps({"trade_date": day, "partition": p, "last_seq": last_seq}).encode()
        self.batch.close_markers.append({"trade_date": day, "partition": p,
                                         "last_seq": last_seq, "offset": off, "raw": raw})
        return self._seen(p, off)

    def dead(self, p: int, off: int, reason: str) -> Builder:
        self.batch.dead_letters.append({"partition": p, "offset": off, "raw": b"{",
                                        "reason": reason})
        return self._seen(p, off)

    def _seen(self, p: int, off: int) -> Builder:
        self.batch.next_offsets[p] = max(self.batch.next_offsets.get(p, 0), off + 1)
        self.batch.messages += 1
        return self


def _line(n: int, p: int, off: int) -> str:
    return trade_copy_line(_trade(n), p, off, "a")


# Random letters do not compress, so this stays longer than a btree entry may be (2704 bytes).
LONG_ID = "".join(random.Random(1).choices(string.ascii_letters, k=6000))


def _ledger(iso: Isolated) -> Ledger:
    return Ledger(iso.settings.ledger_dsn("a"), site="a", scheme="separate",
                  group="settlement-site-a", topic=iso.settings.topic)


def _rows(iso: Isolated, sql: str) -> list[tuple]:
    with connect(iso.settings.ledger_dsn("a")) as conn:
        return conn.execute(sql).fetchall()  # type: ignore[arg-type]


def _write(ledger: Ledger, b: Builder) -> object:
    parts = sorted(b.batch.next_offsets)
    stored = ledger.claim(parts)
    return ledger.write(b.batch, {p: stored.get(p, BEGINNING) for p in parts})


def test_a_poison_batch_commits_its_good_messages_and_dead_letters_the_rest(
        isolated: Isolated) -> None:
    good = [(n, n % 2, 10 + n) for n in range(1, 41)]
    b = Builder()
    for n, p, off in good[:20]:
        b.good(n, p, off)
    # What PostgreSQL refuses, each for another reason, among the good ones.
    b.line(_line(900, 0, 100).replace("\t900\t", "\t9x\t"), 0, 100)     # not a number
    b.line(_line(901, 1, 101).replace("\t10\t", f"\t{1 << 70}\t"), 1, 101)  # > bigint
    b.line(_line(902, 0, 102).replace("ACC1", "ACC1\\."), 0, 102)       # COPY's \. inside
    b.line("\\.\n", 1, 103)                                # COPY's end-of-data, alone
    b.line(_line(903, 0, 104).replace("T000903", LONG_ID), 0, 104)  # too long for a btree
    b.line(_line(904, 1, 105).replace("\t10\t", "\t0\t"), 1, 105,
           json.dumps(_trade(904, quantity=0)).encode())   # CHECK (quantity > 0)
    for n, p, off in good[20:]:
        b.good(n, p, off)
    b.dead(0, 106, "invalid JSON: \x00 in a reason")
    res = _write(_ledger(isolated), b)

    assert (res.inserted, res.refused, res.dead_letters) == (40, 6, 7), res
    ids = {r[0] for r in _rows(isolated, "select trade_id from trades")}
    assert ids == {f"T{n:06d}" for n, _, _ in good}
    dead = dict(_rows(isolated, "select kafka_offset, reason from dead_letters"))
    assert set(dead) == {100, 101, 102, 103, 104, 105, 106}
    assert "invalid input syntax for type bigint" in dead[100]
    assert "out of range" in dead[101]
    assert "COPY read 0 rows from 1 lines" in dead[103]
    assert "index row" in dead[104] and "(54000)" in dead[104]
    assert "trades_quantity_check" in dead[105]
    assert dead[106] == "invalid JSON: \\x00 in a reason"
    raw = dict(_rows(isolated, "select kafka_offset, raw from dead_letters"))
    assert json.loads(bytes(raw[105]))["trade_id"] == "T000904"
    assert _rows(isolated, "select kafka_partition, next_offset from consumer_offsets"
                           " order by 1") == [(0, 107), (1, 106)]
    assert _rows(isolated, "select inserted, dead_letters from ingest_batches") == [(40, 7)]


def test_a_clean_batch_and_a_replay_take_the_fast_path(isolated: Isolated) -> None:
    ledger = _ledger(isolated)
    b = Builder().good(1, 0, 0).good(2, 0, 1).good(1, 0, 2)  # a replay in the same batch
    res = _write(ledger, b)
    assert (res.inserted, res.duplicates, res.refused, res.dead_letters) == (2, 1, 0, 0)
    assert _rows(isolated, "select kafka_offset from trades where trade_id = 'T000001'") == [(0,)]


def test_a_plain_insert_goes_first_after_a_clean_batch_and_a_replay_falls_back(
        isolated: Isolated) -> None:
    ledger = _ledger(isolated)
    counts = lambda res: (res.inserted, res.duplicates, res.dead_letters)  # noqa: E731
    assert counts(_write(ledger, Builder().good(1, 0, 0).good(2, 0, 1))) == (2, 0, 0)
    assert ledger.optimistic  # no replay in it: the next batch tries the plain insert
    # A replay of a stored trade fails the plain insert; the batch is inserted as before.
    assert counts(_write(ledger, Builder().good(3, 0, 2).good(1, 0, 3))) == (1, 1, 0)
    assert not ledger.optimistic
    assert counts(_write(ledger, Builder().good(4, 0, 4))) == (1, 0, 0)
    assert ledger.optimistic
    # Two copies in one batch, one of them conflicting: the first staged copy wins, the
    # other is a dead letter naming it.
    b = Builder().good(5, 0, 5).good(6, 0, 6).good(5, 0, 7, quantity=11)
    assert counts(_write(ledger, b)) == (2, 0, 1)
    assert counts(_write(ledger, Builder().good(7, 0, 8))) == (1, 0, 0)
    assert counts(_write(ledger, Builder().good(8, 0, 9))) == (1, 0, 0)  # plain insert
    assert _rows(isolated, "select trade_id, kafka_offset from trades order by 1") == [
        (f"T{n:06d}", off) for n, off in ((1, 0), (2, 1), (3, 2), (4, 4), (5, 5), (6, 6),
                                          (7, 8), (8, 9))]
    assert "T000005" in _rows(isolated, "select reason from dead_letters")[0][0]
    assert _rows(isolated, "select sum(inserted), sum(duplicates), sum(dead_letters) "
                           "from ingest_batches") == [(8, 1, 1)]


def test_late_trades_are_dead_lettered_exactly_across_batches(isolated: Isolated) -> None:
    ledger = _ledger(isolated)
    # Batch 1: partition 0 closes the day at offset 3; a trade after it in the same batch.
    _write(ledger, Builder().good(1, 0, 1).good(2, 0, 2).close(0, 3, 2).good(3, 0, 4)
           .good(4, 1, 1))
    # Batch 2 (say, after a restart): the day is still closed on 0, still open on 1; the
    # next day's trades on 0 are on time.
    res = _write(Ledger(isolated.settings.ledger_dsn("a"), site="a", scheme="separate",
                        group="settlement-site-a", topic=isolated.settings.topic),
                 Builder().good(5, 0, 5).good(6, 1, 2).good(7, 0, 6, trade_date="2026-11-24"))
    assert res.late == 1 and res.inserted == 2
    assert {r[0] for r in _rows(isolated, "select trade_id from trades")} == {
        "T000001", "T000002", "T000004", "T000006", "T000007"}
    late = _rows(isolated, "select kafka_partition, kafka_offset, trade_date, reason"
                           " from dead_letters order by kafka_offset")
    assert late == [
        (0, 4, dt.date(2026, 11, 23), f"late: trade_date {DATE} closed on partition 0 at offset 3"),
        (0, 5, dt.date(2026, 11, 23), f"late: trade_date {DATE} closed on partition 0 at offset 3"),
    ]


def test_a_stale_batch_is_fenced(isolated: Isolated) -> None:
    ledger = _ledger(isolated)
    _write(ledger, Builder().good(1, 0, 0))
    with pytest.raises(Fenced):
        ledger.write(Builder().good(2, 0, 1).batch, {0: BEGINNING})
    assert _rows(isolated, "select count(*) from trades") == [(1,)]


def test_a_retention_gap_is_recorded_once_with_the_new_position(isolated: Isolated) -> None:
    ledger = _ledger(isolated)
    _write(ledger, Builder().good(1, 0, 9))
    ledger.skip_gap(0, 10, 250)
    with pytest.raises(Fenced):  # a second site finding the same gap: already moved
        ledger.skip_gap(0, 10, 250)
    assert _rows(isolated, "select kafka_partition, from_offset, to_offset, site"
                           " from data_loss_events") == [(0, 10, 250, "a")]
    assert ledger.positions([0]) == {0: (250, "a")}


def test_ledger_sessions_have_bounded_waits(isolated: Isolated) -> None:
    conn = _ledger(isolated).c
    got = {k: conn.execute(f"show {k}").fetchone()[0]  # type: ignore[index]
           for k in ("lock_timeout", "statement_timeout", "idle_in_transaction_session_timeout")}
    assert got == {"lock_timeout": "2s", "statement_timeout": "30s",
                   "idle_in_transaction_session_timeout": "5s"}


def test_errors_are_classified_by_sqlstate() -> None:
    assert is_permanent(psycopg.errors.NumericValueOutOfRange())
    assert is_permanent(psycopg.errors.CheckViolation())
    assert is_permanent(psycopg.errors.ProgramLimitExceeded())
    for transient in (psycopg.errors.SerializationFailure(), psycopg.errors.DeadlockDetected(),
                      psycopg.errors.AdminShutdown(), psycopg.errors.LockNotAvailable(),
                      psycopg.errors.QueryCanceled(), psycopg.OperationalError("gone")):
        assert not is_permanent(transient), transient


def test_a_far_future_trade_does_not_pin_the_current_day(isolated: Isolated) -> None:
    # The contract accepts trade dates up to 2099; one such trade used to become the "current
    # day" of `--until-close` without --date (never closing) and of `settle status`.
    ledger = _ledger(isolated)
    _write(ledger, Builder().good(1, 0, 0).good(2, 1, 0)
           .good(3, 1, 1, trade_date="2099-12-31", executed_at="2099-12-31T10:00:00Z"))
    assert ledger.day_closed(None, 2) == (DATE, False)
    _write(ledger, Builder().close(0, 1, 1).close(1, 2, 2))
    assert ledger.day_closed(None, 2) == (DATE, True)
