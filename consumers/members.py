"""Several consumer processes for one site: ``settle site run --processes N``.

One Python process parses about 100k trades/s (docs/benchmarks.md); a site that needs more
runs more processes. Each is an ordinary ``settle site run`` (same site, scheme and ledger),
so each is a member of the site's consumer group (in the shared scheme, of the one shared
group) and Kafka spreads the partitions over them. Nothing new is needed for exactly-once:
every batch commits with a compare-and-set on the stored offsets of its partitions, so a
member that lost a partition in a rebalance cannot write it again (consumers/ledger.py).

The supervisor only starts, signals and waits; it holds no partitions. Its children die with
it (PR_SET_PDEATHSIG), so a SIGKILL of the supervisor is a site's death, as for one process.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any

log = logging.getLogger("settle.site")

_PR_SET_PDEATHSIG = 1
# Counters a site reports that add up across its processes.
_SUMMED = ("messages", "inserted", "duplicates", "dead_letters", "late", "refused",
           "close_markers", "batches", "fenced", "db_errors", "data_loss_events", "rebalances",
           "stalled_partitions")


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL me when the supervisor dies (Linux)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass  # not Linux: the supervisor's SIGTERM handler still forwards an orderly stop


def member_argv(site: str, scheme: str, until_close: bool, trade_date: str | None,
                max_seconds: float | None) -> list[str]:
    argv = [sys.executable, "-m", "settlement.cli", "site", "run", "--site", site,
            "--scheme", scheme, "--json"]
    if until_close:
        argv.append("--until-close")
    if trade_date:
        argv += ["--date", trade_date]
    if max_seconds:
        argv += ["--max-seconds", str(max_seconds)]
    return argv


def member_env(base_port: int, i: int, n: int) -> dict[str, str]:
    """Member ``i``'s environment: with metrics on (``base_port`` > 0) its own port,
    ``base_port + i``, so N members never fight over one (N-1 would die at start)."""
    env = dict(os.environ)
    if base_port:
        if base_port + n - 1 > 65535:
            raise ValueError(f"SETTLE_METRICS_PORT={base_port} with --processes {n} needs ports "
                             f"{base_port}-{base_port + n - 1}: choose a base port of at most "
                             f"{65536 - n}")
        env["SETTLE_METRICS_PORT"] = str(base_port + i)
    return env


def _watch(procs: list[subprocess.Popen[str]], site: str, stop: threading.Event) -> None:
    """Say at once when a member dies, not when the last one finishes: the site runs on
    with fewer processes (Kafka gives the dead one's partitions to the others)."""
    started, seen = time.monotonic(), set()
    while not stop.wait(0.5):
        for p in procs:
            code = p.poll()
            if code is not None and p.pid not in seen:
                seen.add(p.pid)
                if code != 0:
                    alive = sum(q.poll() is None for q in procs)
                    log.error("site %s: process %d exited with code %d after %.1f s; %d of %d "
                              "processes left", site, p.pid, code,
                              time.monotonic() - started, alive, len(procs))
        if len(seen) == len(procs):
            return


def combine(outputs: list[dict[str, Any]]) -> dict[str, Any]:
    """One site summary from its processes' summaries: counters summed, closed only if every
    process saw the day closed, each process's own summary kept under ``processes``."""
    first = outputs[0]
    out: dict[str, Any] = {k: first.get(k) for k in ("site", "scheme", "group", "ledger",
                                                     "trade_date")}
    for key in _SUMMED:
        out[key] = sum(int(o.get(key, 0)) for o in outputs)
    out["closed"] = all(bool(o.get("closed")) for o in outputs)
    out["stalled"] = sorted({p for o in outputs for p in o.get("stalled", [])})
    seconds = max(float(o.get("seconds", 0)) for o in outputs)
    out["seconds"] = seconds
    out["trades_per_second"] = round(out["inserted"] / seconds) if seconds else 0
    out["processes"] = outputs
    return out


def run_members(n: int, site: str, scheme: str, until_close: bool, trade_date: str | None,
                max_seconds: float | None, metrics_port: int = 0) -> dict[str, Any]:
    """Start ``n`` site processes, forward SIGTERM/SIGINT to them, wait, combine."""
    argv = member_argv(site, scheme, until_close, trade_date, max_seconds)
    envs = [member_env(metrics_port, i, n) for i in range(n)]
    # stderr (the members' logs) is inherited; stdout carries only each one's JSON line.
    procs = [subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env,
                              preexec_fn=_die_with_parent) for env in envs]
    log.info("site %s: %d processes %s%s", site, n, [p.pid for p in procs],
             f", metrics on ports {metrics_port}-{metrics_port + n - 1}" if metrics_port else "")
    stop = threading.Event()
    threading.Thread(target=_watch, args=(procs, site, stop), daemon=True).start()

    def forward(signum: int, _frame: Any) -> None:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    # Each member stops by itself (close, --max-seconds, a signal); the grace covers its
    # last batch and leaving the group.
    deadline = None if max_seconds is None else time.monotonic() + max_seconds + 120
    outputs, failed = [], []
    for p in procs:
        timeout = None if deadline is None else max(1.0, deadline - time.monotonic())
        try:
            stdout, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            stdout, _ = p.communicate()
        lines = [ln for ln in (stdout or "").splitlines() if ln.startswith("{")]
        res = json.loads(lines[-1]) if lines else {}
        if p.returncode != 0 or not res.get("ok", False):
            failed.append(f"pid {p.pid} exit {p.returncode}: {res.get('error', 'no summary')}")
        outputs.append({k: v for k, v in res.items() if k != "ok"} | {"pid": p.pid})
    stop.set()
    out = combine(outputs)
    if failed:
        raise RuntimeError(f"site {site}: {len(failed)} of {n} processes failed: "
                           + "; ".join(failed))
    return out
