"""`settle drill [run|campaign]`: failover drills on live sites, checked Jepsen-style."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from settlement.cli.common import (
    CommandFailed,
    Subparsers,
    add_command,
    console,
    fraction,
    non_negative,
    positive,
    progress,
    require_services,
)
from settlement.config import ConfigError, Settings


def register(sub: Subparsers) -> None:
    sp = add_command(sub, "drill", "failover drill: live sites, one injected fault, a "
                                   "Jepsen-style check", cmd_drill)
    sp.add_argument("action", nargs="?", choices=["run", "campaign"], default="run",
                    help="one drill, or a campaign of random ones")
    sp.add_argument("--scheme", choices=["separate", "shared"], help="run: the scheme")
    sp.add_argument("--fault", choices=["kill", "pause", "db-restart", "broker-kill",
                                        "eod-kill"],
                    help="run: the fault injected into site A or the services (eod-kill: "
                         "into site A's close of the day)")
    sp.add_argument("--trades", type=positive, default=20_000, help="trades in the day")
    sp.add_argument("--seed", type=non_negative, default=1, help="random seed")
    sp.add_argument("--at", type=fraction, default=0.4,
                    help="inject when site A has committed this fraction of its share (0-1)")
    sp.add_argument("--processes", type=positive, default=1,
                    help="consumer processes per site (the fault hits all of site A's)")
    sp.add_argument("--runs", type=positive, default=4, help="campaign: number of drills")
    sp.add_argument("--markdown", default=None, help="campaign: write a Markdown summary")
    sp.add_argument("--keep", action="store_true", help="keep the drill's topic and databases")
    sp.add_argument("--quiet", action="store_true", help="no progress lines on stderr")


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
                          s, keep=args.keep, progress=progress(args))
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
    console().print(t)
