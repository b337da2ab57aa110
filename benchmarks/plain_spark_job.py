"""The Spark job a team would write instead of the close (issue 61's peer): a plain PySpark
batch job that reads one trade date from the ledger over JDBC, nets it per account and symbol,
and writes the positions back over JDBC.

    PLAIN_JOB_PROPERTIES='{"user": ..., "password": ...}' \
    .venv/bin/python benchmarks/plain_spark_job.py --jdbc-url URL --date D --jars JAR[,JAR] \
        [--table plain_positions]

No dedupe, amendments, validation, publication, instructions or report: the floor the close's
extra work is measured against (benchmarks/settlement.py runs both as processes on the same
day). Prints one JSON object: the rows read and written and the wall seconds of the job after
its session started.
"""

from __future__ import annotations

import argparse
import json
import os
import time

from pyspark.sql import SparkSession
from pyspark.sql import functions as F


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jdbc-url", required=True)
    ap.add_argument("--date", required=True)
    ap.add_argument("--jars", required=True, help="the PostgreSQL JDBC driver's jar")
    ap.add_argument("--table", default="plain_positions")
    args = ap.parse_args()
    # The connection properties (a password among them) by the environment, not the command
    # line, which any user of the machine can read.
    props = json.loads(os.environ["PLAIN_JOB_PROPERTIES"])
    spark = (SparkSession.builder.master("local[2]").appName("plain-netting")
             .config("spark.jars", args.jars)
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.ui.enabled", "false")
             .getOrCreate())
    t0 = time.perf_counter()
    query = ("(select buyer, seller, symbol, price, quantity from trades "
             f"where trade_date = date '{args.date}') t")
    trades = spark.read.jdbc(args.jdbc_url, query, properties=props).cache()
    n = trades.count()
    legs = trades.select(F.col("buyer").alias("account"), "symbol",
                         F.col("quantity").alias("qty"),
                         (-F.col("price") * F.col("quantity")).alias("cash")).unionByName(
        trades.select(F.col("seller").alias("account"), "symbol",
                      (-F.col("quantity")).alias("qty"),
                      (F.col("price") * F.col("quantity")).alias("cash")))
    positions = legs.groupBy("account", "symbol").agg(
        F.sum("qty").alias("net_quantity"), F.sum("cash").alias("net_cash")).cache()
    rows = positions.count()
    positions.write.jdbc(args.jdbc_url, args.table, mode="overwrite", properties=props)
    seconds = time.perf_counter() - t0
    spark.stop()
    print(json.dumps({"trades": n, "positions": rows, "job_seconds": round(seconds, 2)}))


if __name__ == "__main__":
    main()
