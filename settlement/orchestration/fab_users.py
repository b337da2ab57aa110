"""Airflow's users in production: the FAB auth manager's roles, one login per person or team.

``settle airflow-users --grant ROLE:USER:PASSWORD_ENV ...`` creates or updates each user with
exactly one role (docker-compose's one-shot ``airflow-users``; re-run it to rotate a
password). The password is read from the named environment variable, so it is never on a
command line (``airflow users create -p`` would put it in ``ps``):

- ``auditor`` -> FAB's ``Viewer``: sees DAGs, runs, task logs and the audit reports; cannot
  trigger, clear, pause or edit anything.
- ``operations`` -> ``Op``: also triggers, clears and pauses runs and manages connections
  (e.g. ``smtp_default`` for alerts); cannot manage users.
- ``admin`` -> ``Admin``: everything, users included.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any

from settlement.config import ConfigError, env_password, split_grant

ROLES = {"auditor": "Viewer", "operations": "Op", "admin": "Admin"}
_USER = re.compile(r"^[A-Za-z0-9._@-]{1,64}$")


@dataclass(frozen=True)
class UserGrant:
    role: str
    user: str
    password_env: str

    @classmethod
    def parse(cls, text: str) -> UserGrant:
        """``ROLE:USER:PASSWORD_ENV``, e.g. ``auditor:audit-team:AIRFLOW_AUDITOR_PASSWORD``."""
        role, user, env = split_grant(text, ROLES, _USER,
                                      "1-64 letters, digits, '.', '_', '@' or '-'",
                                      "auditor:audit-team:AIRFLOW_AUDITOR_PASSWORD")
        return cls(role, user, str(env))

    def password(self) -> str:
        return env_password(self.password_env, f"Airflow user {self.user}", 12)


# FAB syncs its roles and permissions whenever an application starts, so this one-shot and
# the api-server starting beside it can insert the same permission rows at once: the loser
# gets a unique violation, and on the next attempt finds the rows there.
ATTEMPTS = 5


def apply_user_grants(grants: list[UserGrant], pause: float = 2.0) -> dict[str, Any]:
    """Create or update each user with exactly its role, in Airflow's metadata database;
    retried (``ATTEMPTS``, ``pause`` seconds more each time) when a concurrent permission
    sync collides with this one."""
    from sqlalchemy.exc import IntegrityError

    passwords = {g.user: g.password() for g in grants}  # all checked before any change
    for attempt in range(1, ATTEMPTS + 1):
        try:
            return _apply(grants, passwords)
        except IntegrityError:
            if attempt == ATTEMPTS:
                raise
            time.sleep(pause * attempt)
    raise AssertionError("unreachable")


def _apply(grants: list[UserGrant], passwords: dict[str, str]) -> dict[str, Any]:
    from airflow.providers.fab.auth_manager.cli_commands.utils import get_application_builder

    out: dict[str, Any] = {}
    with get_application_builder() as appbuilder:
        sm = appbuilder.sm
        for g in grants:
            role = sm.find_role(ROLES[g.role])
            if role is None:
                raise ConfigError(f"Airflow has no {ROLES[g.role]} role: is the FAB auth "
                                  "manager configured and `airflow db migrate` run?")
            user = sm.find_user(username=g.user)
            if user is None:
                if not sm.add_user(g.user, g.user, g.role, f"{g.user}@settlement.invalid",
                                   role, passwords[g.user]):
                    raise ConfigError(f"Airflow refused to create the user {g.user}")
                out[g.user] = {"role": ROLES[g.role], "result": "created"}
                continue
            user.roles = [role]
            sm.update_user(user)
            sm.reset_password(user.id, passwords[g.user])
            out[g.user] = {"role": ROLES[g.role], "result": "updated"}
    return out
