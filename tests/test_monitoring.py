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
