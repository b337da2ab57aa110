"""The stack's environment files: random secrets (0600), kept across runs, and the loopback
addresses of deploy/local/docker-compose.local.yml. Also its TLS material
(deploy/make-certs.sh).

Three files, as docker-compose.yml reads them (issue 58): ``.env.site-a`` and ``.env.site-b``
hold exactly the variables their site's compose file (deploy/compose/site-a.yml, site-b.yml)
names, so a site's secrets are in its own file only; ``.env`` holds the rest, and every
variable docker-compose.yml or the local override names. The host's tools (drills, tests) read
the three together (``read_all``)."""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import os
import re
import secrets
from pathlib import Path

from settlement.config import ConfigError
from settlement.services.procs import write_private
from settlement.stack.engine import run

PASSWORDS = (
    "SETTLE_PG_ADMIN_PASSWORD", "SETTLE_PG_SITE_A_PASSWORD", "SETTLE_PG_SITE_B_PASSWORD",
    "SETTLE_PG_SETTLEMENT_PASSWORD", "SETTLE_PG_AUDITOR_PASSWORD", "AIRFLOW_DB_PASSWORD",
    "KAFKA_ADMIN_PASSWORD", "SETTLE_KAFKA_GATEWAY_PASSWORD", "SETTLE_KAFKA_SITE_A_PASSWORD",
    "SETTLE_KAFKA_SITE_B_PASSWORD", "SETTLE_KAFKA_SETTLEMENT_PASSWORD",
    "SETTLE_KAFKA_AUDITOR_PASSWORD", "AIRFLOW_ADMIN_PASSWORD", "AIRFLOW_OPERATIONS_PASSWORD",
    "AIRFLOW_AUDITOR_PASSWORD", "AIRFLOW_JWT_SECRET", "AIRFLOW_API_SECRET_KEY",
    "SETTLE_PG_REPLICATION_PASSWORD", "SETTLE_PG_REWIND_PASSWORD", "PATRONI_RESTAPI_PASSWORD",
    "SETTLE_PG_MONITOR_PASSWORD", "MONITORING_PASSWORD",
    # Each server its own admin, each site's Airflow its own secrets (issue 58): site A's
    # are the unsuffixed AIRFLOW_* above.
    "SETTLE_PG_SITE_A_ADMIN_PASSWORD", "SETTLE_PG_SITE_B_ADMIN_PASSWORD",
    "AIRFLOW_B_DB_PASSWORD", "AIRFLOW_B_JWT_SECRET", "AIRFLOW_B_API_SECRET_KEY",
)
# A per-server secret an older .env did not have: the servers it made were initialised with
# the shared one (a PostgreSQL server takes its admin's and `airflow`'s passwords on its first
# start only), so that one is kept until an operator changes it (docs/operations.md).
INHERITED = {
    "SETTLE_PG_SITE_A_ADMIN_PASSWORD": "SETTLE_PG_ADMIN_PASSWORD",
    "SETTLE_PG_SITE_B_ADMIN_PASSWORD": "SETTLE_PG_ADMIN_PASSWORD",
    "AIRFLOW_B_DB_PASSWORD": "AIRFLOW_DB_PASSWORD",
}
# Prometheus', Alertmanager's and the Pushgateway's one login, as deploy/prometheus/
# prometheus.yml names it (web-start.sh gives them its bcrypt hash, MONITORING_PASSWORD_BCRYPT).
MONITORING_USER = "monitoring"
# The ports deploy/local/docker-compose.local.yml listens on (host networking). All lie below
# Linux's ephemeral range (32768-60999): a port inside it is also the local end of outgoing
# connections, and CI once saw the stack's PostgreSQL fail "could not create any TCP/IP
# sockets" on 35432 while the brokers were connecting to each other.
KAFKA_PORTS = (27092, 27093, 27094)
KAFKA_CONTROLLER_PORTS = (27192, 27193, 27194)
# The settlement database's cluster: its member at site A, then site B (Patroni), their
# Patroni REST APIs, and the etcd members (A, B, witness) as (client, peer) ports.
PG_PORTS = (27432, 27433)
PG_PORT = PG_PORTS[0]
PATRONI_PORTS = (27008, 27009)
ETCD_PORTS = ((27379, 27380), (27381, 27382), (27383, 27384))
ETCD_NAMES = ("etcd-a", "etcd-b", "etcd-witness")
# Each site's own server (not in the cluster): ledger_a / ledger_b and its Airflow's metadata.
PG_SITE_PORTS = {"a": 27434, "b": 27435}
# Each site's Airflow api-server: site A's (AIRFLOW_PORT), then site B's.
AIRFLOW_PORT = 28080
AIRFLOW_PORTS = {"a": AIRFLOW_PORT, "b": 28081}
# The task and trigger log server ports, then the scheduler's health check. The log servers
# are not started (--skip-serve-logs: Airflow 3.3 binds them to every interface and serves
# plain HTTP; the api-server reads the logs from the shared volume), but the api-server still
# asks that port for a running task's log: the stack keeps it free so that no other program's
# log server answers.
AIRFLOW_INTERNAL_PORTS = (28793, 28794, 28974)
AIRFLOW_B_INTERNAL_PORTS = (28795, 28796, 28975)
# Monitoring (issue 46): Prometheus, Alertmanager and the Pushgateway (HTTPS), each site's
# metrics, each broker's JMX exporter, the PostgreSQL exporters (cluster member A, B, then each
# site's own server).
PROMETHEUS_PORT, ALERTMANAGER_PORT, PUSHGATEWAY_PORT = 27990, 27991, 27992
SITE_METRICS_PORTS = {"a": 27400, "b": 27401}
JMX_PORTS = (27501, 27502, 27503)
PG_EXPORTER_PORTS = {"postgres-a": 27187, "postgres-b": 27188, "postgres-site-a": 27189,
                     "postgres-site-b": 27190}
