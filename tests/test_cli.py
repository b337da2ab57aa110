"""The settle CLI: JSON last line, clear errors and exit codes."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.helpers import ROOT, last_json


def run(args: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "settlement.cli", *args], capture_output=True,
                          text=True, cwd=ROOT, env={**os.environ, **env}, timeout=120)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["simulate", "--date", "2026-13-01", "--trades", "5"], "not a calendar date"),
        (["simulate", "--date", "2026-11-23", "--trades", "0"], "expected a positive integer"),
        (["simulate", "--date", "2026-11-23", "--dup-rate", "2"], "between 0 and 1"),
        (["site", "run", "--site", "c", "--scheme", "shared"], "invalid choice: 'c'"),
        (["site", "run", "--site", "a", "--scheme", "both"], "invalid choice: 'both'"),
        (["services", "up", "--brokers", "2"], "invalid choice: 2"),
        # 0 used to mean "no limit" in one process and "killed after 120 s" in the other.
        *[(["site", "run", "--site", "a", "--scheme", "shared", f"--max-seconds={v}"],
           "expected a finite number of seconds > 0")
          for v in ("0", "-5", "nan", "inf", "-inf")],
        (["site", "run", "--site", "a", "--scheme", "shared", "--max-seconds", "soon"],
         "expected a number of seconds, got 'soon'"),
        # Said before the services are asked for (none runs on these ports).
        (["instructions"], "settle instructions needs --date YYYY-MM-DD"),
        (["instructions", "status"], "settle instructions status needs --file STATUS.csv"),
        (["instructions", "--date", "2026-11-31"], "not a calendar date"),
        (["instructions", "--date", "2026-11-23", "--format", "pdf"], "invalid choice: 'pdf'"),
        (["eod", "--date", "2026-11-23", "--reclose", "--only-if-unsettled"],
         "--reclose settles a settled day again"),
    ],
)
def test_bad_arguments_exit_2_with_a_reason(args: list[str], message: str) -> None:
    res = run(args)
    assert res.returncode == 2
    assert message in res.stderr


def test_a_bogus_scheme_from_the_environment_fails_at_once() -> None:
    # `SCHEME=bogus make demo` used to start the demo and hang until a timeout.
    res = run(["demo", "--trades", "10"], SCHEME="bogus")
    assert res.returncode == 2
    assert "expected separate or shared (from --scheme or SCHEME), got 'bogus'" in res.stderr


def test_the_alert_webhook_never_appears_in_a_configuration_error() -> None:
    # The URL is a credential (Slack and friends put the token in the path).
    hook = "hxxps://hooks.example/services/T000/B000/SECRET-TOKEN-1234"
    for extra in ([], ["--json"]):
        res = run([*extra, "status"], SETTLE_ALERT_WEBHOOK=hook)
        assert res.returncode == 2, res.stderr
        assert "SETTLE_ALERT_WEBHOOK" in res.stderr + res.stdout
        assert "SECRET-TOKEN" not in res.stderr + res.stdout


def test_metrics_ports_past_the_last_port_are_refused() -> None:
    res = run(["site", "run", "--site", "a", "--scheme", "shared", "--processes", "3"],
              SETTLE_METRICS_PORT="65534")
    assert res.returncode == 2, res.stderr
    assert "choose a base port of at most 65533" in res.stderr


def test_bad_configuration_exits_2_and_names_the_variable() -> None:
    res = run(["services", "status", "--json"], SETTLE_KAFKA_BOOTSTRAP="nohostport")
    assert res.returncode == 2
    out = last_json(res.stdout)
    assert out["ok"] is False
    assert "SETTLE_KAFKA_BOOTSTRAP" in out["error"]
    assert "SETTLE_KAFKA_BOOTSTRAP" in res.stderr


def test_status_json_is_the_last_line(tmp_path) -> None:
    res = run(["services", "status", "--json"], SETTLE_STATE_DIR=str(tmp_path),
              SETTLE_PG_PORT="25999", SETTLE_KAFKA_PORT="29999")
    assert res.returncode == 0, res.stderr
    out = last_json(res.stdout)
    assert out["postgres"] == "stopped" and out["kafka"] == "stopped"
    assert out["postgres_dsn"].split("?")[0].endswith(":25999/settlement")
    assert set(out["ledger_dsns"]) == {"a", "b", "shared"}


# No services on these ports: what an operator sees before `make up`.
DOWN = {"SETTLE_PG_PORT": "25998", "SETTLE_KAFKA_PORT": "29998",
        "SETTLE_KAFKA_CONTROLLER_PORT": "29898", "SETTLE_KAFKA_BROKERS": "1"}


def test_version() -> None:
    from settlement.cli import version

    res = run(["--version"])
    assert res.returncode == 0
    assert res.stdout.strip() == f"settle {version()}" and version() != "unknown"


@pytest.mark.parametrize("args", [["--json", "services", "status"],
                                  ["services", "status", "--json"]])
def test_json_before_or_after_the_command(args: list[str], tmp_path) -> None:
    res = run(args, SETTLE_STATE_DIR=str(tmp_path), **DOWN)
    assert res.returncode == 0, res.stderr
    out = last_json(res.stdout)
    assert out["ok"] is True and out["postgres"] == "stopped"


def test_help_shows_defaults() -> None:
    res = run(["simulate", "--help"])
    assert res.returncode == 0
    assert "(default: 10000)" in res.stdout and "(default: 0.0)" in res.stdout
    text = " ".join(run(["status", "--help"]).stdout.split())  # help wraps lines
    assert "(default: 15.0)" in text and "exit 0 healthy" in text


@pytest.mark.parametrize("args", [
    ["status"],
    ["drill", "--scheme", "shared", "--fault", "kill"],
    ["simulate", "--date", "2026-11-23", "--trades", "5"],
    ["eod", "--date", "2026-11-23"],
])
def test_without_services_the_error_says_how_to_start_them(args: list[str], tmp_path) -> None:
    res = run([*args, "--json"], SETTLE_STATE_DIR=str(tmp_path), **DOWN)
    assert res.returncode == 1, res.stderr[-2000:]
    out = last_json(res.stdout)
    assert "settle services up" in out["error"] and "make up" in out["error"]
    assert "Broker transport failure" not in res.stdout + res.stderr
    assert "Traceback" not in res.stderr


def test_passwords_are_redacted_in_status_and_errors(tmp_path) -> None:
    secret = "hunter2-s3cret"
    dsn = f"postgresql://settle:{secret}@127.0.0.1:25998/settlement"
    res = run(["services", "status", "--json"], SETTLE_STATE_DIR=str(tmp_path),
              SETTLE_PG_DSN=dsn, SETTLE_LEDGER_A_DSN=dsn.replace("settlement", "ledger_a"),
              **DOWN)
    assert res.returncode == 0, res.stderr
    out = last_json(res.stdout)
    assert out["postgres_dsn"] == "postgresql://settle:***@127.0.0.1:25998/settlement"
    assert out["ledger_dsns"]["a"].startswith("postgresql://settle:***@")
    assert secret not in res.stdout + res.stderr
    # An error that carries the DSN (PostgreSQL down): redacted too.
    res = run(["eod", "--date", "2026-11-23", "--json"], SETTLE_STATE_DIR=str(tmp_path),
              SETTLE_PG_DSN=dsn, **DOWN)
    assert res.returncode == 1
    out = last_json(res.stdout)
    assert "PostgreSQL is not reachable at postgresql://settle:***@" in out["error"]
    assert secret not in res.stdout + res.stderr


def test_redact_covers_urls_and_keywords() -> None:
    from settlement.errors import redact

    text = ("postgresql://u:p%40ss@h/db; host=h password='a b' user=u; "
            "sasl.password=xyz, Password: qq")
    red = redact(text)
    for secret in ("p%40ss", "a b", "xyz", "qq"):
        assert secret not in red
    assert red.count("***") == 4 and "user=u" in red
