"""`settle demo`: the main job end to end on the embedded services.

A simulated trading day with duplicates, malformed messages, aborted transactions, busts and
corrections; both sites consuming in the chosen scheme; site A killed once it has committed a
chosen fraction of its share of the day (read from the ledger, so the kill always finds it
working) and site B taking over; then the end-of-day steps that exist, and a summary. The
demo works in its own namespace (topic ``demo_trades``, databases ``demo_*``) so it never
disturbs other data, and resets that namespace at every run.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from settlement.config import Settings, load_settings
from settlement.drills.namespace import namespace_env, reset_namespace
from settlement.drills.runner import spawn_settle, start_site, wait


@dataclass(frozen=True)
class DemoOptions:
    trade_date: str
    scheme: str = "shared"
    trades: int = 60_000
    rate: int = 10_000
    seed: int = 42
    kill_at: float = 0.4  # fraction of its share of the day site A commits before SIGKILL


def _console() -> Any:
    from rich.console import Console

    return Console(stderr=True)


def run_demo(opts: DemoOptions) -> dict[str, Any]:
    from settlement import services
    from settlement.drills.checker import (
        check_ledger,
        day_share,
        read_kafka_day,
        wait_for_owners,
        wait_for_share,
    )

    con = _console()
    base = load_settings()
    con.rule("[bold]dual-site settlement demo")
    con.print("1/5 starting embedded PostgreSQL and Kafka...")
    services.up(base)
    names = namespace_env(base, "demo")
    env = {**os.environ, **names, "SETTLE_BATCH_SIZE": "2000"}
    os.environ.update(names)
    settings = load_settings()
    reset_namespace(settings)
    logs = settings.state_dir / "demo"
    logs.mkdir(parents=True, exist_ok=True)
    _reference_data(settings, opts.trade_date, logs / "refdata")

    con.print(f"2/5 trading day {opts.trade_date}: {opts.trades} trades at {opts.rate}/s, "
              f"scheme [bold]{opts.scheme}[/], both sites consuming")
    a = start_site("a", opts.scheme, opts.trade_date, env, logs / "site-a.log")
    b = start_site("b", opts.scheme, opts.trade_date, env, logs / "site-b.log")
    # Both sites in the group before trading starts, so the day is shared from its start.
    wait_for_owners({s: settings.ledger_dsn(settings.site_ledger(s, opts.scheme))
                     for s in ("a", "b")}, timeout=60)
    gw = spawn_settle(["simulate", "--date", opts.trade_date, "--trades", str(opts.trades),
                       "--seed", str(opts.seed), "--dup-rate", "0.01", "--bad-rate", "0.001",
                       "--abort-rate", "0.1", "--cancel-rate", "0.002", "--correct-rate",
                       "0.003", "--rate", str(opts.rate)], env,
                      logs / "gateway.log")
    progress = wait_for_share(
        settings.ledger_dsn(settings.site_ledger("a", opts.scheme)), "a",
        day_share(opts.trade_date, opts.trades, opts.seed, settings.partitions), opts.kill_at,
        timeout=opts.trades / opts.rate * 2 + 60, own_all=opts.scheme == "separate",
        alive=lambda: a.poll() is None)
    a.send_signal(signal.SIGKILL)
    killed_at = time.time()
    con.print(f"3/5 [red]site A killed[/] (SIGKILL): {progress.describe()}; "
              "site B carries on")
    sim = wait(gw, "gateway", logs / "gateway.log", 600)
    site_b = wait(b, "site B", logs / "site-b.log", 600)

    con.print("4/5 checking the ledger against an independent read of Kafka...")
    survivor = settings.site_ledger("b", opts.scheme)
    day = read_kafka_day(settings, opts.trade_date)
    check = check_ledger(settings.ledger_dsn(survivor), day, settings.topic)

    con.print("5/5 end of day: the eod_settlement DAG via dag.test() (Spark, Great "
              "Expectations, audit report)...")
    eod = _end_of_day(settings, opts, logs)

    summary = {
        "trade_date": opts.trade_date,
        "scheme": opts.scheme,
        "trades_published": sim.get("trades"),
        "duplicates_injected": sim.get("duplicates_injected"),
        "malformed_injected": sim.get("malformed_injected"),
        "aborted_trades": sim.get("aborted"),
        "busts_published": sim.get("cancels"),
        "corrections_published": sim.get("corrections"),
        "ledger_amendments": check.amendments,
        "site_a_killed_at": time.strftime("%H:%M:%S", time.gmtime(killed_at)),
        "site_a_at_kill": progress.describe(),
        "survivor_ledger": survivor,
        "ledger_trades": check.ledger_rows,
        "lost": len(check.lost),
        "duplicated": len(check.duplicated),
        "unexpected": len(check.unexpected),
        **_ledger_counts(settings.ledger_dsn(survivor)),
        "site_b_rebalances": site_b.get("rebalances"),
        **eod,
        "logs": str(logs),
    }
    _print_summary(con, summary)
    summary["still_running"] = _still_running(con, settings)
    if not check.ok:
        raise RuntimeError(f"the ledger does not match Kafka: {check.as_dict()}")
    if eod["eod_dag_state"] != "success" or not eod["validation_success"]:
        raise RuntimeError(f"end of day did not succeed: {eod}")
    return summary


def _ledger_counts(dsn: str) -> dict[str, Any]:
    from settlement.db import connect

    with connect(dsn) as conn:
        dups = conn.execute("select coalesce(sum(duplicates), 0) from ingest_batches").fetchone()
        dead = conn.execute("select count(*) from dead_letters").fetchone()
        by_site = conn.execute("select site, count(*) from trades group by 1 order by 1"
                               ).fetchall()
    return {"duplicates_suppressed": int(dups[0]) if dups else 0,
            "dead_letters": int(dead[0]) if dead else 0,
            **{f"trades_ingested_by_site_{site}": int(n) for site, n in by_site}}


def _end_of_day(settings: Settings, opts: DemoOptions, logs: Any) -> dict[str, Any]:
    """The eod_settlement DAG, run once through dag.test() as Airflow would run it."""
    from settlement.db import connect
    from settlement.orchestration.dagtest import run_dag

    state = run_dag(settings, "eod_settlement", {"trade_date": opts.trade_date,
                                                 "source": "auto"},
                    settings.state_dir / "airflow-demo", logs / "eod_settlement.log")
    with connect(settings.settlement_dsn) as conn:
        row = conn.execute(
            "select source, source_reason, trades, validation_success, netting_efficiency,"
            " report_path from settlement_runs where trade_date = %s"
            " order by run_id desc limit 1", (opts.trade_date,)).fetchone()
    if row is None:
        raise RuntimeError(f"the eod_settlement DAG ended {state} without a settlement run; "
                           f"see {logs / 'eod_settlement.log'}")
    keys = ("source", "source_reason", "settled_trades", "validation_success",
            "netting_efficiency", "report_path")
    return {"eod_dag_state": state, **dict(zip(keys, row, strict=True)),
            **_instructions(settings, opts.trade_date)}


def _reference_data(settings: Settings, trade_date: str, out: Path) -> None:
    """The simulator's securities and participants loaded as an operator would (`settle
    refdata example` then `load`): the summary names the members, and custodian mode
    (SETTLE_INSTRUCTIONS_MODE=custodian) finds every ISIN and safekeeping account."""
    from settlement.instructions.refdata import example, load
    from settlement.simulator.gateway import SimulationSpec, day_names

    symbols, accounts = day_names(SimulationSpec(trade_date, 1))
    example(out, symbols, accounts, settings.settlement_currency)
    load(settings, out / "securities.csv", out / "participants.csv")


def _instructions(settings: Settings, trade_date: str) -> dict[str, Any]:
    """The settlement date and the instruction files the DAG wrote after publication (the
    same files again: a run's instructions are fixed once written)."""
    from settlement.instructions import write_files
    from settlement.instructions.store import InstructionsError

    try:
        sent = write_files(settings, trade_date)
    except InstructionsError as e:
        return {"instructions": f"none: {e}"}
    return {"settlement_date": sent["settlement_date"], "instructions": sent["instructions"],
            "instructions_csv": sent["paths"]["csv"],
            "instructions_iso20022": sent["paths"]["iso20022"],
            **({"instructions_held": len(sent["held"])} if "held" in sent else {})}


# The summary's files, and what each is, in the order they are printed.
PATHS = {"report_path": "audit report", "instructions_csv": "instructions (CSV)",
         "instructions_iso20022": "instructions (ISO 20022)", "logs": "logs"}


def _print_summary(con: Any, summary: dict[str, Any]) -> None:
    from rich.table import Table

    t = Table(title="demo summary", show_header=False)
    t.add_column(no_wrap=True)
    t.add_column(overflow="fold")
    for k, v in summary.items():
        if k in PATHS:
            continue
        style = "red" if k in ("lost", "duplicated", "unexpected") and v else ""
        t.add_row(k.replace("_", " "), f"[{style}]{v}[/]" if style else str(v))
    con.print(t)
    # The files to open, whole on a line each (soft wrap: the terminal wraps a long one and a
    # copy keeps it one path), never cut with "…" by a table cell.
    for k in PATHS:
        if summary.get(k):
            con.print(f"{PATHS[k]:<25} {summary[k]}", soft_wrap=True, highlight=False,
                      markup=False)


def _still_running(con: Any, settings: Settings) -> dict[str, Any]:
    """The demo leaves the embedded services up (a second demo, `make airflow` or `settle
    status` reuse them): say so, where they listen, and how to stop them."""
    if not settings.embedded_kafka or settings.pg_dsn is not None:
        return {}  # external services: not the demo's to stop
    left = {"postgres": f"127.0.0.1:{settings.pg_port}", "kafka": settings.bootstrap()}
    con.print(f"Still running: embedded PostgreSQL on {left['postgres']} and Kafka on "
              f"{left['kafka']} (data in {settings.state_dir}). Stop them with "
              "[bold]make down[/] (or `settle services down`); `make airflow` reuses them.")
    return left
