"""Kafka administration: the `trades` topic and client configuration."""

from __future__ import annotations

import time
from typing import Any

from settlement.config import Settings


def admin_client(settings: Settings) -> Any:
    from confluent_kafka.admin import AdminClient

    # Quiet: an unreachable broker is reported by the caller (e.g. as the fallback reason);
    # librdkafka would otherwise print a connection error to stderr every few milliseconds.
    return AdminClient({**settings.kafka_client_config(), "log_level": 0})


def brokers_refuse(settings: Settings, timeout: float = 2.0) -> bool:
    """True when every bootstrap server actively refuses a TCP connection: nothing listens
    there, so waiting for a metadata timeout cannot change the answer. A timeout or a name
    that does not resolve is no refusal (the client's own timeout decides then). The
    entries are host:port (the configuration validates them)."""
    import socket

    for server in settings.bootstrap().split(","):
        host, _, port = server.rpartition(":")
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
                return False
        except ConnectionRefusedError:
            continue
        except OSError:
            return False
    return True


def ensure_topic(settings: Settings, brokers: int | None = None, timeout: float = 30) -> str:
    """Create the trades topic if missing; returns 'created' or 'exists'.

    Durability comes from the topic, not the producer alone: acks=all means "all in-sync
    replicas", so with replication 3 and min.insync.replicas 2 an acknowledged trade is on
    two brokers before the gateway moves on (seed 002).
    """
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import NewTopic

    admin = admin_client(settings)
    md = admin.list_topics(timeout=timeout)
    if settings.topic in md.topics:
        return "exists"
    n = brokers or len(md.brokers) or 1
    rf = min(3, n)
    topic = NewTopic(
        settings.topic,
        num_partitions=settings.partitions,
        replication_factor=rf,
        config={
            "min.insync.replicas": str(min(2, rf)),
            "unclean.leader.election.enable": "false",
            "retention.ms": str(7 * 24 * 3600 * 1000),
        },
    )
    fut = admin.create_topics([topic], operation_timeout=timeout)[settings.topic]
    try:
        fut.result(timeout=timeout)
    except KafkaException as e:
        if "TOPIC_ALREADY_EXISTS" in str(e):
            return "exists"
        raise
    # Creation is acknowledged by the controller before every broker serves the metadata;
    # callers produce right away, so wait until the topic is visible with leaders.
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        t = admin.list_topics(topic=settings.topic, timeout=5).topics.get(settings.topic)
        if t is not None and t.error is None and t.partitions and all(
            p.leader >= 0 for p in t.partitions.values()
        ):
            return "created"
        time.sleep(0.1)
    raise RuntimeError(f"topic {settings.topic!r} was created but has no leaders after "
                       f"{timeout:.0f}s")


def topic_partitions(settings: Settings, timeout: float = 30, settle: float = 10) -> int:
    """The topic's partition count. A topic created a moment ago may not be in every
    broker's metadata yet, so a missing topic is asked again for up to ``settle`` seconds."""
    admin = admin_client(settings)
    deadline = time.monotonic() + settle
    while True:
        md = admin.list_topics(topic=settings.topic, timeout=timeout)
        t = md.topics.get(settings.topic)
        if t is not None and t.error is None and t.partitions:
            return len(t.partitions)
        if time.monotonic() >= deadline:
            raise RuntimeError(
                f"topic {settings.topic!r} not found on {settings.bootstrap()}: "
                "run `settle services up` (it creates the topic)"
            )
        time.sleep(0.2)
