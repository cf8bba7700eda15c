"""The HTTP endpoint against hostile clients on a real socket: what a request's headers can make the
server do (answer a 500, copy text into an answer's headers, hold memory) and what every error
answer carries."""

from __future__ import annotations

import logging
import socket
import threading
import time
import urllib.request
from typing import Any, cast

import pytest

from pipeline.httpendpoint import HttpEndpoint
from pipeline.service.metrics import Metrics

# `gpuwarden` CLI tests run in this process set SIGPIPE to its default action.
NOSIGNAL = getattr(socket, "MSG_NOSIGNAL", 0)
# What Prometheus 3 sends when it scrapes: every range of it must still be read.
PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6,"
    "application/openmetrics-text;version=0.0.1;q=0.5,text/plain;version=1.0.0;escaping=allow-utf-8;q=0.4,"
    "text/plain;version=0.0.4;q=0.3,*/*;q=0.2"
)


@pytest.fixture(scope="module")
def endpoint():
    ep = HttpEndpoint("127.0.0.1", 0, Metrics().registry, lambda: (True, {}), timeout=2.0).start()
    yield ep
    ep.stop()


def raw(ep: HttpEndpoint, data: bytes) -> tuple[bytes, bytes]:
    """The status line with headers, and the body, of the answer to ``data`` sent as it is (empty
    where the server reset the connection before anything came)."""
    out = b""
    with socket.create_connection(("127.0.0.1", ep.port), timeout=5) as s:
        try:
            s.sendall(data, NOSIGNAL)
            while chunk := s.recv(65536):
                out += chunk
        except (ConnectionResetError, BrokenPipeError):
            pass
    head, _, body = out.partition(b"\r\n\r\n")
    return head, body


def metrics_with_accept(ep: HttpEndpoint, accept: bytes) -> tuple[bytes, bytes]:
    return raw(ep, b"GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: " + accept + b"\r\n\r\n")


@pytest.mark.parametrize("version", [b"1.x", b"9<script>", b"1." + b"9" * 5000, b"1.0.0;x"])
def test_an_accept_header_whose_version_is_not_a_number_gets_the_metrics(endpoint, version, caplog):
    # prometheus_client compares the version as numbers: "1.x" was a TypeError, a 500 and an error
    # with its traceback in the log at every request.
    caplog.set_level(logging.DEBUG, logger="gpuwarden.http")
    head, body = metrics_with_accept(endpoint, b"application/openmetrics-text; version=" + version)
    assert head.startswith(b"HTTP/1.0 200 ") and b"gpuwarden_records_total" in body, head
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.parametrize(
    "accept",
    [
        b"application/openmetrics-text; version=2.0.0<script>alert(1)</script>",
        b"application/openmetrics-text; version=2.0.0\r\n Set-Cookie: session=stolen",
        b"application/openmetrics-text; version=2.0.0\r\n\tX-Injected: 1",
        b"application/openmetrics-text; version=2.0.0\x0bX\x0cY\x1cZ\x7f",
        b"application/openmetrics-text; version=2.0.0\xe9",
    ],
)
def test_an_accept_header_is_never_copied_into_the_answers_headers(endpoint, accept):
    # The version was copied as it came into Content-Type: markup, control characters, and a
    # folded line that a client reads as part of the header block.
    head, body = metrics_with_accept(endpoint, accept)
    assert head.startswith(b"HTTP/1.0 200 ") and b"gpuwarden_records" in body, head
    lines = head.split(b"\r\n")
    assert not [ln for ln in lines if ln[:1] in (b" ", b"\t")], head  # no folded line
    assert all(32 <= c < 127 for ln in lines for c in ln), head  # printable ASCII only
    for word in (b"script", b"Set-Cookie", b"X-Injected", b"stolen"):
        assert word not in head, head


def test_a_scrapers_accept_header_still_chooses_its_format(endpoint):
    head, body = metrics_with_accept(endpoint, PROMETHEUS_ACCEPT.encode())
    ctype = [ln for ln in head.split(b"\r\n") if ln.startswith(b"Content-Type: ")]
    assert ctype == [b"Content-Type: application/openmetrics-text; version=1.0.0; charset=utf-8; escaping=allow-utf-8"]
    assert body.endswith(b"# EOF\n")
    head, _ = metrics_with_accept(endpoint, b"text/plain;version=0.0.4;q=0.3,*/*;q=0.2")
    assert b"Content-Type: text/plain; version=0.0.4; charset=utf-8" in head


