"""Database passwords never travel on spark-submit's command line.

The Spark provider turns ``env_vars`` into ``--conf spark.kubernetes.driverEnv.K=V`` (k8s)
or ``spark.yarn.appMasterEnv.K=V`` (YARN): arguments that ``ps``, the task log and Spark's
Environment tab all show. So the job's DSNs carry no password, only ``passfile=``:

- a driver on this host (local, standalone, and k8s or YARN in client mode) reads a pgpass
  file written here for the run (0600 in a 0700 folder, removed afterwards); its
  environment goes to the spark-submit process itself, never into arguments (in k8s client
  mode the provider would otherwise put it into driverEnv, which a local driver never
  sees, and the job would silently fall back to inherited settings);
- a driver elsewhere (k8s or YARN in cluster mode) reads the pgpass file mounted into it,
  whose path is ``SETTLE_SPARK_PGPASSFILE``; without it the task refuses to submit;
- cluster mode on any other master (a standalone ``spark://`` cluster) is refused with the
  reason: Spark runs no Python application's driver on a standalone worker, and the provider
  could pass it no environment either, so it would start with neither DSNs nor passwords.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from psycopg.conninfo import conninfo_to_dict

from settlement.config import ConfigError
from settlement.services.procs import write_private

DSN_VARS_SUFFIX = "_DSN"
# Spark's default redaction pattern, plus DSNs and pgpass paths (nothing secret is left in
# them, but a hand-set variable might carry one).
REDACTION_REGEX = r"(?i)secret|password|token|access[.]?key|dsn|passfile"


def remote_driver(master: str, deploy_mode: str | None) -> bool:
    """True when the driver runs on another machine than spark-submit. Cluster mode on a
    master that cannot run this job's driver remotely is refused (``ConfigError``)."""
    if deploy_mode != "cluster":
        return False
    if master.startswith("k8s://") or "yarn" in master:
        return True
    raise ConfigError(
        f"the spark_default connection asks for deploy mode 'cluster' on master {master}: "
        "Spark runs no Python application's driver on a standalone cluster's worker (spark-"
        "submit refuses it), and such a driver would get neither the job's DSNs nor their "
        "passwords. Set the connection's deploy-mode to 'client' (the driver runs beside "
        "the Airflow worker, the executors on the cluster), or use a k8s:// or YARN master "
        "with SETTLE_SPARK_PGPASSFILE")


def _escape(field: str) -> str:
    return field.replace("\\", "\\\\").replace(":", "\\:")


def split_password(dsn: str, passfile: str, force: bool = False) -> tuple[str, str | None]:
    """``dsn`` without its password and naming ``passfile``, and its pgpass line. A DSN
    without a password (say, the embedded one, which names its own pgpass file) is kept as
    it is unless ``force``: then it names ``passfile`` too."""
    info = {k: str(v) for k, v in conninfo_to_dict(dsn).items() if v is not None}
    password = info.pop("password", None)
    if password is None and not force:
        return dsn, None
    info["passfile"] = passfile
    line = None
    if password is not None:
        # libpq matches a passfile line against each server of a list on its own: a DSN
        # naming several (a cluster's members) gets a line for any server.
        several = "," in info.get("host", "") + info.get("port", "")
        line = ":".join(_escape(x) for x in (
            "*" if several else info.get("host", "*"),
            "*" if several else info.get("port", "5432"), info.get("dbname", "*"),
            info.get("user", "*"), password))
    return _url(info), line


def _url(info: dict[str, str]) -> str:
    """Conninfo fields as a postgresql:// URL: the job's settings accept DSNs only in that
    form (a key=value string was refused, so a deployment whose DSNs carry passwords could
    not settle: found by the first start of docker-compose.yml)."""
    from urllib.parse import quote, urlencode

    info = dict(info)
    user = quote(info.pop("user", ""), safe="")
    host = info.pop("host", "")
    port = info.pop("port", "")
    dbname = quote(info.pop("dbname", ""), safe="")
    if "," in host + port:
        # Several servers (a cluster's members, tried in turn): in the query, where libpq
        # takes lists of hosts and ports; "h1,h2:p1,p2" in the authority would not parse.
        info = {"host": host, "port": port, **info} if port else {"host": host, **info}
        host = port = ""
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"  # an IPv6 address
    netloc = (f"{user}@" if user else "") + host + (f":{port}" if port else "")
    # %20, not "+" (libpq reads "+" literally); "/" kept, so paths stay readable.
    query = urlencode(info, quote_via=lambda v, *_: quote(v, safe="/"))
    return f"postgresql://{netloc}/{dbname}" + (f"?{query}" if query else "")


def secure_env(env: Mapping[str, str], master: str, deploy_mode: str | None,
               run_dir: Path | None, mounted_passfile: str | None) -> dict[str, str]:
    """``env`` with every ``*_DSN`` value stripped of its password. A local driver's
    passwords go to ``run_dir/pgpass`` (0600); a remote driver names ``mounted_passfile``."""
    remote = remote_driver(master, deploy_mode)
    if remote:
        if not mounted_passfile:
            raise ConfigError(
                f"SETTLE_SPARK_PGPASSFILE is not set: with master {master} in cluster mode the "
                "Spark driver runs elsewhere and spark-submit would pass its environment as "
                "--conf arguments, so passwords are never sent that way. Mount a pgpass file "
                "with the settlement and ledger logins into the driver (a Kubernetes secret: "
                "spark.kubernetes.driver.secrets.<name>=<dir>) and set "
                "SETTLE_SPARK_PGPASSFILE to its path there")
        passfile = mounted_passfile
    else:
        if run_dir is None:
            raise ValueError("a local driver needs a folder for its pgpass file")
        passfile = str(run_dir / "pgpass")
    out, lines = dict(env), []
    for key, value in env.items():
        if key.endswith(DSN_VARS_SUFFIX) and value:
            out[key], line = split_password(value, passfile, force=remote)
            if line is not None and line not in lines:
                lines.append(line)
    if lines and not remote:
        write_private(Path(passfile), "\n".join(lines) + "\n")
    return out
