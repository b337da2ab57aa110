#!/usr/bin/env bash
# Run once by the postgres image on an empty volume (docker-entrypoint-initdb.d), as the admin:
# the databases the product uses, and the `airflow` login that owns Airflow's metadata
# database (and nothing else). Tables come from sql/migrations, and each component's own
# login from the one-shot `migrate` service (`settle db migrate --grant ...`).
#
# The password reaches psql on stdin as a variable (:'pw' quotes it as a literal), never on a
# command line; the server stores it as a SCRAM verifier (password_encryption's default).
set -euo pipefail

: "${AIRFLOW_DB_PASSWORD:?AIRFLOW_DB_PASSWORD is not set (see .env.example)}"

psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" <<'SQL'
CREATE DATABASE ledger_a;
CREATE DATABASE ledger_b;
CREATE DATABASE ledger_shared;
SQL

{
  printf '\\set pw %s\n' "'${AIRFLOW_DB_PASSWORD//\'/\'\'}'"
  cat <<'SQL'
CREATE ROLE airflow LOGIN PASSWORD :'pw';
CREATE DATABASE airflow OWNER airflow;
REVOKE ALL ON DATABASE airflow FROM PUBLIC;
SQL
} | psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname "$POSTGRES_DB"
