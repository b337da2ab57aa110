"""Busts after the close (issue 45): an amended close read from Kafka and from the ledger
gives the same verdict; a re-close from either source equals an independent reference and is
published as the day's next version (the earlier one still readable); the instructions'
delta is exactly the difference; a re-close joins a close of the date in progress; the
eod_reclose DAG publishes only what an operator approved and records the decision."""

from __future__ import annotations

import contextlib
import json
import signal
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from settlement.close.pipeline import (
    BaseMoved,
    RecloseHeld,
    SameApprover,
    publish_held,
    published_run,
    record_decision,
    run_eod,
)
from settlement.config import Settings
from settlement.contract import CLOSE_HEADERS
from settlement.db import connect
from settlement.eod.lease import Lease, acquire
from settlement.instructions.store import delta_set
from settlement.simulator.gateway import (
    Amend,
    DayGenerator,
    SimulationSpec,
    Trade,
    final_trades,
    producer_config,
    simulate,
)
from settlement.status import awaiting_reclose
from tests.conftest import Isolated
from tests.helpers import positions_table, sites_until_close
from tests.spark_fixtures import spark  # noqa: F401

DAY, NEXT = "2026-11-23", "2026-11-24"
SPEC = SimulationSpec(DAY, 1200, seed=45, cancel_rate=0.01, correct_rate=0.01)
NEXT_SPEC = SimulationSpec(NEXT, 300, seed=46)
Positions = dict[tuple[str, str], tuple[Any, ...]]


def _last_seqs(s: Settings, day: str) -> dict[int, int]:
    with connect(s.ledger_dsn("a")) as conn:
        return {int(p): int(n) for p, n in conn.execute(
            "select kafka_partition, last_seq from close_markers where trade_date = %s",
            (day,))}


def _busts(events: list[Trade | Amend], last: dict[int, int]) -> tuple[list[Amend], Amend]:
    """A cancel and a correction on two partitions (covered by amended closes), and a cancel
    on a third that no amended close follows (it stays a late dead letter)."""
    final = {t.trade_id: t for t in final_trades(iter(events))}
    picked: dict[int, Trade] = {}
    for t in final.values():
        picked.setdefault(t.partition, t)
    p1, p2, p3 = sorted(picked)[:3]
    covered = [Amend("cancel", picked[p1], last[p1] + 1),
               Amend("correct", picked[p2], last[p2] + 1, version=9,
                     quantity=picked[p2].quantity + 7)]
    return covered, Amend("cancel", picked[p3], last[p3] + 1)


def _send_after_close(s: Settings, covered: list[Amend], uncovered: Amend) -> None:
    prod = Producer(producer_config(s, None))
    for a in [*covered, uncovered]:
        prod.produce(s.topic, value=a.value(), key=a.symbol.encode(), partition=a.partition,
                     headers=a.headers)
    for a in covered:  # each partition's first amended close, its last_seq covering the bust
        marker = {"trade_date": DAY, "partition": a.partition, "last_seq": a.seq, "amended": 1}
        prod.produce(s.topic, value=json.dumps(marker).encode(), partition=a.partition,
                     headers=CLOSE_HEADERS)
    assert prod.flush(30) == 0


def _reference(events: list[Trade | Amend]) -> Positions:
    """Netting in plain Python with Decimal from the generator's trades in their final states
    (the day's own busts and the post-close ones applied by the simulator's final_trades)."""
    acc: dict[tuple[str, str], list[Any]] = defaultdict(
        lambda: [0, 0, Decimal(0), Decimal(0), 0])
    for t in final_trades(iter(events)):
        amount = t.price * t.quantity
        b, sl = acc[(t.buyer, t.symbol)], acc[(t.seller, t.symbol)]
        b[0] += t.quantity
        b[2] += amount
        b[4] += 1
        sl[1] += t.quantity
        sl[3] += amount
        sl[4] += 1
    return {k: (v[0], v[1], v[0] - v[1], v[2], v[3], v[3] - v[2], v[4]) for k, v in acc.items()}


