"""Running `settle` commands as real child processes (sites, gateway) and reading their JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from settlement.config import REPO_ROOT


def spawn_settle(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[str]:
    """Start ``settle ARGS --json`` with stdout and stderr into ``log``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    out = open(log, "w")
    return subprocess.Popen([sys.executable, "-m", "settlement.cli", *args, "--json"],
                            env=env, stdout=out, stderr=subprocess.STDOUT, text=True,
                            cwd=REPO_ROOT)


def start_site(site: str, scheme: str, trade_date: str, env: dict[str, str], log: Path,
               max_seconds: float = 600) -> subprocess.Popen[str]:
    """``settle site run ... --until-close`` for one trade date, as an operator starts it."""
    return spawn_settle(["site", "run", "--site", site, "--scheme", scheme, "--until-close",
                         "--date", trade_date, "--max-seconds", str(max_seconds)], env, log)


def last_json(log: Path) -> dict[str, Any]:
    """The last JSON object a `settle --json` process printed (empty if none)."""
    lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.startswith("{")]
    return json.loads(lines[-1]) if lines else {}


def wait(proc: subprocess.Popen[str], what: str, log: Path, timeout: float) -> dict[str, Any]:
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise RuntimeError(f"{what} did not finish within {timeout:.0f}s; see {log}") from None
    if proc.returncode != 0:
        tail = "\n    ".join(log.read_text(errors="replace").splitlines()[-8:])
        raise RuntimeError(f"{what} failed (exit {proc.returncode}); last lines of {log}:\n"
                           f"    {tail}")
    return last_json(log)
