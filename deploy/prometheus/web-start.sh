#!/usr/bin/env bash
# Starts Prometheus, Alertmanager or the Pushgateway behind a login: their HTTPS configuration
# (the --web.config.file given, TLS only, mounted read-only) is written again into this
# container's own /tmp with `basic_auth_users` added (the login `monitoring`, as
# prometheus.yml names it, with MONITORING_PASSWORD_BCRYPT, the bcrypt hash of
# MONITORING_PASSWORD), and
# the command runs with that file in its place. Without the hash it refuses to start: an
# open Alertmanager takes silences and an open Pushgateway a passing drill's verdict from
# anyone who reaches it.
# Prometheus, the one client of the others inside the stack, also gets MONITORING_PASSWORD:
# written to /tmp/settle-monitoring-password (0600) for its configuration's password_file,
# then removed from the environment.
#
#   web-start.sh COMMAND [ARGS...]       e.g. web-start.sh /usr/bin/prometheus-pushgateway \
#                                                --web.config.file=/etc/settle/prometheus/web.yml
set -euo pipefail

: "${MONITORING_PASSWORD_BCRYPT:?set MONITORING_PASSWORD_BCRYPT (the bcrypt hash of MONITORING_PASSWORD) in .env}"
umask 077
web=/tmp/settle-web.yml
source_config=
args=()
for arg in "$@"; do
  case $arg in
    --web.config.file=*) source_config=${arg#*=}; args+=("--web.config.file=$web") ;;
    *) args+=("$arg") ;;
  esac
done
[[ -n $source_config ]] || { echo "web-start: no --web.config.file= among the arguments" >&2; exit 2; }
{
  cat "$source_config"
  echo "# Added by web-start.sh: the login."
  echo "basic_auth_users:"
  echo "  monitoring: '${MONITORING_PASSWORD_BCRYPT}'"
} >"$web"
if [[ -n ${MONITORING_PASSWORD:-} ]]; then
  printf '%s' "$MONITORING_PASSWORD" >/tmp/settle-monitoring-password
fi
unset MONITORING_PASSWORD MONITORING_PASSWORD_BCRYPT
exec "${args[@]}"
