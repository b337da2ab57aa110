"""The canonical text of a plain trade and of a day's close marker, as one pattern each.

Generated from ``settlement.contract``: a value matching ``TRADE_PATTERN`` is a trade the
contract accepts, whose fields can be read off its text by position (``settlement.spark.native``
splits it on its quotes). So the pattern is strict where the contract is lenient, never the
other way round:

- fields in the contract's order (``TRADE_FIELDS``), each exactly once, compact separators,
  nothing before or after the object: a repeated key, a byte order mark, an extra field or
  whitespace cannot match;
- text fields of printable ASCII without a quote or a backslash, so no escape (``\\u0041``
  spells what ``A`` does, and would need decoding) and no control character can match;
  their lengths are the contract's, counted in characters as the contract counts them;
- integers without sign, leading zero or exponent, no more digits than the contract's maximum
  (the exact bound is checked as a number by the caller); a price by the contract's canonical
  pattern and not zero;
- dates of the calendar: ``DATE_PATTERN`` lets 30 February through to each parser's calendar
  check, which a pattern alone has to make (years 2000-2099: a leap year is one divisible by
  four there).

Anything else (non-ASCII names, amended close markers, JSON the contract reads but not in this
shape) is no business of these patterns: the caller sends it to the Python parser, which gives
the verdict and the reason. ``tests/test_native.py`` holds a pattern match to the Python
parser's acceptance on the parity corpus and on hostile near-canonical values.
"""

from __future__ import annotations

import datetime as dt

from settlement.contract import (
    CLOSE_FIELDS,
    CLOSE_LAST_SEQ,
    CLOSE_PARTITION,
    DATE_PATTERN,
    EXECUTED_AT_PATTERN,
    INT_FIELDS,
    MAX_DATE,
    MIN_DATE,
    PRICE_PATTERN,
    TEXT_FIELDS,
    TRADE_FIELDS,
    IntField,
)

# The calendar below spells out years 2000-2099 (where every fourth year, 2000 included, is a
# leap year); a contract that widened its window must widen this too.
if (MIN_DATE, MAX_DATE) != (dt.date(2000, 1, 1), dt.date(2099, 12, 31)) or not (
        DATE_PATTERN.startswith("20[0-9]{2}-") and EXECUTED_AT_PATTERN.startswith(DATE_PATTERN)):
    raise ImportError("settlement.spark.canonical: the contract's date window changed")

# A calendar date in 2000-2099: days 01-28 of any month, 29-30 of any month but February, 31
# of the long months, 29 February of a leap year.
CALENDAR_DATE = (
    r"20(?:[0-9]{2}-(?:(?:0[1-9]|1[0-2])-(?:0[1-9]|1[0-9]|2[0-8])"
    r"|(?:0[13-9]|1[0-2])-(?:29|30)|(?:0[13578]|1[02])-31)"
    r"|(?:[02468][048]|[13579][26])-02-29)"
)
# The contract's execution time with its date part a calendar date.
CALENDAR_EXECUTED_AT = CALENDAR_DATE + EXECUTED_AT_PATTERN[len(DATE_PATTERN):]
# Printable ASCII but '"' and '\': a JSON string's content that needs no decoding.
_PLAIN_CHAR = r"[\x20\x21\x23-\x5b\x5d-\x7e]"
# A price by the contract, with a non-zero digit before its closing quote.
CANONICAL_PRICE = rf"(?=[0-9.]*[1-9])(?:{PRICE_PATTERN})"


def canonical_int(field: IntField) -> str:
    """A non-negative integer without sign, leading zero or exponent, of at most the digits
    of ``field.maximum`` (the caller compares the number with the maximum)."""
    if field.minimum not in (0, 1):
        raise ValueError(f"{field.name}: a canonical integer pattern starts at 0 or 1")
    digits = len(str(field.maximum))
    positive = rf"[1-9][0-9]{{0,{digits - 1}}}"
    return positive if field.minimum == 1 else rf"(?:0|{positive})"


def _field_pattern(name: str) -> str:
    """A trade field's canonical value, quoted when the contract writes it as a string."""
    for t in TEXT_FIELDS:
        if t.name == name:
            return f'"{_PLAIN_CHAR}{{1,{t.max_length}}}"'
    for i in INT_FIELDS:
        if i.name == name:
            return canonical_int(i)
    by_name = {"trade_date": f'"{CALENDAR_DATE}"', "price": f'"{CANONICAL_PRICE}"',
               "executed_at": f'"{CALENDAR_EXECUTED_AT}"'}
    if name not in by_name:
        raise ValueError(f"no canonical pattern for the trade field {name!r}")
    return by_name[name]


def _object(fields: list[tuple[str, str]], comma: str, colon: str) -> str:
    return r"\{" + comma.join(f'"{k}"{colon}{v}' for k, v in fields) + r"\}"


# A plain trade, compact as the gateway writes it: {"trade_id":"...",...,"executed_at":"..."}.
TRADE_PATTERN = _object([(f, _field_pattern(f)) for f in TRADE_FIELDS], ",", ":")


def _captured(pattern: str) -> str:
    """A field's pattern with its value (inside the quotes, if any) as a group."""
    if pattern.startswith('"'):
        return f'"({pattern[1:-1]})"'
    return f"({pattern})"


# TRADE_PATTERN with each field's value a group, in TRADE_FIELDS' order (the same texts match:
# a group captures, it does not change what matches).
TRADE_CAPTURE = _object([(f, _captured(_field_pattern(f))) for f in TRADE_FIELDS], ",", ":")

# A day's close marker (not an amended one: no "amended" field), written compact or with
# Python's json.dumps separators (", " and ": "), as the gateway writes it.
# Each field's value is a group (its text, inside the quotes), in CLOSE_FIELDS' order.
_CLOSE_VALUES = {"trade_date": f'"({CALENDAR_DATE})"',
                 CLOSE_PARTITION.name: f"({canonical_int(CLOSE_PARTITION)})",
                 CLOSE_LAST_SEQ.name: f"({canonical_int(CLOSE_LAST_SEQ)})"}
CLOSE_PATTERN = _object([(f, _CLOSE_VALUES[f]) for f in CLOSE_FIELDS], "(?:, |,)", "(?:: |:)")


def anchored(pattern: str) -> str:
    """A pattern for Spark's ``rlike`` (Java's find) that must match the whole text: Java's
    ``$`` also matches before a final newline, ``\\z`` only at the end."""
    return rf"^(?:{pattern})\z"
