"""docker-compose.yml cannot run here (no Docker engine): check it statically.

Besides the shape (services, pinned images, ports, dependencies, secrets only from .env),
this checks the security design: every Kafka listener authenticates (SCRAM for clients and
brokers, PLAIN for controllers), ACLs deny by default with the admin as the only super user,
kafka-init creates one least-privilege user per component and each component logs in as its
own; and Airflow 3 runs as separate components sharing one PostgreSQL metadata database and
one set of secrets. deploy/kafka-start.sh is run for real in --render-only mode.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import stat
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from settlement.config import Settings
from settlement.stack import envfile

ROOT = Path(__file__).resolve().parents[1]
# docker-compose.yml and the two files it includes, each site's own (issue 58).
SITE_FILES = {site: ROOT / "deploy" / "compose" / f"site-{site}.yml" for site in ("a", "b")}
FILES = (ROOT / "docker-compose.yml", *SITE_FILES.values())
COMPOSE_TEXT = "".join(f.read_text() for f in FILES)
PARSED = {f: yaml.safe_load(f.read_text()) for f in FILES}
COMPOSE = {"services": {k: v for d in PARSED.values() for k, v in d["services"].items()},
           "volumes": {k: v for d in PARSED.values() for k, v in (d.get("volumes") or {}).items()}}
SERVICES: dict[str, Any] = COMPOSE["services"]
SETTLE_NAMES = {f"SETTLE_{name.upper()}" for name in Settings.model_fields}
BROKERS = ("kafka-1", "kafka-2", "kafka-3")
PG_MEMBERS = ("postgres-a", "postgres-b")  # the settlement cluster (Patroni)
ETCD = ("etcd-a", "etcd-b", "etcd-witness")
SITES = ("a", "b")
# Each site's own Airflow (issue 41): the four components, and the one-shots before them.
AIRFLOW_COMPONENTS = ("airflow-apiserver", "airflow-scheduler", "airflow-dag-processor",
                      "airflow-triggerer")
AIRFLOW = tuple(f"{c}-{site}" for site in SITES for c in AIRFLOW_COMPONENTS)
AIRFLOW_ONE_SHOTS = tuple(f"airflow-{job}-{site}" for site in SITES
                          for job in ("init", "users", "pools"))
SITE_PG = ("postgres-site-a", "postgres-site-b")  # each site's own server
APP_IMAGE = "dual-site-settlement:0.1.0"
STANDARD_AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
# Which user each Kafka client service logs in as, and the kafka-init role that user has.
KAFKA_USERS = {"site-a": ("site-a", "site-a"), "site-b": ("site-b", "site-b"),
               "airflow-scheduler-a": ("settlement", "settlement"),
               "airflow-scheduler-b": ("settlement", "settlement"),
               "gateway": ("gateway", "gateway")}
# ${VAR}, ${VAR:-default}, ${VAR:?message}; `$${` is compose's escaped literal `${`.
VAR_REF = re.compile(r"(?<!\$)\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}")


def _env(svc: dict[str, Any]) -> dict[str, Any]:
    env = svc.get("environment") or {}
    if isinstance(env, list):
        return dict(item.split("=", 1) for item in env)
    return env


def _ref(value: Any) -> str | None:
    """The variable a value is taken from when it is exactly one ${VAR...} reference."""
    m = VAR_REF.fullmatch(str(value))
    return m.group(1) if m else None


def _interpolate(value: Any, values: dict[str, str]) -> str:
    """What compose would substitute, given .env ``values``."""
    def sub(m: re.Match[str]) -> str:
        name, op, arg = m.groups()
        if values.get(name):
            return values[name]
        if op and op.endswith("-"):
            return arg
        raise KeyError(f"{name} is required by docker-compose.yml")
    return VAR_REF.sub(sub, str(value))


def _host_port(spec: Any) -> str:
    """"19092:9092" and "127.0.0.1:19092:9092" -> "19092"."""
    parts = str(spec).split(":")
    return parts[-2] if len(parts) > 1 else parts[0]


def _listeners(value: str) -> dict[str, str]:
    """"BROKER://:9092,CONTROLLER://:9093" -> {"BROKER": ":9092", ...}."""
    return dict(item.split("://", 1) for item in value.split(","))


def _grants() -> dict[str, tuple[str, str]]:
    """kafka-init's --grant ROLE:USER:PASSWORD_ENV arguments as {user: (role, env)}."""
    cmd = [str(c) for c in SERVICES["kafka-init"]["command"]]
    assert cmd[:2] == ["kafka", "init"], cmd
    flags, values = cmd[2::2], cmd[3::2]
    assert flags and set(flags) == {"--grant"} and len(flags) == len(values), cmd
    grants = {}
    for value in values:
        role, user, password_env = value.split(":")
        assert user not in grants, f"{user} granted twice"
        grants[user] = (role, password_env)
    return grants


def _pg_grants() -> dict[str, tuple[str, str]]:
    """migrate's --grant COMPONENT:USER:PASSWORD_ENV arguments as {user: (component, env)}."""
    cmd = [str(c) for c in SERVICES["migrate"]["command"]]
    assert cmd[:2] == ["db", "migrate"], cmd
    flags, values = cmd[2::2], cmd[3::2]
    assert set(flags) == {"--grant"} and len(flags) == len(values), cmd
    return {user: (component, env)
            for component, user, env in (v.split(":") for v in values)}


GRANT_PASSWORD_VARS = {env for _, env in _grants().values()} | \
    {env for _, env in _pg_grants().values()}
PG_ADMIN = "settle"
# Which PostgreSQL user each service logs in as (every URL in its environment).
PG_USERS = {"migrate": {PG_ADMIN}, "migrate-a": {PG_ADMIN}, "migrate-b": {PG_ADMIN},
            "site-a": {"settle_site_a"}, "site-b": {"settle_site_b"},
            **{f"postgres-exporter-{server}": {"settle_monitor"}
               for server in ("a", "b", "site-a", "site-b")},
            **{name: users for site in SITES for name, users in (
                (f"airflow-scheduler-{site}", {"settle_eod", "airflow"}),
                (f"airflow-apiserver-{site}", {"settle_audit", "airflow"}),
                (f"airflow-triggerer-{site}", {"settle_audit", "airflow"}),
                (f"airflow-dag-processor-{site}", {"airflow"}),
                (f"airflow-init-{site}", {"airflow"}), (f"airflow-pools-{site}", {"airflow"}),
                (f"airflow-users-{site}", {"airflow"}))}}


def _env_example(name: str = ".env.example") -> tuple[set[str], set[str]]:
    """(variables set in an example env file, variables only shown commented out)."""
    active, commented = set(), set()
    for line in (ROOT / name).read_text().splitlines():
        if m := re.match(r"^([A-Za-z_][A-Za-z0-9_]*)=", line):
            active.add(m.group(1))
        elif m := re.match(r"^#\s*([A-Z_][A-Z0-9_]*)=", line):
            commented.add(m.group(1))
    return active, commented


# Each compose file and the example of the env file compose reads it with: the shared tier's
# and each site's.
ENV_EXAMPLES = {
    ".env.example": (ROOT / "docker-compose.yml").read_text(),
    **{f".env.site-{site}.example": f.read_text() for site, f in SITE_FILES.items()},
}
# What only the shared tier may hold: the cluster's admin, replication and Patroni logins,
# Kafka's admin, the gateway's and the auditors' Kafka logins, the monitoring login.
SHARED_ONLY = {"SETTLE_PG_ADMIN_PASSWORD", "SETTLE_PG_REPLICATION_PASSWORD",
               "SETTLE_PG_REWIND_PASSWORD", "PATRONI_RESTAPI_PASSWORD", "KAFKA_ADMIN_PASSWORD",
               "SETTLE_KAFKA_GATEWAY_PASSWORD", "SETTLE_KAFKA_AUDITOR_PASSWORD",
               "MONITORING_PASSWORD", "MONITORING_PASSWORD_BCRYPT", "KAFKA_CLUSTER_ID"}
SITE_OWN, CONSUMER_LOGINS = envfile.SITE_OWN, envfile.CONSUMER_LOGINS


# -- shape ---------------------------------------------------------------------------------

def test_core_services_exist() -> None:
    assert {*BROKERS, "kafka-init", *PG_MEMBERS, *ETCD, "migrate", "site-a", "site-b",
            *SITE_PG, "migrate-a", "migrate-b", *AIRFLOW_ONE_SHOTS, *AIRFLOW} <= set(SERVICES)
    assert "airflow" not in SERVICES, "the standalone Airflow service was split up"


def test_app_services_use_only_documented_settle_names() -> None:
    used = set()
    for name, svc in SERVICES.items():
        for var in _env(svc):
            if not var.startswith("SETTLE_"):
                continue
            if name in ("kafka-init", "migrate", "migrate-a", "migrate-b") \
                    and var in GRANT_PASSWORD_VARS:
                continue  # read by `settle kafka init / db migrate --grant ...:<var>`
            assert var in SETTLE_NAMES, f"{name}: {var} is not a setting in config.py"
            used.add(var)
    assert {"SETTLE_KAFKA_BOOTSTRAP", "SETTLE_PG_DSN", "SETTLE_LEDGER_A_DSN",
            "SETTLE_LEDGER_B_DSN", "SETTLE_LEDGER_SHARED_DSN", "SETTLE_KAFKA_SECURITY_PROTOCOL",
            "SETTLE_KAFKA_SASL_USERNAME", "SETTLE_KAFKA_SASL_PASSWORD"} <= used


