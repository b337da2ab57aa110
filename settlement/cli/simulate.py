"""`settle simulate`: the exchange gateway publishes one trading day."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from settlement.cli.common import (
    Subparsers,
    add_command,
    date,
    fraction,
    non_negative,
    positive,
    require_services,
)
from settlement.config import Settings


def register(sub: Subparsers) -> None:
    sp = add_command(sub, "simulate", "publish one trading day to the trades topic",
                     cmd_simulate)
    sp.add_argument("--date", type=date, required=True, help="trade date YYYY-MM-DD")
    sp.add_argument("--trades", type=positive, default=10_000, help="trades in the day")
    sp.add_argument("--seed", type=non_negative, default=1, help="random seed")
    sp.add_argument("--dup-rate", type=fraction, default=0.0,
                    help="fraction of trades replayed by a non-idempotent upstream")
    sp.add_argument("--bad-rate", type=fraction, default=0.0,
                    help="malformed messages per trade")
    sp.add_argument("--abort-rate", type=fraction, default=0.0,
                    help="fraction of transactions aborted (then re-sent)")
    sp.add_argument("--cancel-rate", type=fraction, default=0.0,
                    help="fraction of trades busted later in the day (a cancel message)")
    sp.add_argument("--correct-rate", type=fraction, default=0.0,
                    help="fraction of trades corrected later in the day (version 2; a "
                         "quarter of them again, version 3)")
    sp.add_argument("--rate", type=positive, default=None,
                    help="pace the day at this many trades/s (default: as fast as possible)")
    sp.add_argument("--hostile-names", action="store_true",
                    help="security drill: some accounts, symbols and trade ids carry HTML/JS, "
                         "quotes, SQL and unicode; besides one trade in 7 goes a copy whose "
                         "buyer holds a control character (a dead letter)")


def cmd_simulate(args: argparse.Namespace, s: Settings) -> dict[str, Any]:
    from settlement.simulator.gateway import SimulationSpec, simulate

    spec = SimulationSpec(
        trade_date=args.date, trades=args.trades, seed=args.seed, dup_rate=args.dup_rate,
        bad_rate=args.bad_rate, abort_rate=args.abort_rate, rate=args.rate,
        hostile_names=args.hostile_names, cancel_rate=args.cancel_rate,
        correct_rate=args.correct_rate,
    )
    require_services(s, postgres=False)
    return simulate(s, spec, progress=not args.json and sys.stderr.isatty())
