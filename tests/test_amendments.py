"""Trade busts and corrections (issue 28): the contract's cancel and correct messages, stored
exactly once by the sites with the reasons for what they refuse, and netted as final states
(the highest version, cancelled trades left out) from Kafka and from the ledger alike."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from consumers.parse import (
    AmendedTrade,
    Malformed,
    amendment,
    amendment_refusal,
    apply_amendment,
    close_marker,
    decode,
    trade_copy_line,
)
from settlement.close.pipeline import run_eod
from settlement.contract import CANCEL, CORRECT, TYPE_HEADER
from settlement.db import connect
from settlement.drills.checker import check_ledger, read_kafka_day
from settlement.simulator.gateway import (
    Amend,
    DayGenerator,
    SimulationSpec,
    final_trades,
    simulate,
)
from settlement.spark.parse import CLASSIFIED_SCHEMA, classify_kafka_values, split_classified
from tests.conftest import Isolated
from tests.helpers import positions_table, reference_positions, sites_until_close
from tests.spark_fixtures import spark  # noqa: F401
from tests.test_ledger import DATE, Builder, _ledger, _rows, _trade, _write


def _cancel(n: int, seq: int, **change: object) -> dict[str, object]:
    return {"trade_id": f"T{n:06d}", "trade_date": DATE, "seq": seq,
            "reason": "trade break", **change}


def _correct(n: int, seq: int, version: int, **change: object) -> dict[str, object]:
    return {**_trade(n, seq=seq, **change), "version": version}


def _amend(b: Builder, kind: str, obj: dict[str, object], p: int, off: int) -> Builder:
    raw = json.dumps(obj).encode()
    b.batch.amendments.append({"a": amendment(decode(raw, 10_000), kind), "partition": p,
                               "offset": off, "raw": raw})
    return b._seen(p, off)


# -- the contract -------------------------------------------------------------------------------
def test_a_cancel_and_a_correction_are_parsed_from_the_contract() -> None:
    c = amendment(_cancel(1, 5), CANCEL)
    assert (c.kind, c.trade_id, c.seq, c.version, c.reason) == (CANCEL, "T000001", 5, None,
                                                                "trade break")
    k = amendment(_correct(1, 6, 2, quantity=12), CORRECT)
    assert (k.kind, k.seq, k.version, k.values.quantity) == (CORRECT, 6, 2, 12)


@pytest.mark.parametrize(("kind", "obj", "reason"), [
    (CANCEL, {k: v for k, v in _cancel(1, 5).items() if k != "reason"},
     "cancel: missing field 'reason'"),
    (CANCEL, _cancel(1, 5, reason=""), "cancel: reason must be a string of 1 to 256"),
    (CANCEL, _cancel(1, 5, reason="x\x00"), "cancel: reason must not contain control"),
    (CANCEL, _cancel(1, 0), "seq must be in [1,"),
    (CANCEL, _cancel(1, 5, trade_date="2026-02-30"), "unknown trade_date"),
    (CORRECT, _trade(1), "correction: missing field 'version'"),
    (CORRECT, _correct(1, 6, 1), "version must be in [2,"),
    (CORRECT, _correct(1, 6, True), "version must be an integer"),
    (CORRECT, _correct(1, 6, 2, buyer="ACC2"), "correction: buyer equals seller"),
])
def test_a_malformed_amendment_names_its_fault(kind: str, obj: dict[str, object],
                                               reason: str) -> None:
    with pytest.raises(Malformed) as e:
        amendment(obj, kind)
    assert str(e.value).startswith(reason), str(e.value)


def test_the_amendment_rules_in_offset_order() -> None:
    cancel = amendment(_cancel(1, 9), CANCEL)
    v2, v3 = (amendment(_correct(1, 7 + v, v), CORRECT) for v in (2, 3))
    assert "unknown trade" in str(amendment_refusal(cancel, None))
    trade = AmendedTrade(DATE)
    assert amendment_refusal(v3, trade) is None
    apply_amendment(v3, trade)
    assert amendment_refusal(v2, trade) == (
        "correction (version 2) of trade 'T000001': version 2 is not above the trade's "
        "current version 3")
    assert amendment_refusal(cancel, AmendedTrade("2026-11-20")) == (
        "cancel of trade 'T000001': the trade is dated 2026-11-20, the amendment 2026-11-23")
    apply_amendment(cancel, trade)
    assert amendment_refusal(v3, trade) == (
        "correction (version 3) of trade 'T000001': the trade is cancelled")


# -- the ledger ---------------------------------------------------------------------------------

@pytest.mark.services
def test_the_ledger_stores_amendments_once_and_dead_letters_the_rest(
        isolated: Isolated) -> None:
    ledger = _ledger(isolated)
    # Batch 1: two trades, a correction of T1 (v2) and its replay, a cancel of a trade that
    # is not there, a correction of T2 on another partition than T2's.
    b = Builder().good(1, 0, 0).good(2, 1, 0)
    _amend(b, CORRECT, _correct(1, 2, 2, quantity=15), 0, 1)
    _amend(b, CORRECT, _correct(1, 2, 2, quantity=15), 0, 2)  # an identical replay
    _amend(b, CANCEL, _cancel(9, 3), 0, 3)  # unknown trade
    _amend(b, CORRECT, _correct(2, 2, 2), 0, 4)  # T2 lives on partition 1
    res = _write(ledger, b)
    assert (res.inserted, res.duplicates, res.dead_letters) == (3, 1, 2), res
    # Batch 2: a lower version after v3, a conflicting replay of v2, the cancel of T1, then a
    # correction of the cancelled T1 and a second cancel of it.
    b = Builder()
    _amend(b, CORRECT, _correct(1, 3, 3, price="11.25"), 0, 5)
    _amend(b, CORRECT, _correct(1, 4, 2, quantity=16), 0, 6)  # conflicting replay of v2
    _amend(b, CANCEL, _cancel(1, 5), 0, 7)
    _amend(b, CORRECT, _correct(1, 6, 4), 0, 8)  # of a cancelled trade
    _amend(b, CANCEL, _cancel(1, 6, reason="again"), 0, 9)  # conflicting replay of the cancel
    res = _write(ledger, b)
    assert (res.inserted, res.duplicates, res.dead_letters) == (2, 0, 3), res
    assert _rows(isolated, "select kind, version, seq, quantity, price::text from "
                           "trade_amendments order by seq") == [
        ("correct", 2, 2, 15, "10.5000"), ("correct", 3, 3, 10, "11.2500"),
        ("cancel", None, 5, None, None)]
    reasons = _rows(isolated, "select kafka_partition, kafka_offset, reason from dead_letters "
                              "order by 1, 2")
    assert reasons == [
        (0, 3, "cancel of trade 'T000009': unknown trade (no such trade before it on its "
               "partition)"),
        (0, 4, "correction (version 2) of trade 'T000002': unknown trade (no such trade "
               "before it on its partition)"),
        (0, 6, "conflicting replay of the correction (version 2) of trade 'T000001': its "
               "fields differ from the copy kept at partition 0 offset 1"),
        (0, 8, "correction (version 4) of trade 'T000001': the trade is cancelled"),
        (0, 9, "conflicting replay of the cancel of trade 'T000001': its fields differ from "
               "the copy kept at partition 0 offset 7")]
    # The trade's own row is never rewritten: the ledger appends.
    assert _rows(isolated, "select quantity, price::text from trades where trade_id = "
                           "'T000001'") == [(10, "10.5000")]


@pytest.mark.services
def test_an_amendment_after_its_days_close_is_late(isolated: Isolated) -> None:
    ledger = _ledger(isolated)
    b = Builder().good(1, 0, 0).close(0, 1, 1)
    _amend(b, CANCEL, _cancel(1, 2), 0, 2)
    res = _write(ledger, b)
    assert (res.inserted, res.close_markers, res.dead_letters) == (1, 1, 1), res
    assert _rows(isolated, "select reason from dead_letters") == [
        (f"late: trade_date {DATE} closed on partition 0 at offset 1",)]
    assert _rows(isolated, "select count(*) from trade_amendments") == [(0,)]


# -- end to end: both sources net the final states ----------------------------------------------
E2E_DATE = "2026-11-24"
E2E = SimulationSpec(E2E_DATE, 3000, seed=11, dup_rate=0.02, bad_rate=0.003, txn_size=500,
                     cancel_rate=0.02, correct_rate=0.03)


@pytest.mark.services
def test_busts_and_corrections_net_the_same_from_kafka_and_both_ledgers(
        isolated: Isolated, tmp_path: Path) -> None:
    s = isolated.settings
    sim = simulate(s, E2E)
    assert sim["cancels"] > 20 and sim["corrections"] > 20, sim
    events = list(DayGenerator(E2E, 6).events())
    sites_until_close(isolated.env, E2E_DATE, tmp_path)
    with connect(s.ledger_dsn("a")) as conn:
        stored = conn.execute("select kind, count(*) from trade_amendments group by kind "
                              "order by kind").fetchall()
    assert stored == [("cancel", sim["cancels"]), ("correct", sim["corrections"])]
    # The drills' independent checker counts them and finds none lost.
    day = read_kafka_day(s, E2E_DATE)
    assert len(set(day.amendments.values())) == sim["cancels"] + sim["corrections"]
    for site in ("a", "b"):
        check = check_ledger(s.ledger_dsn(site), day, s.topic)
        assert check.ok and check.amendments == sim["cancels"] + sim["corrections"], \
            check.as_dict()

    reference = reference_positions(E2E)
    kafka = run_eod(s, E2E_DATE, source="kafka")
    from_kafka = positions_table(s.settlement_dsn, E2E_DATE)
    db = run_eod(s, E2E_DATE, source="db")
    from_db = positions_table(s.settlement_dsn, E2E_DATE)
    for run in (kafka, db):
        assert run["validation_success"] is True, run["validation"]["failures"]
        assert run["published"] is True, run
        assert run["trades"] == E2E.trades, run
        assert (run["cancelled"], run["corrections"]) == (sim["cancels"], sim["corrections"])
        ran = set(run["validation"]["passed"])
        assert any(n.startswith("amendments_day@") for n in ran), ran
        assert any(n.startswith("reconcile_amendments@") for n in ran), run["validation"][
            "skipped"]
    assert from_kafka == from_db == reference
    # A complete ledger's amended trades come from the ledger's index, the small Kafka day's
    # (read by the driver, not the JVM) from a pass over the day: both net the same.
    assert (db["amended_trades_by"], kafka["amended_trades_by"]) == (
        "the read", "a scan of the day")
    # The audit report lists them with their cash effect, computed here independently.
    original = {e.trade_id: e for e in events if not isinstance(e, Amend)}
    change = (sum((t.price * t.quantity for t in final_trades(iter(events))), Decimal(0))
              - sum((t.price * t.quantity for t in original.values()), Decimal(0)))
    for run in (kafka, db):
        facts = json.loads(Path(run["report_json"]).read_text())["amendments"]
        assert (facts["cancelled"], facts["corrections"]) == (sim["cancels"],
                                                              sim["corrections"])
        assert Decimal(facts["notional_change"]) == change != 0
        assert len(facts["listed"]) == sim["cancels"] + sim["corrections"]
        html = Path(run["report_path"]).read_text()
        assert "<h2>Busts and corrections</h2>" in html
        assert f'data-amendments="{sim["cancels"] + sim["corrections"]}"' in html
    # The reference really differs from netting the trades as sent.
    as_sent = reference_positions(SimulationSpec(E2E_DATE, 3000, seed=11))
    assert as_sent != reference
    assert len(final_trades(iter(events))) == E2E.trades - sim["cancels"]


# -- parity: the sites and the Kafka read refuse the same amendments for the same reasons -------
def _stream() -> list[tuple[str, dict[str, object] | bytes]]:
    """One partition's log: trades, then amendments good and bad, in offset order."""
    other_day = "2026-11-20"
    return [
        ("trade", _trade(1)), ("trade", _trade(2, seq=2)),
        ("trade", _trade(3, seq=3, trade_date=other_day)),
        ("cancel", _cancel(9, 4)),  # unknown trade
        ("correct", _correct(1, 5, 2, quantity=15)),
        ("correct", _correct(1, 5, 2, quantity=15)),  # identical replay
        ("correct", _correct(1, 6, 2, quantity=16)),  # conflicting replay
        ("correct", _correct(2, 7, 3, price="12.5")),
        ("correct", _correct(2, 8, 2, price="12.25")),  # lower version
        ("correct", _correct(1, 9, 3, executed_at=f"{DATE}T15:00:00Z")),
        ("cancel", _cancel(1, 10)),
        ("correct", _correct(1, 11, 4)),  # of a cancelled trade
        ("cancel", _cancel(1, 12, reason="again")),  # conflicting replay of the cancel
        ("cancel", _cancel(1, 10)),  # identical replay of the cancel
        ("cancel", _cancel(3, 13)),  # the trade is of another date
        ("cancel", b'{"trade_id": "T000002", "trade_date": "2026-11-23", "seq": 14}'),
        ("correct", _correct(2, 15, 1)),  # version 1 is the original's
        ("cancel", _cancel(2, 16)),
        ("trade", _trade(4, seq=17)),
        ("correct", _correct(4, 18, 2, buyer="ACC3")),
    ]


