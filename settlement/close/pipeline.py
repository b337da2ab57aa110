"""End of day for one trade date: take the date's lease (or join the close holding it),
choose the source once, read once, settle, validate the frames in hand, publish (fenced),
write the settlement instructions, report.

One library function used by ``settle eod``, the spark-submit entry point and the Airflow
DAG. Every run is recorded in ``settlement_runs``; results replace the date's rows in one
transaction, so running a date twice gives the same tables.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import psycopg

from settlement.config import Settings
from settlement.crashpoints import crash_point
from settlement.db import connect, q
from settlement.eod.lease import Joined, Lease, LeaseLost, acquire, marker_offsets, settled_by
from settlement.eod.model import (
    RESULT_TABLES,
    Position,
    Publication,
    SettlementResult,
    SourceChoice,
    rows_of,
)
from settlement.eod.sources import choose_source, with_reason
from settlement.errors import SettlementError, redact
from settlement.instructions import planned, write_files, write_set_files
from settlement.instructions.calendar import CalendarError, settlement_date
from settlement.instructions.store import InstructionsError, InstructionSet, for_run
from settlement.status import awaiting_reclose
from settlement.threads import in_thread

if TYPE_CHECKING:
    from settlement.report import PlannedReport
    from settlement.validation.run import ValidationOutcome

T = TypeVar("T")


@dataclass(frozen=True)
class RunOrigin:
    """Where a run comes from: the published run a re-close was computed against, and who
    asked for it."""

    based_on_run: int | None = None
    triggered_by: str | None = None


def start_run(settings: Settings, trade_date: str, choice: SourceChoice,
              lease: Lease | None = None, origin: RunOrigin = RunOrigin()) -> int:
    try:
        settles_on = settlement_date(settings, trade_date)
    except CalendarError:
        settles_on = None  # a date outside the calendar: `settle instructions` says why
    with connect(settings.settlement_dsn) as conn:
        row = conn.execute(q("eod", "start_run"), {
            "trade_date": trade_date, "source": choice.source, "source_reason": choice.reason,
            "offsets": json.dumps({**choice.as_dict(),
                                   "marker_offsets": choice.marker_offsets(),
                                   "amended_closes": choice.amended_closes()}),
            "holder": None if lease is None else lease.holder,
            "token": None if lease is None else lease.token,
            "settlement_date": settles_on, "based_on_run": origin.based_on_run,
            "triggered_by": origin.triggered_by,
        }).fetchone()
        conn.commit()
    assert row is not None
    return int(row[0])


def _finish_params(run_id: int, status: str, summary: dict[str, Any], error: str | None,
                   with_timings: bool = True) -> dict[str, Any]:
    return {
        # Exception text can carry a DSN with its password (a driver's connect error): the
        # row is read by auditors and shown in alerts, so it is stored redacted.
        "run_id": run_id, "status": status, "error": None if error is None else redact(error),
        "trades": summary.get("trades"),
        "duplicates_removed": summary.get("duplicates_removed"),
        "malformed": summary.get("malformed"), "positions": summary.get("positions"),
        "accounts": summary.get("accounts"),
        "gross_notional": summary.get("gross_notional"),
        "netting_efficiency": summary.get("netting_efficiency"),
        # A published run's timings are recorded when its leftovers are done (complete_run).
        "timings": json.dumps(summary.get("timings", {})) if with_timings else None,
    }


def finish_run(settings: Settings, run_id: int, status: str, summary: dict[str, Any],
               error: str | None = None) -> None:
    """Record the outcome of a run that did not publish. Raises ``LeaseLost`` when the run
    is no longer running: a close that took the date over recorded it ``abandoned``, and
    that record stands."""
    with connect(settings.settlement_dsn) as conn:
        cur = conn.execute(q("eod", "finish_run"),
                           _finish_params(run_id, status, summary, error))
        conn.commit()
    if cur.rowcount != 1:
        raise LeaseLost(f"run {run_id} was taken over and recorded abandoned before it "
                        f"finished; its outcome ({status}) is not recorded")


def complete_run(settings: Settings, run_id: int, timings: dict[str, float],
                 error: str | None) -> None:
    """A published run's last record: its timings, and what of its leftovers failed (the
    append-only rule lets these fill only what is empty)."""
    with connect(settings.settlement_dsn) as conn:
        conn.execute(q("eod", "complete_run"), {
            "run_id": run_id, "timings": json.dumps(timings),
            "error": None if error is None else redact(error)})
        conn.commit()


def stage_results(settings: Settings, run_id: int, result: SettlementResult) -> None:
    """The run's results into the run-tagged tables (not yet published)."""
    rows = {"positions": result.positions, "cash_obligations": result.obligations,
            "instrument_summary": result.instruments}
    with connect(settings.settlement_dsn) as conn:
        # The month's partitions of the close's tables first (and the next month's, a week
        # ahead), committed on their own: a new month's attach then holds no lock while the
        # rows are copied (sql/migrations/0024).
        conn.execute(q("eod", "settlement_partitions"), {"trade_date": result.trade_date})
        conn.commit()
        with conn.transaction():
            for table, row_type in RESULT_TABLES.items():
                # Table and column names are constants of the row types, not data.
                columns = ", ".join(("run_id", *row_type._fields))
                with conn.cursor().copy(
                    f"copy run_{table} ({columns}) from stdin"  # type: ignore[arg-type]
                ) as copy:
                    for row in rows[table]:
                        copy.write_row((run_id, *row))


