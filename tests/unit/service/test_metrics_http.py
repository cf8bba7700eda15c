"""/healthz and /metrics stay answerable while clients misbehave: an idle connection does not
block other requests, and a client that dribbles its request (slowloris) is dropped."""

from __future__ import annotations

import socket
import threading
import time
import urllib.request

import pytest

from pipeline.httpendpoint import HttpEndpoint
from pipeline.service.metrics import Metrics

# `gpuwarden` CLI tests run in this process set SIGPIPE to its default action; a write to a socket
# the server closed must be an error here, not the end of the test run.
NOSIGNAL = getattr(socket, "MSG_NOSIGNAL", 0)


@pytest.fixture
def endpoint():
    ep = HttpEndpoint("127.0.0.1", 0, Metrics().registry, lambda: (True, {"partitions": 3}), timeout=1.0).start()
    yield ep
    ep.stop()


def get(ep: HttpEndpoint, path: str, timeout: float = 1.0) -> tuple[int, bytes]:
    with urllib.request.urlopen(f"http://127.0.0.1:{ep.port}{path}", timeout=timeout) as r:
        return r.status, r.read()


def test_an_idle_connection_does_not_block_healthz(endpoint):
    idle = socket.create_connection(("127.0.0.1", endpoint.port))
    try:
        time.sleep(0.1)   # the server has accepted it and waits for its request line
        t0 = time.monotonic()
        status, body = get(endpoint, "/healthz")
        assert status == 200 and b'"status": "ok"' in body and time.monotonic() - t0 < 1.0
        status, body = get(endpoint, "/metrics")
        assert status == 200 and b"gpuwarden_records_total" in body
    finally:
        idle.close()


def test_a_slowloris_client_is_dropped_after_the_timeout(endpoint):
    s = socket.create_connection(("127.0.0.1", endpoint.port))
    s.settimeout(5)
    s.sendall(b"GET /healthz HTTP/1.1\r\n", NOSIGNAL)
    t0 = time.monotonic()
    dropped = None
    try:
        # One header byte every 0.2 s: each read succeeds, so only a deadline for the whole
        # request ends it.
        for _ in range(40):
            s.sendall(b"X", NOSIGNAL)
            time.sleep(0.2)
    except OSError:
        dropped = time.monotonic() - t0
    else:
        try:
            dropped = time.monotonic() - t0 if s.recv(1) == b"" else None
        except OSError:
            dropped = time.monotonic() - t0
    finally:
        s.close()
    assert dropped is not None and dropped < 3.0, "the connection was not closed by the server"


def test_many_idle_connections_and_healthz_still_answers(endpoint):
    idle = [socket.create_connection(("127.0.0.1", endpoint.port)) for _ in range(20)]
    try:
        results = []
        threads = [threading.Thread(target=lambda: results.append(get(endpoint, "/healthz", timeout=10.0)[0]))
                   for _ in range(5)]
        for t in threads:
            t.start()
        # 10 s: far under what 20 idle clients would hold a one-at-a-time server (5 s each), and
        # far over what a loaded CI machine needs for five requests.
        for t in threads:
            t.join(10)
        assert results == [200] * 5
    finally:
        for s in idle:
            s.close()


def test_stop_returns_promptly_with_a_client_still_connected():
    ep = HttpEndpoint("127.0.0.1", 0, Metrics().registry, lambda: (True, {}), timeout=30.0).start()
    idle = socket.create_connection(("127.0.0.1", ep.port))
    try:
        t0 = time.monotonic()
        ep.stop()
        assert time.monotonic() - t0 < 2.0
    finally:
        idle.close()


def test_a_client_hanging_up_mid_answer_cannot_kill_the_service_with_sigpipe(tmp_path):
    # `gpuwarden serve` runs with SIGPIPE at its default action (pipeline/cli/__init__.py): a plain
    # socket write after the client hung up would end the process, not the request.
    import subprocess
    import sys

    code = """
import signal, socket
from pipeline.httpendpoint import _Handler
signal.signal(signal.SIGPIPE, signal.SIG_DFL)
a, b = socket.socketpair()
b.close()
h = _Handler.__new__(_Handler)
h.request, h.client_address, h.server = a, ("peer", 0), None
h.setup()
try:
    for _ in range(3):
        h.wfile.write(b"x" * 65536)
except OSError as e:
    print("error, not a signal:", type(e).__name__)
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and "error, not a signal: BrokenPipeError" in r.stdout, (r.returncode, r.stderr)


def test_alert_and_dead_letter_series_exist_from_zero() -> None:
    # A counter series born with its first alert makes increase() read 0 for that alert.
    from prometheus_client import generate_latest

    from pipeline.service.metrics import Metrics

    text = generate_latest(Metrics().registry).decode()
    assert 'gpuwarden_alerts_total{family="hbm",state="firing"} 0.0' in text
    assert 'gpuwarden_dead_letters_total{reason="too_deep"} 0.0' in text


def test_healthz_answers_while_more_slow_clients_than_slots_dribble():
    # 160 clients each sending a header byte now and then, reconnecting when cut: more than
    # max_connections (64), so without eviction the probes found every slot held and were refused.
    ep = HttpEndpoint("127.0.0.1", 0, Metrics().registry, lambda: (True, {}), timeout=5.0).start()
    stop = threading.Event()

    def dribble(n: int) -> None:
        socks: list[socket.socket | None] = [None] * n
        while not stop.is_set():
            for i, s in enumerate(socks):
                try:
                    if s is None:
                        s = socks[i] = socket.create_connection(("127.0.0.1", ep.port), timeout=10)
                        s.sendall(b"GET /metrics HTTP/1.1\r\n", NOSIGNAL)
                    s.sendall(b"X", NOSIGNAL)
                except OSError:
                    if s is not None:
                        s.close()
                    socks[i] = None
            stop.wait(0.1)
        for s in socks:
            if s is not None:
                s.close()

    threads = [threading.Thread(target=dribble, args=(40,), daemon=True) for _ in range(4)]
    base = threading.active_count() + len(threads)
    for t in threads:
        t.start()
    try:
        # Until the server runs a thread for each of its 64 slots: the dribblers hold them all.
        deadline = time.monotonic() + 30
        while threading.active_count() < base + 64 and time.monotonic() < deadline:
            time.sleep(0.1)
        results = []
        for _ in range(30):
            try:
                results.append(get(ep, "/healthz", timeout=3.0)[0])
            except OSError as e:
                results.append(type(e).__name__)
        assert results == [200] * 30
    finally:
        stop.set()
        for t in threads:
            t.join(15)
        ep.stop()
