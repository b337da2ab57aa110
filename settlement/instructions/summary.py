"""Per-member summary of a settlement date's instructions (issue 59, item 5): what each
clearing member delivers and receives, pays and is paid, and the fails it carries and how old
they are: the figures a member's operations desk checks first.

A member is the participant the reference data maps an account to (settle refdata load); an
account with no participant is its own line, marked unmapped, so nothing is summed away.
Quantities are shares across instruments (a member's securities movements in units, not
values); money is exact, in the settlement currency, but for the money line: the member's one
money figure for the date (its lines' payments and, in ccp mode, the marks of the open
positions carried in), in the currency's minor units. In ccp mode the clearing house's line
closes the date: the money lines sum to zero but for the rounding residual, reported.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import ROUND_HALF_EVEN, Decimal
from typing import TYPE_CHECKING, Any

from settlement.instructions.model import PAYMENT_SIGN, Instruction, Net, line_for

if TYPE_CHECKING:
    from settlement.instructions.calendar import SettlementCalendar
    from settlement.instructions.store import InstructionSet

COLUMNS = ("member", "mapped", "accounts", "instructions", "securities_in", "securities_out",
           "money_in", "money_out", "net_money", "marks", "money_line", "fails_carried_in",
           "oldest_fail_settlement_date", "oldest_fail_age_days")
# ccp mode's last line: the clearing house, counterparty of every obligation. Its money line
# is what it pays out of, or takes into, the fails it stood in for (the cash the settled side
# of a failed delivery paid it) and their marks: zero when every fail had a failing
# counterpart, and what makes the date's money lines sum to zero.
CLEARING_HOUSE = "clearing house"


@dataclass(frozen=True)
class CarriedIn:
    """A fail carried into the date's instructions: whose, when the open position was first
    due and its age then, in settlement days."""

    instruction_id: str
    account: str
    due: dt.date
    age_days: int


@dataclass
class MemberLine:
    member: str
    mapped: bool
    accounts: set[str]
    instructions: int = 0
    securities_in: int = 0
    securities_out: int = 0
    money_in: Decimal = Decimal(0)
    money_out: Decimal = Decimal(0)
    marks: Decimal = Decimal(0)  # ccp mode: the marks of the open positions carried in
    money_line: Decimal | None = None  # net money and marks in minor units (``money_lines``)
    fails_carried_in: int = 0
    oldest_fail: dt.date | None = None
    oldest_age_days: int | None = None

    @property
    def net_money(self) -> Decimal:
        return self.money_in - self.money_out

    def row(self) -> list[str]:
        mapped = "" if self.member == CLEARING_HOUSE else "yes" if self.mapped else "no"
        return [self.member, mapped, str(len(self.accounts)),
                str(self.instructions), str(self.securities_in), str(self.securities_out),
                f"{self.money_in:.4f}", f"{self.money_out:.4f}", f"{self.net_money:.4f}",
                f"{self.marks:.4f}", "" if self.money_line is None else str(self.money_line),
                str(self.fails_carried_in),
                "" if self.oldest_fail is None else self.oldest_fail.isoformat(),
                "" if self.oldest_age_days is None else str(self.oldest_age_days)]

    def as_dict(self) -> dict[str, Any]:
        return dict(zip(COLUMNS, self.row(), strict=True))


def summarize(lines: Iterable[Instruction], members: Mapping[str, str],
              carried: Iterable[CarriedIn], marks: Mapping[str, Decimal] | None = None
              ) -> list[MemberLine]:
    """One line per member (the participant ``members`` maps an account to, else the account
    itself, unmapped), in member order; ``marks`` per account (ccp mode)."""
    out: dict[str, MemberLine] = {}

    def line_of(account: str) -> MemberLine:
        member = members.get(account, account)
        line = out.setdefault(member, MemberLine(member, account in members, set()))
        line.accounts.add(account)
        return line

    for instr in lines:
        line = line_of(instr.account)
        line.instructions += 1
        if instr.side == "RECE":
            line.securities_in += instr.quantity
        elif instr.side == "DELI":
            line.securities_out += instr.quantity
        sign = PAYMENT_SIGN[instr.payment]
        if sign > 0:
            line.money_in += instr.amount
        elif sign < 0:
            line.money_out += instr.amount
    for account, mark in (marks or {}).items():
        line_of(account).marks += mark
    for fail in carried:
        line = line_of(fail.account)
        line.fails_carried_in += 1
        if line.oldest_fail is None or fail.due < line.oldest_fail:
            line.oldest_fail, line.oldest_age_days = fail.due, fail.age_days
    return [out[m] for m in sorted(out)]


def money_lines(summary: list[MemberLine], digits: int, ccp: bool
                ) -> tuple[list[MemberLine], Decimal]:
    """Each member's one money figure, its net money and marks rounded half-even to the
    currency's minor units, and, in ccp mode, the clearing house's line after them (minus
    the members' exact total). Returns the lines and the rounding residual: what the rounded
    figures sum to (the exact ones sum to zero with the clearing house's)."""
    unit = Decimal(1).scaleb(-digits)
    exact = Decimal(0)
    for line in summary:
        line.money_line = (line.net_money + line.marks).quantize(unit, ROUND_HALF_EVEN)
        exact += line.net_money + line.marks
    out = list(summary)
    if ccp:
        out.append(MemberLine(CLEARING_HOUSE, True, set(),
                              money_line=(-exact).quantize(unit, ROUND_HALF_EVEN)))
    rounded = sum((x.money_line or Decimal(0) for x in out), Decimal(0))
    return out, rounded - (Decimal(0) if ccp else exact)


OBLIGATION_COLUMNS = ("member", "symbol", "side", "quantity", "payment", "amount", "accounts",
                      "instructions")


def obligations(lines: Iterable[Instruction], members: Mapping[str, str]) -> list[list[str]]:
    """ccp mode: each member's one obligation per instrument against the clearing house, its
    accounts' lines netted (signed, as the lines: RECE/RECV add to the member), in (member,
    symbol) order; the CSV's rows. An instrument whose lines net to nothing is left out."""
    nets: dict[tuple[str, str], list[Any]] = {}
    for x in lines:
        key = (members.get(x.account, x.account), x.symbol)
        net = nets.setdefault(key, [0, Decimal(0), set(), 0])
        net[0] += x.signed_quantity
        net[1] += x.signed_amount
        net[2].add(x.account)
        net[3] += 1
    rows = []
    for (member, symbol), (qty, amount, accounts, n) in sorted(nets.items()):
        if qty or amount:
            side, quantity, payment, value = line_for(Net(qty, amount))
            rows.append([member, symbol, side, str(quantity), payment, f"{value:.4f}",
                         str(len(accounts)), str(n)])
    return rows


def to_csv(summary: list[MemberLine]) -> str:
    return _csv(COLUMNS, [line.row() for line in summary])


def _csv(header: tuple[str, ...], rows: Iterable[list[str]]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(header)
    w.writerows(rows)
    return buf.getvalue()


def obligations_csv(rows: list[list[str]]) -> str:
    return _csv(OBLIGATION_COLUMNS, rows)


def for_set(dsn: str, day: InstructionSet, calendar: SettlementCalendar, digits: int
            ) -> tuple[list[MemberLine], Decimal, list[list[str]]]:
    """The summary of an instruction set as stored, with its money lines and their rounding
    residual (its accounts' members from the reference data, its carried fails' first
    settlement dates and ages, in settlement days on the set's date, its marks), and in ccp
    mode the members' obligations per instrument."""
    from settlement.db import connect, q

    lines = [x for x in day.lines if x.kind in ("instruct", "carry")]
    sdate = dt.date.fromisoformat(day.settlement_date)
    accounts = sorted({line.account for line in lines})
    with connect(dsn) as conn:
        members = dict(conn.execute(q("instructions", "members"), {"accounts": accounts}))
        carried = [CarriedIn(i, a, due, calendar.days_between(due, sdate)) for i, a, due in
                   conn.execute(q("instructions", "carried_origins"),
                                {"ids": day.carried_in, "run_id": day.run_id})]
        marks = {a: Decimal(m) for a, m in conn.execute(q("instructions", "run_marks"),
                                                        {"run_id": day.run_id})}
    ccp = day.mode != "custodian"
    out, residual = money_lines(summarize(lines, members, carried, marks if ccp else None),
                                digits, ccp)
    return out, residual, obligations(lines, members) if ccp else []
