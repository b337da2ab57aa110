"""Exactly-once ingest against the real broker and database, with sites killed mid-day."""

from __future__ import annotations

import random
import signal
import subprocess
import time
from pathlib import Path

import pytest

from settlement.db import connect
from settlement.drills.checker import check_ledger, read_kafka_day
from tests.conftest import Isolated
from tests.helpers import ROOT, SETTLE, last_json, settle, start_site, wait_exit, wait_for

pytestmark = pytest.mark.services
DATE = "2026-11-23"


def _batches(dsn: str, site: str) -> int:
    with connect(dsn) as conn:
        return conn.execute("select count(*) from ingest_batches where site = %s",
                            (site,)).fetchone()[0]


def _assert_exact(iso: Isolated, ledgers: list[str], sim: dict) -> None:
    day = read_kafka_day(iso.settings, DATE)
    # The independent read agrees with what the gateway says it committed.
    assert len(day.trade_ids) == sim["trades"]
    assert len(day.malformed) == sim["malformed_injected"]
    for ledger in ledgers:
        dsn = iso.settings.ledger_dsn(ledger)
        res = check_ledger(dsn, day, iso.settings.topic)
        assert res.ok, f"ledger {ledger}: {res.as_dict()}"
        assert res.ledger_rows == sim["trades"]
        with connect(dsn) as conn:
            markers = conn.execute("select count(*) from close_markers where trade_date = %s",
                                   (DATE,)).fetchone()[0]
            reasons = conn.execute("select count(*) from dead_letters where reason = ''"
                                   ).fetchone()[0]
        assert markers == sim["partitions"]
        assert reasons == 0


def test_one_site_ingests_a_faulty_day_exactly_once(isolated: Isolated, tmp_path: Path) -> None:
    sim = settle(["simulate", "--date", DATE, "--trades", "20000", "--seed", "3",
                  "--dup-rate", "0.02", "--bad-rate", "0.005", "--abort-rate", "0.3"],
                 isolated.env)
    assert sim["duplicates_injected"] > 0 and sim["malformed_injected"] > 0
    assert sim["aborted"] > 0
    proc = start_site("a", "separate", isolated.env, DATE, tmp_path / "a.log")
    out = wait_exit(proc, tmp_path / "a.log")
    assert out["closed"] is True
    assert out["inserted"] == sim["trades"]
    assert out["duplicates"] == sim["duplicates_injected"]
    assert out["dead_letters"] == sim["malformed_injected"]
    _assert_exact(isolated, ["a"], sim)
    with connect(isolated.settings.ledger_dsn("a")) as conn:
        reasons = {r[0].split(":")[0].split(" ")[0] for r in
                   conn.execute("select reason from dead_letters")}
        raw_ok = conn.execute("select count(*) from dead_letters where length(raw) > 0"
                              ).fetchone()[0]
        beats = conn.execute("select count(*) from site_heartbeats where site = 'a'"
                             ).fetchone()[0]
    assert raw_ok == sim["malformed_injected"]
    assert beats >= 1
    # Every kind of malformed input the gateway sent produced a reason.
    assert len(reasons) >= 5, reasons


