"""The stack's two sites as things to lose and bring back: which containers a site runs, the
settlement cluster's primary (Patroni's REST API), Kafka's in-sync replicas, and when the
survivor accepts writes again. Used by the site drills (settlement/stack/site_drill.py)."""

from __future__ import annotations

import base64
import json
import ssl
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any

import psycopg

from settlement.db import open_connection
from settlement.errors import ServiceError
from settlement.stack import envfile
from settlement.stack.compose import PROJECT_FILTER, Stack
from settlement.stack.engine import Log, run

MEMBERS = {"a": "postgres-a", "b": "postgres-b"}  # the settlement cluster's member per site


def other(site: str) -> str:
    return "b" if site == "a" else "a"


# -- containers ---------------------------------------------------------------------------

@dataclass(frozen=True)
class SiteContainers:
    """The running containers of one site (label settle.site), by id and service."""

    site: str
    ids: tuple[str, ...]
    services: tuple[str, ...]


def running_containers(site: str) -> SiteContainers:
    """Every running container of ``site``: its broker, etcd member, cluster member, own
    server, consumer and Airflow (one-shots that exited are not running, so never re-run)."""
    out = run(["docker", "ps", "--filter", PROJECT_FILTER,
               "--filter", f"label=settle.site={site}",
               "--format", '{{.ID}} {{.Label "com.docker.compose.service"}}'],
              timeout=60).stdout
    rows = [line.split() for line in out.splitlines() if line.strip()]
    return SiteContainers(site, tuple(r[0] for r in rows), tuple(sorted(r[1] for r in rows)))


def docker_all(action: list[str], containers: SiteContainers) -> None:
    """One docker command on every container of the site at once (kill -s KILL, pause,
    unpause, start): a site is lost whole, not service by service."""
    if not containers.ids:
        raise ServiceError(f"site {containers.site} runs no container: is the stack up?")
    run(["docker", *action, *containers.ids], timeout=120)


# -- the settlement cluster (Patroni) -------------------------------------------------------

def _patroni_url(site: str) -> str:
    port = envfile.PATRONI_PORTS[0 if site == "a" else 1]
    return f"https://127.0.0.1:{port}"


def patroni(stack: Stack, site: str, path: str, body: Any = None,
            timeout: float = 10) -> Any:
    """One call to a member's REST API (TLS verified against the stack's CA); a change
    (POST) logs in as PATRONI_RESTAPI_USERNAME."""
    req = urllib.request.Request(_patroni_url(site) + path, method="POST" if body else "GET",
                                 data=json.dumps(body).encode() if body else None)
    if body is not None:
        env = stack.env()
        login = base64.b64encode(f"patroni:{env['PATRONI_RESTAPI_PASSWORD']}".encode())
        req.add_header("Authorization", f"Basic {login.decode()}")
        req.add_header("Content-Type", "application/json")
    tls = ssl.create_default_context(cafile=str(stack.certs / "ca.crt"))
    with urllib.request.urlopen(req, timeout=timeout, context=tls) as resp:
        raw = resp.read()
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode(errors="replace")


@dataclass(frozen=True)
class Member:
    site: str
    role: str  # leader, sync_standby, replica
    state: str  # running, streaming, stopped, ...
    lag: int | None


def cluster(stack: Stack, ask: tuple[str, ...] = ("a", "b")) -> dict[str, Member]:
    """The cluster as the first member of ``ask`` that answers sees it (site -> member)."""
    for site in ask:
        try:
            members = patroni(stack, site, "/cluster", timeout=5)["members"]
        except (OSError, ValueError, KeyError):
            continue
        by_name = {name: s for s, name in MEMBERS.items()}
        return {by_name[m["name"]]: Member(by_name[m["name"]], m.get("role", ""),
                                           m.get("state", ""),
                                           m["lag"] if isinstance(m.get("lag"), int) else None)
                for m in members if m.get("name") in by_name}
    return {}


def primary_site(stack: Stack, ask: tuple[str, ...] = ("a", "b")) -> str | None:
    return next((m.site for m in cluster(stack, ask).values() if m.role == "leader"), None)


def in_sync(members: dict[str, Member], primary: str) -> bool:
    """The primary at ``primary`` and the other member its synchronous standby, streaming
    with no lag: losing the primary's site now loses no acknowledged commit."""
    lead, standby = members.get(primary), members.get(other(primary))
    return bool(lead and lead.role == "leader" and standby and standby.role == "sync_standby"
                and standby.state == "streaming" and standby.lag == 0)


def make_primary(stack: Stack, site: str, log: Log, timeout: float = 180) -> str:
    """Make ``site``'s member the primary (a Patroni switchover if the other one is) and
    wait until the other is its synchronous standby; returns the site that was primary."""
    before = primary_site(stack)
    if before is None:
        raise ServiceError("the settlement cluster has no primary: is the stack up?")
    deadline = time.monotonic() + timeout
    if before != site:
        # Patroni switches over only to the synchronous standby (412 otherwise): a member
        # that has just rejoined (after an earlier drill) is waited for first.
        while not in_sync(cluster(stack), before):
            if time.monotonic() > deadline:
                raise ServiceError(f"site {site}'s member is not the synchronous standby of "
                                   f"site {before}'s after {timeout:.0f} s: {cluster(stack)}")
            time.sleep(1)
        log(f"switching the settlement database's primary over from site {before} to {site}")
        _switchover(stack, before, site, deadline)
    while not in_sync(cluster(stack), site):
        if time.monotonic() > deadline:
            raise ServiceError(f"site {site}'s member did not become the primary with a "
                               f"synchronous standby in {timeout:.0f} s: {cluster(stack)}")
        time.sleep(1)
    return before


