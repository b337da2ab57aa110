"""What the end of day works with: the source choice, the ledgers' state, the result rows.

Plain Python (no Spark), so the chooser, the pipeline, validation and the report share one
vocabulary. Result rows are named tuples in their table's column order: ``row.net_cash``,
never ``row[4]``; ``Position._fields`` is the column list of ``positions``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from decimal import ROUND_HALF_UP, Decimal, localcontext
from typing import Any, NamedTuple

from settlement.errors import SettlementError


class NoSource(RuntimeError):
    """Neither Kafka nor any ledger can provide the trade date."""


class PartitionMismatch(SettlementError):
    """SETTLE_PARTITIONS disagrees with what is known of the topic, and Kafka cannot be
    asked: settling would silently leave partitions out."""


# -- result rows (sql/migrations/0002_settlement.sql) -----------------------------------------
class Position(NamedTuple):
    trade_date: dt.date
    account: str
    symbol: str
    bought_qty: int
    sold_qty: int
    net_qty: int
    buy_amount: Decimal
    sell_amount: Decimal
    net_cash: Decimal  # sell_amount - buy_amount
    trade_count: int


class CashObligation(NamedTuple):
    """Net cash of one account against the central counterparty; > 0: the CCP pays."""

    trade_date: dt.date
    account: str
    buy_amount: Decimal
    sell_amount: Decimal
    net_cash: Decimal
    trade_count: int


class InstrumentSummary(NamedTuple):
    trade_date: dt.date
    symbol: str
    trades: int
    volume: int
    notional: Decimal
    vwap: Decimal
    low_price: Decimal
    high_price: Decimal
    # The price of the day's last trade by (executed_at, trade_id): what the instrument's
    # open positions are marked to (None in rows published before it was kept).
    close_price: Decimal | None


# table -> its row type; the row's fields are the table's columns, in order.
RESULT_TABLES: dict[str, type[Any]] = {
    "positions": Position,
    "cash_obligations": CashObligation,
    "instrument_summary": InstrumentSummary,
}


# -- netting: computed here and nowhere else --------------------------------------------------
@dataclass(frozen=True)
class Netting:
    """Multilateral netting totals for one business date."""

    gross_notional: Decimal  # sum of price * quantity over the trades, each trade once
    net_settlement: Decimal  # sum over accounts of |net cash|: the cash that actually moves
    # 1 - net_settlement / (2 * gross_notional); None for a day without trades.
    efficiency: Decimal | None


def netting(obligations: Iterable[CashObligation]) -> Netting:
    """Netting totals of one date's cash obligations (one row per account).

    Every trade is bought once, so the accounts' buy amounts add up to the gross notional.
    Efficiency compares like with like: without netting every trade settles both legs with
    the CCP, so the gross cash is twice the notional; with netting only sum |net cash|
    moves. One trade nets 0 %, a ring of trades that cancels out nets 100 %.
    """
    gross = net = Decimal(0)
    for o in obligations:
        gross += o.buy_amount
        net += abs(o.net_cash)
    return Netting(gross, net, efficiency_from_totals(gross, net))


def efficiency_from_totals(gross_notional: Decimal, net_settlement: Decimal) -> Decimal | None:
    """``1 - net / (2 * gross)`` to 10 places, half-up; None without trades (no netting
    happened, and 0 would read as "netting failed")."""
    if gross_notional == 0:
        return None
    with localcontext() as ctx:
        ctx.prec = 60  # amounts have up to 28 digits; keep the quotient exact to 10 places
        ratio = net_settlement / (2 * gross_notional)
        return (Decimal(1) - ratio).quantize(Decimal("1e-10"), rounding=ROUND_HALF_UP)


class Leg(NamedTuple):
    """One account's trades of one symbol on the day, summed (``transforms.netting_legs``'
    rows): what the positions, the cash obligations and the instrument summary are taken
    from."""

    account: str
    symbol: str
    bought_qty: int
    sold_qty: int
    buy_amount: Decimal
    sell_amount: Decimal
    trade_count: int  # trades the account took part in, on either side
    buys: int  # of those, the ones it bought (a trade has one buyer)
    low_price: Decimal
    high_price: Decimal
    last_executed_at: dt.datetime  # of its latest trade of the symbol


class Netted(NamedTuple):
    positions: list[Position]  # by account, symbol
    obligations: list[CashObligation]  # by account
    instruments: list[InstrumentSummary]  # by symbol


# The result tables' numeric(28,4): 24 digits before the point.
_AMOUNT_DIGITS = 24
_VWAP_PLACES = 10


def _exact_sum(values: Iterable[Decimal]) -> Decimal:
    """A sum of scale-4 amounts, exact, refused when it does not fit numeric(28,4) (as
    Spark's ANSI cast refuses it: never a rounded amount)."""
    with localcontext() as ctx:
        ctx.prec = 60
        total = sum(values, Decimal(0))
    if total != 0 and total.adjusted() >= _AMOUNT_DIGITS:
        raise OverflowError(f"an amount of {total} does not fit numeric(28,4)")
    return total


def latest_times(legs: Iterable[Leg]) -> dict[str, dt.datetime]:
    """Each symbol's latest trade time, from its legs: where its closing trade is."""
    out: dict[str, dt.datetime] = {}
    for x in legs:
        if x.symbol not in out or x.last_executed_at > out[x.symbol]:
            out[x.symbol] = x.last_executed_at
    return out


def closes(candidates: Iterable[tuple[str, str, Decimal]]) -> dict[str, Decimal]:
    """Each symbol's closing price: of its last trade by (executed_at, trade_id), from
    (symbol, trade_id, price) of the trades at its latest time: the greatest trade id."""
    best: dict[str, tuple[str, Decimal]] = {}
    for symbol, trade_id, price in candidates:
        if symbol not in best or trade_id > best[symbol][0]:
            best[symbol] = (trade_id, price)
    return {symbol: price for symbol, (_, price) in best.items()}


def positions_of(legs: Iterable[Leg], trade_date: dt.date) -> list[Position]:
    """The day's positions, one per leg (account and symbol), by account then symbol."""
    return [Position(trade_date, x.account, x.symbol, x.bought_qty, x.sold_qty,
                     x.bought_qty - x.sold_qty, x.buy_amount, x.sell_amount,
                     _exact_sum((x.sell_amount, -x.buy_amount)), x.trade_count)
            for x in sorted(legs, key=lambda x: (x.account, x.symbol))]


def net_legs(legs: Iterable[Leg], trade_date: dt.date,
             close: dict[str, Decimal] | None = None,
             positions: list[Position] | None = None) -> Netted:
    """The day's positions, cash obligations and instrument summary from its legs.

    The legs are at most accounts x symbols rows, summed by Spark from the day's trades;
    what is left is small, so it is taken here, in one pass, rather than by two more Spark
    jobs and their shuffles (0.93 s of a 200,000-trade close, docs/benchmarks-history.md). A cash
    obligation sums the account's positions (its trade count is exactly its trades: a
    trade has one symbol and the account is on one side); a symbol's trades, volume and
    notional are its accounts' buys, bought quantities and buy amounts; its VWAP is
    notional / volume rounded half-up to 10 places, exactly (in integers); its close the
    price of its last trade (``close``: symbol -> price, from ``closes``; none when not
    given). ``positions``: ``positions_of`` these legs, when the caller took them already."""
    close = close or {}
    legs = sorted(legs, key=lambda x: (x.account, x.symbol))
    if positions is None:
        positions = positions_of(legs, trade_date)
    by_account: dict[str, list[Position]] = {}
    for p in positions:
        by_account.setdefault(p.account, []).append(p)
    obligations = []
    for account, ps in by_account.items():
        buy = _exact_sum(p.buy_amount for p in ps)
        sell = _exact_sum(p.sell_amount for p in ps)
        obligations.append(CashObligation(trade_date, account, buy, sell,
                                          _exact_sum((sell, -buy)),
                                          sum(p.trade_count for p in ps)))
    by_symbol: dict[str, list[Leg]] = {}
    for x in legs:
        by_symbol.setdefault(x.symbol, []).append(x)
    instruments = []
    for symbol in sorted(by_symbol):
        xs = by_symbol[symbol]
        volume = sum(x.bought_qty for x in xs)
        notional = _exact_sum(x.buy_amount for x in xs)
        instruments.append(InstrumentSummary(
            trade_date, symbol, sum(x.buys for x in xs), volume, notional,
            vwap(notional, volume), min(x.low_price for x in xs),
            max(x.high_price for x in xs), close.get(symbol)))
    return Netted(positions, obligations, instruments)


def vwap(notional: Decimal, volume: int) -> Decimal:
    """``notional / volume`` rounded half-up to 10 places, exactly: with N the notional in
    units of 1e-10 (an integer: the notional has 4 places), floor((2N + v) / 2v)."""
    if volume <= 0:
        raise ValueError(f"a symbol traded with volume {volume}: no VWAP")
    with localcontext() as ctx:
        ctx.prec = 60  # scaleb rounds to the context's digits: none may be lost here
        units = int(notional.scaleb(_VWAP_PLACES))
        return Decimal((2 * units + volume) // (2 * volume)).scaleb(-_VWAP_PLACES)


# -- where the day is -------------------------------------------------------------------------
class PartitionStats(NamedTuple):
    """One ledger's trades of the day on one Kafka partition."""

    rows: int  # trades
    distinct_seq: int  # of the trades and the amendments
    max_seq: int
    first_offset: int  # Kafka offset of the day's first trade on the partition
    amendments: int = 0  # cancels and corrections, which take seqs too


class MarkerAt(NamedTuple):
    """A day's close on one partition as a ledger holds it: after an amended close, its
    latest amended close marker (last_seq covering the post-close amendments), else the
    close marker itself."""

    last_seq: int
    offset: int  # Kafka offset of that marker: where the day's messages end
    amended: int = 0  # k of the latest amended close (0: none)
    closed_at: int = -1  # Kafka offset of the day's close marker itself

    @property
    def close_offset(self) -> int:
        return self.closed_at if self.amended else self.offset


class DataLoss(NamedTuple):
    """A retention gap a site recorded that may cut the day: offsets [from, to) of a
    partition were deleted before the site read them."""

    ledger: str
    kafka_partition: int
    from_offset: int
    to_offset: int
    site: str
    detected_at: str  # ISO 8601, UTC


@dataclass(frozen=True)
class LedgerState:
    """How much of a trade date one ledger holds, and where the day sits in Kafka."""

    name: str
    markers: dict[int, MarkerAt]  # partition -> the day's close marker
    stats: dict[int, PartitionStats]
    previous_markers: dict[int, int]  # partition -> offset of the previous day's marker
    # Retention gaps this ledger's sites recorded that may cover the day (validation fails).
    data_loss: tuple[DataLoss, ...] = ()

    @property
    def trades(self) -> int:
        return sum(s.rows for s in self.stats.values())

    @property
    def amendments(self) -> int:
        """The day's cancels and corrections this ledger holds."""
        return sum(s.amendments for s in self.stats.values())

    @property
    def expected_trades(self) -> int:
        return sum(m.last_seq for m in self.markers.values())

    def complete(self, partitions: int) -> bool:
        """Every partition closed and its seq running 1..last_seq once each."""
        if len(self.markers) != partitions:
            return False
        for p, m in self.markers.items():
            st = self.stats.get(p, PartitionStats(0, 0, 0, 0))
            if not (st.rows + st.amendments == st.distinct_seq == m.last_seq
                    and (st.max_seq == m.last_seq or m.last_seq == 0)):
                return False
        return True


@dataclass(frozen=True)
class SourceChoice:
    """Where a run reads its day from, why, and what the chooser learnt on the way (the
    ledgers' states), so that no later step asks the ledgers again."""

    source: str  # "kafka" | "db"
    reason: str
    # Kafka: partition -> [start, end) offsets of the day. DB: the ledgers to read.
    kafka_ranges: dict[int, tuple[int, int]] = field(default_factory=dict)
    ledgers: tuple[str, ...] = ()
    partitions: int = 0
    # Every reachable ledger's state of the day, as the chooser found it.
    states: dict[str, LedgerState] = field(default_factory=dict)
    # The topic's partition count as Kafka reported it to this run (None: Kafka was not
    # reachable). Recorded with the run, so a later run without Kafka can check its setting.
    topic_partitions: int | None = None

    def as_dict(self) -> dict[str, Any]:
        known = ({} if self.topic_partitions is None
                 else {"topic_partitions": self.topic_partitions})
        return {"source": self.source, "source_reason": self.reason,
                "kafka_ranges": {str(p): list(r) for p, r in sorted(self.kafka_ranges.items())},
                "ledgers": list(self.ledgers), "partitions": self.partitions, **known}

    def day_rows(self) -> int:
        """How many rows the close reads, about: the day's offsets in Kafka (each at most one
        message), or the trades and amendments of the ledgers it reads."""
        if self.source == "kafka":
            return sum(end - start for start, end in self.kafka_ranges.values())
        states = [self.states[n] for n in self.ledgers if n in self.states]
        return sum(st.trades + st.amendments for st in states)

    def close_markers(self) -> dict[int, int]:
        """partition -> last_seq of the day, from the ledgers the run reads (or any)."""
        names = self.ledgers or tuple(self.states)
        out: dict[int, int] = {}
        for name in names:
            st = self.states.get(name)
            for p, m in (st.markers if st else {}).items():
                out[p] = max(out.get(p, 0), m.last_seq)
        return out

    def marker_offsets(self) -> dict[str, int]:
        """partition (as text, a JSON key) -> Kafka offset of the day's newest close marker over
        every reachable ledger: what the run was chosen against, recorded with it so that a
        later close can tell whether the day changed since (``lease.settled_by``)."""
        out: dict[str, int] = {}
        for st in self.states.values():
            for p, m in st.markers.items():
                # The close itself: an amended close is settled by a re-close, which an
                # operator starts (and approves), never by a scheduled close.
                out[str(p)] = max(out.get(str(p), -1), m.close_offset)
        return out

    def amended_closes(self) -> dict[str, int]:
        """partition (as text) -> the latest amended close over every reachable ledger (0:
        none): which post-close amendments this run settles, recorded with it so that
        `settle status` and a re-close can tell which came since."""
        out: dict[str, int] = {}
        for st in self.states.values():
            for p, m in st.markers.items():
                out[str(p)] = max(out.get(str(p), 0), m.amended)
        return out

    def ledgers_with_trades(self) -> tuple[str, ...]:
        return tuple(n for n, st in self.states.items() if st.trades)

    def data_loss(self) -> list[DataLoss]:
        """Every reachable ledger's retention gaps that may cover the day."""
        return [e for st in self.states.values() for e in st.data_loss]


@dataclass(frozen=True)
class Publication:
    """Whether a run's results became the published day, and why."""

    published: bool
    accepted_incomplete: str | None  # the operator's reason when a failed day was forced
    note: str
    superseded_by: int | None = None  # a later run of the date had already published
    # Validated and kept for an operator's approval (the eod_reclose DAG): not published yet,
    # and not a failed run.
    held: bool = False


@dataclass(frozen=True)
class AmendmentEffect:
    """One accepted cancel or correction and what it did to its trade: the price and
    quantity before and after (None after a cancel) and the change in the trade's notional
    (price x quantity), which is the cash its buyer pays less (or more) and its seller
    receives less (or more)."""

    kind: str  # cancel | correct
    trade_id: str
    version: int | None
    kafka_partition: int
    seq: int
    reason: str | None
    price_before: Decimal | None
    quantity_before: int | None
    price_after: Decimal | None
    quantity_after: int | None

    @classmethod
    def of(cls, row: Any, before: tuple[Decimal, int] | None,
           after: tuple[Decimal, int] | None) -> AmendmentEffect:
        b, a = before or (None, None), after or (None, None)
        return cls(row["kind"], row["trade_id"], row["version"], int(row["kafka_partition"]),
                   int(row["seq"]), row["reason"], b[0], b[1], a[0], a[1])

    @property
    def notional_change(self) -> Decimal:
        def notional(price: Decimal | None, qty: int | None) -> Decimal:
            return Decimal(0) if price is None or qty is None else price * qty

        return (notional(self.price_after, self.quantity_after)
                - notional(self.price_before, self.quantity_before))

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "trade_id": self.trade_id, "version": self.version,
                "kafka_partition": self.kafka_partition, "seq": self.seq,
                "reason": self.reason,
                "price_before": _text(self.price_before), "quantity_before": self.quantity_before,
                "price_after": _text(self.price_after), "quantity_after": self.quantity_after,
                "notional_change": str(self.notional_change)}


def _text(d: Decimal | None) -> str | None:
    return None if d is None else str(d)


@dataclass
class SettlementResult:
    """One settled date, exact, as the pipeline hands it to validation and the report."""

    trade_date: str
    source: str
    trades: int
    duplicates_removed: int
    malformed: int
    positions: list[Position]
    obligations: list[CashObligation]
    instruments: list[InstrumentSummary]
    netting: Netting
    close_markers: dict[int, int] = field(default_factory=dict)  # partition -> last_seq
    trades_per_partition: dict[int, int] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    # Kafka source: late trades of earlier dates found in this day's range (date ->
    # partition -> count); not settled here, reported.
    late_in_range: dict[str, dict[int, int]] = field(default_factory=dict)
    # The day's busts and corrections, applied: each with the trade before and after it.
    amendments: list[AmendmentEffect] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        eff = self.netting.efficiency
        return {
            "trade_date": self.trade_date, "source": self.source, "trades": self.trades,
            "duplicates_removed": self.duplicates_removed, "malformed": self.malformed,
            "cancelled": sum(1 for a in self.amendments if a.kind == "cancel"),
            "corrections": sum(1 for a in self.amendments if a.kind == "correct"),
            "amendments_notional_change": str(sum(
                (a.notional_change for a in self.amendments), Decimal(0))),
            "positions": len(self.positions), "accounts": len(self.obligations),
            "instruments": len(self.instruments),
            "gross_notional": str(self.netting.gross_notional),
            "net_settlement": str(self.netting.net_settlement),
            "netting_efficiency": None if eff is None else str(eff),
            "timings": self.timings,
        }


def rows_of(row_type: type[Any], rows: Sequence[Sequence[Any]]) -> list[Any]:
    """Database or Spark rows (in column order) as named result rows."""
    return [row_type(*r) for r in rows]
