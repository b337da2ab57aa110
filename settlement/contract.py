"""The trade contract: what a message on the ``trades`` topic may be, and the ledger row it
becomes. Defined once, as data.

The consumer sites (``consumers.parse``), the Spark Kafka reader (``settlement.spark.parse``),
the checker and the simulator all take their rules from here. The Spark reader runs the
sites' own parser in its Python workers (Arrow batches), and ``tests/test_parity.py`` proves
that a message gets the same verdict and the same typed values in both runtimes.

The limits are chosen so that anything the contract accepts the ledger can store (the parity
test COPYs every accepted message into ``trades``) and both parsers read the same way:

- text is printable (no C0/C1 control characters, no NUL, which PostgreSQL text refuses
  and which would break a COPY line) and short enough for a btree key;
- integers stay far inside ``bigint`` (a day's quantities are summed per account);
- a price fits ``numeric(18, 4)`` and is written canonically (no sign, no leading zeros, no
  exponent) so that the text itself, not a float, is the value;
- dates lie in a window every engine reads alike (Python, Java and PostgreSQL disagree about
  years 0 and 10000); a timestamp is strict ISO-8601 with a zone PostgreSQL accepts.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

# -- message types: a Kafka header ------------------------------------------------------------
TYPE_HEADER = "type"
TRADE = "trade"
CLOSE = "close"
# Amendments of a trade already sent (FIX ExecType H, trade cancel; G, trade correct): they go
# to the partition of the trade they amend (same key), take that partition's next seq and
# count in its close marker's last_seq, like a trade.
CANCEL = "cancel"
CORRECT = "correct"
AMENDMENTS = (CANCEL, CORRECT)
TRADE_HEADERS: list[tuple[str, bytes]] = [(TYPE_HEADER, TRADE.encode())]
CLOSE_HEADERS: list[tuple[str, bytes]] = [(TYPE_HEADER, CLOSE.encode())]
CANCEL_HEADERS: list[tuple[str, bytes]] = [(TYPE_HEADER, CANCEL.encode())]
CORRECT_HEADERS: list[tuple[str, bytes]] = [(TYPE_HEADER, CORRECT.encode())]
# A message without a type header is a trade (lenient toward older producers); a type header
# whose value is null, empty or anything else makes the message a dead letter.
MISSING_TYPE_MEANS = TRADE


# -- the rules, as data -----------------------------------------------------------------------
@dataclass(frozen=True)
class TextField:
    """A JSON string: non-empty, at most ``max_length`` characters, printable."""

    name: str
    max_length: int


@dataclass(frozen=True)
class IntField:
    """A JSON integer (not a float, not a boolean, not a string) in [minimum, maximum]."""

    name: str
    minimum: int
    maximum: int


# Characters a text field may not contain: C0 controls (NUL included), DEL and C1 controls.
# Written as a regex character class that Python's re and Java's regex read the same way.
CONTROL_CHARS = r"\x00-\x1f\x7f-\x9f"
PRINTABLE_PATTERN = rf"[^{CONTROL_CHARS}]*"

MIN_DATE = dt.date(2000, 1, 1)
MAX_DATE = dt.date(2099, 12, 31)
# YYYY-MM-DD within [MIN_DATE, MAX_DATE]; the calendar check (no 30 February) comes after.
# Months and days are spelled out (01-12, 01-31) rather than [0-9]{2} so that the pattern
# alone refuses month 13 or day 00, and each parser's calendar check only has to catch the
# day a month lacks. The patterns are unanchored: Python uses fullmatch, Spark wraps them in
# ^(?:...)\z (Java's $ also matches before a final newline).
_YMD = r"20[0-9]{2}-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12][0-9]|3[01])"
DATE_PATTERN = _YMD
# Strict ISO-8601 with a 'T', seconds, up to microseconds and a zone: Z or +hh:mm with
# |offset| < 15 h (PostgreSQL refuses offsets of 16 h and more, Java of more than 18 h).
# Hours 00-23 and seconds 00-59: no 24:00:00 and no leap second 23:59:60, which Python and
# Spark refuse and PostgreSQL would accept (rolling over to the next minute or day).
EXECUTED_AT_PATTERN = (
    _YMD + r"T(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\.[0-9]{1,6})?"
    r"(?:Z|[+-](?:0[0-9]|1[0-4]):[0-5][0-9])"
)
PRICE_PRECISION = 18
PRICE_SCALE = 4
# numeric(18, 4), canonical: at most 14 integer digits without leading zeros, 1-4 decimals.
PRICE_PATTERN = (
    rf"(?:0|[1-9][0-9]{{0,{PRICE_PRECISION - PRICE_SCALE - 1}}})"
    rf"(?:\.[0-9]{{1,{PRICE_SCALE}}})?"
)
# ...and not zero: at least one non-zero digit somewhere.
NONZERO_PATTERN = r".*[1-9].*"

# -- the JSON itself ----------------------------------------------------------------------
# A value is one RFC 8259 JSON object in UTF-8 (no byte order mark), optionally surrounded
# by JSON whitespace and by nothing else, and on top of RFC 8259:
# - no object repeats a key (orjson keeps the last value, Spark's reader the last one for
#   the fields it reads and the first one for its own checks: refuse rather than guess);
# - no lone UTF-16 surrogate escape ("\ud800"), which is not a character;
# - every number is finite as a binary64 double (orjson refuses 1e400);
# - the limits below, which keep what orjson and Spark's Jackson accept the same.
JSON_WHITESPACE = " \t\n\r"
# Objects and arrays nest at most this deep (the trade object itself is level 1). orjson
# stops at 1024 levels and Jackson at 1000; extra fields need far fewer.
MAX_DEPTH = 8
# A number token is at most this many characters. Jackson refuses numbers of more than 1000
# digits (counted its own way); orjson has no such limit.
MAX_NUMBER_LENGTH = 1000
# An object key is at most this many UTF-16 code units: Jackson's default name limit (Spark
# cannot raise it), enforced by Spark's reader itself and checked by the Python parser. Only
# a value longer than this many bytes can hold such a key.
MAX_KEY_LENGTH = 50_000

MAX_SEQ = 10**15  # per trade date and partition; far above any real day
MAX_QUANTITY = 10**9  # a day of such trades still sums inside bigint
MAX_PARTITION = 2**31 - 1

TRADE_ID = TextField("trade_id", 64)
SYMBOL = TextField("symbol", 32)
BUYER = TextField("buyer", 64)
SELLER = TextField("seller", 64)
TEXT_FIELDS: tuple[TextField, ...] = (TRADE_ID, SYMBOL, BUYER, SELLER)
SEQ = IntField("seq", 1, MAX_SEQ)
QUANTITY = IntField("quantity", 1, MAX_QUANTITY)
INT_FIELDS: tuple[IntField, ...] = (SEQ, QUANTITY)
# Every field of a trade value, in the order of the wire format (design.md).
TRADE_FIELDS = ("trade_id", "trade_date", "seq", "symbol", "price", "quantity", "buyer",
                "seller", "executed_at")
# Fields that are JSON strings on the wire.
STRING_FIELDS = ("trade_id", "trade_date", "symbol", "price", "buyer", "seller", "executed_at")

# A cancel: {"trade_id", "trade_date", "seq", "reason"}; seq is the cancel's own. A correction:
# the whole trade again (TRADE_FIELDS, seq its own) and "version"; the original trade is
# version 1 and the highest version wins. Neither may move a trade to another date.
REASON = TextField("reason", 256)
CANCEL_FIELDS = ("trade_id", "trade_date", "seq", "reason")
ORIGINAL_VERSION = 1
VERSION = IntField("version", ORIGINAL_VERSION + 1, 2**31 - 1)
CORRECT_FIELDS = (*TRADE_FIELDS, "version")
# What a correction may change: the economic fields (identity and date stay the trade's).
CORRECTED_FIELDS = ("symbol", "price", "quantity", "buyer", "seller", "executed_at")

CLOSE_PARTITION = IntField("partition", 0, MAX_PARTITION)
CLOSE_LAST_SEQ = IntField("last_seq", 0, MAX_SEQ)
CLOSE_FIELDS = ("trade_date", "partition", "last_seq")
# An amended close (busts and corrections decided after the close, design.md): the k-th
# amended close marker of a day's partition carries "amended": k (1, 2, ...) and a last_seq
# that covers the cancels and corrections sent after the close. Optional: a marker without
# it is the day's close. A cancel or correction of a closed day is a post-close amendment
# of it only when an amended close marker behind it on its partition covers its seq; else
# it stays a `late` dead letter.
CLOSE_AMENDED = IntField("amended", 1, 2**31 - 1)

# -- the ledger row ---------------------------------------------------------------------------
# Columns of `trades` that settlement reads, in this order (sql/migrations/0001_ledger.sql).
LEDGER_COLUMNS = ("trade_id", "trade_date", "seq", "kafka_partition", "kafka_offset", "symbol",
                  "price", "quantity", "buyer", "seller", "executed_at")
# The COPY into a site's staging table: the ledger row and the site that wrote it.
STAGE_COLUMNS = (*LEDGER_COLUMNS, "site")
# Columns of `trade_amendments` that settlement reads (sql/migrations/0009_amendments.sql);
# a cancel leaves version and the corrected fields NULL, a correction leaves reason NULL.
AMENDMENT_COLUMNS = ("trade_id", "trade_date", "seq", "kafka_partition", "kafka_offset", "kind",
                     "version", "reason", *CORRECTED_FIELDS)

# -- Kafka names other tools rely on (ACLs, drills, the status view) -------------------------
# The gateway's transactional.id; Kafka ACLs grant the gateway user this prefix.
TRANSACTIONAL_ID = "exchange-gateway"
SHARED_GROUP = "settlement-shared"


def group_id(site: str, scheme: str) -> str:
    """A site's consumer group: its own in the separate scheme, one for both in shared."""
    return f"settlement-site-{site}" if scheme == "separate" else SHARED_GROUP
