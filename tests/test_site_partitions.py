"""One partition whose stored position lies past the end of the log (a recreated topic, a
restored ledger, a mirrored cluster) stops that partition only: the site pauses it, says so
once, reports it, and the other partitions are ingested to their close markers."""

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
