"""The capacity model (benchmarks/capacity.py) and the multi-process site summary: pure
functions, no services."""

from __future__ import annotations

import json
import subprocess
import sys

from consumers.members import combine
from tests.helpers import ROOT


def _model(*args: str) -> dict:
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "capacity.py"), *args],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_capacity_table_grows_with_the_day_and_keeps_its_invariants() -> None:
    out = _model()
    plans = out["plans"]
    assert [p["trades_per_day"] for p in plans] == [10_000_000, 100_000_000, 500_000_000]
    small, _, big = plans
    # Today's layout carries 10M; 500M needs more of everything.
    assert (small["partitions"], small["consumer_processes_per_site"]) == (6, 1)
    assert small["design_changes"][0].startswith("none")
    for key in ("partitions", "consumer_processes_per_site", "spark_cores_kafka",
                "ledger_servers_per_site"):
        assert big[key] > small[key], key
    for p in plans:
        # One Kafka partition per Spark core at least (one read task per partition), one per
        # consumer process with room to double, and the EOD fits its window at 70% busy.
        assert p["partitions"] >= max(p["spark_cores_kafka"], 2 * p["consumer_processes_per_site"])
        rate = out["figures"]["settle_kafka_per_core"] * p["spark_cores_kafka"] * 0.7
        assert p["trades_per_day"] * 2 / rate <= 30 * 60
    assert any("partitioned by trade_date" in c for c in big["design_changes"])


def test_capacity_figures_are_flags() -> None:
    # Ten times faster settlement per core needs (about) a tenth of the cores.
    out = _model("--days", "500000000", "--json-only")
    base = out["plans"][0]
    per_core = out["figures"]["settle_kafka_per_core"]
    fast = _model("--days", "500000000", "--json-only", "--settle-kafka-per-core",
                  str(10 * per_core))["plans"][0]
    assert fast["spark_cores_kafka"] <= base["spark_cores_kafka"] // 10 + 1


def test_a_sites_processes_add_up() -> None:
    one = {"site": "a", "scheme": "shared", "group": "g", "ledger": "shared",
           "trade_date": "2026-11-23", "closed": True, "inserted": 700, "messages": 710,
           "fenced": 1, "seconds": 3.0}
    two = {**one, "inserted": 300, "messages": 305, "fenced": 0, "seconds": 5.0,
           "closed": False}
    out = combine([one, two])
    assert (out["inserted"], out["messages"], out["fenced"]) == (1000, 1015, 1)
    assert out["closed"] is False  # closed only if every process saw the day closed
    assert out["seconds"] == 5.0 and out["trades_per_second"] == 200
    assert len(out["processes"]) == 2