def _switchover(stack: Stack, leader: str, candidate: str, deadline: float) -> None:
    """Patroni's switchover, asked again while it answers 412 (its precondition: the leader
    asks the candidate's own API whether it is healthy and caught up, which a member that
    the cluster's view already shows in sync may not answer yet, just after a rejoin)."""
    body = {"leader": MEMBERS[leader], "candidate": MEMBERS[candidate]}
    while True:
        try:
            patroni(stack, leader, "/switchover", body, timeout=60)
            return
        except urllib.error.HTTPError as e:
            why = e.read().decode(errors="replace").strip()
            if e.code != 412 or time.monotonic() > deadline:
                raise ServiceError(f"Patroni refused the switchover from site {leader} to "
                                   f"site {candidate}: HTTP {e.code}: {why or e.reason}; "
                                   f"the cluster: {cluster(stack)}") from None
        time.sleep(2)


def in_recovery(dsn: str) -> bool | None:
    """Whether the server behind ``dsn`` (one host) is a standby; None if it cannot be asked."""
    try:
        with open_connection(dsn, timeout=3, autocommit=True) as conn:
            row = conn.execute("select pg_is_in_recovery()").fetchone()
    except psycopg.Error:
        return None
    return bool(row and row[0])


# -- the survivor accepting writes ------------------------------------------------------------

@dataclass
class WriteProbe:
    """From ``start()`` on, tries a write (a transaction id) on one server until it works:
    ``seconds`` is then how long the survivor refused writes."""

    dsn: str
    seconds: float | None = None
    _t0: float = 0.0
    _thread: threading.Thread | None = field(default=None, repr=False)

    def start(self, t0: float) -> WriteProbe:
        self._t0 = t0
        self._thread = threading.Thread(target=self._run, daemon=True, name="write-probe")
        self._thread.start()
        return self

    def _run(self) -> None:
        while True:
            try:
                with open_connection(self.dsn, timeout=2, autocommit=True) as conn:
                    conn.execute("select txid_current()")
                self.seconds = round(time.time() - self._t0, 1)
                return
            except psycopg.Error:
                time.sleep(0.2)

    def wait(self, timeout: float) -> float | None:
        if self._thread is not None:
            self._thread.join(timeout)
        return self.seconds


def member_dsn(stack: Stack, site: str, db: str = "settlement") -> str:
    """One member of the settlement cluster as the end of day's login (read-write wished:
    a standby refuses the session)."""
    env = stack.env()
    port = envfile.PG_PORTS[0 if site == "a" else 1]
    return (f"postgresql://settle_eod:{env['SETTLE_PG_SETTLEMENT_PASSWORD']}@127.0.0.1:{port}"
            f"/{db}?sslmode=verify-full&sslrootcert={stack.certs / 'ca.crt'}")


# -- Kafka ------------------------------------------------------------------------------------

def kafka_admin(stack: Stack) -> Any:
    from confluent_kafka.admin import AdminClient

    env = stack.env()
    return AdminClient({
        "bootstrap.servers": env["KAFKA_BOOTSTRAP"], "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": env["KAFKA_ADMIN_USER"],
        "sasl.password": env["KAFKA_ADMIN_PASSWORD"],
        "ssl.ca.location": str(stack.certs / "ca.crt"),
        # A lost site's broker refuses connections until it is back: expected, not news.
        "log_level": 0})


def broker_of(stack: Stack, site: str) -> int:
    """The node id of the broker whose rack is ``site`` (asked while it runs)."""
    admin = kafka_admin(stack)  # held until the answer: a dropped client cancels it
    nodes = admin.describe_cluster(request_timeout=30).result(timeout=60).nodes
    found = [n.id for n in nodes if str(n.rack) == site]
    if len(found) != 1:
        raise ServiceError(f"no single broker with rack {site}: {[(n.id, n.rack) for n in nodes]}")
    return found[0]


def out_of_isr(stack: Stack, broker: int) -> list[str]:
    """The partitions (every topic's) that have ``broker`` as a replica but not in sync."""
    topics = kafka_admin(stack).list_topics(timeout=30).topics
    return [f"{name}-{p.id}" for name, t in topics.items() for p in t.partitions.values()
            if broker in p.replicas and broker not in p.isrs]


# -- the site back ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Rejoin:
    rejoined: bool
    seconds: float
    member: str  # the site's cluster member as Patroni reports it
    partitions_out_of_isr: int
    consumer_running: bool


def wait_rejoined(stack: Stack, site: str, broker: int, t0: float, timeout: float,
                  log: Log) -> Rejoin:
    """Until ``site``'s member streams from the primary with lag 0, its broker is in every
    ISR it belongs to and its consumer runs (or ``timeout``)."""
    deadline = time.monotonic() + timeout
    while True:
        members = cluster(stack)
        mine = members.get(site)
        streaming = bool(mine and mine.role in ("sync_standby", "replica")
                         and mine.state == "streaming" and mine.lag == 0)
        try:
            out = out_of_isr(stack, broker)
        except Exception as exc:  # noqa: BLE001 - the brokers may still be electing
            out = [f"(not known: {exc})"]
        consumer = f"site-{site}" in running_containers(site).services
        if (streaming and not out and consumer) or time.monotonic() > deadline:
            result = Rejoin(streaming and not out and consumer, round(time.time() - t0, 1),
                            f"{mine.role} {mine.state} lag {mine.lag}" if mine else "absent",
                            len(out), consumer)
            log(f"site {site} back: {result}")
            return result
        time.sleep(2)
