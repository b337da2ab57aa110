"""Background processes owned by this project: pid files, port checks, readiness waits.

``settle services down`` must stop only what ``up`` started, so every process we start is
recorded in a pid file together with a marker string that must appear in its command line;
a stale pid reused by an unrelated process is never signalled.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from settlement.errors import ServiceError


@dataclass(frozen=True)
class PidFile:
    path: Path

    def write(self, pid: int, marker: str) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps({"pid": pid, "marker": marker}))

    def read(self) -> tuple[int, str] | None:
        try:
            data = json.loads(self.path.read_text())
            return int(data["pid"]), str(data["marker"])
        except (FileNotFoundError, ValueError, KeyError):
            return None

    def alive_pid(self) -> int | None:
        """The recorded pid if that process still runs and is still ours."""
        rec = self.read()
        if rec is None:
            return None
        pid, marker = rec
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            stat = Path(f"/proc/{pid}/stat").read_text()
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            return None
        # A zombie (state Z) has exited; it only waits for its parent to reap it.
        if stat.rsplit(")", 1)[-1].split()[0] == "Z":
            return None
        return pid if marker in cmdline else None

    def clear(self) -> None:
        self.path.unlink(missing_ok=True)


def port_open(port: int, host: str = "127.0.0.1", timeout: float = 0.3) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def port_free(port: int) -> bool:
    """Whether a server could listen on 127.0.0.1:port now (as the servers bind: with
    SO_REUSEADDR, so a closed connection's TIME_WAIT does not count as taken)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def ensure_port_free(port: int, setting: str) -> None:
    if not port_free(port):
        raise ServiceError(
            f"port 127.0.0.1:{port} is already taken by another program; stop it or set "
            f"{setting} to a free port"
        )


def wait_until(
    check: Callable[[], bool],
    timeout: float,
    what: str,
    log: Path | None = None,
    alive: Callable[[], bool] | None = None,
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        if alive is not None and not alive():
            raise ServiceError(f"{what} exited during start-up{_tail(log)}")
        time.sleep(0.2)
    raise ServiceError(f"{what} did not become ready within {timeout:.0f}s{_tail(log)}")


def _tail(log: Path | None, lines: int = 15) -> str:
    if log is None or not log.exists():
        return ""
    text = log.read_text(errors="replace").splitlines()[-lines:]
    return f"; last lines of {log}:\n    " + "\n    ".join(text)


def spawn(
    argv: Sequence[str],
    log: Path,
    pidfile: PidFile,
    marker: str,
    env: dict[str, str] | None = None,
    user: int | None = None,
    group: int | None = None,
) -> subprocess.Popen[bytes]:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            list(argv),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            user=user,
            group=group,
            # Own session: a Ctrl-C in the terminal that ran `up` must not kill services.
            start_new_session=True,
        )
    pidfile.write(proc.pid, marker)
    return proc


def terminate(pidfile: PidFile, timeout: float = 30.0, sig: int = signal.SIGTERM) -> bool:
    """Stop the recorded process: ``sig``, then SIGKILL after ``timeout``."""
    return terminate_all([pidfile], timeout, sig)


def terminate_all(pidfiles: Sequence[PidFile], timeout: float = 30.0,
                  sig: int = signal.SIGTERM) -> bool:
    """Stop the recorded processes together: ``sig`` to each, then SIGKILL to any still
    running after ``timeout``. True if any was running."""
    pids: dict[int, PidFile] = {}
    for pidfile in pidfiles:
        pid = pidfile.alive_pid()
        if pid is None:
            pidfile.clear()
            continue
        _signal(pid, sig)
        pids[pid] = pidfile

    def running() -> list[int]:
        return [pid for pid, f in pids.items() if f.alive_pid() == pid]

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and running():
        time.sleep(0.1)
    left = running()
    for pid in left:
        _signal(pid, signal.SIGKILL)
    if left:
        time.sleep(0.2)
    for f in pids.values():
        f.clear()
    return bool(pids)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass  # it exited between the check and the signal: what we wanted


def write_private(path: Path, text: str) -> None:
    """Create or replace ``path`` readable by its owner only, from the first byte (never
    written with the default umask and chmod'ed after)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)
