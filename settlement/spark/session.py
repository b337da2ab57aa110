"""The SparkSession for settlement jobs, and the connector jars for ``spark-submit --jars``.

The jars come from the foundation's Maven step (``.cache/jars/spark``): the Kafka source,
the PostgreSQL JDBC driver and their runtime dependencies. Some of those dependencies
(scala-library, slf4j-api, lz4-java, snappy-java, ...) ship with pyspark itself in another
version; putting both versions on the classpath breaks Spark in odd ways, so a jar whose
artifact pyspark already has is left out and pyspark's copy wins.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from decimal import Context, Decimal, Inexact, InvalidOperation
from pathlib import Path

import pyarrow as pa
from pyspark import SparkConf, SparkContext
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    DataType,
    DecimalType,
    Row,
    StructType,
    TimestampType,
    _parse_datatype_string,
)

from settlement.config import Settings
from settlement.spark.jvm import (
    DriverJvm,
    building_allowed,
    driver_jvm,
    finish_archive,
    install_at_exit,
)
from settlement.spark.jvmclassify import classifier_jar
from settlement.spark.package import python_files
from settlement.threads import in_thread

# A version segment: digits and dots (1.2.0, 2.13.15, 4.1.118.Final, 33.4.0-jre's 33.4.0).
# "0-10_2.13" in spark-sql-kafka-0-10_2.13 is part of the artifact name, not a version.
_VERSION = re.compile(r"^\d+(\.\d+)+")

DEFAULTS: dict[str, str] = {
    # Trade timestamps are UTC; a machine's local zone must never shift them.
    "spark.sql.session.timeZone": "UTC",
    # Overflow in decimal arithmetic must fail the run, not turn into NULL (Spark 4's default,
    # pinned so that a cluster-wide spark-defaults.conf cannot turn it off silently).
    "spark.sql.ansi.enabled": "true",
    # One business date is small for Spark; the default 200 shuffle tasks cost more than they
    # save on a 2-core machine.
    "spark.sql.shuffle.partitions": "8",
    # The UI binds a port and starts threads that a batch job on a shared host does not need.
    "spark.ui.enabled": "false",
    # The console progress bar writes carriage-return frames to stderr: noise in an
    # operator's terminal and in Airflow's task log, where the run's own progress is printed.
    "spark.ui.showConsoleProgress": "false",
    # A close validates while it nets, from two threads: with Spark's FIFO default each of
    # validation's small queries waited for the netting's stage to end; shared fairly (in
    # FAIR mode Spark's default pool is FAIR too), they take the next free core.
    "spark.scheduler.mode": "FAIR",
}


def artifact_name(jar_file: str) -> str:
    """``scala-library-2.13.15.jar`` -> ``scala-library``; the name up to the version."""
    parts = Path(jar_file).name.removesuffix(".jar").split("-")
    for i in range(1, len(parts)):
        if _VERSION.match(parts[i]):
            return "-".join(parts[:i])
    return "-".join(parts)


def bundled_jars_dir() -> Path:
    """The Spark distribution's jars: $SPARK_HOME/jars if set, else pyspark's own."""
    home = os.environ.get("SPARK_HOME")
    if home and (Path(home) / "jars").is_dir():
        return Path(home) / "jars"
    import pyspark

    return Path(pyspark.__file__).resolve().parent / "jars"


def spark_jars(settings: Settings, bundled: Path | None = None) -> list[str]:
    """Absolute paths of the connector jars to add (for ``spark.jars`` or ``--jars``),
    without those whose artifact the Spark distribution already ships."""
    folder = settings.jars_dir / "spark"
    # The project's own classifier (settlement.spark.jvmclassify), when make setup built it.
    own = [str(j.resolve()) for j in (classifier_jar(settings.jars_dir),) if j.is_file()]
    if not folder.is_dir():
        return own
    bundled = bundled if bundled is not None else bundled_jars_dir()
    have = {artifact_name(p.name) for p in bundled.glob("*.jar")}
    return [
        str(p.resolve()) for p in sorted(folder.glob("*.jar")) if artifact_name(p.name) not in have
    ] + own


def is_cluster(master: str) -> bool:
    """True for a master whose executors are other processes (possibly other machines)."""
    return not master.startswith("local")


def cluster_conf(settings: Settings) -> dict[str, str]:
    """Settings a cluster run needs beyond DEFAULTS: executor size, the driver's address,
    and the Python files. Jars go separately (``spark.jars`` / ``--jars``); both are served
    by the driver and fetched by each executor into its own work directory, so nothing
    relies on a folder the workers share with the driver."""
    conf = {
        "spark.executor.memory": settings.spark_executor_memory,
        "spark.executor.cores": str(settings.spark_executor_cores),
        "spark.submit.pyFiles": str(python_files(settings)),
        # Executors run the workers' own Python; by default the same path as the driver's
        # (the locked environment installed at the same place on every worker).
        "spark.pyspark.python": _worker_python(),
    }
    if settings.spark_cores_max:
        conf["spark.cores.max"] = str(settings.spark_cores_max)
    local_ip = os.environ.get("SPARK_LOCAL_IP")
    if local_ip:
        # Executors connect back to the driver (client mode): it must advertise an address
        # they can reach, not whatever the host name resolves to.
        conf["spark.driver.host"] = local_ip
        conf["spark.driver.bindAddress"] = local_ip
    return conf


def _worker_python() -> str:
    return os.environ.get("PYSPARK_PYTHON", sys.executable)


def _launched_by_spark_submit() -> bool:
    # spark-submit starts the JVM first and hands its gateway to Python through this variable;
    # then --master, --jars, --driver-memory and --conf are already decided.
    return "PYSPARK_GATEWAY_PORT" in os.environ


def _option(value: str) -> str:
    # spark-submit splits spark.driver.extraJavaOptions on blanks, honouring double quotes.
    return f'"{value}"' if " " in value else value


# A small day's Spark: every query runs once over a few thousand rows, so compiling it
# (whole-stage code generation, then Janino, then the JIT) costs more than it saves; Spark's
# interpreted expressions compute the same values (its own tests hold the two to each other).
# 1.2-1.5 s of a 2,000-trade close (docs/benchmarks.md). Its aggregates shuffle into one
# task, not eight: each further task is scheduling, not work (netting 1.75 -> 1.5 s).
SMALL_DAY: dict[str, str] = {
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.codegen.factoryMode": "NO_CODEGEN",
    "spark.sql.shuffle.partitions": "1",
}
# Spark's own defaults, set for any other day: a session this process reuses (a test's, a
# benchmark's) may have run a small day before.
LARGE_DAY: dict[str, str] = {
    "spark.sql.codegen.wholeStage": "true",
    "spark.sql.codegen.factoryMode": "FALLBACK",
    "spark.sql.shuffle.partitions": "8",
}


def is_small_day(settings: Settings, day_rows: int | None) -> bool:
    """A close's day of at most ``spark_small_day_rows`` rows (None: not a close)."""
    limit = settings.spark_small_day_rows
    return day_rows is not None and limit > 0 and day_rows <= limit


