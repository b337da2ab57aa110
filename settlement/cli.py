"""The ``settle`` command line.

Every command accepts ``--json`` (before or after the command): the last line on stdout is
then one JSON object. Human output and progress go to stderr through rich so that stdout stays
machine-readable. Exit codes: 0 success (``status``: healthy), 1 failure (the message says
why; ``status``: unhealthy), 2 bad arguments or configuration. Errors never carry passwords.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from settlement.config import ConfigError, Settings, check_date, load_settings
from settlement.errors import START_SERVICES, ServiceError, redact

Handler = Callable[[argparse.Namespace, Settings], dict[str, Any]]


class CommandFailed(RuntimeError):
    """The command ran but its outcome is a failure (e.g. validation); exit 1 with JSON."""

    def __init__(self, message: str, result: dict[str, Any]):
        super().__init__(message)
        self.result = result


def _console() -> Any:
    from rich.console import Console

    return Console(stderr=True)


def _demo_scheme(value: str) -> str:
    if value not in ("separate", "shared"):
        raise argparse.ArgumentTypeError(
            f"expected separate or shared (from --scheme or SCHEME), got {value!r}")
    return value


def _date(value: str) -> str:
    try:
        return check_date(value)
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("--date: ")) from None


def _rate(value: str) -> float:
    try:
        r = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a fraction between 0 and 1, got {value!r}") from None
    if not 0 <= r <= 1:
        raise argparse.ArgumentTypeError(f"expected a fraction between 0 and 1, got {value}")
    return r


def _int_at_least(minimum: int, what: str) -> Callable[[str], int]:
    def parse(value: str) -> int:
        try:
            n = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {value!r}") from None
        if n < minimum:
            raise argparse.ArgumentTypeError(f"expected {what}, got {n}")
        return n

    return parse


def _seconds(value: str) -> float:
    """A finite, positive number of seconds: 0, negatives, nan and inf are refused (there
    is no "0 means no limit": leave the option out for that)."""
    try:
        x = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {value!r}") from None
    if not math.isfinite(x) or x <= 0:
        raise argparse.ArgumentTypeError(
            f"expected a finite number of seconds > 0, got {value} (leave the option out for "
            "no limit)")
    return x


_positive = _int_at_least(1, "a positive integer")
_non_negative = _int_at_least(0, "an integer >= 0")


# -- handlers ----------------------------------------------------------------------------
def _progress(args: argparse.Namespace) -> Callable[[str], None]:
    """Progress lines of long work, on stderr (stdout keeps the JSON); quiet with --quiet."""
    console = _console()

    def say(step: str) -> None:
        if not getattr(args, "quiet", False):
            console.print(f"[dim]settle {args.command}:[/] {step}", highlight=False)

    return say


def require_services(s: Settings, kafka: bool = True, postgres: bool = True,
                     timeout: float = 5.0) -> None:
    """Fail fast, saying how to start them, when the services a command needs are down
    (rather than a client library's raw error minutes later)."""
    if postgres:
        import psycopg

        try:
            psycopg.connect(s.settlement_dsn, connect_timeout=int(timeout)).close()
        except psycopg.OperationalError as e:
            raise ServiceError(f"PostgreSQL is not reachable at {redact(s.settlement_dsn)} "
                               f"({str(e).strip().splitlines()[0][:200]}): "
                               f"{START_SERVICES}") from None
    if kafka:
        from confluent_kafka import KafkaException

        from settlement.kafka.admin import admin_client

        try:
            admin_client(s).list_topics(timeout=timeout)
        except KafkaException:
            raise ServiceError(f"Kafka is not reachable at {s.bootstrap()}: "
                               f"{START_SERVICES}") from None


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
    for col in ("date", "run", "source", "status", "validation", "published", "finished",
                "report"):
        runs.add_column(col)
    for r in out["settlement"].get("runs", []):
        verdict = {True: "[green]passed[/]", False: "[red]failed[/]", None: "-"}[
            r["validation_success"]]
        runs.add_row(r["trade_date"], str(r["run_id"]), r["source"], r["status"], verdict,
                     "yes" if r["published"] else "no", str(r["finished_at"] or ""),
                     str(r["report_path"] or ""))
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
    for t in (sites, parts, days, runs, closes, abandoned):
        console.print(t)
    if out["healthy"]:
        console.print("[bold green]HEALTHY[/]")
    else:
        console.print("[bold red]UNHEALTHY[/]")
        for prob in out["problems"]:
            console.print(f"  - {prob}", highlight=False)


def cmd_services(args: argparse.Namespace, s: Settings) -> dict[str, Any]:
    from settlement import services

    if args.action == "up":
        _console().print("[bold]starting embedded services[/] (PostgreSQL, Kafka KRaft)...")
        return services.up(s, brokers=args.brokers, spark_cluster=args.spark_cluster)
    if args.action == "down":
        return services.down(s)
    return services.status(s)


def _project_root() -> Path:
    root = Path(__file__).resolve().parent.parent
    if not (root / "docker-compose.yml").exists():
        raise ConfigError("settle stack works from a checkout (it needs docker-compose.yml, "
                          "deploy/ and the Dockerfile): run it there, e.g. `make stack-up`")
    return root


def cmd_stack(args: argparse.Namespace, s: Settings) -> dict[str, Any]:
    from settlement.stack import compose

    def log(message: str) -> None:
        _console().print(f"[dim]stack:[/] {message}", highlight=False)

    root = _project_root()
    if args.action == "up":
        return compose.up(root, log, cron=args.cron)
    if args.action == "down":
        return compose.down(root, log)
    stack = compose.open_stack(root, log)
    if args.action == "soak":
        from settlement.stack.soak import run_soak

        result = run_soak(stack, args.days, args.trades, args.minutes, log, seed=args.seed)
    else:
        if not args.date:
            raise ConfigError("settle stack drill: --date YYYY-MM-DD is required (make "
                              "stack-drill DATE=2026-03-02 TRADES=20000)")
        from settlement.stack.drill import run_stack_drill

        result = run_stack_drill(stack, args.date, args.trades, log, seed=args.seed)
    if not result["passed"]:
        raise CommandFailed(f"the stack {args.action} failed: see lost/duplicated/"
                            "dag_run_state", result)
    return result


def cmd_kafka(args: argparse.Namespace, s: Settings) -> dict[str, Any]:
    from settlement.kafka.security import Grant, init

    return init(s, [Grant.parse(g) for g in args.grant])


def cmd_airflow_users(args: argparse.Namespace, s: Settings) -> dict[str, Any]:
    from settlement.orchestration.fab_users import UserGrant, apply_user_grants

    if not args.grant:
        raise ConfigError("settle airflow-users: name at least one --grant "
                          "ROLE:USER:PASSWORD_ENV")
    return {"users": apply_user_grants([UserGrant.parse(g) for g in args.grant])}


def cmd_db(args: argparse.Namespace, s: Settings) -> dict[str, Any]:
    from settlement.db import connect, migrate_all
    from settlement.dbusers import LoginGrant, apply_grants
    from settlement.services.schema import write_schema_file

    if args.action == "schema":
        return {"schema_file": write_schema_file(s, args.output)}
    grants = [LoginGrant.parse(g) for g in args.grant]  # checked before anything changes
    if args.action == "users" and not grants:
        raise ConfigError("settle db users: name at least one --grant "
                          "COMPONENT:USER:PASSWORD_ENV")
    out: dict[str, Any] = {}
    if args.action == "migrate":
        out["databases"] = migrate_all(s)
    if grants:
        with connect(s.for_component("admin").settlement_dsn, autocommit=True) as conn:
            out["users"] = apply_grants(conn, grants)
    return out


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


def cmd_eod(args: argparse.Namespace, s: Settings) -> dict[str, Any]:
    from settlement.eod.pipeline import run_eod

    require_services(s, kafka=False)  # Kafka down is a reason to settle from the ledger
    out = run_eod(s, args.date, source=args.source, accept_incomplete=args.accept_incomplete,
                  progress=_progress(args), only_if_unsettled=args.only_if_unsettled)
    if "joined_run_id" in out:
        if out["status"] != "succeeded":
            raise CommandFailed(f"the close this one joined failed: {out['publication']}", out)
        return out
    if not out.get("published"):
        raise CommandFailed(f"{out.get('publication')} (report: {out.get('report_path')}); "
                            "to publish anyway: --accept-incomplete \"reason\"", out)
    return out


def cmd_validate(args: argparse.Namespace, s: Settings) -> dict[str, Any]:
    from settlement.eod.pipeline import validate_only

    require_services(s, kafka=False)
    out = validate_only(s, args.date, source=args.source)
    if not out["success"]:
        names = ", ".join(f"{f['suite']}: {f['name']}" for f in out["failures"])
        raise CommandFailed(f"validation failed for {args.date}: {names}", out)
    return out


def cmd_drill(args: argparse.Namespace, s: Settings) -> dict[str, Any]:
    from settlement.drills import drill

    require_services(s)
    if args.action == "campaign":
        results = drill.run_campaign(args.runs, args.seed, trades=args.trades, base=s)
        out = drill.summary(results)
        _print_drills(out)
        if args.markdown:
            cmd = f"settle drill campaign --runs {args.runs} --seed {args.seed} " \
                  f"--trades {args.trades}"
            Path(args.markdown).write_text(_DRILLS_HEADER + drill.markdown(results, cmd))
            out["markdown"] = args.markdown
        if out["passed"] != out["runs"]:
            raise CommandFailed(f"{out['runs'] - out['passed']} drill(s) failed", out)
        return out
    if not (args.scheme and args.fault):
        raise ConfigError("settle drill: --scheme and --fault are required (or `campaign`)")
    res = drill.run_drill(drill.DrillSpec(scheme=args.scheme, fault=args.fault,
                                          trades=args.trades, seed=args.seed, at=args.at,
                                          processes=args.processes),
                          s, keep=args.keep, progress=_progress(args))
    out = res.as_dict()
    if not res.passed:
        raise CommandFailed(f"drill failed: lost {res.lost}, duplicated {res.duplicated}, "
                            f"unexpected {res.unexpected}, nonmonotonic {res.nonmonotonic}, "
                            f"RTO {res.rto_seconds}s; see {res.report_path}", out)
    return out


_DRILLS_HEADER = """# Failover drill campaign

Each drill runs the gateway and both sites as real processes on the embedded services
(three Kafka brokers, PostgreSQL), injects one fault and checks an independent
read_committed read of Kafka against the ledger(s). RTO: shared scheme, from the fault to site
B's first trade from site A's partitions; separate scheme, 0 by design (B consumes
everything); db-restart and broker-kill, from the fault to the first trade ingested after it
(for db-restart that includes PostgreSQL's own crash recovery, which depends on the machine's
load, plus the sites' retry backoff of at most 5 s).

Faults by progress, not by the clock: the fault hits once site A has committed the drill's
fraction (`at`, the column below) of its share of the day, read from the ledger (its share:
the day's trades on the partitions it owns, which the deterministic gateway tells in
advance), so it always finds A working; the drill page notes how far A had got. A campaign
deals the (fault, scheme) pairs so that its first five drills cover every fault and run the
failover paths, kill and pause, in the shared scheme. `eod-kill` hits the close instead: the
day is ingested undisturbed, both sites close it at once and site A's close is killed mid-run;
its RTO is from the kill to site B's close starting its run, and the drill also requires the
killed run recorded abandoned, none left running and the day published once.

Why 6 s: a dead site in the shared scheme is noticed when its group session expires.
Kafka's default `session.timeout.ms` of 45 s would make every takeover take 45 s or more; the
sites use 6 s with a 1 s heartbeat (`SETTLE_SESSION_TIMEOUT_MS`, `SETTLE_HEARTBEAT_INTERVAL_MS`;
the embedded brokers allow down to 1 s), which keeps a takeover near 6 s while tolerating
several missed heartbeats from a busy site. The eager `roundrobin` assignment hands all of
the dead site's partitions over in one rebalance, and the survivor seeks to the offsets stored
in the ledger, so nothing is re-read.

Frozen sites: the pause drill stops site A (SIGSTOP) while its ledger writer is inside a batch
transaction, the worst moment. Ledger sessions wait boundedly: `lock_timeout` (2 s) and
`statement_timeout` (30 s), and `idle_in_transaction_session_timeout` (5 s) ends a frozen
site's session, which frees the offset row locks before the group even rebalances. No server
timeout ends a session waiting for COPY data, so a site sends its COPY into its own staging
table before it locks anything: frozen mid-COPY, it blocks nobody. When A wakes, its stale
batch is refused, by the compare-and-set on the stored offsets or because the server ended
its transaction while another site moved those offsets (the "fenced batches" column: at
least one for a shared-scheme pause).

"""


def _print_drills(out: dict[str, Any]) -> None:
    from rich.table import Table

    t = Table(title=f"drill campaign: {out['passed']}/{out['runs']} passed")
    for col in ("scheme", "fault", "at", "trades", "lost", "duplicated", "unexpected",
                "nonmonotonic", "rto_seconds", "fenced", "passed"):
        t.add_column(col)
    for d in out["drills"]:
        t.add_row(*(str(d[c]) for c in ("scheme", "fault", "at", "trades", "lost", "duplicated",
                                         "unexpected", "nonmonotonic", "rto_seconds",
                                         "fenced", "passed")))
    _console().print(t)


def cmd_demo(args: argparse.Namespace, s: Settings) -> dict[str, Any]:
    import datetime as dt

    from settlement.drills.demo import DemoOptions, run_demo

    day = args.date or dt.date.today().isoformat()
    return run_demo(DemoOptions(trade_date=day, scheme=args.scheme, trades=args.trades,
                                rate=args.rate, seed=args.seed))


COMMANDS: dict[str, Handler] = {
    "status": cmd_status,
    "demo": cmd_demo,
    "eod": cmd_eod,
    "validate": cmd_validate,
    "drill": cmd_drill,
    "services": cmd_services,
    "stack": cmd_stack,
    "db": cmd_db,
    "kafka": cmd_kafka,
    "airflow-users": cmd_airflow_users,
    "simulate": cmd_simulate,
    "site": cmd_site,
}


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows "(default: X)" after an option's help, except where there is nothing to show
    (a flag, an unset default) or the help already says what the default is."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        # identity, not equality: 0 and 0.0 are defaults worth showing, False is a flag's
        if action.default is None or action.default is False or action.default == [] \
                or "default" in text:
            return action.help
        return super()._get_help_string(action)


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("dual-site-settlement")
    except PackageNotFoundError:  # imported from a checkout that was never installed
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="settle", formatter_class=_HelpFormatter,
        description="Dual-site failover settlement: Kafka -> PostgreSQL -> PySpark netting.",
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    # --json before the command; every subcommand also takes it after (both work). A separate
    # dest: a subparser's own default would otherwise overwrite the value parsed here.
    p.add_argument("--json", dest="json_first", action="store_true",
                   help="print one JSON object as the last line of stdout")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, help: str) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, help=help, description=help, formatter_class=_HelpFormatter)
        sp.add_argument("--json", action="store_true",
                        help="print one JSON object as the last line of stdout")
        return sp

    sp = add("status", "are the sites healthy and caught up, and how did the last days "
                       "settle? exit 0 healthy, 1 not (a probe can use it)")
    sp.add_argument("--max-heartbeat-age", type=float, default=15.0, metavar="SECONDS",
                    help="a site whose last heartbeat is older is down")
    sp.add_argument("--max-lag", type=_non_negative, default=10_000, metavar="MESSAGES",
                    help="a partition further behind its high watermark is unhealthy")
    sp.add_argument("--max-lag-seconds", type=float, default=120.0, metavar="SECONDS",
                    help="a partition whose oldest unstored message is older is unhealthy")
    sp.add_argument("--forget-after", type=float, default=3600.0, metavar="SECONDS",
                    help="a site silent for longer is taken as retired, not down")

    sp = add("services", "run the embedded PostgreSQL and Kafka on loopback")
    sp.add_argument("action", choices=["up", "down", "status"])
    sp.add_argument("--brokers", type=int, choices=[1, 3], default=None,
                    help="Kafka cluster size (default SETTLE_KAFKA_BROKERS or 1)")
    sp.add_argument("--spark-cluster", action="store_true",
                    help="up: also a standalone Spark master and SETTLE_SPARK_WORKERS one-core "
                         "workers on loopback (then SETTLE_SPARK_MASTER=spark_master_url); "
                         "down stops them whenever they run")

    sp = add("stack", "the docker-compose deployment on this machine (images built here, "
                      "host networking on loopback)")
    sp.add_argument("action", choices=["up", "down", "drill", "soak"],
                    help="up: engine, images, .env, certificates, then every service healthy; "
                         "down: remove containers and volumes; drill: a faulty day, site-a "
                         "killed, the close run by the stack's scheduler; soak: --days "
                         "compressed trading days, each close created by the scheduler from "
                         "its timetable, a random site killed in each")
    sp.add_argument("--date", type=_date, help="drill: the trade date (YYYY-MM-DD)")
    sp.add_argument("--trades", type=int, default=20_000, help="drill, soak: trades a day")
    sp.add_argument("--seed", type=int, default=7, help="drill, soak: the simulator's seed")
    sp.add_argument("--days", type=int, default=3, help="soak: trading days")
    sp.add_argument("--minutes", type=int, default=4, choices=[2, 3, 4, 5, 6, 10],
                    help="soak: minutes between two closes")
    sp.add_argument("--cron", default="none",
                    help="up: eod_settlement's schedule in the stack (a cron expression, or "
                         "none: runs only when created)")

    sp = add("db", "database schema and login users (as the admin)")
    sp.add_argument("action", choices=["migrate", "schema", "users"],
                    help="migrate: apply sql/migrations everywhere; schema: regenerate "
                         "sql/schema.sql (or --output FILE) from an empty database; users: "
                         "create or update the --grant login users (migrate does too, after "
                         "the migrations)")
    sp.add_argument("--grant", action="append", default=[],
                    metavar="COMPONENT:USER:PASSWORD_ENV",
                    help="migrate, users: create or update USER (password from the environment "
                         "variable PASSWORD_ENV, sent as a SCRAM verifier) as a member of "
                         "COMPONENT's group role only: site_a, site_b, settlement or "
                         "auditor; repeatable; re-run to rotate a password")
    sp.add_argument("--output", type=Path, default=None, metavar="FILE",
                    help="schema: write here instead of sql/schema.sql (default: %(default)s)")

    sp = add("kafka", "prepare a Kafka cluster: the trades topic, users and ACLs (as admin)")
    sp.add_argument("action", choices=["init"])
    sp.add_argument("--grant", action="append", default=[], metavar="ROLE:USER[:PASSWORD_ENV]",
                    help="create or update USER (password from the environment variable "
                         "PASSWORD_ENV) with the ACLs of ROLE: gateway, site-a, site-b or "
                         "settlement; repeatable")

    sp = add("airflow-users", "create or update Airflow's users and roles (FAB auth manager)")
    sp.add_argument("--grant", action="append", default=[], metavar="ROLE:USER:PASSWORD_ENV",
                    help="create or update USER with exactly ROLE: auditor (Viewer: sees runs, "
                         "logs and reports), operations (Op: also triggers and clears) or "
                         "admin; the password is read from the environment variable "
                         "PASSWORD_ENV; repeatable; re-run to rotate a password")

    sp = add("simulate", "publish one trading day to the trades topic")
    sp.add_argument("--date", type=_date, required=True, help="trade date YYYY-MM-DD")
    sp.add_argument("--trades", type=_positive, default=10_000, help="trades in the day")
    sp.add_argument("--seed", type=_non_negative, default=1, help="random seed")
    sp.add_argument("--dup-rate", type=_rate, default=0.0,
                    help="fraction of trades replayed by a non-idempotent upstream")
    sp.add_argument("--bad-rate", type=_rate, default=0.0,
                    help="malformed messages per trade")
    sp.add_argument("--abort-rate", type=_rate, default=0.0,
                    help="fraction of transactions aborted (then re-sent)")
    sp.add_argument("--cancel-rate", type=_rate, default=0.0,
                    help="fraction of trades busted later in the day (a cancel message)")
    sp.add_argument("--correct-rate", type=_rate, default=0.0,
                    help="fraction of trades corrected later in the day (version 2; a "
                         "quarter of them again, version 3)")
    sp.add_argument("--rate", type=_positive, default=None,
                    help="pace the day at this many trades/s (default: as fast as possible)")
    sp.add_argument("--hostile-names", action="store_true",
                    help="security drill: some accounts, symbols and trade ids carry HTML/JS, "
                         "quotes, SQL and unicode; besides one trade in 7 goes a copy whose "
                         "buyer holds a control character (a dead letter)")

    sp = add("site", "run one consumer site")
    sp.add_argument("action", choices=["run"])
    sp.add_argument("--site", choices=["a", "b"], required=True, help="which site")
    sp.add_argument("--scheme", choices=["separate", "shared"], required=True,
                    help="separate: a ledger and group per site; shared: one of each")
    sp.add_argument("--until-close", action="store_true",
                    help="exit once every partition's close marker for the day is ingested")
    sp.add_argument("--date", type=_date, default=None,
                    help="the day --until-close waits for (default: newest day in the ledger)")
    sp.add_argument("--max-seconds", type=_seconds, default=None,
                    help="stop after this many seconds (> 0) even if the day is not closed "
                         "(default: no limit)")
    sp.add_argument("--processes", type=_positive, default=1,
                    help="consumer processes for this site, all members of its consumer "
                         "group (default 1); the JSON sums their counters")
    sp = add("eod", "end-of-day settlement of one trade date (then validation and report)")
    sp.add_argument("--date", type=_date, required=True, help="trade date YYYY-MM-DD")
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

    sp = add("validate", "Great Expectations checks of one trade date (no settlement)")
    sp.add_argument("--date", type=_date, required=True, help="trade date YYYY-MM-DD")
    sp.add_argument("--source", choices=["auto", "kafka", "db"], default="auto",
                    help="where to read the day")

    sp = add("drill", "failover drill: live sites, one injected fault, a Jepsen-style check")
    sp.add_argument("action", nargs="?", choices=["run", "campaign"], default="run",
                    help="one drill, or a campaign of random ones")
    sp.add_argument("--scheme", choices=["separate", "shared"], help="run: the scheme")
    sp.add_argument("--fault", choices=["kill", "pause", "db-restart", "broker-kill",
                                        "eod-kill"],
                    help="run: the fault injected into site A or the services (eod-kill: "
                         "into site A's close of the day)")
    sp.add_argument("--trades", type=_positive, default=20_000, help="trades in the day")
    sp.add_argument("--seed", type=_non_negative, default=1, help="random seed")
    sp.add_argument("--at", type=_rate, default=0.4,
                    help="inject when site A has committed this fraction of its share (0-1)")
    sp.add_argument("--processes", type=_positive, default=1,
                    help="consumer processes per site (the fault hits all of site A's)")
    sp.add_argument("--runs", type=_positive, default=4, help="campaign: number of drills")
    sp.add_argument("--markdown", default=None, help="campaign: write a Markdown summary")
    sp.add_argument("--keep", action="store_true", help="keep the drill's topic and databases")
    sp.add_argument("--quiet", action="store_true", help="no progress lines on stderr")

    sp = add("demo", "the main job end to end on the embedded services")
    # argparse checks `choices` on the command line only, never on a default: the scheme
    # from the environment (`SCHEME=... make demo`) is checked by its type instead.
    sp.add_argument("--scheme", type=_demo_scheme, default=os.environ.get("SCHEME", "shared"),
                    help="the sites' scheme: separate or shared (default: $SCHEME, else shared)")
    sp.add_argument("--date", type=_date, default=None, help="trade date (default today)")
    sp.add_argument("--trades", type=_positive, default=60_000, help="trades in the day")
    sp.add_argument("--rate", type=_positive, default=10_000, help="trades/s")
    sp.add_argument("--seed", type=_non_negative, default=42, help="random seed")
    return p


def _print_human(result: dict[str, Any]) -> None:
    from rich.pretty import Pretty

    _console().print(Pretty(result))


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.json = want_json = bool(getattr(args, "json", False) or args.json_first)
    try:
        settings = load_settings()
        result = COMMANDS[args.command](args, settings)
        code = 0
    except ConfigError as e:
        result, code = {"ok": False, "error": str(e)}, 2
    except CommandFailed as e:
        result, code = {"ok": False, "error": str(e), **e.result}, 1
    except KeyboardInterrupt:
        result, code = {"ok": False, "error": "interrupted"}, 130
    except Exception as e:  # noqa: BLE001 - the CLI's last line of defence: say what failed
        from settlement.errors import describe

        result, code = {"ok": False, "error": describe(e)}, 1
    else:
        result = {"ok": True, **result}
    if result.get("error") is not None:
        result["error"] = redact(str(result["error"]))
    if code != 0:
        print(f"settle {args.command}: error: {result['error']}", file=sys.stderr)
    if want_json:
        print(json.dumps(result, default=str), flush=True)
    elif code == 0 and args.command not in ("demo", "status"):  # these print their own
        _print_human(result)
    return code


if __name__ == "__main__":
    sys.exit(main())
