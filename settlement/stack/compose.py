"""Starting, waiting for and removing the stack; what a client needs to reach it."""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from settlement.errors import ServiceError
from settlement.services.procs import port_free
from settlement.stack import DEFAULT_WAN_RTT_MS, PROJECT, PROJECT_FILTER, envfile
from settlement.stack.airflow_api import AirflowApi
from settlement.stack.engine import (
    Log,
    compose_binary,
    engine_answers,
    ensure_engine,
    run,
    stop_engine_if_ours,
)
from settlement.stack.images import build_images, prune_left_builds

OVERRIDE = envfile.OVERRIDE_FILE
# Run once and exit 0; everything else keeps running (and is healthy, where it says how).
ONE_SHOT = ("kafka-init", "migrate", "migrate-a", "migrate-b",
            *(f"airflow-{job}-{site}" for site in "ab" for job in ("init", "users", "pools")))
# A profile per site (docker-compose.yml): what only that site runs. The local stack is both
# sites; `docker compose --profile site-b up -d` would start the shared services and site B.
SITES = ("a", "b")
PROFILES = tuple(arg for site in SITES for arg in ("--profile", f"site-{site}"))


@dataclass(frozen=True)
class Stack:
    root: Path
    compose_cmd: tuple[str, ...]

    @property
    def env_path(self) -> Path:
        return self.root / ".env"

    @property
    def state(self) -> Path:
        return state_dir(self.root)

    @property
    def certs(self) -> Path:
        return self.state / "certs"

    @property
    def secrets_path(self) -> Path:
        """The clients' secrets (client_info), 0600: never printed."""
        return self.state / "secrets.json"

    def compose_argv(self, *args: str) -> list[str]:
        """docker compose on the production file with the local override and the stack's .env."""
        return [*self.compose_cmd, "-p", PROJECT, "--project-directory", str(self.root),
                "-f", str(self.root / "docker-compose.yml"), "-f", str(self.root / OVERRIDE),
                "--env-file", str(self.env_path), *PROFILES, *args]

    def compose(self, *args: str, check: bool = True, timeout: float = 900,
                capture: bool = True) -> Any:
        return run(self.compose_argv(*args), check=check, timeout=timeout, capture=capture,
                   cwd=self.root)

    def env(self) -> dict[str, str]:
        return envfile.read_all(self.env_path)

    def logs_tail(self, service: str, lines: int = 40, chars: int = 4000) -> str:
        """The last ``lines`` of a service's log, for an error message: a stack that stops
        itself after a failure (the tests do) leaves nothing to read afterwards."""
        try:
            out = self.compose("logs", "--no-color", "--tail", str(lines), service,
                               check=False, timeout=60)
        except ServiceError as exc:  # the failure being reported matters more than its log
            return f"(its log could not be read: {exc})"
        return (out.stdout + out.stderr).strip()[-chars:]

    def containers(self) -> dict[str, dict[str, Any]]:
        """service -> its container's state (docker compose ps -a)."""
        out = self.compose("ps", "-a", "--format", "json").stdout
        rows = [json.loads(line) for line in out.splitlines() if line.strip().startswith("{")]
        return {r["Service"]: r for r in rows}


def state_dir(root: Path) -> Path:
    """The stack's certificates and the dockerd this project started (its log and pid)."""
    return root / ".state" / "stack"


def open_stack(root: Path, log: Log) -> Stack:
    ensure_engine(state_dir(root), log)
    return Stack(root, tuple(compose_binary(root / ".cache" / "stack", log)))


def _not_ready(containers: dict[str, dict[str, Any]],
               logs_tail: Callable[[str], str] | None = None) -> dict[str, str]:
    waiting = {}
    for svc, c in containers.items():
        if svc in ONE_SHOT:
            if c["State"] != "exited":
                waiting[svc] = c["State"]
            elif c.get("ExitCode", 0) != 0:
                raise ServiceError(f"{svc} failed (exit {c['ExitCode']}); the end of its log "
                                   f"(all of it: `docker compose logs {svc}`, make stack-logs):"
                                   f"\n{logs_tail(svc) if logs_tail else '(not read)'}")
        elif c["State"] != "running":
            waiting[svc] = c["State"]
        elif c.get("Health") not in ("", None, "healthy"):
            waiting[svc] = c["Health"]
    return waiting


ERROR_LINE = re.compile(r"error|exception|fatal|panic|refused|denied", re.IGNORECASE)


