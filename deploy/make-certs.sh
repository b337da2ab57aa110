#!/usr/bin/env bash
# Makes the deployment's TLS material: a private CA, one certificate per Kafka broker (a PEM
# keystore: key + certificate, the form the brokers' ssl.keystore.type=PEM reads), one for
# PostgreSQL and one for Airflow's api-server (HTTPS: the UI, the REST API and the task
# processes' execution API). Clients trust ca.crt only and verify host names (Kafka: https
# endpoint identification; PostgreSQL: sslmode=verify-full; Airflow: HTTPS).
#
#   deploy/make-certs.sh DIR [EXTRA_SAN ...]     e.g. deploy/make-certs.sh certs DNS:kafka.example.com
#
# Every certificate names its service (kafka-1..3, postgres, airflow and airflow-apiserver-a/-b,
# prometheus, alertmanager, pushgateway, postgres-exporter, airflow-exporter),
# localhost and 127.0.0.1, plus the extra SANs given (DNS:name or IP:address) for hosts
# clients reach from elsewhere. Idempotent: what exists is kept (delete DIR to re-issue).
#
# The CA's private key is NOT written into DIR: anyone who can read it can mint a `postgres`
# or `kafka-N` certificate that passes verify-full. It lives in CA_DIR (default: DIR's
# sibling DIR-ca, e.g. certs-ca), 0700/0600, which no container mounts; docker-compose.yml
# mounts ca.crt and each service's own key pair from DIR, file by file. A ca.key an older
# version of this script left in DIR is moved there. Keep CA_DIR offline if you can: it is
# needed only to issue certificates.
#
# Private keys are 0600 and, when run as root, owned by the user that reads them in its image
# (Kafka: uid 1000, PostgreSQL: uid 999, as in the official images and the ones deploy/local
# builds; the application image's `settle`: uid 10001, for Airflow's api-server).
set -euo pipefail

dir=${1:?usage: make-certs.sh DIR [EXTRA_SAN ...]}
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

if [[ ! -s ca.crt ]]; then
  openssl req -x509 -newkey rsa:3072 -sha256 -nodes -days 3650 -keyout "$ca_dir/ca.key" \
    -out ca.crt -subj "/CN=dual-site-settlement CA" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
    2>/dev/null
  chmod 0644 ca.crt
  echo "make-certs: CA $dir/ca.crt (its key: $ca_dir/ca.key)" >&2
elif [[ ! -s $ca_dir/ca.key ]]; then
  # Existing certificates are kept; only a new one needs the key.
  need_key=1
fi

issue() { # name owner_uid [more SANs] -> name.key name.crt signed by the CA
  local name=$1 uid=$2 sans="DNS:$1,DNS:localhost,IP:127.0.0.1"
  shift 2
  local san
  for san in "$@" "${extra[@]}"; do sans+=",$san"; done
  [[ -s $name.crt ]] && return 0
  if [[ -n ${need_key:-} ]]; then
    echo "make-certs: $name.crt is missing and the CA's key is not in $ca_dir (set CA_DIR)" >&2
    exit 1
  fi
  openssl req -newkey rsa:2048 -sha256 -nodes -keyout "$name.key" -out "$name.csr" \
    -subj "/CN=$name" 2>/dev/null
  openssl x509 -req -in "$name.csr" -CA ca.crt -CAkey "$ca_dir/ca.key" -CAcreateserial \
    -CAserial "$ca_dir/ca.srl" -days "$days" \
    -sha256 -out "$name.crt" -extfile <(printf '%s\n' "subjectAltName=$sans" \
      "extendedKeyUsage=serverAuth,clientAuth" "keyUsage=critical,digitalSignature,keyEncipherment") \
    2>/dev/null
  rm -f "$name.csr"
  chmod 0644 "$name.crt"
  if [[ $EUID -eq 0 ]]; then
    chown "$uid:$uid" "$name.key"
  else
    echo "make-certs: not root: chown $uid $dir/$name.key* before starting the stack" >&2
  fi
  echo "make-certs: $name ($sans)" >&2
}

for n in 1 2 3; do
  issue "kafka-$n" 1000
  # The broker's PEM keystore: its unencrypted PKCS#8 key, then its certificate.
  if [[ ! -s kafka-$n.pem ]]; then
    cat "kafka-$n.key" "kafka-$n.crt" >"kafka-$n.pem"
    [[ $EUID -ne 0 ]] || chown 1000:1000 "kafka-$n.pem"
  fi
done
# One certificate for both members of the settlement cluster (server, Patroni's REST API and
# its etcd client login) and each site's own server (postgres-site-a, -b), one for the three
# etcd members (uid 998: deploy/local/etcd.Dockerfile).
issue postgres 999 DNS:postgres-a DNS:postgres-b DNS:postgres-site-a DNS:postgres-site-b
issue etcd 998 DNS:etcd-a DNS:etcd-b DNS:etcd-witness
# Each site's Airflow api-server: clients reach it as airflow-apiserver-a / -b (compose's
# service names, each site's execution API URL) or localhost / 127.0.0.1 (the published ports).
issue airflow 10001 DNS:airflow-apiserver-a DNS:airflow-apiserver-b DNS:airflow-apiserver
# Monitoring (uid 997: deploy/prometheus/Dockerfile's prometheus): Prometheus, Alertmanager, the
# Pushgateway, and one for the four PostgreSQL exporters (each at its server's site).
issue prometheus 997
issue alertmanager 997
issue pushgateway 997
issue postgres-exporter 997 DNS:postgres-exporter-a DNS:postgres-exporter-b \
  DNS:postgres-exporter-site-a DNS:postgres-exporter-site-b
# Each site's Airflow exporter (`settle airflow-exporter`, the application image's settle).
issue airflow-exporter 10001 DNS:airflow-exporter-a DNS:airflow-exporter-b
