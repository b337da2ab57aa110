"""Per-member summary of a settlement date's instructions (issue 59, item 5): what each
clearing member delivers and receives, pays and is paid, and the fails it carries and how old
they are: the figures a member's operations desk checks first.

A member is the participant the reference data maps an account to (settle refdata load); an
account with no participant is its own line, marked unmapped, so nothing is summed away.
Quantities are shares across instruments (a member's securities movements in units, not
values); money is exact, in the settlement currency.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from settlement.instructions.model import PAYMENT_SIGN, Instruction

COLUMNS = ("member", "mapped", "accounts", "instructions", "securities_in", "securities_out",
           "money_in", "money_out", "net_money", "fails_carried_in",
           "oldest_fail_settlement_date", "oldest_fail_age_days")


@dataclass(frozen=True)
class CarriedIn:
    """A fail carried into the date's instructions: whose, and when it was due first."""

    instruction_id: str
    account: str
    due: dt.date  # the failed instruction's own settlement date


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
    fails_carried_in: int = 0
    oldest_fail: dt.date | None = None

    @property
    def net_money(self) -> Decimal:
        return self.money_in - self.money_out

    def age_days(self, settlement_date: dt.date) -> int | None:
        """Calendar days from the oldest carried fail's own settlement date to this one."""
        return None if self.oldest_fail is None else (settlement_date - self.oldest_fail).days

    def row(self, settlement_date: dt.date) -> list[str]:
        age = self.age_days(settlement_date)
        return [self.member, "yes" if self.mapped else "no", str(len(self.accounts)),
                str(self.instructions), str(self.securities_in), str(self.securities_out),
                f"{self.money_in:.4f}", f"{self.money_out:.4f}", f"{self.net_money:.4f}",
                str(self.fails_carried_in),
                "" if self.oldest_fail is None else self.oldest_fail.isoformat(),
                "" if age is None else str(age)]

    def as_dict(self, settlement_date: dt.date) -> dict[str, Any]:
        return dict(zip(COLUMNS, self.row(settlement_date), strict=True))


def summarize(lines: Iterable[Instruction], members: Mapping[str, str],
              carried: Iterable[CarriedIn]) -> list[MemberLine]:
    """One line per member (the participant ``members`` maps an account to, else the account
    itself, unmapped), in member order."""
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
    for fail in carried:
        line = line_of(fail.account)
        line.fails_carried_in += 1
        if line.oldest_fail is None or fail.due < line.oldest_fail:
            line.oldest_fail = fail.due
    return [out[m] for m in sorted(out)]


def to_csv(summary: list[MemberLine], settlement_date: dt.date) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(COLUMNS)
    w.writerows(line.row(settlement_date) for line in summary)
    return buf.getvalue()


def for_set(dsn: str, lines: list[Instruction], carried_in: list[str]) -> list[MemberLine]:
    """The summary of an instruction set as stored: its accounts' members from the reference
    data, its carried fails' own settlement dates."""
    from settlement.db import connect, q

    accounts = sorted({line.account for line in lines})
    with connect(dsn) as conn:
        members = dict(conn.execute(q("instructions", "members"), {"accounts": accounts}))
        carried = [CarriedIn(i, a, due) for i, a, due in
                   conn.execute(q("instructions", "carried_origins"), {"ids": carried_in})]
    return summarize(lines, members, carried)
