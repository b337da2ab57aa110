#!/usr/bin/env bash
# The official postgres image's start, reduced to what docker-compose.yml uses: on an empty
# data directory, initdb with POSTGRES_USER / POSTGRES_PASSWORD (SCRAM), POSTGRES_DB, then
# every /docker-entrypoint-initdb.d/*.sh against a server listening on its socket only;
# then the server in the foreground with the command's arguments (`postgres -c ...`).
set -euo pipefail

[[ ${1:-postgres} == postgres ]] || exec "$@"
[[ $# -gt 0 ]] && shift

if [[ ! -s $PGDATA/PG_VERSION ]]; then
  : "${POSTGRES_PASSWORD:?POSTGRES_PASSWORD is not set}"
  user=${POSTGRES_USER:-postgres}
  db=${POSTGRES_DB:-$user}
  mkdir -p "$PGDATA" && chmod 700 "$PGDATA"
  initdb --username="$user" --pwfile=<(printf '%s\n' "$POSTGRES_PASSWORD") \
    --auth-local=trust --auth-host=scram-sha-256 -E UTF8 -D "$PGDATA" >/dev/null
  echo "listen_addresses = '*'" >>"$PGDATA/postgresql.conf"
  pg_ctl -D "$PGDATA" -w -o "-c listen_addresses=''" start >/dev/null
  if [[ $db != postgres ]]; then
    psql -v ON_ERROR_STOP=1 --username "$user" --dbname postgres \
      -c "CREATE DATABASE \"$db\"" >/dev/null
  fi
  for script in /docker-entrypoint-initdb.d/*.sh; do
    [[ -e $script ]] || continue
    echo "postgres-entrypoint: running $script"
    POSTGRES_USER=$user POSTGRES_DB=$db bash "$script"
  done
  pg_ctl -D "$PGDATA" -m fast -w stop >/dev/null
  echo "postgres-entrypoint: database initialised"
fi

exec postgres "$@"