# Each site's Airflow exporter (`settle airflow-exporter`, HTTPS).
AIRFLOW_EXPORTER_PORTS = {"a": 27601, "b": 27602}
# pgBackRest's TLS servers (issue 60): the repository at the witness, then each cluster
# member's (A, B), which the repository's backups read through.
PGBACKREST_REPO_PORT = 27450
PGBACKREST_MEMBER_PORTS = (27451, 27452)
LISTEN_PORTS: dict[int, str] = {
    **{p: f"Kafka broker {i}" for i, p in enumerate(KAFKA_PORTS, 1)},
    **{p: f"Kafka controller {i}" for i, p in enumerate(KAFKA_CONTROLLER_PORTS, 1)},
    **dict(zip(PG_PORTS, ("PostgreSQL (site A)", "PostgreSQL (site B)"), strict=True)),
    **dict(zip(PATRONI_PORTS, ("Patroni REST API (site A)", "Patroni REST API (site B)"),
               strict=True)),
    **{port: f"{name} {kind}" for name, ports in zip(ETCD_NAMES, ETCD_PORTS, strict=True)
       for port, kind in zip(ports, ("clients", "peers"), strict=True)},
    **{port: f"PostgreSQL of site {site.upper()} (its ledger, its Airflow)"
       for site, port in PG_SITE_PORTS.items()},
    **{port: f"site {site.upper()}'s Airflow api-server (HTTPS)"
       for site, port in AIRFLOW_PORTS.items()},
    **{port: f"site {site.upper()}'s Airflow {what}"
       for site, ports in (("a", AIRFLOW_INTERNAL_PORTS), ("b", AIRFLOW_B_INTERNAL_PORTS))
       for port, what in zip(ports, ("task log port (kept free)", "trigger log port (kept "
                                     "free)", "scheduler health check"), strict=True)},
    PROMETHEUS_PORT: "Prometheus (HTTPS)", ALERTMANAGER_PORT: "Alertmanager (HTTPS)",
    PUSHGATEWAY_PORT: "Pushgateway (HTTPS)",
    **{port: f"site {site.upper()}'s metrics" for site, port in SITE_METRICS_PORTS.items()},
    **{p: f"Kafka broker {i}'s JMX exporter" for i, p in enumerate(JMX_PORTS, 1)},
    **{port: f"PostgreSQL exporter of {server}" for server, port in PG_EXPORTER_PORTS.items()},
    **{port: f"site {site.upper()}'s Airflow exporter (HTTPS)"
       for site, port in AIRFLOW_EXPORTER_PORTS.items()},
    PGBACKREST_REPO_PORT: "pgBackRest's repository (the witness, TLS)",
    **dict(zip(PGBACKREST_MEMBER_PORTS, ("pgBackRest at the cluster's member A (TLS)",
                                         "pgBackRest at the cluster's member B (TLS)"),
               strict=True)),
}
# Where the api-server listens unless the .env says otherwise (AIRFLOW_BIND_ADDRESS, kept
# across runs): loopback, so that logins, cookies and tokens stay on this machine.
DEFAULT_AIRFLOW_BIND = "127.0.0.1"
HEADER = ("# Written by `make stack-up` (settlement/stack/envfile.py) for the local stack; its\n"
          "# secrets are kept across runs. Not for production: see .env.example.\n")
