"""Every Great Expectations check can fail: for each one, a day corrupted so that exactly
that check fails (and names what is wrong), and a good day that passes them all.

A test builds a whole day (the read, the settled day, the ledgers, the positions, the close
markers) from rows, the way a run derives them, changes one thing, and runs the suites that
see a frame which differs from the good day's (found from the suites' own assets and
queries, so a suite that is not run cannot have seen the change): a short run that still
shows the whole verdict. The good day and the late trade run every suite.
docs/operations.md ("Validation checks") lists each check with the test that shows it
failing; a test below keeps that table true.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from settlement.spark import transforms as T
from settlement.spark.schemas import AMENDMENT_SCHEMA, POSITIONS_SCHEMA
from settlement.spark.settle import net
from settlement.validation import DATA_LOSS_SCHEMA, ValidationOutcome, validate_frames
from settlement.validation.run import ensure_project, get_context
from settlement.validation.suites import all_suites
from tests.spark_fixtures import spark  # noqa: F401

DATE = "2026-11-23"
D = dt.date(2026, 11, 23)
TS = dt.datetime(2026, 11, 23, 14, 30, tzinfo=dt.UTC)
ROOT = Path(__file__).resolve().parents[1]

Row = tuple[Any, ...]


def _trade(i: int, partition: int, seq: int, buyer: str = "A", seller: str = "B",
           qty: int = 10, *, offset: int | None = None, price: str = "10.5000",
           date: dt.date = D) -> Row:
    return (f"T{i}", date, seq, partition, 100 + i if offset is None else offset,
            "AAPL" if partition == 0 else "MSFT", Decimal(price), qty, buyer, seller, TS)


GOOD = [_trade(1, 0, 1), _trade(2, 0, 2, "B", "C"), _trade(3, 0, 3, "C", "A"),
        _trade(4, 1, 1), _trade(5, 1, 2, "C", "B")]
# The Kafka read of a good day: a producer retry repeated T1 later in the log (same trade).
REPLAY = _trade(1, 0, 1, offset=200)
READ = [*GOOD, REPLAY]
MARKERS = {0: 3, 1: 2}

READ_DATES = "read_dates@as_read"
READ_COPIES = "read_copies@as_read"
TRADES = "trades_day@settlement_trades"
KAFKA = "reconcile_kafka_ledger@ledger_trades"
SITES = "reconcile_site_a_b@ledger_b_trades"
INVARIANTS = "settlement_invariants@positions"
LOSS = "data_loss@data_loss"
AMENDS = "amendments_day@amendments"
RECONCILE_AMENDS = "reconcile_amendments@amendments"

ALL_CHECKS = {
    f"{READ_DATES}: every trade read is of the run's date",
    f"{READ_COPIES}: copies of a trade id agree",
    f"{TRADES}: every partition closed",
    f"{TRADES}: no sequence gaps",
    f"{TRADES}: no trade beyond its close marker",
    f"{TRADES}: one trade per partition and seq",
    f"{KAFKA}: in kafka_day, missing from ledger",
    f"{KAFKA}: in ledger, missing from kafka_day",
    f"{KAFKA}: kafka_day and ledger agree on each trade",
    f"{SITES}: in ledger_a_day, missing from ledger_b",
    f"{SITES}: in ledger_b, missing from ledger_a_day",
    f"{SITES}: ledger_a_day and ledger_b agree on each trade",
    f"{LOSS}: no offset of the day was deleted unread",
    f"{INVARIANTS}: net quantity sums to 0 per symbol",
    f"{INVARIANTS}: net cash sums to 0",
    f"{INVARIANTS}: net columns are consistent",
    f"{INVARIANTS}: trade counts are twice the trades read",
    f"{INVARIANTS}: positions carry the day's volume and notional",
    f"{AMENDS}: every amendment refers to a trade of the day",
    f"{AMENDS}: versions only rise",
    f"{RECONCILE_AMENDS}: amendments missing from the other copy",
    f"{RECONCILE_AMENDS}: amendments missing from the settled day",
    f"{RECONCILE_AMENDS}: both copies agree on each amendment",
}


def _amend(trade: Row, seq: int, offset: int, kind: str = "correct", version: int = 2,
           qty: int | None = None, price: str | None = None) -> Row:
    """A cancel (``kind``) or a correction of ``trade`` (AMENDMENT_SCHEMA order) at its own
    seq and offset on the trade's partition."""
    tid, date, _, part, _, symbol, old_price, old_qty, buyer, seller, at = trade
    if kind == "cancel":
        return (tid, date, seq, part, offset, kind, None, "trade break", None, None, None, None,
                None, None)
    return (tid, date, seq, part, offset, kind, version, None, symbol,
            Decimal(price) if price else old_price, qty or old_qty, buyer, seller, at)


