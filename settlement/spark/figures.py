"""Checksums of a day's trades: what validation compares before it compares trades.

A day is cut into buckets, ``(kafka_partition, seq div BUCKET_SEQS)``. One aggregate per copy
of the day gives each bucket's figures: the trade count, the lowest and highest seq, the sum
of a 64-bit hash of each seq and of each trade's canonical row (each summed as its two
32-bit halves).
Two copies of a day whose buckets all have the same figures hold the same trades, up to a
64-bit hash collision (the row hash is md5's first eight bytes: nobody can aim a trade at
another's hash sum without being able to write to both copies). Only buckets whose figures
differ are then compared trade by trade, so a lost, extra or altered trade is still named,
and a good day costs one aggregate of the settled day (taken in the Kafka read's counting
pass) plus one SQL aggregate per ledger instead of moving every ledger row into Spark and
joining it both ways.

The canonical row and the hash are written three times: for Spark (``row_hash``), for
PostgreSQL (``sql/queries/ledger.sql``, ``day_figures``), and in Python for the Kafka
classifier's workers (``settlement.spark.rowhash.row_hashes``: the day's hashes come with its
verdicts, where the fields are at hand already, and the counting pass only sums them; Spark's
expression cost the 2M day's counting pass 3.8-5.8 s). ``tests/test_parity.py`` holds all
three to the same hashes on the adversarial corpus stored in a real ledger. Every hashed field
is compared trade by trade in the drill-down, so a bucket can only differ because a trade does.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Context, Decimal, Inexact, localcontext
from typing import Any

import numpy as np
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from settlement.spark.rowhash import SEPARATOR
from settlement.spark.session import local_frame

# Seqs per bucket: a partition of a 10M-trade day on 12 partitions is 13 buckets, so one
# lost trade makes the drill-down read 65,536 trades of the ledger, not the day.
BUCKET_SEQS = 1 << 16
Bucket = tuple[int, int]  # (kafka_partition, bucket)
FIGURES_SCHEMA = ("kafka_partition int, bucket long, trades long, lo long, hi long, "
                  "seq_hi long, seq_lo long, row_hi long, row_lo long")
# FIGURES_SCHEMA after the partition.
FIGURE_FIELDS = ("bucket", "trades", "lo", "hi", "seq_hi", "seq_lo", "row_hi", "row_lo")


def _halves(h: Column) -> tuple[Column, Column]:
    """A 64-bit hash as its high and low 32 bits: sums of 32-bit halves stay exact in a
    bigint for billions of trades, where summing the hash itself needs decimals (which cost
    as much as the hash here)."""
    return F.shiftright(h, 32), h.bitwiseAND(F.lit(0xFFFFFFFF))


def row_hash() -> tuple[Column, Column]:
    """The trade's canonical row hashed: md5 of the fields joined by SEPARATOR, its first 8
    bytes as two unsigned 32-bit halves (the SQL's ``('x' || ...)::bit(32)::bigint``).
    Every field of the ledger row but the offset, each rendered as text the same way in
    Spark and PostgreSQL: the date as days since 1970-01-01, the price as its integer count
    of 1/10,000 (scale 4), executed_at as microseconds since the epoch, the rest as is."""
    text = F.concat_ws(
        SEPARATOR,
        F.col("trade_id"), F.unix_date("trade_date").cast("string"),
        F.col("seq").cast("string"), F.col("kafka_partition").cast("string"), F.col("symbol"),
        (F.col("price") * F.lit(10_000)).cast("long").cast("string"),
        F.col("quantity").cast("string"), F.col("buyer"), F.col("seller"),
        F.unix_micros("executed_at").cast("string"))
    md5 = F.md5(text)
    return (F.conv(F.substring(md5, 1, 8), 16, 10).cast("long"),
            F.conv(F.substring(md5, 9, 8), 16, 10).cast("long"))


def seq_hash(seq: Column) -> tuple[Column, Column]:
    """A 64-bit hash of a seq, in halves: its sum over a partition proves, with the count,
    the lowest and the highest seq, that the partition holds each seq 1..n exactly once."""
    return _halves(F.xxhash64(seq.cast("long")))


def bucket_of(seq: Column) -> Column:
    return F.floor(seq / F.lit(BUCKET_SEQS)).cast("long")


def figure_columns(only: Column | None = None,
                   hashes: tuple[Column, Column] | None = None,
                   rows: bool = True) -> list[Column]:
    """The aggregates of a bucket's figures after its key columns, over the rows where
    ``only`` holds (all rows: None). Shared by ``figures`` and the Kafka read, which takes
    the settled day's figures in the pass that counts the read; ``hashes``: the rows'
    ``row_hash`` halves when they hold them already (the Kafka classifier's). ``rows``
    False: the row hash sums are NULL (see ``figures``)."""
    def keep(c: Column) -> Column:
        return c if only is None else F.when(only, c)

    seq_hi, seq_lo = seq_hash(F.col("seq"))
    no_hash = F.lit(None).cast("long")
    row_hi, row_lo = (hashes if hashes is not None else row_hash() if rows
                      else (no_hash, no_hash))
    one = F.lit(1) if only is None else F.when(only, F.lit(1))
    return [F.count(one).alias("trades"), F.min(keep(F.col("seq"))).alias("lo"),
            F.max(keep(F.col("seq"))).alias("hi"), F.sum(keep(seq_hi)).alias("seq_hi"),
            F.sum(keep(seq_lo)).alias("seq_lo"), F.sum(keep(row_hi)).alias("row_hi"),
            F.sum(keep(row_lo)).alias("row_lo")]


def figures(trades: DataFrame, rows: bool = True) -> DataFrame:
    """Each bucket's figures (FIGURES_SCHEMA): one aggregate, reduced within each task
    before anything is shuffled (a few rows per task). ``rows`` False: without the row
    hash sums (NULL), for a copy no other copy is compared with: its completeness needs the
    counts and seq sums only, and the md5 of every row was most of the aggregate's cost
    (0.4 s of 0.6 s for 200,000 trades, warm). A NULL sum equals no other copy's figures, so a
    reconciliation handed them would drill down, never pass."""
    return (trades
            .groupBy(F.col("kafka_partition").cast("int").alias("kafka_partition"),
                     bucket_of(F.col("seq")).alias("bucket"))
            .agg(*figure_columns(rows=rows)))


# The day's trades as sent, per instrument (symbol, trades, volume, notional): what the
# settled day's sums per instrument are derived from (``settlement.spark.settle``), taken in
# the pass that already reads every trade of the day.
SymbolSums = list[tuple[str, int, int, Decimal]]
# Sums and products of money in the driver: exact or an error. Python's default context keeps 28
# digits and rounds beyond them silently; a day's notional in decimal(38,4) may hold 38.
EXACT = Context(prec=80, traps=[Inexact])


def symbol_columns(only: Column | None = None) -> list[Column]:
    """The aggregates of ``SymbolSums`` after the symbol, over the rows where ``only`` holds
    (all rows: None): trades, volume and notional (sum of price * quantity, exact)."""
    def keep(c: Column) -> Column:
        return c if only is None else F.when(only, c)

    one = F.lit(1) if only is None else F.when(only, F.lit(1))
    return [F.count(one).alias("symbol_trades"),
            F.sum(keep(F.col("quantity").cast("long"))).alias("volume"),
            F.sum(keep(F.col("price") * F.col("quantity"))).alias("notional")]


def figures_and_symbols(trades: DataFrame, rows: bool = True
                        ) -> tuple[list[tuple[Any, ...]], SymbolSums]:
    """``figures``' rows (collected) and the day's ``SymbolSums``, from one aggregate by
    bucket and symbol (a symbol lives in one partition, so this is a few rows per bucket):
    the ledger read's cache-filling pass takes both."""
    got = (trades
           .groupBy(F.col("kafka_partition").cast("int").alias("kafka_partition"),
                    bucket_of(F.col("seq")).alias("bucket"), F.col("symbol"))
           .agg(*figure_columns(rows=rows), *symbol_columns())
           .collect())
    out = FiguresBySymbol()
    for r in got:
        out.add(int(r["kafka_partition"]), r, r["symbol"])
    return out.figures(), out.symbols()


class FiguresBySymbol:
    """Aggregate rows grouped by bucket and symbol (``figure_columns`` then
    ``symbol_columns``), merged into FIGURES_SCHEMA rows per bucket and ``SymbolSums``."""

    def __init__(self) -> None:
        self._buckets: dict[Bucket, tuple[list[int], list[int] | None]] = {}
        self._symbols: dict[str, list[Any]] = {}

    def add(self, partition: int, r: Any, symbol: str | None) -> None:
        key = (partition, int(r["bucket"]))
        seqs = [int(r[c]) for c in ("trades", "lo", "hi", "seq_hi", "seq_lo")]
        row = None if r["row_hi"] is None else [int(r["row_hi"]), int(r["row_lo"])]
        held = self._buckets.get(key)
        if held is not None:
            seqs = _combined(held[0], seqs)
            row = None if row is None or held[1] is None else [
                held[1][0] + row[0], held[1][1] + row[1]]
        self._buckets[key] = (seqs, row)
        if symbol is not None and r["symbol_trades"]:
            s = self._symbols.setdefault(symbol, [0, 0, Decimal(0)])
            s[0] += int(r["symbol_trades"])
            s[1] += int(r["volume"])
            with localcontext(EXACT):
                s[2] += r["notional"]

    def figures(self) -> list[tuple[Any, ...]]:
        """FIGURES_SCHEMA rows, by bucket (NULL row hash sums where a row had none)."""
        return [(*k, *seqs, *(row if row is not None else (None, None)))
                for k, (seqs, row) in sorted(self._buckets.items())]

    def symbols(self) -> SymbolSums:
        return [(k, v[0], v[1], v[2]) for k, v in sorted(self._symbols.items())]


def in_buckets(trades: DataFrame, buckets: list[Bucket]) -> DataFrame:
    """The trades of these buckets (an empty frame when there are none)."""
    if not buckets:
        return trades.limit(0)
    cond = F.lit(False)
    for p, b in buckets:
        cond = cond | ((F.col("kafka_partition") == p)
                       & (F.col("seq") >= b * BUCKET_SEQS)
                       & (F.col("seq") < (b + 1) * BUCKET_SEQS))
    return trades.where(cond)


def bucket_sql(buckets: list[Bucket]) -> str:
    """The same buckets as a SQL condition on ``trades`` (integers only: safe to inline)."""
    return " or ".join(
        f"(kafka_partition = {int(p)} and seq >= {int(b) * BUCKET_SEQS} "
        f"and seq < {(int(b) + 1) * BUCKET_SEQS})" for p, b in buckets) or "false"


Figures = dict[Bucket, tuple[int, int, int]]  # bucket -> (trades, row hash sums)


@dataclass
class DaySide:
    """One copy of a day for a reconciliation: its figures per bucket, and how to fetch the
    trades of some buckets (TRADE_SCHEMA) when they differ from the other copy's."""

    name: str
    figures: Figures
    rows_in: Callable[[list[Bucket]], DataFrame]
    seconds: float = 0.0  # what taking the figures cost

    @classmethod
    def of_frame(cls, name: str, trades: DataFrame, held: DataFrame | None = None
                 ) -> DaySide:
        """A copy held in Spark (the settled day, or a ledger already read); ``held``: its
        figures when they were taken already (``collect_figures``)."""
        t0 = time.perf_counter()
        rows = (held if held is not None else figures(trades)).select(
            "kafka_partition", "bucket", "trades", "row_hi", "row_lo").collect()
        got = {(int(r[0]), int(r[1])): (int(r[2]), int(r[3]), int(r[4])) for r in rows}
        return cls(name, got, lambda b: in_buckets(trades, b),
                   round(time.perf_counter() - t0, 3))


def collect_figures(spark: SparkSession, trades: DataFrame,
                    held: list[tuple[int, ...]] | None = None,
                    row_sums: bool = True) -> DataFrame:
    """``figures`` computed once (or ``held``: rows taken already, by the Kafka read) and
    handed back as a local frame: whatever reads it afterwards never scans the day again.
    ``row_sums``: ``figures``' ``rows``."""
    rows = held if held is not None else [
        tuple(r) for r in figures(trades, rows=row_sums).collect()]
    return local_frame(spark, rows, FIGURES_SCHEMA)


def differing(a: DaySide, b: DaySide) -> list[Bucket]:
    """The buckets whose figures differ (present in one copy only included)."""
    return sorted(k for k in a.figures.keys() | b.figures.keys()
                  if a.figures.get(k) != b.figures.get(k))


PARTITION_FIGURES_SCHEMA = ("kafka_partition int, trades long, lo long, hi long, "
                            "seq_hi long, seq_lo long, last_seq long, expected_hi long, "
                            "expected_lo long, suspect boolean, amendments long")


# Spark's XXH64 (org.apache.spark.sql.catalyst.expressions.XXH64) and the seed F.xxhash64
# uses: ``spark_xxhash64`` computes ``seq_hash`` without a Spark job.
_P1, _P2, _P3 = 0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9
_P4, _P5 = 0x85EBCA77C2B2AE63, 0x27D4EB2F165667C5
XXHASH64_SEED = 42
# How many seqs ``expected_seq_sums`` hashes at a time (8 bytes each, a few arrays).
_CHUNK = 1 << 20


def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    return (x << np.uint64(r)) | (x >> np.uint64(64 - r))


def spark_xxhash64(values: np.ndarray) -> np.ndarray:
    """``F.xxhash64`` of bigints, as int64: Spark's ``XXH64.hashLong`` (the 64-bit xxHash of
    the value's eight bytes) with its seed, in wrapping uint64 arithmetic."""
    with np.errstate(over="ignore"):
        x = values.astype(np.int64).view(np.uint64)
        h = np.uint64((XXHASH64_SEED + _P5 + 8) % (1 << 64))
        h = h ^ (_rotl(x * np.uint64(_P2), 31) * np.uint64(_P1))
        h = _rotl(h, 27) * np.uint64(_P1) + np.uint64(_P4)
        h ^= h >> np.uint64(33)
        h *= np.uint64(_P2)
        h ^= h >> np.uint64(29)
        h *= np.uint64(_P3)
        h ^= h >> np.uint64(32)
    return h.view(np.int64)


def _combined(a: list[int] | None, b: list[int]) -> list[int]:
    """Two sets of figures (count, lowest seq, highest seq, seq hash sums) as one."""
    if a is None:
        return b
    return [a[0] + b[0], min(a[1], b[1]), max(a[2], b[2]), a[3] + b[3], a[4] + b[4]]


def seq_figures(seqs: list[tuple[int, int]],
                rows: list[tuple[int, int]] | None = None) -> list[tuple[int | None, ...]]:
    """``figures(rows=False)`` of a few rows the driver holds, (kafka_partition, seq) each:
    FIGURES_SCHEMA rows per bucket, the seq hashes taken as ``seq_hash`` takes them.
    ``rows``: each row's hash halves as well (the classifier's ``_row_hi``, ``_row_lo``),
    summed as the Kafka read's pass sums them; without them the row hash sums are NULL."""
    if not seqs:
        return []
    h = spark_xxhash64(np.array([q for _, q in seqs], dtype=np.int64))
    his, los = (h >> np.int64(32)).tolist(), (h & np.int64(0xFFFFFFFF)).tolist()
    got: dict[Bucket, list[int]] = {}
    sums: dict[Bucket, list[int]] = {}
    for i, ((p, q), hi, lo) in enumerate(zip(seqs, his, los, strict=True)):
        key = (int(p), q // BUCKET_SEQS)
        got[key] = _combined(got.get(key), [1, q, q, hi, lo])
        if rows is not None:
            held = sums.setdefault(key, [0, 0])
            held[0], held[1] = held[0] + rows[i][0], held[1] + rows[i][1]
    return [(*k, *v, *sums.get(k, (None, None))) for k, v in sorted(got.items())]


def expected_seq_sums(lengths: set[int]) -> dict[int, tuple[int, int]]:
    """For each n, the seq hash sums (``seq_hash``'s high and low halves) of 1..n, computed
    in the driver with numpy a chunk at a time. (A Spark job over ``range(1, n)`` with a
    conditional sum per n took 0.8 s of a cold close beside the netting.)"""
    wanted = sorted(n for n in lengths if n > 0)
    out: dict[int, tuple[int, int]] = {}
    hi_sum = lo_sum = 0
    start = 1  # the next seq to hash
    for n in wanted:
        while start <= n:
            end = min(n, start + _CHUNK - 1)
            h = spark_xxhash64(np.arange(start, end + 1, dtype=np.int64))
            hi_sum += int((h >> np.int64(32)).sum())
            lo_sum += int((h & np.int64(0xFFFFFFFF)).sum())
            start = end + 1
        out[n] = (hi_sum, lo_sum)
    return out


def partition_figures(spark: SparkSession, buckets: DataFrame, markers: dict[int, int],
                      amendments: list[Any] | None = None) -> DataFrame:
    """Per partition of the settled day (PARTITION_FIGURES_SCHEMA): the figures summed over
    its buckets, its close marker's last_seq, the seq hash sums a complete partition
    1..last_seq has, and ``suspect``: whether its messages must be searched seq by seq
    (anything but exactly one trade or amendment at each seq 1..last_seq, or any with no
    marker). ``buckets``: the settled day's ``collect_figures``; ``amendments``: its
    cancels' and corrections' figures rows (they take seqs too; ``trades`` counts trades
    only, ``amendments`` them). Returned as a local frame."""
    got: dict[int, list[int]] = {}
    amended: dict[int, int] = {}
    for kind, rows_ in (("trades", buckets.collect()), ("amendments", amendments or [])):
        for r in rows_:
            p = int(r[0])
            n, lo, hi, sh, sl = (int(r[i]) for i in range(2, 7))  # FIGURES_SCHEMA order
            if kind == "amendments":
                amended[p] = amended.get(p, 0) + n
            got[p] = _combined(got.get(p), [n, lo, hi, sh, sl])
    # Only a partition whose count is its marker's last_seq can be complete, so only those
    # lengths are hashed: bounded by the day's own size, whatever a marker claims.
    expected = expected_seq_sums({last for p, last in markers.items()
                                  if got.get(p, [0])[0] == last})
    rows = []
    for p in sorted(got.keys() | markers.keys()):
        n, lo, hi, sh, sl = got.get(p, [0, None, None, 0, 0])
        last = markers.get(p)
        # NULL where the count alone proves the partition incomplete (not hashed).
        eh, el = expected.get(last, (None, None)) if last else (0, 0)
        complete = last is not None and n == last and (
            last == 0 or (lo == 1 and hi == last and (sh, sl) == (eh, el)))
        rows.append((p, n - amended.get(p, 0), lo, hi, sh, sl, last, eh, el, not complete,
                     amended.get(p, 0)))
    return local_frame(spark, rows, PARTITION_FIGURES_SCHEMA)
