"""Operators the DAGs use that need more than wiring."""

from __future__ import annotations

from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator


class SettlementSparkSubmitOperator(SparkSubmitOperator):
    """``spark-submit`` of the settlement job with the services' environment.

    The environment holds database URLs with passwords, so it is built from the Airflow
    connections when the task runs, after templates are rendered: never in an XCom or in
    the rendered-template view that the UI shows and the metadata database keeps.
    """

    def execute(self, context: Any) -> None:
        from settlement.orchestration.tasks import settings_from_airflow, settle_env
        from settlement.spark.session import cluster_conf, is_cluster

        settings = settings_from_airflow()
        self.env_vars = {**(self.env_vars or {}), **settle_env(settings)}
        if is_cluster(settings.spark_master):
            # On a cluster the executors are other processes on other hosts: they get the
            # settlement code as --py-files (fetched from the driver, like the --jars) and
            # executor sizes; what the DAG file set explicitly wins.
            extra = cluster_conf(settings)
            py_files = extra.pop("spark.submit.pyFiles")
            self.py_files = ",".join(x for x in (self.py_files, py_files) if x)
            self.conf = {**extra, **(self.conf or {})}
        super().execute(context)
