"""Settlement steps on tiny inline frames (chispa), edge cases, and a random day checked
against an independent computation in plain Python with Decimal."""

from __future__ import annotations

import datetime as dt
import random
import re
from collections import defaultdict
from decimal import ROUND_HALF_UP, Decimal, localcontext
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from chispa import assert_df_equality
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import DateType, DecimalType, LongType, StringType, StructType

from settlement import contract as C
from settlement.config import REPO_ROOT, load_settings
from settlement.eod.model import CashObligation, Leg, Netting, net_legs, netting, rows_of, vwap
from settlement.spark import figures as figures_module
from settlement.spark import schemas as S
from settlement.spark import transforms as T
from settlement.spark.figures import (
    BUCKET_SEQS,
    collect_figures,
    expected_seq_sums,
    figures,
    figures_and_symbols,
    partition_figures,
    seq_figures,
    seq_hash,
    spark_xxhash64,
)
from settlement.spark.session import (
    artifact_name,
    as_collected,
    local_frame,
    persist_sized,
    spark_jars,
)
from settlement.spark.settle import net
from tests import spark_fixtures

# pytest finds fixtures among module attributes; a name bound by assignment (not import) is
# not reported as redefined by each test's `spark` parameter.
spark = spark_fixtures.spark

DAY = dt.date(2024, 3, 15)
OTHER_DAY = dt.date(2024, 3, 14)
UTC = dt.UTC


def trade(
    trade_id: str,
    symbol: str,
    price: str,
    quantity: int,
    buyer: str,
    seller: str,
    *,
    partition: int = 0,
    offset: int = 0,
    seq: int = 1,
    day: dt.date = DAY,
) -> tuple[Any, ...]:
    executed = dt.datetime.combine(day, dt.time(9, 30), tzinfo=UTC)
    return (
        trade_id, day, seq, partition, offset, symbol, Decimal(price), quantity, buyer, seller,
        executed,
    )  # fmt: skip


def frame(spark: SparkSession, rows: list[tuple[Any, ...]], schema: StructType) -> DataFrame:
    return spark.createDataFrame(rows, schema)


def same(actual: DataFrame, expected: DataFrame) -> None:
    # Aggregates are nullable where the inputs are not; NOT NULL is the tables' business.
    assert_df_equality(actual, expected, ignore_row_order=True, ignore_nullable=True)


def _frames(spark: SparkSession, trades: DataFrame, day: str | dt.date = DAY
            ) -> tuple[DataFrame, DataFrame, DataFrame]:
    """The close's netting of ``trades`` (settlement.spark.settle.net: the legs in Spark,
    the rest in Python) as frames: positions, cash obligations, instrument summary."""
    n = net(trades, day)
    return (frame(spark, n.positions, S.POSITIONS_SCHEMA),
            frame(spark, n.obligations, S.CASH_OBLIGATIONS_SCHEMA),
            frame(spark, n.instruments, S.INSTRUMENT_SUMMARY_SCHEMA))


def _netting(obligations: DataFrame) -> Netting:
    """The one netting computation (settlement.eod.model) over a frame's collected rows."""
    return netting(rows_of(CashObligation, obligations.collect()))


def d(value: str) -> Decimal:
    return Decimal(value)


# -- schemas match the tables ---------------------------------------------------------------


def _sql_columns(table: str) -> list[tuple[str, str]]:
    sql = (REPO_ROOT / "sql" / "migrations" / "0002_settlement.sql").read_text()
    body = re.search(rf"create table {table} \((.*?)\n\);", sql, re.S)
    assert body, table
    cols = []
    for line in body.group(1).splitlines():
        m = re.match(r"\s+(\w+)\s+(\w+(?:\(\d+,\s*\d+\))?)", line)
        if m and m.group(1) != "primary":
            cols.append((m.group(1), m.group(2).replace(" ", "")))
    # Columns later migrations added, in order.
    for path in sorted((REPO_ROOT / "sql" / "migrations").glob("*.sql")):
        for name, kind in re.findall(rf"alter table {table} add column (\w+) "
                                     r"(\w+(?:\(\d+,\s*\d+\))?)", path.read_text()):
            cols.append((name, kind.replace(" ", "")))
    return cols


def _sql_type(spark_type: Any) -> str:
    if isinstance(spark_type, DecimalType):
        return f"numeric({spark_type.precision},{spark_type.scale})"
    return {DateType: "date", StringType: "text", LongType: "bigint"}[type(spark_type)]


@pytest.mark.parametrize(
    ("table", "schema"),
    [
        ("positions", S.POSITIONS_SCHEMA),
        ("cash_obligations", S.CASH_OBLIGATIONS_SCHEMA),
        ("instrument_summary", S.INSTRUMENT_SUMMARY_SCHEMA),
    ],
)
def test_output_schemas_match_the_tables(table: str, schema: StructType) -> None:
    assert [(f.name, _sql_type(f.dataType)) for f in schema] == _sql_columns(table)


