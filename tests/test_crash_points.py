"""Exactly one publication, whatever dies when (issue 56): the crash-point campaign.

Several trading days on one topic and one set of ledgers (both sites ingesting, separate
scheme). Each day's close (``settle eod --only-if-unsettled``, as both sites' schedulers run
it) is made to die or freeze at one named point (settlement.crashpoints), then the date is
closed again at the same site (a retry) or at the other site. Whatever the point, a day ends
with one published run, version 1, one instruction set (that run's), no run left running,
its instruction and report files on disk, and positions equal to an independent netting in
plain Python. Then the agent's answer import and ``settle instructions`` are killed around
their commits on the campaign's days.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from settlement.config import Settings
from settlement.crashpoints import POINTS
from settlement.db import connect
from settlement.simulator.gateway import SimulationSpec, simulate
from tests.conftest import namespace
from tests.helpers import (
    ROOT,
    SETTLE,
    last_json,
    positions_table,
    reference_positions,
    settle,
    start_site,
    wait_exit,
    wait_for,
)

pytestmark = pytest.mark.services

LEASE = 10.0  # the campaign's lease: a frozen close is taken over within seconds, not 30


@dataclass(frozen=True)
class Scenario:
    point: str
    # kill | pause | end-session (paused, its database sessions ended, woken) | db-restart
    # (paused, the settlement database restarted, woken)
    action: str
    again_at: str  # where the date is closed again: "a" (the same site, a retry) or "b"
    day: str

    @property
    def id(self) -> str:
        return f"{self.point}-{self.action}-{'retry' if self.again_at == 'a' else 'other'}"


_CLOSE_POINTS = [p for p in POINTS if p.startswith(("close.", "publish."))]
_DAYS = ["2026-10-05", "2026-10-06", "2026-10-07", "2026-10-08", "2026-10-09", "2026-10-13",
         "2026-10-14", "2026-10-15", "2026-10-16", "2026-10-19", "2026-10-20", "2026-10-21",
         "2026-10-22", "2026-10-23"]
# Every close point killed, closed again alternately at the same site and at the other;
# then frozen inside the publishing transaction (taken over once the server ends that
# transaction) and frozen past the lease before publishing (woken, it must not publish);
# then its database sessions ended around the commit (a failover, a cut connection).
SCENARIOS = [Scenario(p, "kill", "a" if i % 2 else "b", _DAYS[i])
             for i, p in enumerate(_CLOSE_POINTS)]
SCENARIOS += [Scenario("publish.before_commit", "pause", "b", _DAYS[len(SCENARIOS)]),
              Scenario("close.staged", "pause", "a", _DAYS[len(SCENARIOS) + 1])]
SCENARIOS += [Scenario(p, "end-session", "a", _DAYS[len(SCENARIOS) + i])
              for i, p in enumerate(("publish.before_commit", "publish.after_commit"))]
# The settlement database restarted around the commit (exclusive: the server is shared).
RESTARTS = [Scenario(p, "db-restart", "b", d) for p, d in
            (("publish.before_commit", "2026-10-26"), ("publish.after_commit", "2026-10-27"))]
SPECS = {s.day: SimulationSpec(s.day, 400, seed=40 + i, dup_rate=0.02, bad_rate=0.005,
                               abort_rate=0.2, txn_size=200)
         for i, s in enumerate(SCENARIOS + RESTARTS)}


@dataclass(frozen=True)
class Campaign:
    settings: Settings
    env: dict[str, str]


@pytest.fixture(scope="module")
def campaign(services: Settings, tmp_path_factory: pytest.TempPathFactory
             ) -> Iterator[Campaign]:
    """One namespace for the module: every scenario's day published on one topic first, in
    date order, then both sites ingesting them all (each until the last day's close)."""
    import uuid

    tmp = tmp_path_factory.mktemp("campaign")
    with namespace(services, f"c{uuid.uuid4().hex[:10]}",
                   {"SETTLE_CLOSE_LEASE_SECONDS": str(LEASE)}) as ns:
        for day in sorted(SPECS):
            simulate(ns.settings, SPECS[day])
        last = max(SPECS)
        sites = [(start_site(s, "separate", ns.env, last, tmp / f"{s}.log"), tmp / f"{s}.log")
                 for s in ("a", "b")]
        for proc, log in sites:
            assert wait_exit(proc, log, timeout=300)["closed"]
        yield Campaign(ns.settings, ns.env)


def _close(env: dict[str, str], day: str, site: str, log: Path,
           crash_at: str = "") -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*SETTLE, "eod", "--date", day, "--only-if-unsettled", "--json"], cwd=ROOT,
        env={**env, "SETTLE_SITE_NAME": site, "SETTLE_CRASH_AT": crash_at},
        stdout=subprocess.PIPE, stderr=open(log, "w"), text=True)


