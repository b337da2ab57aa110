"""Starting, waiting for and removing the stack; what a client needs to reach it."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from settlement.errors import ServiceError
from settlement.stack import envfile
from settlement.stack.engine import (
    Log,
    compose_binary,
    engine_answers,
    ensure_engine,
    run,
    stop_engine_if_ours,
)
from settlement.stack.images import build_images

PROJECT = "dual-site-settlement"
OVERRIDE = Path("deploy/local/docker-compose.local.yml")
# Run once and exit 0; everything else keeps running (and is healthy, where it says how).
ONE_SHOT = ("kafka-init", "migrate", "airflow-init", "airflow-users", "airflow-pools")


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

    def compose_argv(self, *args: str) -> list[str]:
        """docker compose on the production file with the local override and the stack's .env."""
        return [*self.compose_cmd, "-p", PROJECT, "--project-directory", str(self.root),
                "-f", str(self.root / "docker-compose.yml"), "-f", str(self.root / OVERRIDE),
                "--env-file", str(self.env_path), *args]

    def compose(self, *args: str, check: bool = True, timeout: float = 900,
                capture: bool = True) -> Any:
        return run(self.compose_argv(*args), check=check, timeout=timeout, capture=capture,
                   cwd=self.root)

    def env(self) -> dict[str, str]:
        return envfile.read_env(self.env_path)

    def logs_tail(self, service: str, lines: int = 40) -> str:
        """The last ``lines`` of a service's log, for an error message: a stack that stops
        itself after a failure (the tests do) leaves nothing to read afterwards."""
        try:
            out = self.compose("logs", "--no-color", "--tail", str(lines), service,
                               check=False, timeout=60)
        except ServiceError as exc:  # the failure being reported matters more than its log
            return f"(its log could not be read: {exc})"
        return (out.stdout + out.stderr).strip()[-4000:]

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


def up(root: Path, log: Log, cron: str = "none") -> dict[str, Any]:
    """Engine, images, .env and certificates, then the stack; returns how to reach it."""
    t0 = time.monotonic()
    stack = open_stack(root, log)
    build_images(root, root / ".cache" / "jars" / "kafka", log)
    envfile.make_certs(root, stack.certs)
    envfile.write_env(stack.env_path, stack.certs, cron)
    log("starting the stack (docker compose up -d)...")
    stack.compose("up", "-d", "--remove-orphans", timeout=1200)
    wait_ready(stack, log)
    return {**client_info(stack), "seconds": round(time.monotonic() - t0, 1)}


def down(root: Path, log: Log) -> dict[str, Any]:
    if not engine_answers():  # never start an engine only to find nothing in it
        return {"removed": False, "reason": "no Docker engine runs: nothing to remove",
                "engine_stopped": stop_engine_if_ours(state_dir(root), log)}
    stack = open_stack(root, log)
    if not stack.env_path.exists():
        return {"removed": False, "reason": "no stack .env: nothing was started",
                "engine_stopped": stop_engine_if_ours(stack.state, log)}
    stack.compose("--profile", "simulator", "down", "--volumes", "--remove-orphans",
                  "--timeout", "20", timeout=300)
    return {"removed": True, "engine_stopped": stop_engine_if_ours(stack.state, log)}


def client_info(stack: Stack) -> dict[str, Any]:
    """Everything a client needs, as the read-only auditor (Kafka and PostgreSQL)."""
    env = stack.env()
    ca = str(stack.certs / "ca.crt")
    airflow = env["AIRFLOW_BASE_URL"]
    return {
        "kafka_bootstrap": env["KAFKA_BOOTSTRAP"],
        "kafka_config": {
            "bootstrap.servers": env["KAFKA_BOOTSTRAP"], "security.protocol": "SASL_SSL",
            "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "auditor",
            "sasl.password": env["SETTLE_KAFKA_AUDITOR_PASSWORD"], "ssl.ca.location": ca,
        },
        "topic": env.get("SETTLE_TOPIC", "trades"),
        "postgres_dsn": pg_dsn(env, "settle_audit", env["SETTLE_PG_AUDITOR_PASSWORD"],
                               "settlement", ca),
        "airflow_url": airflow,
        "airflow_user": env.get("AIRFLOW_ADMIN_USER", "admin"),
        "airflow_password": env["AIRFLOW_ADMIN_PASSWORD"],
        "env_file": str(stack.env_path),
    }


def pg_dsn(env: dict[str, str], user: str, password: str, db: str, ca: str) -> str:
    return (f"postgresql://{user}:{password}@{env['PG_ADDRESS']}/{db}"
            f"?sslmode=verify-full&sslrootcert={ca}")
