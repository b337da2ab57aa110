#!/usr/bin/env bash
# Makes the deployment's TLS material: two private CAs and one key pair per server.
#
# - ca.crt, the stack's CA, signs the servers clients reach: each Kafka broker (a PEM
#   keystore: key + certificate, the form the brokers' ssl.keystore.type=PEM reads; the same
#   pair as PKCS#12 for its JMX exporter's HTTPS, kafka-N-jmx.p12 and .yml), each
#   PostgreSQL server (postgres-a, postgres-b: the settlement cluster's members, their
#   PostgreSQL and Patroni's REST API; postgres-site-a, -b: each site's own server), each
#   site's Airflow api-server (airflow-apiserver-a, -b), Prometheus, Alertmanager, the
#   Pushgateway, and each exporter. These are server certificates only (serverAuth): none can
#   log in anywhere as a client. Clients trust ca.crt and verify host names (Kafka: https
#   endpoint identification; PostgreSQL: sslmode=verify-full; HTTPS).
# - etcd-ca.crt, etcd's own CA, signs only the three etcd members (etcd-a, -b, -witness:
#   server and client, for their peer links) and each Patroni member's client certificate
#   (patroni-postgres-a, -b: clientAuth). etcd trusts etcd-ca.crt alone, so no other
#   component's key (a broker's, an exporter's) opens etcd, where Patroni's configuration
#   and leader key live.
# - ca.crt also signs the PostgreSQL admin's client certificates (CN settle): postgres-admin
#   for the migrations, postgres-admin-operator for whoever ran this script. Without one no
#   server takes the admin over TCP (pg_hba: clientcert=verify-full).
#
#   deploy/make-certs.sh DIR [[SERVER=]EXTRA_SAN ...]
#   e.g. deploy/make-certs.sh certs postgres-a=DNS:pg-a.example.com kafka-1=IP:10.0.0.5
#
# Every server certificate names its own service only, plus localhost and 127.0.0.1 (the
# local stack runs every server on one loopback) and the extra SANs (DNS:name or IP:address)
# for the names clients reach it by elsewhere: SERVER=SAN adds one to that server's
# certificate, a bare SAN to every certificate. Idempotent: a certificate is kept while
# its CA verifies it and its usage is the one below; otherwise (an older version's shared
# `postgres` or `serverAuth,clientAuth` certificate) it is issued again. Delete DIR to
# re-issue everything.
#
# The CAs' private keys are NOT written into DIR: anyone who can read one can mint a
# certificate that passes verify-full (or opens etcd). They live in CA_DIR (default: DIR's
# sibling DIR-ca, e.g. certs-ca), 0700/0600, which no container mounts; docker-compose.yml
# mounts the CA certificates and each service's own key pair from DIR, file by file. A ca.key
# an older version of this script left in DIR is moved there. Keep CA_DIR offline if you can:
# it is needed only to issue certificates.
#
# Private keys are 0600 and, when run as root, owned by the user that reads them in its image
# (Kafka: uid 1000, PostgreSQL: uid 999, etcd: 998, monitoring: 997, as in the official images
# and the ones deploy/local builds; the application image's `settle`: uid 10001).
set -euo pipefail

dir=${1:?usage: make-certs.sh DIR [[SERVER=]EXTRA_SAN ...]}
shift
extra=("$@")
days=${CERT_DAYS:-825}
mkdir -p "$dir"  # 0755 (before the umask): the public certificates are read by every service
dir=$(cd "$dir" && pwd)
umask 077
ca_dir=${CA_DIR:-$dir-ca}
mkdir -p "$ca_dir"
chmod 0700 "$ca_dir"
ca_dir=$(cd "$ca_dir" && pwd)
[[ $ca_dir != "$dir" ]] || { echo "make-certs: CA_DIR must not be DIR ($dir)" >&2; exit 1; }
cd "$dir"

