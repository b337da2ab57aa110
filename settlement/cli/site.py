"""`settle site run`: one consumer site, in one process or several."""

from __future__ import annotations

import argparse
import logging
from typing import Any

from settlement.cli.common import Subparsers, add_command, date, positive, seconds
from settlement.config import ConfigError, Settings


def register(sub: Subparsers) -> None:
    sp = add_command(sub, "site", "run one consumer site", cmd_site)
    sp.add_argument("action", choices=["run"])
    sp.add_argument("--site", choices=["a", "b"], required=True, help="which site")
    sp.add_argument("--scheme", choices=["separate", "shared"], required=True,
                    help="separate: a ledger and group per site; shared: one of each")
    sp.add_argument("--until-close", action="store_true",
                    help="exit once every partition's close marker for the day is ingested")
    sp.add_argument("--date", type=date, default=None,
                    help="the day --until-close waits for (default: newest day in the ledger)")
    sp.add_argument("--max-seconds", type=seconds, default=None,
                    help="stop after this many seconds (> 0) even if the day is not closed "
                         "(default: no limit)")
    sp.add_argument("--processes", type=positive, default=1,
                    help="consumer processes for this site, all members of its consumer "
                         "group (default 1); the JSON sums their counters")


def cmd_site(args: argparse.Namespace, s: Settings) -> dict[str, Any]:
    from consumers.site import SiteOptions, run_site

    # No preflight: a site rides out Kafka and ledger outages (it retries), so it may start
    # before them, as a container does.
    if args.processes > 1:
        from consumers.members import run_members

        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
        try:
            return run_members(args.processes, args.site, args.scheme, args.until_close,
                               args.date, args.max_seconds, s.metrics_port)
        except ValueError as e:
            raise ConfigError(str(e)) from None

    opts = SiteOptions(site=args.site, scheme=args.scheme, until_close=args.until_close,
                       trade_date=args.date, max_seconds=args.max_seconds)
    return run_site(s, opts)