SITE_HEADER = "# Site {site}'s own: what deploy/compose/site-{site}.yml names, and nothing else.\n"
OVERRIDE_FILE = Path("deploy") / "local" / "docker-compose.local.yml"


SITES = ("a", "b")
# Where compose finds each site's services; the variables they name go to its env file.
SITE_COMPOSE = {site: Path("deploy") / "compose" / f"site-{site}.yml" for site in SITES}
_VARIABLE = re.compile(r"\$\{([A-Z_][A-Z0-9_]*)")


# What only one site may hold: its Airflow's key, secrets and metadata login, its server's
# admin, its consumer's logins (those two also in the shared .env, whose `migrate` and
# `kafka-init` create them).
SITE_OWN = {
    "a": frozenset({"AIRFLOW_FERNET_KEY", "AIRFLOW_JWT_SECRET", "AIRFLOW_API_SECRET_KEY",
                    "AIRFLOW_DB_PASSWORD", "SETTLE_PG_SITE_A_ADMIN_PASSWORD",
                    "SETTLE_PG_SITE_A_PASSWORD", "SETTLE_KAFKA_SITE_A_PASSWORD"}),
    "b": frozenset({"AIRFLOW_B_FERNET_KEY", "AIRFLOW_B_JWT_SECRET", "AIRFLOW_B_API_SECRET_KEY",
                    "AIRFLOW_B_DB_PASSWORD", "SETTLE_PG_SITE_B_ADMIN_PASSWORD",
                    "SETTLE_PG_SITE_B_PASSWORD", "SETTLE_KAFKA_SITE_B_PASSWORD"}),
}
CONSUMER_LOGINS = frozenset({"SETTLE_PG_SITE_A_PASSWORD", "SETTLE_KAFKA_SITE_A_PASSWORD",
                             "SETTLE_PG_SITE_B_PASSWORD", "SETTLE_KAFKA_SITE_B_PASSWORD"})


def site_env_path(path: Path, site: str) -> Path:
    """Site ``site``'s env file beside the shared ``.env`` at ``path``."""
    return path.with_name(f"{path.name}.site-{site}")


def compose_variables(text: str) -> set[str]:
    """The variables a compose file's text interpolates."""
    return set(_VARIABLE.findall(text))


def read_all(path: Path) -> dict[str, str]:
    """The shared ``.env`` at ``path`` and both sites' files, as one mapping (a variable both
    hold has one value: ``write_env`` writes it so)."""
    values: dict[str, str] = {}
    for p in (*(site_env_path(path, s) for s in SITES), path):
        values.update(read_env(p))
    return values


def read_env(path: Path) -> dict[str, str]:
    values: dict[str, str] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip() and not line.lstrip().startswith("#") and "=" in line:
                key, _, value = line.partition("=")
                value = value.strip()
                if len(value) >= 2 and value[0] == value[-1] == "'":
                    value = value[1:-1]  # literal: compose expands no $ in it
                values[key.strip()] = value
    return values


REPO = Path(__file__).resolve().parents[2]


def deploy_config_digest(root: Path = REPO) -> str:
    """What the services that mount deploy/'s files see (docker-compose.yml's
    DEPLOY_CONFIG_DIGEST): their content, not just their paths, so that a change recreates
    them."""
    digest = hashlib.sha256()
    for f in sorted((root / "deploy").rglob("*")):
        if f.is_file():
            digest.update(f.relative_to(root).as_posix().encode() + b"\0" + f.read_bytes())
    return digest.hexdigest()[:16]


def env_text(values: dict[str, str]) -> str:
    """``values`` as .env lines; a value with a `$` (a bcrypt hash) single-quoted, which
    compose reads literally and read_env unquotes."""
    return "".join(f"{k}='{v}'\n" if "$" in v else f"{k}={v}\n" for k, v in values.items())


def bcrypt_hash(password: str, old: str | None = None) -> str:
    """``old`` while it is ``password``'s hash (a restart keeps the file as it is), else a new
    one. Single-quoted in the .env: a bcrypt hash is full of `$`, which compose expands."""
    import bcrypt

    if old and bcrypt.checkpw(password.encode(), old.encode()):
        return old
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=10)).decode()


