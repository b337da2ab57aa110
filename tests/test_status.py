"""Operations on call: a live site's Prometheus metrics and stats lines, heartbeat retention,
and `settle status` (healthy, a stopped site, lag) against the real services."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from settlement.db import connect
from settlement.drills.runner import spawn_settle
from tests.conftest import Isolated
from tests.helpers import ROOT, last_json, settle, wait_exit, wait_for

pytestmark = pytest.mark.services
DAY, NEXT = "2026-12-01", "2026-12-02"
ARTIFACTS = ROOT / "test-artifacts"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(port: int) -> dict[str, float]:
    """`name{labels}` -> value of every sample on the site's /metrics page."""
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out: dict[str, float] = {}
    for line in body.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def sample(metrics: dict[str, float], name: str) -> float:
    """The single sample of ``name`` (site a, separate scheme)."""
    hits = [v for k, v in metrics.items() if k.startswith(name + "{")]
    assert len(hits) == 1, (name, hits)
    return hits[0]


def status(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "settlement.cli", "status", *args],
                          env=env, capture_output=True, text=True, cwd=ROOT, timeout=120)


def test_live_site_metrics_stats_retention_and_status(isolated: Isolated, tmp_path: Path
                                                      ) -> None:
    env = isolated.env
    sim = settle(["simulate", "--date", DAY, "--trades", "3000", "--seed", "7",
                  "--dup-rate", "0.02", "--bad-rate", "0.005", "--abort-rate", "0.3"], env)
    # A heartbeat older than the retention (7 days by default) that the site must delete.
    with connect(isolated.settings.ledger_dsn("a")) as conn:
        conn.execute("insert into site_heartbeats (site, scheme, beat_at, partitions, "
                     "trades_total) values ('z', 'separate', now() - interval '8 days', "
                     "'{}', 0), ('y', 'separate', now() - interval '6 days', '{}', 0)")
        conn.commit()

    port = free_port()
    log = tmp_path / "site-a.log"
    site = spawn_settle(["site", "run", "--site", "a", "--scheme", "separate",
                         "--max-seconds", "120"],
                        {**env, "SETTLE_METRICS_PORT": str(port),
                         "SETTLE_STATS_INTERVAL_SECONDS": "1"}, log)
    try:
        def caught_up() -> bool:
            try:
                m = scrape(port)
            except OSError:
                return False  # not serving yet
            return any(k.startswith("settle_site_trades_total{") and v == sim["trades"]
                       for k, v in m.items())

        wait_for(caught_up, 90, "the site's metrics to show the whole day", interval=0.5)
        time.sleep(2.5)  # a heartbeat and a lag update after the last batch
        m = scrape(port)
        assert sample(m, "settle_site_trades_total") == sim["trades"]
        assert sample(m, "settle_site_dead_letters_total") == sim["malformed_injected"]
        assert sample(m, "settle_site_duplicates_total") == sim["duplicates_injected"] > 0
        # every trade, replay, malformed message and close marker was one committed message
        assert sample(m, "settle_site_messages_total") >= \
            sim["trades"] + sim["duplicates_injected"] + sim["malformed_injected"] + 6
        assert sample(m, "settle_site_batch_seconds_count") == \
            sample(m, "settle_site_batches_total") >= 1
        assert time.time() - sample(m, "settle_site_last_heartbeat_timestamp_seconds") < 10
        assert sample(m, "settle_site_partitions_owned") == 6
        lags = {k: v for k, v in m.items() if k.startswith("settle_site_lag_messages{")}
        assert len(lags) == 6
        # caught up: at most the trailing transaction marker of each partition
        assert all(v <= 1 for v in lags.values()), lags

        # retention: the 8-day-old beat is gone, the 6-day-old one is kept
        with connect(isolated.settings.ledger_dsn("a")) as conn:
            kept = {r[0] for r in conn.execute(
                "select distinct site from site_heartbeats where site in ('y', 'z')")}
        assert kept == {"y"}

        res = status(env, "--json")
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
        out = last_json(res.stdout)
        assert out["healthy"] is True and out["problems"] == []
        assert set(out["ledgers"]) == {"a"}
        led = out["ledgers"]["a"]
        assert led["sites"]["a"]["age_seconds"] < 15
        assert sorted(led["sites"]["a"]["partitions"]) == list(range(6))
        assert led["day"] == DAY and led["close_markers"] == 6 and led["closed"] is True
        assert led["dead_letters_today"] == sim["malformed_injected"]
        assert len(led["partitions"]) == 6
        for p, o in led["partitions"].items():
            assert o["high"] == out["kafka"]["high"][p] and o["stored"] <= o["high"]
            assert o["lag"] == 0 and o["lag_seconds"] == 0.0, (p, o)
        human = status(env)  # the table, as an operator reads it
        assert human.returncode == 0
        assert "HEALTHY" in human.stderr and "ledger" in human.stderr
        ARTIFACTS.mkdir(exist_ok=True)
        (ARTIFACTS / "status-table.txt").write_text(human.stderr)
    finally:
        site.send_signal(signal.SIGTERM)
    summary = wait_exit(site, log, timeout=60)
    assert summary["inserted"] == sim["trades"]
    stats = [ln for ln in log.read_text().splitlines() if "site a stats:" in ln]
    assert stats, log.read_text()[-2000:]
    assert re.search(rf"trades={sim['trades']} .*dead_letters={sim['malformed_injected']} ",
                     stats[-1]), stats[-1]

    # The site is down and the next day is being published: unhealthy, and says why.
    nxt = settle(["simulate", "--date", NEXT, "--trades", "500", "--seed", "8"], env)
    time.sleep(1.5)
    res = status(env, "--json", "--max-heartbeat-age", "1", "--max-lag", "10")
    assert res.returncode == 1
    out = last_json(res.stdout)
    assert out["healthy"] is False and out["ok"] is False
    assert any("site a" in p and "last heartbeat" in p for p in out["problems"]), out["problems"]
    assert any("messages behind" in p for p in out["problems"]), out["problems"]
    parts = out["ledgers"]["a"]["partitions"].values()
    assert sum(o["lag"] for o in parts) >= nxt["trades"]
    assert all(o["lag_seconds"] is not None and o["lag_seconds"] >= 0 for o in parts)


