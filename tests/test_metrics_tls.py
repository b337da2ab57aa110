"""A site's metrics over HTTPS (issue 58): the scrapes cross the sites' network, so the stack's
sites serve them with their own key pair; a half-configured pair is refused at start."""

from __future__ import annotations

import shutil
import ssl
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from consumers.metrics import SiteMetrics
from tests.test_cli import run


def _key_pair(tmp_path: Path) -> tuple[Path, Path]:
    if shutil.which("openssl") is None:
        pytest.fail("openssl is missing: install Debian's openssl package")
    cert, key = tmp_path / "site-a.crt", tmp_path / "site-a.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                    "-subj", "/CN=site-a", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], capture_output=True, check=True,
                   timeout=60)
    return cert, key


def test_a_site_serves_its_metrics_over_https_with_its_key_pair(tmp_path: Path) -> None:
    cert, key = _key_pair(tmp_path)
    metrics = SiteMetrics("a", "shared")
    metrics.batch(messages=3, inserted=2, duplicates=1, dead=0, seconds=0.01)
    port = metrics.serve(0, "127.0.0.1", str(cert), str(key))
    tls = ssl.create_default_context(cafile=str(cert))
    body = urllib.request.urlopen(f"https://127.0.0.1:{port}/metrics", timeout=5,
                                  context=tls).read().decode()
    assert 'settle_site_trades_total{scheme="shared",site="a"} 2.0' in body
    # Plain HTTP gets no metrics, and a client that verifies against another CA refuses it.
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
    with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
        urllib.request.urlopen(f"https://127.0.0.1:{port}/metrics", timeout=5,
                               context=ssl.create_default_context()).read()


def test_a_certificate_without_its_key_is_refused_with_both_names() -> None:
    res = run(["services", "status", "--json"], SETTLE_METRICS_TLS_CERT="/certs/site-a.crt")
    assert res.returncode == 2, res.stderr
    assert "SETTLE_METRICS_TLS_CERT and SETTLE_METRICS_TLS_KEY go together" in res.stdout, \
        res.stdout