def quick_jit(settings: Settings, day_rows: int | None) -> bool:
    """A close's driver runs the JIT's quick compiler alone: a small day, or a day of at
    most ``spark_quick_jit_rows`` rows (None: not a close)."""
    return is_small_day(settings, day_rows) or (
        day_rows is not None and day_rows <= settings.spark_quick_jit_rows)


def plan_driver_jvm(settings: Settings, jars: Sequence[str], quick_jit: bool,
                    may_build: bool = True) -> DriverJvm:
    """The driver JVM's options (settlement.spark.jvm) for a session this process starts."""
    folder = settings.jars_dir.parent / "jvm" if settings.spark_class_archive else None
    bundled = bundled_jars_dir()
    classpath = [*sorted(bundled.glob("*.jar")), *(Path(j) for j in jars)]
    # spark-submit's configuration folder, first on the driver's class path.
    conf_dir = Path(os.environ.get("SPARK_CONF_DIR") or bundled.parent / "conf")
    return driver_jvm(folder, classpath, quick_jit, conf_dir, may_build)


def with_driver_options(jvm: DriverJvm, given: str | None) -> str:
    """spark.driver.extraJavaOptions: ``jvm``'s options, then those already ``given`` (a
    deployment's own come last and so win)."""
    return " ".join([*(_option(o) for o in jvm.options), given or ""]).strip()