@pytest.mark.parametrize("crash", ["random_kill", "after_db_commit"])
@pytest.mark.parametrize("scheme", ["separate", "shared"])
def test_site_killed_mid_day_loses_and_duplicates_nothing(
    isolated: Isolated, tmp_path: Path, scheme: str, crash: str
) -> None:
    """Sites run while the day is being published; site A dies mid-day."""
    seed = random.randrange(1_000_000)
    rng = random.Random(seed)
    env = {**isolated.env, "SETTLE_BATCH_SIZE": "400"}
    # In the shared scheme A holds as few as one of the six partitions (5,000 trades, 13 or
    # more batches of 400); a failpoint past A's last batch would never fire (CI, seed 184224:
    # after_db_commit:15 never reached).
    kill_after = rng.randint(2, 20 if scheme == "separate" else 10)
    extra = {"SETTLE_FAILPOINT": f"after_db_commit:{kill_after}"} if crash != "random_kill" else {}
    ledger_a = isolated.settings.ledger_dsn(isolated.settings.site_ledger("a", scheme))

    a = start_site("a", scheme, env, DATE, tmp_path / "a1.log", extra)
    b = start_site("b", scheme, env, DATE, tmp_path / "b.log")
    # 30,000 trades paced over about three seconds of "trading day".
    day = subprocess.Popen(
        [*SETTLE, "simulate", "--date", DATE, "--trades", "30000", "--seed", str(seed),
         "--dup-rate", "0.02", "--bad-rate", "0.003", "--abort-rate", "0.2",
         "--rate", "10000", "--json"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    if crash == "random_kill":
        time.sleep(rng.uniform(0.5, 2.5))
        wait_for(lambda: _batches(ledger_a, "a") >= 1 or a.poll() is not None, 60,
                 "site a to commit a batch")
        a.send_signal(signal.SIGKILL)
    out, err = day.communicate(timeout=180)
    assert day.returncode == 0, err[-3000:]
    sim = last_json(out)
    a.wait(timeout=120)
    assert a.returncode == -signal.SIGKILL, (
        f"seed {seed}: site a was not killed ({crash}, kill_after {kill_after}; it committed "
        f"{_batches(ledger_a, 'a')} batches, exit {a.returncode})")

    if scheme == "separate":
        # Site B has its own group and ledger; site A restarts and resumes from its ledger.
        a2 = start_site("a", scheme, env, DATE, tmp_path / "a2.log")
        out_a2 = wait_exit(a2, tmp_path / "a2.log")
        assert out_a2["closed"], out_a2
    # In the shared scheme B takes A's partitions over after the session timeout.
    out_b = wait_exit(b, tmp_path / "b.log")
    assert out_b["closed"], out_b
    ledgers = ["a", "b"] if scheme == "separate" else ["shared"]
    _assert_exact(isolated, ledgers, sim)


def _paced_day(env: dict[str, str], seed: int, trades: int = 20000, rate: int = 8000
               ) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*SETTLE, "simulate", "--date", DATE, "--trades", str(trades), "--seed", str(seed),
         "--dup-rate", "0.01", "--bad-rate", "0.002", "--abort-rate", "0.1",
         "--rate", str(rate), "--json"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)


@pytest.mark.exclusive  # stops the PostgreSQL server every test shares
def test_database_restart_mid_day_pauses_and_loses_nothing(isolated: Isolated,
                                                           tmp_path: Path) -> None:
    from settlement.services.postgres import EmbeddedPostgres

    env = {**isolated.env, "SETTLE_BATCH_SIZE": "500"}
    a = start_site("a", "separate", env, DATE, tmp_path / "a.log")
    day = _paced_day(env, seed=11)
    ledger = isolated.settings.ledger_dsn("a")
    wait_for(lambda: _batches(ledger, "a") >= 3, 60, "site a to commit batches")
    # Crash-stop PostgreSQL (no shutdown checkpoint) for a while, then bring it back.
    pg = EmbeddedPostgres(isolated.settings)
    pg.stop("immediate")
    time.sleep(2.0)
    pg.start()
    out, err = day.communicate(timeout=180)
    assert day.returncode == 0, err[-3000:]
    res = wait_exit(a, tmp_path / "a.log")
    assert res["closed"] and res["db_errors"] >= 1, res
    _assert_exact(isolated, ["a"], last_json(out))


def test_sigterm_finishes_the_batch_and_exits_cleanly(isolated: Isolated,
                                                      tmp_path: Path) -> None:
    env = {**isolated.env, "SETTLE_BATCH_SIZE": "500"}
    a = start_site("a", "separate", env, DATE, tmp_path / "a1.log")
    day = _paced_day(env, seed=12)
    ledger = isolated.settings.ledger_dsn("a")
    wait_for(lambda: _batches(ledger, "a") >= 3, 60, "site a to commit batches")
    a.send_signal(signal.SIGTERM)
    first = wait_exit(a, tmp_path / "a1.log", timeout=60)  # exit code 0 and a JSON summary
    assert first["closed"] is False and first["inserted"] > 0
    out, err = day.communicate(timeout=180)
    assert day.returncode == 0, err[-3000:]
    second = wait_exit(start_site("a", "separate", env, DATE, tmp_path / "a2.log"),
                       tmp_path / "a2.log")
    assert second["closed"]
    sim = last_json(out)
    # Together the two runs applied every trade once: nothing re-inserted after restart.
    assert first["inserted"] + second["inserted"] == sim["trades"]
    _assert_exact(isolated, ["a"], sim)


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except FileNotFoundError:
        return []
    return [int(x) for x in text.split()]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


@pytest.mark.parametrize("scheme", ["separate", "shared"])
def test_two_processes_per_site_exactly_once_with_site_a_killed(
        isolated: Isolated, tmp_path: Path, scheme: str) -> None:
    """`settle site run --processes 2` for both sites: four members in the shared group (two
    per site group in the separate scheme). Site A's supervisor is SIGKILLed mid-day; its
    processes die with it, and the ledger's offset compare-and-set keeps the day exact through
    every rebalance among the survivors."""
    from settlement.drills.runner import spawn_settle

    env = {**isolated.env, "SETTLE_BATCH_SIZE": "400"}
    ledger_a = isolated.settings.ledger_dsn(isolated.settings.site_ledger("a", scheme))

    def site(name: str, log: str) -> subprocess.Popen[str]:
        return spawn_settle(["site", "run", "--site", name, "--scheme", scheme, "--processes",
                             "2", "--until-close", "--date", DATE, "--max-seconds", "240"],
                            env, tmp_path / log)

    a, b = site("a", "a1.log"), site("b", "b.log")
    wait_for(lambda: len(_children(a.pid)) == 2, 30, "site a's two processes")
    members = _children(a.pid)
    day = _paced_day(env, seed=21, trades=30000, rate=10000)
    wait_for(lambda: _batches(ledger_a, "a") >= 4 or a.poll() is not None, 90,
             "site a to commit batches")
    a.send_signal(signal.SIGKILL)
    a.wait(timeout=30)
    # The supervisor's death is the site's death: its consumer processes go with it.
    wait_for(lambda: not any(_alive(p) for p in members), 10, "site a's processes to die")
    out, err = day.communicate(timeout=180)
    assert day.returncode == 0, err[-3000:]
    sim = last_json(out)
    if scheme == "separate":
        a2 = site("a", "a2.log")
        res_a = wait_exit(a2, tmp_path / "a2.log")
        assert res_a["closed"] and len(res_a["processes"]) == 2, res_a
    res_b = wait_exit(b, tmp_path / "b.log")
    assert res_b["closed"] and len(res_b["processes"]) == 2, res_b
    # Both of site B's processes took part (each owned partitions at some point).
    assert all(p["batches"] > 0 for p in res_b["processes"]), res_b["processes"]
    _assert_exact(isolated, ["a", "b"] if scheme == "separate" else ["shared"], sim)