def _version_positions(s: Settings, version: int) -> dict[tuple[str, str], tuple[int, Decimal]]:
    with connect(s.settlement_dsn) as conn:
        return {(a, sym): (int(q), Decimal(c)) for a, sym, q, c in conn.execute(
            "select account, symbol, net_qty, net_cash from positions_by_version "
            "where trade_date = %s and version = %s", (DAY, version))}


@pytest.fixture
def amended_day(isolated: Isolated, tmp_path: Path) -> dict[str, Any]:
    """DAY published (version 1), then busts after its close with amended closes, consumed by
    both sites while they ingest NEXT."""
    s = isolated.settings
    simulate(s, SPEC)
    sites_until_close(isolated.env, DAY, tmp_path)
    first = run_eod(s, DAY, source="kafka")
    assert first["published"] and first["version"] == 1, first
    events = list(DayGenerator(SPEC, 6).events())
    covered, uncovered = _busts(events, _last_seqs(s, DAY))
    _send_after_close(s, covered, uncovered)
    simulate(s, NEXT_SPEC)
    sites_until_close(isolated.env, NEXT, tmp_path)
    return {"events": events, "covered": covered, "uncovered": uncovered,
            "v1": positions_table(s.settlement_dsn, DAY), "run1": first["run_id"]}


@pytest.mark.services
def test_a_reclose_from_kafka_and_from_the_ledger_settles_the_busts(
        isolated: Isolated, amended_day: dict[str, Any]) -> None:
    s = isolated.settings
    covered, uncovered = amended_day["covered"], amended_day["uncovered"]
    # Both sites stored the covered busts as post-close amendments; the other is late.
    for ledger in ("a", "b"):
        with connect(s.ledger_dsn(ledger)) as conn:
            assert conn.execute("select kind, amended from trade_amendments where amended "
                                "is not null order by kind").fetchall() == [
                ("cancel", 1), ("correct", 1)]
            late = conn.execute("select verdict from late_amendments where trade_date = %s "
                                "order by kafka_partition", (DAY,)).fetchall()
            assert sorted(v for (v,) in late if v) == ["stored", "stored"]
            assert conn.execute(
                "select reason from dead_letters where kafka_partition = %s and raw = %s",
                (uncovered.partition, uncovered.value())).fetchone()[0].startswith("late: ")
    waiting = awaiting_reclose(s, DAY)
    assert [(w.trade_date, w.amendments, w.version) for w in waiting] == [(DAY, 2, 1)]
    # settle status shows it, and marks the published run amended since.
    from settlement.status import status

    shown = status(s)["settlement"]
    assert [(a["trade_date"], a["amendments"]) for a in shown["awaiting_reclose"]] == [(DAY, 2)]
    assert {r["trade_date"]: r.get("amended_since") for r in shown["runs"]}[DAY] == \
        waiting[0].since
    # The published day stands until a re-close: nothing changed; its report page says the
    # day has been amended since.
    assert positions_table(s.settlement_dsn, DAY) == amended_day["v1"]
    from settlement.orchestration.reports_app import _facts, amended_since, render_report

    since = amended_since(DAY, amended_day["run1"])
    assert since is not None and since["amendments"] == 2
    page = render_report({**_facts(s.settlement_dsn, amended_day["run1"]),
                          "amended_since": since})
    assert f'data-amended-since="{since["since"]}"' in page and "await a re-close" in page

    reference = _reference([*amended_day["events"], *covered])
    assert reference != amended_day["v1"]
    # From the ledger, held (validated, not published): the same verdict and positions.
    held = run_eod(s, DAY, source="db", reclose=True, hold=True)
    assert held["validation_success"] is True, held["validation"]["failures"]
    assert held["held_for_approval"] and not held["published"], held
    assert held["reclosed"]["amendments"] == 2
    with connect(s.settlement_dsn) as conn:
        rows = conn.execute(
            "select account, symbol, bought_qty, sold_qty, net_qty, buy_amount, sell_amount, "
            "net_cash, trade_count from run_positions where run_id = %s",
            (held["run_id"],)).fetchall()
    assert {(r[0], r[1]): tuple(r[2:]) for r in rows} == reference
    # One re-close at a time: while this one waits for a decision, another is refused,
    # naming it; rejected, the date may be re-closed again.
    with pytest.raises(RecloseHeld, match=f"run {held['run_id']} is a re-close held"):
        run_eod(s, DAY, source="kafka", reclose=True)
    record_decision(s, held["run_id"], DAY, "rejected", "ops-b", held["delta"],
                    "rejected: nothing published")
    # From Kafka, published as version 2.
    out = run_eod(s, DAY, source="kafka", reclose=True)
    assert out["source"] == "kafka" and out["validation_success"] is True, out
    assert out["published"] and out["version"] == 2, out
    assert positions_table(s.settlement_dsn, DAY) == reference
    assert out["trades"] == held["trades"]
    # Version 1 is still readable, as it was.
    v1 = {k: (v[2], v[5]) for k, v in amended_day["v1"].items()}
    assert _version_positions(s, 1) == v1
    v2 = _version_positions(s, 2)
    # The delta lists exactly the accounts and instruments that changed, by the change.
    change = {k: (v2.get(k, (0, Decimal(0)))[0] - v1.get(k, (0, Decimal(0)))[0],
                  v2.get(k, (0, Decimal(0)))[1] - v1.get(k, (0, Decimal(0)))[1])
              for k in v1.keys() | v2.keys()}
    change = {k: v for k, v in change.items() if v != (0, Decimal(0))}
    delta = delta_set(s, DAY)
    got: dict[tuple[str, str], list[Any]] = defaultdict(lambda: [0, Decimal(0)])
    for line in delta.lines:
        got[(line.account, line.symbol)][0] += line.signed_quantity
        got[(line.account, line.symbol)][1] += line.signed_amount
    assert {k: tuple(v) for k, v in got.items()} == change and change
    # Settled: nothing awaits, and a second re-close does nothing.
    assert awaiting_reclose(s, DAY) == []
    assert amended_since(DAY, amended_day["run1"]) is None
    again = run_eod(s, DAY, reclose=True)
    assert again["nothing_to_reclose"] and not again["published"], again