def error_lines(text: str, limit: int = 4) -> list[str]:
    """The last distinct lines of a log that say what went wrong (a broker restarting in a
    loop prints the same exception each time, then its whole configuration)."""
    found: list[str] = []
    for line in reversed(text.splitlines()):
        line = line.strip()
        if ERROR_LINE.search(line) and line not in found:
            found.append(line[:400])
            if len(found) == limit:
                break
    return found[::-1]


def _why_services_failed(stack: Stack) -> str:
    """What the failed or unhealthy services' logs say: `compose up` names only the service."""
    try:
        containers = stack.containers()
    except ServiceError as exc:
        return f"\n(the services' states could not be read: {exc})"
    failed = sorted(svc for svc, c in containers.items()
                    if c.get("Health") == "unhealthy" or c["State"] == "restarting"
                    or (c["State"] == "exited" and c.get("ExitCode", 0) != 0))
    parts = []
    for svc in failed:
        # All of the last 400 lines: a broker in a restart loop ends each try with its
        # configuration, which would fill a short tail.
        lines = (error_lines(stack.logs_tail(svc, lines=400, chars=200_000))
                 or ["(no error line in its log)"])
        state = ", ".join(filter(None, (containers[svc]["State"], containers[svc].get("Health"))))
        parts.append(f"\n{svc} ({state}), its log says:\n  " + "\n  ".join(lines))
    return "".join(parts)


def wait_ready(stack: Stack, log: Log, timeout: float = 900) -> None:
    deadline = time.monotonic() + timeout
    last = ""
    while True:
        waiting = _not_ready(stack.containers(), stack.logs_tail)
        if not waiting:
            return
        text = ", ".join(f"{k} {v}" for k, v in sorted(waiting.items()))
        if text != last:
            log(f"waiting for: {text}")
            last = text
        if time.monotonic() > deadline:
            raise ServiceError(f"the stack was not ready in {timeout:.0f} s: {text}")
        time.sleep(3)


def stale_reason(env_is_new: bool, leftovers: bool, cluster_id: str,
                 volume_cluster_ids: dict[str, str | None]) -> str | None:
    """Why the project's existing containers and volumes cannot belong to this .env, or None.

    Volumes outlive a stack whose removal never ran (a killed test, another clone of the
    project: every clone's stack is named dual-site-settlement). Their PostgreSQL roles and
    Kafka metadata were made with other secrets, so a new .env cannot open them: CI saw every
    broker fail and airflow-init exit 1 on such leftovers."""
    if env_is_new and leftovers:
        return "this .env was just created, so they were made with secrets no longer known"
    foreign = sorted(v for v, found in volume_cluster_ids.items()
                     if found is not None and found != cluster_id)
    if foreign:
        return (f"{', '.join(foreign)} hold(s) another Kafka cluster (cluster.id is not this "
                f".env's KAFKA_CLUSTER_ID)")
    return None


def _leftovers() -> tuple[list[str], list[str]]:
    """The project's existing containers and volumes (any clone's: they share its name)."""
    containers = run(["docker", "ps", "-aq", "--filter", PROJECT_FILTER],
                     timeout=60).stdout.split()
    volumes = run(["docker", "volume", "ls", "-q", "--filter", PROJECT_FILTER],
                  timeout=60).stdout.split()
    return containers, volumes


def _volume_cluster_id(volume: str) -> str | None:
    """cluster.id of the Kafka storage a volume holds (its meta.properties), None if none."""
    out = run(["docker", "volume", "inspect", "-f", "{{.Mountpoint}}", volume], check=False,
              timeout=60)
    if out.returncode != 0:
        return None
    try:
        text = (Path(out.stdout.strip()) / "meta.properties").read_text()
    except OSError:  # not Kafka's, or not formatted yet
        return None
    for line in text.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "cluster.id":
            return value.strip()
    return None


def _remove(stack: Stack) -> None:
    stack.compose("--profile", "simulator", "down", "--volumes", "--remove-orphans",
                  "--timeout", "20", timeout=300)


def remove_stale(stack: Stack, env_is_new: bool, cluster_id: str, log: Log) -> bool:
    """Remove an earlier stack's containers and volumes that this .env cannot open."""
    containers, volumes = _leftovers()
    reason = stale_reason(env_is_new, bool(containers or volumes), cluster_id,
                          {v: _volume_cluster_id(v) for v in volumes if "kafka" in v})
    if reason is None:
        return False
    log(f"removing an earlier stack's {len(containers)} container(s) and {len(volumes)} "
        f"volume(s): {reason}...")
    _remove(stack)
    return True


