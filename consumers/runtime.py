"""Interpreter settings for the loops that parse messages by the hundred thousand: a site's
consume loop (consumers.site) and the end of day's classification of the day's Kafka messages
in Spark's Python workers (settlement.spark.parse).

Both allocate tens of thousands of tracked objects a second (Kafka messages, lists, the
trades' value tuples). At CPython's default first threshold (700) the collector ran about
1,700 times per 300,000 trades in a site, a dozen of them full passes over everything the
process had built before the loop: 0.4-0.7 s of a 3-4 s run, and 0.6 s of a worker's 2.7 s
classifying 300,000 messages. With what exists before the loop frozen out of its passes and
a first threshold of 20,000, 0.1 s (benchmarks/ingest.py, docs/benchmarks.md).
"""

from __future__ import annotations

import gc
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

GC_THRESHOLD_0 = 20_000
_lock = threading.Lock()
_depth = 0
_saved: tuple[float, tuple[int, int, int]] | None = None


@contextmanager
def hot_loop(switch_interval: float | None = None) -> Iterator[None]:
    """The collector tuned as above (and, when given, the GIL switch interval) while at least
    one such loop runs in this process; the previous settings come back when the last one
    ends (tests run several sites in one process)."""
    global _depth, _saved
    with _lock:
        _depth += 1
        if _depth == 1:
            _saved = (sys.getswitchinterval(), gc.get_threshold())
            gc.freeze()
            gc.set_threshold(GC_THRESHOLD_0, *_saved[1][1:])
        if switch_interval is not None:
            sys.setswitchinterval(switch_interval)
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _saved is not None:
                sys.setswitchinterval(_saved[0])
                gc.set_threshold(*_saved[1])
                gc.unfreeze()
                _saved = None
