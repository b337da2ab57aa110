"""`settle airflow-users`: Airflow's users and roles (FAB auth manager); `settle
airflow-exporter`: a site's Airflow health for Prometheus."""

from __future__ import annotations

import argparse
from typing import Any

from settlement.cli.common import Subparsers, add_command
from settlement.config import ConfigError, Settings


def register(sub: Subparsers) -> None:
    sp = add_command(sub, "airflow-users", "create or update Airflow's users and roles (FAB "
                                           "auth manager)", cmd_airflow_users)
    sp.add_argument("--grant", action="append", default=[], metavar="ROLE:USER:PASSWORD_ENV",
                    help="create or update USER with exactly ROLE: auditor (Viewer: sees runs, "
                         "logs and reports), operations (Op: also triggers and clears) or "
                         "admin; the password is read from the environment variable "
                         "PASSWORD_ENV; repeatable; re-run to rotate a password")
    register_exporter(sub)


def cmd_airflow_users(args: argparse.Namespace, s: Settings) -> dict[str, Any]:
    from settlement.orchestration.fab_users import UserGrant, apply_user_grants

    if not args.grant:
        raise ConfigError("settle airflow-users: name at least one --grant "
                          "ROLE:USER:PASSWORD_ENV")
    return {"users": apply_user_grants([UserGrant.parse(g) for g in args.grant])}


def register_exporter(sub: Subparsers) -> None:
    sp = add_command(sub, "airflow-exporter", "serve a site's Airflow health to Prometheus "
                     "(its api-server's /api/v2/monitor/health, asked on each scrape)",
                     cmd_airflow_exporter, prints_own=True)
    sp.add_argument("--site", choices=["a", "b"], required=True, help="which site's Airflow")
    sp.add_argument("--airflow-url", required=True,
                    help="the site's api-server, e.g. https://airflow-apiserver-a:8080")
    sp.add_argument("--ca-file", default="/certs/ca.crt",
                    help="the CA the api-server's certificate is verified against")
    sp.add_argument("--address", default="0.0.0.0", help="the address /metrics is served on")
    sp.add_argument("--port", type=int, default=9402, help="the port /metrics is served on")
    sp.add_argument("--tls-cert", default=None,
                    help="serve HTTPS with this certificate (and --tls-key)")
    sp.add_argument("--tls-key", default=None, help="the private key of --tls-cert")


def cmd_airflow_exporter(args: argparse.Namespace, s: Settings) -> dict[str, Any]:
    from settlement.monitoring.airflow import ExporterOptions, serve

    if bool(args.tls_cert) != bool(args.tls_key):
        raise ConfigError("settle airflow-exporter: give --tls-cert and --tls-key together")
    return serve(ExporterOptions(site=args.site, airflow_url=args.airflow_url,
                                 ca_file=args.ca_file or None, address=args.address,
                                 port=args.port, cert_file=args.tls_cert,
                                 key_file=args.tls_key))