def taken_ports_message(taken: list[int]) -> str | None:
    """What to tell an operator whose stack ports are held by other programs (None: none)."""
    if not taken:
        return None
    names = ", ".join(f"{p} ({envfile.LISTEN_PORTS.get(p, 'the stack')})" for p in taken)
    return (f"the stack listens on 127.0.0.1 (host networking) and these ports are taken by "
            f"another program: {names}. `ss -ltnp` names a listener, `ss -tanp 'sport = :"
            f"{taken[0]}'` a connection using the port; stop it and run `make stack-up` again "
            f"(the ports are fixed in deploy/local/docker-compose.local.yml)")


def _ensure_ports_free() -> None:
    """Before a stack starts (none of its containers runs): each of its ports must be free.
    Otherwise a server fails inside its container, and compose reports only "unhealthy"."""
    if run(["docker", "ps", "-q", "--filter", PROJECT_FILTER], timeout=60).stdout.split():
        return  # ours hold them: `up -d` only reconciles the running stack
    message = taken_ports_message([p for p in envfile.LISTEN_PORTS if not port_free(p)])
    if message:
        raise ServiceError(message)


def build(root: Path, log: Log) -> dict[str, Any]:
    """Engine, Compose and every image, and nothing started: what `up` needs first, done
    ahead (`make test` runs it in the background, at the lowest priority, while the suite's
    first phases run; on a new machine it is most of a first `up`)."""
    t0 = time.monotonic()
    open_stack(root, log)
    images = build_images(root, root / ".cache" / "jars" / "kafka", log)
    return {"images": images, "seconds": round(time.monotonic() - t0, 1)}


def up(root: Path, log: Log, cron: str = "none",
       wan_rtt_ms: float = DEFAULT_WAN_RTT_MS) -> dict[str, Any]:
    """Engine, images, .env and certificates, then the stack, its locations ``wan_rtt_ms``
    apart; returns how to reach it."""
    from settlement.stack import wan

    wan.check_rtt(wan_rtt_ms)
    t0 = time.monotonic()
    stack = open_stack(root, log)
    build_images(root, root / ".cache" / "jars" / "kafka", log)
    old = envfile.read_all(stack.env_path)
    envfile.make_certs(root, stack.certs,
                       old.get("AIRFLOW_BIND_ADDRESS") or envfile.DEFAULT_AIRFLOW_BIND)
    env_is_new = not old.get("KAFKA_CLUSTER_ID")
    values = envfile.write_env(stack.env_path, stack.certs, cron)
    removed = remove_stale(stack, env_is_new, values["KAFKA_CLUSTER_ID"], log)
    _ensure_ports_free()
    log("starting the stack (docker compose up -d)...")
    try:
        stack.compose("up", "-d", "--remove-orphans", timeout=1200)
    except ServiceError as exc:
        raise ServiceError(f"{exc}{_why_services_failed(stack)}") from None
    wait_ready(stack, log)
    # After the wait: the WAN's rules name the containers running now and their ports.
    link = wan.apply(root, stack.state, wan_rtt_ms, log)
    # Now that compose replaced (or removed) every container an older build ran.
    prune_left_builds()
    return {**client_info(stack), **link.describe(), "stale_removed": removed,
            "seconds": round(time.monotonic() - t0, 1)}


def down(root: Path, log: Log) -> dict[str, Any]:
    from settlement.stack import wan

    wan.clear(state_dir(root), log)  # the delayer is a host process: stopped engine or not
    if not engine_answers():  # never start an engine only to find nothing in it
        return {"removed": False, "reason": "no Docker engine runs: nothing to remove",
                "engine_stopped": stop_engine_if_ours(state_dir(root), log)}
    stack = open_stack(root, log)
    if not stack.env_path.exists():
        return {"removed": False, "reason": "no stack .env: nothing was started",
                "engine_stopped": stop_engine_if_ours(stack.state, log)}
    _remove(stack)
    prune_left_builds()
    return {"removed": True, "engine_stopped": stop_engine_if_ours(stack.state, log)}


# Printed in place of a secret: `make stack-up`'s JSON ends up in terminals and CI logs.
IN_SECRETS_FILE = "(in secrets_file)"


