"""`settle stack build|up|down|drill|soak|wan|backup|restore`: the docker-compose deployment on
this machine."""

from __future__ import annotations

import argparse
import datetime as dt
from pathlib import Path
from typing import Any

from settlement.cli.common import CommandFailed, Subparsers, add_command, console, date
from settlement.config import ConfigError, Settings
from settlement.stack import DEFAULT_WAN_RTT_MS


def register(sub: Subparsers) -> None:
    sp = add_command(sub, "stack", "the docker-compose deployment on this machine (images "
                                   "built here, host networking on loopback)", cmd_stack)
    sp.add_argument("action", choices=["build", "up", "down", "drill", "soak", "wan", "backup",
                                       "restore"],
                    help="build: engine, Compose and images only, nothing started; "
                         "up: engine, images, .env, certificates, then every service healthy; "
                         "down: remove containers and volumes; drill: a faulty day, site-a "
                         "killed, the close run by the stack's scheduler; soak: --days "
                         "compressed trading days, each close created by the scheduler from "
                         "its timetable, a random site killed in each; wan: set the running "
                         "stack's --wan-rtt-ms (--wan-jitter-ms, --wan-loss) between its "
                         "locations; backup: a --backup-type backup of the settlement cluster "
                         "into the repository at the witness (pgBackRest); restore: --date's "
                         "published rows put back as they stood at --target, from a copy "
                         "restored at the witness (after a mistaken DELETE)")
    sp.add_argument("--date", type=date, help="drill, restore: the trade date (YYYY-MM-DD)")
    sp.add_argument("--target", default=None,
                    help="restore: the moment before the mistake, with its zone "
                         "(YYYY-MM-DD HH:MM:SS[.fff]+00)")
    sp.add_argument("--trades", type=int, default=20_000, help="drill, soak: trades a day")
    sp.add_argument("--seed", type=int, default=7, help="drill, soak: the simulator's seed")
    sp.add_argument("--fault", choices=["site-loss", "site-freeze", "site-partition",
                                        "standby-partition", "witness-partition",
                                        "switchover-at-commit", "point-in-time"],
                    default=None,
                    help="drill: lose a whole site (every container SIGKILLed, then started "
                         "again), freeze it (docker pause past the leases), cut it off alive "
                         "(site-partition: the primary's site; standby-partition: the "
                         "standby's; witness-partition: the witness; packets dropped, then "
                         "healed); switchover-at-commit: a close frozen just before and just "
                         "after its publishing commit while the settlement primary switches "
                         "over, then closed again at the other site (a day each); "
                         "point-in-time: --date's published rows deleted by mistake as the "
                         "admin, then restored from the backups as of the moment before; "
                         "without it, site-a's consumer is killed")
    sp.add_argument("--site", choices=["a", "b"], default="a",
                    help="drill with --fault: the site lost, frozen or cut off (for "
                         "witness-partition: the site holding the primary)")
    sp.add_argument("--at", choices=["ingest", "close"], default="ingest",
                    help="drill with --fault site-partition: cut the site off mid-day, or "
                         "while its own close holds the date")
    sp.add_argument("--days", type=int, default=3, help="soak: trading days")
    sp.add_argument("--minutes", type=int, default=4, choices=[2, 3, 4, 5, 6, 10],
                    help="soak: minutes between two closes")
    sp.add_argument("--wan-rtt-ms", type=float, default=DEFAULT_WAN_RTT_MS,
                    help="up, wan: the round trip between site A, site B and the witness in "
                         "ms (0: direct links; default %(default)s, two data centres in one "
                         "metro); each location's own traffic stays direct")
    sp.add_argument("--wan-jitter-ms", type=float, default=0.0,
                    help="wan: how much the round trip varies either way, in ms (packets "
                         "keep their order)")
    sp.add_argument("--wan-loss", type=float, default=0.0,
                    help="wan: the fraction of packets between the locations dropped")
    sp.add_argument("--backup-type", choices=["full", "diff", "incr"], default="incr",
                    help="backup: full, differential (since the last full) or incremental "
                         "(since the last backup; full when there is none); default "
                         "%(default)s")
    sp.add_argument("--cron", default="none",
                    help="up: eod_settlement's schedule in the stack (a cron expression, or "
                         "none: runs only when created)")


def _project_root() -> Path:
    # settlement/cli/stack.py -> the checkout's root, three levels up.
    root = Path(__file__).resolve().parents[2]
    if not (root / "docker-compose.yml").exists():
        raise ConfigError("settle stack works from a checkout (it needs docker-compose.yml, "
                          "deploy/ and the Dockerfile): run it there, e.g. `make stack-up`")
    return root


