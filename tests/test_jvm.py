"""The close's driver JVM (settlement.spark.jvm): its options, the class archive's life cycle
(claimed by one close, written under a temporary name, installed only after a clean exit),
and a real Spark driver that builds the archive and a second one that maps it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from settlement.config import load_settings
from settlement.spark import jvm as J
from settlement.spark.session import LARGE_DAY, SMALL_DAY, is_small_day, quick_jit

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def jars(tmp_path: Path) -> list[Path]:
    out = []
    for name in ("a-1.0.jar", "b-2.0.jar"):
        p = tmp_path / name
        p.write_bytes(b"jar " + name.encode())
        out.append(p)
    return out


def test_small_day_gets_the_quick_compiler_and_warnings_on_stderr(tmp_path, jars):
    small = J.driver_jvm(None, jars, quick_jit=True)
    large = J.driver_jvm(None, jars, quick_jit=False)
    assert J.QUICK_JIT in small.options and J.QUICK_JIT not in large.options
    # stdout carries a close's --json summary: the JVM's own warnings must not go there
    for d in (small, large):
        assert d.options[:2] == J.WARNINGS_TO_STDERR and d.archive == "off"


def test_small_day_threshold():
    s = load_settings(spark_small_day_rows=1000)
    assert is_small_day(s, 1000) and not is_small_day(s, 1001) and not is_small_day(s, None)
    assert not is_small_day(load_settings(spark_small_day_rows=0), 1)
    assert SMALL_DAY.keys() == LARGE_DAY.keys()  # a reused session is always set back


def test_quick_compiler_threshold():
    # The quick compiler alone up to spark_quick_jit_rows (a small day always), C2 beyond
    # it and when the day's size is not known (the DAG's spark-submit).
    s = load_settings(spark_small_day_rows=1000, spark_quick_jit_rows=5000)
    assert quick_jit(s, 1000) and quick_jit(s, 5000)
    assert not quick_jit(s, 5001) and not quick_jit(s, None)
    assert quick_jit(load_settings(spark_small_day_rows=1000, spark_quick_jit_rows=0), 1000)


def test_first_close_builds_the_next_maps(tmp_path, jars):
    folder = tmp_path / "jvm"
    first = J.driver_jvm(folder, jars, quick_jit=False)
    assert first.archive == "building" and first.building is not None
    assert f"-XX:ArchiveClassesAtExit={first.building}" in first.options
    assert first.building != first.archive_path  # never written where readers look
    # a second close meanwhile neither waits nor writes: it runs without an archive
    second = J.driver_jvm(folder, jars, quick_jit=False)
    assert second.archive == "off" and not any("Archive" in o for o in second.options)
    # the building JVM exits cleanly after writing its file: installed, lock released
    proc = subprocess.Popen(["sh", "-c", f"cat >/dev/null; printf cds > '{first.building}'"],
                            stdin=subprocess.PIPE)
    assert J.install_archive(first, proc)
    assert first.archive_path is not None and first.archive_path.read_text() == "cds"
    assert not Path(f"{first.archive_path}.lock").exists() and not first.building.exists()
    third = J.driver_jvm(folder, jars, quick_jit=False)
    assert third.archive == "used"
    assert f"-XX:SharedArchiveFile={first.archive_path}" in third.options


def test_a_jvm_that_fails_installs_nothing(tmp_path, jars):
    folder = tmp_path / "jvm"
    d = J.driver_jvm(folder, jars, quick_jit=False)
    assert d.building is not None and d.archive_path is not None
    proc = subprocess.Popen(["sh", "-c", f"cat >/dev/null; printf half > '{d.building}'; exit 3"],
                            stdin=subprocess.PIPE)
    assert not J.install_archive(d, proc)
    assert not d.archive_path.exists() and not d.building.exists()
    # the lock is released: the next close tries again
    assert J.driver_jvm(folder, jars, quick_jit=False).archive == "building"


def test_a_stale_lock_is_taken_over(tmp_path, jars):
    folder = tmp_path / "jvm"
    d = J.driver_jvm(folder, jars, quick_jit=False)
    assert d.archive_path is not None
    lock = Path(f"{d.archive_path}.lock")
    old = time.time() - J.STALE_LOCK_SECONDS - 5
    os.utime(lock, (old, old))
    assert J.driver_jvm(folder, jars, quick_jit=False).archive == "building"


def test_key_follows_the_jars_and_old_archives_go(tmp_path, jars):
    java = J.java_binary()
    assert java is not None
    before = J.archive_key(java, jars)
    jars[0].write_bytes(b"another build of a")
    assert J.archive_key(java, jars) != before
    folder = tmp_path / "jvm"
    folder.mkdir()
    stale = folder / f"{J.PREFIX}0000000000000000.jsa"
    stale.write_text("old")
    d = J.driver_jvm(folder, jars, quick_jit=False)
    assert d.archive == "building" and not stale.exists()


def test_no_archive_with_files_in_the_conf_folder(tmp_path, jars):
    conf = tmp_path / "conf"
    conf.mkdir()
    assert J.driver_jvm(tmp_path / "jvm", jars, False, conf).archive == "building"
    (tmp_path / "jvm").joinpath(os.listdir(tmp_path / "jvm")[0]).unlink()  # the lock
    (conf / "spark-defaults.conf").write_text("spark.x 1\n")
    assert J.driver_jvm(tmp_path / "jvm2", jars, False, conf).archive == "off"


SESSION = """
import json, sys
from settlement.config import load_settings
from settlement.spark.jvm import allow_building
from settlement.spark.session import build_session
if sys.argv[1] == "close":
    allow_building()
