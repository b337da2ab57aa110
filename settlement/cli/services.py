"""`settle services up|down|status`: the embedded PostgreSQL and Kafka on loopback."""

from __future__ import annotations

import argparse
from typing import Any

from settlement.cli.common import Subparsers, add_command, console
from settlement.config import Settings


def register(sub: Subparsers) -> None:
    sp = add_command(sub, "services", "run the embedded PostgreSQL and Kafka on loopback",
                     cmd_services)
    sp.add_argument("action", choices=["up", "down", "status"])
    sp.add_argument("--brokers", type=int, choices=[1, 3], default=None,
                    help="Kafka cluster size (default SETTLE_KAFKA_BROKERS or 1)")
    sp.add_argument("--spark-cluster", action="store_true",
                    help="up: also a standalone Spark master and SETTLE_SPARK_WORKERS one-core "
                         "workers on loopback (then SETTLE_SPARK_MASTER=spark_master_url); "
                         "down stops them whenever they run")


def cmd_services(args: argparse.Namespace, s: Settings) -> dict[str, Any]:
    from settlement import services

    if args.action == "up":
        console().print("[bold]starting embedded services[/] (PostgreSQL, Kafka KRaft)...")
        return services.up(s, brokers=args.brokers, spark_cluster=args.spark_cluster)
    if args.action == "down":
        return services.down(s)
    return services.status(s)
