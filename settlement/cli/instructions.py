"""`settle instructions [write|status]`: a published day's settlement instructions for its
settlement date (CSV or ISO 20022 sese.023), and the settlement agent's answer."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from settlement.cli.common import CommandFailed, Subparsers, add_command, date, require_services
from settlement.config import ConfigError, Settings


def register(sub: Subparsers) -> None:
    sp = add_command(sub, "instructions", "a published day's settlement instructions (T+N, "
                                          "fails carried), or the agent's answer to them",
                     cmd_instructions)
    sp.add_argument("action", nargs="?", choices=["write", "status", "pending"],
                    default="write",
                    help="write: the instructions of --date; status: record the settlement "
                         "agent's answer (--file); pending: custodian mode's failed "
                         "instructions still pending, with age and close-out date")
    sp.add_argument("--date", type=date, help="write: the trade date YYYY-MM-DD; pending: "
                    "the day ages are counted to (default: today)")
    sp.add_argument("--format", choices=["csv", "iso20022"], default="csv",
                    help="write: CSV (one line per instruction) or ISO 20022 sese.023 "
                         "(one SctiesSttlmTxInstr per line, schema-checked)")
    sp.add_argument("--out", type=Path, default=None,
                    help="write: the file to write (default: beside the audit reports, "
                         "instructions/DATE-runN.csv|xml)")
    sp.add_argument("--delta", action="store_true",
                    help="write: only the change between the day's last two versions (what "
                         "to add or reverse after a re-run; nothing sent is rewritten)")
    sp.add_argument("--summary", action="store_true",
                    help="write: the per-member summary instead (securities in and out, money, "
                         "fails carried in and the oldest one's age; members from settle "
                         "refdata), CSV (default: instructions/DATE-runN-summary.csv)")
    sp.add_argument("--file", type=Path, default=None,
                    help="status: the agent's answer, CSV with the header instruction_id,"
                         "status[,settled_quantity] (status settled|failed; a partial is "
                         "settled with its settled_quantity)")


def cmd_instructions(args: argparse.Namespace, s: Settings) -> dict[str, Any]:
    from settlement.instructions.store import InstructionsError

    # Bad arguments are said first (exit 2), whatever the services' state.
    if args.action == "status" and args.file is None:
        raise ConfigError("settle instructions status needs --file STATUS.csv (the settlement "
                          "agent's answer: instruction_id,status[,settled_quantity])")
    if args.action == "write" and args.date is None:
        raise ConfigError("settle instructions needs --date YYYY-MM-DD (the trade date whose "
                          "published run's instructions to write)")
    require_services(s, kafka=False)
    try:
        if args.action == "status":
            return _status(args, s)
        if args.action == "pending":
            return _pending(args, s)
        return _write(args, s)
    except InstructionsError as e:
        raise CommandFailed(str(e), {"error": str(e)}) from None


def _write(args: argparse.Namespace, s: Settings) -> dict[str, Any]:
    from settlement.crashpoints import crash_point
    from settlement.instructions import write_rendered
    from settlement.instructions.files import default_path
    from settlement.instructions.store import delta_set, instructions

    if args.summary and args.delta:
        raise ConfigError("--summary and --delta do not go together: the summary is of the "
                          "day's current instructions (leave out --delta)")
    day = delta_set(s, args.date) if args.delta else instructions(s, args.date)
    if args.summary:
        return _summary(s, day, args.out)
    path = args.out or default_path(Path(s.reports_dir), day, args.format,
                                    "delta" if args.delta else "")
    held = write_rendered(s, day, args.format, path)
    crash_point(s.crash_at, "instructions.files")
    out = {**day.as_dict(), "format": args.format, "path": str(path), "delta": args.delta}
    return {**out, "held": [h.__dict__ for h in held]} if day.mode == "custodian" else out


def _summary(s: Settings, day: Any, out: Path | None) -> dict[str, Any]:
    from rich.table import Table

    from settlement.cli.common import console
    from settlement.instructions import summary, write_summary

    written = write_summary(s, day, out)
    members = written.pop("members")
    table = Table(title=f"settlement date {day.settlement_date}: per member "
                        f"(trade date {day.trade_date}, run {day.run_id})")
    for col in summary.COLUMNS:
        table.add_column(col, justify="left" if col in ("member", "mapped") else "right")
    for line in members:
        table.add_row(*line.row())
    console().print(table)
    return {**day.as_dict(), **written, "path": written["summary_path"],
            "members": [line.as_dict() for line in members]}


def _pending(args: argparse.Namespace, s: Settings) -> dict[str, Any]:
    import datetime as dt

    from rich.table import Table

    from settlement.cli.common import console
    from settlement.instructions.store import pending

    as_of = dt.date.fromisoformat(args.date) if args.date else dt.date.today()
    rows = pending(s, as_of)
    table = Table(title=f"pending with the agent on {as_of} (custodian mode)")
    cols = ("instruction_id", "account", "symbol", "side", "open_quantity",
            "intended_settlement_date", "age_days", "close_out_date")
    for col in cols:
        table.add_column(col)
    for row in rows:
        table.add_row(*(str(row[c]) for c in cols))
    console().print(table)
    return {"as_of": as_of.isoformat(), "pending": rows,
            "past_close_out": [r["instruction_id"] for r in rows
                               if r["close_out_date"] < as_of.isoformat()]}


def _status(args: argparse.Namespace, s: Settings) -> dict[str, Any]:
    from settlement.instructions.store import apply_answers

    out = apply_answers(s, args.file)
    if out["carried_late"]:
        from settlement.instructions import write_files

        # The sets these fails went into were written before: their files again, with the
        # added lines, for the agent (the lines sent before are unchanged).
        for late in out["carried_late"]:
            late["paths"] = write_files(s, late["trade_date"])["paths"]
    for over in out["over_threshold"]:
        _alert(s, over, out["fails_alert_share"])
    return out


def _alert(s: Settings, over: dict[str, Any], share: float) -> None:
    """Fails above the configured share of a settlement date's instructions: the same
    channels as the close's alerts (e-mail, webhook, the log)."""
    from settlement.orchestration.alerts import Alert, day_verdict, deliver
    from settlement.orchestration.links import airflow_base_url

    detail = (f"{over['open_fails']} of {over['instructions']} instructions for settlement on "
              f"{over['settlement_date']} failed or settled in part ({over['share']:.1%}, above "
              f"SETTLE_FAILS_ALERT_SHARE {share:.1%}); "
              + ("they stay pending with the agent (settle instructions pending)"
                 if s.instructions_mode == "custodian" else
                 "they are carried into the next settlement date's instructions"))
    deliver(Alert("instruction_fails", day_verdict(s, over["trade_date"], airflow_base_url()),
                  detail), s)
