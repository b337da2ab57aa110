"""Silent faults between the stack's locations (site A, site B, the witness, the exchange):
packets dropped, never refused, so that a cut-off site is silence to the others and stays
alive on its own side, as a real partition leaves it.

How, on this machine: the stack runs with host networking on loopback (deploy/local), so
every container shares the host's network stack and no link exists to cut. The host's
netfilter still tells the locations apart: in the OUTPUT chain it matches the cgroup of the
socket sending a packet (each container is its own, /docker/<id>), and the ports each
location listens on are found from the listening sockets' processes. A cut from X to Y then
drops (1) what X's containers send to Y's ports (X connecting to Y, and X's side of those
connections) and (2) what X's containers send on connections that Y's containers opened,
which conntrack marks with the opener's location. Both directions: a partition; one: a
one-way cut. Nothing else is touched: the host's own processes (the drill, the auditor's
reads) still reach every location, and traffic within a location flows.

Chosen over the alternatives issue 57 names: this kernel has no netem qdisc (`tc qdisc add
... netem` is refused), so network namespaces joined by veth pairs could only cut, not delay,
and would readdress every service; a fault proxy (Toxiproxy) would put a hop into every
cross-site path and needs per-site Kafka listeners. The WAN's latency is added the same way
(settlement/stack/wan.py: the same matches send cross-location packets to a user-space
queue that holds them).
"""

from __future__ import annotations

import re
import shutil
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from settlement.errors import ServiceError
from settlement.stack import PROJECT_FILTER
from settlement.stack.engine import Log, run

CUT_CHAIN = "SETTLE-CUT"  # filter table: the drops
MARK_CHAIN = "SETTLE-MARK"  # mangle table: which location opened each connection
# conntrack marks, one per location (any values unlikely to clash with another tool's).
MARKS = {"a": 0x5E7A, "b": 0x5E7B, "witness": 0x5E7C, "exchange": 0x5E7D}
_PID = re.compile(r"pid=(\d+)")
_CONTAINER = re.compile(r"/docker/([0-9a-f]{64})")
_MULTIPORT_MAX = 15  # iptables' multiport takes at most 15 ports per rule


@dataclass(frozen=True)
class Location:
    name: str
    containers: tuple[str, ...]  # full container ids
    ports: frozenset[int]  # TCP ports its containers listen on


def iptables(*args: str, table: str = "filter", check: bool = True) -> bool:
    done = run(["iptables", "-w", "5", "-t", table, *args], check=False, timeout=30)
    if check and done.returncode != 0:
        raise ServiceError(f"iptables -t {table} {' '.join(args)} failed: "
                           f"{(done.stderr or done.stdout).strip()}")
    return done.returncode == 0


def require_netfilter() -> None:
    if shutil.which("iptables") is None:
        raise ServiceError("cutting the network between sites needs iptables: "
                           "apt-get install iptables (root)")


def container_of(pid: int) -> str | None:
    """The container id a process runs in (its cgroup), or None for a host process."""
    try:
        text = Path(f"/proc/{pid}/cgroup").read_text()
    except OSError:
        return None
    m = _CONTAINER.search(text)
    return m.group(1) if m else None


def listeners(ss_output: str) -> dict[int, set[int]]:
    """`ss -Hltnp`'s lines as the ports each process id listens on."""
    found: dict[int, set[int]] = {}
    for line in ss_output.splitlines():
        fields = line.split()
        if len(fields) < 4 or ":" not in fields[3]:
            continue
        port = int(fields[3].rsplit(":", 1)[1])
        for pid in _PID.findall(line):
            found.setdefault(int(pid), set()).add(port)
    return found


def listening_ports() -> dict[str, set[int]]:
    """TCP ports by the container whose process listens on them (host processes left out)."""
    found: dict[str, set[int]] = {}
    for pid, ports in listeners(run(["ss", "-Hltnp"], timeout=30).stdout).items():
        cid = container_of(pid)
        if cid:
            found.setdefault(cid, set()).update(ports)
    return found


def survey() -> dict[str, Location]:
    """Every location of the running stack: its containers (label settle.site) and ports."""
    out = run(["docker", "ps", "--no-trunc", "--filter", PROJECT_FILTER,
               "--format", '{{.ID}} {{.Label "settle.site"}}'], timeout=60).stdout
    members: dict[str, list[str]] = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1] in MARKS:
            members.setdefault(parts[1], []).append(parts[0])
    ports = listening_ports()
    return {name: Location(name, tuple(ids),
                           frozenset(p for cid in ids for p in ports.get(cid, ())))
            for name, ids in members.items()}


