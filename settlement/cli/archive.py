"""`settle archive`: published days' ledger rows past the retention, moved to Parquet and
brought back (settlement.archive)."""

from __future__ import annotations

import argparse
import datetime as dt
from typing import Any

from settlement.cli.common import (
    CommandFailed,
    Subparsers,
    add_command,
    date,
    progress,
    require_services,
)
from settlement.config import ConfigError, Settings


def register(sub: Subparsers) -> None:
    sp = add_command(sub, "archive", "move published days' ledger rows older than the "
                                     "retention to Parquet (checked, with a manifest), or "
                                     "bring a day back", cmd_archive)
    sp.set_defaults(exit_now=True)  # a one-shot Spark process: no interpreter teardown
    sp.add_argument("action", nargs="?", choices=["restore", "list"], default=None,
                    help="restore: bring --date back into its ledgers; list: the archived "
                         "days (default: archive)")
    sp.add_argument("--before", type=date, default=None,
                    help="archive: only days before this one (default: today); days younger "
                         "than SETTLE_RETENTION_DAYS are kept whatever it says")
    sp.add_argument("--date", type=date, default=None, help="restore: the trade date")
    sp.add_argument("--quiet", action="store_true", help="no progress lines on stderr")


def cmd_archive(args: argparse.Namespace, s: Settings) -> dict[str, Any]:
    from settlement.archive import ArchiveError, archive, restore

    require_services(s, kafka=False)
    try:
        if args.action == "restore":
            if args.date is None:
                raise ConfigError("settle archive restore needs --date YYYY-MM-DD (settle "
                                  "archive list shows the archived days)")
            return restore(s, dt.date.fromisoformat(args.date))
        if args.date is not None:
            raise ConfigError("--date is for `settle archive restore`; to archive, give "
                              "--before DATE")
        if args.action == "list":
            return {"archives": _list(s)}
        today = dt.date.today()
        before = dt.date.fromisoformat(args.before) if args.before else today
        return archive(s, before, today, progress(args))
    except ArchiveError as e:
        raise CommandFailed(str(e), {"error": str(e)}) from None


def _list(s: Settings) -> list[dict[str, Any]]:
    from settlement.db import connect, q

    cols = ("trade_date", "ledger", "table", "rows", "published_run", "archived_at",
            "removed_at", "restored_at")
    with connect(s.for_component("admin").settlement_dsn) as conn:
        return [{c: (str(v) if v is not None and c.endswith("_at") else v)
                 for c, v in zip(cols, row, strict=True)}
                for row in conn.execute(q("archive", "list"))]
