"""Every HTTP exchange of remediation (the silences query, webhook and Alertmanager posts) has one
deadline for all of it, held against a server that trickles its answer; answers are read into a
bounded buffer; redirects are not followed to another host or scheme.

Real sockets on 127.0.0.1. The bounds on elapsed time are generous (several times the deadline):
they prove that a trickling server no longer holds the remediator for as long as it likes (the
servers here give up after 30 s, which is how long the clients waited before)."""

from __future__ import annotations

import random
import threading
import time

import pytest

from pipeline.remediation.actions import Context, WebhookAction
from pipeline.remediation.alertmanager import AlertmanagerAction, SilenceError, Silences
from tests.unit.remediation.factories import TrickleServer, alert

DEADLINE = 1.0
BOUND = 6.0  # seconds: the deadline, plus slack for a loaded machine; the servers hold 30 s


@pytest.fixture
def trickle():
    made: list[TrickleServer] = []

    def make(**kw) -> TrickleServer:
        s = TrickleServer(**kw)
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()


@pytest.mark.parametrize("where", ["head", "body"])
def test_a_trickled_silences_answer_fails_at_the_deadline(trickle, where):
    # Before: each byte came within the per-read timeout, so the query waited 30 s (the server's
    # own limit here; a hostile one has none) and every node action waited with it.
    srv = trickle(where=where)
    s = Silences(srv.url, timeout=DEADLINE, cache=15)
    t0 = time.monotonic()
    with pytest.raises(SilenceError) as e:
        s.active()
    assert time.monotonic() - t0 < BOUND
    assert "DeadlineTimeout" in str(e.value) and f"within {DEADLINE:g}s" in str(e.value)


@pytest.mark.parametrize("where", ["head", "body"])
def test_a_trickled_webhook_answer_fails_at_the_deadline_on_every_attempt(trickle, where):
    srv = trickle(where=where)
    act = WebhookAction("hook", srv.url + "/h", timeout=DEADLINE, retries=1, backoff=0.01)
    t0 = time.monotonic()
    out = act.execute(act.plan(alert()), Context(sleep=lambda d: None, rng=random.Random(1)))
    assert time.monotonic() - t0 < 2 * BOUND
    assert not out.ok and out.attempts == 2 and "Timeout" in (out.error or "")
    assert srv.accepted == 2  # a timeout is retried like any other


def test_a_trickled_alertmanager_post_fails_at_the_deadline(trickle):
    srv = trickle(where="head")
    act = AlertmanagerAction("am", srv.url, timeout=DEADLINE, retries=0)
    t0 = time.monotonic()
    out = act.execute(act.plan(alert()), Context(sleep=lambda d: None, rng=random.Random(1)))
    assert time.monotonic() - t0 < BOUND
    assert not out.ok and "Timeout" in (out.error or "")


def test_the_deadline_leaves_no_thread_behind(trickle):
    srv = trickle(where="body")
    before = threading.active_count()
    s = Silences(srv.url, timeout=0.5, cache=0)
    for _ in range(3):
        with pytest.raises(SilenceError):
            s.active()
    time.sleep(0.2)
    # The server's own per-connection threads stop when the client hangs up; ours are gone.
    assert threading.active_count() <= before + 3


def test_a_silences_answer_over_the_limit_is_an_error(monkeypatch, trickle):
    from pipeline.remediation import alertmanager

    monkeypatch.setattr(alertmanager, "MAX_BODY", 100)
    srv = trickle(where="body", every=0.0, body=b"[" + b" " * 1000 + b"]")
    with pytest.raises(SilenceError) as e:
        Silences(srv.url, timeout=5).active()
    assert "larger than 100 bytes" in str(e.value)


@pytest.mark.parametrize("status", ["302 Found", "307 Temporary Redirect", "308 Permanent Redirect"])
def test_redirects_are_not_followed(trickle, server, status):
    # The redirect points at a live server on another port: nothing may reach it.
    other = server([200])
    src = trickle(where="body", every=0.0, status=status, body=b"")
    # Location is added to the head by hand: the trickle server sends a fixed one.
    src.fast = src.fast.replace(b"\r\n\r\n", f"\r\nLocation: {other.url}/x\r\n\r\n".encode())
    with pytest.raises(SilenceError) as e:
        Silences(src.url, timeout=5).active()
    assert f"HTTP {status.split()[0]}" in str(e.value)
    act = WebhookAction("hook", src.url + "/h", timeout=5, retries=0)
    out = act.execute(act.plan(alert()), Context(sleep=lambda d: None, rng=random.Random(1)))
    assert not out.ok and f"HTTP {status.split()[0]}" in (out.error or "")
    assert other.hits == []


def test_the_deadline_holds_over_tls(tmp_path):
    # The watchdog shuts the socket under TLS too (the read is inside the TLS layer).
    import signal
    import socket
    import ssl
    import subprocess

    import httpx

    from pipeline.remediation.exchange import DeadlineTimeout, exchange
    from tests.systools import require_tool

    openssl = require_tool("openssl", package="openssl")
    key, cert = tmp_path / "k.pem", tmp_path / "c.pem"
    subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(4)
    stop = threading.Event()

    def serve():
        conn, _ = ls.accept()
        with ctx.wrap_socket(conn, server_side=True) as s:
            s.recv(65536)
            for b in b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello" * 100:
                if stop.is_set():
                    return
                try:
                    s.send(bytes([b]))
                except OSError:
                    return
                time.sleep(0.2)

    # A TLS send takes no MSG_NOSIGNAL, and CLI tests in this process set SIGPIPE to its default
    # action: ignored while the server may write to the connection the client shut.
    old = signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    server = threading.Thread(target=serve, daemon=True)
    server.start()
    client = httpx.Client(timeout=DEADLINE, follow_redirects=False, limits=httpx.Limits(max_keepalive_connections=0),
                          verify=ssl.create_default_context(cafile=str(cert)))
    t0 = time.monotonic()
    try:
        with pytest.raises(DeadlineTimeout):
            exchange(client, "GET", f"https://127.0.0.1:{ls.getsockname()[1]}/", deadline=DEADLINE, max_body=100)
        assert time.monotonic() - t0 < BOUND
    finally:
        client.close()
        stop.set()
        server.join(5)
        ls.close()
        signal.signal(signal.SIGPIPE, old)
