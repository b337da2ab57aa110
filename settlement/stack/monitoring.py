"""The stack's Prometheus, Alertmanager and Pushgateway, as a client sees them (issue 46).

What `make stack-up`'s test asks (every scrape target up, the alert rules loaded), what the
site-loss drill watches (the lost site's heartbeat alert: firing in Prometheus, received by
Alertmanager, resolved once the site is back) and where the drills and soaks leave their
verdict (the Pushgateway, which the DrillOrSoakFailing alert reads). All HTTPS, verified
against the stack's CA.
"""

from __future__ import annotations

import base64
import json
import ssl
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

from settlement.errors import ServiceError
from settlement.stack import envfile
from settlement.stack.compose import Stack
from settlement.stack.engine import Log

HEARTBEAT_ALERT = "SiteHeartbeatStale"
# Beyond the rule's `for:`, what a firing may take: the failed scrape (10 s interval, 8 s
# timeout), the evaluation that sees it and the one that fires (10 s each), and a margin for a
# loaded machine.
FIRING_SLACK_S = 40.0


@dataclass(frozen=True)
class Target:
    job: str
    instance: str
    health: str
    error: str


@dataclass(frozen=True)
class Monitoring:
    prometheus_url: str
    alertmanager_url: str
    pushgateway_url: str
    ca_file: str
    # The monitoring login (envfile.MONITORING_USER, MONITORING_PASSWORD); None: none sent.
    login: tuple[str, str] | None = None

    def fetch(self, url: str, data: bytes | None = None, method: str = "GET",
              timeout: float = 15) -> bytes:
        headers = {"Content-Type": "text/plain; version=0.0.4"} if data is not None else {}
        if self.login:
            token = base64.b64encode(":".join(self.login).encode()).decode()
            headers["Authorization"] = f"Basic {token}"
        req = urllib.request.Request(url, data=data, method=method, headers=headers)
        context = ssl.create_default_context(cafile=self.ca_file)
        with urllib.request.urlopen(req, timeout=timeout, context=context) as resp:
            return bytes(resp.read())

    def prometheus(self, path: str, **params: str) -> Any:
        """A Prometheus API answer's data."""
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        body = json.loads(self.fetch(f"{self.prometheus_url}{path}{query}"))
        if body.get("status") != "success":
            raise ServiceError(f"Prometheus {path}: {body}")
        return body["data"]

    def targets(self) -> list[Target]:
        return [Target(str(t["labels"].get("job")), str(t["labels"].get("instance")),
                       str(t["health"]), str(t.get("lastError") or ""))
                for t in self.prometheus("/api/v1/targets", state="active")["activeTargets"]]

    def alert_rules(self) -> dict[str, float]:
        """Every loaded alert rule's name and its `for:` in seconds."""
        return {str(r["name"]): float(r.get("duration", 0))
                for g in self.prometheus("/api/v1/rules", type="alert")["groups"]
                for r in g["rules"]}

    def firing(self, alertname: str, site: str) -> bool:
        """Prometheus holds the alert firing for ``site``."""
        return any(a["labels"].get("alertname") == alertname
                   and a["labels"].get("site") == site and a["state"] == "firing"
                   for a in self.prometheus("/api/v1/alerts")["alerts"])

    def notified(self, alertname: str, site: str) -> bool:
        """Alertmanager holds the alert active for ``site`` (it was sent there)."""
        query = urllib.parse.urlencode([("filter", f'alertname="{alertname}"'),
                                        ("filter", f'site="{site}"'), ("active", "true")])
        alerts = json.loads(self.fetch(f"{self.alertmanager_url}/api/v2/alerts?{query}"))
        return any(a.get("status", {}).get("state") == "active" for a in alerts)

    def push_verdict(self, drill: str, passed: bool, when: float | None = None) -> None:
        """settle_drill_passed and settle_drill_last_run_timestamp_seconds for ``drill``,
        replacing what the last run of the same kind pushed."""
        body = ("# TYPE settle_drill_passed gauge\n"
                f"settle_drill_passed {1 if passed else 0}\n"
                "# TYPE settle_drill_last_run_timestamp_seconds gauge\n"
                f"settle_drill_last_run_timestamp_seconds {when or time.time():.3f}\n")
        self.fetch(f"{self.pushgateway_url}/metrics/job/settle-drill/drill/"
                   f"{urllib.parse.quote(drill, safe='')}", data=body.encode(), method="PUT")


def monitoring(stack: Stack) -> Monitoring:
    env = stack.env()
    return Monitoring(env["PROMETHEUS_URL"], env["ALERTMANAGER_URL"], env["PUSHGATEWAY_URL"],
                      str(stack.certs / "ca.crt"),
                      (envfile.MONITORING_USER, env["MONITORING_PASSWORD"]))


def push_verdict(stack: Stack, drill: str, passed: bool, log: Log) -> bool:
    """The verdict to the Pushgateway; a Pushgateway that does not answer is said, and the
    drill's own verdict stands."""
    try:
        monitoring(stack).push_verdict(drill, passed)
        return True
    except (OSError, ServiceError, KeyError) as exc:
        log(f"the {drill} verdict was not pushed to the Pushgateway: {exc}")
        return False