def _fernet_key() -> str:
    return base64.urlsafe_b64encode(secrets.token_bytes(32)).decode()


def airflow_url(bind: str, port: int = AIRFLOW_PORT) -> str:
    """The api-server's HTTPS URL for a bind address: loopback when it listens on every
    interface (its certificate names 127.0.0.1; a wildcard is no address to connect to)."""
    try:
        address = ipaddress.ip_address(bind)
    except ValueError:
        raise ConfigError(f"AIRFLOW_BIND_ADDRESS={bind!r} is not an IP address (the stack's "
                          f"api-server listens on one: 127.0.0.1 by default)") from None
    if address.is_unspecified:
        return f"https://127.0.0.1:{port}"
    host = f"[{address}]" if address.version == 6 else str(address)
    return f"https://{host}:{port}"


def local_settings(certs: Path, cron: str, compressed: str = "",
                   airflow_bind: str = DEFAULT_AIRFLOW_BIND) -> dict[str, str]:
    """What is not secret: where the services listen here, the TLS folder, the scheduling."""
    airflow = airflow_url(airflow_bind)
    return {
        "KAFKA_BOOTSTRAP": ",".join(f"127.0.0.1:{p}" for p in KAFKA_PORTS),
        # Both members of the settlement cluster: clients take the one that accepts writes
        # (target_session_attrs=read-write). PG_HOSTS/PG_PORTS: the same as libpq's query
        # lists, for the URLs that cannot hold several host:port pairs (Airflow's).
        "PG_ADDRESS": ",".join(f"127.0.0.1:{p}" for p in PG_PORTS),
        "PG_HOSTS": ",".join("127.0.0.1" for _ in PG_PORTS),
        "PG_PORTS": ",".join(str(p) for p in PG_PORTS),
        # Site B's view: the same members, its own first (a silent site A costs it nothing).
        "PG_ADDRESS_B": ",".join(f"127.0.0.1:{p}" for p in reversed(PG_PORTS)),
        "PG_HOSTS_B": ",".join("127.0.0.1" for _ in PG_PORTS),
        "PG_PORTS_B": ",".join(str(p) for p in reversed(PG_PORTS)),
        # Each member alone (its exporter watches that server, whichever role it has).
        "PG_A_ADDRESS": f"127.0.0.1:{PG_PORTS[0]}",
        "PG_B_ADDRESS": f"127.0.0.1:{PG_PORTS[1]}",
        # Each site's own server (ledger_a / ledger_b, that site's Airflow metadata).
        **{f"PG_SITE_{site.upper()}_ADDRESS": f"127.0.0.1:{port}"
           for site, port in PG_SITE_PORTS.items()},
        "ETCD_HOSTS": ",".join(f"127.0.0.1:{client}" for client, _ in ETCD_PORTS),
        "ETCD_INITIAL_CLUSTER": ",".join(f"{name}=https://127.0.0.1:{peer}" for name, (_, peer)
                                         in zip(ETCD_NAMES, ETCD_PORTS, strict=True)),
        # HTTPS with the stack's CA (deploy/make-certs.sh's airflow certificate): the task
        # processes' execution API, the healthcheck, the UI and the REST API alike.
        "AIRFLOW_BIND_ADDRESS": airflow_bind,
        "AIRFLOW_INTERNAL_URL": airflow,
        "AIRFLOW_BASE_URL": airflow,
        # Site B's Airflow (site A's is the two above).
        "AIRFLOW_B_INTERNAL_URL": airflow_url(airflow_bind, AIRFLOW_PORTS["b"]),
        "AIRFLOW_B_BASE_URL": airflow_url(airflow_bind, AIRFLOW_PORTS["b"]),
        # Monitoring: HTTPS with the stack's CA, on loopback.
        "PROMETHEUS_URL": f"https://127.0.0.1:{PROMETHEUS_PORT}",
        "ALERTMANAGER_URL": f"https://127.0.0.1:{ALERTMANAGER_PORT}",
        "PUSHGATEWAY_URL": f"https://127.0.0.1:{PUSHGATEWAY_PORT}",
        "SETTLE_CERTS_DIR": str(certs),
        "DEPLOY_CONFIG_DIGEST": deploy_config_digest(),
        "SETTLE_SCHEME": "shared",
        "SETTLE_TOPIC": "trades",
        "SETTLE_PARTITIONS": "6",
        # Manual runs only unless a soak asks for a cron: a calendar run created on unpausing
        # would wait for a day nobody publishes and hold the DAG's single active run.
        "SETTLE_EOD_CRON": cron,
        # A soak's compressed trading days (settlement.config.CompressedDays); "" otherwise.
        "SETTLE_EOD_COMPRESSED": compressed,
    }


