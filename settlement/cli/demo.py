"""`settle demo`: the main job end to end on the embedded services."""

from __future__ import annotations

import argparse
import os
from typing import Any

from settlement.cli.common import Subparsers, add_command, date, non_negative, positive
from settlement.config import Settings


def _scheme(value: str) -> str:
    if value not in ("separate", "shared"):
        raise argparse.ArgumentTypeError(
            f"expected separate or shared (from --scheme or SCHEME), got {value!r}")
    return value


def register(sub: Subparsers) -> None:
    # prints_own: the demo narrates itself as it goes.
    sp = add_command(sub, "demo", "the main job end to end on the embedded services", cmd_demo,
                     prints_own=True)
    # argparse checks `choices` on the command line only, never on a default: the scheme
    # from the environment (`SCHEME=... make demo`) is checked by its type instead.
    sp.add_argument("--scheme", type=_scheme, default=os.environ.get("SCHEME", "shared"),
                    help="the sites' scheme: separate or shared (default: $SCHEME, else shared)")
    sp.add_argument("--date", type=date, default=None,
                    help="trade date (default: the exchange's latest trading day, today or "
                         "before; SETTLE_EXCHANGE_CALENDAR)")
    sp.add_argument("--trades", type=positive, default=60_000, help="trades in the day")
    sp.add_argument("--rate", type=positive, default=10_000, help="trades/s")
    sp.add_argument("--seed", type=non_negative, default=42, help="random seed")


def cmd_demo(args: argparse.Namespace, s: Settings) -> dict[str, Any]:
    import datetime as dt

    from settlement.demo import DemoOptions, run_demo
    from settlement.instructions.calendar import latest_trading_day

    # A day the exchange traded: today on a weekday session, else the last one before it.
    day = args.date or latest_trading_day(s.exchange_calendar, dt.date.today()).isoformat()
    return run_demo(DemoOptions(trade_date=day, scheme=args.scheme, trades=args.trades,
                                rate=args.rate, seed=args.seed))
