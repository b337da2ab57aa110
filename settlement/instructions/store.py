"""Instructions in the settlement database: written once per published run, with the fails
they carry in; the settlement agent's answers recorded all or nothing."""

from __future__ import annotations

import csv
import datetime as dt
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg

from settlement.config import Settings
from settlement.crashpoints import crash_point
from settlement.db import connect, q
from settlement.instructions.calendar import CalendarError, settlement_date
from settlement.instructions.model import (
    STATUS_COLUMNS,
    CarriedFail,
    Instruction,
    Net,
    build,
    delta,
    in_minor_units,
    marked,
    minor_units,
    reinstruct,
    unsettled_part,
)


class InstructionsError(ValueError):
    """Instructions cannot be given (the day is not published, the date has no settlement
    date) or an answer file is refused; the message says why and what to do."""


@dataclass(frozen=True)
class InstructionSet:
    trade_date: str
    settlement_date: str
    run_id: int
    version: int
    lines: list[Instruction]
    carried_in: list[str] = field(default_factory=list)  # the fails these lines took over
    mode: str = "ccp"  # the mode the set was written in (settings.instructions_mode)
    # custodian mode: when the set was written (its messages' creation time, so a file
    # written again is the same bytes) and the minor units' rounding residual
    created: dt.datetime | None = None
    rounding_residual: Decimal = Decimal(0)

    def as_dict(self) -> dict[str, Any]:
        out = {"trade_date": self.trade_date, "settlement_date": self.settlement_date,
               "run_id": self.run_id, "version": self.version,
               "instructions": len(self.lines), "carried_in": self.carried_in,
               "mode": self.mode}
        if self.mode == "custodian":
            out["cancellations"] = sum(x.kind == "cancel" for x in self.lines)
            out["rounding_residual"] = str(self.rounding_residual)
        return out


def _rows(rows: list[tuple[Any, ...]]) -> list[Instruction]:
    return [Instruction(*r) for r in rows]


def instructions(settings: Settings, trade_date: str) -> InstructionSet:
    """The published run's instructions for its settlement date: the set its publishing
    transaction committed (``for_run``). A day published before sets were committed with it
    gets its set written here, once (in one transaction with the fails it carries in, so a
    fail is carried once)."""
    s = settings.for_component("settlement")
    with connect(s.settlement_dsn) as conn, conn.transaction():
        row = conn.execute(q("instructions", "published_run"),
                           {"trade_date": trade_date}).fetchone()
        if row is None:
            raise InstructionsError(f"{trade_date} has no published run: settle it first "
                                    f"(settle eod --date {trade_date})")
        return for_run(conn, s, trade_date, int(row[0]))


def for_run(conn: psycopg.Connection, settings: Settings, trade_date: str,
            run_id: int) -> InstructionSet:
    """Run ``run_id``'s instruction set, in the caller's transaction: the one stored, else
    written now (the publishing transaction calls this, so a published version and its
    instructions commit together, or neither does)."""
    conn.execute(q("instructions", "lock"))
    row = conn.execute(q("instructions", "run_settlement"), {"run_id": run_id}).fetchone()
    assert row is not None, f"run {run_id} is not recorded"
    sdate, version, mode = row[0], int(row[1]), row[2]
    if row[3] != trade_date:  # its nets are read by its date: another would find none
        raise InstructionsError(f"run {run_id} settled {row[3]}, not {trade_date}")
    if sdate is None:
        try:
            sdate = settlement_date(settings, trade_date)
        except CalendarError as e:
            raise InstructionsError(f"{trade_date}: no settlement date: {e}") from None
    nets = None
    if mode is None:  # written now, in this deployment's mode
        mode = settings.instructions_mode
        params = {"run_id": run_id, "trade_date": trade_date, "settlement_date": str(sdate)}
        nets = _nets(conn, run_id, trade_date)
        if mode == "custodian":
            _write_custodian(conn, settings, params, version, nets)
        else:
            _write(conn, settings, params, version, nets)
        conn.execute(q("instructions", "set_mode"), {"run_id": run_id, "mode": mode})
    return _stored(conn, settings, trade_date, str(sdate), run_id, version, mode, nets)


