# Stands in for apache/kafka on a machine without a registry: Debian's Java 17 and the broker
# jars Maven resolved (`make jars`, jvm/kafka/pom.xml), laid out as in the official image
# (/opt/kafka/libs, /opt/kafka/config, user appuser uid 1000), so that deploy/kafka-start.sh,
# which runs the broker through its Java main classes, works the same on both.
FROM settle-debian:bookworm
RUN apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --uid 1000 --create-home appuser \
 && mkdir -p /opt/kafka/libs /opt/kafka/config /var/lib/kafka/data \
 && chown appuser /opt/kafka/config /var/lib/kafka/data
COPY libs/ /opt/kafka/libs/
USER appuser
WORKDIR /opt/kafka
