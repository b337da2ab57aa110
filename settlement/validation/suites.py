"""The Great Expectations suites: what "no trade lost, none duplicated" means, as checks.

Every check runs on a frame where it can fail. A check that the frame already guarantees
proves nothing and only makes the verdict look stronger than it is, so:

- **Date and uniqueness on the read as it came in** (``as_read``: every trade the read
  returned, of any date, before dedupe). After the date filter every trade has the run's
  date, and after the dedupe (or a ledger's primary key) every trade id is unique; only the
  read itself can hold a trade of another date in the day's Kafka range, which the filter
  drops silently, or two different trades under one trade id, which the dedupe would
  silently reduce to one.

  A trade of another date in the range does not make the day wrong (the day's completeness
  is proven by its close markers and sequence numbers): it is another day's trade that no
  settlement includes, e.g. one of the day before that arrived after its close marker (the
  sites dead-letter it as ``late``: bad data never stops the line). So that check is a
  warning: it names the trades in the verdict's warnings and does not fail the run.
- **Completeness on the settled day** (the day the netting used): every partition closed,
  sequence numbers 1..last_seq all present, none beyond the close marker, one trade per
  (partition, seq). Decided by each partition's checksums first (``day_partitions``); the
  ``settlement_trades`` frame the checks search holds only the trades of partitions whose
  figures are not exactly one trade at each seq 1..last_seq.
- **Reconciliation** of the settled day with the ledger (Kafka-sourced runs) and of the two
  site ledgers with each other (separate scheme), by bucket checksums first
  (``settlement.spark.figures``: one SQL aggregate in each ledger); the frames the
  anti-joins search hold only the trades of buckets whose figures differ. The ledger's own
  completeness is not a suite: a ledger-sourced day is the settled day, and on a
  Kafka-sourced run any gap or extra seq in the ledger is also a difference from Kafka
  (named by trade id) or a gap in the settled day, so such a check could never fail alone.
- **Data loss** recorded by the sites (``data_loss``: the retention gaps every reachable
  ledger holds that may cover the day): a site that was down longer than the topic's
  retention could not read offsets of the day. The settled day may still look complete (the
  other site read them), but the gap is named and the day fails until an operator decides.
- **Invariants on the positions**, with the trade count taken from the settled day's
  checksums, not from the netting's own count, and volume and notional from the settled
  day: a netting step that drops or mangles a trade fails here.

Not checked here, because no frame we validate can violate them: not-null columns, a
positive quantity and price, buyer <> seller, field formats. A trade is valid by the
contract (``settlement/contract.py``): the Spark reader and the sites' parser drop what it
rejects (dead letters, counted as malformed), ``tests/test_parity.py`` holds both parsers to
the same verdicts on an adversarial corpus, and the ledger's ``NOT NULL`` and ``CHECK``
constraints (quantity > 0, price > 0, seller <> buyer, seq > 0) refuse the rest.

Cross-table checks are ``UnexpectedRowsExpectation`` anti-joins in Spark SQL against
temporary views that ``settlement.validation.validate_frames`` registers for the run (they
name the trades that differ, so a failure says which trade and where). ``{batch}`` is the
asset's frame (GX registers it as ``tmp_view``: no view of ours may have that name):

- ``run_params``: one row (trade_date, partitions) for the run
- ``close_markers_day``: (kafka_partition, last_seq) of the day, from the source
- ``read_trades``: the read as it came in (the ``as_read`` frame)
- ``day_partitions``: per partition of the settled day, its figures, last_seq and whether
  it is ``suspect`` (``settlement.spark.figures.partition_figures``)
- ``kafka_day`` / ``ledger_a_day``: the trades to reconcile with, of the differing buckets
- ``settled_symbols``: the day in final states (busts left out, corrections applied, what
  the positions net): its volume and notional per instrument (summed by ``validate_frames``
  before the positions are netted); ``day_amendments``: the day's accepted cancels and
  corrections; ``amended_trades``: the day's trades (as sent) that those name;
  ``other_amendments``: another copy of the amendments, to reconcile; ``day_cancelled``: one
  row, how many trades of the day are busted

Busts and corrections (``amendments_day``, ``reconcile_amendments``): each refers to a trade
of the day before it on its partition, versions only rise and nothing follows a cancel, and
the copies of the day agree on them. Their seqs count in the completeness checks like a
trade's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from settlement.validation.gximport import defer_unused

defer_unused()  # before GX's first import: SciPy's statistics and Altair are not loaded

import great_expectations as gx  # noqa: E402
import great_expectations.expectations as gxe  # noqa: E402
from great_expectations.constants import MAX_RESULT_RECORDS  # noqa: E402
from great_expectations.core.result_format import ResultFormat  # noqa: E402

# What a replayed copy of a trade must repeat (its offset is the copy's own).
TRADE_IDENTITY = ("trade_date", "seq", "kafka_partition", "symbol", "price", "quantity",
                  "buyer", "seller", "executed_at")
_RUN_DATE = "(select trade_date from run_params)"


class ExpectNoUnexpectedRows(gxe.UnexpectedRowsExpectation):
    """``UnexpectedRowsExpectation`` that runs its query once.

    GX's own class asks for two metrics, the rows (at most ``MAX_RESULT_RECORDS``) and their
    count, and so runs every query twice; on a 10M-trade day each run is a shuffle. Here the
    rows are the only metric: none means success, and a failure reports how many came back
    ("at least" when the cap was reached, which only a badly broken day reaches).
    """

    metric_dependencies: ClassVar[tuple[str, ...]] = ("unexpected_rows_query.table",)

    def _validate(self, metrics: dict[str, Any], runtime_configuration: dict | None = None,
                  execution_engine: Any = None) -> dict[str, Any]:
        rows = metrics["unexpected_rows_query.table"]
        n = len(rows)
        success = n == 0
        fmt = self._get_result_format(runtime_configuration=runtime_configuration)
        fmt = fmt.get("result_format", ResultFormat.SUMMARY) if isinstance(fmt, dict) else fmt
        if fmt == ResultFormat.BOOLEAN_ONLY:
            return {"success": success}
        observed: int | str = n if n < MAX_RESULT_RECORDS else f"at least {n}"
        result: dict[str, Any] = {"observed_value": observed}
        if fmt == ResultFormat.COMPLETE:
            result["details"] = {"unexpected_rows": rows}
        return {"success": success, "result": result}


def _suite(name: str, expectations: list[Any]) -> gx.ExpectationSuite:
    # Built in one go: add_expectation() on a new suite whose name is already in the store
    # would write into the stored suite.
    return gx.ExpectationSuite(name=name, expectations=expectations)


def _rows(name: str, check: str, description: str, query: str, *,
          severity: str = "critical") -> ExpectNoUnexpectedRows:
    """An anti-join check. ``severity``: "critical" fails the run, "warning" is reported."""
    return ExpectNoUnexpectedRows(
        unexpected_rows_query=" ".join(query.split()), description=description,
        meta={"check": check, "name": name}, severity=severity,
    )


def read_dates_suite() -> gx.ExpectationSuite:
    """On ``as_read`` from Kafka (a ledger is read by date: there it cannot fail). A warning:
    another day's trade does not make this day wrong."""
    return _suite("read_dates", [_rows(
        "every trade read is of the run's date", "dates",
        "the day's Kafka range holds only the day's trades: each row returned is a trade of "
        "another date that the date filter drops and no day settles, e.g. a trade of the "
        "day before that arrived after its close marker",
        f"""
        select trade_id, trade_date, kafka_partition, kafka_offset, seq from {{batch}}
        where not (trade_date <=> {_RUN_DATE})
        """, severity="warning")])