# A day with a bust and a correction: T1 corrected (seq 4 of partition 0), T3 busted (seq 5).
AMENDED = (_amend(GOOD[0], 4, 300, qty=12, price="10.4000"), _amend(GOOD[2], 5, 301, "cancel"))
AMENDED_MARKERS = ((0, 5), (1, 2))

# How validate_frames registers each frame: as a suite's asset and/or as a view its queries
# read.
FRAME_NAMES = {
    "as_read": ("as_read", "read_trades"),
    "settled": ("settlement_trades", "settled_symbols", "amended_trades", "day_partitions"),
    "kafka": ("kafka_day",),
    "ledger": ("ledger_trades",),
    "ledger_a": ("ledger_a_day",),
    "ledger_b": ("ledger_b_trades",),
    "positions": ("positions",),
    "markers": ("close_markers_day",),
    "data_loss": ("data_loss",),
    "amendments": ("amendments", "day_amendments", "day_cancelled"),
    "other_amendments": ("other_amendments",),
}


def readers(frames: set[str]) -> set[str]:
    """The suites (``suite@asset``) that see any of these frames."""
    out = set()
    for plan in all_suites():
        text = " ".join([plan.asset, *(e.unexpected_rows_query for e in plan.suite.expectations)])
        if any(re.search(rf"\b{name}\b", text) for f in frames for name in FRAME_NAMES[f]):
            out.add(plan.name)
    return out


@dataclass(frozen=True)
class Day:
    """One run's inputs as rows. Unset frames are derived as a run derives them: the settled
    day is the read's trades of the date, deduplicated; a complete ledger holds the settled
    day; in the separate scheme both site ledgers hold the ledger's trades."""

    read: tuple[Row, ...] = tuple(READ)
    source: str = "kafka"  # "db": one ledger, read by date (trade_id its primary key)
    settled: tuple[Row, ...] | None = None
    ledger: tuple[Row, ...] | None = None
    ledger_a: tuple[Row, ...] | None = None
    ledger_b: tuple[Row, ...] | None = None
    markers: tuple[tuple[int, int], ...] = tuple(MARKERS.items())
    positions: Any = None  # a function (spark, settled frame) -> positions frame
    data_loss: tuple[Row, ...] = ()  # retention gaps the sites recorded (DATA_LOSS_SCHEMA)
    amendments: tuple[Row, ...] = ()  # the day's cancels and corrections (AMENDMENT_SCHEMA)
    # the ledger's copy of them (Kafka-sourced) or site B's (db); None: the same
    other_amendments: tuple[Row, ...] | None = None

    def frames(self) -> dict[str, Any]:
        settled = list(self.settled) if self.settled is not None else _settle(self.read)
        if self.source == "db":
            ledger, a, b, kafka = settled, None, None, None
        else:
            ledger = list(self.ledger) if self.ledger is not None else settled
            a = list(self.ledger_a) if self.ledger_a is not None else ledger
            b = list(self.ledger_b) if self.ledger_b is not None else ledger
            kafka = settled
        return {"as_read": list(self.read), "settled": settled, "kafka": kafka,
                "ledger": ledger, "ledger_a": a, "ledger_b": b, "markers": dict(self.markers),
                "data_loss": list(self.data_loss), "amendments": list(self.amendments),
                "other_amendments": list(self.amendments if self.other_amendments is None
                                         else self.other_amendments)}


def db_day(rows: list[Row] = GOOD, **kw: Any) -> Day:
    return Day(read=tuple(rows), source="db", **kw)


def _settle(rows: tuple[Row, ...] | list[Row]) -> list[Row]:
    first: dict[str, Row] = {}
    for r in sorted((r for r in rows if r[1] == D), key=lambda r: (r[3], r[4])):
        first.setdefault(r[0], r)
    return sorted(first.values(), key=lambda r: (r[3], r[4]))


