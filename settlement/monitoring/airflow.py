"""Each site's Airflow as Prometheus sees it (issue 46): ``settle airflow-exporter``.

Airflow 3 serves no Prometheus endpoint of its own (its metrics are StatsD, and Debian has no
StatsD exporter), but its api-server answers GET /api/v2/monitor/health without a login:
the metadata database's state and, for the scheduler, the triggerer and the dag-processor,
whether its job is alive (a heartbeat within Airflow's threshold) and its last heartbeat.
This exporter asks that endpoint on every scrape (HTTPS, verified against the stack's CA)
and serves, over HTTPS itself, per site:

- ``airflow_exporter_up``: 1 when the api-server answered with a health document, else 0;
- ``airflow_component_healthy{component}``: 1 when Airflow calls the component healthy
  (metadatabase, scheduler, triggerer, dag_processor), else 0 (a component that never ran
  is 0 too);
- ``airflow_component_heartbeat_age_seconds{component}``: seconds since its last heartbeat
  (absent for a component that never beat).

The alert rules read them (deploy/prometheus/rules.yml: AirflowSchedulerDown,
AirflowUnreachable).
"""

from __future__ import annotations

import json
import logging
import signal
import ssl
import threading
import time
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

log = logging.getLogger("settle.airflow_exporter")

HEALTH_PATH = "/api/v2/monitor/health"
COMPONENTS = ("metadatabase", "scheduler", "triggerer", "dag_processor")
# Where each component's last heartbeat is in the health document (the metadata database
# has none).
HEARTBEAT_FIELDS = {"scheduler": "latest_scheduler_heartbeat",
                    "triggerer": "latest_triggerer_heartbeat",
                    "dag_processor": "latest_dag_processor_heartbeat"}
# Below Prometheus's scrape_timeout (8 s, deploy/prometheus/prometheus.yml): a hanging
# api-server is reported down, not a failed scrape.
DEFAULT_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class ComponentHealth:
    component: str
    healthy: bool
    heartbeat: float | None  # Unix time of the last heartbeat, None if it never beat


def _timestamp(value: Any) -> float | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def parse_health(body: Mapping[str, Any]) -> list[ComponentHealth]:
    """The four components' health from the api-server's health document. A component the
    document lacks, or whose status is anything but "healthy" (unhealthy, or null for one
    that never ran), is unhealthy."""
    out = []
    for component in COMPONENTS:
        info = body.get(component)
        info = info if isinstance(info, Mapping) else {}
        field = HEARTBEAT_FIELDS.get(component)
        out.append(ComponentHealth(component, info.get("status") == "healthy",
                                   _timestamp(info.get(field)) if field else None))
    return out


def fetch_health(url: str, ca_file: str | None, timeout: float = DEFAULT_TIMEOUT_S
                 ) -> dict[str, Any]:
    """GET ``url``/api/v2/monitor/health (no login: Airflow serves it to anyone)."""
    context = ssl.create_default_context(cafile=ca_file) if url.startswith("https:") else None
    req = urllib.request.Request(url.rstrip("/") + HEALTH_PATH,
                                 headers={"Accept": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout, context=context) as resp:
        body = json.loads(resp.read())
    if not isinstance(body, dict):
        raise ValueError(f"not a health document: {body!r:.200}")
    return body


class AirflowCollector(Collector):
    """Asks the api-server on each scrape, so every sample is as fresh as the scrape."""

    def __init__(self, site: str, url: str, ca_file: str | None,
                 timeout: float = DEFAULT_TIMEOUT_S):
        self.site, self.url, self.ca_file, self.timeout = site, url, ca_file, timeout
        self.last_error: str | None = None  # the last scrape's failure, if it failed

    def collect(self) -> Iterator[GaugeMetricFamily]:
        up = GaugeMetricFamily("airflow_exporter_up", "1 when the site's Airflow api-server "
                               "answered its health endpoint, else 0", labels=["site"])
        healthy = GaugeMetricFamily("airflow_component_healthy", "1 when Airflow reports "
                                    "the component healthy, else 0",
                                    labels=["site", "component"])
        age = GaugeMetricFamily("airflow_component_heartbeat_age_seconds", "Seconds since "
                                "the component's last heartbeat", labels=["site", "component"])
        took = GaugeMetricFamily("airflow_exporter_request_seconds", "How long the health "
                                 "request took", labels=["site"])
        start = time.monotonic()
        try:
            components = parse_health(fetch_health(self.url, self.ca_file, self.timeout))
        except (OSError, ValueError) as exc:  # unreachable, refused, a timeout, not JSON
            if str(exc) != self.last_error:  # said once per change, not on every scrape
                log.warning("site %s: %s%s does not answer: %s", self.site, self.url,
                            HEALTH_PATH, exc)
            self.last_error = str(exc)
            up.add_metric([self.site], 0)
        else:
            if self.last_error is not None:
                log.warning("site %s: %s%s answers again", self.site, self.url, HEALTH_PATH)
            self.last_error = None
            up.add_metric([self.site], 1)
            now = time.time()
            for c in components:
                healthy.add_metric([self.site, c.component], 1 if c.healthy else 0)
                if c.heartbeat is not None:
                    age.add_metric([self.site, c.component], max(0.0, now - c.heartbeat))
        took.add_metric([self.site], time.monotonic() - start)
        yield from (up, healthy, age, took)


def registry_for(site: str, url: str, ca_file: str | None,
                 timeout: float = DEFAULT_TIMEOUT_S) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(AirflowCollector(site, url, ca_file, timeout))
    return registry


@dataclass(frozen=True)
class ExporterOptions:
    site: str
    airflow_url: str
    ca_file: str | None
    address: str
    port: int
    cert_file: str | None = None
    key_file: str | None = None
    timeout: float = DEFAULT_TIMEOUT_S


def serve(opts: ExporterOptions, stop: threading.Event | None = None) -> dict[str, Any]:
    """Serves /metrics (HTTPS when given a key pair) until SIGTERM/SIGINT or ``stop``."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    registry = registry_for(opts.site, opts.airflow_url, opts.ca_file, opts.timeout)
    server, thread = start_http_server(
        opts.port, addr=opts.address, registry=registry, certfile=opts.cert_file,
        keyfile=opts.key_file,
        tls_min_version=ssl.TLSVersion.TLSv1_2 if opts.cert_file else None)
    stop = stop or threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
    port = int(server.server_address[1])
    print(f"airflow-exporter: site {opts.site}, {opts.airflow_url}{HEALTH_PATH} served on "
          f"{'https' if opts.cert_file else 'http'}://{opts.address}:{port}/metrics", flush=True)
    stop.wait()
    server.shutdown()
    server.server_close()
    thread.join(5)
    return {"site": opts.site, "port": port}
