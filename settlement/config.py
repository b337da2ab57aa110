"""Configuration: environment variables prefixed ``SETTLE_`` with embedded defaults.

Leaving ``SETTLE_KAFKA_BOOTSTRAP`` / ``SETTLE_PG_DSN`` / ``SETTLE_LEDGER_*_DSN`` unset means
"use the embedded services that ``settle services up`` runs on loopback"; setting them
points every command at external services instead.
"""

from __future__ import annotations

import datetime as dt
import math
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from settlement import crashpoints

PACKAGE_DIR = Path(__file__).resolve().parent
# The checkout (source tree) when running from one; for an installed wheel this is the
# site-packages folder, so use ``resource_dir`` and ``running_from_checkout`` rather than
# building paths on it.
REPO_ROOT = PACKAGE_DIR.parent
# Where the wheel carries the top-level ``sql/`` and ``gx/`` folders (pyproject.toml,
# [tool.hatch.build.targets.wheel.sources]).
PACKAGED_RESOURCES = PACKAGE_DIR / "_resources"
RESOURCES = ("sql", "gx")


def running_from_checkout() -> bool:
    """True when ``settlement`` is imported from the source tree (plain or editable
    install): the project's pyproject.toml sits next to the package. False for an
    installed wheel, whose parent folder is site-packages."""
    return (REPO_ROOT / "pyproject.toml").is_file() and (REPO_ROOT / "sql").is_dir()


def resource_dir(name: str) -> Path:
    """A data folder that ships with the code (``sql`` or ``gx``): the checkout's top-level
    folder when running from a checkout, else the copy packaged inside the wheel."""
    if name not in RESOURCES:
        raise ValueError(f"unknown resource folder {name!r}: expected one of {RESOURCES}")
    top = REPO_ROOT / name
    if running_from_checkout() and top.is_dir():
        return top
    return PACKAGED_RESOURCES / name


def _user_dir(xdg_var: str, fallback: str, *parts: str) -> Path:
    """An XDG base directory (``$XDG_STATE_HOME`` etc.) for an installed wheel's runtime
    files; never raises, so importing the package cannot fail on an odd environment."""
    base = os.environ.get(xdg_var)
    if not base:
        try:
            base = str(Path.home() / fallback)
        except (RuntimeError, KeyError):  # no HOME and no passwd entry
            base = str(Path.cwd() / ".settle")
    return Path(base).joinpath("settle", *parts)


def _default_state_dir() -> Path:
    """`.state/` in a checkout; installed: `$XDG_STATE_HOME/settle` (`~/.local/state/settle`)"""
    if running_from_checkout():
        return REPO_ROOT / ".state"
    return _user_dir("XDG_STATE_HOME", ".local/state")


def _default_jars_dir() -> Path:
    """`.cache/jars/` in a checkout; installed: `~/.cache/settle/jars`"""
    if running_from_checkout():
        return REPO_ROOT / ".cache" / "jars"
    return _user_dir("XDG_CACHE_HOME", ".cache", "jars")


def _default_reports_dir() -> Path:
    """`reports/` in a checkout; installed: `~/.local/share/settle/reports`"""
    if running_from_checkout():
        return REPO_ROOT / "reports"
    return _user_dir("XDG_DATA_HOME", ".local/share", "reports")


_HOSTPORT = re.compile(r"^[A-Za-z0-9._\-\[\]:]+:\d{1,5}$")
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")

LEDGERS = ("a", "b", "shared")

# Who logs in to PostgreSQL. Every component has its own login user, granted exactly the
# group role its work needs (sql/migrations/0003_roles.sql and 0007); the admin runs
# migrations and setup only. A deployment names the users in its DSNs (docker-compose.yml
# gives each service its own); the embedded server creates the users below, with random
# passwords kept in a 0600 pgpass file under the state directory.
# The monitoring login is the PostgreSQL exporter's (server statistics and the close's runs,
# sql/migrations/0015): no process of the application logs in as it, but the embedded server
# creates it like the others, so its grants are tested as theirs are.
Component = Literal["admin", "site_a", "site_b", "settlement", "auditor", "monitor"]
COMPONENTS: tuple[Component, ...] = ("admin", "site_a", "site_b", "settlement", "auditor",
                                     "monitor")
COMPONENT_GROUPS: dict[str, str] = {"site_a": "settle_site", "site_b": "settle_site",
                                    "settlement": "settle_settlement",
                                    "auditor": "settle_auditor", "monitor": "settle_monitoring"}
EMBEDDED_USERS: dict[str, str] = {"admin": "settle", "site_a": "settle_site_a",
                                  "site_b": "settle_site_b", "settlement": "settle_eod",
                                  "auditor": "settle_audit", "monitor": "settle_monitor"}
_DB_PREFIX = re.compile(r"^[a-z0-9_]{0,40}$")


