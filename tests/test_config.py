"""Configuration errors name the variable and what it expects."""

from __future__ import annotations

import pytest

from settlement.config import ConfigError, check_date, load_settings


def test_defaults_are_embedded(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("SETTLE_KAFKA_BOOTSTRAP", "SETTLE_PG_DSN", "SETTLE_LEDGER_A_DSN"):
        monkeypatch.delenv(var, raising=False)
    s = load_settings(kafka_port=19092, pg_port=15432, kafka_brokers=1)
    assert s.embedded_kafka
    assert s.bootstrap() == "127.0.0.1:19092"
    assert s.bootstrap(3) == "127.0.0.1:19092,127.0.0.1:19093,127.0.0.1:19094"
    assert s.ledger_dsns()["shared"].split("?")[0].endswith(":15432/ledger_shared")
    assert s.site_ledger("a", "separate") == "a"
    assert s.site_ledger("a", "shared") == "shared"


def test_driver_memory_is_a_jvm_size() -> None:
    assert load_settings().spark_driver_memory == "2g"
    assert load_settings(spark_driver_memory=" 6G ").spark_driver_memory == "6g"


def test_external_services(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SETTLE_KAFKA_BOOTSTRAP", "k1:9092, k2:9092")
    monkeypatch.setenv("SETTLE_PG_DSN", "postgresql://u:p@db:5432/settlement")
    monkeypatch.setenv("SETTLE_LEDGER_A_DSN", "postgresql://u:p@db-a:5432/ledger")
    s = load_settings()
    assert not s.embedded_kafka
    assert s.bootstrap() == "k1:9092,k2:9092"
    assert s.settlement_dsn == "postgresql://u:p@db:5432/settlement"
    assert s.ledger_dsn("a") == "postgresql://u:p@db-a:5432/ledger"


@pytest.mark.parametrize(
    ("var", "value", "message"),
    [
        ("SETTLE_KAFKA_BOOTSTRAP", "localhost", "SETTLE_KAFKA_BOOTSTRAP: expected host:port"),
        ("SETTLE_PG_DSN", "mysql://x/y", "SETTLE_PG_DSN: expected a URL like postgresql://"),
        ("SETTLE_LEDGER_B_DSN", "db-b", "SETTLE_LEDGER_B_DSN: expected a URL"),
        ("SETTLE_KAFKA_BROKERS", "2", "SETTLE_KAFKA_BROKERS: expected 1 or 3"),
        ("SETTLE_PG_PORT", "99", "SETTLE_PG_PORT"),
        ("SETTLE_PARTITIONS", "many", "SETTLE_PARTITIONS"),
        ("SETTLE_SPARK_DRIVER_MEMORY", "lots", "SETTLE_SPARK_DRIVER_MEMORY: expected a JVM"),
        ("SETTLE_SPARK_DRIVER_MEMORY", "6 GB", "SETTLE_SPARK_DRIVER_MEMORY: expected a JVM"),
    ],
)
def test_bad_values_name_the_setting(monkeypatch: pytest.MonkeyPatch, var: str, value: str,
                                     message: str) -> None:
    monkeypatch.setenv(var, value)
    with pytest.raises(ConfigError, match=message):
        load_settings()


def test_sasl_needs_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("SETTLE_KAFKA_SECURITY_PROTOCOL", "SASL_PLAINTEXT")
    monkeypatch.setenv("SETTLE_KAFKA_BOOTSTRAP", "k1:9092")  # a cluster of the deployment's
    monkeypatch.setenv("SETTLE_STATE_DIR", str(tmp_path))  # no embedded credentials there
    with pytest.raises(ConfigError, match="SETTLE_KAFKA_SASL_USERNAME"):
        load_settings().kafka_client_config()


def test_kafka_authenticates_by_default_and_plaintext_is_an_explicit_choice(
        monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    import stat

    from settlement.config import Settings

    for var in ("PROTOCOL", "SASL_USERNAME", "SASL_PASSWORD"):
        monkeypatch.delenv(f"SETTLE_KAFKA_{'SECURITY_' if var == 'PROTOCOL' else ''}{var}",
                           raising=False)
    from settlement.errors import ServiceError

    s = Settings(state_dir=tmp_path)
    assert s.kafka_protocol == "SASL_PLAINTEXT" and s.embedded_sasl
    with pytest.raises(ServiceError, match="settle services up"):
        s.kafka_client_config()
    user, password = s.embedded_kafka_admin()  # what the broker's first start does
    assert user == "admin" and len(password) == 48
    assert stat.S_IMODE(s.kafka_credentials_file.stat().st_mode) == 0o600
    conf = Settings(state_dir=tmp_path).kafka_client_config()
    assert (conf["security.protocol"], conf["sasl.username"], conf["sasl.password"]) == \
        ("SASL_PLAINTEXT", "admin", password)
    assert Settings(state_dir=tmp_path).embedded_kafka_admin() == (user, password)  # kept
    plain = Settings(state_dir=tmp_path, kafka_security_protocol="PLAINTEXT")
    assert not plain.embedded_sasl
    assert plain.kafka_client_config()["security.protocol"] == "PLAINTEXT"
    assert "sasl.username" not in plain.kafka_client_config()
    with pytest.raises(ConfigError, match="set both"):
        _ = Settings(state_dir=tmp_path, kafka_sasl_username="admin").embedded_sasl


@pytest.mark.parametrize("bad", ["2026-1-1", "2026-02-30", "tomorrow"])
def test_bad_dates(bad: str) -> None:
    with pytest.raises(ConfigError, match="--date"):
        check_date(bad)


def test_embedded_dsns_name_each_components_user_and_no_password() -> None:
    from urllib.parse import unquote, urlsplit

    from settlement.config import EMBEDDED_USERS

    s = load_settings(pg_port=15432, pg_db_prefix="t1_")
    for component, user in EMBEDDED_USERS.items():
        url = urlsplit(s.for_component(component).ledger_dsn("a"))  # type: ignore[arg-type]
        assert (url.username, url.password, url.path) == (user, None, "/t1_ledger_a")
        assert unquote(url.query) == f"passfile={s.component_passfile(component)}"  # type: ignore[arg-type]
        assert s.component_passfile(component) != s.pg_passfile  # type: ignore[arg-type]
    assert s.for_component("admin") is s  # the default: no copy
    with pytest.raises(ConfigError, match="unknown component"):
        s.for_component("root")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="SETTLE_PG_DB_PREFIX"):
        load_settings(pg_db_prefix="x; drop")


def test_a_refused_dsn_is_named_without_its_password(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SETTLE_PG_DSN", "mysql://eve:hunter2-secret@db/x")
    monkeypatch.setenv("SETTLE_KAFKA_SASL_PASSWORD", "")
    with pytest.raises(ConfigError) as err:
        load_settings()
    assert "SETTLE_PG_DSN" in str(err.value) and "eve:***@db" in str(err.value)
    assert "hunter2-secret" not in str(err.value)


def test_jaas_values_are_escaped() -> None:
    from settlement.config import jaas_login, jaas_quote

    assert jaas_quote('a"b\\c') == '"a\\"b\\\\c"'
    login = jaas_login("SCRAM-SHA-512", "u", 'p" username="admin')
    assert login.endswith('password="p\\" username=\\"admin";')


def test_crash_points_are_a_test_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    """SETTLE_CRASH_AT names a listed point and action, and a production configuration
    (drills off) refuses it whole."""
    monkeypatch.setenv("SETTLE_CRASH_AT", "publish.after_commit:kill")
    assert load_settings().crash_at == "publish.after_commit:kill"
    monkeypatch.setenv("SETTLE_DRILLS_ENABLED", "false")
    with pytest.raises(ConfigError, match="SETTLE_CRASH_AT is a test setting"):
        load_settings()
    monkeypatch.delenv("SETTLE_DRILLS_ENABLED")
    monkeypatch.setenv("SETTLE_CRASH_AT", "publish.after_comit:kill")
    with pytest.raises(ConfigError, match="no crash point 'publish.after_comit'.*close.leased"):
        load_settings()
    monkeypatch.setenv("SETTLE_CRASH_AT", "close.staged:explode")
    with pytest.raises(ConfigError, match="action 'explode'"):
        load_settings()