def _finish(proc: subprocess.Popen[str], log: Path, timeout: float = 300
            ) -> tuple[int, dict[str, Any]]:
    try:
        stdout, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f"the close did not end within {timeout:.0f}s: "
                             f"{log.read_text()[-3000:]}") from None
    lines = [ln for ln in stdout.splitlines() if ln.startswith("{")]
    return proc.returncode, last_json(stdout) if lines else {}


def _day_state(dsn: str, day: str) -> dict[str, Any]:
    with connect(dsn) as conn:
        runs = conn.execute(
            "select run_id, status, version, published_at is not null, validation_success"
            " from settlement_runs where trade_date = %s order by run_id", (day,)).fetchall()
        sets = conn.execute("select run_id, count(*) from settlement_instructions"
                            " where trade_date = %s group by run_id order by 1",
                            (day,)).fetchall()
        current = conn.execute("select run_id from published_days where trade_date = %s",
                               (day,)).fetchone()
        report = conn.execute("select run_id, html_path from audit_reports"
                              " where trade_date = %s order by run_id", (day,)).fetchall()
    return {"runs": runs, "sets": sets, "current": None if current is None else current[0],
            "reports": report}


def _assert_one_publication(c: Campaign, day: str) -> int:
    """The day's invariants; returns its published run."""
    st = _day_state(c.settings.settlement_dsn, day)
    published = [r for r in st["runs"] if r[3]]
    assert len(published) == 1, st
    run, status, version, _, verdict = published[0]
    assert (status, version, verdict) == ("succeeded", 1, True), st
    assert st["current"] == run, st
    assert [r for r, _n in st["sets"]] == [run], st  # one instruction set, the publication's
    assert not [r for r in st["runs"] if r[1] == "running"], st
    reports = dict(st["reports"])
    assert Path(reports[run]).exists(), st  # its audit report's files, finished by somebody
    out = Path(c.settings.reports_dir) / "instructions"
    assert (out / f"{day}-run{run}.csv").exists() and (out / f"{day}-run{run}.xml").exists()
    assert positions_table(c.settings.settlement_dsn, day) == reference_positions(SPECS[day])
    return int(run)


def _said(log: Path, line: str, timeout: float) -> None:
    wait_for(lambda: line in log.read_text(errors="replace"), timeout, f"{line!r} in {log}",
             interval=0.2)


@pytest.mark.parametrize("sc", SCENARIOS, ids=[s.id for s in SCENARIOS])
def test_a_close_dying_at_any_point_leaves_one_publication(
        campaign: Campaign, sc: Scenario, tmp_path: Path) -> None:
    _scenario(campaign, sc, tmp_path)


@pytest.mark.exclusive  # restarts the PostgreSQL server every test shares
@pytest.mark.parametrize("sc", RESTARTS, ids=[s.id for s in RESTARTS])
def test_a_settlement_database_restart_around_the_commit_leaves_one_publication(
        campaign: Campaign, sc: Scenario, tmp_path: Path) -> None:
    _scenario(campaign, sc, tmp_path)