# -- edge cases -----------------------------------------------------------------------------


def test_account_that_only_buys(spark: SparkSession) -> None:
    trades = frame(
        spark,
        [
            trade("t1", "XAU", "1.5000", 10, "A", "B"),
            trade("t2", "XAU", "2.0000", 5, "A", "C"),
            trade("t3", "YEN", "100.0000", 1, "A", "B"),
        ],
        S.TRADE_SCHEMA,
    )
    pos, cash, _ = _frames(spark, trades)
    same(
        pos,
        frame(
            spark,
            [
                (DAY, "A", "XAU", 15, 0, 15, d("25"), d("0"), d("-25"), 2),
                (DAY, "A", "YEN", 1, 0, 1, d("100"), d("0"), d("-100"), 1),
                (DAY, "B", "XAU", 0, 10, -10, d("0"), d("15"), d("15"), 1),
                (DAY, "B", "YEN", 0, 1, -1, d("0"), d("100"), d("100"), 1),
                (DAY, "C", "XAU", 0, 5, -5, d("0"), d("10"), d("10"), 1),
            ],
            S.POSITIONS_SCHEMA,
        ),
    )
    same(
        cash,
        frame(
            spark,
            [
                (DAY, "A", d("125"), d("0"), d("-125"), 3),
                (DAY, "B", d("0"), d("115"), d("115"), 2),
                (DAY, "C", d("0"), d("10"), d("10"), 1),
            ],
            S.CASH_OBLIGATIONS_SCHEMA,
        ),
    )


def test_one_trade(spark: SparkSession) -> None:
    trades = frame(spark, [trade("t1", "XAU", "2345.6789", 3, "A", "B")], S.TRADE_SCHEMA)
    pos, cash, summary = _frames(spark, trades, "2024-03-15")
    amount = d("7037.0367")
    same(
        pos,
        frame(
            spark,
            [
                (DAY, "A", "XAU", 3, 0, 3, amount, d("0"), -amount, 1),
                (DAY, "B", "XAU", 0, 3, -3, d("0"), amount, amount, 1),
            ],
            S.POSITIONS_SCHEMA,
        ),
    )
    same(
        summary,
        frame(
            spark,
            [(DAY, "XAU", 1, 3, amount, d("2345.6789"), d("2345.6789"), d("2345.6789"),
              d("2345.6789"))],
            S.INSTRUMENT_SUMMARY_SCHEMA,
        ),
    )
    # Both legs settle in full: nothing was netted away.
    assert _netting(cash) == Netting(amount, 2 * amount, Decimal(0))


def test_a_day_with_zero_trades(spark: SparkSession) -> None:
    trades = frame(spark, [], S.TRADE_SCHEMA)
    pos, obligations, summary = _frames(spark, T.dedupe_trades(trades))
    same(pos, frame(spark, [], S.POSITIONS_SCHEMA))
    same(obligations, frame(spark, [], S.CASH_OBLIGATIONS_SCHEMA))
    same(summary, frame(spark, [], S.INSTRUMENT_SUMMARY_SCHEMA))
    assert _netting(obligations).efficiency is None
    assert _netting(obligations) == Netting(Decimal(0), Decimal(0), None)


def test_duplicated_trade_ids_keep_the_earliest_copy(spark: SparkSession) -> None:
    rows = [
        trade("t1", "XAU", "1.0000", 1, "A", "B", partition=1, offset=50, seq=9),
        trade("t1", "XAU", "1.0000", 1, "A", "B", partition=0, offset=70, seq=8),
        trade("t1", "XAU", "1.0000", 1, "A", "B", partition=0, offset=60, seq=7),
        trade("t2", "YEN", "2.0000", 2, "B", "A", partition=2, offset=5, seq=1),
        trade("t2", "YEN", "2.0000", 2, "B", "A", partition=2, offset=5, seq=1),
    ]
    expected = frame(spark, [rows[2], rows[3]], S.TRADE_SCHEMA)
    same(T.dedupe_trades(frame(spark, rows, S.TRADE_SCHEMA)), expected)
    # Same answer whatever the input order and spread over tasks.
    shuffled = frame(spark, rows[::-1], S.TRADE_SCHEMA).repartition(3)
    same(T.dedupe_trades(shuffled), expected)


def test_trades_of_other_dates_are_not_settled(spark: SparkSession) -> None:
    trades = frame(
        spark,
        [
            trade("t1", "XAU", "1.0000", 1, "A", "B"),
            trade("t0", "XAU", "9.0000", 9, "A", "B", day=OTHER_DAY),
        ],
        S.TRADE_SCHEMA,
    )
    pos, _, summary = _frames(spark, trades)
    rows = pos.select("account", "net_qty").collect()
    assert sorted(map(tuple, rows)) == [("A", 1), ("B", -1)]
    assert summary.select("trades").collect()[0][0] == 1