def frame(spark: SparkSession, rows: list[Row] | None) -> DataFrame | None:  # noqa: F811
    return None if rows is None else spark.createDataFrame(rows, T.TRADE_SCHEMA)


def validate(spark: SparkSession, day: Day, everything: bool = False,  # noqa: F811
             **reader: bool) -> ValidationOutcome:
    """Run the suites that see a frame differing from the good day's (all: ``everything``)."""
    rows = day.frames()
    only = None
    if not everything:
        base = (db_day() if day.source == "db" else Day()).frames()
        changed = {k for k, v in rows.items() if v != base[k]}
        if day.positions is not None or "settled" in changed:
            changed.add("positions")
        only = readers(changed)
    settled = frame(spark, rows["settled"])
    assert settled is not None
    amendments = spark.createDataFrame(rows["amendments"], AMENDMENT_SCHEMA)
    final = T.with_final_states(settled, T.final_states(amendments.collect()))
    positions = (day.positions or positions_of)(spark, final)
    return validate_frames(
        spark, trade_date=DATE, partitions=2, as_read=frame(spark, rows["as_read"]),
        settlement_trades=settled, close_markers=rows["markers"], positions=positions,
        ledger=frame(spark, rows["ledger"]), kafka=settled if rows["kafka"] is not None else None,
        ledger_a=frame(spark, rows["ledger_a"]), ledger_b=frame(spark, rows["ledger_b"]),
        data_loss=spark.createDataFrame(rows["data_loss"], DATA_LOSS_SCHEMA),
        unique_ids=day.source == "db", only=only, amendments=amendments,
        other_amendments=spark.createDataFrame(rows["other_amendments"], AMENDMENT_SCHEMA),
        **reader)


def positions_of(spark: SparkSession, trades: DataFrame) -> DataFrame:  # noqa: F811
    """The close's positions of ``trades`` (settlement.spark.settle.net) as a frame."""
    return spark.createDataFrame(net(trades, DATE).positions, POSITIONS_SCHEMA)


def failing(out: ValidationOutcome) -> set[str]:
    """Every check that failed: those that fail the run and the warnings."""
    return {f"{c.suite}@{c.asset}: {c.name}" for c in out.checks if not c.success}


def examples(out: ValidationOutcome, name: str) -> list[Any]:
    return next(c.examples for c in out.checks if f"{c.suite}@{c.asset}: {c.name}" == name)


def fails_alone(spark: SparkSession, day: Day, check: str, everything: bool = False,  # noqa: F811
                warning: bool = False) -> list[Any]:
    """Exactly ``check`` fails (and so does the run, unless it is a warning); returns the
    rows it names."""
    assert check in ALL_CHECKS
    out = validate(spark, day, everything)
    assert failing(out) == {check}, [c.as_dict() for c in out.checks if not c.success]
    assert out.success is warning
    assert [f"{c.suite}@{c.asset}: {c.name}" for c in out.warnings] == ([check] if warning else [])
    return examples(out, check)


def bump(**deltas: dict[tuple[str, str], int]) -> Any:
    """Positions of the settled day with columns changed on some (account, symbol) rows:
    ``bump(net_qty={("A", "AAPL"): 1})``."""
    def positions(spark: SparkSession, settled: DataFrame) -> DataFrame:  # noqa: F811
        pos = positions_of(spark, settled)
        for col, changes in deltas.items():
            new = F.col(col)
            for (account, symbol), d in changes.items():
                hit = (F.col("account") == account) & (F.col("symbol") == symbol)
                new = F.when(hit, F.col(col) + F.lit(d)).otherwise(new)
            pos = pos.withColumn(col, new.cast(pos.schema[col].dataType))
        return pos

    return positions


# -- good days -----------------------------------------------------------------------------


