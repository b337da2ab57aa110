"""Running the real `settle` CLI in subprocesses, as operators and the drills do."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from decimal import Decimal
from pathlib import Path
from typing import Any

from settlement.config import Settings
from settlement.drills import runner
from settlement.simulator.gateway import DayGenerator, SimulationSpec, final_trades

ROOT = Path(__file__).resolve().parents[1]
SETTLE = [sys.executable, "-m", "settlement.cli"]


def last_json(stdout: str) -> dict[str, Any]:
    lines = [ln for ln in stdout.strip().splitlines() if ln.startswith("{")]
    assert lines, f"no JSON line in output:\n{stdout[-2000:]}"
    return json.loads(lines[-1])


def settle(args: list[str], env: dict[str, str], timeout: float = 300,
           check: bool = True) -> dict[str, Any]:
    res = subprocess.run([*SETTLE, *args, "--json"], env=env, capture_output=True, text=True,
                         timeout=timeout, cwd=ROOT)
    if check:
        assert res.returncode == 0, (
            f"settle {args} failed ({res.returncode}):\n{res.stderr[-3000:]}")
    out = last_json(res.stdout)
    out["_returncode"] = res.returncode
    out["_stderr"] = res.stderr
    return out


def start_site(site: str, scheme: str, env: dict[str, str], date: str,
               log: Path, extra_env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return runner.start_site(site, scheme, date, {**env, **(extra_env or {})}, log,
                             max_seconds=240)


def sites_until_close(env: dict[str, str], day: str, tmp: Path,
                      sites: tuple[str, ...] | list[str] = ("a", "b"),
                      scheme: str = "separate") -> dict[str, dict[str, Any]]:
    """Each site ingesting until ``day``'s close, all at once (as both sites run in
    production; one after the other the suite paid each site's start in turn). Each site's
    JSON summary, asserted closed."""
    logs = {site: tmp / f"{site}-{day}.log" for site in sites}
    procs = {site: start_site(site, scheme, env, day, log) for site, log in logs.items()}
    try:
        outs = {site: wait_exit(procs[site], logs[site]) for site in sites}
    finally:  # one site failed: the others are not left ingesting into the next test
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
    for site, out in outs.items():
        assert out["closed"], (site, out)
    return outs


def wait_exit(proc: subprocess.Popen[str], log: Path, timeout: float = 240) -> dict[str, Any]:
    """The site's JSON summary; fails (with the log's tail) unless it exited 0 in time."""
    return runner.wait(proc, "site", log, timeout)


def wait_for(cond: Any, timeout: float, what: str, interval: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync"]


def chromium(url: str, tmp: Path, screenshot: Path | None = None,
             size: str = "1200,2400", window: bool = False) -> str:
    """Render a page in headless Chromium (Debian's package); return the rendered DOM, laid
    out in a window of ``size`` when ``window`` (else Chromium's default)."""
    import shutil

    exe = shutil.which("chromium")
    assert exe, "chromium is not installed: `make test` installs Debian's chromium package"
    base = [exe, *CHROMIUM_FLAGS, f"--user-data-dir={tmp / 'chromium-profile'}"]
    if screenshot is not None:
        screenshot.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([*base, f"--window-size={size}", f"--screenshot={screenshot}", url],
                       capture_output=True, timeout=120, check=True)
    sized = [f"--window-size={size}"] if window else []
    res = subprocess.run([*base, *sized, "--dump-dom", url], capture_output=True, text=True,
                         timeout=120, check=True)
    return res.stdout


def ingest_day(env: dict[str, str], tmp: Path, date: str, sites: list[str], scheme: str,
               trades: int = 3000, seed: int = 5) -> dict[str, Any]:
    """Publish a faulty day and run the given sites until close; returns the gateway JSON."""
    sim = settle(["simulate", "--date", date, "--trades", str(trades), "--seed", str(seed),
                  "--dup-rate", "0.02", "--bad-rate", "0.005", "--abort-rate", "0.3"], env)
    sites_until_close(env, date, tmp, sites, scheme)
    return sim


def published_positions(dsn: str, day: str) -> tuple[bytes, int | None]:
    """The published positions of a day, byte for byte, and the run they came from."""
    from settlement.db import connect

    with connect(dsn) as conn:
        with conn.cursor().copy(
            "copy (select * from positions where trade_date = %s order by account, symbol)"
            " to stdout", (day,)) as copy:
            data = b"".join(bytes(chunk) for chunk in copy)
        row = conn.execute("select run_id from published_days where trade_date = %s",
                           (day,)).fetchone()
    return data, None if row is None else row[0]


@contextmanager
def kafka_down(settings: Settings) -> Iterator[Settings]:
    """``settings`` with every Kafka broker unreachable the way a stopped cluster is: each
    bootstrap server refuses the TCP connection. The ports stay bound (never listening) until
    the block ends, so nothing else can take them meanwhile; the shared cluster goes on
    serving the tests that run at the same time, which is why this is no `exclusive` test."""
    socks: list[socket.socket] = []
    try:
        for _ in range(settings.kafka_brokers):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        servers = ",".join(f"127.0.0.1:{s.getsockname()[1]}" for s in socks)
        yield settings.model_copy(update={"kafka_bootstrap": servers})
    finally:
        for s in socks:
            s.close()


POSITIONS = ("select account, symbol, bought_qty, sold_qty, net_qty, buy_amount, sell_amount,"
             " net_cash, trade_count from positions where trade_date = %s order by 1, 2")
Positions = dict[tuple[str, str], tuple[Any, ...]]


def positions_table(dsn: str, day: str) -> Positions:
    """The published positions of a day: (account, symbol) -> the POSITIONS columns after."""
    from settlement.db import connect

    with connect(dsn) as conn:
        return {(r[0], r[1]): tuple(r[2:]) for r in conn.execute(POSITIONS, (day,))}


def reference_positions(spec: SimulationSpec, partitions: int = 6) -> Positions:
    """The netting in plain Python with Decimal, from the generator's own trades (the day's
    valid trades, before any duplicate or malformed message the simulator adds) in their
    final states (the generator's busts and corrections applied by the simulator's own
    ``final_trades``): a reference independent of Spark and of SQL."""
    acc: dict[tuple[str, str], list[Any]] = defaultdict(
        lambda: [0, 0, Decimal(0), Decimal(0), 0])
    for t in final_trades(DayGenerator(spec, partitions).events()):
        amount = t.price * t.quantity
        b = acc[(t.buyer, t.symbol)]
        b[0] += t.quantity
        b[2] += amount
        b[4] += 1
        s = acc[(t.seller, t.symbol)]
        s[1] += t.quantity
        s[3] += amount
        s[4] += 1
    return {k: (v[0], v[1], v[0] - v[1], v[2], v[3], v[3] - v[2], v[4]) for k, v in acc.items()}