def test_multi_account_multi_symbol_day_balances(spark: SparkSession) -> None:
    rows = [
        # A ring on XAU at one price: every account's cash and quantity cancel out.
        trade("r1", "XAU", "10.0000", 5, "A", "B"),
        trade("r2", "XAU", "10.0000", 5, "B", "C"),
        trade("r3", "XAU", "10.0000", 5, "C", "A"),
        trade("m1", "YEN", "0.0071", 1_000_000, "D", "A"),
        trade("m2", "YEN", "0.0072", 400_000, "A", "B"),
        trade("m3", "OIL", "81.2500", 7, "C", "D"),
        trade("m4", "OIL", "80.9999", 3, "D", "B"),
        trade("m5", "OIL", "81.0001", 11, "B", "C"),
    ]
    trades = frame(spark, rows, S.TRADE_SCHEMA)
    pos, obligations, _ = _frames(spark, trades)
    per_symbol = pos.groupBy("symbol").agg(F.sum("net_qty").alias("q"), F.sum("net_cash"))
    assert {r["symbol"]: r["q"] for r in per_symbol.collect()} == {"XAU": 0, "YEN": 0, "OIL": 0}
    totals = pos.agg(F.sum("net_cash"), F.sum("trade_count")).collect()[0]
    assert totals[0] == 0
    assert totals[1] == 2 * len(rows)  # every trade has two legs
    assert obligations.agg(F.sum("net_cash")).collect()[0][0] == 0
    ring = _frames(spark, trades.where(F.col("symbol") == "XAU"))[1]
    assert _netting(ring).efficiency == 1  # the ring nets out completely


def test_vwap_rounds_half_up_exactly(spark: SparkSession) -> None:
    # notional / volume = 36.66158350204999818...: below the half at the 11th place, so
    # 36.6615835020. Dividing at Spark's bounded scale (…205000) and casting again would
    # round twice and give …5021.
    trades = frame(
        spark,
        [
            trade("v1", "XAU", "30.3226", 9664, "A", "B"),
            trade("v2", "XAU", "40.0845", 17897, "B", "A"),
        ],
        S.TRADE_SCHEMA,
    )
    row = _frames(spark, trades)[2].collect()[0]
    assert row["notional"] == d("1010429.9029")
    assert row["volume"] == 27561
    assert row["vwap"] == d("36.6615835020")
    assert str(row["vwap"]) == "36.6615835020"


def test_the_close_is_the_price_of_the_days_last_trade(spark: SparkSession) -> None:
    def at(hour: int, minute: int) -> dt.datetime:
        return dt.datetime.combine(DAY, dt.time(hour, minute), tzinfo=UTC)

    rows = [trade("z", "XAU", "1.0000", 1, "A", "B")[:-1] + (at(10, 0),),   # first by time
            trade("a", "XAU", "2.0000", 1, "B", "C")[:-1] + (at(15, 59),),
            trade("b", "XAU", "3.0000", 1, "C", "A")[:-1] + (at(15, 59),),  # same time: id b
            trade("y", "XAG", "5.0000", 1, "A", "C")[:-1] + (at(9, 31),)]
    summary = {r["symbol"]: r["close_price"]
               for r in _frames(spark, frame(spark, rows, S.TRADE_SCHEMA))[2].collect()}
    assert summary == {"XAU": d("3.0000"), "XAG": d("5.0000")}


def test_the_positions_are_handed_over_before_the_closing_prices_are_queried(
        spark: SparkSession) -> None:
    """Validation's last suite waits for the positions: it gets them from the legs, and runs
    beside the closing prices' pass over the day instead of after it."""
    rows = [trade("t1", "XAU", "2.5000", 3, "A", "B"), trade("t2", "XAG", "1.0000", 7, "B", "C")]
    tracker = spark.sparkContext.statusTracker()
    handed: list[tuple[list[Any], int]] = []

    def jobs() -> int:
        return max(tracker.getJobIdsForGroup(None), default=-1)

    netted = net(frame(spark, rows, S.TRADE_SCHEMA), DAY,
                 on_positions=lambda positions: handed.append((positions, jobs())))
    assert len(handed) == 1
    positions, jobs_then = handed[0]
    assert positions == netted.positions and len(positions) == 4
    assert jobs() > jobs_then  # the closing prices were queried after the hand-over
    assert {i.symbol: i.close_price for i in netted.instruments} == {
        "XAU": d("2.5000"), "XAG": d("1.0000")}