def cmd_stack(args: argparse.Namespace, s: Settings) -> dict[str, Any]:
    from settlement.stack import compose

    def log(message: str) -> None:
        console().print(f"[dim]stack:[/] {message}", highlight=False)

    root = _project_root()
    if args.action == "build":
        return compose.build(root, log)
    if args.action == "up":
        from settlement.stack.backup import ensure_stanza

        started = compose.up(root, log, cron=args.cron, wan_rtt_ms=args.wan_rtt_ms)
        # WAL archived to the witness's repository from the first start on (issue 60).
        return {**started, **ensure_stanza(compose.open_stack(root, log), log)}
    if args.action == "wan":
        from settlement.stack import wan

        stack = compose.open_stack(root, log)
        return wan.apply(root, stack.state, args.wan_rtt_ms, log, args.wan_loss,
                         args.wan_jitter_ms).describe()
    if args.action == "down":
        from settlement.stack.netcut import heal

        heal(log)  # a drill that died mid-cut leaves no dropped packets behind
        return compose.down(root, log)
    stack = compose.open_stack(root, log)
    if args.action == "backup":
        from settlement.stack.backup import take_backup

        return take_backup(stack, args.backup_type, log)
    if args.action == "restore":
        return _restore(stack, args, log)
    if args.action == "soak":
        from settlement.stack.soak import run_soak

        result = run_soak(stack, args.days, args.trades, args.minutes, log, seed=args.seed)
    else:
        if not args.date:
            raise ConfigError("settle stack drill: --date YYYY-MM-DD is required (make "
                              "stack-drill DATE=2026-03-02 TRADES=20000)")
        if args.fault and args.fault.endswith("-partition"):
            from settlement.stack.partition_drill import run_partition_drill

            result = run_partition_drill(stack, args.fault, args.site, args.date, args.trades,
                                         log, seed=args.seed, at=args.at)
        elif args.fault == "point-in-time":
            from settlement.stack.backup import point_in_time_drill
            from settlement.stack.drill import stack_settings
            from settlement.stack.partition_drill import admin_dsn
            from settlement.stack.site_drill import judge

            settings = stack_settings(stack)
            result = point_in_time_drill(stack, admin_dsn(stack, ("a", "b"), "settlement"),
                                         args.date, log, lambda d: judge(settings, d))
        elif args.fault == "switchover-at-commit":
            from settlement.stack.crash_drill import run_switchover_drill

            result = run_switchover_drill(stack, args.date, args.trades, log, seed=args.seed)
        elif args.fault:
            from settlement.stack.site_drill import run_site_drill

            result = run_site_drill(stack, args.fault, args.site, args.date, args.trades, log,
                                    seed=args.seed)
        else:
            from settlement.stack.drill import run_stack_drill

            result = run_stack_drill(stack, args.date, args.trades, log, seed=args.seed)
    from settlement.stack import wan
    from settlement.stack.monitoring import push_verdict

    result["wan_rtt_ms"] = wan.current(stack.state).rtt_ms  # what the drill ran across

    # The verdict where the DrillOrSoakFailing alert reads it.
    kind = "soak" if args.action == "soak" else (args.fault or "stack")
    result["verdict_pushed"] = push_verdict(stack, kind, bool(result["passed"]), log)
    if not result["passed"]:
        raise CommandFailed(f"the stack {args.action} failed: see lost/duplicated/"
                            "dag_run_state", result)
    return result


def _restore(stack: Any, args: argparse.Namespace, log: Any) -> dict[str, Any]:
    import psycopg

    from settlement.stack.backup import parse_target, restore_day
    from settlement.stack.drill import stack_settings
    from settlement.stack.partition_drill import admin_dsn
    from settlement.stack.site_drill import judge

    if not args.date or not args.target:
        raise ConfigError("settle stack restore: --date YYYY-MM-DD and --target 'YYYY-MM-DD "
                          "HH:MM:SS+00' (the moment before the mistake) are required (make "
                          "stack-restore DATE=2026-03-03 TARGET='2026-11-30 02:58:27+00')")
    try:
        target = parse_target(args.target)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    dsn = admin_dsn(stack, ("a", "b"), "settlement") + "&target_session_attrs=read-write"
    with psycopg.connect(dsn, autocommit=True) as conn:
        out = restore_day(stack, conn, dt.date.fromisoformat(args.date), target, log)
    # What is published now against the day read from Kafka (as the auditor).
    verdict = judge(stack_settings(stack), args.date)
    return {**out, "positions_match": verdict["positions_match"],
            "positions": verdict["positions"], "publications": verdict["publications"]}
