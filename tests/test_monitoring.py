"""The drill's watch on a lost site's heartbeat alert (settlement.stack.monitoring), against a
stand-in for Prometheus and Alertmanager: when it fired, reached Alertmanager and resolved,
and the verdict on those times. The real thing runs in the stack test (make stack-drill
FAULT=site-loss)."""

from __future__ import annotations

import time
from typing import Any

from settlement.stack.monitoring import FIRING_SLACK_S, AlertTimes, AlertWatch


class FakeMonitoring:
    """Fires after ``fire_at`` s, reaches Alertmanager ``notify_after`` s later, and lets go
    ``resolve_after`` s after it is told the site is back."""

    def __init__(self, fire_at: float, notify_after: float, resolve_after: float):
        self.t0 = time.time()
        self.fire_at, self.notify_after, self.resolve_after = fire_at, notify_after, resolve_after
        self.back: float | None = None

    def alert_rules(self) -> dict[str, float]:
        return {"SiteHeartbeatStale": 60.0, "KafkaBrokerDown": 60.0}

    def _active(self, delay: float) -> bool:
        now = time.time()
        if self.back is not None and now >= self.back + self.resolve_after:
            return False
        return now >= self.t0 + self.fire_at + delay

    def firing(self, alertname: str, site: str) -> bool:
        return alertname == "SiteHeartbeatStale" and site == "a" and self._active(0)

    def notified(self, alertname: str, site: str) -> bool:
        return alertname == "SiteHeartbeatStale" and site == "a" and self._active(
            self.notify_after)


def _watch(fake: FakeMonitoring, back_after: float) -> AlertTimes:
    watch = AlertWatch(fake, "a", tick=0.05).start(fake.t0)  # type: ignore[arg-type]
    time.sleep(back_after)
    fake.back = time.time()
    watch.restarted(fake.back)
    return watch.finish(timeout=10)


def test_the_watch_times_the_firing_the_notification_and_the_resolution() -> None:
    times = _watch(FakeMonitoring(fire_at=0.3, notify_after=0.2, resolve_after=0.3),
                   back_after=1.0)
    assert times.for_s == 60.0 and times.error is None
    assert times.fired_s is not None and 0.3 <= times.fired_s <= 0.6, times
    assert times.notified_s is not None and 0.5 <= times.notified_s <= 0.8, times
    assert times.resolved_s is not None and 0.3 <= times.resolved_s <= 0.6, times
    assert times.passed
    out: dict[str, Any] = times.as_json()
    assert out["alert"] == "SiteHeartbeatStale" and out["alert_passed"] is True


def test_an_alert_that_never_reached_alertmanager_or_fired_too_late_fails() -> None:
    never = _watch(FakeMonitoring(fire_at=0.2, notify_after=60, resolve_after=0.1),
                   back_after=0.6)
    assert never.fired_s is not None and never.notified_s is None and not never.passed
    late = AlertTimes(for_s=60, fired_s=60 + FIRING_SLACK_S + 1, notified_s=101,
                      resolved_s=5)
    assert not late.fired_in_window and not late.passed
    unresolved = AlertTimes(for_s=60, fired_s=70, notified_s=75, resolved_s=None)
    assert unresolved.fired_in_window and not unresolved.passed


# -- each site's Airflow exporter (settlement.monitoring.airflow) ---------------------------

def _health_document(scheduler: str | None, beat: str | None) -> dict[str, Any]:
    """A health document in the shape Airflow's own response model gives it (validated by
    that model, so a change of shape in Airflow fails here)."""
    from airflow.api_fastapi.core_api.datamodels.monitor import HealthInfoResponse

    doc = {"metadatabase": {"status": "healthy"},
           "scheduler": {"status": scheduler, "latest_scheduler_heartbeat": beat},
           "triggerer": {"status": None, "latest_triggerer_heartbeat": None},
           "dag_processor": {"status": "healthy",
                             "latest_dag_processor_heartbeat": "2026-11-27T04:40:00+00:00"}}
    return HealthInfoResponse.model_validate(doc).model_dump(mode="json")