@pytest.mark.parametrize("docs_in_background", [False, True])
def test_a_good_day_passes_every_check(spark: SparkSession,  # noqa: F811
                                       docs_in_background: bool) -> None:
    """Kafka-sourced, separate scheme: nothing is skipped; a replayed copy is no failure.
    Data Docs built in the background (as a close builds them) are the same pages, there
    once ``wait_for_docs`` returns."""
    import time
    from urllib.parse import urlparse

    started = time.time()
    out = validate(spark, Day(amendments=AMENDED, markers=AMENDED_MARKERS), everything=True,
                   docs_in_background=docs_in_background)
    assert (out.docs_pending is not None) == docs_in_background
    out.wait_for_docs()
    assert out.docs_pending is None
    assert out.success, [c.as_dict() for c in out.failures]
    assert out.skipped == {}
    assert {f"{c.suite}@{c.asset}: {c.name}" for c in out.checks} == ALL_CHECKS
    assert len(out.checks) == len(ALL_CHECKS)
    # Data Docs (now built once at the end of the run, not per checkpoint) still get a page
    # for each suite's result of this run and a fresh index.
    assert out.data_docs is not None
    index = Path(urlparse(out.data_docs).path)
    assert index.is_file() and index.stat().st_mtime >= started - 1
    pages = {p.relative_to(index.parent / "validations").parts[0]
             for p in (index.parent / "validations").rglob("*.html")
             if p.stat().st_mtime >= started - 1}
    assert pages == {c.suite for c in out.checks}, pages
    # Each suite's page of this run is named in the outcome (the report links them): the
    # index lists only the newest results.
    assert set(out.data_docs_pages) == {f"{c.suite}@{c.asset}" for c in out.checks}
    for name, url in out.data_docs_pages.items():
        page = Path(urlparse(url).path)
        assert page.is_file() and page.stat().st_mtime >= started - 1, name
        assert name.split("@")[0] in page.parts, (name, page)


INDEX_LINK = re.compile(r"validations/[^'\"]+\.html")


def test_the_data_docs_index_lists_only_the_newest_results(spark: SparkSession  # noqa: F811
                                                           ) -> None:
    """An unbounded index read every stored result at each build. With a limit of 3 the
    index links 3 result pages, this run's among them, while older pages stay on disk."""
    from urllib.parse import urlparse

    from settlement.validation.run import limit_docs_index

    context = get_context()
    site = next(iter(context.variables.data_docs_sites.values()))
    assert site["site_index_builder"]["validation_results_limit"] == 100
    out = validate(spark, Day(), everything=True)  # at least the 9 results of a good day
    assert out.data_docs is not None
    index = Path(urlparse(out.data_docs).path)
    listed_before = set(INDEX_LINK.findall(index.read_text()))
    assert len(listed_before) > 3
    context = get_context()
    site = next(iter(context.variables.config["data_docs_sites"].values()))
    site["site_index_builder"].pop("validation_results_limit")
    limit_docs_index(context, 3)
    newest = list(out.data_docs_pages.values())[-1]  # the last suite run: the newest result
    key = next(k for k in context.validation_results_store.list_keys()
               if newest.endswith("/".join(k.to_tuple()) + ".html"))
    context.build_data_docs(resource_identifiers=[key], build_index=True)
    listed = set(INDEX_LINK.findall(index.read_text()))
    assert len(listed) == 3, listed
    assert any(newest.endswith(p) for p in listed), (newest, listed)
    assert all((index.parent / p).is_file() for p in listed_before)


def test_a_ledger_sourced_day_skips_the_checks_that_cannot_fail(spark: SparkSession  # noqa: F811
                                                                 ) -> None:
    """One ledger read by date: no other date, no repeated id, no Kafka, no second site. (The
    checks that do apply run in the tests below on ledger-sourced days.)"""
    skippable = {READ_DATES, READ_COPIES, KAFKA, SITES}
    day = frame(spark, GOOD)
    out = validate_frames(spark, trade_date=DATE, partitions=2, as_read=day,
                          settlement_trades=day, close_markers=MARKERS, ledger=day,
                          unique_ids=True, only=skippable)
    assert out.checks == []
    assert set(out.skipped) == skippable
    assert "read from the ledger by date" in out.skipped[READ_DATES]
    assert "primary key" in out.skipped[READ_COPIES]


def test_an_empty_day_with_no_markers_passes(spark: SparkSession) -> None:  # noqa: F811
    out = validate(spark, db_day([], markers=((0, 0), (1, 0))), everything=True)
    assert out.success, [c.as_dict() for c in out.failures]


# -- the read as it came in ----------------------------------------------------------------


