"""Archives (issue 60, item 2): a published day's ledger rows, once older than the retention,
written as Parquet by Spark and removed from the ledgers; brought back on request.

``settle archive --before D`` takes each published trade date before D (and older than
``retention_days``) not archived yet. Per ledger and table (``TABLES``) it:

1. writes the day's rows as Parquet under ``<archive_dir>/<date>/<ledger>/<table>``;
2. reads the files back and checks them against the rows: the count and an order-free
   checksum of every value (the sum of Spark's xxhash64 of each row), taken by the same
   Spark code on both sides;
3. records the manifest (``day_archives``: rows, checksum, the files' SHA-256, the run that
   published the day) in the settlement database, all of the day's tables in one
   transaction;

and only then deletes the day's rows from each ledger (its partition of ``trades`` is detached
and dropped), each ledger in one transaction that refuses to delete a different number of
rows than the manifest holds. A run that stops in
between is finished by the next (a day whose manifest is committed only has its deletion
left). The settlement database keeps everything published about the day (positions,
versions, instructions, report facts), so its audit report still opens.

``settle archive restore --date D`` reads the day's files back into the ledgers it came from
and checks count and checksum again against the manifest; settled again, the day gives its
published positions.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

from settlement.config import LEDGERS, Settings
from settlement.db import connect, q

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

# The ledger tables a day's rows live in, each selected by its trade_date. Close markers stay
# (a few per day, and what says the day was complete); consumer offsets and heartbeats are not
# a day's.
TABLES = ("trades", "trade_amendments", "dead_letters", "late_amendments")


class ArchiveError(RuntimeError):
    """An archive cannot be written, checked or restored; the message says why and what to
    do."""


@dataclass(frozen=True)
class Part:
    """One ledger's table of one day, as archived."""

    ledger: str
    table: str
    rows: int
    checksum: Decimal
    files_sha256: str
    path: str


def archive_root(settings: Settings) -> Path:
    return Path(settings.archive_dir or Path(settings.reports_dir).parent / "archive")