def _restart(settings: Settings) -> None:
    from settlement.services.postgres import EmbeddedPostgres

    pg = EmbeddedPostgres(settings)
    pg.stop("immediate")
    time.sleep(1.0)
    pg.start()


def _scenario(campaign: Campaign, sc: Scenario, tmp_path: Path) -> None:
    env = campaign.env
    first_log = tmp_path / "first.err"
    # The process itself only dies or freezes; ending its sessions is done from here.
    first = _close(env, sc.day, "a", first_log,
                   f"{sc.point}:{'kill' if sc.action == 'kill' else 'pause'}")
    if sc.action == "kill":
        code, _ = _finish(first, first_log)
        assert code == -signal.SIGKILL, first_log.read_text()[-3000:]
        assert f"crash point {sc.point}: kill" in first_log.read_text()
        again_log = tmp_path / "again.err"
        code, out = _finish(_close(env, sc.day, sc.again_at, again_log), again_log)
        assert code == 0, again_log.read_text()[-3000:]
    elif sc.action in ("end-session", "db-restart"):
        _said(first_log, f"crash point {sc.point}: pause", 300)
        try:
            if sc.action == "end-session":
                _end_sessions(campaign.settings)
            else:
                _restart(campaign.settings)
        finally:
            os.kill(first.pid, signal.SIGCONT)
        code, _ = _finish(first, first_log)
        # Inside the transaction its commit fails with the session; after it, the day is
        # published and the close goes on with new sessions.
        assert (code == 0) == (sc.point == "publish.after_commit"), \
            first_log.read_text()[-3000:]
        again_log = tmp_path / "again.err"
        code, out = _finish(_close(env, sc.day, sc.again_at, again_log), again_log)
        assert code == 0, again_log.read_text()[-3000:]
    else:
        _said(first_log, f"crash point {sc.point}: pause", 300)
        try:
            t0 = time.monotonic()
            again_log = tmp_path / "again.err"
            code, out = _finish(_close(env, sc.day, sc.again_at, again_log), again_log)
            took = time.monotonic() - t0
            assert code == 0, again_log.read_text()[-3000:]
            assert out.get("abandoned_runs"), out  # the frozen close's run, taken over
            # Taken over once the lease ran out (and, inside the publishing transaction,
            # once the server ended that transaction: half a lease): then one close.
            assert took < LEASE * 1.5 + 120, took
        finally:
            os.kill(first.pid, signal.SIGCONT)
        code, woke = _finish(first, first_log)
        # Woken, it finds its lease gone (or its publishing session ended): it publishes
        # nothing and says so.
        assert code != 0, first_log.read_text()[-3000:]
    run = _assert_one_publication(campaign, sc.day)
    committed = sc.action != "pause" and sc.point not in (
        "close.leased", "close.run_started", "close.staged", "close.validated",
        "publish.before_commit")
    if committed:
        # The killed close's publication stands: the next close joined it (finished its
        # files) and computed nothing.
        assert out.get("already_settled_by") == run or out.get("joined_run_id") == run, out
        assert len(_day_state(campaign.settings.settlement_dsn, sc.day)["runs"]) == 1
    else:
        assert out["run_id"] == run and out["published"], out


def _end_sessions(settings: Settings) -> None:
    """End every session on the namespace's settlement database (the frozen close's lease
    session and, inside the transaction, its publishing session: the only ones there), as
    a failover or a cut link would."""
    from psycopg.conninfo import conninfo_to_dict

    dbname = conninfo_to_dict(settings.settlement_dsn)["dbname"]
    with connect(settings.for_component("admin").settlement_dsn, autocommit=True) as admin:
        ended = admin.execute(
            "select count(*) filter (where pg_terminate_backend(pid)) from pg_stat_activity"
            " where datname = %s and pid <> pg_backend_pid()", (dbname,)).fetchone()
    assert ended is not None and ended[0] >= 1, ended  # at least its lease session


def _answers(path: Path, rows: list[str]) -> Path:
    path.write_text("instruction_id,status,settled_quantity\n" + "\n".join(rows) + "\n")
    return path


