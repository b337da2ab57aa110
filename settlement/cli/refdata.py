"""`settle refdata load|example`: the instruments and participants instructions name."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from settlement.cli.common import (
    CommandFailed,
    Subparsers,
    add_command,
    non_negative,
    require_services,
)
from settlement.config import ConfigError, Settings


def register(sub: Subparsers) -> None:
    sp = add_command(sub, "refdata", "reference data: the securities (ISIN, CUSIP, currency) "
                                     "and participants (BIC, safekeeping account) "
                                     "instructions name", cmd_refdata)
    sp.add_argument("action", choices=["load", "example"],
                    help="load: check --securities and --participants and store them, all or "
                         "nothing; example: write files covering the simulator's symbols and "
                         "accounts into --out")
    sp.add_argument("--securities", type=Path, default=None,
                    help="load: CSV with the header symbol,isin,cusip,currency (ISIN and "
                         "CUSIP check digits verified; the CUSIP may be empty)")
    sp.add_argument("--participants", type=Path, default=None,
                    help="load: CSV with the header account,participant_id,bic,"
                         "safekeeping_account")
    sp.add_argument("--out", type=Path, default=None,
                    help="example: the folder to write securities.csv and participants.csv "
                         "into")
    sp.add_argument("--symbols", type=non_negative, default=None,
                    help="example: the simulator's symbols to cover (default: as `settle "
                         "simulate` trades)")
    sp.add_argument("--accounts", type=non_negative, default=None,
                    help="example: the simulator's accounts to cover (default: as `settle "
                         "simulate` trades)")
    sp.add_argument("--hostile-names", action="store_true",
                    help="example: cover the names of `settle simulate --hostile-names`")


def cmd_refdata(args: argparse.Namespace, s: Settings) -> dict[str, Any]:
    from settlement.instructions.refdata import RefDataError, example, load

    if args.action == "example":
        if args.out is None:
            raise ConfigError("settle refdata example needs --out DIR (where to write "
                              "securities.csv and participants.csv)")
        from dataclasses import replace

        from settlement.simulator.gateway import SimulationSpec, day_names

        # The names depend on these three only, not on the day or its size.
        sizes = {k: v for k, v in (("symbols", args.symbols), ("accounts", args.accounts))
                 if v is not None}
        symbols, accounts = day_names(replace(
            SimulationSpec("2000-01-03", 1, hostile_names=args.hostile_names), **sizes))
        return example(args.out, symbols, accounts, s.settlement_currency)
    if args.securities is None and args.participants is None:
        raise ConfigError("settle refdata load needs --securities FILE and/or --participants "
                          "FILE (`settle refdata example --out DIR` writes a pair for the "
                          "simulator's days)")
    require_services(s, kafka=False)
    try:
        return load(s, args.securities, args.participants)
    except RefDataError as e:
        raise CommandFailed(str(e), {"error": str(e)}) from None
