"""Kafka users and ACLs: least privilege for the gateway, the consumer sites and settlement.

``settle kafka init`` runs once per deployment (docker-compose's ``kafka-init`` service) as
a super user. It creates the ``trades`` topic if missing and, for each ``--grant
ROLE:USER:PASSWORD_ENV``, upserts the user's SCRAM credential and the role's ACLs:

- ``gateway``: write and describe the topic, use the gateway's transactional ids (the
  exactly-once producer fences older instances through them), idempotent write.
- ``site-a`` / ``site-b``: read and describe the topic, and that site's consumer groups
  (its own in the separate scheme, the shared one in the shared scheme); it cannot produce
  or join the other site's group.
- ``settlement``: read and describe the topic, probe and Spark consumer groups; it cannot
  produce or join the sites' groups.

Passwords are read from environment variables named on the command line so that no secret
appears in a process list or a compose file. Re-running is safe: credentials are upserted
(that is how a password is rotated) and creating an existing ACL is a no-op in Kafka.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from settlement.config import ConfigError, Settings, env_password, split_grant
from settlement.contract import TRANSACTIONAL_ID, group_id

ROLES = ("gateway", "site-a", "site-b", "settlement", "auditor")
# Iterations for new SCRAM credentials: Kafka accepts 4096 (its minimum) to 16384; more
# iterations cost the broker more per login and an attacker more per guessed password.
SCRAM_ITERATIONS = 8192
# Settlement's consumer groups (prefixes): the source chooser's probe, a day's range read by
# the close itself or its Spark tasks' Python workers (eod-probe-read-...), and Spark's batch
# Kafka source (which names its internal groups spark-kafka-relation-...). It reads by
# assignment.
SETTLEMENT_GROUP_PREFIXES = ("eod-probe-", "spark-kafka-")
AUDITOR_GROUP_PREFIX = "audit-"
_USER = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


@dataclass(frozen=True)
class Grant:
    role: str
    user: str
    password_env: str | None  # None: the user already exists, only ACLs are applied

    @classmethod
    def parse(cls, text: str) -> Grant:
        """``ROLE:USER[:PASSWORD_ENV]``, e.g. ``site-a:site-a:SETTLE_KAFKA_SITE_A_PASSWORD``."""
        return cls(*split_grant(text, ROLES, _USER, "1-64 letters, digits, '.', '_' or '-'",
                                "site-a:site-a:SETTLE_KAFKA_SITE_A_PASSWORD",
                                env_optional=True))

    def password(self) -> str | None:
        if self.password_env is None:
            return None
        return env_password(self.password_env, f"Kafka user {self.user}")


def role_acls(role: str, user: str, topic: str) -> list[Any]:
    """The ACL bindings (all ALLOW, any host) that role ``role`` needs, for principal
    ``User:<user>``."""
    from confluent_kafka.admin import (
        AclBinding,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )

    if role not in ROLES:
        raise ConfigError(f"unknown Kafka role {role!r}: expected one of {', '.join(ROLES)}")
    principal = f"User:{user}"
    lit, pre = ResourcePatternType.LITERAL, ResourcePatternType.PREFIXED

    def allow(rtype: Any, name: str, pattern: Any, op: Any) -> Any:
        return AclBinding(rtype, name, pattern, principal, "*", op, AclPermissionType.ALLOW)

    # Only the gateway publishes; everyone else reads.
    topic_ops = (AclOperation.WRITE if role == "gateway" else AclOperation.READ,
                 AclOperation.DESCRIBE)
    acls = [allow(ResourceType.TOPIC, topic, lit, op) for op in topic_ops]
    if role == "gateway":
        acls += [
            allow(ResourceType.TRANSACTIONAL_ID, TRANSACTIONAL_ID, pre, AclOperation.WRITE),
            allow(ResourceType.TRANSACTIONAL_ID, TRANSACTIONAL_ID, pre, AclOperation.DESCRIBE),
            allow(ResourceType.BROKER, "kafka-cluster", lit, AclOperation.IDEMPOTENT_WRITE),
        ]
    if role.startswith("site-"):
        site = role.removeprefix("site-")
        for scheme in ("separate", "shared"):
            acls.append(allow(ResourceType.GROUP, group_id(site, scheme), lit, AclOperation.READ))
    if role == "settlement":
        for prefix in SETTLEMENT_GROUP_PREFIXES:
            acls.append(allow(ResourceType.GROUP, prefix, pre, AclOperation.READ))
    if role == "auditor":  # reads the topic; its own consumer groups, if any, start audit-
        acls.append(allow(ResourceType.GROUP, AUDITOR_GROUP_PREFIX, pre, AclOperation.READ))
    return acls


def upsert_user(admin: Any, user: str, password: str, mechanism: str) -> None:
    from confluent_kafka.admin import (
        ScramCredentialInfo,
        ScramMechanism,
        UserScramCredentialUpsertion,
    )

    mech = {"SCRAM-SHA-256": ScramMechanism.SCRAM_SHA_256,
            "SCRAM-SHA-512": ScramMechanism.SCRAM_SHA_512}.get(mechanism)
    if mech is None:
        raise ConfigError(
            f"SETTLE_KAFKA_SASL_MECHANISM is {mechanism}: users can only be created for "
            "SCRAM-SHA-256 or SCRAM-SHA-512"
        )
    upsert = UserScramCredentialUpsertion(user, ScramCredentialInfo(mech, SCRAM_ITERATIONS),
                                          password.encode())
    for fut in admin.alter_user_scram_credentials([upsert]).values():
        fut.result()


def init(settings: Settings, grants: list[Grant]) -> dict[str, Any]:
    """Create the topic, then each grant's user and ACLs. Idempotent."""
    from settlement.kafka.admin import admin_client, ensure_topic

    if grants and not settings.kafka_protocol.startswith("SASL"):
        raise ConfigError(
            "--grant needs an authenticated cluster: set SETTLE_KAFKA_SECURITY_PROTOCOL to "
            "SASL_PLAINTEXT or SASL_SSL and the admin's SETTLE_KAFKA_SASL_USERNAME/PASSWORD"
        )
    passwords = {g.user: g.password() for g in grants}  # fail on a missing one before acting
    topic = ensure_topic(settings)
    admin = admin_client(settings)
    users, acls = [], 0
    for g in grants:
        password = passwords[g.user]
        if password is not None:
            upsert_user(admin, g.user, password, settings.kafka_sasl_mechanism)
        bindings = role_acls(g.role, g.user, settings.topic)
        for fut in admin.create_acls(bindings, request_timeout=30).values():
            fut.result()
        acls += len(bindings)
        users.append({"user": g.user, "role": g.role, "password_set": password is not None})
    return {"topic": settings.topic, "topic_status": topic, "grants": users, "acls": acls}
