"""Trading days: the end-of-day DAG runs once per exchange session, never on a holiday.

A weekday cron fires on exchange holidays, where the close-marker sensor then waits hours
for markers that never come. ``TradingDayTimetable`` asks an exchange calendar
(``exchange-calendars``; ``SETTLE_EXCHANGE_CALENDAR``, default ``XNYS``) for the sessions
and schedules each run ``after_close_minutes`` after that session's close, so an early close
(the day after Thanksgiving closes at 13:00 in New York) settles early too.

The class is registered by ``settlement.orchestration.plugin`` (Airflow refuses to
serialise a custom timetable that no plugin registers); the scheduler rebuilds it from
``serialize()`` in its own process.
"""

from __future__ import annotations

import datetime as dt
from functools import cache
from typing import TYPE_CHECKING, Any

import pendulum
from airflow.timetables.base import DagRunInfo, DataInterval, Timetable

if TYPE_CHECKING:
    from airflow.timetables.base import TimeRestriction
    from exchange_calendars import ExchangeCalendar


@cache
def exchange_calendar(name: str) -> ExchangeCalendar:
    """The calendar by its exchange-calendars code; loading one takes ~0.5 s, so once."""
    import exchange_calendars

    return exchange_calendars.get_calendar(name)


def calendar_timezone(name: str) -> str:
    return str(exchange_calendar(name).tz)


def session_run_times(name: str, after: dt.datetime, after_close: dt.timedelta,
                      count: int = 1) -> list[tuple[dt.date, pendulum.DateTime]]:
    """The next ``count`` sessions whose run time (close + ``after_close``) is at or after
    ``after``, as (session date, run time in UTC). Fewer when the calendar ends (it covers
    about a year ahead; exchange-calendars' releases extend it)."""
    import pandas as pd

    cal = exchange_calendar(name)
    # The session whose run is due at `after` can have started up to a day earlier.
    day = (pd.Timestamp(after.astimezone(dt.UTC)).tz_localize(None) - pd.Timedelta(days=1)
           ).normalize()
    out: list[tuple[dt.date, pendulum.DateTime]] = []
    if day > cal.last_session:
        return out
    for session in cal.sessions_in_range(max(day, cal.first_session), cal.last_session):
        run_at = pendulum.instance((cal.session_close(session) + after_close).to_pydatetime())
        if run_at >= after:
            out.append((session.date(), run_at.in_timezone("UTC")))
            if len(out) == count:
                break
    return out


class TradingDayTimetable(Timetable):
    """One run per trading session, ``after_close_minutes`` after the session's close.

    The run's logical date is its run time (a zero-length data interval, as with a cron
    trigger); in the exchange's time zone that is the session's date, which is the trade
    date the run settles.
    """

    def __init__(self, calendar: str = "XNYS", after_close_minutes: int = 30) -> None:
        self.calendar = calendar
        self.after_close_minutes = after_close_minutes
        self.description = (f"trading days of {calendar}, {after_close_minutes} min "
                            "after the close")

    @property
    def summary(self) -> str:
        return f"{self.calendar} sessions, close+{self.after_close_minutes}m"

    def serialize(self) -> dict[str, Any]:
        return {"calendar": self.calendar, "after_close_minutes": self.after_close_minutes}

    @classmethod
    def deserialize(cls, data: dict[str, Any]) -> TradingDayTimetable:
        return cls(str(data["calendar"]), int(data["after_close_minutes"]))

    def validate(self) -> None:
        from airflow.exceptions import AirflowTimetableInvalid

        try:
            exchange_calendar(self.calendar)
        except Exception as e:  # noqa: BLE001 - any failure means the name is unusable
            raise AirflowTimetableInvalid(
                f"exchange calendar {self.calendar!r}: {e} (SETTLE_EXCHANGE_CALENDAR takes an "
                "exchange-calendars code such as XNYS, XLON, XTKS)") from None

    def infer_manual_data_interval(self, *, run_after: pendulum.DateTime) -> DataInterval:
        return DataInterval.exact(run_after)

    def next_dagrun_info(self, *, last_automated_data_interval: DataInterval | None,
                         restriction: TimeRestriction) -> DagRunInfo | None:
        if last_automated_data_interval is not None:
            # Strictly after the last run: its run time is a session's own run time.
            after = last_automated_data_interval.end + dt.timedelta(microseconds=1)
        elif restriction.earliest is None:
            return None  # no start_date: nothing to schedule
        else:
            after = restriction.earliest
        if not restriction.catchup:
            # No backfill of missed sessions: the next session from now on.
            after = max(after, pendulum.now("UTC"))
        found = session_run_times(self.calendar, after,
                                  dt.timedelta(minutes=self.after_close_minutes))
        if not found:
            return None
        run_at = found[0][1]
        if restriction.latest is not None and run_at > restriction.latest:
            return None
        return DagRunInfo.exact(run_at)