def _stored(conn: psycopg.Connection, settings: Settings, trade_date: str, sdate: str,
            run_id: int, version: int, mode: str,
            nets: dict[tuple[str, str], Net] | None = None) -> InstructionSet:
    """The set as stored (``nets``: the run's, when the caller has read them already)."""
    have = _rows(conn.execute(q("instructions", "run_instructions"),
                              {"run_id": run_id}).fetchall())
    carried = sorted({i for line in have for i in line.carried_from.split(";") if i})
    if mode != "custodian":
        return InstructionSet(trade_date, sdate, run_id, version, have, carried)
    row = conn.execute(q("instructions", "run_created"), {"run_id": run_id}).fetchone()
    _, residual = in_minor_units(_nets(conn, run_id, trade_date) if nets is None else nets,
                                 minor_units(settings.settlement_currency))
    return InstructionSet(trade_date, sdate, run_id, version, have, carried, mode, row[0],
                          residual)


def _nets(conn: psycopg.Connection, run_id: int, trade_date: str
          ) -> dict[tuple[str, str], Net]:
    return {(a, sym): Net(int(qty), Decimal(cash)) for a, sym, qty, cash in
            conn.execute(q("instructions", "run_nets"),
                         {"run_id": run_id, "trade_date": trade_date})}


# The columns ``_insert`` copies, in order: the run's id, then an Instruction's fields.
_INSERTED = ", ".join(("run_id", *Instruction._fields))


def _insert(conn: psycopg.Connection, run_id: int, lines: list[Instruction]) -> None:
    """The lines into settlement_instructions by COPY: a day's set is one line per account
    and instrument (12,000 for the 2M-trade benchmark day), and one INSERT a line, even
    pipelined, took 0.4-0.5 s of the publishing transaction."""
    with conn.cursor().copy(
            f"copy settlement_instructions ({_INSERTED}) from stdin"  # type: ignore[arg-type]
    ) as copy:
        for line in lines:
            copy.write_row((run_id, *line))


def _write(conn: psycopg.Connection, settings: Settings, params: dict[str, Any],
           version: int, nets: dict[tuple[str, str], Net]) -> None:
    """ccp mode: the day's nets plus the open fails carried in at market (``_carry``), whole
    sets per version."""
    fails = [CarriedFail(i, a, sym, int(qty), Decimal(amt)) for i, a, sym, qty, amt in
             conn.execute(q("instructions", "open_fails"), params)]
    at_market = _carry(conn, settings, params, fails)
    _insert(conn, params["run_id"], build(params["run_id"], version, params["trade_date"],
                                          params["settlement_date"], nets, at_market))


def _carry(conn: psycopg.Connection, settings: Settings, params: dict[str, Any],
           fails: list[CarriedFail]) -> list[CarriedFail]:
    """ccp mode: open fails taken into run ``params["run_id"]``'s set, each marked to the
    closing price of the set's trade date (``model.marked``; the latest close before it when
    the instrument did not trade that day). Each mark is recorded with the open position's
    first settlement date and its age in settlement days on the set's settlement date, and
    the fails are marked as carried. Returns them at market, as they go into lines."""
    if not fails:
        return []
    from settlement.instructions.calendar import SettlementCalendar

    run_id, sdate = params["run_id"], dt.date.fromisoformat(params["settlement_date"])
    prices = {sym: (price, when) for sym, price, when in conn.execute(
        q("instructions", "mark_prices"),
        {"run_id": run_id, "trade_date": params["trade_date"],
         "symbols": sorted({f.symbol for f in fails})})}
    first = {i: origin for i, _, origin in conn.execute(
        q("instructions", "fail_origins"), {"ids": [f.instruction_id for f in fails]})}
    cal = SettlementCalendar.from_settings(settings)
    out: list[CarriedFail] = []
    for fail in fails:
        price, when = prices.get(fail.symbol, (None, None))
        at_market, mark = marked(fail, None if price is None else Decimal(price))
        out.append(at_market)
        conn.execute(q("instructions", "insert_mark"), {
            "run_id": run_id, "instruction_id": fail.instruction_id, "account": fail.account,
            "symbol": fail.symbol, "quantity": fail.quantity, "carried_amount": fail.amount,
            "close_price": price if fail.quantity else None,
            "price_date": when if fail.quantity else None,
            "marked_amount": at_market.amount, "mark": mark,
            "first_settlement_date": first[fail.instruction_id],
            "age_days": cal.days_between(first[fail.instruction_id], sdate)})
    conn.execute(q("instructions", "carry"),
                 {"run_id": run_id, "ids": [f.instruction_id for f in fails]})
    return out


