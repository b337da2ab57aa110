"""Crash points: named places in the close, the re-close, the instructions' writing and the
agent's answer import where a test makes the process die or freeze (issue 56).

Enabled by one test setting, ``SETTLE_CRASH_AT=POINT:ACTION`` (settlement.config refuses it in
a production configuration, ``SETTLE_DRILLS_ENABLED=false``). At the point the process says so
on stderr (``crash point POINT: ACTION``), then:

- ``kill``: SIGKILL itself (no ``finally``, no teardown: as the OOM killer or a lost host
  would; Spark's JVM exits when its parent's pipe closes);
- ``pause``: SIGSTOP itself, frozen until something sends SIGCONT. The test then acts from
  outside (waits past the lease, ends the process's database sessions, restarts the
  settlement database) before it wakes the process, or never wakes it.

The list is the contract docs/operations.md prints; a name not in it is refused, so a point
renamed in the code cannot leave a test injecting nothing.
"""

from __future__ import annotations

import os
import signal
import sys

# Step boundaries in the order a close meets them, then the re-close's, the instructions'
# and the answer import's. "publish.before_commit" is inside the publishing transaction
# with every row written; "publish.after_commit" right after its commit.
POINTS: dict[str, str] = {
    "close.leased": "the date's lease taken, no run recorded yet",
    "close.run_started": "the run recorded and named in the lease",
    "close.staged": "the run's results staged in the run_* tables",
    "close.validated": "validation's verdict in hand, nothing published",
    "publish.before_commit": "inside the publishing transaction, every row written, "
                             "before its commit",
    "publish.after_commit": "the publication committed (positions, verdict, version, "
                            "instruction set, report facts)",
    "close.instruction_files": "the instruction files written from the committed set",
    "close.report_files": "the audit report's files written",
    "close.completed": "the run's timings recorded, before the lease is released",
    "reclose.held": "a re-close computed, validated and held for approval",
    "instructions.files": "`settle instructions`: the committed set's files written",
    "answers.before_commit": "inside the answer import's transaction, before its commit",
    "answers.after_commit": "the agent's answers committed",
}
ACTIONS = ("kill", "pause")


class CrashPointError(ValueError):
    """A crash-point setting that names no point or no action."""


def parse(value: str) -> tuple[str, str] | None:
    """``POINT:ACTION`` checked against the lists; None for an empty setting."""
    if not value:
        return None
    point, _, action = value.partition(":")
    if point not in POINTS:
        raise CrashPointError(f"no crash point {point!r}; the points are: "
                              + ", ".join(POINTS))
    if action not in ACTIONS:
        raise CrashPointError(f"crash point action {action!r}: expected one of "
                              + ", ".join(ACTIONS))
    return point, action


def crash_point(setting: str, name: str) -> None:
    """Die or freeze here if the setting names this point; nothing otherwise."""
    if not setting:
        return
    assert name in POINTS, f"unlisted crash point {name}"
    chosen = parse(setting)
    if chosen is None or chosen[0] != name:
        return
    print(f"crash point {name}: {chosen[1]}", file=sys.stderr, flush=True)
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL if chosen[1] == "kill" else signal.SIGSTOP)
