"""Which of a day's cancels and corrections the amendment suites must see.

``amendments_day`` and ``reconcile_amendments`` are joins of small frames (a 2M-trade day has
about 11,500 amendments), but each of their five queries is a Spark job planned and run while
the close nets the day on the same two cores: 1.5-3.6 s of validation's thread on a realistic
2M-trade day from Kafka. Most amendments cannot fail any of them, and which ones can is
decided here, exactly, from rows the driver holds; the suites then run on the others only, as
the trade suites run on the buckets whose checksums differ (``settlement.spark.figures``).
Every query returns the same rows on the kept ones as on all of them (so the verdict, its
counts and its examples are the same); on a day where nothing is wrong the frames are empty.

An amendment is left out only when
- ``amendments_day`` cannot name it: a trade of the day is at an earlier offset of its
  partition under its id and date (the anti join finds it), and no two amendments of its
  trade make a pair "versions only rise" names (a cancel, then anything; two corrections
  whose version does not rise); and
- ``reconcile_amendments`` cannot name it: the other copy holds an amendment with its identity
  (trade id, kind, version), each copy holds that identity once, and every compared field is
  equal (as ``<=>`` compares them). Its twin in the other copy is left out with it.

Python's equality here implies Spark's: values are compared as the frames store them (an
instant for a timestamp, whether the row came from Spark or from PostgreSQL), nulls are never
taken to match where the query uses ``=``, and two equal Decimals stay equal in the suites'
decimal type. Anything this module cannot vouch for is kept, so the suites decide it.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Sequence
from typing import Any

from settlement.contract import AMENDMENT_COLUMNS, CANCEL, CORRECT
from settlement.validation.suites import AMENDMENT_FIELDS

Rows = Sequence[Sequence[Any]]

# AMENDMENT_SCHEMA's columns (AMENDMENT_COLUMNS' order) by name.
_AT = {c: i for i, c in enumerate(AMENDMENT_COLUMNS)}


def _identity(row: Sequence[Any]) -> tuple[Any, ...] | None:
    """The suites' join key (trade id, kind, coalesce(version, 0)); None when ``=`` could
    never match it (a null trade id or kind)."""
    tid, kind, version = row[_AT["trade_id"]], row[_AT["kind"]], row[_AT["version"]]
    if tid is None or kind is None:
        return None
    return tid, kind, 0 if version is None else version


def _refers(row: Sequence[Any], earliest: dict[tuple[Any, ...], int]) -> bool:
    """Whether a trade of the day precedes the amendment under its id, partition and date
    (``amended``'s rows: AMENDED_SCHEMA, the earliest offset per key)."""
    key = (row[_AT["trade_id"]], row[_AT["kafka_partition"]], row[_AT["trade_date"]])
    offset = row[_AT["kafka_offset"]]
    if any(v is None for v in (*key, offset)):
        return False
    first = earliest.get(key)
    return first is not None and first < offset


def suspects(day: Rows, amended: Rows, other: Rows | None
             ) -> tuple[list[int], list[int] | None]:
    """The positions in ``day`` (the settled amendments, AMENDMENT_SCHEMA) and in ``other``
    (the other copy's; None: not reconciled) of the rows the amendment suites must see.
    ``amended``: the day's trades they name (AMENDED_SCHEMA: trade id, partition, offset,
    date first)."""
    earliest: dict[tuple[Any, ...], int] = {}
    for t in amended:
        tid, partition, offset, date = t[0], t[1], t[2], t[3]
        if offset is not None:
            key = (tid, partition, date)
            earliest[key] = min(offset, earliest.get(key, offset))
    rising = _versions_rise(day)
    keep = {i for i, r in enumerate(day)
            if r[_AT["trade_id"]] not in rising or not _refers(r, earliest)}
    if other is None:
        return sorted(keep), None
    agreed = _agreed(day, other)
    keep |= {i for i, r in enumerate(day) if _identity(r) not in agreed}
    kept_ids = {_identity(day[i]) for i in keep}
    theirs = [i for i, r in enumerate(other)
              if (k := _identity(r)) not in agreed or k in kept_ids]
    return sorted(keep), theirs


def _versions_rise(day: Rows) -> set[Any]:
    """The trade ids whose amendments "versions only rise" cannot name: no pair of them, one
    before the other on the log, has a cancel first or two corrections whose version does
    not rise (the suite's self join, with its nulls: a null offset pairs with nothing, a
    null version compares false)."""
    by_trade: dict[Any, list[Sequence[Any]]] = {}
    for r in day:
        by_trade.setdefault(r[_AT["trade_id"]], []).append(r)
    out = set()
    for tid, rows in by_trade.items():
        if tid is None:
            continue
        dated = sorted((r for r in rows if r[_AT["kafka_offset"]] is not None),
                       key=lambda r: r[_AT["kafka_offset"]])
        if not any(_named_pair(a, b) for i, a in enumerate(dated) for b in dated[i + 1:]
                   if a[_AT["kafka_offset"]] < b[_AT["kafka_offset"]]):
            out.add(tid)
    return out


def _named_pair(a: Sequence[Any], b: Sequence[Any]) -> bool:
    """Whether the suite names the pair (``a`` before ``b`` on the log)."""
    if a[_AT["kind"]] == CANCEL:
        return True
    va, vb = a[_AT["version"]], b[_AT["version"]]
    return (a[_AT["kind"]] == CORRECT and b[_AT["kind"]] == CORRECT
            and va is not None and vb is not None and vb <= va)


def _agreed(day: Rows, other: Rows) -> set[tuple[Any, ...]]:
    """The identities each copy holds once, with every compared field equal in both."""
    def once(rows: Rows) -> dict[tuple[Any, ...], Sequence[Any]]:
        ids = Counter(_identity(r) for r in rows)
        return {k: r for r in rows if (k := _identity(r)) is not None and ids[k] == 1}

    ours, theirs = once(day), once(other)
    return {k for k, r in ours.items() if k in theirs
            and all(_as_stored(r[_AT[c]]) == _as_stored(theirs[k][_AT[c]])
                    for c in AMENDMENT_FIELDS)}


def _as_stored(value: Any) -> Any:
    """A value as a frame stores it (``settlement.spark.session.local_frame``): a naive
    datetime is local time (as ``collect()`` hands it back), an aware one its instant."""
    return value.astimezone(dt.UTC) if isinstance(value, dt.datetime) else value
