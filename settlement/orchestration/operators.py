"""Operators the DAGs use that need more than wiring."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.providers.standard.operators.hitl import ApprovalOperator


class SettlementSparkSubmitOperator(SparkSubmitOperator):
    """``spark-submit`` of the settlement job with the services' environment.

    The environment is built from the Airflow connections when the task runs, after
    templates are rendered: never in an XCom or in the rendered-template view that the UI
    shows and the metadata database keeps. Its DSNs carry no password
    (``settlement.orchestration.submit_secrets``): a driver on this host reads a pgpass file
    written for the run, a remote one (k8s or YARN cluster mode) the one mounted into it.
    """

    # ``day_rows``: the day's size as the DAG's source choice counted it (templated from its
    # XCom; "None" when it could not count), which decides the driver's JIT.
    template_fields = (*SparkSubmitOperator.template_fields, "day_rows")

    def __init__(self, *, day_rows: str | int | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.day_rows = day_rows

    def execute(self, context: Any) -> None:
        from settlement.orchestration.tasks import settings_from_airflow
        from settlement.spark.session import cluster_conf, is_cluster

        self._settings = settings_from_airflow()
        if is_cluster(self._settings.spark_master):
            # On a cluster the executors are other processes on other hosts: they get the
            # settlement code as --py-files (fetched from the driver, like the --jars) and
            # executor sizes; what the DAG file set explicitly wins.
            extra = cluster_conf(self._settings)
            py_files = extra.pop("spark.submit.pyFiles")
            self.py_files = ",".join(x for x in (self.py_files, py_files) if x)
            self.conf = {**extra, **(self.conf or {})}
        self._run_dir = Path(tempfile.mkdtemp(prefix="settle-submit-"))  # 0700
        self._jvm = None
        ok = False
        try:
            super().execute(context)
            ok = True
        finally:
            shutil.rmtree(self._run_dir, ignore_errors=True)
            if self._jvm is not None:
                from settlement.spark.jvm import finish_archive

                # spark-submit has returned: its driver JVM wrote the archive at its exit
                finish_archive(self._jvm, ok)

    def _get_hook(self) -> SparkSubmitHook:
        hook = super()._get_hook()
        if getattr(self, "_run_dir", None) is not None:  # set by execute()
            secure_hook(hook, self._settings, self._run_dir)
            if self._jvm is None:  # one decision (and one claim of the lock) per run
                self._jvm = driver_archive(hook, self._settings, counted_rows(self.day_rows))
        return hook


def counted_rows(rendered: str | int | None) -> int | None:
    """The day's rows as the templated XCom renders them: a number, or its text (None,
    "None" or "": not counted)."""
    if isinstance(rendered, int):
        return rendered
    return int(rendered) if rendered and rendered.strip().isdigit() else None


def driver_archive(hook: SparkSubmitHook, settings: Any, day_rows: int | None = None) -> Any:
    """A driver that runs in the spark-submit process maps the class archive the CLI's
    closes share (settlement.spark.jvm), or builds it, and runs the quick compiler alone for
    a day of ``day_rows`` up to ``spark_quick_jit_rows`` as the CLI's close does (None: the
    JVM's default JIT): the options join the job's spark.driver.extraJavaOptions. Returns
    the decision (None for a remote driver, which starts on another machine)."""
    from settlement.orchestration.submit_secrets import remote_driver
    from settlement.spark.session import (
        plan_driver_jvm,
        quick_jit,
        spark_jars,
        with_driver_options,
    )

    conn = hook._connection
    if remote_driver(conn["master"], conn.get("deploy_mode")):
        return None
    # The same key as the CLI's: --jars load in a class loader of their own, so the
    # driver's class path is Spark's either way.
    jvm = plan_driver_jvm(settings, spark_jars(settings),
                          quick_jit=quick_jit(settings, day_rows))
    conf = dict(hook._conf or {})
    # The driver's heap as the CLI's closes get it (spark-submit's own default is 1g). A size
    # the DAG file set wins.
    conf.setdefault("spark.driver.memory", settings.spark_driver_memory)
    conf["spark.driver.extraJavaOptions"] = with_driver_options(
        jvm, conf.get("spark.driver.extraJavaOptions"))
    hook._conf = conf
    return jvm


def secure_hook(hook: SparkSubmitHook, settings: Any, run_dir: Path) -> None:
    """Give ``hook`` the job's environment without a password in any argument: through the
    spark-submit process's own environment when the driver is that process, as --conf
    (passwordless, pointing at the mounted pgpass file) only when the driver is remote."""
    from settlement.orchestration.submit_secrets import REDACTION_REGEX, remote_driver, secure_env
    from settlement.orchestration.tasks import settle_env

    conn = hook._connection  # the provider's resolved spark connection: master, deploy mode
    master, mode = conn["master"], conn.get("deploy_mode")
    env = secure_env({**(hook._env_vars or {}), **settle_env(settings)}, master, mode,
                     run_dir, settings.spark_pgpassfile)
    hook._conf = {"spark.redaction.regex": REDACTION_REGEX, **(hook._conf or {})}
    if remote_driver(master, mode):
        hook._env_vars = env  # the provider makes them driverEnv / appMasterEnv --conf
    else:
        hook._env_vars = None  # nothing into arguments...
        hook._env = env  # ...the provider hands this to the spark-submit process


class RecloseApproval(ApprovalOperator):
    """Airflow's ApprovalOperator that also keeps the answer (the option chosen and who chose
    it) as the XCom ``decision``. A rejection skips the tasks after it by ending the task
    without a return value, and the decision must reach the audit trail either way."""

    def execute_complete(self, context: Any, event: dict[str, Any]) -> Any:
        user = event.get("responded_by_user")
        context["ti"].xcom_push(key="decision", value={
            "chosen_options": list(event.get("chosen_options") or []),
            "responded_by_user": dict(user) if user else None})
        return super().execute_complete(context, event)