@pytest.mark.services
def test_a_held_reclose_is_one_at_a_time_bound_to_its_base_and_approved_by_another(
        isolated: Isolated, amended_day: dict[str, Any]) -> None:
    """Held at site A (triggered by ops-a): a re-close at site B is refused naming it; its
    approval by ops-a is refused; once another publication replaced the run it was computed
    against (an operator's rerun), its approval by ops-b publishes nothing. Every published
    version has exactly one instruction set."""
    s = isolated.settings
    held = run_eod(s, DAY, source="db", reclose=True, hold=True, triggered_by="ops-a")
    assert held["held_for_approval"], held
    with pytest.raises(RecloseHeld, match=f"run {held['run_id']} is a re-close held"):
        run_eod(s, DAY, reclose=True, triggered_by="ops-b")
    with pytest.raises(SameApprover, match="ops-a"):
        publish_held(s, held["run_id"], DAY, approved_by="ops-a")
    assert published_run(s, DAY) == amended_day["run1"]
    rerun = run_eod(s, DAY, source="kafka")  # by hand: the day's next version
    assert rerun["published"] and rerun["version"] == 2, rerun
    with pytest.raises(BaseMoved, match=f"computed against run {amended_day['run1']}"):
        publish_held(s, held["run_id"], DAY, approved_by="ops-b")
    assert published_run(s, DAY) == rerun["run_id"]
    versions = _published_versions(s)
    assert versions == [(amended_day["run1"], 1, 1), (rerun["run_id"], 2, 1)], versions


def _published_versions(s: Any) -> list[tuple[int, int, int]]:
    """(run, version, instruction sets it wrote) of each published version of DAY."""
    with connect(s.settlement_dsn) as conn:
        return conn.execute(
            "select r.run_id, r.version, (select count(distinct i.run_id) from"
            " settlement_instructions i where i.run_id = r.run_id) from settlement_runs r"
            " where r.trade_date = %s and r.published_at is not null order by r.version",
            (DAY,)).fetchall()