def test_a_symbols_close_is_its_latest_trades_greatest_id_however_its_legs_fall() -> None:
    from settlement.eod.model import closes, latest_times

    early, late = (dt.datetime(2024, 3, 15, h, 0) for h in (10, 16))
    legs = [Leg("A", "XAU", 1, 0, d("1"), d("0"), 1, 1, d("1"), d("1"), early),
            Leg("B", "XAU", 0, 1, d("0"), d("1"), 1, 0, d("1"), d("1"), late),
            Leg("C", "XAG", 1, 0, d("1"), d("0"), 1, 1, d("1"), d("1"), early)]
    assert latest_times(legs) == {"XAU": late, "XAG": early}
    # Two trades at XAU's latest time: the greater id (as text, Spark's order) closes it,
    # whatever order they come in.
    assert closes([("XAU", "T9", d("3")), ("XAG", "T1", d("7")),
                   ("XAU", "T10", d("2.5"))]) == {"XAU": d("3"), "XAG": d("7")}
    assert closes([("XAU", "Tb", d("3")), ("XAU", "Ta", d("2.5"))]) == {"XAU": d("3")}
    assert closes([]) == {}


def test_vwap_halves_round_up_and_sums_never_round() -> None:
    # Exactly half a unit of the 10th place rounds up; just below it does not.
    assert vwap(d("0.0001"), 2_000_000) == d("1E-10")
    assert vwap(d("0.0001"), 2_000_001) == d("0E-10")
    assert str(vwap(d("1010429.9029"), 27561)) == "36.6615835020"
    # A sum that does not fit the tables' numeric(28,4) is refused, never rounded (Decimal's
    # default 28 digits would round it silently).
    big = d("999999999999999999999999.9999")  # the largest numeric(28,4)
    at = dt.datetime(2024, 3, 15, 10, tzinfo=dt.UTC)
    legs = [Leg(f"A{i}", "XAU", 1, 0, big, d("0"), 1, 1, d("1"), d("1"), at)
            for i in range(2)]
    legs += [Leg("B", "XAU", 0, 1, d("0"), big, 1, 0, d("1"), d("1"), at)] * 2
    with pytest.raises(OverflowError, match="numeric"):
        net_legs(legs, DAY)


# -- a random day against plain Python -------------------------------------------------------


def _random_day(seed: int, n: int) -> list[tuple[Any, ...]]:
    rng = random.Random(seed)
    accounts = [f"ACC{i:03d}" for i in range(15)]
    symbols = ["XAU", "YEN", "OIL", "BTC", "ZNC", "SOY"]
    rows = []
    for i in range(n):
        buyer, seller = rng.sample(accounts, 2)
        price = str(Decimal(rng.randint(1, 50_000_000)).scaleb(-4))
        rows.append(
            trade(
                f"T{i:05d}", rng.choice(symbols), price, rng.randint(1, 5_000), buyer, seller,
                partition=i % 3, offset=i // 3, seq=i // 3 + 1,
            )
        )  # fmt: skip
    # Replays of earlier trades at later offsets, and a trade of another day.
    rows += [r[:4] + (r[4] + n,) + r[5:] for r in rng.sample(rows, 25)]
    rows.append(trade("OLD", "XAU", "1.0000", 1, accounts[0], accounts[1], day=OTHER_DAY))
    return rows


def _expected(rows: list[tuple[Any, ...]]) -> tuple[list, list, list, Netting]:
    unique = {r[0]: r for r in rows if r[1] == DAY}
    pos: dict[tuple[str, str], list] = defaultdict(lambda: [0, 0, Decimal(0), Decimal(0), 0])
    summary: dict[str, list] = {}
    last: dict[str, tuple[Any, str, Decimal]] = {}  # symbol -> its last trade, its price
    for trade_id, _, _, _, _, symbol, price, qty, buyer, seller, at in unique.values():
        if symbol not in last or (at, trade_id) > last[symbol][:2]:
            last[symbol] = (at, trade_id, price)
        amount = price * qty
        b, s = pos[(buyer, symbol)], pos[(seller, symbol)]
        b[0] += qty
        b[2] += amount
        b[4] += 1
        s[1] += qty
        s[3] += amount
        s[4] += 1
        st = summary.setdefault(symbol, [0, 0, Decimal(0), price, price])
        st[0] += 1
        st[1] += qty
        st[2] += amount
        st[3], st[4] = min(st[3], price), max(st[4], price)
    positions = [
        (DAY, acct, sym, bq, sq, bq - sq, ba, sa, sa - ba, n)
        for (acct, sym), (bq, sq, ba, sa, n) in pos.items()
    ]
    by_account: dict[str, list] = defaultdict(lambda: [Decimal(0), Decimal(0), 0])
    for _, acct, _, _, _, _, ba, sa, _, n in positions:
        by_account[acct][0] += ba
        by_account[acct][1] += sa
        by_account[acct][2] += n
    obligations = [(DAY, a, ba, sa, sa - ba, n) for a, (ba, sa, n) in by_account.items()]
    with localcontext() as ctx:
        ctx.prec = 60
        instruments = [
            (DAY, sym, n, vol, notional,
             (notional / vol).quantize(Decimal("1e-10"), ROUND_HALF_UP), low, high,
             last[sym][2])
            for sym, (n, vol, notional, low, high) in summary.items()
        ]  # fmt: skip
        gross = sum((r[6] for r in positions), Decimal(0))
        net = sum((abs(r[4]) for r in obligations), Decimal(0))
        efficiency = (1 - net / (2 * gross)).quantize(Decimal("1e-10"), ROUND_HALF_UP)
    return positions, obligations, instruments, Netting(gross, net, efficiency)


