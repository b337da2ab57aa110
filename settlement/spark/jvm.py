"""The driver JVM's start-up options: a class archive of Spark's classes, and the quick
compiler alone for a day too short to pay C2 back.

A close is a process of its own, so every close starts a JVM that loads and verifies some
twenty thousand classes of Spark, Catalyst, Netty and the connectors before its first job,
and compiles its hot methods twice (C1, then C2) on a machine whose other core is busy with
Python. Two JVM features remove most of that (docs/benchmarks.md, issue 44):

- **Class-data sharing** (AppCDS, JDK 13+): the first close records the classes it loaded
  into an archive at its JVM's exit (``-XX:ArchiveClassesAtExit``); every later close maps
  that archive (``-XX:SharedArchiveFile``) instead of reading, parsing and verifying those
  classes again. The JVM checks the archive against its own build and class path and ignores
  one that does not match (a close then just starts as it did before); the archive's name
  carries a key of the JVM and the jars, so an upgrade builds a new one.
- **The quick compiler alone** (``-XX:TieredStopAtLevel=1``) for a day of at most
  ``spark_quick_jit_rows`` rows (a small day always): C2's optimizing compiler pays off on a
  long run; on a shorter one it only competes with the work for the two cores (measured in
  docs/benchmarks.md: it pays back from about a million rows).

One close at a time builds the archive (a lock file, claimed atomically); it is written under
a temporary name while the JVM exits and renamed into place only once that JVM exited
cleanly, so a reader never maps a half-written archive.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

QUICK_JIT = "-XX:TieredStopAtLevel=1"
# The JVM prints its warnings (an archive it cannot map, say) to stdout by default, and a
# close's stdout carries its --json summary: they go to stderr.
WARNINGS_TO_STDERR = ("-Xlog:all=off:stdout", "-Xlog:all=warning:stderr")
# Writing the archive warns once per class it cannot hold (the signed Janino jar's, generated
# accessors): thousands of lines that say nothing an operator can act on.
QUIET_ARCHIVING = "-Xlog:cds*=off:stderr"
# A builder that died (killed, its host lost) leaves its lock behind; after this long the lock
# is another close's to take.
STALE_LOCK_SECONDS = 900.0
# How long a building close waits at its exit for its JVM to write the archive (about 10 s
# for the ~180 MB of a close's classes on the project's 2-core machine).
DUMP_WAIT_SECONDS = 180.0
PREFIX = "driver-"


_building_allowed = False


def allow_building() -> None:
    """This process is one close that ends when the close does (``settle eod``, the
    spark-submit job): a driver JVM it starts may build a missing archive, written at its
    exit. Other processes (a test run, the demo, a benchmark) only map one: an archive they
    built would come at their exit only, their lock keeping every close from building it
    meanwhile."""
    global _building_allowed
    _building_allowed = True


def building_allowed() -> bool:
    return _building_allowed


@dataclass(frozen=True)
class DriverJvm:
    """What ``driver_jvm`` decided: the options, and how the archive is used."""

    options: tuple[str, ...]
    archive: str  # "used" | "building" | "off"
    archive_path: Path | None = None
    building: Path | None = None  # the temporary file a building JVM writes at its exit

    def as_dict(self) -> dict[str, object]:
        return {"jvm_class_archive": self.archive,
                "jvm_quick_jit": QUICK_JIT in self.options}


def java_binary() -> Path | None:
    """The java spark-submit starts: $JAVA_HOME/bin/java, else the first on PATH."""
    home = os.environ.get("JAVA_HOME")
    found = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    return Path(found).resolve() if found and Path(found).exists() else None


def archive_key(java: Path, classpath: Sequence[Path]) -> str:
    """A digest of what an archive is valid for: the JVM's build (its libjvm) and each jar
    of the class path (path, size, modification time)."""
    lib = java.parent.parent / "lib" / "server" / "libjvm.so"
    h = hashlib.sha256()
    for p in [lib if lib.exists() else java, *classpath]:
        st = p.stat()
        h.update(f"{p}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:16]


def _claim(lock: Path) -> bool:
    """Take the right to build the archive, atomically; a stale lock is taken over once."""
    for _ in range(2):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            with contextlib.suppress(FileNotFoundError):
                if time.time() - lock.stat().st_mtime > STALE_LOCK_SECONDS:
                    lock.unlink()
                    continue
            return False
        except OSError:  # a read-only cache: closes run without an archive
            return False
        with os.fdopen(fd, "w") as f:
            f.write(f"{os.getpid()}\n")
        return True
    return False


def _prune(folder: Path, keep: Path) -> None:
    """Archives of other keys (an older JVM or Spark) and leftovers of failed builds."""
    for p in folder.glob(f"{PREFIX}*"):
        if p != keep and not p.name.endswith(".lock"):
            with contextlib.suppress(OSError):
                p.unlink()


def holds_files(folder: Path) -> bool:
    """True for a directory with anything in it."""
    try:
        return folder.is_dir() and any(folder.iterdir())
    except OSError:
        return False


def driver_jvm(folder: Path | None, classpath: Sequence[Path], quick_jit: bool,
               conf_dir: Path | None = None, may_build: bool = True) -> DriverJvm:
    """The driver's options, the quick compiler alone when ``quick_jit`` (the caller's
    ``settlement.spark.session.quick_jit``: a small day, or one of at most
    ``spark_quick_jit_rows`` rows).

    ``folder`` holds the archives (None: no archive). An existing archive for this JVM and
    class path is mapped; with none, this JVM builds it unless another close is building
    it already or ``may_build`` is False (see ``allow_building``). ``conf_dir`` is Spark's
    configuration folder, which spark-submit puts first on the class path: the JVM neither
    writes nor maps an archive while a directory on its class path holds files ("Cannot have
    non-empty directory in paths"), so then there is none."""
    options: list[str] = list(WARNINGS_TO_STDERR)
    if quick_jit:
        options.append(QUICK_JIT)
    java = java_binary()
    if folder is None or java is None or (conf_dir is not None and holds_files(conf_dir)):
        return DriverJvm(tuple(options), "off")
    archive = folder / f"{PREFIX}{archive_key(java, classpath)}.jsa"
    if archive.is_file():
        return DriverJvm((*options, f"-XX:SharedArchiveFile={archive}"), "used", archive)
    if not may_build:
        return DriverJvm(tuple(options), "off")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return DriverJvm(tuple(options), "off")
    if not _claim(Path(f"{archive}.lock")):
        return DriverJvm(tuple(options), "off")
    _prune(folder, archive)
    tmp = Path(f"{archive}.{os.getpid()}.tmp")
    return DriverJvm((*options, QUIET_ARCHIVING, f"-XX:ArchiveClassesAtExit={tmp}"),
                     "building", archive, tmp)


def install_archive(jvm: DriverJvm, proc: subprocess.Popen[bytes] | None,
                    stop: Callable[[], None] | None = None,
                    wait: float = DUMP_WAIT_SECONDS) -> bool:
    """For the close that builds the archive, at its exit: stop Spark (``stop``: its Python
    workers end quietly), end its JVM (it exits when its stdin closes, PySpark's gateway
    protocol), wait for it to write the archive, and rename that into place if the JVM exited
    cleanly. True when the archive was installed."""
    if jvm.building is None or jvm.archive_path is None:
        return False
    lock = Path(f"{jvm.archive_path}.lock")
    try:
        if proc is None:
            return False
        if stop is not None:
            with contextlib.suppress(Exception):
                stop()
        if proc.stdin is not None:
            with contextlib.suppress(OSError):
                proc.stdin.close()
        try:
            code = proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            return False
        return finish_archive(jvm, code == 0)
    finally:
        with contextlib.suppress(OSError):
            jvm.building.unlink()
        with contextlib.suppress(OSError):
            lock.unlink()


def finish_archive(jvm: DriverJvm, exited_cleanly: bool) -> bool:
    """Once the building JVM has exited (a spark-submit that returned, or after
    ``install_archive``'s wait): rename its archive into place if it exited cleanly and wrote
    one; release the lock either way. True when the archive was installed."""
    if jvm.building is None or jvm.archive_path is None:
        return False
    try:
        if exited_cleanly and jvm.building.is_file() and jvm.building.stat().st_size > 0:
            os.replace(jvm.building, jvm.archive_path)
            return True
        return False
    except OSError:
        return False
    finally:
        with contextlib.suppress(OSError):
            jvm.building.unlink()
        with contextlib.suppress(OSError):
            Path(f"{jvm.archive_path}.lock").unlink()


def install_at_exit(jvm: DriverJvm, proc: subprocess.Popen[bytes] | None,
                    stop: Callable[[], None] | None = None) -> None:
    """``install_archive`` when this interpreter exits (a close's last act)."""
    if jvm.building is not None:
        atexit.register(install_archive, jvm, proc, stop)