def build_session(
    settings: Settings,
    app_name: str = "settlement",
    conf: Mapping[str, str] | None = None,
    day_rows: int | None = None,
    jvm_info: dict[str, object] | None = None,
) -> SparkSession:
    """A SparkSession on ``settings.spark_master`` with the connector jars.

    ``conf`` overrides DEFAULTS (e.g. ``{"spark.ui.enabled": "true"}``). Under spark-submit
    the submitter's master and any setting it passed win; only what it left unset is added.
    If a session already runs in this process it is reused (its static settings, such as the
    master and jars, cannot change; SQL settings are applied to it).

    A driver JVM this process starts maps the class archive (or builds it) and, for a day of
    ``day_rows`` up to ``spark_quick_jit_rows`` (``quick_jit``), runs the quick compiler alone
    (settlement.spark.jvm); a day up to ``spark_small_day_rows`` is also interpreted
    (SMALL_DAY). ``jvm_info``
    gets what was decided.
    """
    small_day = is_small_day(settings, day_rows)
    wanted = dict(DEFAULTS)
    wanted.update(SMALL_DAY if small_day else LARGE_DAY)
    if settings.spark_master.startswith("local"):
        # Executors live in this process: no reason to bind anything but loopback, and a
        # host name that does not resolve would otherwise stall start-up.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    wanted["spark.driver.memory"] = settings.spark_driver_memory
    # The Kafka classifier runs the sites' parser in Python workers: they need this
    # environment's packages (orjson, pyarrow), not whatever `python3` is first on PATH.
    # PySpark reads the variable when it makes the context (spark-submit sets it from
    # spark.pyspark.python); the setting tells a cluster's executors.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    wanted["spark.pyspark.python"] = _worker_python()
    if is_cluster(settings.spark_master):
        wanted.update(cluster_conf(settings))
    jars = spark_jars(settings)
    if jars:
        wanted["spark.jars"] = ",".join(jars)
    # A setting like the others: spark-submit's --name (the DAG names its task's job) wins.
    wanted["spark.app.name"] = app_name
    wanted.update(conf or {})

    builder = SparkSession.builder
    if _launched_by_spark_submit():
        # Connect to spark-submit's JVM first: before that SparkConf() is a plain Python dict
        # that knows none of the submitter's settings (so --name, --jars, --conf were
        # silently overridden).
        SparkContext._ensure_initialized()
        existing = SparkConf()  # now reads spark-submit's settings from the JVM
        wanted = {k: v for k, v in wanted.items() if not existing.contains(k)}
    else:
        builder = builder.master(settings.spark_master)
    jvm = None
    if not _launched_by_spark_submit() and SparkContext._gateway is None:
        # This process starts the JVM (no earlier session left one running).
        jvm = plan_driver_jvm(settings, jars, quick_jit(settings, day_rows),
                              may_build=building_allowed())
        wanted["spark.driver.extraJavaOptions"] = with_driver_options(
            jvm, wanted.get("spark.driver.extraJavaOptions"))
    for key, value in wanted.items():
        builder = builder.config(key, value)
    try:
        spark = builder.getOrCreate()
    except BaseException:
        if jvm is not None:  # no JVM to write the archive: its lock is free again
            finish_archive(jvm, exited_cleanly=False)
        raise
    if jvm is not None:
        install_at_exit(jvm, getattr(spark.sparkContext._gateway, "proc", None), spark.stop)
    if jvm_info is not None:
        jvm_info.update({"small_day": small_day, **(jvm.as_dict() if jvm else {})})
    return spark


