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


class SiteProcesses:
    """The N processes of one site (each its own ``settle site run``, a member of the site's
    group), handled as one: a fault hits every one of them, as the death of a site would."""

    def __init__(self, site: str, procs: list[tuple[subprocess.Popen[str], Path]]):
        self.site, self.procs = site, procs

    @classmethod
    def start(cls, site: str, scheme: str, trade_date: str, env: dict[str, str], log: Path,
              processes: int = 1, max_seconds: float = 600) -> SiteProcesses:
        logs = [log] if processes == 1 else [
            log.with_name(f"{log.stem}-{i}{log.suffix}") for i in range(1, processes + 1)]
        return cls(site, [(start_site(site, scheme, trade_date, env, lg, max_seconds), lg)
                          for lg in logs])

    def poll(self) -> int | None:
        """None while any process runs (the site is alive), else the first exit code."""
        codes = [p.poll() for p, _ in self.procs]
        return None if any(c is None for c in codes) else codes[0]

    def send_signal(self, sig: int) -> None:
        for p, _ in self.procs:
            if p.poll() is None:
                p.send_signal(sig)

    def wait(self, timeout: float) -> None:
        for p, _ in self.procs:
            p.wait(timeout=timeout)

    def results(self, what: str, timeout: float) -> list[dict[str, Any]]:
        """Each process's JSON summary; raises if any failed or overran."""
        return [wait(p, f"{what} ({lg.name})", lg, timeout) for p, lg in self.procs]