def _carry_late(conn: psycopg.Connection, settings: Settings,
                fails: list[tuple[Instruction, CarriedFail]]) -> list[dict[str, Any]]:
    """ccp mode: fails answered after the set of the next settlement date was written go
    into that set now, as added lines (kind ``carry``, ids ``R<run>-L<n>``) at market, so an
    answer after the next close still reaches the next settlement date. A fail with no later
    set written yet waits for it (``open_fails``). Returns where each group went."""
    into: dict[int, tuple[tuple[Any, ...], list[CarriedFail]]] = {}
    for instr, fail in fails:
        row = conn.execute(q("instructions", "next_set"),
                           {"settlement_date": instr.settlement_date}).fetchone()
        if row is not None:
            into.setdefault(int(row[0]), (tuple(row), []))[1].append(fail)
    out: list[dict[str, Any]] = []
    for run_id, ((_, trade_date, sdate, version, before), group) in sorted(into.items()):
        params = {"run_id": run_id, "trade_date": trade_date, "settlement_date": sdate}
        lines = build(run_id, int(version), trade_date, sdate, {},
                      _carry(conn, settings, params, group),
                      ids=lambda n, r=run_id, b=int(before): f"R{r}-L{b + n:06d}")
        _insert(conn, run_id, [x._replace(kind="carry") for x in lines])
        out.append({"trade_date": trade_date, "settlement_date": sdate, "run_id": run_id,
                    "fails": sorted(f.instruction_id for f in group),
                    "lines": [x.instruction_id for x in lines]})
    return out


def _write_custodian(conn: psycopg.Connection, settings: Settings, params: dict[str, Any],
                     version: int, nets: dict[tuple[str, str], Net]) -> None:
    """custodian mode: amounts in minor units; fails are not carried (a failed instruction
    stays pending with the agent); a later version cancels and re-instructs only what
    changed (``model.reinstruct``)."""
    rounded, _ = in_minor_units(nets, minor_units(settings.settlement_currency))
    live = [(Instruction(*r[:13]), Net(int(r[13]), Decimal(r[14])))
            for r in conn.execute(q("instructions", "standing"), params)]
    run_id, trade_date, sdate = params["run_id"], params["trade_date"], params["settlement_date"]
    _insert(conn, run_id, reinstruct(run_id, version, trade_date, sdate, rounded, live))


def delta_set(settings: Settings, trade_date: str) -> InstructionSet:
    """``settle instructions --delta``: the change between the day's last two versions, as
    instructions (nothing already sent is rewritten; this is what to add or reverse). The
    previous version's instructions count as sent only if they were written; a previous
    version that never had any gives the current instructions whole. Stored the first time
    (kind ``delta``, in the current run), then always the same lines: the agent's answers to
    them, and to the previous version's instructions it still holds, are known."""
    current = instructions(settings, trade_date)
    if current.mode == "custodian":
        raise InstructionsError(f"{trade_date}: a custodian-mode version is already the "
                                "change: its cancellations (sese.020) and the instructions "
                                "replacing them; write it with settle instructions --date "
                                f"{trade_date}")
    s = settings.for_component("settlement")
    with connect(s.settlement_dsn) as conn, conn.transaction():
        conn.execute(q("instructions", "lock"))
        row = conn.execute(q("instructions", "previous_version"),
                           {"trade_date": trade_date, "run_id": current.run_id}).fetchone()
        if row is None:
            raise InstructionsError(f"{trade_date} has one version only (run "
                                    f"{current.run_id}): no delta; its instructions are "
                                    f"`settle instructions --date {trade_date}`")
        lines = _rows(conn.execute(q("instructions", "run_delta"),
                                   {"run_id": current.run_id}).fetchall())
        if not lines:
            sent = _rows(conn.execute(q("instructions", "run_instructions"),
                                      {"run_id": int(row[0])}).fetchall())
            lines = [x._replace(kind="delta") for x in delta(
                current.run_id, current.version, trade_date, current.settlement_date,
                current.lines, sent)]
            _insert(conn, current.run_id, lines)
    return InstructionSet(trade_date, current.settlement_date, current.run_id,
                          current.version, lines)


