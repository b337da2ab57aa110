#!/usr/bin/env bash
# Starts Alertmanager with a configuration written from the environment, so that it routes to
# the same people and places as the close's own alerts (settlement/orchestration/alerts.py):
#   SETTLE_ALERT_EMAIL    comma-separated recipients (through ALERTMANAGER_SMTP_SMARTHOST,
#                         host:port, as ALERTMANAGER_SMTP_FROM, with ALERTMANAGER_SMTP_USERNAME
#                         and ALERTMANAGER_SMTP_PASSWORD if the relay wants a login)
#   SETTLE_ALERT_WEBHOOK  a URL every notification is POSTed to (Alertmanager's webhook JSON)
# Neither set: the alerts are held and shown (the API, the UI) but sent nowhere.
# The configuration holds the webhook URL and the SMTP password: it is written into this
# container's own file system (0600), never into a mounted file or onto a command line.
# Extra arguments are Alertmanager's.
set -euo pipefail

conf=${ALERTMANAGER_CONFIG:-/var/lib/alertmanager/alertmanager.yml}
quote() { local v=${1//\'/\'\'}; printf "'%s'" "$v"; }  # a YAML single-quoted scalar

umask 077
{
  echo "# Written by alertmanager-start.sh from the environment at start."
  echo "route:"
  echo "  receiver: settlement-oncall"
  echo "  group_by: [alertname, site]"
  echo "  group_wait: ${ALERTMANAGER_GROUP_WAIT:-10s}"
  echo "  group_interval: ${ALERTMANAGER_GROUP_INTERVAL:-1m}"
  echo "  repeat_interval: ${ALERTMANAGER_REPEAT_INTERVAL:-4h}"
  echo "receivers:"
  echo "  - name: settlement-oncall"
  if [[ -n ${SETTLE_ALERT_EMAIL:-} ]]; then
    echo "    email_configs:"
    IFS=',' read -ra recipients <<<"$SETTLE_ALERT_EMAIL"
    for to in "${recipients[@]}"; do
      to=${to// /}
      [[ -n $to ]] || continue
      echo "      - to: $(quote "$to")"
      echo "        from: $(quote "${ALERTMANAGER_SMTP_FROM:-alertmanager@localhost}")"
      echo "        smarthost: $(quote "${ALERTMANAGER_SMTP_SMARTHOST:-localhost:25}")"
      if [[ -n ${ALERTMANAGER_SMTP_USERNAME:-} ]]; then
        echo "        auth_username: $(quote "$ALERTMANAGER_SMTP_USERNAME")"
        echo "        auth_password: $(quote "${ALERTMANAGER_SMTP_PASSWORD:-}")"
      fi
      echo "        send_resolved: true"
    done
  fi
  if [[ -n ${SETTLE_ALERT_WEBHOOK:-} ]]; then
    echo "    webhook_configs:"
    echo "      - url: $(quote "$SETTLE_ALERT_WEBHOOK")"
    echo "        send_resolved: true"
  fi
  # A site's loss fires many alerts at once (its heartbeat, its broker's partitions, its
  # database member): the site's heartbeat alert is the page, the rest ride along.
  echo "inhibit_rules:"
  echo "  - source_matchers: [alertname=\"SiteHeartbeatStale\"]"
  echo "    target_matchers: [alertname=\"ConsumerLagHigh\"]"
  echo "    equal: [site]"
} >"$conf"

unset SETTLE_ALERT_WEBHOOK ALERTMANAGER_SMTP_PASSWORD
exec /usr/bin/prometheus-alertmanager --config.file="$conf" \
  --storage.path=/var/lib/alertmanager "$@"