def starts_a_jvm() -> bool:
    """A session built now starts this process's JVM (none runs yet, and spark-submit did
    not start one for it)."""
    return not _launched_by_spark_submit() and SparkContext._gateway is None


def size_for_day(spark: SparkSession, settings: Settings, day_rows: int) -> bool:
    """The SQL settings of a day of ``day_rows`` rows (SMALL_DAY or LARGE_DAY), on a session
    that may have been started before the day's size was known exactly; whether it is a
    small day."""
    small = is_small_day(settings, day_rows)
    for key, value in (SMALL_DAY if small else LARGE_DAY).items():
        spark.conf.set(key, value)
    return small


def start_session(settings: Settings, app_name: str = "settlement",
                  conf: Mapping[str, str] | None = None,
                  timings: dict[str, float] | None = None, day_rows: int | None = None,
                  jvm_info: dict[str, object] | None = None) -> Future[SparkSession]:
    """``build_session`` in a thread of its own, started now: the JVM is a process of its
    own, so it starts on another core while the caller goes on (a cold close imports Great
    Expectations and makes its GX project ready meanwhile). ``.result()`` is the session, or
    raises what ``build_session`` raised; ``timings`` gets ``jvm_start_seconds``. PySpark
    installs its Ctrl-C handler only from the main thread; a close started this way is
    interrupted as any Python program is.

    Tried and left (docs/benchmarks.md): running a first job in this thread (the SQL
    engine's classes loaded ahead of the read) and starting the Python workers ahead of the
    Kafka read. Each took the read 2-5 s shorter but cost the start more than that: on two
    cores nothing else was left to overlap them with."""
    out = {} if timings is None else timings

    def started() -> SparkSession:
        t0 = time.perf_counter()
        spark = build_session(settings, app_name, conf, day_rows, jvm_info)
        out["jvm_start_seconds"] = round(time.perf_counter() - t0, 3)
        return spark

    return in_thread("spark-start", started)


_COMPRESSED = "spark.sql.inMemoryColumnarStorage.compressed"
# Of the storage memory the block managers report free, the share an uncompressed cache may
# take: the rest stays for the netting's and validation's shuffles and broadcasts, and in a
# cluster the driver's own block manager (which holds no cached partition) is counted too.
UNCOMPRESSED_SHARE = 0.4


def free_storage_memory(spark: SparkSession) -> int:
    """Bytes of on-heap storage memory the block managers report free (local mode: the
    driver's)."""
    infos = spark.sparkContext._jsc.sc().statusTracker().getExecutorInfos()  # type: ignore[union-attr]
    return sum(int(i.totalOnHeapStorageMemory()) - int(i.usedOnHeapStorageMemory())
               for i in infos)


def persist_sized(spark: SparkSession, df: DataFrame, rows: int, row_bytes: int) -> DataFrame:
    """``df.persist()``, uncompressed when ``rows`` of ``row_bytes`` fit in
    UNCOMPRESSED_SHARE of the free storage memory, compressed otherwise.

    Building the compressed cache tries each of Spark's encodings on every value: on the 2M
    day that was 4-5 s of a 21 s Kafka read (16.5 s uncompressed, docs/benchmarks.md). An
    uncompressed cache is about twice the size, and a cache that does not fit spills to disk,
    which costs more than the compression saved (10M on a 2g driver), hence the bound. Spark
    takes the setting when the cache is defined, so it is set for this persist only."""
    compress = rows * row_bytes > UNCOMPRESSED_SHARE * free_storage_memory(spark)
    before = spark.conf.get(_COMPRESSED, None)
    spark.conf.set(_COMPRESSED, str(compress).lower())
    try:
        return df.persist()
    finally:
        if before is None:
            spark.conf.unset(_COMPRESSED)
        else:
            spark.conf.set(_COMPRESSED, before)


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def _utc(value: object) -> object:
    """A timestamp as ``createDataFrame`` reads one: a naive datetime is the machine's local
    time (as ``collect()`` hands it back), an aware one is exact."""
    return value.astimezone(dt.UTC) if isinstance(value, dt.datetime) else value