def test_random_day_matches_plain_python(spark: SparkSession) -> None:
    rows = _random_day(seed=20240315, n=500)
    positions, obligations, instruments, netting = _expected(rows)

    trades = T.dedupe_trades(frame(spark, rows, S.TRADE_SCHEMA)).cache()
    try:
        assert trades.count() == 501  # 500 + the other day's trade; replays removed
        pos, cash, summary = _frames(spark, trades)
        same(pos, frame(spark, positions, S.POSITIONS_SCHEMA))
        same(cash, frame(spark, obligations, S.CASH_OBLIGATIONS_SCHEMA))
        same(summary, frame(spark, instruments, S.INSTRUMENT_SUMMARY_SCHEMA))
        assert _netting(cash) == netting
        assert 0 <= netting.efficiency < 1  # type: ignore[operator]
    finally:
        trades.unpersist()


# -- session -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("jar", "artifact"),
    [
        ("scala-library-2.13.15.jar", "scala-library"),
        ("spark-sql-kafka-0-10_2.13-4.2.0.jar", "spark-sql-kafka-0-10_2.13"),
        ("snappy-java-1.1.10.5.jar", "snappy-java"),
        ("guava-33.4.0-jre.jar", "guava"),
        ("netty-common-4.1.118.Final.jar", "netty-common"),
        ("no-version.jar", "no-version"),
    ],
)
def test_artifact_name(jar: str, artifact: str) -> None:
    assert artifact_name(jar) == artifact


def test_spark_jars_skip_what_spark_ships(tmp_path: Path) -> None:
    ours, bundled = tmp_path / "jars" / "spark", tmp_path / "bundled"
    ours.mkdir(parents=True)
    bundled.mkdir()
    for name in ("scala-library-2.13.15.jar", "postgresql-42.7.8.jar", "lz4-java-1.10.1.jar"):
        (ours / name).touch()
    for name in ("scala-library-2.13.18.jar", "lz4-java-1.11.0.jar", "spark-core_2.13-4.2.0.jar"):
        (bundled / name).touch()
    settings = load_settings(jars_dir=tmp_path / "jars")
    assert spark_jars(settings, bundled) == [str((ours / "postgresql-42.7.8.jar").resolve())]
    assert spark_jars(load_settings(jars_dir=tmp_path / "missing")) == []
    # The compiled Kafka classifier (make classifier) goes with them when it was built.
    own = tmp_path / "jars" / "classifier" / "settle-classifier.jar"
    own.parent.mkdir()
    own.touch()
    assert spark_jars(settings, bundled) == [str((ours / "postgresql-42.7.8.jar").resolve()),
                                             str(own.resolve())]


def test_session_has_the_connectors(spark: SparkSession) -> None:
    if not spark_jars(load_settings()):
        pytest.skip("connector jars not fetched yet (make jars)")
    assert spark.conf.get("spark.sql.session.timeZone") == "UTC"
    jars = spark.sparkContext.getConf().get("spark.jars") or ""
    assert "postgresql" in jars and "scala-library" not in jars
    # Resolving the source loads its classes; nothing is read until an action runs.
    kafka = spark.read.format("kafka").option("kafka.bootstrap.servers", "127.0.0.1:9")
    assert "offset" in kafka.option("subscribe", "trades").load().columns
    jvm = spark._jvm  # type: ignore[attr-defined]
    loader = jvm.Thread.currentThread().getContextClassLoader()
    assert jvm.java.lang.Class.forName("org.postgresql.Driver", True, loader)
    # make setup compiles the JVM classifier, and the close finds it in its session.
    from settlement.spark.jvmclassify import loaded

    assert loaded(jvm)


def test_jobs_of_two_threads_share_the_cores_fairly(spark: SparkSession) -> None:
    """A close validates while it nets: Spark schedules FAIR, in a FAIR default pool, so a
    small query of validation's takes the next free core instead of queueing behind a
    netting stage (FIFO, Spark's default, queued it)."""
    sc = spark.sparkContext._jsc.sc()  # type: ignore[union-attr]
    assert str(sc.getSchedulingMode()) == "FAIR"
    pool = sc.getPoolForName("default")
    assert pool.isDefined() and str(pool.get().schedulingMode()) == "FAIR"


def _cached_bytes(spark: SparkSession) -> int:
    return sum(int(i.memSize()) for i in spark.sparkContext._jsc.sc().getRDDStorageInfo())