def test_an_unmigrated_or_unprivileged_database_is_reported_not_raised(
        isolated: Isolated) -> None:
    # `settle status` used to crash with UndefinedTable / InsufficientPrivilege.
    admin = isolated.settings.for_component("admin")
    with connect(admin.ledger_dsn("a")) as conn:
        conn.execute("revoke select on site_heartbeats from settle_auditor")
        conn.commit()
    with connect(admin.settlement_dsn) as conn:
        conn.execute("drop table settlement_runs cascade")
        conn.commit()
    res = status(isolated.env, "--json")
    assert res.returncode == 1, res.stderr
    out = last_json(res.stdout)
    problems = " | ".join(out["problems"])
    assert "Traceback" not in res.stderr
    assert "settlement database not migrated" in problems, problems
    assert "run `settle db migrate`" in problems
    assert "ledger database(s) a: the login lacks a privilege" in problems, problems
    assert out["ledgers"]["a"]["reachable"] is False


def test_the_lag_probe_skips_an_unreachable_ledger_and_answers_the_others(
        isolated: Isolated) -> None:
    """One ledger down, another behind on an empty topic: the probe reads the reachable
    one's partitions at once (an end of partition is lag 0) and leaves the other alone."""
    from settlement.status import probe_lag_seconds

    ledgers = {"a": {"reachable": False, "error": "down"},
               "b": {"reachable": True,
                     "partitions": {str(p): {"lag": 1, "stored": 0} for p in range(3)}}}
    probe_lag_seconds(isolated.settings, ledgers)
    # Lag 0: answered by the end of each partition (a timeout would leave the lag as it was).
    assert [o["lag"] for o in ledgers["b"]["partitions"].values()] == [0, 0, 0]
    assert ledgers["a"] == {"reachable": False, "error": "down"}


def test_the_lag_probe_starts_each_partition_at_a_concrete_offset() -> None:
    """librdkafka resolves a logical offset ("beginning") on a 500 ms retry timer; the probe
    starts at the log's first offset instead, or at the stored position past it."""
    from confluent_kafka import OFFSET_BEGINNING

    from settlement.status import BEGINNING, _probe_offset

    low = {0: 5, 1: 0}
    assert _probe_offset(BEGINNING, 0, low) == 5
    assert _probe_offset(3, 0, low) == 5  # retention passed the stored position
    assert _probe_offset(7, 0, low) == 7
    assert _probe_offset(BEGINNING, 1, low) == 0
    assert _probe_offset(BEGINNING, 2, low) == OFFSET_BEGINNING  # no watermark known
    assert _probe_offset(4, 2, None) == 4
