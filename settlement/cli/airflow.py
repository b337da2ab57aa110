"""`settle airflow-users`: Airflow's users and roles (FAB auth manager)."""

from __future__ import annotations

import argparse
from typing import Any

from settlement.cli.common import Subparsers, add_command
from settlement.config import ConfigError, Settings


def register(sub: Subparsers) -> None:
    sp = add_command(sub, "airflow-users", "create or update Airflow's users and roles (FAB "
                                           "auth manager)", cmd_airflow_users)
    sp.add_argument("--grant", action="append", default=[], metavar="ROLE:USER:PASSWORD_ENV",
                    help="create or update USER with exactly ROLE: auditor (Viewer: sees runs, "
                         "logs and reports), operations (Op: also triggers and clears) or "
                         "admin; the password is read from the environment variable "
                         "PASSWORD_ENV; repeatable; re-run to rotate a password")


def cmd_airflow_users(args: argparse.Namespace, s: Settings) -> dict[str, Any]:
    from settlement.orchestration.fab_users import UserGrant, apply_user_grants

    if not args.grant:
        raise ConfigError("settle airflow-users: name at least one --grant "
                          "ROLE:USER:PASSWORD_ENV")
    return {"users": apply_user_grants([UserGrant.parse(g) for g in args.grant])}
