#!/usr/bin/env bash
# Starts one apache/kafka KRaft node (broker + controller) with authentication and ACLs.
#
# It runs Kafka through its Java main classes (kafka.tools.StorageTool, kafka.Kafka) with
# /opt/kafka/libs on the class path, not through the image's bin/*.sh wrappers, so the same
# script starts the official image and the one deploy/local/kafka.Dockerfile builds from
# Debian's Java and the Maven jars.
#
# docker-compose.yml mounts this file read-only and makes it the brokers' entrypoint, because
# the image's own /etc/kafka/docker/run formats storage without `--add-scram`: in KRaft the
# SCRAM credentials live in the metadata log, so the first (super) user has to be written
# into the bootstrap metadata when storage is formatted, before any broker accepts a client.
#
# What it does:
#   1. server.properties from the KAFKA_* environment, with the image's naming convention:
#      strip KAFKA_, then `___` -> `-`, `__` -> `_`, `_` -> `.`, lower case
#      (KAFKA_LISTENER_NAME_BROKER_SASL_ENABLED_MECHANISMS ->
#      listener.name.broker.sasl.enabled.mechanisms). JVM and launcher variables
#      (KAFKA_OPTS, KAFKA_HEAP_OPTS, ...) and the admin credentials are not properties.
#   2. The secret-bearing JAAS entries, from KAFKA_ADMIN_USER / KAFKA_ADMIN_PASSWORD:
#      SCRAM for the client + inter-broker listener, PLAIN for the controller listener
#      (SCRAM cannot guard it: controllers talk before the credentials are loaded).
#   3. admin-client.properties (the admin's SCRAM login, over TLS when the broker listener is
#      SASL_SSL: the truststore is the broker's) for the healthcheck and operators' CLI tools:
#      kafka-acls.sh ... --command-config /opt/kafka/config/admin-client.properties; and the
#      JMX exporter's jmx-exporter.yml (its rules, HTTPS with JMX_EXPORTER_TLS).
#   4. the storage tool's format --ignore-formatted --add-scram SCRAM-SHA-512=[name=admin,...]
#      from a private java @argfile (no password in `ps`); a no-op once the volume holds
#      data: later password changes go through the API.
#   5. exec java ... kafka.Kafka server.properties (log4j2 to the console).
#
# `kafka-start.sh --render-only DIR` does steps 1-3 into DIR and exits (used by the tests).
# `kafka-start.sh --health` asks this node's broker listener for its API versions as the
# admin (the compose healthcheck): only a broker that has loaded the SCRAM users answers.
set -euo pipefail

render_only=""
if [[ ${1:-} == "--render-only" ]]; then
  render_only=${2:?usage: kafka-start.sh --render-only DIR}
fi
kafka_home=${KAFKA_HOME:-/opt/kafka}
conf_dir=${render_only:-$kafka_home/config}
props=$conf_dir/server.properties
client_props=$conf_dir/admin-client.properties
classpath="$kafka_home/libs/*"

if [[ ${1:-} == "--health" ]]; then
  # The broker listener as this node advertises it (BROKER://host:port -> host:port).
  address=$(sed -n 's/^advertised\.listeners=.*BROKER:\/\/\([^,]*\).*/\1/p' "$props")
  # Not listening yet (a broker starting): said without starting a JVM, whose 3 s of CPU
  # every interval slowed the start it waited for.
  if ! (exec 3<>"/dev/tcp/${address%:*}/${address##*:}") 2>/dev/null; then
    echo "kafka-start: nothing listens on ${address:-the BROKER listener} yet" >&2
    exit 1
  fi
  exec java -Xmx64m -XX:TieredStopAtLevel=1 -XX:+UseSerialGC -cp "$classpath" \
    org.apache.kafka.tools.BrokerApiVersionsCommand --bootstrap-server "${address:?no BROKER in advertised.listeners}" \
    --command-config "$client_props" >/dev/null
fi

die() { echo "kafka-start: $*" >&2; exit 1; }

