"""The stack's alert rules and Prometheus configuration, checked with Prometheus's own promtool
(issue 46): the rules load, each alert behaves as its unit tests say (firing, quiet,
resolved), each has a runbook in docs/operations.md, and the local stack's configuration
scrapes the same jobs with the same labels as the production one, on the ports the stack
declares. `make test` installs promtool (Debian's prometheus package, `make promtool`)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from settlement.stack import envfile

ROOT = Path(__file__).resolve().parents[1]
PROM = ROOT / "deploy" / "prometheus"
RULES = PROM / "rules.yml"
RULES_TEST = PROM / "rules_test.yml"
OPERATIONS = ROOT / "docs" / "operations.md"
CONFIGS = {"production": PROM / "prometheus.yml", "local": PROM / "prometheus-local.yml"}


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("promtool")
    if exe is None:  # a failure, not a skip: the rules would go untested
        pytest.fail("promtool is not installed: `make promtool` installs Debian's prometheus")
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=300,
                          check=False, cwd=PROM)


def _alerts() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"] if "alert" in rule]


def _anchors(markdown: str) -> set[str]:
    """GitHub's anchors for the headings: lower case, punctuation dropped, spaces to '-'."""
    return {re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            for m in re.finditer(r"^#{1,6}\s+(.+)$", markdown, re.MULTILINE)}


def test_promtool_loads_the_rules_and_their_unit_tests_pass() -> None:
    checked = _promtool("check", "rules", str(RULES))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(_alerts())} rules found" in checked.stdout, checked.stdout
    tested = _promtool("test", "rules", str(RULES_TEST))
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout, tested.stdout


def test_every_alert_is_unit_tested_has_a_severity_and_a_runbook_in_operations_md() -> None:
    alerts = _alerts()
    names = [a["alert"] for a in alerts]
    assert len(names) == len(set(names)), names
    # What the issue asks for, by the alert that covers it.
    assert {"SiteHeartbeatStale", "ConsumerLagHigh", "DeadLettersRising", "PartitionStalled",
            "KafkaUnderReplicatedPartitions", "KafkaUnderMinIsr", "SettlementReplicaAbsent",
            "SettlementReplicaLagging", "CloseNotPublished", "DrillOrSoakFailing",
            "AirflowSchedulerDown", "AirflowUnreachable"} <= set(names)
    tests = RULES_TEST.read_text()
    anchors = _anchors(OPERATIONS.read_text())
    for alert in alerts:
        name = alert["alert"]
        assert f"alertname: {name}\n" in tests, f"{name} has no promtool unit test"
        assert alert["labels"]["severity"] in ("critical", "warning"), name
        url = alert["annotations"]["runbook_url"]
        page, _, anchor = url.partition("#")
        assert page == "docs/operations.md" and anchor == name.lower(), (name, url)
        assert anchor in anchors, f"{name}: no heading '{name}' in docs/operations.md"


def _scrape_jobs(config: dict[str, Any]) -> dict[str, list[dict[str, str]]]:
    return {job["job_name"]: [sc["labels"] for sc in job["static_configs"]]
            for job in config["scrape_configs"]}


def test_the_local_prometheus_scrapes_what_production_does_on_the_stacks_loopback_ports() -> None:
    for path in CONFIGS.values():
        checked = _promtool("check", "config", "--syntax-only", str(path))
        assert checked.returncode == 0, checked.stdout + checked.stderr
    production, local = (yaml.safe_load(p.read_text()) for p in CONFIGS.values())
    assert _scrape_jobs(production) == _scrape_jobs(local)
    assert production["global"] == local["global"]
    assert production["rule_files"] == local["rule_files"] == ["/etc/settle/prometheus/rules.yml"]
    # Every site, broker and PostgreSQL server is a target, each with its site.
    jobs = _scrape_jobs(local)
    assert sorted(t["site"] for t in jobs["settle-site"]) == ["a", "b"]
    assert sorted(t["broker"] for t in jobs["kafka"]) == ["1", "2", "3"]
    assert {t["member"] for t in jobs["postgres"]} == set(envfile.PG_EXPORTER_PORTS)
    assert sorted(t["site"] for t in jobs["airflow"]) == ["a", "b"]
    assert all(t.get("site") for targets in jobs.values() for t in targets), jobs
    # Locally every target is on loopback, on a port the stack declares.
    addresses = [target for job in local["scrape_configs"] for sc in job["static_configs"]
                 for target in sc["targets"]]
    addresses += local["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"]
    ports = {int(a.rsplit(":", 1)[1]) for a in addresses}
    assert all(a.startswith("127.0.0.1:") for a in addresses), addresses
    assert ports == {envfile.PROMETHEUS_PORT, envfile.ALERTMANAGER_PORT,
                     envfile.PUSHGATEWAY_PORT, *envfile.SITE_METRICS_PORTS.values(),
                     *envfile.JMX_PORTS, *envfile.PG_EXPORTER_PORTS.values(),
                     *envfile.AIRFLOW_EXPORTER_PORTS.values()}
    # The exporters that speak HTTPS are scraped over it, verifying the stack's CA.
    for job in local["scrape_configs"]:
        if job["job_name"] in ("postgres", "pushgateway", "alertmanager", "prometheus",
                               "airflow", "kafka", "settle-site"):
            assert job["scheme"] == "https" and job["tls_config"]["ca_file"] == "/certs/ca.crt"