def test_the_exporter_reads_each_components_health_and_heartbeat() -> None:
    from datetime import datetime

    from settlement.monitoring.airflow import COMPONENTS, ComponentHealth, parse_health

    beat = "2026-11-27T04:40:05.250000+00:00"
    parsed = {c.component: c for c in parse_health(_health_document("healthy", beat))}
    assert tuple(parsed) == COMPONENTS
    assert parsed["metadatabase"] == ComponentHealth("metadatabase", True, None)
    assert parsed["scheduler"] == ComponentHealth(
        "scheduler", True, datetime.fromisoformat(beat).timestamp())
    # A triggerer that never ran (status null) is not healthy and has no heartbeat.
    assert parsed["triggerer"] == ComponentHealth("triggerer", False, None)
    assert parsed["dag_processor"].healthy and parsed["dag_processor"].heartbeat is not None
    # An unhealthy scheduler; a document missing parts; heartbeats Airflow did not format.
    down = {c.component: c for c in parse_health(_health_document("unhealthy", beat))}
    assert not down["scheduler"].healthy and down["scheduler"].heartbeat is not None
    sparse = parse_health({"metadatabase": {"status": "unhealthy"},
                           "scheduler": {"status": "healthy",
                                         "latest_scheduler_heartbeat": "not a time"},
                           "triggerer": "healthy"})
    assert [(c.component, c.healthy, c.heartbeat) for c in sparse] == [
        ("metadatabase", False, None), ("scheduler", True, None), ("triggerer", False, None),
        ("dag_processor", False, None)]


def _samples(text: str) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    return {f"{s.name}{{{','.join(f'{k}={v}' for k, v in sorted(s.labels.items()))}}}": s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_the_exporter_serves_what_the_api_server_answers_and_zero_when_it_does_not() -> None:
    """Against a stand-in api-server (plain HTTP on loopback): each scrape asks it; a scrape
    while it is gone says airflow_exporter_up 0 and no component."""
    import json as _json
    import threading
    import urllib.request
    from datetime import UTC, datetime
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from settlement.monitoring.airflow import ExporterOptions, serve

    beat = datetime.fromtimestamp(time.time() - 12, UTC).isoformat()
    doc = _json.dumps(_health_document("healthy", beat)).encode()

    class Health(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            ok = self.path == "/api/v2/monitor/health"
            self.send_response(200 if ok else 404)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(doc if ok else b"{}")

        def log_message(self, *_: Any) -> None:
            pass

    airflow = ThreadingHTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=airflow.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{airflow.server_address[1]}"
    stop, served = threading.Event(), {}
    # Port 0 would leave the port unknown here: find a free one first.
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    opts = ExporterOptions(site="b", airflow_url=url, ca_file=None, address="127.0.0.1",
                           port=port, timeout=2)
    t = threading.Thread(target=lambda: served.update(serve(opts, stop)), daemon=True)
    t.start()
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",
                                              timeout=5).read().decode()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        got = _samples(text)
        assert got["airflow_exporter_up{site=b}"] == 1
        assert got["airflow_component_healthy{component=scheduler,site=b}"] == 1
        assert got["airflow_component_healthy{component=triggerer,site=b}"] == 0
        assert got["airflow_component_healthy{component=metadatabase,site=b}"] == 1
        assert 11 <= got["airflow_component_heartbeat_age_seconds{component=scheduler,site=b}"] \
            < 60
        assert "airflow_component_heartbeat_age_seconds{component=triggerer,site=b}" not in got
        airflow.shutdown()
        airflow.server_close()
        gone = _samples(urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",
                                               timeout=10).read().decode())
        assert gone["airflow_exporter_up{site=b}"] == 0
        assert not any(k.startswith("airflow_component_") for k in gone), gone
    finally:
        stop.set()
        t.join(10)
    assert served == {"site": "b", "port": port}


def test_the_site_loss_drill_waits_for_an_earlier_alert_to_resolve_before_its_fault() -> None:
    """An alert still firing from an earlier fault (the stack drill's killed consumer) is
    waited out before the kill; one that never clears is said (None)."""
    from settlement.stack.monitoring import wait_alert_quiet

    fake = FakeMonitoring(fire_at=0, notify_after=0, resolve_after=0.3)
    fake.back = time.time()
    waited = wait_alert_quiet(fake, "a", timeout=5, tick=0.05)  # type: ignore[arg-type]
    assert waited is not None and 0.2 <= waited < 2, waited
    stuck = FakeMonitoring(fire_at=0, notify_after=0, resolve_after=0)
    assert wait_alert_quiet(stuck, "a", timeout=0.3, tick=0.05) is None  # type: ignore[arg-type]
    assert wait_alert_quiet(stuck, "b", timeout=0.3, tick=0.05) == 0  # type: ignore[arg-type]