_SASL_SAFE = re.compile(r"^[A-Za-z0-9._\-+/@%^*~]{1,128}$")


class ConfigError(ValueError):
    """A configuration value is wrong; the message names the variable and the fix."""


@dataclass(frozen=True)
class CompressedDays:
    """A test calendar for soaks (``SETTLE_EOD_COMPRESSED=BASE@ANCHOR/MINUTES``): a close every
    ``minutes`` minutes, the one in the slot starting ``k`` slots after ``anchor`` settling the
    ``k``-th weekday from ``base``. Three trading days then pass in three slots."""

    base: dt.date
    anchor: dt.datetime  # aware
    minutes: int

    SHAPE = "YYYY-MM-DD@ISO-8601-TIME/MINUTES, e.g. 2026-04-01@2026-11-25T16:00:00+00:00/4"

    @classmethod
    def parse(cls, text: str) -> CompressedDays:
        try:
            base, rest = text.split("@", 1)
            anchor, minutes = rest.rsplit("/", 1)
            out = cls(dt.date.fromisoformat(base), dt.datetime.fromisoformat(anchor),
                      int(minutes))
        except ValueError:
            raise ValueError(f"expected {cls.SHAPE}") from None
        if out.anchor.tzinfo is None:
            raise ValueError(f"the anchor needs a UTC offset: {cls.SHAPE}")
        if not (1 <= out.minutes <= 60 and 60 % out.minutes == 0):
            raise ValueError("MINUTES must divide 60 (the schedule is the cron */MINUTES)")
        return out

    @property
    def cron(self) -> str:
        return f"*/{self.minutes} * * * *"

    def trade_date(self, when: dt.datetime) -> str:
        """The trading day the slot holding ``when`` settles (weekdays from ``base``)."""
        k = math.floor((when - self.anchor).total_seconds() / (self.minutes * 60))
        day = self.base
        while day.weekday() >= 5:
            day += dt.timedelta(days=1)
        step = 1 if k >= 0 else -1
        for _ in range(abs(k)):
            day += dt.timedelta(days=step)
            while day.weekday() >= 5:
                day += dt.timedelta(days=step)
        return day.isoformat()


# Settings are grouped by concern: one class per group, each with the meaning of every value
# (the `description`, which docs/reference/configuration.md is generated from by `make docs`)
# and, in comments, the reasons. `Settings` joins them and holds the checks that span groups.
class FilesSettings(BaseModel):
    """Files and folders."""

    # Defaults: under the checkout when running from one; for an installed wheel, the user's
    # XDG directories (~/.local/state/settle, ~/.cache/settle/jars, ~/.local/share/settle/reports).
    state_dir: Path = Field(default_factory=_default_state_dir,
                            description="embedded services' data and logs")
    jars_dir: Path = Field(default_factory=_default_jars_dir, description="Maven-resolved jars")
    reports_dir: Path = Field(default_factory=_default_reports_dir,
                              description="audit reports and instruction files")
    archive_dir: Path | None = Field(None, description="where `settle archive` writes a day's "
                                     "ledger rows as Parquet; unset: <reports_dir>/../archive "
                                     "(a checkout's archive/)")
    # Unset: the checkout's gx/, or for an installed wheel <state_dir>/gx, seeded from the
    # packaged copy on first use (GX writes results and data sources into its project folder).
    gx_dir: Path | None = Field(None, description="the Great Expectations project (the folder "
                                "holding great_expectations.yml); unset: the packaged one")


class KafkaSettings(BaseModel):
    """Kafka."""

    kafka_bootstrap: str | None = Field(None, description="host:port[,host:port...] of the "
                                        "brokers; unset: the embedded KRaft cluster on "
                                        "loopback")
    kafka_port: int = Field(19092, ge=1024, le=65000,
                            description="the embedded cluster's first broker port")
    kafka_controller_port: int = Field(19192, ge=1024, le=65000,
                                       description="the embedded cluster's first controller "
                                                   "port")
    kafka_brokers: int = Field(1, description="embedded cluster size: 1 or 3")
    kafka_heap: str = Field("768m", description="each embedded broker's JVM heap")
    topic: str = Field("trades", description="the trades topic")
    partitions: int = Field(6, ge=1, le=1000, description="the topic's partitions when the "
                            "project creates it")
    # Every client authenticates unless PLAINTEXT is chosen explicitly; the embedded broker's
    # admin credentials are made on its first start.
    kafka_security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] | None \
        = Field(None, description="PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL; unset: "
                "SASL_PLAINTEXT (SCRAM)")
    kafka_sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] = Field(
        "SCRAM-SHA-512", description="PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512")
    kafka_sasl_username: str | None = Field(None, description="this component's Kafka user; "
                                            "unset on the embedded cluster: its own")
    kafka_sasl_password: str | None = Field(None, description="that user's password (secret)")
    kafka_ssl_ca_location: str | None = Field(None, description="the CA file the brokers' "
                                              "certificates are checked against")


