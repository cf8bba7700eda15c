"""The scrape's HTTP GET against real hostile servers on 127.0.0.1: one overall deadline however
the server trickles, a cancel that stops it at once, short bodies, redirects and protocol errors
refused with a reason, and the exporter source counting each as a scrape failure."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable

import pytest

from producers import httpget
from producers.dcgm_exporter import ExporterSource

from tests.factories import SHARED_DATA as DATA  # noqa: E402

BODY = (DATA / "dcgm_exporter_h100_8gpu_sampled.prom").read_bytes()
# A write to a client that gave up must be an error in the server thread, not a signal.
NOSIGNAL = getattr(socket, "MSG_NOSIGNAL", 0)
ROOT = Path(__file__).resolve().parents[3]


class RawServer:
    """A TCP server on 127.0.0.1 whose every connection is handled by ``handle(conn)`` in a thread."""

    def __init__(self, handle: Callable[[socket.socket], None]) -> None:
        self.handle = handle
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/metrics"
        self.stop = threading.Event()
        self.connections = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _serve(self, c: socket.socket) -> None:
        try:
            c.settimeout(30)
            c.recv(65536)  # the request
            self.handle(c)
        except OSError:
            pass
        finally:
            c.close()

    def close(self) -> None:
        self.stop.set()
        self.sock.close()


@pytest.fixture
def serve():
    made: list[RawServer] = []

    def make(handle: Callable[[socket.socket], None]) -> RawServer:
        made.append(RawServer(handle))
        return made[-1]

    yield make
    for s in made:
        s.close()


def _trickle(data: bytes, every_s: float = 0.5) -> Callable[[socket.socket], None]:
    def handle(c: socket.socket) -> None:
        for i in range(len(data)):
            c.sendall(data[i : i + 1], NOSIGNAL)
            time.sleep(every_s)

    return handle


def _answer(head: bytes, body: bytes = b"") -> Callable[[socket.socket], None]:
    return lambda c: c.sendall(head + body, NOSIGNAL)


OK_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n"


def _fails(url: str, timeout_s: float = 1.0, **kw) -> tuple[str, float]:
    t0 = time.monotonic()
    with pytest.raises(httpget.FetchError) as e:
        httpget.get(url, timeout_s=timeout_s, max_bytes=1 << 20, **kw)
    return e.value.reason, time.monotonic() - t0


@pytest.mark.parametrize(
    "stream",
    [
        b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n" + b"X-Slow: " + b"a" * 200,  # headers
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + b"0000000000000010",  # a chunk-size line
        b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n" + b"#" * 1000,  # the body
    ],
    ids=["headers", "chunk_size", "body"],
)
def test_a_trickling_server_cannot_hold_the_scrape_past_its_deadline(serve, stream):
    # Before (urllib, a timeout per read): each byte reset the clock, so one byte every 0.5 s
    # held the scrape for as long as the server liked.
    srv = serve(_trickle(stream))
    reason, took = _fails(srv.url, timeout_s=1.0)
    assert reason == "timeout" and took < 4


def test_cancel_stops_a_scrape_in_flight(serve):
    srv = serve(_trickle(b"HTTP/1.1 200 OK\r\n" + b"X: " + b"a" * 1000))
    cancel = threading.Event()
    threading.Timer(0.3, cancel.set).start()
    reason, took = _fails(srv.url, timeout_s=60.0, cancel=cancel)
    assert reason == "interrupted" and took < 3


def test_body_cut_short_of_its_content_length_is_refused(serve):
    srv = serve(_answer(OK_HEAD % len(BODY), BODY[: len(BODY) // 2]))
    assert _fails(srv.url)[0] == "short_body"


def test_chunked_body_cut_short_is_refused(serve):
    srv = serve(_answer(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", b"400\r\n" + b"#" * 10))
    assert _fails(srv.url)[0] == "short_body"


def test_whole_body_is_returned(serve):
    srv = serve(_answer(OK_HEAD % len(BODY), BODY))
    assert httpget.get(srv.url, timeout_s=2.0, max_bytes=1 << 20) == BODY


def test_body_over_the_cap_is_refused(serve):
    srv = serve(_answer(b"HTTP/1.1 200 OK\r\n\r\n", BODY))  # no length: read until close
    with pytest.raises(httpget.FetchError) as e:
        httpget.get(srv.url, timeout_s=2.0, max_bytes=1000)
    assert e.value.reason == "too_large"


@pytest.mark.parametrize(
    "length", ["٣", "9" * 5000, "-1", "12, 13"], ids=["arabic_digit", "5000_digits", "negative", "list"]
)
def test_content_length_not_ascii_digits_is_a_protocol_error(serve, length):
    srv = serve(_answer(b"HTTP/1.1 200 OK\r\nContent-Length: " + length.encode() + b"\r\n\r\n", b"abc"))
    assert _fails(srv.url)[0] == "protocol"


def test_redirect_on_the_same_origin_is_followed_elsewhere_refused(serve):
    target = serve(_answer(OK_HEAD % len(BODY), BODY))
    same = serve(_answer(f"HTTP/1.1 302 Found\r\nLocation: {target.url}\r\nContent-Length: 0\r\n\r\n".encode()))
    # Another port is another origin; so is another scheme on the same host and port.
    assert _fails(same.url)[0] == "redirect_refused"
    local = serve(_answer(b"HTTP/1.1 301 Moved\r\nLocation: /other\r\nContent-Length: 0\r\n\r\n"))
    assert _fails(local.url)[0] == "redirect_refused"  # followed to /other on itself: a loop, capped
    https = serve(
        lambda c: c.sendall(
            f"HTTP/1.1 307 X\r\nLocation: https://127.0.0.1:{c.getsockname()[1]}/m\r\nContent-Length: 0\r\n\r\n".encode(),
            NOSIGNAL,
        )
    )
    assert _fails(https.url)[0] == "redirect_refused"

    hops = {"n": 0}

    def once(c: socket.socket) -> None:
        hops["n"] += 1
        if hops["n"] == 1:
            c.sendall(b"HTTP/1.1 302 Found\r\nLocation: /metrics2\r\nContent-Length: 0\r\n\r\n", NOSIGNAL)
        else:
            c.sendall(OK_HEAD % len(BODY) + BODY, NOSIGNAL)

    assert httpget.get(serve(once).url, timeout_s=2.0, max_bytes=1 << 20) == BODY


def test_exporter_counts_protocol_errors_and_refusals_as_scrape_failures(serve):
    # Before: http.client's BadStatusLine and LineTooLong escaped fetch(), so run() counted a
    # poll error (and a --file run exited 0); a short body was parsed as if whole.
    garbage = serve(_answer(b"HELLO THERE\r\n\r\n"))
    short = serve(_answer(OK_HEAD % len(BODY), BODY[:100]))
    away = serve(_answer(b"HTTP/1.1 302 Found\r\nLocation: http://example.invalid/metrics\r\nContent-Length: 0\r\n\r\n"))
    for srv, reason in ((garbage, "protocol"), (short, "short_body"), (away, "redirect_refused")):
        src = ExporterSource(srv.url, timeout_s=1.0)
        assert src.poll() == []
        c = src.summary()
        assert c["scrape_failures"] == 1 and c[f"scrape_failures.{reason}"] == 1


def test_sigterm_stops_a_producer_stuck_in_a_trickled_scrape(serve, tmp_path):
    # Before: the handler only set the loop's stop flag, and the scrape it waited on never ended.
    srv = serve(_trickle(b"HTTP/1.1 200 OK\r\n" + b"X: " + b"a" * 1000, every_s=0.2))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-m", "pipeline", "produce", "dcgm-exporter", "--url", srv.url, "--timeout", "120"]
    proc = subprocess.Popen(argv + ["--out", str(tmp_path / "o.jsonl")], env=env, cwd=ROOT, stderr=subprocess.PIPE)
    try:
        end = time.monotonic() + 60
        while srv.connections == 0 and time.monotonic() < end:  # started, and inside the scrape
            time.sleep(0.1)
        time.sleep(0.5)
        assert srv.connections == 1 and proc.poll() is None
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)
        assert time.monotonic() - t0 < 10
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = proc.stderr.read().decode() if proc.stderr else ""
    assert "scrape_failures.interrupted 1" in err