def test_a_late_trade_of_the_day_before_fails_only_the_date_check(spark: SparkSession  # noqa: F811
                                                                  ) -> None:
    """Everything runs: a trade of D-1 that arrived after D-1's close marker, inside D's
    Kafka range, is named; the date filter would have dropped it silently. A warning: D
    itself is complete and right, so the run passes with it."""
    late = _trade(0, 0, 9, offset=100, date=D - dt.timedelta(days=1))
    rows = fails_alone(spark, Day(read=(*READ, late)),
                       f"{READ_DATES}: every trade read is of the run's date", everything=True,
                       warning=True)
    assert rows == [{"trade_id": "T0", "trade_date": "2026-11-22", "kafka_partition": 0,
                     "kafka_offset": 100, "seq": 9}]


def test_two_trades_under_one_id_fail_only_the_copies_check(spark: SparkSession  # noqa: F811
                                                            ) -> None:
    """The dedupe keeps the first copy (the settled day is unchanged): only the read shows
    that the 'replay' at offset 200 was a different trade."""
    other = _trade(1, 0, 1, offset=200, price="10.6000")
    rows = fails_alone(spark, Day(read=(*GOOD, other)),
                       f"{READ_COPIES}: copies of a trade id agree")
    assert rows == [{"trade_id": "T1", "copies": 2, "versions": 2, "offsets": "0:101, 0:200"}]


def test_copies_are_not_compared_again_when_reader_and_ledger_rule_a_conflict_out(
        spark: SparkSession) -> None:  # noqa: F811
    """The Kafka reader compared every copy in its partition; the day's checksums equal the
    ledger's (unique trade ids) and the read held only the day: read_copies cannot fail and
    is skipped. A second trade under T1 in another partition breaks the premise: the ledger
    holds T1 once, the bucket differs, and read_copies runs and names T1."""
    kafka_read = {"copies_agree_within_partitions": True, "as_read_only_the_day": True}
    good = validate(spark, Day(), everything=True, **kafka_read)
    assert good.success and "primary key" not in good.skipped[READ_COPIES]
    assert "checksums equal the ledger's" in good.skipped[READ_COPIES]
    assert "no trade of another date" in good.skipped[READ_DATES]
    # Not skipped when the read held a trade of another date.
    other = validate(spark, Day(), everything=True, copies_agree_within_partitions=True)
    assert READ_COPIES not in other.skipped and READ_DATES not in other.skipped
    second = _trade(1, 1, 3, "C", "A", offset=300)  # T1 again, partition 1
    day = Day(read=(*READ, second), settled=(*GOOD, second), markers=((0, 3), (1, 3)),
              ledger=tuple(GOOD))
    out = validate(spark, day, everything=True, **kafka_read)
    assert out.figures["reconcile_kafka_ledger"]["named"] == [[1, 0]]
    assert READ_COPIES not in out.skipped and not out.success
    assert [r["trade_id"] for r in examples(out, f"{READ_COPIES}: copies of a trade id agree")
            ] == ["T1"]


# -- the settled day -----------------------------------------------------------------------


def test_a_missing_close_marker_fails_only_every_partition_closed(spark: SparkSession  # noqa: F811
                                                                  ) -> None:
    rows = fails_alone(spark, Day(markers=((0, 3),)), f"{TRADES}: every partition closed")
    assert rows == [{"kafka_partition": 1}]


def test_a_lost_trade_is_named_by_partition_and_seq(spark: SparkSession) -> None:  # noqa: F811
    rows = fails_alone(spark, db_day([t for t in GOOD if t[0] != "T2"]),
                       f"{TRADES}: no sequence gaps")
    assert rows == [{"trade_date": DATE, "kafka_partition": 0, "seq": 2}]


def test_a_missing_partition_tail_is_named(spark: SparkSession) -> None:  # noqa: F811
    rows = fails_alone(spark, Day(markers=((0, 5), (1, 2))), f"{TRADES}: no sequence gaps")
    assert [(r["kafka_partition"], r["seq"]) for r in rows] == [(0, 4), (0, 5)]


def test_a_trade_beyond_its_close_marker_is_named(spark: SparkSession) -> None:  # noqa: F811
    rows = fails_alone(spark, db_day([*GOOD, _trade(6, 1, 3, "A", "C")]),
                       f"{TRADES}: no trade beyond its close marker")
    assert rows == [{"trade_id": "T6", "kafka_partition": 1, "seq": 3, "last_seq": 2}]


