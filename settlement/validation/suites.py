"""The Great Expectations suites: what "no trade lost, none duplicated" means, as checks.

Every suite runs on Spark DataFrames. Cross-table checks are ``UnexpectedRowsExpectation``
anti-joins in Spark SQL against temporary views that ``settlement.validation.run`` registers
for the run (they name the trades that differ, so a failure says which trade and where):

- ``run_params``: one row (trade_date, partitions, trades) for the run
- ``close_markers_day``: (kafka_partition, last_seq) of the day, from the source
- ``kafka_day`` / ``ledger_day`` / ``ledger_a_day`` / ``ledger_b_day``: trades to reconcile
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import great_expectations as gx
import great_expectations.expectations as gxe

TRADE_COLUMNS = ("trade_id", "trade_date", "seq", "kafka_partition", "kafka_offset", "symbol",
                 "price", "quantity", "buyer", "seller", "executed_at")


def _suite(name: str, expectations: list[Any]) -> gx.ExpectationSuite:
    # Built in one go: add_expectation() on a new suite whose name is already in the store
    # would write into the stored suite.
    return gx.ExpectationSuite(name=name, expectations=expectations)


def _rows(name: str, check: str, description: str, query: str) -> gxe.UnexpectedRowsExpectation:
    return gxe.UnexpectedRowsExpectation(
        unexpected_rows_query=query.strip(), description=description,
        meta={"check": check, "name": name},
    )


def trades_suite() -> gx.ExpectationSuite:
    """Completeness, uniqueness and validity of one day's trades (settlement input, ledger)."""
    suite: list[Any] = []
    suite.append(gxe.ExpectColumnValuesToBeUnique(
        column="trade_id", meta={"check": "uniqueness", "name": "trade_id unique"}))
    for col in TRADE_COLUMNS:
        suite.append(gxe.ExpectColumnValuesToNotBeNull(
            column=col, meta={"check": "validity", "name": f"{col} not null"}))
    suite.append(gxe.ExpectColumnValuesToBeBetween(
        column="quantity", min_value=1, meta={"check": "validity", "name": "quantity > 0"}))
    suite.append(_rows(
        "price > 0", "validity", "every price is positive",
        "select trade_id, price from {batch} where price <= 0"))
    suite.append(_rows(
        "buyer <> seller", "validity", "no account trades with itself",
        "select trade_id, buyer, seller from {batch} where buyer = seller"))
    suite.append(_rows(
        "trade_date is the run's date", "validity", "every trade belongs to the settled date",
        "select trade_id, trade_date from {batch} "
        "where trade_date <> (select trade_date from run_params)"))
    suite.append(_rows(
        "every partition closed", "completeness",
        "a market-close marker exists for every partition",
        """
        select p.kafka_partition
        from (select explode(sequence(0, partitions - 1)) as kafka_partition from run_params
              union select distinct kafka_partition from {batch}) p
        left anti join close_markers_day m on m.kafka_partition = p.kafka_partition
        """))
    suite.append(_rows(
        "no sequence gaps", "completeness",
        "seq runs from 1 to the close marker's last_seq in every partition: each row returned "
        "is a lost trade (date, partition, seq)",
        """
        select (select trade_date from run_params) as trade_date, e.kafka_partition, e.seq
        from (select kafka_partition,
                     explode(sequence(cast(1 as bigint), cast(last_seq as bigint))) as seq
              from close_markers_day where last_seq > 0) e
        left anti join {batch} t on t.kafka_partition = e.kafka_partition and t.seq = e.seq
        """))
    suite.append(_rows(
        "no sequence beyond close", "completeness",
        "no trade has a seq past its partition's close marker or appears twice at one seq",
        """
        select t.kafka_partition, t.seq, count(*) as copies
        from {batch} t left join close_markers_day m on m.kafka_partition = t.kafka_partition
        group by t.kafka_partition, t.seq, m.last_seq
        having count(*) > 1 or m.last_seq is null or t.seq > max(m.last_seq)
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
        f"select b.trade_id from {{batch}} b join {left} k on k.trade_id = b.trade_id "
        "where not (b.symbol <=> k.symbol and b.price <=> k.price and b.quantity <=> k.quantity "
        "and b.buyer <=> k.buyer and b.seller <=> k.seller and b.seq <=> k.seq)"))
    return _suite(name, suite)


def invariants_suite() -> gx.ExpectationSuite:
    """Settlement output: what multilateral netting must conserve."""
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
        "trade counts are twice the trades", "invariants",
        "each trade has two legs: position trade_count sums to twice the trades settled",
        "select coalesce(sum(trade_count), 0) as legs, (select trades from run_params) as trades "
        "from {batch} having coalesce(sum(trade_count), 0) <> 2 * (select trades from run_params)"))
    suite.append(_rows(
        "net columns are consistent", "invariants",
        "net_qty = bought - sold and net_cash = sell_amount - buy_amount on every position",
        "select account, symbol from {batch} where net_qty <> bought_qty - sold_qty "
        "or net_cash <> sell_amount - buy_amount"))
    return _suite("settlement_invariants", suite)


@dataclass(frozen=True)
class SuitePlan:
    """Which asset a suite validates."""

    suite: gx.ExpectationSuite
    asset: str


def all_suites() -> list[SuitePlan]:
    return [
        SuitePlan(trades_suite(), "settlement_trades"),
        SuitePlan(trades_suite(), "ledger_trades"),
        SuitePlan(reconciliation_suite("reconcile_kafka_ledger", "kafka_day", "ledger",
                                       "Kafka vs ledger"), "ledger_trades"),
        SuitePlan(reconciliation_suite("reconcile_site_a_b", "ledger_a_day", "ledger_b",
                                       "site A vs site B"), "ledger_b_trades"),
        SuitePlan(invariants_suite(), "positions"),
    ]
