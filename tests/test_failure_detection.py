"""A database that goes silent is given up within the times docs/operations.md promises
("Failure detection"), not when the operating system gives up (minutes). Silence is made the
way a lost site makes it: packets dropped (iptables, on one loopback port of the test's own),
never a refused connection. Against the embedded PostgreSQL; root and iptables needed (CI
runs as root; `make test` installs Debian's iptables)."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator

import psycopg
import pytest

from settlement.config import Settings
from settlement.db import LIBPQ_TIMEOUTS, dsn_password, open_connection

pytestmark = pytest.mark.services


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def _dropped(port: int) -> Iterator[None]:
    """Every packet to 127.0.0.1:``port`` dropped while inside: a peer gone silent."""
    if os.geteuid() != 0 or shutil.which("iptables") is None:
        pytest.fail("dropping packets needs root and iptables (`make test` installs it)")
    rule = ["INPUT", "-i", "lo", "-p", "tcp", "--dport", str(port), "-j", "DROP"]
    subprocess.run(["iptables", "-I", *rule], check=True, timeout=30)
    try:
        yield
    finally:
        subprocess.run(["iptables", "-D", *rule], check=True, timeout=30)


@contextlib.contextmanager
def _forwarder(target: tuple[str, int]) -> Iterator[int]:
    """A TCP relay on a port of its own to ``target``: the path a test can silence."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = int(listener.getsockname()[1])
    stop = threading.Event()

    def pump(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)

    def serve() -> None:
        listener.settimeout(0.5)
        while not stop.is_set():
            try:
                client, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            upstream = socket.create_connection(target, timeout=5)
            upstream.settimeout(None)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=pump, args=(a, b), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield port
    finally:
        stop.set()
        listener.close()


def _timed_while_dropped(port: int, work: Callable[[], str], limit: float
                         ) -> dict[str, float | str]:
    """``work()`` in a thread while ``port`` is silent: what it returned (``result``) or
    the psycopg error it raised (``error``), and how long it took. Fails the test if it is
    still waiting after ``limit`` seconds."""
    outcome: dict[str, float | str] = {}

    def run() -> None:
        start = time.monotonic()
        try:
            outcome["result"] = work()
        except psycopg.Error as e:
            outcome["error"] = str(e)
        outcome["seconds"] = time.monotonic() - start

    with _dropped(port):
        worker = threading.Thread(target=run, daemon=True)
        worker.start()
        worker.join(timeout=limit)
    assert not worker.is_alive(), f"still waiting on the silent port after {limit:.0f} s"
    return outcome


def _tcp_dsn(services: Settings, *ports: int) -> str:
    """The settlement database over TCP through ``ports`` (in order), with its password."""
    info = psycopg.conninfo.conninfo_to_dict(services.settlement_dsn)
    return psycopg.conninfo.make_conninfo(
        host=",".join("127.0.0.1" for _ in ports), port=",".join(map(str, ports)),
        dbname=info["dbname"], user=info["user"],
        password=dsn_password(services.settlement_dsn) or "")


def test_a_silent_first_member_costs_one_connect_timeout(services: Settings) -> None:
    # A DSN naming the other site's member first while that site is silent: the connection
    # reaches the second member after connect_timeout (3 s), not after the kernel's SYN
    # retries (over two minutes).
    pg_port = int(psycopg.conninfo.conninfo_to_dict(services.settlement_dsn)["port"])
    silent = _free_port()

    def attempt() -> str:
        with open_connection(_tcp_dsn(services, silent, pg_port)) as conn:
            return str(conn.info.port)

    done = _timed_while_dropped(silent, attempt, limit=20)
    assert "error" not in done, done
    assert done["result"] == str(pg_port)
    budget = LIBPQ_TIMEOUTS["connect_timeout"]
    assert budget - 0.5 <= float(done["seconds"]) <= budget + 3, done


def test_a_server_gone_silent_under_a_session_is_given_up_within_the_user_timeout(
        services: Settings) -> None:
    # A session open when its server's site goes silent: the next request is not
    # acknowledged, and tcp_user_timeout (10 s) ends the session with an error the caller
    # sees, instead of TCP's retransmissions (about 15 minutes).
    pg_port = int(psycopg.conninfo.conninfo_to_dict(services.settlement_dsn)["port"])
    with _forwarder(("127.0.0.1", pg_port)) as relay:
        conn = open_connection(_tcp_dsn(services, relay), autocommit=True)
        try:
            assert conn.execute("select 1").fetchone() == (1,)
            outcome = _timed_while_dropped(
                relay, lambda: str(conn.execute("select 2").fetchone()), limit=40)
            assert "result" not in outcome and "error" in outcome, outcome
            limit = LIBPQ_TIMEOUTS["tcp_user_timeout"] / 1000
            assert limit - 1 <= float(outcome["seconds"]) <= limit + 8, outcome
        finally:
            conn.close()
