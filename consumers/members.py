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
import signal
import subprocess
import sys
import time
from typing import Any

log = logging.getLogger("settle.site")

_PR_SET_PDEATHSIG = 1
# Counters a site reports that add up across its processes.
_SUMMED = ("messages", "inserted", "duplicates", "dead_letters", "late", "refused",
           "close_markers", "batches", "fenced", "db_errors", "data_loss_events", "rebalances")


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


def combine(outputs: list[dict[str, Any]]) -> dict[str, Any]:
    """One site summary from its processes' summaries: counters summed, closed only if every
    process saw the day closed, each process's own summary kept under ``processes``."""
    first = outputs[0]
    out: dict[str, Any] = {k: first.get(k) for k in ("site", "scheme", "group", "ledger",
                                                     "trade_date")}
    for key in _SUMMED:
        out[key] = sum(int(o.get(key, 0)) for o in outputs)
    out["closed"] = all(bool(o.get("closed")) for o in outputs)
    seconds = max(float(o.get("seconds", 0)) for o in outputs)
    out["seconds"] = seconds
    out["trades_per_second"] = round(out["inserted"] / seconds) if seconds else 0
    out["processes"] = outputs
    return out


def run_members(n: int, site: str, scheme: str, until_close: bool, trade_date: str | None,
                max_seconds: float | None) -> dict[str, Any]:
    """Start ``n`` site processes, forward SIGTERM/SIGINT to them, wait, combine."""
    argv = member_argv(site, scheme, until_close, trade_date, max_seconds)
    # stderr (the members' logs) is inherited; stdout carries only each one's JSON line.
    procs = [subprocess.Popen(argv, stdout=subprocess.PIPE, text=True,
                              preexec_fn=_die_with_parent) for _ in range(n)]
    log.info("site %s: %d processes %s", site, n, [p.pid for p in procs])

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
    out = combine(outputs)
    if failed:
        raise RuntimeError(f"site {site}: {len(failed)} of {n} processes failed: "
                           + "; ".join(failed))
    return out
