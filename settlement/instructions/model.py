"""Settlement instructions as data: what each account delivers or receives, and pays or is
paid, on the settlement date (delivery versus payment), built from a published day's net
positions plus the fails carried into that date (continuous net settlement).

Signs, as ../shared/design.md fixes them: ``RECE``/``RECV`` add to the account,
``DELI``/``PAY`` take from it; summed per account and instrument, an instruction's signed
quantity and amount equal the day's ``net_qty`` and ``net_cash`` plus the fails carried in.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from decimal import ROUND_HALF_EVEN, Decimal
from typing import NamedTuple

CSV_COLUMNS = ("instruction_id", "trade_date", "settlement_date", "account", "symbol", "side",
               "quantity", "payment", "amount", "version", "carried_from")
STATUS_COLUMNS = ("instruction_id", "status", "settled_quantity")
AMOUNT_SCALE = Decimal("0.0001")  # numeric(28, 4), as positions.net_cash


class Instruction(NamedTuple):
    """One line of the day's instructions (the CSV columns, in order)."""

    instruction_id: str
    trade_date: str
    settlement_date: str
    account: str
    symbol: str
    side: str  # DELI | RECE | NONE
    quantity: int  # >= 0
    payment: str  # PAY | RECV | NONE
    amount: Decimal  # >= 0
    version: int
    carried_from: str  # the failed instructions carried in, ';'-separated ('' for none)

    @property
    def signed_quantity(self) -> int:
        return {"RECE": 1, "DELI": -1, "NONE": 0}[self.side] * self.quantity

    @property
    def signed_amount(self) -> Decimal:
        return {"RECV": 1, "PAY": -1, "NONE": 0}[self.payment] * self.amount

    def csv_row(self) -> list[str]:
        return [self.instruction_id, self.trade_date, self.settlement_date, self.account,
                self.symbol, self.side, str(self.quantity), self.payment,
                f"{self.amount:.4f}", str(self.version), self.carried_from]


class Net(NamedTuple):
    """What one account and instrument must settle: signed quantity and signed cash."""

    quantity: int
    amount: Decimal


class CarriedFail(NamedTuple):
    """A failed instruction (or the unsettled part of a partial) carried to a later date."""

    instruction_id: str
    account: str
    symbol: str
    quantity: int  # signed, as the instruction's
    amount: Decimal  # signed


def line_for(net: Net) -> tuple[str, int, str, Decimal]:
    """(side, quantity, payment, amount) of a signed net."""
    side = "RECE" if net.quantity > 0 else "DELI" if net.quantity < 0 else "NONE"
    pay = "RECV" if net.amount > 0 else "PAY" if net.amount < 0 else "NONE"
    return side, abs(net.quantity), pay, abs(net.amount)


def instruction_id(run_id: int, n: int) -> str:
    """Stable per run: the n-th line of run ``run_id`` in (account, symbol) order. Short
    enough for ISO 20022's TxId (35 characters)."""
    return f"R{run_id}-{n:06d}"


def build(run_id: int, version: int, trade_date: str, settlement_date: str,
          nets: Mapping[tuple[str, str], Net], carried: Iterable[CarriedFail]
          ) -> list[Instruction]:
    """The instructions of a published run: one per account and instrument whose net (the
    day's plus the fails carried in) is not zero in quantity or in cash. A fail that today's
    opposite net cancels out is carried all the same (it leaves the open fails) but makes no
    line: there is nothing left to deliver or pay."""
    total: dict[tuple[str, str], Net] = dict(nets)
    sources: dict[tuple[str, str], list[str]] = {}
    for fail in carried:
        key = (fail.account, fail.symbol)
        q, a = total.get(key, Net(0, Decimal(0)))
        total[key] = Net(q + fail.quantity, a + fail.amount)
        sources.setdefault(key, []).append(fail.instruction_id)
    out: list[Instruction] = []
    for account, symbol in sorted(total):
        net = total[(account, symbol)]
        if net.quantity == 0 and net.amount == 0:
            continue
        side, qty, pay, amount = line_for(net)
        out.append(Instruction(instruction_id(run_id, len(out) + 1), trade_date,
                               settlement_date, account, symbol, side, qty, pay,
                               amount.quantize(AMOUNT_SCALE), version,
                               ";".join(sorted(sources.get((account, symbol), [])))))
    return out


def delta(run_id: int, version: int, trade_date: str, settlement_date: str,
          new: Iterable[Instruction], sent: Iterable[Instruction]) -> list[Instruction]:
    """What must be added or reversed, per account and instrument, so that what was sent
    (the previous version's instructions) becomes the current version's: the signed
    difference, in the instructions' own columns. Ids ``R<run>-D<n>``: stable per run, apart
    from the run's own instructions."""
    diff: dict[tuple[str, str], Net] = {}
    for line, sign in [*((x, 1) for x in new), *((x, -1) for x in sent)]:
        q, a = diff.get((line.account, line.symbol), Net(0, Decimal(0)))
        diff[(line.account, line.symbol)] = Net(q + sign * line.signed_quantity,
                                                a + sign * line.signed_amount)
    out: list[Instruction] = []
    for account, symbol in sorted(diff):
        net = diff[(account, symbol)]
        if net.quantity == 0 and net.amount == 0:
            continue
        side, qty, pay, amount = line_for(net)
        out.append(Instruction(f"R{run_id}-D{len(out) + 1:06d}", trade_date, settlement_date,
                               account, symbol, side, qty, pay, amount.quantize(AMOUNT_SCALE),
                               version, ""))
    return out


def unsettled_part(instr: Instruction, settled_quantity: int | None) -> CarriedFail | None:
    """What remains to carry after the agent's answer: all of a failed instruction (None
    settled), the rest of a partial, nothing once it settled whole. The cash of a partial
    goes pro rata to the quantity delivered, rounded to the amount's scale; the part carried
    is the exact remainder, so settled and carried add up to the instruction."""
    if settled_quantity is None:
        return CarriedFail(instr.instruction_id, instr.account, instr.symbol,
                           instr.signed_quantity, instr.signed_amount)
    if settled_quantity == instr.quantity:
        return None
    left = instr.quantity - settled_quantity
    paid = (instr.amount * settled_quantity / instr.quantity).quantize(
        AMOUNT_SCALE, rounding=ROUND_HALF_EVEN)
    sign_q = 1 if instr.side == "RECE" else -1
    sign_a = {"RECV": 1, "PAY": -1, "NONE": 0}[instr.payment]
    return CarriedFail(instr.instruction_id, instr.account, instr.symbol, sign_q * left,
                       sign_a * (instr.amount - paid))
