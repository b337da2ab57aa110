"""What the stack's Prometheus scrapes that the components do not serve themselves (issue 46):
each site's Airflow, through ``settle airflow-exporter`` (settlement.monitoring.airflow)."""