class PostgresSettings(BaseModel):
    """PostgreSQL."""

    pg_port: int = Field(15432, ge=1024, le=65000, description="the embedded server's port")
    # A private namespace (demo, drills, tests) on the embedded server whose DSNs still carry
    # each component's own user.
    pg_db_prefix: str = Field("", description="prefixes the embedded databases' names")
    # The code of each component sets it (a site, the end of day, `settle status`); explicit
    # DSNs are used as given (the deployment chose their users).
    component: Component = Field("admin", description="which component this process is: "
                                 "chooses the embedded server's login user")
    pg_dsn: str | None = Field(None, description="the settlement database; unset: the "
                               "embedded server's")
    ledger_a_dsn: str | None = Field(None, description="site A's ledger; unset: embedded")
    ledger_b_dsn: str | None = Field(None, description="site B's ledger; unset: embedded")
    ledger_shared_dsn: str | None = Field(None, description="the shared scheme's ledger; "
                                          "unset: embedded")


class SiteSettings(BaseModel):
    """Consumer sites."""

    batch_size: int = Field(20_000, ge=1, le=1_000_000,
                            description="trades a site commits to its ledger at once")
    max_message_bytes: int = Field(16_384, ge=256, description="a larger message is "
                                   "quarantined as a dead letter")
    session_timeout_ms: int = Field(6_000, ge=1_000, le=300_000,
                                    description="the consumer group's session timeout")
    heartbeat_interval_ms: int = Field(1_000, ge=100, le=60_000,
                                       description="the consumer group's heartbeat")
    # Ledger sessions wait boundedly, so a frozen peer can delay a site but never block it:
    # a lock wait (the offset rows a paused zombie holds) gives up and is retried, a statement
    # is cancelled, and a session idle inside a transaction is ended by the server.
    ledger_lock_timeout_ms: int = Field(2_000, ge=100, le=600_000,
                                        description="a ledger lock wait gives up (retried)")
    ledger_statement_timeout_ms: int = Field(30_000, ge=1_000, le=3_600_000,
                                             description="a ledger statement is cancelled")
    ledger_idle_timeout_ms: int = Field(5_000, ge=1_000, le=600_000,
                                        description="a ledger session idle inside a "
                                                    "transaction is ended")
    metrics_port: int = Field(0, ge=0, le=65535, description="Prometheus metrics port; 0: no "
                              "metrics server (two sites on one host need two ports)")
    # Every interface (Prometheus scrapes from another host or container), or one address (the
    # local stack's host networking: 127.0.0.1).
    metrics_address: str = Field("0.0.0.0", description="where the metrics server listens")
    # docker-compose.yml mounts each site's pair; neither serves plain HTTP (embedded runs).
    metrics_tls_cert: str = Field("", description="the metrics server's certificate (PEM); "
                                  "with metrics_tls_key, HTTPS")
    metrics_tls_key: str = Field("", description="the metrics server's key (PEM)")
    stats_interval_seconds: float = Field(30.0, ge=0, description="a one-line stats summary "
                                          "this often; 0: never")
    heartbeat_retention_days: int = Field(7, ge=0, le=3650, description="older ledger "
                                          "heartbeats are deleted hourly; 0: keep all")