def test_host_ports_do_not_clash() -> None:
    ports = [_host_port(p) for svc in SERVICES.values() for p in svc.get("ports", [])]
    assert len(ports) == len(set(ports)), ports


def test_data_stores_are_published_on_loopback_only() -> None:
    for name in (*BROKERS, *PG_MEMBERS, *ETCD):
        for spec in SERVICES[name].get("ports", []):
            assert str(spec).startswith("127.0.0.1:"), f"{name} publishes {spec} to the network"


def test_images_are_pinned() -> None:
    for name, svc in SERVICES.items():
        image = svc.get("image")
        assert image, f"{name} has no image"
        assert re.search(r":[\w.\-]+$", image), f"{name}: image {image!r} has no tag"
        assert not image.endswith(":latest"), f"{name}: {image!r} is not pinned"


def test_dependencies_exist_and_wait_for_health() -> None:
    for name, svc in SERVICES.items():
        for dep, cond in (svc.get("depends_on") or {}).items():
            assert dep in SERVICES, f"{name} depends on unknown {dep}"
            assert cond["condition"] in {"service_healthy", "service_completed_successfully"}
            if cond["condition"] == "service_healthy":
                assert "healthcheck" in SERVICES[dep], f"{name} waits on {dep}'s health"
            else:
                assert SERVICES[dep].get("restart") == "no", f"{dep} is not a one-shot"


CERTS_SOURCE = "${SETTLE_CERTS_DIR:-./certs}"


def _mounts(svc: dict[str, Any]) -> list[dict[str, Any]]:
    """A service's volumes in compose's long form: short "SRC:DST[:ro]" strings parsed."""
    out = []
    for mount in svc.get("volumes", []):
        if isinstance(mount, dict):
            out.append(mount)
            continue
        text = str(mount)
        source, target = text.removesuffix(":ro").rsplit(":", 1)
        kind = "bind" if source.startswith(("./", "/", "$")) else "volume"
        out.append({"type": kind, "source": source, "target": target,
                    "read_only": text.endswith(":ro")})
    return out


def _cert_files(svc: dict[str, Any]) -> dict[str, str]:
    """The TLS files a service mounts: {file name in SETTLE_CERTS_DIR: target}."""
    files = {}
    for m in _mounts(svc):
        if str(m["source"]).startswith(CERTS_SOURCE):
            files[str(m["source"]).removeprefix(CERTS_SOURCE).lstrip("/")] = m["target"]
    return files


def test_volumes_are_declared_and_mounted_files_exist() -> None:
    declared = set(COMPOSE.get("volumes") or {})
    for name, svc in SERVICES.items():
        for m in _mounts(svc):
            source = str(m["source"])
            if source.startswith(CERTS_SOURCE):  # deploy/make-certs.sh's, never committed
                assert (ROOT / "deploy" / "make-certs.sh").exists()
                assert m["read_only"] is True, (name, source)
            elif source.startswith(("./", "/")):
                assert (ROOT / source).exists(), f"{name} mounts missing {source}"
                assert m["read_only"] is True, f"{name}: mount {source} read-only"
            else:
                assert source in declared, f"{name} uses undeclared volume {source}"


# What each service may read of deploy/make-certs.sh's folder, {file: path it is mounted at}:
# the CA certificate it verifies others with and its own key pair (one per server, mounted at
# the path its configuration reads), nothing else. A CA's key (ca.key, etcd-ca.key) in a
# container would let anyone there mint a certificate that passes verify-full or opens etcd.
CA = {"ca.crt": "/certs/ca.crt"}
ETCD_CA = {"etcd-ca.crt": "/certs/etcd-ca.crt"}


def _pair(name: str, at: str) -> dict[str, str]:
    return {f"{name}.crt": f"/certs/{at}.crt", f"{name}.key": f"/certs/{at}.key"}


OWN_TLS_FILES: dict[str, dict[str, str]] = {
    # A broker serves its listeners (PEM) and its JMX exporter (PKCS#12 and the exporter's
    # httpServer block naming it) with its own key pair.
    **{b: {**CA, f"{b}.pem": f"/certs/{b}.pem", f"{b}-jmx.p12": f"/certs/{b}-jmx.p12",
           f"{b}-jmx.yml": f"/certs/{b}-jmx.yml"} for b in BROKERS},
    # A member verifies the other and the site servers with ca.crt and etcd with etcd-ca.crt;
    # it logs in to etcd with its own client certificate, and to the backup repository (and
    # serves the repository's backups) with its pgBackRest key pair.
    **{m: {**CA, **_pair(m, "postgres"), **ETCD_CA, **_pair(f"patroni-{m}", "patroni"),
           **_pair(f"pgbackrest-{m}", "pgbackrest")}
       for m in PG_MEMBERS},
    # The backup repository at the witness: its own pgBackRest key pair, the stack's CA.
    "backup": {**CA, **_pair("pgbackrest-repo", "pgbackrest")},
    # etcd trusts its own CA only.
    **{m: {**ETCD_CA, **_pair(m, "etcd")} for m in ETCD},
    # Each site's own server verifies the admin's client certificate (ca.crt).
    **{m: {**CA, **_pair(m, "postgres")} for m in SITE_PG},
    # The migrations log in as the admin: its password and its client certificate.
    **{m: {**CA, **_pair("postgres-admin", "postgres-admin")}
       for m in ("migrate", "migrate-a", "migrate-b")},
    **{f"airflow-apiserver-{site}": {**CA, **_pair(f"airflow-apiserver-{site}", "airflow")}
       for site in SITES},
    # Monitoring (HTTPS): Prometheus verifies what it scrapes and the exporters their server;
    # Alertmanager and the Pushgateway verify no one.
    "prometheus": {**CA, **_pair("prometheus", "prometheus")},
    "alertmanager": _pair("alertmanager", "alertmanager"),
    "pushgateway": _pair("pushgateway", "pushgateway"),
    **{f"postgres-exporter-{server}": {**CA, **_pair(f"postgres-exporter-{server}",
                                                     "postgres-exporter")}
       for server in ("a", "b", "site-a", "site-b")},
    # Each site's consumer serves its metrics over HTTPS.
    **{f"site-{site}": {**CA, **_pair(f"site-{site}", "metrics")} for site in SITES},
    # Each site's Airflow exporter verifies its api-server and serves HTTPS.
    **{f"airflow-exporter-{site}": {**CA, **_pair(f"airflow-exporter-{site}", "airflow-exporter")}
       for site in SITES},
}


def test_each_service_mounts_the_ca_certificate_and_its_own_key_pair_only() -> None:
    for name, svc in SERVICES.items():
        for m in _mounts(svc):
            source = str(m["source"])
            # Never the folder: whatever make-certs.sh (or an operator) puts there would follow.
            assert source.rstrip("/") != CERTS_SOURCE, f"{name} mounts the whole certs folder"
            assert "ca.key" not in source and "ca.key" not in str(m["target"]), name  # etcd-ca too
            if source.startswith(CERTS_SOURCE):
                assert m["type"] == "bind" and m["read_only"] is True, (name, m)
                # A missing file must fail the start, not become an empty directory.
                assert m.get("bind", {}).get("create_host_path") is False, (name, m)
        assert _cert_files(svc) == OWN_TLS_FILES.get(name, CA), name
    # What the services are configured to read is what they mount.
    for b in BROKERS:
        assert _env(SERVICES[b])["KAFKA_SSL_KEYSTORE_LOCATION"] in _cert_files(SERVICES[b]) \
            .values()
        assert _env(SERVICES[b])["KAFKA_SSL_TRUSTSTORE_LOCATION"] == "/certs/ca.crt"
        assert _env(SERVICES[b])["JMX_EXPORTER_TLS"] == f"/certs/{b}-jmx.yml"
        assert _env(SERVICES[b])["KAFKA_OPTS"].endswith(":/opt/kafka/config/jmx-exporter.yml")
    patroni = yaml.safe_load((ROOT / "deploy/patroni/patroni.yml").read_text())
    params = patroni["postgresql"]["parameters"]
    assert params["ssl"] == "on" and params["ssl_cert_file"] == "/certs/postgres.crt"
    assert params["ssl_key_file"] == "/certs/postgres.key"
    assert (patroni["etcd3"]["cacert"], patroni["etcd3"]["cert"], patroni["etcd3"]["key"]) == (
        "/certs/etcd-ca.crt", "/certs/patroni.crt", "/certs/patroni.key")
    for m in ETCD:
        env = _env(SERVICES[m])
        assert (env["ETCD_CERT_FILE"], env["ETCD_KEY_FILE"]) == ("/certs/etcd.crt",
                                                                "/certs/etcd.key")
        assert env["ETCD_TRUSTED_CA_FILE"] == env["ETCD_PEER_TRUSTED_CA_FILE"] == \
            env["ETCDCTL_CACERT"] == "/certs/etcd-ca.crt"
        assert env["ETCD_CLIENT_CERT_AUTH"] == env["ETCD_PEER_CLIENT_CERT_AUTH"] == "true"
    # pgBackRest reads the key pair and CA each of its services mounts, on both sides.
    for conf in ("member.conf", "repo.conf"):
        text = (ROOT / "deploy/pgbackrest" / conf).read_text()
        files = set(re.findall(r"(/certs/\S+)", text))
        assert files == {"/certs/ca.crt", "/certs/pgbackrest.crt", "/certs/pgbackrest.key"}, conf
    # The local stack's override adds no mount of its own (it would bypass the above).
    local = (ROOT / "deploy/local/docker-compose.local.yml").read_text()
    assert "volumes:" not in local


