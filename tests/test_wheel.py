"""The wheel works outside the checkout: sql/ and gx/ ship inside it, and the installed
``settle`` regenerates the schema from the packaged migrations.

Builds the wheel, installs it with its dependencies into a fresh virtual environment, and
runs that environment's ``settle`` from a directory outside the checkout against the suite's
embedded PostgreSQL.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from settlement.config import Settings

ROOT = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.services, pytest.mark.slow]


def _uv() -> str:
    local = ROOT / ".tools" / "bin" / "uv"
    found = str(local) if local.is_file() else shutil.which("uv")
    if not found:
        pytest.skip("uv is not available")
    return found


def _run(cmd: list[str | Path], *, cwd: Path, env: dict[str, str],
         timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout, check=False)


def _ok(res: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert res.returncode == 0, f"{res.args} exited {res.returncode}\n{res.stdout}\n{res.stderr}"
    return res


def _last_json(stdout: str) -> dict:
    return json.loads(stdout.strip().splitlines()[-1])


def _body(schema: str) -> list[str]:
    """schema.sql without its header comment lines."""
    lines = schema.splitlines()
    while lines and (lines[0].startswith("--") or not lines[0].strip()):
        lines.pop(0)
    return lines


def _clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without anything pointing Python at the checkout, nor
    the per-worker folders the suite's conftest sets (the installed copy finds its own)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSAFEPATH",
                        "SETTLE_GX_DIR", "SETTLE_REPORTS_DIR")}
    env["UV_PYTHON_DOWNLOADS"] = "never"
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if not p.startswith(str(ROOT)))
    env.update(extra)
    return env


_PROBE = """
import json, sysconfig
from importlib.metadata import entry_points
import settlement
from settlement.config import PACKAGED_RESOURCES, resource_dir, running_from_checkout
from settlement.db import MIGRATIONS_DIR, SQL_DIR
gx = resource_dir("gx")
print(json.dumps({
    "settlement": settlement.__file__,
    "purelib": sysconfig.get_paths()["purelib"],
    "checkout": running_from_checkout(),
    "packaged": str(PACKAGED_RESOURCES),
    "sql_dir": str(SQL_DIR),
    "migrations": sorted(p.name for p in MIGRATIONS_DIR.glob("*.sql")),
    "queries": sorted(p.name for p in (SQL_DIR / "queries").glob("*.sql")),
    "gx_dir": str(gx),
    "gx_files": sorted(str(p.relative_to(gx)) for p in gx.rglob("*") if p.is_file()),
    "airflow_plugins": sorted(ep.value for ep in entry_points(group="airflow.plugins")),
}))
"""

_GX_PROBE = """
import json
from settlement.config import load_settings
from settlement.validation.run import get_context
ctx = get_context()
print(json.dumps({"root": str(ctx.root_directory),
                  "expected": str(load_settings().gx_project_dir),
                  "suites": sorted(s.name for s in ctx.suites.all())}))