class SparkSettings(BaseModel):
    """Spark: the close."""

    spark_master: str = Field("local[2]", description="local[N], spark://, k8s:// or yarn")
    # Sizing it to the day was measured and left (docs/benchmarks.md): a 10M day closed no
    # faster with 6g than with 2g.
    spark_driver_memory: str = Field("2g", description="the close's driver JVM heap (a local "
                                     "master caches the day there)")
    # Each of the next three cut a small day's close by seconds (docs/benchmarks.md).
    spark_class_archive: bool = Field(True, description="map an archive of the classes a close "
                                      "loads (built by the first close)")
    spark_small_day_rows: int = Field(50_000, ge=0, description="a day of at most this many "
                                      "rows is a small day: quick compiler, interpreted "
                                      "expressions; 0: never")
    spark_quick_jit_rows: int = Field(1_000_000, ge=0, description="a close of a day of at "
                                      "most this many rows runs the JIT's quick compiler "
                                      "alone; 0: only a small day")
    spark_small_day_driver_read: bool = Field(True, description="a small day is read by the "
                                              "driver and handed to Spark in memory")
    # Off, or on a cluster (whose executors may not reach the files the client's settings
    # name), Spark's own Kafka source reads it.
    spark_kafka_worker_read: bool = Field(True, description="a Kafka day on a local master is "
                                          "read by the tasks' Python workers with the sites' "
                                          "client")
    # A partition holding more than plain trades and close markers is the Python workers'
    # still. Off, or without the jar (`make setup` builds it), the workers read it all.
    spark_jvm_classifier: bool = Field(True, description="those tasks read with the Java "
                                       "client and classify in the JVM")
    # Measured slower than the worker so far (docs/benchmarks.md), hence off by default.
    native_trades: bool = Field(False, description="classify canonical plain trades with "
                                "Spark's own Kafka source and expressions")
    # Small and one core each by default, so two fit the embedded cluster on a two-core
    # machine next to Kafka and PostgreSQL.
    spark_executor_memory: str = Field("768m", description="each executor's memory on a "
                                       "cluster")
    spark_executor_cores: int = Field(1, ge=1, le=256, description="each executor's cores on "
                                      "a cluster")
    spark_cores_max: int | None = Field(None, ge=1, description="cores per application")
    spark_master_port: int = Field(17077, ge=1024, le=65000, description="the embedded "
                                   "standalone cluster's master port (`settle services up "
                                   "--spark-cluster`)")
    spark_master_ui_port: int = Field(18088, ge=1024, le=65000, description="its web UI")
    spark_workers: int = Field(2, ge=1, le=8, description="its workers")
    spark_worker_cores: int = Field(1, ge=1, le=64, description="each worker's cores")
    spark_worker_memory: str = Field("1g", description="each worker's memory")
    # spark-submit turns a remote driver's environment into --conf arguments, visible in `ps`,
    # the log and Spark's UI: mount a pgpass file into the driver (a Kubernetes secret, a YARN
    # local resource) and name its path there.
    spark_pgpassfile: str | None = Field(None, description="pgpass file path inside a remote "
                                         "Spark driver")


class CloseSettings(BaseModel):
    """The close: one per trade date (settlement/eod/lease.py)."""

    # A holder renews every third of the lease; the DAG's settle task allows the wait plus an
    # hour (orchestration.tasks.settle_timeout).
    close_lease_seconds: float = Field(30.0, ge=3, le=3600, description="a close that stops "
                                       "renewing its lease this long (paused, its host lost) "
                                       "is taken over")
    site_name: str | None = Field(None, max_length=64, description="the site this close runs "
                                  "at (a, b...): named in its lease and in `settle status`")
    close_wait_seconds: float = Field(1800.0, ge=0, le=24 * 3600, description="a second close "
                                      "waits this long for the first, then reports its "
                                      "outcome (or settles the date when the first crashed)")


class InstructionSettings(BaseModel):
    """Settlement instructions (settlement.instructions)."""

    # The settlement days are the exchange's sessions (exchange_calendar) less the bank
    # holidays on which settlement is closed although the exchange trades.
    settlement_cycle: str = Field("T+1", description="T+N, N settlement days (0-5)")
    settlement_holidays: str = Field("us-banks", description="'us-banks' (Columbus Day and "
                                     "Veterans Day), 'none', plus any YYYY-MM-DD dates, "
                                     "comma-separated")
    settlement_currency: str = Field("USD", description="ISO 4217 code of the settlement "
                                     "amounts")
    fails_alert_share: float = Field(0.05, ge=0, le=1, description="alert when fails exceed "
                                     "this share of a settlement date's instructions")
    # Which industry model the instructions follow (settlement.instructions): a clearing
    # house's continuous net settlement, or instructions to a custodian or CSD participant.
    instructions_mode: Literal["ccp", "custodian"] = Field(
        "ccp", description="ccp: net obligations against the clearing house, fails carried "
        "into the next net; custodian: one sese.023 per obligation under a head.001 header, "
        "fails stay pending, a re-close cancels (sese.020) and re-instructs")
    custodian_sender_bic: str = Field("SETLUS33XXX", description="custodian mode: the BIC "
                                      "sending the instructions (head.001 From)")
    custodian_receiver_bic: str = Field("CUSTUS33XXX", description="custodian mode: the "
                                        "custodian's or CSD's BIC (head.001 To)")
    depository_bic: str = Field("DTCYUS33", description="custodian mode: the place of "
                                "settlement (the depository's BIC, DTC: DTCYUS33)")
    clearing_house_bic: str = Field("NSCCUS33", description="custodian mode: the counterparty "
                                    "the net obligations face (the clearing house's BIC)")
    fail_close_out_days: int = Field(4, ge=0, le=30, description="custodian mode: settlement "
                                     "days after its intended date by which a pending fail "
                                     "must be closed out (bought in)")


