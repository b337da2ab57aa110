"""Authenticated Kafka: a real embedded broker with SASL/SCRAM and ACLs on its own ports.

It is formatted with one super user (the admin); `settle kafka init` then creates the
gateway, site and settlement users with their ACLs, as docker-compose's kafka-init does.
"""

from __future__ import annotations

import os
import secrets
import stat
import subprocess
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from settlement.config import ConfigError, Settings
from settlement.kafka.security import Grant, role_acls
from settlement.services.kafka import EmbeddedKafka
from tests.helpers import settle
from tests.spark_fixtures import spark  # noqa: F401

DATE = "2026-11-20"
PORT, CONTROLLER_PORT = 29592, 29692  # clear of the suite's 3-broker cluster (29092-29194)


@dataclass(frozen=True)
class SecureKafka:
    settings: Settings  # as the admin
    env: dict[str, str]  # the CLI's environment as the admin
    passwords: dict[str, str]
    processes: set[str]  # every command line seen while the broker was formatted and started

    def client(self, user: str | None, password: str | None = None, **extra: Any
               ) -> dict[str, Any]:
        conf: dict[str, Any] = {"bootstrap.servers": self.settings.bootstrap(1), "log_level": 0}
        if user is not None:
            conf |= {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-512",
                     "sasl.username": user,
                     "sasl.password": password if password is not None else self.passwords[user]}
        return conf | extra

    def env_as(self, user: str) -> dict[str, str]:
        return {**self.env, "SETTLE_KAFKA_SASL_USERNAME": user,
                "SETTLE_KAFKA_SASL_PASSWORD": self.passwords[user]}


@pytest.fixture(scope="module")
def secure_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureKafka]:
    state = Path(tmp_path_factory.mktemp("sasl-kafka"))
    passwords = {u: secrets.token_urlsafe(18)
                 for u in ("admin", "gateway", "site-a", "site-b", "settlement")}
    # Settlement's password holds JAAS metacharacters: Spark's Kafka login is a JAAS string,
    # so unescaped they would end the value early (or inject options).
    passwords["settlement"] += '"\\; username="admin'

    env = {
        **os.environ,
        "SETTLE_STATE_DIR": str(state),
        "SETTLE_KAFKA_PORT": str(PORT),
        "SETTLE_KAFKA_CONTROLLER_PORT": str(CONTROLLER_PORT),
        "SETTLE_KAFKA_BROKERS": "1",
        "SETTLE_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
        "SETTLE_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
        "SETTLE_KAFKA_SASL_USERNAME": "admin",
        "SETTLE_KAFKA_SASL_PASSWORD": passwords["admin"],
        "SETTLE_TOPIC": "trades",
        **{f"PW_{u.upper().replace('-', '_')}": p for u, p in passwords.items()},
    }
    settings = Settings(
        state_dir=state, kafka_port=PORT, kafka_controller_port=CONTROLLER_PORT,
        kafka_brokers=1, kafka_security_protocol="SASL_PLAINTEXT",
        kafka_sasl_username="admin", kafka_sasl_password=passwords["admin"],
    )
    kafka = EmbeddedKafka(settings)
    seen: set[str] = set()
    stop = threading.Event()

    def sample() -> None:  # bounded by the start below
        while not stop.wait(0.05):
            seen.update(subprocess.run(["ps", "-ww", "-eo", "args", "--no-headers"],
                                       capture_output=True, text=True).stdout.splitlines())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        kafka.start(1)
    finally:
        stop.set()
        sampler.join(10)
    try:
        yield SecureKafka(settings, env, passwords, seen)
    finally:
        kafka.stop()


@pytest.fixture(scope="module")
def granted(secure_kafka: SecureKafka) -> SecureKafka:
    grants = ["gateway:gateway:PW_GATEWAY", "site-a:site-a:PW_SITE_A", "site-b:site-b:PW_SITE_B",
              "settlement:settlement:PW_SETTLEMENT"]
    args = ["kafka", "init", *[x for g in grants for x in ("--grant", g)]]
    first = settle(args, secure_kafka.env, timeout=120)
    again = settle(args, secure_kafka.env, timeout=120)  # idempotent: a rotation re-runs it
    assert first["topic_status"] == "created" and again["topic_status"] == "exists"
    assert [g["user"] for g in first["grants"]] == ["gateway", "site-a", "site-b", "settlement"]
    assert first["acls"] == again["acls"] > 0
    return secure_kafka