@pytest.mark.services
def test_sites_and_the_kafka_read_agree_on_every_amendment(
        spark: SparkSession, isolated: Isolated) -> None:  # noqa: F811
    stream = [(k, v if isinstance(v, bytes) else json.dumps(v).encode()) for k, v in _stream()]
    # The site: the parser, then the ledger (one batch per message, as a slow day runs).
    ledger = _ledger(isolated)
    for off, (kind, raw) in enumerate(stream):
        b = Builder()
        try:
            obj = decode(raw, 10_000)
            if kind == "trade":
                b.line(trade_copy_line(obj, 0, off, "a"), 0, off, raw)
            else:
                b.batch.amendments.append({"a": amendment(obj, kind), "partition": 0,
                                           "offset": off, "raw": raw})
                b._seen(0, off)
        except Malformed as e:
            b.dead(0, off, str(e))
        _write(ledger, b)
    dead = dict(_rows(isolated, "select kafka_offset, reason from dead_letters"))
    stored = {o for (o,) in _rows(isolated, "select kafka_offset from trade_amendments")}
    site = {off: dead.get(off, "stored" if off in stored else "replay")
            for off, (kind, _) in enumerate(stream) if kind != "trade"}
    # The end of day's reader, on the same log.
    frame = spark.createDataFrame(
        [(b"k", raw, 0, off, [(TYPE_HEADER, kind.encode())])
         for off, (kind, raw) in enumerate(stream)],
        "key binary, value binary, partition int, offset long, "
        "headers array<struct<key:string,value:binary>>").coalesce(1)
    rows = classify_kafka_values(frame, 10_000).collect()
    reader = {r["kafka_offset"]: r["reason"] or ("replay" if r["_dup"] else "stored")
              for r in rows if r["_kind"] != "trade"}
    assert reader == site
    assert sorted(o for o, v in site.items() if v == "stored") == [4, 7, 9, 10, 17, 19]
    assert site[5] == site[13] == "replay"
    # The day's amendments, as the reader hands them to the settlement.
    amends = split_classified(spark.createDataFrame(rows, CLASSIFIED_SCHEMA)).amendments
    assert sorted((r["trade_id"], r["kind"], r["version"]) for r in amends.collect()) == [
        ("T000001", "cancel", None), ("T000001", "correct", 2), ("T000001", "correct", 3),
        ("T000002", "cancel", None), ("T000002", "correct", 3), ("T000004", "correct", 2)]


