#!/bin/bash
# cached-health.sh MAX_AGE COMMAND...: a compose healthcheck that runs COMMAND (a costly
# check: a JVM admin client, Airflow's CLI) at most once per MAX_AGE seconds while the
# container's main process is the one that last passed it, and answers from that pass in
# between.
#
# Why: on this project's two-core machines, the brokers' check (a JVM started every 10 s,
# 3 s of CPU) and Airflow's `airflow jobs check` (4 s of CPU every 30 s) took about 1.5 of
# the 2 cores of a stack at rest, which made stack-up and every drill slow and, under load,
# made the checks themselves time out. A process that once passed the check stays healthy
# until it restarts (a new start time of PID 1: checked again in full at once) or MAX_AGE
# passes (checked again in full): a hung process is seen within MAX_AGE plus the retries.
set -uo pipefail
max_age=${1:?usage: cached-health.sh MAX_AGE COMMAND...}
shift
marker=${SETTLE_HEALTH_MARKER:-/tmp/.settle-health}  # another path for the tests
# Field 22 of /proc/1/stat is when PID 1 started (clock ticks since boot): a restarted
# container's main process has another. The comm field "(name)" has no spaces here.
read -r -a stat </proc/1/stat
started=${stat[21]}
now=$(date +%s)
if [[ -r $marker ]]; then
  read -r passed_started passed_at <"$marker"
  if [[ ${passed_started:-} == "$started" ]] && ((now - ${passed_at:-0} < max_age)); then
    exit 0
  fi
fi
"$@" || exit $?
echo "$started $now" >"$marker"
