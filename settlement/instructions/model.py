"""Settlement instructions as data: what each account delivers or receives, and pays or is
paid, on the settlement date (delivery versus payment), built from a published day's net
positions plus the fails carried into that date (continuous net settlement).

Signs, as ../shared/design.md fixes them: ``RECE``/``RECV`` add to the account,
``DELI``/``PAY`` take from it; summed per account and instrument, an instruction's signed
quantity and amount equal the day's ``net_qty`` and ``net_cash`` plus the fails carried in.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from decimal import ROUND_HALF_EVEN, Decimal
from typing import NamedTuple

CSV_COLUMNS = ("instruction_id", "trade_date", "settlement_date", "account", "symbol", "side",
               "quantity", "payment", "amount", "version", "carried_from")
STATUS_COLUMNS = ("instruction_id", "status", "settled_quantity")
AMOUNT_SCALE = Decimal("0.0001")  # numeric(28, 4), as positions.net_cash
# What a line's side and payment do to the account: + adds, - takes.
SIDE_SIGN = {"RECE": 1, "DELI": -1, "NONE": 0}
PAYMENT_SIGN = {"RECV": 1, "PAY": -1, "NONE": 0}


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
        return SIDE_SIGN[self.side] * self.quantity

    @property
    def signed_amount(self) -> Decimal:
        return PAYMENT_SIGN[self.payment] * self.amount

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
        _add(total, (fail.account, fail.symbol), fail.quantity, fail.amount)
        sources.setdefault((fail.account, fail.symbol), []).append(fail.instruction_id)
    return _lines(total, lambda n: instruction_id(run_id, n), trade_date, settlement_date,
                  version, {k: ";".join(sorted(v)) for k, v in sources.items()})


def _add(total: dict[tuple[str, str], Net], key: tuple[str, str], quantity: int,
         amount: Decimal) -> None:
    q, a = total.get(key, Net(0, Decimal(0)))
    total[key] = Net(q + quantity, a + amount)


def _lines(total: Mapping[tuple[str, str], Net], ids: Callable[[int], str], trade_date: str,
           settlement_date: str, version: int, carried_from: Mapping[tuple[str, str], str]
           ) -> list[Instruction]:
    """One line per account and instrument whose signed net is not zero, in (account,
    symbol) order, numbered from 1 by ``ids``."""
    out: list[Instruction] = []
    for key in sorted(total):
        net = total[key]
        if net.quantity == 0 and net.amount == 0:
            continue
        side, qty, pay, amount = line_for(net)
        out.append(Instruction(ids(len(out) + 1), trade_date, settlement_date, *key, side, qty,
                               pay, amount.quantize(AMOUNT_SCALE), version,
                               carried_from.get(key, "")))
    return out


def delta(run_id: int, version: int, trade_date: str, settlement_date: str,
          new: Iterable[Instruction], sent: Iterable[Instruction]) -> list[Instruction]:
    """What must be added or reversed, per account and instrument, so that what was sent
    (the previous version's instructions) becomes the current version's: the signed
    difference, in the instructions' own columns. Ids ``R<run>-D<n>``: stable per run, apart
    from the run's own instructions."""
    diff: dict[tuple[str, str], Net] = {}
    for line in new:
        _add(diff, (line.account, line.symbol), line.signed_quantity, line.signed_amount)
    for line in sent:
        _add(diff, (line.account, line.symbol), -line.signed_quantity, -line.signed_amount)
    return _lines(diff, lambda n: f"R{run_id}-D{n:06d}", trade_date, settlement_date, version,
                  {})


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
    return CarriedFail(instr.instruction_id, instr.account, instr.symbol,
                       SIDE_SIGN[instr.side] * left,
                       PAYMENT_SIGN[instr.payment] * (instr.amount - paid))