def read_copies_suite() -> gx.ExpectationSuite:
    """On ``as_read`` before dedupe (a single ledger's primary key makes it unfailable)."""
    same = ", ".join(TRADE_IDENTITY)
    return _suite("read_copies", [_rows(
        "copies of a trade id agree", "uniqueness",
        "a replayed trade repeats the same trade (" + same + "); two different trades under "
        "one trade id are named, which the dedupe would silently reduce to one",
        # Versions are compared only for ids read more than once: counting copies is a cheap
        # aggregate, collecting every trade's versions would be a set per trade.
        f"""
        with repeated as (select trade_id from {{batch}} group by trade_id
                          having count(*) > 1)
        select trade_id, count(*) as copies, size(collect_set(struct({same}))) as versions,
               array_join(sort_array(collect_list(
                   concat(kafka_partition, ':', kafka_offset))), ', ') as offsets
        from {{batch}} left semi join repeated using (trade_id)
        group by trade_id having size(collect_set(struct({same}))) > 1
        """)])


def trades_suite() -> gx.ExpectationSuite:
    """Completeness of the settled day: nothing lost, nothing extra, one trade per seq."""
    suite: list[Any] = []
    suite.append(_rows(
        "every partition closed", "completeness",
        "a market-close marker exists for every partition (and every partition with trades)",
        """
        select p.kafka_partition
        from (select explode(sequence(0, partitions - 1)) as kafka_partition from run_params
              union select kafka_partition from day_partitions where trades > 0
              union select kafka_partition from {batch}) p
        left anti join close_markers_day m on m.kafka_partition = p.kafka_partition
        """))
    suite.append(_rows(
        "no sequence gaps", "completeness",
        "seq runs from 1 to the close marker's last_seq in every partition: each row returned "
        "is a lost trade (date, partition, seq)",
        # Only suspect partitions are searched seq by seq: those whose figures (count, lowest
        # and highest seq, seq hash sum) differ from exactly one trade at each seq
        # 1..last_seq; {batch} holds their trades only (settlement.spark.figures).
        f"""
        with suspect as (select kafka_partition, last_seq from day_partitions
                         where suspect and last_seq > 0)
        select {_RUN_DATE} as trade_date, e.kafka_partition, e.seq
        from (select kafka_partition,
                     explode(sequence(cast(1 as bigint), cast(last_seq as bigint))) as seq
              from suspect) e
        left anti join (select kafka_partition, seq from {{batch}}
                        where kafka_partition in (select kafka_partition from suspect)) t
          on t.kafka_partition = e.kafka_partition and t.seq = e.seq
        """))
    suite.append(_rows(
        "no trade beyond its close marker", "completeness",
        "no trade has a seq past its partition's close marker (the marker closed the day "
        "too early, or the trade is not the day's)",
        """
        select t.trade_id, t.kafka_partition, t.seq, m.last_seq
        from {batch} t join close_markers_day m on m.kafka_partition = t.kafka_partition
        where t.seq > m.last_seq
        """))
    suite.append(_rows(
        "one trade per partition and seq", "uniqueness",
        "each (partition, seq) holds one trade: two trade ids at one seq (a sequence "
        "reissued, or a copy the dedupe kept) are named",
        """
        select kafka_partition, seq, count(*) as trades,
               array_join(sort_array(collect_list(trade_id)), ', ') as trade_ids
        from {batch} group by kafka_partition, seq having count(*) > 1
        """))
    return _suite("trades_day", suite)


