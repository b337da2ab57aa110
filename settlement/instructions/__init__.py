"""Settlement instructions: a published day becomes what each account delivers or receives,
and pays or is paid, on its settlement date (T+N settlement business days), with the fails
reported by the settlement agent carried into the next settlement date until they settle.

``calendar`` (the settlement date), ``model`` (lines, signs, partials), ``store`` (written
once per published run, answers applied all or nothing), ``files`` (CSV and ISO 20022),
``summary`` (per clearing member).
"""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

from settlement.config import Settings
from settlement.instructions import summary
from settlement.instructions.custodian import Held, Parties, held_csv, messages
from settlement.instructions.files import FORMATS, default_path, render
from settlement.instructions.model import minor_units
from settlement.instructions.refdata import lookup
from settlement.instructions.store import InstructionSet, instructions
from settlement.services.procs import write_private


def planned(settings: Settings, day: InstructionSet,
            formats: tuple[str, ...] = FORMATS) -> dict[str, Any]:
    """The set's summary with the ``paths`` its files have (written or not yet): what the
    publishing transaction records in the day's audit report."""
    return {**day.as_dict(),
            "paths": {fmt: str(default_path(Path(settings.reports_dir), day, fmt))
                      for fmt in formats}}


def render_set(settings: Settings, day: InstructionSet, fmt: str, dsn: str | None = None
               ) -> tuple[str, list[Held]]:
    """A set in one format, and the lines held back from it. A set written in custodian mode
    renders as its messages (settlement.instructions.custodian), naming what the reference
    data holds (read at ``dsn``, default the settlement login's); the CSV lists every line
    whichever the mode."""
    if fmt == "iso20022" and day.mode == "custodian":
        secs, parts = lookup(dsn or settings.for_component("settlement").settlement_dsn,
                             (x.symbol for x in day.lines), (x.account for x in day.lines))
        parties = Parties(settings.custodian_sender_bic, settings.custodian_receiver_bic,
                          settings.depository_bic, settings.clearing_house_bic)
        return messages(day, secs, parts, parties, settings.settlement_currency)
    return render(day, fmt, settings.settlement_currency), []


def write_rendered(settings: Settings, day: InstructionSet, fmt: str, path: Path
                   ) -> list[Held]:
    """The set's file in one format, for the owner only; a custodian set's held lines beside
    it (``-held.csv``, only when some are). Returns the held lines."""
    text, held = render_set(settings, day, fmt)
    write_private(path, text)
    held_path = path.with_name(path.stem + "-held.csv")
    if held:
        write_private(held_path, held_csv(held))
    else:  # written again after the reference data was completed: nothing is held now
        held_path.unlink(missing_ok=True)
    return held


def write_set_files(settings: Settings, day: InstructionSet,
                    formats: tuple[str, ...] = FORMATS) -> dict[str, Any]:
    """A committed set's files, one per format, and its per-member summary
    (``summary_path``; ccp mode: ``obligations_path`` too), beside the audit reports
    (rewriting them gives the same bytes: the set is the committed one). Returns
    ``planned``, the summaries' paths, the money lines' rounding residual and, in custodian
    mode, the lines held back (``held``)."""
    out = planned(settings, day, formats)
    held: list[Held] = []
    for fmt, path in out["paths"].items():
        held += write_rendered(settings, day, fmt, Path(path))
    written = write_summary(settings, day)
    del written["members"]
    out = {**out, **written}
    if day.mode == "custodian":
        out["held"] = [h.__dict__ for h in held]
    return out


def write_summary(settings: Settings, day: InstructionSet, path: Path | None = None
                  ) -> dict[str, Any]:
    """The set's per-member summary as CSV (settlement.instructions.summary), for the owner
    only, as the instructions, and in ccp mode the members' obligations per instrument
    beside it (``-obligations.csv``). Returns the paths, the member lines (``members``) and
    the money lines' rounding residual."""
    members, residual, owed = _for_set(
        settings, day, settings.for_component("settlement").settlement_dsn)
    path = path or default_path(Path(settings.reports_dir), day, "csv", "summary")
    write_private(path, summary.to_csv(members))
    out: dict[str, Any] = {"summary_path": str(path), "members": members,
                           "money_rounding_residual": str(residual)}
    if day.mode != "custodian":
        owed_path = path.with_name(path.stem.removesuffix("-summary") + "-obligations.csv")
        write_private(owed_path, summary.obligations_csv(owed))
        out["obligations_path"] = str(owed_path)
    return out


def member_summary(settings: Settings, day: InstructionSet, dsn: str
                   ) -> list[summary.MemberLine]:
    """The set's per-member lines with their money lines, read at ``dsn``."""
    return _for_set(settings, day, dsn)[0]


def _for_set(settings: Settings, day: InstructionSet, dsn: str
             ) -> tuple[list[summary.MemberLine], Decimal, list[list[str]]]:
    """summary.for_set with the settings' calendar and currency."""
    from settlement.instructions.calendar import SettlementCalendar

    return summary.for_set(dsn, day, SettlementCalendar.from_settings(settings),
                           minor_units(settings.settlement_currency))


def write_files(settings: Settings, trade_date: str,
                formats: tuple[str, ...] = FORMATS) -> dict[str, Any]:
    """The published day's committed instructions as files: what the close finishes after a
    publication, and what a close that finds the day published finishes for it."""
    return write_set_files(settings, instructions(settings, trade_date), formats)
