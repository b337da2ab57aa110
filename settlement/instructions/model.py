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
LINK_COLUMNS = ("kind", "links")  # custodian mode's added columns
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
    # Custodian mode: 'cancel' lines cancel the instruction in ``links`` (sese.020); an
    # 'instruct' line of a re-close links the instructions it replaces.
    kind: str = "instruct"
    links: str = ""

    @property
    def signed_quantity(self) -> int:
        return SIDE_SIGN[self.side] * self.quantity

    @property
    def signed_amount(self) -> Decimal:
        return PAYMENT_SIGN[self.payment] * self.amount

    def csv_row(self, linked: bool = False) -> list[str]:
        """The contract's columns, and with ``linked`` custodian mode's ``kind`` and
        ``links``."""
        row = [self.instruction_id, self.trade_date, self.settlement_date, self.account,
               self.symbol, self.side, str(self.quantity), self.payment,
               f"{self.amount:.4f}", str(self.version), self.carried_from]
        return [*row, self.kind, self.links] if linked else row


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


def marked(fail: CarriedFail, price: Decimal | None) -> tuple[CarriedFail, Decimal]:
    """ccp mode: an open position carried in at market, and its mark. The position is its
    quantity at ``price`` (delivery versus payment: the receiver pays); the mark is what its
    value moved from the value it was carried with, paid in the member's money line whether
    or not the delivery settles, so that line and mark together still pay the contract. A
    cash-only fail, or one with no known price, keeps its value (mark 0)."""
    if price is None or fail.quantity == 0:
        return fail, Decimal(0)
    value = (-fail.quantity * price).quantize(AMOUNT_SCALE)
    return fail._replace(amount=value), fail.amount - value


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
          nets: Mapping[tuple[str, str], Net], carried: Iterable[CarriedFail],
          ids: Callable[[int], str] | None = None) -> list[Instruction]:
    """The instructions of a published run: one per account and instrument whose net (the
    day's plus the fails carried in) is not zero in quantity or in cash. A fail that today's
    opposite net cancels out is carried all the same (it leaves the open fails) but makes no
    line: there is nothing left to deliver or pay. ``ids`` numbers the lines (default
    ``instruction_id``)."""
    total: dict[tuple[str, str], Net] = dict(nets)
    sources: dict[tuple[str, str], list[str]] = {}
    for fail in carried:
        _add(total, (fail.account, fail.symbol), fail.quantity, fail.amount)
        sources.setdefault((fail.account, fail.symbol), []).append(fail.instruction_id)
    return _lines(total, ids or (lambda n: instruction_id(run_id, n)), trade_date,
                  settlement_date, version, {k: ";".join(sorted(v)) for k, v in sources.items()})


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


def minor_units(currency: str) -> int:
    """ISO 4217's decimals of ``currency`` (CLDR's data, by Babel)."""
    from babel.numbers import get_currency_precision

    return int(get_currency_precision(currency))


def in_minor_units(nets: Mapping[tuple[str, str], Net], digits: int
                   ) -> tuple[dict[tuple[str, str], Net], Decimal]:
    """Custodian mode: each net's cash rounded half-even to the currency's minor units (an
    agent refuses USD 1.2345), and the rounding residual: what the rounded nets sum to
    beyond the exact ones (the exact nets sum to zero across accounts)."""
    unit = Decimal(1).scaleb(-digits)
    out = {k: Net(n.quantity, n.amount.quantize(unit, rounding=ROUND_HALF_EVEN))
           for k, n in nets.items()}
    residual = sum((n.amount for n in out.values()), Decimal(0)) - sum(
        (n.amount for n in nets.values()), Decimal(0))
    return out, residual


def reinstruct(run_id: int, version: int, trade_date: str, settlement_date: str,
               nets: Mapping[tuple[str, str], Net],
               live: Iterable[tuple[Instruction, Net]]) -> list[Instruction]:
    """Custodian mode's re-close: what the agent must be told so that the date's standing
    instructions (``live``: each with the part of it still pending, signed) become ``nets``.
    Per account and instrument whose standing instructions no longer sum to its net:

    - every standing instruction with something pending is cancelled (a ``cancel`` line,
      ids ``R<run>-C<n>``; a settled part cannot be cancelled);
    - one new instruction, linked to all the standing ones, for the net less what already
      settled (nothing when that is zero).

    Unchanged nets leave their instructions standing, whatever their answers."""
    standing: dict[tuple[str, str], list[tuple[Instruction, Net]]] = {}
    for instr, pending in live:
        standing.setdefault((instr.account, instr.symbol), []).append((instr, pending))
    cancels: list[Instruction] = []
    rest: dict[tuple[str, str], Net] = {}
    links: dict[tuple[str, str], str] = {}
    for key in sorted(set(nets) | set(standing)):
        target = nets.get(key, Net(0, Decimal(0)))
        have = standing.get(key, [])
        sent = Net(sum(i.signed_quantity for i, _ in have),
                   sum((i.signed_amount for i, _ in have), Decimal(0)))
        if sent == target:
            continue
        settled = Net(sum(i.signed_quantity - p.quantity for i, p in have),
                      sum((i.signed_amount - p.amount for i, p in have), Decimal(0)))
        for instr, pending in have:
            if pending != Net(0, Decimal(0)):
                cancels.append(instr._replace(
                    instruction_id=f"R{run_id}-C{len(cancels) + 1:06d}", version=version,
                    carried_from="", kind="cancel", links=instr.instruction_id))
        rest[key] = Net(target.quantity - settled.quantity, target.amount - settled.amount)
        links[key] = ";".join(sorted(i.instruction_id for i, _ in have))
    new = _lines(rest, lambda n: instruction_id(run_id, n), trade_date, settlement_date,
                 version, {})
    return cancels + [x._replace(links=links[(x.account, x.symbol)]) for x in new]
