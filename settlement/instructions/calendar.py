"""The settlement calendar: on which day a trade date settles.

A trade settles N settlement business days after its trade date (``SETTLE_SETTLEMENT_CYCLE``,
T+1 for US equities since May 2024). A settlement business day is an exchange session
(``exchange-calendars``; ``SETTLE_EXCHANGE_CALENDAR``) on which settlement is open: in the US
the Federal Reserve's holidays on which the exchange trades (Columbus Day, Veterans Day) close
settlement, so a trade of Friday 2026-10-09 settles on Tuesday 2026-10-13, not on Columbus
Day. ``SETTLE_SETTLEMENT_HOLIDAYS`` names that rule ("us-banks"), "none", and extra dates.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from exchange_calendars import ExchangeCalendar

    from settlement.config import Settings

# exchange-calendars builds a window around today by default (about a year ahead); the
# settlement calendar builds the trade date's year and the next (T+5 at most crosses one new
# year): 0.2 s against 1.8 s for a century, paid by every close.
FIRST_YEAR, LAST_YEAR = 2000, 2099


class CalendarError(ValueError):
    """The settlement date cannot be known (a date outside the calendar, a bad setting)."""


@cache
def exchange_calendar(name: str, year: int) -> ExchangeCalendar:
    """The exchange's calendar of ``year`` and the next, by its exchange-calendars code,
    built once per process."""
    import exchange_calendars

    try:
        return exchange_calendars.get_calendar(name, start=f"{year}-01-01",
                                               end=f"{year + 1}-12-31")
    except Exception as e:  # noqa: BLE001 - any failure means the name is unusable
        raise CalendarError(f"exchange calendar {name!r}: {e} (SETTLE_EXCHANGE_CALENDAR takes "
                            "an exchange-calendars code such as XNYS, XLON, XTKS)") from None


def _nth_weekday(year: int, month: int, weekday: int, n: int) -> dt.date:
    first = dt.date(year, month, 1)
    return first + dt.timedelta(days=(weekday - first.weekday()) % 7 + 7 * (n - 1))


def us_bank_holidays(year: int) -> set[dt.date]:
    """The Federal Reserve's holidays on which US exchanges trade: Columbus Day (second
    Monday of October) and Veterans Day (11 November; on a Sunday the Monday after; on a
    Saturday not observed, as the Federal Reserve does)."""
    veterans = dt.date(year, 11, 11)
    if veterans.weekday() == 6:
        veterans += dt.timedelta(days=1)
    days = {_nth_weekday(year, 10, 0, 2)}
    if veterans.weekday() < 5:
        days.add(veterans)
    return days


@dataclass(frozen=True)
class SettlementCalendar:
    exchange: str
    cycle_days: int
    rules: tuple[str, ...]  # "us-banks"
    extra_holidays: frozenset[dt.date]

    @classmethod
    def from_settings(cls, settings: Settings) -> SettlementCalendar:
        parts = [p.strip() for p in settings.settlement_holidays.split(",") if p.strip()]
        rules = tuple(p for p in parts if p == "us-banks")
        extra = frozenset(dt.date.fromisoformat(p) for p in parts
                          if p not in ("us-banks", "none"))
        return cls(settings.exchange_calendar, int(settings.settlement_cycle[2:]), rules, extra)

    def bank_holiday(self, day: dt.date) -> bool:
        return day in self.extra_holidays or (
            "us-banks" in self.rules and day in us_bank_holidays(day.year))

    def settlement_day(self, day: dt.date, base_year: int) -> bool:
        """An exchange session on which settlement is open."""
        return exchange_calendar(self.exchange, base_year).is_session(day.isoformat()) \
            and not self.bank_holiday(day)

    def settlement_date(self, trade_date: dt.date) -> dt.date:
        """T+N: the N-th settlement business day after ``trade_date`` (T+0: the trade date
        itself when it is one, else the next)."""
        if not FIRST_YEAR <= trade_date.year < LAST_YEAR:
            raise CalendarError(f"{trade_date} is outside the settlement calendar "
                                f"({FIRST_YEAR}-{LAST_YEAR - 1})")
        if self.cycle_days:
            return self.add_days(trade_date, self.cycle_days)
        day = trade_date
        while not self.settlement_day(day, trade_date.year):
            day += dt.timedelta(days=1)
        return day

    def add_days(self, start: dt.date, n: int) -> dt.date:
        """The n-th settlement day after ``start`` (T+N; a fail's close-out date)."""
        day, left = start, n
        while left:
            day += dt.timedelta(days=1)
            left -= self.settlement_day(day, start.year)
        return day

    def days_between(self, start: dt.date, end: dt.date) -> int:
        """Settlement days after ``start`` up to and including ``end`` (a fail's age: 0 on
        its intended settlement date, 1 the next settlement day)."""
        day, n = start, 0
        while day < end:
            day += dt.timedelta(days=1)
            n += self.settlement_day(day, start.year)
        return n


def settlement_date(settings: Settings, trade_date: str | dt.date) -> dt.date:
    """The settlement date of ``trade_date`` under this deployment's cycle and calendar."""
    day = trade_date if isinstance(trade_date, dt.date) else dt.date.fromisoformat(trade_date)
    return SettlementCalendar.from_settings(settings).settlement_date(day)


def latest_trading_day(name: str, today: dt.date) -> dt.date:
    """The exchange's last session on or before ``today``: the day a demo trades (a weekend
    or holiday has none; the DAG would never schedule it)."""
    cal = exchange_calendar(name, today.year - 1)  # covers last year's sessions, for 1 January
    return cal.date_to_session(today.isoformat(), direction="previous").date()