def _make_certs(directory: Path, *sans: str, **env: str) -> subprocess.CompletedProcess[str]:
    bash = shutil.which("bash")
    if bash is None or shutil.which("openssl") is None:
        pytest.skip("no bash or openssl")
    return subprocess.run([bash, str(ROOT / "deploy" / "make-certs.sh"), str(directory), *sans],
                          env={**os.environ, **env}, capture_output=True, text=True, timeout=120)


def _sans(cert: Path) -> str:
    return subprocess.run(["openssl", "x509", "-in", str(cert), "-noout", "-ext",
                           "subjectAltName"], capture_output=True, text=True, check=True).stdout


def _verifies(ca: Path, cert: Path, host: str | None) -> bool:
    """Whether ``cert`` is signed by ``ca`` (and names ``host``, when given)."""
    cmd = ["openssl", "verify", "-CAfile", str(ca)]
    if host:
        cmd += ["-verify_hostname", host]
    return subprocess.run([*cmd, str(cert)], capture_output=True, text=True).returncode == 0


def _usage(cert: Path) -> str:
    out = subprocess.run(["openssl", "x509", "-in", str(cert), "-noout", "-ext",
                          "extendedKeyUsage"], capture_output=True, text=True, check=True).stdout
    return out.splitlines()[-1].strip()


def test_make_certs_keeps_the_ca_key_out_of_the_mounted_folder(tmp_path: Path) -> None:
    certs = tmp_path / "certs"
    made = _make_certs(certs, "DNS:settle.example.com", "postgres-a=DNS:pg-a.example.com")
    assert made.returncode == 0, made.stderr
    ca_dir = tmp_path / "certs-ca"
    assert not list(certs.glob("ca.key*")) and not (certs / "ca.srl").exists()
    assert stat.S_IMODE((ca_dir / "ca.key").stat().st_mode) == 0o600
    assert stat.S_IMODE(ca_dir.stat().st_mode) == 0o700
    # Every file a service mounts exists; every key is private.
    for f in set().union(*OWN_TLS_FILES.values()):
        assert (certs / f).is_file(), f
    for key in (*certs.glob("*.key"), *certs.glob("*.pem")):
        assert stat.S_IMODE(key.stat().st_mode) == 0o600, key
    # One key pair per server, naming that server only, for serving only.
    signed_by_etcd = {*ETCD, *(f"patroni-{m}" for m in PG_MEMBERS)}
    pgbackrest = {"pgbackrest-repo": "backup", **{f"pgbackrest-{m}": m for m in PG_MEMBERS}}
    servers = {f.removesuffix(".crt") for files in OWN_TLS_FILES.values() for f in files
               if f.endswith(".crt")} - {"ca", "etcd-ca", "postgres-admin"} - signed_by_etcd \
        - set(pgbackrest) | set(BROKERS)
    # 3 brokers, 4 PostgreSQL servers, 2 api-servers, 3 monitoring servers, 6 exporters and
    # 2 sites' metrics
    assert len(servers) == 20, sorted(servers)
    for name in servers:
        assert _verifies(certs / "ca.crt", certs / f"{name}.crt", name), name
        assert _usage(certs / f"{name}.crt") == "TLS Web Server Authentication", name
        sans = set(_sans(certs / f"{name}.crt").split("\n", 1)[1].strip().split(", "))
        own = {"DNS:pg-a.example.com"} if name == "postgres-a" else set()  # SERVER=SAN
        assert sans == {f"DNS:{name}", "DNS:localhost", "IP Address:127.0.0.1",
                        "DNS:settle.example.com", *own}, (name, sans)
    # pgBackRest's (issue 60): each a server and the other side's client, named for the host it
    # is reached by; a member's cannot pass for the other member or for the repository.
    for name, host in pgbackrest.items():
        assert _verifies(certs / "ca.crt", certs / f"{name}.crt", host), name
        assert _usage(certs / f"{name}.crt") == \
            "TLS Web Server Authentication, TLS Web Client Authentication", name
    assert not _verifies(certs / "ca.crt", certs / "pgbackrest-postgres-a.crt", "postgres-b")
    assert not _verifies(certs / "ca.crt", certs / "pgbackrest-postgres-a.crt", "backup")
    # The doors: a site's own server cannot pass for a member of the settlement cluster, nor
    # one site's api-server for the other's.
    assert not _verifies(certs / "ca.crt", certs / "postgres-site-a.crt", "postgres-a")
    assert not _verifies(certs / "ca.crt", certs / "airflow-apiserver-a.crt",
                         "airflow-apiserver-b")
    # etcd's own CA signs its members (peers: both usages) and Patroni's logins (client only);
    # the stack's CA signs none of them, and etcd's signs no other component.
    for m in ETCD:
        assert _verifies(certs / "etcd-ca.crt", certs / f"{m}.crt", m)
        assert not _verifies(certs / "ca.crt", certs / f"{m}.crt", m)
        assert _usage(certs / f"{m}.crt") == \
            "TLS Web Server Authentication, TLS Web Client Authentication"
    for m in PG_MEMBERS:
        assert _verifies(certs / "etcd-ca.crt", certs / f"patroni-{m}.crt", None)
        assert _usage(certs / f"patroni-{m}.crt") == "TLS Web Client Authentication"
    for other in ("kafka-1", "postgres-a", "pushgateway", "airflow-exporter-a",
                  "postgres-admin"):
        assert not _verifies(certs / "etcd-ca.crt", certs / f"{other}.crt", None), other
    # The PostgreSQL admin's client certificates (the migrations', the operator's): CN settle,
    # the user name pg_hba's clientcert=verify-full compares, for logging in only.
    for admin in ("postgres-admin", "postgres-admin-operator"):
        assert _verifies(certs / "ca.crt", certs / f"{admin}.crt", None)
        assert _usage(certs / f"{admin}.crt") == "TLS Web Client Authentication"
        subject = subprocess.run(["openssl", "x509", "-in", str(certs / f"{admin}.crt"),
                                  "-noout", "-subject"], capture_output=True, text=True,
                                 check=True).stdout
        assert subject.strip() == "subject=CN = settle", subject
    if os.geteuid() == 0:  # owned by the image's user that reads it (settle, uid 10001)
        assert (certs / "airflow-apiserver-a.key").stat().st_uid == 10001
        assert (certs / "etcd-a.key").stat().st_uid == 998

    # A folder an older version made (ca.key inside) is cleaned on the next run, the CA kept.
    old = tmp_path / "old"
    old.mkdir()
    for f in certs.iterdir():
        shutil.copy2(f, old / f.name)
    shutil.copy2(ca_dir / "ca.key", old / "ca.key")
    (old / "airflow-apiserver-a.crt").unlink()  # so that one is issued with the moved key
    again = _make_certs(old, CA_DIR=str(tmp_path / "elsewhere"))
    assert again.returncode == 0, again.stderr
    assert not (old / "ca.key").exists(), "the CA's key stayed in the mounted folder"
    assert (tmp_path / "elsewhere" / "ca.key").read_bytes() == (ca_dir / "ca.key").read_bytes()
    assert (old / "ca.crt").read_bytes() == (certs / "ca.crt").read_bytes()
    assert _verifies(old / "ca.crt", old / "airflow-apiserver-a.crt", "airflow-apiserver-a")
    # An older version's etcd certificate (signed by the stack's CA) is issued again by etcd's.
    shutil.copy2(certs / "kafka-1.crt", certs / "etcd-a.crt")
    assert _make_certs(certs).returncode == 0
    assert _verifies(certs / "etcd-ca.crt", certs / "etcd-a.crt", "etcd-a")
    # Without the CA's key nothing new can be issued, and the script says where it looked.
    (old / "postgres-a.crt").unlink()
    lost = _make_certs(old, CA_DIR=str(tmp_path / "empty"))
    assert lost.returncode != 0 and "CA's key is not in" in lost.stderr, lost.stderr


def test_every_compose_variable_is_in_its_env_example() -> None:
    for example, text in ENV_EXAMPLES.items():
        active, commented = _env_example(example)
        for name, op, _ in VAR_REF.findall(text):
            if op.endswith("-"):  # has a default: may be documented commented out
                assert name in active | commented, f"${{{name}}} is not in {example}"
            else:
                assert name in active, f"required ${{{name}}} is not set in {example}"