def reconciliation_suite(name: str, left: str, right: str, what: str) -> gx.ExpectationSuite:
    """Anti-joins both ways between the batch and another view of the same day."""
    suite: list[Any] = []
    suite.append(_rows(
        f"in {left}, missing from {right}", "reconciliation",
        f"{what}: every trade in {left} is in {right}",
        f"select k.trade_id, k.kafka_partition, k.seq from {left} k "
        "left anti join {batch} b on b.trade_id = k.trade_id"))
    suite.append(_rows(
        f"in {right}, missing from {left}", "reconciliation",
        f"{what}: every trade in {right} is in {left}",
        f"select b.trade_id, b.kafka_partition, b.seq from {{batch}} b "
        f"left anti join {left} k on k.trade_id = b.trade_id"))
    suite.append(_rows(
        f"{left} and {right} agree on each trade", "reconciliation",
        f"{what}: a trade id present in both has the same economics in both",
        # Every field the bucket checksums hash: a bucket can only differ because a trade
        # does, and then that trade is named here or by the anti-joins.
        f"select b.trade_id from {{batch}} b join {left} k on k.trade_id = b.trade_id "
        "where not (b.symbol <=> k.symbol and b.price <=> k.price and b.quantity <=> k.quantity "
        "and b.buyer <=> k.buyer and b.seller <=> k.seller and b.seq <=> k.seq "
        "and b.trade_date <=> k.trade_date and b.kafka_partition <=> k.kafka_partition "
        "and b.executed_at <=> k.executed_at)"))
    return _suite(name, suite)