def test_two_trades_at_one_seq_are_named(spark: SparkSession) -> None:  # noqa: F811
    rows = fails_alone(spark, db_day([*GOOD, _trade(7, 0, 2, "C", "B")]),
                       f"{TRADES}: one trade per partition and seq")
    assert rows == [{"kafka_partition": 0, "seq": 2, "trades": 2, "trade_ids": "T2, T7"}]


def test_a_retention_gap_a_site_recorded_is_named(spark: SparkSession) -> None:  # noqa: F811
    """The settled day is complete (the other site read everything), yet site A's ledger
    lost offsets of the day to retention: the gap fails the day, by partition and range."""
    gap = ("a", 1, 40, 75, "A", "2026-11-23T18:00:00+00:00")
    rows = fails_alone(spark, Day(data_loss=(gap,)),
                       f"{LOSS}: no offset of the day was deleted unread")
    assert rows == [{"ledger": "a", "kafka_partition": 1, "from_offset": 40, "to_offset": 75,
                     "site": "A", "detected_at": "2026-11-23T18:00:00+00:00"}]


# -- Kafka vs the ledger -------------------------------------------------------------------


def test_a_trade_missing_from_the_ledger_is_named(spark: SparkSession) -> None:  # noqa: F811
    rows = fails_alone(spark, Day(ledger=tuple(GOOD[1:])),
                       f"{KAFKA}: in kafka_day, missing from ledger")
    assert [r["trade_id"] for r in rows] == ["T1"]


def test_only_buckets_whose_checksums_differ_are_searched(spark: SparkSession  # noqa: F811
                                                          ) -> None:
    """A good day searches nothing trade by trade; a lost trade makes its partition suspect
    and its bucket differ, and nothing else."""
    good = validate(spark, Day(), everything=True)
    assert good.figures["trades_day"]["suspect_partitions"] == []
    for suite in ("reconcile_kafka_ledger", "reconcile_site_a_b"):
        fig = good.figures[suite]
        assert (fig["buckets"], fig["differing"]) == (2, 0), fig
    # Kafka lost T5 (partition 1, seq 2); the ledgers hold it.
    lost = validate(spark, Day(read=tuple(t for t in READ if t[0] != "T5"), ledger=tuple(GOOD)),
                    everything=True)
    assert lost.figures["trades_day"]["suspect_partitions"] == [1]
    assert lost.figures["reconcile_kafka_ledger"]["named"] == [[1, 0]]
    assert lost.figures["reconcile_site_a_b"]["differing"] == 0
    assert {c.name for c in lost.failures} == {"no sequence gaps",
                                               "in ledger, missing from kafka_day"}


def test_a_trade_that_differs_only_in_its_execution_time_is_named(spark: SparkSession  # noqa: F811
                                                                  ) -> None:
    """Every field the checksums hash is compared trade by trade."""
    later = TS + dt.timedelta(microseconds=1)
    ledger = [(*t[:-1], later) if t[0] == "T2" else t for t in GOOD]
    rows = fails_alone(spark, Day(ledger=tuple(ledger)),
                       f"{KAFKA}: kafka_day and ledger agree on each trade")
    assert [r["trade_id"] for r in rows] == ["T2"]


def test_a_ledger_trade_missing_from_kafka_is_named(spark: SparkSession) -> None:  # noqa: F811
    rows = fails_alone(spark, Day(ledger=(*GOOD, _trade(8, 1, 3))),
                       f"{KAFKA}: in ledger, missing from kafka_day")
    assert [r["trade_id"] for r in rows] == ["T8"]


def test_a_ledger_trade_that_differs_from_kafka_is_named(spark: SparkSession) -> None:  # noqa: F811
    ledger = [_trade(3, 0, 3, "C", "A", qty=11) if t[0] == "T3" else t for t in GOOD]
    rows = fails_alone(spark, Day(ledger=tuple(ledger)),
                       f"{KAFKA}: kafka_day and ledger agree on each trade")
    assert [r["trade_id"] for r in rows] == ["T3"]


# -- site A vs site B ----------------------------------------------------------------------


def test_a_site_b_ledger_missing_a_trade_is_named(spark: SparkSession) -> None:  # noqa: F811
    rows = fails_alone(spark, Day(ledger_b=tuple(GOOD[:-1])),
                       f"{SITES}: in ledger_a_day, missing from ledger_b")
    assert [r["trade_id"] for r in rows] == ["T5"]