def test_a_sites_file_names_no_secret_of_the_other_site_or_the_shared_tier() -> None:
    """Issue 58: compose reads each site's file with that site's own env file, so what the
    file names is all that file needs. Neither names the other's secrets nor the shared
    tier's; the shared file names no site's Airflow secret or server admin."""
    named = {site: {n for n, _, _ in VAR_REF.findall(f.read_text())}
             for site, f in SITE_FILES.items()}
    shared = {n for n, _, _ in VAR_REF.findall(ENV_EXAMPLES[".env.example"])}
    for site, other in (("a", "b"), ("b", "a")):
        assert SITE_OWN[site] <= named[site], SITE_OWN[site] - named[site]
        assert not named[site] & SITE_OWN[other], named[site] & SITE_OWN[other]
        assert not named[site] & SHARED_ONLY, named[site] & SHARED_ONLY
        assert not (SITE_OWN[site] - CONSUMER_LOGINS) & shared
        active, _ = _env_example(f".env.site-{site}.example")
        assert not active & (SITE_OWN[other] | SHARED_ONLY), active & (SITE_OWN[other]
                                                                       | SHARED_ONLY)
    active, _ = _env_example()
    assert not active & ((SITE_OWN["a"] | SITE_OWN["b"]) - CONSUMER_LOGINS)
    # docker-compose.yml reads each site's file with its own env file.
    main = PARSED[ROOT / "docker-compose.yml"]
    assert [(i["path"], i["env_file"]) for i in main["include"]] == [
        ("deploy/compose/site-a.yml", ".env.site-a"), ("deploy/compose/site-b.yml", ".env.site-b")]


def test_the_shared_blocks_copied_into_the_site_files_stay_equal() -> None:
    """YAML anchors do not cross files: each site file holds its own copy of the x- blocks
    both use (and docker-compose.yml of those it uses too). They must not drift apart."""
    def blocks(f: Path) -> dict[str, Any]:
        text = re.sub(r"\.env\.site-[ab]\b", ".env", f.read_text())
        return {k: v for k, v in yaml.safe_load(text).items() if k.startswith("x-")}
    a, b, main = blocks(SITE_FILES["a"]), blocks(SITE_FILES["b"]), blocks(FILES[0])
    common = set(a) & set(b)
    assert {"x-airflow-env", "x-airflow-scheduler-env", "x-app-image", "x-ca-crt"} <= common
    for name in common:
        assert a[name] == b[name], name
        if name in main:
            assert a[name] == main[name], name


def test_no_secrets_committed() -> None:
    literal = re.search(r"^\s*\w*PASSWORD\w*:\s*(?!\$\{)\S", COMPOSE_TEXT, re.M)
    assert literal is None, f"a literal password in compose: {literal.group(0)!r}"
    in_urls = re.findall(r"://[^/\s:'\"@]+:(\$\{[^}]*\}|[^@\s'\"]+)@", COMPOSE_TEXT)
    assert in_urls, "no URL credentials found: is this check still matching?"
    for password in in_urls:
        assert _ref(password), f"a literal password in a URL: {password!r}"
    secret = re.compile(r"PASSWORD|SECRET|FERNET_KEY")
    for name, svc in SERVICES.items():
        for var, value in _env(svc).items():
            if secret.search(var):
                assert _ref(value), f"{name}: {var} must come from .env"
    assert (ROOT / ".env.example").exists()
    built = [s for s in SERVICES.values() if "build" in s]
    assert built and (ROOT / "Dockerfile").exists()


def test_deploy_scripts_are_valid_bash() -> None:
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("no bash")
    scripts = sorted((ROOT / "deploy").glob("*.sh"))
    assert ROOT / "deploy" / "kafka-start.sh" in scripts
    for script in scripts:
        res = subprocess.run([bash, "-n", str(script)], capture_output=True, text=True)
        assert res.returncode == 0, f"{script.name}: {res.stderr}"


# -- Kafka -----------------------------------------------------------------------------------

def test_kafka_cluster_is_durable() -> None:
    for i, name in enumerate(BROKERS, start=1):
        env = _env(SERVICES[name])
        assert env["KAFKA_NODE_ID"] == i
        assert int(env["KAFKA_DEFAULT_REPLICATION_FACTOR"]) == 3
        assert int(env["KAFKA_MIN_INSYNC_REPLICAS"]) == 2
        assert int(env["KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR"]) == 3
        assert int(env["KAFKA_TRANSACTION_STATE_LOG_MIN_ISR"]) == 2
        assert str(env["KAFKA_UNCLEAN_LEADER_ELECTION_ENABLE"]).lower() == "false"
        assert "healthcheck" in SERVICES[name]
        assert f"{name}-data:{env['KAFKA_LOG_DIRS']}" in SERVICES[name]["volumes"]


def test_every_service_names_its_site_and_the_brokers_racks_are_the_three_locations() -> None:
    # Site A, site B, the witness (third KRaft node) and the exchange outside both: a service
    # without a site could not be placed (or lost) in a site drill.
    sites = {name: (svc.get("labels") or {}).get("settle.site") for name, svc in SERVICES.items()}
    assert all(sites.values()), {n: s for n, s in sites.items() if not s}
    assert set(sites.values()) <= {"a", "b", "witness", "exchange"}, sites
    assert sites["site-a"] == "a" and sites["site-b"] == "b" and sites["gateway"] == "exchange"
    # One broker per location, its rack the location: rack-aware placement then puts the
    # topic's three replicas one at each, and min.insync 2 survives the loss of any one.
    racks = {name: str(_env(SERVICES[name]).get("KAFKA_BROKER_RACK")) for name in BROKERS}
    assert sorted(racks.values()) == ["a", "b", "witness"], racks
    assert all(racks[name] == sites[name] for name in BROKERS), (racks, sites)


def test_kafka_listeners_authenticate_every_connection() -> None:
    for name in BROKERS:
        svc, env = SERVICES[name], _env(SERVICES[name])
        listeners = _listeners(env["KAFKA_LISTENERS"])
        protocol_map = env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"]
        protocols = dict(p.split(":") for p in protocol_map.split(","))
        controller = env["KAFKA_CONTROLLER_LISTENER_NAMES"]
        broker = env["KAFKA_INTER_BROKER_LISTENER_NAME"]
        assert set(listeners) == set(protocols) == {broker, controller}, name
        # The controller listener is SASL too: with PLAINTEXT its peers would be
        # User:ANONYMOUS, which would then have to be a super user.
        assert all(p.startswith("SASL_") for p in protocols.values()), (name, protocols)
        assert env[f"KAFKA_LISTENER_NAME_{broker}_SASL_ENABLED_MECHANISMS"] == "SCRAM-SHA-512"
        assert env["KAFKA_SASL_MECHANISM_INTER_BROKER_PROTOCOL"] == "SCRAM-SHA-512"
        assert env[f"KAFKA_LISTENER_NAME_{controller}_SASL_ENABLED_MECHANISMS"] == "PLAIN"
        assert env["KAFKA_SASL_MECHANISM_CONTROLLER_PROTOCOL"] == "PLAIN"
        # Clients are told about the SASL listener only, under the broker's own name.
        assert env["KAFKA_ADVERTISED_LISTENERS"] == f"{broker}://{svc['hostname']}:9092"
        assert listeners[broker] == ":9092"
        # The quorum port is never published.
        controller_port = listeners[controller].rsplit(":", 1)[1]
        for spec in svc.get("ports", []):
            assert str(spec).rsplit(":", 1)[1] != controller_port, f"{name} publishes {spec}"


def test_kafka_authorizes_by_acl_with_admin_as_only_super_user() -> None:
    for name in BROKERS:
        env = _env(SERVICES[name])
        assert env["KAFKA_AUTHORIZER_CLASS_NAME"] == STANDARD_AUTHORIZER
        assert str(env["KAFKA_ALLOW_EVERYONE_IF_NO_ACL_FOUND"]).lower() == "false"
        supers = env["KAFKA_SUPER_USERS"].split(";")
        assert supers == [f"User:{env['KAFKA_ADMIN_USER']}"], supers
        assert _ref(env["KAFKA_ADMIN_USER"]) == "KAFKA_ADMIN_USER"
        assert _ref(env["KAFKA_ADMIN_PASSWORD"]) == "KAFKA_ADMIN_PASSWORD"
        assert _ref(env["CLUSTER_ID"]) == "KAFKA_CLUSTER_ID"


def test_kafka_brokers_bootstrap_scram_through_the_start_script() -> None:
    script = ROOT / "deploy" / "kafka-start.sh"
    text = script.read_text()
    assert "--add-scram" in text and "--ignore-formatted" in text
    # Java main classes, not the image's bin/*.sh: the same script runs the official image
    # and the one built from Debian's Java and the Maven jars (deploy/local/kafka.Dockerfile).
    assert "kafka.tools.StorageTool format" in text and "kafka.Kafka" in text
    assert "/opt/kafka/bin" not in text
    for name in BROKERS:
        svc = SERVICES[name]
        assert svc["image"].startswith("apache/kafka:")
        assert "./deploy/kafka-start.sh:/opt/settle/kafka-start.sh:ro" in svc["volumes"]
        assert svc["entrypoint"][-1] == "/opt/settle/kafka-start.sh"
        # The healthcheck logs in as the admin over TLS (the script's --health mode uses the
        # client config it wrote).
        assert svc["healthcheck"]["test"][-2:] == ["/opt/settle/kafka-start.sh", "--health"]
        assert "--command-config \"$client_props\"" in text


