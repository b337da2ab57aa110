"""The end-of-day DAG's trading-day timetable: exchange holidays and weekends get no run."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys

import pendulum
import pytest

from tests.helpers import ROOT


def _next_runs(timetable, earliest: dt.datetime, n: int) -> list[pendulum.DateTime]:
    """What the scheduler would create next, run after run (as Airflow calls it)."""
    from airflow.timetables.base import TimeRestriction

    restriction = TimeRestriction(earliest=pendulum.instance(earliest), latest=None,
                                  catchup=True)
    runs, last = [], None
    for _ in range(n):
        info = timetable.next_dagrun_info(last_automated_data_interval=last,
                                          restriction=restriction)
        assert info is not None
        runs.append(info.logical_date)
        last = info.data_interval
    return runs


def _days(runs: list[pendulum.DateTime], tz: str) -> list[str]:
    from settlement.orchestration.tasks import trade_date_for

    os.environ.pop("SETTLE_EOD_TIMEZONE", None)
    out = [trade_date_for({}, r) for r in runs]
    assert out == [r.in_timezone(tz).date().isoformat() for r in runs]
    return out


@pytest.fixture(scope="module")
def eod_dag():
    from airflow.dag_processing.dagbag import DagBag

    os.environ.pop("SETTLE_EOD_CRON", None)
    bag = DagBag(dag_folder=str(ROOT / "dags" / "eod_settlement.py"))
    assert not bag.import_errors
    return bag.dags["eod_settlement"]


def test_eod_runs_skip_thanksgiving_and_the_weekend(eod_dag) -> None:
    from settlement.orchestration.calendar import TradingDayTimetable

    assert isinstance(eod_dag.timetable, TradingDayTimetable)
    assert eod_dag.timetable.calendar == "XNYS"
    runs = _next_runs(eod_dag.timetable, dt.datetime(2026, 11, 25, tzinfo=dt.UTC), 4)
    # Thu 26 Nov is Thanksgiving, 28-29 Nov a weekend.
    assert _days(runs, "America/New_York") == ["2026-11-25", "2026-11-27", "2026-11-30",
                                               "2026-12-01"]
    ny = [r.in_timezone("America/New_York").strftime("%H:%M") for r in runs]
    # 30 minutes after the close; the day after Thanksgiving closes early (13:00).
    assert ny == ["16:30", "13:30", "16:30", "16:30"]


def test_calendar_is_configurable() -> None:
    from settlement.orchestration.calendar import TradingDayTimetable

    # London: Christmas (Fri), the weekend, Boxing Day observed on Mon 28 Dec 2026.
    runs = _next_runs(TradingDayTimetable("XLON", 15), dt.datetime(2026, 12, 23, tzinfo=dt.UTC),
                      3)
    days = [r.in_timezone("Europe/London").date().isoformat() for r in runs]
    assert days == ["2026-12-23", "2026-12-24", "2026-12-29"]
    assert runs[1].in_timezone("Europe/London").strftime("%H:%M") == "12:45"  # early close


def test_no_backfill_without_catchup() -> None:
    from airflow.timetables.base import TimeRestriction

    from settlement.orchestration.calendar import TradingDayTimetable

    info = TradingDayTimetable().next_dagrun_info(
        last_automated_data_interval=None,
        restriction=TimeRestriction(earliest=pendulum.datetime(2026, 1, 1), latest=None,
                                    catchup=False))
    assert info is not None and info.logical_date >= pendulum.now("UTC")


def test_the_plugin_registers_the_timetable_for_the_scheduler(eod_dag) -> None:
    """Airflow serialises the DAG for the scheduler only if a plugin registers the custom
    timetable; the scheduler's copy must schedule the same sessions."""
    from airflow.serialization.serialized_objects import DagSerialization

    data = DagSerialization.to_dict(eod_dag)
    assert data["dag"]["timetable"]["__type"] == (
        "settlement.orchestration.calendar.TradingDayTimetable")
    restored = DagSerialization.from_dict(data)
    start = dt.datetime(2026, 11, 25, tzinfo=dt.UTC)
    assert _next_runs(restored.timetable, start, 3) == _next_runs(eod_dag.timetable, start, 3)


def test_a_bad_calendar_name_is_an_import_error() -> None:
    env = {**os.environ, "SETTLE_EXCHANGE_CALENDAR": "NOPE"}
    env.pop("SETTLE_EOD_CRON", None)
    code = ("from airflow.dag_processing.dagbag import DagBag; "
            f"b = DagBag(dag_folder={str(ROOT / 'dags' / 'eod_settlement.py')!r}); "
            "print('ERRORS', list(b.import_errors.values()))")
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=180)
    assert "NOPE" in res.stdout and "SETTLE_EXCHANGE_CALENDAR" in res.stdout, res.stdout[-2000:]


def test_compressed_days_settle_one_weekday_per_slot(monkeypatch: pytest.MonkeyPatch) -> None:
    """The soak's calendar: a close every 4 minutes, slot k settling the k-th weekday from
    the base (Fri 2026-04-03, then Mon 04-06: the weekend is skipped)."""
    from settlement.config import CompressedDays, Settings
    from settlement.orchestration.tasks import eod_schedule, trade_date_for

    text = "2026-04-02@2026-11-25T16:00:00+00:00/4"
    days = CompressedDays.parse(text)
    at = dt.datetime(2026, 11, 25, 16, 0, tzinfo=dt.UTC)
    slots = [days.trade_date(at + dt.timedelta(minutes=4 * k, seconds=s))
             for k, s in ((0, 0), (0, 239), (1, 0), (2, 0), (3, 0), (-1, 0))]
    assert slots == ["2026-04-02", "2026-04-02", "2026-04-03", "2026-04-06", "2026-04-07",
                     "2026-04-01"]
    assert eod_schedule(Settings(eod_compressed=text)) == "*/4 * * * *"
    monkeypatch.setenv("SETTLE_EOD_COMPRESSED", text)
    assert trade_date_for({}, pendulum.instance(at + dt.timedelta(minutes=8))) == "2026-04-06"
    assert trade_date_for({"trade_date": "2026-05-01"}, None) == "2026-05-01"


@pytest.mark.parametrize("text", ["2026-04-02/4", "2026-04-02@2026-11-25T16:00:00/4",
                                  "2026-04-02@2026-11-25T16:00:00+00:00/7", "x@y/4"])
def test_compressed_days_refuse_a_malformed_setting(text: str) -> None:
    from settlement.config import ConfigError, Settings, load_settings

    with pytest.raises(Exception, match="MINUTES|UTC offset|expected"):
        Settings(eod_compressed=text)
    os.environ["SETTLE_EOD_COMPRESSED"] = text
    try:
        with pytest.raises(ConfigError, match="SETTLE_EOD_COMPRESSED"):
            load_settings()
    finally:
        del os.environ["SETTLE_EOD_COMPRESSED"]