def stack_secrets(stack: Stack) -> dict[str, Any]:
    """What a client needs with its secrets: the auditor's complete Kafka settings and
    PostgreSQL DSN, and the Airflow logins (from the stack's .env)."""
    env = stack.env()
    ca = str(stack.certs / "ca.crt")
    return {
        "kafka_config": {
            "bootstrap.servers": env["KAFKA_BOOTSTRAP"], "security.protocol": "SASL_SSL",
            "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "auditor",
            "sasl.password": env["SETTLE_KAFKA_AUDITOR_PASSWORD"], "ssl.ca.location": ca,
        },
        "postgres_dsn": pg_dsn(env, "settle_audit", env["SETTLE_PG_AUDITOR_PASSWORD"],
                               "settlement", ca),
        "airflow_url": env["AIRFLOW_BASE_URL"],
        # Each site's Airflow (the same logins at both: each site's airflow-users-* makes them).
        "airflow_urls": {"a": env["AIRFLOW_BASE_URL"], "b": env["AIRFLOW_B_BASE_URL"]},
        "airflow_ca": ca,
        "airflow_logins": {
            "admin": {"username": env.get("AIRFLOW_ADMIN_USER", "admin"),
                      "password": env["AIRFLOW_ADMIN_PASSWORD"]},
            "operations": {"username": "operations",
                           "password": env["AIRFLOW_OPERATIONS_PASSWORD"]},
            "auditor": {"username": "auditor", "password": env["AIRFLOW_AUDITOR_PASSWORD"]},
        },
        # Prometheus', Alertmanager's and the Pushgateway's login (HTTP basic auth).
        "monitoring_login": {"username": envfile.MONITORING_USER,
                             "password": env["MONITORING_PASSWORD"]},
    }


def write_secrets(stack: Stack) -> dict[str, Any]:
    """stack_secrets() into the secrets file, 0600 from its creation (never readable by
    others, not even between open and chmod); replaced whole, so a reader never sees half."""
    values = stack_secrets(stack)
    path = stack.secrets_path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(values, f, indent=2)
        f.write("\n")
    os.chmod(tmp, 0o600)  # whatever the umask
    os.replace(tmp, path)
    return values


def read_secrets(stack: Stack) -> dict[str, Any]:
    """The secrets file `make stack-up` wrote (what tools and tests log in with)."""
    try:
        return dict(json.loads(stack.secrets_path.read_text()))
    except FileNotFoundError:
        raise ServiceError(f"{stack.secrets_path} does not exist: start the stack first "
                           f"(make stack-up)") from None


def airflow_api(stack: Stack, login: str, site: str = "a") -> AirflowApi:
    """Site ``site``'s Airflow REST API as one of the stack's logins (admin, operations,
    auditor), over HTTPS verified against the stack's CA."""
    secrets = read_secrets(stack)
    user = secrets["airflow_logins"][login]
    return AirflowApi(secrets["airflow_urls"][site], user["username"], user["password"],
                      ca_file=secrets["airflow_ca"])


def client_info(stack: Stack) -> dict[str, Any]:
    """How a client reaches the stack, as the read-only auditor (Kafka and PostgreSQL), with
    no secret in it: the passwords are in ``secrets_file`` (0600), written here."""
    secrets = write_secrets(stack)
    env = stack.env()
    kafka = {k: v for k, v in secrets["kafka_config"].items() if k != "sasl.password"}
    return {
        "kafka_bootstrap": env["KAFKA_BOOTSTRAP"],
        "kafka_config": kafka,
        "topic": env.get("SETTLE_TOPIC", "trades"),
        # Without a password: libpq takes it from PGPASSWORD or a passfile.
        "postgres_dsn": pg_dsn(env, "settle_audit", None, "settlement",
                               secrets["airflow_ca"]),
        "airflow_url": secrets["airflow_url"],
        "airflow_urls": secrets["airflow_urls"],
        "airflow_ca": secrets["airflow_ca"],
        "airflow_user": secrets["airflow_logins"]["admin"]["username"],
        "airflow_password": IN_SECRETS_FILE,
        # Monitoring (HTTPS, the same CA); the dashboard: /consoles/settlement.html there.
        "prometheus_url": env["PROMETHEUS_URL"],
        "alertmanager_url": env["ALERTMANAGER_URL"],
        "env_file": str(stack.env_path),
        "site_env_files": {site: str(envfile.site_env_path(stack.env_path, site))
                           for site in envfile.SITES},
        "secrets_file": str(stack.secrets_path),
    }


def pg_dsn(env: dict[str, str], user: str, password: str | None, db: str, ca: str,
           address: str | None = None) -> str:
    """A DSN for the settlement cluster (its primary), or for the one server at
    ``address`` (a site's own server: ledger_a, ledger_b)."""
    login = user if password is None else f"{user}:{password}"
    primary = "" if address else "&target_session_attrs=read-write"
    return (f"postgresql://{login}@{address or env['PG_ADDRESS']}/{db}"
            f"?sslmode=verify-full&sslrootcert={ca}{primary}")