def test_a_site_a_ledger_missing_a_trade_is_named(spark: SparkSession) -> None:  # noqa: F811
    rows = fails_alone(spark, Day(ledger_a=tuple(GOOD[:-1])),
                       f"{SITES}: in ledger_b, missing from ledger_a_day")
    assert [r["trade_id"] for r in rows] == ["T5"]


def test_site_ledgers_that_differ_on_a_trade_are_named(spark: SparkSession) -> None:  # noqa: F811
    b = [_trade(4, 1, 1, "A", "C") if t[0] == "T4" else t for t in GOOD]
    rows = fails_alone(spark, Day(ledger_b=tuple(b)),
                       f"{SITES}: ledger_a_day and ledger_b agree on each trade")
    assert [r["trade_id"] for r in rows] == ["T4"]


# -- the positions -------------------------------------------------------------------------


def test_an_unbalanced_position_is_named(spark: SparkSession) -> None:  # noqa: F811
    # A sold one share less: its net is consistent, the instrument no longer nets to zero.
    day = Day(positions=bump(sold_qty={("A", "AAPL"): -1}, net_qty={("A", "AAPL"): 1}))
    rows = fails_alone(spark, day, f"{INVARIANTS}: net quantity sums to 0 per symbol")
    assert rows == [{"symbol": "AAPL", "net": 1}]


def test_cash_that_does_not_net_to_zero_is_named(spark: SparkSession) -> None:  # noqa: F811
    day = Day(positions=bump(sell_amount={("B", "MSFT"): 1}, net_cash={("B", "MSFT"): 1}))
    rows = fails_alone(spark, day, f"{INVARIANTS}: net cash sums to 0")
    assert rows == [{"net_cash": "1.0000"}]


def test_inconsistent_net_columns_are_named(spark: SparkSession) -> None:  # noqa: F811
    # Net moved between two accounts: every sum still balances, the rows do not.
    day = Day(positions=bump(net_qty={("A", "AAPL"): 1, ("B", "AAPL"): -1}))
    rows = fails_alone(spark, day, f"{INVARIANTS}: net columns are consistent")
    assert sorted((r["account"], r["symbol"]) for r in rows) == [("A", "AAPL"), ("B", "AAPL")]


def test_a_leg_counted_twice_is_named(spark: SparkSession) -> None:  # noqa: F811
    # The read holds 5 trades (T1 twice, one trade): 10 legs, not 11.
    day = Day(positions=bump(trade_count={("C", "MSFT"): 1}))
    rows = fails_alone(spark, day, f"{INVARIANTS}: trade counts are twice the trades read")
    assert rows == [{"legs": 11, "trades": 5, "cancelled": 0}]


def test_positions_that_lose_volume_are_named(spark: SparkSession) -> None:  # noqa: F811
    # One more share bought by A and sold by B: nets, cash and counts all still balance.
    day = Day(positions=bump(bought_qty={("A", "AAPL"): 1}, net_qty={("A", "AAPL"): 1,
                                                                     ("B", "AAPL"): -1},
                             sold_qty={("B", "AAPL"): 1}))
    rows = fails_alone(spark, day, f"{INVARIANTS}: positions carry the day's volume and notional")
    assert [(r["symbol"], r["volume"], r["bought"]) for r in rows] == [("AAPL", 30, 31)]


# -- the project and the docs --------------------------------------------------------------


def _project_files() -> dict[str, bytes]:
    root = get_context().root_directory
    return {str(p.relative_to(root)): p.read_bytes() for p in Path(root).rglob("*")
            if p.is_file() and "uncommitted" not in p.parts}


def test_the_stored_project_is_the_code_and_is_reused() -> None:
    ensure_project(get_context())
    before = _project_files()
    checkpoints = ensure_project(get_context())
    assert _project_files() == before  # nothing rewritten: the stored suites are reused
    names = {p.name for p in all_suites()}
    assert set(checkpoints) == names
    stored = {n.removeprefix("checkpoints/").removesuffix(".json") for n in before
              if n.startswith("checkpoints/")}
    assert stored == names  # and nothing stale left behind


