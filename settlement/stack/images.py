"""The images the stack runs, built here: no registry is reachable from this machine class.

settle-debian:bookworm comes from debootstrap (Debian's packages); the Python, Kafka and
PostgreSQL images are built FROM it (deploy/local/*.Dockerfile) and the application image from
the project's own Dockerfile with that Python underneath. Docker's layer cache makes a second
build take seconds; the base image is made once.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

from settlement.errors import ServiceError
from settlement.stack.engine import Log, run

BASE = "settle-debian:bookworm"
PYTHON = "settle-local/python:3.11-bookworm"
KAFKA = "settle-local/kafka:4.3.1"
POSTGRES = "settle-local/postgres:15-bookworm"
PATRONI = "settle-local/patroni:4.1.5-pg15"  # deploy/patroni/Dockerfile FROM POSTGRES
ETCD = "settle-local/etcd:3.4"
# deploy/prometheus/Dockerfile FROM BASE: Prometheus, Alertmanager, Pushgateway, the
# PostgreSQL exporter (Debian's packages).
MONITORING = "settle-local/monitoring:2.42"
APP = "dual-site-settlement:0.1.0"  # docker-compose.yml's own name for it
DEBIAN_MIRROR = "http://deb.debian.org/debian"
# On every image built here, naming its tag: an older build the tag left behind is found by it.
BUILT_LABEL = "org.dual-site-settlement.built-as"
HOST_CA_DIR = Path("/usr/local/share/ca-certificates")


def image_exists(name: str) -> bool:
    return run(["docker", "image", "inspect", name], check=False, timeout=30).returncode == 0


def build_base(log: Log) -> None:
    if image_exists(BASE):
        return
    log("making the Debian base image with debootstrap (about a minute, once)...")
    with tempfile.TemporaryDirectory(prefix="settle-rootfs-") as root:
        run(["debootstrap", "--variant=minbase", "bookworm", root, DEBIAN_MIRROR], timeout=900)
        tar = subprocess.Popen(["tar", "-C", root, "-c", "."], stdout=subprocess.PIPE)
        try:
            done = subprocess.run(["docker", "import", "-", BASE], stdin=tar.stdout,
                                  capture_output=True, text=True, timeout=600, check=False)
        finally:
            if tar.stdout:
                tar.stdout.close()
            tar.wait()
        if done.returncode != 0 or tar.returncode != 0:
            raise ServiceError(f"docker import of the debootstrap tree failed: {done.stderr}")


def _docker_build(tag: str, context: Path, dockerfile: Path, log: Log,
                  args: dict[str, str] | None = None) -> None:
    log(f"building {tag}...")
    cmd = ["docker", "build", "--network", "host", "-q", "-t", tag, "-f", str(dockerfile),
           "--label", f"{BUILT_LABEL}={tag}"]
    for key, value in (args or {}).items():
        cmd += ["--build-arg", f"{key}={value}"]
    run([*cmd, str(context)], timeout=1800)
    # A build whose sources changed moves the tag to a new image and leaves the one it named
    # untagged: 3.8 GB for the application's, once per stack start with new code (a day of
    # CI runs left 47 GB and filled this machine's disk). Docker keeps an image a container
    # still uses.
    run(["docker", "image", "prune", "--force", "--filter", f"label={BUILT_LABEL}={tag}"],
        check=False, timeout=300)


def prune_left_builds() -> None:
    """Remove every untagged earlier build once the containers that held them are gone: a
    build's own prune skips an image an earlier stack's container still ran (CI found one
    left after `up` removed a stale stack; `up -d` and `down` free others the same way)."""
    run(["docker", "image", "prune", "--force", "--filter", f"label={BUILT_LABEL}"],
        check=False, timeout=300)


def build_images(root: Path, kafka_jars: Path, log: Log) -> list[str]:
    """Every image the local stack runs; returns their tags."""
    build_base(log)
    local = root / "deploy" / "local"
    with tempfile.TemporaryDirectory(prefix="settle-build-") as tmp:
        ctx = Path(tmp)
        # The host's extra CAs (a TLS-inspecting proxy's) so builds reach PyPI and Maven.
        (ctx / "python" / "host-ca").mkdir(parents=True)
        for crt in sorted(HOST_CA_DIR.glob("*.crt")) if HOST_CA_DIR.is_dir() else []:
            shutil.copy(crt, ctx / "python" / "host-ca" / crt.name)
        _docker_build(PYTHON, ctx / "python", local / "python.Dockerfile", log)
        shutil.copytree(kafka_jars, ctx / "kafka" / "libs",
                        ignore=shutil.ignore_patterns(".*"))
        _docker_build(KAFKA, ctx / "kafka", local / "kafka.Dockerfile", log)
        (ctx / "postgres").mkdir()
        shutil.copy(local / "postgres-entrypoint.sh", ctx / "postgres")
        _docker_build(POSTGRES, ctx / "postgres", local / "postgres.Dockerfile", log)
        # Patroni from PyPI: through the same network (and its CAs) as the Python image.
        shutil.copytree(root / "deploy" / "patroni", ctx / "patroni")
        shutil.copytree(ctx / "python" / "host-ca", ctx / "patroni" / "host-ca")
        _docker_build(PATRONI, ctx / "patroni", ctx / "patroni" / "Dockerfile", log,
                      {"POSTGRES_IMAGE": POSTGRES})
        (ctx / "etcd").mkdir()
        _docker_build(ETCD, ctx / "etcd", local / "etcd.Dockerfile", log)
        monitoring = root / "deploy" / "prometheus"
        _docker_build(MONITORING, monitoring, monitoring / "Dockerfile", log,
                      {"BASE_IMAGE": BASE})
    _docker_build(APP, root, root / "Dockerfile", log, {"PYTHON_IMAGE": PYTHON})
    return [PYTHON, KAFKA, POSTGRES, PATRONI, ETCD, MONITORING, APP]