def archive(settings: Settings, before: dt.date, today: dt.date,
            progress: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    """Archive every published day before ``before`` and at least ``retention_days`` old on
    ``today``; finish the deletion of days archived by a run that stopped."""
    admin = settings.for_component("admin")
    oldest_kept = today - dt.timedelta(days=settings.retention_days)
    cutoff = min(before, oldest_kept + dt.timedelta(days=1))
    with connect(admin.settlement_dsn) as conn:
        days = [(d, int(run)) for d, run in conn.execute(
            q("archive", "to_archive"), {"before": cutoff})]
        unfinished = [d for (d,) in conn.execute(q("archive", "archived_days"),
                                                 {"before": cutoff})]
    out: dict[str, Any] = {"before": before.isoformat(), "retention_days":
                           settings.retention_days, "cutoff": cutoff.isoformat(),
                           "archived": [], "rows_removed": 0}
    removed = 0
    for day in unfinished:  # manifests committed by an earlier run: the deletion may be left
        removed += _remove(admin, day)
    if days:
        spark = _session(settings, "archive")
        for n, (day, run_id) in enumerate(days, start=1):
            progress(f"archive {day} ({n}/{len(days)}): writing Parquet")
            parts = _write_day(spark, settings, day)
            _record(admin, day, run_id, parts)
            removed += _remove(admin, day)
            out["archived"].append({"trade_date": day.isoformat(), "published_run": run_id,
                                    "parts": [p.__dict__ | {"checksum": str(p.checksum)}
                                              for p in parts]})
    out["rows_removed"] = removed
    return out


def restore(settings: Settings, day: dt.date) -> dict[str, Any]:
    """Bring an archived day's rows back into the ledgers they came from, checked against
    the manifest; the day can then be settled again (``settle eod --date D --source db``)."""
    admin = settings.for_component("admin")
    with connect(admin.settlement_dsn) as conn:
        parts = [Part(led, table, int(rows), Decimal(chk), sha, path) for
                 led, table, rows, chk, sha, path in
                 conn.execute(q("archive", "manifest"), {"trade_date": day})]
    if not parts:
        raise ArchiveError(f"{day} has no archive: `settle archive --before D` writes one "
                           "(settle status lists the published days)")
    spark = _session(settings, "archive-restore")
    frames = {}
    for part in parts:  # every file checked before anything is restored
        if _sha256(Path(part.path)) != part.files_sha256:
            raise ArchiveError(f"{part.path}: the files' SHA-256 differs from the manifest's: "
                               "the archive was changed since it was written; nothing "
                               "restored")
        frame = spark.read.parquet(part.path)
        figures = _figures(frame)
        if figures != (part.rows, part.checksum):
            raise ArchiveError(f"{part.path}: {figures[0]} rows (checksum {figures[1]}) "
                               f"against the manifest's {part.rows} ({part.checksum}); "
                               "nothing restored")
        frames[part] = frame
    restored = []
    for part, frame in frames.items():
        dsn = admin.ledger_dsn(part.ledger)
        with connect(dsn) as conn, conn.transaction():
            # A restore that stopped half-way left some rows: they go, the whole day comes in.
            conn.execute(q("archive", f"delete_{part.table}"), {"trade_date": day})
            if part.table == "trades":
                conn.execute(q("archive", "trade_partition"), {"trade_date": day})
        if part.rows:
            _jdbc_append(frame, dsn, part.table)
        back = _figures(_read(spark, dsn, part.table, day))
        if back != (part.rows, part.checksum):
            raise ArchiveError(f"{day} {part.ledger}.{part.table}: restored {back[0]} rows "
                               f"(checksum {back[1]}), the manifest holds {part.rows} "
                               f"({part.checksum})")
        restored.append({"ledger": part.ledger, "table": part.table, "rows": part.rows})
    with connect(admin.settlement_dsn) as conn, conn.transaction():
        conn.execute(q("archive", "restored"), {"trade_date": day})
    return {"trade_date": day.isoformat(), "restored": restored,
            "next": f"settle eod --date {day} --source db settles it again from these rows"}


def _write_day(spark: SparkSession, settings: Settings, day: dt.date) -> list[Part]:
    admin = settings.for_component("admin")
    root = archive_root(settings) / day.isoformat()
    parts = []
    for ledger in LEDGERS:
        dsn = admin.ledger_dsn(ledger)
        for table in TABLES:
            frame = _read(spark, dsn, table, day)
            path = root / ledger / table
            frame.write.mode("overwrite").parquet(str(path))
            wrote = _figures(spark.read.parquet(str(path)))
            source = _figures(frame)
            if wrote != source:
                raise ArchiveError(f"{day} {ledger}.{table}: the Parquet files hold {wrote[0]} "
                                   f"rows (checksum {wrote[1]}), the ledger {source[0]} "
                                   f"({source[1]}): nothing removed; run it again")
            parts.append(Part(ledger, table, wrote[0], wrote[1], _sha256(path), str(path)))
    return parts


def _record(admin: Settings, day: dt.date, run_id: int, parts: list[Part]) -> None:
    with connect(admin.settlement_dsn) as conn, conn.transaction():
        for p in parts:
            conn.execute(q("archive", "record"), {
                "trade_date": day, "ledger": p.ledger, "table_name": p.table,
                "row_count": p.rows, "checksum": p.checksum, "files_sha256": p.files_sha256,
                "path": p.path, "published_run": run_id})


def _remove(admin: Settings, day: dt.date) -> int:
    """Delete an archived day's rows from each ledger, each ledger's tables in one
    transaction, refused if a table holds other than none or the manifest's rows."""
    with connect(admin.settlement_dsn) as conn:
        counts = {(led, table): int(rows) for led, table, rows, *_ in
                  conn.execute(q("archive", "manifest"), {"trade_date": day})}
    removed = 0
    for ledger in LEDGERS:
        with connect(admin.ledger_dsn(ledger)) as conn, conn.transaction():
            for table in TABLES:
                row = conn.execute(q("archive", f"delete_{table}"), {"trade_date": day}
                                   ).fetchone()
                n = int(row[0]) if row else 0
                if n not in (0, counts.get((ledger, table), 0)):
                    raise ArchiveError(
                        f"{day} {ledger}.{table}: {n} rows to delete, the archive holds "
                        f"{counts.get((ledger, table), 0)}: rows came after it was written; "
                        "nothing deleted from this ledger. Restore the day (settle archive "
                        f"restore --date {day}) and archive it again")
                removed += n
    with connect(admin.settlement_dsn) as conn, conn.transaction():
        conn.execute(q("archive", "removed"), {"trade_date": day})
    return removed


def _read(spark: SparkSession, dsn: str, table: str, day: dt.date) -> DataFrame:
    from settlement.spark.io import jdbc_options

    url, props = jdbc_options(dsn)
    # JDBC's dbtable takes no bind parameters: the date goes in re-rendered from a date.
    query = f"(select * from {table} where trade_date = date '{day.isoformat()}') day"
    return spark.read.jdbc(url, query, properties={**props, "fetchsize": "20000"})


def _jdbc_append(frame: DataFrame, dsn: str, table: str) -> None:
    from settlement.spark.io import jdbc_options

    url, props = jdbc_options(dsn)
    frame.write.jdbc(url, table, mode="append",
                     properties={**props, "batchsize": "10000", "reWriteBatchedInserts": "true"})


def _figures(frame: DataFrame) -> tuple[int, Decimal]:
    """Rows and the sum of each row's xxhash64 over its columns in name order (decimal: the
    sum of longs overflows under ANSI mode)."""
    from pyspark.sql import functions as F

    cols = [F.col(c) for c in sorted(frame.columns)]
    row = frame.agg(F.count(F.lit(1)).alias("n"),
                    F.sum(F.xxhash64(*cols).cast("decimal(38,0)")).alias("h")).collect()[0]
    return int(row["n"]), Decimal(row["h"] or 0)


def _sha256(path: Path) -> str:
    """SHA-256 over the Parquet files of ``path`` (name order; Spark's markers left out)."""
    digest = hashlib.sha256()
    for f in sorted(path.glob("*.parquet")):
        digest.update(f.name.encode())
        digest.update(f.read_bytes())
    return digest.hexdigest()


def _session(settings: Settings, name: str) -> SparkSession:
    from settlement.spark.session import build_session

    return build_session(settings, app_name=name)