def local_frame(spark: SparkSession, rows: Iterable[Sequence[object]],
                schema: StructType | str) -> DataFrame:
    """A frame of rows the driver holds, handed to Spark once as its own data.

    ``createDataFrame`` of a list is an RDD of pickled rows that every query unpickles again
    in a Python worker: 0.2-0.4 s a query on a 2-core host, and validation queries its small
    frames (positions, figures, markers) a dozen times. Built as an Arrow table instead, the
    rows are converted once, exactly (Decimals into decimal columns, refused if they do not
    fit), and queries read them in the JVM: 12,000 positions in 0.1 s against 0.4 s.

    Timestamps go in as UTC instants, read the way ``createDataFrame`` reads them (a naive
    datetime is local time). They once took ``createDataFrame`` and a local checkpoint
    instead: a Spark job each, about 0.5 s apiece in a close's fresh JVM."""
    struct = schema if isinstance(schema, StructType) else _parse_datatype_string(schema)
    arrow = to_arrow_schema(struct, timezone="UTC")
    held = list(rows)
    columns = list(zip(*held, strict=True)) if held else [()] * len(arrow)
    arrays = []
    for values, spark_field, field in zip(columns, struct.fields, arrow, strict=True):
        if isinstance(spark_field.dataType, TimestampType):
            values = tuple(_utc(v) for v in values)
        arrays.append(pa.array(values, type=field.type))
    return spark.createDataFrame(pa.Table.from_arrays(arrays, schema=arrow), struct)


def as_collected(rows: Iterable[Sequence[object]], schema: StructType | str) -> list[Row]:
    """Rows the driver holds, as ``local_frame(spark, rows, schema).collect()`` hands them
    back, without the frame or its job: what a reader holds already (a day's amendments)
    goes straight to the settlement, and the frame is built only where a query needs it.
    The values as a collect gives them: a timestamp as the machine's naive local time (an
    aware one's instant, a naive one as is), a decimal at its column's scale (refused when
    it does not fit, as ``local_frame`` refuses it). On a realistic 2M-trade day the frame
    of 11,577 amendments and its collect were 1.3 s before the netting could start (timed in
    a slow hour; in alternated closes of one day in a fast hour the read and the amendments
    step took 0.5-0.9 s less)."""
    struct = schema if isinstance(schema, StructType) else _parse_datatype_string(schema)
    make = Row(*struct.names)
    convert = [_as_collected(f.dataType) for f in struct.fields]
    return [make(*(v if v is None else c(v) for c, v in zip(convert, r, strict=True)))
            for r in rows]


def _as_collected(kind: DataType) -> Callable[[object], object]:
    if isinstance(kind, TimestampType):
        # The instant ``local_frame`` hands Arrow (``_utc``), as microseconds since the
        # epoch, then pyspark's own conversion of a collected one.
        return lambda v: kind.fromInternal((_utc(v) - _EPOCH) // dt.timedelta(microseconds=1))
    if isinstance(kind, DecimalType):
        # Quantized to the scale within the precision: a digit lost or one too many traps.
        exact = Context(prec=kind.precision, traps=[Inexact, InvalidOperation])
        unit = Decimal(1).scaleb(-kind.scale)

        def fit(v: object) -> object:
            try:  # money comes as a Decimal or an int, never a float
                if isinstance(v, Decimal | int) and not isinstance(v, bool):
                    q = Decimal(v).quantize(unit, context=exact)
                    if q.is_finite():
                        return q
            except ArithmeticError:
                pass
            raise ValueError(f"{v!r} does not fit decimal({kind.precision},{kind.scale}) "
                             "exactly")
        return fit
    return lambda v: v
