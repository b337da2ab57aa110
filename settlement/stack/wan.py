"""The WAN between the stack's locations: a round-trip time (and optionally a loss rate)
between site A, site B and the witness, on a stack that runs on one loopback.

The kernel here has no netem (nor fq, for a BPF departure time), so the delay is taken in
user space: the netfilter matches the cuts use (settlement/stack/netcut.py: the sending
socket's container, the conntrack mark of the connection's opener) send each packet one
location sends to another to an NFQUEUE, and deploy/wandelay (Go, built here from the Go
module proxy) holds it for half the round trip before letting it go. Both directions are
held, so a request and its answer cross the WAN once each: one RTT. The rules carry
``--queue-bypass``: with the delayer stopped the links are fast, never cut. Traffic within a
location, and the host's own processes (drills, benchmarks, the auditor), stay direct; so
does the exchange's gateway, taken to sit beside the brokers it sends to.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from dataclasses import asdict, dataclass
from itertools import permutations
from pathlib import Path

from settlement.db import open_connection
from settlement.errors import ServiceError
from settlement.stack.engine import Log, run
from settlement.stack.netcut import (
    MARKS,
    Location,
    chunks,
    ensure_chain,
    iptables,
    mark_openers,
    remove_chain,
    require_netfilter,
    survey,
)

WAN_CHAIN = "SETTLE-WAN"  # mangle table: the cross-location packets, queued
QUEUE = 7  # the NFQUEUE number (any unused one)
SITES = ("a", "b", "witness")  # the WAN's ends; the exchange is not one (module docstring)
MAX_RTT_MS = 500.0


@dataclass(frozen=True)
class Wan:
    rtt_ms: float
    loss: float
    jitter_ms: float
    pid: int | None
    rules: int

    def describe(self) -> dict[str, float | int | None]:
        return {"wan_rtt_ms": self.rtt_ms, "wan_jitter_ms": self.jitter_ms,
                "wan_loss": self.loss, "wan_rules": self.rules}


NO_WAN = Wan(0.0, 0.0, 0.0, None, 0)


def check_rtt(rtt_ms: float, loss: float = 0.0, jitter_ms: float = 0.0) -> None:
    if not 0 <= rtt_ms <= MAX_RTT_MS:
        raise ServiceError(f"a WAN round trip of {rtt_ms} ms is out of range: give 0 (no WAN) "
                           f"to {MAX_RTT_MS:.0f} ms, e.g. make stack-up WAN_RTT_MS=5")
    if not 0 <= loss < 1:
        raise ServiceError(f"a WAN loss of {loss} is out of range: a fraction from 0 to below 1")
    if not 0 <= jitter_ms <= rtt_ms:
        raise ServiceError(f"a WAN jitter of {jitter_ms} ms is out of range: from 0 to the round "
                           f"trip ({rtt_ms} ms); each direction varies by half of it")


def _state_file(state: Path) -> Path:
    return state / "wan.json"


def delayer(root: Path, log: Log) -> Path:
    """deploy/wandelay built into .cache/bin (go build; seconds once its modules are cached)."""
    binary = root / ".cache" / "bin" / "wandelay"
    source = root / "deploy" / "wandelay"
    newest = max(p.stat().st_mtime for p in source.iterdir())
    if binary.exists() and binary.stat().st_mtime >= newest:
        return binary
    go = shutil.which("go") or ("/usr/local/go/bin/go" if Path("/usr/local/go/bin/go").exists()
                                else None)
    if go is None:
        raise ServiceError("the WAN's delayer is built with Go (deploy/wandelay): install Go "
                           "1.26+, or start the stack with WAN_RTT_MS=0")
    log("building the WAN's delayer (deploy/wandelay, from the Go module proxy)...")
    binary.parent.mkdir(parents=True, exist_ok=True)
    run([go, "build", "-o", str(binary), "."], cwd=source, timeout=600)
    return binary


def _queue(sender: Location, receivers: list[Location]) -> int:
    """Queue what ``sender`` sends to ``receivers`` (to their ports, and on connections they
    opened); returns the rules added."""
    added = 0
    target = ["-j", "NFQUEUE", "--queue-num", str(QUEUE), "--queue-bypass"]
    ports = set().union(*(r.ports for r in receivers))
    for cid in sender.containers:
        path = ["-m", "cgroup", "--path", f"/docker/{cid}"]
        for chunk in chunks(ports):
            iptables("-A", WAN_CHAIN, *path, "-p", "tcp", "-m", "multiport", "--dports", chunk,
                     *target, table="mangle")
            added += 1
        for r in receivers:
            iptables("-A", WAN_CHAIN, *path, "-m", "connmark", "--mark", hex(MARKS[r.name]),
                     *target, table="mangle")
            added += 1
    return added


def _stop_delayer(state: Path) -> None:
    try:
        pid = int(json.loads(_state_file(state).read_text()).get("pid") or 0)
    except (OSError, ValueError):
        return
    try:
        if pid and "wandelay" in Path(f"/proc/{pid}/cmdline").read_text(errors="replace"):
            os.kill(pid, signal.SIGTERM)
            for _ in range(50):
                if not Path(f"/proc/{pid}").exists():
                    break
                time.sleep(0.1)
    except OSError:
        pass  # gone already


def _start_delayer(root: Path, state: Path, wan: Wan, log: Log) -> int:
    binary = delayer(root, log)
    out = open(state / "wandelay.log", "ab")  # the daemon's, kept open by it
    # Each direction holds half: the round trip, and its jitter, split between the two.
    proc = subprocess.Popen(
        [str(binary), "-queue", str(QUEUE), "-delay", f"{wan.rtt_ms / 2}ms",
         "-jitter", f"{wan.jitter_ms / 2}ms", "-loss", str(wan.loss), "-report", "60s"],
        stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    out.close()
    time.sleep(0.5)
    if proc.poll() is not None:
        tail = (state / "wandelay.log").read_text(errors="replace").strip().splitlines()[-3:]
        raise ServiceError("the WAN's delayer stopped at once: " + " | ".join(tail))
    return proc.pid


def _save(state: Path, wan: Wan) -> None:
    _state_file(state).write_text(json.dumps(asdict(wan)))


def clear(state: Path, log: Log | None = None) -> bool:
    """No WAN: the rules removed and the delayer stopped; True if there was one."""
    had = shutil.which("iptables") is not None and remove_chain(WAN_CHAIN, "mangle")
    _stop_delayer(state)
    _state_file(state).unlink(missing_ok=True)
    if had and log:
        log("the WAN between the locations removed: links are direct")
    return had


def apply(root: Path, state: Path, rtt_ms: float, log: Log, loss: float = 0.0,
          jitter_ms: float = 0.0) -> Wan:
    """The round trip ``rtt_ms`` (give or take ``jitter_ms``; ``loss``) between every two of
    site A, site B and the witness, replacing any WAN set before; 0 and no loss: direct."""
    check_rtt(rtt_ms, loss, jitter_ms)
    clear(state)
    if rtt_ms == 0 and loss == 0:
        return NO_WAN
    require_netfilter()
    locations = survey()
    ends = {n: locations[n] for n in SITES if n in locations}
    if len(ends) < 2:
        raise ServiceError("the WAN needs the stack running at two locations at least: is it "
                           "up (make stack-up)?")
    pid = _start_delayer(root, state, Wan(rtt_ms, loss, jitter_ms, None, 0), log)
    _save(state, Wan(rtt_ms, loss, jitter_ms, pid, 0))  # clear() finds it whatever happens
    try:
        ensure_chain(WAN_CHAIN, "mangle")
        # The openers' marks first, in this chain: a queued packet leaves the mangle table,
        # so netcut's marking chain may not see it.
        mark_openers(locations, WAN_CHAIN)
        rules = sum(_queue(ends[x], [ends[y]]) for x, y in permutations(ends, 2))
    except BaseException:
        clear(state)
        raise
    wan = Wan(rtt_ms, loss, jitter_ms, pid, rules)
    _save(state, wan)
    log(f"WAN between {', '.join(ends)}: {rtt_ms:g} ms round trip"
        + (f" ± {jitter_ms:g} ms" if jitter_ms else "") + (f", {loss:.2%} loss" if loss else "")
        + f" ({rules} netfilter rules, delayer pid {pid})")
    return wan


def current(state: Path) -> Wan:
    """The WAN set now (0 ms when none is)."""
    try:
        return Wan(**json.loads(_state_file(state).read_text()))
    except (OSError, ValueError, TypeError):
        return NO_WAN


def commit_round_trip_ms(dsn: str, n: int = 21) -> float:
    """The median time of ``n`` single-row commits on the primary ``dsn`` names: with
    synchronous replication, at least the round trip to the standby's site. A logged write,
    since a bare transaction id's commit would not wait for the standby."""
    with open_connection(dsn, autocommit=True) as conn:
        conn.execute("create table if not exists wan_probe (id bigserial primary key)")
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            conn.execute("insert into wan_probe default values")
            times.append((time.perf_counter() - t0) * 1000)
        conn.execute("drop table wan_probe")
    return round(sorted(times)[n // 2], 2)