def chunks(ports: Iterable[int]) -> Iterator[str]:
    ordered = sorted(ports)
    for i in range(0, len(ordered), _MULTIPORT_MAX):
        yield ",".join(str(p) for p in ordered[i:i + _MULTIPORT_MAX])


def _ensure_chain(chain: str, table: str) -> None:
    iptables("-N", chain, table=table, check=False)  # exists already: fine
    if not iptables("-C", "OUTPUT", "-j", chain, table=table, check=False):
        iptables("-I", "OUTPUT", "-j", chain, table=table)


def mark_openers(locations: dict[str, Location], chain: str = MARK_CHAIN) -> None:
    """Each connection from one location to another's port carries the opener's mark (rules
    appended to ``chain`` of the mangle table, which the caller made)."""
    for loc in locations.values():
        others = set().union(*(o.ports for o in locations.values() if o.name != loc.name))
        for cid in loc.containers:
            for chunk in chunks(others):
                iptables("-A", chain, "-m", "cgroup", "--path", f"/docker/{cid}",
                         "-p", "tcp", "-m", "multiport", "--dports", chunk,
                         "-j", "CONNMARK", "--set-mark", hex(MARKS[loc.name]), table="mangle")


def ensure_chain(chain: str, table: str) -> None:
    """``chain`` exists, empty, and OUTPUT jumps to it."""
    _ensure_chain(chain, table)
    iptables("-F", chain, table=table)


def remove_chain(chain: str, table: str) -> bool:
    """OUTPUT's jumps to ``chain`` and the chain itself gone; True if it was there."""
    if not iptables("-n", "-L", chain, table=table, check=False):
        return False
    while iptables("-D", "OUTPUT", "-j", chain, table=table, check=False):
        pass
    iptables("-F", chain, table=table)
    iptables("-X", chain, table=table, check=False)
    return True


def _drop(sender: Location, receivers: list[Location]) -> int:
    """Drop what ``sender`` sends to ``receivers``; returns the rules added."""
    added = 0
    ports = set().union(*(r.ports for r in receivers))
    for cid in sender.containers:
        path = ["-m", "cgroup", "--path", f"/docker/{cid}"]
        for chunk in chunks(ports):
            iptables("-A", CUT_CHAIN, *path, "-p", "tcp", "-m", "multiport",
                     "--dports", chunk, "-j", "DROP")
            added += 1
        for r in receivers:
            iptables("-A", CUT_CHAIN, *path, "-m", "connmark", "--mark",
                     hex(MARKS[r.name]), "-j", "DROP")
            added += 1
    return added


@dataclass(frozen=True)
class CutReport:
    isolated: str
    others: tuple[str, ...]
    both_ways: bool
    rules: int
    at: float  # epoch seconds


def cut(isolated: str, others: Iterable[str], log: Log, both_ways: bool = True) -> CutReport:
    """Silence between ``isolated`` and each of ``others`` (both directions, or only what
    ``isolated`` sends)."""
    require_netfilter()
    locations = survey()
    names = tuple(others)
    missing = [n for n in (isolated, *names) if n not in locations]
    if missing:
        raise ServiceError(f"no running container at {', '.join(missing)}: is the stack up?")
    ensure_chain(CUT_CHAIN, "filter")
    ensure_chain(MARK_CHAIN, "mangle")
    mark_openers(locations)
    time.sleep(1)  # live connections' next packets carry their opener's mark
    victim, rest = locations[isolated], [locations[n] for n in names]
    rules = _drop(victim, rest)
    if both_ways:
        for other in rest:
            rules += _drop(other, [victim])
    at = time.time()
    way = "both ways" if both_ways else f"what {isolated} sends"
    log(f"cut {isolated} off from {', '.join(names)} ({way}; {rules} netfilter rules; "
        f"{isolated} listens on {len(victim.ports)} ports)")
    return CutReport(isolated, names, both_ways, rules, at)


def heal(log: Log | None = None) -> bool:
    """Remove every cut (and the marks); True if there was anything to remove."""
    if shutil.which("iptables") is None:
        return False
    had = False
    for chain, table in ((CUT_CHAIN, "filter"), (MARK_CHAIN, "mangle")):
        had = remove_chain(chain, table) or had
    if had and log:
        log("healed: every cut between the locations removed")
    return had


@contextmanager
def partitioned(isolated: str, others: Iterable[str], log: Log,
                both_ways: bool = True) -> Iterator[CutReport]:
    """A cut for the block's duration, healed whatever happens inside it."""
    try:
        yield cut(isolated, others, log, both_ways)
    finally:
        heal(log)