def split_env(values: dict[str, str], root: Path = REPO) -> dict[str, dict[str, str]]:
    """``values`` per file: "" (the shared .env) and each site. A site's file gets the
    variables its compose file names; the shared one everything else, and what
    docker-compose.yml or the local override names (a site's consumer login too: `migrate`
    and `kafka-init` create it)."""
    named = {site: compose_variables((root / SITE_COMPOSE[site]).read_text())
             for site in SITES}
    shared = compose_variables((root / "docker-compose.yml").read_text()
                               + (root / OVERRIDE_FILE).read_text())
    out: dict[str, dict[str, str]] = {site: {} for site in SITES}
    out[""] = {}
    for name, value in values.items():
        sites = [site for site in SITES if name in named[site]]
        for site in sites:
            out[site][name] = value
        if not sites or name in shared:
            out[""][name] = value
    for site, other in zip(SITES, reversed(SITES), strict=True):
        if leaked := sorted(set(out[site]) & SITE_OWN[other]):
            raise ConfigError(f"{SITE_COMPOSE[site]} names site {other}'s own {leaked}: a site's "
                              "file may name only its own secrets (issue 58)")
    return out


def write_env(path: Path, certs: Path, cron: str = "none",
              compressed: str = "") -> dict[str, str]:
    """Create or complete the stack's env files (secrets kept, addresses rewritten); 0600.
    Returns the three files' values together. An older single .env is split: what only a
    site uses leaves it for that site's file."""
    old = read_all(path)
    values = {name: old.get(name) or old.get(INHERITED.get(name, "")) or secrets.token_hex(24)
              for name in PASSWORDS}
    values["AIRFLOW_FERNET_KEY"] = old.get("AIRFLOW_FERNET_KEY") or _fernet_key()
    # Site B's own key; after an older .env's shared one, that one second: Airflow encrypts
    # with the first and still reads what the shared key encrypted (`airflow
    # rotate-fernet-key` at B, then drop it).
    shared = old.get("AIRFLOW_FERNET_KEY")
    values["AIRFLOW_B_FERNET_KEY"] = old.get("AIRFLOW_B_FERNET_KEY") or (
        f"{_fernet_key()},{shared}" if shared else _fernet_key())
    values["KAFKA_CLUSTER_ID"] = (old.get("KAFKA_CLUSTER_ID") or base64.urlsafe_b64encode(
        secrets.token_bytes(16)).decode().rstrip("="))
    values["KAFKA_ADMIN_USER"] = "admin"
    values["MONITORING_PASSWORD_BCRYPT"] = bcrypt_hash(values["MONITORING_PASSWORD"],
                                                       old.get("MONITORING_PASSWORD_BCRYPT"))
    values["AIRFLOW_ADMIN_USER"] = "admin"
    # An operator's bind address is kept; every other address is rewritten.
    values.update(local_settings(certs, cron, compressed,
                                 old.get("AIRFLOW_BIND_ADDRESS") or DEFAULT_AIRFLOW_BIND))
    files = split_env(values)
    for site in SITES:
        write_private(site_env_path(path, site), HEADER + SITE_HEADER.format(site=site)
                       + env_text(files[site]))
    write_private(path, HEADER + env_text(files[""]))
    return values


def ca_dir(certs: Path) -> Path:
    """Where deploy/make-certs.sh keeps the CA's private key: beside ``certs``, never in it
    (docker-compose.yml mounts files of ``certs`` only; no container sees this folder)."""
    return certs.parent / f"{certs.name}-ca"


def make_certs(root: Path, certs: Path, airflow_bind: str = DEFAULT_AIRFLOW_BIND) -> None:
    """The stack's CA and certificates (kept once made). An api-server bound to one address
    other than loopback is reached there, so the certificates name it too (certificates made
    before the address was set do not: remove ``certs`` to re-issue them)."""
    address = ipaddress.ip_address(airflow_bind)
    sans = [] if address.is_loopback or address.is_unspecified else [f"IP:{address}"]
    run(["bash", str(root / "deploy" / "make-certs.sh"), str(certs), *sans], timeout=120,
        env={**os.environ, "CA_DIR": str(ca_dir(certs))})