[[ -n ${CLUSTER_ID:-} ]] || die "CLUSTER_ID is not set (KAFKA_CLUSTER_ID in .env)"
[[ -n ${KAFKA_NODE_ID:-} ]] || die "KAFKA_NODE_ID is not set"
[[ -n ${KAFKA_ADMIN_PASSWORD:-} ]] || die "KAFKA_ADMIN_PASSWORD is not set (see .env.example)"
admin_user=${KAFKA_ADMIN_USER:-admin}
admin_password=$KAFKA_ADMIN_PASSWORD

# The credentials are written into JAAS strings, a properties file and the --add-scram
# argument (which splits on commas): allow only characters that are literal in all three.
safe='^[A-Za-z0-9._+/@%^*~-]{1,128}$'
[[ $admin_user =~ $safe ]] || die "KAFKA_ADMIN_USER: use only letters, digits and ._+/@%^*~-"
[[ $admin_password =~ $safe ]] ||
  die "KAFKA_ADMIN_PASSWORD: use only letters, digits and ._+/@%^*~- (e.g. openssl rand -hex 24)"

listener_of() { # KAFKA_INTER_BROKER_LISTENER_NAME -> listener name in property keys
  local value=${!1:-}
  [[ -n $value ]] || die "$1 is not set"
  printf '%s' "${value,,}"
}
broker_listener=$(listener_of KAFKA_INTER_BROKER_LISTENER_NAME)
controller_listener=$(listener_of KAFKA_CONTROLLER_LISTENER_NAMES)
[[ $controller_listener != *,* ]] || die "KAFKA_CONTROLLER_LISTENER_NAMES: expected one name"
scram=${KAFKA_SASL_MECHANISM_INTER_BROKER_PROTOCOL:-SCRAM-SHA-512}
[[ $scram == SCRAM-SHA-256 || $scram == SCRAM-SHA-512 ]] ||
  die "KAFKA_SASL_MECHANISM_INTER_BROKER_PROTOCOL: expected SCRAM-SHA-256 or SCRAM-SHA-512"
[[ ${KAFKA_SASL_MECHANISM_CONTROLLER_PROTOCOL:-PLAIN} == PLAIN ]] ||
  die "KAFKA_SASL_MECHANISM_CONTROLLER_PROTOCOL: this script configures PLAIN for controllers"