@pytest.mark.services
def test_a_reclose_killed_once_held_stays_the_one_held_and_publishes_once(
        isolated: Isolated, amended_day: dict[str, Any]) -> None:
    """The re-close's crash point (issue 56): the process that computed and held a re-close
    SIGKILLed right after holding it. The held run stands (not computed again): a re-close at
    the other site is refused naming it, and its approval by another user publishes it once,
    as version 2 with one instruction set."""
    import subprocess
    import sys

    s = isolated.settings
    code = ("from settlement.config import load_settings\n"
            "from settlement.orchestration.reclose import compute\n"
            f"compute(load_settings(), {DAY!r}, 'db', triggered_by='ops-a')\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=600, env={**isolated.env, "SETTLE_SITE_NAME": "a",
                                           "SETTLE_CRASH_AT": "reclose.held:kill"})
    assert res.returncode == -signal.SIGKILL, res.stderr[-3000:]
    assert "crash point reclose.held: kill" in res.stderr
    with connect(s.settlement_dsn) as conn:
        held = conn.execute(
            "select run_id from settlement_runs where trade_date = %s and based_on_run = %s"
            " and published_at is null", (DAY, amended_day["run1"])).fetchall()
    assert len(held) == 1, held
    with pytest.raises(RecloseHeld, match=f"run {held[0][0]} is a re-close held"):
        run_eod(s.model_copy(update={"site_name": "b"}), DAY, reclose=True,
                triggered_by="ops-b")
    published = publish_held(s, held[0][0], DAY, approved_by="ops-b")
    assert published_run(s, DAY) == held[0][0], published
    versions = _published_versions(s)
    assert versions == [(amended_day["run1"], 1, 1), (held[0][0], 2, 1)], versions


@pytest.mark.services
def test_a_reclose_joins_the_close_of_the_date_in_progress(
        isolated: Isolated, amended_day: dict[str, Any]) -> None:
    s = isolated.settings.for_component("settlement")
    lease = acquire(s, DAY, ttl=30, wait_seconds=5, say=print)
    assert isinstance(lease, Lease), lease
    with connect(isolated.settings.settlement_dsn) as conn:
        run_id = conn.execute(
            "insert into settlement_runs (trade_date, source, source_reason, status, holder, "
            "fencing_token) values (%s, 'db', 'a close in progress (test)', 'running', %s, %s) "
            "returning run_id", (DAY, lease.holder, lease.token)).fetchone()[0]
        conn.commit()
    lease.attach(run_id)
    result: dict[str, Any] = {}
    t = threading.Thread(target=lambda: result.update(run_eod(isolated.settings, DAY,
                                                              reclose=True)))
    t.start()
    time.sleep(3)
    assert t.is_alive(), "the re-close did not wait for the close holding the date"
    with connect(isolated.settings.settlement_dsn) as conn:
        # It finishes with a verdict (a failed validation): the joiner reports it.
        conn.execute("update settlement_runs set status = 'failed', error = 'test', "
                     "validation_success = false, finished_at = now() where run_id = %s",
                     (run_id,))
        conn.commit()
    lease.release()
    t.join(300)
    assert result.get("joined_run_id") == run_id, result
    # It computed nothing of its own: still awaiting.
    assert [w.amendments for w in awaiting_reclose(isolated.settings, DAY)] == [2]


# -- the eod_reclose DAG: approved in the UI ----------------------------------------------------
# The longest one eod_reclose run may take here (compute, validate, wait for the answer,
# publish); the operator process gives up after 900 s.
HITL_BOUND_S = 1200


@contextlib.contextmanager
def _alarm_after(seconds: int) -> Iterator[None]:
    """Raise TimeoutError in this (the main) thread after ``seconds``."""
    def ring(_signum: int, _frame: object) -> None:
        raise TimeoutError(f"no answer ended the DAG run within {seconds}s")

    before = signal.signal(signal.SIGALRM, ring)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, before)