# -- the amended close: busts after the close, one rule for the sites and the Kafka read -------
def _close_msg(last_seq: int, amended: int | None = None, day: str = DATE) -> dict[str, object]:
    return {"trade_date": day, "partition": 0, "last_seq": last_seq,
            **({} if amended is None else {"amended": amended})}


def _amended_stream() -> list[tuple[str, dict[str, object] | bytes]]:
    """One partition's log across a close: the day, its close, then busts and corrections
    after it with amended close markers good and bad, a late trade, the next day's trades."""
    nxt = "2026-11-24"
    return [
        ("trade", _trade(1)), ("trade", _trade(2, seq=2)), ("trade", _trade(3, seq=3)),
        ("cancel", _cancel(3, 4)),  # before the close: an ordinary bust
        ("close", _close_msg(4, 1)),  # 4: an amended close before the day closed
        ("close", _close_msg(4)),  # 5: the close
        ("trade", _trade(5, seq=5)),  # 6: a late trade
        ("trade", _trade(6, trade_date=nxt, seq=1, executed_at=f"{nxt}T14:00:00Z")),
        ("cancel", _cancel(1, 5)),  # 8: bust after the close: covered by amended 1
        ("correct", _correct(2, 6, 2, quantity=12)),  # 9: covered by amended 1
        ("correct", _correct(2, 6, 2, quantity=12)),  # 10: an identical replay, covered
        ("cancel", _cancel(3, 7)),  # 11: covered, but a second (different) cancel of T3
        ("close", _close_msg(7, 2)),  # 12: amended 2 before amended 1
        ("close", _close_msg(7, 1)),  # 13: amended 1
        ("close", _close_msg(7, 1)),  # 14: its replay
        ("close", _close_msg(8, 1)),  # 15: a conflicting amended 1
        ("correct", _correct(2, 8, 3, price="11.5")),  # 16: covered by amended 2
        ("correct", _correct(1, 9, 2)),  # 17: of a trade busted after the close
        ("close", _close_msg(6, 2)),  # 18: amended 2 going back below amended 1
        ("close", _close_msg(9, 2)),  # 19: amended 2
        ("cancel", _cancel(2, 10)),  # 20: after the close, no amended close behind it
        ("trade", _trade(7, trade_date=nxt, seq=2, executed_at=f"{nxt}T14:00:00Z")),
    ]


