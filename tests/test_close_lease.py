"""One close per trade date (issue 24): closes in separate processes on the real PostgreSQL
contend for a date's lease. A second close joins the first; a killed close is taken over at
once and recorded abandoned; a paused one loses its lease after it expires and can never
publish over the close that took over (SIGSTOP/SIGCONT, as the sites' fencing is tested)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from settlement.db import connect
from settlement.eod import lease as close_lease
from tests.helpers import ROOT

DAY = "2026-11-19"


def _worker(env: dict[str, str], go: Path, ttl: float = 30,
            mode: str = "") -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.lease_worker", DAY, str(go), mode], cwd=ROOT,
        env={**env, "SETTLE_CLOSE_LEASE_SECONDS": str(ttl)}, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)


def _line(proc: subprocess.Popen[str], timeout: float = 60) -> dict[str, Any]:
    """The worker's next JSON line (bounded: a reader thread, joined with a timeout)."""
    out: list[str] = []
    t = threading.Thread(target=lambda: out.append(proc.stdout.readline()))  # type: ignore[union-attr]
    t.start()
    t.join(timeout)
    assert out and out[0], f"no line from the worker in {timeout}s"
    return json.loads(out[0])


def _runs(dsn: str) -> dict[int, tuple[str, str | None]]:
    with connect(dsn) as conn:
        return {r: (s, e) for r, s, e in conn.execute(
            "select run_id, status, error from settlement_runs where trade_date = %s", (DAY,))}


def _published(dsn: str) -> int | None:
    with connect(dsn) as conn:
        row = conn.execute("select run_id from published_days where trade_date = %s",
                           (DAY,)).fetchone()
    return None if row is None else row[0]


def _acquire(settings: Any, **kw: Any) -> tuple[Any, list[str]]:
    said: list[str] = []
    got = close_lease.acquire(settings.for_component("settlement"), DAY,
                              ttl=kw.pop("ttl", 30), wait_seconds=kw.pop("wait", 60),
                              say=said.append)
    return got, said


def test_a_second_close_waits_and_joins_the_first(isolated, tmp_path: Path) -> None:
    go = tmp_path / "go"
    first = _worker(isolated.env, go)
    run = _line(first)["held"]
    threading.Timer(1.5, go.touch).start()
    t0 = time.monotonic()
    got, said = _acquire(isolated.settings)
    assert isinstance(got, close_lease.Joined), got
    assert got.run_id == run and time.monotonic() - t0 >= 1.0
    assert any("waiting for the close in progress" in s and f"run {run}" in s for s in said)
    assert _line(first)["published"] == run and first.wait(30) == 0
    # No second computation, no failed run: one run, succeeded and published.
    assert _runs(isolated.settings.settlement_dsn) == {run: ("succeeded", None)}
    assert _published(isolated.settings.settlement_dsn) == run


def test_a_killed_close_is_taken_over_at_once_and_recorded_abandoned(
        isolated, tmp_path: Path) -> None:
    from settlement.status import settlement_runs

    first = _worker(isolated.env, tmp_path / "never")
    run = _line(first)["held"]
    status = settlement_runs(isolated.settings.for_component("auditor"))
    [close] = [c for c in status["closes_in_progress"] if c["trade_date"] == DAY]
    assert close["run_id"] == run and f"pid {first.pid}" in close["holder"]
    first.send_signal(signal.SIGKILL)
    first.wait(10)
    t0 = time.monotonic()
    got, _ = _acquire(isolated.settings)
    try:
        # The server freed the lock with the dead session: no expiry to wait for.
        assert isinstance(got, close_lease.Lease) and time.monotonic() - t0 < 5
        assert got.abandoned == [run]
    finally:
        got.release()
    status, error = _runs(isolated.settings.settlement_dsn)[run]
    assert status == "abandoned" and f"pid {first.pid}" in error, error
    st = settlement_runs(isolated.settings.for_component("auditor"))
    assert [a["run_id"] for a in st["abandoned"]] == [run]
    assert not [c for c in st["closes_in_progress"] if c["trade_date"] == DAY]