class OperationsSettings(BaseModel):
    """Operations in Airflow: the trading calendar, alerts, drills (settlement.orchestration)."""

    exchange_calendar: str = Field("XNYS", description="exchange-calendars code whose "
                                   "sessions eod_settlement runs on (XNYS, XLON, XTKS...)")
    eod_cron: str = Field("", description="a cron expression replacing the calendar "
                          "(weekdays regardless of holidays), or none: manual runs only")
    eod_compressed: str = Field("", description="soaks only: BASE@ANCHOR/MINUTES, a close "
                                "every MINUTES minutes, each settling the next weekday from "
                                "BASE (overrides the calendar and eod_cron)")
    eod_after_close_minutes: int = Field(30, ge=0, le=720,
                                         description="run eod_settlement this long after "
                                                     "each session's close")
    eod_cutoff_minutes: int = Field(180, ge=1, le=24 * 60,
                                    description="alert when a run has not settled this long "
                                                "after it was queued")
    alert_email: str | None = Field(None, description="comma-separated alert recipients "
                                                      "(sent through the smtp_default "
                                                      "Airflow connection)")
    alert_webhook: str | None = Field(None, description="URL an alert is POSTed to as JSON "
                                      "(secret)")
    alert_smtp_conn_id: str = Field("smtp_default", description="the Airflow connection alert "
                                    "mail goes through")
    # Production (docker-compose.yml) turns it off so nobody fault-injects against live sites
    # from the Airflow UI.
    drills_enabled: bool = Field(True, description="the failover_drill DAG and drill "
                                 "commands may run")
    # A day's ledger rows stay this long; `settle archive` then moves them to Parquet. Kafka's
    # retention is the other bound on settling a day again from the log.
    retention_days: int = Field(400, ge=0, le=36500, description="`settle archive` moves a "
                                "published day's ledger rows older than this many days to "
                                "its archive")
    crash_at: str = Field("", description="tests only: POINT:kill|pause, a crash point "
                                          "(settlement.crashpoints); refused in production "
                                          "(SETTLE_DRILLS_ENABLED=false)")


SETTING_GROUPS: tuple[type[BaseModel], ...] = (
    FilesSettings, KafkaSettings, PostgresSettings, SiteSettings, SparkSettings, CloseSettings,
    InstructionSettings, OperationsSettings,
)


