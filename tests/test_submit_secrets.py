"""No database password reaches spark-submit's command line, for any master: the provider's
real hook builds the command; its arguments, and the environment it hands a local driver,
carry DSNs without passwords; the passwords sit in a 0600 pgpass file (local driver) or in
the one mounted into a remote driver."""

from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import Any

import pytest
from psycopg.conninfo import conninfo_to_dict

from settlement.config import ConfigError, load_settings
from settlement.orchestration.submit_secrets import secure_env, split_password

SECRET = "s3cr:et\\pw"  # pgpass escapes ':' and '\\'
DSN = f"postgresql://settle_settlement:{SECRET.replace(':', '%3A').replace(chr(92), '%5C')}" \
      "@db.example:5433/settlement?sslmode=require"


def _settings(master: str) -> Any:
    return load_settings(spark_master=master, pg_dsn=DSN, ledger_a_dsn=DSN.replace(
        "/settlement?", "/ledger_a?"), spark_pgpassfile="/mnt/secrets/pgpass")


def _hook(master: str, mode: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    from airflow.providers.apache.spark.hooks import spark_submit

    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({
        "conn_type": "spark", "host": master, "extra": {"deploy-mode": mode}}))
    if master.startswith("k8s"):
        # Only the provider's import check: building a command talks to no cluster.
        monkeypatch.setattr(spark_submit, "kube_client", object(), raising=False)
    return spark_submit.SparkSubmitHook(conn_id="spark_default", env_vars={"EXTRA": "1"})


@pytest.mark.parametrize(("master", "mode"), [
    ("local[2]", "client"), ("spark://127.0.0.1:7077", "client"),
    ("k8s://https://k8s.example:6443", "client"), ("k8s://https://k8s.example:6443", "cluster"),
    ("yarn", "client"), ("yarn", "cluster")])
def test_no_password_in_the_built_command(master: str, mode: str, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from settlement.orchestration.operators import secure_hook

    hook = _hook(master, mode, monkeypatch)
    secure_hook(hook, _settings(master), tmp_path)
    cmd = hook._build_spark_submit_command("job.py")
    text = " ".join(cmd)
    assert "s3cr" not in text and "%3A" not in text, text
    assert "spark.redaction.regex=" in text
    env = hook._env or {}
    assert "s3cr" not in json.dumps(env)
    remote = mode == "cluster"
    if remote:
        # The driver is elsewhere: its settings go as --conf, naming the mounted file.
        assert "SETTLE_PG_DSN=" in text and "/mnt/secrets/pgpass" in text
        assert not (tmp_path / "pgpass").exists()
    else:
        # The driver is this spark-submit: the settings are its environment, not arguments.
        assert "SETTLE_PG_DSN" not in text and "driverEnv" not in text
        assert "appMasterEnv" not in text
        info = conninfo_to_dict(env["SETTLE_PG_DSN"])
        assert info.get("password") is None and info["passfile"] == str(tmp_path / "pgpass")
        assert env["EXTRA"] == "1"
        pgpass = tmp_path / "pgpass"
        assert stat.S_IMODE(pgpass.stat().st_mode) == 0o600
        assert "db.example:5433:settlement:settle_settlement:s3cr\\:et\\\\pw" in \
            pgpass.read_text().splitlines()


def test_a_remote_driver_without_a_mounted_pgpass_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="SETTLE_SPARK_PGPASSFILE is not set"):
        secure_env({"SETTLE_PG_DSN": DSN}, "k8s://https://k8s.example:6443", "cluster",
                   tmp_path, None)


@pytest.mark.parametrize("master", ["spark://127.0.0.1:7077", "local[2]"])
def test_cluster_mode_on_a_master_that_cannot_run_the_driver_remotely_is_refused(
        master: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A standalone master in cluster mode was once taken for a local driver: its driver, on
    a worker, would have got neither the DSNs' passwords nor the pgpass file."""
    from settlement.orchestration.operators import secure_hook

    hook = _hook(master, "cluster", monkeypatch)
    with pytest.raises(ConfigError, match="deploy-mode to 'client'"):
        secure_hook(hook, _settings(master), tmp_path)
    assert not (tmp_path / "pgpass").exists()  # no password written for a driver elsewhere


def test_a_dsn_without_a_password_keeps_its_own_pgpass_file(tmp_path: Path) -> None:
    embedded = "postgresql://settle_settlement@127.0.0.1:5432/settlement?passfile=/state/pgpass"
    assert split_password(embedded, str(tmp_path / "pgpass")) == (embedded, None)
    env = secure_env({"SETTLE_PG_DSN": embedded}, "local[2]", "client", tmp_path, None)
    assert env["SETTLE_PG_DSN"] == embedded and not (tmp_path / "pgpass").exists()


@pytest.mark.parametrize(("master", "mode"), [
    ("local[2]", "client"), ("k8s://https://k8s.example:6443", "cluster")])
def test_a_driver_in_spark_submit_shares_the_class_archive(
        master: str, mode: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The DAG's spark-submit builds the class archive the CLI's closes map (the same key),
    or maps it; the DAG's own driver options stay. A remote driver gets none."""
    from settlement.orchestration.operators import counted_rows, driver_archive
    from settlement.spark.jvm import QUICK_JIT, finish_archive

    settings = load_settings(spark_master=master, jars_dir=tmp_path / "jars")
    hook = _hook(master, mode, monkeypatch)
    hook._conf = {"spark.driver.extraJavaOptions": "-Dmine=1"}
    jvm = driver_archive(hook, settings)
    text = " ".join(hook._build_spark_submit_command("job.py"))
    if mode == "cluster":
        assert jvm is None and "Archive" not in text
        return
    assert jvm.archive == "building" and f"-XX:ArchiveClassesAtExit={jvm.building}" in text
    assert "-Dmine=1" in text
    # the CLI's base heap, not spark-submit's 1g; a size the DAG file set stays
    assert "spark.driver.memory=2g" in text
    sized = _hook(master, mode, monkeypatch)
    sized._conf = {"spark.driver.memory": "5g"}
    finish_archive(driver_archive(sized, settings), exited_cleanly=False)
    assert "spark.driver.memory=5g" in " ".join(sized._build_spark_submit_command("job.py"))
    jvm.building.write_bytes(b"archive")  # what the driver JVM writes at its exit
    assert finish_archive(jvm, exited_cleanly=True)
    again = _hook(master, mode, monkeypatch)
    used = driver_archive(again, settings)
    assert used.archive == "used" and used.archive_path == jvm.archive_path
    assert f"-XX:SharedArchiveFile={jvm.archive_path}" in " ".join(
        again._build_spark_submit_command("job.py"))
    # The JIT follows the day's size the DAG's source choice counted, as the CLI's close.
    assert QUICK_JIT not in text  # not counted: the JVM's default
    for rendered, quick in (("200000", True), (200000, True), ("None", False), (None, False),
                            (str(settings.spark_quick_jit_rows + 1), False)):
        sized = _hook(master, mode, monkeypatch)
        driver_archive(sized, settings, counted_rows(rendered))
        assert (QUICK_JIT in " ".join(sized._build_spark_submit_command("job.py"))) is quick