def _run_reclose_dag(iso: Isolated, answer: str, monkeypatch: pytest.MonkeyPatch
                     ) -> tuple[Any, dict[str, Any]]:
    """One eod_reclose run (dag.test()) answered by an operator from outside the run, as the
    Airflow API records an answer (tests.hitl_responder), in a thread of this process: a
    second process on the SQLite metadata database could find its write-ahead log replaced
    under it (the answer then never reached the run)."""
    from settlement.orchestration.dagtest import without_deadlines
    from settlement.orchestration.tasks import airflow_connections
    from tests.hitl_responder import answer as respond
    from tests.test_dags import ROOT, _dagbag

    for k, v in airflow_connections(iso.settings).items():
        monkeypatch.setenv(k, v)
    dag = without_deadlines(_dagbag(ROOT / "dags" / "eod_reclose.py").dags["eod_reclose"])
    got: dict[str, Any] = {}

    def operator() -> None:
        try:
            got["seen"] = respond("eod_reclose", "approve", answer, "ops-anna", timeout=900)
        except Exception as e:  # noqa: BLE001 - reported by the assertion below
            got["error"] = e

    # Everything the operator's queries import and configure, imported here first: two
    # threads importing Airflow's models at once deadlocked (a module lock against
    # SQLAlchemy's mapper configuration lock).
    import airflow.models.dagbag
    import airflow.models.hitl
    import airflow.models.trigger  # noqa: F401
    from airflow.models import import_all_models
    from sqlalchemy.orm import configure_mappers

    import_all_models()
    configure_mappers()
    thread = threading.Thread(target=operator, name="operator", daemon=True)
    thread.start()
    # dag.test() waits for a human-in-the-loop answer without end: an answer that never
    # comes (the operator failed) must end the test, not the suite.
    with _alarm_after(HITL_BOUND_S):
        run = dag.test(run_conf={"trade_date": DAY, "source": "db"})
    thread.join(timeout=60)
    assert "seen" in got, f"the operator never saw the approval: {got.get('error')}"
    return run, got["seen"]


def _decisions(s: Settings) -> list[tuple[Any, ...]]:
    with connect(s.settlement_dsn) as conn:
        return conn.execute("select run_id, decision, decided_by, delta, outcome "
                            "from reclose_decisions order by decision_id").fetchall()


@pytest.mark.services
def test_the_reclose_dag_publishes_only_what_an_operator_approved(
        isolated: Isolated, amended_day: dict[str, Any], airflow_db: None,
        monkeypatch: pytest.MonkeyPatch) -> None:
    s = isolated.settings
    v1 = amended_day["v1"]
    # Rejected: computed and validated, nothing published, the decision recorded.
    run, seen = _run_reclose_dag(isolated, "Reject", monkeypatch)
    assert str(run.state) == "success", run.state
    assert seen["subject"] == f"Re-close {DAY}: publish the next version?"
    (held, verdict, who, delta, outcome), = _decisions(s)
    assert (verdict, who) == ("rejected", "ops-anna") and outcome.startswith("rejected")
    # The operator saw the delta's size: exactly what publishing would change.
    assert (f"{delta['positions']} position(s) of {delta['accounts']} account(s) change"
            in seen["body"]) and delta["positions"] > 0
    assert positions_table(s.settlement_dsn, DAY) == v1
    with connect(s.settlement_dsn) as conn:
        assert conn.execute("select status, validation_success, published_at, version from "
                            "settlement_runs where run_id = %s", (held,)).fetchone() == (
            "succeeded", True, None, None)
    assert [w.amendments for w in awaiting_reclose(s, DAY)] == [2]
    # Approved: published as version 2, its reference positions, the decision recorded.
    run, seen = _run_reclose_dag(isolated, "Approve", monkeypatch)
    assert str(run.state) == "success", run.state
    decisions = _decisions(s)
    assert [(d[1], d[2], d[4]) for d in decisions] == [
        ("rejected", "ops-anna", outcome), ("approved", "ops-anna", "published as version 2")]
    assert decisions[1][0] != held
    reference = _reference([*amended_day["events"], *amended_day["covered"]])
    assert positions_table(s.settlement_dsn, DAY) == reference
    assert _version_positions(s, 1) == {k: (v[2], v[5]) for k, v in v1.items()}
    assert awaiting_reclose(s, DAY) == []
