#!/usr/bin/env bash
# A settlement cluster member's entrypoint (docker-compose.yml: postgres-a, postgres-b):
# pgBackRest's TLS server beside Patroni, so the repository at the witness can back this
# member's data directory up when it is the primary (deploy/pgbackrest/member.conf). The
# server is started again if it ends; Patroni is the container's process, as before.
set -uo pipefail
(
  while :; do
    pgbackrest server
    echo "member-start: pgbackrest server exited ($?); starting it again in 2 s" >&2
    sleep 2
  done
) &
exec /opt/patroni/bin/patroni /etc/patroni/patroni.yml