property_name() {
  local key=${1#KAFKA_}
  key=${key//___/$'\x01'}
  key=${key//__/$'\x02'}
  key=${key//_/.}
  key=${key//$'\x01'/-}
  key=${key//$'\x02'/_}
  printf '%s' "${key,,}"
}

render_properties() {
  local name
  for name in $(compgen -e | LC_ALL=C sort); do
    case $name in
      KAFKA_*) ;;
      *) continue ;;
    esac
    case $name in
      KAFKA_ADMIN_USER | KAFKA_ADMIN_PASSWORD | KAFKA_OPTS | KAFKA_HEAP_OPTS | \
        KAFKA_JVM_PERFORMANCE_OPTS | KAFKA_GC_LOG_OPTS | KAFKA_LOG4J_OPTS | KAFKA_JMX_OPTS | \
        KAFKA_JMX_PORT | KAFKA_JMX_HOSTNAME | KAFKA_DEBUG | KAFKA_HOME | KAFKA_VERSION)
        continue ;;
    esac
    printf '%s=%s\n' "$(property_name "$name")" "${!name}"
  done
}

scram_module=org.apache.kafka.common.security.scram.ScramLoginModule
plain_module=org.apache.kafka.common.security.plain.PlainLoginModule
scram_jaas="$scram_module required username=\"$admin_user\" password=\"$admin_password\";"

umask 077
mkdir -p "$conf_dir"
{
  echo "# Written by kafka-start.sh at container start from the KAFKA_* environment."
  render_properties
  # Client and inter-broker listener: SCRAM; the broker logs in to its peers as the admin.
  echo "listener.name.$broker_listener.${scram,,}.sasl.jaas.config=$scram_jaas"
  # Controller listener: PLAIN with one static user (the admin), client and server side.
  echo "listener.name.$controller_listener.plain.sasl.jaas.config=$plain_module required" \
    "username=\"$admin_user\" password=\"$admin_password\"" \
    "user_$admin_user=\"$admin_password\";"
} >"$props"
# The admin client speaks what the broker listener speaks (SASL_PLAINTEXT or SASL_SSL).
client_protocol=$(sed -n "s/^listener\.security\.protocol\.map=.*\b${broker_listener^^}:\([A-Z_]*\).*/\1/p" "$props")
{
  echo "security.protocol=${client_protocol:-SASL_PLAINTEXT}"
  echo "sasl.mechanism=$scram"
  echo "sasl.jaas.config=$scram_jaas"
  if [[ ${client_protocol:-} == *SSL ]]; then
    echo "ssl.truststore.type=${KAFKA_SSL_TRUSTSTORE_TYPE:-PEM}"
    echo "ssl.truststore.location=${KAFKA_SSL_TRUSTSTORE_LOCATION:?KAFKA_SSL_TRUSTSTORE_LOCATION is not set}"
  fi
} >"$client_props"
# Broker logs to the console (docker logs), as the official image's default.
cat >"$conf_dir/log4j2.yaml" <<'LOG4J'
Configuration:
  Appenders:
    Console: {name: STDOUT, PatternLayout: {pattern: "[%d] %p %m (%c)%n"}}
  Loggers:
    Root: {level: INFO, AppenderRef: [{ref: STDOUT}]}
    Logger:
      - {name: kafka.request.logger, level: WARN}
      - {name: org.apache.kafka.controller, level: INFO}
LOG4J

# The JMX exporter's configuration (KAFKA_OPTS names $conf_dir/jmx-exporter.yml): its rules,
# then with JMX_EXPORTER_TLS the httpServer block deploy/make-certs.sh wrote for this broker
# (its PKCS#12 keystore and password), so the exporter serves HTTPS only.
jmx_rules=${JMX_EXPORTER_RULES:-/opt/settle/jmx-kafka.yml}
if [[ -r $jmx_rules ]]; then
  if [[ -n ${JMX_EXPORTER_TLS:-} && ! -r $JMX_EXPORTER_TLS ]]; then
    die "JMX_EXPORTER_TLS=$JMX_EXPORTER_TLS is not readable: run deploy/make-certs.sh (it writes kafka-N-jmx.yml) and mount it"
  fi
  cat "$jmx_rules" ${JMX_EXPORTER_TLS:+"$JMX_EXPORTER_TLS"} >"$conf_dir/jmx-exporter.yml"
fi

if [[ -n $render_only ]]; then
  exit 0
fi

# The format's arguments carry the admin's password: they go through a private java @argfile
# (java expands "@file" before the main class), so the password is never on a command line
# that `ps` shows.
argfile=$(mktemp "$conf_dir/format.XXXXXX")  # 0600 (umask 077 above)
trap 'rm -f "$argfile"' EXIT
printf '"%s"\n' -cp "$classpath" kafka.tools.StorageTool format --ignore-formatted "--cluster-id=$CLUSTER_ID" \
  --config "$props" --add-scram "$scram=[name=$admin_user,password=$admin_password]" >"$argfile"
java -Xmx256m "-Dlog4j2.configurationFile=$conf_dir/log4j2.yaml" "@$argfile"
rm -f "$argfile"
trap - EXIT

# The broker reads the password from server.properties; its environment need not hold it.
unset KAFKA_ADMIN_PASSWORD admin_password
# The image's kafka-server-start.sh defaults: 1 GiB heap, G1 with short pauses.
# shellcheck disable=SC2086  # the option variables hold several words each
exec java ${KAFKA_HEAP_OPTS:--Xmx1G -Xms1G} \
  ${KAFKA_JVM_PERFORMANCE_OPTS:--server -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:InitiatingHeapOccupancyPercent=35 -XX:+ExplicitGCInvokesConcurrent -Djava.awt.headless=true} \
  ${KAFKA_OPTS:-} "-Dlog4j2.configurationFile=$conf_dir/log4j2.yaml" \
  -cp "$classpath" kafka.Kafka "$props"
