"""A close in its own process for the lease tests: the real lease, run record, fenced
publication and outcome of ``settlement.eod``, with the Spark computation left out (the
day's results are empty: the lease, not the netting, is under test).

``python -m tests.lease_worker DATE GO_FILE [MODE]``: takes the date's lease (or joins),
starts a run, prints ``{"held": run_id}``, waits until GO_FILE exists (at most 120 s), publishes and
finishes the run, prints ``{"published": run_id}``. Exit 3 with ``{"lost": why}`` when the
lease was lost before publishing. MODE:

- ``slow-publish=S``: the publishing transaction sleeps S seconds after its fence (a large
  day's publication, or a slow server), holding the lease row as a real one does;
- ``crash``: instead of publishing, the run fails as a transient error fails it (no
  validation verdict), exit 1.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from settlement.close.pipeline import finish_run, publish, start_run
from settlement.config import load_settings
from settlement.eod import lease as close_lease
from settlement.eod.model import SourceChoice


def main(trade_date: str, go_file: str, mode: str = "") -> int:
    settings = load_settings().for_component("settlement")
    got = close_lease.acquire(settings, trade_date, ttl=settings.close_lease_seconds,
                              wait_seconds=settings.close_wait_seconds,
                              say=lambda line: print(line, file=sys.stderr, flush=True))
    if isinstance(got, close_lease.Joined):
        print(json.dumps({"joined": got.run_id}), flush=True)
        return 0
    try:
        run_id = start_run(settings, trade_date, SourceChoice("db", "lease test"), got)
        got.attach(run_id)
        print(json.dumps({"held": run_id, "token": got.token, "abandoned": got.abandoned}),
              flush=True)
        deadline = time.monotonic() + 120
        while not Path(go_file).exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        if mode == "crash":
            finish_run(settings, run_id, "failed", {},
                       error="OperationalError: the connection was reset (lease test)")
            print(json.dumps({"crashed": run_id}), flush=True)
            return 1
        if mode.startswith("slow-publish="):
            fence, delay = got.check_fence, float(mode.split("=", 1)[1])

            def slow_fence(conn: Any) -> None:
                fence(conn)
                # Inside the publishing transaction, the row locked, the server busy (a
                # client that sleeps here would be a frozen publisher, which the server ends).
                conn.execute("select pg_sleep(%s)", (delay,))

            got.check_fence = slow_fence  # type: ignore[method-assign]
        try:
            publish(settings, run_id, trade_date, None, got)
            finish_run(settings, run_id, "succeeded", {})
        except close_lease.LeaseLost as e:
            print(json.dumps({"lost": str(e), "run_id": run_id}), flush=True)
            return 3
        print(json.dumps({"published": run_id}), flush=True)
        return 0
    finally:
        got.release()


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