# An older version kept the CA's key (and its serial) beside the certificates.
for f in ca.key ca.srl; do
  if [[ -e $f ]]; then
    if [[ -e $ca_dir/$f ]]; then
      cmp -s "$f" "$ca_dir/$f" ||
        { echo "make-certs: $dir/$f and $ca_dir/$f differ: remove the wrong one" >&2; exit 1; }
      rm -f "$f"
    else
      mv "$f" "$ca_dir/$f"
    fi
    echo "make-certs: moved $f out of $dir into $ca_dir (no container mounts it)" >&2
  fi
done

make_ca() { # file subject -> DIR/file.crt, its key in CA_DIR/file.key
  local name=$1 subject=$2
  if [[ ! -s $name.crt ]]; then
    openssl req -x509 -newkey rsa:3072 -sha256 -nodes -days 3650 -keyout "$ca_dir/$name.key" \
      -out "$name.crt" -subj "/CN=$subject" \
      -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
      2>/dev/null
    chmod 0644 "$name.crt"
    echo "make-certs: CA $dir/$name.crt (its key: $ca_dir/$name.key)" >&2
  fi
}
make_ca ca "dual-site-settlement CA"
make_ca etcd-ca "dual-site-settlement etcd CA"

# usage: server (serverAuth), client (clientAuth) or peer (both: etcd's members).
issue() { # ca name owner_uid usage [more SANs] -> name.key name.crt signed by ca
  local ca=$1 name=$2 uid=$3 usage=$4 sans eku want
  shift 4
  case $usage in
    server) eku=serverAuth; want="TLS Web Server Authentication" ;;
    client) eku=clientAuth; want="TLS Web Client Authentication" ;;
    peer) eku=serverAuth,clientAuth
      want="TLS Web Server Authentication, TLS Web Client Authentication" ;;
    *) echo "make-certs: unknown usage $usage" >&2; exit 2 ;;
  esac
  sans="DNS:$name,DNS:localhost,IP:127.0.0.1"
  local san
  for san in "$@"; do sans+=",$san"; done
  for san in "${extra[@]}"; do
    if [[ $san == *=* ]]; then  # SERVER=SAN: that server's only
      [[ ${san%%=*} != "$name" ]] || sans+=",${san#*=}"
    else
      sans+=",$san"
    fi
  done
  if [[ -s $name.crt ]] && openssl verify -CAfile "$ca.crt" "$name.crt" >/dev/null 2>&1 &&
    [[ $(openssl x509 -in "$name.crt" -noout -ext extendedKeyUsage 2>/dev/null | tail -n +2 |
      sed 's/^ *//') == "$want" ]]; then
    return 0
  fi
  if [[ ! -s $ca_dir/$ca.key ]]; then
    echo "make-certs: $name.crt is missing (or outdated) and the CA's key is not in" \
      "$ca_dir/$ca.key (set CA_DIR)" >&2
    exit 1
  fi
  openssl req -newkey rsa:2048 -sha256 -nodes -keyout "$name.key" -out "$name.csr" \
    -subj "/CN=${CN:-$name}" 2>/dev/null
  openssl x509 -req -in "$name.csr" -CA "$ca.crt" -CAkey "$ca_dir/$ca.key" -CAcreateserial \
    -CAserial "$ca_dir/$ca.srl" -days "$days" \
    -sha256 -out "$name.crt" -extfile <(printf '%s\n' "subjectAltName=$sans" \
      "extendedKeyUsage=$eku" "keyUsage=critical,digitalSignature,keyEncipherment") \
    2>/dev/null
  rm -f "$name.csr"
  chmod 0644 "$name.crt"
  if [[ $EUID -eq 0 ]]; then
    chown "$uid:$uid" "$name.key"
  else
    echo "make-certs: not root: chown $uid $dir/$name.key* before starting the stack" >&2
  fi
  echo "make-certs: $name ($usage: $sans)" >&2
}

