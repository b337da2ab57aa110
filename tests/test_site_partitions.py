"""One partition whose stored position lies past the end of the log (a recreated topic, a
restored ledger, a mirrored cluster) stops that partition only: the site stops fetching it,
says so once, reports it, and the other partitions are ingested to their close markers."""

from __future__ import annotations

from pathlib import Path

import pytest

from settlement.db import connect
from settlement.drills.runner import last_json, spawn_settle, start_site, wait
from tests.conftest import Isolated
from tests.helpers import settle

pytestmark = pytest.mark.services
DAY = "2026-10-14"
STALLED = 1
FAR = 10_000_000


def _per_partition(dsn: str) -> dict[int, int]:
    with connect(dsn) as conn:
        return {int(p): int(n) for p, n in conn.execute(
            "select kafka_partition, count(*) from trades group by 1")}


def test_a_partition_past_the_log_end_stalls_alone(isolated: Isolated, tmp_path: Path) -> None:
    env = isolated.env
    settle(["simulate", "--date", DAY, "--trades", "3000", "--seed", "11"], env)
    s = isolated.settings
    # Site a's ledger says partition 1 was read far beyond what the (recreated) topic holds.
    admin = s.for_component("admin")
    with connect(admin.ledger_dsn("a")) as conn:
        conn.execute("insert into consumer_offsets (consumer_group, topic, kafka_partition,"
                     " next_offset, site) values ('settlement-site-a', %s, %s, %s, 'a')",
                     (s.topic, STALLED, FAR))
        conn.commit()

    # Site b (its own ledger, separate scheme) reads the whole day: the reference.
    b = start_site("b", "separate", DAY, env, tmp_path / "b.log", max_seconds=240)
    a = spawn_settle(["site", "run", "--site", "a", "--scheme", "separate", "--until-close",
                      "--date", DAY, "--max-seconds", "25"], env, tmp_path / "a.log")
    wait(b, "site b", tmp_path / "b.log", 300)
    a.wait(timeout=180)
    out = last_json(tmp_path / "a.log")

    assert out["stalled"] == [STALLED] and out["stalled_partitions"] == 1, out
    assert out["closed"] is False  # its day cannot close without partition 1
    full, mine = _per_partition(s.ledger_dsn("b")), _per_partition(s.ledger_dsn("a"))
    assert STALLED in full and len(full) >= 3, full
    assert mine == {p: n for p, n in full.items() if p != STALLED}, (mine, full)
    with connect(s.ledger_dsn("a")) as conn:
        closed = {int(p) for (p,) in conn.execute(
            "select kafka_partition from close_markers where trade_date = %s", (DAY,))}
        (stored,) = conn.execute(
            "select next_offset from consumer_offsets where kafka_partition = %s",
            (STALLED,)).fetchone()
    assert closed == set(full) - {STALLED}
    assert stored == FAR  # nothing skipped or rewritten behind the operator's back
    # Said once, not once a second, with the way out.
    said = (tmp_path / "a.log").read_text().count(f"partition {STALLED} ends at offset")
    assert said == 1, said

    status = settle(["status"], env, check=False)
    assert any(f"partition {STALLED}: stored position {FAR} is past the end of the log" in p
               for p in status["problems"]), status["problems"]


def test_every_recovery_fetches_exactly_the_owned_partitions_from_their_positions(
        isolated: Isolated) -> None:
    """The cycle a site goes through after every ledger error, fencing or rebalance, repeated
    against the real broker: stop fetching, then fetch the owned partitions, less the stalled
    one, from the ledger's positions. Each cycle must deliver every such partition from
    exactly its position and nothing else (a pause/resume version of this cycle left a
    partition unfetched, silently, a few times in a hundred under load)."""
    import random

    from consumers.site import Site, SiteOptions

    settle(["simulate", "--date", DAY, "--trades", "1200", "--seed", "5"], isolated.env)
    site = Site(isolated.settings, SiteOptions(site="a", scheme="separate"))
    consumer = site.consumer
    try:
        parts = list(range(site._partition_count()))
        site.owned = set(parts) - {parts[-1]}  # the last one belongs to another site
        site.expected = {p: -2 for p in parts}  # OFFSET_BEGINNING: read everything once
        site._fetch()
        offsets = _data_offsets(consumer, len(site.owned))
        assert set(offsets) == site.owned and all(offsets.values()), offsets
        rng = random.Random(7)
        for cycle in range(30):
            consumer.unassign()
            consumer.consume(num_messages=50, timeout=0.05)  # the site's wait loop
            site.stalled = {rng.choice(sorted(site.owned)): 10_000_000}
            site.expected = {p: rng.choice(offs) for p, offs in offsets.items()}
            site._fetch()
            want = site.owned - set(site.stalled)
            first = _first_offsets(consumer, len(want))
            assert first == {p: site.expected[p] for p in want}, (cycle, first, site.expected)
    finally:
        site.writer.shutdown(wait=True)
        consumer.close()
        site.ledger.close()
        site.aux.close()


def _data_offsets(consumer: object, n: int) -> dict[int, list[int]]:
    import time

    seen: dict[int, list[int]] = {}
    quiet_since, deadline = time.monotonic(), time.monotonic() + 60
    while time.monotonic() < deadline and time.monotonic() - quiet_since < 3:
        msgs = consumer.consume(num_messages=1000, timeout=0.2)  # type: ignore[attr-defined]
        for m in msgs:
            if m.error() is None:
                seen.setdefault(m.partition(), []).append(m.offset())
                quiet_since = time.monotonic()
    assert len(seen) == n, seen
    return seen


def _first_offsets(consumer: object, n: int) -> dict[int, int]:
    import time

    first: dict[int, int] = {}
    deadline = time.monotonic() + 15
    while len(first) < n and time.monotonic() < deadline:
        for m in consumer.consume(num_messages=1000, timeout=0.1):  # type: ignore[attr-defined]
            if m.error() is None:
                first.setdefault(m.partition(), m.offset())
    return first