def test_a_cache_that_fits_is_kept_uncompressed_and_a_large_one_compressed(
        spark: SparkSession) -> None:
    flag = "spark.sql.inMemoryColumnarStorage.compressed"
    setting = spark.conf.get(flag, None)
    # 200,000 equal 40-character strings: 8 MB as they are, a few bytes run-length encoded.
    df = spark.range(200_000).select(F.lit("x" * 40).alias("s"))

    def size(rows: int, row_bytes: int) -> int:
        before = _cached_bytes(spark)
        cached = persist_sized(spark, df, rows, row_bytes)
        assert cached.count() == 200_000
        grown = _cached_bytes(spark) - before
        cached.unpersist(blocking=True)
        return grown

    fits = size(200_000, 44)
    too_big = size(200_000, 10**6)  # 200 GB: more than any test machine's storage memory
    assert fits > 8_000_000 > 100_000 > too_big, (fits, too_big)
    assert spark.conf.get(flag, None) == setting  # set for that persist only


def test_a_local_frame_holds_the_rows_exactly_as_create_dataframe_would(
        spark: SparkSession) -> None:
    day = dt.date(2026, 11, 24)
    positions = [(day, "ACC1", "XAU", 5, 0, 5, Decimal("123.4567"), Decimal("0"),
                  Decimal("-123.4567"), 1),
                 (day, "ACC2", "XAU", 0, 5, -5, Decimal("0"), Decimal("123.4567"),
                  Decimal("123.4567"), 1)]
    got = local_frame(spark, positions, S.POSITIONS_SCHEMA)
    assert got.schema == S.POSITIONS_SCHEMA
    assert got.collect() == spark.createDataFrame(positions, S.POSITIONS_SCHEMA).collect()
    # A DDL schema, nulls and booleans; no rows at all.
    assert [tuple(r) for r in local_frame(spark, [(1, None, True)],
                                          "p int, n long, b boolean").collect()] == [
        (1, None, True)]
    assert local_frame(spark, [], "cancelled long").count() == 0
    # Timestamps (an amendment's executed_at) come back as they went in, naive ones as local
    # time and aware ones as the same instant, exactly as createDataFrame reads them.
    at = dt.datetime(2026, 11, 24, 14, 30, 0, 123456)
    assert local_frame(spark, [("T1", at)], "trade_id string, executed_at timestamp"
                       ).collect()[0]["executed_at"] == at
    stamps = [(at, at), (at.replace(tzinfo=dt.UTC), at),
              (at.replace(tzinfo=dt.timezone(dt.timedelta(hours=-5))), at), (None, None)]
    ddl = "executed_at timestamp, wall timestamp_ntz"
    assert local_frame(spark, stamps, ddl).collect() == \
        spark.createDataFrame(stamps, ddl).collect()
    # Money is never rounded on the way in: a fifth decimal does not fit decimal(18,4).
    with pytest.raises(pa.ArrowInvalid, match="(?i)decimal|precision|scale"):
        local_frame(spark, [(Decimal("1.23456"),)], "price decimal(18,4)").collect()


def test_rows_held_by_the_driver_are_what_their_local_frame_collects(
        spark: SparkSession) -> None:
    """A read's amendments go to the settlement as rows (``as_collected``), to validation as
    their frame: both must hold the same values, or an amendment's effect in the report
    would differ with its path (a timestamp's zone, a price's scale)."""
    day = dt.date(2026, 11, 24)
    at = dt.datetime(2026, 11, 24, 14, 30, 0, 123456)

    def amendment(i: int, price: object, executed: object) -> tuple[object, ...]:
        return (f"T{i}", day, 10 + i, i % 3, 100 + i, "correct" if i % 2 else "cancel", i,
                None if i % 2 else "bust", "XAU", price, 5 + i, "ACC1", "ACC2", executed)

    rows = [amendment(1, Decimal("12.34"), at), amendment(2, None, None),
            amendment(3, Decimal("0.0001"), at.replace(tzinfo=dt.UTC)),
            amendment(4, 7, at.replace(tzinfo=dt.timezone(dt.timedelta(hours=-5)))),
            amendment(5, Decimal("99999999999999.9999"), at.replace(microsecond=0))]
    held = as_collected(rows, S.AMENDMENT_SCHEMA)
    collected = local_frame(spark, rows, S.AMENDMENT_SCHEMA).collect()
    assert held == collected
    assert [r.asDict() for r in held] == [r.asDict() for r in collected]  # names too
    assert [str(r["price"]) for r in held] == [str(r["price"]) for r in collected]  # scales
    assert as_collected([], S.AMENDMENT_SCHEMA) == []
    # Money that a frame refuses is refused here too, never rounded.
    for bad in (Decimal("1.23456"), Decimal("1e20"), Decimal("NaN"), 1.5):
        with pytest.raises(ValueError, match=r"does not fit decimal\(18,4\)"):
            as_collected([amendment(1, bad, at)], S.AMENDMENT_SCHEMA)



def _amendment(trade_id: str, kind: str, version: int | None, price: str = "1") -> Any:
    from pyspark.sql import Row
    return Row(trade_id=trade_id, kind=kind, version=version, symbol="ABC",
               price=Decimal(price), quantity=5, buyer="B", seller="S",
               executed_at=dt.datetime(2024, 3, 15, 10, tzinfo=UTC))


