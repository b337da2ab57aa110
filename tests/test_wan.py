"""The WAN's delayer (deploy/wandelay, settlement/stack/wan.py) on loopback: packets queued
to it by netfilter arrive a round trip later, a stopped delayer leaves the link fast (never
cut), and bad round trips are refused. Root and iptables needed (CI runs as root; `make test`
installs Debian's iptables); Go builds the delayer."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import statistics
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from settlement.errors import ServiceError
from settlement.stack import wan

ROOT = Path(__file__).resolve().parents[1]
QUEUE = 17  # not the stack's (7): a running stack's WAN is left alone


@pytest.mark.parametrize(("rtt", "loss", "jitter"),
                         [(-1, 0, 0), (501, 0, 0), (5, 1.0, 0), (5, -0.1, 0), (5, 0, 6),
                          (5, 0, -1)])
def test_out_of_range_refused(rtt: float, loss: float, jitter: float) -> None:
    with pytest.raises(ServiceError, match="out of range"):
        wan.check_rtt(rtt, loss, jitter)


@contextlib.contextmanager
def _echo() -> Iterator[int]:
    server = socket.create_server(("127.0.0.1", 0))
    port = int(server.getsockname()[1])

    def serve() -> None:
        conn, _ = server.accept()
        with conn, contextlib.suppress(OSError):
            while data := conn.recv(65536):
                conn.sendall(data)

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield port
    finally:
        server.close()


def _round_trips(sock: socket.socket, n: int = 20) -> list[float]:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        sock.sendall(b"x")
        assert sock.recv(16) == b"x"
        times.append((time.perf_counter() - t0) * 1000)
    return times


@contextlib.contextmanager
def _queued(port: int) -> Iterator[None]:
    """Both directions of 127.0.0.1:``port``'s connections sent to QUEUE (bypassed unheld)."""
    if os.geteuid() != 0 or shutil.which("iptables") is None:
        pytest.fail("queueing packets needs root and iptables (`make test` installs it)")
    rules = [["OUTPUT", "-p", "tcp", flag, str(port), "-j", "NFQUEUE", "--queue-num",
              str(QUEUE), "--queue-bypass"] for flag in ("--dport", "--sport")]
    for rule in rules:
        subprocess.run(["iptables", "-t", "mangle", "-I", *rule], check=True, timeout=30)
    try:
        yield
    finally:
        for rule in rules:
            subprocess.run(["iptables", "-t", "mangle", "-D", *rule], check=True, timeout=30)


@contextlib.contextmanager
def _delayed(*flags: str) -> Iterator[tuple[socket.socket, subprocess.Popen[str]]]:
    """A connection to an echo server whose packets go through a delayer run with ``flags``."""
    binary = wan.delayer(ROOT, lambda _: None)
    with _echo() as port, _queued(port):
        delayer = subprocess.Popen([str(binary), "-queue", str(QUEUE), *flags],
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            time.sleep(0.5)
            assert delayer.poll() is None, delayer.stdout.read() if delayer.stdout else ""
            with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                yield sock, delayer
        finally:
            if delayer.poll() is None:
                delayer.kill()


def test_delayer_adds_the_round_trip_and_a_stopped_one_cuts_nothing() -> None:
    with _delayed("-delay", "10ms") as (sock, delayer):
        held = statistics.median(_round_trips(sock))
        # Each direction held 10 ms: one round trip is 20 ms, and not much more.
        assert 19.5 <= held < 40, held
        delayer.terminate()
        out, _ = delayer.communicate(timeout=10)
        assert "packets seen" in out, out
        # The queue unheld: --queue-bypass lets the same connection through at once.
        assert statistics.median(_round_trips(sock)) < 5


def test_jitter_varies_the_round_trip_within_its_bounds() -> None:
    # Each direction 10 ms give or take 8: a round trip between 4 and 36 ms (and the
    # scheduler's slack), spread out rather than the same each time.
    with _delayed("-delay", "10ms", "-jitter", "8ms") as (sock, _):
        times = _round_trips(sock, 30)
    assert 3.9 <= min(times) and max(times) < 50, times
    assert max(times) - min(times) > 8, times
    assert 12 < statistics.mean(times) < 30, times