for n in 1 2 3; do
  issue ca "kafka-$n" 1000 server
  # The broker's PEM keystore: its unencrypted PKCS#8 key, then its certificate (made again
  # each run: the certificate may just have been issued again).
  cat "kafka-$n.key" "kafka-$n.crt" >"kafka-$n.pem"
  [[ $EUID -ne 0 ]] || chown 1000:1000 "kafka-$n.pem"
  # Its JMX exporter's HTTPS: the exporter reads a Java keystore, not PEM, so the same key
  # pair as PKCS#12 under a password made here, and the exporter's httpServer block naming
  # both (kafka-start.sh appends it to the exporter's rules). Made again when the
  # certificate is newer; the password never reaches a command line (`ps`).
  if [[ ! -s kafka-$n-jmx.p12 || kafka-$n.crt -nt kafka-$n-jmx.p12 || ! -s kafka-$n-jmx.yml ]]; then
    JMX_PASS=$(openssl rand -hex 24)
    export JMX_PASS
    openssl pkcs12 -export -inkey "kafka-$n.key" -in "kafka-$n.crt" -name "kafka-$n" \
      -out "kafka-$n-jmx.p12" -passout env:JMX_PASS
    printf '%s\n' "httpServer:" "  ssl:" "    keyStore:" \
      "      filename: /certs/kafka-$n-jmx.p12" \
      "      password: $JMX_PASS" "    certificate:" "      alias: kafka-$n" >"kafka-$n-jmx.yml"
    unset JMX_PASS
    [[ $EUID -ne 0 ]] || chown 1000:1000 "kafka-$n-jmx.p12" "kafka-$n-jmx.yml"
  fi
done
# Each PostgreSQL server its own: the settlement cluster's members (PostgreSQL and Patroni's
# REST API) and each site's own server. A site server's key cannot pass for the cluster.
for m in postgres-a postgres-b postgres-site-a postgres-site-b; do issue ca "$m" 999 server; done
# The PostgreSQL admin's client certificate (CN settle, the admin's user name): every server
# takes the admin over TCP only with it and the password (pg_hba: clientcert=verify-full).
# Mounted into the one-shot migrations only (the application image's settle: uid 10001).
CN=settle issue ca postgres-admin 10001 client
# The same login for the operator who ran this script (a drill's probes, an emergency psql):
# a key pair of its own, owned by that user (libpq takes a key only from its owner or root).
CN=settle issue ca postgres-admin-operator "$EUID" client
# pgBackRest (issue 60): the repository at the witness (reached as `backup`) and each member's
# server (reached by the member's name), each a TLS server and the other's client. Each side
# accepts the other's certificate by its name (tls-server-auth, deploy/pgbackrest/).
issue ca pgbackrest-repo 999 peer DNS:backup
for m in postgres-a postgres-b; do issue ca "pgbackrest-$m" 999 peer "DNS:$m"; done
# etcd's members (uid 998: deploy/local/etcd.Dockerfile) and Patroni's logins to etcd.
for m in etcd-a etcd-b etcd-witness; do issue etcd-ca "$m" 998 peer; done
for m in postgres-a postgres-b; do issue etcd-ca "patroni-$m" 999 client; done
# Each site's Airflow api-server: clients reach it as airflow-apiserver-a / -b (compose's
# service names, each site's execution API URL) or localhost / 127.0.0.1 (the published ports).
for s in a b; do issue ca "airflow-apiserver-$s" 10001 server; done
# Monitoring (uid 997: deploy/prometheus/Dockerfile's prometheus): Prometheus, Alertmanager, the
# Pushgateway, and each PostgreSQL exporter (one at each server's site).
issue ca prometheus 997 server
issue ca alertmanager 997 server
issue ca pushgateway 997 server
for m in a b site-a site-b; do issue ca "postgres-exporter-$m" 997 server; done
# Each site's Airflow exporter (`settle airflow-exporter`, the application image's settle).
for s in a b; do issue ca "airflow-exporter-$s" 10001 server; done
# Each site's consumer: its metrics endpoint (SETTLE_METRICS_TLS_CERT / _KEY).
for s in a b; do issue ca "site-$s" 10001 server; done
