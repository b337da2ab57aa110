"""A site's Prometheus metrics and its periodic one-line stats summary.

The ledger stays the authority on positions; these are what an on-call engineer and
Prometheus watch: throughput, suppressed duplicates, dead letters, batch latency, lag per
partition and the last heartbeat. Each site has its own registry (not the process-global
one) so that two sites in one process, as in tests, do not collide.
"""

from __future__ import annotations

import logging
import ssl
import time
from collections.abc import Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

log = logging.getLogger("settle.site")

# Batch latency: a 20k-message batch commits in tens to hundreds of milliseconds; a ledger
# stalled on a lock or a slow disk shows in the upper buckets.
BATCH_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class SiteMetrics:
    def __init__(self, site: str, scheme: str):
        self.site = site
        self.registry = CollectorRegistry(auto_describe=True)
        r, lbl = self.registry, ["site", "scheme"]
        self.messages = Counter("settle_site_messages", "Kafka messages consumed and committed "
                                "to the ledger", lbl, registry=r)
        self.trades = Counter("settle_site_trades", "Trades inserted into the ledger", lbl,
                              registry=r)
        self.duplicates = Counter("settle_site_duplicates", "Replayed trades suppressed by the "
                                  "ledger (trade_id already stored)", lbl, registry=r)
        self.dead_letters = Counter("settle_site_dead_letters", "Messages dead-lettered "
                                    "(malformed, late or refused by the database)", lbl,
                                    registry=r)
        self.batches = Counter("settle_site_batches", "Ledger transactions committed", lbl,
                               registry=r)
        self.db_errors = Counter("settle_site_db_errors", "Ledger errors (batch retried)", lbl,
                                 registry=r)
        self.batch_seconds = Histogram("settle_site_batch_seconds", "Ledger commit time of one "
                                       "batch", lbl, buckets=BATCH_BUCKETS, registry=r)
        self.lag = Gauge("settle_site_lag_messages", "High watermark minus the position stored "
                         "in the ledger, per owned partition", [*lbl, "partition"], registry=r)
        self.owned = Gauge("settle_site_partitions_owned", "Partitions assigned to this site",
                           lbl, registry=r)
        self.last_heartbeat = Gauge("settle_site_last_heartbeat_timestamp_seconds",
                                    "Unix time of the last heartbeat stored in the ledger", lbl,
                                    registry=r)
        self.labels = {"site": site, "scheme": scheme}
        self._lagging: set[int] = set()
        self.port: int | None = None

    def serve(self, port: int, addr: str = "0.0.0.0", cert_file: str = "",
              key_file: str = "") -> int:
        """Start the endpoint (``/metrics``) in a daemon thread; returns its port. All
        interfaces by default: Prometheus scrapes from another host or container. HTTPS
        (TLS 1.2 or later) when given a key pair: the scrapes cross the sites' network."""
        server, _thread = start_http_server(
            port, addr=addr, registry=self.registry, certfile=cert_file or None,
            keyfile=key_file or None,
            tls_min_version=ssl.TLSVersion.TLSv1_2 if cert_file else None)
        self.port = int(server.server_address[1])
        return self.port

    def batch(self, messages: int, inserted: int, duplicates: int, dead: int,
              seconds: float) -> None:
        lb = self.labels
        self.messages.labels(**lb).inc(messages)
        self.trades.labels(**lb).inc(inserted)
        self.duplicates.labels(**lb).inc(duplicates)
        self.dead_letters.labels(**lb).inc(dead)
        self.batches.labels(**lb).inc()
        self.batch_seconds.labels(**lb).observe(seconds)

    def db_error(self) -> None:
        self.db_errors.labels(**self.labels).inc()

    def heartbeat(self, when: float | None = None) -> None:
        self.last_heartbeat.labels(**self.labels).set(when or time.time())

    def positions(self, lag: Mapping[int, int]) -> None:
        """Lag per owned partition; partitions no longer owned disappear from the scrape."""
        lb = self.labels
        for p in self._lagging - set(lag):
            self.lag.remove(lb["site"], lb["scheme"], str(p))
        for p, n in lag.items():
            self.lag.labels(**lb, partition=str(p)).set(n)
        self._lagging = set(lag)
        self.owned.labels(**lb).set(len(lag))


def stats_line(site: str, stats: Mapping[str, Any], lag: Mapping[int, int],
               since: Mapping[str, Any], seconds: float) -> str:
    """One line per interval: totals, the rate since the last line, and the lag."""
    rate = (stats["inserted"] - since.get("inserted", 0)) / seconds if seconds > 0 else 0.0
    total_lag = sum(lag.values())
    return (f"site {site} stats: messages={stats['messages']} trades={stats['inserted']} "
            f"({rate:.0f}/s) duplicates={stats['duplicates']} "
            f"dead_letters={stats['dead_letters']} batches={stats['batches']} "
            f"db_errors={stats['db_errors']} partitions={len(lag)} lag={total_lag}")
