# Stands in for python:3.11-slim-bookworm on a machine without a registry: Debian's own
# Python 3.11 on the image debootstrap made (settle-debian:bookworm, `settle stack up`).
# pip may install into the system interpreter, as it does in the official image.
# host-ca/ holds the CA certificates the building host trusts beyond Debian's (its
# /usr/local/share/ca-certificates, e.g. a TLS-inspecting egress proxy's): the image's builds
# reach PyPI and Maven Central through the same network, and Java's truststore is made from
# these when the application image installs it.
FROM settle-debian:bookworm
COPY host-ca/ /usr/local/share/ca-certificates/
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3.11 python3-pip ca-certificates \
 && update-ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && ln -s /usr/bin/python3.11 /usr/local/bin/python
ENV PIP_BREAK_SYSTEM_PACKAGES=1 \
    UV_NATIVE_TLS=1 \
    LANG=C.UTF-8
