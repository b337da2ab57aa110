"""Airflow's REST API (v2) as one user: a JWT from /auth/token, then JSON calls."""

from __future__ import annotations

import json
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
    password: str
    _token: str | None = field(default=None, repr=False)

    def _request(self, method: str, path: str, body: Any = None,
                 auth: bool = True) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base_url.rstrip("/") + path, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        if auth:
            req.add_header("Authorization", f"Bearer {self.token()}")
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                raw = resp.read()
                return resp.status, json.loads(raw) if raw else None
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                return e.code, json.loads(raw)
            except ValueError:
                return e.code, raw.decode(errors="replace")

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
