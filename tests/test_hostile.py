"""A hostile day on the real services, watched for leaks.

Hostile text stays inert: names carrying HTML/JS, quotes, SQL, bidi and astral unicode travel
gateway -> site -> ledger -> Spark -> published tables -> audit report as data, and a control
character sends its trades to the dead letters with their raw bytes.

Secrets never leak: while the day runs (gateway, two sites, the end of day with Spark), the
process table is sampled; afterwards every log, report and output is searched for the
embedded server's passwords, and so are the CLI's error messages.
"""

from __future__ import annotations

import datetime as dt
import html.parser
import os
import re
import stat
import subprocess
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from settlement.config import EMBEDDED_USERS
from settlement.db import connect
from settlement.services.postgres import read_pgpass
from settlement.simulator.gateway import DayGenerator, SimulationSpec
from settlement.simulator.hostile import (
    CONTROL_ACCOUNT,
    HOSTILE_ACCOUNTS,
    HOSTILE_SYMBOLS,
    HOSTILE_TRADE_ID_SUFFIX,
    PWNED_TITLES,
)
from tests.conftest import Isolated
from tests.helpers import chromium, last_json, settle, start_site, wait_exit

pytestmark = pytest.mark.services

DAY, TRADES, SEED = "2026-11-26", 3000, 9


class _Tables(html.parser.HTMLParser):
    """The text of every table cell, grouped by the <h2> heading above its table."""

    def __init__(self) -> None:
        super().__init__()
        self.section, self.tables = "", {}  # type: tuple[str, dict[str, list[list[str]]]]
        self._in: str | None = None
        self._text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in ("h2", "td"):
            self._in, self._text = tag, []
        elif tag == "tr":
            self.tables.setdefault(self.section, []).append([])

    def handle_endtag(self, tag: str) -> None:
        if tag == self._in == "h2":
            self.section = "".join(self._text).strip()
        elif tag == self._in == "td":
            self.tables[self.section][-1].append("".join(self._text))
        if tag == self._in:
            self._in = None

    def handle_data(self, data: str) -> None:
        if self._in:
            self._text.append(data)


def _expected() -> tuple[list, Counter[str]]:
    """The gateway's day, regenerated: its trades, and per account the trades it settles."""
    settled = list(DayGenerator(SimulationSpec(DAY, TRADES, seed=SEED, hostile_names=True),
                                6).trades())
    return settled, Counter([t.buyer for t in settled] + [t.seller for t in settled])


@dataclass(frozen=True)
class Day:
    iso: Isolated
    out: dict[str, Any]  # `settle eod`'s JSON
    outputs: list[str]  # every command's stdout and stderr
    processes: set[str]  # every command line seen while the day ran
    logs: Path


def _sample_processes(seen: set[str], stop: threading.Event) -> None:
    while not stop.wait(0.2):  # bounded by the fixture's own run
        res = subprocess.run(["ps", "-ww", "-eo", "args", "--no-headers"], capture_output=True,
                             text=True, check=False)
        seen.update(res.stdout.splitlines())