info = {}
spark = build_session(load_settings(), day_rows=10, jvm_info=info)
assert spark.range(1000).selectExpr("sum(id) as s").first()["s"] == 499500
print(json.dumps(info))
"""


def _driver(env: dict[str, str], kind: str = "close") -> dict[str, object]:
    res = subprocess.run([sys.executable, "-c", SESSION, kind], env=env, capture_output=True,
                         text=True, timeout=300, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-3000:]
    # the JVM's stdout is the process's: nothing of it may follow the summary line
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_a_real_driver_builds_the_archive_and_the_next_maps_it(tmp_path):
    env = {**os.environ, "SETTLE_JARS_DIR": str(tmp_path / "jars")}
    env.pop("SPARK_CONF_DIR", None)
    # a process that is not one close (a test run, the demo) never builds: it would hold
    # the lock until its own exit
    assert _driver(env, "session")["jvm_class_archive"] == "off"
    assert not (tmp_path / "jvm").exists() or not list((tmp_path / "jvm").iterdir())
    first = _driver(env)
    assert first == {"small_day": True, "jvm_class_archive": "building", "jvm_quick_jit": True}
    archives = list((tmp_path / "jvm").glob("*.jsa"))
    assert len(archives) == 1 and archives[0].stat().st_size > 10_000_000
    assert not list((tmp_path / "jvm").glob("*.lock")) and not list(
        (tmp_path / "jvm").glob("*.tmp"))
    log = tmp_path / "classes.log"
    env["SPARK_SUBMIT_OPTS"] = (env.get("SPARK_SUBMIT_OPTS", "")
                                + f" -Xlog:class+load=info:file={log}").strip()
    second = _driver(env)
    assert second["jvm_class_archive"] == "used"
    spark_classes = [ln for ln in log.read_text().splitlines()
                     if " org.apache.spark.sql.SparkSession " in ln]
    # Spark's classes came out of the archive, not out of its jars
    assert spark_classes and "shared objects file (top)" in spark_classes[0], spark_classes


def test_a_jvm_that_never_started_releases_the_lock(tmp_path, jars):
    """build_session's getOrCreate failed: no JVM will write the archive."""
    folder = tmp_path / "jvm"
    d = J.driver_jvm(folder, jars, quick_jit=False)
    assert d.archive == "building" and d.archive_path is not None
    assert not J.finish_archive(d, exited_cleanly=False)
    assert not Path(f"{d.archive_path}.lock").exists() and not d.archive_path.exists()
    assert J.driver_jvm(folder, jars, quick_jit=False).archive == "building"


def test_the_setup_warm_up_says_why_it_builds_nothing(tmp_path):
    """`make setup`'s warm-up (settlement.spark.warmup) never fails the setup: with one of its
    ports taken it starts nothing and says which port and what happens instead."""
    import socket

    from settlement.spark import warmup

    settings = load_settings(jars_dir=tmp_path / "jars", state_dir=tmp_path / "state")
    assert not warmup.archive_present(settings)
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", warmup.PORTS["SETTLE_PG_PORT"]))
        listener.listen()
        said = warmup.build(settings)
    assert said == ("not built: pg_port 26432 in use on 127.0.0.1; the first close builds it "
                    "instead")
    assert not (tmp_path / "state").exists()
    off = load_settings(jars_dir=tmp_path / "jars", spark_class_archive=False)
    assert "nothing to build" in warmup.build(off)


def test_a_session_started_beside_the_choice_is_handed_over_only_once_started(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A cold close starts its JVM beside the source's choice when the close markers size
    the day; a choice made before the markers answered takes no early session, and none
    starts after it (two JVMs in one close would fight for the cores)."""
    import threading

    import settlement.eod.sources as sources
    import settlement.spark.session as session
    from settlement.close.pipeline import _EarlySession

    built: list[int | None] = []
    answer = threading.Event()
    rows = {"n": 0}

    def marked(_settings: object, _day: str) -> int:
        assert answer.wait(10)
        return rows["n"]

    def build(_settings: object, _name: str, day_rows: int | None = None,
              jvm_info: dict[str, object] | None = None) -> str:
        built.append(day_rows)
        return "session"

    monkeypatch.setattr(sources, "marked_rows", marked)
    monkeypatch.setattr(session, "build_session", build)
    monkeypatch.setattr(session, "starts_a_jvm", lambda: True)
    settings = load_settings()

    def started(n: int, choice_first: bool) -> tuple[object, dict[str, object]]:
        rows["n"] = n
        answer.clear()
        timings: dict[str, float] = {}
        jvm: dict[str, object] = {}
        early = _EarlySession.start(settings, "2026-11-24", timings, jvm)
        assert early is not None
        if not choice_first:
            answer.set()
            deadline = time.monotonic() + 10
            while n and not built and time.monotonic() < deadline:
                time.sleep(0.01)
        taken = early.session()
        answer.set()
        time.sleep(0.2)  # the thread, had it gone on, would have built by now
        return (None if taken is None else taken.result(5)), jvm

    assert started(2_000_000, choice_first=False) == (
        "session", {"sized_by_close_markers": 2_000_000})
    assert built == [2_000_000]
    built.clear()
    assert started(2_000_000, choice_first=True) == (None, {})  # the choice came first
    assert started(0, choice_first=False) == (None, {})  # no ledger has the day's markers
    assert built == []