def test_a_paused_close_is_fenced_after_its_lease_expires(isolated, tmp_path: Path) -> None:
    """SIGSTOP the holder past its lease: the next close ends its lease session, takes over
    with a larger token and publishes; the holder, woken, cannot publish and exits saying so.
    Its run is abandoned, none is left running, the day is published once, by the taker."""
    from settlement.close.pipeline import finish_run, publish, start_run
    from settlement.eod.model import SourceChoice

    go = tmp_path / "go"
    ttl = 3.0
    first = _worker(isolated.env, go, ttl=ttl)
    held = _line(first)
    os.kill(first.pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        got, said = _acquire(isolated.settings, ttl=ttl, wait=60)
        took = time.monotonic() - t0
        assert isinstance(got, close_lease.Lease), got
        assert ttl * 0.5 <= took <= ttl + 10, took  # after the expiry, boundedly
        assert got.token > held["token"] and got.abandoned == [held["held"]]
        assert any("lease expired" in s for s in said), said
        s = isolated.settings.for_component("settlement")
        try:
            mine = start_run(s, DAY, SourceChoice("db", "takeover"), got)
            got.attach(mine)
            publish(s, mine, DAY, None, got)
            finish_run(s, mine, "succeeded", {})
        finally:
            got.release()
    finally:
        os.kill(first.pid, signal.SIGCONT)
    go.touch()
    out = _line(first)
    assert first.wait(30) == 3, out
    assert "taken over" in out["lost"] and out["run_id"] == held["held"]
    assert _published(isolated.settings.settlement_dsn) == mine
    runs = _runs(isolated.settings.settlement_dsn)
    assert runs[mine] == ("succeeded", None)
    assert runs[held["held"]][0] == "abandoned"
    assert "running" not in {st for st, _ in runs.values()}


def test_a_close_whose_lease_session_ended_cannot_publish(isolated) -> None:
    """Between a waiter ending an expired holder's session and taking the lease, the token
    is still the holder's: the fence also wants the lease session alive."""
    from settlement.close.pipeline import finish_run, publish, start_run
    from settlement.eod.model import SourceChoice

    s = isolated.settings.for_component("settlement")
    got, _ = _acquire(isolated.settings)
    assert isinstance(got, close_lease.Lease)
    run = start_run(s, DAY, SourceChoice("db", "cut off"), got)
    got.attach(run)
    with connect(isolated.settings.settlement_dsn) as admin:
        admin.execute("select pg_terminate_backend(%s)", (got.conn.info.backend_pid,))
    try:
        with pytest.raises(close_lease.LeaseLost, match="lost its lease session"):
            publish(s, run, DAY, None, got)
        finish_run(s, run, "failed", {}, error="lease lost")  # not taken over: it may record
    finally:
        got.release()  # the session is gone already: releasing must not raise
    assert _published(s.settlement_dsn) is None
    assert _runs(s.settlement_dsn)[run] == ("failed", "lease lost")


def test_a_waiter_that_ends_a_holder_whose_run_finished_joins_that_run(isolated) -> None:
    """A publication that outlasted the lease leaves it expired until the holder renews: a
    waiter may end the holder's session after its run finished and before its release (CI
    saw it). The run is done, so the waiter joins it instead of computing the date again."""
    from settlement.close.pipeline import finish_run, publish, start_run
    from settlement.eod.model import SourceChoice

    s = isolated.settings.for_component("settlement")
    got, _ = _acquire(isolated.settings)
    assert isinstance(got, close_lease.Lease)
    said: list[str] = []
    waiting = close_lease._Waiting(s, DAY, 30, said.append)
    conn = close_lease._lease_connection(s.settlement_dsn, DAY, 30)
    try:
        assert waiting.step(conn) is None  # the holder holds the date: wait on
        run = start_run(s, DAY, SourceChoice("db", "outlasted its lease"), got)
        got.attach(run)
        publish(s, run, DAY, None, got)
        finish_run(s, run, "succeeded", {})
        with connect(isolated.settings.settlement_dsn) as admin:  # as end_expired does
            admin.execute("select pg_terminate_backend(%s)", (got.conn.info.backend_pid,))
        deadline = time.monotonic() + 30
        joined = None
        while joined is None and time.monotonic() < deadline:
            joined = waiting.step(conn)
            time.sleep(0.1)
        assert isinstance(joined, close_lease.Joined) and joined.run_id == run, joined
    finally:
        got.release()
        if not conn.closed:
            conn.close()
    assert _runs(s.settlement_dsn)[run][0] == "succeeded"


def test_a_close_that_cannot_name_its_run_in_its_lease_records_the_run_failed(
        isolated) -> None:
    """Issue 41's site-freeze: a close frozen past its lease woke with its lease session gone
    (its server demoted meanwhile) and crashed naming its run there; the run stayed `running`
    for nobody. Now it is recorded failed, and the error still stops the close."""
    import psycopg

    from settlement.close.pipeline import begin_run
    from settlement.eod.model import SourceChoice

    s = isolated.settings.for_component("settlement")
    got, _ = _acquire(isolated.settings)
    assert isinstance(got, close_lease.Lease)
    with connect(isolated.settings.settlement_dsn) as admin:
        admin.execute("select pg_terminate_backend(%s)", (got.conn.info.backend_pid,))
    try:
        with pytest.raises(psycopg.OperationalError):
            begin_run(s, DAY, SourceChoice("db", "woken"), got)
    finally:
        got.release()
    (status, error), = _runs(s.settlement_dsn).values()
    assert status == "failed" and "lost its lease session" in str(error), error
    assert _published(s.settlement_dsn) is None


def test_a_close_gives_up_waiting_after_its_bound(isolated, tmp_path: Path) -> None:
    first = _worker(isolated.env, tmp_path / "go")
    run = _line(first)["held"]
    try:
        with pytest.raises(close_lease.LeaseWaitTimeout, match=f"run {run} held by"):
            _acquire(isolated.settings, wait=1.0)
    finally:
        (tmp_path / "go").touch()
        first.wait(30)


def test_a_finished_run_cannot_be_abandoned_and_an_abandoned_one_cannot_finish(
        isolated) -> None:
    """Append-only rows: abandoning touches only running runs; a run abandoned under a close
    cannot then record an outcome (LeaseLost, not a rewritten row)."""
    from settlement.close.pipeline import finish_run, start_run
    from settlement.eod.model import SourceChoice

    s = isolated.settings.for_component("settlement")
    done = start_run(s, DAY, SourceChoice("db", "first"))
    finish_run(s, done, "succeeded", {})
    stale = start_run(s, DAY, SourceChoice("db", "second"))
    got, _ = _acquire(isolated.settings)
    try:
        assert got.abandoned == [stale]
    finally:
        got.release()
    with pytest.raises(close_lease.LeaseLost, match="recorded abandoned"):
        finish_run(s, stale, "succeeded", {})
    runs = _runs(s.settlement_dsn)
    assert runs[done] == ("succeeded", None) and runs[stale][0] == "abandoned"


def _task_command(settings: Any, day: str, run_dir: Path,
                  monkeypatch: pytest.MonkeyPatch) -> tuple[list[str], dict[str, str]]:
    """The eod task's spark-submit, built as SettlementSparkSubmitOperator builds it (the
    provider's hook, the job's secured environment, the DAG's arguments of a scheduled run)."""
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

    from settlement.orchestration.operators import secure_hook
    from settlement.orchestration.tasks import JOB, airflow_connections, spark_jars_csv

    for k, v in airflow_connections(settings).items():
        monkeypatch.setenv(k, v)
    hook = SparkSubmitHook(
        conn_id="spark_default", jars=spark_jars_csv(settings), name="settlement-kafka",
        conf={"spark.ui.enabled": "false", "spark.sql.session.timeZone": "UTC"},
        application_args=["--date", day, "--source", "kafka", "--reason", "test",
                          "--accept-incomplete", "", "--only-if-unsettled", "yes"])
    run_dir.mkdir()
    secure_hook(hook, settings, run_dir)
    return hook._build_spark_submit_command(str(JOB)), {**os.environ, **(hook._env or {})}


def test_two_sites_closing_one_date_at_once_compute_it_once(
        isolated, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Both sites' orchestrators start the close of the day together: one spark-submit'ed job
    computes and publishes, the other waits and reports that run (joined_run_id). The
    second site's scheduler firing afterwards finds the day settled and settles nothing."""
    from tests.helpers import ingest_day, last_json, settle

    day = "2026-11-20"
    sim = ingest_day(isolated.env, tmp_path, day, ["a", "b"], "shared", trades=2000)
    procs = []
    for site in ("a", "b"):
        cmd, env = _task_command(isolated.settings, day, tmp_path / f"run-{site}", monkeypatch)
        log = tmp_path / f"job-{site}.err"
        procs.append((subprocess.Popen(cmd, env={**env, "SETTLE_SITE_NAME": site},
                                       stdout=subprocess.PIPE, stderr=open(log, "w"),
                                       text=True, cwd=ROOT), log))
    outs = []
    for proc, log in procs:
        stdout, _ = proc.communicate(timeout=400)
        assert proc.returncode == 0, log.read_text()[-3000:]
        outs.append(last_json(stdout))
    computed = [o for o in outs if "joined_run_id" not in o]
    joined = [o for o in outs if "joined_run_id" in o]
    assert len(computed) == len(joined) == 1, outs
    run = computed[0]["run_id"]
    assert computed[0]["published"] and computed[0]["trades"] == sim["trades"]
    assert joined[0]["joined_run_id"] == run and joined[0]["published"]
    assert joined[0]["status"] == "succeeded"
    with connect(isolated.settings.settlement_dsn) as conn:
        runs = conn.execute("select run_id, status from settlement_runs where trade_date = %s",
                            (day,)).fetchall()
    assert runs == [(run, "succeeded")]  # no second computation, no failed run

    # The other site's scheduler, after the close: already settled, no run, exit 0.
    t0 = time.monotonic()
    later = settle(["eod", "--date", day, "--only-if-unsettled"], isolated.env)
    assert later["already_settled_by"] == run and later["published"], later
    assert time.monotonic() - t0 < 60  # no Spark started
