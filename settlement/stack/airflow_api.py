"""Airflow's REST API (v2) as one user: a JWT from /auth/token, then JSON calls, over HTTPS
only (the password and the token must not cross the network in clear), the server's
certificate always verified: against ``ca_file`` (the stack's CA), else the system's CAs."""

from __future__ import annotations

import json
import ssl
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from settlement.errors import ServiceError


@dataclass
class AirflowApi:
    base_url: str
    username: str
    password: str = field(repr=False)
    ca_file: str | None = None
    _token: str | None = field(default=None, repr=False)
    _tls: ssl.SSLContext = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not self.base_url.lower().startswith("https://"):
            raise ServiceError(f"Airflow's URL {self.base_url!r} is not https://: the "
                               f"api-server serves HTTPS (AIRFLOW__API__SSL_CERT), and a login "
                               f"over plain HTTP would send {self.username}'s password in clear")
        # create_default_context verifies the chain and the host name; nothing here turns
        # either off.
        self._tls = ssl.create_default_context(cafile=self.ca_file)

    def _request(self, method: str, path: str, body: Any = None,
                 auth: bool = True) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base_url.rstrip("/") + path, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        if auth:
            req.add_header("Authorization", f"Bearer {self.token()}")
        try:
            with urllib.request.urlopen(req, timeout=30, context=self._tls) as resp:
                raw = resp.read()
                return resp.status, json.loads(raw) if raw else None
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                return e.code, json.loads(raw)
            except ValueError:
                return e.code, raw.decode(errors="replace")
        except urllib.error.URLError as e:
            if isinstance(e.reason, ssl.SSLCertVerificationError):
                raise ServiceError(
                    f"Airflow at {self.base_url}: its certificate does not verify against "
                    f"{self.ca_file or 'the system CAs'} ({e.reason.verify_message}); is "
                    f"that the stack's ca.crt, and does the certificate name this host?"
                ) from None
            raise

    def token(self) -> str:
        if self._token is None:
            status, body = self._request("POST", "/auth/token", {
                "username": self.username, "password": self.password}, auth=False)
            if status not in (200, 201) or not isinstance(body, dict):
                raise ServiceError(f"Airflow refused {self.username}'s login ({status}): {body}")
            self._token = str(body["access_token"])
        return self._token

    def call(self, method: str, path: str, body: Any = None) -> Any:
        status, answer = self._request(method, path, body)
        if status >= 300:
            raise ServiceError(f"Airflow {method} {path} as {self.username}: {status} {answer}")
        return answer

    def wait_for_dag(self, dag_id: str, timeout: float) -> None:
        """Until the dag-processor has parsed ``dag_id`` (a fresh stack takes a while)."""
        deadline = time.monotonic() + timeout
        while True:
            status, _ = self._request("GET", f"/api/v2/dags/{dag_id}")
            if status == 200:
                return
            if time.monotonic() > deadline:
                raise ServiceError(f"DAG {dag_id} did not appear in Airflow in {timeout:.0f} s")
            time.sleep(3)

    def wait_for_run(self, dag_id: str, run_id: str, timeout: float,
                     tick: Any = None) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        last = None
        while True:
            run = self.call("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}")
            if run["state"] != last and tick:
                tick(f"{dag_id} {run_id}: {run['state']}")
            last = run["state"]
            if run["state"] in ("success", "failed"):
                return dict(run)
            if time.monotonic() > deadline:
                raise ServiceError(f"{dag_id} run {run_id} still {run['state']} after "
                                   f"{timeout:.0f} s")
            time.sleep(5)