"""


def test_installed_wheel_runs_db_schema_outside_checkout(
        services: Settings, tmp_path: Path) -> None:
    uv = _uv()
    env = _clean_env()
    timings: dict[str, float] = {}

    # 1. Build the wheel from the checkout.
    t0 = time.monotonic()
    dist = tmp_path / "dist"
    _ok(_run([uv, "build", "--wheel", "--out-dir", dist, ROOT], cwd=tmp_path, env=env))
    wheels = list(dist.glob("*.whl"))
    assert len(wheels) == 1, wheels
    timings["build"] = time.monotonic() - t0

    # 2. A fresh virtual environment with the wheel and its dependencies, pinned to the lock
    #    file's versions. The cache is normally warm: offline first, then the index.
    venv = tmp_path / "venv"
    _ok(_run([uv, "venv", "--python", "3.11", venv], cwd=tmp_path, env=env))
    py = venv / "bin" / "python"
    install = [uv, "pip", "install", "--python", py, wheels[0]]
    constraints = tmp_path / "constraints.txt"
    exported = _run([uv, "export", "--frozen", "--no-dev", "--no-hashes", "--no-emit-project",
                     "--no-header", "-q", "-o", constraints], cwd=ROOT, env=env)
    if exported.returncode == 0:
        install += ["--constraint", constraints]
    t0 = time.monotonic()
    res = _run([*install, "--offline"], cwd=tmp_path, env=env)
    if res.returncode != 0:
        res = _run(install, cwd=tmp_path, env=env, timeout=900)
    _ok(res)
    timings["install"] = time.monotonic() - t0

    # 3. Inside that environment, settlement is the installed copy, with its resources.
    probe = _last_json(_ok(_run([py, "-c", _PROBE], cwd=tmp_path, env=env)).stdout)
    purelib = Path(probe["purelib"]).resolve()
    assert Path(probe["settlement"]).resolve().is_relative_to(purelib), probe
    assert not Path(probe["settlement"]).resolve().is_relative_to(ROOT.resolve()), probe
    assert probe["checkout"] is False
    assert probe["sql_dir"] == str(Path(probe["packaged"]) / "sql")
    assert Path(probe["sql_dir"]).resolve().is_relative_to(purelib)
    assert probe["migrations"] == sorted(p.name for p in (ROOT / "sql/migrations").glob("*.sql"))
    assert probe["queries"] == sorted(p.name for p in (ROOT / "sql/queries").glob("*.sql"))
    # Every Airflow component finds the plugin (reports pages, trading-day timetable) here.
    assert "settlement.orchestration.plugin:SettlementPlugin" in probe["airflow_plugins"]
    assert Path(probe["gx_dir"]).resolve().is_relative_to(purelib)
    gx_files = set(probe["gx_files"])
    assert "great_expectations.yml" in gx_files
    for sub in ("expectations", "validation_definitions", "checkpoints"):
        shipped = {f"{sub}/{p.name}" for p in (ROOT / "gx" / sub).glob("*.json")}
        assert shipped and shipped <= gx_files, (sub, shipped - gx_files)
    assert not any(f.startswith("uncommitted") for f in gx_files)

    # 4. `settle db schema` from outside the checkout, against the suite's PostgreSQL.
    settle = venv / "bin" / "settle"
    run_env = _clean_env(SETTLE_STATE_DIR=str(services.state_dir),
                         SETTLE_PG_PORT=str(services.pg_port))
    out = tmp_path / "schema.sql"
    t0 = time.monotonic()
    res = _ok(_run([settle, "db", "schema", "--output", out, "--json"], cwd=tmp_path,
                   env=run_env))
    timings["db schema"] = time.monotonic() - t0
    result = _last_json(res.stdout)
    assert result["ok"] is True and Path(result["schema_file"]).resolve() == out.resolve()
    assert _body(out.read_text()) == _body((ROOT / "sql" / "schema.sql").read_text())

    # Without --output there is no checkout to regenerate: a clear error, nothing written.
    res = _run([settle, "db", "schema", "--json"], cwd=tmp_path, env=run_env)
    assert res.returncode == 2, res.stderr
    assert "--output" in _last_json(res.stdout)["error"]

    # 5. The GX project is seeded into the state dir, never written into site-packages.
    state = tmp_path / "state"
    res = _ok(_run([py, "-c", _GX_PROBE], cwd=tmp_path,
                   env=_clean_env(SETTLE_STATE_DIR=str(state), GX_ANALYTICS_ENABLED="false")))
    gx = _last_json(res.stdout)
    assert Path(gx["root"]).resolve() == (state / "gx").resolve() == Path(gx["expected"])
    assert {p.stem for p in (ROOT / "gx" / "expectations").glob("*.json")} <= set(gx["suites"])
    assert not (Path(probe["gx_dir"]) / "uncommitted").exists()

    print(f"\nwheel test timings (s): {json.dumps({k: round(v, 1) for k, v in timings.items()})}",
          file=sys.stderr)