@dataclass(frozen=True)
class RunRecord:
    """What a close's publishing transaction records beside the positions: the run's end
    (its figures, status ``succeeded``), its validation verdict and its report's facts."""

    summary: dict[str, Any]
    validation: dict[str, Any]
    success: bool
    report: PlannedReport | None


@dataclass(frozen=True)
class Published:
    """What one publishing transaction committed."""

    run_id: int
    version: int
    instructions: InstructionSet | None
    instructions_error: str | None  # why the set could not be made (no settlement date)


def hold_at_most(conn: psycopg.Connection, settings: Settings) -> None:
    """This transaction holds the date's lease row (the fence) and the instruction writers'
    lock: if its client freezes or goes silent, the server ends it within half a lease, so
    the date is free for a takeover within lease + that, not when the operating system gives
    up on the connection (about two hours). A frozen process answers TCP keepalives, hence
    the idle timeout; a vanished host does not, hence the keepalives."""
    idle = max(1, int(settings.close_lease_seconds / 2))
    conn.execute(q("eod", "hold_at_most"), {"idle": f"{idle}s", "probe": str(max(1, idle // 3)),
                                           "user_timeout": str(idle * 1000)})


class BaseMoved(Exception):
    """A held re-close whose base is no longer the published run: it was computed against a
    day that another publication has replaced."""


def publish(settings: Settings, run_id: int, trade_date: str,
            accepted_incomplete: str | None, lease: Lease | None = None,
            record: RunRecord | None = None, base_run: int | None = None) -> Published:
    """The commit point of a close: in one transaction, the run's rows replace the date's
    published rows, the run becomes the date's next version, its instruction set is written
    (every id and line) and, with ``record``, the run's end, verdict and report facts. Readers
    see the old day or the new one, never a mix; a close that dies after the commit leaves a
    day whose every fact is committed, and whoever comes next only writes the files. With
    the close's ``lease``, only while it still holds the date (the fencing token); with
    ``base_run`` (a held re-close), only while that run is still the published one."""
    params = {"run_id": run_id, "trade_date": trade_date,
              "accepted_incomplete": accepted_incomplete}
    with connect(settings.settlement_dsn) as conn, conn.transaction():
        hold_at_most(conn, settings)
        if lease is not None:
            lease.check_fence(conn)
        # Publications of a date are serialised, and a run never replaces one that started
        # after it: an older run finishing late would otherwise overwrite a newer day whose
        # asset was already emitted.
        conn.execute(q("eod", "lock_publication"), params)
        row = conn.execute(q("eod", "published_run"), params).fetchone()
        current = None if row is None else int(row[0])
        if base_run is not None and current != base_run:
            raise BaseMoved(f"run {run_id} was computed against run {base_run}, but the "
                            f"published run of {trade_date} is now {current}: not "
                            "publishing it; re-close the date again")
        if current is not None and current > run_id:
            raise Superseded(current)
        for table in RESULT_TABLES:
            conn.execute(q("eod", f"delete_{table}"), params)
            conn.execute(q("eod", f"publish_{table}"), params)
        conn.execute(q("eod", "mark_published"), params)
        conn.execute(q("eod", "record_publication"), params)
        if record is not None:
            if conn.execute(q("eod", "finish_run"), _finish_params(
                    run_id, "succeeded", record.summary, None, with_timings=False)
                            ).rowcount != 1:
                raise LeaseLost(f"run {run_id} was taken over and recorded abandoned: "
                                "not publishing")
            conn.execute(q("eod", "record_validation"), {
                "run_id": run_id, "success": record.success,
                "validation": json.dumps(record.validation, default=str),
                "report_path": None if record.report is None
                else str(record.report.files.html)})
        day, why = None, None
        try:
            day = for_run(conn, settings, trade_date, run_id)
        except InstructionsError as e:  # no settlement date: the day stands, the error says
            why = f"the settlement instructions were not written: {e}"
        if record is not None and record.report is not None:
            from settlement.report import store_report
            from settlement.report.facts import settlement_facts

            record.report.facts["settlement"] = settlement_facts(
                None if day is None else planned(settings, day))
            store_report(conn, record.report)
        version = int(conn.execute(q("eod", "run_version"), params).fetchone()[0])  # type: ignore[index]
        crash_point(settings.crash_at, "publish.before_commit")
    crash_point(settings.crash_at, "publish.after_commit")
    return Published(run_id, version, day, why)


class Superseded(Exception):
    """A run of the same date that started later has already published."""

    def __init__(self, newer_run: int):
        super().__init__(f"run {newer_run} started later and has already published the date")
        self.newer_run = newer_run


def run_version(settings: Settings, run_id: int) -> int | None:
    with connect(settings.settlement_dsn) as conn:
        row = conn.execute(q("eod", "run_version"), {"run_id": run_id}).fetchone()
    return None if row is None or row[0] is None else int(row[0])


def delta_size(settings: Settings, run_id: int, trade_date: str) -> dict[str, Any]:
    """How far a run's positions are from the published day's: what an operator approves."""
    with connect(settings.settlement_dsn) as conn:
        row = conn.execute(q("eod", "delta_size"),
                           {"run_id": run_id, "trade_date": trade_date}).fetchone()
    assert row is not None
    return {"positions": int(row[0]), "accounts": int(row[1]), "quantity_moved": int(row[2]),
            "cash_moved": str(row[3])}


class NotHeld(Exception):
    """The run named is not a validated, unpublished run of the date."""


class SameApprover(Exception):
    """The operator approving a held re-close is the one who asked for it."""


def publish_held(settings: Settings, run_id: int, trade_date: str,
                 progress: Callable[[str], None] | None = None,
                 approved_by: str | None = None) -> dict[str, Any]:
    """Publish a run that was computed, validated and held for approval, as the date's next
    version, under the date's lease (a close of the date in progress is waited for, and a
    run started after this one that already published wins: ``Superseded``), only while the
    run it was computed against is still the published one (``BaseMoved``), and never on
    the approval of whoever asked for it (``SameApprover``). Its instruction set commits with
    it; then the set's files. Returns the version and the instructions."""
    settings = settings.for_component("settlement")
    say = progress or (lambda _step: None)
    with connect(settings.settlement_dsn) as conn:
        row = conn.execute(q("eod", "held_run"),
                           {"run_id": run_id, "trade_date": trade_date}).fetchone()
    if row is None or row[0] != "succeeded" or row[1] is not True or row[2]:
        raise NotHeld(f"run {run_id} is not a validated, unpublished run of {trade_date} "
                      f"(status, validation, published: {row and row[:3]}); compute it again")
    base_run, triggered_by = row[3], row[4]
    if approved_by is not None and triggered_by is not None and approved_by == triggered_by:
        raise SameApprover(f"run {run_id} was asked for by {triggered_by}: its approval must "
                           "come from another operator")
    got = acquire(settings, trade_date, ttl=settings.close_lease_seconds,
                  wait_seconds=settings.close_wait_seconds, say=say)
    if isinstance(got, Joined):
        # The close that held the date has finished (a joined wait returns then): this run
        # is still the one approved, so take the lease for it now.
        got = acquire(settings, trade_date, ttl=settings.close_lease_seconds,
                      wait_seconds=settings.close_wait_seconds, say=say)
        if isinstance(got, Joined):
            raise RuntimeError(f"another close of {trade_date} holds its lease; publish "
                               f"run {run_id} again once it has finished")
    try:
        published = publish(settings, run_id, trade_date, None, got,
                            base_run=None if base_run is None else int(base_run))
        sent, sent_error = _instruction_files(settings, published, {}, say)
    finally:
        got.release()
    say(f"run {run_id} published as version {published.version} of {trade_date}")
    return {"run_id": run_id, "trade_date": trade_date, "published": True,
            "version": published.version, "instructions": sent,
            "instructions_error": sent_error}


def record_decision(settings: Settings, run_id: int, trade_date: str, decision: str,
                    decided_by: str, delta: dict[str, Any], outcome: str) -> int:
    """An operator's approval or rejection of a held re-close, in the audit trail."""
    with connect(settings.for_component("settlement").settlement_dsn) as conn:
        row = conn.execute(q("eod", "record_decision"), {
            "run_id": run_id, "trade_date": trade_date, "decision": decision,
            "decided_by": decided_by, "delta": json.dumps(delta), "outcome": outcome,
        }).fetchone()
        conn.commit()
    assert row is not None
    return int(row[0])


def published_run(settings: Settings, trade_date: str) -> int | None:
    with connect(settings.settlement_dsn) as conn:
        row = conn.execute(q("eod", "published_run"), {"trade_date": trade_date}).fetchone()
    return None if row is None else int(row[0])


def stored_positions(settings: Settings, trade_date: str) -> list[Position]:
    with connect(settings.settlement_dsn) as conn:
        rows = conn.execute(q("eod", "stored_positions"), {"trade_date": trade_date}).fetchall()
    return rows_of(Position, rows)


def _since_process_start() -> float:
    """Seconds since this process started (Linux: /proc/self/stat's start time in clock
    ticks after boot, against /proc/uptime); 0.0 where that cannot be read."""
    import os

    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0.0
    return round(max(uptime - started, 0.0), 3)


def _timed(timings: dict[str, float], step: str, fn: Callable[[], T]) -> T:
    t0 = time.perf_counter()
    try:
        return fn()
    finally:
        timings[f"{step}_seconds"] = round(time.perf_counter() - t0, 3)


def run_eod(settings: Settings, trade_date: str, source: str = "auto",
            validate: bool = True, reason: str | None = None,
            accept_incomplete: str | None = None,
            progress: Callable[[str], None] | None = None,
            only_if_unsettled: bool = False, reclose: bool = False,
            hold: bool = False, triggered_by: str | None = None) -> dict[str, Any]:
    """Close one date: take the date's lease (or join the close holding it), stage the
    results, validate them, publish only if validation passed (or ``accept_incomplete``
    gives the operator's reason to publish anyway), report.

    ``reason``: when a caller (the DAG's branch) already chose the source, its reason is what
    the run records. ``validate=False`` stages the results without publishing them.
    ``progress`` is told each step as it starts (the CLI prints it: a day takes minutes).
    ``only_if_unsettled`` (scheduled closes): a date a passing run already published since
    its close markers is reported as ``already_settled_by`` that run, not settled again.
    ``reclose``: settle a published day again with the post-close amendments its amended
    closes brought (``settle eod --reclose``); without any awaiting it does nothing and says
    so (``nothing_to_reclose``). Under the date's lease, like any close: one in progress is
    joined. ``hold``: a validated result is kept for an operator's approval instead of being
    published (``publish_held`` publishes it; the eod_reclose DAG). ``triggered_by``: who
    asked for the close (recorded with the run: a held re-close's approver must be another).

    A published date is never settled again while a ledger cannot be asked whether its day
    changed (``LedgersUnreachable``), and never re-closed while a re-close of it is held
    (``RecloseHeld``). A close that finds the date published finishes what that publication
    left (its files), from what it committed.
    """
    if accept_incomplete is not None and not accept_incomplete.strip():
        raise ValueError("--accept-incomplete needs the reason the day is published anyway")
    settings = settings.for_component("settlement")
    say = progress or (lambda _step: None)
    got = acquire(settings, trade_date, ttl=settings.close_lease_seconds,
                  wait_seconds=settings.close_wait_seconds, say=say)
    if isinstance(got, Joined):
        return joined_summary(settings, trade_date, got, say)
    try:
        for run in got.abandoned:
            say(f"run {run} of {trade_date} was left running by a close that stopped: "
                "recorded abandoned; this close takes over")
        published_now = published_run(settings, trade_date)
        markers = (None if published_now is None
                   else refuse_unprovable(settings, trade_date, published_now))
        pending = None
        if reclose:
            held = held_reclose(settings, trade_date)
            if held is not None:
                raise RecloseHeld(
                    f"{trade_date}: run {held} is a re-close held for approval against the "
                    f"published run {published_now}: approve or reject it (the eod_reclose "
                    "DAG's approval) before re-closing the date again")
            # Asked under the lease: a re-close that finished meanwhile has settled them.
            pending = awaiting_reclose(settings, trade_date)
            if not pending:
                note = (f"{trade_date}: no post-close amendments await a re-close (no amended "
                        "close since the published run): nothing to do")
                say(note)
                out = {"trade_date": trade_date, "reclose": True, "nothing_to_reclose": True,
                       "pending_amendments": 0, "published": False, "publication": note,
                       "abandoned_runs": got.abandoned}
                if published_now is not None:
                    out.update(finish_published(settings, trade_date, published_now, say))
                return out
            say(f"{trade_date}: re-closing with {pending[0].amendments} post-close "
                f"amendment(s) since {pending[0].since} (published run "
                f"{pending[0].published_run}, version {pending[0].version})")
        done = (settled_by(settings, trade_date, say, markers) if only_if_unsettled
                else None)
        if done is not None:
            say(f"{trade_date}: already settled by run {done} (published after the day's "
                "close markers): nothing to do; rerun to settle it again")
            return {**latest_run(settings, trade_date, done),
                    **finish_published(settings, trade_date, done, say),
                    "already_settled_by": done, "abandoned_runs": got.abandoned}
        crash_point(settings.crash_at, "close.leased")
        out = _close(settings, trade_date, got, source, validate, reason, accept_incomplete,
                     say, hold, RunOrigin(pending[0].published_run if pending else None,
                                          triggered_by))
        if pending:
            out["reclose"] = True
            out["reclosed"] = pending[0].as_dict()
        if got.abandoned:
            out["abandoned_runs"] = got.abandoned
        return out
    finally:
        got.release()


class RecloseHeld(SettlementError):
    """A re-close of the date already waits for an operator's decision."""


class LedgersUnreachable(SettlementError):
    """A published date whose ledgers cannot all be asked whether the day changed."""


def refuse_unprovable(settings: Settings, trade_date: str, published: int) -> dict[int, int]:
    """A published date is settled again only if every ledger can be asked for the day's
    close markers: an unreachable ledger may hold a marker nobody has seen, but it may as
    well hold nothing new, and settling again would then send the same day twice (a new
    version, a new instruction set). Raises ``LedgersUnreachable``: the day stands.
    Returns the close markers' offsets it asked for (``settled_by`` compares them)."""
    seen = marker_offsets(settings, trade_date)
    if isinstance(seen, str):
        raise LedgersUnreachable(
            f"{trade_date} is published (run {published}) and {seen}: not settling it "
            "again, which could publish it twice; the published day stands. Close it again "
            "once every ledger answers (`settle status` shows them)")
    return seen


def held_reclose(settings: Settings, trade_date: str) -> int | None:
    with connect(settings.settlement_dsn) as conn:
        row = conn.execute(q("eod", "held_reclose"), {"trade_date": trade_date}).fetchone()
    return None if row is None else int(row[0])


def joined_summary(settings: Settings, trade_date: str, joined: Joined,
                   say: Callable[[str], None]) -> dict[str, Any]:
    """A close that waited for another: that run's outcome, not a computation of its own."""
    out = latest_run(settings, trade_date, joined.run_id)
    say(f"{trade_date}: joined run {joined.run_id} after {joined.waited_seconds:.0f}s: "
        f"{out['status']}")
    if out["published"]:  # its files, if it died before writing them
        out.update(finish_published(settings, trade_date, joined.run_id, say))
    return {**out, "joined_run_id": joined.run_id,
            "waited_seconds": joined.waited_seconds,
            "publication": (f"joined run {joined.run_id}, which "
                            + ("published the day" if out["published"] else
                               f"{out['status']} without publishing: {out['error'] or ''}")
                            ).rstrip(": ")}


def begin_run(settings: Settings, trade_date: str, choice: SourceChoice, lease: Lease,
              origin: RunOrigin = RunOrigin()) -> int:
    """The close's run, recorded and named in its lease. A close that cannot name it there
    (its lease session gone: its site was frozen past the lease and its server demoted
    meanwhile, issue 41's site-freeze drill) records the run failed rather than leaving it
    `running` for nobody, and raises."""
    run_id = start_run(settings, trade_date, choice, lease, origin)
    try:
        lease.attach(run_id)
    except psycopg.Error as e:
        with contextlib.suppress(LeaseLost):
            finish_run(settings, run_id, "failed", {},
                       error=f"its close lost its lease session: {type(e).__name__}: {e}")
        raise
    return run_id


@dataclass
class _Run:
    """One close's state as its steps hand it on, and what its end must release."""

    settings: Settings
    trade_date: str
    lease: Lease
    choice: SourceChoice
    run_id: int
    say: Callable[[str], None]
    summary: dict[str, Any]
    timings: dict[str, float]
    read: Any = None  # the day as read: released at the end
    day: Any = None  # the deduplicated day: unpersisted at the end
    validating: Future[ValidationOutcome] | None = None
    validation_timings: dict[str, float] = field(default_factory=dict)  # its thread's
    outcome: ValidationOutcome | None = None
    finished: bool = False  # a finished run's row is append-only (migration 0007)


@dataclass
class _Output:
    """What the publication step leaves for the files and the run's end."""

    pub: Publication
    published: Published | None = None
    planned: PlannedReport | None = None
    report: Any = None  # the report's files, once written
    report_error: str | None = None
    sent: dict[str, Any] | None = None
    sent_error: str | None = None


def _close(settings: Settings, trade_date: str, lease: Lease, source: str, validate: bool,
           reason: str | None, accept_incomplete: str | None,
           say: Callable[[str], None], hold: bool = False,
           origin: RunOrigin = RunOrigin()) -> dict[str, Any]:
    """The close of a date whose lease this process holds, as its named steps; the crash
    points (settlement.crashpoints) sit between them."""
    t0 = time.perf_counter()
    run, session, started, jvm = _begin(settings, trade_date, lease, source, reason, say,
                                        origin, validate)
    try:
        result = _read_and_net(run, session, started, jvm, validate)
        out = _Output(_verdict(run, result, accept_incomplete, hold))
        _publish_step(run, result, out)
        _derived_files(run, result, out)
        if run.outcome is not None:
            # Data Docs were built while the day was published and reported: a close ends
            # with its pages written (an operator follows the report's link).
            _timed(result.timings, "data_docs_wait", run.outcome.wait_for_docs)
        result.timings["total_seconds"] = round(time.perf_counter() - t0, 3)
        _record_end(run, result, out)
        crash_point(settings.crash_at, "close.completed")
    except Exception as e:
        if not run.finished:
            run.summary["timings"] = run.timings
            # A close that took the date over may have recorded this run abandoned already:
            # that record stands (and this close's own error is raised either way).
            with contextlib.suppress(LeaseLost):
                finish_run(settings, run.run_id, "failed", run.summary,
                           error=f"{type(e).__name__}: {e}")
        raise
    finally:
        _release(run)
    return run.summary


def _begin(settings: Settings, trade_date: str, lease: Lease, source: str,
           reason: str | None, say: Callable[[str], None], origin: RunOrigin,
           validate: bool) -> tuple[_Run, Future[Any], dict[str, float], dict[str, object]]:
    """Choose the source, start Spark's session in the background, record the run."""
    from settlement.spark.session import start_session

    # What a cold process paid before this close began (the interpreter, the imports of the
    # CLI or spark-submit's driver, the lease): the fixed cost a small day is made of.
    timings: dict[str, float] = {"before_close_seconds": _since_process_start()}
    say(f"{trade_date}: choosing the source (source={source})")
    started: dict[str, float] = {}
    jvm: dict[str, object] = {}
    early = _EarlySession.start(settings, trade_date, started, jvm)
    # The close's own modules are imported in a thread while the source is chosen: the
    # chooser mostly waits for the ledgers and Kafka, so the imports take the idle core
    # (before the JVM started beside the choice, a JVM started after it was ready 0.3-0.5 s
    # sooner this way on the 2M-trade day).
    importing = threading.Thread(target=_import_close_modules, name="close-imports",
                                 daemon=True)
    importing.start()
    choice = _timed(timings, "choose",
                    lambda: with_reason(choose_source(settings, trade_date, source), reason))
    # The JVM and the Spark session start in a thread of their own: the JVM is another
    # process, so it starts on the other core while this thread imports validation (Great
    # Expectations: about 3 s of CPU, ``validation.gximport``), makes the GX project ready
    # and records the run; a cold close paid them one after the other. When a ledger's
    # close markers gave the day's size, it started beside the choice (``_EarlySession``);
    # else it starts now, after the choice: a date no source holds is said at once, with no
    # JVM starting behind the error.
    # The session's own start-up is timed in its thread; what the close still waits for is
    # ``session_seconds``.
    session = early.session() if early is not None else None
    if session is None:
        session = start_session(settings, app_name=f"settlement-{trade_date}",
                                timings=started, day_rows=choice.day_rows(), jvm_info=jvm)
    imports_t0 = time.perf_counter()
    importing.join()
    _import_close_modules()  # done already; raises here what the thread's imports raised
    import settlement.validation.run

    timings["imports_seconds"] = round(time.perf_counter() - imports_t0, 3)
    run_id = begin_run(settings, trade_date, choice, lease, origin)
    crash_point(settings.crash_at, "close.run_started")
    say(f"run {run_id}: source {choice.source}: {choice.reason}")
    if validate:
        settlement.validation.run.prepare_context(settings)  # in a thread; validation takes it
    run = _Run(settings, trade_date, lease, choice, run_id, say,
               {"run_id": run_id, **choice.as_dict()}, timings)
    return run, session, started, jvm


class _EarlySession:
    """The Spark session of a cold close, started beside the source's choice.

    The JVM's options depend on the day's size (``settlement.spark.session.quick_jit``),
    which the choice counts exactly in about a second on a 2M-trade day (its queries are
    PostgreSQL's work, and leave this host's other core to the imports). The close markers
    say it first, by one indexed lookup (``marked_rows``): with them the JVM starts that
    second sooner, and the SQL settings are set by the exact count once it is known
    (``size_for_day``). No ledger with the day's markers, or none answering before the
    choice is made: the close starts its session after the choice, as before."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._decided = False  # the markers were counted, or the choice came first
        self._started = False
        self._session: Future[Any] = Future()

    @classmethod
    def start(cls, settings: Settings, trade_date: str, timings: dict[str, float],
              jvm: dict[str, object]) -> _EarlySession | None:
        from settlement.eod.sources import marked_rows
        from settlement.spark.session import build_session, starts_a_jvm

        if not starts_a_jvm():
            return None  # a session is up (a test's) or spark-submit started the JVM
        out = cls()

        def run() -> None:
            try:
                rows = marked_rows(settings, trade_date)
            except Exception:  # noqa: BLE001 - the close starts its session after the choice
                rows = 0
            with out._lock:
                if out._decided:
                    return  # the choice came first: the close started its own session
                out._decided, out._started = True, rows > 0
            if rows <= 0:
                return
            jvm["sized_by_close_markers"] = rows
            t0 = time.perf_counter()
            try:
                spark = build_session(settings, f"settlement-{trade_date}", day_rows=rows,
                                      jvm_info=jvm)
            except BaseException as e:  # noqa: BLE001 - raised where the session is taken
                out._session.set_exception(e)
                return
            finally:
                timings["jvm_start_seconds"] = round(time.perf_counter() - t0, 3)
            out._session.set_result(spark)

        # A daemon thread: a choice that fails (say --source kafka, and Kafka lacks the day)
        # ends the process at once, and its JVM with it (PySpark's gateway exits when its
        # parent's pipe closes).
        threading.Thread(target=run, name="spark-start", daemon=True).start()
        return out

    def session(self) -> Future[Any] | None:
        """The session started beside the choice, or None (and then none will start)."""
        with self._lock:
            self._decided = True
            return self._session if self._started else None


def _import_close_modules() -> None:
    """What a close imports beyond the CLI: validation (Great Expectations: about 3 s of
    CPU, 4 s before ``validation.gximport``), Spark's steps, the report."""
    import settlement.report
    import settlement.spark.io
    import settlement.spark.settle
    import settlement.validation.day
    import settlement.validation.run  # noqa: F401


def _read_and_net(run: _Run, session: Future[Any], started: dict[str, float],
                  jvm: dict[str, object], validate: bool) -> SettlementResult:
    """Read the day once, deduplicate it, net it (validating beside the netting), and stage
    the results in the run_* tables."""
    from settlement.spark.io import read_day
    from settlement.spark.session import size_for_day
    from settlement.spark.settle import dedupe_day, net_day
    from settlement.validation.day import ledger_figures_ahead, settled_row_sums, validate_day

    settings, trade_date, choice, lease, say = (run.settings, run.trade_date, run.choice,
                                                run.lease, run.say)
    say("starting Spark")
    # What is left of the session's start once the steps above are done.
    spark = _timed(run.timings, "session", session.result)
    # A session started beside the choice was sized by an estimate: now by the count.
    jvm["small_day"] = size_for_day(spark, settings, choice.day_rows())
    # The ledgers' checksums are one SQL aggregate each: PostgreSQL takes them while Spark
    # reads and nets the day. Not before the session is up: the JVM's start is CPU on both
    # cores, and beside the aggregate (an md5 of every trade) a 2M-trade day's Kafka close
    # waited 4.0-4.5 s for its session instead of 0.1-1.7 s.
    ahead = ledger_figures_ahead(settings, choice, trade_date) if validate else {}
    run.timings.update(started)
    run.summary["jvm"] = jvm
    # Between steps: a close whose renewal found the lease lost stops here, not after
    # computing a day it may not publish.
    lease.ensure_held()
    say(f"reading the day from {choice.source}")
    read = run.read = _timed(run.timings, "read",
                             lambda: read_day(spark, settings, choice, trade_date))
    run.summary["read_by"] = read.read_by
    lease.ensure_held()
    say("settling (dedupe and netting)")
    settle_t0 = time.perf_counter()
    day = run.day = dedupe_day(read, row_sums=validate and settled_row_sums(
        settings, choice, trade_date))
    positions: Future[list[Position]] = Future()
    if validate:
        # The suites run while the day is netted: they need the deduplicated day, and only
        # the last (the invariants) the positions, which it waits for. On two cores GX's
        # Python and the suites' queries fill what netting leaves idle (its jobs' planning,
        # its single-task stages).
        lease.ensure_held()
        say("validating (Great Expectations) while netting")
        run.validating = in_thread("validation", lambda: _timed(
            run.validation_timings, "validate", lambda: validate_day(
                settings, spark, trade_date, choice, read, day.trades, positions.result,
                ahead, docs_in_background=True, amended_trades=day.amended.rows,
                settled_symbols=day.amended.settled_symbols, amendment_rows=day.amendments)))
    try:
        settled = net_day(day, read, trade_date, choice.source,
                          on_positions=positions.set_result)
    except BaseException as e:
        if not positions.done():
            positions.set_exception(e)
        raise
    run.timings["settle_seconds"] = round(time.perf_counter() - settle_t0, 3)
    # Who picked out the trades the day's amendments name (None: the day has none).
    run.summary["amended_trades_by"] = day.amended.taken_by
    lease.ensure_held()
    result = settled.result
    result.timings = {**run.timings, **result.timings}
    _timed(result.timings, "stage", lambda: stage_results(settings, run.run_id, result))
    crash_point(settings.crash_at, "close.staged")
    return result


def _verdict(run: _Run, result: SettlementResult, accept_incomplete: str | None,
             hold: bool) -> Publication:
    """The validation's outcome, and whether the day is published on it."""
    if run.validating is not None:
        run.lease.ensure_held()
        run.outcome = _timed(result.timings, "validate_wait", run.validating.result)
        run.validating = None
        # The suites' own time, from the day's dedupe (most of it beside the netting).
        result.timings.update(run.validation_timings)
    pub = decide_publication(run.outcome, accept_incomplete)
    if hold and pub.published:
        pub = Publication(False, None, "validation passed: held for an operator's approval "
                          "(not published yet)", held=True)
    crash_point(run.settings.crash_at, "close.validated")
    run.say(f"publishing: {pub.note}" if pub.published else f"not publishing: {pub.note}")
    return pub


def _publish_step(run: _Run, result: SettlementResult, out: _Output) -> None:
    """The commit point: the day's rows, the run's end and verdict, its version, the
    instruction set and the report's facts, in one fenced transaction."""
    from settlement.report import plan_report

    outcome = run.outcome
    if not (out.pub.published and outcome is not None):
        return
    try:
        out.planned = plan_report(run.settings, run.run_id, run.trade_date, run.choice,
                                  result, outcome, out.pub)
    except Exception as e:  # noqa: BLE001 - the day's verdict stands without it
        out.report_error = redact(f"the audit report was not written: "
                                  f"{type(e).__name__}: {e}")
        run.say(out.report_error)
    record = RunRecord({**run.summary, **result.summary()}, outcome.as_dict(),
                       outcome.success, out.planned)
    try:
        out.published = _timed(result.timings, "publish", lambda: publish(
            run.settings, run.run_id, run.trade_date, out.pub.accepted_incomplete, run.lease,
            record))
        run.finished = True  # the run's end and verdict committed with the day
    except Superseded as e:
        out.pub = Publication(False, None, f"not published: {e}; this run's results are "
                              "kept in the run_* tables", superseded_by=e.newer_run)
        run.say(out.pub.note)


def _derived_files(run: _Run, result: SettlementResult, out: _Output) -> None:
    """The files derived from what was committed (instructions, the report), or the report
    of a day that was not published."""
    from settlement.report import render_report, write_report

    settings, say = run.settings, run.say
    if out.published is not None:
        out.sent, out.sent_error = _instruction_files(settings, out.published, result.timings,
                                                      say)
        crash_point(settings.crash_at, "close.instruction_files")
        planned_report = out.planned
        if planned_report is not None:
            say("writing the audit report")
            try:
                out.report = _timed(result.timings, "report",
                                    lambda: render_report(settings, planned_report))
            except Exception as e:  # noqa: BLE001 - its facts are committed
                out.report_error = redact(f"the audit report's files were not written: "
                                          f"{type(e).__name__}: {e}")
                say(out.report_error)
        crash_point(settings.crash_at, "close.report_files")
    elif run.outcome is not None:
        outcome = run.outcome
        say("writing the audit report")
        try:
            out.report = _timed(result.timings, "report", lambda: write_report(
                settings, run.run_id, run.trade_date, run.choice, result, outcome, out.pub,
                None))
        except Exception as e:  # noqa: BLE001 - the run's verdict stands without it
            out.report_error = redact(f"the audit report was not written: "
                                      f"{type(e).__name__}: {e}")
            say(out.report_error)


def _record_end(run: _Run, result: SettlementResult, out: _Output) -> None:
    """The run's summary, and its end recorded (completed after a publication, which
    committed its end already; finished with its verdict otherwise)."""
    from settlement.validation.day import record_validation

    settings, summary, pub, outcome = run.settings, run.summary, out.pub, run.outcome
    summary.update(result.summary())
    summary.update({"published": pub.published, "publication": pub.note,
                    "accepted_incomplete": pub.accepted_incomplete,
                    "version": None if out.published is None else out.published.version})
    if pub.held:
        summary["held_for_approval"] = True
        summary["delta"] = delta_size(settings, run.run_id, run.trade_date)
    # A superseded run did its work correctly: a newer run of the date simply won.
    status = ("failed" if outcome is not None and not pub.published
              and pub.superseded_by is None and not pub.held else "succeeded")
    error = None if status == "succeeded" else pub.note
    for key, why in (("instructions_error", out.sent_error),
                     ("report_error", out.report_error)):
        if why is not None:
            error = f"{error}; {why}" if error else why
            summary[key] = why
    if out.sent is not None:
        summary["settlement_date"] = out.sent["settlement_date"]
        summary["instructions"] = out.sent
    if out.published is not None:
        complete_run(settings, run.run_id, result.timings, error)
    else:
        finish_run(settings, run.run_id, status, summary, error=error)
        run.finished = True
        if outcome is not None:
            record_validation(settings, run.run_id, outcome,
                              None if out.report is None else str(out.report.html))
        if pub.held:
            crash_point(settings.crash_at, "reclose.held")
    summary["status"] = status
    if outcome is not None:
        summary.update({"validation_success": outcome.success,
                        "validation": outcome.as_dict()})
    if out.report is not None:
        summary.update({"report_path": str(out.report.html),
                        "report_json": str(out.report.json)})


def _release(run: _Run) -> None:
    """What a close holds, let go whatever happened."""
    from settlement.validation.run import discard_prepared

    if run.validating is not None:
        # A close that failed while validating: its suites end before the day they query
        # is released (the invariants' wait for positions fails at once).
        with contextlib.suppress(BaseException):
            run.outcome = run.validating.result()
    if run.outcome is not None:  # a close that failed after validating: no pages left behind
        with contextlib.suppress(Exception):
            run.outcome.wait_for_docs()
    discard_prepared(run.settings)  # one it did not take is this close's only
    if run.day is not None:
        run.day.trades.unpersist()
    if run.read is not None:
        run.read.release()


def _instruction_files(settings: Settings, published: Published,
                       timings: dict[str, float], say: Callable[[str], None]
                       ) -> tuple[dict[str, Any] | None, str | None]:
    """The committed instruction set's files beside the report (which links them). Files
    that cannot be written leave the published day and its set standing: the error is
    recorded against the run and `settle instructions --date` writes them later, from the
    same set."""
    if published.instructions is None:
        if published.instructions_error is not None:
            say(published.instructions_error)
        return None, published.instructions_error
    say("writing the settlement instructions")
    day = published.instructions
    try:
        sent = _timed(timings, "instructions", lambda: write_set_files(settings, day))
    except Exception as e:  # noqa: BLE001 - the day's publication stands without them
        why = redact(f"the settlement instruction files were not written: "
                     f"{type(e).__name__}: {e}")
        say(why)
        return None, why
    say(f"{sent['instructions']} settlement instructions for {sent['settlement_date']}: "
        + ", ".join(sent["paths"].values()))
    return sent, None


def finish_published(settings: Settings, trade_date: str, run_id: int,
                     say: Callable[[str], None]) -> dict[str, Any]:
    """What a close that finds the date published by ``run_id`` finishes for it, from what
    that publication committed: the files of its instruction set and its audit report's
    files. It never computes the day, publishes or makes a new instruction set."""
    from settlement.report import render_report, stored_report

    out: dict[str, Any] = {}
    try:
        out["instructions"] = write_files(settings, trade_date)
    except (InstructionsError, OSError) as e:  # the publication stands without its files
        out["instructions_error"] = redact(str(e))
        say(f"{trade_date}: run {run_id}'s instruction files were not written: "
            f"{out['instructions_error']}")
    report = stored_report(settings, run_id)
    if report is not None and report.run_id == run_id:
        files = report.files
        try:
            if not (files.html.exists() and files.json.exists()):
                render_report(settings, report)
                say(f"{trade_date}: wrote run {run_id}'s audit report from its committed "
                    f"facts ({files.html})")
        except OSError as e:  # another site's path this host cannot write: the row stands
            out["report_error"] = redact(f"the audit report's files were not written: {e}")
            say(f"{trade_date}: {out['report_error']}")
        out.update({"report_path": str(files.html), "report_json": str(files.json)})
    return out


def decide_publication(outcome: ValidationOutcome | None,
                       accept_incomplete: str | None) -> Publication:
    """Only validated results are published; an operator may force a failed day, with a
    reason that is recorded."""
    if outcome is None:
        return Publication(False, None, "not validated: results staged in run_* tables only")
    if outcome.success:
        return Publication(True, None, "validation passed: published")
    failed = len(outcome.failures)
    if accept_incomplete:
        return Publication(True, accept_incomplete.strip(),
                           f"validation failed ({failed} checks) but published by operator "
                           f"decision: {accept_incomplete.strip()}")
    return Publication(False, None,
                       f"validation failed ({failed} checks): not published; the previously "
                       "published day is unchanged and this run's results are kept in the "
                       "run_* tables")


def validate_only(settings: Settings, trade_date: str, source: str = "auto") -> dict[str, Any]:
    """``settle validate``: read the day once and check it against the published results."""
    from settlement.spark import transforms as T
    from settlement.spark.io import read_day
    from settlement.spark.session import build_session
    from settlement.validation.day import validate_day

    settings = settings.for_component("settlement")
    choice = choose_source(settings, trade_date, source)
    spark = build_session(settings, app_name=f"validate-{trade_date}")
    read = read_day(spark, settings, choice, trade_date)
    trades = (read.trades if read.unique_ids or read.deduplicated
              else T.dedupe_trades(read.trades)).persist()
    try:
        n = trades.count()
        outcome = validate_day(settings, spark, trade_date, choice, read, trades,
                               stored_positions(settings, trade_date) or None)
    finally:
        trades.unpersist()
        read.release()
    return {"trade_date": trade_date, "source": choice.source,
            "source_reason": choice.reason, "trades": n, **outcome.as_dict()}


def latest_run(settings: Settings, trade_date: str, run_id: int | None = None
               ) -> dict[str, Any]:
    """The newest run of a date as recorded, or its run ``run_id`` (what the DAG reports
    after spark-submit)."""
    with connect(settings.for_component("auditor").settlement_dsn) as conn:
        row = conn.execute(q("eod", "latest_run_any"),
                           {"trade_date": trade_date, "run_id": run_id}).fetchone()
    if row is None:
        raise RuntimeError(f"no settlement run recorded for {trade_date}")
    (run_id, status, source, source_reason, trades, success, validation,
     report_path, error, published, accepted) = row
    return {"run_id": run_id, "trade_date": trade_date, "status": status, "source": source,
            "source_reason": source_reason, "trades": trades, "validation_success": success,
            "validation": validation or {}, "report_path": report_path, "error": error,
            "published": published, "accepted_incomplete": accepted}
