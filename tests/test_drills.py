"""Failover drills against live sites: a quick campaign, every fault type at least once."""

from __future__ import annotations

import pytest

from settlement.config import Settings
from settlement.drills import drill

# The campaign restarts PostgreSQL and kills a broker under everyone's feet, and the
# takeover tests assert a time bound: nothing else may run meanwhile.
pytestmark = [pytest.mark.services, pytest.mark.exclusive]


def test_quick_campaign_loses_and_duplicates_nothing(services: Settings,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    # The eod-kill drill's second close waits for the killed close's lease to expire: a
    # 12 s lease instead of the default 30 s (renewed every 4 s; nothing else runs now).
    monkeypatch.setenv("SETTLE_CLOSE_LEASE_SECONDS", "12")
    results = drill.run_campaign(runs=5, seed=7, trades=8000, base=services)
    assert {r.spec["fault"] for r in results} == set(drill.FAULTS)
    by_pair = {(r.spec["scheme"], r.spec["fault"]): r for r in results}
    # The failover paths run in the shared scheme: takeover and zombie fencing.
    assert {("shared", "kill"), ("shared", "pause")} <= set(by_pair)
    s = drill.summary(results)
    assert (s["lost"], s["duplicated"], s["unexpected"], s["nonmonotonic"]) == (0, 0, 0, 0), s
    for r in results:
        assert r.kafka_trades == 8000, r.as_dict()
        assert r.passed, r.as_dict()
        assert r.rto_seconds is not None
        if r.spec["fault"] == "eod-kill":
            continue  # the close is hit, not the ingest: judged below
        # Injected by progress: site A had committed part of its share, not none of it.
        assert "site A had committed" in r.fault_note and "not reached" not in r.fault_note, \
            r.fault_note
    kill = by_pair[("shared", "kill")]
    assert 0 < kill.rto_seconds <= drill.RTO_TARGET_SECONDS, kill.as_dict()
    assert "site B's first trade from site A's partitions" in kill.rto_note, kill.rto_note
    pause = by_pair[("shared", "pause")]
    assert "frozen inside a ledger transaction" in pause.fault_note, pause.fault_note
    assert pause.fenced_batches >= 1, pause.as_dict()  # its stale batch was refused
    # eod-kill: site A's close killed mid-run; site B's took over and published once.
    close = next(r for r in results if r.spec["fault"] == "eod-kill").close
    assert close is not None and close["killed_status"] == "abandoned", close
    assert (close["publications"], close["running"]) == (1, 0), close
    assert close["published_run"] != close["killed_run"] and close["trades"] == 8000, close
    assert "killed" in close["note"] and "took over" in close["note"], close
    md = drill.markdown(results, "pytest")
    assert md.count("| yes |") == 5


def test_campaign_plan_puts_failover_faults_in_the_shared_scheme_first() -> None:
    pairs = drill.campaign_pairs()
    assert pairs[:5] == [("kill", "shared"), ("pause", "shared"),
                         ("db-restart", "separate"), ("broker-kill", "separate"),
                         ("eod-kill", "separate")]
    assert sorted(pairs) == sorted((f, sc) for f in drill.FAULTS for sc in drill.SCHEMES)


def test_shared_kill_with_two_processes_per_site(services: Settings) -> None:
    """Four members in the shared group; both of site A's processes die at once, site B's two
    take their partitions over within the RTO target, and nothing is lost or duplicated (the
    campaign's shared kill judges the same bound with one process a site)."""
    res = drill.run_drill(drill.DrillSpec("shared", "kill", trades=8000, seed=11, at=0.4,
                                          processes=2), services)
    assert res.passed, res.as_dict()
    assert res.lost == res.duplicated == res.unexpected == res.nonmonotonic == 0
    assert res.kafka_trades == 8000
    assert 0 < res.rto_seconds <= drill.RTO_TARGET_SECONDS, res.as_dict()
    assert "site B's first trade from site A's partitions" in res.rto_note, res.rto_note
    assert "site A had committed" in res.fault_note, res.fault_note


def test_bad_drill_arguments_are_refused(services: Settings) -> None:
    with pytest.raises(ValueError, match="--at"):
        drill.run_drill(drill.DrillSpec("shared", "kill", at=1.5), services)
    with pytest.raises(ValueError, match="--fault"):
        drill.run_drill(drill.DrillSpec("shared", "flood"), services)
    external = services.model_copy(update={"pg_dsn": "postgresql://x@db:5432/s"})
    with pytest.raises(ValueError, match="cannot restart an external"):
        drill.run_drill(drill.DrillSpec("shared", "db-restart"), external)


def test_the_eod_kill_drill_holds_the_close_before_its_publication() -> None:
    """The campaign's ``at`` (0.2-0.7) reaches every kill point, each a listed crash point
    met before the publishing transaction (the drill then kills a close that cannot have
    published, however fast it is)."""
    from settlement.crashpoints import POINTS
    from settlement.drills.close import KILL_POINTS, kill_point

    order = list(POINTS)
    assert {kill_point(a / 100) for a in range(20, 71)} == set(KILL_POINTS)
    assert all(order.index(p) < order.index("publish.before_commit") for p in KILL_POINTS)
