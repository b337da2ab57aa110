# Stands in for gcr.io/etcd-development/etcd on a machine without a registry: Debian's etcd
# 3.4 (etcd-server) and its etcdctl (etcd-client, the healthcheck). The user etcd is made
# first with a fixed uid (998), which deploy/make-certs.sh gives the etcd key to; the
# package's own scripts then find it present.
FROM settle-debian:bookworm
RUN useradd --system --uid 998 --user-group --home-dir /var/lib/etcd --create-home etcd \
 && apt-get update \
 && apt-get install -y --no-install-recommends etcd-server etcd-client \
 && rm -rf /var/lib/apt/lists/* \
 && chown etcd:etcd /var/lib/etcd
USER etcd
ENTRYPOINT ["etcd"]
