"""The close's JVM class archive built during ``make setup`` (issue 61, item 4), so that a
fresh clone's first close starts as fast as its later ones.

A close builds the archive (settlement.spark.jvm) when none matches its JVM and class path,
and pays for it: its JVM loads every class from the jars and writes about 160 MB at its exit.
Measured on a 2,000-trade day from Kafka in a fresh checkout: the first close 24.1 s as a
process, the next 7.8 s. The archive must hold what a close loads, so the way to get it
without a user's close paying is a close: this module starts embedded services of its own
(a temporary state folder, ports of its own), publishes a small day with replays and a
malformed message, closes it from Kafka with ``settle eod`` (a close process, the one kind
allowed to build the archive), and removes everything but the archive.

It is an optimisation, so it never fails ``make setup``: when it cannot run (a port taken, no
Java) it says why and the first close builds the archive as before.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from settlement.config import Settings

# Ports no other part of the project uses: `make up` 19092/19192/15432, the tests
# 29092/29192/25432, the stack 27xxx-28xxx. Below Linux's ephemeral range (32768-60999).
PORTS = {"SETTLE_KAFKA_PORT": 26092, "SETTLE_KAFKA_CONTROLLER_PORT": 26192,
         "SETTLE_PG_PORT": 26432}
DAY = "2026-01-05"
TRADES = 1000
STEP_TIMEOUT = 300.0


def archive_present(settings: Settings) -> bool:
    """True when a close's driver JVM would map an archive now (none is built here)."""
    from settlement.spark.session import plan_driver_jvm, spark_jars

    return plan_driver_jvm(settings, spark_jars(settings), quick_jit=True,
                           may_build=False).archive == "used"


def _port_taken(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _say(text: str) -> None:
    print(f"jvm-archive: {text}", file=sys.stderr, flush=True)


def _settle_cmd(*args: str) -> list[str]:
    """This environment's `settle` (beside its Python) with ``args``."""
    return [str(Path(sys.executable).with_name("settle")), *args]


def _settle(env: dict[str, str], *args: str) -> None:
    """One `settle` command of the warm-up; its output only when it fails."""
    done = subprocess.run(_settle_cmd(*args), env=env, capture_output=True, text=True,
                          timeout=STEP_TIMEOUT, check=False)
    if done.returncode != 0:
        tail = (done.stdout + done.stderr).strip()[-2000:]
        raise RuntimeError(f"`settle {' '.join(args)}` exited {done.returncode}: {tail}")


def build(settings: Settings) -> str:
    """Build the archive with a close on throw-away services; what happened, in a line."""
    if not settings.spark_class_archive:
        return "class archives are off (SETTLE_SPARK_CLASS_ARCHIVE=false): nothing to build"
    if archive_present(settings):
        return "the close's class archive is already built"
    taken = [f"{name.removeprefix('SETTLE_').lower()} {port}" for name, port in PORTS.items()
             if _port_taken(port)]
    if taken:
        return (f"not built: {', '.join(taken)} in use on 127.0.0.1; the first close builds "
                "it instead")
    t0 = time.monotonic()
    # Under the state folder, as the tests' services: the server runs as an unprivileged
    # user when this is root, and a private temporary folder would shut it out.
    work = settings.state_dir / "jvm-archive"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    env = {**os.environ, **{k: str(v) for k, v in PORTS.items()},
           "SETTLE_STATE_DIR": str(work / "state"), "SETTLE_REPORTS_DIR": str(work / "reports"),
           "SETTLE_GX_DIR": str(work / "gx"), "SETTLE_KAFKA_BROKERS": "1",
           "SETTLE_JARS_DIR": str(settings.jars_dir)}
    shutil.copytree(settings.gx_project_dir, work / "gx")
    try:
        _say("starting throw-away embedded services...")
        _settle(env, "services", "up")
        _settle(env, "db", "migrate")
        _settle(env, "simulate", "--date", DAY, "--trades", str(TRADES), "--dup-rate", "0.01",
                "--bad-rate", "0.002")
        _say(f"closing a {TRADES}-trade day from Kafka (its JVM writes the archive)...")
        _settle(env, "eod", "--date", DAY, "--source", "kafka", "--quiet")
    except (RuntimeError, subprocess.TimeoutExpired, OSError) as exc:
        return f"not built ({exc}); the first close builds it instead"
    finally:
        subprocess.run(_settle_cmd("services", "down"), env=env, capture_output=True,
                       timeout=STEP_TIMEOUT, check=False)
        shutil.rmtree(work, ignore_errors=True)
    if not archive_present(settings):
        return "not built: the close ended without writing it; the first close builds it"
    return f"built in {time.monotonic() - t0:.0f} s"


def main() -> int:
    _say(build(Settings()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
