#!/usr/bin/env bash
# Entrypoint of docker-compose's airflow-apiserver: `airflow "$@"` (the service's command is
# `api-server`) after writing the simple auth manager's password file from the environment.
#
# Airflow 3's simple auth manager takes its users from [core] simple_auth_manager_users
# ("admin:admin" = user admin with role admin) and their passwords from a JSON file
# ({"admin": "..."}); a user missing from the file gets a random password printed to the log.
# Writing the file from AIRFLOW_ADMIN_PASSWORD at every start keeps the login in .env, so a
# password is rotated by editing .env and recreating this one container.
set -euo pipefail

: "${AIRFLOW_HOME:?AIRFLOW_HOME is not set}"
: "${AIRFLOW_ADMIN_PASSWORD:?AIRFLOW_ADMIN_PASSWORD is not set (see .env.example)}"
passwords_file=${AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE:-$AIRFLOW_HOME/simple_auth_manager_passwords.json.generated}

umask 077
mkdir -p "$(dirname "$passwords_file")"
PASSWORDS_FILE=$passwords_file python - <<'EOF'
import json
import os

user = os.environ.get("AIRFLOW_ADMIN_USER") or "admin"
with open(os.environ["PASSWORDS_FILE"], "w") as f:
    json.dump({user: os.environ["AIRFLOW_ADMIN_PASSWORD"]}, f)
    f.write("\n")
EOF

exec airflow "$@"
