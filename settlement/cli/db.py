"""`settle db migrate|schema|users`: the database schema and login users, as the admin."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from settlement.cli.common import Subparsers, add_command
from settlement.config import ConfigError, Settings


def register(sub: Subparsers) -> None:
    sp = add_command(sub, "db", "database schema and login users (as the admin)", cmd_db)
    sp.add_argument("action", choices=["migrate", "schema", "users"],
                    help="migrate: apply sql/migrations everywhere; schema: regenerate "
                         "sql/schema.sql (or --output FILE) from an empty database; users: "
                         "create or update the --grant login users (migrate does too, after "
                         "the migrations)")
    sp.add_argument("--grant", action="append", default=[],
                    metavar="COMPONENT:USER:PASSWORD_ENV",
                    help="migrate, users: create or update USER (password from the environment "
                         "variable PASSWORD_ENV, sent as a SCRAM verifier) as a member of "
                         "COMPONENT's group role only: site_a, site_b, settlement or "
                         "auditor; repeatable; re-run to rotate a password")
    sp.add_argument("--output", type=Path, default=None, metavar="FILE",
                    help="schema: write here instead of sql/schema.sql (default: %(default)s)")


def cmd_db(args: argparse.Namespace, s: Settings) -> dict[str, Any]:
    from settlement.db import connect, migrate_all
    from settlement.dbusers import LoginGrant, apply_grants
    from settlement.services.schema import write_schema_file

    if args.action == "schema":
        return {"schema_file": write_schema_file(s, args.output)}
    grants = [LoginGrant.parse(g) for g in args.grant]  # checked before anything changes
    if args.action == "users" and not grants:
        raise ConfigError("settle db users: name at least one --grant "
                          "COMPONENT:USER:PASSWORD_ENV")
    out: dict[str, Any] = {}
    if args.action == "migrate":
        out["databases"] = migrate_all(s)
    if grants:
        with connect(s.for_component("admin").settlement_dsn, autocommit=True) as conn:
            out["users"] = apply_grants(conn, grants)
    return out
