"""PostgreSQL login users: one per component, each granted exactly its group role.

The group roles (``settle_site``, ``settle_settlement``, ``settle_auditor``) hold the grants
(sql/migrations); a login user is a member of one of them and of nothing else. The embedded
server creates its users at start (``settlement.services.postgres``); a deployment runs
``settle db migrate --grant COMPONENT:USER:PASSWORD_ENV ...`` as the admin (docker-compose's
one-shot ``migrate``; ``settle db users`` does only the users). Re-running is safe and is how
a password is rotated.

Passwords reach the server only as SCRAM verifiers computed here (libpq's
``PQencryptPasswordConn``), so no plaintext password is ever in a statement the server could
log. Role names go through ``psycopg.sql.Identifier``, never string formatting.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from settlement.config import COMPONENT_GROUPS, env_password, split_grant

GROUPS = tuple(sorted(set(COMPONENT_GROUPS.values())))
_USER = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


@dataclass(frozen=True)
class LoginGrant:
    component: str
    user: str
    password_env: str

    @classmethod
    def parse(cls, text: str) -> LoginGrant:
        """``COMPONENT:USER:PASSWORD_ENV``, e.g. the example below."""
        component, user, env = split_grant(
            text, COMPONENT_GROUPS, _USER,
            "lower-case letters, digits and '_', starting with a letter or '_'",
            "site_a:settle_site_a:SETTLE_PG_SITE_A_PASSWORD")
        return cls(component, user, str(env))

    def password(self) -> str:
        return env_password(self.password_env, f"database user {self.user}", 12)


def scram_verifier(conn: psycopg.Connection, user: str, password: str) -> str:
    """The SCRAM-SHA-256 verifier the server stores, computed client-side."""
    return conn.pgconn.encrypt_password(password.encode(), user.encode(),
                                        b"scram-sha-256").decode()


def set_password(conn: psycopg.Connection, user: str, password: str) -> None:
    conn.execute(sql.SQL("alter role {} password {}").format(
        sql.Identifier(user), sql.Literal(scram_verifier(conn, user, password))))


def ensure_groups(conn: psycopg.Connection) -> None:
    """The NOLOGIN group roles (cluster-wide; migration 0003 creates them too)."""
    have = {r[0] for r in conn.execute("select rolname from pg_roles where rolname = any(%s)",
                                       (list(GROUPS),))}
    for group in GROUPS:
        if group not in have:
            conn.execute(sql.SQL("create role {} nologin").format(sql.Identifier(group)))


def ensure_login(conn: psycopg.Connection, user: str, group: str, password: str) -> str:
    """Create or update ``user``: it can log in, holds no attribute beyond that, and is a
    member of ``group`` and of no other of our groups. Returns 'created' or 'updated'."""
    exists = conn.execute("select 1 from pg_roles where rolname = %s", (user,)).fetchone()
    ident = sql.Identifier(user)
    if not exists:
        conn.execute(sql.SQL("create role {} login").format(ident))
    conn.execute(sql.SQL("alter role {} login inherit nosuperuser nocreatedb nocreaterole "
                         "noreplication nobypassrls").format(ident))
    set_password(conn, user, password)
    for other in GROUPS:
        if other != group:
            conn.execute(sql.SQL("revoke {} from {}").format(sql.Identifier(other), ident))
    conn.execute(sql.SQL("grant {} to {}").format(sql.Identifier(group), ident))
    return "updated" if exists else "created"


def apply_grants(conn: psycopg.Connection, grants: list[LoginGrant]) -> dict[str, Any]:
    """`settle db users`: every grant's login user, as the admin connected by ``conn``."""
    passwords = {g.user: g.password() for g in grants}  # all checked before any change
    ensure_groups(conn)
    return {g.user: {"component": g.component, "group": COMPONENT_GROUPS[g.component],
                     "result": ensure_login(conn, g.user, COMPONENT_GROUPS[g.component],
                                            passwords[g.user])}
            for g in grants}