def _statuses(dsn: str, day: str) -> dict[str, tuple[str, int | None]]:
    with connect(dsn) as conn:
        return {i: (s, q) for i, s, q in conn.execute(
            "select s.instruction_id, s.status, s.settled_quantity from instruction_statuses s"
            " join settlement_instructions i using (instruction_id)"
            " where i.trade_date = %s", (day,))}


def test_the_answer_import_killed_around_its_commit(campaign: Campaign, tmp_path: Path) -> None:
    """Killed before its commit nothing is recorded and the same file applies whole later;
    killed after it, the same file again changes nothing. ``settled`` and ``settled,<whole
    quantity>`` are one answer; ``settled,0`` and non-ASCII digits are refused clearly."""
    s, env = campaign.settings, campaign.env
    day = SCENARIOS[0].day
    settle(["eod", "--date", day, "--only-if-unsettled"], env)  # settled already in a full run
    with connect(s.settlement_dsn) as conn:
        lines = conn.execute(
            "select i.instruction_id, i.quantity from settlement_instructions i"
            " join published_days p on p.run_id = i.run_id where i.trade_date = %s"
            " and i.quantity > 1 order by 1 limit 3", (day,)).fetchall()
    assert len(lines) == 3
    (a, qa), (b, _qb), (c, qc) = lines
    good = _answers(tmp_path / "answers.csv", [f"{a},settled,", f"{b},failed,",
                                               f"{c},settled,{qc - 1}"])
    for point in ("answers.before_commit", "answers.after_commit"):
        res = subprocess.run([*SETTLE, "instructions", "status", "--file", str(good), "--json"],
                             env={**env, "SETTLE_CRASH_AT": f"{point}:kill"}, cwd=ROOT,
                             capture_output=True, text=True, timeout=120)
        assert res.returncode == -signal.SIGKILL, res.stderr[-2000:]
        if point == "answers.before_commit":
            assert _statuses(s.settlement_dsn, day) == {}
            out = settle(["instructions", "status", "--file", str(good)], env)
            assert (out["settled"], out["failed"], out["partial"]) == (1, 1, 1), out
    want = {a: ("settled", None), b: ("failed", None), c: ("settled", qc - 1)}
    assert _statuses(s.settlement_dsn, day) == want
    # The whole quantity written out is the same answer as `settled` alone.
    same = settle(["instructions", "status", "--file",
                   str(_answers(tmp_path / "same.csv", [f"{a},settled,{qa}"]))], env)
    assert same["unchanged"] == 1 and same["settled"] == 0, same
    for bad, why in (("0", "settles nothing"), ("\u00b2", "not a whole number")):
        out = settle(["instructions", "status", "--file",
                      str(_answers(tmp_path / "bad.csv", [f"{a},settled,{bad}"]))], env,
                     check=False)
        assert out["_returncode"] == 1 and why in out["error"], out
        assert "Traceback" not in out["_stderr"], out["_stderr"]
    assert _statuses(s.settlement_dsn, day) == want


def test_instructions_rewritten_after_a_kill_are_the_committed_set(
        campaign: Campaign) -> None:
    """`settle instructions --date` killed once its files are written, then run again: the
    same set (the ids its publication committed), never a new one."""
    s, env = campaign.settings, campaign.env
    day = SCENARIOS[1].day
    settle(["eod", "--date", day, "--only-if-unsettled"], env)  # settled already in a full run
    before = _day_state(s.settlement_dsn, day)["sets"]
    res = subprocess.run([*SETTLE, "instructions", "--date", day, "--json"], cwd=ROOT,
                         env={**env, "SETTLE_CRASH_AT": "instructions.files:kill"},
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == -signal.SIGKILL, res.stderr[-2000:]
    out = settle(["instructions", "--date", day], env)
    assert _day_state(s.settlement_dsn, day)["sets"] == before
    assert out["run_id"] == before[0][0] and Path(out["path"]).exists(), out