def test_final_states_bust_or_take_the_highest_correction() -> None:
    """A trade busted after a correction stays busted; of several corrections, in any order,
    the highest version wins, and one without a version ranks lowest."""
    rows = [_amendment("t1", "correct", 2, "12"), _amendment("t1", "correct", 3, "13"),
            _amendment("t1", "correct", 1, "11"),
            _amendment("t2", "correct", 1, "21"), _amendment("t2", "cancel", None),
            _amendment("t3", "correct", None, "30"), _amendment("t3", "correct", 1, "31")]
    got = {r[0]: r for r in T.final_states(rows)}
    assert sorted(got) == ["t1", "t2", "t3"]
    assert got["t1"][1] is False and got["t1"][3] == Decimal("13")
    assert got["t2"][1] is True and got["t2"][2:] == (None,) * 6
    assert got["t3"][3] == Decimal("31")


def test_final_trades_drop_the_busted_and_correct_the_rest(spark: SparkSession) -> None:
    """The day in final states from the broadcast final states: a busted trade is gone, a
    corrected one carries its correction's fields, the others are untouched."""
    day = local_frame(spark, [trade("t1", "ABC", "10", 1, "B", "S"),
                              trade("t2", "ABC", "10", 2, "B", "S"),
                              trade("t3", "ABC", "10", 3, "B", "S")], S.TRADE_SCHEMA)
    amendments = local_frame(spark, [
        (r["trade_id"], DAY, 1, 0, 9, r["kind"], r["version"], "fix", r["symbol"], r["price"],
         r["quantity"], r["buyer"], r["seller"], r["executed_at"])
        for r in (_amendment("t1", "cancel", None), _amendment("t2", "correct", 2, "12"),
                  _amendment("t2", "correct", 1, "11"))], S.AMENDMENT_SCHEMA)
    states = T.final_states(amendments.collect())
    out = {r["trade_id"]: r for r in T.with_final_states(day, states).collect()}
    assert sorted(out) == ["t2", "t3"]
    assert out["t2"]["price"] == Decimal("12") and out["t2"]["quantity"] == 5
    assert out["t3"]["price"] == Decimal("10") and out["t3"]["quantity"] == 3


def test_the_settled_day_per_instrument_from_the_day_as_sent(spark: SparkSession) -> None:
    """The amended trades as sent, and the settled day's sums per final symbol, derived from
    the day's sums as sent: a busted trade counts nowhere, a correction moves a trade to its
    new symbol, price and quantity, and an instrument whose every trade was busted has no
    row."""
    from settlement.spark.settle import AmendedTrades

    day = local_frame(spark, [trade("t1", "AAA", "10", 1, "B", "S", seq=1),
                              trade("t2", "AAA", "10", 2, "B", "S", seq=2),
                              trade("t3", "AAA", "7", 3, "B", "S", seq=BUCKET_SEQS + 1),
                              trade("t4", "CCC", "5", 4, "B", "S", seq=3)], S.TRADE_SCHEMA)
    corrected = _amendment("t2", "correct", 1, "12")
    states = T.final_states([_amendment("t1", "cancel", None), corrected,
                             _amendment("t4", "cancel", None)])
    # One aggregate by bucket and symbol: the buckets' figures as ``figures`` takes them
    # (bucket 0 holds two symbols), and the day as sent per instrument.
    by_bucket, sent = figures_and_symbols(day)
    assert by_bucket == [tuple(r) for r in figures(day).orderBy("bucket").collect()]
    assert [r[:3] for r in by_bucket] == [(0, 0, 3), (0, 1, 1)]
    assert sent == [("AAA", 3, 6, Decimal("51.0000")), ("CCC", 1, 4, Decimal("20.0000"))]
    # The sums as sent either given (the read's pass took them) or summed here: the same.
    for given in (None, sent):
        taken = AmendedTrades(day, states, given)
        assert [(r[0], r[4], r[5]) for r in taken.rows()] == [
            ("t1", Decimal("10.0000"), 1), ("t2", Decimal("10.0000"), 2),
            ("t4", Decimal("5.0000"), 4)]
        assert taken.settled_symbols() == [
            ("AAA", 3, Decimal("21.0000")), ("ABC", 5, Decimal("60.0000"))]
        plain = AmendedTrades(day, [], given)
        assert plain.rows() == []
        assert plain.settled_symbols() == [
            ("AAA", 6, Decimal("51.0000")), ("CCC", 4, Decimal("20.0000"))]