def _site_verdicts(isolated: Isolated, stream: list[tuple[str, bytes]]) -> dict[int, str]:
    """Each message through the parser and the ledger (one batch each, as a slow day runs):
    'stored', 'kept' (a marker), 'replay', or the reason it is not."""
    ledger = _ledger(isolated)
    for off, (kind, raw) in enumerate(stream):
        b = Builder()
        try:
            obj = decode(raw, 10_000)
            if kind == "trade":
                b.line(trade_copy_line(obj, 0, off, "a"), 0, off, raw)
            elif kind == "close":
                cm = close_marker(obj, 0)
                b.batch.close_markers.append({
                    "trade_date": cm.trade_date, "partition": 0, "last_seq": cm.last_seq,
                    "offset": off, "amended": cm.amended, "raw": raw})
                b._seen(0, off)
            else:
                b.batch.amendments.append({"a": amendment(obj, kind), "partition": 0,
                                           "offset": off, "raw": raw})
                b._seen(0, off)
        except Malformed as e:
            b.dead(0, off, str(e))
        _write(ledger, b)
    dead = dict(_rows(isolated, "select kafka_offset, reason from dead_letters"))
    # A held amendment an amended close decided keeps its late dead letter as history; its
    # verdict is the decision's.
    decided = dict(_rows(isolated, "select kafka_offset, verdict from late_amendments "
                                   "where verdict is not null"))
    stored = {o for (o,) in _rows(isolated, "select kafka_offset from trade_amendments")}
    markers = {o for (o,) in _rows(isolated, "select kafka_offset from close_markers union all "
                                             "select kafka_offset from amended_close_markers")}
    out = {}
    for off, (kind, _) in enumerate(stream):
        if off in decided:
            out[off] = decided[off]
        elif off in dead:
            out[off] = dead[off]
        elif kind == "close":
            out[off] = "kept" if off in markers else "replay"
        elif kind != "trade":
            out[off] = "stored" if off in stored else "replay"
        else:
            out[off] = "stored"
    return out


