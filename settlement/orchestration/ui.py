"""`make airflow`: Airflow's UI on the project's DAGs and the embedded services.

Runs ``airflow standalone`` (SQLite metadata, the simple auth manager, parallelism sized
for two cores) with the Airflow connections pointing at the embedded Kafka, PostgreSQL and
a ``local[2]`` Spark master, then prints the URL and the login.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from settlement.config import REPO_ROOT, Settings, load_settings
from settlement.orchestration.dagtest import prepare_metadata
from settlement.orchestration.tasks import airflow_connections
from settlement.services.procs import port_open

USER = "admin"


def airflow_env(settings: Settings, home: Path, port: int) -> dict[str, str]:
    bin_dir = str(Path(sys.executable).parent)
    return {
        **os.environ,
        **airflow_connections(settings),
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO_ROOT / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        # Two cores: a few task slots; more would only make Spark and the sites fight.
        "AIRFLOW__CORE__PARALLELISM": "4",
        "AIRFLOW__CORE__MAX_ACTIVE_TASKS_PER_DAG": "2",
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{USER}:admin",
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}",
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "30",
        "GX_ANALYTICS_ENABLED": "false",
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
    }


def password(home: Path) -> str | None:
    f = home / "simple_auth_manager_passwords.json.generated"
    try:
        return json.loads(f.read_text()).get(USER)
    except (FileNotFoundError, ValueError):
        return None


def start(settings: Settings, home: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    home.mkdir(parents=True, exist_ok=True)
    env = airflow_env(settings, home, port)
    prepare_metadata(env, log)
    out = open(log, "ab")
    return subprocess.Popen([str(Path(sys.executable).parent / "airflow"), "standalone"],
                            env=env, stdout=out, stderr=subprocess.STDOUT,
                            start_new_session=True)


def wait_ready(proc: subprocess.Popen[bytes], home: Path, port: int, timeout: float = 300
               ) -> str:
    """Block until the API server answers and the login exists; returns the password."""
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"airflow standalone exited with {proc.returncode}")
        pw = password(home)
        if pw and port_open(port):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v2/monitor/health",
                                            timeout=5) as r:
                    if r.status == 200:
                        return pw
            except OSError:
                pass
        time.sleep(1)
    raise RuntimeError(f"Airflow did not become ready on port {port} within {timeout:.0f}s")


def main() -> int:
    from settlement import services
    from settlement.db import migrate_all

    settings = load_settings()
    services.up(settings)
    migrate_all(settings)
    home = settings.state_dir / "airflow"
    port = int(os.environ.get("AIRFLOW_PORT", "8080"))
    log = settings.state_dir / "airflow.log"
    print(f"starting airflow standalone (log: {log})...", flush=True)
    proc = start(settings, home, port, log)
    try:
        pw = wait_ready(proc, home, port)
        print(f"\n  Airflow UI: http://127.0.0.1:{port}\n  login: {USER} / {pw}\n"
              "  DAGs: eod_settlement, failover_drill (unpause, or trigger with parameters)\n"
              f"  Audit reports: Browse > Audit reports (http://127.0.0.1:{port}/plugin/"
              "audit-reports)\n"
              "  Ctrl-C stops Airflow; `make down` stops Kafka and PostgreSQL.\n", flush=True)
        return proc.wait()
    except KeyboardInterrupt:
        return 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 15)
            proc.wait(timeout=60)


if __name__ == "__main__":
    sys.exit(main())
