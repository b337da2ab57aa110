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

        self.env_vars = {**(self.env_vars or {}), **settle_env(settings_from_airflow())}
        super().execute(context)