class Settings(OperationsSettings, InstructionSettings, CloseSettings, SparkSettings,
               SiteSettings, PostgresSettings, KafkaSettings, FilesSettings, BaseSettings):
    """Every setting, read from ``SETTLE_<NAME>`` environment variables."""

    model_config = SettingsConfigDict(env_prefix="SETTLE_", extra="ignore")
    @field_validator("kafka_bootstrap")
    @classmethod
    def _bootstrap(cls, v: str | None) -> str | None:
        if v is None or v == "":
            return None
        hosts = [h.strip() for h in v.split(",")]
        bad = [h for h in hosts if not _HOSTPORT.match(h)]
        if bad:
            raise ValueError(f"expected host:port[,host:port...], got {bad[0]!r}")
        return ",".join(hosts)

    @field_validator("pg_dsn", "ledger_a_dsn", "ledger_b_dsn", "ledger_shared_dsn")
    @classmethod
    def _dsn(cls, v: str | None) -> str | None:
        if v is None or v == "":
            return None
        if not v.startswith(("postgresql://", "postgres://")):
            # The value may hold a password: the message shows it redacted (_explain).
            raise ValueError("expected a URL like postgresql://user@host:5432/dbname")
        return v

    @field_validator("pg_db_prefix")
    @classmethod
    def _db_prefix(cls, v: str) -> str:
        if not _DB_PREFIX.match(v):
            raise ValueError("expected up to 40 lower-case letters, digits or '_'")
        return v

    @field_validator("alert_email", "alert_webhook", "kafka_security_protocol", mode="before")
    @classmethod
    def _blank_is_unset(cls, v: object) -> object:
        return None if v == "" else v

    @field_validator("alert_webhook")
    @classmethod
    def _webhook(cls, v: str | None) -> str | None:
        # The URL is a credential (webhook services put the token in its path): the message
        # never repeats it.
        if v is not None and not v.startswith(("http://", "https://")):
            raise ValueError("expected an http(s) URL (the value is not shown: it is a secret)")
        return v

    @field_validator("gx_dir", mode="before")
    @classmethod
    def _gx_dir(cls, v: object) -> object:
        return None if v == "" else v

    @field_validator("spark_driver_memory")
    @classmethod
    def _driver_memory(cls, v: str) -> str:
        v = v.strip().lower()
        if not re.fullmatch(r"[1-9][0-9]*[kmgt]", v):
            raise ValueError("expected a JVM memory size such as 2g or 6144m")
        return v

    @field_validator("settlement_cycle")
    @classmethod
    def _cycle(cls, v: str) -> str:
        if not re.fullmatch(r"T\+[0-5]", v.strip()):
            raise ValueError("expected T+N with N from 0 to 5, e.g. T+1 (US equities since "
                             "May 2024) or T+2")
        return v.strip()

    @field_validator("settlement_holidays")
    @classmethod
    def _holidays(cls, v: str) -> str:
        for part in (x.strip() for x in v.split(",") if x.strip()):
            if part in ("us-banks", "none"):
                continue
            try:
                dt.date.fromisoformat(part)
            except ValueError:
                raise ValueError(f"{part!r} is neither 'us-banks', 'none' nor a YYYY-MM-DD "
                                 "date") from None
        return v

    @field_validator("custodian_sender_bic", "custodian_receiver_bic", "depository_bic",
                     "clearing_house_bic")
    @classmethod
    def _bic(cls, v: str) -> str:
        from stdnum import bic
        from stdnum.exceptions import ValidationError as BicError

        try:
            return str(bic.validate(v))
        except BicError as e:
            raise ValueError(f"{e.message.rstrip('.').lower()}: expected a BIC of 8 or 11 "
                             "characters, e.g. DTCYUS33") from None

    @field_validator("settlement_currency")
    @classmethod
    def _currency(cls, v: str) -> str:
        if not re.fullmatch(r"[A-Z]{3}", v):
            raise ValueError("expected an ISO 4217 code of three capital letters, e.g. USD")
        return v

    @field_validator("eod_compressed")
    @classmethod
    def _compressed(cls, v: str) -> str:
        if v.strip():
            CompressedDays.parse(v.strip())
        return v.strip()

    @field_validator("kafka_brokers")
    @classmethod
    def _brokers(cls, v: int) -> int:
        if v not in (1, 3):
            raise ValueError(f"expected 1 or 3, got {v}")
        return v

    @field_validator("crash_at")
    @classmethod
    def _crash_at(cls, v: str) -> str:
        crashpoints.parse(v.strip())
        return v.strip()

    @model_validator(mode="after")
    def _metrics_tls_is_a_pair(self) -> Settings:
        if bool(self.metrics_tls_cert) != bool(self.metrics_tls_key):
            raise ValueError("SETTLE_METRICS_TLS_CERT and SETTLE_METRICS_TLS_KEY go together "
                             "(the metrics server's certificate and its key): set both, or "
                             "neither for plain HTTP")
        return self

    @model_validator(mode="after")
    def _no_crash_points_in_production(self) -> Settings:
        if self.crash_at and not self.drills_enabled:
            raise ValueError("SETTLE_CRASH_AT is a test setting: a production configuration "
                             "(SETTLE_DRILLS_ENABLED=false) refuses it; unset it")
        return self

    # -- derived values -------------------------------------------------------------
    @property
    def embedded_kafka(self) -> bool:
        return self.kafka_bootstrap is None

    @property
    def kafka_protocol(self) -> str:
        """The security protocol in force: SASL_PLAINTEXT unless one was chosen."""
        return self.kafka_security_protocol or "SASL_PLAINTEXT"

    @property
    def kafka_credentials_file(self) -> Path:
        """The embedded broker's admin credentials (user, password), made on its first start."""
        return self.state_dir / "kafka-admin.credentials"

    def kafka_credentials(self) -> tuple[str, str] | None:
        """Who SASL clients log in as: SETTLE_KAFKA_SASL_USERNAME/PASSWORD, else the embedded
        broker's admin (its credentials file in the state directory), else nobody."""
        if self.kafka_sasl_username and self.kafka_sasl_password:
            return self.kafka_sasl_username, self.kafka_sasl_password
        if self.kafka_credentials_file.exists():
            user, password = self.kafka_credentials_file.read_text().splitlines()[:2]
            return user, password
        return None

    def embedded_kafka_admin(self) -> tuple[str, str]:
        """The embedded broker's super user: the configured one, else ``admin`` with a random
        password kept in ``kafka_credentials_file`` (0600)."""
        found = self.kafka_credentials()
        if found:
            return found
        import secrets

        password = secrets.token_hex(24)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.kafka_credentials_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(f"admin\n{password}\n")
        return "admin", password

    @property
    def embedded_sasl(self) -> bool:
        """The embedded broker authenticates clients (SCRAM) and enforces ACLs: the default.
        Its super user is SETTLE_KAFKA_SASL_USERNAME/PASSWORD if set, else ``admin`` with a
        password made on first start (``kafka_credentials_file``). PLAINTEXT (no
        authentication) only when SETTLE_KAFKA_SECURITY_PROTOCOL=PLAINTEXT says so."""
        if not self.embedded_kafka or self.kafka_protocol == "PLAINTEXT":
            return False
        if self.kafka_protocol != "SASL_PLAINTEXT":
            raise ConfigError(
                f"SETTLE_KAFKA_SECURITY_PROTOCOL={self.kafka_protocol}: the embedded "
                "broker speaks SASL_PLAINTEXT (the default) or PLAINTEXT; for TLS point "
                "SETTLE_KAFKA_BOOTSTRAP at a real cluster"
            )
        if not self.kafka_sasl_mechanism.startswith("SCRAM"):
            raise ConfigError(
                "SETTLE_KAFKA_SASL_MECHANISM: the embedded broker authenticates with "
                "SCRAM-SHA-256 or SCRAM-SHA-512"
            )
        if bool(self.kafka_sasl_username) != bool(self.kafka_sasl_password):
            raise ConfigError("SETTLE_KAFKA_SASL_USERNAME and SETTLE_KAFKA_SASL_PASSWORD: set "
                              "both (the embedded broker's super user) or neither (it makes "
                              "its own admin)")
        for var, value in (("USERNAME", self.kafka_sasl_username),
                           ("PASSWORD", self.kafka_sasl_password)):
            if value and not _SASL_SAFE.match(value):
                raise ConfigError(
                    f"SETTLE_KAFKA_SASL_{var}: the embedded broker needs only letters, digits "
                    "and ._-+/@%^*~ (it is written into the broker's JAAS configuration)"
                )
        return True

    @property
    def gx_project_dir(self) -> Path:
        """Where the GX file context lives; ``validation.run.get_context`` seeds it."""
        if self.gx_dir:
            return self.gx_dir
        if running_from_checkout() and (REPO_ROOT / "gx").is_dir():
            return REPO_ROOT / "gx"
        return self.state_dir / "gx"

    def bootstrap(self, brokers: int | None = None) -> str:
        if self.kafka_bootstrap:
            return self.kafka_bootstrap
        n = brokers or self.kafka_brokers
        return ",".join(f"127.0.0.1:{self.kafka_port + i}" for i in range(n))

    @property
    def spark_cluster_url(self) -> str:
        """The embedded standalone master's URL (for SETTLE_SPARK_MASTER)."""
        return f"spark://127.0.0.1:{self.spark_master_port}"

    def for_component(self, component: Component) -> Settings:
        """These settings as ``component`` sees them: the embedded server's DSNs log in as
        that component's user."""
        if component not in COMPONENTS:
            raise ConfigError(f"unknown component {component!r}: expected one of "
                              f"{', '.join(COMPONENTS)}")
        return self if component == self.component else \
            self.model_copy(update={"component": component})

    @property
    def pg_passfile(self) -> Path:
        """The embedded server's pgpass file (0600): every embedded user's password, for the
        admin and the services' own tooling. Components read only their own
        (``component_passfile``)."""
        return self.state_dir / "secrets" / "pgpass"

    def component_passfile(self, component: Component | None = None) -> Path:
        """The pgpass file (0600) of one component's embedded login: its line only, so a
        site, the Spark driver or the report pages never hold the superuser's password."""
        return self.state_dir / "secrets" / f"pgpass-{component or self.component}"

    def embedded_dsn(self, dbname: str, component: Component | None = None) -> str:
        """A database on the embedded server as ``component`` (default: this one). The
        password stays in the pgpass file, which libpq reads; the DSN carries none, so it
        can be logged and passed to child processes."""
        from urllib.parse import quote

        user = EMBEDDED_USERS[component or self.component]
        return (f"postgresql://{user}@127.0.0.1:{self.pg_port}/{dbname}"
                f"?passfile={quote(str(self.component_passfile(component)))}")

    @property
    def settlement_dsn(self) -> str:
        return self.pg_dsn or self.embedded_dsn(self.pg_db_prefix + "settlement")

    def ledger_dsn(self, ledger: str) -> str:
        if ledger not in LEDGERS:
            raise ConfigError(f"unknown ledger {ledger!r}: expected one of {', '.join(LEDGERS)}")
        explicit = getattr(self, f"ledger_{ledger}_dsn")
        return explicit or self.embedded_dsn(f"{self.pg_db_prefix}ledger_{ledger}")

    def ledger_dsns(self) -> dict[str, str]:
        return {name: self.ledger_dsn(name) for name in LEDGERS}

    def all_dsns(self) -> dict[str, str]:
        return {"settlement": self.settlement_dsn, **self.ledger_dsns()}

    def site_ledger(self, site: str, scheme: str) -> str:
        """Which ledger a site writes: its own in the separate scheme, the shared one else."""
        return site if scheme == "separate" else "shared"

    def sasl_login(self) -> tuple[str, str]:
        """The SASL user and password, or an error that says where they come from."""
        found = self.kafka_credentials()
        if found is None and self.embedded_kafka:
            from settlement.errors import START_SERVICES, ServiceError

            # Made by the broker's first start: without it, nothing was started here.
            raise ServiceError(f"the embedded Kafka was never started with state directory "
                               f"{self.state_dir} (no admin credentials yet): {START_SERVICES}")
        if found is None:
            raise ConfigError(
                f"SETTLE_KAFKA_SECURITY_PROTOCOL is {self.kafka_protocol} (the default is "
                "SASL_PLAINTEXT): set SETTLE_KAFKA_SASL_USERNAME and SETTLE_KAFKA_SASL_PASSWORD, "
                "start the embedded services (`settle services up` makes "
                f"{self.kafka_credentials_file}), or set SETTLE_KAFKA_SECURITY_PROTOCOL=PLAINTEXT "
                "for a cluster without authentication")
        return found

    def kafka_client_config(self) -> dict[str, str]:
        """Connection and security settings shared by producers, consumers and admin."""
        conf: dict[str, str] = {
            "bootstrap.servers": self.bootstrap(),
            "security.protocol": self.kafka_protocol,
            # Failure detection (docs/operations.md): a broker that does not complete a
            # connection within 5 s, or answer a request within 10 s, is given up and another
            # asked (librdkafka's defaults: 30 s and 60 s); keepalives find a silent peer under
            # an idle connection.
            "socket.connection.setup.timeout.ms": "5000",
            "socket.timeout.ms": "10000",
            "socket.keepalive.enable": "true",
        }
        if self.kafka_protocol.startswith("SASL"):
            user, password = self.sasl_login()
            conf["sasl.mechanism"] = self.kafka_sasl_mechanism
            conf["sasl.username"] = user
            conf["sasl.password"] = password
        if self.kafka_ssl_ca_location:
            conf["ssl.ca.location"] = self.kafka_ssl_ca_location
        return conf


