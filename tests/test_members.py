"""`settle site run --processes N`: each member its own metrics port, and a member that dies
is reported at once, not when the last one finishes."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time

import pytest

from consumers.members import _watch, combine, member_env


def test_each_member_gets_its_own_metrics_port() -> None:
    ports = [member_env(9400, i, 3)["SETTLE_METRICS_PORT"] for i in range(3)]
    assert ports == ["9400", "9401", "9402"]
    # Metrics off: the environment as it is.
    assert member_env(0, 1, 3).get("SETTLE_METRICS_PORT") == os.environ.get("SETTLE_METRICS_PORT")
    with pytest.raises(ValueError, match="at most 65533"):
        member_env(65534, 0, 3)


def test_a_dying_member_is_reported_while_the_others_run(
        caplog: pytest.LogCaptureFixture) -> None:
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    dead = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    stop = threading.Event()
    watcher = threading.Thread(target=_watch, args=([alive, dead], "a", stop), daemon=True)
    try:
        with caplog.at_level(logging.ERROR, logger="settle.site"):
            watcher.start()
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and "exited with code 3" not in caplog.text:
                time.sleep(0.1)
        assert f"process {dead.pid} exited with code 3" in caplog.text
        assert "1 of 2 processes left" in caplog.text
        assert alive.poll() is None  # said while the other still runs
    finally:
        stop.set()
        alive.kill()
        alive.wait()


def test_combine_sums_counters_and_joins_stalled_partitions() -> None:
    out = combine([{"site": "a", "inserted": 2, "stalled": [3], "closed": True, "seconds": 1},
                   {"site": "a", "inserted": 5, "stalled": [1], "closed": False, "seconds": 2}])
    assert out["inserted"] == 7 and out["stalled"] == [1, 3] and out["closed"] is False