def test_the_operations_guide_lists_every_check_with_its_failing_test() -> None:
    text = (ROOT / "docs" / "operations.md").read_text()
    section = text.split("## Validation checks", 1)[1].split("\n## ", 1)[0]
    rows = [[c.strip().strip("`") for c in line.strip().strip("|").split("|")]
            for line in section.splitlines() if line.startswith("| `")]
    documented = {f"{r[0]}: {r[1]}": r[3] for r in rows}
    assert set(documented) == ALL_CHECKS
    tests = {n for n in globals() if n.startswith("test_")}
    assert set(documented.values()) <= tests, set(documented.values()) - tests


# -- busts and corrections -------------------------------------------------------------------


def amended_day(**kw: Any) -> Day:
    return Day(**{"amendments": AMENDED, "markers": AMENDED_MARKERS, **kw})


def test_a_day_without_amendments_skips_their_checks(spark: SparkSession) -> None:  # noqa: F811
    out = validate(spark, Day(), everything=True)
    assert out.success and set(out.skipped) == {AMENDS}, out.skipped
    assert out.skipped[AMENDS] == "no cancel or correction on this day"


def test_an_amendment_of_a_trade_not_in_the_day_is_named(spark: SparkSession) -> None:  # noqa: F811
    ghost = _amend(_trade(9, 1, 9), 3, 302, "cancel")
    rows = fails_alone(spark, amended_day(amendments=(*AMENDED, ghost),
                                          markers=((0, 5), (1, 3))),
                       f"{AMENDS}: every amendment refers to a trade of the day")
    assert rows == [{"trade_id": "T9", "kind": "cancel", "version": None,
                     "kafka_partition": 1, "kafka_offset": 302}]


def test_a_falling_version_and_a_correction_after_a_bust_are_named(spark: SparkSession  # noqa: F811
                                                                     ) -> None:
    v3 = _amend(GOOD[0], 4, 300, version=3, qty=12)
    v2 = _amend(GOOD[0], 5, 301, version=2, qty=13)
    after_bust = _amend(GOOD[2], 6, 303, version=2)
    day = amended_day(amendments=(v3, v2, _amend(GOOD[2], 7, 302, "cancel"), after_bust),
                      markers=((0, 7), (1, 2)))
    rows = fails_alone(spark, day, f"{AMENDS}: versions only rise")
    assert sorted((r["trade_id"], r["earlier"], r["later"]) for r in rows) == [
        ("T1", "correct", "correct"), ("T3", "cancel", "correct")]


def test_amendments_the_other_copy_lacks_or_states_otherwise_are_named(
        spark: SparkSession) -> None:  # noqa: F811
    changed = _amend(GOOD[0], 4, 300, qty=99, price="10.4000")
    out = validate(spark, amended_day(other_amendments=(changed,)))
    assert failing(out) == {f"{RECONCILE_AMENDS}: amendments missing from the other copy",
                            f"{RECONCILE_AMENDS}: both copies agree on each amendment"}
    assert examples(out, f"{RECONCILE_AMENDS}: amendments missing from the other copy") == [
        {"trade_id": "T3", "kind": "cancel", "version": None}]


def test_an_amendments_seq_counts_in_the_day(spark: SparkSession) -> None:  # noqa: F811
    """The close marker counts amendments: without the bust at seq 5, seq 5 is lost."""
    rows = fails_alone(spark, amended_day(amendments=AMENDED[:1]), f"{TRADES}: no sequence gaps")
    assert rows == [{"trade_date": DATE, "kafka_partition": 0, "seq": 5}]


def test_positions_that_ignore_a_bust_fail_the_invariants(spark: SparkSession) -> None:  # noqa: F811
    as_sent = amended_day(positions=lambda s, t: positions_of(
        s, s.createDataFrame(GOOD, T.TRADE_SCHEMA)))
    out = validate(spark, as_sent)
    assert f"{INVARIANTS}: trade counts are twice the trades read" in failing(out)
    assert f"{INVARIANTS}: positions carry the day's volume and notional" in failing(out)


def test_a_preparation_no_close_took_is_forgotten() -> None:
    """A close makes the GX project ready ahead of its validation; one that fails before
    validating forgets it (``discard_prepared``), or a later run in the process would take a
    context read long before (its Data Docs build failed in the suite that way)."""
    from settlement.config import load_settings
    from settlement.validation import run as R

    s = load_settings()
    R.prepare_context(s)
    assert s.gx_project_dir in R._prepared
    R.discard_prepared(s)
    assert s.gx_project_dir not in R._prepared