def split_grant(text: str, roles: Iterable[str], user: re.Pattern[str], user_rule: str,
                example: str, env_optional: bool = False) -> tuple[str, str, str | None]:
    """A ``--grant ROLE:USER:PASSWORD_ENV`` argument (`settle kafka init`, `settle db
    migrate`, `settle airflow-users`): checked, with an error naming the fix."""
    parts = text.split(":")
    shape = "ROLE:USER[:PASSWORD_ENV]" if env_optional else "ROLE:USER:PASSWORD_ENV"
    if len(parts) not in ((2, 3) if env_optional else (3,)) or not all(parts):
        raise ConfigError(f"--grant {text!r}: expected {shape}, e.g. {example}")
    roles = tuple(roles)
    if parts[0] not in roles:
        raise ConfigError(f"--grant {text!r}: role must be one of {', '.join(roles)}")
    if not user.match(parts[1]):
        raise ConfigError(f"--grant {text!r}: user names are {user_rule}")
    return parts[0], parts[1], parts[2] if len(parts) == 3 else None


def env_password(variable: str, who: str, min_length: int = 1) -> str:
    """A password handed over by naming its environment variable (never on a command line)."""
    value = os.environ.get(variable, "")
    if len(value) < min_length:
        raise ConfigError(f"{variable} (the password of {who}): unset or shorter than "
                          f"{min_length} characters; export it there (e.g. `openssl rand "
                          "-hex 24`)")
    return value


