"""The quick answer when Kafka is down: brokers that refuse connections make the source
choice fall back at once instead of after the metadata timeout. Real sockets on loopback."""

from __future__ import annotations

import socket
import time

from settlement.config import load_settings
from settlement.eod.sources import topic_view
from settlement.kafka.admin import brokers_refuse


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # nothing listens there once the socket is closed


def test_refused_everywhere_is_unreachable_at_once() -> None:
    bootstrap = ",".join(f"127.0.0.1:{_closed_port()}" for _ in range(2))
    settings = load_settings(kafka_bootstrap=bootstrap)
    assert brokers_refuse(settings)
    t0 = time.monotonic()
    view = topic_view(settings, timeout=10)
    assert time.monotonic() - t0 < 5  # not the 10 s metadata timeout
    assert view.partitions is None
    assert "Kafka is unreachable" in view.why_not and "refused" in view.why_not


def test_one_listening_server_is_not_a_refusal() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        assert not brokers_refuse(load_settings(
            kafka_bootstrap=f"127.0.0.1:{_closed_port()},127.0.0.1:{port}"))
