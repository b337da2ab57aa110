"""`settle status`: the on-call view, and its exit status for a probe."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from settlement.cli.common import CommandFailed, Subparsers, add_command, non_negative
from settlement.config import Settings


def register(sub: Subparsers) -> None:
    # prints_own: the tables below are the human output.
    sp = add_command(sub, "status", "are the sites healthy and caught up, and how did the last "
                                    "days settle? exit 0 healthy, 1 not (a probe can use it)",
                     cmd_status, prints_own=True)
    sp.add_argument("--max-heartbeat-age", type=float, default=15.0, metavar="SECONDS",
                    help="a site whose last heartbeat is older is down")
    sp.add_argument("--max-lag", type=non_negative, default=10_000, metavar="MESSAGES",
                    help="a partition further behind its high watermark is unhealthy")
    sp.add_argument("--max-lag-seconds", type=float, default=120.0, metavar="SECONDS",
                    help="a partition whose oldest unstored message is older is unhealthy")
    sp.add_argument("--forget-after", type=float, default=3600.0, metavar="SECONDS",
                    help="a site silent for longer is taken as retired, not down")


def cmd_status(args: argparse.Namespace, s: Settings) -> dict[str, Any]:
    from settlement.status import Thresholds, status

    out = status(s, Thresholds(max_heartbeat_age=args.max_heartbeat_age, max_lag=args.max_lag,
                               max_lag_seconds=args.max_lag_seconds,
                               forget_after=args.forget_after))
    if not args.json:
        _print_status(out)
    if not out["healthy"]:
        raise CommandFailed("unhealthy: " + "; ".join(out["problems"]), out)
    return out


def _print_status(out: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    # Wide enough for every column when piped into a file or a probe's log.
    console = Console(stderr=True, width=None if sys.stderr.isatty() else 150)
    sites = Table(title="sites", title_justify="left")
    for col in ("ledger", "site", "scheme", "last heartbeat", "age s", "partitions",
                "trades total"):
        sites.add_column(col)
    parts = Table(title="positions (stored in the ledger) vs Kafka", title_justify="left")
    for col in ("ledger", "partition", "stored", "high watermark", "lag", "lag s",
                "last writer"):
        parts.add_column(col)
    days = Table(title="current day per ledger", title_justify="left")
    for col in ("ledger", "day", "close markers", "dead letters"):
        days.add_column(col)
    for name, led in out["ledgers"].items():
        if not led.get("reachable"):
            sites.add_row(name, "-", "-", f"[red]unreachable: {led.get('error', '')}[/]",
                          "", "", "")
            continue
        for site, st in led["sites"].items():
            age = st["age_seconds"]
            color = "green" if age <= out["thresholds"]["max_heartbeat_age"] else "red"
            sites.add_row(name, site, st["scheme"], st["last_heartbeat"].replace("T", " "),
                          f"[{color}]{age:.1f}[/]", ",".join(map(str, st["partitions"])),
                          f"{st['trades_total']:,}")
        for p, o in led["partitions"].items():
            parts.add_row(name, p, str(o["stored"]), str(o["high"]), str(o["lag"]),
                          "" if o["lag_seconds"] is None else f"{o['lag_seconds']:.1f}",
                          o["last_writer"])
        days.add_row(name, str(led["day"]),
                     f"{led['close_markers']}/{led['partitions_total']}",
                     str(led["dead_letters_today"]))
    runs = Table(title="last settlement run per date", title_justify="left")
    for col in ("date", "settles", "run", "source", "status", "validation", "published",
                "finished", "report"):
        runs.add_column(col)
    for r in out["settlement"].get("runs", []):
        verdict = {True: "[green]passed[/]", False: "[red]failed[/]", None: "-"}[
            r["validation_success"]]
        published = "yes" if r["published"] else "no"
        if r.get("amended_since"):
            published += f" [yellow](amended since {r['amended_since']})[/]"
        runs.add_row(r["trade_date"], str(r.get("settlement_date") or "-"), str(r["run_id"]),
                     r["source"], r["status"], verdict, published,
                     str(r["finished_at"] or ""), str(r["report_path"] or ""))
    reclose = Table(title="days awaiting a re-close (post-close amendments not yet settled: "
                          "settle eod --date D --reclose)", title_justify="left")
    for col in ("date", "amendments", "since", "published run", "version"):
        reclose.add_column(col)
    for a in out["settlement"].get("awaiting_reclose", []):
        reclose.add_row(a["trade_date"], str(a["amendments"]), a["since"],
                        str(a["published_run"]), str(a["version"] or "-"))
    closes = Table(title="closes in progress (one per date, across sites)",
                   title_justify="left")
    for col in ("date", "run", "holder", "since", "lease"):
        closes.add_column(col)
    for c in out["settlement"].get("closes_in_progress", []):
        closes.add_row(c["trade_date"], str(c["run_id"] or "-"), c["holder"], c["since"],
                       "[red]expired[/]" if c["lease_expired"] else "[green]held[/]")
    abandoned = Table(title="abandoned runs (their close stopped; another took over)",
                      title_justify="left")
    for col in ("run", "date", "holder", "at", "reason"):
        abandoned.add_column(col)
    for a in out["settlement"].get("abandoned", []):
        abandoned.add_row(str(a["run_id"]), a["trade_date"], str(a["holder"] or "-"), a["at"],
                          str(a["reason"] or ""))
    for t in (sites, parts, days, runs, reclose, closes, abandoned):
        console.print(t)
    if "open_fails" in out["settlement"]:
        fails = out["settlement"]["open_fails"]
        console.print(f"open settlement fails (carried into the next settlement date): "
                      f"{'[yellow]' if fails else ''}{fails}{'[/]' if fails else ''}",
                      highlight=False)
    if out["healthy"]:
        console.print("[bold green]HEALTHY[/]")
    else:
        console.print("[bold red]UNHEALTHY[/]")
        for prob in out["problems"]:
            console.print(f"  - {prob}", highlight=False)