@pytest.fixture(scope="module")
def day(services: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Day]:
    import os
    import uuid

    from settlement.drills.namespace import (
        drop_namespace,
        namespace_env,
        namespace_settings,
        reset_namespace,
    )

    logs = tmp_path_factory.mktemp("hostile")
    names = namespace_env(services, f"t{uuid.uuid4().hex[:10]}")
    env = {**os.environ, **names}
    settings = namespace_settings(services, names)
    reset_namespace(settings)
    seen: set[str] = set()
    stop = threading.Event()
    sampler = threading.Thread(target=_sample_processes, args=(seen, stop), daemon=True)
    sampler.start()
    outputs: list[str] = []
    try:
        sim = settle(["simulate", "--date", DAY, "--trades", str(TRADES), "--seed", str(SEED),
                      "--hostile-names"], env)
        assert sim["trades"] == TRADES
        assert sim["malformed_by_kind"] == {"hostile_control_char": -(-TRADES // 7)}
        sites = [(start_site(s, "shared", env, DAY, logs / f"{s}.log"), logs / f"{s}.log")
                 for s in ("a", "b")]
        for proc, log in sites:
            assert wait_exit(proc, log)["closed"]
        res = subprocess.run(["settle", "eod", "--date", DAY, "--json"], env=env,
                             capture_output=True, text=True, timeout=900, check=False)
        outputs += [res.stdout, res.stderr]
        assert res.returncode == 0, res.stderr[-3000:]
        out = last_json(res.stdout)
    finally:
        stop.set()
        sampler.join(10)
    yield Day(Isolated(settings, env, names["SETTLE_TOPIC"]), out, outputs, seen, logs)
    drop_namespace(settings)


def test_hostile_names_travel_as_data_and_the_report_runs_no_script(
        day: Day, tmp_path: Path) -> None:
    isolated, out = day.iso, day.out
    assert out["published"] and out["validation_success"], out

    settled, per_account = _expected()
    refused = sum(t.trade_id.endswith(HOSTILE_TRADE_ID_SUFFIX) for t in settled)
    assert refused > 400 and CONTROL_ACCOUNT not in per_account
    with connect(isolated.settings.ledger_dsn("shared")) as conn:
        ledger = conn.execute(
            "select trade_id, symbol, buyer, seller, price from trades where trade_date = %s",
            (DAY,)).fetchall()
        dead = conn.execute("select raw, reason from dead_letters").fetchall()
    # Byte for byte what the gateway sent, hostile or not.
    assert sorted(ledger) == sorted((t.trade_id, t.symbol, t.buyer, t.seller, t.price)
                                    for t in settled)
    assert set(HOSTILE_SYMBOLS) <= {row[1] for row in ledger}
    assert set(HOSTILE_ACCOUNTS) <= {row[2] for row in ledger}
    assert sum(row[0].endswith(HOSTILE_TRADE_ID_SUFFIX) for row in ledger) == refused
    # Every refused trade is a dead letter holding its raw bytes and the reason.
    assert len(dead) == refused
    assert all(b"ACC\\u001b[31mRED" in bytes(raw) for raw, _ in dead)
    assert all("control" in reason or "printable" in reason for _, reason in dead), dead[0]

    # Spark settled them: the published obligations name the hostile accounts exactly.
    with connect(isolated.settings.settlement_dsn) as conn:
        counts = dict(conn.execute(
            "select account, trade_count from cash_obligations where trade_date = %s", (DAY,)))
        top = [r[0] for r in conn.execute(
            "select account from cash_obligations where trade_date = %s"
            " order by abs(net_cash) desc limit 10", (DAY,))]
        summary = {s: (n, c) for s, n, c in conn.execute(
            "select symbol, notional, close_price from instrument_summary"
            " where trade_date = %s", (DAY,))}
    assert counts == dict(per_account)
    for symbol in HOSTILE_SYMBOLS:
        mine = [t for t in settled if t.symbol == symbol]
        assert summary[symbol][0] == sum((t.price * t.quantity for t in mine), Decimal(0))
        # The close: the price of the symbol's last trade by (executed_at, trade_id).
        last = max(mine, key=lambda t: (dt.datetime.fromisoformat(t.executed_at), t.trade_id))
        assert summary[symbol][1] == last.price

    # The report, rendered by a real browser: no payload ran, and every name is a cell's text
    # in a table of the right shape (markup in a name would add or close rows and cells).
    report = Path(out["report_path"])
    dom = chromium(report.as_uri(), tmp_path, screenshot=tmp_path / "hostile-report.png")
    title = re.search(r"<title>(.*?)</title>", dom, re.S)
    assert title and title.group(1) == f"Settlement audit report {DAY}"
    assert title.group(1) not in PWNED_TITLES
    assert "data-pwned" not in dom and "<script" not in dom.lower().replace("&lt;script", "")
    tables = _Tables()
    tables.feed(dom)
    obligations = [r for r in tables.tables["Largest obligations"] if r]
    instruments = [r for r in tables.tables["Instruments"] if r]
    assert [r[0] for r in obligations] == top
    assert all(len(r) == 6 for r in obligations) and all(len(r) == 5 for r in instruments)
    assert set(HOSTILE_ACCOUNTS) & {r[0] for r in obligations}
    assert sorted(r[0] for r in instruments) == sorted(summary)


def _texts(root: Path, skip: tuple[Path, ...] = (),
           suffix: str = "") -> Iterator[tuple[Path, str]]:
    # Skipped folders are pruned before the walk enters them, and a file that vanishes under
    # the walk is passed over: the other worker's tests drop their databases and namespaces
    # meanwhile (a walk into postgres/data once met a database folder being removed).
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if Path(folder, d) not in skip]
        for name in files:
            if not name.endswith(suffix):
                continue
            path = Path(folder, name)
            try:
                st = path.stat()
                # Regular files only: PostgreSQL's socket lives under the state folder too.
                if stat.S_ISREG(st.st_mode) and st.st_size < 50_000_000:
                    yield path, path.read_bytes().decode("utf-8", "replace")
            except FileNotFoundError:
                continue


def test_no_password_in_the_process_table_logs_reports_or_outputs(day: Day) -> None:
    settings = day.iso.settings
    passwords = read_pgpass(settings.pg_passfile)
    # One login per component (the monitoring login included), each its own random secret.
    assert set(passwords) == set(EMBEDDED_USERS.values())
    assert all(len(p) >= 24 for p in passwords.values())
    # The end of day really ran under the watch: Spark's JVM was in the process table.
    assert any("org.apache.spark" in p or "pyspark" in p for p in day.processes)
    for line in day.processes:
        assert not any(p in line for p in passwords.values()), line[:300]
    # Everything written while the day ran: the services' logs (not their data), the sites'
    # logs, the reports and GX's results, and the commands' outputs.
    state = settings.state_dir
    places = [(day.logs, ()), (settings.reports_dir, ()), (settings.gx_project_dir, ()),
              (state, (state / "secrets", state / "postgres" / "data", state / "kafka"))]
    searched = 0
    for root, skip in places:
        for path, text in _texts(root, skip):
            searched += 1
            assert not any(p in text for p in passwords.values()), path
    for node_log, text in _texts(state / "kafka", suffix=".log"):
        searched += 1
        assert not any(p in text for p in passwords.values()), node_log
    assert searched > 20
    for text in day.outputs:
        assert not any(p in text for p in passwords.values())


@pytest.mark.parametrize("env,fragment", [
    # A refused value is named without its password...
    ({"SETTLE_PG_DSN": "mysql://eve:S3cret-pw-1@db/x"}, "SETTLE_PG_DSN"),
    # ...an unreachable server too...
    ({"SETTLE_PG_DSN": "postgresql://eve:S3cret-pw-1@127.0.0.1:9/x"},
     "reachable|Connection refused"),
    # ...and a refused login.
    ({"SETTLE_PG_DSN": "postgresql://settle_audit:S3cret-pw-1@127.0.0.1:{port}/settlement"},
     "password authentication failed"),
])
def test_cli_errors_never_show_a_password(services: Any, env: dict[str, str],
                                          fragment: str) -> None:
    import os

    env = {k: v.format(port=services.pg_port) for k, v in env.items()}
    for args in (["status"], ["eod", "--date", DAY], ["db", "migrate"]):
        res = subprocess.run(["settle", *args], env={**os.environ, **env}, capture_output=True,
                             text=True, timeout=120, check=False)
        assert res.returncode != 0
        assert re.search(fragment, res.stdout + res.stderr), (args, res.stderr[-500:])
        assert "S3cret-pw-1" not in res.stdout + res.stderr, args