def data_loss_suite() -> gx.ExpectationSuite:
    """On the retention gaps the sites recorded (``sql/queries/ledger.sql``, data_loss_for_day)."""
    return _suite("data_loss", [_rows(
        "no offset of the day was deleted unread", "completeness",
        "no site found its stored position older than the partition's log start in a range "
        "that may hold the day's trades: each row is a gap [from_offset, to_offset) that "
        "retention deleted before the site read it (its ledger may lack those trades)",
        """
        select ledger, kafka_partition, from_offset, to_offset, site, detected_at
        from {batch}
        """)])


def invariants_suite() -> gx.ExpectationSuite:
    """Settlement output: what multilateral netting must conserve, and what it must carry."""
    suite: list[Any] = []
    suite.append(_rows(
        "net quantity sums to 0 per symbol", "invariants",
        "every share bought was sold: net_qty sums to zero for each instrument",
        "select symbol, sum(net_qty) as net from {batch} group by symbol having sum(net_qty) <> 0"))
    suite.append(_rows(
        "net cash sums to 0", "invariants",
        "the central counterparty is flat: net_cash sums to zero over all accounts",
        "select sum(net_cash) as net_cash from {batch} having sum(net_cash) <> 0"))
    suite.append(_rows(
        "net columns are consistent", "invariants",
        "net_qty = bought - sold and net_cash = sell_amount - buy_amount on every position",
        "select account, symbol from {batch} where net_qty <> bought_qty - sold_qty "
        "or net_cash <> sell_amount - buy_amount"))
    suite.append(_rows(
        "trade counts are twice the trades read", "invariants",
        "each trade has two legs: position trade_count sums to twice the trades of the "
        "settled day (counted by validation's checksums of that day, not by the netting) "
        "less its cancelled trades",
        """
        select p.legs, r.trades, c.cancelled
        from (select coalesce(sum(trade_count), 0) as legs from {batch}) p
        cross join (select coalesce(sum(trades), 0) as trades from day_partitions) r
        cross join day_cancelled c
        where p.legs <> 2 * (r.trades - c.cancelled)
        """))
    suite.append(_rows(
        "positions carry the day's volume and notional", "invariants",
        "per instrument, the quantity bought equals the settled day's volume and the amount "
        "paid its notional (sum of price * quantity)",
        """
        with p as (select symbol, sum(bought_qty) as bought, sum(buy_amount) as paid
                   from {batch} group by symbol)
        select coalesce(d.symbol, p.symbol) as symbol, d.volume, p.bought, d.notional, p.paid
        from settled_symbols d full outer join p on p.symbol = d.symbol
        where not (d.volume <=> p.bought and d.notional <=> p.paid)
        """))
    return _suite("settlement_invariants", suite)


# What reconcile_amendments compares between the two copies of an amendment.
AMENDMENT_FIELDS = ("trade_date", "seq", "kafka_partition", "reason", "symbol", "price",
                    "quantity", "buyer", "seller", "executed_at")


