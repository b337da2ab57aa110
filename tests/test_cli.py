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
    ],
)
def test_bad_arguments_exit_2_with_a_reason(args: list[str], message: str) -> None:
    res = run(args)
    assert res.returncode == 2
    assert message in res.stderr


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
    assert out["postgres_dsn"].endswith(":25999/settlement")
    assert set(out["ledger_dsns"]) == {"a", "b", "shared"}
