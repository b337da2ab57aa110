"""The Docker engine and Compose v2, made available on a machine that has neither running.

The engine is Debian's ``docker.io``, started as root without a bridge, iptables or
masquerading: every container of the stack uses host networking, so all traffic stays on
127.0.0.1 and nothing is ever routed onto a private bridge range. Compose v2 is built once
from the Go module proxy (the only place this machine class can fetch it from) and cached
under ``.cache``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from settlement.errors import ServiceError

COMPOSE_VERSION = "v2.40.3"
Log = Callable[[str], None]
DOCKERD_ARGS = ["--bridge=none", "--iptables=false", "--ip-masq=false"]


def run(cmd: list[str], *, check: bool = True, capture: bool = True, timeout: float = 600,
        env: dict[str, str] | None = None,
        cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """A command whose failure names the command and the end of its output."""
    try:
        proc = subprocess.run(cmd, capture_output=capture, text=True, timeout=timeout, env=env,
                              cwd=cwd, check=False)
    except FileNotFoundError:
        raise ServiceError(f"{cmd[0]}: not found") from None
    except subprocess.TimeoutExpired:
        raise ServiceError(f"{' '.join(cmd[:4])}...: no answer in {timeout:.0f} s") from None
    if check and proc.returncode != 0:
        tail = ((proc.stderr or "") + (proc.stdout or "")).strip().splitlines()[-15:]
        raise ServiceError(f"{' '.join(cmd[:5])} failed (exit {proc.returncode}):\n"
                           + "\n".join(tail))
    return proc


def engine_answers() -> bool:
    if shutil.which("docker") is None:
        return False
    return run(["docker", "info", "--format", "{{.ServerVersion}}"], check=False,
               timeout=20).returncode == 0


def _apt_install(*packages: str) -> None:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    run(["apt-get", "update", "-qq"], env=env, timeout=300)
    run(["apt-get", "install", "-y", "-qq", *packages], env=env, timeout=600)


def ensure_engine(state: Path, log: Log) -> None:
    """A Docker engine that answers: the running one, else Debian's started here (root)."""
    if engine_answers():
        return
    if os.geteuid() != 0:
        raise ServiceError(
            "no Docker engine answers and starting one needs root: run `make stack-up` as "
            "root, or start dockerd yourself (with --bridge=none --iptables=false "
            "--ip-masq=false) and give this user access to its socket")
    missing = [pkg for pkg, binary in (("docker.io", "dockerd"), ("debootstrap", "debootstrap"))
               if shutil.which(binary) is None]
    if missing:
        log(f"installing {', '.join(missing)} from Debian's packages...")
        _apt_install(*missing)
    if shutil.which("docker") is None:
        raise ServiceError("docker.io installed but no `docker` client on PATH")
    state.mkdir(parents=True, exist_ok=True)
    log("starting dockerd (no bridge, no iptables: containers use host networking)...")
    with open(state / "dockerd.log", "ab") as out:
        proc = subprocess.Popen(["dockerd", *DOCKERD_ARGS], stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    # Ours to stop (`make stack-down`); an engine someone else runs is left alone.
    (state / "dockerd.pid").write_text(f"{proc.pid}\n")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if engine_answers():
            return
        time.sleep(0.5)
    raise ServiceError(f"dockerd did not answer in 60 s; see {state / 'dockerd.log'}")


def compose_binary(cache: Path, log: Log) -> list[str]:
    """The command that runs Compose v2: the installed plugin, else one built here."""
    if run(["docker", "compose", "version"], check=False, timeout=20).returncode == 0:
        return ["docker", "compose"]
    binary = cache / f"docker-compose-{COMPOSE_VERSION}"
    if binary.exists():
        return [str(binary)]
    go = shutil.which("go") or ("/usr/local/go/bin/go" if Path("/usr/local/go/bin/go").exists()
                                else None)
    if go is None:
        raise ServiceError("Compose v2 is not installed and Go is not there to build it: "
                           "install the docker-compose-plugin, or Go 1.24+")
    log(f"building Compose {COMPOSE_VERSION} from the Go module proxy (about 3 minutes, once)...")
    work = cache / "compose-build"
    work.mkdir(parents=True, exist_ok=True)
    if not (work / "go.mod").exists():
        run([go, "mod", "init", "composebuild"], cwd=work)
    # `go install pkg@version` refuses this module (its go.mod has exclude directives).
    run([go, "get", f"github.com/docker/compose/v2/cmd@{COMPOSE_VERSION}"], cwd=work, timeout=900)
    # A guard against a hang, not a budget: `make test` builds this at the lowest priority
    # beside the test suite, where on two busy cores a fresh machine's compile took more than
    # 900 s, and a build killed there is compiled again in the stack phase.
    run([go, "build", "-o", str(binary), "github.com/docker/compose/v2/cmd"], cwd=work,
        timeout=3600)
    return [str(binary)]


def stop_engine_if_ours(state: Path, log: Log) -> bool:
    """Stop the dockerd that ensure_engine started (its images stay in /var/lib/docker)."""
    pidfile = state / "dockerd.pid"
    if not pidfile.exists():
        return False
    pid = int(pidfile.read_text().strip())
    pidfile.unlink()
    try:
        os.kill(pid, 15)
    except ProcessLookupError:
        return False
    log("stopping the dockerd this project started...")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.3)
    os.kill(pid, 9)
    return True
