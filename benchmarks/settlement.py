"""End-of-day settlement throughput from each source, against one SQL GROUP BY.

    .venv/bin/python benchmarks/settlement.py [--trades 2000,1000000[,10000000]]
        [--modes process,warm] [--native on,off] [--jvm on,off] [--own-read on,off]
        [--classifier jvm,workers] [--rounds R] [--mix clean,realistic]

For each mix and size: publish the day to a private topic, ingest it with one site into a
private ledger, then time in the same run (with both mixes, both days first, then their closes
alternated day by day). The mix (--mix, default realistic) is the day's
messages: `realistic` carries what the demo's exchange sends (1% replays, 0.1% malformed,
10% of transactions aborted and sent again, 0.2% of trades busted and 0.3% corrected, a
quarter of those twice); `clean` only the trades, once each.
  process_kafka, process_db - what users run: `settle eod --date D --source S` as a whole
          process, cold (a new interpreter, JVM, Spark session and Great Expectations
          context), wall seconds, with each step's seconds from its JSON and where the fixed
          cost went (`before_close_seconds`: interpreter and imports until the close began;
          `session_seconds`: JVM and Spark session start; the rest: exit); with --jvm off
          also without the close's class archive and small-day settings (`*_jvm_off`);
          with --own-read off (alias --driver-read) also with the day read by Spark's
          Kafka and JDBC readers instead of the close's own (the driver for a small day,
          the tasks' Python workers for a larger Kafka day): `*_spark_read`; with
          --classifier jvm,workers the Kafka close with the compiled classifier
          (settlement.spark.jvmclassify, the default) and with the Python workers'
          (`process_kafka_workers`); with --rounds R the process closes R times,
          alternated (keys of later rounds end _r2, _r3...)
  process_plain_spark - benchmarks/plain_spark_job.py as a process, cold: the plain PySpark
          job a team would write instead (JDBC read of the date, net per account and
          symbol, JDBC write), run right after each round's close from the ledger on the
          same day (`process_db_vs_plain_spark`; later rounds' keys end _r2, _r3...; with
          --rounds also `process_db_vs_plain_spark_best_of_rounds`)
  kafka - settlement only, `run_eod(source="kafka", validate=False)` (bounded read_committed
          Kafka read, parse and check, dedupe, positions, obligations, instrument summary,
          staged results), Spark local[2]
  db    - the same from the ledger over JDBC
  sql   - the positions netting as one GROUP BY inside PostgreSQL on the same rows (the
          baseline the targets are ratios of)
  eod_kafka, eod_db - `settle eod` end to end: the same plus Great Expectations, publication
          and the audit report, with each step's seconds
The Spark session is started and warmed once before timing; the driver JVM's peak resident
memory (VmHWM) is reported after each size. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from consumers.site import Site, SiteOptions
from settlement import services
from settlement.close.pipeline import run_eod
from settlement.config import Settings, load_settings
from settlement.db import connect
from settlement.drills.namespace import (
    drop_namespace,
    namespace_env,
    namespace_settings,
    reset_namespace,
)
from settlement.simulator.gateway import SimulationSpec, simulate
from settlement.spark.session import build_session

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DATE = "2026-11-24"
# The close's JVM without issue 44's class archive and small-day settings.
JVM_OFF = {"SETTLE_SPARK_CLASS_ARCHIVE": "false", "SETTLE_SPARK_SMALL_DAY_ROWS": "0"}
# The day's messages by mix: SimulationSpec's rates (the demo's, settlement.demo).
MIXES: dict[str, dict[str, float]] = {
    "clean": {},
    "realistic": {"dup_rate": 0.01, "bad_rate": 0.001, "abort_rate": 0.1,
                  "cancel_rate": 0.002, "correct_rate": 0.003},
}
# The positions as one query: each trade in its final state (its highest correction, left
# out when busted), netted per account and symbol. On a clean day the amendments are none.
SQL_NETTING = """
with latest as (
    select distinct on (trade_id) trade_id, symbol, price, quantity, buyer, seller
    from trade_amendments where trade_date = %(d)s and kind = 'correct'
    order by trade_id, version desc),
