#!/usr/bin/env bash
# Run once on an empty server, as the admin: by the postgres image on a site's own server
# (docker-entrypoint-initdb.d: postgres-site-a, postgres-site-b) and by Patroni's
# post_bootstrap on the settlement cluster (deploy/patroni/post-bootstrap.sh).
#
# PG_INIT_DATABASES: the databases to create besides POSTGRES_DB (space-separated; default
# the three ledgers, as on a single server). AIRFLOW_DB_PASSWORD, when set: the `airflow`
# login that owns Airflow's metadata database (and nothing else). Tables come from
# sql/migrations, and each component's own login from the one-shot `migrate` services
# (`settle db migrate --grant ...`).
#
# The password reaches psql on stdin as a variable (:'pw' quotes it as a literal), never on a
# command line; the server stores it as a SCRAM verifier (password_encryption's default).
set -euo pipefail

for db in ${PG_INIT_DATABASES-ledger_a ledger_b ledger_shared}; do
  [[ $db =~ ^[a-z_][a-z0-9_]*$ ]] || { echo "postgres-init: bad database name $db" >&2; exit 1; }
  psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" \
    -c "CREATE DATABASE $db"
done

if [[ -n ${AIRFLOW_DB_PASSWORD:-} ]]; then
  {
    printf '\\set pw %s\n' "'${AIRFLOW_DB_PASSWORD//\'/\'\'}'"
    cat <<'SQL'
CREATE ROLE airflow LOGIN PASSWORD :'pw';
CREATE DATABASE airflow OWNER airflow;
REVOKE ALL ON DATABASE airflow FROM PUBLIC;
SQL
  } | psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname "$POSTGRES_DB"
fi
