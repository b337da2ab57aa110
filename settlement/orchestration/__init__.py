"""Airflow glue: what the DAG tasks call, the operators, the standalone UI, dag.test()."""