def unhealthy_targets(mon: Monitoring) -> list[Target]:
    return [t for t in mon.targets() if t.health != "up"]


def wait_targets_up(mon: Monitoring, timeout: float, tick: float = 3) -> list[Target]:
    """Every target's scrape healthy (returns them), or ServiceError naming those that are not."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            targets = mon.targets()
            bad = [t for t in targets if t.health != "up"]
        except (OSError, ServiceError) as exc:
            targets, bad = [], [Target("prometheus", mon.prometheus_url, "down", str(exc))]
        if targets and not bad:
            return targets
        if time.monotonic() > deadline:
            raise ServiceError("scrape targets not up after "
                               f"{timeout:.0f} s: " + "; ".join(
                                   f"{t.job} {t.instance} {t.health} {t.error}" for t in bad))
        time.sleep(tick)


def wait_alert_quiet(mon: Monitoring, site: str, alertname: str = HEARTBEAT_ALERT,
                     timeout: float = 180.0, tick: float = 3.0) -> float | None:
    """Waits until ``alertname`` for ``site`` is neither firing in Prometheus nor active in
    Alertmanager: an earlier fault's alert (the stack drill keeps site-a's consumer down
    through its close, then starts it) takes a scrape and an evaluation or two to resolve,
    and a watch started on it would time the old alert, not the new fault's. The seconds
    waited, or None if it was still active after ``timeout``."""
    start = time.monotonic()
    while True:
        try:
            if not mon.firing(alertname, site) and not mon.notified(alertname, site):
                return round(time.monotonic() - start, 1)
        except (OSError, ServiceError, ValueError):
            pass  # Prometheus or Alertmanager not answering yet: asked again
        if time.monotonic() - start > timeout:
            return None
        time.sleep(tick)


@dataclass
class AlertTimes:
    """Seconds from the fault (fired, notified) and from the site's restart (resolved)."""
    for_s: float | None = None
    fired_s: float | None = None
    notified_s: float | None = None
    resolved_s: float | None = None
    error: str | None = None

    @property
    def fired_in_window(self) -> bool:
        return (self.fired_s is not None and self.for_s is not None
                and self.fired_s <= self.for_s + FIRING_SLACK_S)

    @property
    def passed(self) -> bool:
        return (self.fired_in_window and self.notified_s is not None
                and self.resolved_s is not None)

    def as_json(self) -> dict[str, Any]:
        return {"alert": HEARTBEAT_ALERT, "alert_for_s": self.for_s,
                "alert_fired_s": self.fired_s, "alert_notified_s": self.notified_s,
                "alert_resolved_s": self.resolved_s, "alert_error": self.error,
                "alert_passed": self.passed}


class AlertWatch:
    """Watches one alert for one site from a fault on, in a thread (the drill goes on): when
    Prometheus fires it, when Alertmanager has it, and, once ``restarted`` is called, when
    both have let it go."""

    def __init__(self, mon: Monitoring, site: str, alertname: str = HEARTBEAT_ALERT,
                 tick: float = 2.0):
        self.mon, self.site, self.alertname, self.tick = mon, site, alertname, tick
        self.times = AlertTimes()
        self._t0 = 0.0
        self._restart: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self, t0: float) -> AlertWatch:
        self._t0 = t0
        try:
            self.times.for_s = self.mon.alert_rules().get(self.alertname)
        except (OSError, ServiceError) as exc:
            self.times.error = f"the rules could not be read: {exc}"
        self._thread.start()
        return self

    def wait_raised(self, timeout: float) -> bool:
        """Until Prometheus fires the alert and Alertmanager has it (True), or ``timeout``
        seconds: what an operator waits for before repairing a site. A drill that brought
        the site back sooner would time only how fast it closed the day, and on a fast
        machine the site was back before the alert's `for` had passed."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self._thread.is_alive():
            if self.times.fired_s is not None and self.times.notified_s is not None:
                return True
            time.sleep(1.0)
        return self.times.fired_s is not None and self.times.notified_s is not None

    def restarted(self, when: float) -> None:
        self._restart = when

    def _poll(self) -> None:
        now = time.time()
        firing = self.mon.firing(self.alertname, self.site)
        notified = self.mon.notified(self.alertname, self.site)
        t = self.times
        if firing and t.fired_s is None and self._restart is None:
            t.fired_s = round(now - self._t0, 1)
        if notified and t.notified_s is None and self._restart is None:
            t.notified_s = round(now - self._t0, 1)
        if self._restart is not None and t.fired_s is not None and not firing and not notified:
            t.resolved_s = round(now - self._restart, 1)
            self._stop.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._poll()
            except (OSError, ServiceError, ValueError) as exc:
                self.times.error = str(exc)  # the last one; the watch goes on
            self._stop.wait(self.tick)

    def finish(self, timeout: float) -> AlertTimes:
        """After ``restarted``: waits up to ``timeout`` for the alert to resolve."""
        self._thread.join(timeout)
        self._stop.set()
        self._thread.join(10)
        return self.times