def _metadata_errors(conf: dict[str, Any]) -> tuple[bool, list[KafkaError]]:
    """Whether the client got cluster metadata, and the errors it reported on the way."""
    errors: list[KafkaError] = []
    admin = AdminClient({**conf, "error_cb": errors.append})
    try:
        admin.list_topics(timeout=6)
        return True, errors
    except KafkaException as e:
        admin.poll(1)  # serve error_cb: the cause (e.g. a failed SASL handshake) is there
        return False, [*errors, e.args[0]]


def test_unauthenticated_client_is_refused(secure_kafka: SecureKafka) -> None:
    ok, _ = _metadata_errors(secure_kafka.client(None))
    assert not ok, "a PLAINTEXT client got metadata from the SASL listener"


def test_wrong_password_is_refused_with_an_authentication_error(
        secure_kafka: SecureKafka) -> None:
    ok, errors = _metadata_errors(secure_kafka.client("admin", "not-the-password"))
    assert not ok
    assert any(e.code() == KafkaError._AUTHENTICATION for e in errors), errors


def test_right_password_is_accepted(secure_kafka: SecureKafka) -> None:
    ok, errors = _metadata_errors(secure_kafka.client("admin"))
    assert ok, errors


def _produce(conf: dict[str, Any], topic: str = "trades") -> KafkaError | None:
    results: list[KafkaError | None] = []
    p = Producer({**conf, "message.timeout.ms": 8000})
    p.produce(topic, b'{"probe": true}', on_delivery=lambda err, _m: results.append(err))
    p.flush(15)
    assert results, "no delivery report within 15 s"
    return results[0]


def _consume(conf: dict[str, Any], group: str, want: int, assign: bool = False
             ) -> tuple[int, KafkaError | None]:
    c = Consumer({**conf, "group.id": group, "auto.offset.reset": "earliest",
                  "isolation.level": "read_committed", "enable.auto.commit": False})
    try:
        if assign:
            c.assign([TopicPartition("trades", p, 0) for p in range(6)])
        else:
            c.subscribe(["trades"])
        n = 0
        for _ in range(40):  # at most ~20 s
            for m in c.consume(500, timeout=0.5):
                if m.error():
                    if m.error().code() != KafkaError._PARTITION_EOF:
                        return n, m.error()
                    continue
                n += 1
            if n >= want:
                return n, None
        return n, None
    finally:
        c.close()


def test_users_get_exactly_their_roles_rights(granted: SecureKafka) -> None:
    k = granted
    # The gateway publishes a day through the real transactional producer, as itself.
    sim = settle(["simulate", "--date", DATE, "--trades", "300", "--seed", "3"],
                 k.env_as("gateway"), timeout=120)
    assert sim["trades"] == 300
    day = 300 + 6  # trades + one close marker per partition

    # A site reads the topic through its own consumer group...
    n, err = _consume(k.client("site-a"), "settlement-site-a", day)
    assert err is None and n == day
    # ...but may not publish, nor use another site's group.
    assert _produce(k.client("site-a")).code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    _, err = _consume(k.client("site-a"), "settlement-site-b", 1)
    assert err is not None and err.code() == KafkaError.GROUP_AUTHORIZATION_FAILED
    # The shared scheme's group is both sites' own.
    n, err = _consume(k.client("site-b"), "settlement-shared", day)
    assert err is None and n == day

    # The gateway may publish but not read.
    assert _produce(k.client("gateway")) is None
    _, err = _consume(k.client("gateway"), "eod-probe-gw", 1, assign=True)
    assert err is not None and err.code() in (KafkaError.TOPIC_AUTHORIZATION_FAILED,
                                              KafkaError.GROUP_AUTHORIZATION_FAILED)

    # Settlement reads the day by assignment (source chooser, Spark) and cannot publish.
    n, err = _consume(k.client("settlement"), f"eod-probe-{uuid.uuid4().hex}", day,
                      assign=True)
    assert err is None and n >= day
    assert _produce(k.client("settlement")).code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    # A small day read by the close's own process (settlement.spark.smallday), as itself.
    from settlement.spark.smallday import fetch_ranges

    as_settlement = k.settings.model_copy(update={
        "kafka_sasl_username": "settlement", "kafka_sasl_password": k.passwords["settlement"]})
    got = fetch_ranges(as_settlement, {p: (0, 1) for p in range(6)}, timeout=20)
    assert sum(b.num_rows for b in got.values()) == 6


