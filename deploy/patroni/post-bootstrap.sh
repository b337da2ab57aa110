#!/usr/bin/env bash
# Patroni's post_bootstrap (deploy/patroni/patroni.yml): runs once, on the member that
# initialises the cluster, with its server up. Creates the settlement database, then what
# deploy/postgres-init.sh creates on the single server (the ledgers, the `airflow` login and
# database).
#
# The cluster holds settlement and ledger_shared only (PG_INIT_DATABASES in its environment);
# no `airflow` database: each site's Airflow keeps its metadata on its own server.
#
# Patroni passes the superuser's libpq connection string as $1 (key=value pairs; the password
# in the PGPASSFILE it sets) and keeps its PATRONI_* settings out of this environment.
set -euo pipefail
conn=${1:?post-bootstrap.sh: expected the connection string Patroni passes}
field() { sed -nE "s/(^|.* )$1=([^ ]+).*/\2/p" <<<"$conn" | tr -d "'"; }
admin=$(field user)
[[ -n $admin ]] || { echo "post-bootstrap: no user= in Patroni's connection string" >&2; exit 1; }
host=$(field host) port=$(field port)
export PGHOST=${host:-/var/run/postgresql} PGPORT=${port:-5432}
psql -v ON_ERROR_STOP=1 "$conn" -c 'CREATE DATABASE settlement'
POSTGRES_USER=$admin POSTGRES_DB=settlement exec bash /opt/settle/postgres-init.sh
