"""Work started in a thread of its own (it imports nothing of ours: any layer may use it)."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


def in_thread(name: str, fn: Callable[[], T]) -> Future[T]:
    """``fn`` running in a thread of its own, started now; its result (or error) in the
    future. A Spark job started so runs beside the caller's: PySpark pins each Python thread
    to a JVM thread of its own, and the scheduler runs their jobs side by side."""
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
    try:
        return pool.submit(fn)
    finally:
        pool.shutdown(wait=False)