@pytest.mark.services
def test_sites_and_the_kafka_read_agree_on_the_amended_close(
        spark: SparkSession, isolated: Isolated) -> None:  # noqa: F811
    stream = [(k, v if isinstance(v, bytes) else json.dumps(v).encode())
              for k, v in _amended_stream()]
    site = _site_verdicts(isolated, stream)
    frame = spark.createDataFrame(
        [(b"k", raw, 0, off, [(TYPE_HEADER, kind.encode())])
         for off, (kind, raw) in enumerate(stream)],
        "key binary, value binary, partition int, offset long, "
        "headers array<struct<key:string,value:binary>>").coalesce(1)
    rows = classify_kafka_values(frame, 10_000).collect()
    assert sorted(r["kafka_offset"] for r in rows) == list(range(len(stream)))
    reader = {}
    for r in rows:
        valid = r["reason"] is None
        reader[r["kafka_offset"]] = (
            r["reason"] if not valid else "kept" if r["_kind"] == "close" and not r["_dup"]
            else "replay" if r["_dup"] else "stored")
    # A replayed marker is not a copy to the classifier: it is valid, like the first.
    reader[14] = "replay" if reader[14] == "kept" else reader[14]
    assert reader == site
    closed = f"late: trade_date {DATE} closed on partition 0 at offset 5"
    assert site[4] == f"amended close marker 1 of {DATE} on partition 0: the day is not closed " \
                      "on this partition"
    assert site[6] == site[20] == closed  # a late trade; a bust no amended close covers
    assert [site[o] for o in (8, 9, 10, 16, 17)] == [
        "stored", "stored", "replay", "stored",
        "correction (version 2) of trade 'T000001': the trade is cancelled"]
    assert site[11].startswith("conflicting replay of the cancel of trade 'T000003'")
    assert site[12] == f"amended close marker 2 of {DATE} on partition 0: expected amended 1 " \
                       "next"
    assert site[15].startswith(f"conflicting amended close marker 1 of {DATE}")
    assert "is below the day's last close (7)" in site[18]
    assert site[13] == site[19] == "kept" and site[14] == "replay"
    with connect(isolated.settings.ledger_dsn("a")) as conn:
        assert conn.execute("select kafka_offset, amended from trade_amendments "
                            "order by kafka_offset").fetchall() == [
            (3, None), (8, 1), (9, 1), (16, 2)]
    # The day's amendments as the reader hands them to the settlement: the same ones.
    amends = split_classified(spark.createDataFrame(rows, CLASSIFIED_SCHEMA)).amendments
    assert sorted(r["kafka_offset"] for r in amends.collect()) == [3, 8, 9, 16]