# The checks that start a JVM or Airflow's CLI: through the cache, never every interval.
COSTLY_CHECKS = {**{b: "kafka-start.sh" for b in BROKERS},
                 **{f"airflow-{job}-{site}": "airflow" for job in ("dag-processor", "triggerer")
                    for site in "ab"}}


def test_costly_healthchecks_run_in_full_only_now_and_then() -> None:
    for name, tool in COSTLY_CHECKS.items():
        svc = SERVICES[name]
        test = svc["healthcheck"]["test"]
        assert test[1:4] == ["/bin/bash", "/opt/settle/cached-health.sh", "300"], name
        assert any(tool in part for part in test[4:]), name
        assert "./deploy/cached-health.sh:/opt/settle/cached-health.sh:ro" in svc["volumes"], name


def test_a_broker_not_listening_yet_is_unhealthy_without_a_jvm(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "server.properties").write_text(
        f"advertised.listeners=BROKER://127.0.0.1:{port}\n")
    # Only sed on the PATH, no java: a JVM started would fail otherwise than said here.
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "sed").symlink_to(shutil.which("sed") or "/bin/sed")
    res = subprocess.run([shutil.which("bash") or "/bin/bash",
                          str(ROOT / "deploy" / "kafka-start.sh"), "--health"],
                         env={"PATH": str(tools), "KAFKA_HOME": str(tmp_path)},
                         capture_output=True, text=True, timeout=30)
    assert res.returncode == 1, res
    assert f"nothing listens on 127.0.0.1:{port} yet" in res.stderr, res.stderr


def _cached_check(tmp_path: Path, marker: Path, exit_code: int = 0,
                  max_age: str = "300") -> int:
    calls = tmp_path / "calls"
    script = f"echo x >> {calls}; exit {exit_code}"
    res = subprocess.run(["bash", str(ROOT / "deploy" / "cached-health.sh"), max_age,
                          "bash", "-c", script],
                         env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                              "SETTLE_HEALTH_MARKER": str(marker)},
                         capture_output=True, text=True, timeout=30)
    assert (res.returncode == 0) == (exit_code == 0), res.stderr
    return len(calls.read_text().splitlines()) if calls.exists() else 0


def test_the_cached_healthcheck_reruns_on_a_new_start_or_when_old(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    # A failing check is never remembered: each check runs it again.
    assert _cached_check(tmp_path, marker, exit_code=3) == 1
    assert not marker.exists()
    assert _cached_check(tmp_path, marker) == 2
    # Passed: the next checks answer from the pass.
    assert _cached_check(tmp_path, marker) == 2
    assert _cached_check(tmp_path, marker) == 2
    started, at = marker.read_text().split()
    # Passed by another start of the main process (a restarted container): checked again.
    marker.write_text(f"{int(started) + 1} {at}\n")
    assert _cached_check(tmp_path, marker) == 3
    # Passed longer ago than the age allowed: checked again.
    started, at = marker.read_text().split()
    marker.write_text(f"{started} {int(at) - 301}\n")
    assert _cached_check(tmp_path, marker) == 4
    assert _cached_check(tmp_path, marker) == 4


def _render_broker(tmp_path: Path, **overrides: str) -> subprocess.CompletedProcess[str]:
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("no bash")
    dotenv = {"KAFKA_CLUSTER_ID": "test-cluster", "KAFKA_ADMIN_PASSWORD": "s3cret-Pw.1"}
    env = {k: _interpolate(v, dotenv) for k, v in _env(SERVICES["kafka-1"]).items()}
    env.update(overrides)
    return subprocess.run(
        [bash, str(ROOT / "deploy" / "kafka-start.sh"), "--render-only", str(tmp_path)],
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **env},
        capture_output=True, text=True, timeout=60)


def _properties(path: Path) -> dict[str, str]:
    lines = [ln for ln in path.read_text().splitlines() if ln and not ln.startswith("#")]
    return dict(ln.split("=", 1) for ln in lines)


def test_kafka_start_script_renders_the_broker_config(tmp_path: Path) -> None:
    res = _render_broker(tmp_path, KAFKA_SOME___DASHED__UNDER_NAME="x")
    assert res.returncode == 0, res.stderr
    server = _properties(tmp_path / "server.properties")
    assert server["node.id"] == "1"
    assert server["process.roles"] == "broker,controller"
    # Every listener encrypted and authenticated; the broker's PEM keystore, the CA to trust.
    assert server["listener.security.protocol.map"] == "BROKER:SASL_SSL,CONTROLLER:SASL_SSL"
    assert server["ssl.keystore.type"] == "PEM"
    assert server["ssl.keystore.location"] == "/certs/kafka-1.pem"
    assert server["ssl.truststore.location"] == "/certs/ca.crt"
    assert server["authorizer.class.name"] == STANDARD_AUTHORIZER
    assert server["allow.everyone.if.no.acl.found"] == "false"
    assert server["super.users"] == "User:admin"
    assert server["min.insync.replicas"] == "2"
    assert server["log.dirs"] == "/var/lib/kafka/data"
    assert server["listener.name.broker.sasl.enabled.mechanisms"] == "SCRAM-SHA-512"
    assert server["some-dashed_under.name"] == "x"  # the image's `___`/`__`/`_` convention
    scram = server["listener.name.broker.scram-sha-512.sasl.jaas.config"]
    assert scram.startswith("org.apache.kafka.common.security.scram.ScramLoginModule required")
    assert 'username="admin" password="s3cret-Pw.1";' in scram
    plain = server["listener.name.controller.plain.sasl.jaas.config"]
    assert 'user_admin="s3cret-Pw.1";' in plain
    # Credentials are not properties of their own; the cluster id goes to `format` only.
    assert not any(k.startswith(("admin.", "cluster.id")) for k in server)
    client = _properties(tmp_path / "admin-client.properties")
    assert client["security.protocol"] == "SASL_SSL"
    assert client["ssl.truststore.location"] == "/certs/ca.crt"
    assert client["sasl.mechanism"] == "SCRAM-SHA-512"
    assert client["sasl.jaas.config"] == scram
    for f in ("server.properties", "admin-client.properties"):
        assert stat.S_IMODE((tmp_path / f).stat().st_mode) == 0o600, f