final as (
    select coalesce(l.symbol, t.symbol) as symbol, coalesce(l.price, t.price) as price,
           coalesce(l.quantity, t.quantity) as quantity, coalesce(l.buyer, t.buyer) as buyer,
           coalesce(l.seller, t.seller) as seller
    from trades t left join latest l using (trade_id)
    where t.trade_date = %(d)s and not exists (
        select 1 from trade_amendments c
        where c.trade_id = t.trade_id and c.trade_date = %(d)s and c.kind = 'cancel'))
select account, symbol, sum(bq), sum(sq), sum(bq) - sum(sq), sum(ba), sum(sa),
       sum(sa) - sum(ba), count(*)
from (select buyer as account, symbol, quantity as bq, 0 as sq, price * quantity as ba,
             0 as sa from final
      union all
      select seller, symbol, 0, quantity, 0, price * quantity from final) legs
group by account, symbol
"""


def namespace(base: Settings) -> tuple[Settings, dict[str, str]]:
    ns = namespace_env(base, f"bench_{uuid.uuid4().hex[:6]}")
    s = namespace_settings(base, ns)
    reset_namespace(s)
    return s, ns


def cold_close(env: dict[str, str], source: str, n: int, group_by: float) -> dict[str, Any]:
    """`settle eod` as an operator or the DAG runs it: a process of its own, timed whole."""
    settle = Path(sys.executable).parent / "settle"
    t0 = time.perf_counter()
    res = subprocess.run([str(settle), "eod", "--date", DATE, "--source", source, "--quiet",
                          "--json"], env={**os.environ, **env}, capture_output=True,
                         text=True, timeout=3600)
    secs = time.perf_counter() - t0
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["trades"] == n and out["validation_success"], out.get("validation")
    t = out["timings"]
    return {"seconds": round(secs, 2), "vs_group_by": round(secs / group_by, 2),
            "jvm": out.get("jvm"), "read_by": out.get("read_by"), "timings": t,
            "fixed": {"before_close": t.get("before_close_seconds"),
                      "session": t.get("session_seconds"),
                      "validate": t.get("validate_seconds"),
                      "report": t.get("report_seconds"),
                      "after_close": round(secs - t.get("before_close_seconds", 0)
                                           - t.get("total_seconds", 0), 2)}}


def plain_job(s: Settings, n: int, group_by: float) -> dict[str, Any]:
    """benchmarks/plain_spark_job.py (the PySpark job a team would write instead: JDBC read
    of the date from the ledger, net per account and symbol, JDBC write) as a process of its
    own, cold, timed whole, on the ledger the close reads."""
    from settlement.spark.io import jdbc_options

    url, props = jdbc_options(s.for_component("admin").ledger_dsn("a"))
    jar = next((s.jars_dir / "spark").glob("postgresql-*.jar"))
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, str(Path(__file__).with_name("plain_spark_job.py")),
                          "--jdbc-url", url, "--date", DATE, "--jars", str(jar)],
                         env={**os.environ, "PLAIN_JOB_PROPERTIES": json.dumps(props)},
                         capture_output=True, text=True, timeout=3600)
    secs = time.perf_counter() - t0
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["trades"] == n, out
    return {"seconds": round(secs, 2), "vs_group_by": round(secs / group_by, 2),
            "job_seconds": out["job_seconds"], "positions": out["positions"]}


def driver_peak_rss_mib(spark: SparkSession) -> int | None:
    """The local driver JVM's peak resident memory so far (Linux VmHWM); None when the JVM
    is not a child of this process."""
    proc = getattr(spark.sparkContext._gateway, "proc", None)
    status = Path(f"/proc/{proc.pid}/status") if proc is not None else None
    if status is None or not status.exists():
        return None
    for line in status.read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) // 1024
    return None


def spark_work(spark: SparkSession, group: str) -> dict[str, int]:
    """The Spark jobs and stages a run started (its job group), and the stages skipped
    because their output was already computed (a cached or reused shuffle)."""
    tracker = spark.sparkContext.statusTracker()
    jobs = [tracker.getJobInfo(j) for j in tracker.getJobIdsForGroup(group)]
    stages = {st for j in jobs if j is not None for st in j.stageIds}
    ran = {st for st in stages if tracker.getStageInfo(st) is not None
           and tracker.getStageInfo(st).numCompletedTasks > 0}
    return {"spark_jobs": len(jobs), "spark_stages": len(stages),
            "spark_stages_run": len(ran)}


def _validation_vs_work(run: dict[str, Any]) -> bool:
    """Validation took less time than reading plus netting (the ledger's read is timed as
    the settlement's dedupe step: the rows arrive there)."""
    t = run["timings"]
    work = t.get("read_seconds", 0) + t.get("dedupe_seconds", 0) + t.get("netting_seconds", 0)
    return t.get("validate_seconds", 0) < work


def process_targets(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Issue #44's targets, on the process figures: a 2,000-trade day in 12 s or less from
    either source, 2M within 8x (Kafka) and 6x (ledger) of the GROUP BY, 10M in 60 s (Kafka)
    and 40 s (ledger); issue #61's: from 200,000 trades, the close from the ledger within 1.3x
    of the plain PySpark job."""
    out: dict[str, Any] = {}
    for r in results:
        if "process_kafka" not in r:
            continue
        k, d, m = r["process_kafka"], r["process_db"], r["mix"]
        if r["trades"] <= 2_000:
            out[f"{m}_small_{r['trades']}_le_12s"] = k["seconds"] <= 12 and d["seconds"] <= 12
        if 1_500_000 <= r["trades"] <= 2_500_000:
            out[f"{m}_2m_kafka_le_8x"] = k["vs_group_by"] <= 8
            out[f"{m}_2m_db_le_6x"] = d["vs_group_by"] <= 6
        if r["trades"] >= 200_000 and "process_db_vs_plain_spark" in r:  # issue 61's
            out[f"{m}_{r['trades']}_db_le_1_3x_plain_spark"] = (
                r["process_db_vs_plain_spark"] <= 1.3)
            if "process_db_vs_plain_spark_best_of_rounds" in r:
                out[f"{m}_{r['trades']}_db_le_1_3x_plain_spark_best_of_rounds"] = (
                    r["process_db_vs_plain_spark_best_of_rounds"] <= 1.3)
        if r["trades"] >= 10_000_000:
            out[f"{m}_10m_kafka_le_60s"] = k["seconds"] <= 60
            out[f"{m}_10m_db_le_40s"] = d["seconds"] <= 40
    return out


def mix_targets(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Issue #61's: at each size run in both mixes, the realistic day's Kafka close (as a
    process) within 1.1x of the clean day's, read by the JVM on every partition (its JSON's
    ``read_by`` names no partition read again by the workers). With --rounds, also the ratio
    of each day's fastest round (this machine's speed drifts within a run)."""
    by = {(r["mix"], r["trades"]): r for r in results if "process_kafka" in r}
    out: dict[str, Any] = {}
    for (mix, n), r in sorted(by.items()):
        if mix != "realistic" or ("clean", n) not in by:
            continue
        dirty, clean = r["process_kafka"], by["clean", n]["process_kafka"]
        ratio = round(dirty["seconds"] / clean["seconds"], 2)
        out[f"{n}_realistic_vs_clean_kafka"] = ratio
        out[f"{n}_realistic_le_1_1x_clean"] = ratio <= 1.1
        rounds = [k for k in r if k.startswith("process_kafka_r")]
        if rounds and all(k in by["clean", n] for k in rounds):  # --rounds: every round's
            best = [min(x[k]["seconds"] for k in ("process_kafka", *rounds))
                    for x in (r, by["clean", n])]
            out[f"{n}_realistic_vs_clean_kafka_best_of_rounds"] = round(best[0] / best[1], 2)
        out[f"{n}_realistic_read_by"] = read_by = dirty["read_by"] or ""
        if read_by.startswith("jvm"):  # a small day is read by the driver, whole
            out[f"{n}_realistic_read_by_jvm_alone"] = "workers" not in read_by
    return out


def targets(results: list[dict[str, Any]], growth: dict[str, float] | None
            ) -> dict[str, Any]:
    """Issue #26's targets: the ratios at the size nearest 2M, the seconds at the largest
    size when it is 10M or more, validation against read plus netting at every size."""
    near = min(results, key=lambda r: abs(r["trades"] - 2_000_000))
    big = results[-1]
    out: dict[str, Any] = {
        "ratio_trades": near["trades"],
        "eod_kafka_le_15x_group_by": near["eod_kafka"]["vs_group_by"] <= 15,
        "eod_db_le_10x_group_by": near["eod_db"]["vs_group_by"] <= 10,
        "validation_lt_read_plus_netting": all(
            _validation_vs_work(r[k]) for r in results for k in ("eod_kafka", "eod_db")),
        "growth_no_worse_than_linear": None if growth is None
        else all(g <= 1.0 for g in growth.values()),
    }
    if big["trades"] >= 10_000_000:
        out["eod_kafka_10m_le_150s"] = big["eod_kafka"]["seconds"] <= 150
        out["eod_db_10m_le_75s"] = big["eod_db"]["seconds"] <= 75
    return out


@dataclass
class Day:
    """A day published to a private topic and ingested into a private ledger: what its
    closes run against (``settings``, ``env``) and its figures so far (``out``)."""

    settings: Settings
    env: dict[str, str]
    out: dict[str, Any]


def prepare(base: Settings, n: int, mix: str) -> Day:
    """The day of ``n`` trades in ``mix`` published, ingested by site A, and its `GROUP BY`
    timed (the baseline). The caller drops its namespace (``drop_namespace``)."""
    s, env = namespace(base)
    day = Day(s, env, {"trades": n, "mix": mix})
    try:
        print(f"[{n} {mix}] publishing...", file=sys.stderr, flush=True)
        sim = simulate(s, SimulationSpec(DATE, n, seed=1, txn_size=5_000, **MIXES[mix]))
        print(f"[{n} {mix}] ingesting with site a...", file=sys.stderr, flush=True)
        Site(s, SiteOptions("a", "separate", True, DATE, 3600)).run()
        sent = ("duplicates_injected", "malformed_injected", "aborted_transactions", "cancels",
                "corrections")
        day.out["messages"] = {k: sim.get(k) for k in sent}
        with connect(s.ledger_dsn("a")) as conn:
            # Twice, the faster counts: the first read of freshly ingested rows also sets
            # their hint bits (writes), which no later reader pays.
            runs = []
            for _ in range(2):
                t0 = time.perf_counter()
                rows = conn.execute(SQL_NETTING, {"d": DATE}).fetchall()
                runs.append(time.perf_counter() - t0)
            secs = min(runs)
        day.out["sql_group_by"] = {"seconds": round(secs, 2),
                                   "trades_per_second": round(n / secs), "positions": len(rows)}
    except BaseException:
        drop_namespace(s)
        raise
    return day


def process_runs(native: set[str], jvm: set[str], own_read: set[str], classifier: set[str],
                 rounds: int) -> list[tuple[str, str, dict[str, str]]]:
    """The process closes to time, in order: (key, source, extra environment).
    The Kafka close with the native classifier of plain trades (SETTLE_NATIVE_TRADES=true)
    and without it (the default), one after the other on the same day. And with the close's
    JVM as it was before issue 44's class archive and small-day settings (--jvm off: key
    suffix _jvm_off), for a comparison in the same run. And the day read by Spark's readers
    rather than the close's own (--own-read off: key suffix _spark_read)."""
    runs: list[tuple[str, str, dict[str, str]]] = []
    for jvm_mode, read_mode in ((j, r) for j in sorted(jvm, reverse=True)  # on first
                                for r in sorted(own_read, reverse=True)):
        jsuffix, jenv = ("", {}) if jvm_mode == "on" else ("_jvm_off", JVM_OFF)
        if read_mode == "off":
            jsuffix += "_spark_read"
            jenv = {**jenv, "SETTLE_SPARK_SMALL_DAY_DRIVER_READ": "false",
                    "SETTLE_SPARK_KAFKA_WORKER_READ": "false"}
        runs += [(f"process_kafka{suffix}{csuffix}{jsuffix}", "kafka",
                  {"SETTLE_NATIVE_TRADES": flag, **jenv, **cenv})
                 for flag, suffix, on in (("true", "_native", "on"),
                                          ("false", "", "off")) if on in native
                 for c, csuffix, cenv in (
                     ("jvm", "", {}),
                     ("workers", "_workers", {"SETTLE_SPARK_JVM_CLASSIFIER": "false"}))
                 if c in classifier and (c == "jvm" or flag == "false")]
        runs.append((f"process_db{jsuffix}", "db", jenv))
    return [(key + (f"_r{r}" if r > 1 else ""), source, extra)
            for r in range(1, rounds + 1) for key, source, extra in runs]


def timed_close(day: Day, key: str, source: str, extra: dict[str, str]) -> None:
    n = day.out["trades"]
    print(f"[{n} {day.out['mix']}] settle eod --source {source} {extra} (a process)...",
          file=sys.stderr, flush=True)
    day.out[key] = cold_close({**day.env, **extra}, source, n,
                              day.out["sql_group_by"]["seconds"])


def plain_beside(day: Day, suffix: str) -> None:
    """The plain job on ``day`` right after its ledger close of the same round (``suffix``:
    the round's key suffix, "" for the first): the ratio compares two processes a minute
    apart, where this machine's speed drifts by 1.5x within an hour (the plain job at 2M
    took 19.6-39.4 s across runs of the same code)."""
    n = day.out["trades"]
    print(f"[{n} {day.out['mix']}] the plain PySpark job (a process)...", file=sys.stderr,
          flush=True)
    day.out[f"process_plain_spark{suffix}"] = plain = plain_job(
        day.settings, n, day.out["sql_group_by"]["seconds"])
    day.out[f"process_db_vs_plain_spark{suffix}"] = round(
        day.out[f"process_db{suffix}"]["seconds"] / plain["seconds"], 2)
    rounds = [k for k in day.out if re.fullmatch(r"process_db_vs_plain_spark(_r\d+)?", k)]
    if len(rounds) > 1:  # each side's fastest round, as mix_targets takes the Kafka closes'
        best = [min(day.out[k.replace("process_db_vs_plain_spark", key)]["seconds"]
                    for k in rounds) for key in ("process_db", "process_plain_spark")]
        day.out["process_db_vs_plain_spark_best_of_rounds"] = round(best[0] / best[1], 2)


def warm_runs(spark: SparkSession, day: Day) -> None:
    """settle-only and end-of-day runs in this process's started session."""
    s, out, n = day.settings, day.out, day.out["trades"]
    for source, validate in (("kafka", False), ("db", False), ("kafka", True),
                             ("db", True)):
        key = f"eod_{source}" if validate else source
        print(f"[{n}] {key}...", file=sys.stderr, flush=True)
        group = f"{key}-{n}-{out['mix']}"
        spark.sparkContext.setJobGroup(group, f"benchmark {key} {n}")
        t0 = time.perf_counter()
        res = run_eod(s, DATE, source=source, validate=validate)
        secs = time.perf_counter() - t0
        assert res["trades"] == n, res
        assert not validate or res["validation_success"], res.get("validation")
        out[key] = {"seconds": round(secs, 2), "trades_per_second": round(n / secs),
                    "vs_group_by": round(secs / out["sql_group_by"]["seconds"], 2),
                    "timings": res["timings"], **spark_work(spark, group)}
        if validate:
            val = res["validation"]
            out[key]["validation_suites_seconds"] = val.get("seconds")
            out[key]["validation_figures"] = val.get("figures")
    out["driver_peak_rss_mib"] = driver_peak_rss_mib(spark)


def one_size(spark: SparkSession | None, base: Settings, n: int, mixes: list[str],
             modes: set[str], runs: list[tuple[str, str, dict[str, str]]]
             ) -> list[dict[str, Any]]:
    """Every mix's day of ``n`` trades prepared first, then each process close run on each
    day in turn (clean, realistic, clean, ...): this machine's speed drifts within a run
    (the plain job at 2M took 15.8 s in one run's first half, 20.3 s in its second), and a
    day's closes are compared with the other day's; the plain job runs right after each
    round's ledger close of the same day. Then the warm runs."""
    days: list[Day] = []
    try:
        for mix in mixes:
            days.append(prepare(base, n, mix))
        if "process" in modes:
            for key, source, extra in runs:
                for day in days:
                    timed_close(day, key, source, extra)
                    plain = re.fullmatch(r"process_db(_r\d+)?", key)
                    if plain:  # the plain job beside this round's ledger close, same day
                        plain_beside(day, plain.group(1) or "")
        if spark is not None:
            for day in days:
                warm_runs(spark, day)
        return [day.out for day in days]
    finally:
        for day in days:
            drop_namespace(day.settings)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trades", default="2000,1000000", help="comma-separated day sizes")
    ap.add_argument("--modes", default="process,warm",
                    help="process: `settle eod` as a cold process; warm: in this process's "
                         "started Spark session")
    ap.add_argument("--jvm", default="on",
                    help="on, off or on,off: the process closes with the close's JVM settings "
                         "(class archive, small-day settings: the default), without them "
                         "(keys ending _jvm_off), or both in the same run")
    ap.add_argument("--native", default="off",
                    help="off, on or on,off: the process Kafka close without the native "
                         "classifier of plain trades (the default), with it "
                         "(process_kafka_native), or both in the same run")
    ap.add_argument("--own-read", "--driver-read", dest="own_read", default="on",
                    help="on, off or on,off: the process closes with the day read by the "
                         "close's own readers (the driver for a small day, the tasks' Python "
                         "workers for a larger Kafka day: the default), by Spark's Kafka and "
                         "JDBC readers (keys ending _spark_read), or both in the same run")
    ap.add_argument("--classifier", default="jvm",
                    help="jvm, workers or jvm,workers: the process Kafka close classifying in "
                         "the JVM (the default), by the tasks' Python workers "
                         "(process_kafka_workers), or both in the same run")
    ap.add_argument("--rounds", type=int, default=1,
                    help="the process closes this many times, alternated")
    ap.add_argument("--mix", default="realistic",
                    help="clean, realistic or clean,realistic: the day's messages (see above); "
                         "both: each size's two days ingested, then their closes alternated")
    args = ap.parse_args()

    def on_off(option: str, value: str) -> set[str]:
        got = {m.strip() for m in value.split(",") if m.strip()}
        if not got or not got <= {"on", "off"}:
            ap.error(f"--{option}: expected on and/or off, got {value!r}")
        return got

    native = on_off("native", args.native)
    jvm = on_off("jvm", args.jvm)
    own_read = on_off("own-read", args.own_read)
    classifier = {m.strip() for m in args.classifier.split(",") if m.strip()}
    if not classifier or not classifier <= {"jvm", "workers"}:
        ap.error(f"--classifier: expected jvm and/or workers, got {args.classifier!r}")
    mixes = [m.strip() for m in args.mix.split(",") if m.strip()]
    if not mixes or not set(mixes) <= set(MIXES):
        ap.error(f"--mix: expected clean and/or realistic, got {args.mix!r}")
    mixes = [m for m in MIXES if m in mixes]
    if args.rounds < 1:
        ap.error(f"--rounds: expected 1 or more, got {args.rounds}")
    sizes = [int(x) for x in args.trades.split(",")]
    modes = {m.strip() for m in args.modes.split(",") if m.strip()}
    if not modes <= {"process", "warm"}:
        ap.error(f"--modes: expected process and/or warm, got {args.modes!r}")
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    base = load_settings()
    started = services.up(base)
    try:
        spark = None
        if "warm" in modes:
            spark = build_session(base, "settlement-benchmark")
            spark.range(1000).selectExpr("sum(id)").collect()  # JVM and session warm-up
        runs = process_runs(native, jvm, own_read, classifier, args.rounds)
        results = [out for n in sizes for out in one_size(spark, base, n, mixes, modes, runs)]
    finally:
        if started.get("kafka") == "started" or started.get("postgres") == "started":
            services.down(base)
    growth = None
    last_mix = [r for r in results if r["mix"] == mixes[-1]]
    if len(last_mix) > 1 and "warm" in modes:
        a, b = last_mix[0], last_mix[-1]
        growth = {src: round((b[src]["seconds"] / a[src]["seconds"])
                             / (b["trades"] / a["trades"]), 2)
                  for src in ("kafka", "db", "eod_kafka", "eod_db")}
    print(json.dumps({
        "benchmark": "settlement", "spark_master": base.spark_master,
        "machine": {"cores": os.cpu_count()}, "results": results,
        "cost_growth_vs_linear": growth,
        "targets": targets(results, growth) if "warm" in modes else None,
        "process_targets": process_targets(results),
        "mix_targets": mix_targets(results),
    }, indent=2))


if __name__ == "__main__":
    main()