def test_the_settled_sums_stay_exact_beyond_28_digits() -> None:
    """The driver's arithmetic on the day's notional (decimal(38,4) in Spark) is exact: a
    notional of 34 digits less a trade of the largest price and nearly the largest quantity
    the contract allows, plus its correction, keeps every digit (Python's default context
    would round it to 28)."""
    from settlement.spark.settle import settled_symbols

    big, price, qty = Decimal("123456789012345678901234567890.1234"), \
        Decimal("99999999999999.9999"), C.MAX_QUANTITY - 1
    amended = [("t1", 0, 5, DAY, price, qty, "AAA")]
    state = {c: None for c in T.FINAL_STATES_COLUMNS} | {
        "trade_id": "t1", "_cancelled": False, "_new_price": Decimal("1.0001"),
        "_new_quantity": 3}
    got = settled_symbols([("AAA", 7, 10 * qty, big)], amended,
                          [tuple(state[c] for c in T.FINAL_STATES_COLUMNS)])
    with localcontext() as ctx:
        ctx.prec = 60
        want = big - price * qty + Decimal("3.0003")
    assert got == [("AAA", 9 * qty + 3, want)]
    assert str(want) == "123456689012345778901234667893.1236"  # checked by hand: all 34 digits


def test_the_expected_seq_sums_are_sparks_own_hash_sums(spark: SparkSession) -> None:
    """Validation's figures of a complete partition (the seq hash sums of 1..n) are taken in
    the driver with numpy; a complete partition is proven by Spark's ``seq_hash`` sums, so
    both must agree to the bit, or every partition would look suspect (searched seq by seq)."""
    edge = [0, 1, -1, 2**31, 2**32 - 1, 2**63 - 1, -(2**63), 10**15, 123456789]
    rng = random.Random(7)
    picks = edge + [rng.randrange(-(2**63), 2**63) for _ in range(500)]
    ours = spark_xxhash64(np.array(picks, dtype=np.int64)).tolist()
    theirs = [r[1] for r in spark.createDataFrame([(v,) for v in picks], "v long")
              .select("v", F.xxhash64("v")).collect()]
    assert ours == theirs
    lengths = {1, 7, 65_536, 65_537, 300_001}
    hi, lo = seq_hash(F.col("id"))
    sums = []
    for k, n in enumerate(sorted(lengths)):
        inside = F.col("id") <= F.lit(n)
        sums += [F.sum(F.when(inside, hi)).alias(f"h{k}"),
                 F.sum(F.when(inside, lo)).alias(f"l{k}")]
    row = spark.range(1, max(lengths) + 1).agg(*sums).collect()[0]
    assert expected_seq_sums(lengths | {0}) == {
        n: (row[f"h{k}"], row[f"l{k}"]) for k, n in enumerate(sorted(lengths))}


def test_seq_figures_are_the_figures_spark_takes(spark: SparkSession) -> None:
    """The amendments' figures (their seq coverage) summed in the driver equal ``figures``'
    of the same rows in Spark, bucket by bucket."""
    seqs = [(0, 1), (0, 5), (0, BUCKET_SEQS + 3), (2, 7), (2, 7), (0, BUCKET_SEQS - 1)]
    frame = spark.createDataFrame(seqs, "kafka_partition int, seq long")
    assert seq_figures(seqs) == sorted(tuple(r) for r in figures(frame, rows=False).collect())
    assert seq_figures([]) == []


def test_a_partition_is_complete_by_its_figures_whatever_a_marker_claims(
        spark: SparkSession, monkeypatch: pytest.MonkeyPatch) -> None:
    """A partition holding each seq 1..last_seq once is complete by its figures; one whose
    count differs from its marker is suspect, and its expected sums are not hashed at all,
    so a marker claiming 10^15 trades costs nothing (the sums of 1..n are taken in the
    driver: hashing up to the contract's largest seq would never end)."""
    rows = [trade(f"T{p}-{q}", "S", "1", 1, "A", "B", partition=p, seq=q)
            for p, n in ((0, 3), (1, 3), (2, 2)) for q in range(1, n + 1)]
    rows.append(trade("T2-x", "S", "1", 1, "A", "B", partition=2, seq=2))  # seq 2 twice
    day = frame(spark, rows, S.TRADE_SCHEMA)
    markers = {0: 3, 1: C.MAX_SEQ, 2: 3}
    hashed: list[set[int]] = []  # fails, not hangs, should the marker's length be hashed

    def recorded(lengths: set[int]) -> dict[int, tuple[int, int]]:
        hashed.append(set(lengths))
        assert max(lengths, default=0) <= 3, lengths
        return expected_seq_sums(lengths)

    monkeypatch.setattr(figures_module, "expected_seq_sums", recorded)
    got = {r["kafka_partition"]: r for r in partition_figures(
        spark, collect_figures(spark, day, row_sums=False), markers).collect()}
    assert not got[0]["suspect"] and (got[0]["expected_hi"], got[0]["expected_lo"]) == \
        expected_seq_sums({3})[3]
    assert got[1]["suspect"] and got[1]["expected_hi"] is None  # 3 trades, 10^15 claimed
    # Three trades and a marker of 3, but seq 2 twice and no seq 3: not complete.
    assert got[2]["suspect"] and got[2]["trades"] == 3
    assert hashed == [{3}]
