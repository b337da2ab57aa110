"""`settle kafka init`: the trades topic, users and ACLs of a Kafka cluster, as its admin."""

from __future__ import annotations

import argparse
from typing import Any

from settlement.cli.common import Subparsers, add_command
from settlement.config import Settings


def register(sub: Subparsers) -> None:
    sp = add_command(sub, "kafka", "prepare a Kafka cluster: the trades topic, users and ACLs "
                                   "(as admin)", cmd_kafka)
    sp.add_argument("action", choices=["init"])
    sp.add_argument("--grant", action="append", default=[], metavar="ROLE:USER[:PASSWORD_ENV]",
                    help="create or update USER (password from the environment variable "
                         "PASSWORD_ENV) with the ACLs of ROLE: gateway, site-a, site-b or "
                         "settlement; repeatable")


def cmd_kafka(args: argparse.Namespace, s: Settings) -> dict[str, Any]:
    from settlement.kafka.security import Grant, init

    return init(s, [Grant.parse(g) for g in args.grant])