def jaas_quote(value: str) -> str:
    """``value`` as a JAAS quoted string: Kafka's parser (a StreamTokenizer) reads backslash
    escapes inside quotes, so a quote or backslash in a password cannot end the string early
    and inject options."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def jaas_login(mechanism: str, username: str, password: str) -> str:
    """The sasl.jaas.config value of a Java Kafka client (Spark's Kafka source)."""
    module = ("org.apache.kafka.common.security.plain.PlainLoginModule" if mechanism == "PLAIN"
              else "org.apache.kafka.common.security.scram.ScramLoginModule")
    return f"{module} required username={jaas_quote(username)} password={jaas_quote(password)};"


# Settings whose whole value is a secret (not only a URL's password): never shown in errors.
SECRET_FIELDS = frozenset({"alert_webhook"})


def _explain(err: ValidationError) -> str:
    from settlement.errors import redact

    lines = []
    for e in err.errors():
        field = str(e["loc"][0]) if e["loc"] else "?"
        msg = e["msg"].removeprefix("Value error, ")
        # A refused value is shown so the operator sees what was read, never a secret in it:
        # a password field is not shown at all, a URL's password is masked.
        secret = "password" in field or field in SECRET_FIELDS
        shown = "***" if secret else redact(repr(e.get("input")))
        lines.append(f"SETTLE_{field.upper()}: {msg} (got {shown})")
    return "invalid configuration:\n  " + "\n  ".join(lines)


def load_settings(**overrides: object) -> Settings:
    """Read the environment; a bad value raises ConfigError naming the variable."""
    try:
        return Settings(**overrides)  # type: ignore[arg-type]
    except ValidationError as err:
        raise ConfigError(_explain(err)) from None


def check_date(value: str) -> str:
    """Validate a business date argument (YYYY-MM-DD, a real calendar day)."""
    import datetime as dt

    if not _DATE.match(value):
        raise ConfigError(f"--date: expected YYYY-MM-DD, got {value!r}")
    try:
        dt.date.fromisoformat(value)
    except ValueError as e:
        raise ConfigError(f"--date: {value!r} is not a calendar date ({e})") from None
    return value
