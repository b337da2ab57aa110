"""`settle eod` and `settle validate`: the close of one trade date, and its checks alone."""

from __future__ import annotations

import argparse
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
    sp = add_command(sub, "eod", "end-of-day settlement of one trade date (then validation "
                                 "and report)", cmd_eod)
    sp.set_defaults(exit_now=True)  # a one-shot process: no interpreter teardown
    sp.add_argument("--date", type=date, required=True, help="trade date YYYY-MM-DD")
    sp.add_argument("--source", choices=["auto", "kafka", "db"], default="auto",
                    help="auto: Kafka if it holds the whole day, else the ledger database")
    sp.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    sp.add_argument("--accept-incomplete", metavar="REASON", default=None,
                    help="publish the day even if validation fails; the reason is recorded "
                         "in the run and the audit report (default: publish only a "
                         "validated day)")
    sp.add_argument("--only-if-unsettled", action="store_true",
                    help="settle only if no run that passed validation has published the "
                         "date since its close markers (what a scheduled close does; "
                         "default: settle again). A close of the date in progress is "
                         "joined either way")
    sp.add_argument("--reclose", action="store_true",
                    help="settle a published day again with the post-close amendments its "
                         "amended close markers brought (settle status lists the days "
                         "awaiting one), publishing it as the day's next version; without "
                         "any it says so and does nothing (default: a plain close)")

    sp = add_command(sub, "validate", "Great Expectations checks of one trade date (no "
                                      "settlement)", cmd_validate)
    sp.add_argument("--date", type=date, required=True, help="trade date YYYY-MM-DD")
    sp.add_argument("--source", choices=["auto", "kafka", "db"], default="auto",
                    help="where to read the day")


def cmd_eod(args: argparse.Namespace, s: Settings) -> dict[str, Any]:
    from settlement.close.pipeline import run_eod
    from settlement.spark.jvm import allow_building

    allow_building()  # this process is the close: its JVM may write the class archive
    if args.reclose and args.only_if_unsettled:
        raise ConfigError("--reclose settles a settled day again: it cannot be combined "
                           "with --only-if-unsettled")
    require_services(s, kafka=False)  # Kafka down is a reason to settle from the ledger
    out = run_eod(s, args.date, source=args.source, accept_incomplete=args.accept_incomplete,
                  progress=progress(args), only_if_unsettled=args.only_if_unsettled,
                  reclose=args.reclose)
    if out.get("nothing_to_reclose"):
        return out
    if "joined_run_id" in out:
        if out["status"] != "succeeded":
            raise CommandFailed(f"the close this one joined failed: {out['publication']}", out)
        return out
    if not out.get("published"):
        raise CommandFailed(f"{out.get('publication')} (report: {out.get('report_path')}); "
                            "to publish anyway: --accept-incomplete \"reason\"", out)
    return out


def cmd_validate(args: argparse.Namespace, s: Settings) -> dict[str, Any]:
    from settlement.close.pipeline import validate_only

    require_services(s, kafka=False)
    out = validate_only(s, args.date, source=args.source)
    if not out["success"]:
        names = ", ".join(f"{f['suite']}: {f['name']}" for f in out["failures"])
        raise CommandFailed(f"validation failed for {args.date}: {names}", out)
    return out
