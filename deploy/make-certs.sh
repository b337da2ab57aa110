#!/usr/bin/env bash
# Makes the deployment's TLS material: a private CA, one certificate per Kafka broker (a PEM
# keystore: key + certificate, the form the brokers' ssl.keystore.type=PEM reads) and one for
# PostgreSQL. Clients trust ca.crt only and verify host names (Kafka: https endpoint
# identification; PostgreSQL: sslmode=verify-full).
#
#   deploy/make-certs.sh DIR [EXTRA_SAN ...]     e.g. deploy/make-certs.sh certs DNS:kafka.example.com
#
# Every certificate names its service (kafka-1..3, postgres), localhost and 127.0.0.1, plus the
# extra SANs given (DNS:name or IP:address) for hosts clients reach from elsewhere. Idempotent:
# what exists is kept (delete DIR to re-issue). Private keys are 0600 and, when run as root,
# owned by the user that reads them in its image (Kafka: uid 1000, PostgreSQL: uid 999, as in
# the official images and the ones deploy/local builds); ca.key never leaves DIR.
set -euo pipefail

dir=${1:?usage: make-certs.sh DIR [EXTRA_SAN ...]}
shift
extra=("$@")
days=${CERT_DAYS:-825}
mkdir -p "$dir"
cd "$dir"
umask 077

if [[ ! -s ca.crt ]]; then
  openssl req -x509 -newkey rsa:3072 -sha256 -nodes -days 3650 -keyout ca.key -out ca.crt \
    -subj "/CN=dual-site-settlement CA" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
    2>/dev/null
  chmod 0644 ca.crt
  echo "make-certs: CA $dir/ca.crt" >&2
fi

issue() { # name owner_uid -> name.key name.crt signed by the CA
  local name=$1 uid=$2 sans="DNS:$1,DNS:localhost,IP:127.0.0.1"
  local san
  for san in "${extra[@]}"; do sans+=",$san"; done
  [[ -s $name.crt ]] && return 0
  openssl req -newkey rsa:2048 -sha256 -nodes -keyout "$name.key" -out "$name.csr" \
    -subj "/CN=$name" 2>/dev/null
  openssl x509 -req -in "$name.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days "$days" \
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
issue postgres 999
