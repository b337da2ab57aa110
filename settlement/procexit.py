"""Ending a one-shot process without the interpreter's teardown.

A close's process (``settle eod``, the spark-submit job) has imported PySpark, pandas, Great
Expectations and thousands of objects that proxy JVM objects; after its summary is printed,
the interpreter's teardown (every module's globals cleared, every finalizer run, the proxies
each telling the JVM to release its object) took 1.1 s of a 13-18 s small-day close, and
nothing of it matters to a process that is about to end: its output is flushed, its database
sessions end with the process, its JVM exits when its stdin closes.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading


def exit_now(code: int) -> None:
    """Finish as the interpreter would, without its teardown: flush stdout and stderr, wait
    for the threads that are not daemons (the interpreter's own step), run the exit handlers
    (the class archive's install among them: settlement.spark.jvm), then end."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    shutdown = getattr(threading, "_shutdown", None)
    if shutdown is None or threading.current_thread() is not threading.main_thread():
        sys.exit(code)  # an interpreter without the step below: the ordinary way
    # The interpreter's own first step of finalization: its thread-exit hooks (executors
    # told to stop their idle workers), then a join of every thread that is not a daemon.
    shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)