def test_a_brokers_jmx_exporter_serves_https_only_with_its_own_certificate(
        tmp_path: Path) -> None:
    """The exporter's configuration as kafka-start.sh renders it from make-certs.sh's files,
    loaded by the real agent in a JVM: the metrics over HTTPS verify against the stack's CA
    under the broker's names; plain HTTP gets no metrics."""
    import http.client
    import socket
    import ssl
    import time
    import urllib.error
    import urllib.request

    agent = ROOT / ".cache/jars/jmx/jmx_prometheus_javaagent.jar"
    if shutil.which("java") is None or not agent.exists():
        pytest.fail("needs java and the JMX exporter agent: run `make jars`")
    certs = tmp_path / "certs"
    assert _make_certs(certs).returncode == 0
    tls = certs / "kafka-1-jmx.yml"
    assert stat.S_IMODE(tls.stat().st_mode) == stat.S_IMODE(
        (certs / "kafka-1-jmx.p12").stat().st_mode) == 0o600
    # In the container the keystore is mounted at /certs; here it stays in tmp_path.
    tls.write_text(tls.read_text().replace("/certs/", f"{certs}/"))
    conf = tmp_path / "conf"
    res = _render_broker(conf, JMX_EXPORTER_RULES=str(ROOT / "deploy/prometheus/jmx-kafka.yml"),
                         JMX_EXPORTER_TLS=str(tls))
    assert res.returncode == 0, res.stderr
    rendered = conf / "jmx-exporter.yml"
    config = yaml.safe_load(rendered.read_text())
    assert config["rules"] and config["httpServer"]["ssl"]["certificate"]["alias"] == "kafka-1"
    assert stat.S_IMODE(rendered.stat().st_mode) == 0o600  # it holds the keystore's password
    # A broker whose TLS block is not there does not start with plain HTTP.
    missing = _render_broker(tmp_path / "other", JMX_EXPORTER_RULES=str(rendered),
                             JMX_EXPORTER_TLS=str(tmp_path / "absent.yml"))
    assert missing.returncode != 0 and "make-certs.sh" in missing.stderr
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (tmp_path / "Idle.java").write_text(
        "public class Idle { public static void main(String[] a) throws Exception "
        "{ Thread.sleep(120000); } }\n")
    jvm = subprocess.Popen(["java", f"-javaagent:{agent}=127.0.0.1:{port}:{rendered}",
                            str(tmp_path / "Idle.java")], cwd=tmp_path,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        ca = ssl.create_default_context(cafile=str(certs / "ca.crt"))
        deadline = time.monotonic() + 60
        while True:
            try:
                for host in ("127.0.0.1", "localhost"):
                    with urllib.request.urlopen(f"https://{host}:{port}/metrics", timeout=10,
                                                context=ca) as answer:
                        assert b"jvm_" in answer.read()
                break
            except (ConnectionError, urllib.error.URLError) as exc:
                if isinstance(exc, urllib.error.URLError) and "refused" not in str(exc):
                    raise
                assert jvm.poll() is None and time.monotonic() < deadline, exc
                time.sleep(0.5)
        with pytest.raises((OSError, http.client.HTTPException)):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
                r.read()
    finally:
        jvm.kill()
        jvm.wait(30)


@pytest.mark.parametrize("password", ["a,b", 'q"uote', "sp ace", ""])
def test_kafka_start_script_refuses_unsafe_admin_passwords(tmp_path: Path, password: str) -> None:
    res = _render_broker(tmp_path, KAFKA_ADMIN_PASSWORD=password)
    assert res.returncode != 0
    assert "KAFKA_ADMIN_PASSWORD" in res.stderr


def test_kafka_init_creates_one_least_privilege_user_per_component() -> None:
    svc = SERVICES["kafka-init"]
    env = _env(svc)
    assert svc["image"] == APP_IMAGE and svc["restart"] == "no"
    grants = _grants()
    from settlement.kafka.security import ROLES

    assert {role for role, _ in grants.values()} == set(ROLES)
    # One user per service that talks to Kafka, and the read-only auditor (no service: it is
    # for auditors' own clients, `make stack-up` prints its settings).
    assert {user: role for user, (role, _) in grants.items()} == \
        {user: role for user, role in KAFKA_USERS.values()} | {"auditor": "auditor"}
    for user, (_, password_env) in grants.items():
        assert _ref(env.get(password_env)) == password_env, f"{user}: pass {password_env}"
    # kafka-init itself is the admin.
    assert env["SETTLE_KAFKA_SECURITY_PROTOCOL"].startswith("SASL_")
    assert _ref(env["SETTLE_KAFKA_SASL_USERNAME"]) == "KAFKA_ADMIN_USER"
    assert _ref(env["SETTLE_KAFKA_SASL_PASSWORD"]) == "KAFKA_ADMIN_PASSWORD"
    assert svc["depends_on"] == {b: {"condition": "service_healthy"} for b in BROKERS}


def test_app_services_log_in_to_kafka_as_their_own_user() -> None:
    grants = _grants()
    clients = {n for n, s in SERVICES.items() if "SETTLE_KAFKA_BOOTSTRAP" in _env(s)}
    assert clients - {"kafka-init"} == set(KAFKA_USERS)
    for name, (user, role) in KAFKA_USERS.items():
        svc, env = SERVICES[name], _env(SERVICES[name])
        assert env["SETTLE_KAFKA_SECURITY_PROTOCOL"].startswith("SASL_"), name
        assert env["SETTLE_KAFKA_SASL_MECHANISM"] == "SCRAM-SHA-512", name
        assert env["SETTLE_KAFKA_SASL_USERNAME"] == user, name
        assert grants[user][0] == role, f"{name}: {user} must have role {role}"
        # The same password kafka-init set for that user.
        assert _ref(env["SETTLE_KAFKA_SASL_PASSWORD"]) == grants[user][1], name
        deps = svc["depends_on"]
        assert deps["kafka-init"]["condition"] == "service_completed_successfully", name
        assert deps["migrate"]["condition"] == "service_completed_successfully", name


def test_only_brokers_and_kafka_init_hold_the_admin_credentials() -> None:
    for name, svc in SERVICES.items():
        env = _env(svc)
        if name in (*BROKERS, "kafka-init"):
            continue
        assert not any("KAFKA_ADMIN_PASSWORD" in str(v) for v in env.values()), name
        user = str(env.get("SETTLE_KAFKA_SASL_USERNAME", ""))
        assert user not in ("admin", "") or "SETTLE_KAFKA_BOOTSTRAP" not in env, name
        assert "KAFKA_ADMIN_USER" not in user, name
        # No Kafka password where there is no Kafka client.
        if "SETTLE_KAFKA_BOOTSTRAP" not in env:
            assert "SETTLE_KAFKA_SASL_PASSWORD" not in env, name


# -- Airflow ---------------------------------------------------------------------------------

def test_airflow_runs_as_separate_components_at_each_site() -> None:
    for site in SITES:
        commands = {name: SERVICES[f"{name}-{site}"]["command"] for name in AIRFLOW_COMPONENTS}
        assert commands == {"airflow-apiserver": ["api-server"],
                            "airflow-scheduler": ["scheduler", "--skip-serve-logs"],
                            "airflow-dag-processor": ["dag-processor"],
                            "airflow-triggerer": ["triggerer", "--skip-serve-logs"]}, site
        init = SERVICES[f"airflow-init-{site}"]
        assert init["command"] == ["db", "migrate"] and init["restart"] == "no"
        assert init["entrypoint"] == ["/app/.venv/bin/airflow"]
        # Its metadata on its own site's server, never the other site's.
        assert init["depends_on"] == {f"postgres-site-{site}": {"condition": "service_healthy"}}
        for name in (*(f"{c}-{site}" for c in AIRFLOW_COMPONENTS), *(
                f"airflow-{job}-{site}" for job in ("init", "users", "pools"))):
            svc = SERVICES[name]
            assert svc["labels"] == {"settle.site": site}, name
            assert svc["profiles"] == [f"site-{site}"], name
            other = "b" if site == "a" else "a"
            assert not any(other in str(dep).rsplit("-", 1)[-1] and "site" in str(dep)
                           for dep in svc.get("depends_on", {})), name
        for name in (f"{c}-{site}" for c in AIRFLOW_COMPONENTS):
            svc = SERVICES[name]
            assert svc["image"] == APP_IMAGE
            assert svc["depends_on"][f"airflow-init-{site}"]["condition"] == \
                "service_completed_successfully", name
            # FAB's permission sync in two processes at once dies on a unique violation (a
            # stack start failed so): the components start once airflow-users has written
            # the rows.
            assert svc["depends_on"][f"airflow-users-{site}"]["condition"] == \
                "service_completed_successfully", name
            assert "healthcheck" in svc, name
            assert f"airflow-logs-{site}:/app/airflow/logs" in svc["volumes"], name
        api = SERVICES[f"airflow-apiserver-{site}"]
        assert "/api/v2/monitor/health" in " ".join(api["healthcheck"]["test"])
        assert [str(p).rsplit(":", 1)[1] for p in api["ports"]] == ["8080"]
    assert SERVICES["airflow-apiserver-a"]["ports"] != SERVICES["airflow-apiserver-b"]["ports"]


def _site(site: str) -> tuple[str, ...]:
    """Site ``site``'s Airflow: its four components and its airflow db migrate."""
    return (*(f"{c}-{site}" for c in AIRFLOW_COMPONENTS), f"airflow-init-{site}")


def _shared(var: str, services: tuple[str, ...] = (*AIRFLOW, "airflow-init-a",
                                                   "airflow-init-b")) -> str:
    values = {str(_env(SERVICES[name]).get(var)) for name in services}
    assert len(values) == 1, f"{var} differs between Airflow components: {values}"
    return values.pop()


# Each site's Airflow's own secrets (issue 58): site A's are the unsuffixed names.
SITE_SECRETS = {"AIRFLOW__CORE__FERNET_KEY": "FERNET_KEY", "AIRFLOW__API_AUTH__JWT_SECRET":
                "JWT_SECRET", "AIRFLOW__API__SECRET_KEY": "API_SECRET_KEY"}


def _site_secret(site: str, name: str) -> str:
    return f"AIRFLOW_{name}" if site == "a" else f"AIRFLOW_{site.upper()}_{name}"


def test_each_sites_airflow_keeps_its_metadata_on_its_own_server_and_has_its_own_secrets(
        ) -> None:
    for site in SITES:
        raw = _shared("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", _site(site))
        url = urlsplit(_interpolate(raw, {_site_secret(site, "DB_PASSWORD"): "from-dotenv"}))
        # The site's own server: not the settlement cluster, whose member at this site is a
        # read-only standby whenever the other site holds the primary.
        assert url.scheme.startswith("postgresql") and url.hostname == f"postgres-site-{site}"
        assert url.path == "/airflow" and url.password == "from-dotenv"
        assert url.username == "airflow"  # its own login, owner of that database only
        assert "sslmode=verify-full" in url.query
        assert _interpolate(_shared("AIRFLOW__CORE__EXECUTION_API_SERVER_URL", _site(site)),
                            {}) == f"https://airflow-apiserver-{site}:8080/execution/"
        assert _shared("AIRFLOW__API__BASE_URL", _site(site)).startswith("${AIRFLOW_")
        # Every component of the site agrees on them; the other site has its own.
        for var, name in SITE_SECRETS.items():
            assert _ref(_shared(var, _site(site))) == _site_secret(site, name), (site, var)
    # A site's own server makes its Airflow's login with that site's password.
    for site in SITES:
        init = _env(SERVICES[f"postgres-site-{site}"])
        assert _ref(str(init["AIRFLOW_DB_PASSWORD"])) == _site_secret(site, "DB_PASSWORD")
        assert _ref(str(init["POSTGRES_PASSWORD"])) == \
            f"SETTLE_PG_SITE_{site.upper()}_ADMIN_PASSWORD"
    assert _shared("AIRFLOW__CORE__EXECUTOR") == "LocalExecutor"
    assert _shared("AIRFLOW__CORE__DAGS_FOLDER") == "/app/dags"
    assert _shared("AIRFLOW__CORE__LOAD_EXAMPLES") == "False"
    assert _shared("AIRFLOW_HOME") == "/app/airflow"
    # Roles (auditors view, operations act): the FAB auth manager, whose provider is installed.
    manager = _shared("AIRFLOW__CORE__AUTH_MANAGER")
    assert manager == "airflow.providers.fab.auth_manager.fab_auth_manager.FabAuthManager"
    assert importlib.util.find_spec(manager.rsplit(".", 1)[0])
    # The UI logins' passwords reach the one-shot airflow-users-* only.
    for name, svc in SERVICES.items():
        has = {"AIRFLOW_ADMIN_PASSWORD", "AIRFLOW_OPERATIONS_PASSWORD",
               "AIRFLOW_AUDITOR_PASSWORD"} & set(_env(svc))
        assert bool(has) == (name in ("airflow-users-a", "airflow-users-b")), name


@pytest.mark.parametrize("site", SITES)
def test_airflow_is_served_over_verified_https_on_the_address_the_operator_sets(
        site: str) -> None:
    api = SERVICES[f"airflow-apiserver-{site}"]
    env = _env(api)
    files = _cert_files(api)
    # The api-server's own certificate and key (Airflow's [api] ssl_cert / ssl_key: HTTPS).
    assert env["AIRFLOW__API__SSL_CERT"] == files[f"airflow-apiserver-{site}.crt"] == \
        "/certs/airflow.crt"
    assert env["AIRFLOW__API__SSL_KEY"] == files[f"airflow-apiserver-{site}.key"] == \
        "/certs/airflow.key"
    # Every component that calls it (the task processes: the execution API) trusts the
    # stack's CA alone; every URL to it is https.
    assert _shared("AIRFLOW__API__SSL_CA_FILE") == "/certs/ca.crt"
    assert _shared("AIRFLOW__API__CLIENT_USE_PUBLIC_CERTS") == "False"
    for name in AIRFLOW:
        assert _cert_files(SERVICES[name])["ca.crt"] == "/certs/ca.crt", name
    assert _interpolate(_shared("AIRFLOW__API__BASE_URL", _site(site)), {}).startswith("https://")
    assert _interpolate(_shared("AIRFLOW__CORE__EXECUTION_API_SERVER_URL", _site(site)), {}) \
        .startswith("https://")
    health = " ".join(api["healthcheck"]["test"])
    internal = "AIRFLOW_INTERNAL_URL" if site == "a" else "AIRFLOW_B_INTERNAL_URL"
    assert (f"'${{{internal}:-https://airflow-apiserver-{site}:8080}}/api/v2/monitor/health'"
            in health)
    assert "cafile='/certs/ca.crt'" in health and "CERT_NONE" not in health
    # Published on loopback unless .env names an address.
    port = 18080 if site == "a" else 18081
    assert api["ports"] == [f"${{AIRFLOW_BIND_ADDRESS:-127.0.0.1}}:{port}:8080"]
    active, commented = _env_example()
    assert "AIRFLOW_BIND_ADDRESS" in active | commented
    # Nothing else of Airflow's listens beyond loopback: no log server (Airflow 3.3 has no
    # setting for its address, and it is plain HTTP), the scheduler's health check on 127.0.0.1.
    for name in (f"airflow-scheduler-{site}", f"airflow-triggerer-{site}"):
        assert "--skip-serve-logs" in SERVICES[name]["command"], name
    assert _shared("AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_SERVER_HOST") == "127.0.0.1"
    assert "//127.0.0.1:8974/" in " ".join(
        SERVICES[f"airflow-scheduler-{site}"]["healthcheck"]["test"])
    # The local stack (host networking): the api-server binds AIRFLOW_BIND_ADDRESS itself,
    # and no plain-HTTP URL to it is left anywhere.
    local = (ROOT / "deploy/local/docker-compose.local.yml").read_text()
    assert '"--host", "${AIRFLOW_BIND_ADDRESS:-127.0.0.1}"' in local
    for text in (COMPOSE_TEXT, local, (ROOT / ".env.example").read_text()):
        assert not re.search(r"http://(localhost|127\.0\.0\.1|airflow-apiserver(-[ab])?):"
                             r"(1|2)?808[01]", text)


def test_airflow_metadata_db_drivers_are_installed() -> None:
    """Airflow's URLs say +psycopg (psycopg 3, the project's driver), including the async one
    (Airflow derives +asyncpg when it is unset)."""
    from sqlalchemy import create_engine
    from sqlalchemy.ext.asyncio import create_async_engine

    dotenv = {"AIRFLOW_DB_PASSWORD": "pw", "AIRFLOW_B_DB_PASSWORD": "pw"}
    sync = _interpolate(_shared("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", _site("b")), dotenv)
    async_url = _shared("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC", _site("b"))
    assert async_url != "None", "set SQL_ALCHEMY_CONN_ASYNC (asyncpg is not installed)"
    async_url = _interpolate(async_url, dotenv)
    for url in (sync, async_url):
        driver = urlsplit(url).scheme.partition("+")[2]
        assert driver and importlib.util.find_spec(driver), f"{url}: driver not installed"
    assert create_engine(sync).dialect.driver == "psycopg"
    assert create_async_engine(async_url).dialect.is_async


@pytest.mark.parametrize("site", SITES)
def test_airflow_task_runner_has_the_dags_connections_and_settlement_user(site: str) -> None:
    from settlement.orchestration.tasks import airflow_connections

    env = _env(SERVICES[f"airflow-scheduler-{site}"])
    # Named in the close lease (closed_by in the site drills) and in `settle status`.
    assert env["SETTLE_SITE_NAME"] == site
    needed = set(airflow_connections(Settings()))
    assert needed <= set(env), f"missing {needed - set(env)}"
    dotenv = {"SETTLE_PG_SETTLEMENT_PASSWORD": "pw"}
    spark = json.loads(_interpolate(env["AIRFLOW_CONN_SPARK_DEFAULT"], dotenv))
    assert spark["conn_type"] == "spark" and spark["host"] == "local[2]"
    kafka = json.loads(env["AIRFLOW_CONN_KAFKA_DEFAULT"])
    assert kafka["extra"]["bootstrap.servers"] == env["SETTLE_KAFKA_BOOTSTRAP"]
    assert kafka["extra"]["security.protocol"] == env["SETTLE_KAFKA_SECURITY_PROTOCOL"]
    # Only the scheduler runs tasks (LocalExecutor): the others get no application secrets,
    # except what their own part needs: the api-server reads the settlement database for the
    # audit-report pages, the triggerer for the "not settled" alert's verdict.
    shared_ops = {"SETTLE_DRILLS_ENABLED", "SETTLE_EXCHANGE_CALENDAR",
                  "SETTLE_EOD_AFTER_CLOSE_MINUTES", "SETTLE_EOD_CUTOFF_MINUTES",
                  "SETTLE_EOD_CRON", "SETTLE_EOD_COMPRESSED"}
    allowed = {f"airflow-apiserver-{site}": {"AIRFLOW_CONN_SETTLEMENT_DB"},
               f"airflow-dag-processor-{site}": set(),
               f"airflow-triggerer-{site}": {"SETTLE_PG_DSN", "SETTLE_ALERT_EMAIL",
                                             "SETTLE_ALERT_WEBHOOK"}}
    for name, extra in allowed.items():
        app_vars = {v for v in _env(SERVICES[name]) if v.startswith(("SETTLE_", "AIRFLOW_CONN_"))}
        assert app_vars - shared_ops == extra, f"{name}: {app_vars - shared_ops}"


def test_airflow_operations_settings() -> None:
    """Drills are off in production; every component agrees on the calendar and the cutoff;
    the spark pool exists before the scheduler runs anything."""
    assert _shared("SETTLE_DRILLS_ENABLED") == "false"
    assert _ref(_shared("SETTLE_EXCHANGE_CALENDAR")) == "SETTLE_EXCHANGE_CALENDAR"
    assert _ref(_shared("SETTLE_EOD_CUTOFF_MINUTES")) == "SETTLE_EOD_CUTOFF_MINUTES"
    from settlement.orchestration.tasks import SPARK_POOL

    for site in SITES:
        pools = SERVICES[f"airflow-pools-{site}"]
        assert pools["command"][:4] == ["pools", "set", "spark", "1"]
        assert SERVICES[f"airflow-scheduler-{site}"]["depends_on"][f"airflow-pools-{site}"][
            "condition"] == "service_completed_successfully"
        assert pools["command"][2] == SPARK_POOL
        # Each site alerts.
        for name in (f"airflow-scheduler-{site}", f"airflow-triggerer-{site}"):
            env = _env(SERVICES[name])
            assert _ref(env["SETTLE_ALERT_EMAIL"]) == "SETTLE_ALERT_EMAIL", name


# -- PostgreSQL logins ------------------------------------------------------------------------

def _pg_urls(svc: dict[str, Any]) -> list[tuple[str, Any]]:
    """Every PostgreSQL URL in a service's environment, as (variable, parsed URL)."""
    out = []
    for var, value in _env(svc).items():
        text = str(value)
        if text.startswith(("postgres://", "postgresql://", "postgresql+")):
            values = {m[0]: "pw" for m in VAR_REF.findall(text)}
            out.append((var, urlsplit(_interpolate(text, values))))
    return out


def test_only_the_one_shot_setup_logs_in_as_the_postgres_admin() -> None:
    seen = {}
    for name, svc in SERVICES.items():
        users = {url.username for _, url in _pg_urls(svc)}
        if users:
            seen[name] = users
    assert seen == PG_USERS
    # The admin's password is in the cluster's members (Patroni creates the admin) and migrate.
    for name, svc in SERVICES.items():
        if "SETTLE_PG_ADMIN_PASSWORD" in json.dumps(_env(svc)):
            assert name in (*PG_MEMBERS, *SITE_PG, "migrate", "migrate-a", "migrate-b"), name
    assert SERVICES["migrate"]["restart"] == "no"
    for m in PG_MEMBERS:
        assert _env(SERVICES[m])["PATRONI_SUPERUSER_USERNAME"] == PG_ADMIN


def test_every_postgres_client_lists_both_members_and_asks_for_the_primary() -> None:
    # A failover moves the primary to the other site: a client that named one server, or
    # took whichever answered first, would write nowhere or to a read-only standby.
    # Each site lists its own member first: a silent other site costs a connect_timeout
    # per new connection otherwise.
    views = {"a": ("@${PG_ADDRESS:-postgres-a:5432,postgres-b:5432}/",  # libpq's host list
                   "@/", "host=${PG_HOSTS:-postgres-a,postgres-b}&port=${PG_PORTS:-5432,5432}"),
             "b": ("@${PG_ADDRESS_B:-postgres-b:5432,postgres-a:5432}/", "@/",
                   "host=${PG_HOSTS_B:-postgres-b,postgres-a}&port=${PG_PORTS_B:-5432,5432}")}
    found = 0
    for name, svc in SERVICES.items():
        for var, value in _env(svc).items():
            text = str(value)
            if not text.startswith(("postgres://", "postgresql://", "postgresql+")):
                continue
            site = re.search(r"@\$\{PG_SITE_([AB])_ADDRESS:-postgres-site-([ab]):5432\}/", text)
            if site:
                # A site's own server (one server, no standby): its ledger or its Airflow's
                # metadata, reached by that site (or, for the ledgers, by either close).
                assert site[1].lower() == site[2], (name, var)
                assert re.search(rf"/(ledger_{site[2]}|airflow)\?", text), (name, var)
                # The admin (the migrations) also presents its client certificate.
                tls = "sslmode=verify-full&sslrootcert=/certs/ca.crt"
                admin = "&sslcert=/certs/postgres-admin.crt&sslkey=/certs/postgres-admin.key"
                assert text.endswith(tls + admin if text.startswith("postgresql://settle:")
                                     else tls), (name, var)
                continue
            member = re.search(r"@\$\{PG_([AB])_ADDRESS:-postgres-([ab]):5432\}/settlement\?", text)
            if member:
                # A member's exporter watches that one server, whichever its role.
                assert member[1].lower() == member[2] and name == f"postgres-exporter-{member[2]}"
                assert text.endswith("sslmode=verify-full&sslrootcert=/certs/ca.crt"), (name, var)
                continue
            found += 1
            both = views["b" if name.endswith("-b") else "a"]
            assert both[0] in text or (both[1] in text and both[2] in text), (name, var)
            assert text.endswith("&target_session_attrs=read-write"), (name, var)
            assert "sslmode=verify-full&sslrootcert=/certs/ca.crt" in text, (name, var)
    assert found >= 16, found


def test_migrate_creates_one_login_per_component_with_its_own_password() -> None:
    from settlement.config import COMPONENT_GROUPS

    grants = _pg_grants()
    assert {c for c, _ in grants.values()} == set(COMPONENT_GROUPS)
    env = _env(SERVICES["migrate"])
    for user, (_, password_env) in grants.items():
        assert _ref(env[password_env]) == password_env, user
    # Each component's URLs carry the password migrate gave that user, and no other's.
    for name, svc in SERVICES.items():
        for var, value in _env(svc).items():
            text = str(value)
            for user, (_, password_env) in grants.items():
                if f"//{user}:" in text:
                    assert f"${{{password_env}:?" in text, (name, var)


def test_postgres_init_creates_the_airflow_login_from_stdin() -> None:
    script = (ROOT / "deploy" / "postgres-init.sh").read_text()
    assert "CREATE ROLE airflow LOGIN PASSWORD :'pw';" in script
    # Run by Patroni's post_bootstrap on the member that initialises the cluster.
    patroni = yaml.safe_load((ROOT / "deploy/patroni/patroni.yml").read_text())
    assert patroni["bootstrap"]["post_bootstrap"] == "bash /opt/settle/post-bootstrap.sh"
    bootstrap = (ROOT / "deploy/patroni/post-bootstrap.sh").read_text()
    assert "CREATE DATABASE settlement" in bootstrap and "/opt/settle/postgres-init.sh" in bootstrap
    # The cluster holds the settlement database and the shared ledger; the site ledgers and
    # the Airflows' metadata (and so the `airflow` login) are on each site's own server.
    for m in SITE_PG:
        env = _env(SERVICES[m])
        assert "AIRFLOW_DB_PASSWORD" in env and env["PG_INIT_DATABASES"] == "", m
        assert env["POSTGRES_DB"] == f"ledger_{m[-1]}", m
        assert "./deploy/postgres-init.sh:/docker-entrypoint-initdb.d/00-databases.sh:ro" in \
            SERVICES[m]["volumes"], m
    for m in PG_MEMBERS:
        env = _env(SERVICES[m])
        assert "AIRFLOW_DB_PASSWORD" not in env and env["PG_INIT_DATABASES"] == "ledger_shared"
        mounts = SERVICES[m]["volumes"]
        assert "./deploy/postgres-init.sh:/opt/settle/postgres-init.sh:ro" in mounts
        assert "./deploy/patroni/post-bootstrap.sh:/opt/settle/post-bootstrap.sh:ro" in mounts


@pytest.mark.parametrize("site", SITES)
def test_airflow_users_gives_each_login_one_role(site: str) -> None:
    from settlement.orchestration.fab_users import ROLES, UserGrant

    svc = SERVICES[f"airflow-users-{site}"]
    cmd = [str(c) for c in svc["command"]]
    assert cmd[0] == "airflow-users" and svc["restart"] == "no"
    grants = [UserGrant.parse(_interpolate(v, {})) for v in cmd[2::2]]
    assert {g.role for g in grants} == set(ROLES)
    for g in grants:
        assert _ref(_env(svc)[g.password_env]) == g.password_env
    assert svc["depends_on"][f"airflow-init-{site}"]["condition"] == \
        "service_completed_successfully"


class _LocalLoader(yaml.SafeLoader):
    """The local override's compose tags (!reset) read as plain values."""


_LocalLoader.add_multi_constructor("!", lambda loader, _tag, node: (
    loader.construct_scalar(node) if isinstance(node, yaml.ScalarNode)
    else loader.construct_sequence(node) if isinstance(node, yaml.SequenceNode)
    else loader.construct_mapping(node)))


@pytest.mark.parametrize("site", SITES)
def test_each_sites_airflow_exporter_watches_its_own_api_server_over_https(site: str) -> None:
    """Prometheus's view of Airflow (issue 46): `settle airflow-exporter` at the site, in the
    application image, asking that site's api-server (its internal URL, the stack's CA) and
    serving HTTPS with its own key pair; on the local stack on loopback, on the port
    Prometheus scrapes."""
    from settlement.stack import envfile

    name = f"airflow-exporter-{site}"
    svc = SERVICES[name]
    assert svc["labels"]["settle.site"] == site and svc["profiles"] == [f"site-{site}"]
    assert svc["image"] == SERVICES["site-a"]["image"] and svc["restart"] == "unless-stopped"
    cmd = [str(c) for c in svc["command"]]
    assert cmd[:3] == ["airflow-exporter", "--site", site], cmd
    url = cmd[cmd.index("--airflow-url") + 1]
    internal = "AIRFLOW_INTERNAL_URL" if site == "a" else "AIRFLOW_B_INTERNAL_URL"
    assert url == f"${{{internal}:-https://airflow-apiserver-{site}:8080}}", url
    assert cmd[cmd.index("--tls-cert") + 1] == "/certs/airflow-exporter.crt"
    assert cmd[cmd.index("--tls-key") + 1] == "/certs/airflow-exporter.key"
    local = yaml.load((ROOT / "deploy/local/docker-compose.local.yml").read_text(),
                      Loader=_LocalLoader)["services"][name]
    assert local["network_mode"] == "host"
    lcmd = [str(c) for c in local["command"]]
    assert lcmd[:3] == cmd[:3] and "--tls-cert" in lcmd and "--tls-key" in lcmd, lcmd
    assert lcmd[lcmd.index("--airflow-url") + 1] == f"${{{internal}}}"
    assert lcmd[lcmd.index("--address") + 1] == "127.0.0.1"
    assert int(lcmd[lcmd.index("--port") + 1]) == envfile.AIRFLOW_EXPORTER_PORTS[site]