def test_request_headers_past_the_limit_are_refused_unread(endpoint):
    # http.server takes 100 header lines of 64 KiB each: 6.4 MB a request, which its parser turned
    # into ~12 MB held per connection (64 connections: ~840 MB). Two such lines are already too many.
    big = b"".join(b"X-Pad-%d: " % i + b"a" * 60_000 + b"\r\n" for i in range(2))
    head, _ = raw(endpoint, b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + big + b"\r\n")
    assert not head.startswith(b"HTTP/1.0 200 "), head
    assert head == b"" or head.startswith(b"HTTP/1.0 431 "), head  # or reset: sent past what was read
    huge = b"".join(b"X-Pad-%d: " % i + b"a" * 65_000 + b"\r\n" for i in range(99))
    head, _ = raw(endpoint, b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + huge + b"\r\n")
    assert not head.startswith(b"HTTP/1.0 200 "), head
    # Headers of an ordinary size (a browser's cookies included) are answered.
    head, _ = raw(endpoint, b"GET /healthz HTTP/1.1\r\nHost: x\r\nCookie: " + b"c" * 16_000 + b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 200 "), head


def test_a_server_error_answer_forbids_sniffing_too():
    # wsgiref's own 500 (the application raised) had no nosniff, unlike every other answer.
    def broken_health() -> tuple[bool, dict]:
        raise RuntimeError("a bug in the health check")

    ep = HttpEndpoint("127.0.0.1", 0, Metrics().registry, broken_health, timeout=2.0).start()
    try:
        head, body = raw(ep, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    finally:
        ep.stop()
    assert head.startswith(b"HTTP/1.0 500 ") and b"a bug" not in body, head
    assert b"\r\nX-Content-Type-Options: nosniff" in head, head


def test_a_connection_evicted_mid_request_is_not_answered_and_frees_its_slot_at_once():
    # An evicted client's thread read the end of its input as the end of its headers and ran the
    # request it had half sent: a page that waits on the service loop held the slot past the
    # probe's wait, and the probe that evicted it was refused.
    release = threading.Event()
    calls: list[int] = []

    def slow_page() -> tuple[str, bytes]:  # the loop in a long turn: LIVE_WAIT_S is 2 s
        calls.append(1)
        release.wait(5)
        return "text/plain", b"late"

    ep = HttpEndpoint(
        "127.0.0.1", 0, Metrics().registry, lambda: (True, {}), timeout=10.0, pages={"/incidents": slow_page}
    ).start()
    server = cast(Any, ep.server)
    held: list[socket.socket] = []
    try:
        for _ in range(server.max_connections):
            s = socket.create_connection(("127.0.0.1", ep.port), timeout=5)
            s.sendall(b"GET /incidents HTTP/1.1\r\nHost: x\r\nX-Pad: a", NOSIGNAL)
            held.append(s)
        deadline = time.monotonic() + 5
        while len(server._reading) < server.max_connections and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(server._reading) == server.max_connections
        results = []
        for _ in range(3):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{ep.port}/healthz", timeout=3) as r:
                    results.append(r.status)
            except OSError as e:
                results.append(type(e).__name__)
        assert results == [200] * 3 and server.evicted >= 1 and calls == []
    finally:
        release.set()
        for s in held:
            s.close()
        ep.stop()


@pytest.mark.parametrize("request_line", [b"GET /healthz", b"GET /metrics", b"HEAD /healthz", b"POST /x"])
def test_a_one_line_http_0_9_request_is_refused_with_a_status_and_headers(endpoint, request_line):
    # "GET /healthz" with no version is HTTP/0.9, whose answer was the body alone: no status, no content
    # type, no nosniff (for any method: http.server's own refusal of a HEAD took that path too).
    head, body = raw(endpoint, request_line + b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 400 "), head
    assert b"\r\nX-Content-Type-Options: nosniff" in head and b"\r\nContent-Type: text/html" in head, head
    assert b"HTTP/0.9" in body


def test_an_http_0_9_request_past_the_header_budget_is_refused_with_headers(endpoint):
    big = b"".join(b"X-Pad-%d: " % i + b"a" * 60_000 + b"\r\n" for i in range(2))
    head, _ = raw(endpoint, b"GET /healthz\r\n" + big + b"\r\n")
    assert head == b"" or (head.startswith(b"HTTP/1.0 4") and b"nosniff" in head), head