def amendments_suite() -> gx.ExpectationSuite:
    """On the day's accepted cancels and corrections (busts: FIX ExecType H; corrections:
    G). The readers and the sites refuse an amendment of an unknown trade, a lower version or
    a cancelled trade; these checks prove the settled day holds none."""
    # The amended trades come picked out of the day (``amended_trades``: a semi join of the
    # day with their ids broadcast, which the amendments' effects share).
    # A left anti join straight against the whole day can broadcast only the day (its right
    # side): on a 2M day Spark shuffled the whole day for a few thousand amendments.
    return _suite("amendments_day", [
        _rows("every amendment refers to a trade of the day", "amendments",
              "each cancel and correction names a trade settled on this date, on the same "
              "partition and before it in the log",
              """
              select a.trade_id, a.kind, a.version, a.kafka_partition, a.kafka_offset
              from {batch} a left anti join amended_trades t
                on t.trade_id = a.trade_id and t.kafka_partition = a.kafka_partition
               and t.kafka_offset < a.kafka_offset and t.trade_date = a.trade_date
              """),
        _rows("versions only rise", "amendments",
              "along the log, each correction of a trade has a higher version than the one "
              "before it, and nothing follows a cancel",
              """
              select b.trade_id, a.kind as earlier, a.version as earlier_version,
                     b.kind as later, b.version as later_version, b.kafka_offset
              from {batch} a join {batch} b
                on b.trade_id = a.trade_id and a.kafka_offset < b.kafka_offset
              where a.kind = 'cancel'
                 or (b.kind = 'correct' and a.kind = 'correct' and b.version <= a.version)
              """),
    ])


def reconcile_amendments_suite() -> gx.ExpectationSuite:
    """The day's cancels and corrections against another copy of them (``other_amendments``:
    the ledger's when the day came from Kafka, site B's when it came from site A's ledger)."""
    same = " and ".join(f"b.{c} <=> o.{c}" for c in AMENDMENT_FIELDS)
    key = ("o.trade_id = b.trade_id and o.kind = b.kind "
           "and coalesce(o.version, 0) = coalesce(b.version, 0)")
    return _suite("reconcile_amendments", [
        _rows("amendments missing from the other copy", "reconciliation",
              "every cancel and correction settled is in the other copy",
              f"select b.trade_id, b.kind, b.version from {{batch}} b "
              f"left anti join other_amendments o on {key}"),
        _rows("amendments missing from the settled day", "reconciliation",
              "every cancel and correction in the other copy was settled",
              f"select o.trade_id, o.kind, o.version from other_amendments o "
              f"left anti join {{batch}} b on {key}"),
        _rows("both copies agree on each amendment", "reconciliation",
              "an amendment in both copies has the same fields in both",
              f"select b.trade_id, b.kind, b.version from {{batch}} b "
              f"join other_amendments o on {key} where not ({same})"),
    ])


@dataclass(frozen=True)
class SuitePlan:
    """Which asset a suite validates."""

    suite: gx.ExpectationSuite
    asset: str

    @property
    def name(self) -> str:
        """``suite@asset``: the validation definition's and the checkpoint's name."""
        return f"{self.suite.name}@{self.asset}"


def all_suites() -> list[SuitePlan]:
    return [
        SuitePlan(read_dates_suite(), "as_read"),
        SuitePlan(read_copies_suite(), "as_read"),
        SuitePlan(trades_suite(), "settlement_trades"),
        SuitePlan(reconciliation_suite("reconcile_kafka_ledger", "kafka_day", "ledger",
                                       "Kafka vs ledger"), "ledger_trades"),
        SuitePlan(reconciliation_suite("reconcile_site_a_b", "ledger_a_day", "ledger_b",
                                       "site A vs site B"), "ledger_b_trades"),
        SuitePlan(amendments_suite(), "amendments"),
        SuitePlan(reconcile_amendments_suite(), "amendments"),
        SuitePlan(data_loss_suite(), "data_loss"),
        SuitePlan(invariants_suite(), "positions"),
    ]
