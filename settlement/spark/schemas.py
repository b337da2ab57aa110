"""Spark types of the ledger row and the result tables, in the tables' column order.

The names come from the contract (``settlement.contract.LEDGER_COLUMNS``) and the result rows
(``settlement.eod.model``); a test checks that each schema spells them in the same order.
"""

from __future__ import annotations

from pyspark.sql.types import (
    BinaryType,
    DataType,
    DateType,
    DecimalType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from settlement.contract import AMENDMENT_COLUMNS, LEDGER_COLUMNS
from settlement.eod.model import CashObligation, InstrumentSummary, Position

PRICE = DecimalType(18, 4)
AMOUNT = DecimalType(28, 4)
VWAP = DecimalType(28, 10)
# Exact product of a price and a quantity: 18 + 19 + 1 = 38 digits, scale 4.
PRODUCT = DecimalType(38, 4)


def _schema(*fields: tuple[str, DataType]) -> StructType:
    # Nullable: these are type contracts; NOT NULL is enforced by validation and the tables.
    return StructType([StructField(name, typ, True) for name, typ in fields])


def _typed(columns: tuple[str, ...], types: dict[str, DataType]) -> StructType:
    """The columns, in their given order, with these types: the names come from one place."""
    if set(columns) != set(types):
        raise ValueError(f"types given for {sorted(types)}, columns are {list(columns)}")
    return _schema(*((c, types[c]) for c in columns))


TRADE_SCHEMA = _typed(LEDGER_COLUMNS, {
    "trade_id": StringType(), "trade_date": DateType(), "seq": LongType(),
    "kafka_partition": IntegerType(), "kafka_offset": LongType(), "symbol": StringType(),
    "price": PRICE, "quantity": LongType(), "buyer": StringType(), "seller": StringType(),
    "executed_at": TimestampType(),
})
# A cancel or a correction of the day (the ledger's trade_amendments, or the Kafka read's).
AMENDMENT_SCHEMA = _typed(AMENDMENT_COLUMNS, {
    "trade_id": StringType(), "trade_date": DateType(), "seq": LongType(),
    "kafka_partition": IntegerType(), "kafka_offset": LongType(), "kind": StringType(),
    "version": IntegerType(), "reason": StringType(), "symbol": StringType(), "price": PRICE,
    "quantity": LongType(), "buyer": StringType(), "seller": StringType(),
    "executed_at": TimestampType(),
})
POSITIONS_SCHEMA = _typed(Position._fields, {
    "trade_date": DateType(), "account": StringType(), "symbol": StringType(),
    "bought_qty": LongType(), "sold_qty": LongType(), "net_qty": LongType(),
    "buy_amount": AMOUNT, "sell_amount": AMOUNT, "net_cash": AMOUNT, "trade_count": LongType(),
})
CASH_OBLIGATIONS_SCHEMA = _typed(CashObligation._fields, {
    "trade_date": DateType(), "account": StringType(), "buy_amount": AMOUNT,
    "sell_amount": AMOUNT, "net_cash": AMOUNT, "trade_count": LongType(),
})
INSTRUMENT_SUMMARY_SCHEMA = _typed(InstrumentSummary._fields, {
    "trade_date": DateType(), "symbol": StringType(), "trades": LongType(),
    "volume": LongType(), "notional": AMOUNT, "vwap": VWAP, "low_price": PRICE,
    "high_price": PRICE, "close_price": PRICE,
})
# Shaped like the ledger's dead_letters (minus topic/site, which the caller knows).
MALFORMED_SCHEMA = _schema(
    ("kafka_partition", IntegerType()),
    ("kafka_offset", LongType()),
    ("raw", BinaryType()),
    ("reason", StringType()),
)
CLOSE_MARKERS_SCHEMA = _schema(
    ("trade_date", DateType()),
    ("kafka_partition", IntegerType()),
    ("kafka_offset", LongType()),
    ("last_seq", LongType()),
)

