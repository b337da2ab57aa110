"""docker-compose.yml cannot run here (no Docker engine): check it statically."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from settlement.config import Settings

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES: dict[str, Any] = COMPOSE["services"]
SETTLE_NAMES = {f"SETTLE_{name.upper()}" for name in Settings.model_fields}


def _env(svc: dict[str, Any]) -> dict[str, Any]:
    env = svc.get("environment") or {}
    if isinstance(env, list):
        return dict(item.split("=", 1) for item in env)
    return env


def test_core_services_exist() -> None:
    assert {"kafka-1", "kafka-2", "kafka-3", "postgres", "site-a", "site-b", "airflow",
            "migrate"} <= set(SERVICES)


def test_app_services_use_only_documented_settle_names() -> None:
    used = set()
    for name, svc in SERVICES.items():
        for var in _env(svc):
            if var.startswith("SETTLE_"):
                assert var in SETTLE_NAMES, f"{name}: {var} is not a setting in config.py"
                used.add(var)
    assert {"SETTLE_KAFKA_BOOTSTRAP", "SETTLE_PG_DSN", "SETTLE_LEDGER_A_DSN",
            "SETTLE_LEDGER_B_DSN", "SETTLE_LEDGER_SHARED_DSN"} <= used


def test_host_ports_do_not_clash() -> None:
    ports = [str(p).split(":")[0] for svc in SERVICES.values() for p in svc.get("ports", [])]
    assert len(ports) == len(set(ports)), ports


def test_images_are_pinned() -> None:
    for name, svc in SERVICES.items():
        image = svc.get("image")
        assert image, f"{name} has no image"
        assert re.search(r":[\w.\-]+$", image), f"{name}: image {image!r} has no tag"
        assert not image.endswith(":latest"), f"{name}: {image!r} is not pinned"


def test_kafka_cluster_is_durable() -> None:
    for i in (1, 2, 3):
        env = _env(SERVICES[f"kafka-{i}"])
        assert env["KAFKA_NODE_ID"] == i
        assert int(env["KAFKA_DEFAULT_REPLICATION_FACTOR"]) == 3
        assert int(env["KAFKA_MIN_INSYNC_REPLICAS"]) == 2
        assert str(env["KAFKA_UNCLEAN_LEADER_ELECTION_ENABLE"]).lower() == "false"
        assert "healthcheck" in SERVICES[f"kafka-{i}"]


def test_dependencies_exist_and_wait_for_health() -> None:
    for name, svc in SERVICES.items():
        for dep, cond in (svc.get("depends_on") or {}).items():
            assert dep in SERVICES, f"{name} depends on unknown {dep}"
            assert cond["condition"] in {"service_healthy", "service_completed_successfully"}


def test_no_secrets_committed() -> None:
    text = (ROOT / "docker-compose.yml").read_text()
    literal = re.search(r"^\s*\w*PASSWORD\w*:\s*(?!\$\{)\S", text, re.M)
    assert literal is None, f"a literal password in compose: {literal.group(0)!r}"
    assert (ROOT / ".env.example").exists()
    built = [s for s in SERVICES.values() if "build" in s]
    assert built and (ROOT / "Dockerfile").exists()