def test_grant_arguments_are_checked() -> None:
    assert Grant.parse("site-a:site-a:PW") == Grant("site-a", "site-a", "PW")
    assert Grant.parse("settlement:settlement") == Grant("settlement", "settlement", None)
    for bad in ("site-a", "site:x:PW", "root:x:PW", "site-b::PW", "site-b:a b:PW", "gateway:a:b:c"):
        with pytest.raises(ConfigError):
            Grant.parse(bad)
    os.environ.pop("SETTLE_TEST_UNSET_PW", None)
    with pytest.raises(ConfigError, match="SETTLE_TEST_UNSET_PW"):
        Grant.parse("site-a:site-a:SETTLE_TEST_UNSET_PW").password()


def test_only_the_gateway_may_write() -> None:
    from confluent_kafka.admin import AclOperation

    for role in ("site-a", "site-b", "settlement"):
        ops = {b.operation for b in role_acls(role, "u", "trades")}
        assert AclOperation.WRITE not in ops and AclOperation.READ in ops
    assert AclOperation.WRITE in {b.operation for b in role_acls("gateway", "g", "trades")}
    assert AclOperation.READ not in {b.operation for b in role_acls("gateway", "g", "trades")}


def test_embedded_broker_rejects_unsupported_security() -> None:
    with pytest.raises(ConfigError, match="SASL_PLAINTEXT"):
        _ = Settings(kafka_security_protocol="SASL_SSL", kafka_sasl_username="a",
                     kafka_sasl_password="b").embedded_sasl
    with pytest.raises(ConfigError, match="SETTLE_KAFKA_SASL_PASSWORD"):
        _ = Settings(kafka_security_protocol="SASL_PLAINTEXT", kafka_sasl_username="a",
                     kafka_sasl_password='has"quote').embedded_sasl


def test_no_secret_on_a_command_line_and_secret_files_are_private(
        secure_kafka: SecureKafka) -> None:
    k = secure_kafka
    # The broker's own process was seen (and its storage format before it, briefly).
    assert any("kafka.Kafka" in line for line in k.processes)
    assert any("format.args" in line for line in k.processes)
    for line in k.processes:
        assert k.passwords["admin"] not in line, line[:300]
    node = EmbeddedKafka(k.settings).nodes()[0]
    assert k.passwords["admin"] in node.config_path.read_text()
    assert node.config_path.stat().st_mode & 0o777 == 0o600
    assert not list(node.root.glob("*.args"))  # the format's argfile is gone


def test_spark_logs_in_with_a_password_holding_jaas_metacharacters(
        granted: SecureKafka, spark: Any) -> None:  # noqa: F811
    from settlement.spark.io import kafka_options

    k = granted
    settle(["simulate", "--date", "2026-11-21", "--trades", "50", "--seed", "4"],
           k.env_as("gateway"), timeout=120)
    as_settlement = k.settings.model_copy(update={
        "kafka_sasl_username": "settlement", "kafka_sasl_password": k.passwords["settlement"]})
    opts = kafka_options(as_settlement)
    n = (spark.read.format("kafka").options(**opts)
         .option("subscribe", "trades").option("kafka.isolation.level", "read_committed")
         .load().count())
    assert n >= 50 + 6
    # The broker does check the password (a wrong one is refused), so the read above got the
    # metacharacter-laden password through intact: the escaping is what made it work.
    bad = kafka_options(as_settlement.model_copy(update={"kafka_sasl_password": "nope"}))
    with pytest.raises(Exception, match="(?i)authentication"):
        (spark.read.format("kafka").options(**bad).option("subscribe", "trades")
         .option("kafka.request.timeout.ms", "8000")
         .option("kafka.default.api.timeout.ms", "8000").load().count())


def test_the_default_embedded_services_authenticate_every_client(services: Settings) -> None:
    """The shared services `make test` starts with no security setting at all: SCRAM by
    default (PLAINTEXT is an explicit choice), the admin's credentials made on first start."""
    assert services.kafka_security_protocol is None and services.embedded_sasl
    plain = {"bootstrap.servers": services.bootstrap(), "log_level": 0}
    ok, _ = _metadata_errors(plain)
    assert not ok, "an unauthenticated client got metadata from the default embedded broker"
    ok, errors = _metadata_errors({**services.kafka_client_config(), "log_level": 0})
    assert ok, errors
    assert stat.S_IMODE(services.kafka_credentials_file.stat().st_mode) == 0o600