@dataclass(frozen=True)
class Answer:
    """One line of the settlement agent's answer file."""

    line: int
    instruction_id: str
    status: str
    settled_quantity: int | None


def read_answers(path: Path) -> list[Answer]:
    """The answer file (CSV: instruction_id, status, optional settled_quantity), every line
    checked before anything is applied; the errors name their lines."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise InstructionsError(f"{path}: cannot read the answer file: {e}") from None
    rows = list(csv.reader(text.splitlines()))
    header = [c.strip() for c in rows[0]] if rows else []
    if header not in (list(STATUS_COLUMNS[:2]), list(STATUS_COLUMNS)):
        raise InstructionsError(f"{path}: the first line must be the header "
                                f"{','.join(STATUS_COLUMNS[:2])}[,{STATUS_COLUMNS[2]}]")
    errors: list[str] = []
    out: list[Answer] = []
    seen: set[str] = set()
    for n, row in enumerate(rows[1:], start=2):
        if not any(c.strip() for c in row):
            continue
        cells = [c.strip() for c in row] + [""] * (3 - len(row))
        iid, status, settled = cells[0], cells[1], cells[2]
        if len(row) > len(header) or not iid:
            errors.append(f"line {n}: expected {len(header)} fields with an instruction_id")
            continue
        if status not in ("settled", "failed"):
            errors.append(f"line {n}: status {status!r} is neither 'settled' nor 'failed'")
            continue
        qty: int | None = None
        if settled:
            # ASCII digits only: str.isdigit also accepts "²" and other digits int() refuses.
            if not (settled.isascii() and settled.isdigit()):
                errors.append(f"line {n}: settled_quantity {settled!r} is not a whole number "
                              "(digits 0-9)")
                continue
            if status == "failed":
                errors.append(f"line {n}: a failed instruction settled nothing; a partial "
                              "settlement is status 'settled' with its settled_quantity")
                continue
            qty = int(settled)
            if qty == 0:
                errors.append(f"line {n}: settled_quantity 0 settles nothing: an instruction "
                              "that settled nothing is status 'failed'")
                continue
        if iid in seen:
            errors.append(f"line {n}: {iid} is answered twice in this file")
            continue
        seen.add(iid)
        out.append(Answer(n, iid, status, qty))
    if errors:
        raise InstructionsError(f"{path}: nothing applied: " + "; ".join(errors))
    if not out:
        raise InstructionsError(f"{path}: no answers in the file: nothing applied")
    return out


def apply_answers(settings: Settings, path: Path) -> dict[str, Any]:
    """``settle instructions status --file``: record the agent's answers, all or none.

    ccp mode: an answer is final; a fail (or the unsettled rest of a partial) is carried into
    the next settlement date's instructions until reported settled, at once if that date's
    set is written already (``carried_late``). custodian mode: a failed
    instruction stays pending with the agent and is answered again when it settles
    (``settled_quantity`` is then the total settled so far); any instruction ever sent,
    cancelled or not, and any cancellation can be answered. Every answer applied is kept in
    ``instruction_answers``."""
    answers = read_answers(path)
    s = settings.for_component("settlement")
    counts = {"settled": 0, "failed": 0, "partial": 0, "unchanged": 0}
    after_cancellation: list[dict[str, str]] = []
    with connect(s.settlement_dsn) as conn, conn.transaction():
        conn.execute(q("instructions", "lock"))
        known = {r[0]: r for r in conn.execute(q("instructions", "for_status"),
                                               {"ids": [a.instruction_id for a in answers]})}
        errors: list[str] = []
        todo: list[tuple[Answer, Instruction, bool, bool]] = []
        for a in answers:
            row = known.get(a.instruction_id)
            if row is None:
                errors.append(f"line {a.line}: unknown instruction {a.instruction_id}")
                continue
            instr, current, had, had_qty = Instruction(*row[:13]), row[13], row[14], row[15]
            custodian, cancelled_by = row[16] == "custodian", row[17]
            a = _whole(a, instr)
            had_qty = None if had_qty == instr.quantity else had_qty
            why = (_custodian_refusal(a, instr, had, had_qty) if custodian
                   else _refusal(a, instr, bool(current), had, had_qty))
            if why == "":
                counts["unchanged"] += 1
            elif why:
                errors.append(f"line {a.line}: {a.instruction_id}: {why}")
            else:
                todo.append((a, instr, had is not None, custodian))
                if cancelled_by and a.status == "settled":
                    after_cancellation.append({"instruction_id": a.instruction_id,
                                               "cancellation": cancelled_by})
        if errors:
            raise InstructionsError(f"{path}: nothing applied: " + "; ".join(errors))
        dates: set[str] = set()
        carry: list[tuple[Instruction, CarriedFail]] = []
        for a, instr, again, custodian in todo:
            rest = (None if instr.kind == "cancel" else
                    unsettled_part(instr, None if a.status == "failed" else
                                   (a.settled_quantity if a.settled_quantity is not None
                                    else instr.quantity)))
            kind = ("failed" if a.status == "failed" else
                    "partial" if rest is not None else "settled")
            counts[kind] += 1
            params = {"instruction_id": a.instruction_id, "status": a.status,
                      "settled_quantity": a.settled_quantity,
                      "open_quantity": 0 if rest is None else rest.quantity,
                      "open_amount": Decimal(0) if rest is None else rest.amount,
                      "source_file": str(path), "line": a.line}
            conn.execute(q("instructions", "update_status" if again else "insert_status"),
                         params)
            conn.execute(q("instructions", "insert_answer"), params)
            dates.add(instr.settlement_date)
            if rest is not None and not custodian:
                carry.append((instr, rest))
        carried_late = _carry_late(conn, s, carry)
        shares = [{"settlement_date": d, "trade_date": t, "instructions": int(n),
                   "open_fails": int(f), "share": round(int(f) / int(n), 4)}
                  for d, t, n, f in conn.execute(q("instructions", "fail_share"),
                                              {"dates": sorted(dates)})]
        crash_point(s.crash_at, "answers.before_commit")
    crash_point(s.crash_at, "answers.after_commit")
    return {"file": str(path), **counts, "fail_shares": shares,
            "over_threshold": [x for x in shares if x["share"] > s.fails_alert_share],
            "fails_alert_share": s.fails_alert_share,
            # Settled although a re-close had cancelled it: the agent settled it before the
            # cancellation reached it, so its replacement must be cancelled by hand.
            "after_cancellation": after_cancellation,
            # Fails whose next settlement date's set was written already: added to it.
            "carried_late": carried_late}


def _whole(a: Answer, instr: Instruction) -> Answer:
    """``settled`` and ``settled,<the whole quantity>`` are one answer: settled whole."""
    if a.status == "settled" and a.settled_quantity == instr.quantity:
        return Answer(a.line, a.instruction_id, a.status, None)
    return a


def _quantity_refusal(a: Answer, instr: Instruction) -> str | None:
    if a.settled_quantity is not None:
        if instr.quantity == 0:
            return "a cash-only instruction settles whole or fails: no settled_quantity"
        if a.settled_quantity > instr.quantity:
            return (f"settled_quantity {a.settled_quantity} exceeds the instruction's "
                    f"quantity {instr.quantity}")
    return None


def _refusal(a: Answer, instr: Instruction, current: bool, had: str | None,
             had_qty: int | None) -> str | None:
    """ccp mode: why an answer is refused (None: apply it; "": the same answer was recorded
    already)."""
    if had is not None:
        if had == a.status and had_qty == a.settled_quantity:
            return ""
        return (f"already answered {had}"
                + (f" ({had_qty} settled)" if had_qty is not None else "")
                + "; an answer is final: a fail is carried forward and answered there")
    if not current:
        return (f"superseded: {instr.trade_date} was published again after it; answer the "
                "current instructions (settle instructions --date "
                f"{instr.trade_date}), or, if what you sent was this version and its delta, "
                f"write the delta first (settle instructions --date {instr.trade_date} "
                "--delta): its lines and this version's are then answerable")
    return _quantity_refusal(a, instr)


def _custodian_refusal(a: Answer, instr: Instruction, had: str | None,
                       had_qty: int | None) -> str | None:
    """custodian mode: a pending instruction may be answered again as it settles; what is
    settled stays settled."""
    if had == a.status and had_qty == a.settled_quantity:
        return ""
    if instr.kind == "cancel":
        if a.settled_quantity is not None:
            return ("a cancellation is answered settled (done) or failed (refused), with no "
                    "settled_quantity")
        return None if had is None else (f"already answered {had}: the answer to a "
                                         "cancellation is final")
    if had == "settled" and had_qty is None:
        return "already settled whole: a settled instruction stays settled"
    if had == "settled" and a.status == "failed":
        return (f"{had_qty} of it settled already: the rest stays pending until answered "
                "settled")
    if had == "settled" and a.settled_quantity is not None and a.settled_quantity <= had_qty:
        return (f"settled_quantity is the total settled so far: {a.settled_quantity} is not "
                f"more than the {had_qty} recorded")
    return _quantity_refusal(a, instr)


def pending(settings: Settings, as_of: dt.date) -> list[dict[str, Any]]:
    """custodian mode: the instructions still pending with the agent (failed, or the rest of
    a partial), each with its intended settlement date, its age in settlement days on
    ``as_of`` and the date by which it must be closed out (bought in)."""
    from settlement.instructions.calendar import SettlementCalendar

    cal = SettlementCalendar.from_settings(settings)
    s = settings.for_component("settlement")
    with connect(s.settlement_dsn) as conn:
        rows = conn.execute(q("instructions", "pending")).fetchall()
    out = []
    for iid, trade, due, account, symbol, side, status, settled, qty, amount in rows:
        intended = dt.date.fromisoformat(due)
        out.append({"instruction_id": iid, "trade_date": trade, "intended_settlement_date": due,
                    "account": account, "symbol": symbol, "side": side, "status": status,
                    "settled_quantity": settled, "open_quantity": int(qty),
                    "open_amount": str(amount),
                    "age_days": cal.days_between(intended, as_of),
                    "close_out_date": cal.add_days(intended,
                                                   settings.fail_close_out_days).isoformat()})
    return out


def carried_out(dsn: str, run_id: int) -> list[dict[str, Any]]:
    """The fails among a run's instructions and where each went (the report page's list)."""
    with connect(dsn) as conn:
        return [{"instruction_id": i, "account": a, "symbol": sym, "status": st,
                 "open_quantity": int(qty), "open_amount": str(amt), "carried_into_run": into}
                for i, a, sym, st, qty, amt, into in
                conn.execute(q("instructions", "carried_out"), {"run_id": run_id})]


def run_set(dsn: str, run_id: int) -> InstructionSet | None:
    """A run's instructions as written (None: the run has none), for readers such as the
    report pages, which serve them from the database rather than from a file."""
    with connect(dsn) as conn:
        lines = _rows(conn.execute(q("instructions", "run_instructions"),
                                   {"run_id": run_id}).fetchall())
        mode = conn.execute(q("instructions", "run_settlement"), {"run_id": run_id}
                            ).fetchone()[2]
        created = conn.execute(q("instructions", "run_created"), {"run_id": run_id}
                               ).fetchone()[0]
    if not lines:
        return None
    carried = sorted({i for line in lines for i in line.carried_from.split(";") if i})
    return InstructionSet(lines[0].trade_date, lines[0].settlement_date, run_id,
                          lines[0].version, lines, carried, mode or "ccp", created)
